"""Mutation testing of the modules that keep a user's run safe and exact, each with its own fast tests.

mutmut (the `[dev]` extra) mutates one module at a time and runs, per mutant, only the chosen tests that call
the mutated function. mutmut reads one `[tool.mutmut]` table per project, and each module here has its own
tests, so this driver copies the repository into a scratch folder per module and writes that table there
(the repository's pyproject.toml stays free of it):

    python -m benchmarks.mutation --module hfbert/files.py
    python -m benchmarks.mutation --module hfbert/files.py --workdir /tmp/mut-files --max_children 2

It prints the score (killed / total, timeouts and mutants no test reaches counted apart) and every survivor as
`file:line` with its diff; the results in benchmarks/results/mutation.md are its output.
"""

from __future__ import annotations

import argparse
import ast
import difflib
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

# The fast tests (no `slow` marker) that cover each module: seconds per mutant on a CPU.
TESTS_BY_MODULE = {
    "hfbert/checkpointing.py": ["tests/test_checkpointing.py", "tests/test_files.py"],
    "hfbert/files.py": ["tests/test_files.py", "tests/test_checkpointing.py"],
    "hfbert/pretraining/extras/reshard.py": ["tests/test_reshard.py"],
    # optimization.py's successor: the optimizer, the schedule and the Training (step, update, checkpoint, resume)
    "hfbert/pretraining/training.py": [
        "tests/test_optimization.py", "tests/test_update.py", "tests/test_loop.py", "tests/test_reshard.py",
    ],
    "hfbert/pretraining/settings.py": [
        "tests/test_pretraining_settings.py",
        "tests/test_cli_help.py::test_pretraining_help_shows_the_value_a_run_gets_once_and_never_none",
        # the refusals of a streamed run and those through run_pretraining's main: before any work
        "tests/test_training.py::test_streaming_refuses_what_a_stream_cannot_do_before_any_work",
        "tests/test_training.py::test_bad_flags_are_refused",
    ],
    # the resume and preemption parts (the --only globs in benchmarks/results/mutation.md); the subprocess
    # tests of preemption are slow and mutmut maps only in-process calls: one in-process preemption test is fast
    "hfbert/pretraining/loop.py": ["tests/test_loop.py", "tests/test_training.py", "tests/test_cli.py"],
    "hfbert/finetune/settings.py": ["tests/test_finetune.py", "tests/test_cli_help.py::test_finetune_help_shows_the_defaults"],
    "hfbert/finetune/models.py": ["tests/test_finetune.py"],
    "hfbert/finetune/data.py": ["tests/test_finetune.py"],
    "hfbert/finetune/selection.py": ["tests/test_finetune.py"],
}

COPIED = ["hfbert", "tests", "benchmarks", "pyproject.toml", "run_pretraining.py", "train_tokenizer.py"]


def _toml_list(values: list[str]) -> str:
    return "[" + ", ".join(json.dumps(v) for v in values) + "]"


def prepare(modules: list[str], workdir: Path, deselect: str | None, commit: str | None) -> None:
    """A scratch copy of the repository (the working tree, or `commit`'s files) whose pyproject.toml tells
    mutmut the modules and their tests."""
    if workdir.exists():
        shutil.rmtree(workdir)
    workdir.mkdir(parents=True)
    if commit is not None:  # e.g. the tests before a change, against the same library
        archive = subprocess.run(["git", "-C", str(REPO), "archive", commit, *COPIED], capture_output=True, check=True)
        subprocess.run(["tar", "-x", "-C", str(workdir)], input=archive.stdout, check=True)
    else:
        ignore = shutil.ignore_patterns("__pycache__", "*.egg-info", "results")
        for name in COPIED:
            source = REPO / name
            if source.is_dir():
                shutil.copytree(source, workdir / name, ignore=ignore)
            else:
                shutil.copy2(source, workdir / name)
    tests = list(dict.fromkeys(test for module in modules for test in TESTS_BY_MODULE[module]))
    selection = [*tests, "-m", "not slow"]
    if deselect:
        selection += ["-k", deselect]
    with open(workdir / "pyproject.toml", "a") as f:
        f.write(
            "\n[tool.mutmut]\n"
            'source_paths = ["hfbert"]\n'
            f"only_mutate = {_toml_list(modules)}\n"
            f"pytest_add_cli_args_test_selection = {_toml_list(selection)}\n"
            # torch is not fork-safe after the suite ran in the forking process
            'process_isolation = "forkserver"\n'
            "use_git_change_detection = false\n"
        )


