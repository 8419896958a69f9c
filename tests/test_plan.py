"""--dry_run (hfbert.pretraining.extras.plan): the plan printed after the checks, nothing written."""

import bz2
import gzip
import json
import logging
import math
import shutil
from functools import partial

import pytest
import torch
from accelerate import Accelerator
from conftest import DAMAGES, damage
from datasets import Dataset
from test_pretraining_settings import REFUSED_FLAGS
from test_training import (
    BAD_FLAGS,
    MISMATCHES,
    STREAM_REFUSALS,
    mismatch_args,
    run_args,
    train_in_process,
    write_config,
)

from hfbert import HfBertConfig, HfBertForPreTraining
from hfbert.corpus_arguments import SHIPPED_SAMPLE_DIR, SHIPPED_SAMPLE_FILES
from hfbert.errors import Refusal
from hfbert.files import run_folder_lock
from hfbert.pretraining.cli import main, parse_args
from hfbert.pretraining.extras.plan import INSTANCE_FILL, TOKENS_PER_BYTE, budget_lines
from hfbert.pretraining.flops import flops_per_token
from hfbert.tokenization import model_config_for_tokenizer


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


def gpu_plan(monkeypatch, device_name: str, *flags: str) -> list[str]:
    """The budget lines on a CUDA device of that name (no GPU needed: the device is only named and typed)."""
    from types import SimpleNamespace

    import torch

    from hfbert.pretraining.extras import plan

    monkeypatch.setattr(plan, "device_kind", lambda device: device_name)
    settings = parse_args(["--output_dir", "run", "--model_size", "base", "--per_device_train_batch_size", "128",
                           "--max_train_steps", "10000", *flags])  # fmt: skip
    accelerator = SimpleNamespace(device=torch.device("cuda"), mixed_precision="fp16", num_processes=1)
    config = HfBertConfig.from_preset("base", vocab_size=30522)
    return budget_lines(settings, accelerator, config, 128, None)


def test_the_plan_gives_a_gpu_run_the_time_measured_on_its_device_with_the_commit(monkeypatch):
    """The plan knew CPU speeds only: a run on the H200 that gpu_h200.md measured was 'not measured'."""
    (line,) = [line for line in gpu_plan(monkeypatch, "NVIDIA H200") if line.startswith("expected training time")]
    rate = 385_725 / (128 * 122.3)  # the compiled loop's tokens/s, in updates of 128 instances of 122.3 tokens
    assert line.startswith(f"expected training time: ~{10000 / rate / 60:.0f} min ({rate:.1f} updates/s")
    assert "NVIDIA H200" in line and "2422e49" in line and "gpu_h200.md" in line
    (eager,) = [line for line in gpu_plan(monkeypatch, "NVIDIA H200", "--torch_compile", "false") if "time" in line]
    assert f"({308_700 / (128 * 122.3):.1f} updates/s" in eager
    for device, flags in [("NVIDIA A100-SXM4-80GB", ()), ("NVIDIA H200", ("--max_seq_length", "512"))]:
        (unmeasured,) = [line for line in gpu_plan(monkeypatch, device, *flags) if "time" in line]
        assert unmeasured.startswith("expected training time: not measured"), unmeasured


def test_the_plan_names_the_commit_and_page_of_the_cpu_speed_it_uses(tmp_path, capsys):
    plan = plan_of(["--recipe", "quick-start", "--output_dir", str(tmp_path / "run")], capsys)
    (line,) = [line for line in plan.splitlines() if "expected training time" in line]
    assert ("27b5ed5" in line and "downstream.md" in line) or ("e097322" in line and "one_of_each.md" in line), line


# --------------------------------------------------------------- the dry run refuses what the run refuses


def refusal_of(args: list[str]) -> str:
    with pytest.raises(Refusal) as refused:
        train_in_process(args)
    return str(refused.value)


def corpus_args(run_inputs, output_dir, corpus) -> list[str]:
    return run_args(run_inputs, output_dir, "--max_train_steps", "2", "--train_file", str(corpus))


def a_corpus_folder(tmp_path, texts: dict[str, bytes]):
    folder = tmp_path / "texts"
    for name, content in texts.items():
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_bytes(content)
    return folder


def mismatch_run(tmp_path, run_inputs, case: str) -> list[str]:
    return mismatch_args(tmp_path, run_inputs, tmp_path / "run", case)


