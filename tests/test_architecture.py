"""The import contracts in pyproject.toml (`lint-imports`, run by the README's test command) name every module
they are about: a module added to hfbert/ falls under the model files' contract and, if it is a stage of the
pipeline, under the optional parts' one; the contracts themselves hold (checked here through import-linter's
own entry point too, so a broken contract is a failing test)."""

import subprocess
import sys
from pathlib import Path

import tomllib

REPO = Path(__file__).resolve().parents[1]
HFBERT = REPO / "hfbert"
MODEL_FILES = {"hfbert.modeling_hfbert", "hfbert.configuration_hfbert"}
# The composition root, its command and the optional parts: the stages' contract is about the others.
NOT_STAGES = {"run", "cli", "extras", "__init__", "__main__"}


def contracts() -> dict[str, dict]:
    config = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["importlinter"]
    return {contract["name"]: contract for contract in config["contracts"]}


def top_level_modules() -> set[str]:
    names = {path.stem for path in HFBERT.glob("*.py") if path.stem != "__init__"}
    names |= {path.name for path in HFBERT.iterdir() if (path / "__init__.py").is_file()}
    return {f"hfbert.{name}" for name in names}


def test_the_model_files_contract_forbids_every_other_hfbert_module():
    (model_files,) = [c for c in contracts().values() if set(c.get("source_modules", [])) == MODEL_FILES]
    assert set(model_files["forbidden_modules"]) == top_level_modules() - MODEL_FILES


def test_every_stage_of_the_pipeline_is_a_layer_and_imports_no_optional_part():
    stages = {
        f"hfbert.pretraining.{path.stem if path.suffix else path.name}"
        for path in (HFBERT / "pretraining").iterdir()
        if (path.suffix == ".py" or (path / "__init__.py").is_file()) and path.stem not in NOT_STAGES
    }
    flow = next(c for c in contracts().values() if c["type"] == "layers")
    assert stages <= set(flow["layers"])
    (optional,) = [c for c in contracts().values() if "hfbert.pretraining.extras" in c.get("forbidden_modules", [])]
    assert stages <= set(optional["source_modules"])


def test_the_contracts_hold():
    command = "import sys; from importlinter.cli import lint_imports; sys.exit(lint_imports(no_cache=True))"
    done = subprocess.run([sys.executable, "-c", command], cwd=REPO, capture_output=True, text=True)
    assert done.returncode == 0, done.stdout[-3000:]
