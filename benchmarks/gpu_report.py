"""Everything a GPU session owes, in one call, into one markdown report.

Parts, in this order, each a subprocess under its own time limit (the report is rewritten after every part, so
a call cut off still leaves the parts done so far):

1. the tests whose code takes a CUDA path (GPU_SUITE; `--suite tests` for all of them), first, so that every
   failing test is named whatever else the call reaches: pytest prints each test's name as it ends, and the
   report lists the failures seen even when the part is cut off;
2. `--deterministic` resume: N steps straight against N/2 + resume + N/2, bit for bit
   (tests/test_training.py::test_half_then_resume_then_half_equals_straight_training, on the GPU);
3. the levers: `bench_loop` at the first --sizes and --seq_lens (default BERT-base, T=128) in one process, the
   Trainer against hfbert's loop eager, with each lever on in turn (LEVERS: the compiled update, CUDA graphs,
   unpadded attention, bf16) and all together;
4. every other size and length (`--sizes base large --seq_lens 128 512`): the loop eager and compiled (its
   CUDA default) against the Trainer;
5. the loop's cost under `--deterministic`, against the eager row of part 3.

Every part's whole output goes to the report's name with `.log` (the report keeps the tables, or an output's
last lines).

The whole call stays within --budget_seconds (default 600: one device call): a part gets its own limit or
what is left of the budget, whichever is less, and is skipped when nothing is left.

    python -m benchmarks.gpu_report --output benchmarks/results/gpu_report.md
    python -m benchmarks.gpu_report --suite_seconds 1 --resume_seconds 1 --sizes base large --seq_lens 128 512 \\
        --output benchmarks/results/gpu_report_sizes.md   # a second call: phase 2's length and BERT-large
    python -m benchmarks.gpu_report --sizes tiny --seq_lens 64 --steps 2 --warmup_steps 2 \\
        --batch_sizes 8 --suite tests/test_files.py --output /tmp/report.md   # a CPU rehearsal
"""

from __future__ import annotations

import argparse
import importlib.util
import re
import subprocess
import sys
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

import torch

from benchmarks.bench_pretraining import describe_machine
from hfbert.configuration_hfbert import PRESETS
from hfbert.files import atomic_path
from hfbert.pretraining.flops import device_peak_flops

REPO = Path(__file__).resolve().parents[1]
RESUME_TEST = "tests/test_training.py::test_half_then_resume_then_half_equals_straight_training"
# The test files whose code runs on the GPU when there is one: the model, its parity with transformers, the
# loop and its speed paths, precision, batches, checkpoints, evaluation, fine-tuning, and every file that
# trains in its own process (runs, streams, recipes, phase 2, run health, the README's quick start). The rest
# (tokenizer, data, files, the cluster tests forced onto gloo) runs the same on a CPU, where CI runs it.
GPU_SUITE = [
    f"tests/{name}.py"
    for name in (
        "test_modeling_hfbert", "test_hf_common", "test_speed_paths", "test_precision", "test_collator",
        "test_training", "test_loop", "test_checkpointing", "test_evaluation", "test_finetune", "test_stream",
        "test_recipes", "test_plan", "test_start_from_weights", "test_run_health_runs", "test_docs",
        "test_update",
    )
]  # fmt: skip
FAILED_TEST = re.compile(r"\b(?:FAILED|ERROR|SUBFAIL) (tests/\S+)")
# Per-device batch sizes of bench_loop by model size and sequence length (fit an 80 GB GPU in fp16).
DEFAULT_BATCH_SIZES = {("base", 128): 128, ("base", 512): 32, ("large", 128): 64, ("large", 512): 16}


@dataclass
class Part:
    """One command of the report and what came of it."""

    title: str
    command: list[str]
    limit_seconds: float
    status: str = "not run"
    seconds: float = 0.0
    output: str = ""
    tables: list[str] = field(default_factory=list)


