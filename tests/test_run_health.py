"""Run health (hfbert.pretraining.extras.health): corpus statistics on tiny corpora, the baselines, each signature on
made-up log rows, the replay on resume, and the final folder's health section."""

import json
import logging
import math

import numpy as np
import pytest
from datasets import Dataset

from hfbert.files import write_json_atomic
from hfbert.model_card import build_model_card
from hfbert.plotting import plot_training_curves
from hfbert.pretraining.data import StatisticsColumns, tokenized_with_statistics
from hfbert.pretraining.extras.health import corpus as health_corpus
from hfbert.pretraining.extras.health.corpus import (
    Baselines,
    CorpusHealth,
    CorpusStatistics,
    HealthEvent,
    cached_corpus_health,
    corpus_statistics,
    nsp_chance,
    unigram_cross_entropy,
)
from hfbert.pretraining.extras.health.report import (
    RUN_HEALTH_NAME,
    health_card_section,
    health_report,
    report_reference_lines,
    summary_line,
)
from hfbert.pretraining.extras.health.signatures import (
    LOSS_SPIKE_FACTOR,
    NSP_MLM_IMPROVEMENT,
    PLATEAU_MARGIN,
    RunHealth,
    detect_events,
    text_passes_per_update,
)
from hfbert.pretraining.training import Budget

UNIQUE = [f"Paragraph number {i} tells of the {i} th ship . It sailed in {1900 + i} ." for i in range(40)]
BASELINES = Baselines(unigram_mlm_loss=7.0, nsp_chance_accuracy=0.5, nsp_chance_loss=math.log(2), nsp_eval_instances=400)
BUDGET = Budget(max_train_steps=1000)


def statistics_of(documents, tokenizer, pairs=True, max_seq_length=128) -> CorpusStatistics:
    dataset = Dataset.from_dict({"paragraphs": documents})
    tokenized = tokenized_with_statistics(dataset, tokenizer)
    return corpus_statistics(tokenized, dataset, max_seq_length, pairs, "the test corpus")


def kinds(events) -> list[str]:
    return [event.kind for event in events]


def test_clean_corpus_gives_no_corpus_warning(sample_tokenizer):
    figures = statistics_of([UNIQUE[i : i + 4] for i in range(0, 40, 4)], sample_tokenizer)
    assert (figures.documents, figures.paragraphs) == (10, 40)
    assert figures.duplicate_paragraph_tokens == figures.duplicate_document_tokens == 0
    assert figures.most_repeated == [] and figures.events() == []


def test_repeated_paragraphs_are_counted_and_named(sample_tokenizer):
    repeated = "The same line again and again ."
    documents = [[UNIQUE[i], repeated, repeated] for i in range(10)]
    figures = statistics_of(documents, sample_tokenizer)
    copies = 19  # 20 copies of the line, all but the first are duplicates
    line_tokens = len(sample_tokenizer(repeated, add_special_tokens=False)["input_ids"])
    assert figures.duplicate_paragraph_tokens == copies * line_tokens
    assert figures.most_repeated[0] == (20, repeated)
    events = figures.events()
    assert kinds(events) == ["duplicate_text"] and events[0].update == 0
    assert repeated in events[0].message


def test_repeated_documents_are_counted(sample_tokenizer):
    figures = statistics_of([UNIQUE[:2], UNIQUE[:2], UNIQUE[2:4]], sample_tokenizer)
    assert figures.duplicate_document_tokens == figures.duplicate_paragraph_tokens > 0


def test_unknown_tokens_are_warned(sample_tokenizer):
    figures = statistics_of([[p + " 漢字 ☃ ★"] for p in UNIQUE], sample_tokenizer)
    assert figures.unknown_tokens >= 40
    assert "unknown_tokens" in kinds(figures.events())


def test_documents_too_short_for_a_pair(sample_tokenizer):
    one_sentence = [[f"Short one {i} ."] for i in range(10)] + [UNIQUE[:3]]
    figures = statistics_of(one_sentence, sample_tokenizer)
    assert figures.short_documents == 10
    assert kinds(figures.events()) == ["short_documents"]
    assert statistics_of(one_sentence, sample_tokenizer, pairs=False).short_documents is None


