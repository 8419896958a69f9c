"""BERT (Devlin et al., 2018, https://arxiv.org/abs/1810.04805), written from scratch as a Hugging Face model.

Top to bottom like the paper: embeddings -> post-LN encoder layers -> pooler -> pretraining heads (masked LM
+ next sentence prediction) -> fine-tuning heads. Parameter names are those of `transformers`' BERT
(`bert.encoder.layer.0.attention.self.query.weight`, `cls.predictions.decoder.weight`, ...), so weights move
between the two without renaming. This file and `configuration_hfbert.py` are copied into every checkpoint
for `trust_remote_code`: they import only each other.

Shapes in comments: B batch, T sequence length, d hidden size, nh heads, hs head size (d / nh), V vocab,
M number of masked positions.
"""

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn
from transformers import PreTrainedModel
from transformers import initialization as init
from transformers.activations import ACT2FN
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

from .configuration_hfbert import HfBertConfig

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


# ----------------------------------------------------------------------------------------------------------
# Input checks: bad input gets a message naming the value, not a device-side assert or an IndexError.
# ----------------------------------------------------------------------------------------------------------


def check_inputs(
    config: HfBertConfig,
    input_ids: torch.Tensor | None,
    attention_mask: torch.Tensor | None,
    token_type_ids: torch.Tensor | None,
    position_ids: torch.Tensor | None,
    inputs_embeds: torch.Tensor | None,
) -> None:
    """Raise ValueError for inputs the model cannot embed; runs eagerly (skipped inside torch.compile)."""
    if (input_ids is None) == (inputs_embeds is None):
        raise ValueError("Pass exactly one of input_ids or inputs_embeds.")
    shape = input_ids.shape if input_ids is not None else inputs_embeds.shape[:-1]
    if len(shape) != 2:
        raise ValueError(f"input_ids must have shape (batch, seq_len), got {tuple(shape)}")
    for name, tensor in (
        ("attention_mask", attention_mask),
        ("token_type_ids", token_type_ids),
        ("position_ids", position_ids),
    ):
        if (
            tensor is not None
            and tensor.shape != shape
            and not (name == "position_ids" and tensor.shape[-1:] == shape[-1:])
        ):
            raise ValueError(f"{name} has shape {tuple(tensor.shape)} but input_ids has shape {tuple(shape)}")
    if shape[1] > config.max_position_embeddings:
        raise ValueError(
            f"Sequence length {shape[1]} exceeds max_position_embeddings={config.max_position_embeddings}; "
            f"truncate the input (tokenizer(..., truncation=True, max_length={config.max_position_embeddings}))."
        )
    if torch.compiler.is_compiling():  # data-dependent checks would break the graph; eager calls check
        return
    ranges = (
        ("input_ids", input_ids, config.vocab_size, "vocab_size"),
        ("token_type_ids", token_type_ids, config.type_vocab_size, "type_vocab_size"),
        ("position_ids", position_ids, config.max_position_embeddings, "max_position_embeddings"),
    )
    for name, tensor, limit, field in ranges:
        if tensor is None or tensor.numel() == 0:
            continue
        low, high = tensor.min().item(), tensor.max().item()
        if low < 0 or high >= limit:
            bad = low if low < 0 else high
            raise ValueError(
                f"{name} contains {bad}, outside [0, {field}={limit}); check that the tokenizer matches the "
                f"model (len(tokenizer) <= config.{field})."
            )


def expand_attention_mask(attention_mask: torch.Tensor | None) -> torch.Tensor | None:
    """(B, T) with 1 = token, 0 = padding -> boolean (B, 1, 1, T), True where a key may be attended to.

    Boolean rather than an additive -inf/-1e4 mask: nothing can overflow in fp16/bf16. A row that is all
    padding attends to every position instead of none, so its (meaningless) output stays finite, never NaN.
    """
    if attention_mask is None:
        return None
    keep = attention_mask.bool()
    keep = keep | ~keep.any(dim=-1, keepdim=True)
    return keep[:, None, None, :]


