"""The run's training, with one owner: `Training` holds the prepared model and optimizer, the batches, the
progress (what a checkpoint saves of it), the budget and the learning-rate schedule, and acts on them: the
step of a micro-batch, counting an update and its time, the share of the budget spent, the log interval's
row, the checkpoint and the resume. `setup_training` builds it, prepared by accelerate; the loop drives it."""

from __future__ import annotations

import contextlib
import functools
import logging
import math
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch
from accelerate import Accelerator
from torch.utils.data import DataLoader

from hfbert.checkpointing import RunCheckpoints, last_finite_checkpoint_note, load_checkpoint
from hfbert.errors import RunFailure
from hfbert.pretraining.batches import TrainingBatches
from hfbert.pretraining.evaluation import STATISTICS, batch_statistics, metrics_from_statistics
from hfbert.pretraining.flops import ModelFlops
from hfbert.pretraining.settings import OptimizationSettings

logger = logging.getLogger(__name__)

UNBOUNDED_STEPS = 10**12  # the step budget of a run bounded by --max_train_seconds alone
# A callback's `loss` event: the loss of a micro-batch and the batch -> the loss to train on.
LossHook = Callable[[torch.Tensor, dict[str, torch.Tensor]], torch.Tensor]


@dataclass
class TrainingProgress:
    """Where training stands, saved with every checkpoint so that a resume continues at the exact batch.

    A checkpoint holds its `state_dict` as JSON (`hfbert.checkpointing.save_checkpoint`, never through
    accelerate's `register_for_checkpointing`, whose loader unpickles). The data position is global (counted
    over all processes), so a run on another number of processes continues from the same sample.
    """

    completed_steps: int = 0  # optimizer updates done
    epoch: int = 0  # epoch in progress (or the next one, once an epoch has ended)
    # Micro-batches of `epoch`'s draw order consumed by all processes together: its first
    # micro_batches_in_epoch x per_device_train_batch_size samples.
    micro_batches_in_epoch: int = 0
    log_history: list[dict[str, Any]] = field(default_factory=list)  # train/eval log rows, for the curves
    train_seconds: float = 0.0  # wall-clock time spent training (evaluation and saving excluded)

    def state_dict(self) -> dict[str, Any]:
        """Plain-data copy of the progress (what a checkpoint's `PROGRESS_JSON` holds)."""
        return asdict(self)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore the progress saved by `state_dict` (an older format is refused first, by `read_progress`)."""
        for name in asdict(self):
            setattr(self, name, state[name])


def optimizer_parameter_groups(model: torch.nn.Module, weight_decay: float) -> list[dict[str, Any]]:
    """AdamW groups as in BERT: weight decay on weight matrices only, none on biases and LayerNorm."""
    decay, no_decay = [], []
    for name, parameter in model.named_parameters():
        if not parameter.requires_grad:
            continue
        (no_decay if parameter.ndim < 2 or "LayerNorm" in name else decay).append(parameter)
    return [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]


def build_optimizer(model: torch.nn.Module, optimization: OptimizationSettings, device: torch.device):
    """AdamW as in BERT (see `optimizer_parameter_groups`), fused on CPU and CUDA."""
    return torch.optim.AdamW(
        optimizer_parameter_groups(model, optimization.weight_decay),
        lr=optimization.learning_rate,
        betas=(optimization.adam_beta1, optimization.adam_beta2),
        eps=optimization.adam_epsilon,
        fused=device.type in ("cpu", "cuda"),  # one kernel for all parameters: measured faster
    )


def compile_model(model: torch.nn.Module, mode: str) -> None:
    """Compile `model`'s forward, and with it the backward AOTAutograd derives, as one graph on static shapes
    (`batches.build_loaders` makes every batch one shape); a graph break raises (fullgraph). The rest of the
    update: clipping compiles apart (`compiled_clipping`); the fused AdamW step stays as it is, one kernel
    for all parameters that torch.optim keeps out of dynamo and that takes fp16's inf flag on the device."""
    # Compiled apart, not as one function with .backward(): dynamo traces a backward only with compiled autograd.
    logger.info(f"Compiling the update (torch.compile, mode {mode}): the first update and evaluation take longer.")
    # In place: the model stays itself, so checkpoints and the final folder keep its parameter names
    # (torch.compile's wrapper would prefix them with "_orig_mod.").
    model.compile(dynamic=False, fullgraph=True, mode=mode)