def test_unigram_cross_entropy_is_that_of_the_frequencies():
    train = np.array([0, 0, 30, 10, 0])  # ids 0 and 1 special
    held_out = np.array([5, 5, 3, 1, 0])
    p = (train[2:] + 0.5) / (train[2:] + 0.5).sum()
    expected = -(3 * math.log(p[0]) + 1 * math.log(p[1])) / 4
    assert unigram_cross_entropy(train, held_out, special_ids=[0, 1]) == pytest.approx(expected)


def test_nsp_chance_is_the_majority_label():
    accuracy, loss = nsp_chance(Dataset.from_dict({"input_ids": [[2]] * 4, "next_sentence_label": [0, 0, 0, 1]}))
    assert accuracy == 0.75 and loss == pytest.approx(-(0.75 * math.log(0.75) + 0.25 * math.log(0.25)))
    assert nsp_chance(Dataset.from_dict({"input_ids": [[2]]})) == (None, None)


def test_corpus_health_is_read_from_the_cache_the_second_time(tmp_path, sample_tokenizer, monkeypatch):
    Dataset.from_dict({"paragraphs": [UNIQUE[i : i + 4] for i in range(0, 40, 4)]}).save_to_disk(tmp_path / "d")
    documents = Dataset.load_from_disk(tmp_path / "d")
    tokenized = tokenized_with_statistics(documents, sample_tokenizer)
    evaluation = Dataset.from_dict({"input_ids": [[2, 10, 11, 3]] * 4, "next_sentence_label": [0, 1, 0, 1]})
    columns = StatisticsColumns(tokenized, documents, "x")
    first = cached_corpus_health(columns, evaluation, sample_tokenizer, 128)

    def fail(*args, **kwargs):
        raise AssertionError("computed again instead of read from the cache")

    monkeypatch.setattr(health_corpus, "corpus_statistics", fail)
    assert cached_corpus_health(columns, evaluation, sample_tokenizer, 128) == first


# ---- signatures on made-up rows ------------------------------------------------------------------------


def training_rows(losses, first_step=10, every=10, rate=1e-3, grad_norms=None):
    rows = []
    for i, loss in enumerate(losses):
        row = {"step": first_step + i * every, "train_seconds": 0.0, "loss": loss, "learning_rate": rate}
        if grad_norms is not None:
            row["grad_norm"] = grad_norms[i]
        rows.append(row)
    return rows


def evaluation_row(step, mlm_loss, nsp_accuracy=0.9):
    return {"step": step, "train_seconds": 0.0, "eval_mlm_loss": mlm_loss, "eval_nsp_accuracy": nsp_accuracy}


def test_plateau_fires_past_its_share_only():
    on_plateau = BASELINES.unigram_mlm_loss - PLATEAU_MARGIN / 2
    _, early = detect_events([evaluation_row(200, on_plateau)], BASELINES, BUDGET)  # 20 % of the budget
    _, late = detect_events([evaluation_row(300, on_plateau)], BASELINES, BUDGET)
    _, learning = detect_events([evaluation_row(300, BASELINES.unigram_mlm_loss - 1.0)], BASELINES, BUDGET)
    assert early == [] and learning == []
    assert kinds(late) == ["unigram_plateau"] and late[0].update == 300


def test_nsp_at_chance_needs_two_evaluations_past_half_while_mlm_learns():
    chance = [evaluation_row(400, 6.5, 0.51), evaluation_row(600, 6.0, 0.52)]
    assert kinds(detect_events(chance, BASELINES, BUDGET)[1]) == ["nsp_at_chance"]
    one_dip = [evaluation_row(400, 6.5, 0.70), evaluation_row(600, 6.0, 0.52)]
    assert detect_events(one_dip, BASELINES, BUDGET)[1] == []
    too_early = [evaluation_row(300, 6.5, 0.51), evaluation_row(400, 6.0, 0.52)]
    assert detect_events(too_early, BASELINES, BUDGET)[1] == []
    mlm_stuck = [evaluation_row(400, 6.0, 0.51), evaluation_row(600, 6.0 - NSP_MLM_IMPROVEMENT / 2, 0.52)]
    assert detect_events(mlm_stuck, BASELINES, BUDGET)[1] == []


