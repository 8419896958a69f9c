"""Configuration of hfbert, a from-scratch BERT (Devlin et al., 2018).

Field names and defaults are those of `transformers.BertConfig` (BERT-base), so a config moves between the
two by changing `model_type` alone. This file is copied into every checkpoint for `trust_remote_code`:
it imports nothing from hfbert.
"""

from typing import Any

from huggingface_hub.dataclasses import strict
from transformers import BertConfig, PretrainedConfig

# The Google BERT size grid (Turc et al., 2019, "Well-Read Students Learn Better"): (layers, hidden, heads).
# The feed-forward width is always 4 * hidden and a head is always 64 wide.
PRESET_FIELDS = ("num_hidden_layers", "hidden_size", "num_attention_heads")
PRESETS: dict[str, tuple[int, int, int]] = {
    "tiny": (2, 128, 2),
    "mini": (4, 256, 4),
    "small": (4, 512, 8),
    "medium": (8, 512, 8),
    "base": (12, 768, 12),
    "large": (24, 1024, 16),
}

ACTIVATIONS = ("gelu", "gelu_new", "gelu_python", "relu", "silu", "gelu_pytorch_tanh")
# What a config records of itself rather than of its architecture: left out when it becomes the other library's.
_BOOKKEEPING_KEYS = {"model_type", "architectures", "auto_map", "transformers_version", "dtype"}


def _convert_config(config: PretrainedConfig, target: type) -> PretrainedConfig:
    """Every field but the bookkeeping ones, into `target`: HfBertConfig's fields are all BertConfig's."""
    shared = {key: value for key, value in config.to_dict().items() if key not in _BOOKKEEPING_KEYS}
    return target(**shared, attn_implementation=config._attn_implementation)


@strict
class HfBertConfig(PretrainedConfig):
    r"""Configuration of an hfbert model.

    Args:
        vocab_size: Number of token ids; the word embedding matrix and the MLM decoder have this many rows.
        hidden_size: Width of every token representation (d).
        num_hidden_layers: Number of post-LN encoder layers (L).
        num_attention_heads: Heads per self-attention; must divide `hidden_size`.
        intermediate_size: Width of the feed-forward layer (usually 4 * hidden_size).
        hidden_act: Activation of the feed-forward layer and of the MLM transform.
        hidden_dropout_prob: Dropout on embeddings and on every residual branch.
        attention_probs_dropout_prob: Dropout on the attention probabilities.
        max_position_embeddings: Longest sequence the learned position embeddings cover.
        type_vocab_size: Number of segment (token type) ids; 2 for sentence pairs.
        initializer_range: Standard deviation of the normal initialisation of weight matrices.
        layer_norm_eps: LayerNorm epsilon.
        pad_token_id: Id of [PAD]; its embedding row is kept at zero and receives no gradient.
        classifier_dropout: Dropout before the classification heads (None: `hidden_dropout_prob`).
        tie_word_embeddings: The MLM decoder shares its weight with the word embeddings.

    Example:
        >>> config = HfBertConfig.from_preset("mini", vocab_size=30522)
    """

    model_type = "hfbert"

    vocab_size: int = 30522
    hidden_size: int = 768
    num_hidden_layers: int = 12
    num_attention_heads: int = 12
    intermediate_size: int = 3072
    hidden_act: str = "gelu"
    hidden_dropout_prob: float | int = 0.1
    attention_probs_dropout_prob: float | int = 0.1
    max_position_embeddings: int = 512
    type_vocab_size: int = 2
    initializer_range: float = 0.02
    layer_norm_eps: float = 1e-12
    pad_token_id: int | None = 0
    classifier_dropout: float | int | None = None
    tie_word_embeddings: bool = True

    def __post_init__(self, **kwargs: Any) -> None:
        # A field of older hfbert versions, now a forward argument of the MLM heads: dropped quietly when an
        # old config.json is loaded.
        kwargs.pop("mlm_masked_rows_only", None)
        super().__post_init__(**kwargs)

    def validate_architecture(self) -> None:
        """Fail at construction, naming the field, for combinations the model cannot be built from."""
        # The sizes are the fields typed plain int (pad_token_id, int | None, is checked below).
        for name, kind in HfBertConfig.__annotations__.items():
            if kind is int and getattr(self, name) < 1:
                raise ValueError(f"HfBertConfig.{name} must be >= 1, got {getattr(self, name)}")
        if self.hidden_size % self.num_attention_heads != 0:
            divisors = [h for h in range(1, 33) if self.hidden_size % h == 0]
            raise ValueError(
                f"HfBertConfig.hidden_size ({self.hidden_size}) must be divisible by num_attention_heads "
                f"({self.num_attention_heads}); head counts that divide it: {divisors}"
            )
        for name in ("hidden_dropout_prob", "attention_probs_dropout_prob", "classifier_dropout"):
            value = getattr(self, name)
            if value is not None and not 0.0 <= value < 1.0:
                raise ValueError(f"HfBertConfig.{name} must be in [0, 1), got {value}")
        if self.hidden_act not in ACTIVATIONS:
            raise ValueError(f"HfBertConfig.hidden_act must be one of {ACTIVATIONS}, got {self.hidden_act!r}")
        if self.pad_token_id is not None and not 0 <= self.pad_token_id < self.vocab_size:
            raise ValueError(
                f"HfBertConfig.pad_token_id ({self.pad_token_id}) must be in [0, vocab_size={self.vocab_size})"
            )
        if self.layer_norm_eps <= 0 or self.initializer_range <= 0:
            raise ValueError(
                "HfBertConfig.layer_norm_eps and initializer_range must be > 0, got "
                f"{self.layer_norm_eps} and {self.initializer_range}"
            )

    @classmethod
    def from_preset(cls, name: str, **overrides: Any) -> "HfBertConfig":
        """A config of one of the Google BERT sizes: tiny, mini, small, medium, base, large.

        `overrides` set any other field, e.g. `vocab_size=len(tokenizer)`.
        """
        if name not in PRESETS:
            raise ValueError(f"Unknown hfbert preset {name!r}; choose one of {sorted(PRESETS)}")
        sizes = dict(zip(PRESET_FIELDS, PRESETS[name], strict=True))
        return cls(**{**sizes, "intermediate_size": 4 * sizes["hidden_size"], **overrides})

    @classmethod
    def from_bert_config(cls, config: BertConfig) -> "HfBertConfig":
        """The `HfBertConfig` of a stock BERT config's architecture (BERT's decoder fields, such as is_decoder,
        ride along as extra attributes, unused)."""
        return _convert_config(config, cls)

    def to_bert_config(self) -> BertConfig:
        """The stock `transformers.BertConfig` of the same architecture."""
        return _convert_config(self, BertConfig)
