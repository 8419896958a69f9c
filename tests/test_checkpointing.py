import errno
import json
import logging
import os
import shutil
from collections.abc import Callable
from functools import partial
from pathlib import Path
from unittest import mock

import pytest
import torch
from accelerate import Accelerator, DataLoaderConfiguration
from accelerate.state import AcceleratorState, GradientState
from accelerate.utils import ProjectConfiguration, set_seed
from conftest import DAMAGES, damage
from safetensors import SafetensorError
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from hfbert import HfBertConfig
from hfbert.checkpointing import (
    MANIFEST_NAME,
    PROGRESS_JSON,
    PROGRESS_PICKLE,
    RUN_SETTINGS_NAME,
    TOKENIZER_FOLDER,
    CheckpointWriteError,
    _write_manifest,
    check_run_folder,
    checkpoint_step,
    find_checkpoints,
    finish_interrupted_replace,
    load_checkpoint,
    load_plain_data,
    read_run_settings,
    remove_checkpoints,
    resolve_resume_checkpoint,
    save_checkpoint,
    tokenizer_folder,
    verify_checkpoint,
)
from hfbert.errors import CheckpointError
from hfbert.files import FINAL_RECORD, RUN_LOCK_NAME, run_folder_lock, write_json_atomic
from hfbert.modeling_hfbert import AUTO_MAP
from hfbert.pretraining.training import TrainingProgress
from hfbert.tokenization import save_tokenizer

SEED = 1234
BATCHES_PER_EPOCH = 10
TOTAL_STEPS = 25


@pytest.fixture(autouse=True)
def fresh_accelerate_state():
    # Each test (and each simulated process restart) builds its own Accelerator.
    AcceleratorState._reset_state(True)
    GradientState._reset_state()
    yield
    AcceleratorState._reset_state(True)
    GradientState._reset_state()


def build_run(**accelerator_kwargs):
    """A tiny training setup built the way hfbert's loop builds it (seed, seedable sampler, own generator)."""
    AcceleratorState._reset_state(True)
    GradientState._reset_state()
    accelerator = Accelerator(
        cpu=True, dataloader_config=DataLoaderConfiguration(use_seedable_sampler=True), **accelerator_kwargs
    )
    set_seed(SEED)
    features = torch.randn(BATCHES_PER_EPOCH * 4, 6)
    targets = torch.randn(BATCHES_PER_EPOCH * 4, 1)
    # The loader's own generator keeps DataLoader.__iter__ from drawing its base seed from the global RNG,
    # which would shift the RNG stream when a resumed run starts iterating mid-epoch.
    dataloader = DataLoader(
        TensorDataset(features, targets),
        batch_size=4,
        shuffle=True,
        generator=torch.Generator().manual_seed(SEED),
    )
    # Dropout consumes the global RNG, so the test also proves that the RNG state is restored.
    model = nn.Sequential(nn.Linear(6, 16), nn.Dropout(0.2), nn.ReLU(), nn.Linear(16, 1))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0 - step / (TOTAL_STEPS + 1))
    model, optimizer, dataloader, scheduler = accelerator.prepare(model, optimizer, dataloader, scheduler)
    progress = TrainingProgress()
    return accelerator, model, optimizer, scheduler, dataloader, progress


