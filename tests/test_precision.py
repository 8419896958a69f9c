"""hfbert.pretraining.precision: the precision a run trains in, and why."""

from hfbert.pretraining.precision import resolve_mixed_precision


def test_precision_choice():
    native = "bf16" if resolve_mixed_precision("auto", None, cuda=False)[0] == "bf16" else "no"
    assert resolve_mixed_precision("auto", None, cuda=True)[0] == "fp16"
    assert resolve_mixed_precision("auto", "no", cuda=True)[0] == "fp16"  # 'no' is accelerate's default
    assert resolve_mixed_precision("auto", "bf16", cuda=True)[0] == "bf16"
    assert resolve_mixed_precision("no", "fp16", cuda=True)[0] == "no"
    assert resolve_mixed_precision("fp16", None, cuda=False) == (
        native,
        f"fp16 unavailable on CPU, fell back to {native}",
    )
