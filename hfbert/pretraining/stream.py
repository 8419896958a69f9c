"""--streaming: training instances made from a stream of documents, for corpora larger than the disk.

The documents come through `datasets`' `IterableDataset` (`hfbert.corpus.load_documents(streaming=True)`),
split by process with `split_dataset_by_node`. Each process cuts its stream into windows of
--stream_window_documents consecutive documents; window k of a pass is made by loader worker k % W (W the
DataLoader's workers, 1 without): the worker reads the whole stream of its process, tokenizes only its own
windows, pairs every document of a window with `InstanceRecipe.spans` (an NSP pair's random B comes from
another document of the same window, where google-research/bert draws from the whole corpus), shuffles the
window's instances with a generator seeded by (seed, pass, rank, window) and yields them, each with a draw id
of its own for the collator's masks. When the stream ends, the next pass starts over, pairing anew: the loop
sees one endless stream of batches, and the budget (--max_train_steps or --max_train_seconds) ends the run.

Exact resume: every batch carries the position of its last instance (`StreamPosition`: the logical worker
that made it, pass, window, row, and the documents stream's `state_dict()` before the window's first
document); `StreamLoader` keeps each logical worker's last position and the checkpoint stores them
(`stream_state.json`). A resumed worker loads its window's state, makes that window again and skips the rows
already trained on; physical worker p plays logical worker (p + batches taken) % W, so that the batches come in
the order of an uninterrupted run, whose DataLoader takes them from its workers in turn.

The validation set is fixed and cached as in a run without --streaming: the source's validation split (or
the first --stream_validation_documents documents of the training stream, which training then skips) is
written once to the datasets cache and made into instances there.
"""

from __future__ import annotations

import copy
import itertools
import json
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import datasets
import fsspec
import numpy as np
import torch
from accelerate import Accelerator
from accelerate.utils import gather_object, send_to_device
from datasets.distributed import split_dataset_by_node
from datasets.fingerprint import Hasher
from torch.utils.data import DataLoader

from hfbert.checkpointing import CheckpointError, relaunch_command
from hfbert.corpus import (
    DOCUMENT_FEATURES,
    DOCUMENTS_PER_BATCH,
    load_documents,
    naming_cache_failures,
    resolve_document_boundary,
    stream_documents,
)
from hfbert.corpus_source import CorpusArguments, corpus_fingerprint
from hfbert.errors import Refusal, RunFailure
from hfbert.pretraining.batches import (
    DRAW_KEY,
    BatchPlan,
    DataCollatorForPretraining,
    build_eval_loader,
    loader_options,
)
from hfbert.pretraining.data import (
    PretrainingData,
    _tokenize_batch,
    build_model_config,
    cache_writers_first,
    instance_recipe,
    load_run_tokenizer,
    sample_sentences,
    tokenize_documents,
    tokenized_with_statistics,
)
from hfbert.pretraining.health.corpus import CorpusHealth, cached_corpus_health
from hfbert.pretraining.instances import MIN_NSP_DOCUMENTS, InstanceRecipe, Span, write_instances
from hfbert.pretraining.settings import DataSettings, ModelSettings
from hfbert.pretraining.source_model import SourceModel

STREAM_STATE_NAME = "stream_state.json"  # in a checkpoint of a --streaming run: every process's position
POSITION_KEY = "stream_position"
_ERROR_KEY = "stream_error"
# A draw id packs (pass, rank, window, row) into one integer (the collator seeds a batch's masks with them).
_RANK_BITS, _WINDOW_BITS, _ROW_BITS = 20, 40, 32
_SOURCE_FINGERPRINT = Hasher.hash(Path(__file__).read_bytes())


# ---------------------------------------------------------------------------------------------------------
# The data stage of a --streaming run.
# ---------------------------------------------------------------------------------------------------------


@dataclass
class TrainingStream:
    """What a process trains on under --streaming: its share of the training documents (split by node, not
    yet read) and how they become instances."""

    documents: datasets.IterableDataset
    recipe: InstanceRecipe
    tokenizer: Any
    window_documents: int
    rank: int


