"""Replays the run-health detectors over finished runs' log_history.json and says how far each run was from
each threshold (the margins behind the constants of hfbert/pretraining/extras/health), the events (an outgrown one as
kind@update->update) and, last, how many of the runs each kind warned (still open at the end or outgrown) or
noted; draws their curves side by side with the baselines: benchmarks/results/run_health.md.

    python -m benchmarks.run_health --baselines runs/x/run_health.json --png out.png name=runs/x name2=runs/y

A folder without run_health.json (written by runs before the health section) takes the --baselines file's; a
checkpoint folder replays the log history saved in it.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # after matplotlib.use

from hfbert.checkpointing import read_progress
from hfbert.pretraining.extras.health.corpus import NOTE_KINDS, Baselines, CorpusHealth
from hfbert.pretraining.extras.health.signatures import (
    LOSS_SPIKE_MIN_ROWS,
    LOSS_SPIKE_ROWS,
    NSP_SHARE,
    PLATEAU_SHARE,
    STALL_EVALUATIONS,
    detect_events,
    is_evaluation_row,
    nsp_chance_line,
    recent_gains,
    text_passes_per_update,
)
from hfbert.pretraining.training import Budget


def read_run(folder: Path, fallback: Baselines | None) -> tuple[list[dict[str, Any]], Baselines | None, dict[str, Any]]:
    """A final folder's log_history.json and training_args.json, or a checkpoint's (its saved progress and
    run_settings.json: a run still going)."""
    if (folder / "log_history.json").is_file():
        history = json.loads((folder / "log_history.json").read_text())
        training_args = json.loads((folder / "training_args.json").read_text())
    else:
        history = read_progress(folder)["log_history"]
        training_args = json.loads((folder / "run_settings.json").read_text())
    health = folder / "run_health.json"
    baselines = CorpusHealth.from_dict(json.loads(health.read_text())).baselines if health.is_file() else fallback
    return history, baselines, training_args


def largest_ratio(values: list[float]) -> float:
    """The largest value / running median of the LOSS_SPIKE_ROWS values before it."""
    ratios = [
        value / statistics.median(values[max(0, i - LOSS_SPIKE_ROWS) : i])
        for i, value in enumerate(values)
        if i >= LOSS_SPIKE_MIN_ROWS
    ]
    return max(ratios, default=math.nan)


def margins(history: list[dict[str, Any]], baselines: Baselines | None, training_args: dict[str, Any]) -> dict[str, Any]:
    budget = Budget.of_training_args(training_args)
    training = [row for row in history if not is_evaluation_row(row)]
    evaluations = [row for row in history if is_evaluation_row(row)]
    share = [budget.share_spent(row["step"], row.get("train_seconds", 0.0)) for row in evaluations]
    result: dict[str, Any] = {
        "updates": training[-1]["step"] if training else 0,
        "largest loss / running median": largest_ratio([row["loss"] for row in training]),
        "largest grad norm / running median": largest_ratio([row["grad_norm"] for row in training if "grad_norm" in row]),
    }
    if baselines is not None:
        past = [row["eval_mlm_loss"] - baselines.unigram_mlm_loss for row, s in zip(evaluations, share, strict=False) if s >= PLATEAU_SHARE]
        result["eval MLM loss - unigram, from a quarter on (largest)"] = max(past, default=math.nan)
        line = nsp_chance_line(baselines)
        if line is not None:
            nsp = [row["eval_nsp_accuracy"] - line for row, s in zip(evaluations, share, strict=False) if s >= NSP_SHARE]
            result["eval NSP accuracy - chance line, from half on (smallest)"] = min(nsp, default=math.nan)
            result["training NSP accuracy - chance, from half on (smallest of the rows)"] = min(
                (row["train_nsp_accuracy"] - baselines.nsp_chance_accuracy for row in training
                 if "train_nsp_accuracy" in row and budget.share_spent(row["step"], row.get("train_seconds", 0.0)) >= NSP_SHARE),
                default=math.nan)
    state, events = detect_events(history, baselines, budget, text_passes_per_update(training_args))
    gains = [recent_gains(state.scores[: i + 1]) for i in range(len(state.scores))]
    result[f"evaluations whose last {STALL_EVALUATIONS} beat no earlier held-out MLM loss"] = sum(
        1 for gain in gains if gain is not None and not gain[0])
    result["... nor held-out MLM accuracy nor training loss"] = sum(
        1 for gain in gains if gain is not None and not any(gain))
    result["events"] = [
        f"{event.kind}@{event.update}" + ("" if event.resolved_at is None else f"->{event.resolved_at}")
        for event in events
    ] or ["none"]
    result["open warnings"] = [e.kind for e in events if e.resolved_at is None and e.kind not in NOTE_KINDS]
    result["notes"] = [event.message for event in events if event.kind in NOTE_KINDS]
    return result


def _rate_key(event_name: str) -> str:
    if event_name.split("@")[0] in NOTE_KINDS:
        return "noted"
    return "warned, outgrown" if "->" in event_name else "warned, open at the end"


def rates(results: list[dict[str, Any]]) -> dict[str, Any]:
    """How many of the runs each kind warned (open at the end, or outgrown) or noted."""
    counts: dict[str, dict[str, int]] = {"warned, open at the end": {}, "warned, outgrown": {}, "noted": {}}
    for result in results:
        for key, kind in {(_rate_key(name), name.split("@")[0]) for name in result["events"] if name != "none"}:
            counts[key][kind] = counts[key].get(kind, 0) + 1
    return {"runs": len(results), **counts}


def plot_runs(runs: dict[str, tuple[list[dict[str, Any]], Baselines | None]], path: Path) -> None:
    keys = (("eval_mlm_loss", "held-out MLM loss"), ("eval_nsp_accuracy", "held-out NSP accuracy"), ("loss", "training loss"))
    figure, axes = plt.subplots(1, 3, figsize=(15, 4), constrained_layout=True)
    for name, (history, _baselines) in runs.items():
        for axis, (key, _) in zip(axes, keys, strict=True):
            rows = [row for row in history if key in row]
            axis.plot([row["step"] for row in rows], [row[key] for row in rows], label=name)
    for axis, (_, title) in zip(axes, keys, strict=True):
        axis.set_title(title)
        axis.set_xlabel("update")
        axis.grid(alpha=0.3)
    unigram = {b.unigram_mlm_loss for _, b in runs.values() if b is not None}
    for value in sorted(unigram):
        axes[0].axhline(value, color="gray", linestyle="--", linewidth=1)
    for baselines in {b for _, b in runs.values() if b is not None and b.nsp_chance_accuracy is not None}:
        axes[1].axhline(baselines.nsp_chance_accuracy, color="gray", linestyle="--", linewidth=1)
        axes[1].axhline(nsp_chance_line(baselines), color="gray", linestyle=":", linewidth=1)
    axes[0].legend(fontsize=8)
    figure.savefig(path, dpi=90)
    plt.close(figure)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--baselines", type=Path, help="a run_health.json whose baselines runs without one take")
    parser.add_argument("--png", type=Path)
    parser.add_argument("runs", nargs="+", help="name=folder")
    args = parser.parse_args()
    fallback = CorpusHealth.from_dict(json.loads(args.baselines.read_text())).baselines if args.baselines else None
    runs, results = {}, []
    for spec in args.runs:
        name, folder = spec.split("=", 1)
        history, baselines, training_args = read_run(Path(folder), fallback)
        runs[name] = (history, baselines)
        results.append(margins(history, baselines, training_args))
        print(json.dumps({"run": name, **results[-1]}))
    print(json.dumps(rates(results)))
    if args.png:
        plot_runs(runs, args.png)


if __name__ == "__main__":
    main()
