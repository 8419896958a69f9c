"""Pretraining speed: hfbert against transformers' BertForPreTraining, measured side by side.

Both models are built from the same config with the same initial weights (transformers' state dict is
loaded into hfbert: the parameter names are identical), are fed the same batches and take their steps
alternately in one process (A B A B ...), so load on the machine hits both alike. One training step is
forward + backward + AdamW; both models train (dropout on, as configured). Batches are either real NSP
instances of the shipped WikiText-2 sample (tokenizer trained on the sample, padded per batch to the
longest row rounded up to 8, masked by the collator) or synthetic full-length rows, masked the same way.

Per model it reports non-padding tokens/s and the step time (medians over the timed steps), memory and the model FLOPs utilisation
(MFU) against a matmul peak measured on the device for the dtype, with the library's FLOPs per non-padding
token (`hfbert.pretraining.flops.flops_per_token`: hfbert's last layer at [CLS] and the rows its head
computes, the head at the masked tokens or static slots; transformers' every layer and head at every position).
Memory is torch.cuda.max_memory_allocated on CUDA; on CPU (no allocator statistics) it is the size of the
activations autograd saves for backward in one step, measured with saved-tensor hooks.
The forward-only rows compare the bare encoders (`model.bert`) in eval mode under torch.inference_mode.

hfbert trains on the masked-rows path: `model(**batch, mlm_masked_rows_only=True)` (dynamic shapes), or with
`--max_predictions_per_seq P` on the static path: `model(**batch, masked_positions=..., labels=(B, P))`, the
batches converted once by `masked_positions_from_labels` (a row with more than P masked tokens keeps a random
P, the rest unmasked; transformers gets the same masks back in (B, T) form). `--compile` wraps both models in
torch.compile (compilation happens in the warm-up steps; use --data synthetic, whose rows all have the same
length, or every new padded length compiles again).

    python -m benchmarks.bench_pretraining --sizes mini --precision fp32 bf16 --data nsp synthetic
    python -m benchmarks.bench_pretraining --data synthetic --modes train --max_predictions_per_seq 20 --compile
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import time
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from functools import partial
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # before datasets is imported: the sample is local
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import torch
from torch import nn
from transformers import BertForPreTraining

from hfbert import HfBertConfig, HfBertForPreTraining
from hfbert.configuration_hfbert import PRESETS
from hfbert.corpus import load_documents
from hfbert.corpus_arguments import CorpusArguments
from hfbert.modeling_hfbert import IGNORE_INDEX
from hfbert.pretraining.batches import DataCollatorForPretraining, masked_positions_from_labels
from hfbert.pretraining.data import tokenize_documents
from hfbert.pretraining.flops import flops_per_token
from hfbert.pretraining.instances import InstanceRecipe, write_instances
from hfbert.tokenization import train_tokenizer

SEED = 1234
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
LEARNING_RATE = 1e-4
WEIGHT_DECAY = 0.01
Batch = dict[str, torch.Tensor]


@dataclass
class Measurement:
    tokens_per_second: float
    step_ms: float
    memory_mib: float
    mfu: float


# ----------------------------------------------------------------------------------------------------------
# Batches: built once, shared by both models.
# ----------------------------------------------------------------------------------------------------------


def sample_instances(vocab_size: int, seq_len: int) -> tuple[Any, Any]:
    """A tokenizer trained on the shipped sample and the sample's NSP instances (one pass) made with it."""
    documents = load_documents(CorpusArguments())
    tokenizer = train_tokenizer(documents["train"], vocab_size=vocab_size, show_progress=False)
    if len(tokenizer) > vocab_size:
        raise ValueError(f"tokenizer has {len(tokenizer)} tokens, more than --vocab_size {vocab_size}")
    recipe = InstanceRecipe("mlm+nsp", tokenizer.cls_token_id, tokenizer.sep_token_id, seq_len, seed=SEED)
    instances = write_instances(tokenize_documents(documents["train"], tokenizer), recipe)
    return tokenizer, instances


