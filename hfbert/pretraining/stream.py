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

Exact resume: torchdata's `StatefulDataLoader` keeps which worker's batch comes next and each worker's
`StreamedInstances.state_dict()`, taken after the worker's last batch taken; the checkpoint stores each
process's loader state (`stream_state.json`). What the loader lacks is the row: the documents stream's own
`state_dict()` places the documents read, and a window's are all read before its first instance is made, so
the position (`StreamPosition`) adds the pass, the window and the row of its shuffled instances. A resumed
worker loads the documents' state before its window, makes that window again and skips the rows already
trained on.

The data stage of a stream (its fixed validation set, the process's share of the documents) is
`hfbert.pretraining.data.streamed_instances`; `hfbert.pretraining.batches.build_loaders` makes the loader
(`StreamBatches`, its batches and their passes).
"""

from __future__ import annotations

import copy
import json
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import fsspec
import numpy as np
import torch
from datasets import Dataset

from hfbert.checkpointing import relaunch_command
from hfbert.errors import CheckpointError, Refusal
from hfbert.pretraining.data import tokenize_batch, tokenized_features
from hfbert.pretraining.instances import DRAW_KEY, MIN_NSP_DOCUMENTS, Span, TokenizedDocuments, TrainingStream

STREAM_STATE_NAME = "stream_state.json"  # in a checkpoint of a --streaming run: every process's loader state
PASS_KEY = "stream_pass"  # a row's pass over the stream, for the log
ERROR_KEY = "stream_error"
# A draw id packs (pass, rank, window, row) into one integer (the collator seeds a batch's masks with them).
_RANK_BITS, _WINDOW_BITS, _ROW_BITS = 20, 40, 32


# ---------------------------------------------------------------------------------------------------------
# Windows of documents -> instances, in the loader's workers.
# ---------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class StreamPosition:
    """Where a loader worker's next row comes from: the row of a window (in the window's shuffled order), the
    window (numbered from 0 in every pass), the pass, and the documents stream's `state_dict()` before the
    window's first document (None: the start of the stream)."""

    pass_index: int = 0
    window: int = 0
    row: int = 0
    documents_state: dict[str, Any] | None = None


def draw_id(pass_index: int, rank: int, window: int, row: int) -> int:
    """One integer per instance of a stream, never the same for two: (pass, rank, window, row) packed."""
    if row >= 1 << _ROW_BITS or window >= 1 << _WINDOW_BITS or rank >= 1 << _RANK_BITS:
        raise ValueError(f"stream position out of range: rank {rank}, window {window}, row {row}")
    return (((pass_index << _RANK_BITS | rank) << _WINDOW_BITS | window) << _ROW_BITS) | row


class StreamedInstances(torch.utils.data.IterableDataset):
    """The instances of a process's `TrainingStream`, pass after pass without end, each with its draw id and
    its pass. Its `state_dict()` is the `position` of the row after the last one yielded (in a loader worker:
    that worker's), as `StatefulDataLoader` saves and restores it."""

    def __init__(self, stream: TrainingStream):
        self.stream = stream
        self.position = StreamPosition()

    def state_dict(self) -> dict[str, Any]:
        return asdict(self.position)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.position = StreamPosition(**state)

    def __iter__(self) -> Iterator[dict[str, Any]]:
        info = torch.utils.data.get_worker_info()
        if info is None:
            return self.worker_rows(0, 1)
        fsspec.asyn.reset_lock()  # as datasets does in a worker: fsspec's event loop does not survive a fork
        return self.worker_rows(info.id, info.num_workers)

    def worker_rows(self, worker: int, workers: int) -> Iterator[dict[str, Any]]:
        """Worker `worker`'s rows: those of windows worker, worker + W, ... of every pass, from `position` on."""
        start = self.position
        pass_index, first_window, skip, state = start.pass_index, start.window, start.row, start.documents_state
        while True:
            whole_pass, made = state is None, 0
            for window, window_state, paragraphs in self.windows(state, first_window):
                if window % workers != worker:
                    continue
                documents, spans = self.window_spans(pass_index, window, paragraphs)
                made += len(spans)
                for row in range(skip, len(spans)):
                    self.position = StreamPosition(pass_index, window, row + 1, window_state)
                    yield {
                        **self.stream.recipe.row(documents, spans[row]),
                        DRAW_KEY: draw_id(pass_index, self.stream.rank, window, row),
                        PASS_KEY: pass_index,
                    }
                skip = 0
            if whole_pass and made == 0:
                yield {ERROR_KEY: self.empty_pass_message(worker, workers)}
                return
            pass_index, first_window, skip, state = pass_index + 1, 0, 0, None

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
        window, window_state, paragraphs = first_window, state, []
        for batch in documents.iter(batch_size=1):
            paragraphs.append(batch["paragraphs"][0])
            if len(paragraphs) == size:
                yield window, window_state, paragraphs
                # The state at the window's last document: where the next window starts.
                window, window_state, paragraphs = window + 1, documents.state_dict(), []
        if paragraphs:
            yield window, window_state, paragraphs

    def window_spans(
        self, pass_index: int, window: int, paragraphs: list[list[str]]
    ) -> tuple[TokenizedDocuments, list[Span]]:
        """A window's documents tokenized (in memory, read as the cache is read), and their instances in the
        window's shuffled order. A window of a single document (a pass's last) gives no NSP instances: B would
        have no other document to come from."""
        stream = self.stream
        sentences = tokenize_batch({"paragraphs": paragraphs}, None, stream.tokenizer)
        features = tokenized_features(len(stream.tokenizer))
        documents = TokenizedDocuments(Dataset.from_dict(sentences, features=features))
        if stream.recipe.pairs and len(documents) < MIN_NSP_DOCUMENTS:
            return documents, []
        key = f"-stream-{stream.rank}-{window}"
        spans = [
            span for document in range(len(documents)) for span in stream.recipe.spans(documents, pass_index, document, key)
        ]
        order = np.random.default_rng([stream.recipe.seed, pass_index, stream.rank, window]).permutation(len(spans))
        return documents, [spans[index] for index in order.tolist()]


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


def check_stream_checkpoint(
    checkpoint: Path, num_processes: int, num_workers: int, on_cpu: bool, writer: str
) -> None:
    """Refuse, before any work, to resume a streaming checkpoint where its positions do not apply: each
    process streams its own share of the corpus and each loader worker its own windows, so the process count
    and --dataloader_num_workers must be the checkpoint's. One whose positions are in the form of an hfbert
    before `StatefulDataLoader` is refused first (`writer`: the hfbert that wrote it)."""
    saved = read_stream_state(checkpoint)
    if any("batches_taken" in rank for rank in saved["ranks"]):  # the form hfbert kept before StatefulDataLoader
        raise Refusal(
            f"--resume_from_checkpoint {checkpoint} was written by {writer}, whose {STREAM_STATE_NAME} holds "
            "each loader worker's position in a form this hfbert does not read (it keeps torchdata's "
            "StatefulDataLoader state): finish the run with that hfbert (main's commit d734940, the last to "
            f"write that form, resumes it), or start a new run from its weights with --model_name_or_path {checkpoint}"
        )
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
