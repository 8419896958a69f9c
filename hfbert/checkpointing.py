"""Crash-safe training checkpoints on top of `accelerate`'s `save_state` / `load_state`.

A checkpoint is a folder `checkpoint-<completed_steps>` holding what `Accelerator.save_state` writes (model
weights as safetensors, optimizer, scheduler, grad scaler, one RNG file per process), the training progress
as JSON (plain data: `hfbert.pretraining.training.TrainingProgress` writes and reads it), the model's config
and code and the tokenizer beside the weights (so that it loads as a model folder), plus `checkpoint_manifest.json` (size and sha256 of every file). A resume never unpickles: the torch files are
read with `weights_only=True` (accelerate's loader, whose allow-list adds numpy's RNG state). The state is first
written to `.tmp-checkpoint-<step>`; the manifest is written last and only then is the folder renamed into
place, so a folder named `checkpoint-<step>` with a manifest is complete by construction. A killed save
leaves only a temporary folder, which every reader ignores and the next save removes.
"""

from __future__ import annotations

import json
import logging
import os
import pickle
import random
import re
import shutil
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from functools import partial
from pathlib import Path, PurePosixPath
from typing import Any

import numpy as np
import torch
from accelerate import Accelerator
from accelerate.utils import gather_object
from accelerate.utils import load as load_torch_file
from safetensors import SafetensorError
from safetensors.torch import load_file

from hfbert.errors import CheckpointError, RunFailure
from hfbert.files import (
    CHECKPOINT_PREFIX,
    FINAL_READY,
    FINAL_RECORD,
    FINAL_STAGING,
    RUN_LOCK_NAME,
    WRITE_ERRORS,
    changed_since,
    check_readable,
    describe_write_failure,
    holds_tokenizer,
    is_disk_full,
    not_replaceable,
    read_json,
    sha256_file,
    write_json_atomic,
    write_tokenizer,
)
from hfbert.modeling_hfbert import save_model_files

logger = logging.getLogger(__name__)

TEMP_CHECKPOINT_PREFIX = ".tmp-checkpoint-"
# A checkpoint being replaced by a save at the same step is parked under this prefix until the new one is in place.
REPLACED_CHECKPOINT_PREFIX = ".replaced-checkpoint-"
# A checkpoint beyond --checkpoints_total_limit is renamed under this prefix, then deleted.
PRUNED_CHECKPOINT_PREFIX = ".pruned-checkpoint-"
MANIFEST_NAME = "checkpoint_manifest.json"
MANIFEST_FORMAT_VERSION = 1
# The run's training progress, as JSON; an hfbert up to 88be5f0 had accelerate pickle it as the first object
# registered for checkpointing, a file that its checkpoints still hold (read as plain data, never unpickled).
PROGRESS_JSON = "training_progress.json"
PROGRESS_PICKLE = "custom_checkpoint_0.pkl"
RNG_FILE = "random_states_{rank}.pkl"  # accelerate's per-process RNG file in a checkpoint
# What accelerate's load_state restores from an RNG file on every machine (CUDA's streams: where CUDA is).
RNG_STATES = ("random_state", "numpy_random_seed", "torch_manual_seed")
# Files of a finished run (written by the training loop next to the checkpoints).
FINAL_MODEL_FILES = ("model.safetensors", "config.json")
# A finished run's records beside them: the final evaluation, every setting and fact of the run, the log rows.
EVAL_RESULTS_NAME = "eval_results.json"
TRAINING_ARGS_NAME = "training_args.json"
LOG_HISTORY_NAME = "log_history.json"

_CHECKPOINT_NAME = re.compile(rf"^{re.escape(CHECKPOINT_PREFIX)}(\d+)$")


class CheckpointWriteError(RunFailure):
    """A checkpoint or the final folder could not be written (a full disk ...); the message names the last
    intact checkpoint."""




def load_plain_data(checkpoint: Path, name: str) -> Any:
    """The torch file `name` of `checkpoint`, read as accelerate's load_state reads its state files:
    `weights_only=True`, with accelerate's allow-list (numpy's RNG state). A file that needs any other object
    is refused, never unpickled; the files match the manifest, so any other error is a damaged write."""
    try:
        return load_torch_file(checkpoint / name, map_location="cpu")
    except pickle.UnpicklingError as error:
        raise _unsafe_pickle(checkpoint, name, error) from None
    except (RuntimeError, EOFError) as error:
        raise CheckpointError(
            f"Checkpoint {checkpoint} cannot be loaded ({name}: {error}); {_earlier_checkpoints_hint(checkpoint)}"
        ) from None


def _unsafe_pickle(checkpoint: Path, name: str, error: pickle.UnpicklingError) -> CheckpointError:
    """The refusal of a torch file that only a full unpickling could load (it may run any code)."""
    needed = re.search(r"GLOBAL (\S+)", str(error))
    return CheckpointError(
        f"Checkpoint {checkpoint} cannot be resumed: {name} needs {needed[1] if needed else 'objects'} to load "
        "(a full unpickling, which can run any code); hfbert writes plain data there and reads it with "
        f"weights_only=True, so this is not the file it wrote; {_earlier_checkpoints_hint(checkpoint)}"
    )


def read_progress(checkpoint: Path) -> dict[str, Any]:
    """The training progress of `checkpoint` (plain data): its `PROGRESS_JSON`, or the `PROGRESS_PICKLE` of a
    checkpoint written by an hfbert up to 88be5f0 (read as plain data, which is all it held). A progress that counts
    micro-batches per process (`batch_in_epoch`) is refused: the hfbert before global data positions wrote it,
    and only that one resumes it."""
    if (checkpoint / PROGRESS_JSON).is_file():
        state = _read_checkpoint_json(checkpoint, checkpoint / PROGRESS_JSON)
    else:
        state = load_plain_data(checkpoint, PROGRESS_PICKLE)
    if not isinstance(state, dict):
        raise CheckpointError(
            f"Checkpoint {checkpoint} is corrupted: its progress is no mapping; {_earlier_checkpoints_hint(checkpoint)}"
        )
    if "micro_batches_in_epoch" not in state:
        raise CheckpointError(
            f"Checkpoint {checkpoint} was written by an hfbert before commit 42e5a0a (its data position "
            "counts batches per process): resume it with that hfbert, or start the run over with "
            "--overwrite_output_dir"
        )
    _check_progress_counts(checkpoint, state)
    return state


