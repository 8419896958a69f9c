"""hfbert.flags: how every command reads its flags. transformers' HfArgumentParser reads `<script>.args` beside
the entry point into the command line (`look_for_args_file=True`); no hfbert command does: a stray file there
changes nothing."""

import sys

import pytest

from hfbert import tokenization
from hfbert.errors import Refusal
from hfbert.finetune.settings import parse_args as parse_finetune_args
from hfbert.inspect import main as inspect_main
from hfbert.pretraining.cli import parse_args as parse_pretraining_args


@pytest.fixture
def stray_args_file(tmp_path, monkeypatch):
    """Makes `script` this process's entry point, with `<script>.args` beside it holding `flags`."""

    def place(script: str, flags: str) -> None:
        entry_point = tmp_path / "bin" / script
        entry_point.parent.mkdir(exist_ok=True)
        entry_point.with_suffix(".args").write_text(flags)
        monkeypatch.setattr(sys, "argv", [str(entry_point)])

    return place


@pytest.mark.parametrize("script", ["run_pretraining.py", "hfbert-pretrain", "__main__.py"])
def test_run_pretraining_reads_no_args_file(tmp_path, stray_args_file, script):
    stray_args_file(script, "--learning_rate 0.5 --seed 7 --overwrite_output_dir")
    settings = parse_pretraining_args(["--output_dir", str(tmp_path / "run")])
    assert settings.optimization.learning_rate == 1e-4 and settings.optimization.seed == 42
    assert not settings.output.overwrite_output_dir
    assert not {"learning_rate", "seed", "overwrite_output_dir"} & settings.given


def test_train_tokenizer_reads_no_args_file(tmp_path, stray_args_file):
    named = tmp_path / "tokenizer-the-file-names"
    stray_args_file("train_tokenizer.py", f"--output_dir {named} --vocab_size 200")
    with pytest.raises(Refusal, match="--output_dir"):  # required, and given only in the file
        tokenization.main([])
    assert not named.exists()


def test_finetune_reads_no_args_file(tmp_path, stray_args_file):
    stray_args_file("__main__.py", "--trust_remote_code --data_seed 7")
    settings = parse_finetune_args(["model", "--train_file", "train.csv", "--validation_file", "dev.csv"])
    assert not settings.models.trust_remote_code and settings.data.data_seed == 0


def test_inspect_reads_no_args_file(tmp_path, stray_args_file, sample_tokenizer):
    from conftest import tiny_config

    from hfbert import HfBertForPreTraining

    folder = tmp_path / "model"
    HfBertForPreTraining(tiny_config()).save_pretrained(folder)
    sample_tokenizer.save_pretrained(folder)
    stray_args_file("__main__.py", f"--tasks nsp --output_dir {tmp_path / 'elsewhere'}")
    inspection = inspect_main([str(folder), "--text", "the [MASK] was released ."])
    assert inspection.attention is not None and inspection.fill_mask is not None and not inspection.nsp
    assert (folder / "inspect" / "inspect.md").is_file() and not (tmp_path / "elsewhere").exists()
