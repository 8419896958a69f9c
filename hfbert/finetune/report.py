"""What a fine-tuning comparison reports: per model the scores over seeds and the fits that collapsed, the gain
paired per seed with how sure it is, a per-seed plot, and the model card's `model-index` entries."""

from __future__ import annotations

import math
import os
import statistics
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from hfbert.errors import Refusal
from hfbert.files import atomic_path
from hfbert.finetune.models import COMPARISON_ROLE, MODEL_ROLE, describe
from hfbert.finetune.settings import FinetuneDataArguments
from hfbert.plotting import save_figure

# Student's t at 97.5% for 1..30 degrees of freedom (a 95% interval of a mean of paired differences); written
# out because scipy is not a dependency. Past 30 the normal's 1.96.
T_975 = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160, 2.145, 2.131,
         2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042)  # fmt: skip


def spread(values: list[float]) -> dict[str, Any]:
    """The mean and standard deviation (0 for one value) of per-seed `values`, and the values."""
    std = statistics.stdev(values) if len(values) > 1 else 0.0
    return {"mean": statistics.fmean(values), "std": std, "per_seed": values}


def paired_gain(
    first: dict[str, Any], second: dict[str, Any], seeds: Sequence[int]
) -> dict[str, dict[str, Any]]:
    """Per metric: the per-seed differences first - second (same seed and data order for both models), their
    mean and spread, a 95% interval of the mean (Student's t), how many seeds the first is ahead at, and
    whether the difference is beyond the seed-to-seed noise."""
    out = {}
    for metric, stats in first.items():
        differences = [a - b for a, b in zip(stats["per_seed"], second[metric]["per_seed"], strict=True)]
        gain = spread(differences)
        degrees = len(differences) - 1
        t = T_975[degrees - 1] if degrees <= len(T_975) else 1.96
        half_width = t * gain["std"] / math.sqrt(len(differences))
        interval = [gain["mean"] - half_width, gain["mean"] + half_width] if len(differences) > 1 else None
        out[metric] = {
            **gain,
            "per_seed": dict(zip(map(str, seeds), differences, strict=True)),
            "interval_95": interval,
            "ahead_at": sum(difference > 0 for difference in differences),
            "behind_at": sum(difference < 0 for difference in differences),
            "verdict": gain_verdict(gain["mean"], interval, len(differences)),
        }
    return out


def gain_verdict(mean: float, interval: list[float] | None, seeds: int) -> str:
    if interval is None:
        return "one seed: no spread to judge it by; run more seeds with --seeds 1 2 3 4 5"
    if interval[0] <= 0 <= interval[1]:
        more = " ".join(str(seed) for seed in range(1, max(2 * seeds, 5) + 1))
        return (
            f"within the seed-to-seed noise (the 95% interval holds 0); run more seeds, e.g. --seeds {more}"
        )
    return "ahead beyond the seed-to-seed noise" if mean > 0 else "behind beyond the seed-to-seed noise"


def report_table(results: dict[str, Any]) -> str:
    """Markdown: per model (by role) and metric, mean ± std over seeds and the per-seed values; each model's
    rate and how it was chosen; every collapsed fit by name; the paired gain with its interval and verdict."""
    lines = ["| role | weights | metric | mean ± std | per seed |", "|---|---|---|---|---|"]
    weights = {role: describe(model["folder"], model["init"]) for role, model in results["models"].items()}
    for role, model in results["models"].items():
        collapsed = model.get("collapsed", {})
        for metric, stats in model["summary"].items():
            seeds = ", ".join(
                f"{value:.3f}" + (" (collapsed)" if str(seed) in collapsed else "")
                for seed, value in zip(results["seeds"], stats["per_seed"], strict=True)
            )
            lines.append(
                f"| {role} | {weights[role]} | {metric} | {stats['mean']:.3f} ± {stats['std']:.3f} | {seeds} |"
            )
    for role, model in results["models"].items():
        lines.append(f"\nLearning rate of the {role} ({weights[role]}): {rate_text(model)}")
        for seed, why in model.get("collapsed", {}).items():
            lines.append(f"COLLAPSED: the {role}'s seed {seed}: {why}; its mean above counts it")
    for metric, gain in results.get("gain", {}).items():
        seeds = len(gain["per_seed"])
        low_high = gain["interval_95"]
        interval = f", 95% interval [{low_high[0]:+.3f}, {low_high[1]:+.3f}]" if low_high else ""
        per_seed = ", ".join(f"{value:+.3f}" for value in gain["per_seed"].values())
        lines.append(
            f"\nGain in {metric} of the model over the comparison ({weights[COMPARISON_ROLE]}), paired per "
            f"seed: {gain['mean']:+.3f} ± {gain['std']:.3f} over {seeds} seed{'s' if seeds != 1 else ''} "
            f"({per_seed}){interval}; "
            f"ahead at {gain['ahead_at']} of {seeds}: {gain['verdict']}"
        )
    return "\n".join(lines)


