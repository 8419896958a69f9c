"""The docs say what the code does: every flag is documented, every name and pointer in them resolves, and\nevery command and snippet in them runs as written (or is checked offline, or skipped with a reason)."""

import argparse
import collections
import dataclasses
import importlib
import json
import os
import re
import runpy
import shlex
import subprocess
import sys
from pathlib import Path
from unittest import mock

import pytest
from accelerate.state import AcceleratorState, GradientState
from transformers import HfArgumentParser

from hfbert.corpus_arguments import CorpusArguments
from hfbert.errors import REFUSAL_EXIT_CODE
from hfbert.pretraining.cli import build_parser
from hfbert.tokenization import TokenizerTrainingArguments

REPO = Path(__file__).resolve().parents[1]
DOC_FILES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
PRETRAINING_DOC = REPO / "docs" / "pretraining.md"


def documented_flags(parser: argparse.ArgumentParser) -> list[str]:
    """The parser's flags as --help shows them first (underscores; HfArgumentParser adds dashed aliases)."""
    return [
        option
        for action in parser._actions
        if action.help != argparse.SUPPRESS and not isinstance(action, argparse._HelpAction)
        for option in action.option_strings
        if option.startswith("--") and "-" not in option[2:]
    ]


def mentions(text: str, flag: str) -> bool:
    return re.search(re.escape(flag) + r"(?![\w-])", text) is not None  # --seed is not --seeds


@pytest.mark.parametrize(
    "script, parser",
    [
        ("run_pretraining.py", build_parser()),
        ("train_tokenizer.py", HfArgumentParser((CorpusArguments, TokenizerTrainingArguments))),
    ],
)
def test_docs_pretraining_covers_every_flag_of_the_scripts(script, parser):
    text = PRETRAINING_DOC.read_text()
    flags = documented_flags(parser)
    assert len(flags) > 10  # the parser's flags were found
    missing = [flag for flag in flags if not mentions(text, flag)]
    assert not missing, f"docs/pretraining.md says it covers every flag of {script}; it lacks {missing}"


def test_train_tokenizer_parser_here_is_the_scripts_own():
    """The parser above mirrors hfbert.tokenization.main's: its flags are what `train_tokenizer.py --help` lists."""
    source = (REPO / "hfbert" / "tokenization.py").read_text()
    assert "HfArgumentParser((CorpusArguments, TokenizerTrainingArguments))" in source


def dotted_names(text: str) -> set[str]:
    return set(re.findall(r"`(?:python -m )?(hfbert(?:\.[A-Za-z_]\w*)+)", text))


@pytest.mark.parametrize("doc", DOC_FILES, ids=lambda path: path.name)
def test_every_hfbert_name_in_the_docs_resolves(doc):
    """`hfbert.module.name` in a doc imports: a doc that moved with the code keeps naming the right module."""
    names = dotted_names(doc.read_text())
    unresolved = []
    for name in sorted(names):
        parts = name.split(".")
        for length in range(len(parts), 0, -1):
            try:
                found = importlib.import_module(".".join(parts[:length]))
                break
            except ImportError:
                continue
        for attribute in parts[length:]:
            if not hasattr(found, attribute):
                unresolved.append(name)
                break
            found = getattr(found, attribute)
    assert not unresolved, f"{doc.name} names what does not exist: {unresolved}"


def test_dotted_names_are_found_and_a_wrong_one_is_caught():
    assert dotted_names("(`hfbert.modeling_hfbert.masked_positions_from_labels`)") == {
        "hfbert.modeling_hfbert.masked_positions_from_labels"
    }
    import hfbert.modeling_hfbert

    assert not hasattr(hfbert.modeling_hfbert, "masked_positions_from_labels")  # the name the docs once gave


def test_help_points_to_doc_sections_that_exist():
    """A --help pointer names a doc file and a section ("docs/quality.md, 'Where the gain comes from'") that are
    there; "see README" alone points nowhere."""
    pointers = []
    for action in build_parser()._actions:
        help_text = " ".join((action.help or "").split())
        assert "see README" not in help_text, f"{action.option_strings[0]}: point at a section: {help_text}"
        for path, section in re.findall(r"(docs/[\w.]+\.md), '([^']+)'", help_text):
            pointers.append((action.option_strings[0], path, section))
    assert {flag for flag, _, _ in pointers} >= {"--attention_init", "--deterministic"}
    for flag, path, section in pointers:
        assert section in (REPO / path).read_text(), f"{flag} points at {path}, '{section}', which is not there"


