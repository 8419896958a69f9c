"""`python -m hfbert.pretraining` (and `accelerate launch -m hfbert.pretraining`): run_pretraining.py's command."""

import os

# The launcher, read first (Python imported hfbert before this file runs; see run_pretraining.py).
LAUNCHER_PID = os.getppid()

from hfbert.pretraining.cli import command_line  # noqa: E402

command_line(LAUNCHER_PID)
