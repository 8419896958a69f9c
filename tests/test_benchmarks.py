"""The measurement scripts under benchmarks/ that the README's numbers come from."""

import importlib.util
import json
from pathlib import Path

import pytest
import torch
from conftest import tiny_config

from hfbert import HfBertForPreTraining

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"


def load_script(name: str):
    spec = importlib.util.spec_from_file_location(name, BENCHMARKS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


heldout_nsp = load_script("heldout_nsp")


def test_auc_ranks_random_pairs_above_real_ones():
    labels = torch.tensor([0, 0, 1, 1])  # 1 = B is random
    assert heldout_nsp.auc(torch.tensor([0.1, 0.2, 0.8, 0.9]), labels) == 1.0
    assert heldout_nsp.auc(torch.tensor([0.9, 0.8, 0.2, 0.1]), labels) == 0.0
    assert heldout_nsp.auc(torch.full((4,), 0.5), labels) == 0.5  # ties count half
    assert heldout_nsp.auc(torch.tensor([0.1, 0.6, 0.5, 0.9]), labels) == 0.75


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory, sample_tokenizer):
    torch.manual_seed(0)
    folder = tmp_path_factory.mktemp("heldout") / "tiny"
    HfBertForPreTraining(tiny_config(vocab_size=len(sample_tokenizer))).save_pretrained(folder)
    sample_tokenizer.save_pretrained(folder)
    return folder


def test_heldout_nsp_scores_fresh_pairings(model_dir, capsys):
    accuracies = heldout_nsp.main([str(model_dir), "--pairings", "2", "--batch_size", "16"])
    assert len(accuracies) == 2 and all(0.0 <= value <= 1.0 for value in accuracies)
    report = capsys.readouterr().out
    assert "| 0 |" in report and "| 1 |" in report and "mean NSP accuracy over 2 pairings" in report
    assert accuracies != heldout_nsp.main([str(model_dir), "--pairings", "2", "--seed", "7"])  # other pairs
    assert accuracies == heldout_nsp.main([str(model_dir), "--pairings", "2", "--batch_size", "16"])


def test_heldout_nsp_refuses_a_folder_without_model_or_tokenizer(tmp_path, capsys):
    with pytest.raises(SystemExit):
        heldout_nsp.main([str(tmp_path)])
    assert "has no config.json and tokenizer.json" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        heldout_nsp.main([str(tmp_path), "--pairings", "0"])
    assert "--pairings 0" in capsys.readouterr().err


def test_bench_batches_times_every_batch_builder_on_the_same_batches(capsys):
    bench_batches = load_script("bench_batches")
    results = bench_batches.main(["--batch_size", "16", "--seq_len", "64", "--batches", "2", "--vocab_size", "2000"])
    assert len(results) == 4 and all(ms > 0 for ms in results.values())
    report = capsys.readouterr().out
    assert "| transformers DataCollatorForLanguageModeling, rows |" in report
    assert "hfbert loader, static (length 64, 24 slots)" in report
    with pytest.raises(SystemExit):
        bench_batches.main(["--batch_size", "0"])
    assert "--batch_size 0 must be >= 1" in capsys.readouterr().err


def test_bench_loop_times_the_loop_its_bare_step_and_the_trainer_at_the_model_vocabulary(capsys):
    bench_loop = load_script("bench_loop")
    results = bench_loop.main(
        ["--model_size", "tiny", "--batch_size", "8", "--steps", "2", "--warmup_steps", "2", "--vocab_size", "12000"]
    )
    assert set(results) == {"hfbert loop", "hfbert bare step", "transformers Trainer"}
    assert all(tokens > 0 for tokens in results.values())
    report = capsys.readouterr().out
    # the model keeps the asked vocabulary although the sample trains a smaller tokenizer
    assert "tiny, model vocab 12000 (tokenizer " in report and "| transformers Trainer |" in report
    with pytest.raises(SystemExit):
        bench_loop.main(["--steps", "0"])
    assert "--steps 0 must be >= 1" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        bench_loop.main(["--model_size", "huge"])
    assert "invalid choice: 'huge'" in capsys.readouterr().err


def test_time_to_quality_reports_fp32_runs_as_fp32_and_when_hfbert_reaches_the_reference(tmp_path, capsys):
    time_to_quality = load_script("time_to_quality")
    for model, losses in {"hfbert": (6.0, 5.5, 5.7), "transformers": (6.5, 6.2, 5.6)}.items():
        folder = tmp_path / model
        folder.mkdir()
        rows = [
            {"step": 10 * (i + 1), "train_seconds": 100.0 * (i + 1), "eval_mlm_loss": loss,
             "eval_mlm_accuracy": 0.1, "eval_nsp_loss": 0.69, "eval_nsp_accuracy": 0.5}
            for i, loss in enumerate(losses)
        ]  # fmt: skip
        (folder / "log_history.json").write_text(json.dumps(rows))
        (folder / "eval_results.json").write_text(json.dumps(rows[-1]))
        (folder / "training_args.json").write_text(json.dumps({"precision": "no"}))
    time_to_quality.report(tmp_path, ["--max_train_seconds", "300"])
    report = capsys.readouterr().out
    assert "Time to quality (fp32, torch" in report  # accelerate calls fp32 "no"
    assert "MLM loss NO, MLM accuracy NO, NSP accuracy NO" in report  # 5.7 > 5.6, ties are not better
    assert "after 180 s of training, 0.60 of the time" in report  # 6.0 -> 5.5 crosses 5.6 at 180 s
    assert (tmp_path / "time_to_quality.png").stat().st_size > 0


@pytest.mark.slow
def test_bench_data_stage_reuses_the_cache_on_a_second_run_and_a_resume(capsys, monkeypatch):
    monkeypatch.setenv("PYTHONPATH", str(BENCHMARKS.parent))  # the stages' processes import this checkout
    rows = load_script("bench_data_stage").main(["--vocab_size", "300", "--dupe_factor", "2"])
    assert [row["new_cache_files"] > 0 for row in rows] == [True, False, False]
    assert len({row["instances"] for row in rows}) == 1
    assert "| resume (tokenizer from checkpoint-N/tokenizer) |" in capsys.readouterr().out


@pytest.mark.slow
def test_bench_sampler_memory_measures_both_ways(monkeypatch, capsys):
    monkeypatch.setenv("PYTHONPATH", str(BENCHMARKS.parent))
    rows = load_script("bench_sampler_memory").main(["--instances", "2000000", "--batch_size", "8"])
    # A list of 2M Python ints is ~90 MiB; the int64 permutation 15 MiB.
    assert rows[0]["EpochDraws"] < rows[0]["list"] / 2
    assert "| 2,000,000 |" in capsys.readouterr().out
