"""Refusals are one line on stderr with exit code 2; bugs keep their traceback."""

import subprocess
import sys
from pathlib import Path

import pytest

from hfbert.errors import FAILURE_EXIT_CODE, REFUSAL_EXIT_CODE, Refusal, RunFailure, run_cli

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize(
    "stop, exit_code",
    [(Refusal, REFUSAL_EXIT_CODE), (RunFailure, FAILURE_EXIT_CODE)],
    ids=["refusal: bad input before any work", "run failure: a full disk"],
)
def test_refusals_and_run_failures_are_one_line_with_their_exit_code(stop, exit_code, capsys):
    def main():
        raise stop("--max_train_steps 0 must be > 0\n  (or leave it unset)")

    with pytest.raises(SystemExit) as stopped:
        run_cli(main, prog="tool")
    assert stopped.value.code == exit_code
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


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--model_size", "huge", "--output_dir", "x"], "argument --model_size/--model-size: invalid choice: 'huge'"),
        (["--max_train_steps", "abc", "--output_dir", "x"], "invalid int value: 'abc'"),
        (["--bogus", "1", "--output_dir", "x"], "unrecognized arguments: --bogus 1"),
        ([], "the following arguments are required: --output_dir"),
    ],
)
def test_a_bad_command_line_is_one_line_not_the_whole_usage(argv, message, capsys):
    from hfbert.pretraining.cli import main

    with pytest.raises(SystemExit) as stopped:
        run_cli(lambda: main(argv), prog="run_pretraining.py")
    assert stopped.value.code == REFUSAL_EXIT_CODE
    [line] = capsys.readouterr().err.splitlines()
    assert line.startswith("run_pretraining.py: error: ") and message in line and line.endswith("(see --help)")


@pytest.mark.parametrize(
    "module, argv",
    [
        ("hfbert.tokenization", ["--bogus"]),
        ("hfbert.convert", ["sideways", "a", "b"]),
        ("hfbert.push", ["folder"]),
        ("hfbert.inspect", ["folder", "--layer", "x"]),
        ("hfbert.finetune.run", ["folder", "--train_file", "t.csv", "--learning_rate", "fast"]),
    ],
)
def test_every_tool_refuses_a_bad_command_line_in_one_line(module, argv, capsys):
    main = __import__(module, fromlist=["main"]).main
    with pytest.raises(SystemExit) as stopped:
        run_cli(lambda: main(argv), prog="tool")
    assert stopped.value.code == REFUSAL_EXIT_CODE
    [line] = capsys.readouterr().err.splitlines()
    assert line.startswith("tool: error: ") and line.endswith("(see --help)")
