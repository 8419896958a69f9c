"""Which attention start a run should default to, past the 6,000 updates measured before: the quick-start recipe
(tiny, the shipped WikiText-2 sample) trained for `--steps` updates from three starts, one process each, then
held-out MLM and NSP against updates in one plot and a table.

- structured + fade + spread: `--attention_init structured --structured_attention_fade 1 --cls_attention_spread 1`
  (the quick-start recipe as shipped);
- structured: `--attention_init structured`, the patterns kept (the default before issue 43);
- bert: `--attention_init bert` (transformers' initialisation; the default now).

    python -m benchmarks.attention_start --steps 12000 --output_dir /tmp/attention-start   # trains, then reports
    python -m benchmarks.attention_start --output_dir /tmp/attention-start --report          # the report only

Downstream figures come from `python -m benchmarks.downstream` on the three final folders.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

STARTS = {
    "structured-fade-spread": ["--attention_init", "structured", "--structured_attention_fade", "1",
                               "--cls_attention_spread", "1"],
    "structured-plain": ["--attention_init", "structured", "--structured_attention_fade", "0", "--cls_attention_spread", "0"],
    "bert-init": ["--attention_init", "bert", "--structured_attention_fade", "0", "--cls_attention_spread", "0"],
}
REPO = Path(__file__).resolve().parent.parent


def train(start: str, steps: int, eval_steps: int, output_dir: Path, extra: list[str]) -> subprocess.Popen:
    """One run, in the background (the runs share the machine: one thread each); `extra` flags last."""
    command = [sys.executable, str(REPO / "run_pretraining.py"), "--recipe", "quick-start", "--max_train_steps",
               str(steps), "--eval_steps", str(eval_steps), "--checkpointing_steps", "2000", "--logging_steps", "100",
               "--output_dir", str(output_dir / start), "--resume_from_checkpoint", "auto", *STARTS[start], *extra]  # fmt: skip
    log = (output_dir / f"{start}.log").open("w")
    return subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env={**os.environ, "OMP_NUM_THREADS": "1"})


def evaluation_rows(output_dir: Path, start: str) -> list[dict]:
    """The run's evaluation rows: its final log_history.json, or, while it runs, the lines its log printed."""
    history = output_dir / start / "log_history.json"
    if history.is_file():
        return [row for row in json.loads(history.read_text()) if "eval_mlm_loss" in row]
    rows = []
    for line in (output_dir / f"{start}.log").read_text().splitlines():
        found = re.search(r"step (\d+): (eval_mlm_loss .*)$", line)
        if found:
            pairs = (pair.split(" ") for pair in found.group(2).split(", "))
            rows.append({"step": int(found.group(1)), **{name: float(value) for name, value in pairs}})
    return rows


def report(output_dir: Path, starts: list[str]) -> None:
    curves = {start: evaluation_rows(output_dir, start) for start in starts}
    figure, axes = plt.subplots(1, 2, figsize=(11, 4))
    for start, rows in curves.items():
        steps = [row["step"] for row in rows]
        axes[0].plot(steps, [row["eval_mlm_accuracy"] for row in rows], marker="o", label=start)
        axes[1].plot(steps, [row["eval_nsp_accuracy"] for row in rows], marker="o", label=start)
    for axis, name in zip(axes, ("held-out MLM accuracy", "held-out NSP accuracy"), strict=True):
        axis.set_xlabel("updates")
        axis.set_title(name)
        axis.grid(alpha=0.3)
    axes[0].legend()
    figure.tight_layout()
    figure.savefig(output_dir / "attention_start.png", dpi=110)
    print("| start | updates | held-out MLM loss | MLM accuracy | NSP accuracy | at 6,000: MLM / NSP accuracy |")
    print("|---|---|---|---|---|---|")
    for start, rows in curves.items():
        if not rows:
            print(f"| {start} | - | - | - | - | - |")
            continue
        last = rows[-1]
        at_6000 = next((row for row in rows if row["step"] == 6000), None)
        middle = "-" if at_6000 is None else f"{at_6000['eval_mlm_accuracy']:.3f} / {at_6000['eval_nsp_accuracy']:.3f}"
        print(f"| {start} | {last['step']:,} | {last['eval_mlm_loss']:.3f} | {last['eval_mlm_accuracy']:.3f} | "
              f"{last['eval_nsp_accuracy']:.3f} | {middle} |")  # fmt: skip
    print(f"\nPlot: {output_dir / 'attention_start.png'}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--output_dir", type=Path, required=True)
    parser.add_argument("--steps", type=int, default=12000)
    parser.add_argument("--eval_steps", type=int, default=1000)
    parser.add_argument("--starts", nargs="+", choices=list(STARTS), default=list(STARTS))
    parser.add_argument("--report", action="store_true", help="only report the runs in --output_dir")
    args, extra = parser.parse_known_args()  # after `--`: run_pretraining.py flags for every run (tests: tiny)
    args.output_dir.mkdir(parents=True, exist_ok=True)
    if not args.report:
        extra = [flag for flag in extra if flag != "--"]
        runs = [train(start, args.steps, args.eval_steps, args.output_dir, extra) for start in args.starts]
        failed = [start for start, run in zip(args.starts, runs, strict=True) if run.wait() != 0]
        if failed:
            raise SystemExit(f"runs failed: {', '.join(failed)}; see their logs in {args.output_dir}")
    report(args.output_dir, args.starts)


if __name__ == "__main__":
    main()
