"""Loop stage: `fit` trains until the step or time budget runs out; logs, evaluates and checkpoints on their
schedules; on SIGTERM/SIGUSR1 (preemption) writes a checkpoint and stops."""

from __future__ import annotations

import logging
import math
import signal
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from accelerate import Accelerator
from torch.utils.data import DataLoader
from tqdm.auto import tqdm

from hfbert.checkpointing import TrainingProgress, save_checkpoint
from hfbert.pretraining.attention_shaping import AttentionShaping
from hfbert.pretraining.evaluation import ModelFlops, TrainingWindow, check_loss_is_finite, evaluate
from hfbert.pretraining.reshard import micro_batches_to_skip
from hfbert.pretraining.settings import OptimizationSettings, RunSettings
from hfbert.pretraining.setup import Budget, TrainingState
from hfbert.pretraining.stream import STREAM_STATE_NAME, StreamLoader

NO_SHAPING = AttentionShaping()

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class CheckpointWriter:
    """Where checkpoints go and what they record besides the `TrainingState`: the run's settings (compared
    on resume), its tokenizer (reused on resume), the model's config (so that a checkpoint folder is one a
    new run can start from with --model_name_or_path) and, for a stream, where each process stands in it."""

    output_dir: str
    total_limit: int | None
    run_settings: dict[str, Any]
    tokenizer: Any
    model_config: Any = None
    stream: StreamLoader | None = None  # --streaming: every process's position in the stream is saved too

    def save(self, accelerator: Accelerator, step: int) -> Path:
        extra = None
        if self.stream is not None:  # gathered from every process (this is called on every process)
            extra = {STREAM_STATE_NAME: self.stream.checkpoint_state(accelerator)}
        return save_checkpoint(
            accelerator,
            self.output_dir,
            step,
            self.total_limit,
            run_settings=self.run_settings,
            tokenizer=self.tokenizer,
            model_config=self.model_config,
            extra_json=extra,
        )


def log_row(
    accelerator: Accelerator, progress: TrainingProgress, row: dict[str, Any], with_tracking: bool
) -> None:
    """Append a row to the run's history (saved with checkpoints and the final folder) and the tracker."""
    progress.log_history.append(row)
    if with_tracking:
        accelerator.log({k: v for k, v in row.items() if k != "step"}, step=row["step"])


def run_evaluation(
    accelerator: Accelerator, state: TrainingState, eval_loader: DataLoader, with_tracking: bool
) -> dict[str, float]:
    """Evaluate, log the row and return the metrics."""
    progress = state.progress
    metrics = evaluate(state.model, eval_loader, accelerator)
    log_row(
        accelerator,
        progress,
        {"step": progress.completed_steps, "train_seconds": progress.train_seconds, **metrics},
        with_tracking,
    )
    logger.info(f"step {progress.completed_steps}: " + ", ".join(f"{k} {v:.4f}" for k, v in metrics.items()))
    return metrics


def synced_train_seconds(accelerator: Accelerator, progress: TrainingProgress, budget: Budget) -> float:
    """Training seconds so far as the slowest process sees them, so that every process takes the same
    decisions (stop, learning rate). Costs one reduction, only when a time budget is set."""
    if budget.schedule.max_seconds is None or accelerator.num_processes == 1:
        return progress.train_seconds
    seconds = torch.tensor(progress.train_seconds, dtype=torch.float64, device=accelerator.device)
    return accelerator.reduce(seconds, "max").item()


def train_step(
    accelerator: Accelerator,
    state: TrainingState,
    batch: dict[str, torch.Tensor],
    learning_rate: float,
    optimization: OptimizationSettings,
    precision: str,
    output_dir: str | None = None,
    shaping: AttentionShaping = NO_SHAPING,
) -> tuple[Any, torch.Tensor]:
    """Forward, backward and (at the end of an accumulation) the optimizer update of one micro-batch;
    `output_dir` names the last finite checkpoint should the loss stop being finite; `shaping` adds its
    penalty to the loss."""
    with accelerator.accumulate(state.model):
        outputs = state.model(**batch, mlm_masked_rows_only=True)
        loss = shaping.add_penalty(outputs.mlm_loss, batch)
        if outputs.nsp_loss is not None:  # None under --objective mlm
            loss = loss + optimization.nsp_loss_weight * outputs.nsp_loss
        # On CUDA the check waits for the device, so it runs once per logging interval instead (in fit).
        if accelerator.device.type != "cuda":
            step = state.progress.completed_steps + 1
            check_loss_is_finite(loss, precision, step, learning_rate, output_dir)
        accelerator.backward(loss)
        if accelerator.sync_gradients and optimization.max_grad_norm > 0:
            accelerator.clip_grad_norm_(state.model.parameters(), optimization.max_grad_norm)
        state.optimizer.step()
        state.optimizer.zero_grad(set_to_none=True)
    return outputs, loss


