"""Loop stage: `fit` trains until the step or time budget runs out; logs, evaluates and checkpoints on their
schedules; on SIGTERM/SIGUSR1 (preemption) writes a checkpoint and stops."""

from __future__ import annotations

import functools
import logging
import math
import signal
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from accelerate import Accelerator
from torch.utils.data import DataLoader
from tqdm.auto import tqdm

from hfbert.checkpointing import RUN_SETTINGS_NAME, TrainingProgress, checkpoint_folder, save_checkpoint
from hfbert.pretraining.callbacks import Callback
from hfbert.pretraining.data import PreparedData
from hfbert.pretraining.evaluation import (
    LogInterval,
    check_loss_is_finite,
    check_weights_are_finite,
    evaluate,
)
from hfbert.pretraining.flops import ModelFlops
from hfbert.pretraining.settings import (
    CORPUS_FINGERPRINT,
    OptimizationSettings,
    OutputSettings,
    PretrainingSettings,
)
from hfbert.pretraining.training import Budget, TrainingState

logger = logging.getLogger(__name__)

# `run_evaluation` bound to a fit's accelerator, state, loader and callbacks: budget share spent -> metrics.
Evaluation = Callable[[float], dict[str, float]]
# `write_checkpoint` bound likewise (and to the run's settings and data): writes one, returns its folder.
Checkpointing = Callable[[], Path]


def write_checkpoint(
    accelerator: Accelerator, state: TrainingState, settings: PretrainingSettings, prepared: PreparedData
) -> Path:
    """Write `state` as the checkpoint of its update (on every process: a stream's positions are gathered from
    each; the batches add their position where `progress` does not hold it) with the run's settings (compared
    on resume), its tokenizer (reused on resume) and the model's config (so that a checkpoint folder is one a
    new run can start from with --model_name_or_path). Weights that are no longer finite stop the run instead:
    a checkpoint of them would rotate finite ones out under --checkpoints_total_limit."""
    check_weights_are_finite(accelerator, state, settings.output.output_dir)
    position = state.batches.checkpoint_files(accelerator)  # a stream's; {} where `progress` holds it
    # The corpus as the data stage read it, not as its files are now: text edited since is not what trained.
    recorded = settings.checkpoint_settings() | {CORPUS_FINGERPRINT: prepared.corpus_sha256}
    return save_checkpoint(
        accelerator,
        settings.output.output_dir,
        state.progress.completed_steps,
        settings.output.checkpoints_total_limit,
        progress=state.progress,
        tokenizer=prepared.tokenizer,
        model_config=prepared.config,
        json_files={RUN_SETTINGS_NAME: recorded, **position},
    )


@functools.cache
def compiled_clipping() -> Any:
    """clip_grad_norm_ as one graph (fullgraph: a graph break raises). No CUDA graphs: it changes the gradients
    in place, which a CUDA graph would have to copy in and out."""
    return torch.compile(torch.nn.utils.clip_grad_norm_, fullgraph=True, dynamic=False)


class CompileTime:
    """A compiled update's compilation, timed as the first update of a fit minus the second (which reuses the
    graphs): logged once, and added to the next training row as compile_seconds."""

    def __init__(self) -> None:
        self.updates: list[float] = []
        self.seconds: float | None = None  # known after the second update, until a row takes it

    def add(self, update_seconds: float) -> None:
        if len(self.updates) == 2:
            return
        self.updates.append(update_seconds)
        if len(self.updates) == 2:
            first, second = self.updates
            self.seconds = max(first - second, 0.0)
            logger.info(
                f"Compiling the update took about {self.seconds:.1f} s (first update {first:.1f} s, second "
                f"{second:.3f} s); training time counts it. The first evaluation compiles too."
            )

    def row(self) -> dict[str, float]:
        """compile_seconds for the next training row, once."""
        row = {} if self.seconds is None else {"compile_seconds": self.seconds}
        self.seconds = None
        return row


class Tracker(Callback):
    """--with_tracking: every row goes to accelerate's trackers too (TensorBoard, W&B, ...)."""

    def __init__(self, accelerator: Accelerator):
        self.accelerator = accelerator

    def on_log(self, row: dict[str, Any], share: float) -> None:
        self.accelerator.log({k: v for k, v in row.items() if k != "step"}, step=row["step"])

    on_evaluate = on_log


