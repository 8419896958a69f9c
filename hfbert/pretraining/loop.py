"""Loop stage: `fit` drives the `Training` until its budget runs out; logs, evaluates and checkpoints on their
schedules, calling the callbacks at each event; on SIGTERM/SIGUSR1 (preemption) writes a checkpoint and stops.
One update: `fit` -> `Training.step` (each micro-batch) -> `Training.update` -> `optimizer.step()`."""

from __future__ import annotations

import logging
import math
import signal
import threading
from pathlib import Path
from typing import Any

import torch
from accelerate import Accelerator
from torch.utils.data import DataLoader
from tqdm.auto import tqdm

from hfbert.checkpointing import checkpoint_folder
from hfbert.pretraining.callbacks import Callback
from hfbert.pretraining.evaluation import evaluate
from hfbert.pretraining.settings import OutputSettings
from hfbert.pretraining.training import Budget, Training, TrainingProgress, check_loss_is_finite

logger = logging.getLogger(__name__)


class Tracker(Callback):
    """--with_tracking: every row goes to accelerate's trackers too (TensorBoard, W&B, ...)."""

    def __init__(self, accelerator: Accelerator):
        self.accelerator = accelerator

    def on_log(self, row: dict[str, Any], share: float) -> None:
        self.accelerator.log({k: v for k, v in row.items() if k != "step"}, step=row["step"])

    on_evaluate = on_log


def run_evaluation(training: Training, eval_loader: DataLoader, callbacks: Callback) -> dict[str, float]:
    """Evaluate, log the row, tell the callbacks and return the metrics."""
    progress = training.progress
    metrics = evaluate(training.model, eval_loader, training.accelerator)
    row = {"step": progress.completed_steps, "train_seconds": progress.train_seconds, **metrics}
    progress.log_history.append(row)  # saved with checkpoints and the final folder
    logger.info(f"step {progress.completed_steps}: " + ", ".join(f"{k} {v:.4f}" for k, v in metrics.items()))
    callbacks.on_evaluate(row, training.share_spent())
    return metrics


def is_due(step: int, every: int | None) -> bool:
    return every is not None and step % every == 0


class Preempted(RuntimeError):
    """The run stopped on a scheduler's signal after writing a checkpoint; the message says how to resume."""

    def __init__(self, message: str, signal_number: int):
        super().__init__(message)
        self.signal_number = signal_number
        self.process_group_ended = True  # False: the entry point leaves with process_group.exit_now


class PreemptionSignals:
    """While active, SIGTERM and SIGUSR1 (what Slurm and Kubernetes send before they kill) and SIGINT (Ctrl-C)
    are recorded instead of ending the process, so the loop can finish its update and write a checkpoint; a
    second signal during that save changes nothing. Previous handlers come back on exit. Only the main thread
    can install handlers; elsewhere signals keep their handlers."""

    SIGNALS = (signal.SIGTERM, signal.SIGUSR1, signal.SIGINT)

    def __init__(self) -> None:
        self.signal_number: int | None = None
        self._previous: dict[int, Any] = {}

    def record(self, signal_number: int, frame: Any) -> None:
        self.signal_number = self.signal_number or signal_number

    def __enter__(self) -> PreemptionSignals:
        if threading.current_thread() is threading.main_thread():
            self._previous = {number: signal.signal(number, self.record) for number in self.SIGNALS}
        return self

    def __exit__(self, *exc_info: Any) -> None:
        for number, handler in self._previous.items():
            signal.signal(number, handler)

    def agreed(self, accelerator: Accelerator, due: bool) -> bool:
        """Whether every process stops now. One process: as soon as a signal came. Several: at logging steps,
        where a reduction tells all of them (a signal may reach them at different updates)."""
        if accelerator.num_processes == 1:
            return self.signal_number is not None
        if not due:
            return False
        flag = torch.tensor(float(self.signal_number or 0), device=accelerator.device)
        self.signal_number = int(accelerator.reduce(flag, "max").item()) or None
        return self.signal_number is not None


def stop_for_preemption(training: Training, callbacks: Callback, signum: int, saved: Path | None) -> None:
    """End the fit (`on_fit_end`), write a checkpoint at this update unless one was `saved` at it (its folder;
    every process decides alike) and raise `Preempted`."""
    callbacks.on_fit_end(training.progress)
    where = saved or training.save_checkpoint()
    name = signal.Signals(signum).name
    raise Preempted(
        f"Stopped by {name} after update {training.progress.completed_steps}; the training state is saved in "
        f"{where}. Resume with the same command plus --resume_from_checkpoint latest.",
        signum,
    )


