"""hfbert.pretraining.evaluation: the metrics' sums, the divergence checks, the log interval's row."""

import math
from types import SimpleNamespace

import pytest
import torch
from conftest import tiny_config

from hfbert import HfBertForPreTraining
from hfbert.errors import RunFailure
from hfbert.pretraining.evaluation import (
    STATISTICS,
    LogInterval,
    check_loss_is_finite,
    check_weights_are_finite,
    metrics_from_statistics,
)
from hfbert.pretraining.flops import ModelFlops


def test_metrics_come_from_the_summed_statistics():
    totals = torch.tensor([20.0, 3.0, 10.0, 4.0, 6.0, 8.0], dtype=torch.float64)  # see STATISTICS
    metrics = metrics_from_statistics(totals, prefix="eval_")
    assert metrics == {
        "eval_mlm_loss": 2.0,
        "eval_mlm_accuracy": 0.3,
        "eval_perplexity": pytest.approx(math.exp(2.0)),
        "eval_nsp_loss": 0.5,
        "eval_nsp_accuracy": 0.75,
    }
    assert metrics_from_statistics(torch.zeros(len(STATISTICS), dtype=torch.float64), "")["mlm_loss"] == 0.0


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

    from hfbert.checkpointing import TrainingProgress

    model = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.Linear(2, 1))
    state = SimpleNamespace(model=model, optimizer=torch.optim.SGD(model.parameters(), lr=1e-3),
                            progress=TrainingProgress(completed_steps=5))  # fmt: skip
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

    from hfbert.checkpointing import TrainingProgress

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
