"""Time to quality: hfbert against transformers' BertForPreTraining, through run_pretraining.py's own stages.

Both runs get the same run_pretraining.py flags (the recipe, after `--`), so the same tokenizer, the same
initial weights (the stock model is built from hfbert's initial state dict), the same NSP instances, masks and
batch order and the same budget of training time (evaluation excluded, the compilation of a compiled update
counted: it happens in the first update); only the model differs. It reports
held-out MLM loss and accuracy and NSP loss and accuracy at the end of the budget, the time hfbert needs to
reach transformers' final held-out MLM loss, and writes a PNG of the held-out curves over training seconds.

    python -m benchmarks.time_to_quality --output_dir runs/ttq -- --model_size mini --max_train_seconds 240 ...

Targets: at the same budget hfbert is strictly better on held-out MLM loss, MLM accuracy and NSP accuracy,
and it reaches transformers' final MLM loss in at most 1/3 of the time.
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
import torch
import torch.nn.functional as F
import transformers

REPO = Path(__file__).resolve().parents[1]
MODELS = ("hfbert", "transformers")
METRICS = ("eval_mlm_loss", "eval_mlm_accuracy", "eval_nsp_loss", "eval_nsp_accuracy")


class StockBertForPreTraining(transformers.BertForPreTraining):
    """transformers' BertForPreTraining behind the training loop's interface: its own dense head and its own
    loss computation (cross-entropy over every position, -100 ignored), then the logits of the masked rows."""

    def forward(
        self,
        input_ids,
        attention_mask,
        token_type_ids,
        labels,
        next_sentence_label,
        mlm_masked_rows_only,
        masked_positions=None,
        attention_padding="mask",
    ):
        if attention_padding != "mask":
            raise ValueError(f"transformers' BERT masks its padding; --attention_padding {attention_padding} is hfbert's")
        output = super().forward(input_ids=input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids)
        logits = output.prediction_logits  # (B, T, V)
        if masked_positions is not None:  # the static form (the loop's default on CUDA): (B, P, V) at the slots
            logits = logits.gather(1, masked_positions[..., None].expand(-1, -1, logits.size(-1)))
        mlm_loss = F.cross_entropy(logits.reshape(-1, logits.size(-1)).float(), labels.reshape(-1))
        nsp_loss = F.cross_entropy(output.seq_relationship_logits.float(), next_sentence_label)
        rows_only = mlm_masked_rows_only and masked_positions is None
        return transformers.utils.ModelOutput(
            mlm_loss=mlm_loss,
            nsp_loss=nsp_loss,
            prediction_logits=logits[labels != -100] if rows_only else logits,
            seq_relationship_logits=output.seq_relationship_logits,
        )


def stock_bert(config) -> StockBertForPreTraining:
    """The reference run's model: stock BERT holding hfbert's initial weights exactly."""
    from hfbert import HfBertForPreTraining

    reference = StockBertForPreTraining(config.to_bert_config())
    reference.load_state_dict(HfBertForPreTraining(config).state_dict(), strict=True)
    return reference


def parse_args() -> tuple[argparse.Namespace, list[str]]:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter, allow_abbrev=False
    )
    parser.add_argument("--output_dir", type=Path, default=REPO / "runs" / "time_to_quality",
                        help="holds the two run folders; do not pass run_pretraining.py's --output_dir")  # fmt: skip
    parser.add_argument("--train", choices=MODELS, help=argparse.SUPPRESS)  # one run, in a subprocess
    args, recipe = parser.parse_known_args()
    return args, [flag for flag in recipe if flag != "--"]


def train_one(model: str, run_dir: Path, recipe: list[str]) -> None:
    """One run of run_pretraining.py's pipeline (`hfbert.pretraining.run.pretrain`) with `model` in place of
    HfBertForPreTraining (its `model_class`), started as --attention_init says."""
    from hfbert import HfBertForPreTraining
    from hfbert.pretraining.cli import parse_args
    from hfbert.pretraining.run import pretrain

    settings = parse_args([*recipe, "--output_dir", str(run_dir), "--overwrite_output_dir"])
    pretrain(settings, model_class=HfBertForPreTraining if model == "hfbert" else stock_bert)


def eval_curve(run_dir: Path) -> list[dict]:
    history = json.loads((run_dir / "log_history.json").read_text())
    return [row for row in history if "eval_mlm_loss" in row]


def seconds_to_reach(curve: list[dict], loss: float) -> float | None:
    """Training seconds at which the held-out MLM loss first gets down to `loss`, interpolated."""
    previous = None
    for row in curve:
        seconds, value = row["train_seconds"], row["eval_mlm_loss"]
        if value <= loss:
            if previous is None:
                return seconds
            (s0, v0), (s1, v1) = previous, (seconds, value)
            return s0 + (s1 - s0) * (v0 - loss) / (v0 - v1)
        previous = (seconds, value)
    return None


def report(output_dir: Path, recipe: list[str]) -> None:
    results = {m: json.loads((output_dir / m / "eval_results.json").read_text()) for m in MODELS}
    curves = {m: eval_curve(output_dir / m) for m in MODELS}
    precision = json.loads((output_dir / "hfbert" / "training_args.json").read_text())["precision"]
    precision = {"no": "fp32"}.get(precision, precision)  # accelerate's name for no autocast
    print(f"\nTime to quality ({precision}, torch {torch.__version__}): run_pretraining.py {' '.join(recipe)}\n")
    print("| model | updates | train s | held-out MLM loss | MLM accuracy | NSP loss | NSP accuracy |")
    print("|---|---|---|---|---|---|---|")
    for model in MODELS:
        r = results[model]
        print(f"| {model} | {r['step']} | {r['train_seconds']:.0f} | " + " | ".join(f"{r[k]:.4f}" for k in METRICS) + " |")
    hfbert, reference = results["hfbert"], results["transformers"]
    better = {
        "MLM loss": hfbert["eval_mlm_loss"] < reference["eval_mlm_loss"],
        "MLM accuracy": hfbert["eval_mlm_accuracy"] > reference["eval_mlm_accuracy"],
        "NSP accuracy": hfbert["eval_nsp_accuracy"] > reference["eval_nsp_accuracy"],
    }
    print("\nhfbert strictly better at the same budget: " + ", ".join(f"{k} {'yes' if v else 'NO'}" for k, v in better.items()))
    reached = seconds_to_reach(curves["hfbert"], reference["eval_mlm_loss"])
    if reached is None:
        print("hfbert did not reach transformers' final held-out MLM loss")
    else:
        print(f"hfbert reaches transformers' final held-out MLM loss after {reached:.0f} s of training, "
              f"{reached / reference['train_seconds']:.2f} of the time (target <= 0.33)")  # fmt: skip
    figure, axes = plt.subplots(1, 2, figsize=(11, 4), constrained_layout=True)
    for index, (model, curve) in enumerate(curves.items()):
        color = f"C{index}"  # one colour per model in both panels
        seconds = [row["train_seconds"] for row in curve]
        axes[0].plot(seconds, [row["eval_mlm_loss"] for row in curve], color=color, marker=".", label=model)
        for metric, style in (("mlm", "-"), ("nsp", "--")):
            axes[1].plot(seconds, [row[f"eval_{metric}_accuracy"] for row in curve], color=color,
                         linestyle=style, marker=".", label=f"{model} {metric.upper()}")  # fmt: skip
    axes[0].set(xlabel="training seconds (evaluation excluded)", ylabel="held-out MLM loss")
    axes[1].set(xlabel="training seconds (evaluation excluded)", ylabel="held-out accuracy", ylim=(0, 1))
    for axis in axes:
        axis.grid(alpha=0.3)
        axis.legend()
    figure.suptitle(f"Time to quality on the shipped WikiText sample ({precision})")
    path = output_dir / "time_to_quality.png"
    figure.savefig(path, dpi=110)
    print(f"\ncurves: {path}")


def main() -> None:
    args, recipe = parse_args()
    if args.train:
        train_one(args.train, args.output_dir / args.train, recipe)
        return
    args.output_dir.mkdir(parents=True, exist_ok=True)
    for model in MODELS:
        command = [sys.executable, "-m", "benchmarks.time_to_quality", "--train", model,
                   "--output_dir", str(args.output_dir), "--", *recipe]  # fmt: skip
        print("+", " ".join(command), flush=True)
        subprocess.run(command, check=True, cwd=REPO, env={**os.environ, "TOKENIZERS_PARALLELISM": "false"})
    report(args.output_dir, recipe)


if __name__ == "__main__":
    main()
