"""The signatures of a run going nowhere, named while they happen, and the callback that watches for them.

Every detector reads only log rows (training rows: loss, NSP accuracy, learning rate, gradient norm;
evaluation rows: the held-out losses and accuracies) and the share of the budget each row was logged at, so
the state of a run's health is a fold over its `log_history`: a resumed run replays it and continues, and
`detect_events` gives the same events, and the same outgrown ones, from a finished run's log_history.json. No
detector touches a tensor: the rows are already on the host when the loop logs them.

A warning stands while its signature holds: `OUTGROWN_WHEN` says what ends each one (the others have no such
state). Held-out figures that worsen while the training ones improve are a small corpus learned too well,
not a run going nowhere: one note, `overfitting`, instead of `stalled` or `nsp_at_chance`.
"""

from __future__ import annotations

import logging
import math
import statistics
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from typing import Any

from hfbert.pretraining.callbacks import Callback, StagedFinalFolder
from hfbert.pretraining.extras.health.corpus import NOTE_KINDS, Baselines, CorpusHealth, HealthEvent
from hfbert.pretraining.extras.health.report import summary_line, write_health_report
from hfbert.pretraining.training import Budget, TrainingProgress

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
LOSS_SPIKE_ROWS = 20  # training rows in the running median (200 updates at the default --logging_steps)
LOSS_SPIKE_MIN_ROWS = 5  # rows needed before the median means anything
# A row's loss this many times the running median is a spike; healthy runs measured reach 1.08x at most.
LOSS_SPIKE_FACTOR = 1.5
# A logging window's largest gradient norm this many times the running median of earlier ones: above the
# 3.5x of a tiny run at a rate of 3 (whose loss spike fires first); not yet measured on a healthy long run.
GRAD_NORM_JUMP_FACTOR = 10.0
# Learning stopped: over the last this many evaluations, none better than every earlier one ...
STALL_EVALUATIONS = 4
STALL_MIN_IMPROVEMENT = 0.01  # ... by this (nats; evaluation noise on 490 instances is ~0.01), held-out MLM loss
# ... or held-out MLM accuracy by this (the same masked tokens at every evaluation, about 7,000 on the shipped
# sample: 15 more predicted right),
STALL_MIN_ACCURACY_GAIN = 0.002
# ... or the training loss (the mean of the rows between two evaluations) by STALL_MIN_IMPROVEMENT,
STALL_RATE_SHARE = 0.5  # ... while the rate is at least this share of its peak (a decayed rate may stall)
# NSP "learns in training" when the training rows since the last evaluation are this far above the held-out
# chance accuracy on average: a corpus whose sentences are out of order stays at chance in training too.
TRAINING_NSP_MARGIN = 0.1

# What ends each warning that can stand or not; the other kinds have none: a spike happened, a corpus figure
# is a fact of the text, and the overfitting note is said once.
OUTGROWN_WHEN = {
    "unigram_plateau": f"held-out MLM loss {PLATEAU_MARGIN} below the unigram baseline",
    "nsp_at_chance": "held-out NSP accuracy above the chance line",
    "stalled": "a better held-out MLM loss, held-out MLM accuracy or training loss",
}


def text_passes_per_update(training_args: dict[str, Any]) -> float | None:
    """How many passes over the training text an update makes, from training_args.json (or the run's summary,
    which it is): the instances are --dupe_factor pairing passes over the text. None for a stream."""
    instances, pairings = training_args.get("train_instances"), training_args.get("dupe_factor", 1)
    batch = (training_args.get("per_device_train_batch_size", 0) * training_args.get("num_processes", 1)
             * training_args.get("gradient_accumulation_steps", 1))
    return batch * pairings / instances if instances and batch else None