def is_due(step: int, every: int | None) -> bool:
    return every is not None and step % every == 0


def out_of_budget(progress: TrainingProgress, budget: Budget, seconds: float) -> bool:
    """Whether the step budget, or the time budget (`seconds` synced over processes), is spent."""
    over_time = budget.schedule.max_seconds is not None and seconds >= budget.schedule.max_seconds
    return progress.completed_steps >= budget.max_train_steps or over_time


class Preempted(RuntimeError):
    """The run stopped on a scheduler's signal after writing a checkpoint; the message says how to resume."""

    def __init__(self, message: str, signal_number: int):
        super().__init__(message)
        self.signal_number = signal_number


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


def stop_for_preemption(
    accelerator: Accelerator,
    progress: TrainingProgress,
    checkpoints: CheckpointWriter,
    signal_number: int,
    checkpoint_saved: bool,
) -> None:
    """Write a checkpoint at this update (unless one was just written) and raise `Preempted`."""
    checkpoint = checkpoints.save(accelerator, progress.completed_steps) if not checkpoint_saved else None
    name = signal.Signals(signal_number).name
    where = checkpoint or Path(checkpoints.output_dir) / f"checkpoint-{progress.completed_steps}"
    raise Preempted(
        f"Stopped by {name} after update {progress.completed_steps}; the training state is saved in "
        f"{where}. Resume with the same command plus --resume_from_checkpoint latest.",
        signal_number,
    )


def log_training_row(
    accelerator: Accelerator,
    progress: TrainingProgress,
    row: dict[str, Any],
    bar: tqdm,
    precision: str,
    run: RunSettings,
) -> None:
    """A training window's row (`TrainingWindow.row`: the one host synchronisation of a logging interval),
    checked, into the log (and the tracker, --with_tracking) and the bar."""
    learning_rate = row["learning_rate"]
    check_loss_is_finite(torch.tensor(row["loss"]), precision, row["step"], learning_rate, run.output_dir)
    log_row(accelerator, progress, row, run.with_tracking)
    bar.set_postfix(
        mlm=f"{row['train_mlm_loss']:.3f}",
        mlm_acc=f"{row['train_mlm_accuracy']:.3f}",
        nsp=f"{row.get('train_nsp_loss', math.nan):.3f}",  # nan under --objective mlm
        nsp_acc=f"{row.get('train_nsp_accuracy', math.nan):.3f}",
        lr=f"{learning_rate:.2e}",
        tok_s=f"{row['tokens_per_second']:.0f}",
    )


def progress_bar(accelerator: Accelerator, progress: TrainingProgress, budget: Budget) -> tqdm:
    return tqdm(
        total=None
        if budget.schedule.max_seconds
        else budget.max_train_steps,  # a time budget ends at an unknown step
        initial=progress.completed_steps,
        disable=not accelerator.is_local_main_process,
        desc="pretraining",
        unit="step",
        dynamic_ncols=True,
    )


def fit(
    accelerator: Accelerator,
    state: TrainingState,
    train_loader: DataLoader,
    eval_loader: DataLoader,
    budget: Budget,
    optimization: OptimizationSettings,
    run: RunSettings,
    precision: str,
    checkpoints: CheckpointWriter,
    flops: ModelFlops,
    shaping: AttentionShaping = NO_SHAPING,
) -> dict[str, float]:
    """Train until the step or time budget runs out; log, evaluate and checkpoint on their schedules; shape
    the attention as `shaping` says. On SIGTERM/SIGUSR1, write a checkpoint and raise `Preempted`. Returns
    the final evaluation metrics."""
    progress = state.progress
    every_checkpoint = run.checkpointing_steps
    checkpoint_steps = int(every_checkpoint) if every_checkpoint not in (None, "epoch") else None
    bar = progress_bar(accelerator, progress, budget)
    window = TrainingWindow.start(accelerator.device, progress.train_seconds)
    clock = time.perf_counter()  # start of the current stretch of training time
    seconds = synced_train_seconds(accelerator, progress, budget)
    shaping.resume_at(budget.progress(progress.completed_steps, seconds))
    metrics: dict[str, float] | None = None
    state.model.train()
    with PreemptionSignals() as preemption:
        for epoch in range(progress.epoch, budget.num_epochs):
            if out_of_budget(progress, budget, seconds):
                break
            for batch in epoch_batches(accelerator, train_loader, epoch, progress):
                learning_rate = budget.schedule(progress.completed_steps, seconds)
                set_learning_rate(state.optimizer, learning_rate)
                step_args = (learning_rate, optimization, precision, run.output_dir, shaping)
                outputs, loss = train_step(accelerator, state, batch, *step_args)
                progress.micro_batches_in_epoch += accelerator.num_processes  # global: any split continues it
                window.add(outputs, loss, batch)
                if not accelerator.sync_gradients:
                    continue
                progress.completed_steps += 1
                step, now = progress.completed_steps, time.perf_counter()
                progress.train_seconds += now - clock
                seconds = synced_train_seconds(accelerator, progress, budget)
                shaping.after_update(budget.progress(step, seconds))
                bar.update(1)
                log_due = is_due(step, run.logging_steps) or step == budget.max_train_steps
                if log_due:
                    logged_epoch = train_loader.stream_pass if isinstance(train_loader, StreamLoader) else epoch
                    row = window.row(accelerator, progress, logged_epoch, learning_rate, flops)
                    log_training_row(accelerator, progress, row, bar, precision, run)
                    window = TrainingWindow.start(accelerator.device, progress.train_seconds)
                if is_due(step, run.eval_steps):
                    metrics = run_evaluation(accelerator, state, eval_loader, run.with_tracking)
                if is_due(step, checkpoint_steps):
                    checkpoints.save(accelerator, step)
                if preemption.agreed(accelerator, due=log_due):
                    bar.close()
                    saved = is_due(step, checkpoint_steps)
                    stop_for_preemption(accelerator, progress, checkpoints, preemption.signal_number, saved)
                clock = time.perf_counter()  # evaluation and saving are not training time
                if out_of_budget(progress, budget, seconds):
                    break
            else:  # the epoch ran to its end
                metrics = end_epoch(accelerator, state, eval_loader, run, checkpoints) or metrics
                clock = time.perf_counter()
        bar.close()
        metrics = final_metrics(accelerator, state, eval_loader, run.with_tracking, metrics)
        stop_if_signalled(accelerator, progress, checkpoints, preemption)
    return metrics


