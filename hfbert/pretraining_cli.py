"""Moved: hfbert.pretraining_cli is hfbert.pretraining.cli (this name is kept for existing imports)."""

import sys

from hfbert.pretraining import cli

sys.modules[__name__] = cli
