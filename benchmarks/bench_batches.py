"""Host-side cost of building one pretraining batch: hfbert's collator against transformers' collator.

Real NSP instances of the shipped WikiText-2 sample (tokenizer trained on the sample, `--seq_len` long) are
cut into batches of `--batch_size` in a fixed shuffled order, and every way of building a batch is timed on
the same batches, alternately, in one process (medians over `--batches` batches, ms per batch):

- transformers: `DataCollatorForLanguageModeling(pad_to_multiple_of=8)` on a list of dicts (tokenizer.pad,
  then masking), what a `Trainer` user's loader runs, and what hfbert's loop ran before its own collator;
- hfbert, rows: `DataCollatorForPretraining` on the same list of dicts (padding and masking);
- hfbert, loader: what hfbert's loader does per batch: fetch the rows from the dataset as columns with their
  draw ids (`InstanceDraws.__getitems__`), then pad and mask from the batch's own generator;
- hfbert, loader, static: the same with every row padded to `--seq_len` and `--max_predictions_per_seq`
  static masked slots (the CUDA default and --torch_compile's form).

    python -m benchmarks.bench_batches --batch_size 128 --seq_len 128
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # before datasets is imported: the sample is local
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import torch
from transformers import DataCollatorForLanguageModeling

from benchmarks.bench_pretraining import SEED, describe_machine, sample_instances
from hfbert.pretraining.batches import (
    DataCollatorForPretraining,
    EpochDraws,
    InstanceDraws,
    default_max_predictions,
)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--batch_size", type=int, default=128)
    parser.add_argument("--seq_len", type=int, default=128)
    parser.add_argument("--max_predictions_per_seq", type=int, default=None, help="default: hfbert's default")
    parser.add_argument("--batches", type=int, default=50, help="timed batches per way (after 3 warm-up)")
    parser.add_argument("--vocab_size", type=int, default=30522)
    args = parser.parse_args(argv)
    for name in ("batch_size", "seq_len", "batches", "vocab_size"):
        if getattr(args, name) < 1:
            parser.error(f"--{name} {getattr(args, name)} must be >= 1")
    return args


def main(argv: list[str] | None = None) -> dict[str, float]:
    args = parse_args(argv)
    torch.manual_seed(SEED)
    tokenizer, instances = sample_instances(args.vocab_size, args.seq_len)
    slots = args.max_predictions_per_seq or default_max_predictions(args.seq_len, 0.15)
    draws = list(EpochDraws(len(instances), seed=SEED))
    batch_draws = [draws[i : i + args.batch_size] for i in range(0, len(draws), args.batch_size)]
    batch_draws = [batch for batch in batch_draws if len(batch) == args.batch_size][: args.batches]
    dataset = InstanceDraws(instances.select_columns(["input_ids", "token_type_ids", "next_sentence_label"]))
    rows = [[dataset[draw] for draw in batch] for batch in batch_draws]  # lists of dicts, fetched beforehand
    for batch in rows:
        for row in batch:
            del row["draw"]
    transformers_collator = DataCollatorForLanguageModeling(
        tokenizer, mlm_probability=0.15, pad_to_multiple_of=8
    )
    dynamic = DataCollatorForPretraining(tokenizer, seed=SEED)
    static = DataCollatorForPretraining(
        tokenizer, seed=SEED, pad_to_length=args.seq_len, max_predictions_per_seq=slots
    )
    ways = {
        "transformers DataCollatorForLanguageModeling, rows": lambda i: transformers_collator(rows[i]),
        "hfbert DataCollatorForPretraining, rows": lambda i: dynamic(rows[i]),
        "hfbert loader: fetch + pad + mask": lambda i: dynamic(dataset.__getitems__(batch_draws[i])),
        f"hfbert loader, static (length {args.seq_len}, {slots} slots)": lambda i: static(
            dataset.__getitems__(batch_draws[i])
        ),
    }
    count = len(batch_draws)
    times: dict[str, list[float]] = {name: [] for name in ways}
    for repetition in range(3 + count):  # 3 warm-up batches; the ways alternate, batch by batch
        for name, build in ways.items():
            start = time.perf_counter()
            build(repetition % count)
            if repetition >= 3:
                times[name].append(time.perf_counter() - start)
    results = {name: statistics.median(values) * 1e3 for name, values in times.items()}
    baseline = results[next(iter(results))]
    print(
        f"\n{count} batches of {args.batch_size} NSP instances (length <= {args.seq_len}), {len(tokenizer)}-token "
        f"tokenizer; {describe_machine(torch.device('cpu'))}\n"
    )
    print("| batch builder | ms per batch | vs transformers |")
    print("|---|---|---|")
    for name, ms in results.items():
        print(f"| {name} | {ms:.2f} | {baseline / ms:.1f}x faster |")
    return results


if __name__ == "__main__":
    main()
