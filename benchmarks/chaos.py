"""Fault-injection soak (issue 44): short tiny pretraining runs, each hit by one or two faults at a random moment,
resumed as a user would (the same command, `--resume_from_checkpoint auto`, as many times as it takes, following
every refusal's fix), with invariants checked after every trial:

- the run ends within a bound, and no process of it is left behind (torchrun's workers too, which it starts in
  sessions of their own: every process of a launch is found by a marker in its environment);
- nothing is lost: every checkpoint seen complete stays loadable unless --checkpoints_total_limit rotated it out or
  the trial damaged it itself; the final folder is complete or absent after every attempt;
- the final weights equal, bit for bit, those of the same command run once without faults on the same number of
  processes (computed once per run shape and code version, and cached);
- every refusal is one line that names a fix, and following the fix works.

    python -m benchmarks.chaos --trials 20 --seed 1
    python -m benchmarks.chaos --replay 2718281828      # one trial, from the seed the table printed for it
    python -m benchmarks.chaos --trials 20 --divergence  # NaN weights at a random update instead, rotation on

A divergence trial (`--divergence`) runs its first attempt through benchmarks/diverging_pretraining.py, whose
weights become NaN after a random update: the run must stop in one line naming the last finite checkpoint (the
newest written before that update), which --checkpoints_total_limit 2 must not have rotated out and beside
which no checkpoint of NaN weights may be; the soak then resumes from it (the divergence was a one-off, as an
fp16 overflow can be), and the final weights must equal the straight run's. Elastic launches are left out: torchrun
would restart the diverging command, which diverges again, within the attempt.

Trials run one after another on CPUs (gloo), each process with OMP_NUM_THREADS=1; the disk-full trials mount a
tmpfs (root only) and unmount it at the trial's end.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import hashlib
import json
import os
import random
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import torch
from safetensors.torch import load_file

from benchmarks.diverging_pretraining import DIVERGE_AT_ENV
from hfbert.checkpointing import MANIFEST_NAME, verify_checkpoint
from hfbert.errors import CheckpointError

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "run_pretraining.py"
DIVERGING_SCRIPT = REPO / "benchmarks" / "diverging_pretraining.py"  # its weights NaN after update DIVERGE_AT
DEFAULT_WORK_DIR = Path("/tmp/hfbert-chaos")
LAUNCH_MARKER = "HFBERT_CHAOS_LAUNCH"  # in the environment of every process an attempt starts
PROGRESS = re.compile(r"pretraining: [^|]*\|[^|]*\| (\d+)/")
# Not anchored at a line's start: the refusal may follow the progress bar's last redraw (no newline) on its line.
REFUSAL = re.compile(r"run_pretraining\.py: error: (.*)$", re.M)
TORCHRUN_REPORT = re.compile(r"^torch\.distributed\.elastic\.multiprocessing\.errors\.ChildFailedError:", re.M)
# torchrun's line for a failed run of its workers; with --max_restarts it then starts them again: a new run of
# the command, in a world the last one changed (a rank killed during a save leaves its half-written files).
WORKERS_FAILED = re.compile(r"^E\d{4} [^\n]*\] failed \(exitcode: -?\d+\)[^\n]*$", re.M)
CHECKPOINT_NAME = re.compile(r"^checkpoint-(\d+)$")

ATTEMPT_SECONDS = 600  # a 2-process attempt: 15-40 s on 2 quiet cores, 100-300 s on 2 cores at load 12; elastic starts up to 3 times
TRIAL_SECONDS = 1800
MAX_ATTEMPTS = 6
DDP_TIMEOUT_SECONDS = 60  # a lost peer ends a collective within the attempt's bound
EXIT_GRACE_SECONDS = 5  # a launcher exits after its workers: what is left after it is an orphan
# ... unless a signal ended the launcher (SIGKILL, or SIGUSR1, which torchrun does not handle): its workers then
# stop by design (process_group.stop_with_the_launcher): the update, the next logging step, a checkpoint, and a store
# that is gone noticed within --ddp_timeout. Trial 435203504 (load 7): still saving 5 s after torchrun died.
ORPHAN_STOP_SECONDS = DDP_TIMEOUT_SECONDS + 60
KILL_WAIT_SECONDS = 30  # a killed process frees its memory before it closes its files
# Two nodes: a node whose peer's torchrun died before the group formed waits in torchrun's static rendezvous,
# 600 s by default, as long as an attempt's bound (trial 3340452800: node 0's torchrun killed 11 s in, at load 8,
# before it started its worker; node 1 waited with an empty log). Shortened as --ddp_timeout is.
RENDEZVOUS_TIMEOUT_SECONDS = 120

LAUNCHES = ("one", "torchrun", "elastic", "nodes")
WORLD_SIZE = {"one": 1, "torchrun": 2, "elastic": 2, "nodes": 2}
SIGNAL_FAULTS = ("kill_rank", "kill_launcher", "term_group", "usr1_group", "stop_cont")
DIVERGENCE_SKIPS = ("elastic",)  # launches a divergence trial leaves out
DAMAGES = ("truncate", "delete", "flip")


# ----------------------------------------------------------------------------------------------- trials


@dataclasses.dataclass(frozen=True)
class Shape:
    """The run: the quick recipe's tiny model cut to a few dozen updates, with checkpoints."""

    steps: int
    checkpointing_steps: int
    total_limit: int | None
    eval_steps: int
    loader_workers: int
    logging_steps: int = 2  # a divergence trial's may be beyond its updates: then only the last one logs

    def args(self) -> list[str]:
        args = ["--max_train_steps", str(self.steps), "--checkpointing_steps", str(self.checkpointing_steps)]
        args += ["--eval_steps", str(self.eval_steps), "--dataloader_num_workers", str(self.loader_workers)]
        args += ["--logging_steps", str(self.logging_steps)]
        if self.total_limit is not None:
            args += ["--checkpoints_total_limit", str(self.total_limit)]
        return args


