"""hfbert.pretraining.precision: the precision a run trains in, and why."""

import logging
from pathlib import Path
from unittest import mock

import pytest
import torch

from hfbert.errors import Refusal
from hfbert.pretraining import precision
from hfbert.pretraining.cli import parse_args
from hfbert.pretraining.precision import cpu_has_native_bf16, resolve_mixed_precision

HOPPER, VOLTA = (9, 0), (7, 0)  # compute capabilities: an H100's, a V100's


@pytest.mark.parametrize("native", [True, False], ids=["native-bf16-cpu", "cpu-without-bf16"])
def test_precision_choice(monkeypatch, native):
    monkeypatch.setattr(precision, "cpu_has_native_bf16", lambda: native)
    cpu = "bf16" if native else "no"
    assert resolve_mixed_precision("auto", None, None) == (
        cpu,
        "this CPU has native bf16 (AMX/AVX512-BF16; --mixed_precision auto)"
        if native
        else "this CPU has no native bf16 (--mixed_precision auto)",
    )
    cuda = (
        "fp16",
        "the CUDA default (--mixed_precision auto); bf16 is available on this GPU (compute capability 9.0): "
        "--mixed_precision bf16",
    )
    assert resolve_mixed_precision("auto", None, HOPPER) == cuda
    assert resolve_mixed_precision("auto", None, VOLTA) == (
        "fp16",
        "the CUDA default (--mixed_precision auto); this GPU (compute capability 7.0) has no bf16",
    )
    assert resolve_mixed_precision("auto", "no", HOPPER)[0] == "fp16"  # 'no' is accelerate's default
    assert resolve_mixed_precision("auto", "no", None)[0] == cpu
    launcher = ("bf16", "accelerate launch --mixed_precision")
    assert resolve_mixed_precision("auto", "bf16", HOPPER) == resolve_mixed_precision("auto", "bf16", None) == launcher
    assert resolve_mixed_precision("no", "fp16", HOPPER) == ("no", "--mixed_precision")
    assert resolve_mixed_precision("bf16", None, None) == ("bf16", "--mixed_precision")
    assert resolve_mixed_precision("bf16", None, (8, 0)) == ("bf16", "--mixed_precision")
    assert resolve_mixed_precision("fp16", None, HOPPER) == ("fp16", "--mixed_precision")
    assert resolve_mixed_precision("fp16", None, VOLTA) == ("fp16", "--mixed_precision")
    fallback = (cpu, f"fp16 unavailable on CPU, fell back to {cpu}")
    assert resolve_mixed_precision("fp16", None, None) == fallback
    assert resolve_mixed_precision("auto", "fp16", None) == fallback


@pytest.mark.parametrize("native", [True, False], ids=["native-bf16-cpu", "cpu-without-bf16"])
def test_a_launcher_no_that_hfbert_overrides_is_said_with_where_fp32_is_chosen(monkeypatch, native):
    """accelerate launch writes 'no' also when --mixed_precision was not given to it, so it chooses nothing; where
    --mixed_precision auto then picks another precision, the reason says so and names the flag that gives fp32."""
    monkeypatch.setattr(precision, "cpu_has_native_bf16", lambda: native)
    overridden = "accelerate launch's --mixed_precision no (also written when not given) chooses nothing"
    fp32 = "for fp32 pass --mixed_precision no after the script"
    for capability in (None, HOPPER):
        chosen, reason = resolve_mixed_precision("auto", "no", capability)
        assert (chosen != "no") == (overridden in reason and fp32 in reason), (capability, reason)
    assert resolve_mixed_precision("auto", "no", None)[0] == ("bf16" if native else "no")
    assert overridden not in resolve_mixed_precision("auto", None, HOPPER)[1]  # no launcher: nothing to say
    assert resolve_mixed_precision("no", "no", HOPPER) == ("no", "--mixed_precision")


@pytest.mark.parametrize(
    "requested, launcher, capability",
    [("bf16", None, VOLTA), ("auto", "bf16", (7, 5)), ("bf16", "fp16", (6, 1))],
    ids=["flag-on-a-v100", "launcher-on-a-t4", "flag-on-a-p100"],
)
def test_bf16_is_refused_on_a_gpu_below_compute_capability_8(requested, launcher, capability):
    major, minor = capability
    expected = rf"needs a GPU of compute capability 8\.0 or newer; this one has {major}\.{minor}: train in fp16"
    with pytest.raises(Refusal, match=expected) as refusal:
        resolve_mixed_precision(requested, launcher, capability)
    assert "\n" not in str(refusal.value)


def test_the_refusal_comes_before_the_accelerator_and_the_run_logs_its_precision_and_why(monkeypatch, caplog):
    settings = parse_args(["--output_dir", "unused", "--mixed_precision", "bf16"])
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: VOLTA)
    monkeypatch.delenv("ACCELERATE_USE_CPU", raising=False)
    with mock.patch.object(precision, "Accelerator") as accelerator, pytest.raises(Refusal, match=r"this one has 7\.0"):
        precision.build_accelerator(settings.optimization, settings.output)
    accelerator.assert_not_called()  # refused before any work
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(precision, "cpu_has_native_bf16", lambda: False)
    settings = parse_args(["--output_dir", "unused", "--mixed_precision", "auto"])
    with mock.patch.object(precision, "Accelerator") as accelerator, caplog.at_level(logging.INFO, "hfbert"):
        accelerator.return_value.device, accelerator.return_value.num_processes = torch.device("cpu"), 1
        assert precision.build_accelerator(settings.optimization, settings.output)[1] == "no"
    logged = "Precision: fp32: this CPU has no native bf16 (--mixed_precision auto); device cpu, 1 process(es)."
    assert logged in caplog.text


@pytest.mark.parametrize(
    "cpuinfo, native",
    [
        ("flags\t\t: fpu sse avx2 avx512f avx512_bf16 avx512_vnni\n", True),
        ("flags\t\t: fpu sse avx2 amx_bf16 amx_tile\n", True),
        ("flags\t\t: fpu sse avx2 avx512f avx512_vnni\n", False),
        (OSError("no /proc"), False),
    ],
    ids=["avx512_bf16", "amx_bf16", "neither", "no-cpuinfo"],
)
def test_cpu_has_native_bf16_reads_the_cpu_flags(cpuinfo, native):
    read = mock.patch.object(Path, "read_text", side_effect=[cpuinfo])
    with read as read_text:
        assert cpu_has_native_bf16() is native
    read_text.assert_called_once()