# ------------------------------------------------------------------------------- the docs' commands, as written
#
# Every fenced command block in README.md and docs/*.md carries a decision in an HTML comment right above its
# fence (other comments, such as <!-- test-command -->, may sit between):
#
#   <!-- doc-test: run -->            run as written, in a folder that holds the quick start's run folder
#   <!-- doc-test: tiny (reason) -->  a long run: run with BUDGET_FLAGS cut to TINY_BUDGET and the install steps
#                                     dropped (the test runs in its own venv, offline); the reason says so
#   <!-- doc-test: files (reason) --> as tiny, in a folder where the test wrote a small corpus (my_texts/, a file
#                                     a document, and my_texts.txt) and labelled rows (train.csv, test.csv), with
#                                     hfbert.finetune cut to FINETUNE_BUDGET
#   <!-- doc-test: parse (reason) -->  a long run_pretraining.py run: its flags are parsed and checked in process
#   <!-- doc-test: hub -->            needs the Hub: with the Hub offline each command must end with one line that
#                                     refuses and names the Hub, not with a traceback (run in process, see below)
#   <!-- doc-test: pushed -->         loads a pushed model by its Hub id: run as written with the Hub offline, its
#                                     cache holding the quick start's folder under that id as a push uploads it
#   <!-- doc-test: skip (reason) -->  not run; the reason says why
#
# A block without a decision fails, as does an indented code block (a command this test would not see) and a
# fence without a language (```text for what is not a command).

COMMAND_LANGUAGES = {"bash", "sh", "shell", "console", "python", "py"}
KINDS_WITH_REASON = {"tiny", "files", "parse", "skip"}
DECISION = re.compile(r"<!--\s*doc-test:\s*(\w+)\s*(?:\((.+)\))?\s*-->")
BUDGET_FLAGS = {"--max_train_steps": "2", "--max_train_seconds": None, "--eval_steps": "2", "--checkpointing_steps": "2"}
INSTALL_STEPS = ("python3 -m venv ", ". .venv/bin/activate", "pip install ")
HUB_WORDS = ("hub", "huggingface.co")


@dataclasses.dataclass(frozen=True)
class DocBlock:
    doc: str  # file name relative to the repository
    line: int  # of the opening fence
    language: str
    text: str
    kind: str | None  # the doc-test decision
    reason: str | None

    @property
    def id(self) -> str:
        return f"{self.doc}:{self.line}"

    def commands(self) -> list[str]:
        """The block's shell commands: continuation lines joined, comments and blank lines dropped."""
        joined = self.text.replace("\\\n", " ")
        return [" ".join(line.split()) for line in joined.splitlines() if line.strip() and not line.lstrip().startswith("#")]


def doc_blocks(path: Path) -> tuple[list[DocBlock], list[str]]:
    """The fenced blocks of a markdown file, and what this test cannot account for (problems)."""
    lines = path.read_text().splitlines()
    name = str(path.relative_to(REPO))
    blocks, problems = [], []
    index = 0
    while index < len(lines):
        line = lines[index]
        if line.startswith("```"):
            language = line[3:].strip()
            end = next((i for i in range(index + 1, len(lines)) if lines[i].startswith("```")), None)
            if end is None:
                problems.append(f"{name}:{index + 1}: a fence that is never closed")
                break
            comments, above = [], index - 1
            while above >= 0 and lines[above].strip().startswith("<!--") and lines[above].strip().endswith("-->"):
                comments.append(lines[above].strip())
                above -= 1
            decisions = [DECISION.fullmatch(comment) for comment in comments if "doc-test" in comment]
            kind = reason = None
            if not language:
                problems.append(f"{name}:{index + 1}: a fence without a language (```text for what is not a command)")
            elif language in COMMAND_LANGUAGES:
                if len(decisions) != 1 or decisions[0] is None:
                    problems.append(f"{name}:{index + 1}: a ```{language} block without one <!-- doc-test: ... --> decision")
                else:
                    kind, reason = decisions[0].group(1), decisions[0].group(2)
                    if kind not in {"run", "hub", "pushed", *KINDS_WITH_REASON}:
                        problems.append(f"{name}:{index + 1}: unknown doc-test decision {kind!r}")
                    elif kind in KINDS_WITH_REASON and not (reason or "").strip():
                        problems.append(f"{name}:{index + 1}: doc-test: {kind} needs a (reason)")
            text = "\n".join(lines[index + 1 : end]) + "\n"
            blocks.append(DocBlock(name, index + 1, language, text, kind, reason))
            index = end + 1
            continue
        if line.startswith("    ") and line.strip() and index > 0 and not lines[index - 1].strip():
            problems.append(f"{name}:{index + 1}: an indented code block; fence it (```bash) and decide")
        index += 1
    return blocks, problems


