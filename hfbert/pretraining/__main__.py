"""`python -m hfbert.pretraining` (and `accelerate launch -m hfbert.pretraining`): run_pretraining.py's command."""

from hfbert.pretraining.cli import command_line

command_line()
