"""Documents -> tokenized sentences, and the data stage of a run, cached or streamed.

`tokenize_documents` splits paragraphs into sentences and stores their token ids once, in the narrowest
integer type the vocabulary fits; :mod:`hfbert.pretraining.instances` makes NSP pairs and MLM segments from
them while training. `prepare` is the data stage: corpus -> documents -> tokenizer -> model config ->
evaluation instances and training instances. A cached corpus is tokenized and counted once in the datasets
cache (`cached_instances`); a --streaming one is not read ahead of training: its validation documents (the
source's validation split, or the first --stream_validation_documents of the training stream, which training
then skips) are written to the datasets cache and made into instances there, and each process trains on its
share of the stream (`streamed_instances`, made into instances by :mod:`hfbert.pretraining.stream`).
"""

from __future__ import annotations

import hashlib
import itertools
import json
import logging
import math
import re
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from accelerate import Accelerator
from datasets import (
    Dataset,
    DatasetDict,
    Features,
    IterableDataset,
    IterableDatasetDict,
    List,
    NamedSplit,
    Value,
)
from datasets.distributed import split_dataset_by_node
from datasets.fingerprint import Hasher
from transformers import AutoTokenizer, PreTrainedTokenizerBase

from hfbert.checkpointing import tokenizer_folder
from hfbert.configuration_hfbert import HfBertConfig
from hfbert.corpus import (
    DOCUMENT_FEATURES,
    DOCUMENTS_PER_BATCH,
    load_documents,
    naming_cache_failures,
    resolve_document_boundary,
    stream_documents,
)
from hfbert.corpus_arguments import CorpusArguments, corpus_fingerprint
from hfbert.errors import Refusal
from hfbert.files import running_no_folder_code
from hfbert.initialization import check_structured_attention_config
from hfbert.pretraining.instances import (
    BOUNDARY_HINT,
    MIN_NSP_DOCUMENTS,
    DrawnInstances,
    InstanceRecipe,
    TrainingStream,
    check_validation_for_mlm,
    count_of_documents,
    draw_training_instances,
    write_instances,
)
from hfbert.pretraining.settings import DataSettings, ModelSettings, read_config_file
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



def tokenized_features(vocabulary_size: int) -> Features:
    """uint16 token ids for a vocabulary of up to 65,536 entries (BERT's 30,522 included), else int32: the
    cache holds every token of the corpus once, at 2 bytes a token instead of 4."""
    return Features({"sentences": List(List(Value("uint16" if vocabulary_size <= 1 << 16 else "int32")))})

# datasets hashes module-level functions by qualified name, not by code, so without this an edited hfbert
# would silently reuse caches built by the old code. It is part of every cache key below.
_CODE_FINGERPRINT = Hasher.hash(Path(__file__).read_bytes())


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


def split_validation_documents(documents: DatasetDict, percentage: int, seed: int, min_documents: int) -> DatasetDict:
    """Splits ``train`` and ``validation`` for pretraining, each with at least ``min_documents`` documents
    (`split_needs`).

    Without a ``validation`` split, ``percentage`` percent of the training documents (rounded up), and at least
    ``min_documents``, are held out with ``Dataset.train_test_split(seed=seed)`` (one INFO line when the share is
    fewer); `check_validation_split` refuses what cannot be split first. ``documents`` is returned as it is when
    it already has a validation split.
    """
    total = len(documents["train"])
    validation = len(documents["validation"]) if "validation" in documents else None
    held_out = check_validation_split(total, validation, percentage, min_documents)
    if validation is not None:
        return documents
    if held_out > share_of_documents(percentage, total):
        logger.info(
            f"--validation_split_percentage {percentage} holds out {share_of_documents(percentage, total)} of the "
            f"{total} documents; {_why_documents(min_documents)}, so {held_out} are held out for validation and "
            f"{total - held_out} train (--validation_file gives a validation corpus of your own)"
        )
    # An int test_size holds out the same documents as percentage / 100 and cannot round differently.
    split = documents["train"].train_test_split(test_size=held_out, seed=seed)
    return DatasetDict(train=split["train"], validation=split["test"])


# The documents that settle `check_validation_split` for any percentage: with this many or more, 1% holds out
# 2 and 99% leaves 2.
DOCUMENTS_ANY_SPLIT_FITS = 100 * MIN_NSP_DOCUMENTS


