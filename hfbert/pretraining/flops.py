"""The model FLOPs per token behind the logged model FLOP/s and MFU, and the datasheet peak the MFU is against
(one formula, one table: the loop's log rows, the dry run's plan and the benchmarks use them from here)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

import torch

from hfbert.modeling_hfbert import ROW_SUBSET_BACKENDS

# Dense fp16/bf16 tensor-core peaks in FLOP/s (the datasheets' headline figures are with 2:4 sparsity, twice
# these), by what the device is: a pattern of its CUDA name, its compute capability and its SM count. The SM
# count tells the H100 SXM (132 SMs; its name, "NVIDIA H100 80GB HBM3", does not say SXM) from the PCIe card
# (114), and gives a MIG slice (fewer SMs) no peak. The first matching row wins; a device no row matches has
# no MFU, never a guessed one. Rows: (name pattern, compute capability, SMs, peak, the part and its datasheet).
DATASHEET_PEAK_FLOPS: tuple[tuple[str, tuple[int, int], int, float, str], ...] = (
    # NVIDIA H100 Tensor Core GPU datasheet (nvidia.com/en-us/data-center/h100): FP16/BF16 Tensor Core 1,979
    # (SXM), 1,671 (NVL), 1,513 (PCIe) TFLOPS with sparsity; SXM5 132 SMs, PCIe 114 (H100 whitepaper).
    (r"\bH100\b.*\bNVL\b", (9, 0), 132, 835e12, "H100 NVL, NVIDIA H100 datasheet"),
    (r"\bH100\b(?!.*\bPCIe\b)", (9, 0), 132, 989e12, "H100 SXM5, NVIDIA H100 datasheet"),
    (r"\bH100\b", (9, 0), 114, 756e12, "H100 PCIe, NVIDIA H100 datasheet"),
    # NVIDIA H200 Tensor Core GPU datasheet: 1,979 (SXM) and 1,671 (NVL) TFLOPS with sparsity.
    (r"\bH200\b.*\bNVL\b", (9, 0), 132, 835e12, "H200 NVL, NVIDIA H200 datasheet"),
    (r"\bH200\b", (9, 0), 132, 989e12, "H200 SXM, NVIDIA H200 datasheet"),
    # NVIDIA GH200 Grace Hopper Superchip datasheet: FP16/BF16 Tensor Core 1,979 TFLOPS with sparsity.
    (r"\bGH200\b", (9, 0), 132, 989e12, "GH200, NVIDIA GH200 datasheet"),
    # NVIDIA HGX B200 datasheet: FP16/BF16 Tensor Core 4.5 PFLOPS with sparsity per GPU (1,000 W).
    (r"\bB200\b", (10, 0), 148, 2250e12, "B200 (HGX), NVIDIA HGX B200 datasheet"),
    # NVIDIA A100 Tensor Core GPU datasheet: BF16/FP16 Tensor Core 312 TFLOPS (624 with sparsity), SXM4 and
    # PCIe alike; 108 SMs.
    (r"\bA100\b", (8, 0), 108, 312e12, "A100, NVIDIA A100 datasheet"),
    # NVIDIA A10 datasheet: BF16/FP16 Tensor Core 125 TF (250 with sparsity); 72 SMs.
    (r"\bA10\b", (8, 6), 72, 125e12, "A10, NVIDIA A10 datasheet"),
    # NVIDIA RTX A6000 datasheet: Tensor performance 309.7 TFLOPS with sparsity; 84 SMs.
    (r"\bRTX A6000\b", (8, 6), 84, 154.8e12, "RTX A6000, NVIDIA RTX A6000 datasheet"),
    # NVIDIA L40S datasheet: BF16/FP16 Tensor Core 362.05 TFLOPS (733 with sparsity); L40 datasheet 181.05
    # (362.1 with sparsity); 142 SMs each. NVIDIA L4 datasheet: FP16 Tensor Core 242 TFLOPS with sparsity;
    # 58 SMs.
    (r"\bL40S\b", (8, 9), 142, 362.05e12, "L40S, NVIDIA L40S datasheet"),
    (r"\bL40\b", (8, 9), 142, 181.05e12, "L40, NVIDIA L40 datasheet"),
    (r"\bL4\b", (8, 9), 58, 121e12, "L4, NVIDIA L4 datasheet"),
    # NVIDIA V100 Tensor Core GPU datasheet: Tensor Performance 125 (SXM2), 112 (PCIe), 130 (V100S PCIe)
    # TFLOPS, fp16 (Volta has no bf16); 80 SMs.
    (r"\bV100\b.*\bSXM2\b", (7, 0), 80, 125e12, "V100 SXM2, NVIDIA V100 datasheet"),
    (r"\bV100\b.*\bPCIE\b", (7, 0), 80, 112e12, "V100 PCIe, NVIDIA V100 datasheet"),
    (r"\bV100S\b", (7, 0), 80, 130e12, "V100S PCIe, NVIDIA V100 datasheet"),
    # NVIDIA T4 datasheet: Mixed Precision (FP16/FP32) 65 TFLOPS; 40 SMs.
    (r"\bT4\b", (7, 5), 40, 65e12, "T4, NVIDIA T4 datasheet"),
)


def datasheet_peak(name: str, capability: tuple[int, int], sm_count: int) -> tuple[float, str] | None:
    """(dense fp16/bf16 peak FLOP/s, the part and its datasheet) of a CUDA device by its
    `torch.cuda.get_device_name`, compute capability and SM count; None where no row of DATASHEET_PEAK_FLOPS
    matches all three."""
    for pattern, row_capability, row_sms, peak, part in DATASHEET_PEAK_FLOPS:
        if re.search(pattern, name, re.IGNORECASE) and row_capability == capability and row_sms == sm_count:
            return peak, part
    return None


def device_peak_flops(device: torch.device, precision: str) -> tuple[float | None, str]:
    """The peak FLOP/s the logged MFU is against (None: no MFU) and a line saying which peak, or why none."""
    if device.type != "cuda":
        return None, f"MFU not logged on {device.type}: its peak depends on clock, cores and ISA"
    if precision not in ("fp16", "bf16"):
        return None, "MFU not logged in fp32: the datasheet peaks are fp16/bf16 tensor-core ones"
    properties = torch.cuda.get_device_properties(device)
    found = datasheet_peak(properties.name, (properties.major, properties.minor), properties.multi_processor_count)
    if found is None:
        return None, (
            f"MFU unknown for {properties.name} (compute capability {properties.major}.{properties.minor}, "
            f"{properties.multi_processor_count} SMs): no row of DATASHEET_PEAK_FLOPS matches it"
        )
    peak, part = found
    return peak, f"MFU against {peak / 1e12:,.0f} TFLOP/s, the dense {precision} peak of the {part}"


def flops_per_token(config: Any, seq_len: float, head_rows: float | None = None) -> float:
    """Forward + backward FLOPs of the matrix products per token, for instances of `seq_len` tokens, counted
    where they run. `head_rows`: the rows per instance the MLM head computes (hfbert's training path: the
    static slots, or the masked tokens), the last layer then running at [CLS] and those rows only (keys and
    values at every position; `HfBertMaskedLMMixin.last_layer_positions`, eager or sdpa attention); None: the
    dense head and the last layer at every position (transformers' BertForPreTraining).

    Per instance, in multiply-adds (a layer at m query rows: K and V at T rows; Q, output, FFN, attention at m):
        layer(m) = 2 d^2 T + (2 d^2 + 2 d I) m + 2 m T d
        (L - 1) layer(T) + layer(m_last) + head_rows (d^2 + d V) + d^2 + 2 d   (pooler and NSP at [CLS])
    times 6 (2 FLOPs a multiply-add; the backward computes gradients of inputs and weights, twice the forward),
    over T. Embedding lookups, softmax, LayerNorm and other element-wise work are not counted.
    """
    d, inner, vocab = config.hidden_size, config.intermediate_size, config.vocab_size
    layers = config.num_hidden_layers
    rows_subset = config._attn_implementation in (None, *ROW_SUBSET_BACKENDS)  # None: the default, sdpa
    head = seq_len if head_rows is None else head_rows
    last = 1 + head_rows if head_rows is not None and rows_subset else seq_len

    def layer(rows: float) -> float:
        return 2 * d * d * seq_len + (2 * d * d + 2 * d * inner) * rows + 2 * rows * seq_len * d

    multiply_adds = (layers - 1) * layer(seq_len) + layer(last) + head * (d * d + d * vocab) + d * d + 2 * d
    return 6 * multiply_adds / seq_len


@dataclass
class ModelFlops:
    """What the log rows' model FLOP/s and MFU are computed from: the model's config, its MLM head's static
    slots per row (None: the masked tokens, the dynamic path) and one process's peak FLOP/s (None: no MFU)."""

    config: Any
    static_slots: int | None
    peak_flops_per_process: float | None

    def utilization(
        self, tokens: float, totals: torch.Tensor, seconds: float, num_processes: int
    ) -> dict[str, float]:
        """model_flops_per_second (and mfu) for `tokens` non-padding tokens in `seconds` with window `totals`."""
        _, _, masked, _, _, instances = totals.tolist()
        if tokens == 0 or instances == 0:
            return {}
        head_rows = masked / instances if self.static_slots is None else self.static_slots
        flops = tokens * flops_per_token(self.config, tokens / instances, head_rows) / seconds
        row = {"model_flops_per_second": flops}
        if self.peak_flops_per_process is not None:
            row["mfu"] = flops / (self.peak_flops_per_process * num_processes)
        return row