@dataclasses.dataclass(frozen=True)
class Fault:
    """A signal fault, fired in attempt `attempt` (0: the first run, 1: the first resume) once the progress bar
    shows `at_update` updates, or `at_seconds` after the attempt's start. `target`: the rank (kill_rank,
    stop_cont) or node (kill_launcher) it hits, taken modulo their count; -1 for stop_cont: every process."""

    kind: str
    attempt: int
    at_update: int | None
    at_seconds: float | None
    target: int
    stop_seconds: float = 0.0

    def moment(self) -> str:
        return f"update {self.at_update}" if self.at_update is not None else f"{self.at_seconds:.1f} s"


@dataclasses.dataclass(frozen=True)
class Trial:
    seed: int
    launch: str
    shape: Shape
    faults: tuple[Fault, ...]
    damage: str | None  # done to a file of the newest complete checkpoint after the first faulted attempt
    disk_fraction: float | None  # the output folder on a tmpfs this fraction of the straight run's folder
    node_local_caches: bool  # nodes only: a datasets cache per node, made for this trial
    diverge_at: int | None = None  # the first attempt's weights become NaN after this update

    def describe(self) -> str:
        faults = ", ".join(f"{f.kind}@{f.moment()} (attempt {f.attempt})" for f in self.faults)
        faults += f"divergence@update {self.diverge_at} (attempt 0)" if self.diverge_at else ""
        extras = [f"damage {self.damage}"] if self.damage else []
        extras += [f"disk {self.disk_fraction:.2f}"] if self.disk_fraction else []
        extras += ["node-local caches"] if self.node_local_caches else []
        return f"{self.launch} {self.shape}; {faults}" + "".join(f"; {extra}" for extra in extras)


def generate_trial(seed: int, launches: tuple[str, ...], divergence: bool = False) -> Trial:
    """Everything about a trial, drawn from its own seed: `--replay SEED` rebuilds it (with `--divergence` for a
    divergence trial: the same run shape, rotation on, and NaN weights after an update past the first checkpoint
    instead of the other faults)."""
    draw = random.Random(seed)
    # torchrun --max_restarts would start a diverging command again, diverging again, within one attempt
    launch = draw.choice([launch for launch in launches if launch not in DIVERGENCE_SKIPS] if divergence else launches)
    shape = Shape(
        steps=30,
        checkpointing_steps=draw.choice((3, 7, 10)),
        total_limit=draw.choice((None, 2)),
        eval_steps=draw.choice((1000, 5)),
        loader_workers=draw.choice((0, 1)) if launch == "one" else 0,
    )
    if divergence:  # the loss is read at logging steps only: with 1000, the check of a checkpoint's weights stops it
        shape = dataclasses.replace(shape, total_limit=2, logging_steps=draw.choice((2, 1000)))
        diverge_at = draw.randint(shape.checkpointing_steps + 1, shape.steps - 1)
        return Trial(seed, launch, shape, (), None, None, launch == "nodes" and draw.random() < 0.5, diverge_at)
    kinds = [kind for kind in SIGNAL_FAULTS if not (launch == "one" and kind == "kill_launcher")]
    faults = [random_fault(draw, draw.choice(kinds), attempt=0, steps=shape.steps)]
    if draw.random() < 0.3:  # a second fault during the resume
        faults.append(random_fault(draw, draw.choice(kinds), attempt=1, steps=shape.steps))
    damage = draw.choice(DAMAGES) if draw.random() < 0.35 else None
    disk_fraction = round(draw.uniform(0.15, 1.0), 2) if draw.random() < 0.2 else None
    node_local = launch == "nodes" and draw.random() < 0.5
    return Trial(seed, launch, shape, tuple(faults), damage, disk_fraction, node_local)


def random_fault(draw: random.Random, kind: str, attempt: int, steps: int) -> Fault:
    by_update = draw.random() < 0.6
    return Fault(
        kind=kind,
        attempt=attempt,
        at_update=draw.randint(0, steps) if by_update else None,
        at_seconds=None if by_update else round(draw.uniform(0.2, 14.0), 1),
        target=-1 if kind == "stop_cont" and draw.random() < 0.5 else draw.randint(0, 1),
        stop_seconds=round(draw.uniform(0.5, 6.0), 1) if kind == "stop_cont" else 0.0,
    )


def trial_seeds(seed: int, trials: int) -> list[int]:
    draw = random.Random(seed)
    return [draw.getrandbits(32) for _ in range(trials)]


# ----------------------------------------------------------------------------------------------- launches


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def torchrun(script: Path, *flags: str) -> list[str]:
    return [sys.executable, "-m", "torch.distributed.run", *flags, str(script)]