def damaged_run(tmp_path, run_inputs, flag: str, how: str) -> list[str]:
    """test_a_damaged_config_or_tokenizer_file_is_named_before_any_work's run."""
    given = tmp_path / "given"
    if flag == "--config_name":
        shutil.copy(run_inputs["config"], given)
        damage(given, how)
    else:
        shutil.copytree(run_inputs["tokenizer"], given)
        damage(given / "tokenizer.json", how)
    args = run_args(run_inputs, tmp_path / "run", "--max_train_steps", "2")
    args[args.index(flag) + 1] = str(given)
    return args


def without_tokenizer(args: list[str]) -> list[str]:
    at = args.index("--tokenizer_name")
    return args[:at] + args[at + 2 :]


GOOD_TEXT = b"A sentence of text. Another one follows here.\n"
NO_TOKENS = "\u200b\n".encode()  # a zero-width space: text to the corpus, nothing to BERT's normalizer
SEED = 7  # the run's --seed in the cases that hold documents out of the training corpus


def texts(count: int) -> dict[str, bytes]:
    """`count` files of a document each, every one other words."""
    return {f"{i:02}.txt": f"Document {i} tells of river {i * 7} today. It flows on and on.\n".encode() for i in range(count)}


def trained_tokenizer_run(tmp_path, run_inputs, *flags: str, **config) -> list[str]:
    """A run that trains its tokenizer on 40 short documents, with a model config of `config`'s fields."""
    args = without_tokenizer(corpus_args(run_inputs, tmp_path / "run", a_corpus_folder(tmp_path, texts(40))))
    args[args.index("--config_name") + 1] = str(write_config(tmp_path / "c", **config))
    return [*args, *flags]


def held_out_without_text(tmp_path, run_inputs) -> list[str]:
    """40 documents, the 2 the run holds out for validation (as Dataset.train_test_split picks them) without text."""
    held_out = Dataset.from_dict({"i": list(range(40))}).train_test_split(test_size=2, seed=SEED)["test"]["i"]
    folder = a_corpus_folder(tmp_path, {**texts(40), **{f"{i:02}.txt": NO_TOKENS for i in held_out}})
    return [*corpus_args(run_inputs, tmp_path / "run", folder), "--seed", str(SEED)]
