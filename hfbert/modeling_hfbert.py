"""BERT (Devlin et al., 2018, https://arxiv.org/abs/1810.04805), written from scratch as a Hugging Face model.

Top to bottom like the paper: embeddings -> post-LN encoder layers -> pooler -> pretraining heads (masked LM
+ next sentence prediction) -> fine-tuning heads. Parameter names are those of `transformers`' BERT
(`bert.encoder.layer.0.attention.self.query.weight`, `cls.predictions.decoder.weight`, ...), so weights move
between the two without renaming. This file and `configuration_hfbert.py` are copied into every checkpoint
for `trust_remote_code`: they import only each other.

Shapes in comments: B batch, T sequence length, d hidden size, nh heads, hs head size (d / nh), V vocab,
M number of masked positions in the batch, P masked slots per row (the static path).
"""

import copy
import os
from collections.abc import Callable
from dataclasses import dataclass
from itertools import pairwise
from typing import Literal, NamedTuple, get_args

import torch
import torch.nn.functional as F
from torch import nn
from transformers import PreTrainedModel
from transformers import initialization as init
from transformers.activations import ACT2FN
from transformers.dynamic_module_utils import custom_object_save
from transformers.loss.loss_utils import ForMaskedLMLoss, ForTokenClassification, fixed_cross_entropy
from transformers.masking_utils import create_bidirectional_mask
from transformers.modeling_layers import GradientCheckpointingLayer
from transformers.modeling_outputs import (
    BaseModelOutputWithPooling,
    MaskedLMOutput,
    ModelOutput,
    NextSentencePredictorOutput,
    QuestionAnsweringModelOutput,
    SequenceClassifierOutput,
    TokenClassifierOutput,
)
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS
from transformers.processing_utils import Unpack
from transformers.utils import TransformersKwargs, logging
from transformers.utils.generic import can_return_tuple

try:  # transformers >= 5.x names it capture_outputs; earlier 5.x releases check_model_inputs
    from transformers.utils.output_capturing import capture_outputs
except ImportError:  # pragma: no cover
    from transformers.utils.generic import check_model_inputs as capture_outputs

from .configuration_hfbert import HfBertConfig

logger = logging.get_logger(__name__)

IGNORE_INDEX = -100  # label of positions that carry no MLM loss, as everywhere in transformers

# Every Auto class that loads an hfbert folder; written whole into config.json so that a folder saved from
# any one head loads through all of them with trust_remote_code=True.
AUTO_MAP = {
    "AutoConfig": "configuration_hfbert.HfBertConfig",
    "AutoModel": "modeling_hfbert.HfBertModel",
    "AutoModelForPreTraining": "modeling_hfbert.HfBertForPreTraining",
    "AutoModelForMaskedLM": "modeling_hfbert.HfBertForMaskedLM",
    "AutoModelForNextSentencePrediction": "modeling_hfbert.HfBertForNextSentencePrediction",
    "AutoModelForSequenceClassification": "modeling_hfbert.HfBertForSequenceClassification",
    "AutoModelForTokenClassification": "modeling_hfbert.HfBertForTokenClassification",
    "AutoModelForQuestionAnswering": "modeling_hfbert.HfBertForQuestionAnswering",
}

# Backends whose mask is the boolean (B, 1, 1, T) one and that accept fewer queries than keys, so the last
# layer may run at [CLS] and the masked rows only. Others (flash, flex, hub kernels) get every position.
ROW_SUBSET_BACKENDS = ("eager", "sdpa")

# How attention treats padding (HfBertModel.forward's `attention_padding`): "mask" (transformers' way: a mask
# from attention_mask), or a speed path the caller asks for with what it knows of the batch on the host:
# "none" (no row is padded: no mask, so sdpa may take the flash kernel), "varlen" (rows right-padded: each row
# attends within its own tokens through cumulative sequence offsets, flash's variable-length form, no mask).
AttentionPadding = Literal["mask", "none", "varlen"]
ATTENTION_PADDING: tuple[str, ...] = get_args(AttentionPadding)


# ----------------------------------------------------------------------------------------------------------
# Input checks: bad input gets a message naming the value, not a device-side assert or an IndexError.
# ----------------------------------------------------------------------------------------------------------


def check_range(name: str, tensor: torch.Tensor | None, limit: int, field: str) -> None:
    """Raise ValueError unless every value of `tensor` lies in [0, limit).

    Host-sync policy: CPU tensors are checked eagerly (.item() on a CPU tensor costs no device sync); CUDA
    tensors with torch._assert_async (a device-side assert, no host sync); skipped under torch.compile and on
    other devices (the embedding lookup still fails there, with a less helpful message).
    """
    if tensor is None or tensor.numel() == 0 or torch.compiler.is_compiling():
        return
    message = (
        "{name} contains {value}, outside [0, {field}={limit}); check that the tokenizer matches the "
        "model (len(tokenizer) <= config.{field})."
    )
    if tensor.device.type == "cuda":
        in_range = ((tensor >= 0) & (tensor < limit)).all()
        torch._assert_async(in_range, message.format(name=name, value="a value", field=field, limit=limit))
    elif tensor.device.type == "cpu":
        low, high = (value.item() for value in tensor.aminmax())
        if low < 0 or high >= limit:
            bad = low if low < 0 else high
            raise ValueError(message.format(name=name, value=bad, field=field, limit=limit))


def check_inputs(
    config: HfBertConfig,
    input_ids: torch.Tensor | None,
    attention_mask: torch.Tensor | None,
    token_type_ids: torch.Tensor | None,
    position_ids: torch.Tensor | None,
    inputs_embeds: torch.Tensor | None,
) -> None:
    """Raise ValueError for inputs the model cannot embed (shapes always; values, see `check_range`)."""
    if (input_ids is None) == (inputs_embeds is None):
        raise ValueError("Pass exactly one of input_ids or inputs_embeds.")
    shape = input_ids.shape if input_ids is not None else inputs_embeds.shape[:-1]
    if len(shape) != 2:
        raise ValueError(f"input_ids must have shape (batch, seq_len), got {tuple(shape)}")
    for name, tensor in (("attention_mask", attention_mask), ("token_type_ids", token_type_ids)):
        if tensor is not None and tensor.shape != shape:
            raise ValueError(f"{name} has shape {tuple(tensor.shape)} but input_ids has shape {tuple(shape)}")
    if position_ids is not None and position_ids.shape[-1:] != shape[-1:]:  # (B, T), or (1, T) for every row
        raise ValueError(
            f"position_ids has shape {tuple(position_ids.shape)} but input_ids has shape {tuple(shape)}"
        )
    if shape[1] > config.max_position_embeddings:
        raise ValueError(
            f"Sequence length {shape[1]} exceeds max_position_embeddings={config.max_position_embeddings}; "
            f"truncate the input (tokenizer(..., truncation=True, max_length={config.max_position_embeddings}))."
        )
    check_range("input_ids", input_ids, config.vocab_size, "vocab_size")
    check_range("token_type_ids", token_type_ids, config.type_vocab_size, "type_vocab_size")
    check_range("position_ids", position_ids, config.max_position_embeddings, "max_position_embeddings")


