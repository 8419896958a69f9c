"""The training loop a user runs, against what they would pick instead: transformers' Trainer.

Both train on the same NSP instances (run_pretraining.py's data pipeline on the shipped WikiText-2 sample, or
the corpus flags passed after `--`), from the same initial weights, with the same batch size, precision and
learning rate, one after the other in one process:

- hfbert: run_pretraining.py's own loop (`hfbert.pretraining`: data -> batches -> setup -> fit), with its defaults for the
  device (on CUDA: fp16, the update compiled on static shapes, DataLoader workers, pinned memory); `--compile`
  adds `--torch_compile` (on a CPU, where it is off by default); `-- --torch_compile false` times CUDA's loop
  eager and `-- --torch_compile_mode reduce-overhead` (or max-autotune) with CUDA graphs;
- transformers: `Trainer` + `BertForPreTraining` (sdpa) + `DataCollatorForLanguageModeling`, the same
  precision, `dataloader_num_workers` as hfbert's loader;
- bare step: hfbert's `Training.step` repeated on one batch already on the device (the loop with free batches);
- `--variant NAME=FLAGS` (repeatable): more hfbert loops in the same process, each with FLAGS added to the run's
  (a lever on or off: `eager=--torch_compile false`, `varlen=--attention_padding varlen`), each with its bare
  step, all against the one Trainer run (in the first loop's precision).

Throughput is non-padding tokens/s over the updates after `--warmup_steps`, so without the compilation, whose
seconds (the first update's minus the second's, as the run logs them) are reported apart (instances x their mean
length / seconds, both loops drawing uniformly shuffled batches); the FLOPs per token are the library's
(`hfbert.pretraining.flops.flops_per_token`: hfbert's last layer at [CLS] and the rows its MLM head
computes, the static slots on CUDA or the masked tokens, transformers' every layer and head at every position).
MFU is against the device's datasheet peak (`device_peak_flops`, the row named above the table; none on a CPU
or a GPU without a row) and against the matmul peak measured in the same process; then the loop's share of the
bare step.

    python -m benchmarks.bench_loop --model_size base --batch_size 128 --steps 300 --warmup_steps 50
    python -m benchmarks.bench_loop --model_size mini --batch_size 32 --steps 60 --warmup_steps 20  # CPU
    python -m benchmarks.bench_loop --variant "eager=--torch_compile false" --variant "compiled="  # GPU levers
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
import tempfile
import time
import traceback
from dataclasses import dataclass
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # before datasets is imported: the sample is local
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import torch
from accelerate import Accelerator
from accelerate.state import AcceleratorState, GradientState
from accelerate.utils import set_seed
from transformers import (
    BertForPreTraining,
    DataCollatorForLanguageModeling,
    Trainer,
    TrainerCallback,
    TrainingArguments,
)

from benchmarks.bench_pretraining import describe_machine, measure_matmul_peak, synchronize
from hfbert.configuration_hfbert import PRESETS, HfBertConfig
from hfbert.modeling_hfbert import HfBertForPreTraining
from hfbert.pretraining.batches import build_loaders, resolve_max_predictions, resolve_num_workers
from hfbert.pretraining.callbacks import Callbacks
from hfbert.pretraining.cli import parse_args as parse_run_flags
from hfbert.pretraining.flops import ModelFlops, device_peak_flops, flops_per_token
from hfbert.pretraining.loop import ProgressBar, fit
from hfbert.pretraining.run import build_model, prepare_run_data, run_checkpoints
from hfbert.pretraining.run import start as start_run
from hfbert.pretraining.training import setup_training

DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16, "no": torch.float32}
BARE_STEPS = 20  # timed repetitions of the bare step


class StepClock(TrainerCallback):
    """Wall-clock time (device synchronised) at the end of update `start` and of the last update."""

    def __init__(self, start: int, device: torch.device):
        self.start, self.device, self.times = start, device, {}

    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step in (self.start, state.max_steps):
            synchronize(self.device)
            self.times[state.global_step] = time.perf_counter()


def run_flags(args: argparse.Namespace, output_dir: str, variant_flags: list[str]) -> list[str]:
    # The model has BERT's vocabulary (as in bench_pretraining.py) even where the shipped sample trains a smaller
    # tokenizer: a user's WikiText tokenizer fills it, and the head's size decides what masked rows save.
    config_dir = Path(output_dir) / "model_config"
    HfBertConfig.from_preset(args.model_size, vocab_size=args.vocab_size).save_pretrained(config_dir)
    flags = [
        "--config_name", str(config_dir),
        "--vocab_size", str(args.vocab_size),
        "--per_device_train_batch_size", str(args.batch_size),
        "--max_train_steps", str(args.warmup_steps + args.steps),
        "--logging_steps", str(math.gcd(args.warmup_steps, args.steps)),
        "--eval_steps", str(10**9),
        "--max_eval_samples", "64",
        "--learning_rate", "1e-4",
        "--dupe_factor", str(args.dupe_factor),
        "--output_dir", output_dir,
    ]  # fmt: skip
    return flags + (["--torch_compile"] if args.compile else []) + args.run_flags + variant_flags


@dataclass
class HfbertRun:
    """What the Trainer run and the report take from hfbert's."""

    accelerator: Accelerator
    precision: str
    model: torch.nn.Module  # unwrapped
    num_workers: int
    seed: int
    head_rows: float  # per instance, where hfbert's MLM head runs: the static slots, or the masked share
    compile_seconds: float | None  # None: not compiled


