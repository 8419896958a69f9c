"""The optimization of the model to train: its optimizer, learning-rate schedule and step budget, prepared by
accelerate (`setup_training`). What a checkpoint holds is one explicit `TrainingState`."""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from typing import Any

import torch
from accelerate import Accelerator
from torch.utils.data import DataLoader

from hfbert.checkpointing import TrainingProgress
from hfbert.pretraining.batches import TrainingBatches
from hfbert.pretraining.settings import OptimizationSettings

logger = logging.getLogger(__name__)

UNBOUNDED_STEPS = 10**12  # the step budget of a run bounded by --max_train_seconds alone


def optimizer_parameter_groups(model: torch.nn.Module, weight_decay: float) -> list[dict[str, Any]]:
    """AdamW groups as in BERT: weight decay on weight matrices only, none on biases and LayerNorm."""
    decay, no_decay = [], []
    for name, parameter in model.named_parameters():
        if not parameter.requires_grad:
            continue
        (no_decay if parameter.ndim < 2 or "LayerNorm" in name else decay).append(parameter)
    return [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]


@dataclass(frozen=True)
class LearningRateSchedule:
    """Linear warmup to `peak`, then linear or cosine decay to zero, or constant.

    transformers' schedulers only know steps; a time budget needs the elapsed time too, so the decay follows
    decayed = max(step / max_steps, seconds / max_seconds) and reaches zero exactly when the budget that
    ends the run (steps or seconds) runs out (Izsak et al. 2021). It is a pure function of the checkpointed
    progress, so nothing about it needs saving.
    """

    peak: float
    warmup_steps: int
    max_steps: int
    max_seconds: float | None
    shape: str

    def __call__(self, step: int, seconds: float) -> float:
        if step < self.warmup_steps:
            return self.peak * (step + 1) / (self.warmup_steps + 1)
        if self.shape == "constant":
            return self.peak
        decayed = (step - self.warmup_steps) / max(1, self.max_steps - self.warmup_steps)
        if self.max_seconds is not None:
            decayed = max(decayed, seconds / self.max_seconds)
        decayed = min(decayed, 1.0)
        if self.shape == "cosine":
            return self.peak * 0.5 * (1.0 + math.cos(math.pi * decayed))
        return self.peak * (1.0 - decayed)


@dataclass
class TrainingState:
    """Exactly what a checkpoint holds (accelerate adds the RNG states): the prepared model and optimizer, the
    progress through the budget and the training batches, whose position follows from `progress` or is
    saved by them (`TrainingBatches.checkpoint_files`)."""

    model: torch.nn.Module
    optimizer: torch.optim.Optimizer
    progress: TrainingProgress
    batches: TrainingBatches


@dataclass(frozen=True)
class Budget:
    """How long the run trains: the schedule (a pure function of the progress), the planned updates and the
    epochs they span."""

    schedule: LearningRateSchedule
    max_train_steps: int
    num_epochs: int

    def share_spent(self, step: int, seconds: float) -> float:
        """The share of the budget spent after `step` updates and `seconds` of training, at most 1."""
        spent = step / self.max_train_steps
        if self.schedule.max_seconds is not None:
            spent = max(spent, seconds / self.schedule.max_seconds)
        return min(spent, 1.0)

    @property
    def planned_train_steps(self) -> int | None:
        """The updates planned, or None under a time budget alone (as many as fit: none are planned)."""
        return None if self.max_train_steps == UNBOUNDED_STEPS else self.max_train_steps

    def describe(self) -> str:
        """The budget in words, for the log: the limit that ends the run, never the stand-in step count."""
        seconds = self.schedule.max_seconds
        if self.planned_train_steps is None:
            return f"as many updates as fit in {seconds:g} s (--max_train_seconds)"
        if seconds is not None:
            return f"up to {self.max_train_steps} updates or {seconds:g} s, whichever runs out first"
        return f"up to {self.max_train_steps} updates"


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
    update: clipping compiles apart (`loop.compiled_clipping`); the fused AdamW step stays as it is, one kernel
    for all parameters that torch.optim keeps out of dynamo and that takes fp16's inf flag on the device."""
    # Compiled apart, not as one function with .backward(): dynamo traces a backward only with compiled autograd.
    logger.info(f"Compiling the update (torch.compile, mode {mode}): the first update and evaluation take longer.")
    # In place: the model stays itself, so checkpoints and the final folder keep its parameter names
    # (torch.compile's wrapper would prefix them with "_orig_mod.").
    model.compile(dynamic=False, fullgraph=True, mode=mode)


def plan_budget(
    optimization: OptimizationSettings, batches_per_epoch: int | None, num_processes: int
) -> Budget:
    """The updates of the run (--max_train_steps, or the epochs', or unbounded under a time budget alone)
    and the schedule laid out over them. `batches_per_epoch` None: a stream (--streaming), whose length is
    unknown; it is one endless epoch, and settings refuse it without --max_train_steps or --max_train_seconds."""
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
    schedule = LearningRateSchedule(
        peak=optimization.learning_rate,
        warmup_steps=optimization.num_warmup_steps,
        max_steps=max_train_steps,
        max_seconds=optimization.max_train_seconds,
        shape=optimization.lr_scheduler_type,
    )
    num_epochs = 1 if updates_per_epoch is None else math.ceil(max_train_steps / updates_per_epoch)
    return Budget(schedule, max_train_steps, num_epochs=num_epochs)


def setup_training(
    model: torch.nn.Module,
    batches: TrainingBatches,
    eval_loader: DataLoader,
    optimization: OptimizationSettings,
    accelerator: Accelerator,
) -> tuple[TrainingState, DataLoader, Budget]:
    """Optimizer, schedule and budget for `model` (already started: `hfbert.pretraining.run.build_model`),
    everything prepared by accelerate (not yet resumed).

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
    return TrainingState(model, optimizer, TrainingProgress(), batches), eval_loader, budget