def prepare_stream_data(
    corpus: CorpusArguments,
    data: DataSettings,
    model: ModelSettings,
    seed: int,
    output_dir: Path,
    accelerator: Accelerator,
    checkpoint_tokenizer: Path | None = None,
    source: SourceModel | None = None,
) -> PretrainingData:
    """`hfbert.pretraining.data.prepare_data` for a stream: the tokenizer (never trained here), the model
    config, the fixed validation instances (written to the datasets cache, the main process first) and this
    process's training stream."""
    documents = load_documents(corpus)  # lazy: nothing is read but the first document of each split
    check_stream_tokenizer(data, checkpoint_tokenizer, source)
    tokenizer = load_run_tokenizer(data, output_dir, documents, accelerator, checkpoint_tokenizer, source)
    config = build_model_config(model, data.max_seq_length, tokenizer, source)
    tokenizer.model_max_length = config.max_position_embeddings
    recipe = instance_recipe(data, tokenizer, seed)
    if "validation" not in documents:  # before the validation set is written: it may leave too few to train on
        check_documents_left_to_train(documents["train"], data, recipe.pairs, accelerator.num_processes)
    with cache_writers_first(accelerator), naming_cache_failures():
        validation = validation_documents(documents, corpus, data)
        evaluation = validation_instances(validation, tokenizer, recipe, data)
        health = stream_corpus_health(documents, corpus, data, evaluation, tokenizer)
    train = documents["train"]
    if "validation" not in documents:
        train = train.skip(data.stream_validation_documents)
    train = split_dataset_by_node(train, rank=accelerator.process_index, world_size=accelerator.num_processes)
    sentences, other = sample_sentences(validation)
    return PretrainingData(
        tokenizer=tokenizer,
        config=config,
        train=TrainingStream(train, recipe, tokenizer, data.stream_window_documents, accelerator.process_index),
        evaluation=evaluation,
        sample_sentences=sentences,
        other_sentence=other,
        health=health,
    )


def stream_corpus_health(
    documents: datasets.IterableDatasetDict,
    corpus: CorpusArguments,
    data: DataSettings,
    evaluation: datasets.Dataset,
    tokenizer: Any,
) -> CorpusHealth:
    """The corpus statistics and baselines of a stream, over its first window of training documents (written
    to the datasets cache once, as the validation documents are): a stream is not read ahead of training."""
    held_out = data.stream_validation_documents if "validation" not in documents else 0
    count = data.stream_window_documents
    source = [getattr(corpus, name) for name in ("dataset_name", "dataset_config_name", "train_file", "text_column")]
    fingerprint = Hasher.hash(
        ["hfbert.stream.first_window", source, corpus_fingerprint(corpus), resolve_document_boundary(corpus),
         held_out, count, _SOURCE_FINGERPRINT]
    )
    head = datasets.Dataset.from_generator(
        _first_documents,
        features=DOCUMENT_FEATURES,
        gen_kwargs={"documents": documents["train"].skip(held_out), "count": count},
        writer_batch_size=DOCUMENTS_PER_BATCH,
        fingerprint=fingerprint,
    )
    tokenized = tokenized_with_statistics(head, tokenizer, num_proc=data.preprocessing_num_workers)
    scope = f"the first {len(head):,} training documents of the stream (--streaming reads no further ahead)"
    return cached_corpus_health(tokenized, head, evaluation, tokenizer, data.max_seq_length, scope)


def _first_documents(documents: datasets.IterableDataset, count: int | None) -> Iterator[dict[str, Any]]:
    yield from documents if count is None else documents.take(count)


