"""Precision stage: the precision a run trains in (and why), --deterministic, and the Accelerator built in it."""

from __future__ import annotations

import logging
import os
from pathlib import Path

import datasets
import torch
import transformers
from accelerate import Accelerator, DataLoaderConfiguration
from accelerate.utils import DistributedDataParallelKwargs, parse_flag_from_env

from hfbert.errors import Refusal
from hfbert.pretraining.settings import OptimizationSettings, OutputSettings, precision_name

logger = logging.getLogger(__name__)

# Gradients as views into DDP's all-reduce buckets: no copy into and out of the buckets each update, and (with
# one micro-batch per update) no second gradient-sized buffer: 0.44 GB for base, 1.34 GB for large. Buckets
# stay at 25 MB, which starts the first all-reduce early in the backward; accelerate's `accumulate` already
# skips the all-reduce (no_sync) on all but the last micro-batch of an update (benchmarks/results/scaling.md).
DDP_SETTINGS = DistributedDataParallelKwargs(gradient_as_bucket_view=True)
BF16_CAPABILITY = (8, 0)  # Ampere: the first GPUs whose tensor cores compute in bf16


def cpu_has_native_bf16() -> bool:
    """True when the CPU executes bf16 dot products natively (AVX512-BF16 or AMX), where bf16 pays."""
    try:
        flags = Path("/proc/cpuinfo").read_text()
    except OSError:
        return False
    return "avx512_bf16" in flags or "amx_bf16" in flags


def resolve_mixed_precision(
    requested: str, launcher_choice: str | None, cuda_capability: tuple[int, int] | None
) -> tuple[str, str]:
    """The precision to train in and why. `launcher_choice` is ACCELERATE_MIXED_PRECISION, which accelerate
    launch sets to 'no' also when --mixed_precision was not given, so only fp16/bf16 there count as a choice.
    `cuda_capability`: the GPU's compute capability, None without CUDA. bf16 on a GPU below 8.0 is refused."""
    reason = "--mixed_precision"
    if requested == "auto" and launcher_choice in ("fp16", "bf16"):
        requested, reason = launcher_choice, "accelerate launch --mixed_precision"
    elif requested == "auto":
        chosen, reason = auto_precision(cuda_capability)
        if launcher_choice == "no" and chosen != "no":  # a user who wrote `no` there meant fp32: say where it is
            reason += (
                "; accelerate launch's --mixed_precision no (also written when not given) chooses nothing: "
                "for fp32 pass --mixed_precision no after the script"
            )
        return chosen, reason
    if requested == "bf16" and cuda_capability is not None and cuda_capability < BF16_CAPABILITY:
        major, minor = cuda_capability
        raise Refusal(
            f"bf16 ({reason} bf16) needs a GPU of compute capability 8.0 or newer; this one has {major}.{minor}: "
            "train in fp16 (--mixed_precision fp16, the CUDA default) or fp32 (--mixed_precision no)."
        )
    if requested == "fp16" and cuda_capability is None:
        fallback = "bf16" if cpu_has_native_bf16() else "no"
        logger.warning(
            f"fp16 was asked for ({reason}) but there is no CUDA device and accelerate would silently ignore it "
            f"on a CPU; training in {fallback} instead."
        )
        return fallback, f"fp16 unavailable on CPU, fell back to {fallback}"
    return requested, reason


def auto_precision(cuda_capability: tuple[int, int] | None) -> tuple[str, str]:
    """--mixed_precision auto: fp16 on CUDA (bf16 one flag away where the GPU has it), bf16 on a CPU with
    native bf16, fp32 elsewhere; with the reason the run logs."""
    if cuda_capability is not None:
        major, minor = cuda_capability
        if cuda_capability >= BF16_CAPABILITY:
            bf16 = f"bf16 is available on this GPU (compute capability {major}.{minor}): --mixed_precision bf16"
        else:
            bf16 = f"this GPU (compute capability {major}.{minor}) has no bf16"
        return "fp16", f"the CUDA default (--mixed_precision auto); {bf16}"
    if cpu_has_native_bf16():
        return "bf16", "this CPU has native bf16 (AMX/AVX512-BF16; --mixed_precision auto)"
    return "no", "this CPU has no native bf16 (--mixed_precision auto)"


def use_deterministic_algorithms() -> None:
    """--deterministic: deterministic kernels only (an op without one raises). Not transformers'
    `enable_full_determinism`, which also sets CUDA_LAUNCH_BLOCKING=1 and so makes every launch wait for the GPU."""
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")  # read when cuBLAS starts: before any matmul
    torch.use_deterministic_algorithms(True)
    torch.backends.cudnn.deterministic = True
    torch.backends.cudnn.benchmark = False


def build_accelerator(optimization: OptimizationSettings, output: OutputSettings) -> tuple[Accelerator, str]:
    """The Accelerator in the resolved precision (logged), with loggers quiet on non-main processes."""
    use_cuda = torch.cuda.is_available() and not parse_flag_from_env("ACCELERATE_USE_CPU")
    precision, reason = resolve_mixed_precision(
        optimization.mixed_precision,
        os.environ.get("ACCELERATE_MIXED_PRECISION"),
        torch.cuda.get_device_capability() if use_cuda else None,
    )
    accelerator = Accelerator(
        mixed_precision=precision,  # accumulation is the training's own (`hfbert.pretraining.training.Training`)
        log_with=output.report_to if output.with_tracking else None,
        project_dir=output.output_dir,
        # Pinned batches are copied while the previous step runs (accelerate's loader moves one batch ahead).
        dataloader_config=DataLoaderConfiguration(non_blocking=torch.cuda.is_available()),
        kwargs_handlers=[DDP_SETTINGS],
    )
    logging.getLogger("hfbert").setLevel(logging.INFO if accelerator.is_main_process else logging.WARNING)
    # accelerate warns at every save that the tied decoder weight is stored once; that is intended here.
    logging.getLogger("accelerate.utils.other").setLevel(logging.ERROR)
    if not accelerator.is_main_process:
        datasets.utils.logging.set_verbosity_error()
        transformers.utils.logging.set_verbosity_error()
    logger.info(
        f"Precision: {precision_name(precision)}: {reason}; device {accelerator.device}, "
        f"{accelerator.num_processes} process(es)."
    )
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    one_thread = torch.get_num_threads() == 1
    if accelerator.device.type == "cpu" and one_thread and cores > accelerator.num_processes:
        logger.warning(
            f"Training on the CPU with 1 thread per process although {cores} cores are free: `accelerate launch` "
            "sets OMP_NUM_THREADS=1 on a machine without a GPU unless told otherwise. Use `accelerate launch "
            "--num_cpu_threads_per_process $(nproc) ...` (divided by --num_processes) for full speed."
        )
    return accelerator, precision