def train(run, stop_at_step: int) -> None:
    """The resume-aware loop pattern: set_epoch every epoch, skip the consumed batches of the resumed one."""
    accelerator, model, optimizer, scheduler, dataloader, progress = run
    model.train()
    num_epochs = -(-TOTAL_STEPS // BATCHES_PER_EPOCH)
    for epoch in range(progress.epoch, num_epochs):
        dataloader.set_epoch(epoch)
        batches = (
            accelerator.skip_first_batches(dataloader, progress.micro_batches_in_epoch)
            if progress.micro_batches_in_epoch
            else dataloader
        )
        for features, targets in batches:
            loss = nn.functional.mse_loss(model(features), targets)
            accelerator.backward(loss)
            optimizer.step()
            scheduler.step()
            optimizer.zero_grad()
            progress.micro_batches_in_epoch += 1
            progress.completed_steps += 1
            progress.log_history.append({"step": progress.completed_steps, "loss": loss.item()})
            if progress.completed_steps == stop_at_step:
                return
        progress.epoch += 1
        progress.micro_batches_in_epoch = 0


def resume(run, checkpoint: Path) -> None:
    run[5].load_state_dict(load_checkpoint(run[0], checkpoint))


def parameters(model) -> list[torch.Tensor]:
    return [parameter.detach().clone() for parameter in model.parameters()]


@pytest.mark.parametrize("written_by_main", [False, True])  # main: the progress pickled (before issue 64)
@pytest.mark.parametrize("split_step", [13, BATCHES_PER_EPOCH])  # mid-epoch and exactly at an epoch's end
def test_resume_reproduces_uninterrupted_training(tmp_path, split_step, written_by_main):
    straight = build_run()
    train(straight, TOTAL_STEPS)
    expected = parameters(straight[1])
    expected_history = straight[5].log_history

    first_half = build_run()
    train(first_half, split_step)
    checkpoint = save_checkpoint(first_half[0], tmp_path, first_half[5].completed_steps, progress=first_half[5].state_dict())
    assert checkpoint == tmp_path / f"checkpoint-{split_step}"
    if written_by_main:
        as_main_wrote_it(checkpoint)

    resumed = build_run()  # a fresh process: new Accelerator, freshly initialised model
    resumed[5].load_state_dict(load_checkpoint(resumed[0], resolve_resume_checkpoint(tmp_path, "latest")))
    assert resumed[5].completed_steps == split_step
    train(resumed, TOTAL_STEPS)

    for got, want in zip(parameters(resumed[1]), expected, strict=True):
        assert torch.equal(got, want)
    assert resumed[5].log_history == expected_history


def save_steps(tmp_path, steps, total_limit=None):
    run = build_run()
    for step in steps:
        run[5].completed_steps = step
        save_checkpoint(run[0], tmp_path, step, total_limit=total_limit, progress=run[5].state_dict())
    return run


def test_checkpoint_holds_accelerate_state_and_manifest(tmp_path):
    run = build_run()
    checkpoint = save_checkpoint(run[0], tmp_path, 7, progress=run[5].state_dict())
    names = {path.name for path in checkpoint.iterdir()}
    assert names == {
        "model.safetensors",
        "optimizer.bin",
        "scheduler.bin",
        "random_states_0.pkl",
        PROGRESS_JSON,
        MANIFEST_NAME,
    }
    manifest = json.loads((checkpoint / MANIFEST_NAME).read_text())
    assert manifest["step"] == 7
    assert manifest["num_processes"] == 1
    assert set(manifest["files"]) == names - {MANIFEST_NAME}
    assert [path.name for path in tmp_path.iterdir()] == ["checkpoint-7"]  # no temp folder left


def test_total_limit_keeps_newest_checkpoints(tmp_path):
    save_steps(tmp_path, [2, 4, 6, 8], total_limit=2)
    assert [path.name for path in find_checkpoints(tmp_path)] == ["checkpoint-6", "checkpoint-8"]
    assert sorted(path.name for path in tmp_path.iterdir()) == ["checkpoint-6", "checkpoint-8"]


def test_steps_order_numerically_not_alphabetically(tmp_path):
    save_steps(tmp_path, [9, 10, 100])
    assert [path.name for path in find_checkpoints(tmp_path)] == [
        "checkpoint-9",
        "checkpoint-10",
        "checkpoint-100",
    ]
    assert resolve_resume_checkpoint(tmp_path, "latest").name == "checkpoint-100"


def test_saving_the_same_step_twice_replaces_it(tmp_path):
    run = save_steps(tmp_path, [5])
    run[5].log_history.append({"step": 5, "loss": 1.0})
    save_checkpoint(run[0], tmp_path, 5, progress=run[5].state_dict())
    assert [path.name for path in tmp_path.iterdir()] == ["checkpoint-5"]
    reloaded = build_run()
    reloaded[5].load_state_dict(load_checkpoint(reloaded[0], tmp_path / "checkpoint-5"))
    assert reloaded[5].log_history == [{"step": 5, "loss": 1.0}]


class Killed(BaseException):
    """A SIGKILL at a chosen point, as an exception nothing in hfbert catches."""


@pytest.mark.parametrize("staged_left", [True, False])
def test_a_kill_between_the_renames_of_a_same_step_save_loses_neither_copy(tmp_path, monkeypatch, staged_left):
    """A save of a step that has a checkpoint parks the old one, then renames the new one into place. Killed
    between the two renames (a second preemption right after a resume saves the same step again), the folder
    held no checkpoint-5: auto resumed checkpoint-3, and the next save removed both copies (issue 44, read in
    the code). The next holder of the folder now puts the new copy in place (or the parked one back)."""
    run = save_steps(tmp_path, [3, 5])
    run[5].log_history.append({"step": 5, "loss": 1.0})
    real_replace, renames = os.replace, []

    def killed_after_parking(source, target):
        renames.append(Path(target).name)
        if Path(target).name == "checkpoint-5":
            raise Killed
        real_replace(source, target)

    monkeypatch.setattr(os, "replace", killed_after_parking)
    with pytest.raises(Killed):
        save_checkpoint(run[0], tmp_path, 5, progress=run[5].state_dict())
    monkeypatch.setattr(os, "replace", real_replace)
    assert renames[-2:] == [".replaced-checkpoint-5", "checkpoint-5"]
    if not staged_left:  # only the parked copy is left: it goes back
        shutil.rmtree(tmp_path / ".tmp-checkpoint-5")
    with run_folder_lock(tmp_path, finish_interrupted_replace):
        pass
    assert sorted(path.name for path in tmp_path.iterdir()) == ["checkpoint-3", "checkpoint-5"]
    check_run_folder(tmp_path, resume_from_checkpoint="auto", overwrite_output_dir=False)
    assert resolve_resume_checkpoint(tmp_path, "auto") == tmp_path / "checkpoint-5"  # verified whole
    reloaded = build_run()
    reloaded[5].load_state_dict(load_checkpoint(reloaded[0], tmp_path / "checkpoint-5"))
    assert reloaded[5].log_history == ([{"step": 5, "loss": 1.0}] if staged_left else [])


def test_a_checkpoint_killed_while_being_pruned_is_not_put_back(tmp_path, monkeypatch):
    save_steps(tmp_path, [2, 4])
    monkeypatch.setattr(shutil, "rmtree", mock.Mock(side_effect=Killed))
    with pytest.raises(Killed):
        save_steps(tmp_path, [6], total_limit=2)
    monkeypatch.undo()
    with run_folder_lock(tmp_path, finish_interrupted_replace):
        pass
    assert [path.name for path in find_checkpoints(tmp_path)] == ["checkpoint-4", "checkpoint-6"]


def test_interrupted_save_leaves_previous_checkpoint_latest(tmp_path):
    run = save_steps(tmp_path, [3])
    # A process killed during save_state of step 6: temp folder with partial files, never renamed.
    interrupted = tmp_path / ".tmp-checkpoint-6"
    interrupted.mkdir()
    (interrupted / "model.safetensors").write_bytes(b"\x00" * 10)
    assert find_checkpoints(tmp_path) == [tmp_path / "checkpoint-3"]
    assert resolve_resume_checkpoint(tmp_path, "latest") == tmp_path / "checkpoint-3"
    resume(build_run(), tmp_path / "checkpoint-3")
    # A process killed after the rename but before the manifest cannot happen (manifest is written first);
    # a folder without one is treated as incomplete anyway.
    (tmp_path / "checkpoint-9").mkdir()
    assert resolve_resume_checkpoint(tmp_path, "latest") == tmp_path / "checkpoint-3"
    shutil.rmtree(tmp_path / "checkpoint-9")
    # The next save cleans the leftover temp folder.
    save_checkpoint(run[0], tmp_path, 6, progress=run[5].state_dict())
    assert sorted(path.name for path in tmp_path.iterdir()) == ["checkpoint-3", "checkpoint-6"]


@pytest.mark.parametrize(
    ("damage", "expected_problem"),
    [
        (lambda path: path.write_bytes(path.read_bytes()[:-5]), "optimizer.bin is truncated"),
        (
            lambda path: path.write_bytes(bytes([path.read_bytes()[0] ^ 1]) + path.read_bytes()[1:]),
            "optimizer.bin is corrupted",
        ),
        (os.remove, "optimizer.bin is missing"),
    ],
)
def test_damaged_checkpoint_is_refused_with_the_fix(tmp_path, damage, expected_problem):
    save_steps(tmp_path, [4, 8])
    damage(tmp_path / "checkpoint-8" / "optimizer.bin")
    with pytest.raises(CheckpointError) as raised:
        resolve_resume_checkpoint(tmp_path, "latest")
    message = str(raised.value)
    assert expected_problem in message
    assert f"--resume_from_checkpoint {tmp_path / 'checkpoint-4'}" in message
    verify_checkpoint(tmp_path / "checkpoint-4")  # the earlier one is intact
    with pytest.raises(CheckpointError, match=expected_problem):
        resolve_resume_checkpoint(tmp_path, str(tmp_path / "checkpoint-8"))


def test_missing_or_garbled_manifest_is_refused(tmp_path):
    save_steps(tmp_path, [4])
    (tmp_path / "checkpoint-4" / MANIFEST_NAME).write_text("{not json")
    with pytest.raises(
        CheckpointError, match=r"checkpoint_manifest\.json is not valid JSON.*--overwrite_output_dir"
    ):
        verify_checkpoint(tmp_path / "checkpoint-4")
    os.remove(tmp_path / "checkpoint-4" / MANIFEST_NAME)
    with pytest.raises(CheckpointError, match=r"is incomplete: checkpoint_manifest\.json is missing"):
        verify_checkpoint(tmp_path / "checkpoint-4")


def test_resume_argument_errors(tmp_path):
    with pytest.raises(CheckpointError, match="holds no complete checkpoint"):
        resolve_resume_checkpoint(tmp_path, "latest")
    with pytest.raises(CheckpointError, match="no such folder"):
        resolve_resume_checkpoint(tmp_path, str(tmp_path / "checkpoint-3"))
    with pytest.raises(CheckpointError, match="is not a checkpoint folder"):
        resolve_resume_checkpoint(tmp_path, str(tmp_path))


def test_a_checkpoint_of_another_process_count_loads(tmp_path):
    """Model and optimizer states are replicated under DDP, so they load on any number of processes; the
    data position and the global batch are `hfbert.pretraining.extras.reshard`'s (tests/test_reshard.py)."""
    run = save_steps(tmp_path, [2])
    run[5].micro_batches_in_epoch = 6
    save_checkpoint(run[0], tmp_path, 2, progress=run[5].state_dict())
    manifest_path = tmp_path / "checkpoint-2" / MANIFEST_NAME
    manifest = json.loads(manifest_path.read_text())
    manifest["num_processes"] = 4
    write_json_atomic(manifest_path, manifest)
    resumed = build_run()
    resumed[5].load_state_dict(load_checkpoint(resumed[0], tmp_path / "checkpoint-2"))
    assert resumed[5].micro_batches_in_epoch == 6


def as_main_wrote_it(checkpoint: Path, write=None) -> None:
    """Turn a checkpoint into the layout of the hfbert issue 64 was filed on (88be5f0): its progress pickled by
    accelerate into custom_checkpoint_0.pkl, no training_progress.json (`write`, if given, writes the pickle
    instead: a checkpoint written so); its manifest written anew."""
    progress_json = checkpoint / PROGRESS_JSON
    if progress_json.is_file():
        torch.save(json.loads(progress_json.read_text()), checkpoint / PROGRESS_PICKLE)
        progress_json.unlink()
    if write is not None:
        write(checkpoint / PROGRESS_PICKLE)
    (checkpoint / MANIFEST_NAME).unlink()
    _write_manifest(checkpoint, checkpoint_step(checkpoint), 1)


def test_a_position_counted_per_process_by_an_older_hfbert_is_refused_naming_the_version(tmp_path):
    """The progress a checkpoint of 42c2de9 or later holds (a global `micro_batches_in_epoch`) resumes; an
    hfbert before it counted `batch_in_epoch` per process: refused in one line when the checkpoint is
    resolved, before any work."""
    save_steps(tmp_path, [3, 4])
    checkpoint = tmp_path / "checkpoint-4"
    assert resolve_resume_checkpoint(tmp_path, "latest") == checkpoint
    older = {"completed_steps": 4, "epoch": 1, "batch_in_epoch": 5, "log_history": [], "train_seconds": 1.0}
    as_main_wrote_it(checkpoint, partial(torch.save, older))
    verify_checkpoint(checkpoint)  # whole: it matches its manifest
    with pytest.raises(CheckpointError) as refused:
        resolve_resume_checkpoint(tmp_path, "latest")
    assert str(refused.value) == (
        f"Checkpoint {checkpoint} was written by an hfbert before commit 42e5a0a (its data position counts "
        "batches per process): resume it with that hfbert, or start the run over with --overwrite_output_dir"
    )
    save_steps(tmp_path, [4])  # this format again, cut short as it was written
    as_main_wrote_it(checkpoint, partial(damage, how="truncated"))
    with pytest.raises(CheckpointError) as refused:  # written damaged: named, not a traceback
        resolve_resume_checkpoint(tmp_path, "latest")
    assert f"{PROGRESS_PICKLE}: " in str(refused.value)
    assert f"--resume_from_checkpoint {tmp_path / 'checkpoint-3'}" in str(refused.value)


def test_automatic_checkpoint_naming_is_refused(tmp_path):
    accelerator = build_run(
        project_config=ProjectConfiguration(project_dir=str(tmp_path), automatic_checkpoint_naming=True)
    )[0]
    with pytest.raises(CheckpointError) as refused:
        save_checkpoint(accelerator, tmp_path, 1, progress=TrainingProgress().state_dict())
    assert str(refused.value) == (
        "Accelerator was built with ProjectConfiguration(automatic_checkpoint_naming=True); hfbert names, "
        "writes and prunes checkpoints itself: build the Accelerator without automatic_checkpoint_naming "
        "and total_limit"
    )
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("previous_output", ["checkpoint-5", "model.safetensors", "config.json"])
def test_output_dir_of_another_run_is_refused(tmp_path, previous_output):
    if previous_output == "checkpoint-5":
        (tmp_path / previous_output).mkdir()
        _write_manifest(tmp_path / previous_output, 5, 1)
    else:  # published by a final folder: a file
        (tmp_path / previous_output).write_bytes(b"{}")
        (tmp_path / FINAL_RECORD).write_text(json.dumps([previous_output]))
    before = sorted(Path(tmp_path).rglob("*"))
    with pytest.raises(
        CheckpointError,
        match=rf"already holds another run's output \({previous_output}\).*--overwrite_output_dir",
    ):
        check_run_folder(tmp_path, resume_from_checkpoint=None, overwrite_output_dir=False)
    check_run_folder(tmp_path, resume_from_checkpoint="latest", overwrite_output_dir=False)
    check_run_folder(tmp_path, resume_from_checkpoint=None, overwrite_output_dir=True)
    assert sorted(Path(tmp_path).rglob("*")) == before  # nothing deleted


@pytest.mark.parametrize("leftover", [".tmp-checkpoint-5", ".tokenizer", ".final-ready"])
def test_an_interrupted_run_without_a_complete_checkpoint_needs_overwrite(tmp_path, leftover):
    (tmp_path / leftover).mkdir()
    with pytest.raises(CheckpointError, match=r"interrupted run with no complete checkpoint.*--overwrite_output_dir"):
        check_run_folder(tmp_path, resume_from_checkpoint=None, overwrite_output_dir=False)
    with pytest.raises(CheckpointError, match=r"no complete checkpoint.*--overwrite_output_dir"):
        resolve_resume_checkpoint(tmp_path, "latest")



def test_overwrite_output_dir_refuses_a_folder_holding_what_hfbert_did_not_write(tmp_path):
    """Issue 64, item 2: a Trainer's checkpoint-7 (no manifest) was deleted and the user's README.md and
    config.json replaced, without a log line."""
    (tmp_path / "checkpoint-7").mkdir()
    (tmp_path / "checkpoint-7" / "trainer_state.json").write_text("{}")
    (tmp_path / "README.md").write_text("my notes")
    (tmp_path / "config.json").write_text("{}")
    save_steps(tmp_path, [4])  # hfbert's own checkpoint beside them: replaced, as asked
    (tmp_path / ".tmp-checkpoint-6").mkdir()  # and an interrupted save of it
    with pytest.raises(CheckpointError) as refused:
        check_run_folder(tmp_path, resume_from_checkpoint=None, overwrite_output_dir=True)
    assert str(refused.value) == (
        f"--overwrite_output_dir replaces only what hfbert wrote in {tmp_path} (checkpoints with a "
        f"{MANIFEST_NAME}, the files its final folder lists in {FINAL_RECORD}), and it also holds README.md, "
        f"checkpoint-7 (no {MANIFEST_NAME}), config.json: move them out of it, or pass a new --output_dir"
    )
    (tmp_path / FINAL_RECORD).write_text(json.dumps(["README.md", "config.json", "model.safetensors"]))
    shutil.rmtree(tmp_path / "checkpoint-7")
    check_run_folder(tmp_path, resume_from_checkpoint=None, overwrite_output_dir=True)  # all of it hfbert's


def test_resuming_another_folders_checkpoint_into_a_finished_run_is_refused_naming_it(tmp_path):
    other, finished = tmp_path / "A" / "checkpoint-20", tmp_path / "B"
    finished.mkdir()
    for name in ("model.safetensors", "config.json", "tokenizer.json"):
        (finished / name).write_text("B's")
    (finished / "training_args.json").write_text(json.dumps({"corpus": "b.txt"}))
    (finished / "eval_results.json").write_text(json.dumps({"step": 30}))
    (finished / FINAL_RECORD).write_text(json.dumps(sorted(path.name for path in finished.iterdir())))
    with pytest.raises(CheckpointError) as error:
        check_run_folder(finished, resume_from_checkpoint=str(other), overwrite_output_dir=False)
    assert str(error.value).startswith(
        f"--output_dir {finished} already holds another run (config.json, eval_results.json, model.safetensors, "
        f"tokenizer.json, training_args.json; corpus b.txt, step 30), and --resume_from_checkpoint {other} is not "
        "one of its checkpoints"
    )
    assert str(error.value).endswith("--overwrite_output_dir to replace it")
    check_run_folder(finished, resume_from_checkpoint=str(other), overwrite_output_dir=True)  # replaced, as asked
    check_run_folder(tmp_path / "new", resume_from_checkpoint=str(other), overwrite_output_dir=False)
    own = finished / "checkpoint-30"
    check_run_folder(finished, resume_from_checkpoint=str(own), overwrite_output_dir=False)
    with pytest.raises(CheckpointError, match="pass only one of them"):
        check_run_folder(finished, resume_from_checkpoint=str(own), overwrite_output_dir=True)


def test_auto_resumes_the_newest_checkpoint_or_starts_over_an_interrupted_run(tmp_path):
    def auto(folder):
        check_run_folder(folder, resume_from_checkpoint="auto", overwrite_output_dir=False)
        return resolve_resume_checkpoint(folder, "auto")

    assert auto(tmp_path / "new") is None
    for leftover in (".tokenizer", ".tmp-checkpoint-5", RUN_LOCK_NAME):  # no complete checkpoint (for checkpoint-7 without
        # a manifest, not hfbert's: test_auto_and_latest_never_start_over_a_checkpoint_hfbert_did_not_write)
        (tmp_path / leftover).mkdir()
    assert auto(tmp_path) is None
    save_steps(tmp_path, [2, 4])
    assert auto(tmp_path) == tmp_path / "checkpoint-4"
    with pytest.raises(CheckpointError, match="pass only one of them"):
        check_run_folder(tmp_path, resume_from_checkpoint="auto", overwrite_output_dir=True)
    finished, mine = tmp_path / "finished", tmp_path / "mine"
    for folder, name in ((finished, "model.safetensors"), (mine, "notes.txt")):
        folder.mkdir()
        (folder / name).write_text("keep")
    with pytest.raises(CheckpointError, match=r"auto: .*finished holds a finished run without checkpoints"):
        auto(finished)
    with pytest.raises(CheckpointError, match=r"auto: .*mine holds no complete checkpoint and what hfbert did not write \(notes.txt\)"):
        auto(mine)

def test_output_dir_checks(tmp_path):
    check_run_folder(tmp_path / "new", resume_from_checkpoint=None, overwrite_output_dir=False)
    check_run_folder(tmp_path, resume_from_checkpoint=None, overwrite_output_dir=False)  # empty
    (tmp_path / "notes.txt").write_text("the user's")
    with pytest.raises(CheckpointError, match=r"not empty and holds no hfbert run \(notes.txt\)"):
        check_run_folder(tmp_path, resume_from_checkpoint=None, overwrite_output_dir=False)
    with pytest.raises(CheckpointError, match=r"hfbert wrote in .*, and it also holds notes.txt: move them out"):
        check_run_folder(tmp_path, resume_from_checkpoint=None, overwrite_output_dir=True)
    with pytest.raises(CheckpointError) as refused:
        check_run_folder(tmp_path, resume_from_checkpoint="latest", overwrite_output_dir=True)
    assert str(refused.value) == (
        "--resume_from_checkpoint and --overwrite_output_dir contradict each other (overwriting removes the "
        "checkpoints to resume from); pass only one of them"
    )
    with pytest.raises(CheckpointError, match=r"notes.txt is a file, not a folder"):
        check_run_folder(tmp_path / "notes.txt", resume_from_checkpoint=None, overwrite_output_dir=False)


def test_latest_says_which_incomplete_checkpoint_it_skips(tmp_path, caplog):
    save_steps(tmp_path, [1, 2])
    (tmp_path / "checkpoint-2" / MANIFEST_NAME).unlink()
    with caplog.at_level("WARNING"):
        assert resolve_resume_checkpoint(tmp_path, "latest").name == "checkpoint-1"
    assert "Skipping incomplete checkpoint folder(s) checkpoint-2" in caplog.text


def test_a_failed_save_names_the_cause_and_keeps_earlier_checkpoints(tmp_path):
    save_steps(tmp_path, [1])
    accelerator = build_run()[0]
    with (
        mock.patch.object(accelerator, "save_state", side_effect=RuntimeError("unexpected pos 64 vs 0")),
        pytest.raises(CheckpointWriteError, match=r"writing .*checkpoint-2 failed.*unexpected pos.*checkpoint-1 is intact"),
    ):
        save_checkpoint(accelerator, tmp_path, 2, progress=TrainingProgress().state_dict())
    assert [path.name for path in tmp_path.iterdir()] == ["checkpoint-1"]



@pytest.mark.parametrize(
    "error",
    [
        SafetensorError("Error while serializing: I/O error: No space left on device (os error 28)"),
        OSError(errno.ENOSPC, "No space left on device"),
    ],
    ids=["safetensors", "oserror"],
)
def test_a_full_disk_while_writing_the_weights_names_the_intact_checkpoint(tmp_path, error):
    save_steps(tmp_path, [1])
    accelerator = build_run()[0]

    def write_then_fail(tensors, filename, metadata=None):  # a part of the file made it to disk
        Path(filename).write_bytes(b"\0" * 100)
        raise error

    # safetensors' error is no OSError: it escaped the save's handler and left .tmp-checkpoint-2 behind.
    with (
        mock.patch("accelerate.utils.other.safe_save_file", write_then_fail),
        pytest.raises(CheckpointWriteError) as raised,
    ):
        save_checkpoint(accelerator, tmp_path, 2, progress=TrainingProgress().state_dict())
    assert str(raised.value) == (
        f"no space left writing {tmp_path / 'checkpoint-2'}; the last complete checkpoint {tmp_path / 'checkpoint-1'} "
        f"is intact; free space (`df -h {tmp_path}`, or lower --checkpoints_total_limit) and resume with the same "
        "command plus --resume_from_checkpoint latest"
    )
    assert [path.name for path in tmp_path.iterdir()] == ["checkpoint-1"]

def test_a_full_disk_while_writing_the_tokenizer_names_the_intact_checkpoint(tmp_path):
    """The soak's trials 4002946220 and 1594818867: the tokenizers library reports a full disk as a plain
    Exception ("... (os error 28)"), which escaped the save's handler as a traceback."""
    save_steps(tmp_path, [1])
    accelerator = build_run()[0]
    tokenizer = mock.Mock()
    tokenizer.save_pretrained.side_effect = Exception("No space left on device (os error 28)")  # its very type
    with pytest.raises(CheckpointWriteError, match=r"^no space left writing .*checkpoint-1 is intact; free space"):
        save_checkpoint(accelerator, tmp_path, 2, tokenizer=tokenizer, progress=TrainingProgress().state_dict())
    assert [path.name for path in tmp_path.iterdir()] == ["checkpoint-1"]
    tokenizer.save_pretrained.side_effect = Exception("a bug of the tokenizers library")
    with pytest.raises(Exception, match="a bug of the tokenizers library"):  # not taken for a write failure
        save_checkpoint(accelerator, tmp_path, 2, tokenizer=tokenizer, progress=TrainingProgress().state_dict())


def test_remove_checkpoints_for_overwrite(tmp_path):
    save_steps(tmp_path, [1, 2])
    (tmp_path / ".tmp-checkpoint-3").mkdir()
    (tmp_path / "notes.txt").write_text("kept")
    removed = remove_checkpoints(tmp_path)
    assert [path.name for path in removed] == [".tmp-checkpoint-3", "checkpoint-1", "checkpoint-2"]
    assert [path.name for path in tmp_path.iterdir()] == ["notes.txt"]


# ----------------------------------------------------------------------------------------------- one run per folder


def test_the_lock_file_is_not_one_of_the_users_files(tmp_path):
    (tmp_path / RUN_LOCK_NAME).write_text("{}")
    check_run_folder(tmp_path, resume_from_checkpoint=None, overwrite_output_dir=False)
    (tmp_path / "notes.txt").write_text("mine")
    with pytest.raises(CheckpointError, match=r"holds no hfbert run \(notes.txt\)"):
        check_run_folder(tmp_path, resume_from_checkpoint=None, overwrite_output_dir=False)


# ----------------------------------------------------------------------------------------------- damaged files


class RunsCode:
    """What a rewritten checkpoint file could hold: a pickle that runs code when it is loaded (writes `marker`)."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return exec, (f"open({str(self.marker)!r}, 'w').write('ran')",)


@pytest.mark.parametrize("name", [PROGRESS_PICKLE, "random_states_0.pkl", "optimizer.bin"])
def test_a_checkpoint_file_rewritten_to_run_code_is_refused_on_resume_without_running_it(tmp_path, name):
    """Issue 64, item 7: a checkpoint whose pickle and manifest entry were both rewritten ran the pickle's code
    on resume (the progress was read with weights_only=False; a bad RNG file was skipped silently)."""
    save_steps(tmp_path, [2, 4])
    checkpoint, marker = tmp_path / "checkpoint-4", tmp_path / "ran"
    as_main_wrote_it(checkpoint)
    torch.save(RunsCode(marker), checkpoint / name)
    as_main_wrote_it(checkpoint)
    with pytest.raises(CheckpointError) as refused:
        resume(build_run(), resolve_resume_checkpoint(tmp_path, "latest"))
    assert not marker.exists()
    assert str(refused.value).startswith(f"Checkpoint {checkpoint} cannot be resumed: {name} needs exec to load ")
    assert f"--resume_from_checkpoint {tmp_path / 'checkpoint-2'}" in str(refused.value)


def test_an_rng_file_accelerate_would_skip_is_refused_as_a_resume_that_cannot_be_exact(tmp_path):
    """Issue 64, item 5: accelerate's load_state skips an RNG file it cannot restore silently (the attack: exit 0,
    weights 1.2e-4 from the straight run's)."""
    save_steps(tmp_path, [2, 4])
    checkpoint = tmp_path / "checkpoint-4"
    states = load_plain_data(checkpoint, "random_states_0.pkl")
    torch.save({name: value for name, value in states.items() if name != "torch_manual_seed"}, checkpoint / "random_states_0.pkl")
    as_main_wrote_it(checkpoint)
    with pytest.raises(CheckpointError) as refused:  # before any work: where the checkpoint is resolved
        resolve_resume_checkpoint(tmp_path, "latest")
    assert str(refused.value).startswith(
        f"Checkpoint {checkpoint} cannot be resumed exactly: random_states_0.pkl holds no torch_manual_seed (the "
        "RNG streams of dropout would start elsewhere than where the run left them); resume from an earlier "
        f"checkpoint instead, e.g. --resume_from_checkpoint {tmp_path / 'checkpoint-2'}"
    )


def listing(folder: Path) -> dict[str, int]:
    return {str(path.relative_to(folder)): path.stat().st_mtime_ns for path in folder.rglob("*")}


TINY_RUN_SETTINGS = {RUN_SETTINGS_NAME: {"model": {"model_size": "tiny"}}}


@pytest.mark.parametrize("how", DAMAGES)
@pytest.mark.parametrize(
    "name", ["model.safetensors", "optimizer.bin", PROGRESS_JSON, "run_settings.json", MANIFEST_NAME]
)
def test_a_damaged_checkpoint_file_is_named_on_resume(tmp_path, name, how):
    run = build_run()
    for step in (4, 8):
        save_checkpoint(run[0], tmp_path, step, json_files=TINY_RUN_SETTINGS, progress=run[5].state_dict())
    damage(tmp_path / "checkpoint-8" / name, how)
    before = listing(tmp_path)
    with pytest.raises(CheckpointError) as refused:
        resolve_resume_checkpoint(tmp_path, str(tmp_path / "checkpoint-8"))
    message = str(refused.value)
    assert name in message and f"--resume_from_checkpoint {tmp_path / 'checkpoint-4'}" in message
    assert listing(tmp_path) == before


@pytest.mark.parametrize(
    ("name", "how"),
    [
        ("model.safetensors", "truncated"),
        ("model.safetensors", "garbled"),
        ("optimizer.bin", "truncated"),  # 8 garbled bytes in a zip's local header do not stop torch.load
        (PROGRESS_JSON, "truncated"),
    ],
)
def test_a_checkpoint_written_damaged_is_named_on_load(tmp_path, name, how):
    # The manifest matches the damaged file (it was written so), so only loading can tell.
    save_steps(tmp_path, [4, 8])
    damage(tmp_path / "checkpoint-8" / name, how)
    (tmp_path / "checkpoint-8" / MANIFEST_NAME).unlink()
    _write_manifest(tmp_path / "checkpoint-8", 8, 1)
    verify_checkpoint(tmp_path / "checkpoint-8")
    with pytest.raises(CheckpointError) as refused:
        resume(build_run(), tmp_path / "checkpoint-8")
    message = str(refused.value)
    assert "checkpoint-8" in message and f"--resume_from_checkpoint {tmp_path / 'checkpoint-4'}" in message
    assert f"{tmp_path / 'checkpoint-8' / name} is " in message


@pytest.mark.parametrize("how", DAMAGES)
def test_damaged_run_settings_are_named(tmp_path, how):
    run = build_run()
    save_checkpoint(run[0], tmp_path, 4, json_files=TINY_RUN_SETTINGS, progress=run[5].state_dict())
    damage(tmp_path / "checkpoint-4" / "run_settings.json", how)
    with pytest.raises(CheckpointError, match=r"run_settings\.json is (truncated|not valid JSON).*--overwrite"):
        read_run_settings(tmp_path / "checkpoint-4")


# ----------------------------------------------------------------------------------------------- messages


def test_the_relaunch_command_is_accelerate_s_on_a_gpu_and_torchrun_s_on_a_cpu():
    from hfbert.checkpointing import relaunch_command

    assert relaunch_command(4, cpu=False) == "accelerate launch --num_processes 4 run_pretraining.py ..."
    assert relaunch_command(2, cpu=True) == "ACCELERATE_USE_CPU=1 torchrun --nproc_per_node 2 run_pretraining.py ..."


def complete_checkpoint(output_dir, step, **tensors):
    from safetensors.torch import save_file

    folder = output_dir / f"checkpoint-{step}"
    folder.mkdir(parents=True)
    save_file(tensors, folder / "model.safetensors")
    _write_manifest(folder, step, 1)
    return folder


def test_a_nan_stop_names_the_newest_checkpoint_whose_weights_are_all_finite(tmp_path):
    from hfbert.checkpointing import last_finite_checkpoint_note

    assert last_finite_checkpoint_note(tmp_path) == ""
    complete_checkpoint(tmp_path, 2, w=torch.tensor([1.0, -3.0]), b=torch.tensor([0.5]))
    finite = complete_checkpoint(tmp_path, 4, w=torch.tensor([1.0, -250.0]), b=torch.tensor([0.5]), e=torch.zeros(0))
    complete_checkpoint(tmp_path, 6, w=torch.tensor([1.0, float("nan")]), b=torch.tensor([0.5]))
    assert last_finite_checkpoint_note(tmp_path) == (
        f" The last checkpoint whose weights are all finite is {finite} (largest |weight| 250)."
    )


def test_auto_starts_over_only_where_no_complete_checkpoint_exists(tmp_path):
    from hfbert.checkpointing import starts_over_with_auto

    assert starts_over_with_auto(tmp_path, "auto") and not starts_over_with_auto(tmp_path, "latest")
    assert not starts_over_with_auto(tmp_path, None)
    complete_checkpoint(tmp_path, 2, w=torch.ones(1))
    assert not starts_over_with_auto(tmp_path, "auto")


@pytest.mark.parametrize("count", [6, 7])
def test_a_refusal_lists_six_names_of_a_run_folder_and_says_when_there_are_more(tmp_path, count):
    other, finished = tmp_path / "A" / "checkpoint-20", tmp_path / "B"
    finished.mkdir()
    names = ["config.json", "model.safetensors", "a.txt", "b.txt", "c.txt", "d.txt", "e.txt"][:count]
    for name in names:
        (finished / name).write_text("B's")
    shown = ", ".join(sorted(names)[:6]) + (", ..." if count > 6 else "")
    with pytest.raises(CheckpointError, match=rf"already holds another run \({shown}\), and "):
        check_run_folder(finished, resume_from_checkpoint=str(other), overwrite_output_dir=False)


def test_a_failed_write_on_a_nearly_full_disk_is_named_a_full_disk(tmp_path):
    from hfbert.checkpointing import write_failure_message
    from hfbert.files import NEARLY_FULL_BYTES

    save_steps(tmp_path, [1])
    error = RuntimeError("unexpected pos 138880 vs 138768")  # torch.save's way to say the disk is full
    with mock.patch("hfbert.files.shutil.disk_usage", return_value=mock.Mock(free=NEARLY_FULL_BYTES // 2)):
        message = write_failure_message(error, tmp_path / "checkpoint-2", tmp_path)
    assert message.startswith(f"no space left writing {tmp_path / 'checkpoint-2'}; ")
    assert f"free space (`df -h {tmp_path}`, or lower --checkpoints_total_limit)" in message


def test_latest_with_only_interrupted_saves_names_them_and_how_to_start_over(tmp_path, caplog):
    for leftover in (".tmp-checkpoint-5", "checkpoint-7"):
        (tmp_path / leftover).mkdir()
    with pytest.raises(CheckpointError) as refused:
        resolve_resume_checkpoint(tmp_path, "latest")
    assert str(refused.value) == (
        f"--resume_from_checkpoint latest: {tmp_path} holds no complete checkpoint (only interrupted saves: "
        f".tmp-checkpoint-5); there is nothing to resume: move checkpoint-7 (no {MANIFEST_NAME}) out of it (hfbert "
        "did not write it), then start the run over with the same command without --resume_from_checkpoint, plus --overwrite_output_dir (or use --resume_from_checkpoint auto, "
        "which starts over when there is no checkpoint)"
    )
    shutil.rmtree(tmp_path / "checkpoint-7")
    save_steps(tmp_path, [5])
    (tmp_path / ".tmp-checkpoint-5").mkdir()  # an interrupted save of the same step: nothing newer is skipped
    with caplog.at_level("WARNING"):
        assert resolve_resume_checkpoint(tmp_path, "latest").name == "checkpoint-5"
    assert "Skipping" not in caplog.text



def test_the_fix_for_a_bad_checkpoint_names_the_earlier_complete_ones_or_a_fresh_start(tmp_path):
    from hfbert.checkpointing import _earlier_checkpoints_hint

    assert _earlier_checkpoints_hint(tmp_path / "checkpoint-2") == (
        "no earlier complete checkpoint exists next to it; start a fresh run with --overwrite_output_dir "
        "or a new --output_dir"
    )
    save_steps(tmp_path, [2, 4, 6])
    assert _earlier_checkpoints_hint(tmp_path / "checkpoint-6") == (
        f"resume from an earlier checkpoint instead, e.g. --resume_from_checkpoint {tmp_path / 'checkpoint-4'} "
        "(complete checkpoints: checkpoint-2, checkpoint-4)"
    )


def test_a_manifest_of_another_format_or_a_missing_folder_is_refused_naming_it(tmp_path):
    save_steps(tmp_path, [4])
    manifest_path = tmp_path / "checkpoint-4" / MANIFEST_NAME
    write_json_atomic(manifest_path, json.loads(manifest_path.read_text()) | {"format_version": 99})
    with pytest.raises(CheckpointError, match=r"has an unknown manifest format \(format_version 99, expected 1\); "):
        verify_checkpoint(tmp_path / "checkpoint-4")
    with pytest.raises(CheckpointError) as refused:
        verify_checkpoint(tmp_path / "checkpoint-9")
    assert str(refused.value) == (
        f"--resume_from_checkpoint {tmp_path / 'checkpoint-9'}: no such folder; pass an existing "
        "'checkpoint-<step>' folder or 'latest'"
    )


def test_a_save_makes_missing_parents_keeps_one_checkpoint_at_limit_1_and_adds_json_files(tmp_path):
    output_dir = tmp_path / "runs" / "a"
    run = save_steps(output_dir, [2, 4], total_limit=1)
    assert [path.name for path in output_dir.iterdir()] == ["checkpoint-4"]
    stream_state = {"stream_state.json": {"offset": 12}}
    checkpoint = save_checkpoint(run[0], output_dir, 6, total_limit=1, json_files=stream_state, progress=run[5].state_dict())
    assert json.loads((checkpoint / "stream_state.json").read_text()) == {"offset": 12}
    assert "stream_state.json" in json.loads((checkpoint / MANIFEST_NAME).read_text())["files"]
    # The model's config beside the weights: a checkpoint is a folder --model_name_or_path can start from.
    config = HfBertConfig.from_preset("tiny", vocab_size=123)
    checkpoint = save_checkpoint(run[0], output_dir, 7, total_limit=1, model_config=config, progress=run[5].state_dict())
    assert HfBertConfig.from_pretrained(checkpoint).vocab_size == 123
    assert "config.json" in json.loads((checkpoint / MANIFEST_NAME).read_text())["files"]
    with pytest.raises(CheckpointError, match=r"^--checkpoints_total_limit 0 must be >= 1 \(or unset to keep all\)$"):
        save_checkpoint(run[0], output_dir, 8, total_limit=0, progress=run[5].state_dict())


def test_a_checkpoint_is_a_model_folder_with_its_tokenizer_config_and_code_beside_the_weights(tmp_path, sample_tokenizer):
    config = HfBertConfig.from_preset("tiny", vocab_size=len(sample_tokenizer))
    run = build_run()
    checkpoint = save_checkpoint(run[0], tmp_path, 3, progress=run[5].state_dict(), tokenizer=sample_tokenizer, model_config=config)
    model_files = {"config.json", "configuration_hfbert.py", "modeling_hfbert.py", "tokenizer.json", "tokenizer_config.json"}
    assert model_files <= {path.name for path in checkpoint.iterdir()}
    assert model_files <= set(json.loads((checkpoint / MANIFEST_NAME).read_text())["files"])
    assert json.loads((checkpoint / "config.json").read_text())["auto_map"] == AUTO_MAP  # every Auto class
    assert getattr(config, "auto_map", None) is None  # the run's own config is left as it was
    assert tokenizer_folder(checkpoint) == checkpoint
    # An hfbert up to 88be5f0 kept the tokenizer in tokenizer/, where it is still found; a folder without one has none.
    (checkpoint / TOKENIZER_FOLDER).mkdir()
    for name in ("tokenizer.json", "tokenizer_config.json"):
        (checkpoint / name).rename(checkpoint / TOKENIZER_FOLDER / name)
    assert tokenizer_folder(checkpoint) == checkpoint / TOKENIZER_FOLDER
    shutil.rmtree(checkpoint / TOKENIZER_FOLDER)
    assert tokenizer_folder(checkpoint) is None


def test_each_refused_run_folder_is_told_whole(tmp_path):
    def refusal(folder):
        with pytest.raises(CheckpointError) as refused:
            check_run_folder(folder, resume_from_checkpoint=None, overwrite_output_dir=False)
        return str(refused.value)

    finished, interrupted, mine = tmp_path / "finished", tmp_path / "interrupted", tmp_path / "mine"
    for folder, names in ((finished, ["config.json", "model.safetensors"]), (interrupted, [".tokenizer", ".tmp-checkpoint-5"])):
        folder.mkdir()
        for name in names:
            (folder / name).mkdir()
    mine.mkdir()
    for index in range(6):
        (mine / f"notes{index}.txt").write_text("mine")
    assert refusal(finished) == (
        f"--output_dir {finished} already holds another run's output (config.json, model.safetensors); pass "
        "--resume_from_checkpoint latest to continue that run, --overwrite_output_dir to replace it, or a "
        "new --output_dir"
    )
    assert refusal(interrupted) == (
        f"--output_dir {interrupted} holds an interrupted run with no complete checkpoint (.tmp-checkpoint-5, "
        ".tokenizer); nothing can be resumed: pass --overwrite_output_dir to start it over, or a new --output_dir"
    )
    assert refusal(mine) == (
        f"--output_dir {mine} is not empty and holds no hfbert run (notes0.txt, notes1.txt, notes2.txt, notes3.txt, "
        "notes4.txt, ...); pass a new or empty --output_dir"
    )
    (mine / "notes5.txt").unlink()
    assert "(notes0.txt, notes1.txt, notes2.txt, notes3.txt, notes4.txt); pass" in refusal(mine)


class OneOfTwo:
    """What write_on_every_process uses of the Accelerator of one process of two."""

    num_processes = 2

    def __init__(self, is_main_process: bool):
        self.is_main_process = is_main_process


def test_when_one_process_fails_to_write_its_part_every_process_stops_with_its_refusal(tmp_path, monkeypatch):
    """The soak's trial 3532446025 (issue 44, finding 6): rank 0 stopped on a full disk alone, and rank 1, left in
    the checkpoint's next collective, stopped with gloo's 'Connection closed by peer' as its refusal."""
    from hfbert import checkpointing

    output_dir, temp = tmp_path / "run", tmp_path / "run" / ".tmp-checkpoint-10"
    temp.mkdir(parents=True)
    full = OSError(errno.ENOSPC, "No space left on device")

    def no_space() -> None:
        raise full

    def gathered(messages):  # the two processes' messages, this one's first
        return lambda mine: [mine[0], *messages]

    # The main process failed; the other, with nothing of its own to write, raises the main process's refusal.
    monkeypatch.setattr(checkpointing, "gather_object", gathered(["no space left writing ...checkpoint-10; ..."]))
    with pytest.raises(checkpointing.CheckpointWriteError, match=r"^no space left writing \.\.\.checkpoint-10"):
        checkpointing.write_on_every_process(OneOfTwo(False), None, output_dir / "checkpoint-10", output_dir, temp)
    assert temp.is_dir()  # only the main process removes the staged folder
    # The main process raises its own refusal, naming the disk, and removes the staged folder.
    monkeypatch.setattr(checkpointing, "gather_object", gathered([None]))
    with pytest.raises(checkpointing.CheckpointWriteError, match=r"no complete checkpoint exists yet\. Free space"):
        checkpointing.write_on_every_process(OneOfTwo(True), no_space, output_dir / "checkpoint-10", output_dir, temp)
    assert not temp.exists()
    # Written everywhere: nothing raised.
    checkpointing.write_on_every_process(OneOfTwo(True), lambda: None, output_dir / "checkpoint-10", output_dir, temp)

    # A process killed during the write (the soak's trial 3530063114): the others' refusal says that another
    # process stopped, not that this one's write failed with gloo's error and its source line.
    def peer_died(mine):
        raise RuntimeError(
            "[/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:553] Connection closed by peer "
            "[127.0.0.1]:22195. This is typically caused by a remote worker crashing. Check the logs of the remote "
            "worker before reporting an error. GLHF!"
        )

    monkeypatch.setattr(checkpointing, "gather_object", peer_died)
    with pytest.raises(checkpointing.CheckpointWriteError) as refusal:
        checkpointing.write_on_every_process(OneOfTwo(False), None, output_dir / "checkpoint-10", output_dir, temp)
    assert str(refusal.value).startswith(
        f"another process of the run stopped while {output_dir / 'checkpoint-10'} was being written (Connection "
        "closed by peer [127.0.0.1]:22195); its log names the cause. No complete checkpoint exists yet"
    ), refusal.value
    assert "pair.cc" not in str(refusal.value) and "GLHF" not in str(refusal.value)
    (output_dir / "checkpoint-7").mkdir()
    (output_dir / "checkpoint-7" / checkpointing.MANIFEST_NAME).write_text("{}")
    with pytest.raises(checkpointing.CheckpointWriteError, match=r"the last complete checkpoint .*checkpoint-7 is "
                       r"intact; resume with the same command plus --resume_from_checkpoint latest$"):  # fmt: skip
        checkpointing.write_on_every_process(OneOfTwo(True), lambda: None, output_dir / "checkpoint-10", output_dir, temp)


# ----------------------------------------------------------------------------------------------- only what hfbert wrote


def test_auto_and_latest_never_start_over_a_checkpoint_hfbert_did_not_write(tmp_path):
    """The attack on d734940, F1: `auto` started over a folder holding a Trainer's checkpoint-7 (no manifest) and
    deleted it; `latest` refused it but recommended `auto`."""
    (tmp_path / "checkpoint-7").mkdir()
    (tmp_path / "checkpoint-7" / "pytorch_model.bin").write_text("my trainer weights")
    (tmp_path / ".tmp-checkpoint-5").mkdir()  # hfbert's interrupted save beside it
    before = listing(tmp_path)
    with pytest.raises(CheckpointError) as refused:
        check_run_folder(tmp_path, resume_from_checkpoint="auto", overwrite_output_dir=False)
    assert str(refused.value) == (
        f"--resume_from_checkpoint auto: {tmp_path} holds no complete checkpoint and what hfbert did not write "
        f"(checkpoint-7 (no {MANIFEST_NAME})): move them out of it, or pass a new or empty --output_dir"
    )
    assert not starts_over_with_auto_removing(tmp_path)  # remove_checkpoints too keeps what has no manifest
    assert listing(tmp_path) == {name: mtime for name, mtime in before.items() if ".tmp" not in name}
    with pytest.raises(CheckpointError) as refused:
        resolve_resume_checkpoint(tmp_path, "latest")
    assert str(refused.value) == (
        f"--resume_from_checkpoint latest: {tmp_path} holds no complete checkpoint; there is nothing to resume: "
        f"move checkpoint-7 (no {MANIFEST_NAME}) out of it (hfbert did not write it), then start the run over "
        "with the same command without --resume_from_checkpoint, plus --overwrite_output_dir (or use "
        "--resume_from_checkpoint auto, which starts over when there is no checkpoint)"
    )
    shutil.rmtree(tmp_path / "checkpoint-7")  # as the hint says: now auto starts over
    (tmp_path / ".tokenizer").mkdir()
    check_run_folder(tmp_path, resume_from_checkpoint="auto", overwrite_output_dir=False)
    check_run_folder(tmp_path, resume_from_checkpoint=None, overwrite_output_dir=True)


def starts_over_with_auto_removing(folder: Path) -> list[Path]:
    return [path for path in remove_checkpoints(folder) if not path.name.startswith(".tmp-checkpoint-")]


def test_overwrite_refuses_a_users_file_in_a_checkpoint_and_hidden_names_that_only_share_a_prefix(tmp_path):
    """The attack on d734940, F4: --overwrite_output_dir deleted checkpoint-8/my_eval.txt (not in its manifest)
    and .final-ready-old/ (a prefix of hfbert's .final-ready)."""
    save_steps(tmp_path, [4])
    (tmp_path / "checkpoint-4" / "my_eval.txt").write_text("mine")
    for name in (".final-ready-old", ".tmp-checkpoint-old", ".replaced-checkpoint-old", ".tokenizer-mine"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "x").write_text("mine")
    before = listing(tmp_path)
    with pytest.raises(CheckpointError) as refused:
        check_run_folder(tmp_path, resume_from_checkpoint=None, overwrite_output_dir=True)
    assert "it also holds .final-ready-old, .replaced-checkpoint-old, .tmp-checkpoint-old, .tokenizer-mine, " \
        "checkpoint-4/my_eval.txt: move them out" in str(refused.value)
    with pytest.raises(CheckpointError, match=r"is not empty and holds no hfbert run \(\.final-ready-old"):
        _fresh_start_of_hidden_names(tmp_path)
    finish_interrupted_replace(tmp_path)  # a parked checkpoint is .replaced-checkpoint-<step>, nothing else
    save_steps(tmp_path, [5])  # the save's cleanup of its staging folders
    remove_checkpoints(tmp_path)
    kept = {name: mtime for name, mtime in listing(tmp_path).items() if name in before}
    assert kept == {name: mtime for name, mtime in before.items() if not name.startswith("checkpoint-4")}


def _fresh_start_of_hidden_names(tmp_path):
    hidden = tmp_path.parent / f"{tmp_path.name}-hidden"
    hidden.mkdir()
    (hidden / ".final-ready-old").mkdir()
    check_run_folder(hidden, resume_from_checkpoint=None, overwrite_output_dir=False)


@pytest.mark.parametrize("mode", ["overwrite", "latest", "auto", "fresh"])
def test_a_linked_checkpoint_is_refused_naming_it_before_anything_is_deleted(tmp_path, mode):
    """The attack on d734940, F5: a symlinked checkpoint-9 made --overwrite_output_dir stop in a traceback ("Cannot
    call rmtree on a symbolic link") after checkpoint-2..8 were deleted."""
    run_dir, elsewhere = tmp_path / "run", tmp_path / "elsewhere"
    save_steps(run_dir, [2, 4])
    shutil.copytree(run_dir / "checkpoint-4", elsewhere)
    (run_dir / "checkpoint-9").symlink_to(elsewhere, target_is_directory=True)
    before = listing(tmp_path)
    with pytest.raises(CheckpointError) as refused:
        check_run_folder(
            run_dir,
            resume_from_checkpoint={"latest": "latest", "auto": "auto"}.get(mode),
            overwrite_output_dir=mode == "overwrite",
        )
    assert str(refused.value) == (
        f"--output_dir {run_dir} holds checkpoint-9 as a symbolic link: hfbert reads, rotates and deletes there "
        "only the folders it wrote, never through a link; replace the link with a copy of its folder, or move it out"
    )
    assert listing(tmp_path) == before
    assert find_checkpoints(run_dir) == [run_dir / "checkpoint-2", run_dir / "checkpoint-4"]  # never followed
    save_steps(run_dir, [6], total_limit=1)  # rotation mid-run passes the link by
    remove_checkpoints(run_dir)
    assert sorted(path.name for path in run_dir.iterdir()) == ["checkpoint-9"]
    assert listing(elsewhere) == {name[len("elsewhere/"):]: mtime for name, mtime in before.items() if name.startswith("elsewhere/")}


@pytest.mark.parametrize(
    "state, value",
    [("torch_manual_seed", torch.zeros(5, dtype=torch.uint8)), ("torch_manual_seed", torch.zeros(5056)),
     ("random_state", (3, (1, 2), None)), ("numpy_random_seed", ("MT19937", [1, 2], 0, 0, 0.0))],
)  # fmt: skip
def test_an_rng_state_that_cannot_be_set_is_refused_as_a_resume_that_cannot_be_exact(tmp_path, state, value):
    """The attack on d734940, F3: a torch_manual_seed of 5 bytes was accepted; accelerate's load_state then failed
    in torch.set_rng_state and logged "Could not load random states" at INFO (weights 1.8e-4 from the straight
    run's)."""
    save_steps(tmp_path, [2, 4])
    checkpoint = tmp_path / "checkpoint-4"
    states = load_plain_data(checkpoint, "random_states_0.pkl")
    torch.save({**states, state: value}, checkpoint / "random_states_0.pkl")
    as_main_wrote_it(checkpoint)
    torch.manual_seed(3)
    expected = torch.rand(3)
    torch.manual_seed(3)
    with pytest.raises(CheckpointError) as refused:
        resolve_resume_checkpoint(tmp_path, "latest")
    assert str(refused.value).startswith(
        f"Checkpoint {checkpoint} cannot be resumed exactly: random_states_0.pkl holds a {state} that cannot be "
        "restored ("
    )
    assert "\n" not in str(refused.value)
    assert f"; resume from an earlier checkpoint instead, e.g. --resume_from_checkpoint {tmp_path / 'checkpoint-2'}" in str(refused.value)
    assert torch.equal(torch.rand(3), expected)  # the check left this process's streams as they were
    resolve_resume_checkpoint(tmp_path, str(tmp_path / "checkpoint-2"))  # a good file passes


@pytest.mark.parametrize("resume", ["latest", "auto", "checkpoint-4"])
def test_a_resume_in_its_own_folder_refuses_what_hfbert_did_not_write(tmp_path, resume):
    """The second attack (9e9ff09), N1 and N2: a resume replaced a user's manifest-less checkpoint-6 with its own
    save, overwrote their README.md and config.json with the final folder's, and rotation deleted a file of
    theirs inside checkpoint-2."""
    save_steps(tmp_path, [2, 4])
    (tmp_path / ".tokenizer").mkdir()
    resume = str(tmp_path / resume) if resume.startswith("checkpoint") else resume
    check_run_folder(tmp_path, resume_from_checkpoint=resume, overwrite_output_dir=False)  # hfbert's own: resumes
    (tmp_path / "checkpoint-6").mkdir()
    (tmp_path / "checkpoint-6" / "pytorch_model.bin").write_text("my weights")
    for name in ("README.md", "config.json", "checkpoint-2/my_eval.txt"):
        (tmp_path / name).write_text("mine")
    before = listing(tmp_path)
    with pytest.raises(CheckpointError) as refused:
        check_run_folder(tmp_path, resume_from_checkpoint=resume, overwrite_output_dir=False)
    assert str(refused.value) == (
        f"--resume_from_checkpoint {resume}: {tmp_path} holds what hfbert did not write (README.md, "
        f"checkpoint-2/my_eval.txt, checkpoint-6 (no {MANIFEST_NAME}), config.json), which the resumed run's "
        "checkpoints, their rotation or its final folder would replace or delete: move it out of the folder, then resume"
    )
    assert listing(tmp_path) == before


@pytest.mark.parametrize("forged", [{"completed_steps": 9}, {"completed_steps": "4"}, {"micro_batches_in_epoch": -1}])
def test_a_progress_that_disagrees_with_its_checkpoint_is_refused(tmp_path, forged):
    """The second attack (9e9ff09), N4: checkpoint-4's training_progress.json rewritten (another step count),
    its manifest rewritten to match, resumed silently at the forged step. The progress must agree with the
    folder it sits in and hold counts."""
    save_steps(tmp_path, [2, 4])
    checkpoint = tmp_path / "checkpoint-4"
    progress = {**json.loads((checkpoint / PROGRESS_JSON).read_text()), **forged}
    (checkpoint / PROGRESS_JSON).write_text(json.dumps(progress))
    (checkpoint / MANIFEST_NAME).unlink()
    _write_manifest(checkpoint, 4, 1)
    with pytest.raises(CheckpointError) as refused:
        resolve_resume_checkpoint(tmp_path, "latest")
    name, value = next(iter(forged.items()))
    assert str(refused.value).startswith(
        f"Checkpoint {checkpoint} is corrupted: its {PROGRESS_JSON} has {name} {value!r}, "
        f"{'not the 4 updates its folder name and manifest count' if value == 9 else 'not a count'}; "
        f"resume from an earlier checkpoint instead, e.g. --resume_from_checkpoint {tmp_path / 'checkpoint-2'}"
    )
    resolve_resume_checkpoint(tmp_path, str(tmp_path / "checkpoint-2"))  # its own progress passes


@pytest.mark.parametrize("resume", [None, "latest"])
def test_a_users_file_in_the_trained_tokenizers_folder_is_refused(tmp_path, sample_tokenizer, resume):
    """The third attack (7c6b93a), F4: .tokenizer/ counted as hfbert's by its name alone, so --overwrite_output_dir
    deleted .tokenizer/.final-staging/mine.txt (the tokenizer's staging) and kept notes.txt unnamed."""
    save_steps(tmp_path, [4])
    save_tokenizer(sample_tokenizer, tmp_path / ".tokenizer")  # what a run writes there: accepted
    check_run_folder(tmp_path, resume_from_checkpoint=resume, overwrite_output_dir=resume is None)
    (tmp_path / ".tokenizer" / "notes.txt").write_text("mine")
    (tmp_path / ".tokenizer" / ".final-staging").mkdir()
    (tmp_path / ".tokenizer" / ".final-staging" / "mine.txt").write_text("mine")
    before = listing(tmp_path)
    with pytest.raises(CheckpointError) as refused:
        check_run_folder(tmp_path, resume_from_checkpoint=resume, overwrite_output_dir=resume is None)
    assert ".tokenizer/.final-staging/mine.txt, .tokenizer/notes.txt" in str(refused.value)
    assert listing(tmp_path) == before


def test_an_interrupted_replace_is_finished_only_from_folders_hfbert_wrote_whole(tmp_path):
    """The fourth attack (aca973c), F6: a fresh run's lock "finished the replace" of a user's
    .replaced-checkpoint-3/ (thesis.tex, no manifest) beside a .tmp-checkpoint-3 holding an empty manifest,
    deleting thesis.tex, before the run was refused."""
    (tmp_path / ".replaced-checkpoint-3").mkdir()
    (tmp_path / ".replaced-checkpoint-3" / "thesis.tex").write_text("mine")
    (tmp_path / ".tmp-checkpoint-3").mkdir()
    (tmp_path / ".tmp-checkpoint-3" / MANIFEST_NAME).write_text("{}")
    before = listing(tmp_path)
    with run_folder_lock(tmp_path, finish_interrupted_replace):
        pass
    assert listing(tmp_path) == before


def test_a_folder_link_or_an_empty_folder_in_a_checkpoint_is_named(tmp_path):
    """The fourth attack (aca973c), F7: --overwrite_output_dir deleted checkpoint-4 with a user's folder link and
    empty folder in it, naming neither (a file link was named)."""
    save_steps(tmp_path, [4])
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "checkpoint-4" / "my_data_link").symlink_to(tmp_path / "elsewhere")
    (tmp_path / "checkpoint-4" / "my_empty_dir").mkdir()
    (tmp_path / "elsewhere").rename(tmp_path.parent / f"{tmp_path.name}-elsewhere")  # outside the run folder
    (tmp_path / "checkpoint-4" / "my_data_link").unlink()
    (tmp_path / "checkpoint-4" / "my_data_link").symlink_to(tmp_path.parent / f"{tmp_path.name}-elsewhere")
    with pytest.raises(CheckpointError) as refused:
        check_run_folder(tmp_path, resume_from_checkpoint=None, overwrite_output_dir=True)
    assert "it also holds checkpoint-4/my_data_link, checkpoint-4/my_empty_dir: move them out" in str(refused.value)


def test_rotation_keeps_a_checkpoint_holding_a_file_hfbert_did_not_write_and_says_so(tmp_path, caplog):
    """The fifth attack (c7ce483), F7: a user's my_eval.txt written into checkpoint-2 while the run trained was
    deleted with it by --checkpoints_total_limit 1, with no log line."""
    save_steps(tmp_path, [2])
    (tmp_path / "checkpoint-2" / "my_eval.txt").write_text("mine")
    with caplog.at_level(logging.WARNING, logger="hfbert.checkpointing"):
        save_steps(tmp_path, [4, 6], total_limit=1)
    assert [path.name for path in find_checkpoints(tmp_path)] == ["checkpoint-2", "checkpoint-6"]
    assert (tmp_path / "checkpoint-2" / "my_eval.txt").read_text() == "mine"
    assert caplog.messages[-1] == (
        "Kept checkpoint-2 beyond --checkpoints_total_limit 1: it holds checkpoint-2/my_eval.txt, which hfbert did not "
        "write; move that out of it, and the next rotation removes the checkpoint"
    )


def assert_progress_kept_as_the_users(run_dir: Path, caplog, mode: str) -> None:
    """checkpoint-2's training progress, changed by the user, is named as theirs and kept: by a rotation to one
    checkpoint (with a warning), or by --overwrite_output_dir or a resume of the folder (refused, nothing
    touched)."""
    before = listing(run_dir)
    changed = f"checkpoint-2/{PROGRESS_JSON} (changed since hfbert wrote it)"
    if mode == "rotation":
        with caplog.at_level(logging.WARNING, logger="hfbert.checkpointing"):
            save_steps(run_dir, [6], total_limit=1)
        assert [path.name for path in find_checkpoints(run_dir)] == ["checkpoint-2", "checkpoint-6"]
        assert caplog.messages[-1].startswith(
            f"Kept checkpoint-2 beyond --checkpoints_total_limit 1: it holds {changed}, which hfbert did not write"
        )
        return
    with pytest.raises(CheckpointError) as refused:
        check_run_folder(
            run_dir, resume_from_checkpoint="latest" if mode == "latest" else None, overwrite_output_dir=mode == "overwrite"
        )
    assert changed in str(refused.value)
    assert listing(run_dir) == before


@pytest.mark.parametrize("edit", ["longer", "same size"])
@pytest.mark.parametrize("mode", ["overwrite", "latest", "rotation"])
def test_a_file_the_user_edited_in_a_checkpoint_is_theirs_and_never_deleted(tmp_path, caplog, mode, edit):
    """The fifth attack (c7ce483), F8: a file the user edited in a checkpoint (checkpoint-3/config.json; here
    checkpoint-2's training_progress.json) was judged by its name only: --overwrite_output_dir, a resume's
    rotation and its re-save of that step deleted the edit. A listed file changed after its manifest was written
    is the user's; a copy of the folder (`cp -r`: every file changed later, none other than recorded) and damage
    that leaves the change time (as a disk's does) are still hfbert's."""
    save_steps(tmp_path, [2, 4])
    manifest = tmp_path / "checkpoint-2" / MANIFEST_NAME
    manifest_time = manifest.stat().st_mtime_ns - 10**9  # a second before the edit: a file system's clock may be coarse
    os.utime(manifest, ns=(manifest_time, manifest_time))
    copied = tmp_path.parent / f"{tmp_path.name}-copy"
    shutil.copytree(tmp_path, copied)
    for path in copied.rglob("*"):
        os.utime(path, ns=(manifest_time + 10**9, manifest_time + 10**9 + len(path.name)))  # newer, in any order
    for copied_manifest in copied.rglob(MANIFEST_NAME):  # every file of the copy changed after its manifest
        os.utime(copied_manifest, ns=(manifest_time - 10**9, manifest_time - 10**9))
    check_run_folder(copied, resume_from_checkpoint="latest", overwrite_output_dir=False)
    for how in DAMAGES:
        damage(tmp_path / "checkpoint-4" / "model.safetensors", how)
        check_run_folder(tmp_path, resume_from_checkpoint=None, overwrite_output_dir=True)
    edited = tmp_path / "checkpoint-2" / PROGRESS_JSON
    text = edited.read_text()
    edited.write_text(text + " " if edit == "longer" else text.replace("2", "3", 1))
    os.utime(edited, ns=(manifest_time + 10**9, manifest_time + 10**9))  # a file system's clock may be coarse
    assert edit == "longer" or edited.stat().st_size == len(text.encode())
    assert_progress_kept_as_the_users(tmp_path, caplog, mode)
    assert edited.read_text() != text


@pytest.mark.parametrize("move", ["mv", "cp -p"])
@pytest.mark.parametrize("mode", ["overwrite", "latest", "rotation"])
def test_a_users_file_moved_into_a_checkpoint_with_an_older_time_is_theirs(tmp_path, caplog, mode, move):
    """The twelfth attack (cb90694), Y1: a file of the user's moved onto a name a checkpoint's manifest lists,
    keeping its older modification time (`mv`, `cp -p`), was taken as hfbert's, the time being asked first:
    --overwrite_output_dir deleted it, a resume's rotation too. Both set its change time, which a disk's damage
    leaves as it was."""
    save_steps(tmp_path, [2, 4])
    manifest = tmp_path / "checkpoint-2" / MANIFEST_NAME
    written = manifest.stat().st_mtime_ns - 10**9  # a second before the move: a file system's clock may be coarse
    os.utime(manifest, ns=(written, written))
    theirs = tmp_path.parent / "my_progress.json"
    theirs.write_text('{"mine": true}')
    os.utime(theirs, (946684800, 946684800))  # 2000-01-01, long before the run
    target = tmp_path / "checkpoint-2" / PROGRESS_JSON
    if move == "mv":
        os.replace(theirs, target)
    else:
        shutil.copy2(theirs, target)
    assert target.stat().st_mtime_ns < written
    assert_progress_kept_as_the_users(tmp_path, caplog, mode)
    assert target.read_text() == '{"mine": true}'


@pytest.mark.parametrize("mode", ["overwrite", "latest"])
def test_a_link_or_folder_at_a_published_name_is_the_users(tmp_path, mode):
    """The sixth attack (9c5ba80), G5: README.md, published by the final folder, replaced by the user with a link
    to their notes (or made a folder) was replaced by --overwrite_output_dir and a resume's final folder, with no
    message: hfbert publishes regular files only, so a link or a folder at such a name is not one of them."""
    run_dir = tmp_path / "run"
    save_steps(run_dir, [2])
    (run_dir / "config.json").write_text("{}")  # published before its record
    (run_dir / FINAL_RECORD).write_text(json.dumps(["README.md", "config.json", "samples.md"]))
    (tmp_path / "notes.md").write_text("mine")
    (run_dir / "README.md").symlink_to(tmp_path / "notes.md")
    (run_dir / "samples.md").mkdir()
    check_folder = partial(
        check_run_folder, run_dir, resume_from_checkpoint="latest" if mode == "latest" else None,
        overwrite_output_dir=mode == "overwrite",
    )  # fmt: skip
    with pytest.raises(CheckpointError) as refused:
        check_folder()
    assert "README.md (a link), samples.md (a folder)" in str(refused.value)
    (run_dir / "README.md").unlink()
    (run_dir / "samples.md").rmdir()
    check_folder()


@pytest.mark.parametrize("copy", ["checkpoint-2", "checkpoint-004"])
@pytest.mark.parametrize("mode", ["overwrite", "latest", "rotation"])
def test_a_users_copy_of_a_checkpoint_under_another_number_is_theirs(tmp_path, caplog, mode, copy):
    """The sixth attack (9c5ba80), G3: a backup `cp -a checkpoint-4 checkpoint-2` (or checkpoint-004) was deleted
    by rotation and --overwrite_output_dir with no message, though a resume from it is refused (its progress is
    step 4's): a checkpoint is hfbert's under the name of the step its manifest records only."""
    save_steps(tmp_path, [4])
    shutil.copytree(tmp_path / "checkpoint-4", tmp_path / copy)
    before = listing(tmp_path)
    if mode == "rotation":
        with caplog.at_level(logging.WARNING, logger="hfbert.checkpointing"):
            save_steps(tmp_path, [6, 8], total_limit=1)
        assert (tmp_path / copy).is_dir()
        assert caplog.messages[-1] == (
            f"Kept {copy} beyond --checkpoints_total_limit 1: its manifest records update 4, so it is a copy of "
            f"checkpoint-4 (hfbert names a checkpoint by its update); rename it (e.g. {copy}-copy) or move it out "
            "of the folder"
        )
        return
    with pytest.raises(CheckpointError) as refused:
        check_run_folder(tmp_path, resume_from_checkpoint="latest" if mode == "latest" else None, overwrite_output_dir=mode == "overwrite")
    assert f"{copy} (a copy of checkpoint-4)" in str(refused.value)
    assert listing(tmp_path) == before


def published_run(tmp_path: Path, mode: str, names_only: bool = False) -> tuple[Path, int, Callable[[], None]]:
    """A run folder with checkpoint-2 and a published README.md and config.json (times kept, as publish_files
    moves them), recorded with sizes or, as an older hfbert did, by name only: (the folder, the record's mtime,
    the folder check of `mode`, "overwrite" or "latest")."""
    from hfbert.files import write_final_record

    run_dir = tmp_path / "run"
    save_steps(run_dir, [2])
    for name in ("README.md", "config.json"):
        (run_dir / name).write_text(f"hfbert's {name}")
    if names_only:
        (run_dir / FINAL_RECORD).write_text(json.dumps(["README.md", "config.json"]))
    else:
        write_final_record(run_dir, run_dir)
    written = (run_dir / FINAL_RECORD).stat().st_mtime_ns
    for name in ("README.md", "config.json"):
        os.utime(run_dir / name, ns=(written - 10**9, written - 10**9))  # published before the record
    check_folder = partial(
        check_run_folder, run_dir, resume_from_checkpoint="latest" if mode == "latest" else None,
        overwrite_output_dir=mode == "overwrite",
    )  # fmt: skip
    check_folder()  # as published: hfbert's
    return run_dir, written, check_folder


@pytest.mark.parametrize("mode", ["overwrite", "latest"])
def test_a_published_file_the_user_edited_is_theirs(tmp_path, mode):
    """The seventh attack (731f08a), B2: the final folder's record held names only, so a README.md the user
    added notes to was replaced by a resume's final folder and by --overwrite_output_dir, with no message. The
    record holds each file's size and sha256; one changed after it was written is the user's (as in a
    checkpoint, F8)."""
    run_dir, written, check_folder = published_run(tmp_path, mode)
    (run_dir / "README.md").write_text("hfbert's README.md\n\nMy notes.")
    os.utime(run_dir / "README.md", ns=(written + 10**9, written + 10**9))
    with pytest.raises(CheckpointError) as refused:
        check_folder()
    assert "README.md (changed since hfbert wrote it)" in str(refused.value)
    assert "My notes." in (run_dir / "README.md").read_text()


@pytest.mark.parametrize("mode", ["overwrite", "latest"])
def test_a_published_file_edited_since_a_names_only_record_is_theirs(tmp_path, mode):
    """The eighth attack (2b53043), K2: a record an older hfbert wrote lists names only, so a README.md the user
    edited since was replaced. Without sizes, a file modified after its record was written may be an edit: it is
    the user's (files as published, times kept, stay hfbert's)."""
    run_dir, written, check_folder = published_run(tmp_path, mode, names_only=True)
    (run_dir / "README.md").write_text("hfbert's README.md\n\nMy notes.")
    os.utime(run_dir / "README.md", ns=(written + 10**9, written + 10**9))
    with pytest.raises(CheckpointError) as refused:
        check_folder()
    assert "README.md (changed since hfbert wrote it)" in str(refused.value)
    assert "config.json" not in str(refused.value)


@pytest.mark.parametrize("written_as", ["torch.save", "pickle"])
def test_a_file_the_manifest_does_not_list_is_no_part_of_the_resume(tmp_path, written_as):
    """The seventh attack (731f08a), S1: a checkpoint given by path holding an unlisted custom_checkpoint_1.pkl
    ended in accelerate's RuntimeError traceback (torch.save) or a refusal saying it matched its manifest
    (pickle). A checkpoint's state is the files its manifest lists: a user's file beside them is never read."""
    import pickle

    save_steps(tmp_path, [2, 4])
    checkpoint, marker = tmp_path / "checkpoint-4", tmp_path / "ran"
    with open(checkpoint / "custom_checkpoint_1.pkl", "wb") as file:
        (partial(torch.save, f=file) if written_as == "torch.save" else partial(pickle.dump, file=file))(RunsCode(marker))
    run = build_run()
    resume(run, checkpoint)
    assert run[5].completed_steps == 4 and not marker.exists()


@pytest.mark.parametrize("mode", ["overwrite", "latest"])
def test_a_users_file_moved_in_with_an_older_time_at_a_published_name_is_theirs(tmp_path, mode):
    """The ninth attack (16a18ca), A: a user's README.md moved over the card (`mv`, `cp -p` and `rsync -a` keep
    its older time) was taken as hfbert's and replaced: the time was asked before the record's sha256."""
    run_dir, _, check_folder = published_run(tmp_path, mode)
    (tmp_path / "notes.md").write_text("MY PRECIOUS NOTES")
    os.utime(tmp_path / "notes.md", (946684800, 946684800))  # 2000-01-01
    (tmp_path / "notes.md").rename(run_dir / "README.md")
    with pytest.raises(CheckpointError) as refused:
        check_folder()
    assert "README.md (changed since hfbert wrote it)" in str(refused.value)


@pytest.mark.parametrize("made", ["notes", "copy"])
def test_a_checkpoint_folder_the_user_made_during_the_run_is_not_replaced_by_its_save(tmp_path, made):
    """The ninth attack (16a18ca), C: a `checkpoint-8` the user made while the run trained (a folder of notes, a
    `cp -a checkpoint-4 checkpoint-8` backup) was parked and deleted by the save of update 8. Every process stops
    there instead, naming it; a same-step save over hfbert's own checkpoint still replaces it."""
    run = save_steps(tmp_path, [4, 4])  # hfbert's own, saved twice: replaced
    if made == "notes":
        (tmp_path / "checkpoint-8").mkdir()
        (tmp_path / "checkpoint-8" / "notes.txt").write_text("mine")
        shown = "checkpoint-8 (no checkpoint_manifest.json)"
    else:
        shutil.copytree(tmp_path / "checkpoint-4", tmp_path / "checkpoint-8")
        shown = "checkpoint-8 (a copy of checkpoint-4)"
    before = listing(tmp_path)
    run[5].completed_steps = 8
    with pytest.raises(CheckpointWriteError) as refused:  # a run failure, as a failed save is
        save_checkpoint(run[0], tmp_path, 8, progress=run[5].state_dict())
    assert str(refused.value) == (
        f"Did not save checkpoint-8: {tmp_path / 'checkpoint-8'} holds what hfbert did not write ({shown}), which "
        f"the save would replace; the run stops here. Move it out of {tmp_path}, then resume with the same "
        "command plus --resume_from_checkpoint latest"
    )
    assert listing(tmp_path) == before