def validation_documents(
    documents: datasets.IterableDatasetDict, corpus: CorpusArguments, data: DataSettings
) -> datasets.Dataset:
    """The validation documents, written once to the datasets cache (keyed by the corpus, its content where it
    is local files, and the count): the source's validation split (at most --max_eval_samples documents, which
    give at least as many instances), else the first --stream_validation_documents of the training stream."""
    held_out = "validation" not in documents
    count = data.stream_validation_documents if held_out else None
    if data.max_eval_samples is not None:
        count = data.max_eval_samples if count is None else min(count, data.max_eval_samples)
    stream = documents["train" if held_out else "validation"]
    source = {
        name: getattr(corpus, name)
        for name in ("dataset_name", "dataset_config_name", "train_file", "validation_file", "text_column")
    }
    fingerprint = Hasher.hash(
        [
            "hfbert.stream.validation_documents",
            source,
            resolve_document_boundary(corpus),
            corpus_fingerprint(corpus),
            held_out,
            count,
            _SOURCE_FINGERPRINT,
        ]
    )
    validation = datasets.Dataset.from_generator(
        _first_documents,
        features=DOCUMENT_FEATURES,
        gen_kwargs={"documents": stream, "count": count},
        split=datasets.NamedSplit("validation"),
        writer_batch_size=DOCUMENTS_PER_BATCH,
        fingerprint=fingerprint,
    )
    return validation


def check_stream_tokenizer(data: DataSettings, checkpoint_tokenizer: Path | None, source: SourceModel | None) -> None:
    """A stream trains no tokenizer: refuse a run that names none and resumes no checkpoint holding one."""
    has_tokenizer = checkpoint_tokenizer is not None and checkpoint_tokenizer.is_dir()
    if not (has_tokenizer or data.tokenizer_name is not None or source is not None):
        raise Refusal(
            "--streaming needs a trained tokenizer and --resume_from_checkpoint found no checkpoint to take one "
            "from: train one first with `python train_tokenizer.py --streaming <the same corpus flags> "
            "--output_dir tokenizer` and pass --tokenizer_name tokenizer"
        )


def check_stream_corpus(corpus: CorpusArguments, data: DataSettings, num_processes: int) -> None:
    """`hfbert.pretraining.data.check_cached_corpus` for a stream: every check of `load_documents`, then
    enough documents left to train on (`check_documents_left_to_train`)."""
    documents = stream_documents(corpus)
    if "validation" not in documents:
        check_documents_left_to_train(documents["train"], data, data.objective == "mlm+nsp", num_processes)


def check_documents_left_to_train(
    train: datasets.IterableDataset, data: DataSettings, pairs: bool, num_processes: int
) -> None:
    """With the validation documents held out of the training stream (its first --stream_validation_documents):
    refuse a stream that leaves too few documents to train on, each process needing one (two for NSP pairs, B
    comes from another document), naming the flag, the counts and a value that fits. Without this the run
    started and stopped at its first batch for "process 0's share of the training stream gives no instances",
    naming neither. Reads at most the held-out documents and the few needed after them."""
    held = data.stream_validation_documents
    per_process = MIN_NSP_DOCUMENTS if pairs else 1
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
        f"{per_process} for each of {num_processes} process(es){', NSP draws B from another document' if pairs else ''}); "
        f"{fix}, or a separate validation corpus with --validation_file"
    )


def validation_instances(
    validation: datasets.Dataset, tokenizer: Any, recipe: InstanceRecipe, data: DataSettings
) -> datasets.Dataset:
    """The fixed evaluation instances: the validation documents tokenized and paired once, cached, as a run
    without --streaming makes them."""
    tokenized = tokenize_documents(validation, tokenizer, num_proc=data.preprocessing_num_workers)
    if recipe.pairs and len(tokenized) < MIN_NSP_DOCUMENTS:
        raise Refusal(
            f"the validation documents of this stream give {len(tokenized)} document(s) with text; next-sentence "
            f"prediction needs at least {MIN_NSP_DOCUMENTS} (B segments come from another document): pass a "
            "larger --stream_validation_documents or --max_eval_samples, or a --validation_file with more "
            "documents; check --document_boundary too"
        )
    evaluation = write_instances(tokenized, recipe, num_proc=data.preprocessing_num_workers)
    if data.max_eval_samples is not None:
        evaluation = evaluation.select(range(min(data.max_eval_samples, len(evaluation))))
    return evaluation


# ---------------------------------------------------------------------------------------------------------
# Windows of documents -> instances, in the loader's workers.
# ---------------------------------------------------------------------------------------------------------


