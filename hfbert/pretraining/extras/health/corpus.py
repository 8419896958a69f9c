"""Corpus statistics and the baselines a run should beat, from what the data stage already made.

The tokenizing map of the data stage (`hfbert.pretraining.data.tokenized_with_statistics`) writes, beside each
document's token ids, a few integers per document (its `STATISTICS_FEATURES`: a hash and a token count per
paragraph, a hash of the whole document, its sentences, its [UNK] tokens) into the same datasets cache. The
statistics are sums and counts over those integers, and the baselines are counts over the cached token ids:
no text is read or tokenized again. Both are then stored as one JSON file beside the tokenized documents'
cache files, under a key made of the caches' fingerprints, so that a second run or a resume reads them.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import datasets
import numpy as np
import pyarrow.compute as pc
from datasets.fingerprint import Hasher

from hfbert.files import write_json_atomic
from hfbert.pretraining.data import STATISTICS_FEATURES, StatisticsColumns

EVENT_KINDS = (
    "duplicate_text", "unknown_tokens", "short_documents",  # the corpus's: `CorpusStatistics.events`
    "unigram_plateau", "nsp_at_chance", "loss_spike", "stalled", "overfitting",  # the run's: `signatures`
)  # fmt: skip
NOTE_KINDS = ("overfitting",)  # said at INFO: a small corpus learned too well is no failure

# Thresholds on the corpus (measured figures: benchmarks/results/run_health.md).
# google-research/bert #746: thousands of repeated lines kept a run at the plateau; the shipped WikiText-2
# sample has 0.1 % of its tokens in repeated paragraphs, so 5 % is far from clean text and close to a scrape.
DUPLICATE_TEXT_SHARE = 0.05
# A WordPiece vocabulary trained on the corpus leaves ~0 % [UNK] (sample: 0.0 %); 1 % means a tokenizer
# trained on other text (another script, casing) and 1 % of the masked targets that teach nothing.
UNKNOWN_TOKEN_SHARE = 0.01
# Such a document only ever gets a random B (its pairs are all label 1); the sample has 0 %. A quarter of the
# documents skews NSP's labels and its chance level enough to be worth a line.
SHORT_DOCUMENT_SHARE = 0.25
MOST_REPEATED_LINES = 5  # shown in run_health.json and in the duplicate_text warning
REPEATED_LINE_CHARACTERS = 80  # each shown line is cut to this many characters

_CODE_FINGERPRINT = Hasher.hash(Path(__file__).read_bytes())
_CACHE_PREFIX = "hfbert-corpus-health-"


@dataclass(frozen=True)
class HealthEvent:
    """One warning or note: its `kind` (one of `EVENT_KINDS`), the update it fired at (0: before training), the
    line, and the update whose evaluation showed it outgrown (None while it stands)."""

    kind: str
    update: int
    message: str
    resolved_at: int | None = None

    def __post_init__(self) -> None:
        if self.kind not in EVENT_KINDS:
            raise ValueError(f"health event kind {self.kind!r} is not one of {EVENT_KINDS}")


@dataclass(frozen=True)
class CorpusStatistics:
    """What the training text is made of; `scope` says which text was counted."""

    scope: str
    documents: int
    paragraphs: int
    tokens: int
    duplicate_paragraph_tokens: int  # tokens of every copy of a paragraph after its first
    duplicate_document_tokens: int  # tokens of every copy of a document after its first
    unknown_tokens: int
    short_documents: int | None  # documents too short to give a real next-sentence pair; None without NSP
    most_repeated: list[tuple[int, str]]  # (copies, the paragraph's start), most copies first

    def share(self, count: int) -> float:
        return count / self.tokens if self.tokens else 0.0

    @property
    def duplicate_share(self) -> float:
        return self.share(max(self.duplicate_paragraph_tokens, self.duplicate_document_tokens))

    @property
    def short_document_share(self) -> float | None:
        if self.short_documents is None:
            return None
        return self.short_documents / self.documents if self.documents else 0.0

    def events(self) -> list[HealthEvent]:
        """The corpus warnings, each at update 0 (before training)."""
        events = []
        if self.duplicate_share > DUPLICATE_TEXT_SHARE:
            lines = "; ".join(f"{count}x '{text}'" for count, text in self.most_repeated[:3])
            events.append(HealthEvent("duplicate_text", 0, (
                f"{self.duplicate_share:.1%} of the tokens of {self.scope} are in repeated text "
                f"({self.share(self.duplicate_paragraph_tokens):.1%} in repeated paragraphs, "
                f"{self.share(self.duplicate_document_tokens):.1%} in repeated documents; threshold "
                f"{DUPLICATE_TEXT_SHARE:.0%}): the model spends its updates memorising the copies and learns "
                f"little that carries to new text. Most repeated: {lines}. Deduplicate the corpus before training")))
        if self.share(self.unknown_tokens) > UNKNOWN_TOKEN_SHARE:
            events.append(HealthEvent("unknown_tokens", 0, (
                f"{self.share(self.unknown_tokens):.1%} of the tokens of {self.scope} are [UNK] (threshold "
                f"{UNKNOWN_TOKEN_SHARE:.0%}): the tokenizer was trained on other text; train one on this corpus "
                "(drop --tokenizer_name) or pass a tokenizer of the corpus's language and casing")))
        short = self.short_document_share
        if short is not None and short > SHORT_DOCUMENT_SHARE:
            events.append(HealthEvent("short_documents", 0, (
                f"{short:.0%} of the documents of {self.scope} are too short to give a real next-sentence pair "
                f"(threshold {SHORT_DOCUMENT_SHARE:.0%}): their pairs are all random and NSP learns document "
                "length; check --document_boundary (row makes every row a document), or use --objective mlm")))
        return events


@dataclass(frozen=True)
class Baselines:
    """The scores a model that ignores its input gets: predicting masked tokens by their frequency in the
    training text (the unigram cross-entropy, in nats, on the evaluation instances' tokens), and NSP by the
    majority label of the evaluation instances (None under --objective mlm)."""

    unigram_mlm_loss: float
    nsp_chance_accuracy: float | None
    nsp_chance_loss: float | None
    nsp_eval_instances: int

    def describe(self) -> str:
        text = f"unigram baseline: held-out MLM loss {self.unigram_mlm_loss:.3f}"
        if self.nsp_chance_accuracy is not None:
            text += f"; NSP chance: accuracy {self.nsp_chance_accuracy:.3f}, loss {self.nsp_chance_loss:.3f}"
        return text


@dataclass(frozen=True)
class CorpusHealth:
    """The corpus statistics and the baselines (`cached_corpus_health`, from the data stage's
    `PreparedData.statistics_columns`)."""

    statistics: CorpusStatistics
    baselines: Baselines

    def to_dict(self) -> dict[str, Any]:
        return {"statistics": asdict(self.statistics), "baselines": asdict(self.baselines)}

    @classmethod
    def from_dict(cls, saved: dict[str, Any]) -> CorpusHealth:
        statistics = dict(saved["statistics"])
        statistics["most_repeated"] = [(int(count), str(text)) for count, text in statistics["most_repeated"]]
        return cls(CorpusStatistics(**statistics), Baselines(**saved["baselines"]))


def _repeated_lines(
    table: Any, first: np.ndarray, counts: np.ndarray, documents: datasets.Dataset
) -> list[tuple[int, str]]:
    """The most repeated paragraphs, read from the documents by position (no scan of the text); `first` and
    `counts`: each distinct paragraph hash's first position in the flattened paragraphs and its copies."""
    lengths = pc.list_value_length(table.column("paragraph_hashes")).to_numpy()
    starts = np.concatenate([[0], np.cumsum(lengths)])
    lines = []
    for group in np.argsort(-counts, kind="stable")[:MOST_REPEATED_LINES].tolist():
        if counts[group] < 2:
            break
        row = int(np.searchsorted(starts, first[group], side="right") - 1)
        document = int(table.column("document_index")[row].as_py())
        text = documents[document]["paragraphs"][int(first[group] - starts[row])]
        lines.append((int(counts[group]), " ".join(text.split())[:REPEATED_LINE_CHARACTERS]))
    return lines


def corpus_statistics(
    tokenized: datasets.Dataset, documents: datasets.Dataset, max_seq_length: int, pairs: bool, scope: str
) -> CorpusStatistics:
    """Sums over the statistics columns of `tokenized` (`tokenized_with_statistics`' output for `documents`).
    A document is too short for NSP when it is one sentence that fits in half an instance: `nsp_pairs` then
    always draws a random B for it."""
    table = tokenized.select_columns(list(STATISTICS_FEATURES)).data.table
    hashes = pc.list_flatten(table.column("paragraph_hashes")).to_numpy()
    paragraph_tokens = pc.list_flatten(table.column("paragraph_tokens")).to_numpy()
    _, first_paragraphs, copies = np.unique(hashes, return_index=True, return_counts=True)
    document_tokens = table.column("document_tokens").to_numpy()
    _, first_documents = np.unique(table.column("document_hash").to_numpy(), return_index=True)
    tokens = int(document_tokens.sum())
    piece_length = -(-(max_seq_length - 3) // 2)  # nsp_pairs' piece: half of what an instance holds
    single = table.column("sentence_count").to_numpy() < 2
    short = int(np.count_nonzero(single & (document_tokens <= piece_length))) if pairs else None
    return CorpusStatistics(
        scope=scope,
        documents=len(tokenized),
        paragraphs=len(hashes),
        tokens=tokens,
        duplicate_paragraph_tokens=tokens - int(paragraph_tokens[first_paragraphs].sum()),
        duplicate_document_tokens=tokens - int(document_tokens[first_documents].sum()),
        unknown_tokens=int(table.column("unknown_tokens").to_numpy().sum()),
        short_documents=short,
        most_repeated=_repeated_lines(table, first_paragraphs, copies, documents),
    )


def token_counts(dataset: datasets.Dataset, column: str, vocabulary_size: int) -> np.ndarray:
    """How often each id occurs in a column of lists (of lists) of ids, counted chunk by chunk."""
    counts = np.zeros(vocabulary_size, dtype=np.int64)
    for chunk in dataset.data.table.column(column).chunks:
        ids = pc.list_flatten(chunk, recursive=True).to_numpy().astype(np.int64)
        counts += np.bincount(ids, minlength=vocabulary_size)
    return counts


def unigram_cross_entropy(train_counts: np.ndarray, eval_counts: np.ndarray, special_ids: Sequence[int]) -> float:
    """Cross-entropy (nats) of the evaluation tokens under the training tokens' frequencies, over the ids a
    mask can choose (special tokens never are). Add-half smoothing: a token unseen in training costs a
    finite amount, as it would for a model that gives every id some probability."""
    eligible = np.ones(len(train_counts), dtype=bool)
    eligible[list(special_ids)] = False
    train, targets = train_counts[eligible] + 0.5, eval_counts[eligible]
    if targets.sum() == 0:
        raise ValueError("the evaluation instances hold no token a mask can choose; pass a larger validation set")
    return float(-(targets * np.log(train / train.sum())).sum() / targets.sum())


def nsp_chance(evaluation: datasets.Dataset) -> tuple[float | None, float | None]:
    """(majority-label accuracy, the binary entropy of the labels in nats) of the evaluation instances."""
    if "next_sentence_label" not in evaluation.column_names or len(evaluation) == 0:
        return None, None
    random_share = float(np.mean(evaluation.data.table.column("next_sentence_label").to_numpy()))
    # 0 log 0 is 0 (one label only: entropy 0.0, not -0.0)
    entropy = 0.0 - sum(share * math.log(share) for share in (random_share, 1 - random_share) if share > 0)
    return max(random_share, 1 - random_share), entropy


def cached_corpus_health(
    columns: StatisticsColumns, evaluation: datasets.Dataset, tokenizer: Any, max_seq_length: int
) -> CorpusHealth:
    """`CorpusHealth` of a run's training documents (the data stage's `columns`), read from the datasets cache,
    or computed and written there (call it with one writer at a time: the data stage's `cache_writers_first`);
    in memory, computed each time."""
    train_tokenized, scope = columns.tokenized, columns.scope
    pairs = "next_sentence_label" in evaluation.column_names
    path = None
    if train_tokenized.cache_files:  # _fingerprint: private, kept: no public accessor (test_corpus checks it)
        fingerprint = Hasher.hash([train_tokenized._fingerprint, evaluation._fingerprint, _CODE_FINGERPRINT,
                                   max_seq_length, pairs, scope])
        path = Path(train_tokenized.cache_files[0]["filename"]).parent / f"{_CACHE_PREFIX}{fingerprint}.json"
        if path.is_file():
            return CorpusHealth.from_dict(json.loads(path.read_text()))
    statistics = corpus_statistics(train_tokenized, columns.documents, max_seq_length, pairs, scope)
    train_counts = token_counts(train_tokenized, "sentences", len(tokenizer))
    eval_counts = token_counts(evaluation, "input_ids", len(tokenizer))
    unigram = unigram_cross_entropy(train_counts, eval_counts, tokenizer.all_special_ids)
    health = CorpusHealth(statistics, Baselines(unigram, *nsp_chance(evaluation), len(evaluation)))
    if path is not None:
        write_json_atomic(path, health.to_dict())
    return health