def check_masked_positions(
    masked_positions: torch.Tensor, labels: torch.Tensor | None, input_shape: torch.Size
) -> None:
    """The static path's (B, P) positions and labels: shapes always, values as in `check_range`."""
    batch, seq_len = input_shape
    if masked_positions.dim() != 2 or masked_positions.size(0) != batch:
        raise ValueError(
            f"masked_positions must have shape (batch={batch}, max_predictions_per_seq), "
            f"got {tuple(masked_positions.shape)}"
        )
    if labels is not None and labels.shape != masked_positions.shape:
        raise ValueError(
            f"With masked_positions {tuple(masked_positions.shape)}, labels must have the same shape (one label "
            f"per slot, -100 on empty slots), got {tuple(labels.shape)}; see hfbert.pretraining.batches.masked_positions_from_labels()."
        )
    check_range("masked_positions", masked_positions, seq_len, "seq_len")


# `num_items_in_batch` (every head's forward): the labelled items of the whole accumulated batch over every
# process, as transformers' Trainer counts them (labels != -100). A loss given it is its sum over this batch
# divided by it, so the micro-batches of an accumulation add up to the loss of one batch of all their rows;
# without it, the mean over this batch (transformers' loss).
NumItems = torch.Tensor | int | None


def masked_lm_loss(
    logits: torch.Tensor, labels: torch.Tensor, training_path: bool, num_items_in_batch: NumItems = None
) -> torch.Tensor:
    """Cross-entropy of MLM logits against labels (-100 ignored), in fp32, over `num_items_in_batch` masked
    tokens where given. Otherwise, on the training paths (masked rows, static slots) the mean over this batch's
    masked tokens, and a batch in which nothing was masked adds zero loss, not 0/0 = NaN; elsewhere
    transformers' semantics (the mean over labelled tokens)."""
    if num_items_in_batch is None and training_path:
        num_items_in_batch = (labels != IGNORE_INDEX).sum().clamp(min=1)
    return ForMaskedLMLoss(logits, labels, logits.size(-1), num_items_in_batch)


def summed_loss(
    loss_function: Callable[..., torch.Tensor],
    source: torch.Tensor,
    target: torch.Tensor,
    num_items_in_batch: NumItems,
) -> torch.Tensor:
    """An elementwise loss (MSE, BCE) as transformers' fixed_cross_entropy takes cross-entropy: the mean, or the
    sum divided by `num_items_in_batch` where given."""
    if num_items_in_batch is None:
        return loss_function(source, target)
    return loss_function(source, target, reduction="sum") / num_items_in_batch


def next_sentence_loss(
    logits: torch.Tensor, labels: torch.Tensor, mlm_labels: torch.Tensor | None, num_items_in_batch: NumItems
) -> torch.Tensor:
    """NSP's cross-entropy in fp32, over `num_items_in_batch` rows where given. Beside MLM (`mlm_labels`),
    Trainer's one count is of the MLM labels, masked tokens rather than rows: this batch's NSP mean is then
    weighted by its share of those tokens, which is its share of the rows (and the update exact) when every
    micro-batch has the same masked tokens per row."""
    if num_items_in_batch is None or mlm_labels is None:
        return fixed_cross_entropy(logits.float(), labels.reshape(-1), num_items_in_batch)
    share = (mlm_labels != IGNORE_INDEX).sum() / num_items_in_batch
    return F.cross_entropy(logits.float(), labels.reshape(-1)) * share


