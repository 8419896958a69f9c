"""Several nodes on one machine (torchrun launchers that meet at 127.0.0.1, CPU processes, gloo): two nodes of
one process train what one node of two trains and every process exits; nodes that disagree, or that do not
share the output folder, are refused on every rank; a worker killed mid-run is restarted by torchrun and the
run ends where an uninterrupted one ends; docs/cluster.md's Slurm script and elastic command run."""

import contextlib
import itertools
import os
import re
import signal
import socket
import stat
import subprocess
import sys
import time
from pathlib import Path
from unittest import mock

import pytest
import torch
from test_training import REPO, final_weights, run_args, subprocess_env

from hfbert.errors import CheckpointError, Refusal, RunFailure
from hfbert.files import run_folder_lock
from hfbert.pretraining import process_group
from hfbert.pretraining.extras import cluster
from hfbert.pretraining.extras.cluster import differences
from hfbert.pretraining.process_group import ProcessGroupError, checked_on_main_process, form_process_group

BOUND_SECONDS = 240  # every process of a launch has exited by then (one takes 20-40 s on 2 busy cores)
STEPS = ("--max_train_steps", "30", "--checkpointing_steps", "10", "--eval_steps", "1000")
CLUSTER_DOC = REPO / "docs" / "cluster.md"


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def cpu_env(**extra: str) -> dict[str, str]:
    return {**subprocess_env(), "ACCELERATE_USE_CPU": "1", "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", **extra}


def torchrun(*flags: str) -> list[str]:
    return [sys.executable, "-m", "torch.distributed.run", *flags, str(REPO / "run_pretraining.py")]


LAUNCH_MARKER = "HFBERT_TEST_LAUNCH"  # in the environment of every process a launch starts
launches = itertools.count()


def start(command: list[str], env: dict[str, str], log: Path, cwd: Path = REPO) -> subprocess.Popen:
    """In its own session, with a marker in its environment that every process it starts inherits: torchrun
    starts its workers in sessions of their own, so the session alone does not tell whether they still run."""
    launch = f"{os.getpid()}-{next(launches)}"
    with log.open("w") as output:
        process = subprocess.Popen(
            command, env={**env, LAUNCH_MARKER: launch}, cwd=cwd, stdout=output, stderr=subprocess.STDOUT,
            start_new_session=True,
        )  # fmt: skip
    process.marker = f"{LAUNCH_MARKER}={launch}".encode()
    return process


def launched_pids(process: subprocess.Popen) -> list[int]:
    """The live processes of `process`'s launch: the launcher, its workers and theirs, wherever their session
    (an exited process not yet reaped has an empty environment and is not counted)."""
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            environment = (entry / "environ").read_bytes()
        except OSError:  # exited meanwhile
            continue
        if process.marker in environment.split(b"\0"):
            pids.append(int(entry.name))
    return pids


def launch_alive(process: subprocess.Popen) -> bool:
    return bool(launched_pids(process))


def wait_all(processes: list[subprocess.Popen], logs: list[Path], bound: float = BOUND_SECONDS) -> list[tuple[int, str]]:
    """Every launcher's exit code and output; fails (and kills them) if any launcher, or any process one
    started, is alive `bound` seconds after the start."""
    deadline = time.monotonic() + bound
    try:
        for process in processes:
            process.wait(timeout=max(1.0, deadline - time.monotonic()))
        while any(launch_alive(process) for process in processes) and time.monotonic() < deadline:
            time.sleep(0.1)  # workers of an exited launcher
        alive = {str(process.args): launched_pids(process) for process in processes if launch_alive(process)}
        assert not alive, f"still alive after the launcher exited: {alive}"
    except subprocess.TimeoutExpired:
        tails = "\n".join(log.read_text()[-3000:] for log in logs)
        pytest.fail(f"a launch was still running {bound} s after its start:\n{tails}")
    finally:
        for process in processes:
            for pid in launched_pids(process):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
    return [(process.returncode, log.read_text()) for process, log in zip(processes, logs, strict=True)]


