"""What a flag declares besides its help: whether a resumed run must repeat it. Declared in the flag's
annotation (`Annotated[int, MUST_MATCH]`), which `transformers.HfArgumentParser` reads past (it resolves type
hints without their extras), so the settings dataclasses keep its contract; read by
`hfbert.pretraining.settings` for what a checkpoint records and compares."""

from __future__ import annotations

import dataclasses
import typing
from enum import Enum


class Resume(Enum):
    MUST_MATCH = "a resumed run must repeat the checkpoint's value"
    BUDGET = "recorded; a resume may change it where the learning rate does not depend on it"


MUST_MATCH = Resume.MUST_MATCH
BUDGET = Resume.BUDGET


def declared(group: object, rule: Resume) -> list[str]:
    """The names of the dataclass `group`'s fields declared `rule`, in field order."""
    hints = typing.get_type_hints(type(group), include_extras=True)
    return [f.name for f in dataclasses.fields(group) if rule in getattr(hints[f.name], "__metadata__", ())]