def _check_progress_counts(checkpoint: Path, state: dict[str, Any]) -> None:
    """Refuse a progress that is not the one hfbert wrote with `checkpoint` (its counts are not counts, or its
    update count is not the folder's and the manifest's): resumed, it would go on at another update or sample."""
    name = PROGRESS_JSON if (checkpoint / PROGRESS_JSON).is_file() else PROGRESS_PICKLE
    for count in ("completed_steps", "epoch", "micro_batches_in_epoch"):
        value = state.get(count)
        if type(value) is not int or value < 0:
            problem = f"{count} {value!r}, not a count"
            break
    else:
        steps = {read_manifest(checkpoint)["step"]}
        if _CHECKPOINT_NAME.match(checkpoint.name):
            steps.add(checkpoint_step(checkpoint))
        if steps == {state["completed_steps"]}:
            return
        problem = (
            f"completed_steps {state['completed_steps']!r}, not the {'/'.join(map(str, sorted(steps)))} updates "
            "its folder name and manifest count"
        )
    raise CheckpointError(
        f"Checkpoint {checkpoint} is corrupted: its {name} has {problem}; {_earlier_checkpoints_hint(checkpoint)}"
    )


def checkpoint_step(path: str | os.PathLike) -> int:
    """The step number in a `checkpoint-<step>` folder name."""
    match = _CHECKPOINT_NAME.match(Path(path).name)
    if match is None:
        raise CheckpointError(
            f"{path} is not a checkpoint folder: its name must be '{CHECKPOINT_PREFIX}<step>', e.g. "
            f"'{CHECKPOINT_PREFIX}500'; pass a folder written by this training script"
        )
    return int(match.group(1))


def _checkpoint_folders(output_dir: str | os.PathLike, also: re.Pattern[str] | None = None) -> list[Path]:
    """The folders in `output_dir` named `checkpoint-<step>` or, given `also`, named as it matches, by name; never
    a symbolic link (`check_run_folder` refuses one; read, rotated or deleted, it would be followed)."""
    output_dir = Path(output_dir)
    if not output_dir.is_dir():
        return []
    return sorted(
        path
        for path in output_dir.iterdir()
        if path.is_dir() and not path.is_symlink()
        and (_CHECKPOINT_NAME.match(path.name) or (also and also.fullmatch(path.name)))
    )


def find_checkpoints(output_dir: str | os.PathLike) -> list[Path]:
    """Complete checkpoints (`checkpoint-<step>` with a manifest) in `output_dir`, oldest step first."""
    complete = [path for path in _checkpoint_folders(output_dir) if (path / MANIFEST_NAME).is_file()]
    return sorted(complete, key=checkpoint_step)


def _write_manifest(folder: Path, step: int, num_processes: int) -> None:
    files = {
        path.relative_to(folder).as_posix(): {"size": path.stat().st_size, "sha256": sha256_file(path)}
        for path in sorted(folder.rglob("*"))
        if path.is_file()
    }
    write_json_atomic(
        folder / MANIFEST_NAME,
        {"format_version": MANIFEST_FORMAT_VERSION, "step": step, "num_processes": num_processes, "files": files},
    )


def _earlier_checkpoints_hint(checkpoint: Path) -> str:
    step = checkpoint_step(checkpoint) if _CHECKPOINT_NAME.match(checkpoint.name) else None
    earlier = [
        path for path in find_checkpoints(checkpoint.parent) if step is None or checkpoint_step(path) < step
    ]
    if not earlier:
        return (
            "no earlier complete checkpoint exists next to it; start a fresh run with --overwrite_output_dir "
            "or a new --output_dir"
        )
    return (
        f"resume from an earlier checkpoint instead, e.g. --resume_from_checkpoint {earlier[-1]} "
        f"(complete checkpoints: {', '.join(path.name for path in earlier)})"
    )


def read_manifest(checkpoint: str | os.PathLike) -> dict[str, Any]:
    """The parsed manifest of a checkpoint folder; raises `CheckpointError` if it is missing or unreadable."""
    checkpoint = Path(checkpoint)
    manifest_path = checkpoint / MANIFEST_NAME
    if not manifest_path.is_file():
        raise CheckpointError(
            f"Checkpoint {checkpoint} is incomplete: {MANIFEST_NAME} is missing (the save was interrupted or "
            f"the folder was not written by this script); {_earlier_checkpoints_hint(checkpoint)}"
        )
    manifest = _read_checkpoint_json(checkpoint, manifest_path)
    try:
        files = manifest["files"]
        int(manifest["num_processes"])
    except (ValueError, KeyError, TypeError) as error:
        raise CheckpointError(
            f"Checkpoint {checkpoint} is corrupted: {manifest_path} cannot be parsed ({error}); "
            f"{_earlier_checkpoints_hint(checkpoint)}"
        ) from error
    if manifest.get("format_version") != MANIFEST_FORMAT_VERSION or not isinstance(files, dict):
        raise CheckpointError(
            f"Checkpoint {checkpoint} has an unknown manifest format (format_version "
            f"{manifest.get('format_version')!r}, expected {MANIFEST_FORMAT_VERSION}); resume it with the "
            f"hfbert version that wrote it, or {_earlier_checkpoints_hint(checkpoint)}"
        )
    return manifest


def verify_checkpoint(checkpoint: str | os.PathLike) -> None:
    """Check every file listed in the checkpoint's manifest: present, of the recorded size, same sha256.

    Raises `CheckpointError` naming the first bad file and the fix (an earlier checkpoint, listed by name).
    """
    checkpoint = Path(checkpoint)
    if not checkpoint.is_dir():
        raise CheckpointError(
            f"--resume_from_checkpoint {checkpoint}: no such folder; pass an existing '{CHECKPOINT_PREFIX}<step>' "
            "folder or 'latest'"
        )
    problem = damaged_file(checkpoint)
    if problem is not None:
        raise CheckpointError(
            f"Checkpoint {checkpoint} is damaged: {problem}; {_earlier_checkpoints_hint(checkpoint)}"
        )


