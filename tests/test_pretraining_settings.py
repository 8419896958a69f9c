"""hfbert.pretraining.settings: every flag checked in one place, before any work; resume comparisons."""

import json
import re
import subprocess
from importlib.metadata import version
from pathlib import Path

import pytest
from conftest import tiny_config

from hfbert.errors import Refusal
from hfbert.pretraining.cli import parse_args
from hfbert.pretraining.settings import PRECISION, UPDATE_CHANGES, UPDATE_REVISION, check_resume_settings

REPO = Path(__file__).resolve().parents[1]

REFUSED_FLAGS = [
    (["--logging_steps", "0"], "--logging_steps 0 must be > 0"),
    (["--eval_steps", "0"], "--eval_steps 0 must be > 0 (or leave it unset)"),
    (["--checkpoints_total_limit", "0", "--checkpointing_steps", "5"], "--checkpoints_total_limit 0 must be > 0"),
    (["--checkpoints_total_limit", "2"], "without --checkpointing_steps"),
    (["--checkpointing_steps", "often"], "must be a positive number of updates or 'epoch'"),
    (["--max_train_seconds", "-1"], "--max_train_seconds -1.0 must be > 0"),
    (["--learning_rate", "0"], "--learning_rate 0.0 must be > 0"),
    (["--mlm_probability", "1.5"], "--mlm_probability 1.5 must be in (0, 1)"),
    (["--dropout", "1.0"], "--dropout 1.0 must be in [0, 1)"),
    (["--nsp_loss_weight", "-1"], "--nsp_loss_weight -1.0 must be >= 0"),
    (["--structured_attention_fade", "1.5"], "--structured_attention_fade 1.5 must be a fraction of the budget"),
    (
        ["--attention_init", "bert", "--structured_attention_fade", "0.5"],
        "--attention_init bert has none; drop --structured_attention_fade or pass --attention_init structured",
    ),
    (["--model_name_or_path", "src", "--structured_attention_fade", "1"], "weights hold no structured start to fade"),
    (["--cls_attention_spread", "-1"], "--cls_attention_spread -1.0 must be >= 0"),
    (["--cls_attention_spread", "1", "--torch_compile"], "drop --torch_compile or --cls_attention_spread"),
    (["--validation_split_percentage", "0"], "must be in (0, 100)"),
    (["--push_to_hub"], "--push_to_hub needs --hub_model_id"),
    # Validated pushed or not: the model card's Python snippets load it (quotes and newlines landed in them raw).
    (["--hub_model_id", 'me/x")\nimport os'], '--hub_model_id me/x")\nimport os: Repo id must'),
    (["--hub_model_id", "a/b/c"], "--hub_model_id a/b/c: Repo id must"),
    # The card said from_pretrained("hfbert-x"), and the Hub creates <user>/hfbert-x: no one could load it.
    (["--hub_model_id", "hfbert-x"], "--hub_model_id hfbert-x has no namespace"),
    (["--max_grad_norm", "nan"], "--max_grad_norm nan must be a finite number, e.g. 1.0"),
    (["--max_train_seconds", "nan"], "--max_train_seconds nan must be a finite number"),
    (["--max_train_seconds", "inf"], "--max_train_seconds inf must be a finite number"),
    (["--learning_rate", "nan"], "--learning_rate nan must be a finite number, e.g. 0.0001"),
    (["--adam_beta1", "1.5"], "--adam_beta1 1.5 must be in [0, 1)"),
    (["--adam_beta2", "1.0"], "--adam_beta2 1.0 must be in [0, 1)"),
    (["--adam_epsilon", "-1"], "--adam_epsilon -1.0 must be > 0"),
    (["--adam_epsilon", "0"], "--adam_epsilon 0.0 must be > 0"),
    (
        ["--tokenizer_name", "tok", "--vocab_size", "8192"],
        "--vocab_size 8192 only sizes the tokenizer a run trains, and --tokenizer_name tok is the run's tokenizer "
        "(the model's vocabulary is its size); drop --vocab_size",
    ),
    (
        ["--model_size", "tiny", "--max_seq_length", "1024"],
        "--max_seq_length 1024 exceeds the max_position_embeddings 512 of --model_size tiny; pass "
        "--max_seq_length <= 512",
    ),
]


