"""Moved: hfbert.final_folder is hfbert.pretraining.finish (this name is kept for existing imports)."""

import sys

from hfbert.pretraining import finish

sys.modules[__name__] = finish
