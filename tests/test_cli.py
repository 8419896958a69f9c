"""hfbert.pretraining.cli (run_pretraining.py): flags -> settings -> pretrain, and what it prints and exits with."""

import json
import signal
from pathlib import Path

import pytest
from accelerate.state import AcceleratorState

from hfbert import HfBertConfig
from hfbert.errors import REFUSAL_EXIT_CODE, run_cli
from hfbert.pretraining import cli
from hfbert.pretraining.finish import FinalFolder
from hfbert.pretraining.loop import Preempted


def test_the_end_of_a_run_prints_the_folder_and_the_fill_mask_section_it_was_handed(monkeypatch, tmp_path, capsys):
    seen = []

    def fake_run(settings):
        seen.append(settings)
        return FinalFolder(tmp_path, fill_mask="## Fill-mask\n\n1. `the [MASK] .`: true word **cat** is number 1")

    monkeypatch.setattr(cli, "pretrain", fake_run)
    cli.main(["--output_dir", str(tmp_path), "--model_size", "tiny", "--max_train_steps", "3"])
    out = capsys.readouterr().out
    assert f"Model, tokenizer, model card, curves and samples: {Path(tmp_path).resolve()}" in out
    assert "## Fill-mask" in out and "true word **cat**" in out
    assert seen[0].optimization.max_train_steps == 3 and seen[0].model.model_size == "tiny"


def test_no_samples_print_no_fill_mask_section(monkeypatch, tmp_path, capsys):
    """The seventh attack (731f08a), S4: a run that wrote no samples.md still said it had."""
    monkeypatch.setattr(cli, "pretrain", lambda settings: FinalFolder(tmp_path))
    cli.main(["--output_dir", str(tmp_path)])
    out = capsys.readouterr().out
    assert out == f"\nModel, tokenizer, model card and curves: {Path(tmp_path).resolve()}\n\n"


def test_a_preempted_run_exits_as_the_signal_would(monkeypatch, tmp_path, capsys):
    def preempted(settings):
        raise Preempted("Stopped by SIGTERM after update 4; resume with ...", signal.SIGTERM)

    monkeypatch.setattr(cli, "pretrain", preempted)
    with pytest.raises(SystemExit) as stopped:
        cli.main(["--output_dir", str(tmp_path)])
    assert stopped.value.code == 128 + signal.SIGTERM
    assert "Stopped by SIGTERM after update 4" in capsys.readouterr().err


def refusal_line(argv, capsys) -> str:
    """The one line run_pretraining.py prints for a refusal (exit code 2), run as its __main__ runs it."""
    capsys.readouterr()
    try:
        with pytest.raises(SystemExit) as exited:
            run_cli(lambda: cli.main(argv), prog="run_pretraining.py")
    finally:
        AcceleratorState._reset_state(reset_partial_state=True)
    assert exited.value.code == REFUSAL_EXIT_CODE
    err = capsys.readouterr().err
    assert "Traceback" not in err
    [line] = [line for line in err.splitlines() if line.startswith("run_pretraining.py:")]
    return line.removeprefix("run_pretraining.py: error: ")


def test_a_config_that_hfbert_config_refuses_is_one_line_naming_the_flag(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    HfBertConfig(hidden_size=32, num_attention_heads=4).save_pretrained(tmp_path / "model")
    config = json.loads((tmp_path / "model" / "config.json").read_text())
    (tmp_path / "bad.json").write_text(json.dumps({**config, "hidden_size": 30}))
    line = refusal_line(["--config_name", "bad.json", "--output_dir", "out", "--max_train_steps", "1"], capsys)
    assert line.startswith("--config_name bad.json: HfBertConfig.hidden_size (30) must be divisible")
    line = refusal_line(["--config_name", "./missing.json", "--output_dir", "out"], capsys)
    assert line.startswith("--config_name ./missing.json: no such file or folder")
    assert sorted(path.name for path in tmp_path.iterdir()) == ["bad.json", "model"]  # no run folder left


def test_a_source_folder_that_phase_1_has_not_written_yet_is_one_line(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "runs").mkdir()
    argv = ["--model_name_or_path", "runs/bert-base-phase1", "--output_dir", "runs/bert-base-phase2"]
    line = refusal_line(argv, capsys)
    assert line.startswith("--model_name_or_path runs/bert-base-phase1: no such folder")
    assert "huggingface.co" not in line and list((tmp_path / "runs").iterdir()) == []