def gather_positions(hidden_states: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """(B, T, d) gathered at `positions` (B, m) -> (B, m, d)."""
    return hidden_states.gather(1, positions[..., None].expand(-1, -1, hidden_states.size(-1)))


def attention_mask_for(
    config: HfBertConfig, implementation: str, attention_mask: torch.Tensor | None, embeddings: torch.Tensor
) -> torch.Tensor | None:
    """(B, T) with 1 = token, 0 = padding -> the mask in the form the attention backend takes: boolean (B, 1,
    1, T), True where a key may be attended to, for eager and sdpa (no host sync), otherwise whatever
    transformers builds for that backend (2-D for flash, a BlockMask for flex).

    Boolean rather than an additive -inf/-1e4 mask: nothing can overflow in fp16/bf16. A row that is all
    padding attends to every position instead of none, so its (meaningless) output stays finite, never NaN.
    """
    if attention_mask is None:
        return None
    keep = attention_mask.bool()
    keep = keep | ~keep.any(dim=-1, keepdim=True)
    if implementation in ROW_SUBSET_BACKENDS:
        return keep[:, None, None, :]
    return create_bidirectional_mask(config=config, inputs_embeds=embeddings, attention_mask=keep)


class RightPaddedRows(NamedTuple):
    """The varlen path's form of the padding, in place of a mask: (B,) int32 tokens per right-padded row,
    at least 1 (a row that is all padding attends to its first position, so its output stays finite)."""

    lengths: torch.Tensor


def check_attention_padding(
    attention_padding: str, attention_mask: torch.Tensor | None, implementation: str
) -> None:
    """Raise ValueError unless `attention_mask` is what `attention_padding` promises (all ones for "none",
    right-padded rows for "varlen"). Checked as `check_range` checks: on the CPU eagerly, on CUDA with
    torch._assert_async (no host sync), not under torch.compile."""
    if attention_padding not in ATTENTION_PADDING:
        raise ValueError(f"attention_padding must be one of {ATTENTION_PADDING}, got {attention_padding!r}")
    if attention_padding == "varlen" and implementation != "sdpa":
        raise ValueError(
            f"attention_padding='varlen' is the sdpa backend's unpadded form; this call uses {implementation!r} "
            "(output_attentions=True runs eager): pass attention_padding='mask'"
        )
    if attention_padding == "mask" or attention_mask is None or torch.compiler.is_compiling():
        return
    keep = attention_mask.bool()
    # "varlen": each row tokens, then padding, so no position is kept after one that is not
    promised = keep.all() if attention_padding == "none" else (keep[:, 1:] <= keep[:, :-1]).all()
    message = (
        f"attention_padding={attention_padding!r} promises "
        + ("no padding" if attention_padding == "none" else "right-padded rows (tokens, then padding)")
        + ", but attention_mask has {found}; pass attention_padding='mask'"
    )
    if keep.device.type == "cuda":
        torch._assert_async(promised, message.format(found="other rows"))
    elif keep.device.type == "cpu" and not promised.item():
        found = "padding" if attention_padding == "none" else "a row with padding before a token"
        raise ValueError(message.format(found=found))


def varlen_offsets(
    lengths: torch.Tensor, query_len: int, key_len: int, every_position: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    """Cumulative offsets (2B+1,) int32 of queries and keys in (B*Tq) and (B*T) flattened right-padded rows.

    Each row is two sequences, its tokens then its padding, so the rows stay where they are (no gather, shapes
    static). Keys: [0, len_0, T, T + len_1, 2T, ..., B*T]. Queries at every position split the same way (padding
    attends to padding: finite, unused); a subset of Tq positions (the last layer's rows) is all in the tokens
    sequence, [0, Tq, Tq, 2Tq, 2Tq, ..., B*Tq], so a position that is padding attends to the row's tokens, as
    with the mask.
    """
    sizes = torch.stack([lengths, key_len - lengths], dim=1).flatten()  # each row: tokens, then padding
    key_offsets = F.pad(sizes.cumsum(0, dtype=torch.int32), (1, 0))
    if every_position:
        return key_offsets, key_offsets
    sequence = torch.arange(2 * lengths.size(0) + 1, device=lengths.device, dtype=torch.int32)
    return (sequence + 1) // 2 * query_len, key_offsets


def varlen_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    rows: RightPaddedRows,
    every_position: bool,
    scaling: float,
    dropout: float,
) -> torch.Tensor:
    """(B, nh, Tq, hs) queries, (B, nh, T, hs) keys and values of right-padded rows -> (B, Tq, nh, hs), each
    query attending to its row's tokens only (see `varlen_offsets`), with no mask.

    On CUDA FlashAttention's variable-length kernel through the aten op sdpa's flash backend calls (the public
    torch.nn.attention.varlen.varlen_attn has no dropout, and BERT trains with attention dropout); on other
    devices sdpa per sequence, the same arithmetic, for tests.
    """
    batch, heads, query_len, head_size = query.shape
    key_len = key.size(2)
    query_offsets, key_offsets = varlen_offsets(rows.lengths, query_len, key_len, every_position)
    packed = [tensor.transpose(1, 2).reshape(-1, heads, head_size) for tensor in (query, key, value)]
    if query.device.type == "cuda":
        if query.dtype not in (torch.float16, torch.bfloat16):
            raise ValueError(
                f"attention_padding='varlen' runs FlashAttention, which takes float16 or bfloat16, not "
                f"{query.dtype}: train with mixed precision, or pass attention_padding='mask'"
            )
        # Private, kept: the public varlen_attn has no dropout (test_speed_paths checks the op's arguments).
        context = torch.ops.aten._flash_attention_forward(
            *packed, query_offsets, key_offsets, query_len, key_len, dropout, False, False, scale=scaling
        )[0]
    else:  # what the kernel computes, one sequence at a time: queries [q_i, q_i+1) attend to keys [k_i, k_i+1)
        query, key, value = (tensor.transpose(0, 1) for tensor in packed)  # (nh, B*Tq or B*T, hs)
        context = query.new_zeros(query.shape)
        bounds = zip(pairwise(query_offsets.tolist()), pairwise(key_offsets.tolist()), strict=True)
        for (query_start, query_end), (key_start, key_end) in bounds:
            if query_end == query_start:
                continue
            context[:, query_start:query_end] = F.scaled_dot_product_attention(
                query[:, query_start:query_end],
                key[:, key_start:key_end],
                value[:, key_start:key_end],
                dropout_p=dropout,
                scale=scaling,
            )
        context = context.transpose(0, 1)
    return context.view(batch, query_len, heads, head_size)


# ----------------------------------------------------------------------------------------------------------
# Attention: transformers' ALL_ATTENTION_FUNCTIONS (sdpa, flash_attention_2/3, flex_attention, hub kernels),
# with this eager function as the default.
# ----------------------------------------------------------------------------------------------------------


def eager_attention_forward(
    module: nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    scaling: float,
    dropout: float = 0.0,
    **kwargs: Unpack[TransformersKwargs],
) -> tuple[torch.Tensor, torch.Tensor]:
    """softmax(q k^T * scaling) v, written out so the attention probabilities can be returned.

    (B, nh, Tq, hs) queries, (B, nh, T, hs) keys and values -> (B, Tq, nh, hs) and (B, nh, Tq, T)
    probabilities. The mask is boolean, True = attend (see `attention_mask_for`).
    """
    scores = query @ key.transpose(-2, -1) * scaling  # (B, nh, Tq, T)
    if attention_mask is not None:
        scores = scores.masked_fill(~attention_mask, torch.finfo(scores.dtype).min)
    probs = F.dropout(scores.softmax(dim=-1), p=dropout, training=module.training)
    return (probs @ value).transpose(1, 2).contiguous(), probs


# ----------------------------------------------------------------------------------------------------------
# The encoder.
# ----------------------------------------------------------------------------------------------------------


class HfBertEmbeddings(nn.Module):
    """word + learned position + token type embeddings, then LayerNorm and dropout."""

    def __init__(self, config: HfBertConfig):
        super().__init__()
        self.word_embeddings = nn.Embedding(
            config.vocab_size, config.hidden_size, padding_idx=config.pad_token_id
        )
        self.position_embeddings = nn.Embedding(config.max_position_embeddings, config.hidden_size)
        self.token_type_embeddings = nn.Embedding(config.type_vocab_size, config.hidden_size)
        self.LayerNorm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.dropout = nn.Dropout(config.hidden_dropout_prob)

    def forward(
        self,
        input_ids: torch.Tensor | None,
        token_type_ids: torch.Tensor | None,
        position_ids: torch.Tensor | None,
        inputs_embeds: torch.Tensor | None,
    ) -> torch.Tensor:
        if inputs_embeds is None:
            inputs_embeds = self.word_embeddings(input_ids)  # (B, T, d)
        if position_ids is None:
            position_ids = torch.arange(inputs_embeds.size(1), device=inputs_embeds.device)[None, :]  # (1, T)
        if token_type_ids is None:
            # All segment A. Looked up through the module, not read as .weight[0]: with device_map offload the
            # weight lives on the meta device and only the module's own forward hook brings it in.
            token_type_ids = torch.zeros((1, 1), dtype=torch.long, device=inputs_embeds.device)
        embeddings = inputs_embeds + self.position_embeddings(position_ids)
        embeddings = embeddings + self.token_type_embeddings(token_type_ids)
        return self.dropout(self.LayerNorm(embeddings))


class HfBertSelfAttention(nn.Module):
    """Multi-head self-attention: project to queries, keys and values, attend per head, concatenate."""

    def __init__(self, config: HfBertConfig):
        super().__init__()
        self.config = config
        self.num_heads = config.num_attention_heads
        self.head_size = config.hidden_size // config.num_attention_heads
        self.scaling = self.head_size**-0.5
        self.is_causal = False  # read by transformers' sdpa / flash functions
        self.query = nn.Linear(config.hidden_size, config.hidden_size)
        self.key = nn.Linear(config.hidden_size, config.hidden_size)
        self.value = nn.Linear(config.hidden_size, config.hidden_size)
        self.dropout = nn.Dropout(config.attention_probs_dropout_prob)

    def forward(
        self,
        hidden_states: torch.Tensor,
        attention_mask: torch.Tensor | RightPaddedRows | None = None,
        queries: torch.Tensor | None = None,
        **kwargs: Unpack[TransformersKwargs],
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Attend from `queries` (B, Tq, d) (default: `hidden_states` itself) to `hidden_states` (B, T, d).

        Returns the (B, Tq, d) context and the attention probabilities (eager only, else None).
        """
        query, key, value = self.project(hidden_states, queries)  # (B, nh, Tq or T, hs)
        dropout = self.dropout.p if self.training else 0.0
        if isinstance(attention_mask, RightPaddedRows):
            every_position = queries is None
            context = varlen_attention(query, key, value, attention_mask, every_position, self.scaling, dropout)
            return context.flatten(2), None
        # output_attentions=True runs eager for that call (HfBertModel.forward warns once).
        implementation = "eager" if kwargs.get("output_attentions") else self.config._attn_implementation
        attention_interface: Callable = ALL_ATTENTION_FUNCTIONS.get_interface(
            implementation, eager_attention_forward
        )
        context, probs = attention_interface(
            self, query, key, value, attention_mask, dropout=dropout, scaling=self.scaling, **kwargs
        )  # (B, Tq, nh, hs)
        return context.flatten(2), probs

    def project(
        self, hidden_states: torch.Tensor, queries: torch.Tensor | None
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Queries at `queries` (None: at every position of `hidden_states`), keys and values at every
        position, each (B, nh, Tq or T, hs).

        One wide matmul where it can: d -> 3d for all three, or d -> 2d for keys and values when the queries
        are a subset. The weights stay three nn.Linear, concatenated at each call, so the saved names are
        transformers' (query, key, value) and nothing converts them. A projection whose call is more than its
        matmul runs as its own module: another class (quantized, an adapter), forward hooks (the
        pretraining loop's --cls_attention_spread), or a forward replaced by accelerate (offload: the weight
        stays on the meta device until that forward loads it).
        """
        modules = (self.query, self.key, self.value)
        if not all(map(is_plain_linear, modules)):
            query_input = hidden_states if queries is None else queries
            projected = [self.query(query_input), self.key(hidden_states), self.value(hidden_states)]
        elif queries is None:
            projected = fused_linear(hidden_states, modules)
        else:
            projected = [self.query(queries), *fused_linear(hidden_states, modules[1:])]
        return tuple(
            tensor.unflatten(-1, (self.num_heads, self.head_size)).transpose(1, 2) for tensor in projected
        )


def is_plain_linear(module: nn.Module) -> bool:
    """Calling `module` is F.linear with its weight and bias and nothing else."""
    hooked = module._forward_hooks or module._forward_pre_hooks or "forward" in vars(module)
    return type(module) is nn.Linear and not hooked and module.weight.device.type != "meta"


def fused_linear(inputs: torch.Tensor, modules: tuple[nn.Linear, ...]) -> list[torch.Tensor]:
    """`[module(inputs) for module in modules]` as one matmul with the weights and biases concatenated."""
    weight = torch.cat([module.weight for module in modules])
    bias = torch.cat([module.bias for module in modules])
    return list(F.linear(inputs, weight, bias).chunk(len(modules), dim=-1))


class HfBertResidualOutput(nn.Module):
    """dense -> dropout -> add the residual -> LayerNorm (post-LN). Closes both sub-layers of a layer."""

    def __init__(self, config: HfBertConfig, in_features: int):
        super().__init__()
        self.dense = nn.Linear(in_features, config.hidden_size)
        self.LayerNorm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.dropout = nn.Dropout(config.hidden_dropout_prob)

    def forward(self, hidden_states: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
        return self.LayerNorm(self.dropout(self.dense(hidden_states)) + residual)


class HfBertAttention(nn.Module):
    """Self-attention sub-layer with its residual and LayerNorm."""

    def __init__(self, config: HfBertConfig):
        super().__init__()
        self.self = HfBertSelfAttention(config)
        self.output = HfBertResidualOutput(config, config.hidden_size)

    def forward(
        self,
        hidden_states: torch.Tensor,
        attention_mask: torch.Tensor | RightPaddedRows | None,
        positions: torch.Tensor | None = None,
        **kwargs: Unpack[TransformersKwargs],
    ) -> torch.Tensor:
        """Outputs at every position, or at `positions` (B, m) only (all positions still serve as keys)."""
        queries = None if positions is None else gather_positions(hidden_states, positions)
        context, _ = self.self(hidden_states, attention_mask, queries, **kwargs)
        return self.output(context, hidden_states if queries is None else queries)


class HfBertIntermediate(nn.Module):
    """First half of the feed-forward sub-layer: dense d -> intermediate_size, then the activation."""

    def __init__(self, config: HfBertConfig):
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.intermediate_size)
        self.intermediate_act_fn = ACT2FN[config.hidden_act]

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        return self.intermediate_act_fn(self.dense(hidden_states))


class HfBertLayer(GradientCheckpointingLayer):
    """One post-LN encoder layer: attention -> add & norm -> feed-forward -> add & norm."""

    def __init__(self, config: HfBertConfig):
        super().__init__()
        self.attention = HfBertAttention(config)
        self.intermediate = HfBertIntermediate(config)
        self.output = HfBertResidualOutput(config, config.intermediate_size)

    def forward(
        self,
        hidden_states: torch.Tensor,
        attention_mask: torch.Tensor | RightPaddedRows | None,
        positions: torch.Tensor | None = None,
        **kwargs: Unpack[TransformersKwargs],
    ) -> torch.Tensor:
        """(B, T, d) -> (B, T, d), or (B, m, d) at `positions` (B, m) only."""
        attended = self.attention(hidden_states, attention_mask, positions, **kwargs)
        return self.output(self.intermediate(attended), attended)


class HfBertEncoder(nn.Module):
    def __init__(self, config: HfBertConfig):
        super().__init__()
        self.layer = nn.ModuleList([HfBertLayer(config) for _ in range(config.num_hidden_layers)])

    def forward(
        self,
        hidden_states: torch.Tensor,
        attention_mask: torch.Tensor | RightPaddedRows | None,
        last_layer_positions: torch.Tensor | None = None,
        **kwargs: Unpack[TransformersKwargs],
    ) -> torch.Tensor:
        for layer in self.layer[:-1]:
            hidden_states = layer(hidden_states, attention_mask, **kwargs)
        return self.layer[-1](hidden_states, attention_mask, last_layer_positions, **kwargs)


class HfBertPooler(nn.Module):
    """tanh(dense(h_[CLS])): the sentence representation the NSP and sequence-classification heads read."""

    def __init__(self, config: HfBertConfig):
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.hidden_size)

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        return torch.tanh(self.dense(hidden_states[:, 0]))  # (B, d)


# ----------------------------------------------------------------------------------------------------------
# Pretraining heads.
# ----------------------------------------------------------------------------------------------------------


class HfBertPredictionHeadTransform(nn.Module):
    def __init__(self, config: HfBertConfig):
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.hidden_size)
        self.transform_act_fn = ACT2FN[config.hidden_act]
        self.LayerNorm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        return self.LayerNorm(self.transform_act_fn(self.dense(hidden_states)))


