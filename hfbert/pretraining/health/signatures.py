"""The signatures of a run going nowhere, named while they happen, and the callback that watches for them.

Every detector reads only log rows (training rows: loss, learning rate, gradient norm; evaluation rows: the
held-out losses and accuracies) and the share of the budget each row was logged at, so the state of a run's
health is a fold over its `log_history`: a resumed run replays it and continues, and `detect_events` gives
the same events from a finished run's log_history.json. No detector touches a tensor: the rows are already
on the host when the loop logs them.
"""

from __future__ import annotations

import logging
import math
import statistics
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, Protocol

from hfbert.checkpointing import TrainingProgress
from hfbert.pretraining.callbacks import Callback
from hfbert.pretraining.health.corpus import Baselines, CorpusHealth, HealthEvent

logger = logging.getLogger(__name__)

# Thresholds on the log rows (measured figures: benchmarks/results/run_health.md).
# A plateau is named after a quarter of the budget: healthy runs measured are under it by 8-17 % of theirs.
PLATEAU_SHARE = 0.25
# Held-out MLM loss above the unigram baseline minus this (nats) is "still on the plateau": healthy runs
# measured are 0.6+ nats below it from a quarter of the budget on, rates of 1e-9 and 5e-2 above it.
PLATEAU_MARGIN = 0.25
# NSP is judged after half the budget: it comes off chance later than MLM (the README's main job is under
# the line below at a third of its budget, 0.576 against 0.578, and above it from half on).
NSP_SHARE = 0.5
# "At chance" is within this many standard errors of the chance accuracy, for the evaluation's instance
# count: a run truly at chance is below the line 98 % of the time at each evaluation.
NSP_CHANCE_STANDARD_ERRORS = 2.0
# ... at this many evaluations in a row, the last past NSP_SHARE: one evaluation of a run that is learning
# NSP slowly can dip under the line (the main job is 1 standard error above it at half its budget).
NSP_CHANCE_EVALUATIONS = 2
# "While MLM improves": held-out MLM loss this far (nats) below the first evaluation's, five times the
# evaluation noise; a run without it is stuck on MLM too, which unigram_plateau or stalled name.
NSP_MLM_IMPROVEMENT = 0.05
LOSS_SPIKE_WINDOW = 20  # training rows in the running median (200 updates at the default --logging_steps)
LOSS_SPIKE_MIN_ROWS = 5  # rows needed before the median means anything
# A row's loss this many times the running median is a spike; healthy runs measured reach 1.08x at most.
LOSS_SPIKE_FACTOR = 1.5
# A logging window's largest gradient norm this many times the running median of earlier ones: above the
# 3.5x of a tiny run at a rate of 3 (whose loss spike fires first); not yet measured on a healthy long run.
GRAD_NORM_JUMP_FACTOR = 10.0
# Learning stopped: this many evaluations in a row without a better held-out MLM loss ...
STALL_EVALUATIONS = 4
STALL_MIN_IMPROVEMENT = 0.01  # ... better by at least this (nats; evaluation noise on 490 instances is ~0.01)
STALL_RATE_SHARE = 0.5  # ... while the rate is at least this share of its peak (a decayed rate may stall)


class BudgetShare(Protocol):
    """What `hfbert.pretraining.setup.Budget` answers: the share of the budget spent at (step, seconds)."""

    def share_spent(self, step: int, seconds: float) -> float: ...


@dataclass(frozen=True)
class BudgetLimits:
    """A finished run's budget as training_args.json records it (`Budget.share_spent` without the schedule), to
    replay its log_history."""

    max_train_steps: int | None
    max_train_seconds: float | None = None

    @classmethod
    def of_training_args(cls, training_args: dict[str, Any]) -> BudgetLimits:
        steps = training_args.get("max_train_steps") or training_args.get("planned_train_steps")
        return cls(steps, training_args.get("max_train_seconds"))

    def share_spent(self, step: int, seconds: float) -> float:
        spent = step / self.max_train_steps if self.max_train_steps else 0.0
        if self.max_train_seconds:
            spent = max(spent, seconds / self.max_train_seconds)
        return min(spent, 1.0)


@dataclass
class SignatureState:
    """What the detectors remember between rows; a fold over the log rows (`observe_row`)."""

    losses: deque[float] = field(default_factory=lambda: deque(maxlen=LOSS_SPIKE_WINDOW))
    grad_norms: deque[float] = field(default_factory=lambda: deque(maxlen=LOSS_SPIKE_WINDOW))
    learning_rate: float = 0.0
    peak_learning_rate: float = 0.0
    evaluations: int = 0
    best_eval_loss: float = math.inf
    evaluations_without_improvement: int = 0
    nsp_evaluations_at_chance: int = 0
    first_eval_loss: float | None = None
    fired: set[str] = field(default_factory=set)


def is_evaluation_row(row: dict[str, Any]) -> bool:
    return "eval_mlm_loss" in row


def _finite(value: Any) -> bool:
    return isinstance(value, (int, float)) and math.isfinite(value)


