"""--dry_run (hfbert.pretraining.plan): the plan printed after the checks, nothing written."""

import math

import pytest
from test_training import run_args, train_in_process

from hfbert import HfBertConfig
from hfbert.errors import Refusal
from hfbert.pretraining.cli import main
from hfbert.pretraining.evaluation import flops_per_token
from hfbert.pretraining.plan import INSTANCE_FILL, TOKENS_PER_BYTE


def plan_of(argv, capsys) -> str:
    main([*argv, "--dry_run"])
    return capsys.readouterr().out


def test_the_plan_counts_the_quick_start_and_writes_nothing(tmp_path, capsys):
    output_dir = tmp_path / "run"
    plan = plan_of(["--recipe", "quick-start", "--output_dir", str(output_dir)], capsys)
    tokens = 6000 * 16 * INSTANCE_FILL * 128
    corpus_tokens = round(687982 * TOKENS_PER_BYTE)  # the shipped sample's training file
    assert "model: 2 layers x 128, vocabulary 8192: 1.6M parameters" in plan
    assert "batch: 16 x 1 processes x 1 accumulation = 16 instances" in plan
    assert f"updates: 6,000; ~{tokens:,.0f} tokens seen" in plan
    assert f"passes over the corpus: ~{tokens / corpus_tokens:.1f}" in plan
    assert "resume: none, a fresh start" in plan
    # the loop's formula on a CPU's path: the MLM head at the masked rows (15% of the mean instance)
    config, instance_tokens = HfBertConfig.from_preset("tiny", vocab_size=8192), INSTANCE_FILL * 128
    per_token = flops_per_token(config, instance_tokens, head_rows=0.15 * instance_tokens)
    assert f"compute: ~{per_token * tokens:.2e} FLOPs" in plan
    assert not output_dir.exists()


@pytest.mark.slow
def test_the_plan_names_the_checkpoint_a_resume_would_start_from(tmp_path, capsys, run_inputs):
    output_dir = tmp_path / "run"
    train_in_process(run_args(run_inputs, output_dir, "--max_train_steps", "2", "--checkpointing_steps", "2"))
    before = sorted(path.name for path in output_dir.iterdir())
    plan = plan_of(run_args(run_inputs, output_dir, "--max_train_steps", "2", "--resume_from_checkpoint", "latest"),
                   capsys)  # fmt: skip
    assert f"resume: from {output_dir / 'checkpoint-2'}" in plan
    assert sorted(path.name for path in output_dir.iterdir()) == before


def test_a_bad_flag_gets_the_refusal_of_a_real_run(tmp_path):
    with pytest.raises(Refusal, match=r"--learning_rate 0\.0 must be > 0"):
        main(["--output_dir", str(tmp_path / "run"), "--learning_rate", "0", "--dry_run"])


def test_an_epoch_budget_is_counted_from_the_corpus_and_a_time_budget_from_a_measured_step(tmp_path, capsys):
    plan = plan_of(["--output_dir", str(tmp_path / "run"), "--model_size", "tiny", "--num_train_epochs", "2"], capsys)
    instances = round(687982 * TOKENS_PER_BYTE) / (INSTANCE_FILL * 128)  # --dupe_factor 1
    assert f"updates: {2 * math.ceil(instances / 32):,};" in plan
    timed = plan_of(["--output_dir", str(tmp_path / "run"), "--model_size", "mini", "--max_train_seconds", "60"], capsys)
    assert "updates: as many as fit in 60 s (the step is not measured on this device)" in timed