class HfBertLMPredictionHead(nn.Module):
    """Masked-LM head: dense -> GELU -> LayerNorm -> decoder (weight tied to the word embeddings) + bias."""

    def __init__(self, config: HfBertConfig):
        super().__init__()
        self.transform = HfBertPredictionHeadTransform(config)
        self.decoder = nn.Linear(config.hidden_size, config.vocab_size)
        self.bias = nn.Parameter(torch.zeros(config.vocab_size))  # the decoder's bias, tied to it

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        return self.decoder(self.transform(hidden_states))  # (..., V)


class HfBertPreTrainingHeads(nn.Module):
    """The `cls` module: `predictions` (masked LM) and/or `seq_relationship` (next sentence, 2-way)."""

    def __init__(self, config: HfBertConfig, masked_lm: bool = True, next_sentence: bool = True):
        super().__init__()
        if masked_lm:
            self.predictions = HfBertLMPredictionHead(config)
        if next_sentence:
            self.seq_relationship = nn.Linear(config.hidden_size, 2)


# ----------------------------------------------------------------------------------------------------------
# Hugging Face model classes.
# ----------------------------------------------------------------------------------------------------------


class HfBertPreTrainedModel(PreTrainedModel):
    config_class = HfBertConfig
    config: HfBertConfig
    base_model_prefix = "bert"
    supports_gradient_checkpointing = True
    _supports_sdpa = True
    _supports_flash_attn = True
    _supports_flex_attn = True
    _supports_attention_backend = True
    _no_split_modules = ["HfBertEmbeddings", "HfBertLayer"]
    # What capture_outputs records for output_hidden_states / output_attentions.
    _can_record_outputs = {"hidden_states": HfBertLayer, "attentions": HfBertSelfAttention}

    @torch.no_grad()
    def _init_weights(self, module: nn.Module) -> None:
        """BERT's init: N(0, initializer_range) matrices and embeddings, zero biases and [PAD] row, unit LayerNorm."""
        super()._init_weights(module)  # covers Linear, Embedding (incl. padding row) and LayerNorm exactly so
        if isinstance(module, HfBertLMPredictionHead):
            init.zeros_(module.bias)

    def save_pretrained(self, save_directory, *args, **kwargs):
        map_every_auto_class(self.config)
        return super().save_pretrained(save_directory, *args, **kwargs)


