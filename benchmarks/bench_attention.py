"""The attention levers of the training step, each against the step without it, side by side in one process.

One HfBertForPreTraining, one batch on the device, forward + backward of the pretraining loss at the static
masked slots (what the loop runs on CUDA); the variants take turns step by step, so a machine that slows down
slows them all:

- Q, K, V as three matmuls (each projection as its own module) against one (the default);
- a batch with padded rows: the mask (default) against `attention_padding="varlen"` (CUDA only: on other devices
  varlen runs sdpa per sequence, a test path);
- a batch without padding: the mask against `attention_padding="none"` (sdpa with no mask).

Padded rows follow the shipped WikiText sample at T=128 under run_pretraining.py's defaults: 87.1% of rows
full length, the others of a uniform length (measured with the data stage, docs/model.md).

    python -m benchmarks.bench_attention --model_size mini --batch_size 32 --steps 30  # CPU
    python -m benchmarks.bench_attention --model_size base --batch_size 128 --steps 50  # GPU
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import torch
from torch import nn

from benchmarks.bench_pretraining import describe_machine, synchronize
from hfbert.configuration_hfbert import PRESETS, HfBertConfig
from hfbert.modeling_hfbert import HfBertForPreTraining
from hfbert.pretraining.batches import default_max_predictions, masked_positions_from_labels

FULL_ROWS = 0.871  # share of full-length rows in the shipped sample's NSP instances at T=128
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


class SeparateLinear(nn.Linear):
    """A projection of another class than nn.Linear: the model runs it as its own module, unfused."""


def projections_as(model: nn.Module, cls: type[nn.Linear]) -> None:
    for layer in model.bert.encoder.layer:
        for module in (layer.attention.self.query, layer.attention.self.key, layer.attention.self.value):
            module.__class__ = cls


def make_batch(
    config: HfBertConfig, batch_size: int, seq_len: int, padded: bool, device: torch.device
) -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(0)
    lengths = torch.full((batch_size,), seq_len)
    if padded:
        short = torch.rand(batch_size, generator=generator) > FULL_ROWS
        lengths[short] = torch.randint(8, seq_len, (int(short.sum()),), generator=generator)
    attention_mask = (torch.arange(seq_len) < lengths[:, None]).long()
    input_ids = torch.randint(5, config.vocab_size, (batch_size, seq_len), generator=generator) * attention_mask
    chosen = (torch.rand(batch_size, seq_len, generator=generator) < 0.15) & attention_mask.bool()
    labels = torch.where(chosen, input_ids, -100)
    slots = default_max_predictions(seq_len, 0.15)
    positions, labels, _ = masked_positions_from_labels(labels, slots, generator=generator)
    batch = {
        "input_ids": input_ids,
        "attention_mask": attention_mask,
        "token_type_ids": torch.zeros_like(input_ids),
        "masked_positions": positions,
        "labels": labels,
        "next_sentence_label": torch.randint(0, 2, (batch_size,), generator=generator),
    }
    return {key: value.to(device) for key, value in batch.items()}


def timed_steps(
    variants: dict[str, Callable[[], None]], steps: int, warmup: int, device: torch.device
) -> dict[str, float]:
    """Median seconds per step of each variant, the variants taking turns."""
    times: dict[str, list[float]] = {name: [] for name in variants}
    for step in range(warmup + steps):
        for name, run in variants.items():
            synchronize(device)
            start = time.perf_counter()
            run()
            synchronize(device)
            if step >= warmup:
                times[name].append(time.perf_counter() - start)
    return {name: statistics.median(values) for name, values in times.items()}


def main(argv: list[str] | None = None) -> dict[str, float]:
    args = parse_args(argv)
    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    dtype = DTYPES[args.dtype or ("fp16" if device.type == "cuda" else "bf16")]
    config = HfBertConfig.from_preset(args.model_size, vocab_size=30522)
    model = HfBertForPreTraining(config).to(device).train()
    batches = {padded: make_batch(config, args.batch_size, args.seq_len, padded, device) for padded in (True, False)}

    def step(padded: bool, separate: bool = False, **inputs) -> Callable[[], None]:
        def run() -> None:
            projections_as(model, SeparateLinear if separate else nn.Linear)
            with torch.autocast(device.type, dtype=dtype, enabled=dtype != torch.float32):
                loss = model(**batches[padded], **inputs).loss
            loss.backward()
            model.zero_grad(set_to_none=True)

        return run

    variants = {
        "padded, mask, three QKV matmuls": step(True, separate=True),
        "padded, mask": step(True),
        "unpadded, mask": step(False),
        "unpadded, none": step(False, attention_padding="none"),
    }
    if device.type == "cuda":
        variants["padded, varlen"] = step(True, attention_padding="varlen")
        variants["unpadded, varlen"] = step(False, attention_padding="varlen")
    seconds = timed_steps(variants, args.steps, args.warmup, device)
    tokens = int(batches[True]["attention_mask"].sum())
    print(describe_machine(device))
    print(
        f"{args.model_size}, batch {args.batch_size} x T={args.seq_len}, {dtype}, {tokens} non-padding tokens "
        f"in the padded batch; median of {args.steps} steps each, taking turns"
    )
    print("| step | ms | vs the default of its batch |")
    print("|---|---|---|")
    for name, value in seconds.items():
        baseline = seconds["padded, mask" if name.startswith("padded") else "unpadded, mask"]
        print(f"| {name} | {value * 1e3:.1f} | {baseline / value:.3f}x |")
    return seconds


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model_size", default="mini", choices=list(PRESETS))
    parser.add_argument("--batch_size", type=int, default=32)
    parser.add_argument("--seq_len", type=int, default=128)
    parser.add_argument("--steps", type=int, default=30, help="timed steps per variant")
    parser.add_argument("--warmup", type=int, default=3, help="untimed steps per variant first")
    parser.add_argument("--dtype", choices=list(DTYPES), help="autocast dtype (default: fp16 on CUDA, else bf16)")
    parser.add_argument("--device", help="default: cuda if available, else cpu")
    return parser.parse_args(argv)


if __name__ == "__main__":
    main()
