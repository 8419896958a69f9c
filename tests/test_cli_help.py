"""`--help` of run_pretraining.py and train_tokenizer.py: printed cleanly, and every flag it lists works."""

from __future__ import annotations

import re

import pytest

from hfbert import tokenization
from hfbert.pretraining import cli as pretraining_cli

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
