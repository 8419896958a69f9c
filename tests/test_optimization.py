"""hfbert.pretraining.training: optimizer groups, the learning-rate schedule and the step budget."""

import pytest
from conftest import tiny_config

from hfbert import HfBertForPreTraining
from hfbert.pretraining.settings import OptimizationSettings
from hfbert.pretraining.training import (
    UNBOUNDED_STEPS,
    LearningRateSchedule,
    optimizer_parameter_groups,
    plan_budget,
)


def test_no_weight_decay_on_biases_and_layer_norm():
    model = HfBertForPreTraining(tiny_config())
    decay, no_decay = optimizer_parameter_groups(model, 0.01)
    names = {id(p): n for n, p in model.named_parameters()}
    assert decay["weight_decay"] == 0.01 and no_decay["weight_decay"] == 0.0
    assert all(names[id(p)].endswith("weight") and "LayerNorm" not in names[id(p)] for p in decay["params"])
    assert {names[id(p)] for p in no_decay["params"]} >= {
        "bert.embeddings.LayerNorm.weight",
        "cls.predictions.bias",
        "bert.encoder.layer.0.attention.self.query.bias",
    }
    assert len(decay["params"]) + len(no_decay["params"]) == len(list(model.parameters()))


def test_the_schedule_warms_up_then_reaches_zero_exactly_at_the_budget():
    by_steps = LearningRateSchedule(peak=1e-3, warmup_steps=10, max_steps=110, max_seconds=None, shape="linear")
    assert by_steps(0, 0.0) < by_steps(9, 0.0) < by_steps(10, 0.0) == 1e-3
    assert by_steps(60, 0.0) == pytest.approx(5e-4) and by_steps(110, 0.0) == 0.0
    by_time = LearningRateSchedule(peak=1e-3, warmup_steps=0, max_steps=10**9, max_seconds=600.0, shape="linear")
    assert by_time(50, 300.0) == pytest.approx(5e-4) and by_time(51, 600.0) == 0.0 and by_time(52, 700.0) == 0.0
    cosine = LearningRateSchedule(peak=1e-3, warmup_steps=0, max_steps=100, max_seconds=None, shape="cosine")
    assert cosine(50, 0.0) == pytest.approx(5e-4) and cosine(100, 0.0) == pytest.approx(0.0)
    constant = LearningRateSchedule(peak=1e-3, warmup_steps=0, max_steps=100, max_seconds=10.0, shape="constant")
    assert constant(99, 9.0) == 1e-3


def test_the_budget_counts_updates_per_epoch_over_processes_and_accumulation():
    budget = plan_budget(OptimizationSettings(num_train_epochs=3, gradient_accumulation_steps=2), 10, 2)
    assert (budget.max_train_steps, budget.num_epochs) == (9, 3)  # ceil(ceil(10 / 2) / 2) = 3 per epoch
    assert budget.schedule.max_steps == 9
    timed = plan_budget(OptimizationSettings(max_train_seconds=60.0), 10, 1)
    assert timed.max_train_steps == UNBOUNDED_STEPS and timed.schedule.max_seconds == 60.0
    assert plan_budget(OptimizationSettings(max_train_steps=7), 10, 1).max_train_steps == 7


def test_the_budget_is_described_as_the_limit_that_ends_the_run():
    timed = plan_budget(OptimizationSettings(max_train_seconds=600.0), 10, 1)
    assert timed.planned_train_steps is None
    assert timed.describe() == "as many updates as fit in 600 s (--max_train_seconds)"
    both = plan_budget(OptimizationSettings(max_train_steps=7, max_train_seconds=600.0), 10, 1)
    assert both.planned_train_steps == 7
    assert both.describe() == "up to 7 updates or 600 s, whichever runs out first"
    assert plan_budget(OptimizationSettings(max_train_steps=7), 10, 1).describe() == "up to 7 updates"
