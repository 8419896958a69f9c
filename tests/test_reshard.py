"""Resuming a checkpoint on another number of processes: the global batch is kept (or the resume refused with
the launches that keep it), and the resumed run trains on the same samples with the same masks."""

import json
import logging
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from accelerate import Accelerator
from accelerate.state import AcceleratorState, GradientState
from test_training import REPO, run_args, subprocess_env
from torch.utils.data import DataLoader, TensorDataset

from hfbert.checkpointing import _write_manifest
from hfbert.errors import CheckpointError, Refusal
from hfbert.pretraining.batches import TrainingBatches, micro_batches_to_skip
from hfbert.pretraining.extras.reshard import continue_on_this_split, keep_global_batch
from hfbert.pretraining.settings import OptimizationSettings
from hfbert.pretraining.training import Training, TrainingProgress

CHECKPOINT = "runs/x/checkpoint-30"


def saved_settings(per_device: int = 8, accumulation: int = 1) -> dict:
    return {"per_device_train_batch_size": per_device, "gradient_accumulation_steps": accumulation, "seed": 42}


@pytest.mark.parametrize(
    ("saved_processes", "saved_accumulation", "num_processes", "expected"),
    [(8, 1, 4, 2), (4, 2, 8, 1), (2, 1, 1, 2), (1, 4, 2, 2), (2, 3, 3, 2)],
)
def test_the_accumulation_is_set_to_keep_the_global_batch(
    saved_processes, saved_accumulation, num_processes, expected, caplog
):
    optimization = OptimizationSettings(gradient_accumulation_steps=saved_accumulation)
    with caplog.at_level(logging.WARNING):
        saved = keep_global_batch(
            saved_settings(accumulation=saved_accumulation), saved_processes, optimization, num_processes,
            CHECKPOINT, on_cpu=False,
        )  # fmt: skip
    assert optimization.gradient_accumulation_steps == saved["gradient_accumulation_steps"] == expected
    assert saved_processes * saved_accumulation == num_processes * expected
    assert (
        f"Resuming on {num_processes} processes instead of {saved_processes}: --gradient_accumulation_steps "
        f"{expected} (not {saved_accumulation}) keeps the checkpoint's global batch of "
        f"{8 * saved_processes * saved_accumulation} rows."
    ) in caplog.text


def test_the_same_process_count_changes_nothing():
    optimization = OptimizationSettings(gradient_accumulation_steps=3)  # check_resume_settings refuses it
    saved = saved_settings(accumulation=1)
    assert keep_global_batch(saved, 2, optimization, 2, CHECKPOINT, on_cpu=True) is saved
    assert optimization.gradient_accumulation_steps == 3


def test_a_global_batch_that_cannot_be_split_is_refused_naming_the_launches_that_keep_it():
    optimization = OptimizationSettings()
    with pytest.raises(Refusal) as refused:
        keep_global_batch(saved_settings(accumulation=1), 4, optimization, 3, CHECKPOINT, on_cpu=False)
    assert str(refused.value) == (
        f"--resume_from_checkpoint {CHECKPOINT}: its global batch of 32 rows (8 per process x 4 processes x 1 "
        "accumulation) cannot be split over 3 processes; resume it with one of: "
        "`accelerate launch --num_processes 1 run_pretraining.py ...` (--gradient_accumulation_steps 4); "
        "`accelerate launch --num_processes 2 run_pretraining.py ...` (--gradient_accumulation_steps 2); "
        "`accelerate launch --num_processes 4 run_pretraining.py ...` (--gradient_accumulation_steps 1)"
    )
    assert optimization.gradient_accumulation_steps == 1
    with pytest.raises(Refusal, match=r"records no run settings.*torchrun --nproc_per_node 4"):
        keep_global_batch(None, 4, optimization, 2, CHECKPOINT, on_cpu=True)
    # one process or two (the plural), and on a CPU: the launches are torchrun's
    with pytest.raises(Refusal) as refused:
        keep_global_batch(saved_settings(accumulation=3), 1, optimization, 2, CHECKPOINT, on_cpu=True)
    assert "(8 per process x 1 process x 3 accumulation)" in str(refused.value)
    assert str(refused.value).endswith(
        "`ACCELERATE_USE_CPU=1 torchrun --nproc_per_node 3 run_pretraining.py ...` (--gradient_accumulation_steps 1)"
    )
    with pytest.raises(Refusal, match=r"\(8 per process x 2 processes x 1 accumulation\)"):
        keep_global_batch(saved_settings(accumulation=1), 2, optimization, 3, CHECKPOINT, on_cpu=True)