def split_needs(objective: str) -> int:
    """The documents each split needs: next-sentence prediction draws the random B segment from another
    document of the same split, so 2 for NSP; 1 for --objective mlm."""
    return MIN_NSP_DOCUMENTS if objective == "mlm+nsp" else 1


def _why_documents(min_documents: int, splits: str = "each split") -> str:
    if min_documents == 1:
        return f"--objective mlm needs at least 1 document in {splits}"
    return (
        f"next-sentence prediction needs at least {min_documents} documents in {splits} (B segments come from "
        "another document)"
    )


def share_of_documents(percentage: int, total: int) -> int:
    """What Dataset.train_test_split(test_size=percentage / 100) holds out of `total` documents: rounded up."""
    return math.ceil(percentage / 100 * total)


def check_validation_split(total: int, validation: int | None, percentage: int, min_documents: int) -> int:
    """The documents `split_validation_documents` holds out of ``total`` training documents (``validation``:
    the documents of a validation split, None without one). Each split needs ``min_documents`` (`split_needs`):
    a share that rounds below it holds out ``min_documents``; a corpus that cannot give both splits as many, or a
    share that leaves training fewer, is refused, saying how many documents each split would get and which flag
    fixes it (--validation_split_percentage, --validation_file, --document_boundary)."""
    if validation is not None:
        splits = (("training", total, "the training corpus"), ("validation", validation, "--validation_file"))
        for split, count, source in splits:
            if count < min_documents:
                raise Refusal(
                    f"the {split} split has {count_of_documents(count)}; {_why_documents(min_documents)}. "
                    f"Give {source} more documents, or {BOUNDARY_HINT}; --validation_file is the "
                    "validation corpus"
                )
        return validation
    if not 1 <= percentage <= 99:
        raise Refusal(
            f"--validation_split_percentage {percentage} must be between 1 and 99 (the share of the training "
            "corpus held out for evaluation); or pass --validation_file"
        )

    def held_out(share: int) -> int:  # the share, and at least what each split needs
        return max(share_of_documents(share, total), min_documents)

    workable = [share for share in range(1, 100) if held_out(share) <= total - min_documents]
    if not workable:
        both = _why_documents(min_documents, "each of the training and validation splits")
        documents = count_of_documents(total)
        raise Refusal(
            f"the training corpus has {documents} and there is no validation split; {both}, so "
            f"{documents} cannot be split. Pass a separate validation corpus with --validation_file (and "
            f"at least {min_documents} training {'document' if min_documents == 1 else 'documents'}), or "
            f"{BOUNDARY_HINT}"
        )
    validation_count = held_out(percentage)
    if percentage not in workable:  # refused, not cut: a share this high was asked for, not rounded
        suggestion = min(workable, key=lambda share: abs(share - percentage))
        raise Refusal(
            f"--validation_split_percentage {percentage} holds out {validation_count} of the {total} documents "
            f"for validation and leaves {total - validation_count} for training; {_why_documents(min_documents)}. "
            f"Pass --validation_split_percentage {suggestion} (anything from {workable[0]} to {workable[-1]} "
            f"works for {total} documents), or a separate validation corpus with --validation_file"
        )
    return validation_count


