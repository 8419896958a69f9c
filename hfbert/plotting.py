"""Training curves PNG: MLM and NSP loss and accuracy, train against held-out eval, and the learning rate."""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")  # headless: training runs on servers without a display

import matplotlib.pyplot as plt  # after matplotlib.use: the backend is chosen before pyplot loads

from hfbert.files import atomic_path

# (panel title, y label, [(history key, legend label), ...]); train and eval of one metric share a panel,
# so overfitting (train improving while eval worsens) shows the moment it starts.
PANELS: tuple[tuple[str, str, tuple[tuple[str, str], ...]], ...] = (
    ("MLM loss", "loss", (("train_mlm_loss", "train"), ("eval_mlm_loss", "eval (held out)"))),
    ("MLM accuracy", "accuracy", (("train_mlm_accuracy", "train"), ("eval_mlm_accuracy", "eval (held out)"))),
    ("Learning rate", "learning rate", (("learning_rate", "learning rate"),)),
    ("NSP loss", "loss", (("train_nsp_loss", "train"), ("eval_nsp_loss", "eval (held out)"))),
    ("NSP accuracy", "accuracy", (("train_nsp_accuracy", "train"), ("eval_nsp_accuracy", "eval (held out)"))),
    ("Training loss", "loss (MLM + weighted NSP)", (("loss", "train loss"),)),
)


def plot_training_curves(
    history: list[dict[str, Any]],
    path: str | os.PathLike,
    title: str = "hfbert pretraining",
    reference_lines: Sequence[tuple[str, float, str]] = (),
) -> Path:
    """Draw every known metric in `history` against its "step" and save a PNG at `path` (atomically).

    `history` mixes training rows ({"step", "loss", "learning_rate", "train_mlm_loss", "train_mlm_accuracy",
    "train_nsp_loss", "train_nsp_accuracy", ...}) and evaluation rows ({"step", "eval_mlm_loss",
    "eval_mlm_accuracy", "eval_nsp_loss", "eval_nsp_accuracy", ...}); a panel whose metrics never appear says
    so instead of staying blank. `reference_lines` are (panel title, value, label): a dashed horizontal line
    each, such as the baselines a curve should beat (`hfbert.pretraining.extras.health.report.report_reference_lines`).
    """
    titles = [panel[0] for panel in PANELS]
    unknown = [line[0] for line in reference_lines if line[0] not in titles]
    if unknown:
        raise ValueError(f"reference lines for unknown panels {unknown}; the panels are {titles}")
    # the six PANELS in two rows of three, 4.4 x 3.4 inches each
    figure, axes = plt.subplots(2, 3, figsize=(13.2, 6.8), constrained_layout=True)
    for axis, (panel_title, y_label, metrics) in zip(axes.flat, PANELS, strict=True):
        for key, label in metrics:
            rows = [row for row in history if row.get(key) is not None]
            if rows:
                steps, values = [int(row["step"]) for row in rows], [float(row[key]) for row in rows]
                axis.plot(steps, values, marker="o" if len(steps) < 20 else None, markersize=3, label=label)
        plotted = bool(axis.lines)  # before the reference lines, which are no data
        references = [line for line in reference_lines if line[0] == panel_title]
        for _, value, label in references:
            axis.axhline(value, color="gray", linestyle="--", linewidth=1, label=f"{label} ({value:.3g})")
        if plotted:
            if len(metrics) > 1 or references:
                axis.legend()
            axis.grid(alpha=0.3)
        else:
            axis.text(
                0.5, 0.5, "no data logged", ha="center", va="center", transform=axis.transAxes, color="gray"
            )
        if y_label == "accuracy":
            axis.set_ylim(0.0, 1.0)
        axis.set(title=panel_title, xlabel="optimizer step", ylabel=y_label)
    axes[0, 2].ticklabel_format(axis="y", style="sci", scilimits=(-3, 3))
    figure.suptitle(title)
    return save_figure(figure, path)


def save_figure(figure: plt.Figure, path: str | os.PathLike, dpi: int = 100, **savefig: Any) -> Path:
    """Save `figure` as a PNG at `path` atomically (a crash leaves the previous file), then close it; `savefig`:
    more of matplotlib's savefig options (e.g. bbox_inches)."""
    path = Path(path)
    try:
        with atomic_path(path) as temp_path:
            figure.savefig(temp_path, format="png", dpi=dpi, **savefig)
    finally:
        plt.close(figure)
    return path
