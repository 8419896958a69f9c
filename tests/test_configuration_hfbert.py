"""hfbert.configuration_hfbert: presets, BERT-base defaults, and bad fields refused at construction."""

import pytest
from transformers import BertConfig

from hfbert import PRESETS, HfBertConfig


@pytest.mark.parametrize(
    ("preset", "layers", "hidden", "heads"),
    [
        ("tiny", 2, 128, 2),
        ("mini", 4, 256, 4),
        ("small", 4, 512, 8),
        ("medium", 8, 512, 8),
        ("base", 12, 768, 12),
        ("large", 24, 1024, 16),
    ],
)
def test_presets_follow_the_google_bert_grid(preset, layers, hidden, heads):
    config = HfBertConfig.from_preset(preset, vocab_size=500)
    assert (config.num_hidden_layers, config.hidden_size, config.num_attention_heads) == (
        layers,
        hidden,
        heads,
    )
    assert config.intermediate_size == 4 * hidden and config.vocab_size == 500


def test_defaults_are_bert_base():
    ours, theirs = HfBertConfig().to_dict(), BertConfig().to_dict()
    shared = set(ours) & set(theirs) - {"model_type", "transformers_version"}
    assert {key: ours[key] for key in shared} == {key: theirs[key] for key in shared}
    assert "vocab_size" in shared and "layer_norm_eps" in shared


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (
            {"hidden_size": 30, "num_attention_heads": 4},
            "hidden_size \\(30\\) must be divisible by num_attention_heads",
        ),
        ({"vocab_size": 0}, "vocab_size must be >= 1"),
        ({"hidden_dropout_prob": 1.5}, "hidden_dropout_prob must be in"),
        ({"hidden_act": "swish2"}, "hidden_act must be one of"),
        ({"pad_token_id": 40000}, "pad_token_id \\(40000\\) must be in"),
    ],
)
def test_invalid_config_fails_at_construction_naming_the_field(overrides, message):
    with pytest.raises(Exception, match=message):
        HfBertConfig(**overrides)


def test_unknown_preset_lists_the_choices():
    with pytest.raises(ValueError, match="choose one of"):
        HfBertConfig.from_preset("huge")


def test_a_preset_takes_overrides_and_the_config_round_trips(tmp_path):
    config = HfBertConfig.from_preset("mini", vocab_size=1234, hidden_dropout_prob=0.0)
    assert set(PRESETS) == {"tiny", "mini", "small", "medium", "base", "large"}
    assert config.vocab_size == 1234 and config.hidden_dropout_prob == 0.0
    config.save_pretrained(tmp_path)
    loaded = HfBertConfig.from_pretrained(tmp_path)
    assert loaded.to_dict() == config.to_dict()
    with pytest.raises(Exception, match="hidden_dropout_prob must be in"):  # strict dataclasses wrap it
        HfBertConfig.from_preset("mini", hidden_dropout_prob=1.0)
