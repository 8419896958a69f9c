"""Batches for BERT pretraining: the loaders (every decision about a batch's shape, in `build_loaders`), the
one batch builder (padding, MLM masking, the static form) and the
sampler that gives every row of every epoch its own draw id, so batches can be built ahead, in DataLoader
workers, and still be reproduced exactly on resume.

Masks are drawn from a generator seeded by the batch's draw ids (seed, epoch and instance index), not from
torch's global RNG: a batch is the same whichever process or worker builds it, however far ahead it is
prefetched, and evaluation, which draws its masks the same way, touches no training RNG stream.
"""

from __future__ import annotations

import atexit
import functools
import itertools
import math
import multiprocessing
import os
import signal
import warnings
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
import torch.nn.functional as F
from accelerate import Accelerator
from accelerate.utils import gather_object, send_to_device
from torch.utils.data import DataLoader, Dataset, Sampler
from torchdata.stateful_dataloader import StatefulDataLoader

from hfbert.errors import CheckpointError, Refusal, RunFailure
from hfbert.modeling_hfbert import IGNORE_INDEX
from hfbert.pretraining.instances import DRAW_KEY, SHUFFLE_GROUP, DrawnInstances, TrainingStream
from hfbert.pretraining.stream import (
    ERROR_KEY,
    PASS_KEY,
    STREAM_STATE_NAME,
    StreamedInstances,
    read_stream_state,
)

if TYPE_CHECKING:
    from hfbert.pretraining.settings import DataSettings, OptimizationSettings

_SAMPLER_BLOCK = 65536  # draw ids converted to Python ints at a time by EpochDraws


def default_max_predictions(max_seq_length: int, mlm_probability: float) -> int:
    """Static masked slots per row for CUDA's default static path: the mean number of masked tokens plus three
    standard deviations (tokens are chosen independently), rounded up to a multiple of 8, so that hardly any
    masked token is dropped (32 at length 128 and 15%)."""
    mean = max_seq_length * mlm_probability
    spread = 3.0 * math.sqrt(max_seq_length * mlm_probability * (1.0 - mlm_probability))
    return min(max_seq_length, 8 * math.ceil((mean + spread) / 8))


