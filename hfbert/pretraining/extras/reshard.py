"""Resuming a checkpoint on another number of processes (e.g. an 8-GPU job preempted and given back 4).

What keeps the run the same across the change:
- the global batch: per_device_train_batch_size x processes x gradient_accumulation_steps is kept by
  setting the accumulation (`keep_global_batch`), or the resume is refused naming the launches that keep it;
- the data: the epoch's draw order is one permutation of (seed, epoch), cut into micro-batches of
  per_device_train_batch_size, and process r of n takes micro-batches r, r + n, ...; an update consumes the
  next processes x accumulation of them, so with the global batch kept it consumes the same samples. Masks
  are seeded by each micro-batch's draw ids (`DataCollatorForPretraining.batch_generator`), so they follow
  the samples, whichever process builds them. `TrainingProgress.micro_batches_in_epoch` counts them globally;
- optimizer, model and grad-scaler states (replicated under DDP) and the schedule (a function of the step).

What cannot be kept: each process's RNG stream (dropout) is its own; a process whose rank had no
`random_states_<rank>.pkl` in the checkpoint starts a stream derived from (seed, rank, step)
(`continue_on_this_split`), and the streams of ranks that no longer exist end. The all-reduce sums gradients in
another order, so weights agree to float rounding, not bit for bit.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import numpy as np
from accelerate import Accelerator
from accelerate.utils import set_seed

from hfbert.checkpointing import RNG_FILE, read_manifest, relaunch_command
from hfbert.errors import Refusal
from hfbert.pretraining.settings import OptimizationSettings

logger = logging.getLogger(__name__)

ACCUMULATION = "gradient_accumulation_steps"


def keep_global_batch(
    saved: dict[str, Any] | None,
    saved_processes: int,
    optimization: OptimizationSettings,
    num_processes: int,
    checkpoint: str,
    on_cpu: bool,
) -> dict[str, Any] | None:
    """On another number of processes than the checkpoint's: set --gradient_accumulation_steps so that the
    global batch stays the checkpoint's, and return the saved settings with that accumulation (for
    `check_resume_settings`, which then compares everything else). Raises `Refusal` naming the launches
    that keep it when none on `num_processes` does. The same process count: `saved` unchanged."""
    if saved_processes == num_processes:
        return saved
    if saved is None or ACCUMULATION not in saved:
        raise Refusal(
            f"--resume_from_checkpoint {checkpoint} was written by {saved_processes} processes and records no "
            f"run settings (an older hfbert), so its global batch is unknown: resume it on {saved_processes} "
            f"processes (`{relaunch_command(saved_processes, on_cpu)}`)"
        )
    per_device = int(saved["per_device_train_batch_size"])
    micro_batches = saved_processes * int(saved[ACCUMULATION])  # per update, all processes together
    if micro_batches % num_processes:
        choices = [count for count in range(1, micro_batches + 1) if micro_batches % count == 0]
        launches = "; ".join(
            f"`{relaunch_command(count, on_cpu)}` (--gradient_accumulation_steps {micro_batches // count})"
            for count in choices
        )
        raise Refusal(
            f"--resume_from_checkpoint {checkpoint}: its global batch of {micro_batches * per_device} rows "
            f"({per_device} per process x {saved_processes} process{'es' if saved_processes > 1 else ''} x "
            f"{saved[ACCUMULATION]} accumulation) "
            f"cannot be split over {num_processes} processes; resume it with one of: {launches}"
        )
    accumulation = micro_batches // num_processes
    if optimization.gradient_accumulation_steps != accumulation:
        logger.warning(
            f"Resuming on {num_processes} processes instead of {saved_processes}: --gradient_accumulation_steps "
            f"{accumulation} (not {optimization.gradient_accumulation_steps}) keeps the checkpoint's global batch "
            f"of {micro_batches * per_device} rows."
        )
    optimization.gradient_accumulation_steps = accumulation
    return {**saved, ACCUMULATION: accumulation}


def continue_on_this_split(accelerator: Accelerator, step: int, checkpoint: Path, seed: int) -> None:
    """After the resume from `checkpoint`, written after update `step` (`micro_batches_to_skip` then places each
    process in the epoch): RNG streams for a process whose rank wrote no RNG file (the checkpoint came from
    fewer processes), seeded by (seed, rank, step), not the fresh-start seed it had, which would replay step 0's
    dropout. Its dropout is then not what any uninterrupted run draws; nothing else is."""
    rank = accelerator.process_index
    if (checkpoint / RNG_FILE.format(rank=rank)).is_file():
        return
    derived = int(np.random.SeedSequence([seed, rank, step]).generate_state(1)[0])
    set_seed(derived)
    writers = int(read_manifest(checkpoint)["num_processes"])
    why = "(written by fewer processes)" if rank >= writers else (
        f"although the {writers} process{'es' if writers > 1 else ''} that wrote it saved one each (it was removed since)"
    )  # fmt: skip
    logger.warning(
        f"{checkpoint} holds no {RNG_FILE.format(rank=rank)} {why}: process {rank} seeds its RNG streams "
        f"(dropout) from (seed {seed}, rank {rank}, step {step}), so the resume is not exact."
    )