def damaged_file(checkpoint: str | os.PathLike) -> str | None:
    """The first file listed in the checkpoint's manifest that is missing, of another size or another sha256
    ('<name> is ...'), or None when every file matches. The caller adds its own fix."""
    checkpoint = Path(checkpoint)
    for name, expected in read_manifest(checkpoint)["files"].items():
        path = checkpoint / name
        if not path.is_file():
            return f"{name} is missing"
        if path.stat().st_size != expected["size"]:
            return f"{name} is truncated or overwritten ({path.stat().st_size} bytes, expected {expected['size']})"
        if sha256_file(path) != expected["sha256"]:
            return f"{name} is corrupted (sha256 differs from the one recorded at save time)"
    return None


def finish_interrupted_replace(output_dir: Path) -> None:
    """A save of a step that has a checkpoint parks the old one, then renames the new one into place; a kill
    between the two renames leaves no checkpoint-N. Put the new one in place (its manifest, written last, lists
    every file in it), else the parked one back (whole by the same test), before anything looks for checkpoints;
    a folder of those names that is neither is left for the checks to name."""
    for parked in output_dir.glob(f"{REPLACED_CHECKPOINT_PREFIX}*"):
        step = parked.name.removeprefix(REPLACED_CHECKPOINT_PREFIX)
        final, staged = output_dir / f"{CHECKPOINT_PREFIX}{step}", output_dir / f"{TEMP_CHECKPOINT_PREFIX}{step}"
        if not _STAGING_NAME.fullmatch(parked.name) or not parked.is_dir() or final.exists():
            continue  # the replace finished: the parked copy is a leftover of its cleanup
        # Whole: its manifest (written last) lists every file in it; neither whole: left for the checks to name.
        staged_whole, parked_whole = _unlisted_files(staged) == [], _unlisted_files(parked) == []
        if not (staged_whole or parked_whole):
            continue
        os.replace(staged if staged_whole else parked, final)
        if staged_whole and parked_whole:
            shutil.rmtree(parked)
        logger.warning(f"Finished the replace of {final.name} that a crash interrupted")


def _prune_checkpoints(output_dir: Path, total_limit: int) -> None:
    """Remove the oldest checkpoints beyond `total_limit`, each renamed first so that a crash mid-delete leaves
    a temp folder (ignored) rather than a damaged checkpoint; one holding a file hfbert did not write is kept,
    with a warning naming it.
    Not accelerate's `ProjectConfiguration(total_limit)`: it prunes only under its `checkpoint_<save count>`
    names, before the new save is written (a failed save leaves fewer), counting every folder, in place."""
    for path in find_checkpoints(output_dir)[:-total_limit]:
        if original := _copied_from(path):
            logger.warning(
                f"Kept {path.name} beyond --checkpoints_total_limit {total_limit}: its manifest records update "
                f"{original.removeprefix(CHECKPOINT_PREFIX)}, so it is a copy of {original} (hfbert names a checkpoint "
                f"by its update); rename it (e.g. {path.name}-copy) or move it out of the folder"
            )
            continue
        if unlisted := _unlisted_files(path):  # a user's file, written into it while the run trained
            logger.warning(
                f"Kept {path.name} beyond --checkpoints_total_limit {total_limit}: it holds "
                f"{', '.join(f'{path.name}/{name}' for name in unlisted[:6])}, which hfbert did not write; move "
                f"{'that' if len(unlisted) == 1 else 'those'} out of it, and the next rotation removes the checkpoint"
            )
            continue
        doomed = path.with_name(f"{PRUNED_CHECKPOINT_PREFIX}{checkpoint_step(path)}")
        os.replace(path, doomed)
        shutil.rmtree(doomed)


# Saved inside every checkpoint: the settings that shape the run (compared on resume).
RUN_SETTINGS_NAME = "run_settings.json"
# A checkpoint is a model folder: its tokenizer lies beside the weights, config and code. An hfbert up to commit
# 88be5f0 saved the tokenizer in this subfolder instead, where it is still read.
TOKENIZER_FOLDER = "tokenizer"
# The temporary folders of a checkpoint save (the next save removes them); with the final folder's, the
# folders of an earlier run that --overwrite_output_dir removes, and (with the trained tokenizer) the names
# that mark a folder as an hfbert run, complete or not.
# Matched whole, as hfbert forms them: a user's `.final-ready-old` is not one of them.
_STAGING_PREFIXES = (TEMP_CHECKPOINT_PREFIX, REPLACED_CHECKPOINT_PREFIX, PRUNED_CHECKPOINT_PREFIX)
_STAGING_NAME = re.compile("|".join(rf"{re.escape(prefix)}\d+" for prefix in _STAGING_PREFIXES))
_LEFTOVER_NAME = re.compile(rf"{_STAGING_NAME.pattern}|{re.escape(FINAL_STAGING)}|{re.escape(FINAL_READY)}")
_TRAINED_TOKENIZER = ".tokenizer"  # hfbert.pretraining.data.TRAINED_TOKENIZER_DIR, a later stage's name
_RUN_MARKER = re.compile(rf"{_LEFTOVER_NAME.pattern}|{re.escape(_TRAINED_TOKENIZER)}")
# What hfbert.tokenization.save_tokenizer writes into the trained tokenizer's folder (a test holds the list),
# and where it stages them.
_TOKENIZER_FILES = {"tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", FINAL_RECORD}
_TOKENIZER_PLACES = {".", FINAL_STAGING, FINAL_READY}


def tokenizer_folder(folder: str | os.PathLike) -> Path | None:
    """Where a model folder or checkpoint keeps its tokenizer: at its top, or in `TOKENIZER_FOLDER` (a checkpoint
    of an older hfbert); None where it holds none."""
    return next((place for place in (Path(folder), Path(folder) / TOKENIZER_FOLDER) if holds_tokenizer(place)), None)


def checkpoint_folder(output_dir: str | os.PathLike, step: int) -> Path:
    """Where the checkpoint written after `step` updates lives."""
    return Path(output_dir) / f"{CHECKPOINT_PREFIX}{step}"


