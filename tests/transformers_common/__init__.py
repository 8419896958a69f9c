"""transformers' own common model and config tests (vendored, see each file's header)."""

from .markers import register_markers

register_markers()