@pytest.mark.parametrize(("flags", "message"), REFUSED_FLAGS)
def test_bad_flags_are_refused_when_parsed(flags, message):
    with pytest.raises(ValueError) as error:
        parse_args(["--output_dir", "unused", *flags])
    assert message in str(error.value)


def test_the_structured_fade_is_resolved_for_a_fresh_structured_model_only():
    assert parse_args(["--output_dir", "o", "--attention_init", "structured"]).model.structured_attention_fade == 0.0
    assert parse_args(["--output_dir", "o"]).model.structured_attention_fade is None  # the bert start: none to fade


def test_resume_refuses_another_fade_or_spread_and_a_longer_budget_under_a_fade():
    fading = ["--output_dir", "o", "--lr_scheduler_type", "constant", "--attention_init", "structured",
              "--structured_attention_fade", "0.5"]  # fmt: skip
    saved = parse_args([*fading, "--max_train_steps", "10"]).checkpoint_settings()
    with pytest.raises(ValueError, match=r"--max_train_steps 10 in the checkpoint, 20 now \(--structured_attention_fade"):
        check_resume_settings(saved, parse_args([*fading, "--max_train_steps", "20"]), "ckpt", "cpu", "bf16")
    other = parse_args([*fading[:-1], "1", "--max_train_steps", "10"])
    with pytest.raises(ValueError, match=r"--structured_attention_fade 0.5 in the checkpoint, 1.0 now"):
        check_resume_settings(saved, other, "ckpt", "cpu", "bf16")
    spread = parse_args([*fading, "--max_train_steps", "10", "--cls_attention_spread", "1"])
    with pytest.raises(ValueError, match=r"--cls_attention_spread 0.0 in the checkpoint, 1.0 now"):
        check_resume_settings(saved, spread, "ckpt", "cpu", "bf16")


def test_resume_refuses_changed_flags_and_allows_a_longer_constant_schedule():
    saved = parse_args(["--output_dir", "o", "--max_train_steps", "10"]).checkpoint_settings()
    changed = parse_args(["--output_dir", "o", "--max_train_steps", "10", "--model_size", "small"])
    with pytest.raises(ValueError, match=r"--model_size 'mini' in the checkpoint, 'small' now"):
        check_resume_settings(saved, changed, "ckpt", "cpu", "bf16")
    longer = parse_args(["--output_dir", "o", "--max_train_steps", "20"])
    with pytest.raises(ValueError) as refused:
        check_resume_settings(saved, longer, "ckpt", "cpu", "bf16")
    assert str(refused.value) == (
        "--resume_from_checkpoint ckpt: these flags differ from the run that wrote the checkpoint: "
        "--max_train_steps 10 in the checkpoint, 20 now (the linear learning-rate schedule is laid out over the "
        "planned budget, so changing it makes the learning rate jump; only a constant schedule can be extended). "
        "Resume with the original values (see run_settings.json in the checkpoint), or start a new run with a new "
        "--output_dir"
    )
    constant = ["--output_dir", "o", "--lr_scheduler_type", "constant"]
    saved = parse_args([*constant, "--max_train_steps", "10"]).checkpoint_settings()
    notes = check_resume_settings(saved, parse_args([*constant, "--max_train_steps", "20"]), "ckpt", "cpu", "bf16")
    assert notes == ["--max_train_steps changed from 10 to 20: training continues to the new budget"]
    assert check_resume_settings(None, longer, "old", "cpu", "bf16")[0].startswith("old records no run settings")


def test_resume_refuses_a_corpus_whose_content_changed(tmp_path):
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("First sentence here. Second one.\n")
    flags = ["--output_dir", "o", "--train_file", str(corpus), "--max_train_steps", "10"]
    saved = parse_args(flags).checkpoint_settings()
    assert check_resume_settings(saved, parse_args(flags), "ckpt", "cpu", "bf16") == []
    corpus.write_text("First sentence here. Second one, edited.\n")
    now = parse_args(flags).checkpoint_settings()["corpus_sha256"]
    with pytest.raises(ValueError) as refused:
        check_resume_settings(saved, parse_args(flags), "ckpt", "cpu", "bf16")
    assert (
        f"the corpus ({corpus}) has changed since the checkpoint was written (content sha256 "
        f"{saved['corpus_sha256'][:12]}... then, {now[:12]}... now): restore the files it was trained on"
    ) in str(refused.value)