def gather_positions(hidden_states: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """(B, T, d) gathered at `positions` (B, m) -> (B, m, d)."""
    return hidden_states.gather(1, positions[..., None].expand(-1, -1, hidden_states.size(-1)))


# ----------------------------------------------------------------------------------------------------------
# Attention backends, chosen by config._attn_implementation.
# ----------------------------------------------------------------------------------------------------------


def eager_attention(
    query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, mask: torch.Tensor | None, dropout: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """softmax(q k^T / sqrt(hs)) v, written out so the attention probabilities can be returned."""
    scores = query @ key.transpose(-2, -1) * query.size(-1) ** -0.5  # (B, nh, T, T)
    if mask is not None:
        scores = scores.masked_fill(~mask, torch.finfo(scores.dtype).min)
    probs = scores.softmax(dim=-1)
    context = F.dropout(probs, p=dropout) @ value  # (B, nh, T, hs)
    return context, probs


def sdpa_attention(
    query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, mask: torch.Tensor | None, dropout: float
) -> tuple[torch.Tensor, None]:
    """torch's fused scaled_dot_product_attention (flash / memory-efficient / math kernel chosen by torch)."""
    return F.scaled_dot_product_attention(query, key, value, attn_mask=mask, dropout_p=dropout), None


ATTENTION_BACKENDS: dict[str, Callable[..., tuple[torch.Tensor, torch.Tensor | None]]] = {
    "eager": eager_attention,
    "sdpa": sdpa_attention,
}


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
        seq_len = inputs_embeds.size(1)
        if position_ids is None:
            position_ids = torch.arange(seq_len, device=inputs_embeds.device)[None, :]  # (1, T)
        embeddings = inputs_embeds + self.position_embeddings(position_ids)
        if token_type_ids is None:
            embeddings = embeddings + self.token_type_embeddings.weight[0]  # all segment A
        else:
            embeddings = embeddings + self.token_type_embeddings(token_type_ids)
        return self.dropout(self.LayerNorm(embeddings))


class HfBertSelfAttention(nn.Module):
    """Multi-head self-attention: project to queries, keys and values, attend per head, concatenate."""

    def __init__(self, config: HfBertConfig):
        super().__init__()
        self.config = config
        self.num_heads = config.num_attention_heads
        self.head_size = config.hidden_size // config.num_attention_heads
        self.query = nn.Linear(config.hidden_size, config.hidden_size)
        self.key = nn.Linear(config.hidden_size, config.hidden_size)
        self.value = nn.Linear(config.hidden_size, config.hidden_size)
        self.dropout = nn.Dropout(config.attention_probs_dropout_prob)

    def forward(
        self, hidden_states: torch.Tensor, mask: torch.Tensor | None, queries: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Attend from `queries` (B, Tq, d) (usually `hidden_states` itself) to `hidden_states` (B, T, d)."""
        batch, query_len, _ = queries.shape
        query = self.query(queries).view(batch, query_len, self.num_heads, self.head_size).transpose(1, 2)
        heads = (batch, hidden_states.size(1), self.num_heads, self.head_size)
        key = self.key(hidden_states).view(heads).transpose(1, 2)  # (B, nh, T, hs)
        value = self.value(hidden_states).view(heads).transpose(1, 2)
        attend = ATTENTION_BACKENDS[self.config._attn_implementation]
        dropout = self.dropout.p if self.training else 0.0
        context, probs = attend(query, key, value, mask, dropout)  # (B, nh, Tq, hs)
        context = context.transpose(1, 2).reshape(batch, query_len, -1)  # (B, Tq, d)
        return context, probs


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
        self, hidden_states: torch.Tensor, mask: torch.Tensor | None, positions: torch.Tensor | None
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Outputs at every position, or at `positions` (B, m) only (all positions still serve as keys)."""
        queries = hidden_states if positions is None else gather_positions(hidden_states, positions)
        context, probs = self.self(hidden_states, mask, queries)
        return self.output(context, queries), probs


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
        self, hidden_states: torch.Tensor, mask: torch.Tensor | None, positions: torch.Tensor | None
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """(B, T, d) -> (B, T, d), or (B, m, d) at `positions` (B, m) only."""
        attended, probs = self.attention(hidden_states, mask, positions)
        return self.output(self.intermediate(attended), attended), probs


class HfBertEncoder(nn.Module):
    def __init__(self, config: HfBertConfig):
        super().__init__()
        self.layer = nn.ModuleList([HfBertLayer(config) for _ in range(config.num_hidden_layers)])


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
    _no_split_modules = ["HfBertEmbeddings", "HfBertLayer"]

    @classmethod
    def _can_set_attn_implementation(cls) -> bool:
        # The backend is looked up in ATTENTION_BACKENDS at every forward, so set_attn_implementation() is safe.
        return True

    @torch.no_grad()
    def _init_weights(self, module: nn.Module) -> None:
        """BERT's init: N(0, initializer_range) matrices and embeddings, zero biases and [PAD] row, unit LayerNorm."""
        super()._init_weights(module)  # covers Linear, Embedding (incl. padding row) and LayerNorm exactly so
        if isinstance(module, HfBertLMPredictionHead):
            init.zeros_(module.bias)

    def save_pretrained(self, save_directory, *args, **kwargs):
        # Every Auto class, not only the one this head is registered for, must load the folder remotely.
        self.config.auto_map = {**AUTO_MAP, **(getattr(self.config, "auto_map", None) or {})}
        return super().save_pretrained(save_directory, *args, **kwargs)


@dataclass
class HfBertForPreTrainingOutput(ModelOutput):
    """Output of `HfBertForPreTraining`.

    Attributes:
        loss: mlm_loss + nsp_loss (or the one part whose labels were given).
        mlm_loss: Masked-LM cross-entropy over positions whose label is not -100.
        nsp_loss: Next-sentence cross-entropy.
        prediction_logits: (B, T, V) logits; (M, V) at the M masked positions, in row-major order of
            `labels != -100`, when labels were given and `config.mlm_masked_rows_only` is set.
        seq_relationship_logits: (B, 2); index 0 = B follows A, 1 = B is random.
        hidden_states: Embedding output and every layer's output, each (B, T, d), if asked for.
        attentions: Every layer's attention probabilities, each (B, nh, T, T), if asked for (eager only).
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

    def __init__(self, config: HfBertConfig, add_pooling_layer: bool = True):
        super().__init__(config)
        self.embeddings = HfBertEmbeddings(config)
        self.encoder = HfBertEncoder(config)
        self.pooler = HfBertPooler(config) if add_pooling_layer else None
        self.post_init()

    def get_input_embeddings(self) -> nn.Embedding:
        return self.embeddings.word_embeddings

    def set_input_embeddings(self, value: nn.Embedding) -> None:
        self.embeddings.word_embeddings = value

    def forward(
        self,
        input_ids: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        token_type_ids: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None,
        inputs_embeds: torch.Tensor | None = None,
        output_attentions: bool | None = None,
        output_hidden_states: bool | None = None,
        return_dict: bool | None = None,
        **kwargs,
    ) -> BaseModelOutputWithPooling | tuple:
        """Encode a batch.

        Args:
            input_ids: (B, T) token ids in [0, vocab_size).
            attention_mask: (B, T), 1 for tokens and 0 for padding.
            token_type_ids: (B, T) segment ids, 0 for sentence A and 1 for sentence B.
            position_ids: (B, T) or (1, T); default 0..T-1.
            inputs_embeds: (B, T, d) instead of input_ids.
            output_attentions: Return each layer's attention probabilities (needs attn_implementation="eager").
            output_hidden_states: Return the embedding output and every layer's output.
            return_dict: Return a ModelOutput (default) or a tuple.
        """
        output = self.encode(
            input_ids,
            attention_mask,
            token_type_ids,
            position_ids,
            inputs_embeds,
            output_attentions,
            output_hidden_states,
        )
        return return_as(output, return_dict, self.config)

    def encode(
        self,
        input_ids: torch.Tensor | None,
        attention_mask: torch.Tensor | None,
        token_type_ids: torch.Tensor | None,
        position_ids: torch.Tensor | None,
        inputs_embeds: torch.Tensor | None,
        output_attentions: bool | None,
        output_hidden_states: bool | None,
        last_layer_positions: torch.Tensor | None = None,
    ) -> BaseModelOutputWithPooling:
        """`forward` as a ModelOutput. With `last_layer_positions` (B, m) the last layer runs at those positions
        only (keys and values still cover every position), so `last_hidden_state` is (B, m, d) and the
        pooler reads column 0: the masked-LM heads' masked-rows path, see `last_layer_positions()`."""
        config = self.config
        output_attentions = config.output_attentions if output_attentions is None else output_attentions
        output_hidden_states = (
            config.output_hidden_states if output_hidden_states is None else output_hidden_states
        )
        if output_attentions and config._attn_implementation != "eager":
            raise ValueError(
                f"output_attentions=True needs the eager attention backend, but this model uses "
                f"{config._attn_implementation!r}; load it with attn_implementation='eager' or call "
                "model.set_attn_implementation('eager')."
            )
        check_inputs(config, input_ids, attention_mask, token_type_ids, position_ids, inputs_embeds)

        hidden_states = self.embeddings(input_ids, token_type_ids, position_ids, inputs_embeds)  # (B, T, d)
        mask = expand_attention_mask(attention_mask)  # (B, 1, 1, T) bool
        all_hidden_states = (hidden_states,) if output_hidden_states else None
        all_attentions = () if output_attentions else None
        last = len(self.encoder.layer) - 1
        for index, layer in enumerate(self.encoder.layer):
            hidden_states, probs = layer(hidden_states, mask, last_layer_positions if index == last else None)
            if output_hidden_states:
                all_hidden_states += (hidden_states,)
            if output_attentions:
                all_attentions += (probs,)
        pooled = self.pooler(hidden_states) if self.pooler is not None else None

        return BaseModelOutputWithPooling(
            last_hidden_state=hidden_states,
            pooler_output=pooled,
            hidden_states=all_hidden_states,
            attentions=all_attentions,
        )


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
        self, labels: torch.Tensor | None, output_attentions: bool | None, output_hidden_states: bool | None
    ) -> torch.Tensor | None:
        """(B, m) positions whose last-layer output the losses read: [CLS] (for the pooler) and the masked
        ones, ascending, each row padded with unmasked positions (label -100) to the longest. The last layer
        then runs at these m of T positions only, since no loss reads the others (the mini preset's training
        step gets 16% faster). None when every position is needed: no labels, the dense head, or hidden
        states / attentions asked for."""
        config = self.config
        every_position = (config.output_attentions if output_attentions is None else output_attentions) or (
            config.output_hidden_states if output_hidden_states is None else output_hidden_states
        )
        if labels is None or not config.mlm_masked_rows_only or every_position:
            return None
        needed = labels != IGNORE_INDEX
        needed[:, 0] = True
        longest = int(needed.sum(dim=1).max())
        return torch.argsort((~needed).int(), dim=1, stable=True)[:, :longest]  # needed ones first, in order

    def masked_lm(
        self,
        input_ids: torch.Tensor | None,
        attention_mask: torch.Tensor | None,
        token_type_ids: torch.Tensor | None,
        position_ids: torch.Tensor | None,
        inputs_embeds: torch.Tensor | None,
        labels: torch.Tensor | None,
        output_attentions: bool | None,
        output_hidden_states: bool | None,
    ) -> tuple[BaseModelOutputWithPooling, torch.Tensor, torch.Tensor | None]:
        """Encode, then MLM logits and loss: (encoder outputs, logits, loss).

        With labels and `mlm_masked_rows_only`, the last layer and the head run on the masked rows alone: the
        dense head spends most of a small model's FLOPs on positions whose loss is ignored.
        """
        positions = self.last_layer_positions(labels, output_attentions, output_hidden_states)
        outputs = self.bert.encode(
            input_ids,
            attention_mask,
            token_type_ids,
            position_ids,
            inputs_embeds,
            output_attentions,
            output_hidden_states,
            last_layer_positions=positions,
        )
        sequence_output = outputs.last_hidden_state
        if labels is None:
            return outputs, self.cls.predictions(sequence_output), None  # (B, T, V)
        if positions is not None:
            labels = labels.gather(1, positions)  # (B, m), the labels of the rows the last layer computed
        if self.config.mlm_masked_rows_only:
            masked = labels != IGNORE_INDEX
            sequence_output, labels = sequence_output[masked], labels[masked]  # (M, d), (M,)
        logits = self.cls.predictions(sequence_output)  # (M, V) or (B, T, V)
        loss = F.cross_entropy(logits.reshape(-1, logits.size(-1)).float(), labels.reshape(-1))
        return outputs, logits, loss


def return_as(output: ModelOutput, return_dict: bool | None, config: HfBertConfig) -> ModelOutput | tuple:
    """A head's output as a ModelOutput or, with return_dict=False, a tuple of its non-None fields."""
    return output if (config.return_dict if return_dict is None else return_dict) else output.to_tuple()


class HfBertForPreTraining(HfBertMaskedLMMixin, HfBertPreTrainedModel):
    """BERT with both pretraining heads: masked LM over tokens and next sentence prediction on [CLS]."""

    def __init__(self, config: HfBertConfig):
        super().__init__(config)
        self.bert = HfBertModel(config)
        self.cls = HfBertPreTrainingHeads(config)
        self.post_init()

    def forward(
        self,
        input_ids: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        token_type_ids: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None,
        inputs_embeds: torch.Tensor | None = None,
        labels: torch.Tensor | None = None,
        next_sentence_label: torch.Tensor | None = None,
        output_attentions: bool | None = None,
        output_hidden_states: bool | None = None,
        return_dict: bool | None = None,
        **kwargs,
    ) -> HfBertForPreTrainingOutput | tuple:
        """Pretraining forward pass.

        Args:
            labels: (B, T) MLM targets; -100 where no loss is taken.
            next_sentence_label: (B,) 0 if segment B follows segment A, 1 if B is random.
            Other arguments: see `HfBertModel.forward`.
        """
        outputs, prediction_logits, mlm_loss = self.masked_lm(
            input_ids,
            attention_mask,
            token_type_ids,
            position_ids,
            inputs_embeds,
            labels,
            output_attentions,
            output_hidden_states,
        )
        seq_relationship_logits = self.cls.seq_relationship(outputs.pooler_output)  # (B, 2)
        nsp_loss = None
        if next_sentence_label is not None:
            nsp_loss = F.cross_entropy(seq_relationship_logits.float(), next_sentence_label.reshape(-1))
        parts = [part for part in (mlm_loss, nsp_loss) if part is not None]
        output = HfBertForPreTrainingOutput(
            loss=sum(parts) if parts else None,
            mlm_loss=mlm_loss,
            nsp_loss=nsp_loss,
            prediction_logits=prediction_logits,
            seq_relationship_logits=seq_relationship_logits,
            hidden_states=outputs.hidden_states,
            attentions=outputs.attentions,
        )
        return return_as(output, return_dict, self.config)


class HfBertForMaskedLM(HfBertMaskedLMMixin, HfBertPreTrainedModel):
    """BERT with the masked-LM head alone (what `pipeline("fill-mask")` loads)."""

    def __init__(self, config: HfBertConfig):
        super().__init__(config)
        self.bert = HfBertModel(config, add_pooling_layer=False)
        self.cls = HfBertPreTrainingHeads(config, next_sentence=False)
        self.post_init()

    def forward(
        self,
        input_ids: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        token_type_ids: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None,
        inputs_embeds: torch.Tensor | None = None,
        labels: torch.Tensor | None = None,
        output_attentions: bool | None = None,
        output_hidden_states: bool | None = None,
        return_dict: bool | None = None,
        **kwargs,
    ) -> MaskedLMOutput | tuple:
        """Masked-LM forward pass; `logits` are (B, T, V), or (M, V) as in HfBertForPreTraining with labels."""
        outputs, logits, loss = self.masked_lm(
            input_ids,
            attention_mask,
            token_type_ids,
            position_ids,
            inputs_embeds,
            labels,
            output_attentions,
            output_hidden_states,
        )
        output = MaskedLMOutput(
            loss=loss, logits=logits, hidden_states=outputs.hidden_states, attentions=outputs.attentions
        )
        return return_as(output, return_dict, self.config)


class HfBertForNextSentencePrediction(HfBertPreTrainedModel):
    """BERT with the next-sentence head alone."""

    def __init__(self, config: HfBertConfig):
        super().__init__(config)
        self.bert = HfBertModel(config)
        self.cls = HfBertPreTrainingHeads(config, masked_lm=False)
        self.post_init()

    def forward(
        self,
        input_ids: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        token_type_ids: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None,
        inputs_embeds: torch.Tensor | None = None,
        labels: torch.Tensor | None = None,
        output_attentions: bool | None = None,
        output_hidden_states: bool | None = None,
        return_dict: bool | None = None,
        **kwargs,
    ) -> NextSentencePredictorOutput | tuple:
        """`labels` (B,): 0 if segment B follows segment A, 1 if it is random."""
        outputs = self.bert(
            input_ids,
            attention_mask=attention_mask,
            token_type_ids=token_type_ids,
            position_ids=position_ids,
            inputs_embeds=inputs_embeds,
            output_attentions=output_attentions,
            output_hidden_states=output_hidden_states,
            return_dict=True,
        )
        logits = self.cls.seq_relationship(outputs.pooler_output)  # (B, 2)
        loss = F.cross_entropy(logits.float(), labels.reshape(-1)) if labels is not None else None
        output = NextSentencePredictorOutput(
            loss=loss, logits=logits, hidden_states=outputs.hidden_states, attentions=outputs.attentions
        )
        return return_as(output, return_dict, self.config)


def classification_loss(config: HfBertConfig, logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """The loss transformers' sequence classifiers use, picked by `config.problem_type` (inferred once)."""
    if config.problem_type is None:
        if config.num_labels == 1:
            config.problem_type = "regression"
        elif labels.dtype in (torch.long, torch.int):
            config.problem_type = "single_label_classification"
        else:
            config.problem_type = "multi_label_classification"
    if config.problem_type == "regression":
        return F.mse_loss(logits.squeeze(-1).float(), labels.float().reshape(logits.shape[:-1]))
    if config.problem_type == "single_label_classification":
        return F.cross_entropy(logits.float().view(-1, config.num_labels), labels.view(-1))
    return F.binary_cross_entropy_with_logits(logits.float(), labels.float())


class HfBertForSequenceClassification(HfBertPreTrainedModel):
    """BERT with a linear classifier (or regressor, num_labels=1) on the pooled [CLS] representation."""

    def __init__(self, config: HfBertConfig):
        super().__init__(config)
        self.num_labels = config.num_labels
        self.bert = HfBertModel(config)
        dropout = (
            config.hidden_dropout_prob if config.classifier_dropout is None else config.classifier_dropout
        )
        self.dropout = nn.Dropout(dropout)
        self.classifier = nn.Linear(config.hidden_size, config.num_labels)
        self.post_init()

    def forward(
        self,
        input_ids: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        token_type_ids: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None,
        inputs_embeds: torch.Tensor | None = None,
        labels: torch.Tensor | None = None,
        output_attentions: bool | None = None,
        output_hidden_states: bool | None = None,
        return_dict: bool | None = None,
        **kwargs,
    ) -> SequenceClassifierOutput | tuple:
        """`labels` (B,) class ids, (B,) floats for regression, or (B, num_labels) multi-label targets."""
        outputs = self.bert(
            input_ids,
            attention_mask=attention_mask,
            token_type_ids=token_type_ids,
            position_ids=position_ids,
            inputs_embeds=inputs_embeds,
            output_attentions=output_attentions,
            output_hidden_states=output_hidden_states,
            return_dict=True,
        )
        logits = self.classifier(self.dropout(outputs.pooler_output))  # (B, num_labels)
        loss = classification_loss(self.config, logits, labels) if labels is not None else None
        output = SequenceClassifierOutput(
            loss=loss, logits=logits, hidden_states=outputs.hidden_states, attentions=outputs.attentions
        )
        return return_as(output, return_dict, self.config)


class HfBertForTokenClassification(HfBertPreTrainedModel):
    """BERT with a linear classifier on every token (NER, tagging)."""

    def __init__(self, config: HfBertConfig):
        super().__init__(config)
        self.num_labels = config.num_labels
        self.bert = HfBertModel(config, add_pooling_layer=False)
        dropout = (
            config.hidden_dropout_prob if config.classifier_dropout is None else config.classifier_dropout
        )
        self.dropout = nn.Dropout(dropout)
        self.classifier = nn.Linear(config.hidden_size, config.num_labels)
        self.post_init()

    def forward(
        self,
        input_ids: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        token_type_ids: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None,
        inputs_embeds: torch.Tensor | None = None,
        labels: torch.Tensor | None = None,
        output_attentions: bool | None = None,
        output_hidden_states: bool | None = None,
        return_dict: bool | None = None,
        **kwargs,
    ) -> TokenClassifierOutput | tuple:
        """`labels` (B, T) class ids, -100 where no loss is taken."""
        outputs = self.bert(
            input_ids,
            attention_mask=attention_mask,
            token_type_ids=token_type_ids,
            position_ids=position_ids,
            inputs_embeds=inputs_embeds,
            output_attentions=output_attentions,
            output_hidden_states=output_hidden_states,
            return_dict=True,
        )
        logits = self.classifier(self.dropout(outputs.last_hidden_state))  # (B, T, num_labels)
        loss = None
        if labels is not None:
            loss = F.cross_entropy(logits.float().view(-1, self.num_labels), labels.view(-1))
        output = TokenClassifierOutput(
            loss=loss, logits=logits, hidden_states=outputs.hidden_states, attentions=outputs.attentions
        )
        return return_as(output, return_dict, self.config)


class HfBertForQuestionAnswering(HfBertPreTrainedModel):
    """BERT with a span head (start and end logits per token) for extractive QA."""

    def __init__(self, config: HfBertConfig):
        super().__init__(config)
        self.num_labels = config.num_labels
        self.bert = HfBertModel(config, add_pooling_layer=False)
        self.qa_outputs = nn.Linear(config.hidden_size, config.num_labels)
        self.post_init()

    def forward(
        self,
        input_ids: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        token_type_ids: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None,
        inputs_embeds: torch.Tensor | None = None,
        start_positions: torch.Tensor | None = None,
        end_positions: torch.Tensor | None = None,
        output_attentions: bool | None = None,
        output_hidden_states: bool | None = None,
        return_dict: bool | None = None,
        **kwargs,
    ) -> QuestionAnsweringModelOutput | tuple:
        """`start_positions` / `end_positions` (B,): token index of the answer span; out-of-range ones are ignored."""
        outputs = self.bert(
            input_ids,
            attention_mask=attention_mask,
            token_type_ids=token_type_ids,
            position_ids=position_ids,
            inputs_embeds=inputs_embeds,
            output_attentions=output_attentions,
            output_hidden_states=output_hidden_states,
            return_dict=True,
        )
        logits = self.qa_outputs(outputs.last_hidden_state)  # (B, T, 2)
        start_logits, end_logits = (part.squeeze(-1).contiguous() for part in logits.split(1, dim=-1))
        loss = None
        if start_positions is not None and end_positions is not None:
            ignored = start_logits.size(1)  # positions outside the sequence carry no loss
            start = start_positions.reshape(-1).clamp(0, ignored)
            end = end_positions.reshape(-1).clamp(0, ignored)
            loss = (
                F.cross_entropy(start_logits.float(), start, ignore_index=ignored)
                + F.cross_entropy(end_logits.float(), end, ignore_index=ignored)
            ) / 2
        output = QuestionAnsweringModelOutput(
            loss=loss,
            start_logits=start_logits,
            end_logits=end_logits,
            hidden_states=outputs.hidden_states,
            attentions=outputs.attentions,
        )
        return return_as(output, return_dict, self.config)


__all__ = [
    "AUTO_MAP",
    "HfBertForMaskedLM",
    "HfBertForNextSentencePrediction",
    "HfBertForPreTraining",
    "HfBertForPreTrainingOutput",
    "HfBertForQuestionAnswering",
    "HfBertForSequenceClassification",
    "HfBertForTokenClassification",
    "HfBertModel",
    "HfBertPreTrainedModel",
]