ALL_BLOCKS = [block for doc in DOC_FILES for block in doc_blocks(doc)[0] if block.kind is not None]


def blocks_of(*kinds: str) -> list[DocBlock]:
    return [block for block in ALL_BLOCKS if block.kind in kinds]


@pytest.mark.parametrize("doc", DOC_FILES, ids=lambda path: path.name)
def test_every_command_block_has_a_decision(doc):
    _, problems = doc_blocks(doc)
    assert not problems, "\n".join(problems)


def test_a_block_without_a_decision_or_reason_is_caught(tmp_path):
    doc = tmp_path / "new.md"
    doc.write_text(
        "text\n\n```bash\necho a\n```\n\n<!-- doc-test: skip -->\n```python\nprint(1)\n```\n\n```\nx\n```\n\n"
        "    python -m something\n\n<!-- doc-test: run -->\n<!-- test-command -->\n```bash\necho b\n```\n"
    )
    with mock.patch(f"{__name__}.REPO", tmp_path):
        blocks, problems = doc_blocks(doc)
    assert [problem.split(": ", 1)[1] for problem in problems] == [
        "a ```bash block without one <!-- doc-test: ... --> decision",
        "doc-test: skip needs a (reason)",
        "a fence without a language (```text for what is not a command)",
        "an indented code block; fence it (```bash) and decide",
    ]
    assert (blocks[-1].kind, blocks[-1].text) == ("run", "echo b\n")


def test_every_decision_kind_is_used_and_every_block_is_counted():
    """The docs' blocks by decision, so that a block that silently dropped out of the run shows here."""
    kinds = collections.Counter(block.kind for block in ALL_BLOCKS)
    assert set(kinds) == {"run", "tiny", "files", "parse", "hub", "pushed", "skip"}
    assert len(blocks_of("tiny")) == 1  # the quick start, which the sandbox below trains
    assert len(blocks_of("pushed")) == 1  # loading the quick start's folder back by its Hub id
    assert len(blocks_of("files")) == 1  # "Your own text", run on the files the test below writes


def tiny_budget(command: str) -> str:
    """The command without its install steps and with its budget flags cut (BUDGET_FLAGS)."""
    steps = [step for step in command.split(" && ") if not step.strip().startswith(INSTALL_STEPS)]
    command = " && ".join(steps)
    for flag, value in BUDGET_FLAGS.items():
        replacement = f"--max_train_steps {BUDGET_FLAGS['--max_train_steps']}" if value is None else f"{flag} {value}"
        command = re.sub(rf"{flag} \S+", replacement, command)
    if "--recipe" in command:  # the recipe's budget, overridden by flags after it
        cut = " ".join(f"{flag} {value}" for flag, value in BUDGET_FLAGS.items() if value and flag not in command)
        command = f"{command} {cut}"
    return command


def test_tiny_budget_drops_the_install_and_cuts_the_budget():
    command = (
        "python3 -m venv .venv && . .venv/bin/activate && pip install torch==2.13.0 && pip install -e . && "
        "accelerate launch x.py --max_train_steps 800 --eval_steps 200 --checkpointing_steps 400 --output_dir r"
    )
    assert tiny_budget(command) == (
        "accelerate launch x.py --max_train_steps 2 --eval_steps 2 --checkpointing_steps 2 --output_dir r"
    )
    assert tiny_budget("python x.py --max_train_seconds 600 --eval_steps 1000") == (
        "python x.py --max_train_steps 2 --eval_steps 2"
    )
    assert tiny_budget("accelerate launch x.py --recipe quick-start --output_dir r") == (
        "accelerate launch x.py --recipe quick-start --output_dir r --max_train_steps 2 --eval_steps 2 "
        "--checkpointing_steps 2"
    )