def test_loss_spike_against_the_running_median():
    steady = [5.0, 5.1, 4.9, 5.0, 5.05, 4.95]
    below = training_rows([*steady, 5.0 * LOSS_SPIKE_FACTOR * 0.95])
    above = training_rows([*steady, 5.0 * LOSS_SPIKE_FACTOR * 1.05])
    assert detect_events(below, BASELINES, BUDGET)[1] == []
    events = detect_events(above, BASELINES, BUDGET)[1]
    assert kinds(events) == ["loss_spike"] and events[0].update == 70


def test_gradient_norm_jump_is_a_spike():
    norms = [1.0, 1.2, 0.9, 1.1, 1.0, 1.0, 30.0]
    events = detect_events(training_rows([5.0] * 7, grad_norms=norms), BASELINES, BUDGET)[1]
    assert kinds(events) == ["loss_spike"] and "gradient norm" in events[0].message


def test_stalled_while_the_rate_is_high_not_once_it_has_decayed():
    flat = [evaluation_row(100 * (i + 1), 5.0) for i in range(5)]
    high = [row for pair in zip(training_rows([5.0] * 5, every=100, rate=1e-3), flat, strict=False) for row in pair]
    assert kinds(detect_events(high, None, BUDGET)[1]) == ["stalled"]
    decayed_rows = training_rows([5.0] * 5, every=100)
    for row, rate in zip(decayed_rows, [1e-3, 8e-4, 4e-4, 2e-4, 1e-4], strict=True):
        row["learning_rate"] = rate
    decayed = [row for pair in zip(decayed_rows, flat, strict=False) for row in pair]
    assert detect_events(decayed, None, BUDGET)[1] == []


def run_of(points, rate=1e-3):
    """A training row then an evaluation row at each point: (step, held-out MLM loss, held-out MLM accuracy,
    held-out NSP accuracy, training loss, training NSP accuracy); `rate` a number or a function of the step."""
    rows = []
    for step, eval_loss, eval_accuracy, eval_nsp, train_loss, train_nsp in points:
        learning_rate = rate(step) if callable(rate) else rate
        rows.append({"step": step, "train_seconds": 0.0, "loss": train_loss, "train_nsp_accuracy": train_nsp,
                     "learning_rate": learning_rate})
        rows.append({"step": step, "train_seconds": 0.0, "eval_mlm_loss": eval_loss,
                     "eval_mlm_accuracy": eval_accuracy, "eval_nsp_accuracy": eval_nsp})
    return rows


def warnings_of(events):
    return [event.kind for event in events if event.kind != "overfitting"]


# The README main job as a new user ran it on an AMD EPYC (issue 56): held-out NSP lagged (0.563 at 3,000,
# under the line of 0.578) while the training pairs' NSP accuracy was 0.78, and came off chance at 4,000.
README_BASELINES = Baselines(7.24, nsp_chance_accuracy=0.533, nsp_chance_loss=0.69, nsp_eval_instances=490)
README_TRAINING_ARGS = {
    "max_train_steps": 6000, "train_instances": 57232, "dupe_factor": 40, "per_device_train_batch_size": 16,
    "num_processes": 1, "gradient_accumulation_steps": 1}
README_BUDGET, README_PASSES = Budget.of_training_args(README_TRAINING_ARGS), text_passes_per_update(README_TRAINING_ARGS)
README_MAIN_JOB = run_of([
    (1000, 6.10, 0.170, 0.533, 5.60, 0.60),
    (2000, 5.90, 0.200, 0.576, 5.10, 0.70),
    (3000, 5.82, 0.210, 0.563, 4.80, 0.78),
    (4000, 5.79, 0.215, 0.637, 4.60, 0.82),
    (5000, 5.78, 0.218, 0.600, 4.45, 0.85),
    (6000, 5.77, 0.220, 0.639, 4.40, 0.86),
])


def test_passes_over_the_text_follow_from_the_instances_and_the_batch():
    assert pytest.approx(16 * 40 / 57232) == README_PASSES
    assert text_passes_per_update({"max_train_steps": 10, "train_instances": None}) is None


def test_nsp_lagging_held_out_while_training_learns_it_is_a_note_not_a_warning():
    _, events = detect_events(README_MAIN_JOB, README_BASELINES, README_BUDGET, README_PASSES)
    assert warnings_of(events) == []
    (note,) = events
    assert (note.kind, note.update) == ("overfitting", 3000)
    assert "34 passes over the corpus" in note.message and "more text" in note.message
    assert "learning_rate" not in note.message
    assert summary_line(events).startswith("no open warnings")