def _spike(name: str, value: float, earlier: deque[float], factor: float) -> str | None:
    if len(earlier) < LOSS_SPIKE_MIN_ROWS:
        return None
    median = statistics.median(earlier)
    if median <= 0 or value <= factor * median:
        return None
    return f"{name} {value:.4g} is {value / median:.1f}x its running median {median:.4g} (threshold {factor:g}x)"


def training_row_events(row: dict[str, Any], state: SignatureState) -> list[HealthEvent]:
    """Loss spikes and gradient-norm jumps; then the row joins the running windows."""
    found = []
    loss, grad_norm = row.get("loss"), row.get("grad_norm")
    spike = _spike("training loss", loss, state.losses, LOSS_SPIKE_FACTOR) if _finite(loss) else None
    if spike is None and _finite(grad_norm):
        spike = _spike("the largest gradient norm", grad_norm, state.grad_norms, GRAD_NORM_JUMP_FACTOR)
    if spike is not None:
        found.append(HealthEvent("loss_spike", int(row["step"]), (
            f"update {row['step']}: {spike}: the learning rate is too high for this model and batch; lower "
            "--learning_rate, lengthen --num_warmup_steps, keep --max_grad_norm at 1.0")))
    if _finite(loss):
        state.losses.append(float(loss))
    if _finite(grad_norm):
        state.grad_norms.append(float(grad_norm))
    if _finite(row.get("learning_rate")):
        state.learning_rate = float(row["learning_rate"])
        state.peak_learning_rate = max(state.peak_learning_rate, state.learning_rate)
    return found


def plateau_event(row: dict[str, Any], baselines: Baselines, share: float) -> HealthEvent | None:
    loss, unigram = row["eval_mlm_loss"], baselines.unigram_mlm_loss
    if share < PLATEAU_SHARE or loss < unigram - PLATEAU_MARGIN:
        return None
    return HealthEvent("unigram_plateau", int(row["step"]), (
        f"update {row['step']}: held-out MLM loss {loss:.3f} is not below the unigram baseline {unigram:.3f} by "
        f"{PLATEAU_MARGIN} after {share:.0%} of the budget: the model predicts word frequencies and nothing "
        "else. Usual causes, in order (docs/run_health.md counts them): duplicated text (the corpus statistics "
        "at the start of the run), the batch (raise --per_device_train_batch_size or "
        "--gradient_accumulation_steps), the learning rate or warm-up, too small or far too large (both end "
        "here: 1e-3 suits tiny/mini, 1e-4 base, with --num_warmup_steps 1-5 % of the updates)"))


def nsp_chance_line(baselines: Baselines) -> float | None:
    """The held-out NSP accuracy at or below which NSP is at chance, for the evaluation's instance count."""
    chance = baselines.nsp_chance_accuracy
    if chance is None or baselines.nsp_eval_instances == 0:
        return None
    error = math.sqrt(chance * (1 - chance) / baselines.nsp_eval_instances)
    return chance + NSP_CHANCE_STANDARD_ERRORS * error


def nsp_event(
    row: dict[str, Any], state: SignatureState, baselines: Baselines, share: float
) -> HealthEvent | None:
    line, accuracy = nsp_chance_line(baselines), row.get("eval_nsp_accuracy")
    if line is None or not _finite(accuracy):
        return None
    at_chance = accuracy <= line
    state.nsp_evaluations_at_chance = state.nsp_evaluations_at_chance + 1 if at_chance else 0
    first = state.first_eval_loss
    mlm_learns = first is not None and row["eval_mlm_loss"] < first - NSP_MLM_IMPROVEMENT
    if share < NSP_SHARE or state.nsp_evaluations_at_chance < NSP_CHANCE_EVALUATIONS or not mlm_learns:
        return None
    return HealthEvent("nsp_at_chance", int(row["step"]), (
        f"update {row['step']}: held-out NSP accuracy {accuracy:.3f} is at chance ({baselines.nsp_chance_accuracy:.3f}, "
        f"within {NSP_CHANCE_STANDARD_ERRORS:g} standard errors: {line:.3f}) at {state.nsp_evaluations_at_chance} "
        f"evaluations in a row, after {share:.0%} of the budget, "
        f"while MLM improves (held-out loss {first:.3f} -> {row['eval_mlm_loss']:.3f}). Usual causes, in order: too few updates yet (NSP comes off chance later than MLM: "
        "the README's tiny model after about 2,500 updates of 16 pairs; a longer budget tells), documents that "
        "are not in order or not documents (check --document_boundary: shuffled lines or one sentence per "
        "document leave nothing to tell real next sentences from random ones), a small --nsp_loss_weight; or "
        "drop NSP with --objective mlm"))