def run_evaluation(
    accelerator: Accelerator,
    state: TrainingState,
    eval_loader: DataLoader,
    callbacks: Callback,
    share: float,
) -> dict[str, float]:
    """Evaluate, log the row, tell the callbacks and return the metrics."""
    progress = state.progress
    metrics = evaluate(state.model, eval_loader, accelerator)
    row = {"step": progress.completed_steps, "train_seconds": progress.train_seconds, **metrics}
    progress.log_history.append(row)  # saved with checkpoints and the final folder
    logger.info(f"step {progress.completed_steps}: " + ", ".join(f"{k} {v:.4f}" for k, v in metrics.items()))
    callbacks.on_evaluate(row, share)
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
    optimization: OptimizationSettings,
    interval: LogInterval,
    callbacks: Callback,
) -> tuple[Any, torch.Tensor]:
    """Forward, backward and (at the end of an accumulation) the optimizer update of one micro-batch, its
    statistics added to `interval` on the device; `callbacks` may add to the loss. The update is compiled where
    `optimization.compiles_update` says (`optimization.compile_model` compiled the model; clipping here)."""
    compiled = optimization.compiles_update(accelerator.device.type)
    if compiled:  # a new iteration: CUDA graphs (reduce-overhead, max-autotune) may reuse the last one's memory
        torch.compiler.cudagraph_mark_step_begin()
    with accelerator.accumulate(state.model):
        outputs = state.model(**batch, mlm_masked_rows_only=True, attention_padding=optimization.attention_padding)
        loss = callbacks.loss(outputs.mlm_loss, batch)
        if outputs.nsp_loss is not None:  # None under --objective mlm
            loss = loss + optimization.nsp_loss_weight * outputs.nsp_loss
        accelerator.backward(loss)  # the loss is checked once per logging interval (a check waits for the device)
        grad_norm = None
        if accelerator.sync_gradients and optimization.max_grad_norm > 0:  # the norm before clipping, for the log
            # What accelerator.clip_grad_norm_ does for one process or DDP, with the clipping compiled if the update is
            accelerator.unscale_gradients(state.optimizer)
            clip = compiled_clipping() if compiled else torch.nn.utils.clip_grad_norm_
            grad_norm = clip(list(state.model.parameters()), optimization.max_grad_norm)
        state.optimizer.step()  # under fp16 the scaler gives the fused step its inf flag on the device: no wait
        state.optimizer.zero_grad(set_to_none=True)
    interval.add(outputs, loss, batch, grad_norm)
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
        self.process_group_ended = True  # False: the entry point leaves with cluster.exit_now


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
    progress: TrainingProgress, callbacks: Callback, signum: int, saved: Path | None, save: Checkpointing
) -> None:
    """End the fit (`on_fit_end`), write a checkpoint at this update with `save` unless one was `saved` at it
    (its folder; every process decides alike) and raise `Preempted`."""
    callbacks.on_fit_end(progress)
    where = saved or save()
    name = signal.Signals(signum).name
    raise Preempted(
        f"Stopped by {name} after update {progress.completed_steps}; the training state is saved in "
        f"{where}. Resume with the same command plus --resume_from_checkpoint latest.",
        signum,
    )


