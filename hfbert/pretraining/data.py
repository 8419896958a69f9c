"""Documents -> tokenized sentences -> BERT sentence-pair (NSP) instances.

The instance builder follows google-research/bert's ``create_instances_from_document``
(create_pretraining_data.py): fill a chunk of whole sentences up to a target length, split it into A and B at a
random sentence boundary, replace B by a span of another document half of the time, and trim the longer side.
Instances are neither padded nor masked; :mod:`hfbert.pretraining.batches` does both per batch.

`prepare_data` is the data stage of a run: corpus -> documents -> tokenizer -> model config -> instances.
"""

from __future__ import annotations

import json
import logging
import math
import random
import re
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import datasets
from accelerate import Accelerator
from datasets import Dataset, DatasetDict, Features, List, Value
from datasets.fingerprint import Hasher
from transformers import AutoTokenizer, PreTrainedTokenizerBase

from hfbert.configuration_hfbert import HfBertConfig
from hfbert.corpus import DOCUMENTS_PER_BATCH, load_documents, naming_cache_failures
from hfbert.corpus_source import CorpusArguments
from hfbert.errors import Refusal
from hfbert.initialization import check_structured_attention_config
from hfbert.pretraining.settings import (
    DataSettings,
    ModelSettings,
    check_max_seq_length,
    read_config_file,
)
from hfbert.pretraining.source_model import SourceModel, source_run_config
from hfbert.tokenization import (
    check_tokenizer_matches_config,
    load_tokenizer,
    model_config_for_tokenizer,
    save_tokenizer,
    train_tokenizer,
)

# NLTK/punkt is not in the dependency stack; a regex is enough to find NSP segment boundaries.
# A boundary is whitespace after . ! ? (optionally followed by a closing quote or bracket) and before an
# uppercase letter or digit (optionally after an opening quote or bracket). It covers WikiText's
# space-tokenised text ("release . It was") and ordinary text ("release. It was"), and skips initials
# ("J. R. Tolkien") and a few titles ("Mr. Smith").
_SENTENCE_BOUNDARY = re.compile(
    r"(?:(?<=[.!?])|(?<=[.!?][\"')\]]))"
    r"(?<!\b[A-Z]\.)(?<!\b(?:Mr|Ms|Dr|St|Jr|Sr)\.)(?<!\bMrs\.)"
    r"\s+"
    r"(?=[\"'(\[]?[A-Z0-9])"
)

TOKENIZED_FEATURES = Features({"sentences": List(List(Value("int32")))})
INSTANCE_FEATURES = Features(
    {
        "input_ids": List(Value("int32")),
        "token_type_ids": List(Value("int8")),
        "next_sentence_label": Value("int8"),
    }
)
MLM_INSTANCE_FEATURES = Features({"input_ids": List(Value("int32")), "token_type_ids": List(Value("int8"))})

# datasets hashes module-level functions by qualified name, not by code, so without this an edited hfbert
# would silently reuse caches built by the old code. It is part of every cache key below.
_SOURCE_FINGERPRINT = Hasher.hash(Path(__file__).read_bytes())


def tokenizer_fingerprint(tokenizer: PreTrainedTokenizerBase) -> str:
    """A hash of what decides the ids a fast tokenizer gives: its serialized pipeline (normalizer,
    pre-tokenizer, WordPiece vocabulary, ...) and its special tokens.

    The cache keys of :func:`tokenize_documents` and :func:`build_nsp_instances` use it instead of datasets'
    hash of the tokenizer object, which includes the folder the tokenizer was loaded from: a resumed run loads
    its tokenizer from ``checkpoint-N/tokenizer`` and would otherwise redo all preprocessing.
    """
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None:
        raise Refusal(
            f"{type(tokenizer).__name__} is not a fast tokenizer; pass a tokenizers-backed one "
            "(AutoTokenizer.from_pretrained(..., use_fast=True), or a folder from train_tokenizer.py)"
        )
    pipeline = json.loads(backend.to_str())
    # Truncation and padding are call-time state (set by earlier calls), not part of what sentences become.
    pipeline.pop("truncation", None)
    pipeline.pop("padding", None)
    return Hasher.hash([pipeline, tokenizer.all_special_tokens, tokenizer.all_special_ids])


