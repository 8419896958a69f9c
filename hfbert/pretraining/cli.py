"""run_pretraining.py's command line (also `python -m hfbert.pretraining` and hfbert-pretrain): flags ->
`PretrainingSettings` -> `hfbert.pretraining.run.pretrain`."""

from __future__ import annotations

import os
import sys

from hfbert.corpus_source import CorpusArguments
from hfbert.errors import Refusal, stops_in_one_line
from hfbert.flags import RefusingHfArgumentParser
from hfbert.pretraining.cluster import exit_now, stop_with_the_launcher
from hfbert.pretraining.loop import Preempted
from hfbert.pretraining.recipes import apply_recipe, list_recipes, naming_the_recipe
from hfbert.pretraining.run import dry_run, pretrain
from hfbert.pretraining.settings import (
    DataSettings,
    ModelSettings,
    OptimizationSettings,
    PretrainingSettings,
    RunSettings,
)


def build_parser() -> RefusingHfArgumentParser:
    """run_pretraining.py's flags: the corpus flags it shares with train_tokenizer.py, then its own groups,
    and --list_recipes."""
    parser = RefusingHfArgumentParser(
        (CorpusArguments, DataSettings, ModelSettings, OptimizationSettings, RunSettings)  # type: ignore[arg-type]
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
        raise naming_the_recipe(refusal, recipe, from_recipe) from None


def main(argv: list[str] | None = None, launcher_pid: int | None = None) -> None:
    """Entry point of run_pretraining.py. A worker of torchrun stops (SIGTERM) when torchrun exits
    (`stop_with_the_launcher`; `launcher_pid`: the parent the entry point read before its imports, None: the
    parent now). A run stopped by SIGTERM/SIGUSR1 exits with 128 + the signal's number, as a process ended by
    it would."""
    stop_with_the_launcher(os.getppid() if launcher_pid is None else launcher_pid)
    settings = parse_args(argv)
    if settings.run.dry_run:
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
        print(f"\nModel, tokenizer, model card, curves and samples: {final.path.resolve()}\n")
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