def test_shuffled_sentences_leave_nsp_at_chance_in_training_too_and_warn():
    rows = run_of([(1000 * i, 6.4 - 0.1 * i, 0.16 + 0.01 * i, 0.516, 5.6 - 0.2 * i, 0.50 + 0.005 * (i % 2))
                   for i in range(1, 7)])
    _, events = detect_events(rows, README_BASELINES, README_BUDGET, README_PASSES)
    assert kinds(events) == ["nsp_at_chance"] and events[0].update == 3000 and events[0].resolved_at is None


def test_held_out_loss_rising_while_accuracy_and_training_improve_is_a_note_not_stalled():
    # The quality-10min recipe on an AMD EPYC (issue 56): held-out MLM loss best early and rising to 6.348
    # while held-out accuracy rose to 0.232 and the training accuracy reached 0.57.
    losses = [6.30, 5.90, 5.80, 5.785, 5.85, 5.92, 6.00, 6.05, 6.10, 6.15, 6.20, 6.25, 6.28, 6.31, 6.348]
    points = [(1000 * (i + 1), loss, 0.19 + 0.003 * i, 0.70 + 0.005 * i, 5.0 - 0.15 * i, 0.75 + 0.01 * i)
              for i, loss in enumerate(losses)]
    _, events = detect_events(run_of(points, rate=lambda step: 1e-3 * (1 - step / 17738)), README_BASELINES,
                              README_BUDGET, README_PASSES)
    assert warnings_of(events) == []
    (note,) = events
    assert note.kind == "overfitting" and note.update == 8000  # 4 evaluations past the best, at 4,000
    assert "passes over the corpus" in note.message and "dropout" in note.message


def test_a_stall_where_nothing_improves_still_warns_and_held_out_accuracy_rising_is_no_stall():
    flat = [(1000 * (i + 1), 5.0, 0.2, 0.9, 4.0, 0.9) for i in range(5)]
    assert kinds(detect_events(run_of(flat), README_BASELINES, README_BUDGET, README_PASSES)[1]) == ["stalled"]
    accuracy_rises = [(step, loss, 0.2 + 0.01 * i, nsp, train, tnsp) for i, (step, loss, _, nsp, train, tnsp)
                      in enumerate(flat)]
    assert detect_events(run_of(accuracy_rises), README_BASELINES, README_BUDGET, README_PASSES)[1] == []


@pytest.mark.parametrize("rate", [1e-9, 5e-2])
def test_a_dead_rate_and_a_rate_far_too_high_still_warn_at_the_end(rate):
    # As benchmarks/results/run_health.md measured them at README size: held-out MLM loss on the unigram
    # plateau to the end; at 5e-2 MLM 0.19 below its first evaluation, NSP at chance in training too.
    budget = Budget(max_train_steps=600)
    drop = 0.0 if rate == 1e-9 else 0.04
    rows = run_of([(100 * i, 7.4 - drop * i, 0.05, 0.52, 7.5 - drop * i, 0.5) for i in range(1, 7)],
                  rate=lambda step: rate * (1 - step / 600))
    events = detect_events(rows, README_BASELINES, budget)[1]
    assert "unigram_plateau" in kinds(events) and all(event.resolved_at is None for event in events)
    assert ("nsp_at_chance" in kinds(events)) == (rate == 5e-2)
    assert summary_line(events).startswith(f"{len(events)} open warning(s)")