def stop_if_signalled(
    accelerator: Accelerator, progress: TrainingProgress, checkpoints: CheckpointWriter, preemption: PreemptionSignals
) -> None:
    """After the last update (e.g. during the final evaluation): a signal still leaves a checkpoint."""
    if preemption.agreed(accelerator, due=True):
        saved = (Path(checkpoints.output_dir) / f"checkpoint-{progress.completed_steps}").is_dir()
        stop_for_preemption(accelerator, progress, checkpoints, preemption.signal_number, saved)


def epoch_batches(
    accelerator: Accelerator, train_loader: DataLoader | StreamLoader, epoch: int, progress: TrainingProgress
) -> Iterable[dict[str, torch.Tensor]]:
    """The epoch's batches: its own shuffle, and past the batches already trained on when resumed mid-epoch.
    A stream (--streaming) is one endless epoch, placed by its own checkpointed position (`StreamLoader`)."""
    if isinstance(train_loader, StreamLoader):
        return train_loader.batches(accelerator.device)
    train_loader.set_epoch(epoch)
    if progress.micro_batches_in_epoch:
        skip = micro_batches_to_skip(progress, accelerator.num_processes, len(train_loader))
        # accelerate's micro-batch counter (which micro-batch ends an accumulation) comes back from this rank's
        # RNG file counted in the writer's split, or not at all: count it in this one (0 past the epoch's end).
        accelerator.step = skip % len(train_loader)
        return accelerator.skip_first_batches(train_loader, skip)
    return train_loader


def set_learning_rate(optimizer: torch.optim.Optimizer, learning_rate: float) -> None:
    for group in optimizer.param_groups:
        group["lr"] = learning_rate


def end_epoch(
    accelerator: Accelerator,
    state: TrainingState,
    eval_loader: DataLoader,
    run: RunSettings,
    checkpoints: CheckpointWriter,
) -> dict[str, float] | None:
    """At the end of an epoch: the next one starts at its first batch; evaluate (without --eval_steps) and
    checkpoint (--checkpointing_steps epoch). Returns the evaluation's metrics, if one ran."""
    progress = state.progress
    progress.epoch += 1
    progress.micro_batches_in_epoch = 0
    metrics = (
        run_evaluation(accelerator, state, eval_loader, run.with_tracking) if run.eval_steps is None else None
    )
    if run.checkpointing_steps == "epoch":
        checkpoints.save(accelerator, progress.completed_steps)
    return metrics


def final_metrics(
    accelerator: Accelerator,
    state: TrainingState,
    eval_loader: DataLoader,
    with_tracking: bool,
    metrics: dict[str, float] | None,
) -> dict[str, float]:
    """The last evaluation's metrics, evaluating once more unless one ran at the last update."""
    log_history = state.progress.log_history
    last_eval = next((row["step"] for row in reversed(log_history) if "eval_mlm_loss" in row), None)
    if metrics is None or last_eval != state.progress.completed_steps:
        metrics = run_evaluation(accelerator, state, eval_loader, with_tracking)
    return metrics
