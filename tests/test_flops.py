"""hfbert.pretraining.flops: the FLOPs formula behind the logged model FLOP/s and MFU, and the peak it is against."""

from types import SimpleNamespace
from unittest import mock

import pytest
import torch
from conftest import tiny_config
from torch.utils.flop_counter import FlopCounterMode
from transformers import BertForPreTraining

from hfbert import HfBertConfig, HfBertForPreTraining
from hfbert.pretraining.batches import masked_positions_from_labels
from hfbert.pretraining.flops import ModelFlops, datasheet_peak, device_peak_flops, flops_per_token


def counted_training_flops(model, **inputs) -> int:
    """torch's own count of the matrix products of one forward + backward of `model` on `inputs`."""
    with FlopCounterMode(display=False) as counter:
        model(**inputs).loss.backward()
    return counter.get_total_flops()


@pytest.mark.parametrize("attention", ["eager", "sdpa"])
def test_flops_per_token_is_what_torch_counts_on_each_training_path(attention):
    """Exact (tolerance 0) against FlopCounterMode on a forward + backward of the tiny model: the dense head,
    the masked rows (the last layer at [CLS] + 4 rows, the head at the 4) and the static slots (6 slots, the
    head at all 6, filled or not); transformers' BertForPreTraining with the dense count."""
    config = tiny_config()
    model = HfBertForPreTraining(config).train()
    model.config._attn_implementation = attention
    batch, length, masked = 3, 16, torch.tensor([2, 5, 7, 11])
    input_ids = torch.randint(5, config.vocab_size, (batch, length))
    labels = torch.full_like(input_ids, -100)
    labels[:, masked] = input_ids[:, masked]  # 4 a row: the last layer's rows are the same in every row
    common = {"input_ids": input_ids, "attention_mask": torch.ones_like(input_ids),
              "next_sentence_label": torch.tensor([0, 1, 0])}  # fmt: skip
    tokens = batch * length
    assert counted_training_flops(model, labels=input_ids, **common) == tokens * flops_per_token(config, length)
    assert counted_training_flops(model, labels=labels, mlm_masked_rows_only=True, **common) == tokens * (
        flops_per_token(config, length, head_rows=4)
    )
    positions, slot_labels, _ = masked_positions_from_labels(labels, 6)
    static = counted_training_flops(model, labels=slot_labels, masked_positions=positions, **common)
    assert static == tokens * flops_per_token(config, length, head_rows=6)
    reference = BertForPreTraining(config.to_bert_config()).train()
    reference.config._attn_implementation = attention
    assert counted_training_flops(reference, labels=input_ids, **common) == tokens * flops_per_token(config, length)


def test_flops_per_token_of_bert_base_by_hand():
    """BERT-base at T=128 with 32 static slots, worked out by hand: 11 full layers of 4 d^2 + 2 d I + 2 T d
    multiply-adds a token, the last at 33 rows, the head at 32 rows of d^2 + d V, then x 6."""
    config = HfBertConfig.from_preset("base", vocab_size=30522)
    d, inner, length, vocab = 768, 3072, 128, 30522
    full_layer = 4 * d * d * length + 2 * d * inner * length + 2 * length * length * d
    last_layer = 2 * d * d * length + (2 * d * d + 2 * d * inner) * 33 + 2 * 33 * length * d
    expected = 6 * (11 * full_layer + last_layer + 32 * (d * d + d * vocab) + d * d + 2 * d) / length
    assert flops_per_token(config, length, head_rows=32) == pytest.approx(expected, rel=1e-12)
    assert flops_per_token(config, length) == pytest.approx(
        6 * (12 * full_layer + length * (d * d + d * vocab) + d * d + 2 * d) / length, rel=1e-12
    )
    flash = HfBertConfig.from_preset("base", vocab_size=30522, attn_implementation="flash_attention_2")
    assert flops_per_token(flash, length, head_rows=32) > expected  # no row subset there: the last layer runs at T


def test_the_log_row_has_model_flops_and_mfu_only_with_a_known_peak():
    config = tiny_config()
    totals = torch.tensor([0.0, 0.0, 150.0, 0.0, 0.0, 10.0], dtype=torch.float64)  # 150 masked, 10 rows
    row = ModelFlops(config, static_slots=None, peak_flops_per_process=None).utilization(1000.0, totals, 2.0, 1)
    assert set(row) == {"model_flops_per_second"}
    assert row["model_flops_per_second"] == pytest.approx(1000 * flops_per_token(config, 100, head_rows=15) / 2)
    static = ModelFlops(config, static_slots=24, peak_flops_per_process=1e12).utilization(1000.0, totals, 2.0, 2)
    assert static["model_flops_per_second"] == pytest.approx(1000 * flops_per_token(config, 100, head_rows=24) / 2)
    assert static["mfu"] == pytest.approx(static["model_flops_per_second"] / 2e12)