@pytest.mark.parametrize(
    ("position", "num_processes", "batches_per_process", "expected"),
    [
        (0, 2, 5, 0),
        (8, 2, 5, 4),  # mid-epoch: 4 micro-batches each
        (8, 4, 3, 2),
        (9, 2, 5, 5),  # one process wrote the 9-batch epoch's end; two (5 each, the last round filled) skip it all
        (10, 1, 9, 9),  # two processes wrote it (a filled last round); one skips its 9
    ],
)
def test_the_global_position_becomes_this_process_count_s(position, num_processes, batches_per_process, expected):
    skipped = micro_batches_to_skip(position, 0, num_processes, batches_per_process)
    assert skipped == expected and type(skipped) is int  # a count of batches to skip, never 4.0


@pytest.mark.parametrize(("position", "skipped", "ends"), [(4, 4, [False, True, False, True, True]), (9, 9, [])])
def test_a_resumed_epoch_continues_the_accumulation_from_its_position(position, skipped, ends):
    """Which micro-batch ends an update follows from the position alone, counted in this split (what
    accelerate's counter, restored from the writer's RNG file, had to be set for): after 4 of the epoch's 9
    micro-batches with accumulation 2, the 6th and 8th end one, and the 9th, the epoch's last, a short one."""
    AcceleratorState._reset_state(True)
    GradientState._reset_state()
    accelerator = Accelerator(cpu=True)
    loader = TrainingBatches(DataLoader(TensorDataset(torch.arange(36)), batch_size=4))
    loader.prepare(accelerator)
    progress = TrainingProgress(micro_batches_in_epoch=position)
    optimization = OptimizationSettings(gradient_accumulation_steps=2)
    training = Training(accelerator, None, None, loader, None, None, optimization, None, None, progress)
    seen = []
    for _ in loader.epoch(0, position, accelerator):
        seen.append(training.ends_update())
        progress.micro_batches_in_epoch += 1  # as the step counts it
    assert (len(seen), seen) == (9 - skipped, ends)
    AcceleratorState._reset_state(True)
    GradientState._reset_state()


def test_a_position_inside_an_update_of_this_split_is_refused():
    with pytest.raises(CheckpointError) as refused:
        micro_batches_to_skip(6, 0, 4, 5)
    assert str(refused.value) == (
        "the checkpoint stands at micro-batch 6 of epoch 0, which 4 processes cannot continue from (it is no "
        "multiple of 4); resume it on a number of processes that divides the micro-batches of an update"
    )


def dropout_draw(accelerator, checkpoint, seed=42, step=30):
    torch.manual_seed(0)  # what a fresh start on every rank leaves
    continue_on_this_split(accelerator, step, checkpoint, seed)
    return torch.rand(4)


def test_a_rank_the_checkpoint_has_no_rng_file_for_draws_by_seed_rank_and_step(tmp_path, caplog):
    checkpoint = tmp_path / "checkpoint-30"
    checkpoint.mkdir()
    (checkpoint / "random_states_0.pkl").write_bytes(b"")
    _write_manifest(checkpoint, 30, 1)  # written by one process
    rank = [SimpleNamespace(process_index=index) for index in range(3)]
    torch.manual_seed(0)
    fresh = torch.rand(4)
    assert torch.equal(dropout_draw(rank[0], checkpoint), fresh)  # its streams came from its own file
    with caplog.at_level(logging.WARNING):
        draw = dropout_draw(rank[1], checkpoint)
    assert (
        f"{checkpoint} holds no random_states_1.pkl (written by fewer processes): process 1 seeds its RNG "
        "streams (dropout) from (seed 42, rank 1, step 30), so the resume is not exact."
    ) in caplog.text
    assert torch.equal(dropout_draw(rank[1], checkpoint), draw)  # reproducible
    others = [fresh, dropout_draw(rank[2], checkpoint), dropout_draw(rank[1], checkpoint, step=31)]
    others.append(dropout_draw(rank[1], checkpoint, seed=43))
    assert not any(torch.equal(draw, other) for other in others)  # not step 0's, nor another rank's or step's


def test_an_rng_file_deleted_from_a_checkpoint_is_warned_as_deleted_not_as_written_by_fewer_processes(tmp_path, caplog):
    """The attack on d734940, F3: random_states_0.pkl deleted from a one-process checkpoint was warned as
    'written by fewer processes'."""
    checkpoint = tmp_path / "checkpoint-30"
    checkpoint.mkdir()
    _write_manifest(checkpoint, 30, 1)
    with caplog.at_level(logging.WARNING):
        dropout_draw(SimpleNamespace(process_index=0), checkpoint)
    assert (
        f"{checkpoint} holds no random_states_0.pkl although the 1 process that wrote it saved one each (it was "
        "removed since): process 0 seeds its RNG streams (dropout) from (seed 42, rank 0, step 30), so the resume "
        "is not exact."
    ) in caplog.text


