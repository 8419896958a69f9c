"""The processes of a launch: the process group formed for this attempt of it, a worker that stops with its
launcher, the main process's checks given to every rank, and an end after which nothing distributed outlives
the run on any rank (the composition root ends the group: `hfbert.pretraining.run`).

Every function is a no-op, or a check of one process against itself, in a single-process run.
"""

from __future__ import annotations

import ctypes
import gc
import logging
import os
import signal
import sys
import time
import weakref
from collections.abc import Callable
from datetime import timedelta
from typing import Any, NoReturn, TypeVar

import torch
import torch.distributed as dist
from accelerate import Accelerator, PartialState
from accelerate.utils import broadcast_object_list, parse_flag_from_env
from torch.distributed.elastic.utils.store import barrier as store_barrier

from hfbert.errors import Refusal, RunFailure

logger = logging.getLogger(__name__)

# The restart number torchrun gives a worker group (0 at the first start, +1 at every restart after a failure).
RESTART_COUNT_ENV = "TORCHELASTIC_RESTART_COUNT"
# Node 0's workers exit this much later than the other nodes' (see end_process_group); torchrun notices
# an exited worker within its --monitor_interval (0.1 s by default).
EXIT_LINGER_SECONDS = 2.0
# linux/prctl.h: have the kernel send the calling process a signal when its parent exits.
PR_SET_PDEATHSIG = 1


Result = TypeVar("Result")


class ProcessGroupError(RunFailure):
    """The processes of a launch did not form their process group; the message names master address and port
    (printed as one line by the entry point: a cluster problem, not a bug)."""


def attempt_of_launch() -> str:
    return os.environ.get(RESTART_COUNT_ENV, "0")


def stop_with_the_launcher(launcher_pid: int) -> None:
    """Under torchrun, have the kernel send this worker SIGTERM when torchrun exits, whatever ended it.

    torchrun forwards SIGTERM and SIGINT to its workers, but a signal it does not handle ends it at once (SIGUSR1,
    which the README names as a preemption signal) and so does SIGKILL; its workers, in sessions of their own,
    then trained on alone to the end of the run, holding the folder's lock. With this they stop as on a
    preemption instead: a checkpoint and the resume command. A torchrun that died before this call (during the
    imports, seconds) is noticed by the worker's parent, which is then no longer `launcher_pid`, the parent the
    entry point read before its imports: the worker stops with a refusal that says so.
    """
    if "TORCHELASTIC_RUN_ID" not in os.environ or not sys.platform.startswith("linux"):
        return
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG, SIGTERM) failed")
    if os.getppid() != launcher_pid:
        raise ProcessGroupError(
            "The launcher that started this worker (torchrun) exited before the worker could start: start every "
            "node's launcher again with the same command."
        )


def form_process_group(timeout_seconds: int) -> None:
    """Join the launch's process group before the Accelerator is built (accelerate then uses it as it is).

    torchrun keeps one TCPStore for every restart of a worker group (static and c10d rendezvous alike), and
    torch's env:// process group writes its keys there without the restart number: a restarted group could
    read the killed group's gloo addresses ("Gloo connectFullMesh failed ... Connection refused") or its
    barrier counts (a hang). The keys of this group are prefixed with the restart number. A group that does not
    form within `timeout_seconds` (also the timeout of every later collective) stops naming address and port.
    """
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    if world_size < 2 or dist.is_initialized():
        return
    rank = int(os.environ["RANK"])
    address, port = os.environ.get("MASTER_ADDR"), os.environ.get("MASTER_PORT")
    timeout = timedelta(seconds=timeout_seconds)
    try:
        store, _, _ = next(dist.rendezvous("env://", rank, world_size, timeout=timeout))
        attempt_store = dist.PrefixStore(f"hfbert/attempt-{attempt_of_launch()}", store)
        cpu = parse_flag_from_env("ACCELERATE_USE_CPU") or not torch.cuda.is_available()  # as accelerate decides
        PartialState(cpu=cpu, store=attempt_store, rank=rank, world_size=world_size, timeout=timeout)
    except (RuntimeError, TimeoutError, ValueError) as error:  # torch's DistError family, a bad address
        raise ProcessGroupError(
            f"Rank {rank} of {world_size} could not form the process group through MASTER_ADDR {address} "
            f"MASTER_PORT {port} within --ddp_timeout {timeout_seconds} s (restart {attempt_of_launch()}): "
            f"{type(error).__name__}: {' '.join(str(error).split())[:500]}. Start every node's launcher with the "
            "same master address and port (reachable from every node: rank 0's host), --nnodes and "
            "--nproc_per_node; if they were, a process on another node stopped first (its log says why): start "
            "every node's launcher again with the same command."
        ) from error


