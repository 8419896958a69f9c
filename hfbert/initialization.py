"""A structured starting point for pretraining: BERT's weights, with three attention heads that start useful.

A BERT initialised as transformers does (every matrix N(0, 0.02)) starts with near-uniform attention. On a
small corpus and a short budget it learns to copy the input at unmasked positions and the unigram
distribution, then stalls: held-out masked-token accuracy stays at that level and NSP memorises the training
articles. Both tasks need attention patterns that take thousands of updates to emerge from random weights:
looking at the neighbouring tokens (masked-token prediction) and finding the same word in the other segment
(next-sentence prediction, whose random pairs share few words). `init_structured_attention` writes those
patterns into the initial weights instead, as convolution-like initialisation does for vision transformers
(Zheng et al. 2024) and mimetic initialisation does with W_q^T W_k ~ I (Trockman & Kolter 2023):

- position embeddings become a cos/sin code at random frequencies in the first half of the hidden dims, so
  that p(i + delta) is a rotation of p(i); segment embeddings move to that half too;
- layer 0, head 0 attends to token i - 1 and layer 1, head 0 to token i + 1 (W_q rotates the code by delta);
- layer 0, head 1 attends to the same word: its queries and keys read only the second half of the dims,
  where words are and positions are not, so a word's twin in the other segment scores as high as itself.

Nothing else changes: the architecture, the parameter names and the other weights are BERT's, and every
weight trains from there. It is for pretraining from scratch only (`run_pretraining.py --attention_init`);
the model classes keep transformers' `_init_weights`. It works on any module with BERT's parameter layout,
hfbert's or transformers' `BertForPreTraining`.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import nn

from hfbert.errors import Refusal

# Gains that make the three heads attend almost only where intended at step 0 for 64-wide heads (every
# preset); narrower heads get proportionally larger ones so the attention logits keep their size.
OFFSET_GAIN = 2.0
MATCH_GAIN = 2.0
REFERENCE_HEAD_SIZE = 64


def check_structured_attention_config(config: Any) -> None:
    """Refuse a config the structured init cannot be laid onto, naming the fix."""
    heads, layers = config.num_attention_heads, config.num_hidden_layers
    head_size = config.hidden_size // heads
    if layers < 2 or heads < 2 or head_size % 2:
        raise Refusal(
            f"--attention_init structured needs at least 2 layers and 2 attention heads of even width (this "
            f"model has {layers} layers, {heads} heads of width {head_size}); pass --attention_init bert"
        )


def position_code(
    num_positions: int, hidden_size: int, amplitude: float, generator: torch.Generator
) -> tuple[torch.Tensor, torch.Tensor]:
    """(num_positions, hidden_size) embeddings: cos and sin of position * w at hidden_size / 4 random
    frequencies w in (0, pi) in the first half of the dims, zero in the second; code entries have standard
    deviation `amplitude * sqrt(2)`, the energy of a full-width N(0, amplitude) row. Random frequencies give a
    kernel p(i) . p(j) that peaks sharply at i = j and never repeats, unlike the geometric ones of sinusoidal
    encodings. Returns the code and the frequencies."""
    num_frequencies = hidden_size // 4
    frequencies = torch.rand(num_frequencies, generator=generator, dtype=torch.float64) * math.pi
    angles = torch.arange(num_positions, dtype=torch.float64)[:, None] * frequencies  # (P, F)
    code = torch.zeros(num_positions, hidden_size, dtype=torch.float64)
    code[:, :num_frequencies] = torch.cos(angles)
    code[:, num_frequencies : 2 * num_frequencies] = torch.sin(angles)
    return code * amplitude * 2.0, frequencies  # cos and sin have standard deviation 1/sqrt(2)


def offset_query_key(
    frequencies: torch.Tensor, offset: int, head_size: int, hidden_size: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """(head_size, hidden_size) query and key weights of a head that attends from position i to i + offset:
    keys read the cos/sin pairs of head_size / 2 frequencies, queries the same pairs rotated by offset * w,
    so that q_i . k_j = sum_w cos(w (i + offset - j)), largest at j = i + offset."""
    count = head_size // 2
    num_frequencies = hidden_size // 4
    rotation = frequencies[:count] * offset
    pair = torch.arange(count)
    cos_dim, sin_dim = pair, pair + num_frequencies  # where the code keeps cos(i w) and sin(i w)
    query = torch.zeros(head_size, hidden_size, dtype=torch.float64)
    key = torch.zeros(head_size, hidden_size, dtype=torch.float64)
    key[pair, cos_dim] = 1.0
    key[pair + count, sin_dim] = 1.0
    # cos((i + offset) w) = cos(i w) cos(offset w) - sin(i w) sin(offset w); sin likewise
    query[pair, cos_dim] = torch.cos(rotation)
    query[pair, sin_dim] = -torch.sin(rotation)
    query[pair + count, sin_dim] = torch.cos(rotation)
    query[pair + count, cos_dim] = torch.sin(rotation)
    return query, key


@torch.no_grad()
def init_structured_attention(
    model: nn.Module, seed: int, keep_random_rows: bool = False
) -> dict[str, torch.Tensor]:
    """Lay the structured start (see the module docstring) onto a freshly initialised BERT, in place.

    Args:
        model: a BERT with transformers' parameter layout (hfbert's or transformers' models, with or without
            a head); its config must pass `check_structured_attention_config`.
        seed: seed of the random frequencies (a private generator: the global RNG is left untouched).
        keep_random_rows: add the three heads' query/key rows to the random ones instead of replacing them,
            so that the model is left with BERT's initialisation there once they are taken away again
            (hfbert.pretraining.extras.attention_shaping.StructuredFade).

    Returns:
        The query/key components written, by parameter name: full-size tensors, zero outside the three heads.
    """
    config = model.config
    check_structured_attention_config(config)
    encoder = getattr(model, model.base_model_prefix, model)
    hidden, heads = config.hidden_size, config.num_attention_heads
    head_size = hidden // heads
    gain_scale = (REFERENCE_HEAD_SIZE / head_size) ** 0.25  # attention logits scale with sqrt(head_size)
    generator = torch.Generator().manual_seed(seed)
    embeddings = encoder.embeddings
    code, frequencies = position_code(
        embeddings.position_embeddings.num_embeddings, hidden, config.initializer_range, generator
    )
    embeddings.position_embeddings.weight.copy_(code)
    embeddings.token_type_embeddings.weight[:, hidden // 2 :] = 0.0  # segments live beside the positions
    # The same-word head's queries and keys read the first head_size dims of the second half (words, no
    # positions; head_size <= hidden / 2 with 2 or more heads), so that q_i . k_j is the words' similarity there.
    match = torch.zeros(head_size, hidden, dtype=torch.float64)
    match[torch.arange(head_size), hidden // 2 + torch.arange(head_size)] = 1.0
    heads_to_set = {  # (layer, head): (query, key, gain)
        (0, 0): (*offset_query_key(frequencies, -1, head_size, hidden), OFFSET_GAIN),
        (1, 0): (*offset_query_key(frequencies, +1, head_size, hidden), OFFSET_GAIN),
        (0, 1): (match, match, MATCH_GAIN),
    }
    names = {parameter: name for name, parameter in model.named_parameters()}
    components: dict[str, torch.Tensor] = {}
    for (layer, head), (query, key, gain) in heads_to_set.items():
        attention = encoder.encoder.layer[layer].attention.self
        rows = slice(head * head_size, (head + 1) * head_size)
        for role, pattern in (("query", query), ("key", key)):
            weight = getattr(attention, role).weight
            component = components.setdefault(names[weight], torch.zeros_like(weight))
            component[rows] = (pattern * gain * gain_scale).to(weight.dtype)
            weight[rows] = component[rows] + weight[rows] if keep_random_rows else component[rows]
            getattr(attention, role).bias[rows] = 0.0
    return components