def build_batches(args: argparse.Namespace) -> tuple[dict[str, list[Batch]], str]:
    """The NSP and/or synthetic batches asked for, and a description of the data for the report."""
    tokenizer, instances = sample_instances(args.vocab_size, args.seq_len)
    collator = DataCollatorForPretraining(tokenizer)
    generator = torch.Generator().manual_seed(SEED)
    order = torch.randperm(len(instances), generator=generator).tolist()
    lengths = [len(instances[i]["input_ids"]) for i in order]
    notes = (
        f"tokenizer trained on the shipped sample: {len(tokenizer)} tokens (model vocab {args.vocab_size}); "
        f"{len(instances)} NSP instances at max_seq_length {args.seq_len}, mean length "
        f"{statistics.mean(lengths):.1f}; padding fraction at batch size {args.batch_size}: "
        f"{padding_fraction(lengths, args.batch_size, 8):.1%} (shuffled, longest in batch rounded up to 8), "
        f"{padding_fraction(sorted(lengths), args.batch_size, 8):.1%} (grouped by length), "
        f"{1 - statistics.mean(lengths) / args.seq_len:.1%} (padded to {args.seq_len})"
    )
    num_batches = args.warmup + args.steps
    batches: dict[str, list[Batch]] = {}
    torch.manual_seed(SEED)  # the collator masks with torch's global RNG
    if "nsp" in args.data:
        rows = [instances[order[i % len(order)]] for i in range(num_batches * args.batch_size)]
        batches["nsp"] = [
            collator(rows[i : i + args.batch_size]) for i in range(0, len(rows), args.batch_size)
        ]
    if "synthetic" in args.data:
        first_regular_id = len(tokenizer.all_special_ids)  # special tokens are ids 0..4
        half = args.seq_len // 2
        batches["synthetic"] = []
        for _ in range(num_batches):
            ids = torch.randint(first_regular_id, len(tokenizer), (args.batch_size, args.seq_len))
            ids[:, 0], ids[:, half - 1], ids[:, -1] = (
                tokenizer.cls_token_id,
                tokenizer.sep_token_id,
                tokenizer.sep_token_id,
            )
            segments = (torch.arange(args.seq_len) >= half).long().expand(args.batch_size, -1)
            features = [
                {"input_ids": row, "token_type_ids": segment, "next_sentence_label": int(label)}
                for row, segment, label in zip(
                    ids.tolist(),
                    segments.tolist(),
                    torch.randint(2, (args.batch_size,)).tolist(),
                    strict=True,
                )
            ]
            batches["synthetic"].append(collator(features))
    if args.max_predictions_per_seq is not None:
        batches = {
            data: [static_form(b, args.max_predictions_per_seq) for b in bs] for data, bs in batches.items()
        }
        notes += f"; at most {args.max_predictions_per_seq} predictions per row (static masked positions)"
    return batches, notes


def static_form(batch: Batch, max_predictions_per_seq: int) -> Batch:
    """Adds `masked_positions` and `masked_labels` (B, P); input_ids and the (B, T) labels transformers reads
    are rewritten to the same (capped) masks, so both models see the same data."""
    positions, masked_labels, input_ids = masked_positions_from_labels(
        batch["labels"], max_predictions_per_seq, batch["input_ids"]
    )
    labels = torch.full_like(batch["labels"], IGNORE_INDEX)
    filled = masked_labels != IGNORE_INDEX
    labels[torch.arange(len(labels))[:, None].expand_as(positions)[filled], positions[filled]] = (
        masked_labels[filled]
    )
    return {
        **batch,
        "input_ids": input_ids,
        "labels": labels,
        "masked_positions": positions,
        "masked_labels": masked_labels,
    }


def model_inputs(name: str, batch: Batch) -> Batch:
    """What each model's forward takes: transformers the (B, T) batch; hfbert the masked-rows path, static
    (`masked_positions`, (B, P) labels) when the batch has the static form, dynamic otherwise."""
    dense = {key: value for key, value in batch.items() if key not in ("masked_positions", "masked_labels")}
    if name == "transformers":
        return dense
    if "masked_positions" in batch:
        return {**dense, "labels": batch["masked_labels"], "masked_positions": batch["masked_positions"]}
    return {**dense, "mlm_masked_rows_only": True}


