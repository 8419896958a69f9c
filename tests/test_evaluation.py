"""hfbert.pretraining.evaluation: the metrics' sums."""

import math

import pytest
import torch

from hfbert.pretraining.evaluation import STATISTICS, metrics_from_statistics


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
