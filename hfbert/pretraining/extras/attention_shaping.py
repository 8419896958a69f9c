"""Two ways pretraining leaves attention that few-label fine-tuning can use (benchmarks/results/downstream.md).

The structured start (hfbert.initialization) makes a small model learn in minutes, but the sharp patterns it
writes into the attention queries and keys (previous token, next token, same word) stay in the saved folder,
and a classifier fine-tuned on a few hundred labels then reads little more than the first words: the main
job's folder fine-tuned 8.5 points worse than random weights on the tweets' tuning split. Two levers, each a
flag of `run_pretraining.py`, each a loop callback (`hfbert.pretraining.callbacks`; the model classes are
untouched):

- `StructuredFade` (`--structured_attention_fade F`): the start's patterns fade linearly to nothing over the
  first fraction F of the budget. The random BERT rows under them and what training learned stay, so the
  folder's queries and keys are the model's own.
- `ClsAttentionSpread` (`--cls_attention_spread W`): a penalty of W times how far [CLS]'s attention is from
  spreading over the whole input (one minus its entropy over the log of the row's length, averaged over
  layers, heads and rows). [CLS]'s row serves no MLM loss, so this costs masked-word prediction nothing; it is
  the vector a classifier reads.
"""

from __future__ import annotations

import torch
from torch import nn

from hfbert.pretraining.callbacks import Callback
from hfbert.pretraining.training import TrainingProgress


class StructuredFade(Callback):
    """Subtracts the structured start's query/key components from the weights as the share of the budget spent
    goes from 0 to `fraction`: after an update at share p the weights hold max(0, 1 - p / fraction) of them.

    The scale is a pure function of the checkpointed progress, so a resumed run, whose weights already carry
    the scale of its checkpoint, continues the same subtraction (`on_fit_start`). Made with the model, before
    it is moved to its device: the components follow the parameters there at the start of training."""

    def __init__(self, model: nn.Module, components: dict[str, torch.Tensor], fraction: float):
        if not 0 < fraction <= 1:
            raise ValueError(f"fraction must be in (0, 1], got {fraction}")
        parameters = dict(model.named_parameters())  # moving a module to a device keeps its Parameter objects
        self.pairs = [(parameters[name], component) for name, component in components.items()]
        self.fraction = fraction
        self.applied_scale = 1.0

    def scale(self, share: float) -> float:
        """The share of the components the weights hold once `share` (in [0, 1]) of the budget is spent."""
        return max(0.0, 1.0 - share / self.fraction)

    def on_fit_start(self, progress: TrainingProgress, share: float) -> None:
        """The weights were started, or loaded from a checkpoint written at `share` of the budget."""
        self.pairs = [(parameter, component.to(parameter)) for parameter, component in self.pairs]
        self.applied_scale = self.scale(share)

    @torch.no_grad()
    def on_update(self, step: int, share: float) -> None:
        """Bring the weights to the scale of `share` (after each optimizer update; no host sync)."""
        scale = self.scale(share)
        if scale < self.applied_scale:  # the share spent never goes back; a scale is never added again
            for parameter, component in self.pairs:
                parameter.sub_((self.applied_scale - scale) * component)
            self.applied_scale = scale


class ClsAttentionSpread(Callback):
    """Forward hooks on every layer's query and key projections; `penalty` turns what the last training
    forward captured into weight * mean over layers of mean over rows and heads of (1 - H(p) / log n), p the
    attention of the row's query at position 0 ([CLS], first in the last layer's queries too) over its n
    unpadded keys. Hooks are not traced by torch.compile the same way: settings refuse the combination."""

    def __init__(self, model: nn.Module, weight: float):
        encoder = getattr(model, model.base_model_prefix, model)
        self.weight = weight
        self.num_heads = model.config.num_attention_heads
        self.attentions = [layer.attention.self for layer in encoder.encoder.layer]
        self.captured: dict[nn.Module, torch.Tensor] = {}  # projection -> its output in the last training forward
        self.handles = [
            projection.register_forward_hook(self._capture)
            for attention in self.attentions
            for projection in (attention.query, attention.key)
        ]

    def _capture(self, module: nn.Module, inputs: tuple, output: torch.Tensor) -> None:
        if module.training:  # evaluation forwards keep nothing
            self.captured[module] = output

    def penalty(self, attention_mask: torch.Tensor) -> torch.Tensor:
        """The weighted penalty of the last training forward, whose (B, T) `attention_mask` marks real keys."""
        valid = attention_mask.bool()
        log_lengths = valid.sum(-1).float().log()[:, None]  # (B, 1)
        total = 0.0
        for attention in self.attentions:
            query = self.captured.pop(attention.query)[:, 0].unflatten(-1, (self.num_heads, -1))  # (B, H, hs)
            key = self.captured.pop(attention.key).unflatten(-1, (self.num_heads, -1))  # (B, T, H, hs)
            logits = torch.einsum("bhs,bths->bht", query, key) * query.size(-1) ** -0.5
            log_probs = logits.masked_fill(~valid[:, None, :], float("-inf")).log_softmax(-1)
            entropy = -(log_probs.exp() * log_probs.masked_fill(~valid[:, None, :], 0.0)).sum(-1)  # (B, H)
            total = total + (1 - entropy / log_lengths).mean()
        return self.weight * total / len(self.attentions)

    def loss(self, loss: torch.Tensor, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        """`loss` plus the penalty of the forward that made it."""
        return loss + self.penalty(batch["attention_mask"])

    def remove(self) -> None:
        for handle in self.handles:
            handle.remove()


__all__ = ["ClsAttentionSpread", "StructuredFade"]
