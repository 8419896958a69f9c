"""The resume and preemption parts of the training loop (hfbert/pretraining/loop.py), fast and in-process: what
a checkpoint records, the budget, the end of an epoch and how several processes agree, with stand-ins for
what a run of several processes would need (issue 45: mutation testing maps only in-process calls)."""

import json
import signal
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from accelerate import Accelerator
from test_training import run_args, train_in_process

from hfbert.checkpointing import RUN_SETTINGS_NAME
from hfbert.pretraining import loop, training
from hfbert.pretraining.callbacks import Callback
from hfbert.pretraining.loop import PreemptionSignals, ProgressBar, end_epoch
from hfbert.pretraining.settings import OutputSettings
from hfbert.pretraining.training import (
    Budget,
    CompileTime,
    LearningRateSchedule,
    Training,
    TrainingProgress,
    synced_train_seconds,
)


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
    return Budget(max_steps, max_seconds, num_epochs=3)


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
    assert settings["precision"] in ("bf16", "no")  # resolved from --mixed_precision auto: compared on resume
    assert (newest / "tokenizer.json").is_file()  # beside the weights: a checkpoint is a model folder
    config = json.loads((newest / "config.json").read_text())
    assert config["hidden_size"] == json.loads(run_inputs["config"].read_text())["hidden_size"]


def test_the_budget_ends_at_its_updates_or_its_seconds_whichever_comes_first():
    steps_only, with_time = budget(10), budget(10, max_seconds=5.0)
    assert not steps_only.is_spent(9, seconds=1e9)
    assert steps_only.is_spent(10, seconds=0.0)
    assert not with_time.is_spent(9, seconds=4.99)
    assert with_time.is_spent(9, seconds=5.0)
    assert with_time.is_spent(10, seconds=0.0)


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
    eval_steps, each_epoch, monkeypatch
):
    calls = []

    def evaluation(training, eval_loader, callbacks):
        calls.append(("evaluation", training.share_spent()))
        return {"eval_mlm_loss": 1.0}

    monkeypatch.setattr(loop, "run_evaluation", evaluation)
    progress = TrainingProgress(completed_steps=7, epoch=1, micro_batches_in_epoch=12)
    stand_in = SimpleNamespace(progress=progress, share_spent=lambda: 0.5,
                               save_checkpoint=lambda *given: calls.append(("checkpoint", *given)))  # fmt: skip
    run = OutputSettings(output_dir="run", eval_steps=eval_steps, checkpointing_steps="epoch" if each_epoch else "3")
    metrics = end_epoch(stand_in, run, "eval_loader", Callback())
    assert (progress.epoch, progress.micro_batches_in_epoch, progress.completed_steps) == (2, 0, 7)
    evaluated = [("evaluation", 0.5)] if eval_steps is None else []
    saved = [("checkpoint",)] if each_epoch else []
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
    history, metrics, evaluates, monkeypatch
):
    calls = []

    def evaluation(training, eval_loader, callbacks):
        calls.append(training.share_spent())
        return {"eval_mlm_loss": 3.0}

    monkeypatch.setattr(loop, "run_evaluation", evaluation)
    progress = TrainingProgress(completed_steps=6, log_history=history)
    stand_in = SimpleNamespace(progress=progress, share_spent=lambda: 0.75)
    final = loop.final_metrics(stand_in, "eval_loader", Callback(), metrics)
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


class Recorder(Callback):
    """Every event `fit` sends, with its arguments."""

    def __init__(self) -> None:
        self.events: list[tuple[Any, ...]] = []

    def on_fit_start(self, progress, share):
        self.events.append(("fit_start", progress.completed_steps, share))

    def on_update(self, step, share):
        self.events.append(("update", step, share))

    def on_log(self, row, share):
        self.events.append(("log", row["step"], share))

    def on_evaluate(self, row, share):
        self.events.append(("evaluate", row["step"], share))

    def on_fit_end(self, progress):
        self.events.append(("fit_end", progress.completed_steps))


@dataclass
class StandInBatches:
    """Two batches an epoch; the epochs the loop asked for are recorded."""

    epochs: list[int] = field(default_factory=list)

    def epoch(self, epoch, position, accelerator):
        self.epochs.append(epoch)
        return iter([{"epoch": epoch}] * 2)

    def logged_epoch(self, epoch):
        return epoch