@dataclass(frozen=True)
class Budget:
    """How long the run trains: `max_train_steps` updates (UNBOUNDED_STEPS under a time budget alone) or
    `max_train_seconds` of training, whichever runs out first, over `num_epochs` epochs."""

    max_train_steps: int
    max_train_seconds: float | None = None
    num_epochs: int = 1

    @classmethod
    def of_training_args(cls, training_args: dict[str, Any]) -> Budget:
        """The budget a run's training_args.json records (its epochs unknown: 1), for a replay of its log rows
        (run health): the shares it gives are the run's."""
        steps = training_args.get("max_train_steps") or training_args.get("planned_train_steps")
        return cls(steps or UNBOUNDED_STEPS, training_args.get("max_train_seconds"))

    def share_spent(self, step: int, seconds: float) -> float:
        """The share of the budget spent after `step` updates and `seconds` of training, at most 1."""
        spent = step / self.max_train_steps
        if self.max_train_seconds is not None:
            spent = max(spent, seconds / self.max_train_seconds)
        return min(spent, 1.0)

    def is_spent(self, step: int, seconds: float) -> bool:
        """Whether the step budget, or the time budget (`seconds` synced over processes), is spent."""
        over_time = self.max_train_seconds is not None and seconds >= self.max_train_seconds
        return step >= self.max_train_steps or over_time

    @property
    def planned_train_steps(self) -> int | None:
        """The updates planned, or None under a time budget alone (as many as fit: none are planned)."""
        return None if self.max_train_steps == UNBOUNDED_STEPS else self.max_train_steps

    def describe(self) -> str:
        """The budget in words, for the log: the limit that ends the run, never the stand-in step count."""
        seconds = self.max_train_seconds
        if self.planned_train_steps is None:
            return f"as many updates as fit in {seconds:g} s (--max_train_seconds)"
        if seconds is not None:
            return f"up to {self.max_train_steps} updates or {seconds:g} s, whichever runs out first"
        return f"up to {self.max_train_steps} updates"


@dataclass(frozen=True)
class LearningRateSchedule:
    """Linear warmup to `peak`, then linear or cosine decay to zero over the budget, or constant.

    transformers' schedulers only know steps; a time budget needs the elapsed time too, so the decay follows
    decayed = max(step / max_steps, seconds / max_seconds) and reaches zero exactly when the budget that
    ends the run (steps or seconds) runs out (Izsak et al. 2021). Not transformers' `get_scheduler` for a step
    budget either: it warms up as step / warmup (this as (step + 1) / (warmup + 1)) and rounds its linear decay
    otherwise (the last digit of 40 of 100 rates), and the logged rates and the resumes of existing checkpoints
    follow this one. A pure function of the checkpointed progress, so nothing about it needs saving.
    """

    peak: float
    warmup_steps: int
    shape: str

    @classmethod
    def of(cls, optimization: OptimizationSettings) -> LearningRateSchedule:
        return cls(optimization.learning_rate, optimization.num_warmup_steps, optimization.lr_scheduler_type)

    def __call__(self, step: int, seconds: float, budget: Budget) -> float:
        if step < self.warmup_steps:
            return self.peak * (step + 1) / (self.warmup_steps + 1)
        if self.shape == "constant":
            return self.peak
        decayed = (step - self.warmup_steps) / max(1, budget.max_train_steps - self.warmup_steps)
        if budget.max_train_seconds is not None:
            decayed = max(decayed, seconds / budget.max_train_seconds)
        decayed = min(decayed, 1.0)
        if self.shape == "cosine":
            return self.peak * 0.5 * (1.0 + math.cos(math.pi * decayed))
        return self.peak * (1.0 - decayed)


