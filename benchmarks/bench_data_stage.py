"""Seconds of the data stage (corpus -> documents -> tokenized sentences -> NSP instances) for a first run, a
second identical run and a resume, each in a fresh process sharing one new datasets cache.

The resume loads the same tokenizer from another folder, as a resumed run loads it from
``checkpoint-N/tokenizer``. The tokenizer (``--vocab_size``, trained on the corpus once, untimed) and the flags
(``--max_seq_length``, ``--dupe_factor``, ``--seed``) are the Quick start's by default. The stage is what
run_pretraining.py does before its model exists: `load_documents`, `split_validation_documents`,
`tokenize_documents` on both splits and `build_nsp_instances` for every pass.

    python -m benchmarks.bench_data_stage --dupe_factor 10
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # before datasets is imported: the sample is local
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

STAGES = (
    ("first run", "tokenizer"),
    ("second run", "tokenizer"),
    ("resume (tokenizer from checkpoint-N/tokenizer)", "checkpoint-2/tokenizer"),
)

REPO = Path(__file__).resolve().parents[1]  # `python -m benchmarks.<name>` runs from here


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--vocab_size", type=int, default=8192)
    parser.add_argument("--max_seq_length", type=int, default=128)
    parser.add_argument("--dupe_factor", type=int, default=10)
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--stage_tokenizer", default=None, help=argparse.SUPPRESS)  # one timed stage
    args = parser.parse_args(argv)
    for name in ("vocab_size", "max_seq_length", "dupe_factor"):
        if getattr(args, name) < 1:
            parser.error(f"--{name} {getattr(args, name)} must be >= 1")
    return args


def data_stage(tokenizer_folder: str, args: argparse.Namespace) -> dict[str, float]:
    """Runs the data stage once in this process; returns its seconds and the number of instances."""
    from transformers import AutoTokenizer

    from hfbert.corpus import load_documents
    from hfbert.corpus_source import CorpusArguments
    from hfbert.pretraining.data import split_validation_documents, tokenize_documents
    from hfbert.pretraining.instances import InstanceRecipe, count_instances, write_instances

    start = time.perf_counter()
    tokenizer = AutoTokenizer.from_pretrained(tokenizer_folder)
    documents = split_validation_documents(load_documents(CorpusArguments()), 5, args.seed)
    instances = 0
    for split, passes in (("train", args.dupe_factor), ("validation", 1)):
        tokenized = tokenize_documents(documents[split], tokenizer)
        recipe = InstanceRecipe(
            "mlm+nsp", tokenizer.cls_token_id, tokenizer.sep_token_id, args.max_seq_length, seed=args.seed
        )
        if split == "validation":
            instances += len(write_instances(tokenized, recipe))
        for pass_index in range(passes if split == "train" else 0):
            instances += int(count_instances(tokenized, recipe, pass_index).sum())
    return {"seconds": time.perf_counter() - start, "instances": instances}


def cache_files(cache: Path) -> int:
    return sum(1 for _ in cache.rglob("cache-*.arrow"))  # an absent folder has none


def main(argv: list[str] | None = None) -> list[dict[str, float]]:
    args = parse_args(argv)
    if args.stage_tokenizer is not None:
        print(json.dumps(data_stage(args.stage_tokenizer, args)))
        return []
    from benchmarks.bench_pretraining import describe_machine
    from hfbert.corpus import load_documents
    from hfbert.corpus_source import CorpusArguments
    from hfbert.tokenization import train_tokenizer

    work = Path(tempfile.mkdtemp(prefix="bench-data-stage-"))
    try:
        # The tokenizer is trained with this process's cache; the timed stages start from an empty one.
        tokenizer = train_tokenizer(load_documents(CorpusArguments())["train"], vocab_size=args.vocab_size)
        for _, folder in STAGES:
            tokenizer.save_pretrained(work / folder)
        env = {**os.environ, "HF_DATASETS_CACHE": str(work / "datasets-cache")}
        flags = [f"--{name}={getattr(args, name)}" for name in ("vocab_size", "max_seq_length", "dupe_factor", "seed")]
        rows = []
        for name, folder in STAGES:
            before = cache_files(work / "datasets-cache")
            output = subprocess.run(
                [sys.executable, "-m", "benchmarks.bench_data_stage", *flags, "--stage_tokenizer", str(work / folder)],
                check=True, capture_output=True, text=True, env=env, cwd=REPO,
            ).stdout  # fmt: skip
            row = json.loads(output.strip().splitlines()[-1])
            row.update(stage=name, new_cache_files=cache_files(work / "datasets-cache") - before)
            rows.append(row)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    import torch

    print(f"Data stage on the shipped sample ({' '.join(flags)}); {describe_machine(torch.device('cpu'))}\n")
    print("| stage | seconds | new cache files | instances |\n|---|---:|---:|---:|")
    for row in rows:
        print(f"| {row['stage']} | {row['seconds']:.2f} | {row['new_cache_files']} | {row['instances']} |")
    return rows


if __name__ == "__main__":
    main()
