"""Data-parallel scaling: tokens/s of run_pretraining.py at 1, 2 and 4 processes on this machine (a sanity
figure on a CPU), the gradient bytes DDP all-reduces per update for BERT-base and -large, and the
data-parallel efficiency those bytes leave at 8, 64 and 256 GPUs.

Efficiency is a model, not a measurement: a ring all-reduce moves 2 (N - 1) / N x bytes through each GPU's
slowest link, so it takes that over the link's bandwidth (NVLink within an 8-GPU node, InfiniBand between
nodes); the latency term (2 (N - 1) hops per bucket) is left out. An update then takes the step plus the
all-reduce where nothing overlaps (the lower bound), or the step plus what of the all-reduce outlasts the
backward (DDP starts a bucket's all-reduce as soon as its gradients are ready; the backward is ~2/3 of the
step), and at least the all-reduce of the embeddings: their gradients are ready last (the backward ends
there, and the word embedding is tied to the MLM decoder), so nothing is left to overlap their bucket with.

    python -m benchmarks.bench_scaling                       # tiny, 1 2 4 processes, ~2 minutes on 2 cores
    python -m benchmarks.bench_scaling --processes 1 2 --model_size mini --steps 40
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import torch

from hfbert.configuration_hfbert import PRESETS, HfBertConfig
from hfbert.modeling_hfbert import HfBertForPreTraining
from hfbert.pretraining.batches import default_max_predictions
from hfbert.pretraining.flops import flops_per_token

REPO = Path(__file__).resolve().parents[1]
GRADIENT_BYTES_PER_PARAMETER = 4  # DDP all-reduces gradients in the parameters' dtype: fp32 under fp16/bf16 autocast
# Published per-GPU, per-direction link bandwidths (bytes/s): NVLink 4 on an H100 SXM node (900 GB/s both
# directions); one 400 Gb/s InfiniBand NDR adapter per GPU (DGX H100 and most H100 clusters).
NVLINK_BANDWIDTH = 450e9
INFINIBAND_BANDWIDTH = 50e9
GPUS_PER_NODE = 8
BACKWARD_SHARE = 2 / 3  # of a step: the window in which DDP's bucketed all-reduce can overlap
# BERT-base at length 128, batch 128, fp16 on one H100: 311,500 tokens/s (docs/speed.md), 52.6 ms a step.
BASE_STEP_SECONDS = 128 * 128 / 311_500


def gradient_bytes(size: str, vocab_size: int = 30522) -> int:
    """Bytes of gradient one update all-reduces: every trainable parameter once (the tied decoder weight is
    the word embedding's), built on the meta device."""
    with torch.device("meta"):
        model = HfBertForPreTraining(HfBertConfig.from_preset(size, vocab_size=vocab_size))
    return GRADIENT_BYTES_PER_PARAMETER * sum(p.numel() for p in model.parameters() if p.requires_grad)


def embedding_gradient_bytes(size: str, vocab_size: int = 30522) -> int:
    """Bytes of the gradients the backward produces last (the embeddings'), whose all-reduce cannot overlap."""
    with torch.device("meta"):
        model = HfBertForPreTraining(HfBertConfig.from_preset(size, vocab_size=vocab_size))
    return GRADIENT_BYTES_PER_PARAMETER * sum(p.numel() for p in model.bert.embeddings.parameters())


def step_seconds(size: str, seq_len: int = 128, mask_share: float = 0.15) -> float:
    """A step of `size` on an H100 at batch 128 x 128: base's measured step scaled by FLOPs per token (the MLM
    head at CUDA's default static slots)."""

    def flops(name: str) -> float:
        with torch.device("meta"):
            model = HfBertForPreTraining(HfBertConfig.from_preset(name, vocab_size=30522))
        return flops_per_token(model.config, seq_len, default_max_predictions(seq_len, mask_share))

    return BASE_STEP_SECONDS * flops(size) / flops("base")


def ring_allreduce_seconds(num_bytes: float, gpus: int) -> float:
    """Bandwidth term of a ring all-reduce over `gpus`: NVLink within one node, InfiniBand across nodes."""
    bandwidth = NVLINK_BANDWIDTH if gpus <= GPUS_PER_NODE else INFINIBAND_BANDWIDTH
    return 2 * (gpus - 1) / gpus * num_bytes / bandwidth


def efficiency(step: float, allreduce: float, last_bucket: float | None = None) -> float:
    """Share of an update spent computing: the whole all-reduce after the step (no `last_bucket`), or what of
    it outlasts the backward, at least the `last_bucket`'s all-reduce."""
    exposed = allreduce if last_bucket is None else max(allreduce - BACKWARD_SHARE * step, last_bucket)
    return step / (step + exposed)


def measure_tokens_per_second(processes: int, args: argparse.Namespace, workdir: Path) -> float:
    """run_pretraining.py on `processes` CPU processes (torchrun): the median of its logged tokens/s (all
    processes together) after the first window."""
    output_dir = workdir / f"run-{processes}"
    flags = [
        "--model_size", args.model_size, "--vocab_size", "8192", "--per_device_train_batch_size", str(args.batch_size),
        "--max_train_steps", str(args.steps), "--logging_steps", str(max(1, args.steps // 5)), "--eval_steps", "100000",
        "--max_eval_samples", "32", "--mixed_precision", "no", "--output_dir", str(output_dir),
    ]  # fmt: skip
    command = [
        sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(processes), "--standalone",
        str(REPO / "run_pretraining.py"), *flags,
    ]  # fmt: skip
    # One thread per process, at every count: on a machine other jobs share, a 2-thread OpenMP team waiting at
    # its barriers for a core measured 3-6x slower than one thread, which would flatter the process counts.
    env = {**os.environ, "ACCELERATE_USE_CPU": "1", "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
    result = subprocess.run(command, capture_output=True, text=True, env=env, cwd=workdir)
    if result.returncode != 0:
        raise RuntimeError(f"{processes} processes failed:\n{result.stderr[-3000:]}")
    rows = json.loads((output_dir / "log_history.json").read_text())
    rates = [row["tokens_per_second"] for row in rows if "tokens_per_second" in row]
    return statistics.median(rates[1:] or rates)


def efficiency_rows(sizes: list[str], gpu_counts: list[int]) -> list[str]:
    rows = [
        "| model | gradient MB per update | step (ms, H100) | GPUs | link | all-reduce (ms) | efficiency, no overlap | "
        "efficiency, overlapped with the backward (embeddings last) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for size in sizes:
        num_bytes, step = gradient_bytes(size), step_seconds(size)
        for gpus in gpu_counts:
            allreduce = ring_allreduce_seconds(num_bytes, gpus)
            last_bucket = ring_allreduce_seconds(embedding_gradient_bytes(size), gpus)
            link = "NVLink" if gpus <= GPUS_PER_NODE else "InfiniBand"
            rows.append(
                f"| {size} | {num_bytes / 1e6:,.0f} | {step * 1e3:.1f} | {gpus} | {link} | {allreduce * 1e3:.1f} | "
                f"{efficiency(step, allreduce):.0%} | {efficiency(step, allreduce, last_bucket):.0%} |"
            )
    return rows


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--processes", type=int, nargs="+", default=[1, 2, 4])
    parser.add_argument("--model_size", default="tiny", choices=list(PRESETS))
    parser.add_argument("--batch_size", type=int, default=16, help="per process")
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--gpus", type=int, nargs="+", default=[8, 64, 256])
    parser.add_argument("--sizes", nargs="+", default=["base", "large"], choices=list(PRESETS))
    args = parser.parse_args(argv)
    for name in ("batch_size", "steps"):
        if getattr(args, name) < 1:
            parser.error(f"--{name} {getattr(args, name)} must be >= 1")
    if min(args.processes + args.gpus) < 1:
        parser.error("--processes and --gpus must be >= 1")
    return args


def main(argv: list[str] | None = None) -> dict[str, object]:
    args = parse_args(argv)
    measured = {}
    with tempfile.TemporaryDirectory() as workdir:
        for processes in args.processes:
            measured[processes] = measure_tokens_per_second(processes, args, Path(workdir))
    single = measured.get(1)
    print(f"run_pretraining.py, {args.model_size}, {args.batch_size} rows per process, one thread each, {os.cpu_count()} CPU cores, fp32:")
    print("| processes | tokens/s (all processes) | vs 1 process |\n|---|---|---|")
    for processes, rate in measured.items():
        print(f"| {processes} | {rate:,.0f} | {f'{rate / single:.2f}x' if single else '-'} |")
    print()
    table = efficiency_rows(args.sizes, args.gpus)
    print("\n".join(table))
    return {"tokens_per_second": measured, "efficiency": table}


if __name__ == "__main__":
    main()