def launch_nodes(tmp_path: Path, node_args: list[list[str]], node_envs: list[dict[str, str]], wrappers=None):
    """One torchrun launcher of one process per node, all meeting at 127.0.0.1."""
    port, nodes = str(free_port()), len(node_args)
    wrappers = wrappers or [[]] * nodes
    processes, logs = [], []
    for rank in range(nodes):
        log = tmp_path / f"node{rank}.log"
        flags = ("--nnodes", str(nodes), "--nproc_per_node", "1", "--node_rank", str(rank))
        command = [*wrappers[rank], *torchrun(*flags, "--master_addr", "127.0.0.1", "--master_port", port)]
        processes.append(start([*command, *node_args[rank]], node_envs[rank], log))
        logs.append(log)
    return wait_all(processes, logs)


def assert_clean_success(results: list[tuple[int, str]]) -> None:
    for rank, (code, output) in enumerate(results):
        assert code == 0, f"node {rank} exited with {code}:\n{output[-4000:]}"
        assert "Traceback" not in output and "Error waiting on exit barrier" not in output, output[-4000:]


def assert_same_weights(folder: Path, reference: Path) -> None:
    expected, actual = final_weights(reference), final_weights(folder)
    assert expected.keys() == actual.keys()
    for name, tensor in expected.items():
        assert torch.equal(actual[name], tensor), name


@pytest.fixture(scope="module")
def one_node_of_two(tmp_path_factory, run_inputs) -> Path:
    """The reference: one node of two processes, uninterrupted."""
    folder = tmp_path_factory.mktemp("one-node")
    command = [*torchrun("--nproc_per_node", "2", "--standalone"), *run_args(run_inputs, folder / "run", *STEPS)]
    [(code, output)] = wait_all([start(command, cpu_env(), folder / "log")], [folder / "log"])
    assert code == 0, output[-4000:]
    return folder / "run"


def cache_files(cache: Path) -> dict[str, int]:
    return {str(path): path.stat().st_mtime_ns for path in cache.rglob("*.arrow")}


@pytest.mark.slow
def test_two_nodes_equal_one_node_of_two_processes_and_every_process_exits(tmp_path, run_inputs, one_node_of_two):
    """Three two-node runs: one datasets cache for both nodes, then a cache per node (prepared by each
    node), then again on those caches (read, not written)."""
    shared, local = [tmp_path / "cache"] * 2, [tmp_path / "cache-node0", tmp_path / "cache-node1"]
    for attempt, caches in enumerate((shared, local, local)):
        before = [cache_files(cache) for cache in caches]
        output_dir = tmp_path / f"run{attempt}"
        args = run_args(run_inputs, output_dir, *STEPS)
        envs = [cpu_env(HF_DATASETS_CACHE=str(cache)) for cache in caches]
        assert_clean_success(launch_nodes(tmp_path, [args, args], envs))
        assert_same_weights(output_dir, one_node_of_two)
        after = [cache_files(cache) for cache in caches]
        assert all(after), "every node's cache holds the prepared data"
        if attempt == 2:
            assert after == before, "the prepared caches were read, not written again"


@pytest.mark.slow
def test_nodes_with_different_flags_are_refused_on_every_rank_before_training(tmp_path, run_inputs):
    args = run_args(run_inputs, tmp_path / "run", *STEPS)
    other = [*args, "--learning_rate", "3e-4"]  # the last occurrence of a flag wins
    results = launch_nodes(tmp_path, [args, other], [cpu_env(), cpu_env()])
    for code, output in results:
        assert code != 0
        [line] = [line for line in output.splitlines() if "error: The processes of this run disagree" in line]
        assert re.search(r"rank 1 \(node 1, host [^)]+\): --learning_rate 0\.0003 \(rank 0: 0\.001\)", line), line
    assert not (tmp_path / "run" / "checkpoint-10").exists()


@pytest.mark.slow
def test_a_folder_in_use_is_refused_on_every_node_at_once(tmp_path, run_inputs):
    """Only the main process can take the run folder's lock; its refusal reaches the other nodes' processes
    too, which end with it at once instead of waiting for rank 0 until --ddp_timeout."""
    args = run_args(run_inputs, tmp_path / "run", *STEPS)
    with run_folder_lock(tmp_path / "run"):  # another run holds the folder
        results = launch_nodes(tmp_path, [args, args], [cpu_env(), cpu_env()])
    for node, (code, output) in enumerate(results):
        assert code != 0, f"node {node} exited with 0"
        assert re.search(r"run_pretraining\.py: error: --output_dir \S+ is in use by another training run", output), (
            f"node {node}:\n{output[-3000:]}"
        )


