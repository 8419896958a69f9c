"""`python -m hfbert.finetune`'s flags, parsed into four typed groups (the models, the data, the fine-tuning,
the output), each a frozen dataclass that the step needing it takes. The checks that need nothing but the
flags are argparse usage errors (exit 2) here; checks that read folders or files come later, before any
training (hfbert.finetune.run.check_before_work)."""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from dataclasses import asdict, dataclass, fields
from typing import Any

PROG = "python -m hfbert.finetune"
RANDOM_INIT = "random_init"
AUTO = "auto"  # --learning_rate auto: chosen on folds of the training rows
# The defaults that fit the folder's size. Small models (hidden size <= 256: tiny, mini) with a few hundred labels
# stay at chance with BERT-base's GLUE setting (5e-5, 3 epochs); they fine-tune best at 3e-4 to 1e-3 for 20
# epochs, and 3e-3 collapsed more fits and made the chosen rate worse (benchmarks/results/finetune_defaults.md).
# Larger models keep the GLUE epochs and a grid around BERT's rates.
SMALL_HIDDEN_SIZE = 256
SMALL_MODEL_EPOCHS, LARGER_MODEL_EPOCHS = 20.0, 3.0
SMALL_MODEL_RATES, LARGER_MODEL_RATES = (1e-4, 3e-4, 1e-3), (2e-5, 3e-5, 5e-5, 1e-4)
RATE_FOLDS = 3  # --learning_rate_folds' default: every training row is held out once


@dataclass(frozen=True)
class ModelSettings:
    """The folder under test, what it is compared with, and whether a folder's own code may run."""

    model_dir: str
    compare: str | None = None
    trust_remote_code: bool = False


@dataclass(frozen=True)
class DataSettings:
    """Where the labelled rows come from and which of them are used."""

    dataset_name: str | None = None
    dataset_config_name: str | None = None
    validation_split: str = "validation"
    train_file: str | None = None
    validation_file: str | None = None
    text_column: str | None = None
    text_pair_column: str | None = None
    label_column: str = "label"
    max_train_samples: int | None = None
    max_eval_samples: int | None = None
    data_seed: int = 0


@dataclass(frozen=True)
class TrainingSettings:
    """The Trainer's settings, the seeds, the rate choice and the surgery before fine-tuning."""

    seeds: tuple[int, ...] = (1, 2, 3)
    learning_rate: float | str = AUTO
    learning_rate_grid: tuple[float, ...] | None = None
    learning_rate_folds: int = RATE_FOLDS
    num_train_epochs: float | None = None
    per_device_train_batch_size: int = 16
    warmup_ratio: float = 0.1
    weight_decay: float = 0.01
    max_seq_length: int = 128
    fp16: bool = False
    reinit_query_key: bool = False

    @property
    def chooses_rate(self) -> bool:
        return self.learning_rate == AUTO


@dataclass(frozen=True)
class OutputSettings:
    """Where the results go and what is printed."""

    output_dir: str | None = None
    update_model_card: bool = False
    quiet: bool = False


@dataclass(frozen=True)
class FinetuneSettings:
    models: ModelSettings
    data: DataSettings
    training: TrainingSettings
    output: OutputSettings

    def as_flags(self) -> dict[str, Any]:
        """Every flag by name (model_dir left out): what finetune_results.json records as its settings."""
        flags: dict[str, Any] = {}
        for group in (self.models, self.data, self.training, self.output):
            flags.update(asdict(group))
        flags.pop("model_dir")
        return {key: list(value) if isinstance(value, tuple) else value for key, value in flags.items()}


class _HelpFormatter(argparse.RawDescriptionHelpFormatter, argparse.ArgumentDefaultsHelpFormatter):
    """The module docstring as written, and every flag's default (unless it has none, or says it)."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        if action.default is None or action.default is False or "default" in (action.help or ""):
            return action.help
        return super()._get_help_string(action)


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


def build_parser(description: str | None = None) -> argparse.ArgumentParser:
    """`python -m hfbert.finetune`'s flags, with their defaults and help."""
    parser = argparse.ArgumentParser(prog=PROG, description=description, formatter_class=_HelpFormatter)
    add_model_arguments(parser)
    add_data_arguments(parser)
    add_training_arguments(parser)
    add_output_arguments(parser)
    return parser


def add_model_arguments(parser: argparse.ArgumentParser) -> None:
    models = parser.add_argument_group("models")
    models.add_argument(
        "model_dir",
        help="a finished run's output folder, one of its checkpoint-<step> folders, or any BERT folder",
    )
    models.add_argument(
        "--compare", help=f"'{RANDOM_INIT}' (the same config, freshly initialised) or another folder"
    )
    models.add_argument(
        "--trust_remote_code",
        action="store_true",
        help="let a folder whose model or tokenizer transformers does not know run the Python it ships "
        "(transformers' flag of the same name). hfbert folders never need it: the installed hfbert loads them",
    )