def markdown_tables(output: str) -> list[str]:
    """The markdown tables (runs of lines starting with '|') in a command's output, with the line before each
    (bench_loop prints its setting there)."""
    lines = output.splitlines()
    tables, start = [], None
    for index, line in enumerate([*lines, ""]):
        if line.startswith("|") and start is None:
            start = index
        elif not line.startswith("|") and start is not None:
            context = next((lines[i] for i in range(start - 1, -1, -1) if lines[i].strip()), "")
            tables.append("\n".join([context, "", *lines[start:index]]).strip())
            start = None
    return tables


def run_part(part: Part, seconds_left: float) -> None:
    """Run the part's command under min(its limit, what is left); record status, time, output and tables."""
    limit = min(part.limit_seconds, seconds_left)
    if limit < 1:
        part.status = "skipped: the budget is spent"
        return
    started = time.perf_counter()
    try:
        done = subprocess.run(part.command, cwd=REPO, capture_output=True, text=True, timeout=limit)
        part.output = done.stdout + done.stderr
        part.status = "ok" if done.returncode == 0 else f"failed (exit {done.returncode})"
    except subprocess.TimeoutExpired as expired:
        part.output = _text(expired.stdout) + _text(expired.stderr)
        part.status = f"timed out after {limit:.0f} s"
    part.seconds = time.perf_counter() - started
    part.tables = markdown_tables(part.output)


def _text(output: bytes | str | None) -> str:
    if isinstance(output, bytes):
        return output.decode(errors="replace")
    return output or ""


def render(parts: list[Part], device: str, started: str) -> str:
    lines = [
        "# GPU report",
        "",
        f"{device}; started {started}; `python -m benchmarks.gpu_report {' '.join(sys.argv[1:])}`",
        "",
        "| part | status | seconds |",
        "|---|---|---|",
        *(f"| {part.title} | {part.status} | {part.seconds:.0f} |" for part in parts),
        "",
    ]
    for part in parts:
        lines += [f"## {part.title}", "", f"`{' '.join(part.command)}`: {part.status}", ""]
        lines += [*(table + "\n" for table in part.tables)]
        failed = list(dict.fromkeys(FAILED_TEST.findall(part.output)))
        if failed:
            lines += [f"Failed ({len(failed)}):", "", *(f"- `{name}`" for name in failed), ""]
        if not part.tables and part.output:
            tail = "\n".join(part.output.strip().splitlines()[-15:])
            lines += ["```", tail, "```", ""]
    return "\n".join(lines).rstrip() + "\n"