def checked(rank: int, outcome: list, check) -> object:
    """`checked_on_main_process` on `rank` of 2, the main process's `outcome` broadcast to it."""
    accelerator = mock.Mock(is_main_process=rank == 0, num_processes=2)

    def broadcast(objects, from_process):
        if rank:
            objects[:] = outcome
        else:
            outcome[:] = objects

    with mock.patch.object(process_group, "broadcast_object_list", broadcast), mock.patch.object(process_group, "end_process_group"):
        return checked_on_main_process(accelerator, check)


def test_a_main_process_check_gives_every_rank_its_result_or_its_refusal():
    outcome: list = []
    assert checked(0, outcome, lambda: 7) == 7
    assert checked(1, outcome, pytest.fail) == 7  # only the main process checks
    with pytest.raises(CheckpointError, match="in use"):  # the main process keeps its own error
        checked(0, outcome, mock.Mock(side_effect=CheckpointError("--output_dir run is in use")))
    with pytest.raises(Refusal, match="in use"):
        checked(1, outcome, pytest.fail)


def test_a_full_disk_at_the_shared_folder_check_is_one_refusal_on_every_rank(tmp_path):
    """The soak's trial 1594818867: a resume onto a full disk; rank 0's probe write raised OSError (a
    traceback) and rank 1 printed gloo's from the barrier after it."""
    outcome: list = []
    full_disk = mock.patch.object(cluster, "write_json_atomic", side_effect=OSError(28, "No space left on device"))
    for rank in (0, 1):
        accelerator = mock.Mock(is_main_process=rank == 0, num_processes=2)

        def broadcast(objects, from_process, rank=rank):
            if rank:
                objects[:] = outcome
            else:
                outcome[:] = objects

        with (
            full_disk, mock.patch.object(process_group, "broadcast_object_list", broadcast),
            mock.patch.object(process_group, "end_process_group"),
            pytest.raises(Refusal, match=r"^--output_dir .*: no space left writing .*; free space .* same command"),
        ):
            cluster.check_output_dir_shared(tmp_path, accelerator)
    accelerator.wait_for_everyone.assert_not_called()  # rank 1 left with the refusal, not for a barrier


def can_unshare_mounts() -> bool:
    try:
        return subprocess.run(["unshare", "-m", "true"], capture_output=True).returncode == 0
    except FileNotFoundError:
        return False


@pytest.mark.slow
@pytest.mark.skipif(not can_unshare_mounts(), reason="needs `unshare -m` (root or user namespaces)")
def test_an_output_dir_not_shared_by_every_node_is_refused_before_any_work(tmp_path, run_inputs):
    """Node 1 runs in its own mount namespace with another folder mounted where the output folder's parent is:
    the same path, another disk."""
    parent, elsewhere = tmp_path / "shared", tmp_path / "node1-disk"
    parent.mkdir(), elsewhere.mkdir()
    args = run_args(run_inputs, parent / "run", *STEPS)
    own_disk = ["unshare", "-m", "sh", "-c", f'mount --bind "{elsewhere}" "{parent}" && exec "$@"', "sh"]
    results = launch_nodes(tmp_path, [args, args], [cpu_env(), cpu_env()], wrappers=[[], own_disk])
    for code, output in results:
        assert code != 0
        [line] = [line for line in output.splitlines() if "is not one folder shared by every node" in line]
        assert "rank 1 (node 1, host" in line and "rank 0 (" not in line, line
    assert not any(parent.rglob("*")) and not any(elsewhere.rglob("*")), "nothing was written"