def test_resume_refuses_a_local_dataset_folder_whose_files_changed(tmp_path):
    """The third attack (7c6b93a), F3: a local --dataset_name folder had no fingerprint; its edited text resumed."""
    folder = tmp_path / "my-dataset"
    folder.mkdir()
    for split in ("train", "validation"):
        (folder / f"{split}.txt").write_text(f"The {split} text. Another sentence.\n")
    flags = ["--output_dir", "o", "--dataset_name", str(folder), "--max_train_steps", "10"]
    saved = parse_args(flags).checkpoint_settings()
    assert check_resume_settings(saved, parse_args(flags), "ckpt", "cpu", "bf16") == []
    (folder / "train.txt").write_text("The train text, edited.\n")
    with pytest.raises(ValueError, match=re.escape(f"the corpus ({folder}) has changed since the checkpoint was")):
        check_resume_settings(saved, parse_args(flags), "ckpt", "cpu", "bf16")


def test_resume_refuses_a_config_name_file_whose_values_changed(tmp_path):
    """The fourth attack (aca973c), F2: --config_name's file edited (dropout 0.1 -> 0.5) between the run and its
    resume: only the flag's value (the path) was compared, so the resume trained on at 0.5 without a word."""
    config = tmp_path / "cfg.json"
    tiny_config(vocab_size=1000).save_pretrained(tmp_path)
    (tmp_path / "config.json").rename(config)
    flags = ["--output_dir", "o", "--config_name", str(config), "--max_train_steps", "10"]
    saved = json.loads(json.dumps(parse_args(flags).checkpoint_settings()))  # as run_settings.json gives it back
    assert check_resume_settings(saved, parse_args(flags), "ckpt", "cpu", "bf16") == []
    config.write_text(config.read_text().replace('"hidden_dropout_prob": 0.1', '"hidden_dropout_prob": 0.5'))
    with pytest.raises(ValueError) as refused:
        check_resume_settings(saved, parse_args(flags), "ckpt", "cpu", "bf16")
    assert (
        f"--config_name {config} holds other values than when the checkpoint was written (hidden_dropout_prob "
        "0.1 then, 0.5 now): restore the file it was trained with"
    ) in str(refused.value)
    older = {name: value for name, value in saved.items() if name != "config_values"}  # a checkpoint before it
    assert check_resume_settings(older, parse_args(flags), "ckpt", "cpu", "bf16") == []


@pytest.mark.parametrize(
    "flag", [("--attention_padding", "varlen"), ("--torch_compile_mode", "max-autotune"), ("--deterministic", "true")]
)
def test_resume_refuses_a_flag_that_changes_the_updates_arithmetic(flag):
    """The fifth attack (c7ce483), F6: --attention_padding varlen on a resume of a mask run went on silently,
    1.2e-4 from the straight run (the compile mode and --deterministic change the kernels too)."""
    flags = ["--output_dir", "o", "--max_train_steps", "10"]
    saved = parse_args(flags).checkpoint_settings()
    with pytest.raises(ValueError, match=re.escape(flag[0])):
        check_resume_settings(saved, parse_args([*flags, *flag]), "ckpt", "cpu", "bf16")