def save_checkpoint(
    accelerator: Accelerator,
    output_dir: str | os.PathLike,
    step: int,
    total_limit: int | None = None,
    *,
    progress: dict[str, Any],
    tokenizer: Any = None,
    model_config: Any = None,
    json_files: dict[str, Any] | None = None,
) -> Path:
    """Save the full training state to `output_dir/checkpoint-<step>`, crash-safely. Call on EVERY process.

    The state goes to `.tmp-checkpoint-<step>` (accelerate writes the shared files from the main process and
    one RNG file per process; `progress`, the training progress's plain data, as `PROGRESS_JSON`, the
    `tokenizer` and the `model_config` with the model's code (`save_model_files`), which make it a model folder, and `json_files` (file name -> JSON data:
    the run's settings as `RUN_SETTINGS_NAME`, a stream's position) are saved beside them), then the main
    process writes the manifest and puts the folder in place (`_put_in_place`). A failed write (e.g. a full
    disk) raises `CheckpointError` and leaves earlier checkpoints untouched. Returns the checkpoint folder.
    """
    # With automatic_checkpoint_naming, save_state ignores its output_dir and prunes by
    # ProjectConfiguration.total_limit itself, which would bypass the temp-folder-and-rename protocol.
    if accelerator.project_configuration.automatic_checkpoint_naming:
        raise CheckpointError(
            "Accelerator was built with ProjectConfiguration(automatic_checkpoint_naming=True); hfbert names, "
            "writes and prunes checkpoints itself: build the Accelerator without automatic_checkpoint_naming "
            "and total_limit"
        )
    if total_limit is not None and total_limit < 1:
        raise CheckpointError(f"--checkpoints_total_limit {total_limit} must be >= 1 (or unset to keep all)")
    output_dir = Path(output_dir)
    temp_folder = output_dir / f"{TEMP_CHECKPOINT_PREFIX}{step}"
    final_folder = checkpoint_folder(output_dir, step)
    if accelerator.is_main_process:
        output_dir.mkdir(parents=True, exist_ok=True)
        for path in output_dir.iterdir():
            if path.is_dir() and _STAGING_NAME.fullmatch(path.name):
                shutil.rmtree(path)
    accelerator.wait_for_everyone()

    def write_main_files() -> None:
        write_json_atomic(temp_folder / PROGRESS_JSON, progress)
        if tokenizer is not None:
            write_tokenizer(tokenizer, temp_folder)
        if model_config is not None:
            save_model_files(model_config, temp_folder)
        for name, content in (json_files or {}).items():
            write_json_atomic(temp_folder / name, content)
        _write_manifest(temp_folder, step, accelerator.num_processes)

    state = partial(accelerator.save_state, str(temp_folder), safe_serialization=True)
    in_the_way = partial(_refuse_replacing_theirs, final_folder) if accelerator.is_main_process else None
    for write in (in_the_way, state, write_main_files if accelerator.is_main_process else None):  # each agreed on
        write_on_every_process(accelerator, write, final_folder, output_dir, staged=temp_folder)
    if accelerator.is_main_process:
        _put_in_place(temp_folder, final_folder, total_limit)
    accelerator.wait_for_everyone()
    return final_folder


@dataclass(frozen=True)
class RunCheckpoints:
    """Where and with what a run writes its checkpoints (`save_checkpoint`): into `output_dir`, the newest
    `total_limit` kept, each with the run's `tokenizer` (reused on resume), `model_config` (a checkpoint is a
    folder a new run can start from) and `json_files` (file name -> JSON: its settings, compared on resume)."""

    output_dir: str
    total_limit: int | None
    tokenizer: Any
    model_config: Any
    json_files: dict[str, Any]

    def write(self, accelerator: Accelerator, step: int, progress: dict[str, Any], position: dict[str, Any]) -> Path:
        """The checkpoint of update `step`: the state, `progress` and `position` (JSON files of a data position
        that the progress does not hold). Call on every process."""
        files = {**self.json_files, **position}
        return save_checkpoint(
            accelerator, self.output_dir, step, self.total_limit, progress=progress, tokenizer=self.tokenizer,
            model_config=self.model_config, json_files=files,
        )  # fmt: skip


def _refuse_replacing_theirs(final_folder: Path) -> None:
    """Refuse a save over a `checkpoint-N` that is not hfbert's, made while the run trained (a folder of notes, a
    copy of another checkpoint): the same-step replace would delete it."""
    if not (final_folder.exists() or final_folder.is_symlink()):
        return
    if theirs := _not_hfberts(final_folder.parent, [final_folder.name]):
        raise CheckpointError(
            f"Did not save {final_folder.name}: {final_folder} holds what hfbert did not write ({', '.join(theirs)}), "
            f"which the save would replace; the run stops here. Move it out of {final_folder.parent}, then resume "
            "with the same command plus --resume_from_checkpoint latest"
        )


def _put_in_place(temp_folder: Path, final_folder: Path, total_limit: int | None) -> None:
    """Rename a written checkpoint into place (parking one already there: of the same step saved twice, e.g.
    by a step save and an epoch save, the newer state wins), and only then prune beyond `total_limit`."""
    replaced = final_folder.with_name(f"{REPLACED_CHECKPOINT_PREFIX}{checkpoint_step(final_folder)}")
    if final_folder.exists():
        os.replace(final_folder, replaced)
    os.replace(temp_folder, final_folder)
    if replaced.exists():
        shutil.rmtree(replaced)
    if total_limit is not None:
        _prune_checkpoints(final_folder.parent, total_limit)


