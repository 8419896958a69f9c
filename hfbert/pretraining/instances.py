"""Training instances made while training, from tokenized documents stored once.

The datasets cache holds every tokenized document once and, for every pass over the corpus (``--dupe_factor``),
one count per document: how many instances the document gives in that pass. An instance is made only when a
batch asks for it, in the loader's workers, from a random stream seeded by (seed, pass, document): the cache
grows with the corpus, not with the corpus times the passes, and a resumed run makes the same instances.

An instance is described by two token ranges (`Span`): A is a range of its own document, B a range of the
same document (the real next segment) or of another one (a random next segment). google-research/bert's
``create_instances_from_document`` only ever joins consecutive sentences and trims the ends, so both sides
are contiguous ranges, and the pairing needs the documents' sentence lengths only, never their tokens.
"""

from __future__ import annotations

import bisect
import functools
import itertools
import random
from collections import OrderedDict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, NamedTuple

import numpy as np
from datasets import Dataset, Features, IterableDataset, List, Value, concatenate_datasets
from datasets.fingerprint import Hasher

from hfbert.corpus import DOCUMENTS_PER_BATCH
from hfbert.errors import Refusal

Objective = Literal["mlm+nsp", "mlm"]  # what --objective names

MLM_INSTANCE_FEATURES = Features({"input_ids": List(Value("int32")), "token_type_ids": List(Value("int8"))})
INSTANCE_FEATURES = Features({**MLM_INSTANCE_FEATURES, "next_sentence_label": Value("int8")})
COUNT_FEATURES = Features({"instances": Value("int32")})
MIN_NSP_DOCUMENTS = 2
BOUNDARY_HINT = (
    "check --document_boundary too (heading: WikiText ' = Title = ' lines start documents; blank_line: blank "
    "lines separate them; row: each row is one)"
)
DRAW_KEY = "draw"  # an instance's draw id, which seeds its masks (see hfbert.pretraining.batches.InstanceDraws)

# datasets hashes module-level functions by qualified name, not by code, so without this an edited hfbert
# would silently reuse counts made by the old code. It is part of every cache key below.
_CODE_FINGERPRINT = Hasher.hash(Path(__file__).read_bytes())
# Instances a worker keeps the spans of (about 100 bytes each): two shuffle windows' worth, so that a window's
# documents are paired once per worker, not once per instance.
_CACHED_SPANS = 1 << 17
SHUFFLE_GROUP = 1 << 16  # instances shuffled together (see hfbert.pretraining.batches.EpochDraws)


class TokenizedDocuments:
    """The output of :func:`hfbert.pretraining.data.tokenize_documents` read as numpy views of its Arrow
    table (memory-mapped, or in memory for a stream's window): a document's sentence offsets and tokens without
    converting rows to Python lists.

    Pickles as its dataset (which pickles as its file paths) without its views, so loader and ``datasets.map``
    workers map the same files instead of copying the corpus.
    """

    def __init__(self, dataset: Dataset):
        if dataset._indices is not None:  # private, kept: no public way to ask (test_instances checks it)
            raise ValueError("TokenizedDocuments reads Arrow files in order; pass dataset.flatten_indices()")
        if dataset.column_names != ["sentences"]:
            raise ValueError(
                f"TokenizedDocuments expects tokenize_documents' one column 'sentences', got {dataset.column_names}"
            )
        self.dataset = dataset
        self._chunks: dict[int, tuple[np.ndarray, np.ndarray, np.ndarray]] = {}
        self._chunk_starts: list[int] | None = None

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_chunks": {}, "_chunk_starts": None}

    def __len__(self) -> int:
        return len(self.dataset)

    def _views(self, document: int) -> tuple[int, tuple[np.ndarray, np.ndarray, np.ndarray]]:
        column = self.dataset.data.table.column("sentences")
        if self._chunk_starts is None:
            self._chunk_starts = np.cumsum([0, *(len(chunk) for chunk in column.chunks)]).tolist()
        if not 0 <= document < len(self):
            raise IndexError(f"document {document} of {len(self)}")
        number = bisect.bisect_right(self._chunk_starts, document) - 1
        if number not in self._chunks:
            chunk = column.chunks[number]
            sentences = chunk.values
            self._chunks[number] = (
                chunk.offsets.to_numpy(),
                sentences.offsets.to_numpy(),
                sentences.values.to_numpy(zero_copy_only=True),
            )
        return document - self._chunk_starts[number], self._chunks[number]

    def sentence_offsets(self, document: int) -> np.ndarray:
        """Where each sentence of ``document`` starts in its tokens, and where the last one ends (n + 1 values)."""
        row, (document_offsets, sentence_offsets, _) = self._views(document)
        offsets = sentence_offsets[document_offsets[row] : document_offsets[row + 1] + 1]
        return offsets - offsets[0]

    def tokens(self, document: int) -> np.ndarray:
        """The token ids of ``document``, its sentences concatenated (a view, not a copy)."""
        row, (document_offsets, sentence_offsets, tokens) = self._views(document)
        return tokens[sentence_offsets[document_offsets[row]] : sentence_offsets[document_offsets[row + 1]]]


