"""hfbert.pretraining.evaluation: the metrics' sums, the FLOPs formula behind the logged MFU."""

import math

import pytest
import torch
from conftest import tiny_config

from hfbert import HfBertForPreTraining
from hfbert.errors import RunFailure
from hfbert.pretraining.evaluation import (
    STATISTICS,
    ModelFlops,
    TrainingWindow,
    check_loss_is_finite,
    flops_per_token,
    metrics_from_statistics,
)


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


def test_flops_per_token_counts_the_encoder_attention_and_the_head_share():
    config = tiny_config()
    model = HfBertForPreTraining(config)
    encoder = sum(p.numel() for p in model.bert.encoder.parameters())
    d, layers, vocab = config.hidden_size, config.num_hidden_layers, config.vocab_size
    assert flops_per_token(config, model, 64, 0.0) == 6 * encoder + 12 * layers * d * 64
    head = 6 * (d * d + d * vocab)
    assert flops_per_token(config, model, 64, 1.0) - flops_per_token(config, model, 64, 0.0) == head


def test_the_log_row_has_model_flops_and_mfu_only_with_a_known_peak():
    config = tiny_config()
    model = HfBertForPreTraining(config)
    totals = torch.tensor([0.0, 0.0, 150.0, 0.0, 0.0, 10.0], dtype=torch.float64)  # 150 masked, 10 rows
    row = ModelFlops(config, model, peak_flops_per_process=None).utilization(1000.0, totals, 2.0, 1)
    assert set(row) == {"model_flops_per_second"}
    assert row["model_flops_per_second"] == pytest.approx(1000 * flops_per_token(config, model, 100, 0.15) / 2)
    with_peak = ModelFlops(config, model, peak_flops_per_process=1e12).utilization(1000.0, totals, 2.0, 2)
    assert with_peak["mfu"] == pytest.approx(with_peak["model_flops_per_second"] / 2e12)


def test_non_finite_loss_is_an_error_except_under_fp16():
    with pytest.raises(FloatingPointError, match=r"loss became nan at step 7.*--learning_rate") as error:
        check_loss_is_finite(torch.tensor(float("nan")), "no", 7, 1e-3)
    assert "start a new run" in str(error.value) and "resume from" not in str(error.value)  # resume refuses a new rate
    assert isinstance(error.value, RunFailure)  # entry points print it as one line, exit 1
    check_loss_is_finite(torch.tensor(float("inf")), "fp16", 7, 1e-3)  # the grad scaler skips it
    check_loss_is_finite(torch.tensor(2.0), "bf16", 7, 1e-3)


def test_the_nan_stop_names_the_last_checkpoint_whose_weights_are_finite(tmp_path):
    from safetensors.torch import save_file

    for step, value in ((2, 3.0), (4, 1e6), (6, float("nan"))):
        checkpoint = tmp_path / f"checkpoint-{step}"
        checkpoint.mkdir()
        save_file({"w": torch.tensor([1.0, -value])}, checkpoint / "model.safetensors")
        (checkpoint / "checkpoint_manifest.json").write_text("{}")
    with pytest.raises(FloatingPointError) as error:
        check_loss_is_finite(torch.tensor(float("inf")), "bf16", 7, 1e-3, str(tmp_path))
    assert str(error.value).endswith(
        f"The last checkpoint whose weights are all finite is {tmp_path / 'checkpoint-4'} (largest |weight| 1e+06)."
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
        flops = ModelFlops(config, model, peak_flops_per_process=None)
        rows = []
        for norms in ([], [None, torch.tensor(2.0), torch.tensor(math.inf), torch.tensor(3.0), None]):
            window = TrainingWindow.start(torch.device("cpu"), 0.0)
            for norm in norms or [None]:
                window.add(outputs, outputs.loss, batch, norm)
            rows.append(window.row(accelerator, TrainingProgress(completed_steps=1, train_seconds=1.0), 0, 1e-3, flops))
    finally:
        AcceleratorState._reset_state(reset_partial_state=True)
        GradientState._reset_state()
    assert "grad_norm" not in rows[0]  # no clipping (--max_grad_norm 0): no norm computed, none logged
    assert rows[1]["grad_norm"] == 3.0
