"""The tooling's tests (benchmarks/: the chaos soak, gpu_report, the benchmarks): beside the tooling and out of
the default run (pyproject.toml's testpaths is tests/), as many of them run a benchmark or a trial end to end;
the README's test command (CI) runs the fast ones after the suite. All of them: `python -m pytest benchmarks/tests -n 2`. The suite's fixtures serve them too."""

from tests.conftest import (  # noqa: F401 (pytest finds fixtures among a conftest's names)
    _fresh_accelerator_state,
    _seed_everything,
    run_inputs,
    sample_documents,
    sample_tokenizer,
    tiny_config,
)