def plan_budget(
    optimization: OptimizationSettings, batches_per_epoch: int | None, num_processes: int
) -> Budget:
    """The updates of the run (--max_train_steps, or the epochs', or unbounded under a time budget alone)
    and the epochs they span. `batches_per_epoch` None: a stream (--streaming), whose length is unknown; it is
    one endless epoch, and settings refuse it without --max_train_steps or --max_train_seconds."""
    updates_per_epoch = None
    if batches_per_epoch is not None:
        updates_per_epoch = math.ceil(
            math.ceil(batches_per_epoch / num_processes) / optimization.gradient_accumulation_steps
        )
    elif optimization.max_train_steps is None and optimization.max_train_seconds is None:
        raise ValueError("a stream needs --max_train_steps or --max_train_seconds (it has no epochs)")
    max_train_steps = optimization.max_train_steps or (
        # A time budget alone (a stream's only other bound) runs as many epochs as fit in it.
        UNBOUNDED_STEPS
        if optimization.max_train_seconds or updates_per_epoch is None
        else optimization.num_train_epochs * updates_per_epoch
    )
    num_epochs = 1 if updates_per_epoch is None else math.ceil(max_train_steps / updates_per_epoch)
    return Budget(max_train_steps, optimization.max_train_seconds, num_epochs)


class NonFiniteLoss(RunFailure, FloatingPointError):
    """The training loss (outside fp16, whose grad scaler skips such steps) or the weights became NaN or
    infinite."""


def diverged(
    what: str, precision: str, step: int, learning_rate: float, output_dir: str | None, resumed_from: Path | None
) -> NonFiniteLoss:
    """The stop of a run whose `what` ("The training loss became nan") happened at `step`: the advice, and the
    last checkpoint of `output_dir` (else the one it `resumed_from`) whose weights are finite."""
    note = "" if output_dir is None else last_finite_checkpoint_note(output_dir, resumed_from)
    return NonFiniteLoss(
        f"{what} at step {step} (learning rate {learning_rate:.3g}, precision {precision}). Resuming would "
        "diverge again, as a resume keeps the learning rate, warmup and clipping: start a new run (a new "
        "--output_dir, or --overwrite_output_dir) with a lower --learning_rate, more --num_warmup_steps or "
        f"--max_grad_norm > 0.{note}"
    )


def check_loss_is_finite(
    loss: float,
    precision: str,
    step: int,
    learning_rate: float,
    output_dir: str | None = None,
    resumed_from: Path | None = None,
) -> None:
    """Stop with advice on a NaN/inf loss; under fp16 the grad scaler skips such steps, so only warn."""
    if math.isfinite(loss):
        return
    if precision == "fp16":
        logger.warning(f"Non-finite loss ({loss}) at step {step}: the fp16 grad scaler skips this update.")
        return
    raise diverged(f"The training loss became {loss}", precision, step, learning_rate, output_dir, resumed_from)


def check_weights_are_finite(accelerator: Accelerator, training: Training, output_dir: str) -> None:
    """Stop before a checkpoint or the final folder is written from weights that are no longer finite (rotation
    would then delete finite checkpoints, the final folder replace a finite one): one reduction on the device
    and one read, when one is written, not at every update; every process agrees."""
    parameters = list(training.model.parameters())
    finite = torch.stack([parameter.detach().isfinite().all() for parameter in parameters]).all()
    if accelerator.num_processes > 1:
        finite = accelerator.reduce(finite.float(), "min")
    if bool(finite):
        return
    named = accelerator.unwrap_model(training.model).named_parameters()
    where = next((name for name, parameter in named if not parameter.isfinite().all()), "another process's copy")
    what = f"The weights became non-finite ({where} holds nan or inf; no checkpoint or final folder of them is written)"
    learning_rate = training.optimizer.param_groups[0]["lr"]
    step = training.progress.completed_steps
    raise diverged(what, accelerator.mixed_precision, step, learning_rate, output_dir, training.resumed_from)