def test_resume_compares_the_precision_the_run_trained_in_not_the_flag_as_given():
    """The fifth attack (c7ce483), F6's other half: --mixed_precision auto was compared as given, so a run that
    resolved to bf16 (a CPU with native bf16, or accelerate launch --mixed_precision bf16) resumed in fp32 (a CPU
    without it) or fp16 (a GPU) with no word."""
    flags = ["--output_dir", "o", "--max_train_steps", "10"]
    saved = parse_args(flags).checkpoint_settings() | {PRECISION: "bf16"}  # as run_checkpoints records it
    assert check_resume_settings(saved, parse_args(flags), "ckpt", "cpu", "bf16") == []
    with pytest.raises(ValueError) as refused:
        check_resume_settings(saved, parse_args(flags), "ckpt", "cpu", "no")
    assert (
        "the checkpoint trained in bf16 and this launch would train in fp32 (--mixed_precision auto on cpu): "
        "pass --mixed_precision bf16"
    ) in str(refused.value)
    # The fix the refusal names resumes it: the same arithmetic, another way of asking for it.
    assert check_resume_settings(saved, parse_args([*flags, "--mixed_precision", "bf16"]), "ckpt", "cpu", "bf16") == []
    older = {name: value for name, value in saved.items() if name != PRECISION}  # a checkpoint before it: the flag
    with pytest.raises(ValueError, match=re.escape("--mixed_precision 'auto' in the checkpoint, 'bf16' now")):
        check_resume_settings(older, parse_args([*flags, "--mixed_precision", "bf16"]), "ckpt", "cpu", "bf16")


def test_a_tilde_in_the_output_dir_is_the_folder_the_checks_and_the_run_both_use(tmp_path, monkeypatch):
    """The fifth attack (c7ce483), F5: --output_dir '~/out' (quoted, or from a recipe) passed the corpus check,
    which expanded it, and the run wrote ./~/out, inside the --train_file folder it was run from."""
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert parse_args(["--output_dir", "~/out", "--max_train_steps", "1"]).output.output_dir == str(tmp_path / "home" / "out")


def test_a_flag_the_command_leaves_unset_compares_by_what_it_resolves_to():
    flags = ["--output_dir", "o", "--max_train_steps", "10"]
    saved = parse_args(flags).checkpoint_settings() | {"torch_compile": False}  # an hfbert whose default was False
    assert check_resume_settings(saved, parse_args(flags), "ckpt", "cpu", "bf16") == []  # unset: eager on a CPU
    with pytest.raises(Refusal, match=r": --torch_compile False in the checkpoint, unset now \(True on cuda\)\. "):
        check_resume_settings(saved, parse_args(flags), "ckpt", "cuda", "fp16")
    with pytest.raises(Refusal, match=r": --torch_compile False in the checkpoint, True now\. "):  # given
        check_resume_settings(saved, parse_args([*flags, "--torch_compile"]), "ckpt", "cpu", "bf16")
    saved = saved | {"torch_compile": None, "learning_rate": 2e-4}
    with pytest.raises(Refusal, match=r": --learning_rate 0.0002 in the checkpoint, 0.0001 now\. "):  # its default
        check_resume_settings(saved, parse_args(flags), "ckpt", "cpu", "bf16")


def test_a_checkpoint_records_the_hfbert_that_wrote_it():
    commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True, text=True).stdout.strip()
    recorded = parse_args(["--output_dir", "o"]).checkpoint_settings()["hfbert"]
    assert recorded == {"version": version("hfbert"), "commit": commit or None, "update_revision": UPDATE_REVISION}


def test_a_checkpoint_whose_update_this_hfbert_does_not_repeat_is_refused_naming_its_writer():
    flags = ["--output_dir", "o", "--max_train_steps", "10"]
    current = parse_args(flags).checkpoint_settings()
    writer = {"version": "0.1.0", "commit": "0123456789abcdef", "update_revision": 1}
    with pytest.raises(Refusal) as refused:
        check_resume_settings(current | {"hfbert": writer}, parse_args(flags), "run/checkpoint-10", "cpu", "bf16")
    assert str(refused.value) == (
        "--resume_from_checkpoint run/checkpoint-10 was written by hfbert 0.1.0 at commit 0123456, whose update "
        f"this hfbert does not repeat bit for bit ({UPDATE_CHANGES[2]}): finish the run with that hfbert, or start "
        "a new run from its weights with --model_name_or_path run/checkpoint-10"
    )
    newer = writer | {"commit": None, "update_revision": UPDATE_REVISION + 1}
    with pytest.raises(Refusal, match=rf"by hfbert 0.1.0, whose .* \(its update's revision {UPDATE_REVISION + 1} is newer"):
        check_resume_settings(current | {"hfbert": newer}, parse_args(flags), "ckpt", "cpu", "bf16")
    # An hfbert up to 88be5f0 named no writer: one that recorded --torch_compile False for a command leaving it
    # unset had that default (before ca7ff39, the update of revision 1); the others continue bit for bit.
    legacy = {name: value for name, value in current.items() if name != "hfbert"}
    assert check_resume_settings(legacy, parse_args(flags), "ckpt", "cpu", "bf16") == []
    with pytest.raises(Refusal, match=r"was written by an hfbert before commit ca7ff39 \(it names no version"):
        check_resume_settings(legacy | {"torch_compile": False}, parse_args(flags), "ckpt", "cpu", "bf16")
    given = parse_args([*flags, "--torch_compile", "false"])
    assert check_resume_settings(legacy | {"torch_compile": False}, given, "ckpt", "cpu", "bf16") == []