class WindowDocuments:
    """A window's tokenized documents in memory, read as `TokenizedDocuments` reads the cache (what
    `InstanceRecipe.spans` and `InstanceRecipe.row` take)."""

    def __init__(self, sentences: Sequence[Sequence[Sequence[int]]]):
        self._offsets = [np.cumsum([0, *map(len, document)]) for document in sentences]
        self._tokens = [
            np.fromiter(itertools.chain.from_iterable(document), dtype=np.int32, count=int(offsets[-1]))
            for document, offsets in zip(sentences, self._offsets, strict=True)
        ]

    def __len__(self) -> int:
        return len(self._tokens)

    def sentence_offsets(self, document: int) -> np.ndarray:
        return self._offsets[document]

    def tokens(self, document: int) -> np.ndarray:
        return self._tokens[document]


@dataclass(frozen=True)
class StreamPosition:
    """Where a logical worker stands: the row of its window last handed out (in the window's shuffled order),
    the window (numbered from 0 in every pass), the pass, and the documents stream's `state_dict()` before the
    window's first document (None: the start of the stream)."""

    worker: int
    epoch: int
    window: int
    row: int
    state: dict[str, Any] | None


def draw_id(epoch: int, rank: int, window: int, row: int) -> int:
    """One integer per instance of a stream, never the same for two: (pass, rank, window, row) packed."""
    if row >= 1 << _ROW_BITS or window >= 1 << _WINDOW_BITS or rank >= 1 << _RANK_BITS:
        raise ValueError(f"stream position out of range: rank {rank}, window {window}, row {row}")
    return (((epoch << _RANK_BITS | rank) << _WINDOW_BITS | window) << _ROW_BITS) | row


class StreamedInstances(torch.utils.data.IterableDataset):
    """The instances of a process's `TrainingStream`, pass after pass without end, each with its draw id and
    its `StreamPosition`. `rotation` and `positions` place a resumed run (see `StreamLoader.resume`)."""

    def __init__(self, stream: TrainingStream):
        self.stream = stream
        self.rotation = 0
        self.positions: dict[int, StreamPosition] = {}

    def __iter__(self) -> Iterator[dict[str, Any]]:
        info = torch.utils.data.get_worker_info()
        if info is None:
            workers, physical = 1, 0
        else:
            workers, physical = info.num_workers, info.id
            fsspec.asyn.reset_lock()  # as datasets does in a worker: fsspec's event loop does not survive a fork
        worker = (physical + self.rotation) % workers
        return self.worker_rows(worker, workers, self.positions.get(worker))

    def worker_rows(self, worker: int, workers: int, last: StreamPosition | None) -> Iterator[dict[str, Any]]:
        """Logical worker `worker`'s rows: those of windows worker, worker + W, ... of every pass, from the row
        after `last` on."""
        if last is None:
            epoch, first_window, skip, state = 0, 0, 0, None
        else:
            epoch, first_window, skip, state = last.epoch, last.window, last.row + 1, last.state
        while True:
            whole_pass, made = state is None, 0
            for window, window_state, paragraphs in self.windows(state, first_window):
                if window % workers != worker:
                    continue
                documents, spans = self.window_spans(epoch, window, paragraphs)
                made += len(spans)
                for row in range(skip, len(spans)):
                    position = StreamPosition(worker, epoch, window, row, window_state)
                    yield {
                        **self.stream.recipe.row(documents, spans[row]),
                        DRAW_KEY: draw_id(epoch, self.stream.rank, window, row),
                        POSITION_KEY: position,
                    }
                skip = 0
            if whole_pass and made == 0:
                yield {_ERROR_KEY: self.empty_pass_message(worker, workers)}
                return
            epoch, first_window, skip, state = epoch + 1, 0, 0, None

    def empty_pass_message(self, worker: int, workers: int) -> str:
        stream = self.stream
        where = f"process {stream.rank}'s share of the training stream"
        if workers > 1:
            return (
                f"{where} gave loader worker {worker} of {workers} no instances in a whole pass (window k of "
                f"{stream.window_documents} documents is made by worker k % {workers}): pass a smaller "
                "--stream_window_documents or --dataloader_num_workers, or a larger corpus"
            )
        return f"{where} gives no instances (too few documents with text); pass a larger corpus or fewer processes"

    def windows(
        self, state: dict[str, Any] | None, first_window: int
    ) -> Iterator[tuple[int, dict[str, Any] | None, list[list[str]]]]:
        """(window number, the stream's state before its first document, its documents' paragraphs) from the
        stream's start, or from `state`, the start of window `first_window`. Every window is read (a worker
        reads the whole stream of its process), only a worker's own are made into instances."""
        documents = self.stream.documents
        if state is not None:
            documents = copy.deepcopy(documents)  # loading a state changes every later iteration of it
            documents.load_state_dict(state)
        size = self.stream.window_documents
        window, window_state, before, paragraphs = first_window, state, state, []
        for batch in documents.iter(batch_size=1):
            if not paragraphs:
                window_state = before
            paragraphs.append(batch["paragraphs"][0])
            before = documents.state_dict()
            if len(paragraphs) == size:
                yield window, window_state, paragraphs
                window, paragraphs = window + 1, []
        if paragraphs:
            yield window, window_state, paragraphs

    def window_spans(self, epoch: int, window: int, paragraphs: list[list[str]]) -> tuple[WindowDocuments, list[Span]]:
        """A window's documents tokenized, and their instances in the window's shuffled order. A window of a
        single document (a pass's last) gives no NSP instances: B would have no other document to come from."""
        stream = self.stream
        documents = WindowDocuments(_tokenize_batch({"paragraphs": paragraphs}, stream.tokenizer)["sentences"])
        if stream.recipe.pairs and len(documents) < MIN_NSP_DOCUMENTS:
            return documents, []
        key = f"-stream-{stream.rank}-{window}"
        spans = [
            span for document in range(len(documents)) for span in stream.recipe.spans(documents, epoch, document, key)
        ]
        order = np.random.default_rng([stream.recipe.seed, epoch, stream.rank, window]).permutation(len(spans))
        return documents, [spans[index] for index in order.tolist()]