def map_every_auto_class(config: HfBertConfig) -> None:
    """Name every Auto class in `config.auto_map`, not only the one a head is registered for, so that each loads
    a saved folder remotely."""
    config.auto_map = {**AUTO_MAP, **(getattr(config, "auto_map", None) or {})}


def save_model_files(config: HfBertConfig, save_directory: str | os.PathLike) -> None:
    """What `save_pretrained` writes beside the weights: config.json, naming every Auto class, and the model's
    code (this file and configuration_hfbert.py, copied by transformers' own `custom_object_save`). Beside weights
    written otherwise (a training checkpoint's model.safetensors), the folder loads as a saved model does, also
    where hfbert is not installed."""
    config = copy.deepcopy(config)  # the caller's config is left as it was
    map_every_auto_class(config)
    config.save_pretrained(save_directory)
    custom_object_save(HfBertPreTrainedModel, save_directory)


@dataclass
class HfBertForPreTrainingOutput(ModelOutput):
    """Output of `HfBertForPreTraining`.

    Attributes:
        loss: mlm_loss + nsp_loss (or the one part whose labels were given).
        mlm_loss: Masked-LM cross-entropy over positions whose label is not -100.
        nsp_loss: Next-sentence cross-entropy.
        prediction_logits: (B, T, V) logits, as in transformers. Only when asked for: (M, V) at the M masked
            positions in row-major order of `labels != -100` with `mlm_masked_rows_only=True` and labels;
            (B, P, V) at `masked_positions` when those are given.
        seq_relationship_logits: (B, 2); index 0 = B follows A, 1 = B is random.
        hidden_states: Embedding output and every layer's output, each (B, T, d), if asked for.
        attentions: Every layer's attention probabilities, each (B, nh, T, T), if asked for.
    """

    loss: torch.Tensor | None = None
    mlm_loss: torch.Tensor | None = None
    nsp_loss: torch.Tensor | None = None
    prediction_logits: torch.Tensor | None = None
    seq_relationship_logits: torch.Tensor | None = None
    hidden_states: tuple[torch.Tensor, ...] | None = None
    attentions: tuple[torch.Tensor, ...] | None = None


