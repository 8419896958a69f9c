"""hfbert.initialization: the structured start puts three heads where intended and changes nothing else."""

import pytest
import torch
import transformers
from conftest import tiny_config

from hfbert.initialization import init_structured_attention
from hfbert.modeling_hfbert import HfBertForPreTraining

# The tiny preset's shape (64-wide heads, as every preset) with a small vocabulary.
PRESET_SHAPE = dict(hidden_size=128, num_hidden_layers=2, num_attention_heads=2, intermediate_size=512)
SET_BY_INIT = {
    "bert.embeddings.position_embeddings.weight",
    "bert.embeddings.token_type_embeddings.weight",
    "bert.encoder.layer.0.attention.self.query.weight",
    "bert.encoder.layer.0.attention.self.key.weight",
    "bert.encoder.layer.1.attention.self.query.weight",
    "bert.encoder.layer.1.attention.self.key.weight",
}


def attentions(model, input_ids, token_type_ids) -> tuple[torch.Tensor, ...]:
    model.eval()
    with torch.no_grad():
        output = model.bert(input_ids=input_ids, token_type_ids=token_type_ids, output_attentions=True)
    return tuple(layer[0] for layer in output.attentions)  # each (heads, T, T)


def pair_with_shared_words(length: int = 64) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Segment A of distinct ids, segment B of other ids except every 4th, which repeats a word of A."""
    half = length // 2
    a = torch.arange(100, 100 + half)
    b = torch.arange(500, 500 + half)
    b[::4] = a[1::4]
    input_ids = torch.cat([a, b])[None]
    token_type_ids = torch.cat([torch.zeros(half), torch.ones(half)]).long()[None]
    return input_ids, token_type_ids, torch.arange(half, length, 4)  # positions in B with a twin in A


@pytest.mark.parametrize("attention_init", ["structured", "bert"])
def test_three_heads_start_at_the_previous_token_the_next_token_and_the_same_word(attention_init):
    model = HfBertForPreTraining(tiny_config(**PRESET_SHAPE, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0))
    if attention_init == "structured":
        init_structured_attention(model, seed=0)
    input_ids, token_type_ids, with_twin = pair_with_shared_words()
    layer0, layer1 = attentions(model, input_ids, token_type_ids)
    inner = torch.arange(1, input_ids.size(1) - 1)
    to_previous = layer0[0, inner, inner - 1].mean()
    to_next = layer1[0, inner, inner + 1].mean()
    twin = with_twin - 31  # b[::4] = a[1::4]: B position 32 + 4k repeats A position 1 + 4k
    to_twin = layer0[1, with_twin, twin].mean()
    if attention_init == "structured":
        assert to_previous > 0.9 and to_next > 0.9
        assert to_twin > 0.25  # shared with the token itself, which holds the same word
    else:  # transformers' init: about uniform, 1/64 per position
        assert to_previous < 0.1 and to_next < 0.1 and to_twin < 0.1


def test_only_positions_segments_and_three_heads_change():
    model = HfBertForPreTraining(tiny_config(**PRESET_SHAPE))
    before = {name: tensor.clone() for name, tensor in model.state_dict().items()}
    init_structured_attention(model, seed=0)
    changed = {name for name, tensor in model.state_dict().items() if not torch.equal(tensor, before[name])}
    assert changed == SET_BY_INIT
    matching_head = model.bert.encoder.layer[0].attention.self.query.weight[64:]
    assert not torch.equal(matching_head, before["bert.encoder.layer.0.attention.self.query.weight"][64:])
    untouched_head = model.bert.encoder.layer[1].attention.self.query.weight[64:]
    assert torch.equal(untouched_head, before["bert.encoder.layer.1.attention.self.query.weight"][64:])
    assert torch.count_nonzero(model.bert.embeddings.token_type_embeddings.weight[:, 64:]) == 0
    assert torch.count_nonzero(model.bert.embeddings.position_embeddings.weight[:, 64:]) == 0


def test_transformers_bert_gets_the_same_start_and_the_same_outputs():
    config = tiny_config(**PRESET_SHAPE, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    ours = HfBertForPreTraining(config)
    theirs = transformers.BertForPreTraining(config.to_bert_config())
    theirs.load_state_dict(ours.state_dict())
    init_structured_attention(ours, seed=3)
    init_structured_attention(theirs, seed=3)
    for name, tensor in ours.state_dict().items():
        assert torch.equal(tensor, theirs.state_dict()[name]), name
    input_ids, token_type_ids, _ = pair_with_shared_words()
    ours.eval(), theirs.eval()
    with torch.no_grad():
        logits = ours(input_ids=input_ids, token_type_ids=token_type_ids).prediction_logits
        reference = theirs(input_ids=input_ids, token_type_ids=token_type_ids).prediction_logits
    torch.testing.assert_close(logits, reference, rtol=1e-5, atol=1e-5)


def test_the_seed_picks_the_frequencies_and_leaves_the_global_rng_alone():
    first, second = (HfBertForPreTraining(tiny_config(**PRESET_SHAPE)) for _ in range(2))
    state = torch.get_rng_state()
    init_structured_attention(first, seed=1)
    assert torch.equal(torch.get_rng_state(), state)
    init_structured_attention(second, seed=2)
    positions = "bert.embeddings.position_embeddings.weight"
    assert not torch.equal(first.state_dict()[positions], second.state_dict()[positions])


@pytest.mark.parametrize(
    "shape",
    [dict(num_hidden_layers=1), dict(num_attention_heads=1, hidden_size=32), dict(hidden_size=36, num_attention_heads=4)],
)
def test_a_model_without_room_for_the_heads_is_refused_with_the_fix(shape):
    with pytest.raises(ValueError, match="pass --attention_init bert"):
        init_structured_attention(HfBertForPreTraining(tiny_config(**shape)), seed=0)
