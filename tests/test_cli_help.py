"""`--help` of run_pretraining.py, train_tokenizer.py and hfbert.finetune: printed cleanly, with the defaults a run
gets, and every flag it lists works."""

from __future__ import annotations

import re

import pytest

from hfbert import tokenization
from hfbert.pretraining import cli as pretraining_cli
from hfbert.pretraining.cli import parse_args

# A value each listed flag is given on its own (with --output_dir); flags with a default take that default.
EXAMPLE_VALUES = {
    "--dataset_name": "Salesforce/wikitext",
    "--max_predictions_per_seq": "24",
    "--dataloader_num_workers": "0",
    "--max_eval_samples": "100",
    "--preprocessing_num_workers": "2",
    "--dropout": "0",
    "--structured_attention_fade": "1",
    "--max_train_steps": "800",
    "--max_train_seconds": "600",
    "--eval_steps": "200",
    "--checkpointing_steps": "400",
    "--resume_from_checkpoint": "latest",
    "--recipe": "quick-start",
    "--hub_model_id": "your-name/hfbert-mini",
    "--hub_token": "hf_example",
    "--model_name_or_path": "runs/bert-phase1",
    "--vocab_size": "8192",
}
# Flags that only make sense beside another one.
COMPANIONS = {
    "--dataset_config_name": [
        "--dataset_name",
        "Salesforce/wikitext",
        "--dataset_config_name",
        "wikitext-2-raw-v1",
    ],
    "--validation_file": ["--train_file", "{file}", "--validation_file", "{file}"],
    "--checkpoints_total_limit": ["--checkpointing_steps", "400", "--checkpoints_total_limit", "2"],
    "--push_to_hub": ["--push_to_hub", "--hub_model_id", "your-name/hfbert-mini"],
    "--structured_attention_fade": ["--attention_init", "structured", "--structured_attention_fade", "1"],
}
STREAMING = ["--streaming", "--max_train_steps", "100", "--tokenizer_name", "{file}"]
COMPANIONS |= {
    "--streaming": STREAMING,
    "--stream_window_documents": [*STREAMING, "--stream_window_documents", "500"],
    "--stream_validation_documents": [*STREAMING, "--stream_validation_documents", "500"],
}


def printed_help(main, capsys) -> str:
    with pytest.raises(SystemExit) as exited:
        main(["--help"])
    assert exited.value.code == 0
    return capsys.readouterr().out


@pytest.mark.parametrize(
    "main", [pretraining_cli.main, tokenization.main], ids=["run_pretraining", "train_tokenizer"]
)
def test_help_prints_cleanly(main, capsys):
    text = printed_help(main, capsys)
    assert text.startswith("usage:")
    assert "{'" not in text  # an unescaped % in a help string makes argparse print its dict instead
    assert "--output_dir" in text


def test_pretraining_help_offers_streaming(capsys):
    text = printed_help(pretraining_cli.main, capsys)
    assert "--streaming" in text and "--stream_window_documents" in text


def listed_flags(help_text: str) -> list[str]:
    return re.findall(r"^  (--\w+)", help_text, flags=re.MULTILINE)


def argv_for(flag: str, text_file: str) -> list[str]:
    if flag in COMPANIONS:
        return [word.format(file=text_file) for word in COMPANIONS[flag]]
    action = pretraining_cli.build_parser()._option_string_actions[flag]
    if action.nargs == "?" and action.const is True:  # a boolean switch
        return [flag]
    if flag in ("--train_file", "--config_name", "--tokenizer_name"):
        return [flag, text_file]
    if flag in EXAMPLE_VALUES:
        return [flag, EXAMPLE_VALUES[flag]]
    if action.choices:
        return [flag, str(action.choices[-1])]
    assert action.default is not None, f"{flag} has no default: add an example value to EXAMPLE_VALUES"
    return [flag, str(action.default)]


def test_every_flag_in_pretraining_help_is_accepted(capsys, tmp_path):
    flags = listed_flags(printed_help(pretraining_cli.main, capsys))
    assert "--eval_mlm_probability" in flags and "--max_train_seconds" in flags
    text_file = tmp_path / "train.raw"
    text_file.write_text(" = Title = \n\n Some text .\n", encoding="utf-8")
    for flag in flags:
        if flag in ("--help", "--list_recipes", "--output_dir"):  # --list_recipes prints and exits, as --help
            continue
        argv = [*argv_for(flag, str(text_file)), "--output_dir", str(tmp_path / "run")]
        try:
            pretraining_cli.parse_args(argv)
        except (ValueError, SystemExit) as refused:
            pytest.fail(f"run_pretraining.py refused {argv}, a flag its --help lists: {refused!r}")


def test_pretraining_help_shows_the_value_a_run_gets_once_and_never_none(capsys):
    """The defaults a fresh run gets are the fields' defaults, as --help prints them (no "(default: None)")."""
    with pytest.raises(SystemExit):
        parse_args(["--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "default: None" not in text
    for flag, shown in [("--model_size", "mini"), ("--vocab_size", "30522"), ("--attention_init", "bert"),
                        ("--structured_attention_fade", "0.0"), ("--stream_window_documents", "1000")]:  # fmt: skip
        entry = text.split(f" {flag} ", 1)[1]  # from the flag on: its help's first default is its own
        assert entry.split("(default", 1)[1].startswith(f": {shown})"), flag
    fresh = parse_args(["--output_dir", "x"])
    assert (fresh.model.model_size, fresh.data.vocab_size, fresh.model.attention_init) == ("mini", 30522, "bert")
    source = parse_args(["--output_dir", "x", "--model_name_or_path", "someone/bert"])
    assert source.model.model_size is None  # the source's size, read from it


def test_finetune_help_shows_the_defaults(capsys):
    from hfbert.finetune.settings import parse_args

    with pytest.raises(SystemExit):
        parse_args(["--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "'auto' (the default)" in text and "(default: label)" in text and "keeps (default: 0)" in text
    assert "(default: 20 for a model of hidden size <= 256 (tiny, mini), 3 for larger" in text
    assert "(default: 1e-4 3e-4 1e-3 for a model of hidden size <= 256 (tiny, mini), 2e-5 3e-5 5e-5" in text
    assert "(default: None)" not in text


def test_finetune_help_says_why_a_rate_is_dropped(capsys):
    """A rate is dropped when a fold's fit collapsed or underfitted (hfbert.finetune.selection); the help named
    collapse alone."""
    from hfbert.finetune.settings import parse_args

    with pytest.raises(SystemExit):
        parse_args(["--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "a rate at which any fit collapsed or underfitted (its last epoch's training loss above 70% of its first" in text