class HfBertModel(HfBertPreTrainedModel):
    """The bare encoder: embeddings, L post-LN layers and (optionally) the [CLS] pooler."""

    _input_embed_layer = "word_embeddings"  # get/set_input_embeddings find it in self.embeddings

    def __init__(self, config: HfBertConfig, add_pooling_layer: bool = True):
        super().__init__(config)
        self.embeddings = HfBertEmbeddings(config)
        self.encoder = HfBertEncoder(config)
        self.pooler = HfBertPooler(config) if add_pooling_layer else None
        self.post_init()

    @capture_outputs
    def forward(
        self,
        input_ids: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        token_type_ids: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None,
        inputs_embeds: torch.Tensor | None = None,
        last_layer_positions: torch.Tensor | None = None,
        attention_padding: AttentionPadding = "mask",
        **kwargs: Unpack[TransformersKwargs],
    ) -> BaseModelOutputWithPooling | tuple:
        """Encode a batch.

        Args:
            input_ids: (B, T) token ids in [0, vocab_size).
            attention_mask: (B, T), 1 for tokens and 0 for padding.
            token_type_ids: (B, T) segment ids, 0 for sentence A and 1 for sentence B.
            position_ids: (B, T) or (1, T); default 0..T-1.
            inputs_embeds: (B, T, d) instead of input_ids.
            last_layer_positions: (B, m): run the last layer at these positions only (keys and values still
                cover every position), so `last_hidden_state` is (B, m, d) and the pooler reads column 0. The
                masked-LM heads' speed path; eager and sdpa only.
            attention_padding: "mask" (default): padding from `attention_mask`, as in transformers. The speed
                paths, for a caller that knows its batch on the host (the training loop): "none", no row is
                padded, so no mask is built (sdpa may then run the flash kernel); "varlen", rows are right-padded
                and each attends within its own tokens, flash's variable-length kernel on CUDA (fp16/bf16; sdpa
                only, no attentions), no mask. Outputs at padded positions are meaningless on every path and
                differ between them; all others agree. An `attention_mask` that breaks the promise is refused.
            kwargs: `output_hidden_states`, `output_attentions` (with a non-eager backend this call runs
                eager attention, with a warning), `return_dict`, and transformers' attention kwargs.
        """
        config = self.config
        check_inputs(config, input_ids, attention_mask, token_type_ids, position_ids, inputs_embeds)
        implementation = config._attn_implementation
        if kwargs.get("output_attentions", config.output_attentions):
            if implementation != "eager":
                logger.warning_once(
                    f"output_attentions=True needs eager attention; this model uses {implementation!r}, so "
                    "these calls run eager attention (slower). Load the model with attn_implementation='eager' "
                    "to make that the default."
                )
            implementation = "eager"
            kwargs["output_attentions"] = True  # tells every HfBertSelfAttention to run eager
        if last_layer_positions is not None and implementation not in ROW_SUBSET_BACKENDS:
            raise ValueError(f"last_layer_positions needs eager or sdpa attention, not {implementation!r}")

        check_attention_padding(attention_padding, attention_mask, implementation)

        hidden_states = self.embeddings(input_ids, token_type_ids, position_ids, inputs_embeds)  # (B, T, d)
        if attention_padding == "mask":
            mask = attention_mask_for(config, implementation, attention_mask, hidden_states)
        elif attention_padding == "none" or attention_mask is None:
            mask = None
        else:
            mask = RightPaddedRows(attention_mask.sum(dim=-1, dtype=torch.int32).clamp(min=1))
        hidden_states = self.encoder(hidden_states, mask, last_layer_positions, **kwargs)
        pooled = self.pooler(hidden_states) if self.pooler is not None else None
        return BaseModelOutputWithPooling(last_hidden_state=hidden_states, pooler_output=pooled)


class HfBertMaskedLMMixin:
    """The masked-LM part shared by HfBertForPreTraining and HfBertForMaskedLM (their `cls.predictions`)."""

    _tied_weights_keys = {
        "cls.predictions.decoder.weight": "bert.embeddings.word_embeddings.weight",
        "cls.predictions.decoder.bias": "cls.predictions.bias",
    }

    def get_output_embeddings(self) -> nn.Linear:
        return self.cls.predictions.decoder

    def set_output_embeddings(self, new_embeddings: nn.Linear) -> None:
        self.cls.predictions.decoder = new_embeddings
        self.cls.predictions.bias = new_embeddings.bias

    def last_layer_positions(
        self,
        labels: torch.Tensor | None,
        mlm_masked_rows_only: bool = True,
        masked_positions: torch.Tensor | None = None,
        every_position: bool = False,
    ) -> torch.Tensor | None:
        """(B, m) positions whose last-layer output the losses read: [CLS] (for the pooler) then the masked
        ones. The last layer then runs at these m of T positions only, since no loss reads the others (the
        mini preset's training step gets 16% faster). None when every position is needed: the dense head, a
        backend other than eager/sdpa, or hidden states / attentions asked for (`every_position`).

        Static path (`masked_positions` (B, P) given): [CLS] then the P slots, m = 1 + P, a static shape.
        Dynamic path (`mlm_masked_rows_only` and labels (B, T)): [CLS] and the masked positions ascending,
        each row padded with unmasked positions (label -100) to the longest row (a data-dependent shape).
        """
        if every_position or self.config._attn_implementation not in ROW_SUBSET_BACKENDS:
            return None
        if masked_positions is not None:
            return F.pad(masked_positions, (1, 0))  # [CLS] is position 0
        if labels is None or not mlm_masked_rows_only:
            return None
        needed = labels != IGNORE_INDEX
        needed[:, 0] = True
        longest = int(needed.sum(dim=1).max())
        return torch.argsort((~needed).int(), dim=1, stable=True)[:, :longest]  # needed ones first, in order

    def masked_lm(
        self,
        inputs: tuple[torch.Tensor | None, ...],
        labels: torch.Tensor | None,
        mlm_masked_rows_only: bool,
        masked_positions: torch.Tensor | None,
        num_items_in_batch: NumItems,
        kwargs: dict,
    ) -> tuple[BaseModelOutputWithPooling, torch.Tensor, torch.Tensor | None]:
        """Encode `inputs` (HfBertModel.forward's first five arguments), then MLM logits and loss: (encoder
        outputs, logits, loss).

        Dense by default: (B, T, V) logits. With `masked_positions` (static) or `mlm_masked_rows_only` and
        labels (dynamic), the last layer and the head run on the masked rows alone: the dense head spends most
        of a small model's FLOPs on positions whose loss is ignored.
        """
        config = self.config
        if masked_positions is not None:
            input_ids, inputs_embeds = inputs[0], inputs[-1]
            shape = input_ids.shape if input_ids is not None else inputs_embeds.shape[:-1]
            check_masked_positions(masked_positions, labels, shape)
        every_position = bool(
            kwargs.get("output_attentions", config.output_attentions)
            or kwargs.get("output_hidden_states", config.output_hidden_states)
        )
        positions = self.last_layer_positions(labels, mlm_masked_rows_only, masked_positions, every_position)
        outputs = self.bert(*inputs, last_layer_positions=positions, return_dict=True, **kwargs)
        rows = outputs.last_hidden_state  # dense: (B, T, d) -> (B, T, V) logits
        if masked_positions is not None:  # static: (B, P, d) -> (B, P, V)
            # with positions, the last layer ran at [CLS] + the P slots
            rows = rows[:, 1:] if positions is not None else gather_positions(rows, masked_positions)
        elif labels is not None and mlm_masked_rows_only:  # dynamic masked rows: (M, d) -> (M, V)
            if positions is not None:
                labels = labels.gather(1, positions)  # (B, m), the labels of the rows the last layer computed
            masked = labels != IGNORE_INDEX
            rows, labels = rows[masked], labels[masked]  # (M, d), (M,)
        logits = self.cls.predictions(rows)
        loss = None
        if labels is not None:
            training_path = mlm_masked_rows_only or masked_positions is not None
            loss = masked_lm_loss(logits, labels, training_path, num_items_in_batch)
        return outputs, logits, loss