# Every refusal of the run that comes before training, built as its own test builds it (test_training.py).
REFUSALS_BEFORE_WORK = {
    "an output dir that is a file": lambda tmp_path, run_inputs: (
        (tmp_path / "run").write_text("not a folder"), run_args(run_inputs, tmp_path / "run", "--max_train_steps", "2")
    )[1],
    "an output dir of another run": lambda tmp_path, run_inputs: (
        (tmp_path / "run" / "checkpoint-4").mkdir(parents=True),
        run_args(run_inputs, tmp_path / "run", "--max_train_steps", "2"),
    )[1],
    "a folder of the user's own files": lambda tmp_path, run_inputs: (
        (tmp_path / "run").mkdir(), (tmp_path / "run" / "README.md").write_text("mine"),
        run_args(run_inputs, tmp_path / "run", "--max_train_steps", "2"),
    )[2],
    "a run killed during its first save": lambda tmp_path, run_inputs: (
        (tmp_path / "run" / ".tmp-checkpoint-3").mkdir(parents=True),
        run_args(run_inputs, tmp_path / "run", "--max_train_steps", "2"),
    )[1],
    "a missing tokenizer folder": lambda tmp_path, run_inputs: [
        *run_args(run_inputs, tmp_path / "run", "--max_train_steps", "2"), "--tokenizer_name", str(tmp_path / "none")
    ],
    "a push to an unreachable Hub": lambda tmp_path, run_inputs: run_args(
        run_inputs, tmp_path / "run", "--max_train_steps", "2", "--push_to_hub", "--hub_model_id", "me/m"
    ),
    **{
        f"a tokenizer and config that disagree: {case}": partial(mismatch_run, case=case) for case, _ in MISMATCHES
    },
    "a stream resumed with no checkpoint and no tokenizer": lambda tmp_path, run_inputs: [
        *without_tokenizer(run_args(run_inputs, tmp_path / "run", "--max_train_steps", "2")),
        *["--streaming", "--stream_validation_documents", "4", "--resume_from_checkpoint", "auto"],
    ],
    **{
        f"a {how} {flag} file": partial(damaged_run, flag=flag, how=how)
        for flag in ("--config_name", "--tokenizer_name")
        for how in DAMAGES
    },
    "a --max_seq_length beyond the position embeddings, with a tokenizer to train": lambda tmp_path, run_inputs: (
        without_tokenizer(run_args(run_inputs, tmp_path / "run", "--max_train_steps", "2", "--max_seq_length", "256"))
    ),
    "a corpus too small to hold out validation documents": lambda tmp_path, run_inputs: corpus_args(
        run_inputs, tmp_path / "run", a_corpus_folder(tmp_path, {f"{i}.txt": GOOD_TEXT for i in range(3)})
    ),
    "a corpus of one document, for --objective mlm": lambda tmp_path, run_inputs: [
        *corpus_args(run_inputs, tmp_path / "run", a_corpus_folder(tmp_path, texts(1))), "--objective", "mlm"
    ],
    "a missing corpus file": lambda tmp_path, run_inputs: corpus_args(run_inputs, tmp_path / "run", tmp_path / "no.txt"),
    "a glob matching nothing": lambda tmp_path, run_inputs: corpus_args(run_inputs, tmp_path / "run", tmp_path / "*.txt"),
    "an empty corpus folder": lambda tmp_path, run_inputs: corpus_args(
        run_inputs, tmp_path / "run", a_corpus_folder(tmp_path, {".hidden": b"x"})
    ),
    "a binary file in the corpus folder": lambda tmp_path, run_inputs: corpus_args(
        run_inputs, tmp_path / "run", a_corpus_folder(tmp_path, {"a.txt": GOOD_TEXT, "b.bin": b"\0\1"})
    ),
    "a latin-1 file in the corpus folder": lambda tmp_path, run_inputs: corpus_args(
        run_inputs, tmp_path / "run", a_corpus_folder(tmp_path, {"a.txt": GOOD_TEXT, "b.txt": b"Caf\xe9.\n"})
    ),
    "a corpus without text": lambda tmp_path, run_inputs: corpus_args(
        run_inputs, tmp_path / "run", a_corpus_folder(tmp_path, {"a.txt": b"\n\n", "b.txt": b" \n"})
    ),
    # refused by the run's data stage, after its work: the dry run meets them in memory
    "a --vocab_size below the corpus's characters": lambda tmp_path, run_inputs: trained_tokenizer_run(
        tmp_path, run_inputs, "--vocab_size", "10"
    ),
    "a trained tokenizer larger than --config_name's vocab_size": partial(trained_tokenizer_run, vocab_size=20),
    "a trained tokenizer with another pad id than --config_name's": partial(trained_tokenizer_run, pad_token_id=1),
    "a training split with fewer than two documents of text after tokenizing": lambda tmp_path, run_inputs: corpus_args(
        run_inputs, tmp_path / "run", a_corpus_folder(tmp_path, {**{f"{i:02}.txt": NO_TOKENS for i in range(40)}, "a.txt": GOOD_TEXT})
    ),
    "a validation corpus without text after tokenizing": lambda tmp_path, run_inputs: [
        *corpus_args(run_inputs, tmp_path / "run", a_corpus_folder(tmp_path, texts(40))),
        *["--validation_file", str(a_corpus_folder(tmp_path / "v", {"a.txt": NO_TOKENS, "b.txt": NO_TOKENS}))],
    ],
    "a held-out split without text after tokenizing": held_out_without_text,
    "a validation corpus without text after tokenizing, for --objective mlm": lambda tmp_path, run_inputs: [
        *corpus_args(run_inputs, tmp_path / "run", a_corpus_folder(tmp_path, texts(40))),
        *["--validation_file", str(a_corpus_folder(tmp_path / "v", {"a.txt": NO_TOKENS, "b.txt": NO_TOKENS})), "--objective", "mlm"],
    ],
    "a stream's validation documents without text after tokenizing": lambda tmp_path, run_inputs: [
        *corpus_args(run_inputs, tmp_path / "run", a_corpus_folder(tmp_path, {**texts(40), "00.txt": NO_TOKENS})),
        *["--streaming", "--stream_validation_documents", "2"],
    ],
}


@pytest.mark.parametrize("case", REFUSALS_BEFORE_WORK)
def test_the_dry_run_refuses_every_refusal_of_the_run_with_the_same_line(tmp_path, run_inputs, case):
    args = REFUSALS_BEFORE_WORK[case](tmp_path, run_inputs)
    before = sorted(str(path) for path in tmp_path.rglob("*"))
    dry = refusal_of([*args, "--dry_run"])
    assert sorted(str(path) for path in tmp_path.rglob("*")) == before  # the dry run wrote nothing
    assert dry == refusal_of(args)


def test_the_dry_run_refuses_a_folder_in_use_with_the_line_of_the_run(tmp_path, run_inputs):
    output_dir = tmp_path / "run"
    args = run_args(run_inputs, output_dir, "--max_train_steps", "2")
    with run_folder_lock(output_dir):  # this process plays the first run
        before = sorted(output_dir.rglob("*"))
        dry = refusal_of([*args, "--dry_run"])
        assert sorted(output_dir.rglob("*")) == before
        assert dry == refusal_of(args)
    assert "is in use" in dry