def write_on_every_process(
    accelerator: Accelerator,
    write: Callable[[], Any] | None,
    path: Path,
    output_dir: Path,
    staged: Path | None = None,
) -> Any:
    """Run this process's part of writing `path` (a checkpoint or the final folder; `write`, None: nothing
    here) and return what it returns; then every process learns whether any failed, and all raise the first
    failing one's refusal (`staged`, if given, is removed first by the main process). A writer that stopped
    alone left the others in the run's next collective, to stop there on a network error that named no cause
    (one full disk told as two refusals, or as a refusal and a traceback)."""
    message, cause, written = None, None, None
    try:
        if write is not None:
            written = write()
    except WRITE_ERRORS as error:  # the message before any cleanup frees space
        message, cause = write_failure_message(error, path, output_dir), error
    except CheckpointError as refused:  # a write refused before it began (what is in its way is the user's)
        message, cause = str(refused), refused
    if accelerator.num_processes > 1:
        try:
            message = next((m for m in gather_object([message]) if m is not None), None)
        except RuntimeError as error:  # another process died: this one can only say so
            message, cause = message or peer_failure_message(error, path, output_dir), cause or error
    if message is None:
        return written
    if accelerator.is_main_process and staged is not None:
        shutil.rmtree(staged, ignore_errors=True)
    raise CheckpointWriteError(message) from cause


def write_failure_message(
    error: BaseException, path: str | os.PathLike, output_dir: str | os.PathLike
) -> str:
    """What a failed write of a checkpoint or the final folder `path` means for the run in `output_dir`: the
    cause (a full disk named as such), the last complete checkpoint (intact: writes are staged) and the fix."""
    disk_full = is_disk_full(error, output_dir)
    full = f"free space (`df -h {output_dir}`, or lower --checkpoints_total_limit)"
    return _how_to_go_on(
        describe_write_failure(error, path, disk_full),
        output_dir,
        f"; no complete checkpoint exists yet. Free space (`df -h {output_dir}`) or fix the cause, then ",
        f"{full if disk_full else 'fix the cause'} and ",
    )


def peer_failure_message(error: RuntimeError, path: str | os.PathLike, output_dir: str | os.PathLike) -> str:
    """For a process that lost another during the agreement on a checkpoint or the final folder `path`: the
    collective's error (gloo's or NCCL's first sentence, without its source line) stands for a cause that only the
    other process's log names."""
    reason = re.sub(r"^\[[^\]]*\]\s*", "", str(error)).split(". ")[0].strip()
    what = f"another process of the run stopped while {path} was being written ({reason}); its log names the cause"
    return _how_to_go_on(what, output_dir, ". No complete checkpoint exists yet: ", "")


def _how_to_go_on(what: str, output_dir: str | os.PathLike, no_checkpoint: str, fix: str) -> str:
    """`what` failed, then how to go on: `fix`, then resume from the last complete checkpoint (intact: writes
    are staged); where there is none, `no_checkpoint`, then start over."""
    checkpoints = find_checkpoints(output_dir)
    if not checkpoints:
        return (
            f"{what}{no_checkpoint}start the run again (the same command with --resume_from_checkpoint auto, or "
            "--overwrite_output_dir)"
        )
    return (
        f"{what}; the last complete checkpoint {checkpoints[-1]} is intact; {fix}resume with the same command plus "
        "--resume_from_checkpoint latest"
    )


def last_finite_checkpoint_note(output_dir: str | os.PathLike, resumed_from: Path | None = None) -> str:
    """For a NaN stop: ' The last checkpoint whose weights are all finite is <path> (largest |weight| <w>).' for
    the newest such checkpoint in `output_dir`, else the one the run resumed from (`resumed_from`, in another
    folder) if finite (weights far above 1 are diverging already), else ''. Reads the weights: for an error path
    only."""
    for checkpoint in [*reversed(find_checkpoints(output_dir)), *([resumed_from] if resumed_from else [])]:
        tensors = [tensor for path in sorted(checkpoint.glob("*.safetensors")) for tensor in load_file(path).values()]
        if tensors and all(bool(tensor.isfinite().all()) for tensor in tensors):
            largest = max(float(tensor.abs().max()) for tensor in tensors if tensor.numel())
            return f" The last checkpoint whose weights are all finite is {checkpoint} (largest |weight| {largest:.3g})."
    return ""


def relaunch_command(num_processes: int, cpu: bool) -> str:
    """How to start `num_processes` training processes (on a CPU, accelerate launch starts only one)."""
    if cpu:
        return f"ACCELERATE_USE_CPU=1 torchrun --nproc_per_node {num_processes} run_pretraining.py ..."
    return f"accelerate launch --num_processes {num_processes} run_pretraining.py ..."


def load_checkpoint(accelerator: Accelerator, checkpoint: str | os.PathLike) -> dict[str, Any]:
    """Restore a checkpoint already verified by `resolve_resume_checkpoint`: model, optimizer, grad scaler and
    RNG with `accelerator.load_state` (every torch file read with weights_only=True); returns its training
    progress (`read_progress`). Call on every process, after `accelerator.prepare`. The processes that wrote it may be
    more or fewer than this run's (see `hfbert.pretraining.extras.reshard`): accelerate loads
    `random_states_<rank>.pkl` where it exists (`check_rng_states` made sure it can) and skips it where not."""
    checkpoint = Path(checkpoint)
    listed = sorted(checkpoint / name for name in read_manifest(checkpoint)["files"])
    try:
        check_readable(listed, _earlier_checkpoints_hint(checkpoint), torch_files=True)
    except ValueError as error:
        raise CheckpointError(f"Checkpoint {checkpoint} is damaged although it matches its manifest: {error}") from None
    try:
        with _state_files(checkpoint, listed) as state_folder:
            accelerator.load_state(str(state_folder))
    # Its files match the manifest (verified), so this is a checkpoint written damaged or a file that is not
    # plain data: pickle and safetensors report that as the errors below, naming no file.
    except (EOFError, pickle.UnpicklingError, SafetensorError) as error:
        for path in sorted(path for path in checkpoint.iterdir() if path.suffix in (".bin", ".pt")):  # names it
            load_plain_data(checkpoint, path.name)
        raise CheckpointError(
            f"Checkpoint {checkpoint} cannot be loaded ({type(error).__name__}: {error}) although its files match "
            f"the manifest written with it; {_earlier_checkpoints_hint(checkpoint)}"
        ) from error
    return read_progress(checkpoint)