class HfBertForPreTraining(HfBertMaskedLMMixin, HfBertPreTrainedModel):
    """BERT with both pretraining heads: masked LM over tokens and next sentence prediction on [CLS]."""

    def __init__(self, config: HfBertConfig):
        super().__init__(config)
        self.bert = HfBertModel(config)
        self.cls = HfBertPreTrainingHeads(config)
        self.post_init()

    @can_return_tuple
    def forward(
        self,
        input_ids: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        token_type_ids: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None,
        inputs_embeds: torch.Tensor | None = None,
        labels: torch.Tensor | None = None,
        next_sentence_label: torch.Tensor | None = None,
        mlm_masked_rows_only: bool = False,
        masked_positions: torch.Tensor | None = None,
        num_items_in_batch: NumItems = None,
        **kwargs: Unpack[TransformersKwargs],
    ) -> HfBertForPreTrainingOutput | tuple:
        """Pretraining forward pass.

        Args:
            labels: (B, T) MLM targets, -100 where no loss is taken; (B, P) with `masked_positions`.
            next_sentence_label: (B,) 0 if segment B follows segment A, 1 if B is random.
            mlm_masked_rows_only: With labels, run the last layer at [CLS] and the masked rows and the MLM head
                at the masked rows only (same loss and gradients as the dense head, much less work);
                `prediction_logits` is then (M, V), in row-major order of `labels != -100`.
            masked_positions: (B, P) positions of the MLM targets, `labels` (B, P) with -100 on empty slots
                (see `hfbert.pretraining.batches.masked_positions_from_labels`): the same path with static shapes (torch.compile);
                `prediction_logits` is (B, P, V).
            num_items_in_batch: transformers' Trainer's count of the accumulated batch's `labels`, its masked
                tokens: MLM's loss is its sum over them, NSP's mean is weighted by this batch's share of them
                (see `next_sentence_loss`). Without it each loss is this batch's mean.
            Other arguments: see `HfBertModel.forward`.
        """
        inputs = (input_ids, attention_mask, token_type_ids, position_ids, inputs_embeds)
        outputs, logits, mlm_loss = self.masked_lm(
            inputs, labels, mlm_masked_rows_only, masked_positions, num_items_in_batch, kwargs
        )
        seq_relationship_logits = self.cls.seq_relationship(outputs.pooler_output)  # (B, 2)
        nsp_loss = None
        if next_sentence_label is not None:
            nsp_loss = next_sentence_loss(
                seq_relationship_logits, next_sentence_label, labels, num_items_in_batch
            )
        parts = [part for part in (mlm_loss, nsp_loss) if part is not None]
        return HfBertForPreTrainingOutput(
            loss=sum(parts) if parts else None,
            mlm_loss=mlm_loss,
            nsp_loss=nsp_loss,
            prediction_logits=logits,
            seq_relationship_logits=seq_relationship_logits,
            hidden_states=outputs.hidden_states,
            attentions=outputs.attentions,
        )


class HfBertForMaskedLM(HfBertMaskedLMMixin, HfBertPreTrainedModel):
    """BERT with the masked-LM head alone (what `pipeline("fill-mask")` loads)."""

    def __init__(self, config: HfBertConfig):
        super().__init__(config)
        self.bert = HfBertModel(config, add_pooling_layer=False)
        self.cls = HfBertPreTrainingHeads(config, next_sentence=False)
        self.post_init()

    @can_return_tuple
    def forward(
        self,
        input_ids: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        token_type_ids: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None,
        inputs_embeds: torch.Tensor | None = None,
        labels: torch.Tensor | None = None,
        mlm_masked_rows_only: bool = False,
        masked_positions: torch.Tensor | None = None,
        num_items_in_batch: NumItems = None,
        **kwargs: Unpack[TransformersKwargs],
    ) -> MaskedLMOutput | tuple:
        """Masked-LM forward pass; `logits` are (B, T, V), or (M, V) / (B, P, V) as in HfBertForPreTraining;
        the loss is over `num_items_in_batch` masked tokens where given."""
        inputs = (input_ids, attention_mask, token_type_ids, position_ids, inputs_embeds)
        outputs, logits, loss = self.masked_lm(
            inputs, labels, mlm_masked_rows_only, masked_positions, num_items_in_batch, kwargs
        )
        return MaskedLMOutput(
            loss=loss, logits=logits, hidden_states=outputs.hidden_states, attentions=outputs.attentions
        )