_MIN_NSP_DOCUMENTS = 2
_BOUNDARY_HINT = (
    "check --document_boundary too (heading: WikiText ' = Title = ' lines start documents; blank_line: blank "
    "lines separate them; row: each row is one)"
)


def _documents(count: int) -> str:
    return f"{count} document" if count == 1 else f"{count} documents"


def split_validation_documents(documents: DatasetDict, percentage: int, seed: int) -> DatasetDict:
    """Splits ``train`` and ``validation`` for pretraining, each with enough documents for NSP instances.

    Without a ``validation`` split, ``percentage`` percent of the training documents (rounded up) are held out
    with ``Dataset.train_test_split(seed=seed)``. Next-sentence prediction draws the random B segment from
    another document of the same split, so each split needs at least 2 documents. Raises ValueError before
    anything is split or written, saying how many documents each split would get and which flag fixes it
    (--validation_split_percentage, --validation_file, --document_boundary). ``documents`` is returned as it
    is when it already has a validation split.
    """
    if "validation" in documents:
        for split, source in (("training", "the training corpus"), ("validation", "--validation_file")):
            count = len(documents["train" if split == "training" else "validation"])
            if count < _MIN_NSP_DOCUMENTS:
                raise Refusal(
                    f"the {split} split has {_documents(count)}; next-sentence prediction needs at least "
                    f"{_MIN_NSP_DOCUMENTS} documents in each split (B segments come from another document). "
                    f"Give {source} more documents, or {_BOUNDARY_HINT}; --validation_file is the "
                    "validation corpus"
                )
        return documents
    total = len(documents["train"])
    if not 1 <= percentage <= 99:
        raise Refusal(
            f"--validation_split_percentage {percentage} must be between 1 and 99 (the share of the training "
            "corpus held out for evaluation); or pass --validation_file"
        )

    def held_out(share: int) -> int:  # what Dataset.train_test_split(test_size=share / 100) holds out
        return math.ceil(share / 100 * total)

    workable = [
        share
        for share in range(1, 100)
        if held_out(share) >= _MIN_NSP_DOCUMENTS and total - held_out(share) >= _MIN_NSP_DOCUMENTS
    ]
    if not workable:
        raise Refusal(
            f"the training corpus has {_documents(total)} and there is no validation split; next-sentence "
            f"prediction needs at least {_MIN_NSP_DOCUMENTS} documents in each of the training and validation "
            f"splits (B segments come from another document), so {_documents(total)} cannot be split. Pass a "
            f"separate validation corpus with --validation_file (and at least {_MIN_NSP_DOCUMENTS} training "
            f"documents), or {_BOUNDARY_HINT}"
        )
    validation_count = held_out(percentage)
    if percentage not in workable:
        suggestion = min(workable, key=lambda share: abs(share - percentage))
        raise Refusal(
            f"--validation_split_percentage {percentage} holds out {validation_count} of the {total} documents "
            f"for validation and leaves {total - validation_count} for training; next-sentence prediction needs "
            f"at least {_MIN_NSP_DOCUMENTS} documents in each split (B segments come from another document). "
            f"Pass --validation_split_percentage {suggestion} (anything from {workable[0]} to {workable[-1]} "
            f"works for {total} documents), or a separate validation corpus with --validation_file"
        )
    # An int test_size holds out the same documents as percentage / 100 and cannot round differently.
    split = documents["train"].train_test_split(test_size=validation_count, seed=seed)
    return DatasetDict(train=split["train"], validation=split["test"])


