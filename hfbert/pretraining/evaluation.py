"""The held-out evaluation, and the sums every MLM/NSP metric is made of (kept on the device, read once per
log row or evaluation: the training rows are made of them too, `hfbert.pretraining.training.LogInterval`)."""

from __future__ import annotations

import math
from typing import Any

import torch
from accelerate import Accelerator
from torch.utils.data import DataLoader

from hfbert.modeling_hfbert import IGNORE_INDEX

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