class LogInterval:
    """Training statistics since the last log row, from `start_seconds` of training on, kept on the device
    (read once per logging interval)."""

    def __init__(self, device: torch.device, start_seconds: float):
        self.totals = torch.zeros(len(STATISTICS), dtype=torch.float64, device=device)
        self.tokens = torch.zeros((), dtype=torch.float64, device=device)
        self.loss = torch.zeros((), dtype=torch.float64, device=device)
        # the largest finite gradient norm before clipping
        self.grad_norm = torch.zeros((), dtype=torch.float64, device=device)
        self.start_seconds = start_seconds
        self.batches = 0
        self.clipped_updates = 0  # updates whose norm clipping computed (none without --max_grad_norm)

    def add(
        self, outputs: Any, loss: torch.Tensor, batch: dict[str, torch.Tensor], grad_norm: torch.Tensor | None = None
    ) -> None:
        """A micro-batch's statistics; `grad_norm`, at the end of an accumulation, the norm clipping computed."""
        self.totals += batch_statistics(outputs, batch)
        self.tokens += batch["attention_mask"].sum()
        self.loss += loss.detach()
        self.batches += 1
        if grad_norm is not None:
            # fp16's skipped updates have an infinite norm: the loss scaler's business, not a spike
            finite = torch.where(grad_norm.isfinite(), grad_norm.detach().double(), 0.0)
            self.grad_norm = torch.maximum(self.grad_norm, finite)
            self.clipped_updates += 1

    def row(
        self,
        accelerator: Accelerator,
        progress: TrainingProgress,
        epoch: int,
        learning_rate: float,
        flops: ModelFlops,
    ) -> dict[str, Any]:
        """The log row of this window (reduced over processes), with the model FLOP/s and, where the device's
        peak is known, the MFU."""
        seconds = max(progress.train_seconds - self.start_seconds, 1e-9)
        totals = accelerator.reduce(self.totals, "sum")
        tokens = accelerator.reduce(self.tokens, "sum").item()
        grad_norm = {"grad_norm": accelerator.reduce(self.grad_norm, "max").item()} if self.clipped_updates else {}
        return {
            "step": progress.completed_steps,
            "epoch": epoch,
            "train_seconds": progress.train_seconds,
            "loss": accelerator.reduce(self.loss, "mean").item() / max(self.batches, 1),
            **metrics_from_statistics(totals, prefix="train_"),
            "learning_rate": learning_rate,
            "tokens_per_second": tokens / seconds,
            **flops.utilization(tokens, totals, seconds, accelerator.num_processes),
            **grad_norm,
        }


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


@functools.cache
def compiled_clipping() -> Any:
    """clip_grad_norm_ as one graph (fullgraph: a graph break raises). No CUDA graphs: it changes the gradients
    in place, which a CUDA graph would have to copy in and out."""
    return torch.compile(torch.nn.utils.clip_grad_norm_, fullgraph=True, dynamic=False)


def synced_train_seconds(accelerator: Accelerator, progress: TrainingProgress, budget: Budget) -> float:
    """Training seconds so far as the slowest process sees them, so that every process takes the same
    decisions (stop, learning rate). Costs one reduction, only when a time budget is set."""
    if budget.max_train_seconds is None or accelerator.num_processes == 1:
        return progress.train_seconds
    seconds = torch.tensor(progress.train_seconds, dtype=torch.float64, device=accelerator.device)
    return accelerator.reduce(seconds, "max").item()