def split_sentences(paragraph: str) -> list[str]:
    """Split a paragraph into sentences with a small regex (see ``_SENTENCE_BOUNDARY``).

    Works on WikiText's space-tokenised paragraphs as well as on ordinary prose. Empty pieces are dropped.
    """
    return [sentence for sentence in (s.strip() for s in _SENTENCE_BOUNDARY.split(paragraph)) if sentence]


def tokenize_documents(
    documents: Dataset, tokenizer: PreTrainedTokenizerBase, num_proc: int | None = None
) -> Dataset:
    """Split every paragraph into sentences and tokenize them (no special tokens).

    Args:
        documents: dataset with a ``"paragraphs"`` column (``list[str]`` per document), as returned by
            :func:`hfbert.corpus.load_documents`.
        tokenizer: a fast tokenizer; sentences are tokenized in batches.
        num_proc: worker processes for ``datasets.map``.

    Returns:
        A dataset with one column ``"sentences"``: ``list[list[int]]`` per document, one list of token ids per
        sentence. Sentences that tokenize to nothing and documents left without sentences are dropped.
        Cached by the datasets fingerprint when ``documents`` is backed by cache files.
    """
    if "paragraphs" not in documents.column_names:
        raise ValueError(
            f"tokenize_documents expects a 'paragraphs' column, got columns {documents.column_names}; "
            "pass the output of hfbert.corpus.load_documents"
        )
    fingerprint = Hasher.hash(
        ["tokenize_documents", documents._fingerprint, tokenizer_fingerprint(tokenizer), _SOURCE_FINGERPRINT]
    )
    return documents.map(
        _tokenize_batch,
        batched=True,
        batch_size=DOCUMENTS_PER_BATCH,
        writer_batch_size=DOCUMENTS_PER_BATCH,
        num_proc=num_proc,
        remove_columns=documents.column_names,
        features=TOKENIZED_FEATURES,
        fn_kwargs={"tokenizer": tokenizer},
        new_fingerprint=fingerprint,
        desc="Tokenizing sentences",
    )


def _tokenize_batch(batch: dict[str, list], tokenizer: PreTrainedTokenizerBase) -> dict[str, list]:
    sentences_per_document = [
        [sentence for paragraph in paragraphs for sentence in split_sentences(paragraph)]
        for paragraphs in batch["paragraphs"]
    ]
    flat_sentences = [sentence for sentences in sentences_per_document for sentence in sentences]
    # The tokenizer rejects an empty list, which a batch of empty documents would give.
    flat_ids = (
        tokenizer(
            flat_sentences,
            add_special_tokens=False,
            return_attention_mask=False,
            return_token_type_ids=False,
            verbose=False,  # sentences longer than model_max_length are expected; instances truncate later
        )["input_ids"]
        if flat_sentences
        else []
    )
    tokenized_documents = []
    start = 0
    for sentences in sentences_per_document:
        document = [ids for ids in flat_ids[start : start + len(sentences)] if ids]
        start += len(sentences)
        if document:
            tokenized_documents.append(document)
    return {"sentences": tokenized_documents}