def test_each_warning_is_outgrown_when_its_signature_no_longer_holds():
    budget = Budget(max_train_steps=6000)
    nsp = run_of([(1000 * i, 6.4 - 0.1 * i, 0.2, 0.52 if i <= 3 else 0.64, 5.0 - 0.1 * i, 0.51) for i in range(1, 7)])
    _, events = detect_events(nsp, README_BASELINES, budget)
    assert [(e.kind, e.update, e.resolved_at) for e in events] == [("nsp_at_chance", 3000, 4000)]
    assert summary_line(events) == "no open warnings (1 outgrown: nsp_at_chance 3000 → 4000)"
    plateau = run_of([(1000 * i, 7.1 if i <= 2 else 6.5, 0.1, 0.9, 6.0 - 0.1 * i, 0.9) for i in range(1, 5)])
    _, events = detect_events(plateau, README_BASELINES, budget)
    assert [(e.kind, e.update, e.resolved_at) for e in events] == [("unigram_plateau", 2000, 3000)]
    stall = run_of([(1000 * i, 5.0 if i <= 5 else 4.5, 0.2, 0.9, 4.0, 0.9) for i in range(1, 7)])
    _, events = detect_events(stall, README_BASELINES, budget)
    assert [(e.kind, e.update, e.resolved_at) for e in events] == [("stalled", 5000, 6000)]


def test_a_spike_has_no_outgrown_state_and_an_outgrown_kind_can_fire_again():
    rows = [*rows_with_a_spike(), *training_rows([5.0] * 30, first_step=90)]
    (spike,) = detect_events(rows, BASELINES, BUDGET)[1]
    assert spike.resolved_at is None and summary_line([spike]) == "1 open warning(s): loss_spike (update 70)"
    budget = Budget(max_train_steps=4000)
    back = run_of([(1000, 7.1, 0.1, 0.9, 6.0, 0.9), (2000, 6.5, 0.1, 0.9, 5.9, 0.9),
                   (3000, 7.1, 0.1, 0.9, 5.8, 0.9)])
    events = detect_events(back, README_BASELINES, budget)[1]
    assert [(e.kind, e.update, e.resolved_at) for e in events] == [
        ("unigram_plateau", 1000, 2000), ("unigram_plateau", 3000, None)]


def test_nan_rows_fire_nothing():
    rows = [*training_rows([5.0] * 6 + [math.nan]), evaluation_row(300, math.nan)]
    assert detect_events(rows, BASELINES, BUDGET)[1] == []


# ---- the callback ---------------------------------------------------------------------------------------


class Progress:  # what RunHealth reads of hfbert.pretraining.training.TrainingProgress
    def __init__(self, rows, completed_steps):
        self.log_history, self.completed_steps = rows, completed_steps


def corpus_with_duplicates() -> CorpusHealth:
    figures = CorpusStatistics("x", 2, 4, 100, 50, 0, 0, 0, [(3, "again")])
    return CorpusHealth(figures, BASELINES)


def rows_with_a_spike():
    return training_rows([5.0, 5.1, 4.9, 5.0, 5.05, 4.95, 20.0, 5.0])


def test_outgrowing_is_logged_once_and_replayed_silently_on_resume(caplog):
    budget = Budget(max_train_steps=6000)
    rows = run_of([(1000 * i, 6.4 - 0.1 * i, 0.2, 0.52 if i <= 3 else 0.64, 5.0 - 0.1 * i, 0.51) for i in range(1, 7)])
    health = RunHealth(CorpusHealth(CorpusStatistics("x", 2, 4, 100, 0, 0, 0, 0, []), README_BASELINES), budget, None, True)
    with caplog.at_level(logging.INFO, logger="hfbert"):
        health.on_fit_start(Progress([], 0), 0.0)
        for row in rows:
            health.on_log(row, 0.0)
        health.on_fit_end(Progress(rows, 6000))
    messages = [r.getMessage() for r in caplog.records]
    assert [m for m in messages if "outgrown at update" in m] == [
        "Run health, nsp_at_chance (update 3000): outgrown at update 4000: held-out NSP accuracy above the chance line"]
    assert [r.getMessage().split(":")[0] for r in caplog.records if r.levelno == logging.WARNING] == [
        "Run health, nsp_at_chance"]
    assert messages[-1] == "Run health: no open warnings (1 outgrown: nsp_at_chance 3000 → 4000)"
    caplog.clear()
    resumed = RunHealth(health.corpus, budget, None, main_process=True)
    with caplog.at_level(logging.INFO, logger="hfbert"):
        resumed.on_fit_start(Progress(rows, 6000), 1.0)
    assert resumed.events == health.events and health.events[0].resolved_at == 4000
    assert not [r for r in caplog.records if "outgrown at update" in r.getMessage() or r.levelno == logging.WARNING]