@dataclass
class SignatureState:
    """What the detectors remember between rows; a fold over the log rows (`observe_row`)."""

    losses: deque[float] = field(default_factory=lambda: deque(maxlen=LOSS_SPIKE_ROWS))
    grad_norms: deque[float] = field(default_factory=lambda: deque(maxlen=LOSS_SPIKE_ROWS))
    learning_rate: float = 0.0
    peak_learning_rate: float = 0.0
    evaluations: int = 0
    # (held-out MLM loss, held-out MLM accuracy, mean training loss since the evaluation before) of each
    # evaluation with a finite loss, with its update; the first one's loss is what "MLM improves" is against
    scores: list[tuple[int, float, float, float]] = field(default_factory=list)
    losses_since_evaluation: list[float] = field(default_factory=list)  # training rows since the last evaluation
    nsp_accuracies_since_evaluation: list[float] = field(default_factory=list)
    nsp_evaluations_at_chance: int = 0
    events: list[HealthEvent] = field(default_factory=list)  # every event so far, outgrown ones included


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
    loss, grad_norm = row.get("loss"), row.get("grad_norm")
    spike = _spike("training loss", loss, state.losses, LOSS_SPIKE_FACTOR) if _finite(loss) else None
    if spike is None and _finite(grad_norm):
        spike = _spike("the largest gradient norm", grad_norm, state.grad_norms, GRAD_NORM_JUMP_FACTOR)
    found = [] if spike is None else [HealthEvent("loss_spike", int(row["step"]), (
        f"update {row['step']}: {spike}: the learning rate is too high for this model and batch; lower "
        "--learning_rate, lengthen --num_warmup_steps, keep --max_grad_norm at 1.0"))]
    if _finite(loss):
        state.losses.append(float(loss))
        state.losses_since_evaluation.append(float(loss))
    if _finite(row.get("train_nsp_accuracy")):
        state.nsp_accuracies_since_evaluation.append(float(row["train_nsp_accuracy"]))
    if _finite(grad_norm):
        state.grad_norms.append(float(grad_norm))
    if _finite(row.get("learning_rate")):
        state.learning_rate = float(row["learning_rate"])
        state.peak_learning_rate = max(state.peak_learning_rate, state.learning_rate)
    return found


def _mean(values: list[float]) -> float:
    return statistics.fmean(values) if values else math.nan


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


def overfitting_note(step: int, evidence: str, passes: float | None) -> HealthEvent:
    seen = "" if passes is None else f", after {passes:.0f} passes over the corpus"
    return HealthEvent("overfitting", step, (
        f"update {step}: {evidence}: the training text is learned better than text in general{seen}. A small "
        "corpus learned too well, not a failure; what helps: more text, --dropout 0.1, fewer passes (a shorter "
        "budget: the best held-out figures and their update are in log_history.json)"))


def nsp_event(
    row: dict[str, Any], state: SignatureState, baselines: Baselines, share: float, passes: float | None
) -> HealthEvent | None:
    """NSP at chance held out; a note where the training pairs' NSP accuracy shows it learns them."""
    line, accuracy = nsp_chance_line(baselines), row.get("eval_nsp_accuracy")
    if line is None or not _finite(accuracy):
        return None
    state.nsp_evaluations_at_chance = state.nsp_evaluations_at_chance + 1 if accuracy <= line else 0
    first = state.scores[0][1]  # the first evaluation's own (at the first: no improvement)
    mlm_learns = row["eval_mlm_loss"] < first - NSP_MLM_IMPROVEMENT
    if share < NSP_SHARE or state.nsp_evaluations_at_chance < NSP_CHANCE_EVALUATIONS or not mlm_learns:
        return None
    step, chance, training = int(row["step"]), baselines.nsp_chance_accuracy, _mean(state.nsp_accuracies_since_evaluation)
    held_out = (f"held-out NSP accuracy {accuracy:.3f} is at chance ({chance:.3f}, within "
                f"{NSP_CHANCE_STANDARD_ERRORS:g} standard errors: {line:.3f}) at {state.nsp_evaluations_at_chance} "
                "evaluations in a row")
    if training > chance + TRAINING_NSP_MARGIN:  # NaN (no training NSP in the rows): not shown to learn
        evidence = f"{held_out}, while the training pairs' NSP accuracy is {training:.3f}"
        return overfitting_note(step, evidence, passes)
    return HealthEvent("nsp_at_chance", step, (
        f"update {step}: {held_out}, and the training pairs' {training:.3f}, after {share:.0%} of the budget, "
        f"while MLM improves (held-out loss {first:.3f} -> {row['eval_mlm_loss']:.3f}). Usual causes, in order: "
        "too few updates yet (NSP comes off chance later than MLM: "
        "the README's tiny model after about 2,500 updates of 16 pairs; a longer budget tells), documents that "
        "are not in order or not documents (check --document_boundary: shuffled lines or one sentence per "
        "document leave nothing to tell real next sentences from random ones), a small --nsp_loss_weight; or "
        "drop NSP with --objective mlm"))


