"""run_pretraining.py's command line: flags -> `PretrainingSettings` -> `hfbert.training.pretrain`."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import transformers
from transformers import HfArgumentParser

from hfbert.corpus import CorpusArguments
from hfbert.pretraining_settings import (
    DataSettings,
    ModelSettings,
    OptimizationSettings,
    PretrainingSettings,
    RunSettings,
)
from hfbert.training import ModelFactory, hfbert_model, pretrain

FILL_MASK_EXAMPLE = "The game was released in [MASK] ."


def parse_args(argv: list[str] | None = None) -> PretrainingSettings:
    """Parse and validate run_pretraining.py's flags (every check runs here, before any work)."""
    parser = HfArgumentParser(
        (CorpusArguments, DataSettings, ModelSettings, OptimizationSettings, RunSettings)  # type: ignore[arg-type]
    )
    corpus, data, model, optimization, run = parser.parse_args_into_dataclasses(args=argv)
    return PretrainingSettings(corpus=corpus, data=data, model=model, optimization=optimization, run=run)


def fill_mask_example(model_dir: Path) -> str:
    """A few lines showing pipeline("fill-mask") on the saved folder."""
    # The MLM-only model leaves the pooler and NSP head unused; its load report would only be noise here.
    transformers.utils.logging.set_verbosity_error()
    fill_mask = transformers.pipeline("fill-mask", model=str(model_dir), device="cpu")
    text = FILL_MASK_EXAMPLE.replace("[MASK]", fill_mask.tokenizer.mask_token)
    lines = [f'pipeline("fill-mask", model="{model_dir}")("{text}"):']
    lines += [f"  {p['score']:.3f}  {p['sequence']}" for p in fill_mask(text, top_k=5)]
    return "\n".join(lines)


def main(argv: list[str] | None = None, model_factory: ModelFactory = hfbert_model) -> None:
    """Entry point of run_pretraining.py; benchmarks pass another `model_factory` (e.g. stock BERT)."""
    output_dir = pretrain(parse_args(argv), model_factory=model_factory)
    if int(os.environ.get("RANK", "0")) == 0:
        print(f"\nModel, tokenizer, model card and curves: {output_dir.resolve()}")
        if model_factory is hfbert_model:
            print(fill_mask_example(output_dir))
        sys.stdout.flush()
