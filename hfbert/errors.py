"""One way to refuse bad input: raise `Refusal`; one way to stop a run on a condition outside the code (a full
disk): raise `RunFailure`. Every entry point's `__main__` runs inside `stops_in_one_line` (`run_cli` for a
function), which prints either as one line and keeps tracebacks for real bugs.

A leaf module: everything in hfbert may import it, it imports nothing of hfbert's.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

# Set to 1 to see a refusal's traceback (a bug's traceback is always shown).
DEBUG_ENV = "HFBERT_DEBUG"
REFUSAL_EXIT_CODE = 2  # argparse's code for bad usage
FAILURE_EXIT_CODE = 1


class Refusal(ValueError):
    """Bad input, found before any work: the message names the bad value and the fix.

    A `ValueError`, so library callers that catch those keep working; entry points print it as one line.
    """


class CheckpointError(Refusal):
    """A checkpoint or output folder that cannot be used as asked; the message names the problem and the fix."""


class RunFailure(RuntimeError):
    """Work stopped on a condition outside the code (a full disk, a folder that became unwritable): the message
    names the cause, what is intact and how to go on. Entry points print it as one line, exit code 1."""


def program_name() -> str:
    """How this process was started, for usage and error lines: `python -m hfbert.pretraining` for a module run
    with -m (argparse would say `__main__.py`; it says this itself from Python 3.14), else the script's name
    (run_pretraining.py, hfbert-pretrain)."""
    spec = getattr(sys.modules.get("__main__"), "__spec__", None)
    if spec is not None:
        return f"python -m {spec.name.removesuffix('.__main__')}"
    return Path(sys.argv[0]).name


@contextmanager
def stops_in_one_line(prog: str | None = None) -> Iterator[None]:
    """Around an entry point's `main()`: a `Refusal` ends the process with one line on stderr and exit code 2, a
    `RunFailure` with one line and exit code 1.

    Any other exception is a bug and keeps its traceback. `HFBERT_DEBUG=1` shows the traceback of these too.
    """
    try:
        yield
    except (Refusal, RunFailure) as stop:
        if os.environ.get(DEBUG_ENV, "") not in ("", "0"):
            raise
        name = prog or program_name()
        message = " ".join(str(stop).split())  # one line, whatever the message's own layout
        # One write of the whole line: the processes of a launch share one stderr, and print() writes the text
        # and its newline separately, so two ranks' refusals could run into one line.
        sys.stderr.write(f"{name}: error: {message}\n")
        sys.stderr.flush()
        raise SystemExit(REFUSAL_EXIT_CODE if isinstance(stop, Refusal) else FAILURE_EXIT_CODE) from None


def run_cli(main: Callable[[], Any], prog: str | None = None) -> None:
    """Run an entry point's `main()` with its refusals and failures as one line (`stops_in_one_line`)."""
    with stops_in_one_line(prog):
        main()
