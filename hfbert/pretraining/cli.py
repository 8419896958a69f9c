"""run_pretraining.py's command line (also `python -m hfbert.pretraining` and hfbert-pretrain): flags ->
`PretrainingSettings` -> `hfbert.pretraining.run.pretrain`; and its recipes.

Recipes: run_pretraining.py's flags as a file, `--recipe NAME|PATH` (or the file as the one positional
argument, as transformers' examples take `python run_mlm.py args.json`).

A recipe is a YAML (or JSON) mapping of flag names to values, with a header comment saying what it
reproduces, its source, and what it gave where it was measured (or "not run here"); its first comment line
is what `--list_recipes` prints. The shipped ones are `hfbert/recipes/*.yaml`, named by their stem.

Its keys must be fields of the parser's dataclasses (as `HfArgumentParser.parse_dict(...,
allow_extra_keys=False)` asks); its values go through the same parser as flags placed before the command
line's, so they get exactly the command line's type and choice checks (parse_dict would hand them to the
dataclasses unchecked) and a flag given on the command line wins (argparse keeps the last value). A refusal
about a flag the recipe set names the recipe file and the key.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import reprlib
import sys
from pathlib import Path
from typing import Any

import yaml

from hfbert.corpus_arguments import CorpusArguments
from hfbert.errors import Refusal, stops_in_one_line
from hfbert.flags import RefusingHfArgumentParser
from hfbert.pretraining.loop import Preempted
from hfbert.pretraining.process_group import exit_now, stop_with_the_launcher
from hfbert.pretraining.run import dry_run, pretrain
from hfbert.pretraining.settings import (
    DataSettings,
    ModelSettings,
    OptimizationSettings,
    OutputSettings,
    PretrainingSettings,
)

RECIPES_DIR = Path(__file__).resolve().parents[1] / "recipes"
RECIPE_SUFFIXES = (".yaml", ".yml", ".json")
# A corpus source or a tokenizer on the command line replaces the recipe's whole source or tokenizer (not only
# the flag it names), so that `--recipe bert-base-phase1 --train_file my.txt` is that recipe on my.txt rather than
# a refusal for giving both --dataset_name and --train_file, and `--recipe quick-start --tokenizer_name tok` that
# recipe with tok rather than a refusal of its --vocab_size: (command-line flags, the recipe keys they replace).
REPLACED_BY_THE_COMMAND_LINE = (
    (("dataset_name", "train_file"), ("dataset_name", "dataset_config_name", "train_file", "validation_file")),
    (("tokenizer_name", "vocab_size"), ("tokenizer_name", "vocab_size")),
)


def shipped_recipes() -> dict[str, Path]:
    """The recipes shipped in the package, by name (the file's stem)."""
    return {path.stem: path for path in sorted(RECIPES_DIR.glob("*.yaml"))}


def recipe_summary(path: Path) -> str:
    """The recipe's first comment line: what it is."""
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.startswith("#") and line.lstrip("#").strip():
            return line.lstrip("#").strip()
    return "(no header comment)"


def list_recipes() -> str:
    """One shipped recipe a line: its name, then what it is."""
    recipes = shipped_recipes()
    width = max(len(name) for name in recipes)
    return "\n".join(f"{name:<{width}}  {recipe_summary(path)}" for name, path in recipes.items())


def find_recipe(name_or_path: str) -> Path:
    """A shipped recipe's file by name, or a recipe file's path; anything else is refused listing the names."""
    shipped = shipped_recipes()
    if name_or_path in shipped:
        return shipped[name_or_path]
    path = Path(name_or_path).expanduser()
    if path.is_file():
        return path
    if path.suffix in RECIPE_SUFFIXES:
        raise Refusal(f"--recipe {name_or_path}: no such file")
    raise Refusal(
        f"--recipe {name_or_path} is neither a shipped recipe ({', '.join(shipped)}; --list_recipes says what "
        f"each is) nor a recipe file ({', '.join(RECIPE_SUFFIXES)})"
    )


# A recipe maps flag names to values: one level, and a second for a list or mapping value (refused as not a
# single value, with the key named).
RECIPE_DEPTH = 2


def check_yaml_recipe(path: Path, text: str) -> None:
    """Refuse, from the YAML parser's events (which never expand an alias), stopping at the first: an anchor
    (&name) or alias (*name), which printing or walking the loaded value expands (a billion laughs: a few hundred
    bytes that print as gigabytes); nesting deeper than `RECIPE_DEPTH` (PyYAML's scanner slows with the square of
    the depth: minutes for 100,000 brackets, and its composer recurses once a level)."""
    depth = 0
    for event in yaml.parse(text, Loader=yaml.SafeLoader):
        where = f"recipe {path}: line {event.start_mark.line + 1}"
        if getattr(event, "anchor", None) is not None:
            raise Refusal(
                f"{where}: YAML anchors and aliases (&name, *name) are not read in a recipe (an alias can expand a "
                "small file to gigabytes); write each value out"
            )
        depth += isinstance(event, yaml.CollectionStartEvent) - isinstance(event, yaml.CollectionEndEvent)
        if depth > RECIPE_DEPTH:
            raise Refusal(f"{where}: nested deeper than a recipe's values go (a recipe maps flag names to single values)")


def read_recipe(path: Path, parser: RefusingHfArgumentParser) -> dict[str, Any]:
    """The recipe's flags (name -> value), its keys checked against the fields of `parser`'s dataclasses."""
    kind = "JSON" if path.suffix == ".json" else "YAML"
    try:  # as HfArgumentParser.parse_json_file / parse_yaml_file read them; a file not UTF-8 is a ValueError
        text = path.read_text(encoding="utf-8")
        if kind == "YAML":
            check_yaml_recipe(path, text)
        values = json.loads(text) if kind == "JSON" else yaml.safe_load(text)
    except Refusal:
        raise
    except (ValueError, yaml.YAMLError) as error:
        reason = " ".join(str(error).split())
        raise Refusal(f"recipe {path}: not valid {kind}: {reason}") from None
    except RecursionError:  # json's parser recurses once a nesting level
        raise Refusal(
            f"recipe {path}: nested deeper than Python's JSON parser reads (a recipe maps flag names to single "
            "values)"
        ) from None
    if not isinstance(values, dict):
        raise Refusal(f"recipe {path}: holds no mapping of flag names to values (e.g. `learning_rate: 1.0e-3`)")
    if "recipe" in values:
        raise Refusal(f"recipe {path}: key recipe: a recipe cannot name another recipe")
    defaults = {field.name: field.default for dtype in parser.dataclass_types for field in dataclasses.fields(dtype)}
    unknown = sorted(set(values) - defaults.keys())
    if unknown:
        raise Refusal(
            f"recipe {path}: key {', '.join(map(str, unknown))} is not a run_pretraining.py flag (see --help)"
        )
    for key, value in values.items():
        if isinstance(value, (list, dict)):  # shown cut short: a list may be as long as the file
            raise Refusal(f"recipe {path}: key {key}: {reprlib.repr(value)} is not a single value")
        if value is None and defaults[key] is not None:
            raise Refusal(f"recipe {path}: key {key}: null, and --{key} cannot be unset (its default is {defaults[key]!r})")
    return {key: value for key, value in values.items() if value is not None}


def _flag_text(value: Any) -> str:
    return str(value).lower() if isinstance(value, bool) else str(value)


def apply_recipe(argv: list[str], parser: RefusingHfArgumentParser) -> tuple[list[str], Path | None, set[str]]:
    """The command line with the recipe's flags in front (so the command line's win), the recipe's file, and
    the flags it set that the command line does not override. The recipe is `--recipe X`, or a .yaml/.json file
    given as the first argument (turned into `--recipe X`)."""
    if argv and not argv[0].startswith("-") and argv[0].endswith(RECIPE_SUFFIXES):
        argv = ["--recipe", argv[0], *argv[1:]]
    # parse_known_args also takes --recipe=X and the abbreviations the full parser would take.
    scan = RefusingHfArgumentParser(add_help=False)
    scan.add_argument("--recipe")
    name = scan.parse_known_args(argv)[0].recipe
    if name is None:
        return argv, None, set()
    path = find_recipe(name)
    values = read_recipe(path, parser)
    given = parser.given_flags(argv)
    for flags, keys in REPLACED_BY_THE_COMMAND_LINE:
        if given & set(flags):
            values = {key: value for key, value in values.items() if key not in keys}
    flags = [word for key, value in values.items() for word in (f"--{key}", _flag_text(value))]
    return [*flags, *argv], path, set(values) - given


def build_parser() -> RefusingHfArgumentParser:
    """run_pretraining.py's flags: the corpus flags it shares with train_tokenizer.py, then its own groups,
    and --list_recipes."""
    parser = RefusingHfArgumentParser(
        (CorpusArguments, DataSettings, ModelSettings, OptimizationSettings, OutputSettings)  # type: ignore[arg-type]
    )
    parser.add_argument(
        "--list_recipes",
        action="version",  # argparse's print-and-exit action: printed as --help is, before any check
        version=list_recipes(),
        help="Print the shipped recipes (for --recipe), one a line: its name, then what it is; and exit.",
    )
    return parser


def parse_args(argv: list[str] | None = None) -> PretrainingSettings:
    """Parse and validate run_pretraining.py's flags (every check runs here, before any work), a recipe's
    (--recipe, or a .yaml/.json file as the first argument) first: the command line's override them."""
    parser = build_parser()
    argv, recipe, from_recipe = apply_recipe(sys.argv[1:] if argv is None else list(argv), parser)
    try:
        return PretrainingSettings(*parser.parse_flags(argv), given=parser.given_flags(argv))
    except Refusal as refusal:
        # A refusal that names a flag the recipe set (and the command line did not) says so, with the file.
        keys = [key for key in dict.fromkeys(re.findall(r"--(\w+)", str(refusal))) if key in from_recipe]
        if not keys:
            raise
        raise Refusal(f"recipe {recipe}, key {', '.join(keys)}: {refusal}") from None


def main(argv: list[str] | None = None, launcher_pid: int | None = None) -> None:
    """Entry point of run_pretraining.py. A worker of torchrun stops (SIGTERM) when torchrun exits
    (`stop_with_the_launcher`; `launcher_pid`: the parent the entry point read before its imports, None: the
    parent now). A run stopped by SIGTERM/SIGUSR1 exits with 128 + the signal's number, as a process ended by
    it would."""
    stop_with_the_launcher(os.getppid() if launcher_pid is None else launcher_pid)
    settings = parse_args(argv)
    if settings.output.dry_run:
        print(dry_run(settings))
        return
    try:
        final = pretrain(settings)
    except Preempted as stopped:
        print(f"\n{stopped}", file=sys.stderr, flush=True)
        if not stopped.process_group_ended:
            exit_now(128 + stopped.signal_number)
        raise SystemExit(128 + stopped.signal_number) from None
    if int(os.environ.get("RANK", "0")) == 0:
        held = "card, curves and samples" if final.fill_mask is not None else "card and curves"
        print(f"\nModel, tokenizer, model {held}: {final.path.resolve()}\n")
        if final.fill_mask is not None:
            print(final.fill_mask)
        sys.stdout.flush()
    if not final.process_group_ended:
        exit_now(0)


def command_line(launcher_pid: int | None = None) -> None:
    """The process entry point of `python -m hfbert.pretraining` and hfbert-pretrain (run_pretraining.py's is
    its own two lines)."""
    with stops_in_one_line():
        main(launcher_pid=launcher_pid)