@dataclass
class StreamCollator:
    """The loader's `collate_fn` for a stream: the batch as `DataCollatorForPretraining` builds it, and the
    position of its last row; (None, message) when a worker found no instances in a whole pass."""

    collator: DataCollatorForPretraining

    def __call__(self, rows: list[dict[str, Any]]) -> tuple[dict[str, torch.Tensor] | None, Any]:
        errors = [row[_ERROR_KEY] for row in rows if _ERROR_KEY in row]
        if errors:
            return None, errors[0]
        columns = {key: [row[key] for row in rows] for key in rows[0] if key != POSITION_KEY}
        return self.collator(columns), rows[-1][POSITION_KEY]


@dataclass
class StreamLoader:
    """A process's training batches under --streaming (a `hfbert.pretraining.batches.TrainingBatches`): one
    endless epoch of unknown length, placed by its own position, which every checkpoint stores
    (`stream_state.json`, every process's, gathered) and a resumed run restores before iterating."""

    dataset: StreamedInstances
    loader: DataLoader
    num_workers: int
    batches_taken: int = 0  # by this process, since the run started
    positions: dict[int, StreamPosition] = field(default_factory=dict)  # by logical worker
    stream_pass: int = 0  # the pass of the last batch taken (for the log)
    batches_per_epoch: None = None  # a stream's length is unknown

    @property
    def workers(self) -> int:
        return max(1, self.num_workers)

    def prepare(self, accelerator: Accelerator) -> None:
        pass  # split by process already (split_dataset_by_node); `batches` moves each batch to the device

    def epoch(self, epoch: int, progress: Any, accelerator: Accelerator) -> Iterator[dict[str, torch.Tensor]]:
        return self.batches(accelerator.device)

    def logged_epoch(self, epoch: int) -> int:
        return self.stream_pass

    def batches(self, device: torch.device) -> Iterator[dict[str, torch.Tensor]]:
        for batch, position in self.loader:
            if batch is None:
                raise RunFailure(position)
            self.positions[position.worker] = position
            self.batches_taken += 1
            self.stream_pass = position.epoch
            yield send_to_device(batch, device, non_blocking=self.loader.pin_memory)
        raise RunFailure("the training stream ended; it repeats its passes without end, so this is a bug")

    def state(self) -> dict[str, Any]:
        """This process's position (plain data, JSON)."""
        return {
            "batches_taken": self.batches_taken,
            "positions": [asdict(position) for _, position in sorted(self.positions.items())],
        }

    def checkpoint_files(self, accelerator: Accelerator) -> dict[str, Any]:
        """`stream_state.json`: every process's position, gathered (call on every process)."""
        ranks = gather_object([self.state()]) if accelerator.num_processes > 1 else [self.state()]
        saved = {"num_processes": accelerator.num_processes, "num_workers": self.num_workers, "ranks": ranks}
        return {STREAM_STATE_NAME: saved}

    def resume(self, checkpoint: Path, accelerator: Accelerator) -> None:
        self.restore(read_stream_state(checkpoint), accelerator.process_index)

    def restore(self, saved: dict[str, Any], rank: int) -> None:
        """Continue from a checkpoint's `stream_state.json` (checked by `check_stream_checkpoint`)."""
        state = saved["ranks"][rank]
        self.batches_taken = int(state["batches_taken"])
        self.positions = {int(p["worker"]): StreamPosition(**p) for p in state["positions"]}
        self.dataset.positions = dict(self.positions)
        self.dataset.rotation = self.batches_taken % self.workers


