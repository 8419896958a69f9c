"""Time to quality: hfbert against transformers' BertForPreTraining, through run_pretraining.py's own pipeline.

Both runs use one tokenizer, the same seed (so the same initial weights: `--model_implementation
transformers` copies hfbert's initial state dict), the same NSP instances, masks and batch order, and the
same wall-clock budget of training time (evaluation excluded), with a constant learning rate after warmup
so that neither schedule depends on where the budget ends. It prints a table and writes a PNG of the
held-out MLM loss over training seconds.

    python benchmarks/time_to_quality.py --budget_seconds 300 --model_size mini

Targets (issue #5): at the same budget hfbert's held-out MLM loss is lower, and hfbert reaches
transformers' final loss in at most 1/3 of the time.
"""

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

REPO = Path(__file__).resolve().parents[1]
IMPLEMENTATIONS = ("hfbert", "transformers")


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--budget_seconds", type=float, default=300.0, help="training time per model")
    parser.add_argument("--model_size", default="mini", choices=["tiny", "mini", "small", "medium", "base"])
    parser.add_argument("--vocab_size", type=int, default=30522, help="tokenizer trained on the sample")
    parser.add_argument("--batch_size", type=int, default=32)
    parser.add_argument("--learning_rate", type=float, default=5e-4)
    parser.add_argument("--num_warmup_steps", type=int, default=50)
    parser.add_argument("--eval_steps", type=int, default=20)
    parser.add_argument("--max_eval_samples", type=int, default=256)
    parser.add_argument("--mixed_precision", default="auto", choices=["auto", "no", "bf16", "fp16"])
    parser.add_argument("--output_dir", type=Path, default=REPO / "runs" / "time_to_quality")
    return parser.parse_args()


def run(command: list[str]) -> None:
    print("+", " ".join(command), flush=True)
    subprocess.run(command, check=True, env={**os.environ, "TOKENIZERS_PARALLELISM": "false"})


def eval_curve(run_dir: Path) -> list[tuple[float, float]]:
    """(training seconds, held-out MLM loss) at every evaluation of a run."""
    history = json.loads((run_dir / "log_history.json").read_text())
    return [(row["train_seconds"], row["eval_mlm_loss"]) for row in history if "eval_mlm_loss" in row]


def seconds_to_reach(curve: list[tuple[float, float]], loss: float) -> float | None:
    """Training seconds at which `curve` first gets down to `loss`, interpolated between evaluations."""
    previous = None
    for seconds, value in curve:
        if value <= loss:
            if previous is None:
                return seconds
            (s0, v0), (s1, v1) = previous, (seconds, value)
            return s0 + (s1 - s0) * (v0 - loss) / (v0 - v1)
        previous = (seconds, value)
    return None


def main() -> None:
    args = parse_args()
    args.output_dir.mkdir(parents=True, exist_ok=True)
    tokenizer_dir = args.output_dir / "tokenizer"
    if not (tokenizer_dir / "tokenizer.json").exists():
        run([sys.executable, str(REPO / "train_tokenizer.py"), "--vocab_size", str(args.vocab_size),
             "--output_dir", str(tokenizer_dir)])  # fmt: skip
    curves = {}
    for implementation in IMPLEMENTATIONS:
        run_dir = args.output_dir / implementation
        run([
            sys.executable, str(REPO / "run_pretraining.py"),
            "--model_implementation", implementation,
            "--tokenizer_name", str(tokenizer_dir),
            "--model_size", args.model_size,
            "--per_device_train_batch_size", str(args.batch_size),
            "--learning_rate", str(args.learning_rate),
            "--lr_scheduler_type", "constant_with_warmup",
            "--num_warmup_steps", str(args.num_warmup_steps),
            "--max_train_steps", "1000000",
            "--max_train_seconds", str(args.budget_seconds),
            "--eval_steps", str(args.eval_steps),
            "--max_eval_samples", str(args.max_eval_samples),
            "--mixed_precision", args.mixed_precision,
            "--logging_steps", "10",
            "--output_dir", str(run_dir),
            "--overwrite_output_dir",
        ])  # fmt: skip
        curves[implementation] = eval_curve(run_dir)

    hfbert, reference = curves["hfbert"], curves["transformers"]
    reference_final = reference[-1][1]
    hfbert_time = seconds_to_reach(hfbert, reference_final)
    precision = json.loads((args.output_dir / "hfbert" / "training_args.json").read_text())["precision"]
    steps = {
        name: json.loads((args.output_dir / name / "eval_results.json").read_text())["step"]
        for name in curves
    }
    print(f"\nTime to quality, {args.model_size}, {precision}, batch {args.batch_size}, "
          f"budget {args.budget_seconds:.0f} s of training each\n")  # fmt: skip
    print("| model | updates in budget | final held-out MLM loss | seconds to transformers' final loss |")
    print("|---|---|---|---|")
    print(f"| transformers BertForPreTraining | {steps['transformers']} | {reference_final:.4f} | "
          f"{reference[-1][0]:.0f} |")  # fmt: skip
    reached = f"{hfbert_time:.0f}" if hfbert_time is not None else "not reached"
    print(f"| hfbert | {steps['hfbert']} | {hfbert[-1][1]:.4f} | {reached} |")
    if hfbert_time is not None:
        print(f"\nhfbert reaches transformers' final loss in {hfbert_time / reference[-1][0]:.2f} of the time "
              "(target <= 0.33)")  # fmt: skip
    print(f"hfbert's final loss is {'lower' if hfbert[-1][1] < reference_final else 'NOT lower'} "
          f"than transformers' at the same budget")  # fmt: skip

    figure, axis = plt.subplots(figsize=(7, 4.2))
    for name, curve in curves.items():
        axis.plot(*zip(*curve, strict=True), marker=".", label=name)
    axis.axhline(reference_final, color="grey", linestyle=":", linewidth=1, label="transformers' final loss")
    axis.set(xlabel="training seconds (evaluation excluded)", ylabel="held-out MLM loss",
             title=f"Time to quality: BERT-{args.model_size}, {precision}, shipped WikiText sample")  # fmt: skip
    axis.grid(alpha=0.3)
    axis.legend()
    figure.tight_layout()
    path = args.output_dir / "time_to_quality.png"
    figure.savefig(path, dpi=120)
    print(f"\ncurves: {path}")


if __name__ == "__main__":
    main()