# ----------------------------------------------------------------------------------------------------------
# Measuring.
# ----------------------------------------------------------------------------------------------------------


def measure_matmul_peak(device: torch.device, dtype: torch.dtype) -> float:
    """Best FLOP/s of a large square matmul in `dtype` over many tries (the best one is the least disturbed
    by other processes): the peak the MFU is taken against."""
    n = 8192 if device.type == "cuda" else 3072
    a, b = (torch.randn(n, n, device=device, dtype=dtype) for _ in range(2))
    best = float("inf")
    for _ in range(10):
        synchronize(device)
        start = time.perf_counter()
        torch.matmul(a, b)
        synchronize(device)
        best = min(best, time.perf_counter() - start)
    return 2 * n**3 / best


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def padding_fraction(lengths: list[int], batch_size: int, pad_to_multiple_of: int | None = None) -> float:
    """Fraction of padded positions when ``lengths`` are batched in order and padded per batch.

    Each batch of ``batch_size`` consecutive rows is padded to its longest row, rounded up to
    ``pad_to_multiple_of`` when given (what :class:`hfbert.pretraining.batches.DataCollatorForPretraining` does).
    Shuffle ``lengths`` first to measure a shuffled loader.
    """
    if batch_size < 1:
        raise ValueError(f"batch_size {batch_size} must be >= 1")
    multiple = pad_to_multiple_of or 1
    padded_positions = 0
    for start in range(0, len(lengths), batch_size):
        batch_lengths = lengths[start : start + batch_size]
        padded_length = -(-max(batch_lengths) // multiple) * multiple
        padded_positions += padded_length * len(batch_lengths)
    return 1.0 - sum(lengths) / padded_positions if padded_positions else 0.0


def saved_activation_mib(step: Callable[[], None], model: nn.Module) -> float:
    """MiB of tensors autograd saves for backward during `step` (parameters excluded): CPU memory proxy."""
    parameters = {p.untyped_storage().data_ptr() for p in model.parameters()}
    storages: dict[int, int] = {}

    def pack(tensor: torch.Tensor) -> torch.Tensor:
        storage = tensor.untyped_storage()
        if storage.data_ptr() not in parameters:
            storages[storage.data_ptr()] = storage.nbytes()
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        step()
    return sum(storages.values()) / 2**20


def autocast(device: torch.device, precision: str) -> AbstractContextManager:
    if precision == "fp32":
        return nullcontext()
    return torch.autocast(device_type=device.type, dtype=DTYPES[precision])


def train_step(
    name: str,
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    batch: Batch,
    *,
    device: torch.device,
    precision: str,
) -> None:
    with autocast(device, precision):
        loss = model(**model_inputs(name, batch)).loss
    loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)


def infer_step(model: nn.Module, batch: Batch, *, device: torch.device, precision: str) -> None:
    inputs = {key: batch[key] for key in ("input_ids", "attention_mask", "token_type_ids")}
    with torch.inference_mode(), autocast(device, precision):
        model.bert(**inputs)


def compare(
    models: dict[str, nn.Module],
    steps: dict[str, Callable[[Batch], None]],
    batches: list[Batch],
    args: argparse.Namespace,
    device: torch.device,
) -> dict[str, tuple[list[float], float]]:
    """Alternate the models' steps over `batches`; per model the timed step seconds and the memory in MiB."""
    seconds: dict[str, list[float]] = {name: [] for name in models}
    peak_bytes = dict.fromkeys(models, 0)
    for index, batch in enumerate(batches):
        for name in models:
            if device.type == "cuda":
                torch.cuda.reset_peak_memory_stats()
            synchronize(device)
            start = time.perf_counter()
            steps[name](batch)
            synchronize(device)
            if index >= args.warmup:
                seconds[name].append(time.perf_counter() - start)
            if device.type == "cuda":
                peak_bytes[name] = max(peak_bytes[name], torch.cuda.max_memory_allocated())
    memory = {}
    for name, model in models.items():
        if device.type == "cuda":
            memory[name] = peak_bytes[name] / 2**20
        elif model.training:
            memory[name] = saved_activation_mib(partial(steps[name], batches[0]), model)
        else:
            memory[name] = float("nan")  # inference saves nothing for backward
    return {name: (seconds[name], memory[name]) for name in models}