STATUS_BY_EXIT_CODE = {0: "survived", 33: "no tests", 34: "skipped", 37: "caught by type check"}


def mutmut_command() -> list[str]:
    return [str(Path(sys.executable).with_name("mutmut"))]


def results(workdir: Path) -> dict[str, str]:
    out = subprocess.run(
        [*mutmut_command(), "results", "--all", "true"],
        cwd=workdir, capture_output=True, text=True, check=True,
    ).stdout
    status_by_mutant = {}
    for line in out.splitlines():
        name, _, status = line.strip().rpartition(": ")
        if name:
            status_by_mutant[name] = status
    return status_by_mutant


# `mutmut show` for many mutants in one process (one `mutmut show` per survivor takes seconds each).
_DIFFS = """
import json, sys
from mutmut.mutation.diff_apply import find_mutant, get_diff_for_mutant
names = json.load(sys.stdin)
json.dump({name: get_diff_for_mutant(name, path=find_mutant(name).path) for name in names}, sys.stdout)
"""


def diffs_of(workdir: Path, mutants: list[str]) -> dict[str, str]:
    out = subprocess.run(
        [sys.executable, "-c", _DIFFS], cwd=workdir, input=json.dumps(mutants), capture_output=True, text=True,
        check=True,
    ).stdout
    return json.loads(out)


def function_lines(module_source: str, mutant: str) -> range:
    """The module's lines of the function a mutant changes (`pkg.mod.x_name__mutmut_3`, `pkg.mod.xǁCǁname__mutmut_3`)."""
    qualified = mutant.rsplit(".", 1)[1].rsplit("__mutmut_", 1)[0]
    parts = qualified.split("ǁ")[1:] if "ǁ" in qualified else [qualified.removeprefix("x_")]
    nodes = ast.parse(module_source).body
    for part in parts:
        node = next(
            n for n in nodes if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef) and n.name == part
        )
        nodes = node.body
    return range(node.lineno, node.end_lineno + 1)


def line_of_change(module_source: str, mutant: str, diff: str) -> tuple[int | None, str]:
    """The module's line the mutant changes (found by the removed line's text in its function) and the change."""
    removed = [ln[1:] for ln in diff.splitlines() if ln.startswith("-") and not ln.startswith("---")]
    added = [ln[1:] for ln in diff.splitlines() if ln.startswith("+") and not ln.startswith("+++")]
    if not removed:
        return None, diff.strip()
    lines = module_source.splitlines()
    span = function_lines(module_source, mutant)
    # the diff's first line is the def with mutmut's name for it; the changed line is the last one removed
    target = removed[-1].strip()
    change = " ".join(
        f"`{a.strip()}` -> `{b.strip()}`" for a, b in zip(removed, added, strict=False) if a.strip() != b.strip()
    ) or f"removed `{target}`"
    candidates = [n for n in span if lines[n - 1].strip() == target]
    if not candidates:  # a statement over several lines, which mutmut shows on one
        close = difflib.get_close_matches(target, [lines[n - 1].strip() for n in span], n=1, cutoff=0.3)
        candidates = [n for n in span if close and lines[n - 1].strip() == close[0]]
    return (candidates[0] if candidates else None), change