@dataclass
class StandInAccelerator(Processes):
    mixed_precision: str = "no"
    is_local_main_process: bool = False


@dataclass
class StandInInterval:
    def row(self, accelerator, progress, epoch, learning_rate, flops):
        return {"step": progress.completed_steps, "loss": 1.0}


def fit_with_stand_ins(monkeypatch, progress, max_seconds=None, num_processes=1, evaluate=None, **run):
    """`fit` with every part but its own control flow stood in: it returns what the callbacks saw, the epochs
    the batches were asked for, the checkpoints written and the final metrics (or the `Preempted` raised)."""
    recorder, batches, written = Recorder(), StandInBatches(), []

    def step(stand_in, batch, adjust_loss):  # what a step counts: its micro-batch, here each one an update
        stand_in.progress.micro_batches_in_epoch += 1
        stand_in.update_ended = True

    monkeypatch.setattr(Training, "step", step)
    monkeypatch.setattr(training, "LogInterval", lambda device, seconds: StandInInterval())
    monkeypatch.setattr(loop, "check_loss_is_finite", lambda *given: None)
    monkeypatch.setattr(loop, "evaluate", evaluate or (lambda model, loader, accelerator: {"eval_mlm_loss": 2.0}))

    def write(stand_in):
        written.append(stand_in.progress.completed_steps)
        folder = loop.checkpoint_folder(run["output_dir"], stand_in.progress.completed_steps)
        folder.mkdir(parents=True)
        return folder

    monkeypatch.setattr(Training, "save_checkpoint", write)
    optimization = type("Optimization", (), {"compiles_update": lambda self, device: False})()
    model = type("Model", (), {"train": lambda self: None})()
    optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))])
    accelerator = StandInAccelerator(num_processes, others=[0.0] * (num_processes - 1), device=torch.device("cpu"))
    stand_in = Training(accelerator, model, optimizer, batches, budget(6, max_seconds), None, optimization, None, None,
                        progress)  # fmt: skip
    try:
        result = loop.fit(stand_in, "eval_loader", recorder, OutputSettings(**run))
    except loop.Preempted as stopped:
        result = stopped
    return recorder.events, batches.epochs, written, result


def test_a_resumed_fit_runs_only_the_epochs_left_and_tells_the_callbacks_their_share(monkeypatch, tmp_path):
    # Resumed at update 3, in epoch 1 of 3 (two updates an epoch): epochs 1 and 2 only, to the budget's 6.
    progress = TrainingProgress(completed_steps=3, epoch=1, train_seconds=1.0)
    events, epochs, written, metrics = fit_with_stand_ins(
        monkeypatch, progress, output_dir=str(tmp_path), logging_steps=2, eval_steps=4, checkpointing_steps="epoch"
    )
    assert epochs == [1, 2] and (progress.epoch, progress.micro_batches_in_epoch) == (2, 1)
    assert written == [5]  # the end of epoch 1 (update 5); the budget ends epoch 2 before its end
    assert metrics == {"eval_mlm_loss": 2.0}
    share = [event for event in events if event[0] != "fit_end"]
    assert share == [
        ("fit_start", 3, 0.5),
        ("update", 4, 4 / 6),
        ("log", 4, 4 / 6),
        ("evaluate", 4, 4 / 6),
        ("update", 5, 5 / 6),
        ("update", 6, 1.0),
        ("log", 6, 1.0),
        ("evaluate", 6, 1.0),  # the final evaluation
    ]
    assert events[-1] == ("fit_end", 6)
    assert progress.train_seconds > 1.0  # the clock restarted after the end of epoch 1 still counts


def test_a_fit_under_a_time_budget_on_several_processes_syncs_the_seconds_first(monkeypatch, tmp_path):
    progress = TrainingProgress(completed_steps=0, train_seconds=30.0)
    events, *_ = fit_with_stand_ins(monkeypatch, progress, max_seconds=60.0, num_processes=2, output_dir=str(tmp_path))
    assert events[0] == ("fit_start", 0, 0.5)  # 30 of 60 s already spent, synced before the first update


