"""The health section of a run's final folder: run_health.json, the baselines as reference lines of
training_curves.png, and the model card's section."""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

from hfbert.files import write_json_atomic
from hfbert.pretraining.callbacks import StagedFinalFolder
from hfbert.pretraining.extras.health.corpus import EVENT_KINDS, NOTE_KINDS, CorpusHealth, HealthEvent

RUN_HEALTH_NAME = "run_health.json"


def health_report(corpus: CorpusHealth | None, events: list[HealthEvent]) -> dict[str, Any]:
    """What run_health.json holds: the `summary_line`, every event (kind, update, message, resolved_at), the
    corpus statistics and the baselines (absent where the data stage gave none)."""
    return {
        "status": summary_line(events),
        "event_kinds": list(EVENT_KINDS),
        "note_kinds": list(NOTE_KINDS),
        "events": [asdict(event) for event in events],
        **({} if corpus is None else corpus.to_dict()),
    }


def write_health_report(folder: StagedFinalFolder, corpus: CorpusHealth | None, events: list[HealthEvent]) -> None:
    """run_health.json (`health_report`) into the staged final folder, its section of the card and the baselines
    as the curves' reference lines."""
    report = health_report(corpus, events)
    write_json_atomic(folder.path / RUN_HEALTH_NAME, report)
    folder.health_section = health_card_section(report)
    folder.reference_lines += report_reference_lines(report)


def summary_line(events: list[HealthEvent]) -> str:
    """The warnings still open, those outgrown and the notes, in one line."""
    notes = [event for event in events if event.kind in NOTE_KINDS]  # never outgrown: `OUTGROWN_WHEN`
    standing = [event for event in events if event.resolved_at is None and event.kind not in NOTE_KINDS]
    outgrown = [event for event in events if event.resolved_at is not None]
    line = "no open warnings"
    if standing:
        line = f"{len(standing)} open warning(s): " + ", ".join(f"{e.kind} (update {e.update})" for e in standing)
    if outgrown:
        spans = ", ".join(f"{e.kind} {e.update} → {e.resolved_at}" for e in outgrown)
        line += f" ({len(outgrown)} outgrown: {spans})"
    if notes:
        line += "; note: " + ", ".join(f"{e.kind} (update {e.update})" for e in notes)
    return line


def report_reference_lines(report: dict[str, Any] | None) -> list[tuple[str, float, str]]:
    """(panel title of `hfbert.plotting.PANELS`, value, label) for each baseline of a `health_report` a curve
    should beat (none for a run without baselines)."""
    baselines = None if report is None else report.get("baselines")
    if baselines is None:
        return []
    lines = [("MLM loss", baselines["unigram_mlm_loss"], "unigram baseline")]
    if baselines["nsp_chance_accuracy"] is not None:
        lines += [
            ("NSP loss", baselines["nsp_chance_loss"], "chance"),
            ("NSP accuracy", baselines["nsp_chance_accuracy"], "chance"),
        ]
    return lines


def card_line(event: dict[str, Any]) -> str:
    """One event of run_health.json as a line of the card (older files have no resolved_at)."""
    if event["kind"] in NOTE_KINDS:
        return f"- note `{event['kind']}` at update {event['update']}: {event['message']}"
    outgrown = "" if event.get("resolved_at") is None else f", outgrown at update {event['resolved_at']}"
    return f"- `{event['kind']}` at update {event['update']}{outgrown}: {event['message']}"


def health_card_section(report: dict[str, Any]) -> str:
    """The model card's "Run health" section (markdown) for a `health_report`."""
    lines = ["## Run health", ""]
    if report["events"]:
        lines.append(f"{report['status']} (what each means and what to change: hfbert's docs/run_health.md):")
        lines.append("")
        lines += [card_line(event) for event in report["events"]]
    else:
        lines.append("No warnings: no corpus figure beyond its threshold and no signature of a stuck run.")
    if "statistics" in report:  # with the baselines: `CorpusHealth.to_dict`
        corpus = CorpusHealth.from_dict(report)
        figures, nsp = corpus.statistics, corpus.baselines.nsp_chance_accuracy
        chance = "" if nsp is None else f", NSP chance accuracy {nsp:.3f}"
        lines += ["", (
            f"Corpus ({figures.scope}): {figures.documents:,} documents, {figures.paragraphs:,} paragraphs, "
            f"{figures.tokens:,} tokens; {figures.duplicate_share:.1%} of the tokens in repeated text, "
            f"{figures.share(figures.unknown_tokens):.2%} [UNK]."), "", (
            f"Baselines (dashed in the training curves): unigram held-out MLM loss "
            f"{corpus.baselines.unigram_mlm_loss:.3f}{chance}.")]
    return "\n".join(lines) + "\n"
