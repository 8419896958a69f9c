"""hfbert installed from its wheel, outside the repository: every entry point runs (`python -m` and the console
scripts), with the recipes and the sample corpus that ship inside the package."""

import json
import os
import shutil
import site
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
# Each entry point as a module (python -m) and as a console script, with the name its usage line gives.
ENTRY_POINTS = {
    "hfbert.pretraining": "hfbert-pretrain",
    "hfbert.tokenization": "hfbert-tokenizer",
    "hfbert.finetune": "hfbert-finetune",
}


def run(command: list, cwd: Path, timeout: float = 300) -> subprocess.CompletedProcess:
    result = subprocess.run(
        [str(word) for word in command], cwd=cwd, env=installed_env(cwd), capture_output=True, text=True,
        timeout=timeout,
    )  # fmt: skip
    assert result.returncode == 0, f"{command} failed (exit {result.returncode}):\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}"
    return result


def installed_env(installed: Path) -> dict[str, str]:
    """This session's environment (offline, its own datasets cache: conftest) without PYTHONPATH, so that
    only the installed hfbert is importable, with the venv's scripts first on PATH."""
    env = {key: value for key, value in os.environ.items() if key != "PYTHONPATH"}
    bin_dir = installed / "venv" / "bin"
    return {**env, "PATH": f"{bin_dir}{os.pathsep}{env['PATH']}", "TOKENIZERS_PARALLELISM": "false",
            "MPLBACKEND": "Agg", "PYTHONUNBUFFERED": "1"}  # fmt: skip


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> Path:
    """A folder outside the repository holding venv/, a fresh venv with hfbert's wheel installed (no -e) and
    this environment's packages (torch, transformers, ...) visible behind its own: nothing is downloaded."""
    root = tmp_path_factory.mktemp("installed")
    source = root / "source"  # the wheel is built from a copy: building writes build/ and *.egg-info beside it
    shutil.copytree(REPO / "hfbert", source / "hfbert", ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(REPO / name, source / name)
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check"]
    run([*pip, "wheel", "--no-deps", "--no-build-isolation", "--no-index", "--wheel-dir", root / "dist", source], root)
    (wheel,) = (root / "dist").glob("hfbert-*.whl")
    shutil.rmtree(source)

    run([sys.executable, "-m", "venv", "--without-pip", root / "venv"], root)
    python = root / "venv" / "bin" / "python"
    purelib = run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], root).stdout.strip()
    # Plain paths, not site.addsitedir: an editable hfbert in this environment (pip install -e) stays unseen.
    site_dirs = [*site.getsitepackages(), *([site.getusersitepackages()] if site.ENABLE_USER_SITE else [])]
    (Path(purelib) / "this-environment.pth").write_text("\n".join(site_dirs) + "\n")
    run([python, "-m", "pip", "--disable-pip-version-check", "install", "--no-deps", "--no-index", wheel], root)

    # find_spec, not import: where hfbert would be imported from, without importing torch for it (seconds).
    where = run([python, "-c", "import importlib.util, sys; print(importlib.util.find_spec('hfbert').origin); print(sys.path)"], root).stdout
    assert where.startswith(purelib), f"hfbert is not the installed one: {where}"
    assert str(REPO) not in where.splitlines()[1].split("'"), f"the repository is on sys.path: {where}"
    return root


@pytest.mark.slow
def test_every_entry_point_prints_its_help_installed(installed):
    """`python -m <module> --help` and `<console script> --help`, all at once (each process imports torch)."""
    python = installed / "venv" / "bin" / "python"
    commands = {f"python -m {module}": [python, "-m", module, "--help"] for module in ENTRY_POINTS}
    commands |= {script: [installed / "venv" / "bin" / script, "--help"] for script in ENTRY_POINTS.values()}
    env = installed_env(installed)
    processes = {
        name: subprocess.Popen(
            [str(word) for word in command], cwd=installed, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            text=True,
        )
        for name, command in commands.items()
    }
    for name, process in processes.items():
        out, err = process.communicate(timeout=300)
        assert process.returncode == 0, f"{name} --help: exit {process.returncode}\n{err[-3000:]}"
        assert "--output_dir" in out, f"{name} --help:\n{out[:2000]}"
        if "finetune" not in name:  # hfbert.finetune's usage names its module form, whichever way it started
            assert out.startswith(f"usage: {name} "), f"{name} --help:\n{out[:300]}"


@pytest.mark.slow
def test_a_tokenizer_and_a_two_update_pretraining_run_installed(installed):
    """The tokenizer on the shipped sample (hfbert-tokenizer), then a recipe's run cut to two updates with it
    (accelerate launch -m hfbert.pretraining): the recipe, the sample and the model code all come from the
    installed package."""
    python = installed / "venv" / "bin" / "python"
    tokenizer = installed / "tokenizer"
    result = run([installed / "venv" / "bin" / "hfbert-tokenizer", "--vocab_size", "1000", "--output_dir", tokenizer], installed)
    assert f"Saved tokenizer to {tokenizer}" in result.stdout
    assert json.loads((tokenizer / "tokenizer.json").read_text())["model"]["type"] == "WordPiece"

    output_dir = installed / "runs" / "tiny"
    launch = [python, "-m", "accelerate.commands.launch", "--num_processes", "1", "--num_machines", "1",
              "--mixed_precision", "no", "--dynamo_backend", "no"]  # fmt: skip
    flags = ["--recipe", "quick-start", "--tokenizer_name", tokenizer, "--max_train_steps", "2", "--eval_steps", "2",
             "--checkpointing_steps", "2", "--dupe_factor", "1", "--per_device_train_batch_size", "8",
             "--max_eval_samples", "64", "--output_dir", output_dir]  # fmt: skip
    result = run([*launch, "-m", "hfbert.pretraining", *flags], installed)
    assert f"Model, tokenizer, model card, curves and samples: {output_dir.resolve()}" in result.stdout
    assert json.loads((output_dir / "eval_results.json").read_text())["step"] == 2
    training_args = json.loads((output_dir / "training_args.json").read_text())
    assert training_args["recipe"] == "quick-start" and training_args["attention_init"] == "structured"
    installed_modeling = next((installed / "venv" / "lib").glob("python*/site-packages/hfbert/modeling_hfbert.py"))
    assert (output_dir / "modeling_hfbert.py").read_bytes() == installed_modeling.read_bytes()
