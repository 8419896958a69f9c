"""Fine-tune a finished model folder on a labelled text-classification set, over several seeds, and compare it
with the same architecture from random initialisation (or with another folder).

The model is loaded as `AutoModelForSequenceClassification` and trained by transformers' `Trainer`; the data
comes from the Hub (`--dataset_name`, e.g. GLUE, whose columns and metrics are known) or from local
csv/jsonl/parquet files. Every check on the data and the folders runs before any training.

    python -m hfbert.finetune runs/hfbert-quality --train_file train.csv --validation_file test.csv \\
        --text_column text --label_column label --max_train_samples 200 --compare random_init
    python -m hfbert.finetune runs/bert-base --dataset_name nyu-mll/glue --dataset_config_name mrpc \\
        --compare random_init --seeds 1 2 3
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import datasets
import numpy as np
import torch
from transformers import (
    AutoConfig,
    AutoModelForSequenceClassification,
    AutoTokenizer,
    DataCollatorWithPadding,
    PreTrainedTokenizerBase,
    Trainer,
    TrainingArguments,
)

import hfbert  # noqa: F401  (registers model_type "hfbert" with the Auto classes)
from hfbert.files import atomic_path, check_folder_readable, write_json_atomic
from hfbert.plotting import save_figure
from hfbert.pretraining.finish import TRAINING_ARGS_NAME

RANDOM_INIT = "random_init"
RESULTS_NAME = "finetune_results.json"
PLOT_NAME = "finetune_results.png"


@dataclass(frozen=True)
class GlueTask:
    """A GLUE classification task: its columns, its evaluation split and the metrics GLUE reports."""

    text_column: str
    text_pair_column: str | None
    metrics: tuple[str, ...]
    validation_split: str = "validation"


# GLUE's classification tasks (STS-B is a regression and is not offered).
GLUE_TASKS: dict[str, GlueTask] = {
    "cola": GlueTask("sentence", None, ("matthews_correlation", "accuracy")),
    "sst2": GlueTask("sentence", None, ("accuracy",)),
    "mrpc": GlueTask("sentence1", "sentence2", ("accuracy", "f1")),
    "qqp": GlueTask("question1", "question2", ("accuracy", "f1")),
    "mnli": GlueTask("premise", "hypothesis", ("accuracy",), "validation_matched"),
    "qnli": GlueTask("question", "sentence", ("accuracy",)),
    "rte": GlueTask("sentence1", "sentence2", ("accuracy",)),
    "wnli": GlueTask("sentence1", "sentence2", ("accuracy",)),
}
GLUE_NAMES = ("glue", "nyu-mll/glue")
FILE_BUILDERS = {".csv": "csv", ".json": "json", ".jsonl": "json", ".parquet": "parquet"}


# ------------------------------------------------------------------------------------------------ metrics


def classification_metrics(predictions: np.ndarray, labels: np.ndarray) -> dict[str, float]:
    """Accuracy, F1 of class 1 (binary tasks) and Matthews correlation, computed locally (no downloads)."""
    metrics = {"accuracy": float((predictions == labels).mean())}
    classes = np.union1d(np.unique(labels), np.unique(predictions))
    if len(classes) <= 2:
        tp = float(((predictions == 1) & (labels == 1)).sum())
        fp = float(((predictions == 1) & (labels != 1)).sum())
        fn = float(((predictions != 1) & (labels == 1)).sum())
        metrics["f1"] = 2 * tp / (2 * tp + fp + fn) if tp else 0.0
    metrics["matthews_correlation"] = _matthews(predictions, labels)
    return metrics


def _matthews(predictions: np.ndarray, labels: np.ndarray) -> float:
    """Multiclass Matthews correlation (Gorodkin's R_K, as scikit-learn computes it)."""
    classes = np.union1d(labels, predictions)
    confusion = np.zeros((len(classes), len(classes)))
    np.add.at(confusion, (np.searchsorted(classes, labels), np.searchsorted(classes, predictions)), 1)
    true_sum, predicted_sum = confusion.sum(axis=1), confusion.sum(axis=0)
    samples, correct = confusion.sum(), np.trace(confusion)
    numerator = correct * samples - predicted_sum @ true_sum
    denominator = np.sqrt((samples**2 - predicted_sum @ predicted_sum) * (samples**2 - true_sum @ true_sum))
    return float(numerator / denominator) if denominator else 0.0


def _compute_metrics(prediction) -> dict[str, float]:
    logits, labels = prediction.predictions, prediction.label_ids
    return classification_metrics(np.asarray(logits).argmax(-1), np.asarray(labels))


# ------------------------------------------------------------------------------------------------ data


@dataclass(frozen=True)
class TaskData:
    """The labelled examples, as train and evaluation splits with integer labels 0..num_labels-1."""

    train: datasets.Dataset
    evaluation: datasets.Dataset
    text_column: str
    text_pair_column: str | None
    label_names: list[str]
    metrics: tuple[str, ...]


def _load_raw(args: argparse.Namespace) -> tuple[datasets.Dataset, datasets.Dataset]:
    if args.dataset_name is not None:
        task = GLUE_TASKS.get(args.dataset_config_name or "") if args.dataset_name in GLUE_NAMES else None
        try:
            splits = datasets.load_dataset(args.dataset_name, args.dataset_config_name)
        except Exception as error:  # datasets raises many types for offline / missing / typo
            raise ValueError(
                f"--dataset_name {args.dataset_name} (--dataset_config_name {args.dataset_config_name}) could not "
                f"be loaded ({type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}); check the "
                "name and your connection to the Hub, or pass --train_file/--validation_file"
            ) from None
        validation = task.validation_split if task else args.validation_split
        for split in ("train", validation):
            if split not in splits:
                raise ValueError(f"--dataset_name {args.dataset_name} has no {split!r} split; it has {list(splits)}")
        return splits["train"], splits[validation]
    loaded = []
    for flag, path in (("--train_file", args.train_file), ("--validation_file", args.validation_file)):
        path = Path(path)
        if not path.is_file():
            raise ValueError(f"{flag} {path}: no such file")
        if path.suffix not in FILE_BUILDERS:
            raise ValueError(f"{flag} {path}: use a {', '.join(FILE_BUILDERS)} file")
        loaded.append(datasets.load_dataset(FILE_BUILDERS[path.suffix], data_files=str(path), split="train"))
    return loaded[0], loaded[1]


def _columns(args: argparse.Namespace) -> tuple[str, str | None, str, tuple[str, ...]]:
    """(text column, pair column, label column, metrics) from the flags, with GLUE's defaults."""
    task = GLUE_TASKS.get(args.dataset_config_name or "") if args.dataset_name in GLUE_NAMES else None
    text = args.text_column or (task.text_column if task else "text")
    pair = args.text_pair_column or (task.text_pair_column if task else None)
    metrics = task.metrics if task else ("accuracy",)
    return text, pair, args.label_column, metrics


def _check_columns(split: datasets.Dataset, name: str, columns: Sequence[str | None]) -> None:
    for column in columns:
        if column is not None and column not in split.column_names:
            raise ValueError(
                f"the {name} split has no column {column!r}; its columns are {split.column_names} "
                "(choose with --text_column, --text_pair_column, --label_column)"
            )


def _label_names(train: datasets.Dataset, evaluation: datasets.Dataset, column: str) -> list[str]:
    """The classes, in the dataset's ClassLabel order or sorted; refuses labels that are not categories."""
    feature = train.features[column]
    if isinstance(feature, datasets.ClassLabel):
        return list(feature.names)
    values = train.unique(column)
    if any(isinstance(value, float) and not float(value).is_integer() for value in values):
        raise ValueError(
            f"--label_column {column} holds non-integer numbers ({values[:3]} ...): a regression target, not "
            "categories; this tool fine-tunes classifiers"
        )
    if len(values) > max(50, len(train) // 2):
        raise ValueError(
            f"--label_column {column} has {len(values)} distinct values in {len(train)} training examples: not "
            "categorical; pass the column that holds the class"
        )
    names = sorted(str(value) for value in values)
    unseen = sorted({str(value) for value in evaluation.unique(column)} - set(names))
    if unseen:
        raise ValueError(
            f"the evaluation split has labels the training split lacks: {unseen[:5]}; a classifier cannot learn "
            "them (use splits with the same classes)"
        )
    if len(names) < 2:
        raise ValueError(f"--label_column {column} has a single class {names}; a classifier needs two or more")
    return names


def _with_label_ids(split: datasets.Dataset, column: str, names: list[str]) -> datasets.Dataset:
    if isinstance(split.features[column], datasets.ClassLabel):
        return split.filter(lambda row: row[column] >= 0).rename_column(column, "labels")  # GLUE test: -1
    index = {name: i for i, name in enumerate(names)}
    return split.map(lambda row: {"labels": index[str(row[column])]}, remove_columns=[column])


def few_labels(train: datasets.Dataset, count: int, seed: int) -> datasets.Dataset:
    """`count` training examples drawn as evenly across the classes as they allow (stratified), by `seed`."""
    generator = np.random.default_rng(seed)
    labels = np.asarray(train["labels"])
    by_class = [generator.permutation(np.flatnonzero(labels == label)) for label in np.unique(labels)]
    chosen, round_index = [], 0
    while len(chosen) < min(count, len(labels)):
        for indices in by_class:
            if round_index < len(indices) and len(chosen) < count:
                chosen.append(int(indices[round_index]))
        round_index += 1
    return train.select(sorted(chosen))


def load_task(args: argparse.Namespace) -> TaskData:
    """The task's splits with integer labels, after every check on columns and labels."""
    text, pair, label, metrics = _columns(args)
    train, evaluation = _load_raw(args)
    _check_columns(train, "training", (text, pair, label))
    _check_columns(evaluation, "evaluation", (text, pair, label))
    names = _label_names(train, evaluation, label)
    train, evaluation = (_with_label_ids(split, label, names) for split in (train, evaluation))
    if args.max_train_samples is not None:
        train = few_labels(train, args.max_train_samples, args.data_seed)
    if args.max_eval_samples is not None:
        evaluation = evaluation.shuffle(seed=args.data_seed).select(range(min(args.max_eval_samples, len(evaluation))))
    return TaskData(train, evaluation, text, pair, names, metrics)


def tokenize(task: TaskData, tokenizer: PreTrainedTokenizerBase, max_seq_length: int) -> tuple[datasets.Dataset, ...]:
    def encode(rows: dict[str, list]) -> dict[str, list]:
        pair = rows[task.text_pair_column] if task.text_pair_column else None
        return tokenizer(rows[task.text_column], pair, truncation=True, max_length=max_seq_length)

    return tuple(
        split.map(encode, batched=True, remove_columns=[c for c in split.column_names if c != "labels"])
        for split in (task.train, task.evaluation)
    )


# ------------------------------------------------------------------------------------------------ models


def check_model_folder(folder: str) -> None:
    """Refuse, before any work, a folder that holds no model (or a damaged one)."""
    path = Path(folder)
    if not path.is_dir():
        raise ValueError(f"{folder}: no such folder; pass a finished run's output folder (it holds config.json)")
    if not (path / "config.json").is_file() or (not any(path.glob("*.safetensors")) and not any(path.glob("*.bin"))):
        raise ValueError(
            f"{folder} holds no model (config.json and weights); pass a finished run's output folder, not a "
            "checkpoint-<step> folder or a tokenizer folder"
        )
    check_folder_readable(path, "copy or write the folder again")


def build_model(
    folder: str, init: str, num_labels: int, seed: int, label_names: list[str], reinit_query_key: bool = False
) -> torch.nn.Module:
    """The classifier of `folder`: its pretrained weights (init = "pretrained") or the same config freshly
    initialised under `seed` (init = RANDOM_INIT). The classification head is new either way; with
    `reinit_query_key` so are the pretrained model's attention queries and keys."""
    labels = {"id2label": dict(enumerate(label_names)), "label2id": {n: i for i, n in enumerate(label_names)}}
    torch.manual_seed(seed)  # the new head (and, for random_init, everything) starts from the seed
    if init == RANDOM_INIT:
        config = AutoConfig.from_pretrained(folder, num_labels=num_labels, trust_remote_code=True, **labels)
        return AutoModelForSequenceClassification.from_config(config, trust_remote_code=True)
    model = AutoModelForSequenceClassification.from_pretrained(
        folder, num_labels=num_labels, trust_remote_code=True, **labels
    )
    if reinit_query_key:
        reinitialise_query_key(model)
    return model


@torch.no_grad()
def reinitialise_query_key(model: torch.nn.Module) -> int:
    """Draw every attention layer's query and key projections afresh, as BERT initialises them (N(0,
    initializer_range), zero bias), keeping the embeddings, values, outputs and feed-forward layers; returns
    how many projections were drawn. The attention patterns a small model learns in pretraining (the previous
    and next token, the same word) are sharp, and few-label fine-tuning does not unlearn them, while the rest
    of the weights transfer well (benchmarks/results/downstream.md). Drawn here rather than by the model's
    `_init_weights`, which skips tensors that `from_pretrained` loaded."""
    projections = [
        module
        for name, module in model.named_modules()
        if isinstance(module, torch.nn.Linear) and name.rsplit(".", 1)[-1] in ("query", "key")
    ]
    if not projections:
        raise ValueError(
            f"{type(model).__name__} has no attention projections named query and key (BERT's layout); "
            "fine-tune it without --reinit_query_key"
        )
    std = model.config.initializer_range
    for projection in projections:
        projection.weight.normal_(0.0, std)
        if projection.bias is not None:
            projection.bias.zero_()
    return len(projections)


def finetune_once(
    model: torch.nn.Module,
    tokenizer: PreTrainedTokenizerBase,
    train: datasets.Dataset,
    evaluation: datasets.Dataset,
    args: argparse.Namespace,
    seed: int,
) -> dict[str, float]:
    """One fine-tuning run with transformers' Trainer; returns the evaluation metrics."""
    with tempfile.TemporaryDirectory(prefix="hfbert-finetune-") as scratch:
        training_args = TrainingArguments(
            output_dir=scratch,
            learning_rate=args.learning_rate,
            num_train_epochs=args.num_train_epochs,
            per_device_train_batch_size=args.per_device_train_batch_size,
            per_device_eval_batch_size=64,
            warmup_steps=args.warmup_ratio,  # a float in [0, 1): a share of the updates
            weight_decay=args.weight_decay,
            lr_scheduler_type="linear",
            seed=seed,
            eval_strategy="no",
            save_strategy="no",
            logging_strategy="no",
            report_to=[],
            use_cpu=not torch.cuda.is_available(),
            fp16=args.fp16,
            disable_tqdm=args.quiet,
        )
        trainer = Trainer(
            model=model,
            args=training_args,
            train_dataset=train,
            data_collator=DataCollatorWithPadding(tokenizer),
            compute_metrics=_compute_metrics,
        )
        trainer.train()
        metrics = trainer.evaluate(evaluation)
    return {key.removeprefix("eval_"): value for key, value in metrics.items() if isinstance(value, float)}


# ------------------------------------------------------------------------------------------------ report


def summarise(per_seed: dict[int, dict[str, float]], metrics: Sequence[str]) -> dict[str, Any]:
    summary = {}
    for metric in metrics:
        values = [run[metric] for run in per_seed.values()]
        summary[metric] = {
            "mean": statistics.fmean(values),
            "std": statistics.stdev(values) if len(values) > 1 else 0.0,
            "per_seed": values,
        }
    return summary


def report_table(results: dict[str, Any]) -> str:
    """Markdown table: per model and metric, mean ± std over seeds and the per-seed values, then the gain."""
    lines = ["| model | metric | mean ± std | per seed |", "|---|---|---|---|"]
    for name, model in results["models"].items():
        for metric, stats in model["summary"].items():
            seeds = ", ".join(f"{value:.3f}" for value in stats["per_seed"])
            lines.append(f"| {name} | {metric} | {stats['mean']:.3f} ± {stats['std']:.3f} | {seeds} |")
    for metric, gain in results.get("gain", {}).items():
        lines.append(f"\nGain in {metric} over {results['compare']}: {gain['mean']:+.3f} ± {gain['std']:.3f} (per seed)")
    return "\n".join(lines)


def gain(first: dict[str, Any], second: dict[str, Any]) -> dict[str, dict[str, float]]:
    """Per-seed differences first - second (same seeds, same data), their mean and spread."""
    out = {}
    for metric, stats in first.items():
        differences = [a - b for a, b in zip(stats["per_seed"], second[metric]["per_seed"], strict=True)]
        out[metric] = {
            "mean": statistics.fmean(differences),
            "std": statistics.stdev(differences) if len(differences) > 1 else 0.0,
        }
    return out


def plot_results(results: dict[str, Any], path: Path) -> Path:
    """Accuracy per seed, one marker series per model."""
    import matplotlib.pyplot as plt  # after hfbert.plotting chose the headless backend

    figure, axis = plt.subplots(figsize=(5.5, 3.5), constrained_layout=True)
    seeds = results["seeds"]
    for offset, (name, model) in enumerate(results["models"].items()):
        values = model["summary"]["accuracy"]["per_seed"]
        axis.scatter([offset] * len(values), values, label=name)
        axis.hlines(statistics.fmean(values), offset - 0.2, offset + 0.2, color="black")
    axis.set_xticks(range(len(results["models"])), list(results["models"]), fontsize=8)
    axis.set_ylabel("accuracy (evaluation split)")
    axis.set_title(f"Fine-tuned accuracy per seed (seeds {seeds})", fontsize=9)
    axis.grid(alpha=0.3)
    return save_figure(figure, path)


def add_to_model_card(folder: Path, results: dict[str, Any], dataset: str, dataset_config: str | None) -> Path:
    """Add the pretrained model's mean fine-tuned metrics to the folder's model card as `model-index` entries
    (Hub metadata), keeping the card's text and its other results; written atomically."""
    from huggingface_hub import EvalResult, ModelCard

    card_path = folder / "README.md"
    card = ModelCard.load(card_path) if card_path.is_file() else ModelCard("---\n---\n")
    data = card.data
    data.model_name = data.model_name or folder.name
    entries = [
        result for result in (data.eval_results or [])
        if not (result.task_type == "text-classification" and result.dataset_type == dataset)
    ]  # fmt: skip
    how = "query/key re-initialised, " if results["settings"].get("reinit_query_key") else ""
    seed_count = f"{len(results['seeds'])} seed" + ("s" if len(results["seeds"]) != 1 else "")
    for metric, stats in results["models"]["pretrained"]["summary"].items():
        entries.append(
            EvalResult(
                task_type="text-classification",
                dataset_type=dataset,
                dataset_name=dataset,
                dataset_config=dataset_config,
                dataset_split=results["evaluation_split"],
                metric_type=metric,
                metric_value=round(stats["mean"], 4),
                metric_name=f"{metric} (fine-tuned, {how}mean of {seed_count})",
            )
        )
    data.eval_results = entries
    with atomic_path(card_path) as temp_path:
        card.save(temp_path)
    return card_path


def reinit_query_key_hint(folder: str) -> str | None:
    """A note for a folder that `run_pretraining.py` pretrained from the structured attention start (its
    training_args.json says so): such folders fine-tuned better with --reinit_query_key in every measurement.
    None for any other folder."""
    try:
        training_args = json.loads((Path(folder) / TRAINING_ARGS_NAME).read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(training_args, dict) or training_args.get("attention_init") != "structured":
        return None
    if training_args.get("model_name_or_path"):  # started from weights: the start was not applied
        return None
    return (
        f"Note: {folder} was pretrained from the structured attention start. Such folders fine-tuned better "
        "with --reinit_query_key in every measurement so far (tiny models, 150 and 1,500 labels: "
        "benchmarks/results/downstream.md in the hfbert repository)."
    )


def run_comparison(args: argparse.Namespace) -> dict[str, Any]:
    """Fine-tune the folder (and the comparison) under every seed; returns the results."""
    check_model_folder(args.model_dir)
    models = {"pretrained": (args.model_dir, "pretrained")}
    if args.compare == RANDOM_INIT:
        models[RANDOM_INIT] = (args.model_dir, RANDOM_INIT)
    elif args.compare is not None:
        check_model_folder(args.compare)
        models[Path(args.compare).name] = (args.compare, "pretrained")
    hint = None if args.reinit_query_key else reinit_query_key_hint(args.model_dir)
    if hint:
        print(hint, flush=True)
    task = load_task(args)
    results: dict[str, Any] = {
        "model_dir": str(args.model_dir),
        "compare": args.compare,
        "seeds": list(args.seeds),
        "train_examples": len(task.train),
        "evaluation_examples": len(task.evaluation),
        "evaluation_split": "validation",
        "labels": task.label_names,
        "settings": {key: value for key, value in vars(args).items() if key not in ("model_dir",)},
        "models": {},
    }
    for name, (folder, init) in models.items():
        tokenizer = AutoTokenizer.from_pretrained(folder, trust_remote_code=True)
        train, evaluation = tokenize(task, tokenizer, args.max_seq_length)
        per_seed = {}
        for seed in args.seeds:
            model = build_model(folder, init, len(task.label_names), seed, task.label_names, args.reinit_query_key)
            per_seed[seed] = finetune_once(model, tokenizer, train, evaluation, args, seed)
            print(f"{name}, seed {seed}: " + ", ".join(f"{m} {per_seed[seed][m]:.3f}" for m in task.metrics), flush=True)
        results["models"][name] = {"folder": str(folder), "init": init, "summary": summarise(per_seed, task.metrics)}
    if len(models) > 1:
        first, second = list(results["models"].values())[:2]
        results["gain"] = gain(first["summary"], second["summary"])
    return results


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("model_dir", help="a finished run's output folder (or any BERT folder)")
    data = parser.add_argument_group("data")
    data.add_argument("--dataset_name", help="a Hub dataset, e.g. nyu-mll/glue (GLUE's columns and metrics are known)")
    data.add_argument("--dataset_config_name", help="e.g. sst2, mrpc, rte, mnli, cola, qnli, qqp")
    data.add_argument("--validation_split", default="validation", help="evaluation split of a non-GLUE Hub set")
    data.add_argument("--train_file", help="local csv, jsonl/json or parquet")
    data.add_argument("--validation_file", help="local csv, jsonl/json or parquet (the held-out evaluation)")
    data.add_argument("--text_column", help="default: GLUE's, else 'text'")
    data.add_argument("--text_pair_column", help="second text of sentence-pair tasks (default: GLUE's)")
    data.add_argument("--label_column", default="label")
    data.add_argument("--max_train_samples", type=int, help="few-label runs: this many, evenly across classes")
    data.add_argument("--max_eval_samples", type=int)
    data.add_argument("--data_seed", type=int, default=0, help="which examples --max_train_samples keeps")
    training = parser.add_argument_group("fine-tuning (transformers' Trainer)")
    training.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    training.add_argument("--learning_rate", type=float, default=5e-5)
    training.add_argument("--num_train_epochs", type=float, default=3.0)
    training.add_argument("--per_device_train_batch_size", type=int, default=16)
    training.add_argument("--warmup_ratio", type=float, default=0.1)
    training.add_argument("--weight_decay", type=float, default=0.01)
    training.add_argument("--max_seq_length", type=int, default=128)
    training.add_argument("--fp16", action="store_true", help="fp16 mixed precision (CUDA)")
    training.add_argument(
        "--reinit_query_key",
        action="store_true",
        help="draw the pretrained folders' attention queries and keys afresh before fine-tuning (the embeddings, "
        "values and feed-forward layers stay pretrained): small hfbert folders fine-tune better so with few labels",
    )
    output = parser.add_argument_group("comparison and output")
    output.add_argument("--compare", help=f"'{RANDOM_INIT}' (the same config, freshly initialised) or another folder")
    output.add_argument("--output_dir", help=f"where {RESULTS_NAME} and {PLOT_NAME} go (default: the model folder)")
    output.add_argument("--update_model_card", action="store_true", help="add the results to the folder's README.md")
    output.add_argument("--quiet", action="store_true", help="no progress bars")
    args = parser.parse_args(argv)
    if (args.dataset_name is None) == (args.train_file is None):
        parser.error("pass either --dataset_name or --train_file (with --validation_file)")
    if args.train_file is not None and args.validation_file is None:
        parser.error("--train_file needs --validation_file: results are measured on held-out examples")
    for name in ("learning_rate", "num_train_epochs", "per_device_train_batch_size", "max_seq_length"):
        if not getattr(args, name) > 0:
            parser.error(f"--{name} {getattr(args, name)} must be > 0")
    if not 0 <= args.warmup_ratio < 1:
        parser.error(f"--warmup_ratio {args.warmup_ratio} must be in [0, 1)")
    if args.max_train_samples is not None and args.max_train_samples < 2:
        parser.error(f"--max_train_samples {args.max_train_samples} must be >= 2")
    if len(set(args.seeds)) != len(args.seeds):
        parser.error(f"--seeds {args.seeds} repeats a seed")
    return args


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    results = run_comparison(args)
    output_dir = Path(args.output_dir or args.model_dir)
    output_dir.mkdir(parents=True, exist_ok=True)
    write_json_atomic(output_dir / RESULTS_NAME, results)
    plot_results(results, output_dir / PLOT_NAME)
    if args.update_model_card:
        dataset = args.dataset_name or Path(args.train_file).stem
        add_to_model_card(Path(args.model_dir), results, dataset, args.dataset_config_name)
    print("\n" + report_table(results))
    print(f"\nResults: {output_dir / RESULTS_NAME}, {output_dir / PLOT_NAME}")
    return results


if __name__ == "__main__":
    from hfbert.errors import run_cli

    run_cli(main, prog="python -m hfbert.finetune")