@contextmanager
def _state_files(checkpoint: Path, listed: list[Path]) -> Iterator[Path]:
    """The folder accelerate's load_state reads: a view (links) of the `listed` files of `checkpoint` (its
    manifest's), so a file beside them (a user's `custom_checkpoint_1.pkl`) is never read, without the pickled
    progress of an hfbert up to 88be5f0, which load_state refuses without a registered object and unpickles with
    one."""
    with tempfile.TemporaryDirectory(prefix="hfbert-checkpoint-") as view:
        for top in {path.relative_to(checkpoint).parts[0] for path in listed} - {PROGRESS_PICKLE}:
            (Path(view) / top).symlink_to((checkpoint / top).absolute())
        yield Path(view)


# How accelerate's load_state restores each of `RNG_STATES` (and how the check puts this process's back).
_RNG_ACCESS = (
    (random.getstate, random.setstate),
    (np.random.get_state, np.random.set_state),
    (torch.get_rng_state, torch.set_rng_state),
)


def check_rng_states(checkpoint: Path) -> None:
    """Refuse a resume that cannot be exact because accelerate's load_state would skip a process's RNG file
    silently: one that does not load as plain data, lacks a state it restores or holds one it cannot set (tried
    here as load_state sets it, this process's streams put back). One without CUDA's streams, on a machine with
    CUDA, is one warning (they start from the seed)."""
    for path in sorted(checkpoint.glob(RNG_FILE.format(rank="*"))):
        states = load_plain_data(checkpoint, path.name)
        missing = [state for state in RNG_STATES if not isinstance(states, dict) or state not in states]
        problem = f"holds no {', '.join(missing)}" if missing else None
        for state, (get, put) in zip(RNG_STATES, _RNG_ACCESS, strict=True) if not missing else ():
            current = get()
            try:
                put(states[state])
            except Exception as error:  # what load_state catches, logging "Could not load random states" at INFO
                reason = f"{type(error).__name__}: {(str(error).splitlines() or [''])[0]}"
                problem = problem or f"holds a {state} that cannot be restored ({reason})"
            finally:
                put(current)
        if problem:
            raise CheckpointError(
                f"Checkpoint {checkpoint} cannot be resumed exactly: {path.name} {problem} (the RNG streams of "
                f"dropout would start elsewhere than where the run left them); {_earlier_checkpoints_hint(checkpoint)}"
            )
        if torch.cuda.is_available() and "torch_cuda_manual_seed" not in states:
            logger.warning(
                f"{path} holds no CUDA RNG state (written without CUDA): dropout on the GPU starts from the seed, "
                "so the resumed run differs from one that never stopped."
            )


def resolve_resume_checkpoint(output_dir: str | os.PathLike, resume_from_checkpoint: str) -> Path | None:
    """The verified checkpoint folder meant by `--resume_from_checkpoint` ('latest' = newest complete
    checkpoint in `output_dir`; 'auto' = the same, or None when there is none: a fresh start; else a folder
    path), its progress in the format this hfbert reads and every RNG file restorable (`check_rng_states`).
    Raises `CheckpointError` before anything is written.
    Hashes every file: call it once, on the main process."""
    output_dir = Path(output_dir)
    if resume_from_checkpoint in ("latest", "auto"):
        checkpoints = find_checkpoints(output_dir)
        if not checkpoints and resume_from_checkpoint == "auto":
            return None
        incomplete = [  # what no reader may use: interrupted saves and folders without a manifest
            path.name
            for path in _checkpoint_folders(output_dir, _STAGING_NAME)
            if path.name.startswith(TEMP_CHECKPOINT_PREFIX) or not (path / MANIFEST_NAME).is_file()
        ]
        if not checkpoints:  # the fix must hold: starting over refuses what hfbert did not write
            foreign = ", ".join(_not_hfberts(output_dir, _run_folder_names(output_dir)))
            interrupted = ", ".join(name for name in incomplete if name.startswith(TEMP_CHECKPOINT_PREFIX))
            raise CheckpointError(
                f"--resume_from_checkpoint latest: {output_dir} holds no complete checkpoint"
                f"{f' (only interrupted saves: {interrupted})' if interrupted else ''}; there is nothing to resume: "
                f"{f'move {foreign} out of it (hfbert did not write it), then ' if foreign else ''}"
                "start the run over with the same command without "
                "--resume_from_checkpoint, plus --overwrite_output_dir (or use --resume_from_checkpoint auto, "
                "which starts over when there is no checkpoint)"
            )
        checkpoint = checkpoints[-1]
        newer = [name for name in incomplete if int(name.rsplit("-", 1)[1]) > checkpoint_step(checkpoint)]
        if newer:
            logger.warning(
                f"Skipping incomplete checkpoint folder(s) {', '.join(newer)} (interrupted save or missing "
                f"{MANIFEST_NAME}); resuming from {checkpoint.name}, the newest complete one."
            )
    else:
        checkpoint = Path(resume_from_checkpoint)
        checkpoint_step(checkpoint)
    verify_checkpoint(checkpoint)
    read_progress(checkpoint)
    check_rng_states(checkpoint)
    return checkpoint


def read_run_settings(checkpoint: str | os.PathLike) -> dict[str, Any] | None:
    """The run settings saved with a checkpoint, or None for a checkpoint written before they were saved."""
    path = Path(checkpoint) / RUN_SETTINGS_NAME
    return _read_checkpoint_json(Path(checkpoint), path) if path.is_file() else None


def _read_checkpoint_json(checkpoint: Path, path: Path) -> Any:
    """The parsed JSON file `path` of `checkpoint`; a `CheckpointError` naming the damage and an earlier one."""
    try:
        return read_json(path, _earlier_checkpoints_hint(checkpoint))
    except ValueError as error:
        raise CheckpointError(f"Checkpoint {checkpoint} is corrupted: {error}") from None


def starts_over_with_auto(output_dir: str | os.PathLike, resume_from_checkpoint: str | None) -> bool:
    """Whether `--resume_from_checkpoint auto` starts a fresh run: `output_dir` has no complete checkpoint
    (the leftovers of a run interrupted before its first one are then removed, as --overwrite_output_dir does)."""
    return resume_from_checkpoint == "auto" and not find_checkpoints(output_dir)


