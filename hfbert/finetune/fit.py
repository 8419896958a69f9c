"""One fine-tuning fit with transformers' Trainer: its scores on the rows it is evaluated on, its training loss
per epoch, and whether it collapsed.

A fit collapsed (Mosbach et al. 2021's failed run) when its accuracy on the evaluation rows is no better than
always answering the most frequent class there, or when its training loss never fell below where it started
(the last epoch's mean at or above the first's): the optimisation failed, whatever the pretraining was worth.
A fit underfitted when its last epoch's training loss is still above UNDERFIT_LOSS_SHARE of its first epoch's:
its rate was too small for its updates (the rate choice drops such rates; benchmarks/results/finetune_defaults.md).
"""

from __future__ import annotations

import signal
import tempfile
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import datasets
import numpy as np
import torch
from transformers import DataCollatorWithPadding, PreTrainedTokenizerBase, Trainer, TrainingArguments
from transformers.trainer_callback import PrinterCallback, TrainerCallback

from hfbert.finetune.settings import UNDERFIT_LOSS_SHARE, FinetuneTrainingArguments


def classification_metrics(predictions: np.ndarray, labels: np.ndarray) -> dict[str, float]:
    """Accuracy, F1 of class 1 (binary tasks) and Matthews correlation (multiclass: Gorodkin's R_K, as
    scikit-learn computes it), computed locally (no downloads)."""
    metrics = {"accuracy": float((predictions == labels).mean())}
    classes = np.union1d(labels, predictions)
    if len(classes) <= 2:
        tp = float(((predictions == 1) & (labels == 1)).sum())
        predicted_and_true = float((predictions == 1).sum() + (labels == 1).sum())  # 2 tp + fp + fn
        metrics["f1"] = 2 * tp / predicted_and_true if tp else 0.0
    confusion = np.zeros((len(classes), len(classes)))
    np.add.at(confusion, (np.searchsorted(classes, labels), np.searchsorted(classes, predictions)), 1)
    true_sum, predicted_sum = confusion.sum(axis=1), confusion.sum(axis=0)
    samples, correct = confusion.sum(), np.trace(confusion)
    numerator = correct * samples - predicted_sum @ true_sum
    denominator = np.sqrt((samples**2 - predicted_sum @ predicted_sum) * (samples**2 - true_sum @ true_sum))
    metrics["matthews_correlation"] = float(numerator / denominator) if denominator else 0.0
    return metrics


@dataclass(frozen=True)
class FitResult:
    """What one fit scored on its evaluation rows, and how its training went."""

    metrics: dict[str, float]
    epoch_losses: tuple[float, ...]  # the mean training loss of each epoch
    predicted_counts: tuple[int, ...]  # how many evaluation rows it put in each class
    majority_rate: float  # the share of the evaluation rows in their most frequent class

    @property
    def collapse(self) -> str | None:
        """Why the fit counts as collapsed, or None."""
        accuracy = self.metrics["accuracy"]
        if accuracy <= self.majority_rate:
            return f"accuracy {accuracy:.3f}, no better than the majority-class rate {self.majority_rate:.3f}"
        if len(self.epoch_losses) > 1 and self.epoch_losses[-1] >= self.epoch_losses[0]:
            return (
                f"training loss never fell below its start ({self.epoch_losses[0]:.3f} in the first epoch, "
                f"{self.epoch_losses[-1]:.3f} in the last)"
            )
        return None

    @property
    def underfit(self) -> str | None:
        """Why the fit counts as not having learned its training rows, or None (one epoch: not judged)."""
        if len(self.epoch_losses) < 2 or self.epoch_losses[-1] <= UNDERFIT_LOSS_SHARE * self.epoch_losses[0]:
            return None
        first, last = self.epoch_losses[0], self.epoch_losses[-1]
        return (
            f"training loss still {last / first:.0%} of its first epoch's ({first:.3f} -> {last:.3f}): the rate is too "
            "small for the updates"
        )

    def as_json(self) -> dict:
        return {
            **self.metrics,
            "epoch_losses": list(self.epoch_losses),
            "predicted_counts": list(self.predicted_counts),
            "majority_rate": self.majority_rate,
            "collapsed": self.collapse,
            "underfit": self.underfit,
        }


