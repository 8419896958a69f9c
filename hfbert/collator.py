"""Moved: hfbert.collator is hfbert.pretraining.batches (this name is kept for existing imports)."""

import sys

from hfbert.pretraining import batches

sys.modules[__name__] = batches