def command_env() -> dict[str, str]:
    """This session's environment (offline, its own datasets cache: conftest) with this venv's python,
    accelerate and pip first on PATH."""
    bin_dir = str(Path(sys.executable).parent)
    return {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}", "TOKENIZERS_PARALLELISM": "false",
            "MPLBACKEND": "Agg", "PYTHONUNBUFFERED": "1"}  # fmt: skip


def working_folder(folder: Path) -> Path:
    """A folder laid out like the repository root for the docs' commands: the two scripts and benchmarks/."""
    folder.mkdir(parents=True, exist_ok=True)
    for name in ("run_pretraining.py", "train_tokenizer.py", "benchmarks"):
        (folder / name).symlink_to(REPO / name)
    return folder


def run_block(
    block: DocBlock, cwd: Path, text: str | None = None, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess:
    text = block.text if text is None else text
    if block.language in {"python", "py"}:
        (cwd / "snippet.py").write_text(text)
        command = [sys.executable, "snippet.py"]
    else:
        command = ["bash", "-euo", "pipefail", "-c", text]
    env = {**command_env(), **(env or {})}
    return subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, timeout=600)


def check_ran(block: DocBlock, result: subprocess.CompletedProcess) -> None:
    assert result.returncode == 0, f"{block.id} failed (exit {result.returncode}):\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}"
    assert "Traceback" not in result.stderr, f"{block.id}:\n{result.stderr[-3000:]}"


@pytest.fixture(scope="session")
def docs_sandbox(tmp_path_factory) -> Path:
    """A folder with the README's quick start run in it (runs/hfbert-tiny-wikitext), at a tiny budget; what
    the run printed is kept beside the folder, in QUICK_START_OUTPUT."""
    (quick_start,) = blocks_of("tiny")
    folder = working_folder(tmp_path_factory.mktemp("docs") / "root")
    (command,) = quick_start.commands()
    result = run_block(quick_start, folder, tiny_budget(command))
    check_ran(quick_start, result)
    (folder.parent / QUICK_START_OUTPUT).write_text(result.stdout + result.stderr)
    return folder


QUICK_START_OUTPUT = "quick-start-output.txt"
# What `accelerate launch` prints when a value it needs is neither on its command line nor in a config file.
ACCELERATE_DEFAULTS_WARNING = "were not passed to `accelerate launch` and had defaults used instead"


MAIN_LINE_LIMIT = 160  # characters of the quick start's command after its install steps


def launch_words(block: DocBlock) -> list[str]:
    """The words before run_pretraining.py in the block's command that runs it, install steps dropped."""
    (command,) = [command for command in block.commands() if "run_pretraining.py" in command]
    words = shlex.split(command.split(" && ")[-1])
    return words[: words.index("run_pretraining.py")]


def test_the_readme_launch_lines_mean_what_they_say_and_the_main_line_is_short():
    """The quick start and "Your own text" give the launcher no precision: `accelerate launch` writes
    --mixed_precision no also when it is not given, so hfbert's own --mixed_precision auto decides, and a `no`
    before the script would read as fp32 while the run trains in bf16 on a CPU with native bf16."""
    for block in blocks_of("tiny", "files"):
        assert "--mixed_precision" not in launch_words(block), f"{block.id}: a launcher precision hfbert overrides"
    (quick_start,) = blocks_of("tiny")
    (command,) = quick_start.commands()
    main_line = command.split(" && ")[-1]
    assert len(main_line) <= MAIN_LINE_LIMIT, f"{quick_start.id}: {len(main_line)} characters: {main_line}"


@pytest.mark.slow
def test_the_quick_start_runs_at_a_tiny_budget(docs_sandbox):
    (quick_start,) = blocks_of("tiny")
    output_dir = re.search(r"--output_dir (\S+)", quick_start.text).group(1)
    final = docs_sandbox / output_dir
    assert {"model.safetensors", "config.json", "tokenizer.json", "README.md", "samples.md"} <= {
        path.name for path in final.iterdir()
    }
    assert json.loads((final / "eval_results.json").read_text())["step"] == int(BUDGET_FLAGS["--max_train_steps"])
    output = (docs_sandbox.parent / QUICK_START_OUTPUT).read_text()
    assert ACCELERATE_DEFAULTS_WARNING not in output, "name accelerate's defaults in the quick start's command"