def masked_positions_from_labels(
    labels: torch.Tensor,
    max_predictions_per_seq: int,
    input_ids: torch.Tensor | None = None,
    generator: torch.Generator | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """(B, T) MLM labels -> the static-shape form of google-research/bert's `max_predictions_per_seq`.

    Returns `(masked_positions, masked_labels, input_ids)`: (B, P) positions of the labelled tokens in
    ascending order, their (B, P) labels, empty slots holding position 0 and label -100; P is
    `max_predictions_per_seq`. A row with more than P labelled tokens keeps a uniformly random P of them
    (drawn from `generator`, or torch's global RNG: B x T uniforms per call, whatever the masks); the others
    are unmasked, as google never masks more than P: their label is dropped and, when `input_ids` is given,
    the original token (the label) is written back into a copy of `input_ids`, so the model sees it unchanged.
    Feed the result to the model as `model(input_ids=..., masked_positions=..., labels=masked_labels, ...)`.
    """
    if max_predictions_per_seq < 1:
        raise ValueError(f"max_predictions_per_seq must be >= 1, got {max_predictions_per_seq}")
    seq_len = labels.size(1)
    masked = labels != IGNORE_INDEX
    slots = min(max_predictions_per_seq, seq_len)
    priority = torch.rand(labels.shape, generator=generator, device=labels.device)
    keep = priority.masked_fill(~masked, -1.0).topk(slots, dim=1).indices  # the (at most) P to predict
    chosen = torch.zeros_like(masked).scatter_(1, keep, True) & masked
    if input_ids is not None:
        input_ids = torch.where(masked & ~chosen, labels, input_ids)
    order = torch.argsort((~chosen).int(), dim=1, stable=True)[:, :slots]  # chosen first, ascending
    filled = chosen.gather(1, order)
    positions = order.masked_fill(~filled, 0)
    masked_labels = labels.gather(1, order).masked_fill(~filled, IGNORE_INDEX)
    extra = (0, max_predictions_per_seq - slots)  # P > T: empty slots past the row
    return F.pad(positions, extra), F.pad(masked_labels, extra, value=IGNORE_INDEX), input_ids


@dataclass
class DataCollatorForPretraining:
    """Pads NSP instances and masks them for MLM the way google-research/bert masks (80/10/10).

    Call it with features, either a list of dicts or a dict of columns, holding ``input_ids``,
    ``token_type_ids`` and, for pretraining, ``next_sentence_label`` (the rows of
    :func:`hfbert.pretraining.data.build_nsp_instances`); it returns long tensors ``input_ids``,
    ``attention_mask``, ``token_type_ids``, ``labels`` and ``next_sentence_label``. Rows are right-padded to
    ``pad_to_length`` when given (static shapes), else to the longest row rounded up to ``pad_to_multiple_of``
    (padding: ``attention_mask`` 0, ``token_type_ids`` 0, ``labels`` -100). With ``pad_to_batch_size``,
    all-padding rows (every label -100, ``next_sentence_label`` -100) fill a short batch up to that size. Of
    the tokens that are neither special (``[CLS]``, ``[SEP]``, ``[UNK]``, ...) nor padding, a fraction
    ``mlm_probability`` is chosen; a chosen token becomes ``[MASK]`` with probability ``mask_replace_prob``, a
    random non-special token with probability ``random_replace_prob``, and stays unchanged otherwise.
    ``labels`` hold the original id at chosen positions and -100 elsewhere. With ``max_predictions_per_seq``
    P the batch is in the static form instead: ``masked_positions`` and ``labels`` (B, P), see
    :func:`masked_positions_from_labels`. With ``whole_word_masking`` words are chosen
    instead of tokens (a token and its ``##`` continuations, each word with probability ``mlm_probability``),
    the 80/10/10 replacement is still drawn per token, and the static form drops whole words, not tokens.

    Randomness: features carrying a ``draw`` id (what :class:`InstanceDraws` adds) are masked from a
    generator seeded by ``seed`` and the batch's draw ids, so the same rows always get the same masks; without
    draw ids, masks come from torch's global RNG, as in transformers' collators.

    Not transformers' `DataCollatorForLanguageModeling`: its masks follow one running generator, not draw ids.
    """

    tokenizer: Any
    mlm_probability: float = 0.15
    mask_replace_prob: float = 0.8
    random_replace_prob: float = 0.1
    pad_to_multiple_of: int | None = 8
    pad_to_length: int | None = None
    pad_to_batch_size: int | None = None
    max_predictions_per_seq: int | None = None
    whole_word_masking: bool = False
    seed: int = 0
    # Lookup tables in numpy: torch's indexing kernel spreads a (B, T) lookup over its threads, which costs
    # milliseconds when a core is busy (e.g. with the training step); numpy's stays on one.
    _special: np.ndarray = field(init=False, repr=False)  # (V,) bool, True for special ids
    _non_special_ids: np.ndarray = field(init=False, repr=False)
    _continuation: np.ndarray = field(init=False, repr=False)  # (V,) bool, True for '##' word pieces

    def __post_init__(self) -> None:
        if self.tokenizer.pad_token_id is None:
            raise Refusal("The tokenizer has no pad token; BERT pretraining needs one, e.g. '[PAD]'")
        if self.tokenizer.mask_token_id is None:
            raise Refusal("The tokenizer has no mask token; BERT pretraining needs one, e.g. '[MASK]'")
        for name in ("mlm_probability", "mask_replace_prob", "random_replace_prob"):
            if not 0.0 <= getattr(self, name) <= 1.0:
                raise ValueError(f"{name} {getattr(self, name)} must be in [0, 1]")
        if self.mask_replace_prob + self.random_replace_prob > 1.0:
            raise ValueError(
                f"mask_replace_prob {self.mask_replace_prob} + random_replace_prob {self.random_replace_prob} "
                "should not exceed 1 (the rest of the chosen tokens stay unchanged)"
            )
        for name in ("pad_to_multiple_of", "pad_to_length", "pad_to_batch_size", "max_predictions_per_seq"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise ValueError(f"{name} {value} must be a positive integer, or None")
        self._special = np.isin(np.arange(len(self.tokenizer)), self.tokenizer.all_special_ids)
        self._non_special_ids = np.flatnonzero(~self._special)
        # WordPiece's prefix of a piece that continues a word ('##'), read from the tokenizer's model.
        model = getattr(getattr(self.tokenizer, "backend_tokenizer", None), "model", None)
        prefix = getattr(model, "continuing_subword_prefix", None) or "##"
        tokens = self.tokenizer.convert_ids_to_tokens(list(range(len(self.tokenizer))))
        self._continuation = np.array([token is not None and token.startswith(prefix) for token in tokens])

    def __call__(
        self, features: Sequence[Mapping[str, Any]] | Mapping[str, Sequence[Any]]
    ) -> dict[str, torch.Tensor]:
        columns = features
        if not isinstance(columns, Mapping):  # a list of rows
            columns = {key: [row[key] for row in features] for key in features[0]}
        generator = self.batch_generator(columns.get(DRAW_KEY))
        input_ids, token_type_ids, attention_mask = self.pad(columns["input_ids"], columns["token_type_ids"])
        masked_ids, labels = self.mask_tokens(input_ids, generator)
        batch = {"attention_mask": attention_mask, "token_type_ids": token_type_ids}
        if "next_sentence_label" in columns:  # padding rows added by pad_to_batch_size carry -100
            nsp = torch.as_tensor(columns["next_sentence_label"], dtype=torch.long)
            batch["next_sentence_label"] = F.pad(nsp, (0, len(input_ids) - len(nsp)), value=IGNORE_INDEX)
        if self.max_predictions_per_seq is not None:
            if self.whole_word_masking:
                masked_ids, labels = self.drop_words_beyond_slots(input_ids, masked_ids, labels, generator)
            batch["masked_positions"], labels, masked_ids = masked_positions_from_labels(
                labels, self.max_predictions_per_seq, masked_ids, generator=generator
            )
        return {"input_ids": masked_ids, "labels": labels, **batch}

    def batch_generator(self, draws: Sequence[int] | None) -> torch.Generator | None:
        """The batch's own generator, seeded by `seed` and its draw ids; None (global RNG) without them."""
        if draws is None:
            return None
        state = np.random.SeedSequence([self.seed, *map(int, draws)]).generate_state(1, np.uint64)[0]
        return torch.Generator().manual_seed(int(state))

    def pad(self, input_ids: Sequence[Sequence[int]], token_type_ids: Sequence[Sequence[int]]):
        """(B, L) input_ids, token_type_ids and attention_mask, right-padded; filled from one flat array,
        because tokenizer.pad over Python lists costs tens of milliseconds a batch."""
        lengths = np.fromiter(map(len, input_ids), dtype=np.int64, count=len(input_ids))
        longest = int(lengths.max())
        if self.pad_to_length is not None and longest > self.pad_to_length:
            raise ValueError(f"A row of {longest} tokens is longer than pad_to_length {self.pad_to_length}")
        multiple = self.pad_to_multiple_of or 1
        width = self.pad_to_length or multiple * math.ceil(longest / multiple)
        rows = max(len(lengths), self.pad_to_batch_size or 0)
        is_token = np.arange(width) < np.pad(lengths, (0, rows - len(lengths)))[:, None]  # padding rows: none
        attention_mask = is_token.astype(np.int64)
        total = int(lengths.sum())
        ids = np.full((rows, width), self.tokenizer.pad_token_id, dtype=np.int64)
        ids[is_token] = np.fromiter(itertools.chain.from_iterable(input_ids), dtype=np.int64, count=total)
        types = np.zeros((rows, width), dtype=np.int64)
        types[is_token] = np.fromiter(
            itertools.chain.from_iterable(token_type_ids), dtype=np.int64, count=total
        )
        return torch.from_numpy(ids), torch.from_numpy(types), torch.from_numpy(attention_mask)

    def mask_tokens(
        self, input_ids: torch.Tensor, generator: torch.Generator | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Choose and replace tokens of (B, L) ``input_ids``: returns new ``(input_ids, labels)``. Whole-tensor
        operations only (no boolean indexing), so the cost does not depend on how many tokens are chosen."""
        eligible = torch.from_numpy(~self._special[input_ids.numpy()])  # never [CLS], [SEP], [PAD], ...
        choice = torch.rand(input_ids.shape, generator=generator)
        if self.whole_word_masking:  # every token of a word takes its first token's draw
            choice = choice.gather(1, self.word_starts(input_ids))
        chosen = (choice < self.mlm_probability) & eligible
        kind = torch.rand(input_ids.shape, generator=generator)
        to_mask = chosen & (kind < self.mask_replace_prob)
        to_random = chosen & ~to_mask & (kind < self.mask_replace_prob + self.random_replace_prob)
        picks = torch.randint(len(self._non_special_ids), input_ids.shape, generator=generator)
        masked = torch.where(to_random, torch.from_numpy(self._non_special_ids[picks.numpy()]), input_ids)
        masked = masked.masked_fill(to_mask, self.tokenizer.mask_token_id)
        labels = input_ids.masked_fill(~chosen, IGNORE_INDEX)
        return masked, labels

    def word_starts(self, input_ids: torch.Tensor) -> torch.Tensor:
        """(B, L) position of the first token of each token's word: a '##' continuation belongs to the word
        before it, unless it follows a special token (a segment cut mid-word); every other token starts one."""
        ids = input_ids.numpy()
        continues = self._continuation[ids]
        continues[:, 0] = False
        continues[:, 1:] &= ~self._special[ids[:, :-1]]
        positions = np.broadcast_to(np.arange(ids.shape[1]), ids.shape)
        return torch.from_numpy(np.maximum.accumulate(np.where(continues, 0, positions), axis=1))

    def drop_words_beyond_slots(
        self,
        input_ids: torch.Tensor,
        masked_ids: torch.Tensor,
        labels: torch.Tensor,
        generator: torch.Generator | None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Unmask whole words, taken in a random order, past ``max_predictions_per_seq`` chosen tokens in a row,
        so that the static form never keeps part of a word (google's whole-word masking skips a word that
        does not fit). Returns new ``(masked_ids, labels)``; a dropped token gets its original id back."""
        starts = self.word_starts(input_ids)
        chosen = labels != IGNORE_INDEX
        priority = torch.rand(input_ids.shape, generator=generator).gather(1, starts).masked_fill(~chosen, 2.0)
        order = torch.argsort(priority, dim=1, stable=True)  # a word's tokens stay together, in order
        running = torch.cumsum(chosen.gather(1, order).long(), dim=1)
        count_through = torch.empty_like(running).scatter_(1, order, running)
        word_count = torch.zeros_like(running).scatter_reduce(1, starts, count_through, reduce="amax")
        dropped = chosen & (word_count.gather(1, starts) > self.max_predictions_per_seq)
        return torch.where(dropped, labels, masked_ids), labels.masked_fill(dropped, IGNORE_INDEX)


class InstanceDraws(Dataset):
    """NSP instances addressed by draw id (epoch * len + index): each row comes back with its `draw` id, for
    the collator to seed its masks with. Rows are fetched a batch at a time (`__getitems__`), as columns."""

    def __init__(self, instances: Any):
        self.instances = instances

    def __len__(self) -> int:
        return len(self.instances)

    def __getitem__(self, draw: int) -> dict[str, Any]:
        return {**self.instances[draw % len(self.instances)], DRAW_KEY: draw}

    def __getitems__(self, draws: list[int]) -> dict[str, list[Any]]:
        size = len(self.instances)
        return {**self.instances[[draw % size for draw in draws]], DRAW_KEY: list(draws)}


class EpochDraws(Sampler[int]):
    """Draw ids of one epoch: the instances in an order seeded by (seed, epoch), offset by epoch * len.
    Deterministic, so every process of a launch draws the same ids and accelerate shards them; accelerate's
    loader calls `set_epoch`. With `shuffle=False` (evaluation) it is the instances in order with draw ids
    0..len-1 in every epoch, so every evaluation scores the same masks.

    Without `unit_offsets` the order is a permutation of all instances. With them (instances made while
    training, :class:`hfbert.pretraining.instances.DrawnInstances`: unit k holds instances
    `unit_offsets[k]` to `unit_offsets[k + 1] - 1`, one document in one pass), the units are permuted and
    the instances of consecutive units are shuffled together in groups of about `SHUFFLE_GROUP`, as a
    shuffle buffer would: a batch mixes many documents, while a worker pairs each document once per group.
    The memory is then a few bytes a unit, not 8 bytes an instance.
    """

    def __init__(
        self, num_instances: int, seed: int, shuffle: bool = True, unit_offsets: np.ndarray | None = None
    ):
        if unit_offsets is not None and int(unit_offsets[-1]) != num_instances:
            raise ValueError(f"unit_offsets end at {int(unit_offsets[-1])}, not at {num_instances} instances")
        self.num_instances, self.seed, self.shuffle, self.epoch = num_instances, seed, shuffle, 0
        self.unit_offsets = unit_offsets

    def set_epoch(self, epoch: int) -> None:
        if self.shuffle:
            self.epoch = epoch

    def __len__(self) -> int:
        return self.num_instances

    def __iter__(self) -> Iterator[int]:
        offset = self.epoch * self.num_instances
        if not self.shuffle:
            return iter(range(offset, offset + self.num_instances))
        generator = torch.Generator().manual_seed(self.seed + self.epoch)
        if self.unit_offsets is not None:
            return (offset + index for group in self.groups(generator) for index in group.tolist())
        # Kept as an int64 tensor (8 bytes an instance) and turned into Python ints a block at a time: a list
        # of every index costs ~36 bytes an instance in every process.
        order = torch.randperm(self.num_instances, generator=generator)
        return (offset + index for block in order.split(_SAMPLER_BLOCK) for index in block.tolist())

    def groups(self, generator: torch.Generator) -> Iterator[np.ndarray]:
        """The epoch's instance indices, a shuffled group at a time."""
        assert self.unit_offsets is not None
        units = torch.randperm(len(self.unit_offsets) - 1, generator=generator).numpy()
        starts, counts = self.unit_offsets[units], np.diff(self.unit_offsets)[units]
        ends = np.cumsum(counts)  # where each unit ends in the epoch's order
        cuts = np.searchsorted(ends, np.arange(SHUFFLE_GROUP, self.num_instances, SHUFFLE_GROUP)) + 1
        group_seed = int(torch.randint(0, 2**62, (1,), generator=generator))
        # A cut inside the last unit leaves the last group empty: it adds no instances.
        for number, (first, last) in enumerate(itertools.pairwise([0, *np.unique(cuts).tolist(), len(units)])):
            group_counts = counts[first:last]
            # Each unit's instances in order: its start, repeated, plus 0, 1, ... within the unit.
            unit_starts = np.cumsum(group_counts) - group_counts  # where each unit starts in the group
            within = np.arange(group_counts.sum()) - np.repeat(unit_starts, group_counts)
            indices = np.repeat(starts[first:last], group_counts) + within
            yield np.random.default_rng([group_seed, number]).permutation(indices)


# ---------------------------------------------------------------------------------------------------------
# The loaders: every decision about a batch's shape, made once, from the settings and the device.
# ---------------------------------------------------------------------------------------------------------


def resolve_max_predictions(
    data: DataSettings, optimization: OptimizationSettings, device: torch.device
) -> int | None:
    """Static masked slots per row: --max_predictions_per_seq, else a default on CUDA (static shapes keep the
    step free of host synchronisation) and where the update is compiled (`compiles_update`); None (every masked
    token, dynamic shapes) on a CPU, where the dynamic path is measured faster."""
    if data.max_predictions_per_seq is not None:
        return data.max_predictions_per_seq
    if device.type == "cuda" or optimization.compiles_update(device.type):
        return default_max_predictions(data.max_seq_length, data.mlm_probability)
    return None


def resolve_num_workers(requested: int | None, device: torch.device) -> int:
    """DataLoader workers: --dataloader_num_workers, else 4 on CUDA (batches are built while the GPU steps)
    and 0 on a CPU (a worker would take a core from the step; building a batch costs about a millisecond)."""
    if requested is not None:
        return requested
    return min(4, os.cpu_count() or 1) if device.type == "cuda" else 0


def loader_options(num_workers: int, pin_memory: bool, persistent: bool = True) -> dict[str, Any]:
    """A DataLoader's worker options: workers that leave stop signals to the main process, and are killed at
    its exit (kept between iterators when `persistent`)."""
    if num_workers > 0:
        kill_workers_at_exit()
    return {
        "num_workers": num_workers,
        "pin_memory": pin_memory,
        "persistent_workers": persistent and num_workers > 0,
        "prefetch_factor": 4 if num_workers > 0 else None,
        "worker_init_fn": ignore_stop_signals,  # a signal to the whole process group is the main process's
    }


def micro_batches_to_skip(position: int, epoch: int, num_processes: int, batches_per_process: int) -> int:
    """This process's micro-batches of `epoch` already trained on, from the global `position` (the
    checkpoint's `micro_batches_in_epoch`). A position past every process's next-to-last micro-batch is the end
    of the epoch (the writer's epoch ended with its last update; with another process count accelerate fills
    its last round differently): skip it all."""
    if position > (batches_per_process - 1) * num_processes:
        return batches_per_process
    if position % num_processes:
        raise CheckpointError(
            f"the checkpoint stands at micro-batch {position} of epoch {epoch}, which "
            f"{num_processes} processes cannot continue from (it is no multiple of {num_processes}); resume it "
            "on a number of processes that divides the micro-batches of an update"
        )
    return position // num_processes


class TrainingBatches:
    """A process's training batches, all that setup, the loop and a checkpoint ask of them: here those of the
    written or drawn instances, where an epoch is a shuffle of them all and the position within it is the
    micro-batches of it trained on (`TrainingProgress.micro_batches_in_epoch`, global, so another process count
    continues it); a stream's are a `StreamBatches`."""

    def __init__(self, loader: DataLoader):
        self.loader = loader
        # Over all processes; None: a stream, one endless epoch of unknown length.
        self.batches_per_epoch: int | None = len(loader)

    @property
    def batches_per_process(self) -> int | None:
        """This process's micro-batches of an epoch, once `prepare`d; None: a stream."""
        return None if self.batches_per_epoch is None else len(self.loader)

    def prepare(self, accelerator: Accelerator) -> None:
        """Split the batches over this launch's processes."""
        self.loader = accelerator.prepare_data_loader(self.loader)

    def epoch(self, epoch: int, position: int, accelerator: Accelerator) -> Iterable[dict]:
        """The batches of `epoch` from `position` (its micro-batches trained on, by all processes together), on
        this process's device: the epoch's own shuffle, past the batches already trained on when resumed mid-epoch."""
        self.loader.set_epoch(epoch)
        if not position:
            return self.loader
        skip = micro_batches_to_skip(position, epoch, accelerator.num_processes, len(self.loader))
        return accelerator.skip_first_batches(self.loader, skip)

    def logged_epoch(self, epoch: int) -> int:
        """What the log calls `epoch` (a stream: its pass over the corpus)."""
        return epoch

    def checkpoint_files(self, accelerator: Accelerator) -> dict[str, Any]:
        """The JSON files a checkpoint adds for the position (call on every process); {} where the training
        progress holds it."""
        return {}

    def resume(self, checkpoint: Path, accelerator: Accelerator) -> None:
        """Continue from `checkpoint`'s position (after its state, the progress included, is loaded); here the
        position is the progress's, loaded with the state."""


def collate_stream(collator: DataCollatorForPretraining, rows: list[dict]) -> tuple[dict | None, Any]:
    """A stream loader's `collate_fn` (with its collator bound): the batch as `DataCollatorForPretraining`
    builds it, and the pass of its last row; (None, message) when a worker found no instances in a whole
    pass."""
    errors = [row[ERROR_KEY] for row in rows if ERROR_KEY in row]
    if errors:
        return None, errors[0]
    return collator(rows), rows[-1][PASS_KEY]  # the collator reads its own columns only


@dataclass
class StreamBatches(TrainingBatches):
    """A process's training batches under --streaming: one endless epoch of unknown length from a
    `StatefulDataLoader`, whose state (which worker's batch comes next, each worker's `StreamedInstances`
    position) every checkpoint stores (`stream_state.json`, every process's, gathered) and a resumed run
    restores before iterating."""

    loader: StatefulDataLoader
    num_workers: int
    stream_pass: int = 0  # the pass of the last batch taken (for the log)
    batches_per_epoch: None = None  # a stream's length is unknown

    def prepare(self, accelerator: Accelerator) -> None:
        pass  # split by process already (split_dataset_by_node); `epoch` moves each batch to the device

    def epoch(self, epoch: int, position: int, accelerator: Accelerator) -> Iterator[dict[str, torch.Tensor]]:
        """The stream's batches, without end, on this process's device (`epoch` and `position` are the
        loop's: the stream keeps its own)."""
        for batch, stream_pass in self.loader:
            if batch is None:
                raise RunFailure(stream_pass)
            self.stream_pass = stream_pass
            yield send_to_device(batch, accelerator.device, non_blocking=self.loader.pin_memory)
        raise RunFailure("the training stream ended; it repeats its passes without end, so this is a bug")

    def logged_epoch(self, epoch: int) -> int:
        return self.stream_pass

    def checkpoint_files(self, accelerator: Accelerator) -> dict[str, Any]:
        """`stream_state.json`: every process's loader state (plain data), gathered (call on every process)."""
        state = self.loader.state_dict()
        ranks = gather_object([state]) if accelerator.num_processes > 1 else [state]
        saved = {"num_processes": accelerator.num_processes, "num_workers": self.num_workers, "ranks": ranks}
        return {STREAM_STATE_NAME: saved}

    def resume(self, checkpoint: Path, accelerator: Accelerator) -> None:
        """Continue from this process's loader state in `checkpoint`'s `stream_state.json` (checked by
        `check_stream_checkpoint`)."""
        self.loader.load_state_dict(read_stream_state(checkpoint)["ranks"][accelerator.process_index])


def build_loaders(
    data: DataSettings,
    optimization: OptimizationSettings,
    eval_batch_size: int,
    device: torch.device,
    tokenizer: Any,
    train: DrawnInstances | TrainingStream,
    evaluation: Any,
) -> tuple[TrainingBatches, DataLoader]:
    """Training batches and the evaluation loader (`evaluation`: written instances, a ``datasets.Dataset``, in
    order, the same masks at every evaluation), every decision about a batch's shape made here, from the
    settings and the device. Their collate_fn builds finished batches (padded, masked, static form where
    `resolve_max_predictions` says) in worker processes, into pinned memory on CUDA; the training instances
    are made there too: drawn ones (`TrainingBatches`) or a stream's (`StreamBatches`, masks seeded by each
    instance's draw id). Where the update is compiled (--torch_compile, the CUDA default) every batch has one
    shape: rows padded to --max_seq_length, full training batches (the last partial one of an epoch is
    dropped) and evaluation batches filled up with padding rows. Whole-word masking is for training batches
    only: evaluation stays token-level, comparable."""
    compiled = optimization.compiles_update(device.type)
    shape = {
        "max_predictions_per_seq": resolve_max_predictions(data, optimization, device),
        "pad_to_length": data.max_seq_length if compiled else None,
        "seed": optimization.seed,
    }
    workers, pin_memory = resolve_num_workers(data.dataloader_num_workers, device), device.type == "cuda"
    collator = DataCollatorForPretraining(
        tokenizer, mlm_probability=data.mlm_probability, whole_word_masking=data.whole_word_masking, **shape
    )
    # Its own generator: otherwise each new iterator draws its workers' base seed from the global RNG and shifts
    # the training dropout stream (the evaluation loader's too, at every evaluation).
    options = {
        "batch_size": optimization.per_device_train_batch_size,
        "generator": torch.Generator().manual_seed(optimization.seed),
    }
    if isinstance(train, TrainingStream):  # split by process already; the streamed loader never kept its workers
        collate = functools.partial(collate_stream, collator)
        stream_workers = loader_options(workers, pin_memory, persistent=False)
        with warnings.catch_warnings():  # torchdata 0.11 calls torch.set_vital, which torch deprecates
            warnings.filterwarnings("ignore", "'set_vital' is deprecated")
            loader = StatefulDataLoader(StreamedInstances(train), collate_fn=collate, **options, **stream_workers)
        batches: TrainingBatches = StreamBatches(loader, workers)
    else:
        loader = DataLoader(
            InstanceDraws(train),
            sampler=EpochDraws(len(train), optimization.seed, unit_offsets=train.unit_offsets),
            collate_fn=collator,
            drop_last=compiled and len(train) >= optimization.per_device_train_batch_size,
            **options,
            **loader_options(workers, pin_memory),
        )
        batches = TrainingBatches(loader)
    eval_collator = DataCollatorForPretraining(
        tokenizer,
        mlm_probability=data.eval_mlm_probability,
        pad_to_batch_size=eval_batch_size if compiled else None,
        **shape,
    )
    eval_loader = DataLoader(
        InstanceDraws(evaluation),
        batch_size=eval_batch_size,
        sampler=EpochDraws(len(evaluation), optimization.seed, shuffle=False),
        collate_fn=eval_collator,
        generator=torch.Generator().manual_seed(optimization.seed),
        **loader_options(workers, pin_memory),
    )
    return batches, eval_loader


@functools.cache  # once per process
def kill_workers_at_exit() -> None:
    """At this process's exit, SIGKILL its daemonic children (its DataLoader workers). They ignore SIGTERM
    (`ignore_stop_signals`), and multiprocessing's exit handler ends them with SIGTERM and waits for them: a run
    that stopped with its loader alive (held by a refusal's traceback) would never exit. Registered after
    multiprocessing's handler, so it runs first."""
    atexit.register(_kill_daemonic_children)


def _kill_daemonic_children() -> None:
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)  # torch's handler raises on a worker killed by a signal
    for child in multiprocessing.active_children():
        if child.daemon:
            child.kill()
            child.join()


def ignore_stop_signals(worker_id: int) -> None:
    """DataLoader `worker_init_fn`: the worker ignores SIGTERM, SIGINT and SIGUSR1. A scheduler (Slurm,
    `kill -- -PGID`) and Ctrl-C signal the whole process group; a worker dying of it made the loop fail before
    it could checkpoint. The main process handles these signals and shuts its workers down itself (and a
    worker exits on its own when its parent is gone)."""
    for number in (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1):
        signal.signal(number, signal.SIG_IGN)
