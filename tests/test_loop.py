"""The resume and preemption parts of the training loop (hfbert/pretraining/loop.py), fast and in-process: what
a checkpoint records, the budget, the end of an epoch and how several processes agree, with stand-ins for
what a run of several processes would need (issue 45: mutation testing maps only in-process calls)."""

import json
import signal
from dataclasses import dataclass, field

import pytest
import torch
from test_training import run_args, train_in_process

from hfbert.checkpointing import RUN_SETTINGS_NAME, TOKENIZER_FOLDER, TrainingProgress
from hfbert.pretraining import loop
from hfbert.pretraining.loop import PreemptionSignals, end_epoch, out_of_budget, synced_train_seconds
from hfbert.pretraining.optimization import Budget, LearningRateSchedule
from hfbert.pretraining.settings import RunSettings


@dataclass
class Processes:
    """What the loop uses of an Accelerator of `num_processes` processes: the others' values in a reduction
    come from `others`, and every reduction is recorded."""

    num_processes: int
    others: list[float] = field(default_factory=list)
    reductions: list[tuple[torch.Tensor, str]] = field(default_factory=list)
    device: str = "cpu"

    def reduce(self, tensor: torch.Tensor, reduction: str) -> torch.Tensor:
        self.reductions.append((tensor.clone(), reduction))
        assert reduction == "max"
        return torch.stack([tensor, *(torch.tensor(v, dtype=tensor.dtype) for v in self.others)]).max()


def budget(max_steps: int = 10, max_seconds: float | None = None) -> Budget:
    return Budget(LearningRateSchedule(1e-3, 0, max_steps, max_seconds, "linear"), max_steps, num_epochs=3)


def test_a_checkpoint_records_the_runs_settings_tokenizer_and_config_and_the_limit_keeps_the_newest(
    tmp_path, run_inputs
):
    output_dir = tmp_path / "run"
    args = run_args(run_inputs, output_dir, "--max_train_steps", "4", "--checkpointing_steps", "1")
    train_in_process([*args, "--checkpoints_total_limit", "2", "--eval_steps", "1000"])
    assert sorted(path.name for path in output_dir.glob("checkpoint-*")) == ["checkpoint-3", "checkpoint-4"]
    newest = output_dir / "checkpoint-4"
    settings = json.loads((newest / RUN_SETTINGS_NAME).read_text())
    assert settings["max_train_steps"] == 4 and settings["learning_rate"] == 1e-3
    assert (newest / TOKENIZER_FOLDER / "tokenizer.json").is_file()
    config = json.loads((newest / "config.json").read_text())
    assert config["hidden_size"] == json.loads(run_inputs["config"].read_text())["hidden_size"]


def test_the_budget_ends_at_its_updates_or_its_seconds_whichever_comes_first():
    steps_only, with_time = budget(10), budget(10, max_seconds=5.0)
    assert not out_of_budget(TrainingProgress(completed_steps=9), steps_only, seconds=1e9)
    assert out_of_budget(TrainingProgress(completed_steps=10), steps_only, seconds=0.0)
    assert not out_of_budget(TrainingProgress(completed_steps=9), with_time, seconds=4.99)
    assert out_of_budget(TrainingProgress(completed_steps=9), with_time, seconds=5.0)
    assert out_of_budget(TrainingProgress(completed_steps=10), with_time, seconds=0.0)


def test_training_seconds_are_the_slowest_processes_only_under_a_time_budget_on_several_processes():
    progress = TrainingProgress(train_seconds=2.5)
    one = Processes(1)
    assert synced_train_seconds(one, progress, budget(max_seconds=60.0)) == 2.5 and not one.reductions
    several = Processes(2, others=[3.75])
    assert (
        synced_train_seconds(several, progress, budget()) == 2.5 and not several.reductions
    )  # no time budget
    seconds = synced_train_seconds(several, progress, budget(max_seconds=60.0))
    assert seconds == 3.75 and isinstance(seconds, float)
    ((reduced, how),) = several.reductions
    assert reduced.dtype == torch.float64 and reduced.item() == 2.5 and how == "max"


def test_one_process_stops_at_once_and_several_only_at_logging_steps_on_any_ones_signal():
    with PreemptionSignals() as preemption:
        assert not preemption.agreed(Processes(1), due=True)
        preemption.record(signal.SIGUSR1, None)
        preemption.record(signal.SIGTERM, None)  # a second signal changes nothing
        assert preemption.signal_number == signal.SIGUSR1
        assert preemption.agreed(Processes(1), due=False)
    several = Processes(2, others=[float(signal.SIGTERM)])
    quiet = PreemptionSignals()
    assert (
        not quiet.agreed(several, due=False) and not several.reductions
    )  # no reduction between logging steps
    assert quiet.agreed(several, due=True)  # another process had a signal
    assert quiet.signal_number == signal.SIGTERM
    assert not PreemptionSignals().agreed(Processes(2, others=[0.0]), due=True)


def test_signal_handlers_are_recorded_while_active_and_given_back_after():
    # Whatever they were before (a pytest-xdist worker ignores SIGINT): given back as they were.
    before = {number: signal.getsignal(number) for number in PreemptionSignals.SIGNALS}
    with PreemptionSignals() as preemption:
        for number in PreemptionSignals.SIGNALS:
            assert signal.getsignal(number) == preemption.record
        signal.raise_signal(signal.SIGINT)  # Ctrl-C: recorded, no KeyboardInterrupt
        assert preemption.signal_number == signal.SIGINT
    assert {number: signal.getsignal(number) for number in PreemptionSignals.SIGNALS} == before


