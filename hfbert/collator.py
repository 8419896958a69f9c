"""Batches for BERT pretraining: dynamic padding plus dynamic MLM masking, drawn fresh for every batch."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
from transformers import DataCollatorForLanguageModeling


@dataclass
class DataCollatorForPretraining(DataCollatorForLanguageModeling):
    """Pads NSP instances and masks them for MLM, the way google-research/bert masks (80/10/10).

    Call it with a list of features, dicts with ``input_ids``, ``token_type_ids`` and ``next_sentence_label``
    (the rows of :func:`hfbert.pretraining_data.build_nsp_instances`); it returns long tensors ``input_ids``,
    ``attention_mask``, ``token_type_ids``, ``labels`` and ``next_sentence_label``. Rows are right-padded to the
    longest row of the batch rounded up to ``pad_to_multiple_of`` (padding: ``attention_mask`` 0,
    ``token_type_ids`` 0, ``labels`` -100). Of the tokens that are neither special (``[CLS]``, ``[SEP]``,
    ``[UNK]``, ...) nor padding, a fraction ``mlm_probability`` is chosen; a chosen token
    becomes ``[MASK]`` with probability ``mask_replace_prob``, a random non-special token with probability
    ``random_replace_prob``, and stays unchanged otherwise. ``labels`` hold the original id at chosen
    positions and -100 elsewhere.

    Padding and argument checks come from :class:`transformers.DataCollatorForLanguageModeling`; only the
    masking is replaced, because the parent draws random replacements from the whole vocabulary (special
    tokens included). All randomness comes from torch's global RNG, so restoring the RNG state (as accelerate
    does on resume) reproduces the masks exactly, provided the masks are drawn at step time: a DataLoader that
    prefetches batches would draw them ahead of a checkpoint. The training loop therefore pads in the loader
    and calls `torch_mask_tokens` itself (`hfbert.training.masked_batch`).
    """

    mlm_probability: float = 0.15
    pad_to_multiple_of: int | None = 8
    # Fixed: MLM only, whole-token masking, torch tensors, and no private generator (global RNG, see above).
    mlm: bool = field(default=True, init=False)
    whole_word_mask: bool = field(default=False, init=False)
    return_tensors: str = field(default="pt", init=False)
    seed: int | None = field(default=None, init=False)

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.tokenizer.pad_token_id is None:
            raise ValueError("The tokenizer has no pad token; BERT pretraining needs one, e.g. '[PAD]'")
        if self.pad_to_multiple_of is not None and self.pad_to_multiple_of < 1:
            raise ValueError(
                f"pad_to_multiple_of {self.pad_to_multiple_of} must be a positive integer, or None for no rounding"
            )
        special_ids = torch.tensor(sorted(set(self.tokenizer.all_special_ids)), dtype=torch.long)
        vocabulary = torch.arange(len(self.tokenizer), dtype=torch.long)
        self._special_ids = special_ids
        self._non_special_ids = vocabulary[~torch.isin(vocabulary, special_ids)]

    def torch_mask_tokens(
        self,
        inputs: torch.Tensor,
        special_tokens_mask: torch.Tensor | None = None,
        offset_mapping: Any | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Choose and replace tokens in ``inputs`` (in place); returns ``(inputs, labels)``."""
        labels = inputs.clone()
        never_chosen = torch.isin(inputs, self._special_ids)  # covers [CLS], [SEP] and [PAD]
        if special_tokens_mask is not None:
            never_chosen |= special_tokens_mask.bool()
        probabilities = torch.full(inputs.shape, self.mlm_probability).masked_fill_(never_chosen, 0.0)
        chosen = torch.bernoulli(probabilities).bool()
        labels[~chosen] = -100

        replace_with_mask = torch.bernoulli(torch.full(inputs.shape, self.mask_replace_prob)).bool() & chosen
        inputs[replace_with_mask] = self.tokenizer.mask_token_id

        # Of the chosen tokens not replaced by [MASK], this share gets a random token; the rest stay unchanged.
        random_share = (
            self.random_replace_prob / (1.0 - self.mask_replace_prob) if self.random_replace_prob > 0 else 0.0
        )
        replace_with_random = (
            torch.bernoulli(torch.full(inputs.shape, random_share)).bool() & chosen & ~replace_with_mask
        )
        random_picks = torch.randint(len(self._non_special_ids), (int(replace_with_random.sum()),))
        inputs[replace_with_random] = self._non_special_ids[random_picks]
        return inputs, labels