class Stopped(BaseException):
    """SIGTERM or SIGINT arrived: raised where the run is, so that every `with` block (the Trainer's scratch
    folder) cleans up on the way out. A BaseException, as KeyboardInterrupt: no `except Exception` swallows it."""

    def __init__(self, signal_number: int) -> None:
        super().__init__(signal.Signals(signal_number).name)
        self.signal_number = signal_number


# The signals received inside stop_on_signals: a handler has no other place to write, and a Stopped raised
# while a finalizer (__del__) runs is ignored by Python, so StopAtNextUpdate raises it again.
_received: list[int] = []


def _raise_stopped(signal_number: int, frame: Any) -> None:
    _received.append(signal_number)
    raise Stopped(signal_number)


@contextmanager
def stop_on_signals(signals: Sequence[int] = (signal.SIGTERM, signal.SIGINT)) -> Iterator[None]:
    """Turn `signals` into `Stopped` while the block runs (main thread only); the handlers are restored after."""
    _received.clear()
    previous = {number: signal.signal(number, _raise_stopped) for number in signals}
    try:
        yield
    finally:
        for number, handler in previous.items():
            signal.signal(number, handler)
        _received.clear()


class StopAtNextUpdate(TrainerCallback):
    """Raises, after each update, a stop whose first `Stopped` was lost in a finalizer."""

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if _received:
            raise Stopped(_received[0])


def finetune_once(
    model: torch.nn.Module,
    tokenizer: PreTrainedTokenizerBase,
    train: datasets.Dataset,
    evaluation: datasets.Dataset,
    training: FinetuneTrainingArguments,
    seed: int,
    learning_rate: float,
    num_train_epochs: float,
) -> FitResult:
    """One fine-tuning run with transformers' Trainer (its own progress output off: the caller shows one bar
    for every fit); returns what it scored on `evaluation` and its training loss per epoch."""
    with tempfile.TemporaryDirectory(prefix="hfbert-finetune-") as scratch:
        training_args = TrainingArguments(
            output_dir=scratch,
            learning_rate=learning_rate,
            num_train_epochs=num_train_epochs,
            per_device_train_batch_size=training.per_device_train_batch_size,
            per_device_eval_batch_size=64,
            warmup_steps=training.warmup_ratio,  # a float in [0, 1): a share of the updates
            weight_decay=training.weight_decay,
            seed=seed,
            save_strategy="no",
            logging_strategy="epoch",  # the loss per epoch, kept in trainer.state.log_history
            use_cpu=not torch.cuda.is_available(),
            fp16=training.fp16,
            disable_tqdm=True,
        )
        trainer = Trainer(
            model=model,
            args=training_args,
            train_dataset=train,
            data_collator=DataCollatorWithPadding(tokenizer),
            callbacks=[StopAtNextUpdate()],
        )
        trainer.remove_callback(PrinterCallback)  # without its bar the Trainer prints every log row instead
        trainer.train()
        prediction = trainer.predict(evaluation)
        epoch_losses = tuple(row["loss"] for row in trainer.state.log_history if "loss" in row)
    predicted = np.asarray(prediction.predictions).argmax(-1)
    labels = np.asarray(prediction.label_ids)
    classes = model.config.num_labels
    return FitResult(
        metrics=classification_metrics(predicted, labels),
        epoch_losses=epoch_losses,
        predicted_counts=tuple(int(count) for count in np.bincount(predicted, minlength=classes)),
        majority_rate=float(np.bincount(labels, minlength=classes).max() / len(labels)),
    )