# ----------------------------------------------------------------------------------------------- end to end

# run_pretraining.py, recording every micro-batch a process trains on: its place in the epoch's global order
# (the global position before the step plus the rank), a hash of the batch (ids, masks, labels) and its loss.
RECORDING_RUN = textwrap.dedent(
    """
    import hashlib, json, os, sys
    from hfbert.errors import run_cli
    from hfbert.pretraining.cli import main
    from hfbert.pretraining.training import Training

    record_path = os.path.join(sys.argv.pop(1), f"rank{os.environ.get('RANK', '0')}-{os.getpid()}.jsonl")
    step = Training.step

    def recording_step(training, batch, *args, **kwargs):
        progress, accelerator = training.progress, training.accelerator
        where = [progress.epoch, progress.micro_batches_in_epoch + accelerator.process_index]
        outputs, loss = step(training, batch, *args, **kwargs)
        digest = hashlib.sha256()
        for name in sorted(batch):
            digest.update(name.encode() + batch[name].cpu().numpy().tobytes())
        row = {"where": where, "update": progress.completed_steps + 1, "batch": digest.hexdigest(),
               "loss": loss.item(), "processes": accelerator.num_processes,
               "accumulation": training.optimization.gradient_accumulation_steps,
               "bucket_view": getattr(training.model, "gradient_as_bucket_view", None)}
        with open(record_path, "a") as record:
            record.write(json.dumps(row) + "\\n")
        return outputs, loss

    Training.step = recording_step
    run_cli(main)
    """
)
STEPS = 8  # checkpoints at 3 and 6 (every 3)


def launch(tmp_path: Path, run_inputs, output_dir: Path, processes: int, *extra: str) -> dict:
    """Train on `processes` CPU processes; returns the recorded micro-batches by their global place."""
    script = tmp_path / "recording_run.py"
    script.write_text(RECORDING_RUN)
    records = tmp_path / f"records-{output_dir.name}"
    records.mkdir()
    args = run_args(
        run_inputs, output_dir, "--per_device_train_batch_size", "4", "--max_train_steps", str(STEPS),
        "--checkpointing_steps", "3", "--dropout", "0", "--eval_steps", "1000", "--logging_steps", "1", *extra,
    )  # fmt: skip
    command = [
        sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(processes), "--standalone",
        str(script), str(records), *args,
    ]  # fmt: skip
    env = {**subprocess_env(), "ACCELERATE_USE_CPU": "1", "OMP_NUM_THREADS": "1"}
    result = subprocess.run(command, capture_output=True, text=True, env=env, cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-4000:]
    rows = [json.loads(line) for path in records.glob("*.jsonl") for line in path.read_text().splitlines()]
    assert {row["processes"] for row in rows} == {processes}
    # DDP (under torchrun even for one process) keeps gradients as views into its all-reduce buckets
    # (hfbert.pretraining.precision.DDP_SETTINGS).
    assert {row["bucket_view"] for row in rows} == {True}
    by_place = {tuple(row["where"]): row for row in rows}
    assert len(by_place) == len(rows)  # no place trained twice
    return by_place


def resume_from(tmp_path: Path, checkpoint: Path, name: str) -> Path:
    output_dir = tmp_path / name
    output_dir.mkdir()
    shutil.copytree(checkpoint, output_dir / checkpoint.name)
    return output_dir


def assert_continues(straight: dict, resumed: dict, from_update: int, accumulation: int) -> None:
    """The resumed run trained on exactly the straight run's micro-batches after `from_update`, in the same
    updates, with losses equal up to float summation order (another all-reduce split)."""
    expected = {place: row for place, row in straight.items() if row["update"] > from_update}
    assert resumed.keys() == expected.keys()
    for place, row in resumed.items():
        assert row["accumulation"] == accumulation
        assert (row["batch"], row["update"]) == (expected[place]["batch"], expected[place]["update"]), place
        assert row["loss"] == pytest.approx(expected[place]["loss"], rel=1e-4, abs=1e-5), place


@pytest.fixture(scope="module")
def straight_run(tmp_path_factory, run_inputs) -> tuple[Path, dict]:
    """2 processes x 2 accumulation (global batch 16 rows of 4), uninterrupted, checkpoints at 3 and 6."""
    tmp_path = tmp_path_factory.mktemp("straight")
    straight = launch(tmp_path, run_inputs, tmp_path / "straight", 2, "--gradient_accumulation_steps", "2")
    assert len(straight) == STEPS * 4 and max(row["update"] for row in straight.values()) == STEPS
    return tmp_path / "straight", straight


