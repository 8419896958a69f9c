"""run_pretraining.py's command line: flags -> `PretrainingSettings` -> `hfbert.pretraining.run.pretrain`."""

from __future__ import annotations

import os
import sys

from hfbert.corpus_source import CorpusArguments
from hfbert.pretraining.loop import Preempted
from hfbert.pretraining.run import pretrain_run
from hfbert.pretraining.settings import (
    DataSettings,
    ModelSettings,
    OptimizationSettings,
    PretrainingSettings,
    RunSettings,
)
from hfbert.tokenization import RefusingHfArgumentParser


def build_parser() -> RefusingHfArgumentParser:
    """run_pretraining.py's flags: the corpus flags it shares with train_tokenizer.py, then its own groups."""
    return RefusingHfArgumentParser(
        (CorpusArguments, DataSettings, ModelSettings, OptimizationSettings, RunSettings)  # type: ignore[arg-type]
    )


def parse_args(argv: list[str] | None = None) -> PretrainingSettings:
    """Parse and validate run_pretraining.py's flags (every check runs here, before any work)."""
    corpus, data, model, optimization, run = build_parser().parse_flags(argv)
    return PretrainingSettings(corpus=corpus, data=data, model=model, optimization=optimization, run=run)


def main(argv: list[str] | None = None) -> None:
    """Entry point of run_pretraining.py. A run stopped by SIGTERM/SIGUSR1 exits with 128 + the signal's
    number, as a process ended by it would."""
    try:
        final = pretrain_run(parse_args(argv))
    except Preempted as stopped:
        print(f"\n{stopped}", file=sys.stderr, flush=True)
        raise SystemExit(128 + stopped.signal_number) from None
    if int(os.environ.get("RANK", "0")) == 0:
        print(f"\nModel, tokenizer, model card, curves and samples: {final.path.resolve()}\n")
        if final.fill_mask is not None:
            print(final.fill_mask)
        sys.stdout.flush()