def launch_commands(launch: str, args: list[str], script: Path = SCRIPT) -> list[list[str]]:
    """One command per launcher (two for two nodes), all of them on this machine."""
    port = str(free_port())
    if launch == "one":
        return [[sys.executable, str(script), *args]]
    if launch == "torchrun":
        return [[*torchrun(script, "--nproc_per_node", "2", "--standalone"), *args]]
    if launch == "elastic":  # docs/cluster.md's elastic command on one node
        rendezvous = ("--rdzv_backend", "c10d", "--rdzv_endpoint", f"127.0.0.1:{port}", "--rdzv_id", "chaos")
        return [[*torchrun(script, "--nnodes", "1", "--nproc_per_node", "2", "--max_restarts", "2", *rendezvous), *args]]
    if launch == "nodes":
        return [
            [*torchrun(script, "--nnodes", "2", "--nproc_per_node", "1", "--node_rank", str(node),
                       "--master_addr", "127.0.0.1", "--master_port", port,
                       "--rdzv_conf", f"timeout={RENDEZVOUS_TIMEOUT_SECONDS}"), *args]
            for node in range(2)
        ]  # fmt: skip
    raise ValueError(f"unknown launch {launch!r}")


def run_env(datasets_cache: Path, marker: str) -> dict[str, str]:
    return {
        **os.environ,
        "PYTHONUNBUFFERED": "1",
        "TOKENIZERS_PARALLELISM": "false",
        "OMP_NUM_THREADS": "1",
        "ACCELERATE_USE_CPU": "1",
        "HF_HUB_OFFLINE": "1",
        "HF_DATASETS_OFFLINE": "1",
        "HF_DATASETS_CACHE": str(datasets_cache),
        LAUNCH_MARKER: marker,
    }


def process_environment(pid: int) -> dict[str, str] | None:
    """None for a process that exited meanwhile (or a zombie, whose environment reads empty)."""
    try:
        raw = Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return None
    entries = [entry.split(b"=", 1) for entry in raw.split(b"\0") if b"=" in entry]
    return {key.decode(errors="replace"): value.decode(errors="replace") for key, value in entries} or None


def parent_of(pid: int) -> int:
    try:  # the field after the parenthesised name, which may hold spaces
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return 0


def is_alive(pid: int) -> bool:
    """Running or still exiting; a zombie has closed its files."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except (OSError, IndexError):
        return False


def is_torchrun(pid: int) -> bool:
    try:
        return b"torch.distributed.run" in Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False


class Launch:
    """The launchers of one attempt, each in a session of its own, and every process they start."""

    def __init__(self, commands: list[list[str]], envs: list[dict[str, str]], logs: list[Path]) -> None:
        self.marker = envs[0][LAUNCH_MARKER]
        self.logs = logs
        self.launchers: list[subprocess.Popen] = []
        for command, env, log in zip(commands, envs, logs, strict=True):
            with log.open("w") as sink:
                self.launchers.append(subprocess.Popen(
                    command, env=env, cwd=REPO, stdout=sink, stderr=subprocess.STDOUT, start_new_session=True
                ))  # fmt: skip

    def pids(self) -> list[int]:
        """Every live process of the launch, whatever its session."""
        found = []
        for entry in Path("/proc").iterdir():
            if entry.name.isdigit():
                environment = process_environment(int(entry.name))
                if environment is not None and environment.get(LAUNCH_MARKER) == self.marker:
                    found.append(int(entry.name))
        return found

    def worker_of_rank(self, rank: int) -> int | None:
        """The training process of `rank` (torchrun gives its workers RANK); the launcher itself for one process."""
        if len(self.launchers) == 1 and self.launchers[0].args[1] == str(SCRIPT):
            return self.launchers[0].pid
        for pid in self.pids():
            environment = process_environment(pid) or {}
            if environment.get("RANK") == str(rank) and is_torchrun(parent_of(pid)):
                return pid
        return None

    def running(self) -> bool:
        return any(launcher.poll() is None for launcher in self.launchers)

    def output(self) -> str:
        return "\n".join(log.read_text(errors="replace") for log in self.logs)

    def progress(self) -> int:
        return max(map(int, PROGRESS.findall(self.output())), default=-1)

    def kill_everything(self) -> None:
        """SIGKILL every process, and wait (up to KILL_WAIT_SECONDS) until each has exited: a killed worker holds
        its files open while the kernel frees its memory, and a tmpfs it wrote to cannot be unmounted before."""
        killed: set[int] = set()
        deadline = time.monotonic() + KILL_WAIT_SECONDS
        while time.monotonic() < deadline:
            found = self.pids()
            for number in (signal.SIGCONT, signal.SIGKILL):  # a stopped process dies of SIGKILL, its waiters may not
                for pid in found:
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(pid, number)
            killed.update(found)
            for launcher in self.launchers:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    launcher.wait(timeout=max(deadline - time.monotonic(), 0))
            if not any(map(is_alive, killed)) and not self.pids():
                return
            time.sleep(0.05)


# ----------------------------------------------------------------------------------------------- attempts


@dataclasses.dataclass
class Attempt:
    returncodes: list[int | None]
    output: str
    fired: list[str]
    hung: bool
    left_behind: list[str]  # command lines of processes alive after every launcher exited
    seconds: float

    @property
    def succeeded(self) -> bool:
        return all(code == 0 for code in self.returncodes)


def due(fault: Fault, launch: Launch, started: float) -> bool:
    if fault.at_seconds is not None:
        return time.monotonic() - started >= fault.at_seconds
    return launch.progress() >= fault.at_update


def fire(fault: Fault, launch: Launch, world_size: int) -> bool:
    """Deliver `fault`; False when its target is not there yet (torchrun has not started the worker)."""
    if fault.kind == "kill_launcher":
        with contextlib.suppress(ProcessLookupError):
            os.kill(launch.launchers[fault.target % len(launch.launchers)].pid, signal.SIGKILL)
        return True
    if fault.kind in ("term_group", "usr1_group"):  # Slurm's preemption signal, to every node's task
        number = signal.SIGTERM if fault.kind == "term_group" else signal.SIGUSR1
        for launcher in launch.launchers:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(launcher.pid, number)
        return True
    pids = launch.pids() if fault.target == -1 else [launch.worker_of_rank(fault.target % world_size)]
    if not pids or None in pids:
        return False
    if fault.kind == "kill_rank":
        with contextlib.suppress(ProcessLookupError):
            os.kill(pids[0], signal.SIGKILL)
        return True
    for pid in pids:  # stop_cont
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGSTOP)
    time.sleep(fault.stop_seconds)
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGCONT)
    return True


def leftovers(launch: Launch) -> list[str]:
    """The command lines of the launch's processes still alive EXIT_GRACE_SECONDS after its launchers exited
    (ORPHAN_STOP_SECONDS where a signal ended a launcher)."""
    killed = any(launcher.returncode is not None and launcher.returncode < 0 for launcher in launch.launchers)
    deadline = time.monotonic() + (ORPHAN_STOP_SECONDS if killed else EXIT_GRACE_SECONDS)
    while launch.pids() and time.monotonic() < deadline:
        time.sleep(0.1)
    left = []
    for pid in launch.pids():
        with contextlib.suppress(OSError):
            command = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            left.append(f"{pid}: {command[:200]}")
    return left


def run_attempt(commands: list[list[str]], envs: list[dict[str, str]], logs: list[Path], faults: list[Fault],
                world_size: int) -> Attempt:  # fmt: skip
    """Run one attempt to its end (or ATTEMPT_SECONDS), firing `faults` when due; every process it started is
    gone when this returns."""
    started, pending, fired = time.monotonic(), list(faults), []
    launch = Launch(commands, envs, logs)
    try:
        while launch.running() and time.monotonic() - started < ATTEMPT_SECONDS:
            for fault in list(pending):
                if due(fault, launch, started) and fire(fault, launch, world_size):
                    pending.remove(fault)
                    fired.append(fault.kind)
            time.sleep(0.05)
        hung = launch.running()
        left = [] if hung else leftovers(launch)
    finally:
        launch.kill_everything()
    codes = [launcher.returncode for launcher in launch.launchers]
    return Attempt(codes, launch.output(), fired, hung, left, time.monotonic() - started)


# ----------------------------------------------------------------------------------------------- inputs and straight runs


def prepare_inputs(work_dir: Path) -> dict[str, Path]:
    """The tests' inputs: a 1000-token WordPiece tokenizer of the shipped sample and the tiny model's config."""
    folder = work_dir / "inputs"
    inputs = {"tokenizer": folder / "tokenizer", "config": folder / "model-config" / "config.json"}
    if not (folder / "done").exists():
        from hfbert import HfBertConfig
        from hfbert.corpus import load_documents
        from hfbert.corpus_arguments import CorpusArguments
        from hfbert.tokenization import train_tokenizer

        documents = load_documents(CorpusArguments())
        tokenizer = train_tokenizer(documents["train"], vocab_size=1000, min_frequency=2, show_progress=False)
        tokenizer.save_pretrained(inputs["tokenizer"])
        sizes = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64)
        HfBertConfig(vocab_size=len(tokenizer), max_position_embeddings=128, **sizes).save_pretrained(
            inputs["config"].parent
        )
        (folder / "done").touch()
    return inputs


def run_args(inputs: dict[str, Path], output_dir: Path, shape: Shape) -> list[str]:
    """The user's one command: the same for the first run and every resume."""
    return [
        "--tokenizer_name", str(inputs["tokenizer"]), "--config_name", str(inputs["config"]),
        "--output_dir", str(output_dir), "--per_device_train_batch_size", "8", "--per_device_eval_batch_size", "32",
        "--max_eval_samples", "64", "--learning_rate", "1e-3", "--mixed_precision", "no",
        "--ddp_timeout", str(DDP_TIMEOUT_SECONDS), *shape.args(), "--resume_from_checkpoint", "auto",
    ]  # fmt: skip