def step_functions(
    models: dict[str, nn.Module], mode: str, device: torch.device, precision: str
) -> dict[str, Callable[[Batch], None]]:
    """Per model, one training step (with its own AdamW) or one forward-only step (in eval mode)."""
    if mode == "infer":
        for model in models.values():
            model.eval()
        return {
            name: partial(infer_step, model, device=device, precision=precision)
            for name, model in models.items()
        }
    optimizer = optimizers(models)
    return {
        name: partial(train_step, name, model, optimizer[name], device=device, precision=precision)
        for name, model in models.items()
    }


def build_models(config: HfBertConfig, device: torch.device, compile: bool = False) -> dict[str, nn.Module]:
    """transformers' BertForPreTraining and hfbert with the same config and the same initial weights
    (both wrapped in torch.compile with `compile`)."""
    torch.manual_seed(SEED)
    reference = BertForPreTraining(config.to_bert_config()).to(device)
    hfbert = HfBertForPreTraining(config).to(device)
    hfbert.load_state_dict(reference.state_dict())
    models = {"transformers": reference, "hfbert": hfbert}
    if compile:
        torch._dynamo.reset()
        models = {name: torch.compile(model) for name, model in models.items()}
    return models


def optimizers(models: dict[str, nn.Module]) -> dict[str, torch.optim.Optimizer]:
    """transformers: torch's default AdamW (a per-tensor loop on CPU, foreach on CUDA); hfbert: fused AdamW."""
    return {
        "transformers": torch.optim.AdamW(
            models["transformers"].parameters(), lr=LEARNING_RATE, weight_decay=WEIGHT_DECAY
        ),
        "hfbert": torch.optim.AdamW(
            models["hfbert"].parameters(), lr=LEARNING_RATE, weight_decay=WEIGHT_DECAY, fused=True
        ),
    }


def run(args: argparse.Namespace) -> None:
    device = torch.device(args.device)
    if device.type == "cpu" and "fp16" in args.precision:
        raise ValueError("--precision fp16 needs --device cuda; on CPU use fp32 or bf16")
    batches, notes = build_batches(args)
    batches = {data: [{k: v.to(device) for k, v in b.items()} for b in bs] for data, bs in batches.items()}
    peaks = {precision: measure_matmul_peak(device, DTYPES[precision]) for precision in args.precision}
    print(describe_machine(device))
    print(f"data: {notes}")
    print("matmul peak: " + ", ".join(f"{p} {peak / 1e9:.0f} GFLOP/s" for p, peak in peaks.items()))
    print(
        f"batch {args.batch_size}, max length {args.seq_len}, {args.warmup} warm-up + {args.steps} timed steps "
        f"per model, alternating; AdamW lr {LEARNING_RATE} wd {WEIGHT_DECAY}: transformers default "
        "implementation, hfbert fused=True\n"
    )
    header = (
        "| size | precision | data | mode | transformers tok/s | hfbert tok/s | **ratio** | "
        "transformers step ms | hfbert step ms | transformers mem MiB | hfbert mem MiB | "
        "transformers MFU | hfbert MFU |"
    )
    print(header)
    print("|" + "---|" * (header.count("|") - 1))
    for size in args.sizes:
        config = HfBertConfig.from_preset(size, vocab_size=args.vocab_size)
        for precision in args.precision:
            for data, data_batches in batches.items():
                for mode in args.modes:
                    models = build_models(config, device, args.compile)
                    steps = step_functions(models, mode, device, precision)
                    results = compare(models, steps, data_batches, args, device)
                    row = summarize(config, results, data_batches, args, mode, peaks[precision])
                    print(
                        f"| {size} | {precision} | {data} | {mode} | {row['transformers'].tokens_per_second:,.0f} | "
                        f"{row['hfbert'].tokens_per_second:,.0f} | "
                        f"**{row['hfbert'].tokens_per_second / row['transformers'].tokens_per_second:.2f}x** | "
                        f"{row['transformers'].step_ms:,.0f} | {row['hfbert'].step_ms:,.0f} | "
                        f"{row['transformers'].memory_mib:,.0f} | {row['hfbert'].memory_mib:,.0f} | "
                        f"{row['transformers'].mfu:.1%} | {row['hfbert'].mfu:.1%} |",
                        flush=True,
                    )