@pytest.mark.parametrize(
    ("flags", "message"),
    [(["--output_dir", "unused", *flags], message) for flags, message in REFUSED_FLAGS + BAD_FLAGS]
    + [(["--output_dir", "unused", "--streaming", "--dataset_name", "w", *flags], message) for flags, message in STREAM_REFUSALS],
)
def test_the_dry_run_refuses_every_refused_flag(flags, message, capsys):
    with pytest.raises((Refusal, SystemExit)) as error:
        main([*flags, "--dry_run"])
    assert message in str(error.value) + capsys.readouterr().err


def test_a_corpus_folder_or_glob_that_the_dry_run_passes_is_trained_on(tmp_path, run_inputs, capsys):
    texts = {f"doc{i:03}.txt": f"Document {i} says one thing. Then it says another thing.\n".encode() * 8 for i in range(120)}
    folder = a_corpus_folder(tmp_path, texts)
    size = sum(len(text) for text in texts.values())
    for corpus in (folder, f"{folder}/doc0*.txt"):
        plan = plan_of(corpus_args(run_inputs, tmp_path / "run", corpus), capsys)
        files = 120 if corpus == folder else 100
        assert f"corpus: {files} files" in plan
    assert f"corpus: 120 files, {size / 1e6:.1f} MB" in plan_of(corpus_args(run_inputs, tmp_path / "run", folder), capsys)
    train_in_process(corpus_args(run_inputs, tmp_path / "run", folder))
    assert (tmp_path / "run" / "model.safetensors").is_file()
    statistics = json.loads((tmp_path / "run" / "run_health.json").read_text())["statistics"]
    assert statistics["documents"] == 120 - 6  # a file a document, 5% held out for validation


def held_out_lines(caplog) -> list[str]:
    return [record.getMessage() for record in caplog.records if "--validation_split_percentage" in record.getMessage()]


@pytest.mark.parametrize(("objective", "held_out"), [("mlm+nsp", 2), ("mlm", 1)])
def test_a_small_corpus_holds_out_what_the_objective_needs_and_the_dry_run_says_so(
    tmp_path, run_inputs, capsys, caplog, objective, held_out
):
    """20 documents, 5% held out: one validation document, enough for --objective mlm (no B segment from another
    document); NSP holds out 2 and says so in one INFO line, the same in the dry run as in the run."""
    args = [*corpus_args(run_inputs, tmp_path / "run", a_corpus_folder(tmp_path, texts(20))), "--objective", objective]
    with caplog.at_level(logging.INFO, "hfbert"):
        assert "updates: 2;" in plan_of(args, capsys)
        said_by_the_dry_run = held_out_lines(caplog)
        caplog.clear()
        train_in_process(args)
    assert held_out_lines(caplog) == said_by_the_dry_run
    said = (
        "--validation_split_percentage 5 holds out 1 of the 20 documents; next-sentence prediction needs at least 2 "
        "documents in each split (B segments come from another document), so 2 are held out for validation and 18 "
        "train (--validation_file gives a validation corpus of your own)"
    )
    assert said_by_the_dry_run == ([] if held_out == 1 else [said])
    statistics = json.loads((tmp_path / "run" / "run_health.json").read_text())["statistics"]
    assert statistics["documents"] == 20 - held_out


@pytest.mark.slow
def test_the_dry_run_refuses_nodes_that_disagree_with_the_line_of_the_run(tmp_path, run_inputs):
    """The multi-process refusal (processes with other flags) replayed as REFUSALS_BEFORE_WORK replays the others:
    two nodes of one process each, the second with another --learning_rate."""
    from test_multinode import STEPS, cpu_env, launch_nodes

    args = run_args(run_inputs, tmp_path / "run", *STEPS)
    other = [*args, "--learning_rate", "3e-4"]  # the last occurrence of a flag wins

    def refusal_lines(*flags: str) -> list[str]:
        results = launch_nodes(tmp_path, [[*args, *flags], [*other, *flags]], [cpu_env(), cpu_env()])
        assert all(code != 0 for code, _ in results), [output[-3000:] for _, output in results]
        return [line for _, output in results for line in output.splitlines() if "error: The processes" in line]

    before = sorted(str(path) for path in tmp_path.rglob("*") if not path.name.startswith("node"))  # not the logs
    dry = refusal_lines("--dry_run")
    assert sorted(str(path) for path in tmp_path.rglob("*") if not path.name.startswith("node")) == before
    assert len(dry) == 2 and dry == refusal_lines()
    assert "--learning_rate 0.0003 (rank 0: 0.001)" in dry[0]