class ProgressBar(Callback):
    """The tqdm bar (main process of each node): one tick an update, the last training row beside it."""

    def __init__(self, accelerator: Accelerator, budget: Budget):
        self.bar = tqdm(
            total=None if budget.max_train_seconds else budget.max_train_steps,  # a time budget: unknown
            disable=not accelerator.is_local_main_process, desc="pretraining", unit="step", dynamic_ncols=True
        )

    def on_fit_start(self, progress: TrainingProgress, share: float) -> None:
        self.bar.reset(total=self.bar.total)
        self.bar.update(progress.completed_steps)

    def on_update(self, step: int, share: float) -> None:
        self.bar.update(1)

    def on_log(self, row: dict[str, Any], share: float) -> None:
        self.bar.set_postfix(
            mlm=f"{row['train_mlm_loss']:.3f}",
            mlm_acc=f"{row['train_mlm_accuracy']:.3f}",
            nsp=f"{row.get('train_nsp_loss', math.nan):.3f}",  # nan under --objective mlm
            nsp_acc=f"{row.get('train_nsp_accuracy', math.nan):.3f}",
            lr=f"{row['learning_rate']:.2e}",
            tok_s=f"{row['tokens_per_second']:.0f}",
        )

    def on_fit_end(self, progress: TrainingProgress) -> None:
        self.bar.close()


def fit(training: Training, eval_loader: DataLoader, callbacks: Callback, output: OutputSettings) -> dict[str, float]:
    """Train until `training`'s budget runs out; log, evaluate (on `eval_loader`) and checkpoint as `output`
    says, calling `callbacks` at each event. On SIGTERM/SIGUSR1, write a checkpoint and raise `Preempted`.
    Returns the final evaluation metrics."""
    progress, accelerator = training.progress, training.accelerator
    training.start_fit()
    callbacks.on_fit_start(progress, training.share_spent())
    training.start_clock()
    metrics: dict[str, float] | None = None
    with PreemptionSignals() as preemption:
        for epoch in range(progress.epoch, training.budget.num_epochs):
            if training.out_of_budget():
                break
            for batch in training.batches.epoch(epoch, progress.micro_batches_in_epoch, accelerator):
                training.step(batch, callbacks.loss)
                if not training.update_ended:
                    continue
                update = training.count_update()
                share = training.share_spent()
                callbacks.on_update(update, share)
                log_due = is_due(update, output.logging_steps) or update == training.budget.max_train_steps
                if log_due:  # the interval's row is its one host synchronisation
                    row = training.log_row(training.batches.logged_epoch(epoch))
                    precision = accelerator.mixed_precision  # a non-finite loss names the last finite checkpoint
                    check_loss_is_finite(
                        row["loss"], precision, update, training.learning_rate, output.output_dir, training.resumed_from
                    )
                    progress.log_history.append(row)
                    callbacks.on_log(row, share)
                if is_due(update, output.eval_steps):
                    metrics = run_evaluation(training, eval_loader, callbacks)
                saved = training.save_checkpoint() if is_due(update, output.checkpoint_steps) else None
                if preemption.agreed(accelerator, due=log_due):
                    stop_for_preemption(training, callbacks, preemption.signal_number, saved)
                training.start_clock()  # evaluation and saving are not training time
                if training.out_of_budget():
                    break
            else:  # the epoch ran to its end
                metrics = end_epoch(training, output, eval_loader, callbacks) or metrics
                training.start_clock()
        metrics = final_metrics(training, eval_loader, callbacks, metrics)
        if preemption.agreed(accelerator, due=True):  # a signal during the final evaluation still checkpoints
            last = checkpoint_folder(output.output_dir, progress.completed_steps)
            stop_for_preemption(training, callbacks, preemption.signal_number, last if last.is_dir() else None)
    callbacks.on_fit_end(progress)
    return metrics


def end_epoch(
    training: Training, output: OutputSettings, eval_loader: DataLoader, callbacks: Callback
) -> dict[str, float] | None:
    """At the end of an epoch: the next one starts at its first batch; evaluate (without --eval_steps) and
    checkpoint (--checkpointing_steps epoch). Returns the evaluation's metrics, if one ran."""
    progress = training.progress
    progress.epoch += 1
    progress.micro_batches_in_epoch = 0
    metrics = run_evaluation(training, eval_loader, callbacks) if output.eval_steps is None else None
    if output.checkpoint_each_epoch:
        training.save_checkpoint()
    return metrics


def final_metrics(
    training: Training, eval_loader: DataLoader, callbacks: Callback, metrics: dict[str, float] | None
) -> dict[str, float]:
    """The last evaluation's metrics, evaluating once more unless one ran at the last update."""
    progress = training.progress
    last_eval = next((row["step"] for row in reversed(progress.log_history) if "eval_mlm_loss" in row), None)
    if metrics is None or last_eval != progress.completed_steps:
        metrics = run_evaluation(training, eval_loader, callbacks)
    return metrics