class ProgressBar(Callback):
    """The tqdm bar (main process of each node): one tick an update, the last training row beside it."""

    def __init__(self, accelerator: Accelerator, budget: Budget):
        self.bar = tqdm(
            total=None if budget.schedule.max_seconds else budget.max_train_steps,  # a time budget: unknown
            disable=not accelerator.is_local_main_process,
            desc="pretraining",
            unit="step",
            dynamic_ncols=True,
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


def count_update(progress: TrainingProgress, clock: float, compile_time: CompileTime | None) -> int:
    """Count the update that just ended and its training time (since `clock`; into `compile_time` too, for a
    compiled update); returns its number."""
    progress.completed_steps += 1
    update_seconds = time.perf_counter() - clock
    progress.train_seconds += update_seconds
    if compile_time is not None:
        compile_time.add(update_seconds)
    return progress.completed_steps


def fit(
    accelerator: Accelerator,
    state: TrainingState,
    budget: Budget,
    eval_loader: DataLoader,
    callbacks: Callback,
    settings: PretrainingSettings,
    prepared: PreparedData,
    flops: ModelFlops,
) -> dict[str, float]:
    """Train `state` on its batches until `budget` runs out; log, evaluate and checkpoint (with `data`'s
    tokenizer and config) as `settings.output` says, calling `callbacks` at each event; `flops`: the logged model
    FLOP/s and MFU. On SIGTERM/SIGUSR1, write a checkpoint and raise `Preempted`. Returns the final evaluation
    metrics."""
    output, progress = settings.output, state.progress
    compiled = settings.optimization.compiles_update(accelerator.device.type)
    seconds = synced_train_seconds(accelerator, progress, budget)
    share = budget.share_spent(progress.completed_steps, seconds)
    callbacks.on_fit_start(progress, share)
    interval = LogInterval(accelerator.device, progress.train_seconds)
    compile_time = CompileTime()
    clock = time.perf_counter()  # start of the current stretch of training time
    metrics: dict[str, float] | None = None
    evaluation: Evaluation = functools.partial(run_evaluation, accelerator, state, eval_loader, callbacks)
    save = functools.partial(write_checkpoint, accelerator, state, settings, prepared)
    state.model.train()
    with PreemptionSignals() as preemption:
        for epoch in range(progress.epoch, budget.num_epochs):
            if out_of_budget(progress, budget, seconds):
                break
            for batch in state.batches.epoch(epoch, progress, accelerator):
                learning_rate = budget.schedule(progress.completed_steps, seconds)
                set_learning_rate(state.optimizer, learning_rate)
                train_step(accelerator, state, batch, settings.optimization, interval, callbacks)
                progress.micro_batches_in_epoch += accelerator.num_processes  # global: any split continues it
                if not accelerator.sync_gradients:
                    continue
                update = count_update(progress, clock, compile_time if compiled else None)
                seconds = synced_train_seconds(accelerator, progress, budget)
                share = budget.share_spent(update, seconds)
                callbacks.on_update(update, share)
                log_due = is_due(update, output.logging_steps) or update == budget.max_train_steps
                if log_due:  # the interval's row is its one host synchronisation
                    row = interval.row(accelerator, progress, state.batches.logged_epoch(epoch), learning_rate, flops)
                    precision = accelerator.mixed_precision  # a non-finite loss names the last finite checkpoint
                    check_loss_is_finite(row["loss"], precision, update, learning_rate, output.output_dir)
                    progress.log_history.append(row | compile_time.row())
                    callbacks.on_log(progress.log_history[-1], share)
                    interval = LogInterval(accelerator.device, progress.train_seconds)
                if is_due(update, output.eval_steps):
                    metrics = evaluation(share)
                saved = save() if is_due(update, output.checkpoint_steps) else None
                if preemption.agreed(accelerator, due=log_due):
                    stop_for_preemption(progress, callbacks, preemption.signal_number, saved, save)
                clock = time.perf_counter()  # evaluation and saving are not training time
                if out_of_budget(progress, budget, seconds):
                    break
            else:  # the epoch ran to its end
                metrics = end_epoch(progress, output, evaluation, save, share) or metrics
                clock = time.perf_counter()
        metrics = final_metrics(progress, evaluation, metrics, share)
        if preemption.agreed(accelerator, due=True):  # a signal during the final evaluation still checkpoints
            last = checkpoint_folder(output.output_dir, progress.completed_steps)
            saved = last if last.is_dir() else None
            stop_for_preemption(progress, callbacks, preemption.signal_number, saved, save)
    callbacks.on_fit_end(progress)
    return metrics


def set_learning_rate(optimizer: torch.optim.Optimizer, learning_rate: float) -> None:
    for group in optimizer.param_groups:
        group["lr"] = learning_rate


def end_epoch(
    progress: TrainingProgress, output: OutputSettings, evaluation: Evaluation, save: Checkpointing, share: float
) -> dict[str, float] | None:
    """At the end of an epoch: the next one starts at its first batch; evaluate (without --eval_steps) and
    checkpoint with `save` (--checkpointing_steps epoch). Returns the evaluation's metrics, if one ran."""
    progress.epoch += 1
    progress.micro_batches_in_epoch = 0
    metrics = None
    if output.eval_steps is None:
        metrics = evaluation(share)
    if output.checkpoint_each_epoch:
        save()
    return metrics


def final_metrics(
    progress: TrainingProgress, evaluation: Evaluation, metrics: dict[str, float] | None, share: float
) -> dict[str, float]:
    """The last evaluation's metrics, evaluating once more unless one ran at the last update."""
    last_eval = next((row["step"] for row in reversed(progress.log_history) if "eval_mlm_loss" in row), None)
    if metrics is None or last_eval != progress.completed_steps:
        metrics = evaluation(share)
    return metrics