def test_an_epoch_budget_on_a_hub_corpus_not_yet_downloaded_has_unknown_updates(tmp_path):
    # The corpus's size is unknown before the download (corpus_tokens None): the plan says so, not a crash.
    settings = parse_args(["--output_dir", str(tmp_path / "run"), "--model_size", "tiny", "--num_train_epochs", "2"])
    config = HfBertConfig.from_preset("tiny")
    lines = budget_lines(settings, Accelerator(cpu=True), config, 32, None)
    assert lines == ["updates: those of the epochs, unknown until the Hub dataset is downloaded"]


# ------------------------------------------------------------------------------------------------ issue 64


def parameters_of(config: HfBertConfig) -> int:
    with torch.device("meta"):
        return sum(p.numel() for p in HfBertForPreTraining(config).parameters())


def test_the_plan_counts_the_model_the_run_builds_with_its_tokenizers_vocabulary(tmp_path, capsys, run_inputs,
                                                                                  sample_tokenizer):  # fmt: skip
    """With --tokenizer_name the plan counted --vocab_size's default 30,522 tokens (4.4M parameters, where the run
    builds 0.6M); a tokenizer the run trains comes out smaller than --vocab_size on a small corpus."""
    run = ["--model_size", "tiny", "--output_dir", str(tmp_path / "run")]
    plan = plan_of([*run, "--tokenizer_name", str(run_inputs["tokenizer"])], capsys)
    built = parameters_of(model_config_for_tokenizer(sample_tokenizer, "tiny"))
    assert f"model: 2 layers x 128, vocabulary 1000: {built / 1e6:.1f}M parameters" in plan
    plan = plan_of(run, capsys)  # the shipped sample holds 11,464 WordPiece tokens of the 30,522 asked for
    assert f"vocabulary 11464: {parameters_of(HfBertConfig.from_preset('tiny', vocab_size=11464)) / 1e6:.1f}M" in plan
    hub = ["--dataset_name", "someone/corpus", "--max_train_steps", "10"]  # not read by the dry run
    plan = plan_of([*run, *hub, "--tokenizer_name", str(run_inputs["tokenizer"])], capsys)
    assert f"model: 2 layers x 128, vocabulary 1000: {built / 1e6:.1f}M parameters" in plan


def compressed_sample(path, compress) -> tuple[int, int]:
    """The shipped sample's training text, compressed into `path`: (its text's bytes, the file's)."""
    text = (SHIPPED_SAMPLE_DIR / SHIPPED_SAMPLE_FILES["train"]).read_bytes()
    path.write_bytes(compress(text))
    return len(text), path.stat().st_size


def test_a_compressed_corpus_is_planned_by_its_text_not_its_compressed_size(tmp_path, capsys, run_inputs):
    """A gzip corpus was planned at its compressed size (1.2 MB, where the run cached 510 MB)."""
    text, compressed = compressed_sample(tmp_path / "wiki.train.raw.gz", gzip.compress)
    plan = plan_of(corpus_args(run_inputs, tmp_path / "run", tmp_path / "wiki.train.raw.gz"), capsys)
    tokens = round(text * TOKENS_PER_BYTE)
    assert f"corpus: {text / 1e6:.1f} MB of text in {compressed / 1e6:.1f} MB compressed, ~{tokens:,} tokens" in plan
    assert f"data stage: ~{2.2 * tokens / 1e6:.1f} MB in the datasets cache" in plan


def test_a_compressed_file_longer_than_the_sample_read_is_estimated_and_said_so(tmp_path, capsys, run_inputs,
                                                                                monkeypatch):  # fmt: skip
    text, compressed = compressed_sample(tmp_path / "wiki.train.raw.bz2", bz2.compress)
    monkeypatch.setattr("hfbert.pretraining.extras.plan.TEXT_SAMPLE_BYTES", 100_000)  # of the sample's 0.69 MB
    plan = plan_of(corpus_args(run_inputs, tmp_path / "run", tmp_path / "wiki.train.raw.bz2"), capsys)
    [line] = [line.strip() for line in plan.splitlines() if line.strip().startswith("corpus: ")]
    estimate = float(line.removeprefix("corpus: ~").split(" MB")[0])
    assert line.startswith("corpus: ~") and abs(estimate - text / 1e6) < 0.1 * text / 1e6, line
    assert (f" MB of text in {compressed / 1e6:.1f} MB compressed (estimated from the first 0.1 MB of each file's text"
            in line)  # fmt: skip