def build_nsp_instances(
    tokenized: Dataset,
    *,
    cls_token_id: int,
    sep_token_id: int,
    max_seq_length: int,
    short_seq_prob: float = 0.1,
    seed: int = 42,
    pass_index: int = 0,
    num_proc: int | None = None,
) -> Dataset:
    """Build ``[CLS] A [SEP] B [SEP]`` next-sentence-prediction instances from tokenized documents.

    Follows google-research/bert's ``create_instances_from_document``: per document a target length of
    ``max_seq_length - 3`` (with probability ``short_seq_prob`` a random one in ``[2, max_seq_length - 3]``),
    whole sentences accumulated into a chunk up to that target, A/B split at a random sentence boundary, B
    replaced by a span of a different document with probability 0.5 (always when the chunk is one sentence),
    and the longer side trimmed from the front or back at random until the pair fits.

    The random stream is seeded per ``(seed, pass_index, document index)``, so the result does not depend on
    ``num_proc`` or the batch size, and another ``pass_index`` gives fresh pairings (google's ``dupe_factor``,
    or one pass per epoch).

    Args:
        tokenized: output of :func:`tokenize_documents` (column ``"sentences"``).
        cls_token_id: id of ``[CLS]``.
        sep_token_id: id of ``[SEP]``.
        max_seq_length: maximum instance length including the three special tokens.
        short_seq_prob: probability that a document uses a shorter random target length.
        seed: base seed.
        pass_index: which pass over the corpus this is.
        num_proc: worker processes for ``datasets.map``.

    Returns:
        Dataset with ``input_ids``, ``token_type_ids`` (0 for ``[CLS] A [SEP]``, 1 for ``B [SEP]``) and
        ``next_sentence_label`` (0 = B really follows A, 1 = B comes from another document). Not padded, not
        masked. Cached by the datasets fingerprint when ``tokenized`` is backed by cache files.
    """
    check_nsp_inputs(tokenized, max_seq_length, short_seq_prob)
    parameters = {
        "cls_token_id": cls_token_id,
        "sep_token_id": sep_token_id,
        "max_num_tokens": max_seq_length - 3,
        "short_seq_prob": short_seq_prob,
        "seed": seed,
        "pass_index": pass_index,
    }
    # Keyed by the tokenized documents' fingerprint (itself keyed by content) and the parameters, not by
    # datasets' hash of fn_kwargs, which would hash the whole `all_documents` object.
    fingerprint = Hasher.hash(["build_nsp_instances", tokenized._fingerprint, parameters, _SOURCE_FINGERPRINT])
    return tokenized.map(
        _build_instances_batch,
        batched=True,
        batch_size=DOCUMENTS_PER_BATCH,
        with_indices=True,
        num_proc=num_proc,
        remove_columns=tokenized.column_names,
        features=INSTANCE_FEATURES,
        # Arrow rows let a random span be read sentence by sentence instead of converting whole documents.
        fn_kwargs={"all_documents": tokenized.with_format("arrow"), **parameters},
        new_fingerprint=fingerprint,
        desc=f"Building NSP instances (pass {pass_index})",
    )


def check_nsp_inputs(tokenized: Dataset, max_seq_length: int, short_seq_prob: float) -> None:
    """Refuse what cannot make NSP instances, before any work: too short a length, a bad probability, or too
    few documents to draw random next segments from."""
    if max_seq_length < 5:
        raise ValueError(
            f"max_seq_length {max_seq_length} leaves no room for two segments besides [CLS] [SEP] [SEP]; "
            "pass max_seq_length >= 5"
        )
    if not 0.0 <= short_seq_prob <= 1.0:
        raise ValueError(f"short_seq_prob {short_seq_prob} is not a probability; pass a value in [0, 1]")
    if len(tokenized) < _MIN_NSP_DOCUMENTS:
        raise Refusal(
            f"Next-sentence prediction needs at least {_MIN_NSP_DOCUMENTS} documents to draw random next "
            f"segments from, but this split has {_documents(len(tokenized))} with text left after tokenizing; "
            "use a larger corpus: more documents in --train_file or --validation_file, or a larger "
            f"--validation_split_percentage when the validation documents are held out of the training corpus; "
            f"{_BOUNDARY_HINT}"
        )


