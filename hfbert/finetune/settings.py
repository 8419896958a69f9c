"""`python -m hfbert.finetune`'s flags, parsed by `hfbert.flags.RefusingHfArgumentParser` into four typed groups
(the models, the data, the fine-tuning, the output), each a frozen dataclass that the step needing it takes.
Each group refuses what needs nothing but its flags when it is built (exit 2); checks that read folders or files
come later, before any training (hfbert.finetune.run.check_before_work)."""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from dataclasses import asdict, dataclass, fields
from typing import Any

from transformers.hf_argparser import HfArg

from hfbert.errors import Refusal
from hfbert.flags import RefusingHfArgumentParser

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
# A fit whose training loss ended above this share of its first epoch's did not learn its training rows. At 60
# labels a rate that small chose 3e-4 over 1e-3 for a random-init twin on three noisy folds and lost 18 points.
UNDERFIT_LOSS_SHARE = 0.7


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


@dataclass(frozen=True)
class FinetuneModelArguments:
    """The folder under test, what it is compared with, and whether a folder's own code may run."""

    _argument_group_name = "models"

    model_dir: str = HfArg(
        help="a finished run's output folder, one of its checkpoint-<step> folders, or any BERT folder",
        metadata={"positional": True},
    )
    compare: str | None = HfArg(
        default=None,
        help=f"'{RANDOM_INIT}' (the same config, freshly initialised) or another folder",
    )
    trust_remote_code: bool = HfArg(
        default=False,
        help="let a folder whose model or tokenizer transformers does not know run the Python it ships "
        "(transformers' flag of the same name). hfbert folders never need it: the installed hfbert loads them",
    )


@dataclass(frozen=True)
class FinetuneDataArguments:
    """Where the labelled rows come from and which of them are used."""

    _argument_group_name = "data"

    dataset_name: str | None = HfArg(
        default=None,
        help="a Hub dataset, e.g. nyu-mll/glue (GLUE's columns and metrics are known)",
    )
    dataset_config_name: str | None = HfArg(default=None, help="e.g. sst2, mrpc, rte, mnli, cola, qnli, qqp")
    validation_split: str = HfArg(default="validation", help="evaluation split of a non-GLUE Hub set")
    train_file: str | None = HfArg(
        default=None,
        help="local csv, jsonl/json or parquet (UTF-8, a header and labelled rows)",
    )
    validation_file: str | None = HfArg(
        default=None,
        help="local csv, jsonl/json or parquet (the held-out evaluation)",
    )
    text_column: str | None = HfArg(default=None, help="default: GLUE's, else 'text'")
    text_pair_column: str | None = HfArg(
        default=None,
        help="second text of sentence-pair tasks (default: GLUE's)",
    )
    label_column: str = HfArg(
        default="label",
        help="the class of each row: integers (1 and 1.0 alike) or names",
    )
    max_train_samples: int | None = HfArg(
        default=None,
        help="few-label runs: this many, evenly across classes (default: every row)",
    )
    max_eval_samples: int | None = HfArg(
        default=None,
        help="evaluate on this many rows, drawn by --data_seed (default: every row)",
    )
    data_seed: int = HfArg(default=0, help="which examples --max_train_samples keeps")

    def __post_init__(self) -> None:
        if (self.dataset_name is None) == (self.train_file is None):
            raise Refusal("pass either --dataset_name or --train_file (with --validation_file)")
        if self.train_file is not None and self.validation_file is None:
            raise Refusal("--train_file needs --validation_file: results are measured on held-out examples")
        if self.dataset_name is not None and self.validation_file is not None:
            raise Refusal(
                "--validation_file goes with --train_file; a --dataset_name set's evaluation split is its own"
            )
        hub_only = [
            f"--{flag.name}" for flag in fields(self)
            if flag.name in ("dataset_config_name", "validation_split") and getattr(self, flag.name) != flag.default
        ]  # fmt: skip
        if self.train_file is not None and hub_only:
            raise Refusal(f"{', '.join(hub_only)} go with --dataset_name, not with local files; leave them out")
        if self.max_train_samples is not None and self.max_train_samples < 2:
            raise Refusal(f"--max_train_samples {self.max_train_samples} must be >= 2")
        if self.max_eval_samples is not None and self.max_eval_samples < 1:
            raise Refusal(f"--max_eval_samples {self.max_eval_samples} must be >= 1")


