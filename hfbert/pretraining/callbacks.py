"""What the loop does besides the step, plugged in as callbacks (the shape of Composer's events): the loop
calls every registered callback at each event, in order, and knows nothing of what they do. The structured
fade, the [CLS] penalty, the progress bar and the trackers are callbacks (`attention_shaping`, `loop`).

Events, and what a callback may do there:

    on_fit_start(progress, share)   after any resume, before the first update; `share` of the budget spent
    loss(loss, batch)               inside a training step, before backward: returns the loss to train on
    on_update(step, share)          after every optimizer update; no host synchronisation here
    on_log(row, share)              at a logging point, with the training row (already read to the host)
    on_evaluate(row, share)         after each held-out evaluation, with its row
    on_fit_end(progress)            when fit stops: after the final evaluation, or on preemption before its checkpoint
    on_final_folder(folder, model_name, config, weights)
                                    on the main process, into the staged final folder (`finish`), whose
                                    tokenizer and records are written and its model not yet (`weights`: the
                                    final state dict): writes the callback's files there, returns what the
                                    card and the curves show of them (`FinalFolderPart`)

A callback's own state must follow from the checkpointed progress (its log history and update count), so
that a resumed run continues it without a file of its own.
"""

from __future__ import annotations

import functools
import operator
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from hfbert.checkpointing import TrainingProgress


@dataclass(frozen=True)
class FinalFolderPart:
    """What a callback's files add to the final folder's card (`hfbert.model_card.build_model_card`'s
    `samples_name` and `health_section`) and curves (`reference_lines`), and the text the run prints at its end."""

    samples_name: str | None = None
    health_section: str | None = None
    reference_lines: tuple[tuple[str, float, str], ...] = ()
    fill_mask: str | None = None

    def __or__(self, other: FinalFolderPart) -> FinalFolderPart:
        """Both parts: the reference lines of each, `other`'s value where both give one."""
        return FinalFolderPart(
            other.samples_name or self.samples_name,
            other.health_section or self.health_section,
            (*self.reference_lines, *other.reference_lines),
            other.fill_mask or self.fill_mask,
        )


class Callback:
    """Base class: every event does nothing."""

    def on_fit_start(self, progress: TrainingProgress, share: float) -> None:
        pass

    def loss(self, loss: torch.Tensor, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        return loss

    def on_update(self, step: int, share: float) -> None:
        pass

    def on_log(self, row: dict[str, Any], share: float) -> None:
        pass

    def on_evaluate(self, row: dict[str, Any], share: float) -> None:
        pass

    def on_fit_end(self, progress: TrainingProgress) -> None:
        pass

    def on_final_folder(
        self, folder: Path, model_name: str, config: Any, weights: dict[str, torch.Tensor]
    ) -> FinalFolderPart:
        return FinalFolderPart()


class Callbacks(Callback):
    """The run's callbacks as one: each event goes to each callback, in the order given."""

    def __init__(self, callbacks: Sequence[Callback] = ()):
        self.callbacks = tuple(callbacks)

    def on_fit_start(self, progress: TrainingProgress, share: float) -> None:
        for callback in self.callbacks:
            callback.on_fit_start(progress, share)

    def loss(self, loss: torch.Tensor, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        for callback in self.callbacks:
            loss = callback.loss(loss, batch)
        return loss

    def on_update(self, step: int, share: float) -> None:
        for callback in self.callbacks:
            callback.on_update(step, share)

    def on_log(self, row: dict[str, Any], share: float) -> None:
        for callback in self.callbacks:
            callback.on_log(row, share)

    def on_evaluate(self, row: dict[str, Any], share: float) -> None:
        for callback in self.callbacks:
            callback.on_evaluate(row, share)

    def on_fit_end(self, progress: TrainingProgress) -> None:
        for callback in self.callbacks:
            callback.on_fit_end(progress)

    def on_final_folder(
        self, folder: Path, model_name: str, config: Any, weights: dict[str, torch.Tensor]
    ) -> FinalFolderPart:
        parts = (callback.on_final_folder(folder, model_name, config, weights) for callback in self.callbacks)
        return functools.reduce(operator.or_, parts, FinalFolderPart())