def rate_text(model: dict[str, Any]) -> str:
    selection = model.get("learning_rate_selection")
    epochs = f"{model['num_train_epochs']:g} epochs"
    if not selection:
        return f"{model['learning_rate']:g}, as passed; {epochs}"
    scores = ", ".join(
        f"{rate}: {statistics.fmean(values):.3f}"
        + (" (dropped: a fold failed)" if rate in selection["dropped"] else "")
        for rate, values in selection["fold_scores"].items()
    )
    note = f" ({selection['note']})" if selection["note"] else ""
    return (
        f"{model['learning_rate']:g}, chosen on {selection['chosen_on']} by {selection['metric']} (mean over the "
        f"folds: {scores}){note}; {epochs}"
    )


def plot_results(results: dict[str, Any], path: Path) -> Path:
    """Accuracy per seed, one marker series per model; collapsed fits drawn as crosses."""
    import matplotlib.pyplot as plt  # after hfbert.plotting chose the headless backend

    figure, axis = plt.subplots(figsize=(5.5, 3.5), constrained_layout=True)
    labels = []
    for offset, (role, model) in enumerate(results["models"].items()):
        values = model["summary"]["accuracy"]["per_seed"]
        collapsed = [str(seed) in model.get("collapsed", {}) for seed in results["seeds"]]
        labels.append(f"{role}\n{describe(Path(model['folder']).name, model['init'])}")
        kept = [value for value, bad in zip(values, collapsed, strict=True) if not bad]
        failed = [value for value, bad in zip(values, collapsed, strict=True) if bad]
        if kept:
            axis.scatter([offset] * len(kept), kept, color=f"C{offset}", label=role)
        if failed:
            axis.scatter([offset] * len(failed), failed, marker="x", color="red", label=f"{role}: collapsed")
        axis.hlines(statistics.fmean(values), offset - 0.2, offset + 0.2, color="black")
    axis.set_xticks(range(len(labels)), labels, fontsize=8)
    axis.set_ylabel("accuracy (evaluation split)")
    axis.set_title(f"Fine-tuned accuracy per seed (seeds {results['seeds']})", fontsize=9)
    axis.legend(fontsize=7)
    axis.grid(alpha=0.3)
    return save_figure(figure, path)


def check_model_card(card_path: Path) -> None:
    """Refuse, before any training, a card whose metadata `add_to_model_card` could not read afterwards."""
    import yaml
    from huggingface_hub import ModelCard

    if card_path.is_symlink() or card_path.is_dir():  # written as a file in its place: the link's text, gone
        shown = f"a symbolic link (to {os.readlink(card_path)})" if card_path.is_symlink() else "a folder"
        raise Refusal(
            f"--update_model_card: {card_path} is {shown}, and the card is written as a regular file in its "
            "place: put the card itself there, or remove it and a new one is written"
        )
    if not card_path.is_file():
        return
    try:
        ModelCard.load(card_path)
    except (yaml.YAMLError, ValueError) as error:
        reason = " ".join(str(error).split())[:200]
        raise Refusal(
            f"--update_model_card: the metadata of {card_path} (its YAML front matter) cannot be read ({reason}); "
            "fix it, or move the card away and a new one is written"
        ) from None


def add_to_model_card(folder: Path, results: dict[str, Any], data: FinetuneDataArguments) -> Path:
    """Add the fine-tuned metrics of the model under test (never the comparison's) to its folder's model card
    as `model-index` entries (Hub metadata) for the Hub set, or for the evaluation file by its name (shown
    with the training file's): the mean as the value, and the seeds, each seed's value, the rate and how it
    was chosen as the metric's args; keeps the card's text and its other results; written atomically."""
    from huggingface_hub import EvalResult, ModelCard

    if data.dataset_name is not None:
        dataset, dataset_config, dataset_name = data.dataset_name, data.dataset_config_name, data.dataset_name
    else:  # local files: named after what was evaluated on and what was trained on
        dataset, dataset_config = Path(data.validation_file).name, None
        dataset_name = f"{dataset} (fine-tuned on {Path(data.train_file).name})"
    card_path = folder / "README.md"
    card = ModelCard.load(card_path) if card_path.is_file() else ModelCard("---\n---\n")
    data = card.data
    data.model_name = data.model_name or folder.name
    entries = [
        result for result in (data.eval_results or [])
        if not (result.task_type == "text-classification" and result.dataset_type == dataset)
    ]  # fmt: skip
    model = results["models"][MODEL_ROLE]
    how = "query/key re-initialised, " if results["settings"].get("reinit_query_key") else ""
    seed_count = f"{len(results['seeds'])} seed" + ("s" if len(results["seeds"]) != 1 else "")
    chosen = "chosen on folds of the training rows" if model["learning_rate_selection"] else "as passed"
    for metric, stats in model["summary"].items():
        entries.append(
            EvalResult(
                task_type="text-classification",
                dataset_type=dataset,
                dataset_name=dataset_name,
                dataset_config=dataset_config,
                dataset_split=results["evaluation_split"],
                metric_type=metric,
                metric_value=round(stats["mean"], 4),
                metric_name=f"{metric} (fine-tuned, {how}mean of {seed_count})",
                metric_args={
                    "seeds": list(results["seeds"]),
                    "per_seed": [round(value, 4) for value in stats["per_seed"]],
                    "learning_rate": model["learning_rate"],
                    "learning_rate_choice": chosen,
                    "num_train_epochs": model["num_train_epochs"],
                    "collapsed_seeds": sorted(model.get("collapsed", {})),
                },
            )
        )
    data.eval_results = entries
    with atomic_path(card_path) as temp_path:
        card.save(temp_path)
    return card_path
