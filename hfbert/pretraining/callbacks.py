"""What the loop does besides the step, plugged in as callbacks (the shape of Composer's events): the loop
calls every registered callback at each event, in order, and knows nothing of what they do. The structured
fade, the [CLS] penalty, the progress bar, the trackers, run health and the final folder's samples are
callbacks (`extras.attention_shaping`, `loop`, `extras.health`, `extras.samples`), attached by `run`.

Events, and what a callback may do there:

    on_fit_start(progress, share)   after any resume, before the first update; `share` of the budget spent
    loss(loss, batch)               inside a training step, before backward: returns the loss to train on
    on_update(step, share)          after every optimizer update; no host synchronisation here
    on_log(row, share)              at a logging point, with the training row (already read to the host)
    on_evaluate(row, share)         after each held-out evaluation, with its row
    on_fit_end(progress)            when fit stops: after the final evaluation, or on preemption before its checkpoint
    on_final_folder(folder)         on the main process, while the final folder is staged (`finish`; its
                                    tokenizer and records written, its model not yet): writes the callback's
                                    files into it and fills in what the card and the curves show of them

A callback's own state must follow from the checkpointed progress (its log history and update count), so
that a resumed run continues it without a file of its own.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from hfbert.pretraining.training import TrainingProgress


@dataclass
class StagedFinalFolder:
    """The final folder as `on_final_folder` sees it: where it is staged, the model's name and config, the final
    weights (a state dict: the model is saved after the event), and what the callbacks' files add, which they
    fill in: the card's `samples_name` and `health_section` (`hfbert.model_card.build_model_card`), the curves'
    `reference_lines` and the text printed at the run's end."""

    path: Path
    model_name: str
    config: Any
    weights: dict[str, torch.Tensor]
    samples_name: str | None = None
    health_section: str | None = None
    reference_lines: list[tuple[str, float, str]] = field(default_factory=list)
    fill_mask: str | None = None


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

    def on_final_folder(self, folder: StagedFinalFolder) -> None:
        pass


class Callbacks(Callback):
    """The run's callbacks as one: each event goes to each callback, in the order given (the loss through
    each in turn)."""

    def __init__(self, callbacks: Sequence[Callback] = ()):
        self.callbacks = tuple(callbacks)

    def loss(self, loss: torch.Tensor, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        for callback in self.callbacks:
            loss = callback.loss(loss, batch)
        return loss


def _to_each(event: str) -> Callable[..., None]:
    """`Callbacks`' `event`: the same call on each of its callbacks, in order."""

    def to_each(self: Callbacks, *args: Any, **kwargs: Any) -> None:
        for callback in self.callbacks:
            getattr(callback, event)(*args, **kwargs)

    return to_each


for _event in (name for name in vars(Callback) if name.startswith("on_")):  # every event but the loss
    setattr(Callbacks, _event, _to_each(_event))
