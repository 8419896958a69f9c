"""Moved: hfbert.pretraining_settings is hfbert.pretraining.settings (this name is kept for existing imports)."""

import sys

from hfbert.pretraining import settings

sys.modules[__name__] = settings