def recent_gains(scores: list[tuple[int, float, float, float]]) -> tuple[bool, bool, bool] | None:
    """Whether the last STALL_EVALUATIONS evaluations' best held-out MLM loss, held-out MLM accuracy and
    training loss beat every earlier evaluation's; None while there is no earlier one."""
    if len(scores) <= STALL_EVALUATIONS:
        return None
    earlier, recent = scores[:-STALL_EVALUATIONS], scores[-STALL_EVALUATIONS:]

    def lowest(rows: list[tuple[int, float, float, float]], index: int, sign: float = 1.0) -> float:
        return min((sign * row[index] for row in rows if math.isfinite(row[index])), default=math.inf)

    return (
        lowest(recent, 1) < lowest(earlier, 1) - STALL_MIN_IMPROVEMENT,
        lowest(recent, 2, -1.0) < lowest(earlier, 2, -1.0) - STALL_MIN_ACCURACY_GAIN,
        lowest(recent, 3) < lowest(earlier, 3) - STALL_MIN_IMPROVEMENT,
    )


def learning_event(
    row: dict[str, Any], state: SignatureState, gains: tuple[bool, bool, bool] | None, passes: float | None
) -> HealthEvent | None:
    """Learning stopped (nothing improves) while the rate is high, or held-out MLM loss that does not improve
    while the training loss does (the note); `gains`: `recent_gains` of the scores."""
    if gains is None:
        return None
    loss_gain, accuracy_gain, training_gain = gains
    step, (_, loss, accuracy, training) = int(row["step"]), state.scores[-1]
    best_step, best_loss, best_accuracy, _ = min(state.scores, key=lambda score: score[1])
    if not loss_gain and training_gain:
        return overfitting_note(step, (
            f"held-out MLM loss {loss:.3f} has not improved on its best ({best_loss:.3f} at update {best_step}) "
            f"in {STALL_EVALUATIONS} evaluations while the training loss has ({training:.3f}; held-out MLM "
            f"accuracy now {accuracy:.3f}, {best_accuracy:.3f} at that update)"), passes)
    rate, peak = state.learning_rate, state.peak_learning_rate
    if loss_gain or accuracy_gain or rate < STALL_RATE_SHARE * peak or peak == 0:
        return None
    return HealthEvent("stalled", step, (
        f"update {step}: over {STALL_EVALUATIONS} evaluations nothing improved: held-out MLM loss (best "
        f"{best_loss:.3f}, now {loss:.3f}), held-out MLM accuracy and the training loss ({training:.3f}), while "
        f"the learning rate is still {rate:.2e} ({rate / peak:.0%} of its peak). Usual causes, in order: too "
        "early to judge (a plateau that more updates end: the next evaluations tell), a rate too high to settle "
        "(lower --learning_rate), a rate too low to move; or stop earlier"))


def evaluation_row_events(
    row: dict[str, Any], state: SignatureState, baselines: Baselines | None, budget: Budget,
    passes_per_update: float | None = None,
) -> tuple[list[HealthEvent], set[str]]:
    """Plateau, NSP at chance, learning stopped and the overfitting note at an evaluation, and the kinds
    (`OUTGROWN_WHEN`) whose signature it shows no longer holds; the messages count the passes over the text
    where `passes_per_update` is known (`text_passes_per_update`)."""
    state.evaluations += 1
    loss, step = row.get("eval_mlm_loss"), int(row["step"])
    if not _finite(loss):
        return [], set()
    share = budget.share_spent(step, float(row.get("train_seconds", 0.0)))
    passes = None if passes_per_update is None else step * passes_per_update
    accuracy = row.get("eval_mlm_accuracy")
    state.scores.append((step, loss, accuracy if _finite(accuracy) else math.nan, _mean(state.losses_since_evaluation)))
    gains = recent_gains(state.scores)
    found = [learning_event(row, state, gains, passes)]
    outgrown = {"stalled"} if gains is not None and any(gains) else set()
    if baselines is not None:
        found += [plateau_event(row, baselines, share), nsp_event(row, state, baselines, share, passes)]
        if loss < baselines.unigram_mlm_loss - PLATEAU_MARGIN:
            outgrown.add("unigram_plateau")
        line, nsp = nsp_chance_line(baselines), row.get("eval_nsp_accuracy")
        if line is not None and _finite(nsp) and nsp > line:
            outgrown.add("nsp_at_chance")
    return [event for event in found if event is not None], outgrown