def hfbert_loop(args: argparse.Namespace, output_dir: str, variant_flags: list[str]):
    """Train with hfbert's loop (its stages as `hfbert.pretraining.run.pretrain` composes them, without the final
    folder); returns (run, data, initial weights, mean length, tokens/s after warm-up, bare-step tokens/s)."""
    settings = parse_run_flags(run_flags(args, output_dir, variant_flags))
    optimization = settings.optimization
    accelerator, precision = start_run(settings)
    prepared, _ = prepare_run_data(settings, accelerator, checkpoint=None)
    model, start_callbacks = build_model(settings, prepared.config, None, HfBertForPreTraining)
    set_seed(optimization.seed, device_specific=True)
    device, eval_batch_size = accelerator.device, settings.output.per_device_eval_batch_size
    batches, eval_loader = build_loaders(
        settings.data, optimization, eval_batch_size, device, prepared.tokenizer, prepared.train, prepared.eval_instances
    )
    static_slots = resolve_max_predictions(settings.data, optimization, device)
    flops = ModelFlops(model.config, static_slots, peak_flops_per_process=None)
    checkpoints = run_checkpoints(settings, prepared, precision)
    training, eval_loader = setup_training(model, batches, eval_loader, optimization, accelerator, checkpoints, flops)
    initial = {name: tensor.clone() for name, tensor in model.state_dict().items()}
    callbacks = Callbacks([*start_callbacks, ProgressBar(accelerator, training.budget)])  # as `run.pretrain` has
    fit(training, eval_loader, callbacks, settings.output)
    mean_length = statistics.mean(len(ids) for ids in prepared.train.write()["input_ids"])
    head_rows = static_slots or settings.data.mlm_probability * mean_length
    rows = {row["step"]: row for row in training.progress.log_history if "loss" in row}
    compile_seconds = next((row["compile_seconds"] for row in rows.values() if "compile_seconds" in row), None)
    workers = resolve_num_workers(settings.data.dataloader_num_workers, device)
    run = HfbertRun(accelerator, precision, model, workers, optimization.seed, head_rows, compile_seconds)
    last = max(rows)
    seconds = rows[last]["train_seconds"] - rows[args.warmup_steps]["train_seconds"]
    loop = (last - args.warmup_steps) * args.batch_size * mean_length / seconds
    batch = next(iter(training.batches.loader))
    no_callbacks = Callbacks()  # as the loop's step has
    for _ in range(args.warmup_steps // 2):
        training.step(batch, no_callbacks.loss)
    # Back to back, synchronised at the two ends only: on a GPU the host queues the next step while the device
    # runs this one, as in the loop (a synchronisation around each step measured it below the loop on an H100).
    synchronize(accelerator.device)
    start = time.perf_counter()
    for _ in range(BARE_STEPS):
        training.step(batch, no_callbacks.loss)
    synchronize(accelerator.device)
    bare = BARE_STEPS * int(batch["attention_mask"].sum()) / (time.perf_counter() - start)
    if args.profile:  # where the bare step's time goes, by operator (torch.profiler; benchmarks/results/cpu_profile.md)
        with torch.profiler.profile() as profiler:
            for _ in range(args.profile):
                training.step(batch, no_callbacks.loss)
            synchronize(accelerator.device)
        print(profiler.key_averages().table(sort_by="self_cpu_time_total", row_limit=25), flush=True)
    return run, prepared, initial, mean_length, loop, bare


def trainer_loop(
    args: argparse.Namespace,
    run,
    prepared,
    initial: dict,
    mean_length: float,
    device: torch.device,
    output_dir: str,
) -> tuple[float, BertForPreTraining]:
    """Train transformers' BertForPreTraining with Trainer on the same instances; returns tokens/s."""
    precision = run.precision
    model = BertForPreTraining(prepared.config.to_bert_config())
    model.load_state_dict(initial)
    clock = StepClock(args.warmup_steps, device)
    training_args = TrainingArguments(
        output_dir=output_dir,
        per_device_train_batch_size=args.batch_size,
        max_steps=args.warmup_steps + args.steps,
        learning_rate=1e-4,
        fp16=precision == "fp16",
        bf16=precision == "bf16",
        dataloader_num_workers=run.num_workers,
        dataloader_pin_memory=device.type == "cuda",
        logging_steps=args.steps,
        save_strategy="no",
        report_to=[],
        use_cpu=device.type == "cpu",
        torch_compile=args.compile,
        seed=run.seed,
        disable_tqdm=True,
    )
    collator = DataCollatorForLanguageModeling(prepared.tokenizer, mlm_probability=0.15, pad_to_multiple_of=8)
    trainer = Trainer(
        model=model,
        args=training_args,
        train_dataset=prepared.train.write(),  # the same instances, written: what a Trainer user has
        data_collator=collator,
        callbacks=[clock],
    )
    trainer.train()
    seconds = clock.times[args.warmup_steps + args.steps] - clock.times[args.warmup_steps]
    return args.steps * args.batch_size * mean_length / seconds, model


def reset_accelerate() -> None:
    """accelerate's state is a process-wide singleton: each loop (and the Trainer) starts its own."""
    AcceleratorState._reset_state(reset_partial_state=True)
    GradientState._reset_state()


def main(argv: list[str] | None = None) -> dict[str, float]:
    args = parse_args(argv)
    results: dict[str, float] = {}
    flops: dict[str, float] = {}
    compiled: dict[str, str] = {}
    failed: dict[str, str] = {}
    with tempfile.TemporaryDirectory() as scratch:
        first = None
        for index, (name, variant_flags) in enumerate(args.variant):
            output_dir = str(Path(scratch) / f"hfbert-{index}")
            try:
                run, prepared, initial, mean_length, loop, bare = hfbert_loop(args, output_dir, variant_flags)
            except Exception as error:  # one lever that breaks must not cost the other rows of a device call
                failed[name] = f"{type(error).__name__}: {str(error).strip().splitlines()[0][:160]}"
                print(f"variant {name}: FAILED, {failed[name]}", flush=True)
                traceback.print_exc()
                torch._dynamo.reset()
                reset_accelerate()
                continue
            first = first or (run, prepared, initial, mean_length, run.accelerator.device)
            results[name], results[f"{name} bare step"] = loop, bare
            flops[name] = flops[f"{name} bare step"] = flops_per_token(run.model.config, mean_length, run.head_rows)
            compiled[name] = "eager" if run.compile_seconds is None else f"compiled in {run.compile_seconds:.1f} s"
            print(f"variant {name}: {loop:,.0f} tokens/s in the loop, {bare:,.0f} bare ({compiled[name]})", flush=True)
            reset_accelerate()
        if first is None:
            raise SystemExit(f"every hfbert loop failed: {failed}")
        run, prepared, initial, mean_length, device = first  # read before its accelerate state was reset
        precision = run.precision
        scratch_trainer = str(Path(scratch) / "trainer")
        trainer, reference = trainer_loop(args, run, prepared, initial, mean_length, device, scratch_trainer)
    measured_peak = measure_matmul_peak(device, DTYPES[precision])
    datasheet_peak, peak_line = device_peak_flops(device, precision)
    results["transformers Trainer"] = trainer
    flops["transformers Trainer"] = flops_per_token(reference.config, mean_length)
    print(
        f"\n{args.model_size}, model vocab {prepared.config.vocab_size} (tokenizer {len(prepared.tokenizer)}), batch "
        f"{args.batch_size}, precision {precision}, {len(prepared.train)} NSP instances "
        f"(mean length {mean_length:.1f}), updates {args.warmup_steps}-{args.warmup_steps + args.steps} timed; "
        f"{describe_machine(device)}; FLOPs per token {flops[args.variant[0][0]] / 1e6:,.1f}M (hfbert, MLM head at "
        f"{run.head_rows:.1f} rows an instance), {flops['transformers Trainer'] / 1e6:,.1f}M (transformers); "
        f"{peak_line}; matmul peak measured {measured_peak / 1e9:,.0f} GFLOP/s; hfbert's update: "
        + ", ".join(f"{name} {how} (not timed)" if how != "eager" else f"{name} eager" for name, how in compiled.items())
        + "\n"
    )
    print_table(args, results, flops, failed, measured_peak, datasheet_peak)
    return results


def print_table(
    args: argparse.Namespace, results: dict[str, float], flops: dict[str, float], failed: dict[str, str],
    measured_peak: float, datasheet_peak: float | None,
) -> None:
    """The Markdown table of every loop's tokens/s (`results`, the Trainer's among them), its model FLOP rate
    against the datasheet and the measured peaks, and the failed variants."""
    print("| loop | flags | non-padding tokens/s | model GFLOP/s | MFU | of the measured matmul peak | vs Trainer | "
          "share of the bare step |")
    print("|---|---|---|---|---|---|---|---|")
    variant_flags = {name: " ".join(flags) for name, flags in args.variant}
    for name, reason in failed.items():
        print(f"| {name} | {variant_flags[name]} | failed: {reason} |  |  |  |  |  |")
    for name, tokens in results.items():
        model_flops = tokens * flops[name]
        mfu = "n/a" if datasheet_peak is None else f"{model_flops / datasheet_peak:.1%}"
        bare = results.get(f"{name} bare step")
        print(
            f"| {name} | {variant_flags.get(name, '')} | {tokens:,.0f} | {model_flops / 1e9:,.0f} | {mfu} | "
            f"{model_flops / measured_peak:.1%} | {tokens / results['transformers Trainer']:.2f}x | "
            f"{'' if bare is None else f'{tokens / bare:.0%}'} |"
        )


def variant(text: str) -> tuple[str, list[str]]:
    """`NAME=FLAGS` -> (NAME, the flags split as a shell would, without quotes)."""
    name, separator, flags = text.partition("=")
    if not separator or not name:
        raise argparse.ArgumentTypeError(f"{text!r} is not NAME=FLAGS; e.g. 'eager=--torch_compile false'")
    return name, flags.split()


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model_size", default="base", choices=list(PRESETS))
    parser.add_argument("--batch_size", type=int, default=128)
    parser.add_argument("--profile", type=int, default=0, help="also profile this many bare steps: operators by self time")
    parser.add_argument("--steps", type=int, default=300, help="timed updates, after the warm-up")
    parser.add_argument(
        "--warmup_steps", type=int, default=50, help="untimed updates first (compilation too)"
    )
    parser.add_argument(
        "--vocab_size", type=int, default=30522, help="model vocabulary (the trained tokenizer <= this)"
    )
    parser.add_argument(
        "--dupe_factor", type=int, default=10, help="NSP passes: enough instances for the run"
    )
    parser.add_argument(
        "--compile",
        action="store_true",
        help="--torch_compile for hfbert (its default on CUDA), torch_compile for Trainer",
    )
    parser.add_argument(
        "--variant",
        type=variant,
        action="append",
        help="NAME=FLAGS: an hfbert loop with FLAGS added, in the same process (repeatable; default: one, 'hfbert loop')",
    )
    parser.add_argument(
        "run_flags", nargs="*", help="after --: more run_pretraining.py flags (corpus, precision)"
    )
    args = parser.parse_args(argv)
    args.variant = args.variant or [("hfbert loop", [])]
    names = [name for name, _ in args.variant]
    if len(set(names)) < len(names):
        parser.error(f"--variant names repeat ({', '.join(names)}): give each loop its own name")
    for name in ("batch_size", "steps", "warmup_steps", "dupe_factor"):
        if getattr(args, name) < 1:
            parser.error(f"--{name} {getattr(args, name)} must be >= 1")
    return args


if __name__ == "__main__":
    main()