def test_run_health_logs_each_event_once_and_replays_it_silently_on_resume(caplog):
    health = RunHealth(corpus_with_duplicates(), BUDGET, None, main_process=True)
    with caplog.at_level(logging.INFO, logger="hfbert"):
        health.on_fit_start(Progress([], 0), 0.0)
        for row in rows_with_a_spike():
            health.on_log(row, 0.0)
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert [w.split(":")[0] for w in warnings] == ["Run health, duplicate_text", "Run health, loss_spike"]
    assert kinds(health.events) == ["duplicate_text", "loss_spike"]
    caplog.clear()
    resumed = RunHealth(corpus_with_duplicates(), BUDGET, None, main_process=True)
    with caplog.at_level(logging.INFO, logger="hfbert"):
        resumed.on_fit_start(Progress(rows_with_a_spike(), 80), 0.08)
        resumed.on_log(training_rows([30.0], first_step=90)[0], 0.09)  # a second spike: the kind has fired
    assert resumed.events == health.events
    assert not [r for r in caplog.records if r.levelno == logging.WARNING]


def test_only_the_main_process_logs(caplog):
    health = RunHealth(corpus_with_duplicates(), BUDGET, None, main_process=False)
    with caplog.at_level(logging.INFO, logger="hfbert"):
        health.on_fit_start(Progress([], 0), 0.0)
        for row in rows_with_a_spike():
            health.on_log(row, 0.0)
        health.on_fit_end(Progress([], 80))
    assert caplog.records == [] and kinds(health.events) == ["duplicate_text", "loss_spike"]


def test_unknown_event_kind_is_refused():
    with pytest.raises(ValueError, match="not one of"):
        HealthEvent("plateau", 3, "x")


# ---- the final folder's health section ------------------------------------------------------------------


def test_run_health_json_and_card_section(tmp_path):
    events = [HealthEvent("loss_spike", 70, "update 70: training loss 20 is 4.0x its running median")]
    report = health_report(corpus_with_duplicates(), events)
    saved = json.loads(write_json_atomic(tmp_path / RUN_HEALTH_NAME, report).read_text())
    assert saved["status"] == "1 open warning(s): loss_spike (update 70)" and saved["events"][0]["kind"] == "loss_spike"
    assert saved["baselines"]["unigram_mlm_loss"] == 7.0
    section = health_card_section(report)
    assert "`loss_spike` at update 70" in section and "7.000" in section
    assert "No warnings" in health_card_section(health_report(corpus_with_duplicates(), []))
    outgrown = HealthEvent("nsp_at_chance", 3000, "update 3000: held-out NSP accuracy 0.563 is at chance", 4000)
    note = HealthEvent("overfitting", 3000, "update 3000: held-out NSP lags the training pairs' ...")
    report = health_report(corpus_with_duplicates(), [outgrown, note])
    saved = json.loads(write_json_atomic(tmp_path / RUN_HEALTH_NAME, report).read_text())
    assert saved["events"][0]["resolved_at"] == 4000 and saved["note_kinds"] == ["overfitting"]
    assert saved["status"] == "no open warnings (1 outgrown: nsp_at_chance 3000 → 4000); note: overfitting (update 3000)"
    section = health_card_section(report)
    assert "`nsp_at_chance` at update 3000, outgrown at update 4000" in section
    assert "note `overfitting` at update 3000" in section
    card = build_model_card(model_name="m", training_config={}, eval_results={}, dataset_name=None,
                            dataset_config_name=None, health_section=section)
    assert "## Run health" in str(card)


def test_curves_draw_the_baselines(tmp_path):
    history = [*training_rows([5.0, 4.0]), evaluation_row(20, 6.0, 0.6)]
    assert report_reference_lines(None) == report_reference_lines({"baselines": None}) == []
    lines = report_reference_lines(health_report(CorpusHealth(CorpusStatistics("x", 2, 4, 100, 0, 0, 0, 0, []), BASELINES), []))
    assert [line[0] for line in lines] == ["MLM loss", "NSP loss", "NSP accuracy"]
    assert plot_training_curves(history, tmp_path / "c.png", reference_lines=lines).stat().st_size > 0
    with pytest.raises(ValueError, match="unknown panels"):
        plot_training_curves(history, tmp_path / "d.png", reference_lines=[("Perplexity", 1.0, "x")])