def output_folder_names() -> list[str]:
    """The names in docs/pretraining.md's "The output folder" table (`checkpoint-<step>/` as written)."""
    section = PRETRAINING_DOC.read_text().split("## The output folder", 1)[1].split("\n## ", 1)[0]
    rows = [line.split("|")[1] for line in section.splitlines() if line.startswith("| `")]
    return [name for row in rows for name in re.findall(r"`([^`]+)`", row)]


@pytest.mark.slow
def test_the_output_folder_table_names_everything_the_quick_start_leaves(docs_sandbox):
    """The table omitted `.tokenizer/`, which every run that trains its tokenizer leaves."""
    (quick_start,) = blocks_of("tiny")
    folder = docs_sandbox / re.search(r"--output_dir (\S+)", quick_start.text).group(1)
    patterns = [re.escape(name.rstrip("/")).replace("<step>", r"\d+") for name in output_folder_names()]
    unnamed = [path.name for path in folder.iterdir() if not any(re.fullmatch(p, path.name) for p in patterns)]
    assert not unnamed, f"docs/pretraining.md's output folder table lacks {unnamed}"


@pytest.mark.slow
@pytest.mark.parametrize("block", blocks_of("run"), ids=lambda block: block.id)
def test_doc_block_runs_as_written(block, docs_sandbox, tmp_path):
    """Each in a folder of its own that sees the quick start's runs/ (so the files one block writes are not
    another's input)."""
    cwd = working_folder(tmp_path / "root")
    (cwd / "runs").symlink_to(docs_sandbox / "runs")
    check_ran(block, run_block(block, cwd))


def hub_cache_holding(folder: Path, repo_id: str, cache: Path) -> None:
    """A Hub cache (huggingface_hub's layout: a snapshot and refs/main) holding what a push of `folder` uploads."""
    from hfbert.model_card import upload_file_set

    repo = cache / f"models--{repo_id.replace('/', '--')}"
    revision = "0" * 40
    for name in upload_file_set(folder):
        (repo / "snapshots" / revision / name).parent.mkdir(parents=True, exist_ok=True)
        (repo / "snapshots" / revision / name).symlink_to(folder / name)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(revision)


@pytest.mark.slow
@pytest.mark.parametrize("block", blocks_of("pushed"), ids=lambda block: block.id)
def test_a_pushed_model_loads_by_its_hub_id_as_written(block, docs_sandbox, tmp_path):
    """Offline, from a Hub cache that holds the quick start's folder as `python -m hfbert.push` uploads it: the
    snippet finds every file it needs under the id, the model's code included."""
    (repo_id,) = set(re.findall(r'from_pretrained\("([\w-]+/[\w.-]+)"', block.text))
    (quick_start,) = blocks_of("tiny")
    folder = docs_sandbox / re.search(r"--output_dir (\S+)", quick_start.text).group(1)
    hub_cache_holding(folder, repo_id, tmp_path / "hub")
    cwd = working_folder(tmp_path / "root")
    check_ran(block, run_block(block, cwd, env={"HF_HUB_CACHE": str(tmp_path / "hub"), "HF_HUB_OFFLINE": "1"}))


@pytest.mark.parametrize("block", blocks_of("parse"), ids=lambda block: block.id)
def test_long_run_flags_parse_and_pass_the_checks(block):
    from hfbert.pretraining.cli import parse_args

    (command,) = block.commands()
    words = shlex.split(command)
    assert "run_pretraining.py" in words, f"{block.id}: doc-test: parse is for run_pretraining.py commands"
    settings = parse_args(words[words.index("run_pretraining.py") + 1 :])
    assert settings.output.output_dir


HUB_COMMANDS: dict[str, str] = {}  # each command once (docs/pretraining.md repeats the README's), with its block
for _block in blocks_of("hub"):
    for _command in _block.commands():
        HUB_COMMANDS.setdefault(_command, _block.id)


