"""hfbert.pretraining.precision: the precision a run trains in, and why."""

from pathlib import Path
from unittest import mock

import pytest

from hfbert.pretraining import precision
from hfbert.pretraining.precision import cpu_has_native_bf16, resolve_mixed_precision


@pytest.mark.parametrize("native", [True, False], ids=["native-bf16-cpu", "cpu-without-bf16"])
def test_precision_choice(monkeypatch, native):
    monkeypatch.setattr(precision, "cpu_has_native_bf16", lambda: native)
    cpu = "bf16" if native else "no"
    assert resolve_mixed_precision("auto", None, cuda=False) == (
        cpu,
        "CPU with native bf16" if native else "CPU without native bf16",
    )
    cuda = ("fp16", "CUDA device (fp16 with loss scaling)")
    assert resolve_mixed_precision("auto", None, cuda=True) == cuda
    assert resolve_mixed_precision("auto", "no", cuda=True)[0] == "fp16"  # 'no' is accelerate's default
    assert resolve_mixed_precision("auto", "no", cuda=False)[0] == cpu
    launcher = ("bf16", "accelerate launch --mixed_precision")
    assert (
        resolve_mixed_precision("auto", "bf16", cuda=True)
        == resolve_mixed_precision("auto", "bf16", cuda=False)
        == launcher
    )
    assert resolve_mixed_precision("no", "fp16", cuda=True) == ("no", "--mixed_precision")
    assert resolve_mixed_precision("bf16", None, cuda=False) == ("bf16", "--mixed_precision")
    assert resolve_mixed_precision("fp16", None, cuda=True) == ("fp16", "--mixed_precision")
    fallback = (cpu, f"fp16 unavailable on CPU, fell back to {cpu}")
    assert resolve_mixed_precision("fp16", None, cuda=False) == fallback
    assert resolve_mixed_precision("auto", "fp16", cuda=False) == fallback


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
