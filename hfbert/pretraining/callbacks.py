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

A callback's own state must follow from the checkpointed progress (its log history and update count), so
that a resumed run continues it without a file of its own.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from hfbert.pretraining.training import TrainingProgress


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