@dataclass(frozen=True)
class FinetuneTrainingArguments:
    """The Trainer's settings, the seeds, the rate choice and the surgery before fine-tuning."""

    _argument_group_name = "fine-tuning (transformers' Trainer)"

    seeds: list[int] = HfArg(
        default_factory=lambda: [1, 2, 3],
        help="one fine-tuning run per seed; the gain is paired per seed (same seed and data order for both "
        "models)",
    )
    learning_rate: float | str = HfArg(
        default=AUTO,
        help=f"AdamW's peak rate, or '{AUTO}' (the default): each model (the comparison too) trains once per rate "
        "of --learning_rate_grid and fold of the training rows (--learning_rate_folds; fold i with seed i of "
        "--seeds, in turn) and is scored on the fold's held-out rows; a rate at which any fit collapsed or "
        f"underfitted (its last epoch's training loss above {UNDERFIT_LOSS_SHARE:.0%}% of its first epoch's) is "
        "dropped, and the one with the best mean minus spread over the folds (the lower rate on a tie) "
        "trains the model on every training row for every seed. The evaluation split is never looked at. A "
        "number, e.g. 5e-5, skips the choice",
        metadata={"type": learning_rate_flag},
    )
    learning_rate_grid: list[float] | None = HfArg(
        default=None,
        help=f"the rates --learning_rate {AUTO} tries (default: {rates_text(SMALL_MODEL_RATES)} for a model of "
        f"hidden size <= {SMALL_HIDDEN_SIZE} (tiny, mini), {rates_text(LARGER_MODEL_RATES)} for larger ones)",
    )
    learning_rate_folds: int = HfArg(
        default=RATE_FOLDS,
        help="--learning_rate auto's stratified folds of the training rows (each held out once)",
    )
    num_train_epochs: float | None = HfArg(
        default=None,
        help=f"passes over the training rows (default: {SMALL_MODEL_EPOCHS:g} for a model of hidden size <= "
        f"{SMALL_HIDDEN_SIZE} (tiny, mini), {LARGER_MODEL_EPOCHS:g} for larger ones, BERT's GLUE setting)",
    )
    per_device_train_batch_size: int = HfArg(default=16, help="rows per update")
    warmup_ratio: float = HfArg(default=0.1, help="share of the updates spent warming up")
    weight_decay: float = HfArg(default=0.01, help="AdamW's weight decay")
    max_seq_length: int = HfArg(default=128, help="longer texts are cut (at most the model's positions)")
    fp16: bool = HfArg(default=False, help="fp16 mixed precision (CUDA)")
    reinit_query_key: bool = HfArg(
        default=False,
        help="draw the pretrained folders' attention queries and keys afresh before fine-tuning (the embeddings, "
        "values and feed-forward layers stay pretrained): small hfbert folders pretrained on WikiText from "
        "the structured attention start, faded or not, fine-tuned better so with few labels; two pretrained on "
        "their set's own text, no differently",
    )

    def __post_init__(self) -> None:
        for name in ("learning_rate", "num_train_epochs", "per_device_train_batch_size", "max_seq_length"):
            value = getattr(self, name)
            if value not in (None, AUTO) and not value > 0:
                raise Refusal(f"--{name} {value} must be > 0")
        grid = self.learning_rate_grid
        if grid is not None:
            if not self.chooses_rate:
                raise Refusal(f"--learning_rate_grid goes with --learning_rate {AUTO}; leave one of them out")
            if not all(rate > 0 for rate in grid) or len(set(grid)) != len(grid):
                raise Refusal(f"--learning_rate_grid {grid}: distinct rates > 0")
        if self.learning_rate_folds < 2:
            raise Refusal(
                f"--learning_rate_folds {self.learning_rate_folds} must be >= 2 (a spread needs two folds)"
            )
        if not 0 <= self.warmup_ratio < 1:
            raise Refusal(f"--warmup_ratio {self.warmup_ratio} must be in [0, 1)")
        if len(set(self.seeds)) != len(self.seeds):
            raise Refusal(f"--seeds {self.seeds} repeats a seed")

    @property
    def chooses_rate(self) -> bool:
        return self.learning_rate == AUTO


@dataclass(frozen=True)
class FinetuneOutputArguments:
    """Where the results go and what is printed."""

    _argument_group_name = "output"

    output_dir: str | None = HfArg(
        default=None,
        help="where finetune_results.json and finetune_results.png go (default: the model folder)",
    )
    update_model_card: bool = HfArg(
        default=False,
        help="add the model's results (only) to its folder's README.md",
    )
    quiet: bool = HfArg(
        default=False,
        help="no progress bar or library warnings: one line per fit and the table",
    )


@dataclass(frozen=True)
class FinetuneSettings:
    models: FinetuneModelArguments
    data: FinetuneDataArguments
    training: FinetuneTrainingArguments
    output: FinetuneOutputArguments

    def as_flags(self) -> dict[str, Any]:
        """Every flag by name (model_dir left out): what finetune_results.json records as its settings."""
        groups = (self.models, self.data, self.training, self.output)
        return {name: value for group in groups for name, value in asdict(group).items() if name != "model_dir"}


def parse_args(argv: Sequence[str] | None = None, description: str | None = None) -> FinetuneSettings:
    """The flags as typed groups, after the checks that need nothing but the flags (a `Refusal`, exit 2)."""
    parser = RefusingHfArgumentParser(
        (FinetuneModelArguments, FinetuneDataArguments, FinetuneTrainingArguments, FinetuneOutputArguments),
        prog=PROG,
        description=description,
    )
    return FinetuneSettings(*parser.parse_flags(None if argv is None else list(argv)))