def _check_auto_start(output_dir: Path, names: list[str]) -> None:
    """--resume_from_checkpoint auto resumes the newest complete checkpoint, or starts over a folder that is
    empty or holds only an interrupted run (`names`: what it holds); a finished run without checkpoints or
    other files are refused."""
    if find_checkpoints(output_dir):
        return
    if any(name in FINAL_MODEL_FILES for name in names):
        raise CheckpointError(
            f"--resume_from_checkpoint auto: {output_dir} holds a finished run without checkpoints "
            f"({', '.join(names[:6])}); nothing to resume: pass a new --output_dir, or --overwrite_output_dir "
            "instead to replace it"
        )
    foreign = _not_hfberts(output_dir, names)
    if foreign:
        raise CheckpointError(
            f"--resume_from_checkpoint auto: {output_dir} holds no complete checkpoint and what hfbert did not write "
            f"({', '.join(foreign[:6])}{', ...' if len(foreign) > 6 else ''}): move them out of it, or pass a new or "
            "empty --output_dir"
        )


def _describe_folder(output_dir: Path, names: list[str]) -> str:
    """What a folder holds, for a refusal: a run (its files, corpus and step where it records them) or files."""
    shown = ", ".join(names[:6]) + (", ..." if len(names) > 6 else "")
    if not any(name in FINAL_MODEL_FILES or _CHECKPOINT_NAME.match(name) or _RUN_MARKER.fullmatch(name) for name in names):
        return f"other files ({shown})"
    facts = []
    for name, key in ((TRAINING_ARGS_NAME, "corpus"), (EVAL_RESULTS_NAME, "step")):
        try:
            facts.append(f"{key} {json.loads((output_dir / name).read_text(encoding='utf-8'))[key]}")
        except (OSError, ValueError, KeyError, TypeError):
            continue  # an interrupted run has neither file
    return f"another run ({shown}{'; ' if facts else ''}{', '.join(facts)})"


def check_run_folder(
    output_dir: str | os.PathLike, *, resume_from_checkpoint: str | None, overwrite_output_dir: bool
) -> None:
    """Refuse a run folder that cannot be used as asked, before anything is written.

    A fresh run needs a new or empty folder; a folder holding another run (complete or interrupted) needs
    --resume_from_checkpoint or --overwrite_output_dir, and so does a non-empty folder resumed into from another
    folder's checkpoint; with --overwrite_output_dir, a folder holding anything hfbert did not write is refused
    (`_check_overwrite`). Never deletes anything: with `overwrite_output_dir` the caller removes the old run (see
    `remove_checkpoints`) so stale checkpoints cannot be mistaken for this run's.
    """
    output_dir = Path(output_dir)
    if output_dir.exists() and not output_dir.is_dir():
        raise CheckpointError(f"--output_dir {output_dir} is a file, not a folder; pass a folder path")
    # Whether --resume_from_checkpoint names a checkpoint of output_dir itself ('latest' and 'auto' do).
    resumes_own_run = resume_from_checkpoint in ("latest", "auto") or (
        resume_from_checkpoint is not None
        and Path(resume_from_checkpoint).absolute().parent.resolve() == output_dir.absolute().resolve()
    )
    if resumes_own_run and overwrite_output_dir:
        raise CheckpointError(
            "--resume_from_checkpoint and --overwrite_output_dir contradict each other (overwriting removes the "
            "checkpoints to resume from); pass only one of them"
        )
    if not output_dir.is_dir():  # a new folder: nothing in the way
        return
    names = _run_folder_names(output_dir)
    hfbert_named = (name for name in names if _CHECKPOINT_NAME.match(name) or _RUN_MARKER.fullmatch(name))
    links = [name for name in hfbert_named if (output_dir / name).is_symlink()]
    if links:  # refused in every mode: a resume would read it and rotation delete it, overwriting delete through it
        raise CheckpointError(
            f"--output_dir {output_dir} holds {', '.join(links)} as a symbolic link: hfbert reads, rotates and "
            "deletes there only the folders it wrote, never through a link; replace the link with a copy of its "
            "folder, or move it out"
        )
    if resume_from_checkpoint == "auto":
        _check_auto_start(output_dir, names)
        _check_resume_folder(output_dir, names, resume_from_checkpoint)
        return
    if overwrite_output_dir:
        _check_overwrite(output_dir, names)
    if resumes_own_run:  # its saves, rotation and final folder would replace or delete what hfbert did not write
        _check_resume_folder(output_dir, names, resume_from_checkpoint)
    if resumes_own_run or overwrite_output_dir or not names:
        return
    if resume_from_checkpoint is not None:  # a checkpoint of another folder, resumed into this one
        raise CheckpointError(
            f"--output_dir {output_dir} already holds {_describe_folder(output_dir, names)}, and "
            f"--resume_from_checkpoint {resume_from_checkpoint} is not one of its checkpoints: resuming there "
            "would replace it. Pass a new or empty --output_dir, or --overwrite_output_dir to replace it"
        )
    _check_fresh_start(output_dir, names)


def _check_resume_folder(output_dir: Path, names: list[str], resume_from_checkpoint: str) -> None:
    """A run resumed in its own folder writes, rotates and publishes there: refuse what hfbert did not write."""
    foreign = _not_hfberts(output_dir, [name for name in names if not name.startswith(TEMP_CHECKPOINT_PREFIX)])
    if foreign:
        raise CheckpointError(
            f"--resume_from_checkpoint {resume_from_checkpoint}: {output_dir} holds what hfbert did not write "
            f"({', '.join(foreign[:6])}{', ...' if len(foreign) > 6 else ''}), which the resumed run's checkpoints, "
            "their rotation or its final folder would replace or delete: move it out of the folder, then resume"
        )


def _check_overwrite(output_dir: Path, names: list[str]) -> None:
    """--overwrite_output_dir replaces what hfbert wrote in `output_dir` (`names`: what it holds): checkpoints
    with a manifest, the files its final folders published (`FINAL_RECORD`) and its hidden staging folders.
    Anything else is refused, named, before anything is deleted (`_not_hfberts`)."""
    foreign = _not_hfberts(output_dir, names)
    if foreign:
        raise CheckpointError(
            f"--overwrite_output_dir replaces only what hfbert wrote in {output_dir} (checkpoints with a "
            f"{MANIFEST_NAME}, the files its final folder lists in {FINAL_RECORD}), and it also holds "
            f"{', '.join(foreign[:6])}{', ...' if len(foreign) > 6 else ''}: move them out of it, or pass a new "
            "--output_dir"
        )