@pytest.mark.slow
@pytest.mark.parametrize("command, block_id", HUB_COMMANDS.items(), ids=list(HUB_COMMANDS.values()))
def test_hub_command_refuses_in_one_line_naming_the_hub_when_offline(command, block_id, docs_sandbox, tmp_path, monkeypatch, capsys):
    """The script runs in this process through its own __main__ (runpy), with the command's argv: a new
    interpreter per command would cost more than this file's budget, and `accelerate launch` only starts the
    script (and adds a traceback of its own when the script exits non-zero). A command that starts from an
    earlier command's folder under runs/ (phase 2 from phase 1) finds the quick start's folder there."""
    words = shlex.split(command)
    script = next((word for word in words if word.endswith(".py")), None)
    assert script is not None, f"{block_id}: doc-test: hub is for the two scripts' commands: {command}"
    cwd = working_folder(tmp_path / "root")
    (quick_start,) = blocks_of("tiny")
    quick_start_folder = docs_sandbox / re.search(r"--output_dir (\S+)", quick_start.text).group(1)
    if "--model_name_or_path" in words:
        source = cwd / words[words.index("--model_name_or_path") + 1]
        source.parent.mkdir(parents=True, exist_ok=True)
        source.symlink_to(quick_start_folder)
    monkeypatch.chdir(cwd)
    monkeypatch.setattr(sys, "argv", words[words.index(script) :])
    try:
        with pytest.raises(SystemExit) as exit_info:
            runpy.run_path(str(cwd / script), run_name="__main__")
    finally:
        AcceleratorState._reset_state(reset_partial_state=True)
        GradientState._reset_state()
    assert exit_info.value.code == REFUSAL_EXIT_CODE, f"{block_id}: exit {exit_info.value.code}"
    lines = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert lines[-1].startswith(f"{script}: error: "), f"{block_id}: {lines[-3:]}"
    assert any(word in lines[-1].lower() for word in HUB_WORDS), f"{block_id}: the refusal does not name the Hub: {lines[-1]}"


# ------------------------------------------------------------------------ commands that stand for a recipe
#
# A command that trains what a shipped recipe trains names the recipe (`--recipe NAME`), so that it cannot drift
# from the recipe when a default changes (the quality recipe's command, spelled out, lost its structured start
# when the default start became BERT's). A run_pretraining.py command, or the flags a benchmark passes to it
# after `--`, that sets most of a recipe's values without `--recipe` is a recipe copied by hand.

COPIED_SHARE = 0.6  # of a recipe's values


def pretraining_flags(command: str) -> dict[str, str] | None:
    """The run_pretraining.py flags of a command (after the script, or after a benchmark's `--`), by name."""
    if "run_pretraining.py" not in command and "benchmarks." not in command:
        return None
    words = shlex.split(command)
    if "run_pretraining.py" in words:
        words = words[words.index("run_pretraining.py") + 1 :]
    elif any(word.startswith("benchmarks.") for word in words) and "--" in words:
        words = words[words.index("--") + 1 :]
    else:
        return None
    flags = {}
    for index, word in enumerate(words):
        if word.startswith("--"):
            following = words[index + 1] if index + 1 < len(words) else ""
            flags[word[2:]] = "true" if following.startswith("--") or not following else following
    return flags


def same_value(given: str, recipe_value) -> bool:
    try:
        return float(given) == float(recipe_value)
    except (TypeError, ValueError):
        return given.lower() == str(recipe_value).lower()


def copied_recipe(flags: dict[str, str]) -> str | None:
    """The shipped recipe whose values `flags` repeat the most of, when that is most of them and they do not
    name it (recipes share values: own-text is the quick start's)."""
    import yaml

    from hfbert.pretraining.cli import shipped_recipes

    if "recipe" in flags:
        return None
    shares = {}
    for name, path in shipped_recipes().items():
        values = yaml.safe_load(path.read_text())
        repeated = [key for key, value in values.items() if key in flags and same_value(flags[key], value)]
        shares[name] = len(repeated) / len(values)
    name = max(shares, key=shares.get, default=None)
    return name if name is not None and shares[name] >= COPIED_SHARE else None


def test_no_doc_command_spells_out_a_recipe_and_every_named_recipe_is_shipped():
    from hfbert.pretraining.cli import shipped_recipes

    copies, unknown = [], []
    for block in ALL_BLOCKS:
        if block.language not in {"bash", "sh", "shell", "console"}:
            continue
        for command in block.commands():
            flags = pretraining_flags(command)
            if flags is None:
                continue
            if (name := copied_recipe(flags)) is not None:
                copies.append(f"{block.id}: spells out the {name} recipe's flags; write --recipe {name}")
            if "recipe" in flags and flags["recipe"] not in shipped_recipes():
                unknown.append(f"{block.id}: --recipe {flags['recipe']} is no shipped recipe")
    assert not copies and not unknown, "\n".join(copies + unknown)


