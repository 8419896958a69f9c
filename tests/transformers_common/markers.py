"""The pytest markers transformers' common tests use (transformers 5.23.0: its pyproject.toml and conftest), so
the vendored module imports under this project's --strict-markers.

`pytest.mark.<name>` is checked when the vendored module is imported, before any pytest_plugins or
conftest in a test module could register them, so they are added to the running config here, at import.
"""

import pytest

MARKERS = {
    "accelerate_tests": "tests that need accelerate (transformers' marker)",
    "flash_attn_test": "tests that need flash-attn 2 (transformers' marker)",
    "flash_attn_3_test": "tests that need flash-attn 3 (transformers' marker)",
    "flash_attn_4_test": "tests that need flash-attn 4 (transformers' marker)",
    "torch_compile_test": "tests that torch.compile (transformers' marker)",
}


def register_markers() -> None:
    config = getattr(pytest.mark, "_config", None)  # the running pytest config (None outside pytest)
    if config is None:
        return
    known = {line.split(":")[0].strip() for line in config.getini("markers")}
    for name, description in MARKERS.items():
        if name not in known:
            config.addinivalue_line("markers", f"{name}: {description}")