def code_digest() -> str:
    """What the straight runs are cached under: hfbert's code and the entry point."""
    digest = hashlib.sha256()
    for path in sorted([*(REPO / "hfbert").rglob("*.py"), SCRIPT]):
        digest.update(path.relative_to(REPO).as_posix().encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()[:16]


def straight_run(work_dir: Path, inputs: dict[str, Path], shape: Shape, world_size: int, digest: str) -> Path:
    """The folder of the same command run once without faults on `world_size` processes; made once and cached."""
    key = hashlib.sha256(json.dumps([digest, world_size, dataclasses.astuple(shape)]).encode()).hexdigest()[:16]
    folder = work_dir / "straight" / key
    if (folder / "done").exists():
        return folder / "run"
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    launch = "one" if world_size == 1 else "torchrun"
    env = run_env(work_dir / "datasets-cache", f"straight-{key}-{os.getpid()}")
    args = run_args(inputs, folder / "run", shape)
    attempt = run_attempt(launch_commands(launch, args), [env], [folder / "log"], [], world_size)
    if not attempt.succeeded or attempt.left_behind:
        raise RuntimeError(f"the straight run of {shape} on {world_size} failed:\n{attempt.output[-3000:]}")
    (folder / "done").touch()
    return folder / "run"


def folder_bytes(folder: Path) -> int:
    return sum(path.stat().st_size for path in folder.rglob("*") if path.is_file())


# ----------------------------------------------------------------------------------------------- invariants


def complete_checkpoints(output_dir: Path) -> dict[str, int]:
    """Checkpoint folders with a manifest (complete when written), by name -> step."""
    if not output_dir.is_dir():
        return {}
    return {
        path.name: int(match[1])
        for path in output_dir.iterdir()
        if (match := CHECKPOINT_NAME.match(path.name)) and (path / MANIFEST_NAME).is_file()
    }


@dataclasses.dataclass
class Ledger:
    """Every checkpoint seen complete after an attempt, and those the trial damaged itself."""

    total_limit: int | None
    seen: dict[str, int] = dataclasses.field(default_factory=dict)
    damaged: set[str] = dataclasses.field(default_factory=set)

    def check(self, output_dir: Path, final: bool) -> list[str]:
        """A seen checkpoint that no longer verifies; at the trial's end, also one that is gone and was not
        rotated out by --checkpoints_total_limit (a newer complete checkpoint for each kept one)."""
        now = complete_checkpoints(output_dir)
        problems = []
        for name, step in self.seen.items():
            if name in self.damaged:
                continue
            if (output_dir / name).is_dir():
                try:
                    verify_checkpoint(output_dir / name)
                except CheckpointError as error:
                    problems.append(f"lost: {name} was complete and no longer verifies: {error}")
            elif final and not (self.total_limit and sum(later > step for later in now.values()) >= self.total_limit):
                problems.append(f"lost: {name} was complete and is gone (complete now: {sorted(now)})")
        self.seen.update(now)
        return problems


def loads(checkpoint: Path) -> str | None:
    """None when the checkpoint's weights and optimizer state load; else what failed."""
    try:
        verify_checkpoint(checkpoint)
        load_file(checkpoint / "model.safetensors")
        torch.load(checkpoint / "optimizer.bin", map_location="cpu", weights_only=True)
    except Exception as error:  # any failure to load is the finding
        return f"{type(error).__name__}: {' '.join(str(error).split())[:300]}"
    return None


def final_files(folder: Path) -> set[str]:
    """The final folder's files: the run folder's top-level files but the lock and other dot files."""
    if not folder.is_dir():
        return set()
    return {path.name for path in folder.iterdir() if path.is_file() and not path.name.startswith(".")}


def final_folder_problem(output_dir: Path, straight: Path, must_exist: bool) -> str | None:
    present, expected = final_files(output_dir), final_files(straight)
    if present == expected or (not present and not must_exist):
        return None
    if not present:
        return "the run ended without a final folder"
    return f"lost: the final folder is half-written: missing {sorted(expected - present)}, extra {sorted(present - expected)}"


def weights_differ(output_dir: Path, straight: Path) -> list[str]:
    expected, actual = load_file(straight / "model.safetensors"), load_file(output_dir / "model.safetensors")
    if expected.keys() != actual.keys():
        return ["<the names of the weights>"]
    return [name for name, tensor in expected.items() if not torch.equal(actual[name], tensor)]


# ----------------------------------------------------------------------------------------------- refusals and their fixes


def worker_tracebacks(output: str) -> int:
    """Tracebacks but torchrun's own report of a failed worker (whose one-line refusal is above it)."""
    return output.count("Traceback (most recent call last)") - len(TORCHRUN_REPORT.findall(output))


def refusal_of(attempt: Attempt, restarts: bool = False) -> tuple[str | None, str | None]:
    """(the attempt's one refusal line, None), or (None, why it is not one line naming a fix). A fault may
    leave tracebacks of its own (a peer's lost connection) beside a refusal of a later restart. With
    `restarts` (torchrun --max_restarts), each run of the workers is judged alone, and the last one's line is
    the fix to follow."""
    tail = attempt.output[-2500:]
    if worker_tracebacks(attempt.output) and not attempt.fired:
        return None, f"exit {attempt.returncodes} with a traceback instead of a one-line refusal:\n{tail}"
    runs = WORKERS_FAILED.split(attempt.output) if restarts else [attempt.output]
    refused = [lines for run in runs if (lines := sorted(set(REFUSAL.findall(run))))] or [[]]
    for lines in refused:  # every rank may print the same line
        # A fault on one node is seen differently on the others ("my launcher exited", "no peer came"): one fix.
        same_fix = attempt.fired and len({line.rsplit(": ", 1)[-1] for line in lines}) == 1
        if len(lines) != 1 and not same_fix:
            return None, f"exit {attempt.returncodes} with {len(lines)} distinct refusal lines:\n{tail}"
        if not re.search(r"--\w+|free space|again with the same command", lines[0], re.I):
            return None, f"a refusal that names no fix: {lines[0]}"
    return refused[-1][0], None


def suggested_checkpoint(refusal: str) -> Path | None:
    match = re.search(r"--resume_from_checkpoint (\S+)", refusal)
    if match is None or match[1] in ("latest", "auto"):
        return None
    return Path(match[1].rstrip(",;.)"))


def with_resume_flag(args: list[str], *replacement: str) -> list[str]:
    """`args` with `--resume_from_checkpoint auto` replaced by `replacement`."""
    at = args.index("--resume_from_checkpoint")
    return [*args[:at], *replacement, *args[at + 2 :]]


# ----------------------------------------------------------------------------------------------- the disk and the damage


@contextlib.contextmanager
def output_disk(trial_dir: Path, size: int | None):
    """The folder the run's --output_dir goes in: a tmpfs of `size` bytes (unmounted on the way out), or a plain
    folder when `size` is None."""
    disk = trial_dir / "disk"
    disk.mkdir(parents=True)
    if size is None:
        yield disk
        return
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(disk)], check=True)
    try:
        yield disk
    finally:
        subprocess.run(["umount", str(disk)], check=True)


