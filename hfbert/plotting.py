"""Training curves PNG: training loss, learning rate and the evaluation metrics over optimizer steps."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")  # headless: training runs on servers without a display

import matplotlib.pyplot as plt  # after matplotlib.use: the backend is chosen before pyplot loads

from hfbert.checkpointing import atomic_path

# (panel title, y label, [(history key, legend label), ...]); one panel per group of comparable numbers.
PANELS: tuple[tuple[str, str, tuple[tuple[str, str], ...]], ...] = (
    ("Training loss", "loss (MLM + NSP)", (("loss", "train loss"),)),
    ("Learning rate", "learning rate", (("learning_rate", "learning rate"),)),
    ("Evaluation losses", "loss", (("eval_mlm_loss", "MLM loss"), ("eval_nsp_loss", "NSP loss"))),
    (
        "Evaluation accuracies",
        "accuracy",
        (("eval_mlm_accuracy", "MLM accuracy"), ("eval_nsp_accuracy", "NSP accuracy")),
    ),
    ("Evaluation perplexity", "perplexity (MLM)", (("eval_perplexity", "perplexity"),)),
)


def _series(history: list[dict[str, Any]], key: str) -> tuple[list[int], list[float]]:
    rows = [row for row in history if row.get(key) is not None]
    return [int(row["step"]) for row in rows], [float(row[key]) for row in rows]


def plot_training_curves(
    history: list[dict[str, Any]], path: str | os.PathLike, title: str = "hfbert pretraining"
) -> Path:
    """Draw every known metric in `history` against its "step" and save a PNG at `path` (atomically).

    `history` mixes training rows ({"step", "loss", "learning_rate"}) and evaluation rows ({"step",
    "eval_mlm_loss", "eval_mlm_accuracy", "eval_perplexity", "eval_nsp_loss", "eval_nsp_accuracy"}); a panel
    whose metrics never appear says so instead of staying blank.
    """
    figure, axes = plt.subplots(1, len(PANELS), figsize=(4.2 * len(PANELS), 3.6), constrained_layout=True)
    for axis, (panel_title, y_label, metrics) in zip(axes, PANELS, strict=True):
        plotted = False
        for key, label in metrics:
            steps, values = _series(history, key)
            if steps:
                axis.plot(steps, values, marker="o" if len(steps) < 20 else None, markersize=3, label=label)
                plotted = True
        if plotted:
            if len(metrics) > 1:
                axis.legend()
            axis.grid(alpha=0.3)
        else:
            axis.text(
                0.5, 0.5, "no data logged", ha="center", va="center", transform=axis.transAxes, color="gray"
            )
        if y_label == "accuracy":
            axis.set_ylim(0.0, 1.0)
        axis.set_title(panel_title)
        axis.set_xlabel("optimizer step")
        axis.set_ylabel(y_label)
    axes[1].ticklabel_format(axis="y", style="sci", scilimits=(-3, 3))
    figure.suptitle(title)
    path = Path(path)
    try:
        with atomic_path(path) as temp_path:
            figure.savefig(temp_path, format="png", dpi=100)
    finally:
        plt.close(figure)
    return path