@pytest.mark.parametrize("checkpointing_steps", ["2", None])
def test_a_signal_stops_the_fit_with_one_checkpoint_at_its_update(monkeypatch, tmp_path, checkpointing_steps):
    def evaluate_then_signal(model, loader, accelerator):
        signal.raise_signal(signal.SIGUSR1)
        return {"eval_mlm_loss": 2.0}

    events, _, written, stopped = fit_with_stand_ins(
        monkeypatch,
        TrainingProgress(),
        evaluate=evaluate_then_signal,
        output_dir=str(tmp_path),
        eval_steps=2,
        checkpointing_steps=checkpointing_steps,
    )
    assert isinstance(stopped, loop.Preempted) and stopped.signal_number == signal.SIGUSR1
    assert written == [2]  # the scheduled checkpoint at update 2 is the stop's; never written twice
    assert f"saved in {tmp_path / 'checkpoint-2'}." in str(stopped)
    assert events[-1] == ("fit_end", 2)


def test_a_signal_during_the_final_evaluation_still_checkpoints_once(monkeypatch, tmp_path):
    def evaluate(model, loader, accelerator):
        if progress.completed_steps == 6:  # the final evaluation, after the last update's checkpoint
            signal.raise_signal(signal.SIGTERM)
        return {"eval_mlm_loss": 2.0}

    progress = TrainingProgress()
    _, _, written, stopped = fit_with_stand_ins(
        monkeypatch, progress, evaluate=evaluate, output_dir=str(tmp_path), eval_steps=4, checkpointing_steps="3"
    )
    assert isinstance(stopped, loop.Preempted) and written == [3, 6]
    assert f"saved in {tmp_path / 'checkpoint-6'}." in str(stopped)


def test_the_compile_time_is_the_first_update_less_the_second_logged_once():
    compile_time = CompileTime()
    compile_time.add(3.5)
    assert compile_time.row() == {}
    compile_time.add(0.5)
    compile_time.add(9.0)  # later updates change nothing
    assert compile_time.row() == {"compile_seconds": 3.0} and compile_time.row() == {}
    faster_first = CompileTime()
    faster_first.add(0.5)
    faster_first.add(0.75)
    assert faster_first.row() == {"compile_seconds": 0.0}


def test_the_progress_bar_counts_updates_and_shows_the_last_rows_losses():
    bar = ProgressBar(StandInAccelerator(1, is_local_main_process=True), budget(6))
    row = {"train_mlm_loss": 2.0, "train_mlm_accuracy": 0.25, "learning_rate": 1e-4, "tokens_per_second": 99.6}
    bar.on_log(row | {"train_nsp_loss": 0.5, "train_nsp_accuracy": 0.75}, share=0.5)
    assert bar.bar.unit == "step" and bar.bar.total == 6
    assert bar.bar.postfix == "lr=1.00e-04, mlm=2.000, mlm_acc=0.250, nsp=0.500, nsp_acc=0.750, tok_s=100"  # sorted
    bar.on_log(row, share=0.5)  # --objective mlm: no NSP columns
    assert "nsp=nan, nsp_acc=nan" in bar.bar.postfix
    bar.on_fit_end(TrainingProgress())


def test_the_step_asks_the_model_for_the_masked_rows_only():
    """The loop's speed path: the MLM head at the masked rows alone (the model's default stays every row)."""
    asked = {}

    class Model(torch.nn.Module):
        def forward(self, **kwargs):
            asked.update(kwargs)
            loss = self.weight.sum()
            return type("Outputs", (), {"mlm_loss": loss, "nsp_loss": None})()

        def __init__(self):
            super().__init__()
            self.weight = torch.nn.Parameter(torch.ones(2))

    model = Model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    optimization = type("Optimization", (), {"compiles_update": lambda self, device: False, "attention_padding": "mask",
                                             "max_grad_norm": 0, "gradient_accumulation_steps": 1})()  # fmt: skip
    schedule = LearningRateSchedule(0.1, 0, "constant")
    stand_in = Training(Accelerator(cpu=True), model, optimizer, None, None, schedule, optimization, None, None)
    stand_in.interval = type("Interval", (), {"add": lambda self, *given: None})()
    stand_in.step({"input_ids": "ids"}, Callback().loss)
    assert asked == {"input_ids": "ids", "mlm_masked_rows_only": True, "attention_padding": "mask"}
