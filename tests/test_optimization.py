"""hfbert.pretraining.training: optimizer groups, the learning-rate schedule and the step budget, the progress,
the divergence checks and the log interval's row."""

import math
from types import SimpleNamespace

import pytest
import torch
from conftest import tiny_config

from hfbert import HfBertForPreTraining
from hfbert.errors import RunFailure
from hfbert.pretraining.flops import ModelFlops
from hfbert.pretraining.settings import OptimizationSettings
from hfbert.pretraining.training import (
    UNBOUNDED_STEPS,
    Budget,
    LearningRateSchedule,
    LogInterval,
    Training,
    TrainingProgress,
    check_loss_is_finite,
    check_weights_are_finite,
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


def schedule(peak: float, warmup_steps: int, max_steps: int, max_seconds: float | None, shape: str):
    """The rate at (step, seconds) of `shape` over a budget of `max_steps` or `max_seconds`."""
    budget = Budget(max_steps, max_seconds)
    return lambda step, seconds: LearningRateSchedule(peak, warmup_steps, shape)(step, seconds, budget)


def test_the_schedule_warms_up_then_reaches_zero_exactly_at_the_budget():
    by_steps = schedule(peak=1e-3, warmup_steps=10, max_steps=110, max_seconds=None, shape="linear")
    assert by_steps(0, 0.0) < by_steps(9, 0.0) < by_steps(10, 0.0) == 1e-3
    assert by_steps(60, 0.0) == pytest.approx(5e-4) and by_steps(110, 0.0) == 0.0
    by_time = schedule(peak=1e-3, warmup_steps=0, max_steps=10**9, max_seconds=600.0, shape="linear")
    assert by_time(50, 300.0) == pytest.approx(5e-4) and by_time(51, 600.0) == 0.0 and by_time(52, 700.0) == 0.0
    cosine = schedule(peak=1e-3, warmup_steps=0, max_steps=100, max_seconds=None, shape="cosine")
    assert cosine(50, 0.0) == pytest.approx(5e-4) and cosine(100, 0.0) == pytest.approx(0.0)
    constant = schedule(peak=1e-3, warmup_steps=0, max_steps=100, max_seconds=10.0, shape="constant")
    assert constant(99, 9.0) == 1e-3


def test_the_budget_counts_updates_per_epoch_over_processes_and_accumulation():
    budget = plan_budget(OptimizationSettings(num_train_epochs=3, gradient_accumulation_steps=2), 10, 2)
    assert (budget.max_train_steps, budget.num_epochs) == (9, 3)  # ceil(ceil(10 / 2) / 2) = 3 per epoch
    timed = plan_budget(OptimizationSettings(max_train_seconds=60.0), 10, 1)
    assert timed.max_train_steps == UNBOUNDED_STEPS and timed.max_train_seconds == 60.0
    assert plan_budget(OptimizationSettings(max_train_steps=7), 10, 1).max_train_steps == 7


def test_the_budget_is_described_as_the_limit_that_ends_the_run():
    timed = plan_budget(OptimizationSettings(max_train_seconds=600.0), 10, 1)
    assert timed.planned_train_steps is None
    assert timed.describe() == "as many updates as fit in 600 s (--max_train_seconds)"
    both = plan_budget(OptimizationSettings(max_train_steps=7, max_train_seconds=600.0), 10, 1)
    assert both.planned_train_steps == 7
    assert both.describe() == "up to 7 updates or 600 s, whichever runs out first"
    assert plan_budget(OptimizationSettings(max_train_steps=7), 10, 1).describe() == "up to 7 updates"

@pytest.mark.parametrize(
    "flags",
    [{"max_train_steps": 7}, {"num_train_epochs": 2}, {"max_train_seconds": 60.0}, {"max_train_steps": 7, "max_train_seconds": 60.0}],
)
def test_a_replay_of_training_args_finds_the_runs_budget(flags):
    """Run health replays a finished run's log rows with the budget its training_args.json records: the same
    shares as the run's own budget gave."""
    run = plan_budget(OptimizationSettings(**flags), 10, 1)
    recorded = {"max_train_steps": None, "max_train_seconds": None, **flags, "planned_train_steps": run.planned_train_steps}
    replayed = Budget.of_training_args(recorded)
    assert (replayed.max_train_steps, replayed.max_train_seconds) == (run.max_train_steps, run.max_train_seconds)
    assert [replayed.share_spent(step, 20.0) for step in (0, 3, 7, 30)] == [run.share_spent(step, 20.0) for step in (0, 3, 7, 30)]


def stand_in_training(position: int, accumulation: int, per_process: int | None, processes: int) -> Training:
    """A training at `position` in its epoch (micro-batches of all `processes`), of `per_process` micro-batches
    an epoch on each (None: a stream)."""
    accelerator = SimpleNamespace(num_processes=processes, device=torch.device("cpu"))
    optimization = OptimizationSettings(gradient_accumulation_steps=accumulation)
    batches, progress = SimpleNamespace(batches_per_process=per_process), TrainingProgress(micro_batches_in_epoch=position)
    return Training(accelerator, None, None, batches, None, None, optimization, None, None, progress)


@pytest.mark.parametrize(
    ("accumulation", "per_process", "processes", "ends"),
    [
        (2, 5, 1, [False, True, False, True, True]),  # the epoch's last micro-batch ends a shorter update
        (2, 5, 2, [False, True, False, True, True]),  # the position counts every process's micro-batches
        (3, None, 1, [False, False, True, False, False, True]),  # a stream: an epoch without end
        (1, 3, 1, [True, True, True]),
    ],
)
def test_a_micro_batch_ends_an_update_at_the_end_of_its_accumulation_or_of_the_epoch(
    accumulation, per_process, processes, ends
):
    """What accelerate's `accumulate` decided (its counter reset at the end of a prepared loader), from the
    checkpointed position alone."""
    seen = [stand_in_training(taken * processes, accumulation, per_process, processes).ends_update() for taken in range(len(ends))]
    assert seen == ends


def test_the_runs_accelerator_leaves_the_accumulation_to_the_training():
    """The training divides each micro-batch's loss by the accumulation: accelerate's backward must not too."""
    from hfbert.pretraining.cli import parse_args
    from hfbert.pretraining.precision import build_accelerator

    settings = parse_args(["--output_dir", "unused", "--gradient_accumulation_steps", "4", "--mixed_precision", "no"])
    accelerator, _ = build_accelerator(settings.optimization, settings.output)
    assert accelerator.gradient_accumulation_steps == 1 and settings.optimization.gradient_accumulation_steps == 4



def test_training_progress_comes_back_whole_from_its_state_dict():
    saved = TrainingProgress(
        completed_steps=30, epoch=2, micro_batches_in_epoch=8, log_history=[{"step": 30, "loss": 2.5}], train_seconds=12.5
    )
    restored = TrainingProgress()
    restored.load_state_dict(saved.state_dict())
    assert restored == saved


def test_non_finite_loss_is_an_error_except_under_fp16():
    with pytest.raises(FloatingPointError, match=r"loss became nan at step 7.*--learning_rate") as error:
        check_loss_is_finite(float("nan"), "no", 7, 1e-3)
    assert "start a new run" in str(error.value) and "resume from" not in str(error.value)  # resume refuses a new rate
    assert isinstance(error.value, RunFailure)  # entry points print it as one line, exit 1
    check_loss_is_finite(float("inf"), "fp16", 7, 1e-3)  # the grad scaler skips it
    check_loss_is_finite(2.0, "bf16", 7, 1e-3)


def test_the_nan_stop_names_the_last_checkpoint_whose_weights_are_finite(tmp_path):
    from safetensors.torch import save_file

    for step, value in ((2, 3.0), (4, 1e6), (6, float("nan"))):
        checkpoint = tmp_path / f"checkpoint-{step}"
        checkpoint.mkdir()
        save_file({"w": torch.tensor([1.0, -value])}, checkpoint / "model.safetensors")
        (checkpoint / "checkpoint_manifest.json").write_text("{}")
    with pytest.raises(FloatingPointError) as error:
        check_loss_is_finite(float("inf"), "bf16", 7, 1e-3, str(tmp_path))
    assert str(error.value).endswith(
        f"The last checkpoint whose weights are all finite is {tmp_path / 'checkpoint-4'} (largest |weight| 1e+06)."
    )


def test_weights_that_are_no_longer_finite_stop_the_run_before_their_checkpoint_naming_the_tensor(tmp_path):
    from accelerate import Accelerator


    model = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.Linear(2, 1))
    state = SimpleNamespace(model=model, optimizer=torch.optim.SGD(model.parameters(), lr=1e-3),
                            progress=TrainingProgress(completed_steps=5), resumed_from=None)  # fmt: skip
    accelerator = Accelerator(cpu=True)
    check_weights_are_finite(accelerator, state, str(tmp_path))
    with torch.no_grad():
        model[1].bias.fill_(float("inf"))
    with pytest.raises(FloatingPointError) as stopped:
        check_weights_are_finite(accelerator, state, str(tmp_path))
    assert isinstance(stopped.value, RunFailure)
    assert str(stopped.value).startswith(
        "The weights became non-finite (1.bias holds nan or inf; no checkpoint or final folder of them is written) "
        "at step 5 (learning rate 0.001, precision no). Resuming would diverge again"
    )


