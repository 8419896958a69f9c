"""hfbert.pretraining.extras.attention_shaping: the structured start fades to BERT's rows on schedule and resumes
exactly; the [CLS] spread penalty is what the model's own attention says, in every forward the loop runs."""

import math

import torch
from conftest import tiny_config

from hfbert.initialization import init_structured_attention
from hfbert.modeling_hfbert import HfBertForPreTraining
from hfbert.pretraining.callbacks import Callbacks
from hfbert.pretraining.extras.attention_shaping import ClsAttentionSpread, StructuredFade
from hfbert.pretraining.training import TrainingProgress

SHAPE = dict(hidden_size=128, num_hidden_layers=2, num_attention_heads=2, intermediate_size=256)
NO_DROPOUT = dict(hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)


def fresh_model(seed: int = 0) -> HfBertForPreTraining:
    torch.manual_seed(seed)
    return HfBertForPreTraining(tiny_config(**SHAPE, **NO_DROPOUT))


def query_key(model) -> dict[str, torch.Tensor]:
    return {
        name: tensor.detach().clone()
        for name, tensor in model.named_parameters()
        if ".attention.self.query.weight" in name or ".attention.self.key.weight" in name
    }


def test_the_structured_rows_go_on_top_of_the_random_ones_when_they_will_fade():
    replaced, kept = fresh_model(), fresh_model()
    random_rows = query_key(kept)
    components = init_structured_attention(replaced, seed=0)
    assert set(components) <= set(random_rows)
    assert init_structured_attention(kept, seed=0, keep_random_rows=True).keys() == components.keys()
    assert len(components) == 4  # query and key of layer 0 (two heads) and layer 1 (one head)
    for name, component in components.items():
        rows = component.abs().sum(1) > 0  # the three heads' rows
        assert rows.sum() in (64, 128)
        torch.testing.assert_close(query_key(replaced)[name][rows], component[rows], rtol=0, atol=0)
        torch.testing.assert_close(query_key(kept)[name][rows], component[rows] + random_rows[name][rows])
        torch.testing.assert_close(query_key(kept)[name][~rows], random_rows[name][~rows], rtol=0, atol=0)


def test_the_fade_leaves_its_share_of_the_structure_and_then_only_what_is_not_structure():
    model = fresh_model()
    random_rows = query_key(model)
    components = init_structured_attention(model, seed=0, keep_random_rows=True)
    fade = StructuredFade(model, components, fraction=0.5)
    fade.on_update(1, 0.125)  # a quarter of the way through the fade: three quarters left
    for name, weight in query_key(model).items():
        torch.testing.assert_close(weight, random_rows[name] + 0.75 * components[name])
    fade.on_update(4, 0.5)
    fade.on_update(7, 0.9)  # past the fade: nothing more to take away
    for name, weight in query_key(model).items():
        torch.testing.assert_close(weight, random_rows[name], atol=1e-6, rtol=0)


def test_a_fade_resumed_from_a_checkpoint_equals_an_uninterrupted_one_bit_for_bit():
    progresses = [step / 40 for step in range(1, 41)]
    straight = fresh_model()
    fade = StructuredFade(straight, init_structured_attention(straight, seed=0, keep_random_rows=True), 0.7)
    for step, progress in enumerate(progresses, start=1):
        fade.on_update(step, progress)
        if progress == progresses[16]:
            checkpoint = query_key(straight)
    resumed = fresh_model()
    components = init_structured_attention(resumed, seed=0, keep_random_rows=True)
    with torch.no_grad():
        for name, parameter in resumed.named_parameters():
            if name in checkpoint:
                parameter.copy_(checkpoint[name])
    fade = Callbacks([StructuredFade(resumed, components, 0.7)])  # as the loop calls it
    fade.on_fit_start(TrainingProgress(completed_steps=17), progresses[16])
    for step, progress in enumerate(progresses[17:], start=18):
        fade.on_update(step, progress)
    for name, weight in query_key(straight).items():
        assert torch.equal(query_key(resumed)[name], weight), name


def cls_spread_from_attentions(model, input_ids, attention_mask) -> torch.Tensor:
    """1 - H / log n of [CLS]'s row, from the model's own (eager) attention probabilities."""
    with torch.no_grad():
        out = model.bert(input_ids=input_ids, attention_mask=attention_mask, output_attentions=True)
    lengths = attention_mask.sum(-1).double()
    per_layer = []
    for probs in out.attentions:  # (B, H, T, T)
        row = probs[:, :, 0, :].double()
        entropy = -(row * row.clamp_min(1e-30).log()).sum(-1)
        per_layer.append((1 - entropy / lengths.log()[:, None]).mean())
    return torch.stack(per_layer).mean()


def test_the_cls_penalty_is_the_spread_of_cls_attention_in_the_full_and_the_pretraining_forward():
    model = fresh_model()
    init_structured_attention(model, seed=0)  # sharp heads: a penalty far from 0
    input_ids = torch.randint(5, 99, (3, 24))
    input_ids[:, 0] = 2
    attention_mask = torch.ones_like(input_ids)
    attention_mask[1, 17:] = 0  # a padded row: its padding is no key
    labels = torch.full_like(input_ids, -100)
    labels[:, [3, 9]] = input_ids[:, [3, 9]]
    expected = cls_spread_from_attentions(model.eval(), input_ids, attention_mask)
    assert 0.2 < expected < 1
    spread = ClsAttentionSpread(model, weight=3.0)
    model.train()  # no dropout in this config: the same numbers as in eval mode
    model(input_ids=input_ids, attention_mask=attention_mask)
    torch.testing.assert_close(spread.penalty(attention_mask).double(), 3.0 * expected)
    # The loop's forward runs the last layer at [CLS] and the masked positions only: [CLS] still comes first.
    outputs = model(input_ids=input_ids, attention_mask=attention_mask, labels=labels, mlm_masked_rows_only=True)
    penalty = spread.penalty(attention_mask)
    torch.testing.assert_close(penalty.double(), 3.0 * expected)
    penalty.backward()  # it trains the queries and keys
    assert model.bert.encoder.layer[1].attention.self.query.weight.grad.abs().sum() > 0
    assert outputs.mlm_loss is not None


def test_uniform_attention_costs_nothing_and_evaluation_forwards_capture_nothing():
    model = fresh_model()
    with torch.no_grad():
        for layer in model.bert.encoder.layer:
            layer.attention.self.query.weight.zero_()
            layer.attention.self.query.bias.zero_()
    spread = ClsAttentionSpread(model, weight=1.0)
    input_ids = torch.randint(5, 99, (2, 16))
    model.train()
    model(input_ids=input_ids)
    assert spread.penalty(torch.ones_like(input_ids)).abs() < 1e-6
    model.eval()
    model(input_ids=input_ids)
    assert not spread.captured
    spread.remove()
    model.train()
    model(input_ids=input_ids)
    assert not spread.captured


def test_the_loop_without_callbacks_leaves_loss_and_weights_alone():
    model = fresh_model()
    before = query_key(model)
    shaping = Callbacks()
    loss = torch.tensor(math.pi)
    assert shaping.loss(loss, {"attention_mask": torch.ones(1, 4)}) is loss
    shaping.on_fit_start(TrainingProgress(), 0.3)
    shaping.on_update(1, 0.6)
    for name, weight in query_key(model).items():
        assert torch.equal(weight, before[name])