class HfBertForNextSentencePrediction(HfBertPreTrainedModel):
    """BERT with the next-sentence head alone."""

    def __init__(self, config: HfBertConfig):
        super().__init__(config)
        self.bert = HfBertModel(config)
        self.cls = HfBertPreTrainingHeads(config, masked_lm=False)
        self.post_init()

    @can_return_tuple
    def forward(
        self,
        input_ids: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        token_type_ids: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None,
        inputs_embeds: torch.Tensor | None = None,
        labels: torch.Tensor | None = None,
        num_items_in_batch: NumItems = None,
        **kwargs: Unpack[TransformersKwargs],
    ) -> NextSentencePredictorOutput | tuple:
        """`labels` (B,): 0 if segment B follows segment A, 1 if it is random; the loss is over
        `num_items_in_batch` rows where given."""
        outputs = self.bert(
            input_ids, attention_mask, token_type_ids, position_ids, inputs_embeds, return_dict=True, **kwargs
        )
        logits = self.cls.seq_relationship(outputs.pooler_output)  # (B, 2)
        loss = None
        if labels is not None:
            loss = next_sentence_loss(logits, labels, None, num_items_in_batch)
        return NextSentencePredictorOutput(
            loss=loss, logits=logits, hidden_states=outputs.hidden_states, attentions=outputs.attentions
        )


class HfBertClassifierModel(HfBertPreTrainedModel):
    """BERT with dropout and a linear classifier on the pooled [CLS] representation or on every token
    (`per_token`); a subclass names that, its output class and its loss."""

    per_token: bool
    output_class: type[ModelOutput]

    def __init__(self, config: HfBertConfig):
        super().__init__(config)
        self.bert = HfBertModel(config, add_pooling_layer=not self.per_token)
        dropout = config.classifier_dropout  # None: hidden_dropout_prob
        self.dropout = nn.Dropout(config.hidden_dropout_prob if dropout is None else dropout)
        self.classifier = nn.Linear(config.hidden_size, config.num_labels)
        self.post_init()

    @can_return_tuple
    def forward(
        self,
        input_ids: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        token_type_ids: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None,
        inputs_embeds: torch.Tensor | None = None,
        labels: torch.Tensor | None = None,
        num_items_in_batch: NumItems = None,
        **kwargs: Unpack[TransformersKwargs],
    ) -> SequenceClassifierOutput | TokenClassifierOutput | tuple:
        """`labels`: see the subclass; the loss is over `num_items_in_batch` labelled items where given (rows,
        rows x labels for multi-label, labelled tokens)."""
        outputs = self.bert(
            input_ids, attention_mask, token_type_ids, position_ids, inputs_embeds, return_dict=True, **kwargs
        )
        features = outputs.last_hidden_state if self.per_token else outputs.pooler_output
        logits = self.classifier(self.dropout(features))  # (B, T, num_labels) or (B, num_labels)
        loss = self.classification_loss(logits, labels, num_items_in_batch) if labels is not None else None
        return self.output_class(
            loss=loss, logits=logits, hidden_states=outputs.hidden_states, attentions=outputs.attentions
        )


class HfBertForSequenceClassification(HfBertClassifierModel):
    """BERT with a linear classifier (or regressor, num_labels=1) on the pooled [CLS] representation.

    `labels` (B,) class ids, (B,) floats for regression, or (B, num_labels) multi-label targets.
    """

    per_token = False
    output_class = SequenceClassifierOutput

    def classification_loss(
        self, logits: torch.Tensor, labels: torch.Tensor, num_items_in_batch: NumItems
    ) -> torch.Tensor:
        """transformers' sequence-classification loss, picked by `config.problem_type` (inferred once); over
        `num_items_in_batch` in every problem type (transformers' own takes it for single-label only)."""
        config = self.config
        if config.problem_type is None:
            if config.num_labels == 1:
                config.problem_type = "regression"
            elif labels.dtype in (torch.long, torch.int):
                config.problem_type = "single_label_classification"
            else:
                config.problem_type = "multi_label_classification"
        if config.problem_type == "regression":
            targets = labels.float().reshape(logits.shape[:-1])
            return summed_loss(F.mse_loss, logits.squeeze(-1).float(), targets, num_items_in_batch)
        if config.problem_type == "single_label_classification":
            flat_logits = logits.float().view(-1, config.num_labels)
            return fixed_cross_entropy(flat_logits, labels.view(-1), num_items_in_batch)
        return summed_loss(
            F.binary_cross_entropy_with_logits, logits.float(), labels.float(), num_items_in_batch
        )


class HfBertForTokenClassification(HfBertClassifierModel):
    """BERT with a linear classifier on every token (NER, tagging).

    `labels` (B, T) class ids, -100 where no loss is taken.
    """

    per_token = True
    output_class = TokenClassifierOutput

    def classification_loss(
        self, logits: torch.Tensor, labels: torch.Tensor, num_items_in_batch: NumItems
    ) -> torch.Tensor:
        return ForTokenClassification(logits, labels, self.config, num_items_in_batch=num_items_in_batch)


class HfBertForQuestionAnswering(HfBertPreTrainedModel):
    """BERT with a span head (start and end logits per token) for extractive QA."""

    def __init__(self, config: HfBertConfig):
        super().__init__(config)
        self.bert = HfBertModel(config, add_pooling_layer=False)
        self.qa_outputs = nn.Linear(config.hidden_size, config.num_labels)
        self.post_init()

    @can_return_tuple
    def forward(
        self,
        input_ids: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        token_type_ids: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None,
        inputs_embeds: torch.Tensor | None = None,
        start_positions: torch.Tensor | None = None,
        end_positions: torch.Tensor | None = None,
        num_items_in_batch: NumItems = None,
        **kwargs: Unpack[TransformersKwargs],
    ) -> QuestionAnsweringModelOutput | tuple:
        """`start_positions` / `end_positions` (B,): token index of the answer span; out-of-range ones are ignored.
        The loss is over `num_items_in_batch` rows where given (transformers' Trainer, which counts `labels`
        only, passes none: it divides each micro-batch's mean by the accumulation steps instead)."""
        outputs = self.bert(
            input_ids, attention_mask, token_type_ids, position_ids, inputs_embeds, return_dict=True, **kwargs
        )
        logits = self.qa_outputs(outputs.last_hidden_state)  # (B, T, 2)
        start_logits, end_logits = (part.squeeze(-1).contiguous() for part in logits.split(1, dim=-1))
        # transformers' span loss (positions outside the sequence carry none), in fp32; None without both labels
        loss = self.loss_function(
            start_logits.float(),
            end_logits.float(),
            start_positions,
            end_positions,
            num_items_in_batch=num_items_in_batch,
        )
        return QuestionAnsweringModelOutput(
            loss=loss,
            start_logits=start_logits,
            end_logits=end_logits,
            hidden_states=outputs.hidden_states,
            attentions=outputs.attentions,
        )