def can_mount() -> bool:
    return os.geteuid() == 0 and shutil.which("mount") is not None


def grow_disk(disk: Path, size: int) -> None:
    """Free space as the refusal asks: the tmpfs made `size` bytes."""
    subprocess.run(["mount", "-o", f"remount,size={size}", str(disk)], check=True)


def damage_newest_checkpoint(output_dir: Path, how: str, draw: random.Random) -> str | None:
    """Truncate, delete or flip a byte of one file of the newest complete checkpoint; what was done, or None
    when there is no complete checkpoint."""
    complete = complete_checkpoints(output_dir)
    if not complete:
        return None
    newest = output_dir / max(complete, key=complete.get)
    path = draw.choice(sorted(path for path in newest.rglob("*") if path.is_file()))
    data, times = path.read_bytes(), path.stat()
    if how == "truncate":
        path.write_bytes(data[: len(data) // 2])
    elif how == "delete":
        path.unlink()
    else:
        at = draw.randrange(len(data)) if data else 0
        path.write_bytes(data[:at] + bytes([data[at] ^ (1 << draw.randrange(8))]) + data[at + 1 :] if data else b"\0")
    if how != "delete":  # as a disk's damage: the modification time kept (a file changed later is the user's edit)
        os.utime(path, ns=(times.st_atime_ns, times.st_mtime_ns))
        # and the change time no later than the manifest's: a disk's damage leaves it, a write sets it, so the
        # manifest's time is moved up to it instead
        manifest = newest / MANIFEST_NAME
        if path != manifest:
            changed = max(manifest.stat().st_mtime_ns, path.stat().st_ctime_ns)
            os.utime(manifest, ns=(changed, changed))
    return f"{how} {path.relative_to(output_dir)}"


# ----------------------------------------------------------------------------------------------- one trial


@dataclasses.dataclass
class Outcome:
    trial: Trial
    attempts: int = 0
    fired: list[str] = dataclasses.field(default_factory=list)
    notes: list[str] = dataclasses.field(default_factory=list)  # damage done, fixes followed
    problems: list[str] = dataclasses.field(default_factory=list)
    bit_equal: bool | None = None
    hung: bool = False
    seconds: float = 0.0

    @property
    def lost(self) -> bool:
        return any(problem.startswith("lost") for problem in self.problems)

    @property
    def survived(self) -> bool:
        return not self.problems


@dataclasses.dataclass
class TrialRun:
    """What a trial's attempts share: where it runs, the straight run it must equal, and the disk."""

    trial: Trial
    trial_dir: Path
    output_dir: Path
    straight: Path
    base_args: list[str]
    envs: list[dict[str, str]]
    disk: Path | None

    def attempt(self, number: int, args: list[str]) -> Attempt:
        logs = [self.trial_dir / f"attempt{number}-launcher{index}.log" for index in range(len(self.envs))]
        faults = [fault for fault in self.trial.faults if fault.attempt == number]
        envs = [{**env, LAUNCH_MARKER: f"{env[LAUNCH_MARKER]}-{number}"} for env in self.envs]
        script = SCRIPT
        if number == 0 and self.trial.diverge_at is not None:
            script, envs = DIVERGING_SCRIPT, [{**env, DIVERGE_AT_ENV: str(self.trial.diverge_at)} for env in envs]
        commands = launch_commands(self.trial.launch, args, script)
        return run_attempt(commands, envs, logs, faults, WORLD_SIZE[self.trial.launch])


def next_args(run: TrialRun, outcome: Outcome, attempt: Attempt, ledger: Ledger) -> list[str] | None:
    """The command of the next attempt after a failed one, following its refusal's fix; None (with the problem
    recorded) when the refusal is not one line naming a fix the soak can follow."""
    refusal, problem = refusal_of(attempt, restarts=run.trial.launch == "elastic")
    if problem:
        outcome.problems.append(problem)
        return None
    checkpoint = suggested_checkpoint(refusal)
    if checkpoint is not None and checkpoint.is_dir():
        outcome.notes.append(f"followed --resume_from_checkpoint {checkpoint.name}")
        return with_resume_flag(run.base_args, "--resume_from_checkpoint", str(checkpoint))
    if "free space" in refusal.lower() and run.disk is not None:  # "Free space" before any checkpoint exists
        grow_disk(run.disk, 4 * folder_bytes(run.straight) + (1 << 20))
        outcome.notes.append("freed space")
        return run.base_args
    if "--overwrite_output_dir" in refusal:
        outcome.notes.append("followed --overwrite_output_dir")
        ledger.seen.clear()  # the user asked for the folder's checkpoints to go
        return with_resume_flag(run.base_args, "--overwrite_output_dir")
    if "--resume_from_checkpoint latest" in refusal:  # e.g. a rank killed while the others wrote a checkpoint
        outcome.notes.append("followed --resume_from_checkpoint latest")
        return with_resume_flag(run.base_args, "--resume_from_checkpoint", "latest")
    if "again with the same command" in refusal:  # e.g. another node's rank killed before the group formed
        outcome.notes.append("started again with the same command")
        return run.base_args
    outcome.problems.append(f"a refusal whose fix the soak cannot follow: {refusal}")
    return None


def checked_attempt(run: TrialRun, outcome: Outcome, ledger: Ledger, number: int, args: list[str]) -> Attempt:
    attempt = run.attempt(number, args)
    outcome.attempts += 1
    outcome.fired += attempt.fired
    if attempt.hung:
        outcome.hung = True
        outcome.problems.append(f"hung: attempt {number} still running after {ATTEMPT_SECONDS} s")
    if attempt.left_behind:
        outcome.hung = True
        outcome.problems.append(f"left behind by attempt {number}: {attempt.left_behind}")
    outcome.problems += ledger.check(run.output_dir, final=False)
    if problem := final_folder_problem(run.output_dir, run.straight, must_exist=False):
        outcome.problems.append(f"after attempt {number}: {problem}")
    return attempt


def after_divergence(run: TrialRun, outcome: Outcome, attempt: Attempt) -> list[str] | None:
    """The command after the attempt whose weights became NaN after update K: it must have stopped in one line
    naming the last finite checkpoint (the newest written before K, which rotation must have kept), with no
    checkpoint of NaN weights beside it; the next attempt resumes from it. None (problems recorded) otherwise."""
    shape, at = run.trial.shape, run.trial.diverge_at
    expected = run.output_dir / f"checkpoint-{shape.checkpointing_steps * ((at - 1) // shape.checkpointing_steps)}"
    outcome.fired.append("divergence")
    refusal, problem = refusal_of(attempt)
    if problem or attempt.succeeded:
        outcome.problems.append(problem or f"diverged at update {at}, and the run ended as if it had not")
        return None
    for name in sorted(complete_checkpoints(run.output_dir)):
        weights = load_file(run.output_dir / name / "model.safetensors")
        if not all(bool(tensor.isfinite().all()) for tensor in weights.values()):
            outcome.problems.append(f"lost: {name}, written after the divergence, holds non-finite weights")
    if f"The last checkpoint whose weights are all finite is {expected} " not in refusal:
        outcome.problems.append(f"diverged at update {at}: the refusal does not name {expected.name}: {refusal}")
    if problem := loads(expected):
        outcome.problems.append(f"lost: the last finite checkpoint {expected.name}: {problem}")
    if outcome.problems:
        return None
    outcome.notes.append(f"resumed the last finite checkpoint {expected.name}")
    return with_resume_flag(run.base_args, "--resume_from_checkpoint", str(expected))


def resume_until_done(run: TrialRun, outcome: Outcome) -> None:
    """Attempts as a user would make them: the same command after a fault, a refusal's fix after a refusal, the
    last finite checkpoint after a divergence."""
    ledger, args, damage_draw = Ledger(run.trial.shape.total_limit), run.base_args, random.Random(run.trial.seed)
    damage_pending, started = run.trial.damage, time.monotonic()
    for number in range(MAX_ATTEMPTS):
        attempt = checked_attempt(run, outcome, ledger, number, args)
        if number == 0 and run.trial.diverge_at is not None and not outcome.problems:
            if (args := after_divergence(run, outcome, attempt)) is None:
                break
            continue
        if outcome.problems or attempt.succeeded:
            break
        if time.monotonic() - started > TRIAL_SECONDS:
            outcome.hung = True
            outcome.problems.append(f"hung: not finished {TRIAL_SECONDS} s after the trial's start")
            break
        if attempt.fired and not REFUSAL.search(attempt.output):  # stopped by the fault: the same command again
            if damage_pending and (done := damage_newest_checkpoint(run.output_dir, damage_pending, damage_draw)):
                outcome.notes.append(f"damaged: {done}")
                ledger.damaged.add(done.split()[1].split("/")[0])
                damage_pending = None
            args = run.base_args
        elif (args := next_args(run, outcome, attempt, ledger)) is None:  # a refusal, faulted or not: its fix
            break
    else:
        outcome.problems.append(f"not finished after {MAX_ATTEMPTS} attempts")
    if not outcome.problems:
        final_checks(run, outcome, ledger)


def final_checks(run: TrialRun, outcome: Outcome, ledger: Ledger) -> None:
    outcome.problems += ledger.check(run.output_dir, final=True)
    if problem := final_folder_problem(run.output_dir, run.straight, must_exist=True):
        outcome.problems.append(problem)
        return
    for name in sorted(set(complete_checkpoints(run.output_dir)) - ledger.damaged):
        if problem := loads(run.output_dir / name):
            outcome.problems.append(f"lost: {name} does not load: {problem}")
    differing = weights_differ(run.output_dir, run.straight)
    outcome.bit_equal = not differing
    if differing:
        outcome.problems.append(f"final weights differ from the straight run's: {differing[:5]}")


def run_trial(trial: Trial, work_dir: Path, inputs: dict[str, Path], digest: str) -> Outcome:
    """Run the trial in work_dir/trials/SEED (removed when it passes); every process and mount it made is gone
    when this returns."""
    started, outcome = time.monotonic(), Outcome(trial)
    straight = straight_run(work_dir, inputs, trial.shape, WORLD_SIZE[trial.launch], digest)
    trial_dir = work_dir / "trials" / str(trial.seed)
    shutil.rmtree(trial_dir, ignore_errors=True)
    size = None if trial.disk_fraction is None else max(int(trial.disk_fraction * folder_bytes(straight)), 65536)
    with output_disk(trial_dir, size) as disk:
        run = TrialRun(trial, trial_dir, disk / "run", straight, run_args(inputs, disk / "run", trial.shape),
                       trial_envs(trial, work_dir, trial_dir), disk if size else None)  # fmt: skip
        resume_until_done(run, outcome)
        outcome.seconds = time.monotonic() - started
        if not outcome.survived and size and run.output_dir.exists():  # kept to look at once the disk is gone
            shutil.copytree(run.output_dir, trial_dir / "run-on-disk", symlinks=True)
        if size or outcome.survived:
            shutil.rmtree(run.output_dir, ignore_errors=True)
    if outcome.survived:
        shutil.rmtree(trial_dir, ignore_errors=True)
    return outcome


def trial_envs(trial: Trial, work_dir: Path, trial_dir: Path) -> list[dict[str, str]]:
    """One environment per launcher; node-local datasets caches are the trial's own (prepared by each node)."""
    marker = f"chaos-{os.getpid()}-{trial.seed}"
    if trial.launch == "nodes" and trial.node_local_caches:
        return [run_env(trial_dir / f"cache-node{node}", marker) for node in range(2)]
    return [run_env(work_dir / "datasets-cache", marker)] * len(launch_commands(trial.launch, []))


# ----------------------------------------------------------------------------------------------- the soak


def outcome_line(outcome: Outcome) -> str:
    verdict = "ok" if outcome.survived else "FAILED"
    equal = {True: "bit-equal", False: "NOT bit-equal", None: "-"}[outcome.bit_equal]
    notes = "".join(f"; {note}" for note in outcome.notes)
    line = f"{outcome.trial.seed:>10}  {verdict:<6} {outcome.seconds:5.0f} s  {outcome.attempts} attempts  {equal}"
    line += f"  fired {outcome.fired or 'nothing'}{notes}\n            {outcome.trial.describe()}"
    return line + "".join(f"\n            ! {problem[:1500]}" for problem in outcome.problems)


def summary_table(rows: list[dict]) -> str:
    """The soak's table, from `result_row`s (of this run, or of several batches read back from results.jsonl)."""
    fired = Counter(kind for row in rows for kind in row["fired"])
    fired.update(note.split()[1] for row in rows for note in row["notes"] if note.startswith("damaged"))
    launches = Counter(row["launch"] for row in rows)
    failing = [str(row["seed"]) for row in rows if not row["survived"]]
    table = [
        ("trials", f"{len(rows)} ({', '.join(f'{name} {count}' for name, count in sorted(launches.items()))})"),
        ("faults by kind", ", ".join(f"{kind} {count}" for kind, count in sorted(fired.items())) or "none"),
        ("full disk (tmpfs of a fraction of the run's folder)", str(sum(row["disk"] is not None for row in rows))),
        ("second fault during the resume", str(sum(len(row["fired"]) > 1 for row in rows))),
        ("survived", str(sum(row["survived"] for row in rows))),
        ("bit-equal", f"{sum(row['bit_equal'] is True for row in rows)} of {len(rows)}"),
        ("lost", str(sum(row["lost"] for row in rows))),
        ("hung or left behind", str(sum(row["hung"] for row in rows))),
        ("failing seeds (--replay SEED)", " ".join(failing) or "none"),
    ]
    return "| | |\n|---|---|\n" + "\n".join(f"| {name} | {value} |" for name, value in table)


def result_row(outcome: Outcome, batch_seed: int | None) -> dict:
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=REPO)
    return {
        "batch_seed": batch_seed, "seed": outcome.trial.seed, "launch": outcome.trial.launch,
        "commit": commit.stdout.strip(), "fired": outcome.fired, "notes": outcome.notes,
        "disk": outcome.trial.disk_fraction, "diverge_at": outcome.trial.diverge_at,
        "survived": outcome.survived, "bit_equal": outcome.bit_equal,
        "lost": outcome.lost, "hung": outcome.hung, "attempts": outcome.attempts,
        "seconds": round(outcome.seconds, 1), "problems": outcome.problems,
    }  # fmt: skip


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--trials", type=int, default=20)
    parser.add_argument("--seed", type=int, default=0, help="the batch's seed: every trial's seed is drawn from it")
    parser.add_argument("--replay", type=int, nargs="+", help="run only these trials, by the seeds the table names")
    parser.add_argument("--launches", nargs="+", choices=LAUNCHES, default=list(LAUNCHES))
    parser.add_argument("--divergence", action="store_true",
                        help="divergence trials: NaN weights after a random update, --checkpoints_total_limit 2")  # fmt: skip
    parser.add_argument("--work_dir", type=Path, default=DEFAULT_WORK_DIR, help="inputs, cached straight runs, trials")
    parser.add_argument("--table_of", type=Path, help="print the table of the trials recorded in this results.jsonl")
    args = parser.parse_args(argv)
    if args.divergence and set(args.launches) <= set(DIVERGENCE_SKIPS):
        parser.error(f"--divergence leaves out {', '.join(DIVERGENCE_SKIPS)}: pass --launches with another launch")
    return args


def stop_on_sigterm(number: int, frame: object) -> None:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)  # a second one would cut the cleanup short
    sys.exit(128 + number)


def main(argv: list[str] | None = None) -> int:
    """Run the trials; 1 when any broke an invariant."""
    args = parse_args(argv)
    if args.table_of:
        print(summary_table([json.loads(line) for line in args.table_of.read_text().splitlines()]))
        return 0
    # Stopped with SIGTERM (a background batch ignores SIGINT), a trial still kills its processes and unmounts.
    signal.signal(signal.SIGTERM, stop_on_sigterm)
    args.work_dir.mkdir(parents=True, exist_ok=True)
    inputs, digest = prepare_inputs(args.work_dir), code_digest()
    launches = tuple(args.launches)
    seeds = args.replay or trial_seeds(args.seed, args.trials)
    rows = []
    for seed in seeds:
        outcome = run_trial(generate_trial(seed, launches, args.divergence), args.work_dir, inputs, digest)
        print(outcome_line(outcome), flush=True)
        rows.append(result_row(outcome, None if args.replay else args.seed))
        with (args.work_dir / "results.jsonl").open("a") as results:  # batches add up there
            results.write(json.dumps(rows[-1]) + "\n")
    print(summary_table(rows))
    return 0 if all(row["survived"] for row in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