def descendants(pid: int) -> list[int]:
    found = [int(child) for child in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    return found + [grandchild for child in found for grandchild in descendants(child)]


def worker_of_rank(launcher: subprocess.Popen, rank: int) -> int:
    """The pid of the training process of `rank` (torchrun gives its workers RANK; torchrun has none)."""
    for pid in descendants(launcher.pid):
        environ = dict(
            entry.split("=", 1) for entry in Path(f"/proc/{pid}/environ").read_text().split("\0") if "=" in entry
        )
        if environ.get("RANK") == str(rank):
            return pid
    raise AssertionError(f"no worker of rank {rank} under {launcher.pid}")


def without_output_dir(args: list[str]) -> list[str]:
    at = args.index("--output_dir")
    return args[:at] + args[at + 2 :]


def documented_block(marker: str) -> str:
    """The fenced code block after `<!-- marker -->` in docs/cluster.md."""
    text = CLUSTER_DOC.read_text()
    return re.search(rf"<!-- {marker} -->\n```bash\n(.*?)```", text, re.S).group(1)


@pytest.mark.slow
def test_a_worker_killed_mid_run_is_restarted_and_ends_equal_to_an_uninterrupted_run(tmp_path, run_inputs, one_node_of_two):
    """docs/cluster.md's elastic command on one node of two processes; rank 0 is SIGKILLed after the first
    checkpoint and torchrun restarts the group, which resumes from it."""
    output_dir = tmp_path / "run"
    args = without_output_dir(run_args(run_inputs, output_dir, *STEPS))
    command = ["bash", "-c", documented_block("elastic-command"), "elastic", *args]
    env = cpu_env(NNODES="1", NPROC_PER_NODE="2", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()),
                  JOB_ID="test", OUTPUT_DIR=str(output_dir))  # fmt: skip
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env['PATH']}"  # this venv's torchrun
    log = tmp_path / "log"
    launcher = start(command, env, log)
    deadline = time.monotonic() + BOUND_SECONDS
    while not (output_dir / "checkpoint-10").exists():
        assert launcher.poll() is None and time.monotonic() < deadline, log.read_text()[-4000:]
        time.sleep(0.02)
    os.kill(worker_of_rank(launcher, 0), signal.SIGKILL)
    [(code, output)] = wait_all([launcher], [log])
    assert code == 0, output[-4000:]
    assert "Resuming from" in output and "checkpoint-10" in output, output[-4000:]
    assert output.count("Resuming from") == 1, "killed after checkpoint-10: one restart"
    assert_same_weights(output_dir, one_node_of_two)


STAND_IN_SRUN = """#!/bin/bash
# srun for the test: one task per node, all on this machine, each with its SLURM_NODEID.
while [[ "$1" == --* ]]; do shift; done
pids=()
for ((node = 0; node < SLURM_NNODES; node++)); do
    SLURM_NODEID=$node SLURM_PROCID=$node HF_DATASETS_CACHE="$CACHE_PREFIX$node" "$@" > "$LOG_PREFIX$node" 2>&1 &
    pids+=($!)
done
status=0
for pid in "${pids[@]}"; do wait "$pid" || status=$?; done
exit $status
"""
STAND_IN_SCONTROL = """#!/bin/bash
# scontrol for the test: the job's hosts are this machine; a requeue is recorded.
case "$1" in
    show) for ((node = 0; node < SLURM_NNODES; node++)); do echo 127.0.0.1; done ;;
    requeue) echo "$2" >> "$REQUEUED" ;;
esac
"""


def install(folder: Path, name: str, script: str) -> None:
    path = folder / name
    path.write_text(script)
    path.chmod(path.stat().st_mode | stat.S_IXUSR)


@pytest.mark.slow
def test_the_slurm_script_runs_one_task_per_node_and_equals_one_node_of_two(tmp_path, run_inputs, one_node_of_two):
    """docs/cluster.md's batch script, run as sbatch would on two nodes, with stand-ins for srun and scontrol
    that start each node's task on this machine (node-local datasets caches)."""
    bin_folder, output_dir = tmp_path / "bin", tmp_path / "run"
    bin_folder.mkdir()
    install(bin_folder, "srun", STAND_IN_SRUN)
    install(bin_folder, "scontrol", STAND_IN_SCONTROL)
    (tmp_path / "hfbert.sbatch").write_text(documented_block("slurm-script"))
    env = cpu_env(
        PATH=f"{bin_folder}{os.pathsep}{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
        SLURM_JOB_ID="35", SLURM_NNODES="2", SLURM_JOB_NODELIST="node[0-1]", GPUS_PER_NODE="1",
        MASTER_PORT=str(free_port()), OUTPUT_DIR=str(output_dir), CACHE_PREFIX=str(tmp_path / "cache-node"),
        LOG_PREFIX=str(tmp_path / "node"), REQUEUED=str(tmp_path / "requeued"),
    )  # fmt: skip
    command = ["bash", str(tmp_path / "hfbert.sbatch"), *without_output_dir(run_args(run_inputs, output_dir, *STEPS))]
    [(code, output)] = wait_all([start(command, env, tmp_path / "log")], [tmp_path / "log"])
    assert code == 0, output[-4000:]
    nodes = [(code, output + (tmp_path / f"node{node}").read_text()) for node in range(2)]
    assert_clean_success(nodes)
    assert not (tmp_path / "requeued").exists()
    assert_same_weights(output_dir, one_node_of_two)