@pytest.mark.slow
def test_two_processes_resume_on_one_and_back_on_two_with_the_same_batches(tmp_path, run_inputs, straight_run):
    """checkpoint-3 of the 2-process run resumed on 1 process (x 4 accumulation), then that run's checkpoint-6
    on 2 processes again (x 2): every micro-batch after the checkpoint is the straight run's, in the same
    update, with the same masks, and the same learning rate at every update."""
    straight_dir, straight = straight_run
    one_dir = resume_from(tmp_path, straight_dir / "checkpoint-3", "on-one")
    # --gradient_accumulation_steps 2 as in the original command: set to 4 on one process, logged.
    on_one = launch(tmp_path, run_inputs, one_dir, 1, "--gradient_accumulation_steps", "2",
                    "--resume_from_checkpoint", "latest")  # fmt: skip
    assert_continues(straight, on_one, 3, accumulation=4)
    two_dir = resume_from(tmp_path, one_dir / "checkpoint-6", "back-on-two")
    back_on_two = launch(tmp_path, run_inputs, two_dir, 2, "--gradient_accumulation_steps", "4",
                         "--resume_from_checkpoint", "latest")  # fmt: skip
    assert_continues(straight, back_on_two, 6, accumulation=2)
    straight_rates = learning_rates(straight_dir)
    for folder in (one_dir, two_dir):
        rates = learning_rates(folder)
        assert len(rates) == STEPS and rates == straight_rates


@pytest.mark.slow
def test_two_processes_resume_on_four_with_the_same_batches(tmp_path, run_inputs, straight_run):
    straight_dir, straight = straight_run
    four_dir = resume_from(tmp_path, straight_dir / "checkpoint-3", "on-four")
    on_four = launch(tmp_path, run_inputs, four_dir, 4, "--gradient_accumulation_steps", "2",
                     "--resume_from_checkpoint", "latest")  # fmt: skip
    assert_continues(straight, on_four, 3, accumulation=1)
    assert learning_rates(four_dir) == learning_rates(straight_dir)


def learning_rates(folder: Path) -> dict[int, float]:
    """The learning rate logged at every update (--logging_steps 1), by step."""
    rows = json.loads((folder / "log_history.json").read_text())
    return {row["step"]: row["learning_rate"] for row in rows if "learning_rate" in row}


@pytest.mark.slow
def test_a_split_that_cannot_keep_the_global_batch_is_refused_before_any_work(tmp_path, run_inputs, straight_run):
    straight_dir, _ = straight_run
    output_dir = resume_from(tmp_path, straight_dir / "checkpoint-3", "on-three")
    before = sorted(path.relative_to(output_dir) for path in output_dir.rglob("*"))
    command = [
        sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "3", "--standalone",
        str(REPO / "run_pretraining.py"),
        *run_args(run_inputs, output_dir, "--per_device_train_batch_size", "4", "--max_train_steps", str(STEPS),
                  "--gradient_accumulation_steps", "2", "--resume_from_checkpoint", "latest"),
    ]  # fmt: skip
    env = {**subprocess_env(), "ACCELERATE_USE_CPU": "1", "OMP_NUM_THREADS": "1"}
    result = subprocess.run(command, capture_output=True, text=True, env=env, cwd=tmp_path)
    assert result.returncode != 0  # torchrun's own code; the refusing process exits with 2
    refusals = [line for line in result.stderr.splitlines() if line.startswith("run_pretraining.py: error:")]
    assert refusals and set(refusals) == {  # every process that prints before torchrun stops it, the same line
        f"run_pretraining.py: error: --resume_from_checkpoint {output_dir / 'checkpoint-3'}: its global batch of 16 "
        "rows (4 per process x 2 processes x 2 accumulation) cannot be split over 3 processes; resume it with one "
        "of: `ACCELERATE_USE_CPU=1 torchrun --nproc_per_node 1 run_pretraining.py ...` (--gradient_accumulation_steps "
        "4); `ACCELERATE_USE_CPU=1 torchrun --nproc_per_node 2 run_pretraining.py ...` (--gradient_accumulation_steps "
        "2); `ACCELERATE_USE_CPU=1 torchrun --nproc_per_node 4 run_pretraining.py ...` (--gradient_accumulation_steps 1)"
    }
    assert sorted(path.relative_to(output_dir) for path in output_dir.rglob("*")) == before