def build_stream_loaders(
    plan: BatchPlan, tokenizer: Any, train: TrainingStream, evaluation: datasets.Dataset
) -> tuple[StreamLoader, DataLoader]:
    """`hfbert.pretraining.batches.build_loaders` for a stream: the training batches of this process's
    stream (the same collator, masks seeded by each instance's draw id), the evaluation loader unchanged."""
    collator = DataCollatorForPretraining(
        tokenizer,
        mlm_probability=plan.mlm_probability,
        whole_word_masking=plan.whole_word_masking,
        max_predictions_per_seq=plan.max_predictions_per_seq,
        pad_to_length=plan.pad_to_length,
        seed=plan.seed,
    )
    dataset = StreamedInstances(train)
    workers = plan.num_workers
    loader = DataLoader(
        dataset,
        batch_size=plan.train_batch_size,
        collate_fn=StreamCollator(collator),
        generator=torch.Generator().manual_seed(plan.seed),
        **loader_options(workers, plan.pin_memory, persistent=False),  # the streamed loader never kept its workers
    )
    return StreamLoader(dataset, loader, workers), build_eval_loader(plan, tokenizer, evaluation)


# ---------------------------------------------------------------------------------------------------------
# Checkpoints.
# ---------------------------------------------------------------------------------------------------------


def read_stream_state(checkpoint: Path) -> dict[str, Any]:
    path = checkpoint / STREAM_STATE_NAME
    if not path.is_file():
        raise CheckpointError(
            f"--resume_from_checkpoint {checkpoint} holds no {STREAM_STATE_NAME}: it was not written by a "
            "--streaming run; resume it without --streaming"
        )
    return json.loads(path.read_text())


def check_stream_checkpoint(checkpoint: Path, num_processes: int, num_workers: int, on_cpu: bool) -> None:
    """Refuse, before any work, to resume a streaming checkpoint where its positions do not apply: each
    process streams its own share of the corpus and each loader worker its own windows, so the process count
    and --dataloader_num_workers must be the checkpoint's."""
    saved = read_stream_state(checkpoint)
    if int(saved["num_processes"]) != num_processes:
        raise Refusal(
            f"--resume_from_checkpoint {checkpoint} was written by a --streaming run of {saved['num_processes']} "
            f"processes, each streaming its own share of the corpus, and holds each one's position; it resumes "
            f"on {saved['num_processes']} processes only (`{relaunch_command(int(saved['num_processes']), on_cpu)}`)"
        )
    if int(saved["num_workers"]) != num_workers:
        raise Refusal(
            f"--resume_from_checkpoint {checkpoint} was written with --dataloader_num_workers "
            f"{saved['num_workers']}, and this run would use {num_workers}: under --streaming each loader worker "
            "makes its own windows, so the batches depend on the count; pass --dataloader_num_workers "
            f"{saved['num_workers']}"
        )