def end_process_group(accelerator: Accelerator) -> bool:
    """Every rank passes a final barrier, then destroys the process group (and finishes the trackers).
    Returns False where the group could not end: the process must then leave with `exit_now`.

    The barrier goes through the group's store: while a rank waits there its gloo worker threads can take the
    GIL to free the work of the last collective. gloo's destructor joins those threads; run while the main
    thread holds the GIL and a worker still needs it, it deadlocks (a rank hangs after success).
    Where the store is gone (node 0's torchrun, its host, died: every worker then stops as on a preemption),
    the barrier fails, and any teardown of the group after that, even Python's own at exit, hangs in a torch
    destructor."""
    if accelerator.num_processes > 1 and dist.is_initialized():
        accelerator.wait_for_everyone()
        store = dist.distributed_c10d._get_default_store()  # no public accessor; the group's own store
        try:
            store_barrier(store, accelerator.num_processes, f"hfbert/end/attempt-{attempt_of_launch()}")
        except dist.DistNetworkError as error:
            logger.warning(
                f"The launch's store is gone ({' '.join(str(error).split())[:200]}): node 0's launcher exited. "
                "This process exits without tearing down its process group."
            )
            return False
    accelerator.end_training()
    # On node 0 of a launch of several nodes, wait a moment before exiting: node 0's torchrun hosts the store
    # of the launchers' exit barrier and leaves as soon as the last launcher arrives there; a launcher
    # arriving last on another node then lost its store mid-barrier (torch's race: 'Error waiting on exit
    # barrier ... DistNetworkError' after a successful run). Arriving last, node 0 leaves after everyone.
    if int(os.environ.get("GROUP_WORLD_SIZE", "1")) > 1 and os.environ.get("GROUP_RANK") == "0":
        time.sleep(EXIT_LINGER_SECONDS)
    return True


def exit_now(code: int) -> NoReturn:
    """Exit with `code` once the logs and output are flushed, skipping the interpreter's teardown, which hangs
    on a process group that could not end (`end_process_group`). Everything the run wrote is already in place
    (checkpoints and final folder are renamed into place whole)."""
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def release_ddp_wrapper(accelerator: Accelerator, state: Any) -> None:
    """Replace `state.model` (the prepared model) by the model itself and free the DDP wrapper now: its
    Reducer holds the process group, which `end_process_group` must destroy, not a later garbage collection
    after other ranks have gone. The accelerator forgets what it prepared (nothing is saved after this)."""
    model = accelerator.unwrap_model(state.model)
    if model is state.model:
        return
    wrapper = weakref.ref(state.model)
    state.model = model
    accelerator.free_memory()  # its lists of prepared objects hold the wrapper; collects garbage
    gc.collect()
    if wrapper() is not None:
        raise RuntimeError(
            f"The DDP wrapper of the model is still referenced after training ({len(gc.get_referrers(wrapper()))} "
            "referrers); it would destroy the process group at an unknown time"
        )


def checked_on_main_process(accelerator: Accelerator, check: Callable[[], Result]) -> Result:
    """Run `check`, which only the main process can make (the run folder's lock, the checkpoint to resume), and
    give every rank its result or its refusal: a refusal then ends every rank at once, each printing it, instead
    of leaving the other ranks (other nodes' above all) waiting for the main process until --ddp_timeout."""
    outcome: list[Any] = [None, None]  # the result, or the refusal's message
    refusal: Refusal | None = None
    if accelerator.is_main_process:
        try:
            outcome[0] = check()
        except Refusal as raised:
            refusal, outcome[1] = raised, str(raised)
    if accelerator.num_processes > 1:
        broadcast_object_list(outcome, from_process=0)
    if outcome[1] is not None:
        end_process_group(accelerator)
        raise refusal or Refusal(outcome[1])  # the main process keeps its own (e.g. a CheckpointError)
    return outcome[0]