def write_report(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with atomic_path(path) as temp_path:
        temp_path.write_text(text, encoding="utf-8")


def bench_loop_command(
    args: argparse.Namespace, size: str, seq_len: int, bench_flags: list[str], run_flags: list[str]
) -> list[str]:
    """bench_loop at `size` and `seq_len` (`bench_flags` its own, `run_flags` run_pretraining.py's)."""
    batch_size = args.batch_sizes[0] if args.batch_sizes else DEFAULT_BATCH_SIZES.get((size, seq_len), 32)
    return [
        sys.executable, "-m", "benchmarks.bench_loop", "--model_size", size, "--batch_size", str(batch_size),
        "--steps", str(args.steps), "--warmup_steps", str(args.warmup_steps), *bench_flags,
        "--", "--max_seq_length", str(seq_len), *run_flags,
    ]  # fmt: skip


# Each lever alone on top of the eager loop, then all together (fp16 stays the CUDA default; bf16 is a lever).
LEVERS = [
    ("eager", "--torch_compile false"),
    ("compiled", "--torch_compile true"),
    ("compiled, CUDA graphs", "--torch_compile true --torch_compile_mode reduce-overhead"),
    ("unpadded attention", "--torch_compile false --attention_padding varlen"),
    ("bf16", "--torch_compile false --mixed_precision bf16"),
    ("all", "--torch_compile true --torch_compile_mode reduce-overhead --attention_padding varlen"),
]


def plan_parts(args: argparse.Namespace) -> list[Part]:
    # no -q: with -v it cancels back to dots, and the H200 report of 2026-11-27 saw 4 failures it could not name
    pytest = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-p", "no:benchmark"]
    workers = ["-n", str(args.workers)] if args.workers and importlib.util.find_spec("xdist") is not None else []
    # -v: each test's outcome and name as it ends (with -n, one line each); -rfE: the failures again at the end.
    parts = [Part("test suite", [*pytest, "-v", "-rfE", *workers, *args.suite], args.suite_seconds)]
    parts.append(Part("--deterministic resume (bit for bit)", [*pytest, RESUME_TEST], args.resume_seconds))
    size, seq_len = args.sizes[0], args.seq_lens[0]
    levers = [flag for name, flags in LEVERS for flag in ("--variant", f"{name}={flags}")]
    command = bench_loop_command(args, size, seq_len, levers, [])
    parts.append(Part(f"bench_loop {size}, T={seq_len}, each lever", command, args.levers_seconds))
    for other_size in args.sizes:
        for other_len in args.seq_lens:
            if (other_size, other_len) == (size, seq_len):
                continue
            variants = [flag for name, flags in LEVERS[:2] for flag in ("--variant", f"{name}={flags}")]
            command = bench_loop_command(args, other_size, other_len, variants, [])
            parts.append(Part(f"bench_loop {other_size}, T={other_len}", command, args.compile_seconds))
    command = bench_loop_command(args, size, seq_len, [], ["--torch_compile", "false", "--deterministic"])
    parts.append(Part(f"bench_loop {size}, T={seq_len}, --deterministic", command, args.bench_seconds))
    return parts


def main(argv: list[str] | None = None) -> list[Part]:
    args = parse_args(argv)
    clock = time.perf_counter()
    accelerator = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    # the peak bench_loop's MFU column is against (fp16, the CUDA default; bf16's is the same on every row)
    device = f"{describe_machine(accelerator)}; {device_peak_flops(accelerator, 'fp16')[1]}"
    started = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    parts = plan_parts(args)
    write_report(args.output, render(parts, device, started))
    log = args.output.with_suffix(".log")
    log.write_text("", encoding="utf-8")
    for part in parts:
        run_part(part, args.budget_seconds - (time.perf_counter() - clock))
        write_report(args.output, render(parts, device, started))
        with log.open("a", encoding="utf-8") as stream:
            stream.write(f"## {part.title}: {part.status} ({part.seconds:.0f} s)\n$ {' '.join(part.command)}\n{part.output}\n")
        print(f"{part.title}: {part.status} ({part.seconds:.0f} s)", flush=True)
    print(f"\nReport: {args.output}")
    return parts


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter, allow_abbrev=False
    )
    parser.add_argument("--output", type=Path, default=REPO / "benchmarks" / "results" / "gpu_report.md")
    parser.add_argument("--budget_seconds", type=float, default=600.0, help="the whole call (default: 600)")
    parser.add_argument("--suite_seconds", type=float, default=330.0, help="limit of the test suite")
    parser.add_argument("--resume_seconds", type=float, default=90.0, help="limit of the resume test")
    parser.add_argument("--bench_seconds", type=float, default=60.0, help="limit of each plain bench_loop run")
    parser.add_argument("--levers_seconds", type=float, default=300.0, help="limit of the levers' bench_loop")
    parser.add_argument("--compile_seconds", type=float, default=180.0, help="limit of each other size's run")
    parser.add_argument(
        "--suite", nargs="+", default=GPU_SUITE, help="what pytest runs (default: the test files with CUDA paths)"
    )
    parser.add_argument("--workers", type=int, default=14, help="pytest-xdist workers, where installed (0: none)")
    parser.add_argument("--sizes", nargs="+", default=["base"], choices=list(PRESETS))
    parser.add_argument("--seq_lens", nargs="+", type=int, default=[128])
    parser.add_argument("--batch_sizes", nargs=1, type=int, help="one batch size for every run (default: by size)")
    parser.add_argument("--steps", type=int, default=30, help="timed updates of each bench_loop run")
    parser.add_argument("--warmup_steps", type=int, default=10, help="untimed updates first")
    args = parser.parse_args(argv)
    limits = ("budget_seconds", "suite_seconds", "resume_seconds", "bench_seconds", "levers_seconds", "compile_seconds")
    for name in (*limits, "steps", "warmup_steps"):
        if getattr(args, name) <= 0:
            parser.error(f"--{name} {getattr(args, name)} must be > 0")
    return args


if __name__ == "__main__":
    main()
