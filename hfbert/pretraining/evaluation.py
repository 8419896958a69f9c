"""Evaluation and metrics: the sums every MLM/NSP metric is made of (kept on the device, read once per log or
evaluation), held-out evaluation, the training window's log row, and the model FLOPs per token behind the
logged MFU (the one formula: benchmarks use it from here)."""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from typing import Any

import torch
from accelerate import Accelerator
from torch.utils.data import DataLoader

from hfbert.checkpointing import TrainingProgress, last_finite_checkpoint_note
from hfbert.errors import RunFailure
from hfbert.modeling_hfbert import IGNORE_INDEX

logger = logging.getLogger(__name__)

# Dense fp16/bf16 tensor-core peaks from the vendors' datasheets, by a substring of the CUDA device name.
# The MFU is logged only where the peak is known (a CPU's depends on its clock, cores and ISA).
DATASHEET_PEAK_FLOPS = {
    "H200": 989e12,
    "H100 SXM": 989e12,
    "H100 NVL": 835e12,
    "H100": 756e12,
    "A100": 312e12,
}


def flops_per_token(config: Any, model: torch.nn.Module, seq_len: float, head_fraction: float) -> float:
    """6 N_nonembedding + 12 L d T + 6 (d^2 + d V) f_head (forward + backward FLOPs per token); N_nonembedding
    is the encoder's parameters (`model.bert.encoder`), f_head the share of positions the MLM head computes
    (hfbert's masked rows: masked tokens / tokens; transformers' every position: 1)."""
    non_embedding = sum(p.numel() for p in model.bert.encoder.parameters())
    d, vocab = config.hidden_size, config.vocab_size
    return (
        6 * non_embedding
        + 12 * config.num_hidden_layers * d * seq_len
        + 6 * (d * d + d * vocab) * head_fraction
    )


def datasheet_peak_flops(device: torch.device, precision: str) -> float | None:
    """The device's dense fp16/bf16 peak FLOP/s (`DATASHEET_PEAK_FLOPS`), or None where it is not known."""
    if device.type != "cuda" or precision not in ("fp16", "bf16"):
        return None
    name = torch.cuda.get_device_name(device)
    return next((peak for key, peak in DATASHEET_PEAK_FLOPS.items() if key in name), None)


@dataclass
class ModelFlops:
    """What the log rows' model FLOP/s and MFU are computed from: the model (unwrapped), its config and the
    peak FLOP/s of one process's device (None: unknown, no MFU logged)."""

    config: Any
    model: torch.nn.Module
    peak_flops_per_process: float | None

    def utilization(
        self, tokens: float, totals: torch.Tensor, seconds: float, num_processes: int
    ) -> dict[str, float]:
        """model_flops_per_second (and mfu) for `tokens` non-padding tokens in `seconds` with window `totals`."""
        instances, masked = (
            totals[STATISTICS.index("instances")].item(),
            totals[STATISTICS.index("masked_tokens")].item(),
        )
        if not hasattr(self.model, "bert") or tokens == 0 or instances == 0:
            return {}
        flops = (
            tokens * flops_per_token(self.config, self.model, tokens / instances, masked / tokens) / seconds
        )
        row = {"model_flops_per_second": flops}
        if self.peak_flops_per_process is not None:
            row["mfu"] = flops / (self.peak_flops_per_process * num_processes)
        return row


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
    return torch.stack(
        [
            outputs.mlm_loss.detach().float() * masked_tokens,
            (predictions == labels).sum(),  # -100 never equals a prediction
            masked_tokens,
            nsp_loss_sum,
            nsp_correct,
            instances,
        ]
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
    if instances == 0:  # --objective mlm: no NSP labels
        return metrics
    return metrics | {
        f"{prefix}nsp_loss": nsp_sum / max(instances, 1.0),
        f"{prefix}nsp_accuracy": nsp_correct / max(instances, 1.0),
    }


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
    """The training loss became NaN or infinite (outside fp16, whose grad scaler skips such steps)."""


def check_loss_is_finite(
    loss: torch.Tensor, precision: str, step: int, learning_rate: float, output_dir: str | None = None
) -> None:
    """Stop with advice on a NaN/inf loss; under fp16 the grad scaler skips such steps, so only warn."""
    if torch.isfinite(loss):
        return
    if precision == "fp16":
        logger.warning(
            f"Non-finite loss ({loss.item()}) at step {step}: the fp16 grad scaler skips this update."
        )
        return
    raise NonFiniteLoss(
        f"The training loss became {loss.item()} at step {step} (learning rate {learning_rate:.3g}, precision "
        f"{precision}). Resuming would diverge again, as a resume keeps the learning rate, warmup and clipping: "
        "start a new run (a new --output_dir, or --overwrite_output_dir) with a lower --learning_rate, more "
        f"--num_warmup_steps or --max_grad_norm > 0.{'' if output_dir is None else last_finite_checkpoint_note(output_dir)}"
    )


@dataclass
class TrainingWindow:
    """Training statistics since the last log row, kept on the device (read once per logging interval)."""

    totals: torch.Tensor
    tokens: torch.Tensor
    loss: torch.Tensor
    grad_norm: torch.Tensor  # the largest finite gradient norm before clipping
    start_seconds: float
    batches: int = 0
    clipped_updates: int = 0  # updates whose norm clipping computed (none without --max_grad_norm)

    @classmethod
    def start(cls, device: torch.device, seconds: float) -> TrainingWindow:
        zeros = torch.zeros(len(STATISTICS), dtype=torch.float64, device=device)
        scalar = torch.zeros((), dtype=torch.float64, device=device)
        return cls(totals=zeros, tokens=scalar, loss=scalar.clone(), grad_norm=scalar.clone(), start_seconds=seconds)

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
