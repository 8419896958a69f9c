"""Evaluation and metrics: the sums every MLM/NSP metric is made of (kept on the device, read once per log or
evaluation), held-out evaluation and the log interval's row (its model FLOP/s and MFU: `hfbert.pretraining.flops`)."""

from __future__ import annotations

import logging
import math
from typing import Any

import torch
from accelerate import Accelerator
from torch.utils.data import DataLoader

from hfbert.checkpointing import TrainingProgress, last_finite_checkpoint_note
from hfbert.errors import RunFailure
from hfbert.modeling_hfbert import IGNORE_INDEX
from hfbert.pretraining.flops import ModelFlops
from hfbert.pretraining.training import TrainingState

logger = logging.getLogger(__name__)

# Sums that make every MLM/NSP metric, accumulated on the device and reduced once per log or evaluation.
STATISTICS = ("mlm_loss_sum", "mlm_correct", "masked_tokens", "nsp_loss_sum", "nsp_correct", "instances")


def batch_statistics(outputs: Any, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    """(6,) float64 sums of a batch (see STATISTICS), from the masked-rows outputs; no host synchronisation."""
    labels = batch["labels"]
    masked_tokens = (labels != IGNORE_INDEX).sum()
    predictions = outputs.prediction_logits.argmax(-1)  # (M,) dynamic path, (B, P) static path
    if predictions.shape != labels.shape:  # dynamic: rows in the row-major order of labels != -100
        labels = labels[labels != IGNORE_INDEX]
    if "next_sentence_label" in batch:
        nsp_labels = batch["next_sentence_label"]
        instances = (nsp_labels != IGNORE_INDEX).sum()  # padding rows of a filled-up batch carry -100
        nsp_loss_sum = outputs.nsp_loss.detach().float() * instances
        nsp_correct = (outputs.seq_relationship_logits.argmax(-1) == nsp_labels).sum()
    else:  # --objective mlm
        instances = nsp_loss_sum = nsp_correct = torch.zeros((), device=labels.device)
    mlm_loss_sum = outputs.mlm_loss.detach().float() * masked_tokens
    mlm_correct = (predictions == labels).sum()  # -100 never equals a prediction
    return torch.stack(
        [mlm_loss_sum, mlm_correct, masked_tokens, nsp_loss_sum, nsp_correct, instances]  # in STATISTICS' order
    ).double()


def metrics_from_statistics(totals: torch.Tensor, prefix: str) -> dict[str, float]:
    """MLM loss, accuracy, perplexity and NSP loss, accuracy from summed statistics."""
    mlm_sum, mlm_correct, masked, nsp_sum, nsp_correct, instances = totals.tolist()
    mlm_loss = mlm_sum / max(masked, 1.0)
    metrics = {
        f"{prefix}mlm_loss": mlm_loss,
        f"{prefix}mlm_accuracy": mlm_correct / max(masked, 1.0),
        f"{prefix}perplexity": math.exp(min(mlm_loss, 50.0)),
    }
    if instances > 0:  # none under --objective mlm: no NSP labels
        metrics[f"{prefix}nsp_loss"] = nsp_sum / instances
        metrics[f"{prefix}nsp_accuracy"] = nsp_correct / instances
    return metrics


@torch.no_grad()
def evaluate(model: torch.nn.Module, eval_loader: DataLoader, accelerator: Accelerator) -> dict[str, float]:
    """MLM loss, accuracy and perplexity, NSP loss and accuracy on the evaluation instances.

    The evaluation loader's masks come from its batches' draw ids (`hfbert.pretraining.batches`), so every evaluation of a
    run scores the same masked tokens and no RNG stream of training, CPU or CUDA, is touched. (With several
    processes, accelerate repeats a few instances to even out the last batch; they count twice.)
    """
    model.eval()
    totals = torch.zeros(len(STATISTICS), dtype=torch.float64, device=accelerator.device)
    for batch in eval_loader:
        totals += batch_statistics(model(**batch, mlm_masked_rows_only=True), batch)
    model.train()
    return metrics_from_statistics(accelerator.reduce(totals, "sum"), prefix="eval_")


class NonFiniteLoss(RunFailure, FloatingPointError):
    """The training loss (outside fp16, whose grad scaler skips such steps) or the weights became NaN or
    infinite."""


def diverged(what: str, precision: str, step: int, learning_rate: float, output_dir: str | None) -> NonFiniteLoss:
    """The stop of a run whose `what` ("The training loss became nan") happened at `step`: the advice, and the
    last checkpoint of `output_dir` whose weights are finite."""
    return NonFiniteLoss(
        f"{what} at step {step} (learning rate {learning_rate:.3g}, precision {precision}). Resuming would "
        "diverge again, as a resume keeps the learning rate, warmup and clipping: start a new run (a new "
        "--output_dir, or --overwrite_output_dir) with a lower --learning_rate, more --num_warmup_steps or "
        f"--max_grad_norm > 0.{'' if output_dir is None else last_finite_checkpoint_note(output_dir)}"
    )


def check_loss_is_finite(
    loss: float, precision: str, step: int, learning_rate: float, output_dir: str | None = None
) -> None:
    """Stop with advice on a NaN/inf loss; under fp16 the grad scaler skips such steps, so only warn."""
    if math.isfinite(loss):
        return
    if precision == "fp16":
        logger.warning(f"Non-finite loss ({loss}) at step {step}: the fp16 grad scaler skips this update.")
        return
    raise diverged(f"The training loss became {loss}", precision, step, learning_rate, output_dir)


def check_weights_are_finite(accelerator: Accelerator, state: TrainingState, output_dir: str) -> None:
    """Stop before a checkpoint or the final folder is written from weights that are no longer finite (rotation
    would then delete finite checkpoints, the final folder replace a finite one): one reduction on the device
    and one read, when one is written, not at every update; every process agrees."""
    parameters = list(state.model.parameters())
    finite = torch.stack([parameter.detach().isfinite().all() for parameter in parameters]).all()
    if accelerator.num_processes > 1:
        finite = accelerator.reduce(finite.float(), "min")
    if bool(finite):
        return
    named = accelerator.unwrap_model(state.model).named_parameters()
    where = next((name for name, parameter in named if not parameter.isfinite().all()), "another process's copy")
    what = f"The weights became non-finite ({where} holds nan or inf; no checkpoint or final folder of them is written)"
    learning_rate = state.optimizer.param_groups[0]["lr"]
    raise diverged(what, accelerator.mixed_precision, state.progress.completed_steps, learning_rate, output_dir)


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