@pytest.mark.parametrize("output", ["run", "run/checkpoint-10", "run/checkpoint-10/phase2", "run/checkpoint-10/.."])
@pytest.mark.parametrize("overwrite", [[], ["--overwrite_output_dir"]])
def test_a_run_never_writes_into_its_own_source(tmp_path, output, overwrite):
    source = tmp_path / "run" / "checkpoint-10"
    source.mkdir(parents=True)
    with pytest.raises(Refusal, match=r"--output_dir .* (is|contains|is inside) the --model_name_or_path folder") as refused:
        parse_args(["--model_name_or_path", str(source), "--output_dir", str(tmp_path / output), *overwrite])
    assert "--overwrite_output_dir" not in str(refused.value)


@pytest.mark.parametrize(
    ("corpus", "output"),
    [(["--train_file", "texts"], "texts/run"), (["--train_file", "texts"], "texts"),
     (["--train_file", "texts/**/*.txt"], "texts/run"), (["--train_file", "texts/*.txt"], "texts"),
     (["--train_file", "a.txt", "--validation_file", "texts"], "texts/x/run"),
     (["--dataset_name", "texts"], "texts/run")],
)  # fmt: skip
def test_an_output_dir_inside_the_corpus_folder_is_refused_before_any_work(tmp_path, monkeypatch, corpus, output):
    """Issue 64, item 4: the run's files became part of the corpus, and every later run on it was refused
    ("files of different formats"), the resume too."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "texts").mkdir()
    (tmp_path / "texts" / "one.txt").write_text("Some text here. And more.")
    flag, value = next((corpus[i], corpus[i + 1]) for i in range(0, len(corpus), 2) if "texts" in corpus[i + 1])
    with pytest.raises(Refusal) as refused:
        parse_args(["--output_dir", output, *corpus])
    assert str(refused.value) == (
        f"--output_dir {output} is inside the folder {flag} {value} reads ({tmp_path / 'texts'}): what the run "
        "writes there would become part of that corpus, and every later run on it would read it; pass an "
        "--output_dir outside it"
    )
    parse_args(["--output_dir", "runs/one", *corpus])  # beside it
    if value == "texts/*.txt":  # a glob that does not reach into subfolders reads none of them
        parse_args(["--output_dir", "texts/run/deeper", *corpus])


def test_a_run_beside_its_source_is_accepted(tmp_path):
    (tmp_path / "phase1").mkdir()
    (tmp_path / "phase1-link").symlink_to(tmp_path / "phase1")
    parse_args(["--model_name_or_path", str(tmp_path / "phase1"), "--output_dir", str(tmp_path / "phase2")])
    with pytest.raises(Refusal, match="is the --model_name_or_path folder"):
        parse_args(["--model_name_or_path", str(tmp_path / "phase1"), "--output_dir", str(tmp_path / "phase1-link")])


# Given at their default values too: a flag named is a flag the user expects to act.
@pytest.mark.parametrize(
    "flag",
    [["--vocab_size", "8192"], ["--attention_init", "bert"], ["--vocab_size", "30522"], ["--attention_init", "structured"],
     ["--structured_attention_fade=0.0"]],
)  # fmt: skip
def test_flags_that_only_shape_a_fresh_model_are_refused_with_a_source(flag):
    flag = flag[0].split("=") if len(flag) == 1 else flag
    with pytest.raises(Refusal, match=rf"{flag[0]} {flag[1]} only shapes a fresh model.*drop {flag[0]}"):
        parse_args(["--model_name_or_path", "someone/bert", "--output_dir", "x", *flag])
    settings = parse_args(["--model_name_or_path", "someone/bert", "--output_dir", "x"])
    assert settings.data.vocab_size is None and settings.model.attention_init is None  # recorded as not set


def test_a_fresh_model_gets_the_default_vocab_size_and_bert_s_initialisation():
    """The default start is the one whose folders the model card sends to no surgery (issue 43)."""
    settings = parse_args(["--output_dir", "x"])
    assert (settings.data.vocab_size, settings.model.attention_init) == (30522, "bert")


def test_a_run_from_weights_resumes_a_checkpoint_that_recorded_the_ignored_vocab_size():
    # hfbert before the refusal recorded the default --vocab_size of a run from weights, which it ignored
    source = ["--output_dir", "o", "--model_name_or_path", "someone/bert"]
    saved = parse_args(source).checkpoint_settings() | {"vocab_size": 30522}
    assert check_resume_settings(saved, parse_args(source), "ckpt", "cpu", "bf16") == []


@pytest.mark.parametrize("flag", ["--stream_window_documents", "--stream_validation_documents"])
def test_stream_flags_given_without_streaming_are_refused_even_at_their_default(flag):
    with pytest.raises(Refusal, match=rf"^{flag} 1000 applies to --streaming runs only; add --streaming or drop {flag}$"):
        parse_args(["--output_dir", "x", flag, "1000"])
    assert getattr(parse_args(["--output_dir", "x"]).data, flag[2:]) is None  # recorded as not applying
    assert getattr(parse_args(["--output_dir", "x", "--streaming", "--max_train_steps", "5",
                               "--tokenizer_name", "t"]).data, flag[2:]) == 1000  # fmt: skip


def test_what_a_checkpoint_records_is_declared_on_the_fields():
    """The flags a resume must repeat are those annotated MUST_MATCH; budget flags are recorded, not compared."""
    recorded = parse_args(["--output_dir", "x"]).checkpoint_settings()
    assert {"learning_rate", "seed", "max_seq_length", "train_file", "model_size", "structured_attention_fade",
            "max_train_steps", "corpus_sha256"} <= set(recorded)  # fmt: skip
    assert not {"output_dir", "logging_steps", "eval_steps", "attention_init", "dataloader_num_workers"} & set(recorded)


# Each range's edges, one flag at a time: the value just inside is accepted, the one just outside refused
# (a `<` written as `<=` moves an edge and nothing else notices).
@pytest.mark.parametrize(
    "flags",
    [
        ["--max_seq_length", "8"],
        ["--mlm_probability", "0.01"],
        ["--mlm_probability", "0.99"],
        ["--eval_mlm_probability", "0.99"],
        ["--short_seq_prob", "0"],
        ["--short_seq_prob", "1"],
        ["--validation_split_percentage", "1"],
        ["--validation_split_percentage", "99"],
        ["--dataloader_num_workers", "0"],
        ["--dropout", "0"],
        ["--attention_init", "structured", "--structured_attention_fade", "0"],
        ["--attention_init", "structured", "--structured_attention_fade", "1"],
        ["--attention_init", "bert", "--structured_attention_fade", "0"],
        ["--adam_beta1", "0", "--adam_beta2", "0"],
        ["--weight_decay", "0", "--max_grad_norm", "0", "--num_warmup_steps", "0", "--nsp_loss_weight", "0"],
        ["--cls_attention_spread", "0", "--torch_compile"],
        ["--checkpointing_steps", "1", "--checkpoints_total_limit", "1"],
        ["--checkpointing_steps", "epoch"],
        ["--max_train_steps", "1", "--max_train_seconds", "0.5", "--eval_steps", "1"],
        ["--per_device_train_batch_size", "1", "--gradient_accumulation_steps", "1", "--num_train_epochs", "1"],
        ["--push_to_hub", "--hub_model_id", "me/bert"],
        ["--seed", "0"],
        ["--seed", str(2**32 - 1)],
        ["--vocab_size", str(1 << 20)],
        ["--model_size", "tiny", "--max_seq_length", "512"],
    ],
)
def test_the_edges_of_each_range_are_accepted(flags):
    parse_args(["--output_dir", "unused", *flags])


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--max_seq_length", "7"], "--max_seq_length 7 must be >= 8 ([CLS] A [SEP] B [SEP])"),
        (["--max_seq_length", "0"], "--max_seq_length 0 must be > 0"),
        (["--dupe_factor", "0"], "--dupe_factor 0 must be > 0"),
        (["--vocab_size", "0"], "--vocab_size 0 must be > 0 (or leave it unset)"),
        (["--max_eval_samples", "0"], "--max_eval_samples 0 must be > 0 (or leave it unset)"),
        (["--preprocessing_num_workers", "0"], "--preprocessing_num_workers 0 must be > 0 (or leave it unset)"),
        (["--mlm_probability", "0"], "--mlm_probability 0.0 must be in (0, 1), e.g. 0.15"),
        (["--eval_mlm_probability", "1"], "--eval_mlm_probability 1.0 must be in (0, 1), e.g. 0.15"),
        (["--short_seq_prob", "-0.1"], "--short_seq_prob -0.1 must be in [0, 1]"),
        (["--short_seq_prob", "1.1"], "--short_seq_prob 1.1 must be in [0, 1]"),
        (["--validation_split_percentage", "100"], "--validation_split_percentage 100 must be in (0, 100)"),
        (["--dataloader_num_workers", "-1"], "--dataloader_num_workers -1 must be >= 0 (or leave it unset)"),
        (["--dropout", "-0.1"], "--dropout -0.1 must be in [0, 1)"),
        (["--structured_attention_fade", "-0.1"], "--structured_attention_fade -0.1 must be a fraction of the budget in [0, 1], e.g. 1"),
        (["--adam_beta1", "-0.1"], "--adam_beta1 -0.1 must be in [0, 1), e.g. 0.9 or 0.999"),
        (["--weight_decay", "-0.1"], "--weight_decay -0.1 must be >= 0"),
        (["--max_grad_norm", "-0.1"], "--max_grad_norm -0.1 must be >= 0"),
        (["--num_warmup_steps", "-1"], "--num_warmup_steps -1 must be >= 0"),
        (["--checkpointing_steps", "0"], "--checkpointing_steps '0' must be a positive number of updates or 'epoch'"),
        (["--max_train_steps", "0"], "--max_train_steps 0 must be > 0 (or leave it unset)"),
        (["--per_device_eval_batch_size", "0"], "--per_device_eval_batch_size 0 must be > 0"),
        (["--ddp_timeout", "0"], "--ddp_timeout 0 must be > 0"),
        (["--gradient_accumulation_steps", "0"], "--gradient_accumulation_steps 0 must be > 0"),
        (["--num_train_epochs", "0"], "--num_train_epochs 0 must be > 0"),
        # accelerate's set_seed raised a ValueError traceback at the start of work; --dry_run accepted them.
        (["--seed", "-1"], "--seed -1 must be in [0, 2**32 - 1], e.g. 42"),
        (["--seed", str(2**32)], f"--seed {2**32} must be in [0, 2**32 - 1], e.g. 42"),
        # The tokenizer trainer aborted in Rust (exit 134) after reading the corpus.
        (["--vocab_size", "1048577"], "--vocab_size 1048577 is above 1,048,576, the largest vocabulary hfbert trains "
         "(BERT's is 30,522, multilingual ones 250,002; the trainer reserves memory for every entry first); pass e.g. "
         "--vocab_size 30522"),
    ],
)
def test_the_value_just_outside_each_range_is_refused_naming_it(flags, message):
    with pytest.raises(Refusal) as error:
        parse_args(["--output_dir", "unused", *flags])
    assert str(error.value) == message



STREAMED = ["--output_dir", "unused", "--streaming", "--max_train_steps", "5", "--tokenizer_name", "t"]


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--stream_window_documents", "1"], "--stream_window_documents 1 must be >= 2 (next sentence prediction draws B from another document)"),
        # 0 was taken for "unset" and silently became the default 1000
        (["--objective", "mlm", "--stream_validation_documents", "0"], "--stream_validation_documents 0 must be >= 1"),
        (["--objective", "mlm", "--stream_window_documents", "0"], "--stream_window_documents 0 must be >= 1"),
        (["--objective", "mlm", "--stream_window_documents", "1"], None),
        (["--stream_window_documents", "2", "--stream_validation_documents", "2"], None),
    ],
)
def test_a_stream_window_needs_two_documents_for_nsp_and_one_for_mlm(flags, message):
    if message is None:
        parse_args([*STREAMED, *flags])
        return
    with pytest.raises(Refusal) as refused:
        parse_args([*STREAMED, *flags])
    assert str(refused.value) == message



def test_a_config_file_that_is_missing_or_refused_by_hfbert_config_is_named_with_the_flag(tmp_path):
    from hfbert.pretraining.settings import read_config_file

    fix = "pass a config.json written by HfBertConfig.save_pretrained (or its folder), or --model_size instead"
    with pytest.raises(Refusal, match=rf"^--config_name ./missing.json: no such file or folder \(.*\); {re.escape(fix)}$"):
        read_config_file("./missing.json")
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "hfbert", "hidden_size": 30, "num_attention_heads": 4}))
    with pytest.raises(Refusal) as refused:
        read_config_file(str(tmp_path / "config.json"))
    assert str(refused.value).startswith(f"--config_name {tmp_path / 'config.json'}: ")
    assert "30" in str(refused.value) and str(refused.value).endswith(f"; {fix}")
    with pytest.raises(Refusal) as refused:  # transformers' own OSError (offline here): its first line
        read_config_file("someone/no-such-config")
    assert str(refused.value).startswith("--config_name someone/no-such-config: ")
    assert not str(refused.value).startswith("--config_name someone/no-such-config: None;")


def test_dupe_factor_with_mlm_is_refused_with_what_to_raise_instead():
    with pytest.raises(Refusal) as refused:
        parse_args(["--output_dir", "unused", "--objective", "mlm", "--dupe_factor", "3"])
    assert str(refused.value) == (
        "--dupe_factor 3 with --objective mlm would repeat the same segments (they are cut without randomness; the "
        "masks change every epoch anyway): drop --dupe_factor and raise --num_train_epochs or --max_train_steps instead"
    )


# ------------------------------------------------------------------------------------------------ issue 64


def test_vocab_size_is_recorded_as_unset_beside_a_tokenizer_and_an_older_checkpoint_s_default_resumes():
    """--vocab_size was accepted beside --tokenizer_name and recorded as the run's though no tokenizer was trained."""
    named = ["--output_dir", "o", "--tokenizer_name", "tok"]
    assert parse_args(named).data.vocab_size is None
    with pytest.raises(Refusal, match=r"^--vocab_size 30522 only sizes the tokenizer a run trains"):
        parse_args([*named, "--vocab_size", "30522"])  # named at its default: the user expects it to act
    older = parse_args(named).checkpoint_settings() | {"vocab_size": 30522}  # what a checkpoint recorded before
    check_resume_settings(older, parse_args(named), "ckpt", "cpu", "bf16")
    trained = parse_args(["--output_dir", "o"]).checkpoint_settings()  # a run that trains its tokenizer: compared
    with pytest.raises(Refusal, match=r"--vocab_size 30522 in the checkpoint, 8192 now"):
        check_resume_settings(trained, parse_args(["--output_dir", "o", "--vocab_size", "8192"]), "ckpt", "cpu", "bf16")


def test_a_resume_without_tokenizer_name_of_a_run_that_named_one_is_not_refused_for_the_unset_vocab_size():
    """The checkpoint of a run given --tokenizer_name records --vocab_size None; its resume without the flag (the
    checkpoint's tokenizer is the run's) left --vocab_size at its default and was refused for it."""
    saved = parse_args(["--output_dir", "o", "--tokenizer_name", "tok"]).checkpoint_settings()
    assert check_resume_settings(saved, parse_args(["--output_dir", "o"]), "ckpt", "cpu", "bf16") == []
    with pytest.raises(Refusal, match=r"--vocab_size None in the checkpoint, 8192 now"):
        check_resume_settings(saved, parse_args(["--output_dir", "o", "--vocab_size", "8192"]), "ckpt", "cpu", "bf16")
