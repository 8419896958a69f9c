"""run_pretraining.py's command line: flags -> `PretrainingSettings` -> `hfbert.training.pretrain`."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from transformers import HfArgumentParser

from hfbert.corpus import CorpusArguments
from hfbert.inspect import SAMPLES_NAME
from hfbert.pretraining_settings import (
    DataSettings,
    ModelSettings,
    OptimizationSettings,
    PretrainingSettings,
    RunSettings,
)
from hfbert.training import ModelFactory, Preempted, hfbert_model, pretrain


def build_parser() -> HfArgumentParser:
    """run_pretraining.py's flags: the corpus flags it shares with train_tokenizer.py, then its own groups."""
    parser = HfArgumentParser(
        (CorpusArguments, DataSettings, ModelSettings, OptimizationSettings, RunSettings)  # type: ignore[arg-type]
    )
    # --streaming is train_tokenizer.py's: pretraining pairs sentences across the whole cached corpus, so the
    # flag stays parseable (validate refuses it with that reason) but is not offered in --help.
    for action in parser._actions:
        if action.dest == "streaming":
            action.help = argparse.SUPPRESS
    return parser


def parse_args(argv: list[str] | None = None) -> PretrainingSettings:
    """Parse and validate run_pretraining.py's flags (every check runs here, before any work)."""
    corpus, data, model, optimization, run = build_parser().parse_args_into_dataclasses(args=argv)
    return PretrainingSettings(corpus=corpus, data=data, model=model, optimization=optimization, run=run)


def fill_mask_section(model_dir: Path) -> str:
    """The fill-mask part of the run's samples.md: top-5 on validation sentences, the true word marked."""
    samples = (model_dir / SAMPLES_NAME).read_text(encoding="utf-8")
    start = samples.index("## Fill-mask")
    end = samples.find("\n## ", start + 1)
    return samples[start : end if end >= 0 else None].strip()


def main(argv: list[str] | None = None, model_factory: ModelFactory = hfbert_model) -> None:
    """Entry point of run_pretraining.py; benchmarks pass another `model_factory` (e.g. stock BERT). A run
    stopped by SIGTERM/SIGUSR1 exits with 128 + the signal's number, as a process ended by it would."""
    try:
        output_dir = pretrain(parse_args(argv), model_factory=model_factory)
    except Preempted as stopped:
        print(f"\n{stopped}", file=sys.stderr, flush=True)
        raise SystemExit(128 + stopped.signal_number) from None
    if int(os.environ.get("RANK", "0")) == 0:
        print(f"\nModel, tokenizer, model card, curves and samples: {output_dir.resolve()}\n")
        if (output_dir / SAMPLES_NAME).is_file():
            print(fill_mask_section(output_dir))
        sys.stdout.flush()
