"""How every hfbert command reads its flags: `RefusingHfArgumentParser`, a `transformers.HfArgumentParser` whose bad command
lines are one-line refusals, with one help formatter; and what a flag declares besides its help, whether a
resumed run must repeat it (`Annotated[int, MUST_MATCH]`, which HfArgumentParser reads past: it resolves type
hints without their extras), read by `hfbert.pretraining.settings` for what a checkpoint records and compares.
"""

from __future__ import annotations

import argparse
import dataclasses
import typing
from typing import Any, NoReturn

from transformers import HfArgumentParser

from hfbert.errors import Refusal, program_name

# What a field may declare in its Annotated extras: a resumed run must repeat the flag.
MUST_MATCH = "a resumed run must repeat the checkpoint's value"


def declared(group: object, rule: str) -> list[str]:
    """The names of the dataclass `group`'s fields declared `rule`, in field order."""
    hints = typing.get_type_hints(type(group), include_extras=True)
    return [f.name for f in dataclasses.fields(group) if rule in getattr(hints[f.name], "__metadata__", ())]


class DefaultsHelpFormatter(argparse.RawDescriptionHelpFormatter, argparse.ArgumentDefaultsHelpFormatter):
    """The description as written, and each flag's default, unless it has none (an unset flag's help says what
    unset means) or its help says it ("default: ...")."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        if action.default is None or "default:" in (action.help or ""):
            return action.help
        return super()._get_help_string(action)


class RefusingHfArgumentParser(HfArgumentParser):
    """HfArgumentParser whose command-line errors, unknown flags included, are one-line refusals (which
    `hfbert.errors.run_cli` prints) instead of argparse printing the whole usage before them (57 lines for
    run_pretraining.py); `--help` shows each flag's default where it has one; no `<script>.args` file is read. The
    parser of every hfbert command: it may also take no dataclasses and declare flags with `add_argument`, as
    argparse does.

    Two things a field's metadata may ask beyond HfArgumentParser's: `positional` (an argument without dashes)
    and `type` (a conversion other than the annotation's, such as a number or a word)."""

    def __init__(self, dataclass_types: Any = (), **kwargs: Any):
        super().__init__(
            dataclass_types, **{"formatter_class": DefaultsHelpFormatter, "prog": program_name(), **kwargs}
        )

    def error(self, message: str) -> NoReturn:
        raise Refusal(f"{message} (see --help)")

    @staticmethod
    def _parse_dataclass_field(parser: argparse.ArgumentParser, field: dataclasses.Field) -> None:
        metadata = dict(field.metadata)
        if metadata.pop("positional", False):
            parser.add_argument(field.name, **metadata)
        elif "type" in metadata:  # HfArgumentParser would replace it by the annotation
            parser.add_argument(f"--{field.name}", default=field.default, **metadata)
        else:
            HfArgumentParser._parse_dataclass_field(parser, field)

    def given_flags(self, argv: list[str]) -> frozenset[str]:
        """The destinations of the flags `argv` names (as given, `--flag=value` or an abbreviation argparse
        accepts): settings tell a flag given at its default value from one left unset."""
        named = {token.split("=", 1)[0] for token in argv if token.startswith("--")}
        return frozenset(
            action.dest
            for action in self._actions
            for option in action.option_strings
            if any(option == token or (option.startswith(token) and self.allow_abbrev) for token in named)
        )

    def parse_flags(self, argv: list[str] | None) -> list[Any]:
        """The dataclasses of `argv` (sys.argv's when None), and of nothing else: HfArgumentParser would also
        read a `<script>.args` file beside the entry point, flags nobody typed or logged."""
        *groups, unknown = self.parse_args_into_dataclasses(
            args=argv, return_remaining_strings=True, look_for_args_file=False
        )
        if unknown:  # HfArgumentParser itself raises a bare ValueError for them
            self.error(f"unrecognized arguments: {' '.join(unknown)}")
        return groups