def test_the_log_row_has_the_largest_finite_gradient_norm_clipping_computed():
    """The norm run health reads; an fp16 update skipped for overflow (an infinite norm) is no spike."""
    from accelerate import Accelerator
    from accelerate.state import AcceleratorState, GradientState


    config = tiny_config()
    model = HfBertForPreTraining(config)
    input_ids = torch.randint(5, config.vocab_size, (2, 8))
    batch = {"input_ids": input_ids, "attention_mask": torch.ones_like(input_ids), "labels": input_ids.clone(),
             "next_sentence_label": torch.tensor([0, 1])}  # fmt: skip
    outputs = model(**batch, mlm_masked_rows_only=True)
    accelerator = Accelerator(cpu=True)
    try:
        flops = ModelFlops(config, static_slots=None, peak_flops_per_process=None)
        rows = []
        for norms in ([], [None, torch.tensor(2.0), torch.tensor(math.inf), torch.tensor(3.0), None]):
            interval = LogInterval(torch.device("cpu"), 0.0)
            for norm in norms or [None]:
                interval.add(outputs, outputs.loss, batch, norm)
            rows.append(interval.row(accelerator, TrainingProgress(completed_steps=1, train_seconds=1.0), 0, 1e-3, flops))
    finally:
        AcceleratorState._reset_state(reset_partial_state=True)
        GradientState._reset_state()
    assert "grad_norm" not in rows[0]  # no clipping (--max_grad_norm 0): no norm computed, none logged
    assert rows[1]["grad_norm"] == 3.0