@pytest.mark.parametrize("rank", ["0", "1"])
def test_a_process_group_that_never_forms_stops_naming_master_address_and_port(monkeypatch, rank):
    """Rank 0 hosts the store and waits for a rank that never comes; rank 1 finds no store at the address."""
    port = str(free_port())
    for name, value in {"WORLD_SIZE": "2", "RANK": rank, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": port}.items():
        monkeypatch.setenv(name, value)
    monkeypatch.delenv("TORCHELASTIC_USE_AGENT_STORE", raising=False)
    started = time.monotonic()
    with pytest.raises(ProcessGroupError, match=rf"MASTER_ADDR 127\.0\.0\.1 MASTER_PORT {port} within --ddp_timeout 2 s") as refusal:
        form_process_group(2)
    # The same refusal when another node's rank died before the group formed (the soak's trial 2103068741): it
    # names that case and its fix too, not only a misconfiguration.
    assert str(refusal.value).endswith(
        "if they were, a process on another node stopped first (its log says why): start every node's launcher "
        "again with the same command."
    ), refusal.value
    assert time.monotonic() - started < 60
    assert issubclass(ProcessGroupError, RunFailure)  # entry points print it as one line, exit 1


def test_differences_name_each_flag_version_and_input_that_differs_from_rank_0():
    reference = {
        "flags": {"learning_rate": 1e-3, "seed": 42},
        "corpus content": "aa",
        "tokenizer": "t0",
        "versions": {"torch": "2.13.0", "hfbert": "0.1.0"},
    }
    other = {**reference, "flags": {"learning_rate": 3e-4, "seed": 42}, "tokenizer": "t1", "versions": {"torch": "2.12.0", "hfbert": "0.1.0"}}
    assert differences(reference, reference) == []
    assert differences(reference, other) == [
        "--learning_rate 0.0003 (rank 0: 0.001)",
        "tokenizer 't1' (rank 0: 't0')",
        "torch '2.12.0' (rank 0: '2.13.0')",
    ]


ORPHAN = """
import os, subprocess, sys, time
if sys.argv[1] == "launcher":  # stands in for torchrun: starts the worker in a session of its own, then waits
    worker = subprocess.Popen([sys.executable, "-c", sys.argv[2], *sys.argv[3:]], start_new_session=True)
    print(worker.pid, flush=True)
    time.sleep(600)
else:
    launcher = os.getppid()  # as run_pretraining.py reads it, before its imports
    import hfbert
    if sys.argv[1] == "late":  # the launcher is killed during the worker's imports
        open(sys.argv[2] + "-imported", "w").close()
        while not os.path.exists(sys.argv[2] + "-go"):
            time.sleep(0.05)
    from hfbert.pretraining.process_group import stop_with_the_launcher
    stop_with_the_launcher(launcher)
    open(sys.argv[2], "w").close()
    time.sleep(600)
"""


def running(pid: int) -> bool:
    """Alive and not a zombie (an orphan is reaped by init or the nearest subreaper, which may take its time)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def test_a_worker_of_torchrun_gets_sigterm_when_torchrun_is_killed(tmp_path):
    """torchrun ended by SIGKILL or SIGUSR1 (which it does not forward) left its workers training alone."""
    ready = tmp_path / "ready"
    launcher = subprocess.Popen(
        [sys.executable, "-c", ORPHAN, "launcher", ORPHAN, "worker", str(ready)], cwd=REPO, stdout=subprocess.PIPE,
        text=True, env={**os.environ, "TORCHELASTIC_RUN_ID": "test"},
    )  # fmt: skip
    worker = int(launcher.stdout.readline())
    try:
        deadline = time.monotonic() + 60
        while not ready.exists():
            assert time.monotonic() < deadline, "the worker did not start"
            time.sleep(0.05)
        launcher.kill()
        launcher.wait()
        while running(worker) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not running(worker), "the worker outlived its launcher"
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(worker, signal.SIGKILL)


def test_run_pretraining_reads_its_launcher_before_importing_hfbert():
    """The window the watch leaves is the interpreter's start: run_pretraining.py's first statement reads it."""
    source = (REPO / "run_pretraining.py").read_text()
    assert source.index("LAUNCHER_PID = os.getppid()") < source.index("from hfbert")
    assert "main(launcher_pid=LAUNCHER_PID)" in source
    assert "getppid" not in (REPO / "hfbert" / "__init__.py").read_text()  # importing hfbert registers classes


def test_a_worker_whose_torchrun_died_during_its_imports_stops_saying_so(tmp_path):
    """The soak's trials 1891571895 and 3547280107 (issue 44): torchrun killed 7 s in, while its workers were
    still importing, before they asked the kernel for SIGTERM; they went on alone and waited minutes for the
    store torchrun had hosted. A worker now compares its parent with the one its entry point read before importing
    hfbert."""
    ready, log = tmp_path / "ready", tmp_path / "worker.log"
    launcher = subprocess.Popen(
        [sys.executable, "-c", ORPHAN, "launcher", ORPHAN, "late", str(ready)], cwd=REPO, stdout=subprocess.PIPE,
        stderr=log.open("w"), text=True, env={**os.environ, "TORCHELASTIC_RUN_ID": "test"},
    )  # fmt: skip
    worker = int(launcher.stdout.readline())
    try:
        deadline = time.monotonic() + 60
        while not Path(f"{ready}-imported").exists():
            assert time.monotonic() < deadline, "the worker did not import hfbert"
            time.sleep(0.05)
        launcher.kill()
        launcher.wait()
        Path(f"{ready}-go").touch()
        while running(worker) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not running(worker) and not ready.exists(), "the worker went on without its launcher"
        assert "(torchrun) exited before the worker could start: start every node's launcher again" in log.read_text()  # no pid: one line on every node
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(worker, signal.SIGKILL)


STORE_LOST = """
import os, sys, time
from datetime import timedelta
import torch, torch.distributed as dist
if sys.argv[1] == "host":  # stands in for node 0's torchrun: hosts the store, then waits to be killed
    store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    print(store.port, flush=True)
    time.sleep(600)
rank, port, ready = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
store = dist.TCPStore("127.0.0.1", port, is_master=False, timeout=timedelta(seconds=10))
dist.init_process_group("gloo", store=store, rank=rank, world_size=2, timeout=timedelta(seconds=10))
dist.all_reduce(torch.ones(1))
open(f"{ready}-{rank}", "w").close()
while not os.path.exists(f"{ready}-go"):  # the host is gone
    time.sleep(0.05)

class Accelerator:  # what end_process_group uses of accelerate's
    num_processes = 2
    wait_for_everyone = staticmethod(dist.barrier)
    def end_training(self):
        raise AssertionError("the group was torn down without its store")

from hfbert.pretraining.process_group import end_process_group, exit_now
if end_process_group(Accelerator()):
    sys.exit(1)
exit_now(143)
"""


def test_workers_whose_store_died_with_node_0s_launcher_say_so_and_exit(tmp_path):
    """Issue 44, the soak's finding 2: the final store barrier failed with a traceback, and the process hung at
    exit tearing its process group down. Now one line, and the exit status the stopped run gives."""
    host = subprocess.Popen([sys.executable, "-c", STORE_LOST, "host"], stdout=subprocess.PIPE, text=True)
    port = host.stdout.readline().strip()
    ready = tmp_path / "ready"
    workers = [
        subprocess.Popen(
            [sys.executable, "-c", STORE_LOST, str(rank), port, str(ready)], cwd=REPO, stderr=subprocess.PIPE, text=True
        )
        for rank in (0, 1)
    ]
    try:
        deadline = time.monotonic() + 60
        while not all(Path(f"{ready}-{rank}").exists() for rank in (0, 1)):
            assert time.monotonic() < deadline and all(w.poll() is None for w in workers), "the group did not form"
            time.sleep(0.05)
        host.kill()
        host.wait()
        Path(f"{ready}-go").touch()
        for worker in workers:
            _, stderr = worker.communicate(timeout=60)
            assert worker.returncode == 143, stderr[-2000:]
            assert "The launch's store is gone" in stderr and "Traceback" not in stderr, stderr[-2000:]
    finally:
        for process in (host, *workers):
            with contextlib.suppress(ProcessLookupError):
                process.kill()