def add_data_arguments(parser: argparse.ArgumentParser) -> None:
    data = parser.add_argument_group("data")
    data.add_argument(
        "--dataset_name", help="a Hub dataset, e.g. nyu-mll/glue (GLUE's columns and metrics are known)"
    )
    data.add_argument("--dataset_config_name", help="e.g. sst2, mrpc, rte, mnli, cola, qnli, qqp")
    data.add_argument(
        "--validation_split", default="validation", help="evaluation split of a non-GLUE Hub set"
    )
    data.add_argument(
        "--train_file", help="local csv, jsonl/json or parquet (UTF-8, a header and labelled rows)"
    )
    data.add_argument("--validation_file", help="local csv, jsonl/json or parquet (the held-out evaluation)")
    data.add_argument("--text_column", help="default: GLUE's, else 'text'")
    data.add_argument("--text_pair_column", help="second text of sentence-pair tasks (default: GLUE's)")
    data.add_argument(
        "--label_column", default="label", help="the class of each row: integers (1 and 1.0 alike) or names"
    )
    data.add_argument(
        "--max_train_samples",
        type=int,
        help="few-label runs: this many, evenly across classes (default: every row)",
    )
    data.add_argument(
        "--max_eval_samples",
        type=int,
        help="evaluate on this many rows, drawn by --data_seed (default: every row)",
    )
    data.add_argument("--data_seed", type=int, default=0, help="which examples --max_train_samples keeps")


def add_training_arguments(parser: argparse.ArgumentParser) -> None:
    training = parser.add_argument_group("fine-tuning (transformers' Trainer)")
    training.add_argument(
        "--seeds", type=int, nargs="+", default=[1, 2, 3],
        help="one fine-tuning run per seed; the gain is paired per seed (same seed and data order for both models)",
    )  # fmt: skip
    training.add_argument(
        "--learning_rate",
        type=learning_rate_flag,
        default=AUTO,
        help=f"AdamW's peak rate, or '{AUTO}' (the default): each model (the comparison too) trains once per rate "
        "of --learning_rate_grid and fold of the training rows (--learning_rate_folds; fold i with seed i of "
        "--seeds, in turn) and is scored on the fold's held-out rows; a rate at which any fit collapsed is "
        "dropped, and the one with the best mean minus spread over the folds (the lower rate on a tie) trains "
        "the model on every training row for every seed. The evaluation split is never looked at. A number, "
        "e.g. 5e-5, skips the choice",
    )
    training.add_argument(
        "--learning_rate_grid",
        type=float,
        nargs="+",
        help=f"the rates --learning_rate {AUTO} tries (default: {rates_text(SMALL_MODEL_RATES)} for a model of "
        f"hidden size <= {SMALL_HIDDEN_SIZE} (tiny, mini), {rates_text(LARGER_MODEL_RATES)} for larger ones)",
    )
    training.add_argument(
        "--learning_rate_folds",
        type=int,
        default=RATE_FOLDS,
        help="--learning_rate auto's stratified folds of the training rows (each held out once)",
    )
    training.add_argument(
        "--num_train_epochs",
        type=float,
        help=f"passes over the training rows (default: {SMALL_MODEL_EPOCHS:g} for a model of hidden size <= "
        f"{SMALL_HIDDEN_SIZE} (tiny, mini), {LARGER_MODEL_EPOCHS:g} for larger ones, BERT's GLUE setting)",
    )
    training.add_argument("--per_device_train_batch_size", type=int, default=16, help="rows per update")
    training.add_argument(
        "--warmup_ratio", type=float, default=0.1, help="share of the updates spent warming up"
    )
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
    output = parser.add_argument_group("output")
    output.add_argument(
        "--output_dir",
        help="where finetune_results.json and finetune_results.png go (default: the model folder)",
    )
    output.add_argument(
        "--update_model_card",
        action="store_true",
        help="add the model's results (only) to its folder's README.md",
    )
    output.add_argument(
        "--quiet",
        action="store_true",
        help="no progress bar or library warnings: one line per fit and the table",
    )


def check_flags(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """The checks that need nothing but the flags: argparse usage errors (exit 2)."""
    if (args.dataset_name is None) == (args.train_file is None):
        parser.error("pass either --dataset_name or --train_file (with --validation_file)")
    if args.train_file is not None and args.validation_file is None:
        parser.error("--train_file needs --validation_file: results are measured on held-out examples")
    if args.dataset_name is not None and args.validation_file is not None:
        parser.error(
            "--validation_file goes with --train_file; a --dataset_name set's evaluation split is its own"
        )
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
    if args.learning_rate_folds < 2:
        parser.error(
            f"--learning_rate_folds {args.learning_rate_folds} must be >= 2 (a spread needs two folds)"
        )
    if not 0 <= args.warmup_ratio < 1:
        parser.error(f"--warmup_ratio {args.warmup_ratio} must be in [0, 1)")
    if args.max_train_samples is not None and args.max_train_samples < 2:
        parser.error(f"--max_train_samples {args.max_train_samples} must be >= 2")
    if args.max_eval_samples is not None and args.max_eval_samples < 1:
        parser.error(f"--max_eval_samples {args.max_eval_samples} must be >= 1")
    if len(set(args.seeds)) != len(args.seeds):
        parser.error(f"--seeds {args.seeds} repeats a seed")


def parse_args(argv: Sequence[str] | None = None, description: str | None = None) -> FinetuneSettings:
    """The flags as typed groups, after the checks that need nothing but the flags (exit 2)."""
    parser = build_parser(description)
    args = parser.parse_args(argv)
    check_flags(parser, args)
    values = {key: tuple(value) if isinstance(value, list) else value for key, value in vars(args).items()}

    def group(cls: type) -> Any:
        return cls(**{field.name: values[field.name] for field in fields(cls)})

    return FinetuneSettings(
        group(ModelSettings), group(DataSettings), group(TrainingSettings), group(OutputSettings)
    )