def _check_fresh_start(output_dir: Path, names: list[str]) -> None:
    """A fresh run (no --resume_from_checkpoint, no --overwrite_output_dir) refuses a folder holding anything
    (`names`): another run's output, an interrupted run or other files, each with its own fix."""
    complete = [name for name in names if _CHECKPOINT_NAME.match(name) or name in FINAL_MODEL_FILES]
    if find_checkpoints(output_dir) or any(name in FINAL_MODEL_FILES for name in complete):
        raise CheckpointError(
            f"--output_dir {output_dir} already holds another run's output ({', '.join(complete)}); pass "
            "--resume_from_checkpoint latest to continue that run, --overwrite_output_dir to replace it, or a "
            "new --output_dir"
        )
    if any(_RUN_MARKER.fullmatch(name) for name in names):
        raise CheckpointError(
            f"--output_dir {output_dir} holds an interrupted run with no complete checkpoint "
            f"({', '.join(names)}); nothing can be resumed: pass --overwrite_output_dir to start it over, or a "
            "new --output_dir"
        )
    raise CheckpointError(
        f"--output_dir {output_dir} is not empty and holds no hfbert run ({', '.join(names[:5])}"
        f"{', ...' if len(names) > 5 else ''}); pass a new or empty --output_dir"
    )


def _run_folder_names(output_dir: Path) -> list[str]:
    """What `output_dir` holds, by name, but the run's lock and its record of published files."""
    return sorted(path.name for path in output_dir.iterdir() if path.name not in (RUN_LOCK_NAME, FINAL_RECORD))


def _not_hfberts(output_dir: Path, names: list[str]) -> list[str]:
    """What of `names` (in `output_dir`) hfbert did not write, as a refusal names it: all but its hidden folders,
    the files its final folders published as they are (`not_replaceable`) and its checkpoints, of which a file
    the manifest does not list ('checkpoint-8/my_eval.txt') or one without a manifest ('checkpoint-7 (no ...)')."""
    foreign: list[str] = []
    others = [
        name for name in names if not (_CHECKPOINT_NAME.match(name) or name == _TRAINED_TOKENIZER or _RUN_MARKER.fullmatch(name))
    ]
    theirs = not_replaceable(output_dir, others)  # the final folder's names: only what it published as it is
    for name in names:
        if _CHECKPOINT_NAME.match(name):
            unlisted = _unlisted_files(output_dir / name)
            if original := _copied_from(output_dir / name):
                foreign.append(f"{name} (a copy of {original})")
            elif unlisted is None:
                state = "no" if not (output_dir / name / MANIFEST_NAME).is_file() else "an unreadable"
                foreign.append(f"{name} ({state} {MANIFEST_NAME})")
            else:
                foreign += [f"{name}/{file}" for file in unlisted]
        elif name == _TRAINED_TOKENIZER:
            foreign += _not_tokenizer_files(output_dir, name)
        elif name in theirs:
            foreign.append(theirs[name])
    return foreign


def _copied_from(checkpoint: Path) -> str | None:
    """The name of the checkpoint that `checkpoint` is a copy of, where its manifest records another update than
    its name says (a user's backup, `cp -a checkpoint-4 checkpoint-2`: hfbert names a checkpoint by its update);
    None where the two agree or it has no readable manifest."""
    try:
        step = read_manifest(checkpoint).get("step")
    except CheckpointError:
        return None
    if not isinstance(step, int) or checkpoint.name == f"{CHECKPOINT_PREFIX}{step}":
        return None
    return f"{CHECKPOINT_PREFIX}{step}"


def _unlisted_files(checkpoint: Path) -> list[str] | None:
    """What in `checkpoint` hfbert did not write (relative POSIX paths: files, links and folders its manifest does
    not list, and listed files changed since, '<name> (changed since hfbert wrote it)'), or None where it has no
    readable manifest."""
    manifest = checkpoint / MANIFEST_NAME
    try:
        recorded = read_manifest(checkpoint)["files"]
    except CheckpointError:
        return None
    listed = {*recorded, MANIFEST_NAME}
    folders = {parent.as_posix() for name in listed for parent in PurePosixPath(name).parents}
    unlisted = []
    for path in sorted(checkpoint.rglob("*")):  # rglob does not enter a folder link
        name = path.relative_to(checkpoint).as_posix()
        if name not in (folders if path.is_dir() and not path.is_symlink() else listed):
            unlisted.append(name)
        elif name in recorded and changed_since(path, recorded[name], manifest.stat().st_mtime_ns):
            unlisted.append(f"{name} (changed since hfbert wrote it)")
    return unlisted


def _not_tokenizer_files(output_dir: Path, name: str) -> list[str]:
    """What of the trained tokenizer's folder `name` hfbert did not write: all but its tokenizer files (where it
    writes or stages them); the folder itself where it is a link or no folder."""
    folder = output_dir / name
    if folder.is_symlink() or not folder.is_dir():
        return [f"{name} ({'a link' if folder.is_symlink() else 'no folder'})"]
    files = (path.relative_to(folder) for path in sorted(folder.rglob("*")) if not path.is_dir() or path.is_symlink())
    return [
        f"{name}/{file.as_posix()}"
        for file in files
        if file.name not in _TOKENIZER_FILES or file.parent.as_posix() not in _TOKENIZER_PLACES
    ]


def remove_checkpoints(output_dir: str | os.PathLike) -> list[Path]:
    """Delete every checkpoint (with a manifest) and leftover temporary folder of an earlier run in `output_dir`
    (for `--overwrite_output_dir`, or `auto` starting over; main process only), none of them a link, after
    `check_run_folder` refused anything else. Returns what was removed."""
    removed = [
        path for path in _checkpoint_folders(output_dir, _LEFTOVER_NAME)
        if _LEFTOVER_NAME.fullmatch(path.name) or (path / MANIFEST_NAME).is_file()
    ]  # fmt: skip
    for path in removed:
        shutil.rmtree(path)
    return removed