def test_a_recipe_spelled_out_by_hand_is_caught():
    spelled = (
        "python run_pretraining.py --model_size tiny --vocab_size 8192 --dropout 0 --learning_rate 1e-3 "
        "--num_warmup_steps 200 --dupe_factor 40 --weight_decay 0.1 --per_device_train_batch_size 16 "
        "--max_train_seconds 600 --eval_steps 1000 --output_dir runs/hfbert-quality"
    )
    assert copied_recipe(pretraining_flags(spelled)) == "quality-10min"
    benchmark = "python -m benchmarks.time_to_quality --output_dir runs/ttq -- " + spelled.split("py ", 1)[1]
    assert copied_recipe(pretraining_flags(benchmark)) == "quality-10min"
    assert copied_recipe(pretraining_flags("python run_pretraining.py --recipe quality-10min --eval_steps 500")) is None
    assert copied_recipe(pretraining_flags("python run_pretraining.py --model_size tiny --output_dir o")) is None


# ------------------------------------------------------------------------------------ links between the pages


def section_slugs(path: Path) -> set[str]:
    """The #anchors GitHub gives a markdown file's headings (lower case, punctuation dropped, spaces to dashes,
    a repeated heading numbered)."""
    slugs, seen, in_fence = set(), collections.Counter(), False
    for line in path.read_text(encoding="utf-8").splitlines():
        in_fence = in_fence != line.startswith("```")
        if in_fence or not re.match(r"#{1,6} ", line):
            continue
        slug = re.sub(r"[^\w\- ]", "", line.lstrip("#").strip().lower()).replace(" ", "-")
        slugs.add(f"{slug}-{seen[slug]}" if seen[slug] else slug)
        seen[slug] += 1
    return slugs


def broken_links(doc: Path) -> list[str]:
    """The relative links of a markdown file whose file or section is not there."""
    text = re.sub(r"```.*?```", "", doc.read_text(encoding="utf-8"), flags=re.S)
    broken = []
    for target in re.findall(r"\]\(([^)\s]+)\)", text):
        if re.match(r"[a-z]+:", target):
            continue
        path, _, anchor = target.partition("#")
        destination = (doc.parent / path).resolve() if path else doc
        if not destination.exists():
            broken.append(f"{target} (no such file)")
        elif anchor and destination.suffix == ".md" and anchor not in section_slugs(destination):
            broken.append(f"{target} (no such section)")
    return broken


LINKED_PAGES = [*DOC_FILES, *sorted((REPO / "benchmarks" / "results").glob("*.md"))]


@pytest.mark.parametrize("doc", LINKED_PAGES, ids=lambda path: str(path.relative_to(REPO)))
def test_every_link_between_the_pages_resolves_to_its_section(doc):
    assert not broken_links(doc), f"{doc.relative_to(REPO)}: {broken_links(doc)}"


COMMAND_WORDS = ("python", "accelerate", "torchrun", "bash", "pip", "sbatch", "cd")


def commands_leaving_the_repository(text: str) -> list[str]:
    """The commands of a page (fenced lines and code spans that start with a command) that name a path above the
    repository root, from which every command in the docs and results pages runs."""
    fenced = [line for block in re.findall(r"```.*?```", text, flags=re.S) for line in block.splitlines()]
    spans = re.findall(r"`([^`\n]+)`", re.sub(r"```.*?```", "", text, flags=re.S))
    commands = [line.strip() for line in fenced + spans if line.strip().startswith(COMMAND_WORDS)]
    return [command for command in commands if re.search(r"(?:^|\s)\.\./", command)]


@pytest.mark.parametrize("doc", LINKED_PAGES, ids=lambda path: str(path.relative_to(REPO)))
def test_every_command_runs_from_the_repository_alone(doc):
    """A command that reaches outside the clone (../shared/tools/...) fails in everyone else's."""
    assert not commands_leaving_the_repository(doc.read_text(encoding="utf-8")), doc.name


def test_a_command_leaving_the_repository_is_caught():
    text = "Count with `python ../shared/tools/count_code.py hfbert`, [a](../x.md).\n```bash\ncd ../other && ls\n```\n"
    assert commands_leaving_the_repository(text) == ["cd ../other && ls", "python ../shared/tools/count_code.py hfbert"]


def test_a_link_to_a_missing_section_is_caught(tmp_path):
    (tmp_path / "other.md").write_text("# Other\n\n## The main job (6,000 updates)\n\n```bash\n# not a heading\n```\n")
    doc = tmp_path / "doc.md"
    doc.write_text(
        "[a](other.md#the-main-job-6000-updates) [b](other.md#the-main-job) [c](gone.md) [d](#here) [e](https://x.org)"
        "\n\n## Here\n"
    )
    assert broken_links(doc) == ["other.md#the-main-job (no such section)", "gone.md (no such file)"]