def summarize(
    config: HfBertConfig,
    results: dict[str, tuple[list[float], float]],
    batches: list[Batch],
    args: argparse.Namespace,
    mode: str,
    peak: float,
) -> dict[str, Measurement]:
    timed = batches[args.warmup :]
    step_tokens = [int(b["attention_mask"].sum()) for b in timed]
    if "masked_positions" in timed[0]:  # the static head runs at every slot, filled or not
        head_rows = sum(b["masked_positions"].numel() for b in timed)
    else:
        head_rows = sum(int((b["labels"] != -100).sum()) for b in timed)
    rows = sum(b["input_ids"].size(0) for b in timed)
    head_rows_per_row, mean_length = head_rows / rows, sum(step_tokens) / rows  # non-padding tokens a row
    summary = {}
    for name, (seconds, memory) in results.items():
        flops = flops_per_token(config, mean_length, head_rows_per_row if name == "hfbert" else None)
        if mode == "infer":  # forward only (a third of fwd + bwd), encoder only (no MLM head)
            dense = flops_per_token(config, mean_length)
            flops = (dense - 6 * (config.hidden_size**2 + config.hidden_size * config.vocab_size)) / 3
        # Medians, not totals: other processes on a shared machine add outliers to single steps.
        tokens_per_second = statistics.median(n / t for n, t in zip(step_tokens, seconds, strict=True))
        summary[name] = Measurement(
            tokens_per_second=tokens_per_second,
            step_ms=statistics.median(seconds) * 1000,
            memory_mib=memory,
            mfu=tokens_per_second * flops / peak,
        )
    return summary


def describe_machine(device: torch.device) -> str:
    if device.type == "cuda":
        name = torch.cuda.get_device_name(device)
    else:
        with open("/proc/cpuinfo") as cpuinfo:
            name = next(
                (line.split(":", 1)[1].strip() for line in cpuinfo if line.startswith("model name")),
                platform.processor(),
            )
        name += f", {torch.get_num_threads()} threads"
    return f"device: {name}; torch {torch.__version__}"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", nargs="+", default=["mini"], choices=list(PRESETS))
    parser.add_argument("--precision", nargs="+", default=["fp32", "bf16"], choices=list(DTYPES))
    parser.add_argument("--data", nargs="+", default=["nsp", "synthetic"], choices=["nsp", "synthetic"])
    parser.add_argument("--modes", nargs="+", default=["train", "infer"], choices=["train", "infer"])
    parser.add_argument("--steps", type=int, default=10, help="timed steps per model")
    parser.add_argument("--warmup", type=int, default=2, help="untimed steps per model first")
    parser.add_argument("--batch_size", type=int, default=32)
    parser.add_argument("--seq_len", type=int, default=128, help="max_seq_length of the NSP instances")
    parser.add_argument("--vocab_size", type=int, default=30522, help="model vocabulary (tokenizer <= this)")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument(
        "--max_predictions_per_seq",
        type=int,
        default=None,
        help="hfbert trains on the static path with this many masked slots per row (google: 20 at length 128)",
    )
    parser.add_argument("--compile", action="store_true", help="torch.compile both models")
    return parser.parse_args(argv)


if __name__ == "__main__":
    run(parse_args())
