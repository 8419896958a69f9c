"""`--learning_rate auto`: which rate each model is fine-tuned at, chosen on folds of the training rows alone.

Each rate of the grid is fitted once per fold (fold i with the i-th seed of --seeds, in turn) and scored on
the fold's held-out rows. One split and one seed made the choice a coin toss (a rate won by three rows of 40,
and a seed then collapsed at it), so a rate at which any fold's fit collapsed or underfitted (hfbert.finetune.fit)
is dropped, and the others are ranked by the mean over the folds minus their spread (standard deviation): a rate
that is good on average but erratic loses to a steady one.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass

from hfbert.finetune.fit import FitResult

# RateChoice.note when every rate had a collapsed or underfitted fold
EVERY_RATE_FAILED = (
    "a fit collapsed or underfitted at every rate of the grid, so the rate with the fewest such folds and then "
    "the best mean minus spread is used; pass more training rows or epochs, or another --learning_rate_grid"
)


@dataclass(frozen=True)
class FoldFit:
    """Where one selection fit ran: its rate, its fold (from 0) and its seed."""

    rate: float
    fold: int
    seed: int


def selection_plan(rates: Sequence[float], folds: int, seeds: Sequence[int]) -> list[FoldFit]:
    """Every fit the choice makes, rates in increasing order, then folds."""
    return [FoldFit(rate, fold, seeds[fold % len(seeds)]) for rate in sorted(rates) for fold in range(folds)]


@dataclass(frozen=True)
class RateChoice:
    """The rate chosen and, per rate, its fold scores, its mean minus spread, and why it was dropped."""

    chosen: float
    metric: str
    fold_scores: dict[float, list[float]]
    ranking: dict[float, float]  # mean minus spread over the folds
    dropped: dict[float, str]  # rate -> why (a collapsed or underfitted fold)
    note: str | None  # said when every rate had a collapsed or underfitted fold

    def as_json(self) -> dict:
        return {
            "chosen": self.chosen,
            "metric": self.metric,
            "rule": "rates with a collapsed or underfitted fold dropped; the best mean minus spread over the folds (lower rate on a tie)",
            "fold_scores": {f"{rate:g}": scores for rate, scores in self.fold_scores.items()},
            "mean_minus_spread": {f"{rate:g}": score for rate, score in self.ranking.items()},
            "dropped": {f"{rate:g}": why for rate, why in self.dropped.items()},
            "note": self.note,
        }


def choose_rate(fits: dict[FoldFit, FitResult], metric: str) -> RateChoice:
    """The rule, applied to every selection fit's result on its fold's held-out rows."""
    fold_scores: dict[float, list[float]] = {}
    failed: dict[float, list[str]] = {}  # rate -> each collapsed or underfitted fold, as `dropped` says it
    for where, result in sorted(fits.items(), key=lambda item: (item[0].rate, item[0].fold)):
        fold_scores.setdefault(where.rate, []).append(result.metrics[metric])
        failed.setdefault(where.rate, [])
        if result.collapse or result.underfit:
            how = f"collapsed: {result.collapse}" if result.collapse else f"underfitted: {result.underfit}"
            failed[where.rate].append(f"fold {where.fold + 1} (seed {where.seed}) {how}")
    ranking = {
        rate: statistics.fmean(scores) - (statistics.stdev(scores) if len(scores) > 1 else 0.0)
        for rate, scores in fold_scores.items()
    }
    dropped = {rate: folds[0] for rate, folds in failed.items() if folds}
    # with every rate dropped, the rates with the fewest failed folds compete, and the report says so
    kept = [rate for rate, folds in failed.items() if len(folds) == min(map(len, failed.values()))]
    note = EVERY_RATE_FAILED if dropped.keys() == failed.keys() else None
    chosen = max(kept, key=lambda rate: (ranking[rate], -rate))
    return RateChoice(chosen, metric, fold_scores, ranking, dropped, note)