def stall_event(row: dict[str, Any], state: SignatureState) -> HealthEvent | None:
    loss = row["eval_mlm_loss"]
    if loss < state.best_eval_loss - STALL_MIN_IMPROVEMENT:
        state.best_eval_loss, state.evaluations_without_improvement = loss, 0
        return None
    state.evaluations_without_improvement += 1
    rate, peak = state.learning_rate, state.peak_learning_rate
    if state.evaluations_without_improvement < STALL_EVALUATIONS or rate < STALL_RATE_SHARE * peak or peak == 0:
        return None
    return HealthEvent("stalled", int(row["step"]), (
        f"update {row['step']}: held-out MLM loss has not improved by {STALL_MIN_IMPROVEMENT} over "
        f"{state.evaluations_without_improvement} evaluations (best {state.best_eval_loss:.3f}, now {loss:.3f}) "
        f"while the learning rate is still {rate:.2e} ({rate / peak:.0%} of its peak). Usual causes, in order: "
        "too early to judge (a plateau that more updates end: the next evaluations tell), a small corpus seen "
        "many times (more text helps, more --dupe_factor does not), a rate too high to settle (lower "
        "--learning_rate); or stop earlier"))


def evaluation_row_events(
    row: dict[str, Any], state: SignatureState, baselines: Baselines | None, share: float
) -> list[HealthEvent]:
    """Plateau, NSP at chance and learning stopped, at an evaluation."""
    state.evaluations += 1
    if not _finite(row.get("eval_mlm_loss")):
        return []
    found = [stall_event(row, state)]
    if baselines is not None:
        found += [plateau_event(row, baselines, share), nsp_event(row, state, baselines, share)]
    if state.first_eval_loss is None:
        state.first_eval_loss = row["eval_mlm_loss"]
    return [event for event in found if event is not None]


def observe_row(
    row: dict[str, Any], state: SignatureState, baselines: Baselines | None, budget: BudgetShare
) -> list[HealthEvent]:
    """The events `row` fires for the first time (each kind fires once in a run)."""
    if is_evaluation_row(row):
        share = budget.share_spent(int(row["step"]), float(row.get("train_seconds", 0.0)))
        found = evaluation_row_events(row, state, baselines, share)
    else:
        found = training_row_events(row, state)
    new = [event for event in found if event.kind not in state.fired]
    state.fired.update(event.kind for event in new)
    return new


def detect_events(
    rows: Iterable[dict[str, Any]], baselines: Baselines | None, budget: BudgetShare
) -> tuple[SignatureState, list[HealthEvent]]:
    """Replay `rows` (a log_history) through the detectors: the state after them and every event fired."""
    state, events = SignatureState(), []
    for row in rows:
        events += observe_row(row, state, baselines, budget)
    return state, events


class RunHealth(Callback):
    """Names the corpus warnings before the first update and each signature the first time it fires, one
    line each on the main process; `events` holds them all (a resumed run replays its log history)."""

    def __init__(self, corpus: CorpusHealth | None, budget: BudgetShare, main_process: bool):
        self.corpus = corpus
        self.budget = budget
        self.main_process = main_process
        self.state = SignatureState()
        self.corpus_events = corpus.statistics.events() if corpus is not None else []
        self.events: list[HealthEvent] = list(self.corpus_events)

    @property
    def baselines(self) -> Baselines | None:
        return None if self.corpus is None else self.corpus.baselines

    def warn(self, event: HealthEvent) -> None:
        if self.main_process:
            logger.warning(f"Run health, {event.kind}: {event.message}")

    def on_fit_start(self, progress: TrainingProgress, share: float) -> None:
        self.state, replayed = detect_events(progress.log_history, self.baselines, self.budget)
        self.events = [*self.corpus_events, *replayed]
        if not self.main_process:
            return
        if progress.completed_steps == 0 and self.corpus is not None:
            logger.info(f"Run health: {describe_statistics(self.corpus)}")
            for event in self.corpus_events:
                self.warn(event)
        elif replayed:
            logger.info(f"Run health: resumed with {len(replayed)} earlier warning(s): "
                        + ", ".join(f"{event.kind} at update {event.update}" for event in replayed))

    def on_log(self, row: dict[str, Any], share: float) -> None:
        for event in observe_row(row, self.state, self.baselines, self.budget):
            self.events.append(event)
            self.warn(event)

    def on_evaluate(self, row: dict[str, Any], share: float) -> None:
        if self.state.evaluations == 0 and self.baselines is not None and self.main_process:
            logger.info(f"Run health at the first evaluation: {self.baselines.describe()}")
        self.on_log(row, share)

    def on_fit_end(self, progress: TrainingProgress) -> None:
        if self.main_process:
            logger.info(f"Run health: {summary_line(self.events)}")


def summary_line(events: list[HealthEvent]) -> str:
    if not events:
        return "no warnings"
    return f"{len(events)} warning(s): " + ", ".join(f"{event.kind} (update {event.update})" for event in events)


def describe_statistics(corpus: CorpusHealth) -> str:
    figures = corpus.statistics
    short = figures.short_document_share
    return (
        f"{figures.scope}: {figures.documents:,} documents, {figures.paragraphs:,} paragraphs, {figures.tokens:,} "
        f"tokens; repeated text {figures.duplicate_share:.1%} of the tokens, [UNK] "
        f"{figures.share(figures.unknown_tokens):.2%}"
        + ("" if short is None else f", documents too short for NSP {short:.0%}")
        + f"; {corpus.baselines.describe()}"
    )