@dataclass
class Training:
    """The run's training and its one owner: the prepared `model` and `optimizer`, the `batches`, the
    `progress`, the `budget` and the `schedule`, with the `optimization` settings, where its checkpoints go
    (`checkpoints`) and what its log rows' FLOP/s are computed from (`flops`). A micro-batch ends an update at
    the end of an accumulation or of the epoch, counted from `progress` (accelerate's own accumulation is left
    at 1: its counter is not in the checkpointed progress)."""

    accelerator: Accelerator
    model: torch.nn.Module
    optimizer: torch.optim.Optimizer
    batches: TrainingBatches
    budget: Budget
    schedule: LearningRateSchedule
    optimization: OptimizationSettings
    checkpoints: RunCheckpoints
    flops: ModelFlops
    progress: TrainingProgress = field(default_factory=TrainingProgress)

    def __post_init__(self) -> None:
        self.compiled = self.optimization.compiles_update(self.accelerator.device.type)
        self.seconds = 0.0  # the training seconds as the slowest process counts them (`synced_train_seconds`)
        self.update_ended = False  # whether the last micro-batch ended an update
        self.compile_time = CompileTime()
        self.interval = LogInterval(self.accelerator.device, self.progress.train_seconds)
        self.clock = time.perf_counter()  # the start of the current stretch of training time
        self.resumed_from: Path | None = None  # the checkpoint `resume` continued from

    def ends_update(self) -> bool:
        """Whether the next micro-batch ends an update: the last of an accumulation, or of this process's epoch
        (a shorter update, as accelerate's `accumulate` made it)."""
        taken = self.progress.micro_batches_in_epoch // self.accelerator.num_processes + 1  # this one included
        return taken % self.optimization.gradient_accumulation_steps == 0 or taken == self.batches.batches_per_process

    def step(self, batch: dict[str, torch.Tensor], adjust_loss: LossHook) -> tuple[Any, torch.Tensor]:
        """Forward, backward and (where it ends an update: `update_ended`) the optimizer update of one
        micro-batch at the schedule's rate, its statistics added to the log interval on the device; `adjust_loss`
        (the callbacks' `loss`) may add to the loss. Compiled where `optimization.compiles_update` says
        (`compile_model` compiled the model; clipping here). Returns the outputs and the loss."""
        self.update_ended, optimization = self.ends_update(), self.optimization
        if self.compiled:  # a new iteration: CUDA graphs (reduce-overhead, max-autotune) may reuse the last one's memory
            torch.compiler.cudagraph_mark_step_begin()
        # What accelerate's accumulate does: gradients are reduced over processes at an update's last micro-batch only.
        with contextlib.nullcontext() if self.update_ended else self.accelerator.no_sync(self.model):
            outputs = self.model(**batch, mlm_masked_rows_only=True, attention_padding=optimization.attention_padding)
            loss = adjust_loss(outputs.mlm_loss, batch)
            if outputs.nsp_loss is not None:  # None under --objective mlm
                loss = loss + optimization.nsp_loss_weight * outputs.nsp_loss
            # Each micro-batch's mean weighs alike, as accelerate divides; the loss is checked once per log interval.
            self.accelerator.backward(loss / optimization.gradient_accumulation_steps)
        grad_norm = self.update() if self.update_ended else None
        self.progress.micro_batches_in_epoch += self.accelerator.num_processes  # global: any split continues it
        self.interval.add(outputs, loss, batch, grad_norm)
        return outputs, loss

    def update(self) -> torch.Tensor | None:
        """The optimizer update at the schedule's rate, the gradients clipped first (--max_grad_norm: what
        accelerator.clip_grad_norm_ does for one process or DDP, compiled with the update); returns the norm
        before clipping, for the log."""
        grad_norm, max_norm = None, self.optimization.max_grad_norm
        if max_norm > 0:
            self.accelerator.unscale_gradients(self.optimizer)
            clip = compiled_clipping() if self.compiled else torch.nn.utils.clip_grad_norm_
            grad_norm = clip(list(self.model.parameters()), max_norm)
        learning_rate = self.schedule(self.progress.completed_steps, self.seconds, self.budget)
        for group in self.optimizer.param_groups:
            group["lr"] = learning_rate
        self.optimizer.step()  # under fp16 the scaler gives the fused step its inf flag on the device: no wait
        self.optimizer.zero_grad(set_to_none=True)
        return grad_norm

    def count_update(self) -> int:
        """Count the update that just ended and its training time (a compiled update's into the compile time
        too), then the seconds as the slowest process counts them; returns its number."""
        progress = self.progress
        progress.completed_steps += 1
        update_seconds = time.perf_counter() - self.clock
        progress.train_seconds += update_seconds
        if self.compiled:
            self.compile_time.add(update_seconds)
        self.seconds = synced_train_seconds(self.accelerator, progress, self.budget)
        return progress.completed_steps

    def start_fit(self) -> None:
        """After any resume, before the first update: training mode, the synced seconds and a new log interval."""
        self.model.train()
        self.seconds = synced_train_seconds(self.accelerator, self.progress, self.budget)
        self.interval = LogInterval(self.accelerator.device, self.progress.train_seconds)

    def start_clock(self) -> None:
        """Training time counts from now (evaluation and saving are not training time)."""
        self.clock = time.perf_counter()

    @property
    def learning_rate(self) -> float:
        """The rate of the last update."""
        return self.optimizer.param_groups[0]["lr"]

    def share_spent(self) -> float:
        return self.budget.share_spent(self.progress.completed_steps, self.seconds)

    def out_of_budget(self) -> bool:
        return self.budget.is_spent(self.progress.completed_steps, self.seconds)

    def log_row(self, epoch: int) -> dict[str, Any]:
        """The training row of the log interval that ends now (its one host synchronisation; `epoch` as the
        log calls it) with the compile time, once; the next interval starts."""
        row = self.interval.row(self.accelerator, self.progress, epoch, self.learning_rate, self.flops)
        self.interval = LogInterval(self.accelerator.device, self.progress.train_seconds)
        return row | self.compile_time.row()

    def save_checkpoint(self) -> Path:
        """Write the checkpoint of this update (on every process: a stream's positions are gathered from each;
        the batches add their position where `progress` does not hold it). Weights that are no longer finite
        stop the run instead: a checkpoint of them would rotate finite ones out under --checkpoints_total_limit."""
        check_weights_are_finite(self.accelerator, self, self.checkpoints.output_dir)
        position = self.batches.checkpoint_files(self.accelerator)  # a stream's; {} where `progress` holds it
        return self.checkpoints.write(self.accelerator, self.progress.completed_steps, self.progress.state_dict(), position)

    def resume(self, checkpoint: Path) -> None:
        """Continue from `checkpoint` (verified): model, optimizer, grad scaler and RNG states, the progress
        and the batches' position. Call on every process."""
        self.progress.load_state_dict(load_checkpoint(self.accelerator, checkpoint))
        self.batches.resume(checkpoint, self.accelerator)
        self.resumed_from = checkpoint