def pages_linked_from(doc: Path) -> set[Path]:
    text = re.sub(r"```.*?```", "", doc.read_text(encoding="utf-8"), flags=re.S)
    targets = (target.partition("#")[0] for target in re.findall(r"\]\(([^)\s]+)\)", text))
    return {(doc.parent / target).resolve() for target in targets if target.endswith(".md") and ":" not in target}


def test_every_results_page_is_reached_from_the_readme():
    """A results page no reader can reach from the README through links (docs, then results pages) holds numbers
    that no doc stands on or corrects."""
    reached, queue = set(), [REPO / "README.md"]
    while queue:
        page = queue.pop()
        if page in reached or not page.exists():
            continue
        reached.add(page)
        queue.extend(pages_linked_from(page))
    unreached = [path.name for path in sorted((REPO / "benchmarks" / "results").glob("*.md")) if path.resolve() not in reached]
    assert not unreached, f"benchmarks/results pages linked from nowhere the README leads to: {unreached}"


FINETUNE_BUDGET = "--learning_rate 1e-3 --num_train_epochs 1 --seeds 1 2"  # no rate search: 4 short fits


def write_own_text_files(folder: Path) -> None:
    """The shipped sample's articles as my_texts/ (a .txt file each, in two subfolders) and as my_texts.txt (a
    blank line between them), and train.csv / test.csv of two classes that their words tell apart."""
    from hfbert.corpus import load_documents

    documents = load_documents(CorpusArguments())
    articles = ["\n".join(row["paragraphs"]) for split in ("train", "validation") for row in documents[split]]
    for number, article in enumerate(articles):
        path = folder / "my_texts" / f"part{number % 2}" / f"article{number:03}.txt"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(article + "\n", encoding="utf-8")
    (folder / "my_texts.txt").write_text("\n\n".join(articles) + "\n", encoding="utf-8")
    for name, rows in (("train.csv", 12), ("test.csv", 6)):
        lines = ["text,label"] + [f"the game was great and fun {i},good" for i in range(rows)]
        lines += [f"the match was dull and poor {i},bad" for i in range(rows)]
        (folder / name).write_text("\n".join(lines) + "\n", encoding="utf-8")


@pytest.mark.slow
@pytest.mark.parametrize("corpus", ["my_texts/", "my_texts.txt"])
def test_the_own_text_commands_run_on_a_small_corpus_the_test_makes(corpus, tmp_path):
    """The README's "Your own text" as written (a tiny budget), on a folder and on one file of documents."""
    (block,) = blocks_of("files")
    cwd = working_folder(tmp_path / "root")
    write_own_text_files(cwd)
    commands = [tiny_budget(command) for command in block.commands()]
    commands = [f"{command} {FINETUNE_BUDGET}" if "hfbert.finetune" in command else command for command in commands]
    text = "\n".join(commands).replace("--train_file my_texts/", f"--train_file {corpus}") + "\n"
    assert "--train_file my_texts/ " in block.text and "--compare random_init" in block.text
    result = run_block(block, cwd, text)
    check_ran(block, result)
    assert ACCELERATE_DEFAULTS_WARNING not in result.stdout + result.stderr, "accelerate's defaults block printed"
    results = json.loads((cwd / "runs" / "my-bert" / "finetune_results.json").read_text())
    assert set(results["models"]) == {"model", "comparison"} and "gain" in results
    recorded = json.loads((cwd / "runs" / "my-bert" / "training_args.json").read_text())
    assert recorded["recipe"] == "own-text" and recorded["train_file"] == corpus


def test_the_library_speaks_of_behaviour_not_of_its_history():
    """Issue, soak-trial and finding numbers belong in commit messages and benchmarks/results/, not in hfbert/."""
    history = re.compile(r"\b[Ii]ssues? \d+|\bsoak\b|\btrials? \d{5,}|\b[Ff]indings? \d+")
    found = [
        f"{path.relative_to(REPO)}:{number}: {line.strip()}"
        for path in sorted((REPO / "hfbert").rglob("*.py"))
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
        if history.search(line)
    ]
    assert not found, "history in the library:\n" + "\n".join(found)