class Span(NamedTuple):
    """An instance: token range A of `document`, range B of `b_document`, and whether B is a random next
    segment (None for an MLM segment, which has no B)."""

    document: int
    a_start: int
    a_stop: int
    b_document: int
    b_start: int
    b_stop: int
    is_random_next: bool | None


@dataclass(frozen=True)
class InstanceRecipe:
    """How documents become instances: for ``mlm+nsp`` sentence pairs ``[CLS] A [SEP] B [SEP]`` as
    google-research/bert makes them, for ``mlm`` segments ``[CLS] segment [SEP]`` as transformers' run_mlm.py
    groups texts."""

    objective: Objective
    cls_token_id: int
    sep_token_id: int
    max_seq_length: int
    short_seq_prob: float = 0.1
    seed: int = 42

    def __post_init__(self) -> None:
        least = 5 if self.pairs else 3
        if self.max_seq_length < least:
            room = "two segments besides [CLS] [SEP] [SEP]" if self.pairs else "a segment"
            raise ValueError(
                f"max_seq_length {self.max_seq_length} leaves no room for {room}; pass max_seq_length >= {least}"
            )
        if not 0.0 <= self.short_seq_prob <= 1.0:
            raise ValueError(
                f"short_seq_prob {self.short_seq_prob} is not a probability; pass a value in [0, 1]"
            )

    @property
    def pairs(self) -> bool:
        """Sentence pairs with a next-sentence label (else segments)."""
        return self.objective == "mlm+nsp"

    def spans(
        self, documents: TokenizedDocuments, pass_index: int, document: int, stream_key: str = ""
    ) -> list[Span]:
        """The instances ``document`` gives in pass ``pass_index``; the same whichever process asks.
        ``stream_key`` names the window a streamed document is in (`hfbert.pretraining.stream`), whose documents
        are numbered from 0 in every window."""
        offsets = documents.sentence_offsets(document)
        if not self.pairs:  # no randomness: the masks, drawn per epoch, change between epochs
            return mlm_segments(document, int(offsets[-1]), self.max_seq_length - 2)
        # A string seed is hashed with SHA-512 by random.Random, so it is stable across processes and runs.
        rng = random.Random(f"{self.seed}-{pass_index}-{document}{stream_key}")
        max_num_tokens = self.max_seq_length - 3
        return nsp_pairs(document, offsets.tolist(), documents, max_num_tokens, self.short_seq_prob, rng)

    def row(self, documents: TokenizedDocuments, span: Span) -> dict[str, Any]:
        """The instance's ``input_ids`` and ``token_type_ids`` (and ``next_sentence_label`` for NSP)."""
        tokens_a = documents.tokens(span.document)[span.a_start : span.a_stop].tolist()
        if span.is_random_next is None:
            return {
                "input_ids": [self.cls_token_id, *tokens_a, self.sep_token_id],
                "token_type_ids": [0] * (len(tokens_a) + 2),
            }
        tokens_b = documents.tokens(span.b_document)[span.b_start : span.b_stop].tolist()
        return {
            "input_ids": [self.cls_token_id, *tokens_a, self.sep_token_id, *tokens_b, self.sep_token_id],
            "token_type_ids": [0] * (len(tokens_a) + 2) + [1] * (len(tokens_b) + 1),
            "next_sentence_label": int(span.is_random_next),
        }

    def columns(self, documents: TokenizedDocuments, spans: Iterable[Span]) -> dict[str, list]:
        """The rows of `spans` as columns, as a ``datasets.Dataset`` answers for a batch of rows."""
        rows = [self.row(documents, span) for span in spans]
        return {name: [row[name] for row in rows] for name in self.features()}

    def features(self) -> Features:
        return INSTANCE_FEATURES if self.pairs else MLM_INSTANCE_FEATURES

    def fingerprint(self, documents: Dataset, *extra: Any) -> str:
        """A datasets cache key for something made from ``documents`` with this recipe (and ``extra``)."""
        # _fingerprint: private, kept: datasets has no public accessor of it (test_corpus checks it)
        return Hasher.hash([documents._fingerprint, self, extra, _CODE_FINGERPRINT])