def report(module: str, workdir: Path) -> dict:
    """The score of `module` in a finished run in `workdir`, and its survivors."""
    # mutants outside --only stay "not checked": not part of the score
    dotted = module.removesuffix(".py").replace("/", ".") + "."
    status_by_mutant = {
        k: v for k, v in results(workdir).items() if v != "not checked" and k.startswith(dotted)
    }
    counts: dict[str, int] = {}
    for status in status_by_mutant.values():
        counts[status] = counts.get(status, 0) + 1
    module_source = (workdir / module).read_text()  # the source as it was mutated
    left = [m for m, status in status_by_mutant.items() if status not in ("killed", "timeout")]
    diffs = diffs_of(workdir, left)
    survivors = []
    for mutant in sorted(left, key=_natural):
        line, change = line_of_change(module_source, mutant, diffs[mutant])
        survivors.append({"mutant": mutant, "status": status_by_mutant[mutant], "line": line, "change": change})
    killed = counts.get("killed", 0)
    total = len(status_by_mutant)
    return {"module": module, "total": total, "killed": killed, "counts": counts, "survivors": survivors}


def markdown(summary: dict) -> str:
    """A module's score and its survivors, as benchmarks/results/mutation.md lists them."""
    counts = summary["counts"]
    lines = [
        f"{summary['module']}: killed {summary['killed']} / {summary['total']} "
        f"({100 * summary['killed'] / max(summary['total'], 1):.0f} %); timeouts {counts.get('timeout', 0)}, "
        f"survived {counts.get('survived', 0)}, reached by no test {counts.get('no tests', 0)}",
        "",
    ]
    for s in summary["survivors"]:
        change = s["change"] if len(s["change"]) < 300 else s["change"][:300] + " ..."
        lines.append(f"- {s['status']}: `{summary['module']}:{s['line']}` {change}")
    return "\n".join(lines) + "\n"


def _natural(name: str) -> list:
    return [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", name)]


def main(argv: list[str] | None = None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--module", required=True, nargs="+", choices=sorted(TESTS_BY_MODULE),
        help="one or more: modules sharing their tests share one run (the tests are traced once)",
    )
    parser.add_argument("--workdir", type=Path, default=None, help="scratch copy (default /tmp/hfbert-mutation/<module>)")
    parser.add_argument("--max_children", type=int, default=1, help="mutants run at once (the machine's free cores)")
    parser.add_argument(
        "--only", nargs="+", default=None,
        help="mutmut's mutant-name globs: a part of the module ('*.x_check_*'), or a sample ('*_mutmut_*[05]': every fifth)",
    )
    parser.add_argument("--commit", default=None, help="test this commit's files (default: the working tree)")
    parser.add_argument("--deselect", default=None, help="a pytest -k expression to narrow the tests")
    parser.add_argument("--report_only", action="store_true", help="summarize a finished run in --workdir")
    parser.add_argument("--json", type=Path, default=None, help="write the summary here")
    parser.add_argument("--markdown", type=Path, default=None, help="write the score and survivors here, as markdown")
    args = parser.parse_args(argv)
    name = "+".join(module.replace("/", "_").removesuffix(".py") for module in args.module)
    workdir = args.workdir or Path("/tmp/hfbert-mutation") / name
    if not args.report_only:
        prepare(args.module, workdir, args.deselect, args.commit)
        env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
        run = [*mutmut_command(), "run", "--max-children", str(args.max_children)]
        if args.only:
            run += args.only
        subprocess.run(run, cwd=workdir, env=env, check=True)
    summaries = [report(module, workdir) for module in args.module]
    for summary in summaries:
        print(f"{summary['module']}: killed {summary['killed']} / {summary['total']}  {summary['counts']}")
        for s in summary["survivors"]:
            print(f"  {s['status']}: {summary['module']}:{s['line']}  {s['change']}  ({s['mutant']})")
    if args.json:
        args.json.write_text(json.dumps(summaries, indent=1))
    if args.markdown:
        args.markdown.write_text("\n".join(markdown(summary) for summary in summaries))
    return summaries


if __name__ == "__main__":
    main()