def first_documents_with_text(
    documents: IterableDataset, tokenizer: PreTrainedTokenizerBase, count: int
) -> Dataset:
    """The first `count` documents of `documents` that keep text after tokenizing (all there are, when fewer),
    tokenized as `tokenize_documents` tokenizes them, in memory: nothing is written (--dry_run)."""
    found: list[list[list[int]]] = []
    for batch in documents.iter(batch_size=DOCUMENTS_PER_BATCH):
        found += tokenize_batch(batch, None, tokenizer)["sentences"]
        if len(found) >= count:
            break
    return Dataset.from_dict({"sentences": found[:count]}, features=tokenized_features(len(tokenizer)))


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
        sentence (uint16 up to 65,536 vocabulary entries, see `tokenized_features`). Sentences that tokenize to nothing and documents left without sentences are dropped.
        Cached by the datasets fingerprint when ``documents`` is backed by cache files (with the corpus
        statistics columns of `tokenized_with_statistics`, which it selects away).
    """
    return tokenized_with_statistics(documents, tokenizer, num_proc).select_columns(["sentences"])


# The columns the tokenizing map adds beside "sentences" (one row per document that has text).
STATISTICS_FEATURES = {
    "paragraph_hashes": List(Value("int64")),
    "paragraph_tokens": List(Value("int32")),
    "document_hash": Value("int64"),
    "document_tokens": Value("int64"),
    "sentence_count": Value("int32"),
    "unknown_tokens": Value("int32"),
    "document_index": Value("int64"),  # the row of the documents dataset (documents without text are dropped)
}


def text_hash(text: str) -> int:
    """A 63-bit hash of `text` with its whitespace collapsed (the same in every process, unlike `hash`; 63
    bits: pyarrow reads Python ints as int64)."""
    digest = hashlib.blake2b(" ".join(text.split()).encode("utf-8"), digest_size=8).digest()
    return int.from_bytes(digest, "little") >> 1


def document_statistics(
    paragraphs: Sequence[str], paragraph_ids: Sequence[Sequence[Sequence[int]]], unknown_id: int | None, index: int
) -> dict[str, Any]:
    """The `STATISTICS_FEATURES` row of one document: its paragraphs' text and their sentences' token ids."""
    paragraph_tokens = [sum(len(ids) for ids in sentences) for sentences in paragraph_ids]
    return {
        "paragraph_hashes": [text_hash(paragraph) for paragraph in paragraphs],
        "paragraph_tokens": paragraph_tokens,
        "document_hash": text_hash("\n".join(paragraphs)),
        "document_tokens": sum(paragraph_tokens),
        "sentence_count": sum(1 for sentences in paragraph_ids for ids in sentences if ids),
        "unknown_tokens": sum(ids.count(unknown_id) for sentences in paragraph_ids for ids in sentences),
        "document_index": index,
    }


def tokenized_with_statistics(
    documents: Dataset, tokenizer: PreTrainedTokenizerBase, num_proc: int | None = None
) -> Dataset:
    """`tokenize_documents` with the run-health columns beside ``"sentences"`` (a hash and a token count per
    paragraph, and per document its hash, tokens, sentences, [UNK] tokens and row: `STATISTICS_FEATURES`),
    made in the same pass so that the corpus statistics never read the text again."""
    if "paragraphs" not in documents.column_names:
        raise ValueError(
            f"tokenize_documents expects a 'paragraphs' column, got columns {documents.column_names}; "
            "pass the output of hfbert.corpus.load_documents"
        )
    fingerprint = Hasher.hash(  # _fingerprint: private, kept: datasets has no public accessor (test_corpus checks it)
        ["tokenize_documents", documents._fingerprint, tokenizer_fingerprint(tokenizer), _CODE_FINGERPRINT]
    )
    return documents.map(
        tokenize_batch, batched=True, with_indices=True, fn_kwargs={"tokenizer": tokenizer},
        batch_size=DOCUMENTS_PER_BATCH, writer_batch_size=DOCUMENTS_PER_BATCH, num_proc=num_proc,
        remove_columns=documents.column_names, new_fingerprint=fingerprint, desc="Tokenizing sentences",
        features=Features({**tokenized_features(len(tokenizer)), **STATISTICS_FEATURES}),
    )


def tokenize_batch(
    batch: dict[str, list], indices: list[int] | None, tokenizer: PreTrainedTokenizerBase
) -> dict[str, list]:
    """The ``"sentences"`` of a batch of documents and, given the documents' `indices`, their
    `STATISTICS_FEATURES` columns (without: the sentences only, what a --streaming window tokenizes)."""
    sentences_per_paragraph = [
        [split_sentences(paragraph) for paragraph in paragraphs] for paragraphs in batch["paragraphs"]
    ]
    flat_sentences = [s for document in sentences_per_paragraph for sentences in document for s in sentences]
    # The tokenizers backend directly: transformers' wrapper converts every encoding into a dict of lists,
    # a fifth of the tokenizing time, for the same ids. Truncation and padding are call-time state that a
    # wrapper call may have left set; sentences longer than an instance are cut later, when pairing.
    backend = tokenizer.backend_tokenizer
    backend.no_truncation()
    backend.no_padding()
    encodings = iter(backend.encode_batch_fast(flat_sentences, add_special_tokens=False))
    names = ["sentences", *(STATISTICS_FEATURES if indices is not None else [])]
    columns: dict[str, list] = {name: [] for name in names}
    for number, document in enumerate(sentences_per_paragraph):
        paragraph_ids = [[next(encodings).ids for _ in paragraph] for paragraph in document]
        sentence_ids = [ids for sentences in paragraph_ids for ids in sentences if ids]
        if not sentence_ids:
            continue
        columns["sentences"].append(sentence_ids)
        if indices is not None:
            paragraphs = batch["paragraphs"][number]
            row = document_statistics(paragraphs, paragraph_ids, tokenizer.unk_token_id, indices[number])
            for name, value in row.items():
                columns[name].append(value)
    return columns


logger = logging.getLogger(__name__)


# ---------------------------------------------------------------------------------------------------------
# The data stage: corpus -> documents -> tokenizer -> model config -> instances, and the sample sentences.
# ---------------------------------------------------------------------------------------------------------

TRAINED_TOKENIZER_DIR = ".tokenizer"  # hidden: never uploaded
SAMPLE_WORDS = (6, 40)  # the final folder's samples use sentences of 6 to 40 words
SAMPLE_COUNT = 4  # consecutive sentences of one validation document


@dataclass(frozen=True)
class StatisticsColumns:
    """Training documents (`scope` says which: the training split, a stream's first window) and their tokenized
    form with the `STATISTICS_FEATURES` columns beside the sentences: what the corpus statistics are counted
    from (`hfbert.pretraining.extras.health.corpus.cached_corpus_health`), no text read again."""

    tokenized: Dataset
    documents: Dataset
    scope: str


@dataclass
class PreparedData:
    """What the run trains on: tokenizer, the model config that matches it, and the instances."""

    tokenizer: Any
    config: HfBertConfig
    train: DrawnInstances | TrainingStream  # TrainingStream: --streaming
    eval_instances: Dataset
    sample_sentences: list[str]  # validation sentences for the final folder's samples.md
    other_sentence: str | None  # a sentence of another validation document (the random NSP pair)
    statistics_columns: StatisticsColumns | None = None
    # sha256 of the local corpus files as the data stage read them (None: a Hub dataset); what checkpoints record
    corpus_sha256: str | None = None


def load_run_tokenizer(
    data: DataSettings,
    output_dir: Path,
    documents: DatasetDict | IterableDatasetDict,
    accelerator: Accelerator,
    checkpoint: Path | None,
    source: SourceModel | None = None,
) -> Any:
    """The tokenizer of the run: a resumed run's own (the one its `checkpoint` holds), --tokenizer_name, the
    source model's (--model_name_or_path), or one trained on the training corpus by the main process into
    `output_dir/.tokenizer` (never on a stream)."""
    if isinstance(documents, IterableDatasetDict):
        check_stream_tokenizer(data, checkpoint, source)
    resumed = None if checkpoint is None else tokenizer_folder(checkpoint)
    if resumed is not None:
        with running_no_folder_code(f"the checkpoint {checkpoint}", "tokenizer"):
            tokenizer = AutoTokenizer.from_pretrained(resumed, trust_remote_code=False)
        logger.info(f"Resuming with the tokenizer saved in {resumed} (none is trained)")
        if data.tokenizer_name is not None:
            named = load_tokenizer(data.tokenizer_name)
            if named.get_vocab() != tokenizer.get_vocab():
                raise Refusal(
                    f"--tokenizer_name {data.tokenizer_name} differs from the tokenizer {checkpoint} "
                    f"was trained with ({len(named)} vs {len(tokenizer)} tokens, or other ids); drop --tokenizer_name "
                    "to resume with the checkpoint's own tokenizer"
                )
        return tokenizer
    if data.tokenizer_name is not None:
        return load_tokenizer(data.tokenizer_name)
    if source is not None:
        return AutoTokenizer.from_pretrained(source.tokenizer_location, trust_remote_code=False)  # checked before
    trained = output_dir / TRAINED_TOKENIZER_DIR
    if accelerator.is_main_process:
        logger.info(
            f"No --tokenizer_name given: training a WordPiece tokenizer (vocab_size={data.vocab_size}) on the "
            "training corpus first; it is saved with the model."
        )
        save_tokenizer(train_tokenizer(documents["train"], vocab_size=data.vocab_size), trained)
    accelerator.wait_for_everyone()
    return AutoTokenizer.from_pretrained(trained, trust_remote_code=False)


def build_model_config(
    model: ModelSettings, tokenizer: Any, source: SourceModel | None = None
) -> HfBertConfig:
    """The model config (the source model's, --config_name or the --model_size preset, --dropout applied),
    checked against the tokenizer and --attention_init (--max_seq_length was checked against the same
    position embeddings before any work: `PretrainingSettings.validate`, `check_config_file`)."""
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
    return config


def instance_recipe(data: DataSettings, tokenizer: Any, seed: int) -> InstanceRecipe:
    """How the run's documents become instances: --objective, --max_seq_length and --short_seq_prob."""
    return InstanceRecipe(
        objective=data.objective, cls_token_id=tokenizer.cls_token_id, sep_token_id=tokenizer.sep_token_id,
        max_seq_length=data.max_seq_length, short_seq_prob=data.short_seq_prob, seed=seed,
    )


def count_training_instances(train: DrawnInstances | TrainingStream) -> int | None:
    """How many training instances a run has: None for a stream (--streaming), whose length is unknown."""
    return None if isinstance(train, TrainingStream) else len(train)


@contextmanager
def cache_writers_first(accelerator: Accelerator) -> Iterator[None]:
    """The main process first, then the first process of every other node, then the rest: one writer per
    datasets cache, whether the nodes share one (the others read what the main process wrote) or each node has
    its own (HF_DATASETS_CACHE on a local disk: written by the node's first process, read by its others)."""
    with accelerator.main_process_first(), accelerator.local_main_process_first():
        yield


def prepare(
    corpus: CorpusArguments,
    data: DataSettings,
    model: ModelSettings,
    seed: int,
    output_dir: Path,
    accelerator: Accelerator,
    checkpoint: Path | None = None,
    source: SourceModel | None = None,
) -> PreparedData:
    """The data stage: corpus -> tokenizer -> model config -> the evaluation instances and the training
    instances, cached (`cached_instances`) or, with --streaming, a stream made into instances while training
    (`streamed_instances`); what the datasets cache holds is written by one process and read by the others
    (`cache_writers_first`). `checkpoint`: the checkpoint a resumed run continues from (its tokenizer is the
    run's); `source`: the model a run starts from (--model_name_or_path), whose tokenizer and config it
    takes."""
    corpus_sha256 = corpus_fingerprint(corpus)  # as read now, whatever the files hold later
    if corpus.streaming:
        documents = load_documents(corpus)  # lazy: nothing is read but the first document of each split
    else:
        with cache_writers_first(accelerator):
            documents = load_documents(corpus, num_proc=data.preprocessing_num_workers)
            documents = split_validation_documents(
                documents, data.validation_split_percentage, seed, split_needs(data.objective)
            )
    tokenizer = load_run_tokenizer(data, output_dir, documents, accelerator, checkpoint, source)
    config = build_model_config(model, tokenizer, source)
    tokenizer.model_max_length = config.max_position_embeddings  # what the saved model accepts
    with cache_writers_first(accelerator), naming_cache_failures():
        if corpus.streaming:
            instances = streamed_instances(documents, tokenizer, data, seed, corpus, accelerator)
        else:
            instances = cached_instances(documents, tokenizer, data, seed)
    train, validation, evaluation, columns = instances
    sentences, other = sample_sentences(validation)
    return PreparedData(tokenizer, config, train, evaluation, sentences, other, columns, corpus_sha256)


def evaluation_instances(tokenized: Dataset, recipe: InstanceRecipe, data: DataSettings) -> Dataset:
    """The evaluation instances: one pass over the tokenized validation documents, written (every evaluation
    scores the same rows), at most --max_eval_samples."""
    if not recipe.pairs:  # NSP's own check (`check_documents_for_nsp`) refuses too few documents
        check_validation_for_mlm(tokenized)
    evaluation = write_instances(tokenized, recipe, num_proc=data.preprocessing_num_workers)
    if data.max_eval_samples is not None:
        evaluation = evaluation.select(range(min(data.max_eval_samples, len(evaluation))))
    return evaluation


def cached_instances(
    documents: DatasetDict, tokenizer: Any, data: DataSettings, seed: int
) -> tuple[DrawnInstances, Dataset, Dataset, StatisticsColumns]:
    """The training instances (`dupe_factor` passes, counted now and made while training), the validation
    documents, their instances and the training split's statistics columns, all from the same cached map."""
    recipe = instance_recipe(data, tokenizer, seed)
    workers = data.preprocessing_num_workers
    tokenized = {
        split: tokenized_with_statistics(documents[split], tokenizer, num_proc=workers) for split in documents
    }
    sentences = {split: tokenized[split].select_columns(["sentences"]) for split in tokenized}
    # --objective mlm cuts every document the same way in every pass: --dupe_factor is 1 (settings refuse more).
    train = draw_training_instances(sentences["train"], recipe, data.dupe_factor, num_proc=workers)
    evaluation = evaluation_instances(sentences["validation"], recipe, data)
    columns = StatisticsColumns(tokenized["train"], documents["train"], "the training split")
    return train, documents["validation"], evaluation, columns


def streamed_instances(
    documents: IterableDatasetDict,
    tokenizer: Any,
    data: DataSettings,
    seed: int,
    corpus: CorpusArguments,
    accelerator: Accelerator,
) -> tuple[TrainingStream, Dataset, Dataset, StatisticsColumns]:
    """This process's share of the training stream (`split_dataset_by_node`), the validation documents (written
    to the datasets cache, `validation_documents`), their instances, made as a cached run makes them, and the
    statistics columns of the stream's first window (written to the datasets cache too)."""
    recipe = instance_recipe(data, tokenizer, seed)
    validation = validation_documents(documents, corpus, data)
    tokenized = tokenize_documents(validation, tokenizer, num_proc=data.preprocessing_num_workers)
    if recipe.pairs:
        check_stream_validation_for_nsp(tokenized)
    evaluation = evaluation_instances(tokenized, recipe, data)
    held_out = 0 if "validation" in documents else data.stream_validation_documents
    # No skip(0): it would change the stream's state_dict(), which a checkpoint's positions hold.
    train = documents["train"].skip(held_out) if held_out else documents["train"]
    head = written_documents(train, data.stream_window_documents, corpus, "train", held_out)
    scope = f"the first {len(head):,} training documents of the stream (--streaming reads no further ahead)"
    tokenized_head = tokenized_with_statistics(head, tokenizer, num_proc=data.preprocessing_num_workers)
    columns = StatisticsColumns(tokenized_head, head, scope)
    train = split_dataset_by_node(train, rank=accelerator.process_index, world_size=accelerator.num_processes)
    stream = TrainingStream(train, recipe, tokenizer, data.stream_window_documents, accelerator.process_index)
    return stream, validation, evaluation, columns


def check_stream_validation_for_nsp(tokenized: Dataset) -> None:
    """Refuse a stream's tokenized validation documents that hold too few documents with text for NSP."""
    if len(tokenized) < MIN_NSP_DOCUMENTS:
        raise Refusal(
            f"the validation documents of this stream give {len(tokenized)} document(s) with text; next-sentence "
            f"prediction needs at least {MIN_NSP_DOCUMENTS} (B segments come from another document): pass a "
            "larger --stream_validation_documents or --max_eval_samples, or a --validation_file with more "
            "documents; check --document_boundary too"
        )


def stream_validation_split(documents: IterableDatasetDict, data: DataSettings) -> tuple[IterableDataset, int | None]:
    """Where a stream's validation documents come from and how many are taken (None: all): the source's
    validation split (at most --max_eval_samples documents, which give at least as many instances), else the
    first --stream_validation_documents of the training stream."""
    held_out = "validation" not in documents
    limits = [data.max_eval_samples, data.stream_validation_documents if held_out else None]
    count = min((limit for limit in limits if limit is not None), default=None)
    return documents["train" if held_out else "validation"], count


def validation_documents(
    documents: IterableDatasetDict, corpus: CorpusArguments, data: DataSettings
) -> Dataset:
    """A stream's validation documents (`stream_validation_split`), written once to the datasets cache."""
    stream, count = stream_validation_split(documents, data)
    return written_documents(stream, count, corpus, "validation", "validation" not in documents)


def written_documents(
    stream: IterableDataset, count: int | None, corpus: CorpusArguments, split: str, *key: Any
) -> Dataset:
    """The first `count` documents of `stream` (None: all of them), written once to the datasets cache under the
    corpus (its content where it is local files), the count, `split` and `key`."""
    source = [
        getattr(corpus, name)
        for name in ("dataset_name", "dataset_config_name", "train_file", "validation_file", "text_column")
    ]
    fingerprint = Hasher.hash(
        [split, source, resolve_document_boundary(corpus), corpus_fingerprint(corpus), count, key, _CODE_FINGERPRINT]
    )
    return Dataset.from_generator(
        _first_documents, features=DOCUMENT_FEATURES, gen_kwargs={"documents": stream, "count": count},
        split=NamedSplit(split), writer_batch_size=DOCUMENTS_PER_BATCH, fingerprint=fingerprint,
    )


def _first_documents(documents: IterableDataset, count: int | None) -> Iterator[dict[str, Any]]:
    yield from documents if count is None else documents.take(count)


def check_corpus(corpus: CorpusArguments, data: DataSettings, num_processes: int) -> None:
    """The data stage's refusals that need no tokenizer, before any work: every check of `load_documents`
    (streamed: nothing is written), then enough documents: to hold out validation documents
    (`check_validation_split`, counted only as far as the answer needs), or, for a stream without a validation
    split, left to train on past its validation documents (`check_documents_left_to_train`). A Hub dataset not
    streamed is checked when it is downloaded, the run's first work (the datasets cache may hold it where
    streaming it cannot reach it)."""
    if not corpus.streaming and corpus.dataset_name is not None and not Path(corpus.dataset_name).is_dir():
        return
    documents = stream_documents(corpus)
    if corpus.streaming:
        if "validation" not in documents:
            check_documents_left_to_train(documents["train"], data, num_processes)
        return
    counts = {
        split: sum(1 for _ in itertools.islice(split_documents, DOCUMENTS_ANY_SPLIT_FITS))
        for split, split_documents in documents.items()
    }
    percentage = data.validation_split_percentage
    check_validation_split(counts["train"], counts.get("validation"), percentage, split_needs(data.objective))


def check_documents_left_to_train(train: IterableDataset, data: DataSettings, num_processes: int) -> None:
    """With the validation documents held out of the training stream (its first --stream_validation_documents):
    refuse a stream that leaves too few documents to train on, each process needing one (two for NSP pairs, B
    comes from another document), naming the flag, the counts and a value that fits; the run would otherwise
    stop at its first batch, naming neither. Reads at most the held-out documents and the few needed after
    them."""
    held = data.stream_validation_documents
    per_process = split_needs(data.objective)
    needed = per_process * num_processes
    total = sum(1 for _ in itertools.islice(train, held + needed))
    if total >= held + needed:
        return
    # The share a run without --streaming holds out (--validation_split_percentage), at least what validation needs.
    fits = max(per_process, total * data.validation_split_percentage // 100)
    fix = (
        f"pass --stream_validation_documents {fits} (about the {data.validation_split_percentage}% a run without "
        f"--streaming holds out, at least {per_process})"
        if fits + needed <= total
        else "pass a larger corpus"
    )
    raise Refusal(
        f"the training stream has {total} documents and --stream_validation_documents {held} holds out the first "
        f"{min(held, total)} for validation, leaving {max(total - held, 0)} to train on ({needed} needed: "
        f"{per_process} for each of {num_processes} process(es){', NSP draws B from another document' if per_process > 1 else ''}); "
        f"{fix}, or a separate validation corpus with --validation_file"
    )


def check_stream_tokenizer(data: DataSettings, checkpoint: Path | None, source: SourceModel | None) -> None:
    """A stream trains no tokenizer: refuse a run that names none and resumes no checkpoint holding one."""
    has_tokenizer = checkpoint is not None and tokenizer_folder(checkpoint) is not None
    if not (has_tokenizer or data.tokenizer_name is not None or source is not None):
        raise Refusal(
            "--streaming needs a trained tokenizer and --resume_from_checkpoint found no checkpoint to take one "
            "from: train one first with `python train_tokenizer.py --streaming <the same corpus flags> "
            "--output_dir tokenizer` and pass --tokenizer_name tokenizer"
        )


def sample_sentences(documents: Iterable[Sequence[str] | Mapping[str, Sequence[str]]], count: int = SAMPLE_COUNT):
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
        if not sentences:
            windows = (all_sentences[start : start + count] for start in range(len(all_sentences) - count + 1))
            sentences = next((window for window in windows if all(map(usable, window))), [])
        elif (other := next(filter(usable, all_sentences), None)) is not None:
            return sentences, other
    return sentences, None
