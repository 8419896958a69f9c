"""Moved: hfbert.pretraining_data is hfbert.pretraining.data (this name is kept for existing imports)."""

import sys

from hfbert.pretraining import data

sys.modules[__name__] = data
