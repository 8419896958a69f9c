"""Fine-tune a finished model folder on a labelled text-classification set, over several seeds, and compare it
with the same architecture from random initialisation (or with another folder).

The model is loaded as `AutoModelForSequenceClassification` and trained by transformers' `Trainer`; the data
comes from the Hub (`--dataset_name`, e.g. GLUE, whose columns and metrics are known) or from local
csv/jsonl/parquet files. Every check on the data and the folders runs before any training. Unless
--learning_rate is a number, each model's rate (the comparison's too) is chosen on a stratified 20% of the
training rows held out, never on the evaluation split; the epochs follow the model's size.

    python -m hfbert.finetune runs/hfbert-quality --train_file train.csv --validation_file test.csv \\
        --text_column text --label_column label --max_train_samples 200 --compare random_init
    python -m hfbert.finetune runs/bert-base --dataset_name nyu-mll/glue --dataset_config_name mrpc \\
        --compare random_init --seeds 1 2 3
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import signal
import statistics
import sys
import tempfile
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import datasets
import numpy as np
import torch
import transformers
from transformers import (
    AutoConfig,
    AutoModelForSequenceClassification,
    AutoTokenizer,
    DataCollatorWithPadding,
    PreTrainedTokenizerBase,
    Trainer,
    TrainingArguments,
)
from transformers.models.auto.modeling_auto import MODEL_FOR_SEQUENCE_CLASSIFICATION_MAPPING as CLASSIFIERS
from transformers.trainer_callback import PrinterCallback

import hfbert  # noqa: F401  (registers model_type "hfbert" with the Auto classes)
from hfbert.checkpointing import MANIFEST_NAME, verify_checkpoint
from hfbert.errors import Refusal, run_cli
from hfbert.files import atomic_path, check_folder_readable, check_folder_writable, write_json_atomic
from hfbert.finetune_data import (
    TaskData,
    hold_out,
    load_task,
    task_columns,
    tokenize,
)
from hfbert.model_card import pretrained_from_structured_start
from hfbert.plotting import save_figure
from hfbert.pretraining.finish import TRAINING_ARGS_NAME

PROG = "python -m hfbert.finetune"
RANDOM_INIT = "random_init"
# What the results are keyed by: the model under test, and what it is compared with (never a folder's name).
MODEL_ROLE = "model"
COMPARISON_ROLE = "comparison"
RESULTS_NAME = "finetune_results.json"
PLOT_NAME = "finetune_results.png"
AUTO = "auto"  # --learning_rate auto: chosen on held-out training rows
# The defaults that fit the folder's size. Small models (hidden size <= 256: tiny, mini) with a few hundred labels
# stay at chance with BERT-base's GLUE setting (5e-5, 3 epochs); their best measured so far is 1e-3 for 20
# epochs (benchmarks/results/downstream.md). Larger models keep the GLUE epochs and a grid around BERT's rates.
SMALL_HIDDEN_SIZE = 256
SMALL_MODEL_EPOCHS, LARGER_MODEL_EPOCHS = 20.0, 3.0
SMALL_MODEL_RATES, LARGER_MODEL_RATES = (1e-4, 3e-4, 1e-3, 3e-3), (2e-5, 3e-5, 5e-5, 1e-4)
HELD_OUT_SHARE = 0.2  # of the training rows, stratified by class: where --learning_rate auto compares the rates


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


# ------------------------------------------------------------------------------------------------ models


FOLDER_FIX = "pass a finished run's output folder (or one of its checkpoint-<step> folders, or any BERT folder)"
TOKENIZER_FILES = ("tokenizer.json", "vocab.txt")  # the vocabulary: tokenizer_config.json alone holds none
WEIGHT_FILES = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin")
CHECKPOINT_TOKENIZER = "tokenizer"  # where a checkpoint-<step> folder keeps its tokenizer


def _refusal_from(check: Callable[[], None], where: str | None = None) -> None:
    """Run one of hfbert.files' checks, which name the bad file or folder and the fix in a ValueError, so that
    its message is a Refusal (prefixed with `where`, the flag and folder, if given)."""
    try:
        check()
    except ValueError as error:
        raise Refusal(f"{where}: {error}" if where else str(error)) from None


def check_model_folder(folder: str, flag: str = "model_dir") -> Path:
    """Refuse, before any work, a folder that holds no model, a damaged one (unreadable JSON or safetensors,
    or files that differ from a checkpoint's sha256 manifest) or one without a tokenizer; returns the folder
    that holds its tokenizer (the folder, or a checkpoint's tokenizer/)."""
    path, where = Path(folder), f"{flag} {folder}"
    if not path.is_dir():
        problem = f"is a file; pass the folder that holds it ({path.parent}), or" if path.is_file() else "no such folder;"
        raise Refusal(f"{where}: {problem} {FOLDER_FIX}")
    if not (path / "config.json").is_file() or not any((path / name).is_file() for name in WEIGHT_FILES):
        raise Refusal(f"{where} holds no model (config.json and weights); {FOLDER_FIX}, not a tokenizer folder")
    if (path / MANIFEST_NAME).is_file():  # a checkpoint: every file as it was saved
        verify_checkpoint(path)
    tokenizer_folder = next(
        (place for place in (path, path / CHECKPOINT_TOKENIZER) if any((place / n).is_file() for n in TOKENIZER_FILES)),
        None,
    )
    if tokenizer_folder is None:
        raise Refusal(
            f"{where} holds no tokenizer ({', '.join(TOKENIZER_FILES)}, at its top or in {CHECKPOINT_TOKENIZER}/); "
            f"{FOLDER_FIX}, or save the tokenizer it was trained with into it (tokenizer.save_pretrained(folder))"
        )
    for place in {path, tokenizer_folder}:
        _refusal_from(lambda place=place: check_folder_readable(place, "copy or write the folder again"), where)
    return tokenizer_folder


@dataclass(frozen=True)
class Candidate:
    """One model the run fine-tunes: the one under test (role "model") or the comparison."""

    role: str  # MODEL_ROLE or COMPARISON_ROLE: what the results are keyed by
    folder: str  # where its config (and, unless init is RANDOM_INIT, its weights) come from
    init: str  # "pretrained" or RANDOM_INIT
    tokenizer: PreTrainedTokenizerBase
    num_train_epochs: float  # --num_train_epochs, or the default for the model's size
    learning_rates: tuple[float, ...]  # the one --learning_rate, or the rates `auto` chooses from

    @property
    def description(self) -> str:
        return f"{self.folder}, random init" if self.init == RANDOM_INIT else self.folder


def load_candidate(role: str, folder: str, init: str, flag: str, args: argparse.Namespace) -> Candidate:
    """Check `folder` and the flags against its config and tokenizer; refuses what would fail mid-training."""
    tokenizer_folder = check_model_folder(folder, flag)
    where = f"{flag} {folder}"
    try:
        config = AutoConfig.from_pretrained(folder, trust_remote_code=True)
    except (OSError, ValueError, KeyError) as error:
        raise Refusal(f"{where}: its config.json cannot be read ({str(error).splitlines()[0]}); {FOLDER_FIX}") from None
    remote_classes = getattr(config, "auto_map", None) or {}
    if "AutoModelForSequenceClassification" not in remote_classes and type(config) not in CLASSIFIERS:
        raise Refusal(
            f"{where} holds a {config.model_type!r} model, which has no sequence-classification class in "
            f"transformers; {FOLDER_FIX}"
        )
    try:
        tokenizer = AutoTokenizer.from_pretrained(tokenizer_folder, trust_remote_code=True)
    except Exception as error:  # tokenizers' Rust errors are plain Exceptions; transformers adds KeyError, OSError
        raise Refusal(
            f"{where}: its tokenizer in {tokenizer_folder} cannot be loaded ({type(error).__name__}: "
            f"{str(error).splitlines()[0] if str(error) else ''}); save the tokenizer the model was trained with "
            "into the folder again"
        ) from None
    positions = getattr(config, "max_position_embeddings", None)
    if positions is not None and args.max_seq_length > positions:
        raise Refusal(
            f"--max_seq_length {args.max_seq_length} exceeds {where}'s max_position_embeddings {positions}; "
            f"pass --max_seq_length <= {positions}"
        )
    special = tokenizer.num_special_tokens_to_add(pair=task_columns(args)[1] is not None)
    if args.max_seq_length <= special:
        raise Refusal(
            f"--max_seq_length {args.max_seq_length} leaves no room for text beside the {special} special tokens; "
            "pass a larger --max_seq_length (128 is usual)"
        )
    vocab_size = getattr(config, "vocab_size", None)
    if vocab_size is not None and len(tokenizer) > vocab_size:
        raise Refusal(
            f"{where}: its tokenizer has {len(tokenizer)} tokens but the model only {vocab_size} embeddings; "
            "save the tokenizer the model was trained with into the folder"
        )
    return Candidate(role, folder, init, tokenizer, *training_settings(config, where, args))


def size_defaults(hidden_size: int) -> tuple[float, tuple[float, ...]]:
    """(epochs, the learning rates `--learning_rate auto` tries) for a model of `hidden_size`."""
    if hidden_size <= SMALL_HIDDEN_SIZE:
        return SMALL_MODEL_EPOCHS, SMALL_MODEL_RATES
    return LARGER_MODEL_EPOCHS, LARGER_MODEL_RATES


def training_settings(config: Any, where: str, args: argparse.Namespace) -> tuple[float, tuple[float, ...]]:
    """(epochs, learning rates to try) from the flags, and where they are left to the default, from the model's
    hidden size; refuses a config without one in that case."""
    needs_size = args.num_train_epochs is None or (args.learning_rate == AUTO and args.learning_rate_grid is None)
    hidden_size = getattr(config, "hidden_size", None)
    if needs_size and not isinstance(hidden_size, int):
        raise Refusal(
            f"{where}: its config has no hidden_size, which the default epochs and learning rates follow; pass "
            "--num_train_epochs and --learning_rate (or --learning_rate_grid)"
        )
    default_epochs, default_rates = size_defaults(hidden_size) if needs_size else (None, None)
    epochs = args.num_train_epochs if args.num_train_epochs is not None else default_epochs
    if args.learning_rate != AUTO:
        return epochs, (args.learning_rate,)
    return epochs, tuple(args.learning_rate_grid or default_rates)


def check_before_work(args: argparse.Namespace) -> tuple[list[Candidate], TaskData]:
    """Every check on the folders, the output places, the flags and the data, before any training: the
    models to fine-tune (the one under test first) and the task."""
    candidates = [load_candidate(MODEL_ROLE, args.model_dir, "pretrained", "model_dir", args)]
    if args.compare == RANDOM_INIT:
        if Path(RANDOM_INIT).exists():
            raise Refusal(
                f"--compare {RANDOM_INIT} means random initialisation, but a folder of that name is here too; "
                f"pass --compare ./{RANDOM_INIT} to compare with the folder"
            )
        candidates.append(dataclasses.replace(candidates[0], role=COMPARISON_ROLE, init=RANDOM_INIT))
    elif args.compare is not None:
        if Path(args.compare).resolve() == Path(args.model_dir).resolve():
            raise Refusal(f"--compare {args.compare} is the model folder itself; pass another folder or {RANDOM_INIT}")
        candidates.append(load_candidate(COMPARISON_ROLE, args.compare, "pretrained", "--compare", args))
    if args.output_dir is not None:
        _refusal_from(lambda: check_folder_writable(args.output_dir, "--output_dir"))
    else:
        _refusal_from(lambda: check_folder_writable(args.model_dir, "model_dir (where the results go)"))
    if args.update_model_card:
        _refusal_from(lambda: check_folder_writable(args.model_dir, "--update_model_card's model_dir"))
        check_model_card(Path(args.model_dir) / "README.md")
    if args.fp16 and not torch.cuda.is_available():
        raise Refusal("--fp16 needs a CUDA GPU and none is available; leave --fp16 out on a CPU")
    task = load_task(args)
    if args.learning_rate == AUTO:  # a split too small for the classes is refused here, before any training
        hold_out(task.train, HELD_OUT_SHARE, args.data_seed, task.label_names)
    return candidates, task


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
        raise Refusal(
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
    learning_rate: float,
    num_train_epochs: float,
) -> dict[str, float]:
    """One fine-tuning run with transformers' Trainer; returns the evaluation metrics."""
    with tempfile.TemporaryDirectory(prefix="hfbert-finetune-") as scratch:
        training_args = TrainingArguments(
            output_dir=scratch,
            learning_rate=learning_rate,
            num_train_epochs=num_train_epochs,
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
        if args.quiet:  # without progress bars the Trainer prints every log row instead
            trainer.remove_callback(PrinterCallback)
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


def describe(model: dict[str, Any]) -> str:
    """A results entry as 'folder' or 'folder, random init'."""
    return f"{model['folder']}, random init" if model["init"] == RANDOM_INIT else model["folder"]


def report_table(results: dict[str, Any]) -> str:
    """Markdown table: per model (by role) and metric, mean ± std over seeds and the per-seed values, then the
    gain of the model over the comparison."""
    lines = ["| role | weights | metric | mean ± std | per seed |", "|---|---|---|---|---|"]
    for role, model in results["models"].items():
        for metric, stats in model["summary"].items():
            seeds = ", ".join(f"{value:.3f}" for value in stats["per_seed"])
            lines.append(
                f"| {role} | {describe(model)} | {metric} | {stats['mean']:.3f} ± {stats['std']:.3f} | {seeds} |"
            )
    for role, model in results["models"].items():
        selection = model.get("learning_rate_selection")
        how = f"chosen on {selection['chosen_on']}, by {selection['metric']}" if selection else "as passed"
        lines.append(
            f"\nLearning rate of the {role} ({describe(model)}): {model['learning_rate']:g}, {how}; "
            f"{model['num_train_epochs']:g} epochs"
        )
    for metric, gain in results.get("gain", {}).items():
        comparison = describe(results["models"][COMPARISON_ROLE])
        lines.append(
            f"\nGain in {metric} of the model over the comparison ({comparison}): {gain['mean']:+.3f} ± "
            f"{gain['std']:.3f} (per seed)"
        )
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
    labels = []
    for offset, (role, model) in enumerate(results["models"].items()):
        values = model["summary"]["accuracy"]["per_seed"]
        labels.append(f"{role}\n{Path(model['folder']).name}" + (", random init" if model["init"] == RANDOM_INIT else ""))
        axis.scatter([offset] * len(values), values, label=role)
        axis.hlines(statistics.fmean(values), offset - 0.2, offset + 0.2, color="black")
    axis.set_xticks(range(len(labels)), labels, fontsize=8)
    axis.set_ylabel("accuracy (evaluation split)")
    axis.set_title(f"Fine-tuned accuracy per seed (seeds {seeds})", fontsize=9)
    axis.grid(alpha=0.3)
    return save_figure(figure, path)


def check_model_card(card_path: Path) -> None:
    """Refuse, before any training, a card whose metadata `add_to_model_card` could not read afterwards."""
    import yaml
    from huggingface_hub import ModelCard

    if not card_path.is_file():
        return
    try:
        ModelCard.load(card_path)
    except (yaml.YAMLError, ValueError) as error:
        reason = " ".join(str(error).split())[:200]
        raise Refusal(
            f"--update_model_card: the metadata of {card_path} (its YAML front matter) cannot be read ({reason}); "
            "fix it, or move the card away and a new one is written"
        ) from None


def add_to_model_card(
    folder: Path, results: dict[str, Any], dataset: str, dataset_config: str | None, dataset_name: str | None = None
) -> Path:
    """Add the mean fine-tuned metrics of the model under test (never the comparison's) to its folder's model
    card as `model-index` entries (Hub metadata) for `dataset` (a Hub id, or the evaluation file's name),
    shown as `dataset_name` (default: `dataset`); keeps the card's text and its other results; written
    atomically."""
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
    for metric, stats in results["models"][MODEL_ROLE]["summary"].items():
        entries.append(
            EvalResult(
                task_type="text-classification",
                dataset_type=dataset,
                dataset_name=dataset_name or dataset,
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
    training_args.json says so), faded or not: such folders fine-tuned better with --reinit_query_key in every
    measurement. None for any other folder."""
    try:
        training_args = json.loads((Path(folder) / TRAINING_ARGS_NAME).read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(training_args, dict) or not pretrained_from_structured_start(training_args):
        return None
    return (
        f"Note: {folder} was pretrained from the structured attention start. Such folders fine-tuned better "
        "with --reinit_query_key in every measurement so far (tiny models, 150 and 1,500 labels: "
        "benchmarks/results/downstream.md in the hfbert repository)."
    )


def choose_learning_rate(candidate: Candidate, task: TaskData, args: argparse.Namespace) -> dict[str, Any]:
    """`--learning_rate auto`: fine-tune `candidate` once per rate in its grid (the first seed, its epochs) on 80%
    of the training rows and score it on the other 20% (stratified by class, drawn by --data_seed). The
    evaluation split is never looked at. Returns the chosen rate (the best score; the lower rate on a tie) with
    what it was chosen on."""
    held_in, held_out = hold_out(task.train, HELD_OUT_SHARE, args.data_seed, task.label_names)
    selection_task = dataclasses.replace(task, train=held_in, evaluation=held_out)
    train, evaluation = tokenize(selection_task, candidate.tokenizer, args.max_seq_length)
    seed, metric = args.seeds[0], task.metrics[0]
    scores = {}
    for rate in sorted(candidate.learning_rates):
        model = build_model(
            candidate.folder, candidate.init, len(task.label_names), seed, task.label_names, args.reinit_query_key
        )
        metrics = finetune_once(model, candidate.tokenizer, train, evaluation, args, seed, rate, candidate.num_train_epochs)
        scores[rate] = metrics[metric]
        print(
            f"{candidate.role} ({candidate.description}), choosing the learning rate: {rate:g} scores {metric} "
            f"{scores[rate]:.3f} on {len(held_out)} held-out training rows",
            flush=True,
        )
    chosen = max(scores, key=lambda rate: (scores[rate], -rate))
    return {
        "chosen": chosen,
        "chosen_on": f"{HELD_OUT_SHARE:.0%} of the training rows, held out (stratified by class, --data_seed "
        f"{args.data_seed}), after training on the other {len(held_in)} (seed {seed})",
        "metric": metric,
        "scores": {f"{rate:g}": score for rate, score in scores.items()},
        "held_in_rows": len(held_in),
        "held_out_rows": len(held_out),
        "seed": seed,
    }


def run_comparison(args: argparse.Namespace) -> dict[str, Any]:
    """Check everything, then fine-tune the model (and the comparison) under every seed; returns the results,
    keyed by role ("model", "comparison")."""
    candidates, task = check_before_work(args)
    hint = None if args.reinit_query_key else reinit_query_key_hint(args.model_dir)
    if hint:
        print(hint, flush=True)
    results: dict[str, Any] = {
        "model_dir": str(args.model_dir),
        "compare": args.compare,
        "seeds": list(args.seeds),
        "train_examples": len(task.train),
        "evaluation_examples": len(task.evaluation),
        "evaluation_split": task.evaluation_split,
        "labels": task.label_names,
        "settings": {key: value for key, value in vars(args).items() if key not in ("model_dir",)},
        "models": {},
    }
    for candidate in candidates:
        selection = choose_learning_rate(candidate, task, args) if args.learning_rate == AUTO else None
        learning_rate = selection["chosen"] if selection else args.learning_rate
        train, evaluation = tokenize(task, candidate.tokenizer, args.max_seq_length)
        per_seed = {}
        for seed in args.seeds:
            model = build_model(
                candidate.folder, candidate.init, len(task.label_names), seed, task.label_names, args.reinit_query_key
            )
            per_seed[seed] = finetune_once(
                model, candidate.tokenizer, train, evaluation, args, seed, learning_rate, candidate.num_train_epochs
            )
            scores = ", ".join(f"{m} {per_seed[seed][m]:.3f}" for m in task.metrics)
            print(f"{candidate.role} ({candidate.description}), seed {seed}: {scores}", flush=True)
        results["models"][candidate.role] = {
            "folder": str(candidate.folder),
            "init": candidate.init,
            "learning_rate": learning_rate,
            "num_train_epochs": candidate.num_train_epochs,
            "learning_rate_selection": selection,
            "summary": summarise(per_seed, task.metrics),
        }
    if len(candidates) > 1:
        models = results["models"]
        results["gain"] = gain(models[MODEL_ROLE]["summary"], models[COMPARISON_ROLE]["summary"])
    return results


class _HelpFormatter(argparse.RawDescriptionHelpFormatter, argparse.ArgumentDefaultsHelpFormatter):
    """The module docstring as written, and every flag's default (unless it has none, or says it)."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        if action.default is None or action.default is False or "default" in (action.help or ""):
            return action.help
        return super()._get_help_string(action)


def build_parser() -> argparse.ArgumentParser:
    """`python -m hfbert.finetune`'s flags, with their defaults and help."""
    parser = argparse.ArgumentParser(prog=PROG, description=__doc__, formatter_class=_HelpFormatter)
    parser.add_argument(
        "model_dir", help="a finished run's output folder, one of its checkpoint-<step> folders, or any BERT folder"
    )
    add_data_arguments(parser)
    add_finetuning_arguments(parser)
    add_output_arguments(parser)
    return parser


def add_data_arguments(parser: argparse.ArgumentParser) -> None:
    """Where the labelled rows come from and which of them are used."""
    data = parser.add_argument_group("data")
    data.add_argument("--dataset_name", help="a Hub dataset, e.g. nyu-mll/glue (GLUE's columns and metrics are known)")
    data.add_argument("--dataset_config_name", help="e.g. sst2, mrpc, rte, mnli, cola, qnli, qqp")
    data.add_argument("--validation_split", default="validation", help="evaluation split of a non-GLUE Hub set")
    data.add_argument("--train_file", help="local csv, jsonl/json or parquet (UTF-8, a header and labelled rows)")
    data.add_argument("--validation_file", help="local csv, jsonl/json or parquet (the held-out evaluation)")
    data.add_argument("--text_column", help="default: GLUE's, else 'text'")
    data.add_argument("--text_pair_column", help="second text of sentence-pair tasks (default: GLUE's)")
    data.add_argument(
        "--label_column", default="label", help="the class of each row: integers (1 and 1.0 alike) or names"
    )
    data.add_argument(
        "--max_train_samples", type=int, help="few-label runs: this many, evenly across classes (default: every row)"
    )
    data.add_argument(
        "--max_eval_samples", type=int, help="evaluate on this many rows, drawn by --data_seed (default: every row)"
    )
    data.add_argument("--data_seed", type=int, default=0, help="which examples --max_train_samples keeps")


def add_finetuning_arguments(parser: argparse.ArgumentParser) -> None:
    """The Trainer's settings, the seeds and the surgery before fine-tuning."""
    training = parser.add_argument_group("fine-tuning (transformers' Trainer)")
    training.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3], help="one fine-tuning run per seed")
    training.add_argument(
        "--learning_rate",
        type=learning_rate_flag,
        default=AUTO,
        help=f"AdamW's peak rate, or '{AUTO}' (the default): each model (the comparison too) trains once per rate "
        f"of --learning_rate_grid on {1 - HELD_OUT_SHARE:.0%}% of the training rows, with the first seed, and the "
        f"rate that scores best on the other {HELD_OUT_SHARE:.0%}% (stratified by class; never the evaluation "
        "split) trains it on every training row for every seed. A number, e.g. 5e-5, skips the choice",
    )
    training.add_argument(
        "--learning_rate_grid",
        type=float,
        nargs="+",
        help=f"the rates --learning_rate {AUTO} tries (default: "
        f"{rates_text(SMALL_MODEL_RATES)} for a model of hidden size <= {SMALL_HIDDEN_SIZE} (tiny, mini), "
        f"{rates_text(LARGER_MODEL_RATES)} for larger ones)",
    )
    training.add_argument(
        "--num_train_epochs",
        type=float,
        help=f"passes over the training rows (default: {SMALL_MODEL_EPOCHS:g} for a model of hidden size <= "
        f"{SMALL_HIDDEN_SIZE} (tiny, mini), {LARGER_MODEL_EPOCHS:g} for larger ones, BERT's GLUE setting)",
    )
    training.add_argument("--per_device_train_batch_size", type=int, default=16, help="rows per update")
    training.add_argument("--warmup_ratio", type=float, default=0.1, help="share of the updates spent warming up")
    training.add_argument("--weight_decay", type=float, default=0.01, help="AdamW's weight decay")
    training.add_argument(
        "--max_seq_length", type=int, default=128, help="longer texts are cut (at most the model's positions)"
    )
    training.add_argument("--fp16", action="store_true", help="fp16 mixed precision (CUDA)")
    training.add_argument(
        "--reinit_query_key",
        action="store_true",
        help="draw the pretrained folders' attention queries and keys afresh before fine-tuning (the embeddings, "
        "values and feed-forward layers stay pretrained): small hfbert folders pretrained from the structured "
        "attention start, faded or not, fine-tune better so with few labels",
    )


def add_output_arguments(parser: argparse.ArgumentParser) -> None:
    """What the model is compared with and where the results go."""
    output = parser.add_argument_group("comparison and output")
    output.add_argument("--compare", help=f"'{RANDOM_INIT}' (the same config, freshly initialised) or another folder")
    output.add_argument("--output_dir", help=f"where {RESULTS_NAME} and {PLOT_NAME} go (default: the model folder)")
    output.add_argument(
        "--update_model_card", action="store_true", help="add the model's results (only) to its folder's README.md"
    )
    output.add_argument(
        "--quiet", action="store_true", help="no progress bars or library warnings: the scores and the table only"
    )


def rates_text(rates: Sequence[float]) -> str:
    """'1e-4 3e-4 1e-3' for (1e-4, 3e-4, 1e-3)."""
    return " ".join(f"{rate:.0e}".replace("e-0", "e-") for rate in rates)


def learning_rate_flag(value: str) -> float | str:
    """--learning_rate's value: AUTO or a number."""
    if value == AUTO:
        return AUTO
    try:
        return float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{value!r} is neither '{AUTO}' nor a number such as 5e-5") from None


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """The flags, after the checks that need nothing but the flags (argparse's usage errors, exit 2)."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if (args.dataset_name is None) == (args.train_file is None):
        parser.error("pass either --dataset_name or --train_file (with --validation_file)")
    if args.train_file is not None and args.validation_file is None:
        parser.error("--train_file needs --validation_file: results are measured on held-out examples")
    if args.dataset_name is not None and args.validation_file is not None:
        parser.error("--validation_file goes with --train_file; a --dataset_name set's evaluation split is its own")
    hub_only = [
        f"--{name}" for name in ("dataset_config_name", "validation_split")
        if getattr(args, name) != parser.get_default(name)
    ]  # fmt: skip
    if args.train_file is not None and hub_only:
        parser.error(f"{', '.join(hub_only)} go with --dataset_name, not with local files; leave them out")
    for name in ("learning_rate", "num_train_epochs", "per_device_train_batch_size", "max_seq_length"):
        value = getattr(args, name)
        if value not in (None, AUTO) and not value > 0:
            parser.error(f"--{name} {value} must be > 0")
    if args.learning_rate_grid is not None:
        if args.learning_rate != AUTO:
            parser.error(f"--learning_rate_grid goes with --learning_rate {AUTO}; leave one of them out")
        if not all(rate > 0 for rate in args.learning_rate_grid) or len(set(args.learning_rate_grid)) != len(
            args.learning_rate_grid
        ):
            parser.error(f"--learning_rate_grid {args.learning_rate_grid}: distinct rates > 0")
    if not 0 <= args.warmup_ratio < 1:
        parser.error(f"--warmup_ratio {args.warmup_ratio} must be in [0, 1)")
    if args.max_train_samples is not None and args.max_train_samples < 2:
        parser.error(f"--max_train_samples {args.max_train_samples} must be >= 2")
    if args.max_eval_samples is not None and args.max_eval_samples < 1:
        parser.error(f"--max_eval_samples {args.max_eval_samples} must be >= 1")
    if len(set(args.seeds)) != len(args.seeds):
        parser.error(f"--seeds {args.seeds} repeats a seed")
    return args


@contextmanager
def quiet_libraries(quiet: bool) -> Iterator[None]:
    """With `quiet`, no progress bars and no warnings (such as a LOAD REPORT per seed) from transformers and
    datasets while the block runs; their settings are restored after it."""
    if not quiet:
        yield
        return
    verbosity, bars = transformers.logging.get_verbosity(), transformers.logging.is_progress_bar_enabled()
    dataset_bars = datasets.is_progress_bar_enabled()
    transformers.logging.set_verbosity_error()
    transformers.logging.disable_progress_bar()
    datasets.disable_progress_bar()
    try:
        yield
    finally:
        transformers.logging.set_verbosity(verbosity)
        if bars:
            transformers.logging.enable_progress_bar()
        if dataset_bars:
            datasets.enable_progress_bar()


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    """`python -m hfbert.finetune`: check, fine-tune, write the results (and the model card); returns them."""
    args = parse_args(argv)
    with quiet_libraries(args.quiet):
        results = run_comparison(args)
        output_dir = Path(args.output_dir or args.model_dir)
        output_dir.mkdir(parents=True, exist_ok=True)
        write_json_atomic(output_dir / RESULTS_NAME, results)
        plot_results(results, output_dir / PLOT_NAME)
        if args.update_model_card:
            if args.dataset_name is not None:
                add_to_model_card(Path(args.model_dir), results, args.dataset_name, args.dataset_config_name)
            else:  # local files: named after what was evaluated on and what was trained on
                train, validation = Path(args.train_file).name, Path(args.validation_file).name
                add_to_model_card(
                    Path(args.model_dir), results, validation, None, f"{validation} (fine-tuned on {train})"
                )
    print("\n" + report_table(results))
    print(f"\nResults: {output_dir / RESULTS_NAME}, {output_dir / PLOT_NAME}")
    return results


class Stopped(BaseException):
    """SIGTERM or SIGINT arrived: raised where the run is, so that every `with` block (the Trainer's scratch
    folder) cleans up on the way out. A BaseException, as KeyboardInterrupt: no `except Exception` swallows it."""

    def __init__(self, signal_number: int) -> None:
        super().__init__(signal.Signals(signal_number).name)
        self.signal_number = signal_number


@contextmanager
def stop_on_signals(signals: Sequence[int] = (signal.SIGTERM, signal.SIGINT)) -> Iterator[None]:
    """Turn `signals` into `Stopped` while the block runs (main thread only); the handlers are restored after."""

    def stop(signal_number: int, frame: Any) -> None:
        raise Stopped(signal_number)

    previous = {number: signal.signal(number, stop) for number in signals}
    try:
        yield
    finally:
        for number, handler in previous.items():
            signal.signal(number, handler)


def command_line() -> None:
    """The process entry point: a refusal is one line and exit 2 (run_cli); a stop by SIGTERM or Ctrl-C is one
    line and exit 128 + the signal, with the scratch folders removed and no results written."""
    try:
        with stop_on_signals():
            run_cli(main, prog=PROG)
    except Stopped as stopped:
        print(
            f"{PROG}: stopped by {stopped}; nothing of this run was kept ({RESULTS_NAME} and the model card are "
            "written only once every fine-tuning run has finished); run the command again",
            file=sys.stderr,
            flush=True,
        )
        raise SystemExit(128 + stopped.signal_number) from None


if __name__ == "__main__":
    command_line()