def observe_row(
    row: dict[str, Any], state: SignatureState, baselines: Baselines | None, budget: Budget,
    passes_per_update: float | None = None,
) -> list[HealthEvent]:
    """The events `row` fires and those it shows outgrown (with their `resolved_at`); a kind fires again only
    after it was outgrown."""
    if is_evaluation_row(row):
        found, outgrown = evaluation_row_events(row, state, baselines, budget, passes_per_update)
        state.losses_since_evaluation, state.nsp_accuracies_since_evaluation = [], []
    else:
        found, outgrown = training_row_events(row, state), set()
    changed = []
    for index, event in enumerate(state.events):
        if event.resolved_at is None and event.kind in outgrown:
            state.events[index] = replace(event, resolved_at=int(row["step"]))
            changed.append(state.events[index])
    for event in found:
        if not any(earlier.kind == event.kind and earlier.resolved_at is None for earlier in state.events):
            state.events.append(event)
            changed.append(event)
    return changed


def detect_events(
    rows: Iterable[dict[str, Any]], baselines: Baselines | None, budget: Budget, passes_per_update: float | None = None
) -> tuple[SignatureState, list[HealthEvent]]:
    """Replay `rows` (a log_history) through the detectors: the state after them and every event fired,
    outgrown ones with their `resolved_at`."""
    state = SignatureState()
    for row in rows:
        observe_row(row, state, baselines, budget, passes_per_update)
    return state, state.events


class RunHealth(Callback):
    """Names the corpus warnings before the first update, each signature when it fires (a warning; the
    overfitting note at INFO) and when it is outgrown (INFO), one line each on the main process; `events`
    holds them all (a resumed run replays its log history). `budget`: the run's, whose shares a replay of its
    training_args.json finds too (`Budget.of_training_args`); `passes_per_update`: `text_passes_per_update`."""

    def __init__(
        self, corpus: CorpusHealth | None, budget: Budget, passes_per_update: float | None, main_process: bool
    ):
        self.corpus = corpus
        self.baselines = None if corpus is None else corpus.baselines
        self.budget, self.passes_per_update = budget, passes_per_update
        self.main_process = main_process
        self.state = SignatureState()
        self.corpus_events = corpus.statistics.events() if corpus is not None else []

    @property
    def events(self) -> list[HealthEvent]:
        return [*self.corpus_events, *self.state.events]

    def say(self, line: str, level: int = logging.INFO) -> None:
        if self.main_process:
            logger.log(level, line)

    def announce(self, event: HealthEvent) -> None:
        if event.resolved_at is not None:
            self.say(f"Run health, {event.kind} (update {event.update}): outgrown at update {event.resolved_at}: "
                     f"{OUTGROWN_WHEN[event.kind]}")
        else:
            level = logging.INFO if event.kind in NOTE_KINDS else logging.WARNING
            self.say(f"Run health, {event.kind}: {event.message}", level)

    def on_fit_start(self, progress: TrainingProgress, share: float) -> None:
        self.state, replayed = detect_events(progress.log_history, self.baselines, self.budget, self.passes_per_update)
        if progress.completed_steps == 0 and self.corpus is not None:
            self.say(f"Run health: {describe_statistics(self.corpus)}")
            for event in self.corpus_events:
                self.announce(event)
        elif replayed:
            self.say(f"Run health: resumed with the earlier events: {summary_line(replayed)}")

    def on_log(self, row: dict[str, Any], share: float) -> None:
        for event in observe_row(row, self.state, self.baselines, self.budget, self.passes_per_update):
            self.announce(event)

    def on_evaluate(self, row: dict[str, Any], share: float) -> None:
        if self.state.evaluations == 0 and self.baselines is not None:
            self.say(f"Run health at the first evaluation: {self.baselines.describe()}")
        self.on_log(row, share)

    def on_fit_end(self, progress: TrainingProgress) -> None:
        self.say(f"Run health: {summary_line(self.events)}")

    def on_final_folder(self, folder: StagedFinalFolder) -> None:
        write_health_report(folder, self.corpus, self.events)


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