def _build_instances_batch(
    batch: dict[str, list],
    indices: list[int],
    *,
    all_documents: Dataset,
    cls_token_id: int,
    sep_token_id: int,
    max_num_tokens: int,
    short_seq_prob: float,
    seed: int,
    pass_index: int,
) -> dict[str, list]:
    output: dict[str, list[Any]] = {name: [] for name in INSTANCE_FEATURES}
    piece_length = -(-max_num_tokens // 2)  # two pieces fill an instance: A and a real next B
    for sentences, document_index in zip(batch["sentences"], indices, strict=True):
        document = _split_long_sentences(sentences, piece_length)
        # A string seed is hashed with SHA-512 by random.Random, so it is stable across processes and runs.
        rng = random.Random(f"{seed}-{pass_index}-{document_index}")
        for tokens_a, tokens_b, is_random_next in _create_pairs_from_document(
            document, document_index, all_documents, max_num_tokens, short_seq_prob, rng
        ):
            output["input_ids"].append([cls_token_id, *tokens_a, sep_token_id, *tokens_b, sep_token_id])
            output["token_type_ids"].append([0] * (len(tokens_a) + 2) + [1] * (len(tokens_b) + 1))
            output["next_sentence_label"].append(int(is_random_next))
    return output


def build_mlm_instances(
    tokenized: Dataset,
    *,
    cls_token_id: int,
    sep_token_id: int,
    max_seq_length: int,
    num_proc: int | None = None,
) -> Dataset:
    """``[CLS] segment [SEP]`` instances for masked LM alone (``--objective mlm``, RoBERTa's finding that NSP
    can be dropped).

    Each document's tokens, in order, are cut into segments of ``max_seq_length - 2`` tokens, anywhere (not at
    sentence boundaries), as transformers' run_mlm.py groups texts, so every token of the corpus is in exactly
    one instance. Segments stay within their document (RoBERTa's DOC-SENTENCES; its FULL-SENTENCES would cross
    into the next document): a document's last segment is shorter. No randomness: the masks, drawn per epoch,
    are what changes between epochs.

    Returns:
        Dataset with ``input_ids`` and ``token_type_ids`` (all 0); no ``next_sentence_label``.
    """
    if max_seq_length < 3:
        raise ValueError(f"max_seq_length {max_seq_length} leaves no room for a segment; pass max_seq_length >= 3")
    parameters = {"cls_token_id": cls_token_id, "sep_token_id": sep_token_id, "segment_length": max_seq_length - 2}
    fingerprint = Hasher.hash(["build_mlm_instances", tokenized._fingerprint, parameters, _SOURCE_FINGERPRINT])
    return tokenized.map(
        _build_segments_batch,
        batched=True,
        batch_size=DOCUMENTS_PER_BATCH,
        num_proc=num_proc,
        remove_columns=tokenized.column_names,
        features=MLM_INSTANCE_FEATURES,
        fn_kwargs=parameters,
        new_fingerprint=fingerprint,
        desc="Building MLM segments",
    )


def _build_segments_batch(
    batch: dict[str, list], *, cls_token_id: int, sep_token_id: int, segment_length: int
) -> dict[str, list]:
    output: dict[str, list[Any]] = {name: [] for name in MLM_INSTANCE_FEATURES}
    for document in batch["sentences"]:
        tokens = [token for sentence in document for token in sentence]
        for start in range(0, len(tokens), segment_length):
            segment = tokens[start : start + segment_length]
            output["input_ids"].append([cls_token_id, *segment, sep_token_id])
            output["token_type_ids"].append([0] * (len(segment) + 2))
    return output


def _split_long_sentences(document: list[list[int]], piece_length: int) -> list[list[int]]:
    """Cut every sentence longer than ``piece_length`` tokens into pieces of that length (the last shorter).

    The sentence regex finds no boundary in lower-cased or unpunctuated text, whose "sentences" are then whole
    paragraphs or lines: kept whole, such a sentence is a chunk on its own, always gets a random B and is
    truncated to the instance, losing most of its tokens. Pieces of half an instance keep every token (but one
    per instance, from rounding), and give such text real next-segment pairs.
    """
    if all(len(sentence) <= piece_length for sentence in document):
        return document
    return [
        sentence[start : start + piece_length]
        for sentence in document
        for start in range(0, len(sentence), piece_length)
    ]


def _create_pairs_from_document(
    document: list[list[int]],
    document_index: int,
    all_documents: Dataset,
    max_num_tokens: int,
    short_seq_prob: float,
    rng: random.Random,
) -> list[tuple[list[int], list[int], bool]]:
    """google-research/bert ``create_instances_from_document``, returning (A, B, is_random_next) triples.

    One deviation: the shorter target is drawn per chunk, not once per document. Drawn per document, a short
    target turns almost every chunk of that document into a single sentence, which always gets a random B,
    and such documents yield many instances: on WikiText that skews the labels to ~60% random.
    """

    def draw_target_length() -> int:
        return rng.randint(2, max_num_tokens) if rng.random() < short_seq_prob else max_num_tokens

    target_seq_length = draw_target_length()
    pairs = []
    current_chunk: list[list[int]] = []
    current_length = 0
    i = 0
    while i < len(document):
        segment = document[i]
        current_chunk.append(segment)
        current_length += len(segment)
        if i == len(document) - 1 or current_length >= target_seq_length:
            # How many sentences of the chunk go into A.
            a_end = rng.randint(1, len(current_chunk) - 1) if len(current_chunk) >= 2 else 1
            tokens_a = [token for sentence in current_chunk[:a_end] for token in sentence]
            is_random_next = len(current_chunk) == 1 or rng.random() < 0.5
            if is_random_next:
                target_b_length = target_seq_length - len(tokens_a)
                random_index = _other_document_index(document_index, len(all_documents), rng)
                random_document = all_documents[random_index]["sentences"][0]
                tokens_b = []
                for j in range(rng.randint(0, len(random_document) - 1), len(random_document)):
                    # No more of a sentence than an instance holds: an unpunctuated line can be megabytes long.
                    sentence = random_document[j].values
                    tokens_b.extend(sentence.slice(0, max_num_tokens + 1).to_pylist())
                    if len(tokens_b) >= target_b_length:
                        break
                # The chunk's unused sentences go back to the document for the next instance.
                i -= len(current_chunk) - a_end
            else:
                tokens_b = [token for sentence in current_chunk[a_end:] for token in sentence]
            _truncate_seq_pair(tokens_a, tokens_b, max_num_tokens, rng)
            pairs.append((tokens_a, tokens_b, is_random_next))
            current_chunk = []
            current_length = 0
            target_seq_length = draw_target_length()
        i += 1
    return pairs


def _other_document_index(document_index: int, num_documents: int, rng: random.Random) -> int:
    # google retries randint up to 10 times and may still return the same document; drawing uniformly among
    # the other documents gives the distribution it aims for and never the same one.
    other_index = rng.randint(0, num_documents - 2)
    return other_index + 1 if other_index >= document_index else other_index


def _truncate_seq_pair(
    tokens_a: list[int], tokens_b: list[int], max_num_tokens: int, rng: random.Random
) -> None:
    """Trim the longer list, from the front or the back at random, until both fit into max_num_tokens.

    google's token-by-token loop (one draw per removed token, the same draws and result), with the removals
    counted first and cut in one slice per end: deleting from a list's front one token at a time is quadratic.
    """
    length_a, length_b = len(tokens_a), len(tokens_b)
    cut = {"a": [0, 0], "b": [0, 0]}  # tokens to remove from the front, from the back
    while length_a + length_b > max_num_tokens:
        side = "a" if length_a > length_b else "b"
        cut[side][0 if rng.random() < 0.5 else 1] += 1
        if side == "a":
            length_a -= 1
        else:
            length_b -= 1
    for tokens, (front, back) in ((tokens_a, cut["a"]), (tokens_b, cut["b"])):
        del tokens[len(tokens) - back :]
        del tokens[:front]


logger = logging.getLogger(__name__)


# ---------------------------------------------------------------------------------------------------------
# The data stage: corpus -> documents -> tokenizer -> model config -> instances, and the sample sentences.
# ---------------------------------------------------------------------------------------------------------

TRAINED_TOKENIZER_DIR = ".tokenizer"  # hidden: never uploaded
SAMPLE_WORDS = (6, 40)  # the final folder's samples use sentences of 6 to 40 words


@dataclass
class PretrainingData:
    """What the run trains on: tokenizer, the model config that matches it, and the NSP instances."""

    tokenizer: Any
    config: HfBertConfig
    train: datasets.Dataset
    evaluation: datasets.Dataset
    sample_sentences: list[str]  # validation sentences for the final folder's samples.md
    other_sentence: str | None  # a sentence of another validation document (the random NSP pair)


def load_run_tokenizer(
    data: DataSettings,
    output_dir: Path,
    documents: datasets.DatasetDict,
    accelerator: Accelerator,
    checkpoint_tokenizer: Path | None,
    source: SourceModel | None = None,
) -> Any:
    """The tokenizer of the run: a resumed run's own (`checkpoint_tokenizer`, the folder its checkpoint holds),
    --tokenizer_name, the source model's (--model_name_or_path), or one trained on the training corpus by the
    main process into `output_dir/.tokenizer`."""
    if checkpoint_tokenizer is not None and checkpoint_tokenizer.is_dir():
        checkpoint = checkpoint_tokenizer.parent
        tokenizer = AutoTokenizer.from_pretrained(checkpoint_tokenizer)
        logger.info(f"Resuming with the tokenizer saved in {checkpoint_tokenizer} (none is trained)")
        if data.tokenizer_name is not None:
            named = load_tokenizer(data.tokenizer_name)
            if named.get_vocab() != tokenizer.get_vocab():
                raise Refusal(
                    f"--tokenizer_name {data.tokenizer_name} differs from the tokenizer {checkpoint} was trained "
                    f"with ({len(named)} vs {len(tokenizer)} tokens, or other ids); drop --tokenizer_name to "
                    "resume with the checkpoint's own tokenizer"
                )
        return tokenizer
    if data.tokenizer_name is not None:
        return load_tokenizer(data.tokenizer_name)
    if source is not None:
        return AutoTokenizer.from_pretrained(source.tokenizer_location)
    trained = output_dir / TRAINED_TOKENIZER_DIR
    if accelerator.is_main_process:
        logger.info(
            f"No --tokenizer_name given: training a WordPiece tokenizer (vocab_size={data.vocab_size}) on the "
            "training corpus first; it is saved with the model."
        )
        save_tokenizer(train_tokenizer(documents["train"], vocab_size=data.vocab_size), trained)
    accelerator.wait_for_everyone()
    return AutoTokenizer.from_pretrained(trained)


def build_model_config(
    model: ModelSettings, max_seq_length: int, tokenizer: Any, source: SourceModel | None = None
) -> HfBertConfig:
    """The model config (the source model's, --config_name or the --model_size preset, --dropout applied),
    checked against the tokenizer, --max_seq_length and --attention_init."""
    if source is not None:  # checked against the tokenizer and the flags by check_source_model
        return source_run_config(source, model.dropout)
    if model.config_name is not None:
        config = read_config_file(model.config_name)
        check_tokenizer_matches_config(tokenizer, config)
    else:
        config = model_config_for_tokenizer(tokenizer, model.model_size)
    if model.dropout is not None:
        config.hidden_dropout_prob = config.attention_probs_dropout_prob = model.dropout
    if model.attention_init == "structured":
        check_structured_attention_config(config)
    check_max_seq_length(max_seq_length, config, "the model")
    return config


def build_instances(
    documents: datasets.DatasetDict, tokenizer: Any, data: DataSettings, seed: int
) -> tuple[datasets.Dataset, datasets.Dataset]:
    """NSP instances for training (`dupe_factor` passes) and evaluation (one pass), cached by datasets."""
    nsp = {
        "cls_token_id": tokenizer.cls_token_id,
        "sep_token_id": tokenizer.sep_token_id,
        "max_seq_length": data.max_seq_length,
        "short_seq_prob": data.short_seq_prob,
        "seed": seed,
        "num_proc": data.preprocessing_num_workers,
    }
    tokenized = {
        split: tokenize_documents(documents[split], tokenizer, num_proc=data.preprocessing_num_workers)
        for split in ("train", "validation")
    }
    if data.objective == "mlm":  # [CLS] segment [SEP], one pass (--dupe_factor is 1)
        segments = {key: nsp[key] for key in ("cls_token_id", "sep_token_id", "max_seq_length", "num_proc")}
        passes = [build_mlm_instances(tokenized["train"], **segments)]
        evaluation = build_mlm_instances(tokenized["validation"], **segments)
    else:
        passes = [build_nsp_instances(tokenized["train"], pass_index=i, **nsp) for i in range(data.dupe_factor)]
        evaluation = build_nsp_instances(tokenized["validation"], pass_index=0, **nsp)
    if data.max_eval_samples is not None:
        evaluation = evaluation.select(range(min(data.max_eval_samples, len(evaluation))))
    return datasets.concatenate_datasets(passes), evaluation


@contextmanager
def cache_writers_first(accelerator: Accelerator) -> Iterator[None]:
    """The main process first, then the first process of every other node, then the rest: one writer per
    datasets cache, whether the nodes share one (the others read what the main process wrote) or each node has
    its own (HF_DATASETS_CACHE on a local disk: written by the node's first process, read by its others)."""
    with accelerator.main_process_first(), accelerator.local_main_process_first():
        yield


def prepare_data(
    corpus: CorpusArguments,
    data: DataSettings,
    model: ModelSettings,
    seed: int,
    output_dir: Path,
    accelerator: Accelerator,
    checkpoint_tokenizer: Path | None = None,
    source: SourceModel | None = None,
) -> PretrainingData:
    """Corpus -> tokenizer -> model config -> NSP instances (the main process first, the others from cache).
    `checkpoint_tokenizer`: the tokenizer folder of the checkpoint a resumed run continues from; `source`: the
    model a run starts from (--model_name_or_path), whose tokenizer and config it takes."""
    with cache_writers_first(accelerator):
        documents = load_documents(corpus, num_proc=data.preprocessing_num_workers)
        documents = split_validation_documents(documents, data.validation_split_percentage, seed)
    tokenizer = load_run_tokenizer(data, output_dir, documents, accelerator, checkpoint_tokenizer, source)
    config = build_model_config(model, data.max_seq_length, tokenizer, source)
    tokenizer.model_max_length = config.max_position_embeddings  # what the saved model accepts
    with cache_writers_first(accelerator), naming_cache_failures():
        train, evaluation = build_instances(documents, tokenizer, data, seed)
    sentences, other = sample_sentences(documents["validation"])
    return PretrainingData(
        tokenizer=tokenizer,
        config=config,
        train=train,
        evaluation=evaluation,
        sample_sentences=sentences,
        other_sentence=other,
    )


def sample_sentences(documents: Iterable[Sequence[str] | Mapping[str, Sequence[str]]], count: int = 4):
    """Pick `write_samples`' inputs from validation documents (paragraph lists, or ``{"paragraphs": ...}``).

    Returns (sentences, other): `count` consecutive sentences of 6-40 words from the first document that has
    that many, and one such sentence from a later document (for the random NSP pair; None if there is none).
    Deterministic: the same documents give the same choice. Reads documents only until both are found.
    """

    def usable(sentence: str) -> bool:
        return SAMPLE_WORDS[0] <= len(sentence.split()) <= SAMPLE_WORDS[1]

    sentences: list[str] = []
    for document in documents:
        paragraphs = document["paragraphs"] if isinstance(document, Mapping) else document
        all_sentences = [s for p in paragraphs for s in split_sentences(p)]
        if sentences:
            other = next((s for s in all_sentences if usable(s)), None)
            if other is not None:
                return sentences, other
            continue
        for start in range(len(all_sentences) - count + 1):
            window = all_sentences[start : start + count]
            if all(usable(s) for s in window):
                sentences = window
                break
    return sentences, None