# What `torch.cuda.get_device_name`, the compute capability and the SM count read on each part.
DEVICES = [
    ("NVIDIA H100 80GB HBM3", (9, 0), 132, 989e12),  # the SXM5 part (seen: the H100 this project measured)
    ("NVIDIA H100 PCIe", (9, 0), 114, 756e12),
    ("NVIDIA H100 NVL", (9, 0), 132, 835e12),
    ("NVIDIA H200", (9, 0), 132, 989e12),
    ("NVIDIA H200 NVL", (9, 0), 132, 835e12),
    ("NVIDIA GH200 480GB", (9, 0), 132, 989e12),
    ("NVIDIA B200", (10, 0), 148, 2250e12),
    ("NVIDIA A100-SXM4-80GB", (8, 0), 108, 312e12),
    ("NVIDIA A100-SXM4-40GB", (8, 0), 108, 312e12),
    ("NVIDIA A100-PCIE-40GB", (8, 0), 108, 312e12),
    ("NVIDIA A100 80GB PCIe", (8, 0), 108, 312e12),
    ("NVIDIA A10", (8, 6), 72, 125e12),
    ("NVIDIA RTX A6000", (8, 6), 84, 154.8e12),
    ("NVIDIA L40S", (8, 9), 142, 362.05e12),
    ("NVIDIA L40", (8, 9), 142, 181.05e12),
    ("NVIDIA L4", (8, 9), 58, 121e12),
    ("Tesla V100-SXM2-16GB", (7, 0), 80, 125e12),
    ("Tesla V100-SXM2-32GB", (7, 0), 80, 125e12),
    ("Tesla V100-PCIE-16GB", (7, 0), 80, 112e12),
    ("Tesla V100S-PCIE-32GB", (7, 0), 80, 130e12),
    ("Tesla T4", (7, 5), 40, 65e12),
    # No peak rather than a wrong one: a MIG slice (fewer SMs), AWS's A10G (no NVIDIA datasheet figure), a
    # part not in the table, a name whose SM count or capability does not fit its row.
    ("NVIDIA H100 80GB HBM3 MIG 3g.40gb", (9, 0), 60, None),
    ("NVIDIA A10G", (8, 6), 80, None),
    ("NVIDIA GeForce RTX 4090", (8, 9), 128, None),
    ("NVIDIA H100 PCIe", (9, 0), 132, None),
    ("NVIDIA A100-SXM4-80GB", (9, 0), 108, None),
]


@pytest.mark.parametrize("name, capability, sm_count, peak", DEVICES, ids=[f"{d[0]}-{d[2]}" for d in DEVICES])
def test_the_datasheet_peak_is_chosen_by_what_the_device_is(name, capability, sm_count, peak):
    found = datasheet_peak(name, capability, sm_count)
    assert (None if found is None else found[0]) == peak


def test_the_peak_line_names_the_row_or_why_there_is_no_mfu():
    cuda = torch.device("cuda", 0)
    h100 = SimpleNamespace(name="NVIDIA H100 80GB HBM3", major=9, minor=0, multi_processor_count=132)
    with mock.patch.object(torch.cuda, "get_device_properties", return_value=h100):
        assert device_peak_flops(cuda, "fp16") == (
            989e12, "MFU against 989 TFLOP/s, the dense fp16 peak of the H100 SXM5, NVIDIA H100 datasheet"
        )
        assert device_peak_flops(cuda, "no")[0] is None
    slice_ = SimpleNamespace(name="NVIDIA A100-SXM4-40GB MIG 1g.5gb", major=8, minor=0, multi_processor_count=14)
    with mock.patch.object(torch.cuda, "get_device_properties", return_value=slice_):
        assert device_peak_flops(cuda, "bf16") == (
            None,
            "MFU unknown for NVIDIA A100-SXM4-40GB MIG 1g.5gb (compute capability 8.0, 14 SMs): no row of "
            "DATASHEET_PEAK_FLOPS matches it",
        )
    assert device_peak_flops(torch.device("cpu"), "bf16")[0] is None