@pytest.mark.parametrize("eval_steps", [None, 5])
@pytest.mark.parametrize("each_epoch", [True, False])
def test_the_end_of_an_epoch_starts_the_next_at_its_first_batch_evaluating_and_checkpointing_as_scheduled(
    monkeypatch, eval_steps, each_epoch
):
    calls = []

    def evaluation(accelerator, state, eval_loader, callbacks, share):
        calls.append(("evaluation", accelerator, state, eval_loader, callbacks, share))
        return {"eval_mlm_loss": 1.0}

    monkeypatch.setattr(loop, "run_evaluation", evaluation)
    monkeypatch.setattr(loop, "write_checkpoint", lambda *given: calls.append(("checkpoint", *given)))
    progress = TrainingProgress(completed_steps=7, epoch=1, micro_batches_in_epoch=12)
    state = type("State", (), {"progress": progress})()
    accelerator, eval_loader, callbacks, data = "accelerator", "eval_loader", "callbacks", "data"  # passed on
    run = RunSettings(output_dir="run", eval_steps=eval_steps, checkpointing_steps="epoch" if each_epoch else "3")
    settings = type("Settings", (), {"run": run})()
    metrics = end_epoch(accelerator, state, eval_loader, callbacks, settings, data, share=0.5)
    assert (progress.epoch, progress.micro_batches_in_epoch, progress.completed_steps) == (2, 0, 7)
    evaluated = (
        [("evaluation", accelerator, state, eval_loader, callbacks, 0.5)] if eval_steps is None else []
    )
    saved = [("checkpoint", accelerator, state, settings, data)] if each_epoch else []
    assert calls == evaluated + saved
    assert metrics == ({"eval_mlm_loss": 1.0} if eval_steps is None else None)


@pytest.mark.parametrize(
    "history, metrics, evaluates",
    [
        ([{"step": 6, "loss": 1.0}, {"step": 6, "eval_mlm_loss": 2.0}], {"eval_mlm_loss": 2.0}, False),
        ([{"step": 4, "eval_mlm_loss": 2.0}, {"step": 6, "loss": 1.0}], {"eval_mlm_loss": 2.0}, True),
        ([{"step": 6, "loss": 1.0}], None, True),
    ],
)
def test_the_final_metrics_evaluate_again_unless_an_evaluation_ran_at_the_last_update(
    monkeypatch, history, metrics, evaluates
):
    calls = []

    def evaluation(accelerator, state, eval_loader, callbacks, share):
        calls.append(share)
        return {"eval_mlm_loss": 3.0}

    monkeypatch.setattr(loop, "run_evaluation", evaluation)
    progress = TrainingProgress(completed_steps=6, log_history=history)
    state = type("State", (), {"progress": progress})()
    final = loop.final_metrics("accelerator", state, "eval_loader", "callbacks", metrics, share=0.75)
    assert calls == ([0.75] if evaluates else [])
    assert final == ({"eval_mlm_loss": 3.0} if evaluates else metrics)


WORKER_ALIVE_AT_EXIT = """
import sys
from torch.utils.data import DataLoader
from hfbert.pretraining import batches
loader = DataLoader(range(1000), **batches.loader_options(num_workers=1, pin_memory=False))
iterator = iter(loader)
next(iterator)
sys.exit(1)  # the loader alive at exit, as the frames of a refusal's traceback keep it
"""


def test_a_process_stopped_with_its_loader_workers_alive_exits():
    """The soak's trial 3822092998: a one-process run that refused on a full disk, with a DataLoader worker,
    never exited: multiprocessing's exit handler ends daemonic children with SIGTERM, which the workers ignore
    (a signal to the process group is the main process's), and then waited for them. Killed, they must not
    make torch's SIGCHLD handler raise at exit either (the soak's trial 2024883001: a traceback)."""
    import subprocess
    import sys

    finished = subprocess.run([sys.executable, "-c", WORKER_ALIVE_AT_EXIT], capture_output=True, timeout=60)
    assert finished.returncode == 1 and b"Traceback" not in finished.stderr, finished.stderr.decode()[-2000:]


def test_an_update_clips_the_gradient_to_the_norm_the_flags_ask_for(tmp_path, run_inputs):
    """AdamW's first step barely depends on the gradient's scale (m / sqrt(v)), so the weights cannot tell the
    clipping; its first moment can: after one update it is (1 - beta1) times the clipped gradient."""
    output_dir = tmp_path / "run"
    max_grad_norm = 0.01
    args = run_args(run_inputs, output_dir, "--max_train_steps", "1", "--checkpointing_steps", "1")
    train_in_process([*args, "--max_grad_norm", str(max_grad_norm), "--eval_steps", "1000"])
    optimizer = torch.load(output_dir / "checkpoint-1" / "optimizer.bin", weights_only=True)
    ((beta1, _),) = {tuple(group["betas"]) for group in optimizer["param_groups"]}
    first_moments = [state["exp_avg"] for state in optimizer["state"].values()]
    clipped_norm = torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(m) for m in first_moments]))
    (logged,) = [row for row in json.loads((output_dir / "log_history.json").read_text()) if "grad_norm" in row]
    assert logged["grad_norm"] > 20 * max_grad_norm  # the norm before clipping: clipping had work to do
    assert clipped_norm.item() / (1 - beta1) == pytest.approx(max_grad_norm, rel=1e-4)
