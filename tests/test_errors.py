"""Refusals are one line on stderr with exit code 2; bugs keep their traceback."""

import subprocess
import sys
from pathlib import Path

import pytest

from hfbert.errors import REFUSAL_EXIT_CODE, Refusal, run_cli

ROOT = Path(__file__).resolve().parents[1]


def test_refusal_is_one_line_with_exit_code_2(capsys):
    def main():
        raise Refusal("--max_train_steps 0 must be > 0\n  (or leave it unset)")

    with pytest.raises(SystemExit) as stopped:
        run_cli(main, prog="tool")
    assert stopped.value.code == REFUSAL_EXIT_CODE
    assert capsys.readouterr().err == "tool: error: --max_train_steps 0 must be > 0 (or leave it unset)\n"


def test_debug_env_shows_the_refusal_traceback(monkeypatch):
    monkeypatch.setenv("HFBERT_DEBUG", "1")

    def main():
        raise Refusal("bad")

    with pytest.raises(Refusal):
        run_cli(main)


def test_a_bug_keeps_its_traceback():
    def main():
        raise KeyError("a bug")

    with pytest.raises(KeyError):
        run_cli(main)


def test_run_pretraining_refuses_bad_flag_in_one_line(tmp_path):
    result = subprocess.run(
        [sys.executable, str(ROOT / "run_pretraining.py"), "--max_train_steps", "0", "--output_dir", str(tmp_path)],
        capture_output=True,
        text=True,
        cwd=tmp_path,
    )
    assert result.returncode == REFUSAL_EXIT_CODE
    assert result.stderr.strip().splitlines() == [
        "run_pretraining.py: error: --max_train_steps 0 must be > 0 (or leave it unset)"
    ]
