"""Peak memory of the epoch sampler at corpus sizes 10x apart: hfbert's `EpochDraws` (the permutation kept as
torch's int64 tensor, turned into Python ints a block at a time) against the Python list of every index it
held before (`torch.randperm(n).tolist()`).

Each measurement runs in a fresh process (Linux): the growth of its peak resident set size (VmHWM, reset after
the imports) to after the first batch of draw ids of an epoch (what a DataLoader asks for at an epoch's start).

    python -m benchmarks.bench_sampler_memory --instances 1000000 10000000
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

WAYS = ("list", "EpochDraws")

REPO = Path(__file__).resolve().parents[1]  # `python -m benchmarks.<name>` runs from here


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--instances", type=int, nargs="+", default=[1_000_000, 10_000_000])
    parser.add_argument("--batch_size", type=int, default=256)
    parser.add_argument("--measure", choices=WAYS, default=None, help=argparse.SUPPRESS)  # one process's way
    args = parser.parse_args(argv)
    if min(args.instances) < 1 or args.batch_size < 1:
        parser.error("--instances and --batch_size must be >= 1")
    return args


def status_mib(field: str) -> float:
    with open("/proc/self/status") as status:
        return next(int(line.split()[1]) for line in status if line.startswith(field + ":")) / 1024  # kB


def reset_peak() -> None:
    # Linux: "5" resets the peak RSS (VmHWM) to the current one, so a transient peak of the imports is not
    # taken for the sampler's.
    with open("/proc/self/clear_refs", "w") as clear_refs:
        clear_refs.write("5")


def measure(way: str, instances: int, batch_size: int) -> float:
    """MiB the peak RSS grows by to draw the first batch of an epoch's draw ids."""
    import torch

    from hfbert.pretraining.batches import EpochDraws

    reset_peak()
    before = status_mib("VmRSS")
    if way == "list":  # what EpochDraws did before
        order = torch.randperm(instances, generator=torch.Generator().manual_seed(42)).tolist()
        draws = iter(order)
    else:
        draws = iter(EpochDraws(instances, seed=42))
    first = [next(draws) for _ in range(min(batch_size, instances))]
    del first
    return status_mib("VmHWM") - before


def main(argv: list[str] | None = None) -> list[dict[str, float]]:
    args = parse_args(argv)
    if args.measure is not None:
        print(json.dumps(measure(args.measure, args.instances[0], args.batch_size)))
        return []
    rows = []
    for instances in args.instances:
        row = {"instances": instances}
        for way in WAYS:
            command = [sys.executable, "-m", "benchmarks.bench_sampler_memory", "--measure", way,
                       "--instances", str(instances), "--batch_size", str(args.batch_size)]  # fmt: skip
            output = subprocess.run(command, check=True, capture_output=True, text=True, cwd=REPO).stdout
            row[way] = json.loads(output.strip().splitlines()[-1])
        rows.append(row)
    print("| instances | Python list (before), MiB | EpochDraws, MiB |\n|---:|---:|---:|")
    for row in rows:
        print(f"| {row['instances']:,} | {row['list']:.0f} | {row['EpochDraws']:.0f} |")
    return rows


if __name__ == "__main__":
    main()
