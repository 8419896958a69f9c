"""The docs say what the code does: every flag is documented, every name and pointer in them resolves."""

import argparse
import importlib
import re
from pathlib import Path

import pytest
from transformers import HfArgumentParser

from hfbert.corpus import CorpusArguments
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
