"""hfbert.pretraining.cli (run_pretraining.py): flags -> settings -> pretrain, and what it prints and exits with."""

import signal
from pathlib import Path

import pytest

from hfbert.pretraining import cli
from hfbert.pretraining.finish import FinalFolder
from hfbert.pretraining.loop import Preempted


def test_the_end_of_a_run_prints_the_folder_and_the_fill_mask_section_it_was_handed(monkeypatch, tmp_path, capsys):
    seen = []

    def fake_run(settings):
        seen.append(settings)
        return FinalFolder(tmp_path, fill_mask="## Fill-mask\n\n1. `the [MASK] .`: true word **cat** is number 1")

    monkeypatch.setattr(cli, "pretrain_run", fake_run)
    cli.main(["--output_dir", str(tmp_path), "--model_size", "tiny", "--max_train_steps", "3"])
    out = capsys.readouterr().out
    assert f"Model, tokenizer, model card, curves and samples: {Path(tmp_path).resolve()}" in out
    assert "## Fill-mask" in out and "true word **cat**" in out
    assert seen[0].optimization.max_train_steps == 3 and seen[0].model.model_size == "tiny"


def test_no_samples_print_no_fill_mask_section(monkeypatch, tmp_path, capsys):
    monkeypatch.setattr(cli, "pretrain_run", lambda settings: FinalFolder(tmp_path))
    cli.main(["--output_dir", str(tmp_path)])
    assert "Fill-mask" not in capsys.readouterr().out


def test_a_preempted_run_exits_as_the_signal_would(monkeypatch, tmp_path, capsys):
    def preempted(settings):
        raise Preempted("Stopped by SIGTERM after update 4; resume with ...", signal.SIGTERM)

    monkeypatch.setattr(cli, "pretrain_run", preempted)
    with pytest.raises(SystemExit) as stopped:
        cli.main(["--output_dir", str(tmp_path)])
    assert stopped.value.code == 128 + signal.SIGTERM
    assert "Stopped by SIGTERM after update 4" in capsys.readouterr().err