def mlm_segments(document: int, length: int, segment_length: int) -> list[Span]:
    """The document's tokens, in order, cut into segments of ``segment_length`` anywhere (not at sentence
    boundaries): every token is in exactly one segment, and a document's last segment is shorter."""
    return [
        Span(document, start, min(start + segment_length, length), -1, 0, 0, None)
        for start in range(0, length, segment_length)
    ]


def nsp_pairs(
    document: int,
    sentence_offsets: list[int],
    documents: TokenizedDocuments,
    max_num_tokens: int,
    short_seq_prob: float,
    rng: random.Random,
) -> list[Span]:
    """google-research/bert ``create_instances_from_document`` on sentence offsets instead of tokens.

    Per chunk a target length of ``max_num_tokens`` (with probability ``short_seq_prob`` a random one in
    ``[2, max_num_tokens]``), whole sentences accumulated up to it, A/B split at a random sentence boundary,
    B replaced by a span of a different document with probability 0.5 (always when the chunk is one sentence;
    the chunk's unused sentences go back to the document), and the longer side trimmed from the front or back
    at random until the pair fits. Two deviations: the shorter target is drawn per chunk, not once per
    document (drawn per document, a short target turns almost every chunk of that document into a single
    sentence, which always gets a random B: on WikiText that skews the labels to ~60% random), and sentences
    longer than half an instance are cut into pieces of that length first (see `piece_starts`).
    """

    def draw_target_length() -> int:
        return rng.randint(2, max_num_tokens) if rng.random() < short_seq_prob else max_num_tokens

    starts = piece_starts(sentence_offsets, -(-max_num_tokens // 2))  # two pieces fill A and a real next B
    pieces = len(starts) - 1
    target_seq_length = draw_target_length()
    spans = []
    first = 0  # the chunk's first piece
    i = 0
    while i < pieces:
        if i == pieces - 1 or starts[i + 1] - starts[first] >= target_seq_length:
            chunk = i + 1 - first
            a_end = first + (rng.randint(1, chunk - 1) if chunk >= 2 else 1)  # A's pieces: first..a_end-1
            a_start, a_stop = starts[first], starts[a_end]
            is_random_next = chunk == 1 or rng.random() < 0.5
            if is_random_next:
                b_document, b_start, b_stop = random_next_segment(
                    document, documents, target_seq_length - (a_stop - a_start), max_num_tokens, rng
                )
                i = a_end - 1  # the chunk's unused pieces go back to the document for the next instance
            else:
                b_document, b_start, b_stop = document, a_stop, starts[i + 1]
            cut_a, cut_b = truncation(a_stop - a_start, b_stop - b_start, max_num_tokens, rng)
            a_range = (a_start + cut_a[0], a_stop - cut_a[1])
            b_range = (b_start + cut_b[0], b_stop - cut_b[1])
            spans.append(Span(document, *a_range, b_document, *b_range, is_random_next))
            first = i + 1
            target_seq_length = draw_target_length()
        i += 1
    return spans


def piece_starts(sentence_offsets: list[int], piece_length: int) -> list[int]:
    """Sentence offsets with every sentence longer than ``piece_length`` cut into pieces of that length.

    The sentence regex finds no boundary in lower-cased or unpunctuated text, whose "sentences" are then whole
    paragraphs or lines: kept whole, such a sentence is a chunk on its own, always gets a random B and is
    truncated to the instance, losing most of its tokens. Pieces of half an instance keep every token (but one
    per instance, from rounding), and give such text real next-segment pairs.
    """
    starts = []
    for start, stop in itertools.pairwise(sentence_offsets):
        starts.extend(range(start, stop, piece_length))
    starts.append(sentence_offsets[-1])
    return starts


def random_next_segment(
    document: int, documents: TokenizedDocuments, target_length: int, max_num_tokens: int, rng: random.Random
) -> tuple[int, int, int]:
    """(document, start, stop) of a random next segment: whole sentences of another document from a random
    one on, until ``target_length`` tokens are reached. No sentence adds more than an instance holds (an
    unpunctuated line can be megabytes long); such a sentence always reaches the target, so it is the last one
    and the segment stays one contiguous range."""
    # google retries randint up to 10 times and may still return the same document; drawing uniformly among
    # the other documents gives the distribution it aims for and never the same one.
    other = rng.randint(0, len(documents) - 2)
    other = other + 1 if other >= document else other
    offsets = documents.sentence_offsets(other)
    first = rng.randint(0, len(offsets) - 2)
    start = stop = int(offsets[first])
    # Where each sentence from the first on ends; at most one sentence per token of the target is needed.
    for end in offsets[first + 1 : first + 2 + max(target_length, 0)].tolist():
        stop += min(end - stop, max_num_tokens + 1)
        if stop - start >= target_length:
            break
    return other, start, stop


def truncation(
    length_a: int, length_b: int, max_num_tokens: int, rng: random.Random
) -> tuple[tuple[int, int], tuple[int, int]]:
    """Tokens to remove from the front and the back of A and of B so that both fit into ``max_num_tokens``.

    google's token-by-token loop trims the longer side (B on a tie) from the front or the back at random, one
    draw per removed token. Which side loses each token follows from the lengths alone: the longer side until
    both are equal, then B, A, B, A, ...; so the draws are taken at once and counted per side, with the same
    draws and result as the loop.
    """
    removals = length_a + length_b - max_num_tokens
    if removals <= 0:
        return (0, 0), (0, 0)
    # Draw i is below 0.5 exactly when bit 64 i + 31 of these bits is 0: random() takes two 32-bit words and
    # is below 0.5 when the first is below 2**31, and getrandbits returns the same words, the first lowest.
    bits = rng.getrandbits(64 * removals)
    first = min(removals, abs(length_a - length_b))  # taken from the longer side, then B, A, B, ...
    alternating = removals - first
    backs = {
        "longer": (bits & _top_bits(first, 64)).bit_count(),
        "b": ((bits >> (64 * first)) & _top_bits((alternating + 1) // 2, 128)).bit_count(),
        "a": ((bits >> (64 * first + 64)) & _top_bits(alternating // 2, 128)).bit_count(),
    }
    counts = {"b": (alternating + 1) // 2, "a": alternating // 2}
    longer = "a" if length_a > length_b else "b"
    counts[longer] += first
    backs[longer] += backs.pop("longer")
    return (counts["a"] - backs["a"], backs["a"]), (counts["b"] - backs["b"], backs["b"])


@functools.lru_cache(maxsize=1024)
def _top_bits(count: int, stride: int) -> int:
    """Bit 31 of the first 32-bit word of ``count`` draws ``stride`` bits apart."""
    # Built from bytes, in linear time (a sum of shifted ints is quadratic in the count).
    word = b"\x00\x00\x00\x80" + bytes(stride // 8 - 4)
    return int.from_bytes(word * count, "little")


def count_of_documents(count: int) -> str:
    return f"{count} document" if count == 1 else f"{count} documents"


def check_documents_for_nsp(tokenized: Dataset) -> None:
    """Refuse a split that cannot give NSP instances: random next segments come from another document."""
    if len(tokenized) < MIN_NSP_DOCUMENTS:
        raise Refusal(
            f"Next-sentence prediction needs at least {MIN_NSP_DOCUMENTS} documents to draw random next "
            f"segments from, but this split has {count_of_documents(len(tokenized))} with text left after "
            "tokenizing; use a larger corpus: more documents in --train_file or --validation_file, or a larger "
            "--validation_split_percentage when the validation documents are held out of the training corpus; "
            f"{BOUNDARY_HINT}"
        )


def check_validation_for_mlm(tokenized: Dataset) -> None:
    """Refuse validation documents without text for --objective mlm: evaluation scores masked tokens, and a
    split without text gives none to mask."""
    if len(tokenized) == 0:
        raise Refusal(
            "the validation split has no document with text left after tokenizing, so evaluation has no token "
            "to mask (--objective mlm); give it text: a --validation_file with text, a larger "
            "--validation_split_percentage when the validation documents are held out of the training corpus, or "
            "a larger --stream_validation_documents with --streaming; check --document_boundary too"
        )


def _count_batch(
    batch: dict[str, list],
    indices: list[int],
    *,
    documents: TokenizedDocuments,
    recipe: InstanceRecipe,
    pass_index: int,
) -> dict[str, list]:
    return {"instances": [len(recipe.spans(documents, pass_index, index)) for index in indices]}


def count_instances(
    tokenized: Dataset, recipe: InstanceRecipe, pass_index: int, num_proc: int | None = None
) -> np.ndarray:
    """How many instances every document gives in pass ``pass_index`` (int32, one per document).

    The pairing runs once here, on sentence lengths, and is not written: only its counts are, cached by
    datasets under the documents' fingerprint and the recipe (4 bytes a document a pass).
    """
    description = f"Pairing sentences (pass {pass_index})" if recipe.pairs else "Cutting segments"
    # Counts are small: larger batches than the rows' keep datasets' per-batch overhead down.
    counts = _map_pass(tokenized, recipe, pass_index, _count_batch, COUNT_FEATURES, 32, description, num_proc)
    return counts.data.column("instances").to_numpy()


def _map_pass(
    tokenized: Dataset,
    recipe: InstanceRecipe,
    pass_index: int,
    function: Any,
    features: Features,
    batches_of_documents: int,
    description: str,
    num_proc: int | None,
) -> Dataset:
    """``function`` over every document of pass ``pass_index``, cached under the documents, the recipe, the
    pass and the function's name."""
    if recipe.pairs:
        check_documents_for_nsp(tokenized)
    return tokenized.map(
        function,
        batched=True,
        batch_size=DOCUMENTS_PER_BATCH * batches_of_documents,
        with_indices=True,
        num_proc=num_proc,
        remove_columns=tokenized.column_names,
        features=features,
        fn_kwargs={"documents": TokenizedDocuments(tokenized), "recipe": recipe, "pass_index": pass_index},
        new_fingerprint=recipe.fingerprint(tokenized, function.__name__, pass_index),
        desc=description,
    )


def _rows_batch(
    batch: dict[str, list],
    indices: list[int],
    *,
    documents: TokenizedDocuments,
    recipe: InstanceRecipe,
    pass_index: int,
) -> dict[str, list]:
    spans = (span for index in indices for span in recipe.spans(documents, pass_index, index))
    return recipe.columns(documents, spans)


def write_instances(
    tokenized: Dataset, recipe: InstanceRecipe, pass_index: int = 0, num_proc: int | None = None
) -> Dataset:
    """Every instance of pass ``pass_index``, written as a dataset (the fixed validation set, and benchmarks):
    the same rows :class:`DrawnInstances` makes while training, in document order."""
    description = f"Building NSP instances (pass {pass_index})" if recipe.pairs else "Building MLM segments"
    return _map_pass(tokenized, recipe, pass_index, _rows_batch, recipe.features(), 1, description, num_proc)


class DrawnInstances:
    """The instances of every pass over the documents, made when asked for: ``instances[i]`` is a row,
    ``instances[[i, j, ...]]`` a batch of rows as columns, as a ``datasets.Dataset`` answers.

    Instance indices run pass by pass, document by document (a unit is one document in one pass); the spans
    of the units asked for last are kept, so the sampler's shuffle windows (`unit_offsets`) pair each
    document once per process, not once per instance.
    """

    def __init__(self, tokenized: Dataset, recipe: InstanceRecipe, counts: Sequence[np.ndarray]):
        self.documents = TokenizedDocuments(tokenized)
        self.recipe = recipe
        if any(len(count) != len(tokenized) for count in counts):
            raise ValueError(f"every pass needs one count per document ({len(tokenized)})")
        self.passes = len(counts)
        self.unit_offsets = np.concatenate([[0], np.cumsum(np.concatenate(counts), dtype=np.int64)])
        self._spans: OrderedDict[int, list[Span]] = OrderedDict()
        self._cached_spans = 0

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_spans": OrderedDict(), "_cached_spans": 0}

    def __len__(self) -> int:
        return int(self.unit_offsets[-1])

    def __getitem__(self, index: int | Sequence[int]) -> dict[str, Any]:
        if isinstance(index, int | np.integer):
            return self.recipe.row(self.documents, self.span(int(index)))
        return self.recipe.columns(self.documents, (self.span(int(i)) for i in index))

    def write(self, num_proc: int | None = None) -> Dataset:
        """Every instance written as one dataset, in index order: for tools that want rows on disk (a
        transformers ``Trainer``, an export), at the cache size this class avoids."""
        written = [write_instances(self.documents.dataset, self.recipe, p, num_proc) for p in range(self.passes)]
        return concatenate_datasets(written)

    def span(self, index: int) -> Span:
        if not 0 <= index < len(self):
            raise IndexError(f"instance {index} of {len(self)}")
        unit = int(np.searchsorted(self.unit_offsets, index, side="right")) - 1
        return self.unit_spans(unit)[index - int(self.unit_offsets[unit])]

    def unit_spans(self, unit: int) -> list[Span]:
        spans = self._spans.get(unit)
        if spans is None:
            pass_index, document = divmod(unit, len(self.documents))
            spans = self.recipe.spans(self.documents, pass_index, document)
            self._spans[unit] = spans
            self._cached_spans += len(spans)
            while self._cached_spans > _CACHED_SPANS and len(self._spans) > 1:
                self._cached_spans -= len(self._spans.popitem(last=False)[1])
        else:
            self._spans.move_to_end(unit)
        return spans


def draw_training_instances(
    tokenized: Dataset, recipe: InstanceRecipe, passes: int, num_proc: int | None = None
) -> DrawnInstances:
    """The training instances of ``passes`` pairing passes (``--dupe_factor``), counted now, made while
    training."""
    counts = [count_instances(tokenized, recipe, pass_index, num_proc) for pass_index in range(passes)]
    return DrawnInstances(tokenized, recipe, counts)


@dataclass
class TrainingStream:
    """The training instances of a --streaming run, made while training from a process's share of the
    documents (split by node, not yet read) in windows of `window_documents` (`hfbert.pretraining.stream`)."""

    documents: IterableDataset
    recipe: InstanceRecipe
    tokenizer: Any
    window_documents: int
    rank: int
