"""Text from outside hfbert (corpus sentences, flag values, paths) in the Markdown it writes: shown as written.

A code span renders no Markdown and no HTML, so a sentence holding `**b**`, `[l](javascript:...)` or `<img ...>`
reads as those characters in a model card, samples.md or inspect.md, and on the Hub page that shows them.
"""

from __future__ import annotations

import re
from typing import Any


def code(value: Any) -> str:
    """`value` as one Markdown code span, whatever it holds: its whitespace runs (newlines, a blank line that would
    end the paragraph) as one space, fenced by more backticks than its longest run of them."""
    text = " ".join(str(value).split())
    fence = "`" * (max(map(len, re.findall(r"`+", text)), default=0) + 1)
    padding = " " if text.startswith("`") or text.endswith("`") else ""
    return f"{fence}{padding}{text}{padding}{fence}"


def cell(value: Any) -> str:
    """`value` as a Markdown table cell: a code span, its | escaped (a table splits there even inside code)."""
    return code(value).replace("|", "\\|")