def setup_training(
    model: torch.nn.Module,
    batches: TrainingBatches,
    eval_loader: DataLoader,
    optimization: OptimizationSettings,
    accelerator: Accelerator,
    checkpoints: RunCheckpoints,
    flops: ModelFlops,
) -> tuple[Training, DataLoader]:
    """The training of `model` (already started: `hfbert.pretraining.run.build_model`): its optimizer,
    budget and schedule, everything prepared by accelerate (not yet resumed), with the prepared `eval_loader`.

    `model` is any module whose forward takes a batch plus `mlm_masked_rows_only=True` and returns `mlm_loss`,
    `nsp_loss`, `prediction_logits` at the masked rows (row-major order of labels != -100) and
    `seq_relationship_logits`, as `HfBertForPreTraining` does; on the static path (the default on CUDA) the
    batch also holds `masked_positions` (B, P) and labels are (B, P). This is the seam through which another
    model trains in the same pipeline (benchmarks/time_to_quality.py trains transformers' BERT this way)."""
    if optimization.compiles_update(accelerator.device.type):
        compile_model(model, optimization.torch_compile_mode)
    optimizer = build_optimizer(model, optimization, accelerator.device)
    budget = plan_budget(optimization, batches.batches_per_epoch, accelerator.num_processes)
    model, optimizer = accelerator.prepare(model, optimizer)
    batches.prepare(accelerator)
    eval_loader = accelerator.prepare_data_loader(eval_loader)
    schedule = LearningRateSchedule.of(optimization)
    training = Training(accelerator, model, optimizer, batches, budget, schedule, optimization, checkpoints, flops)
    return training, eval_loader
