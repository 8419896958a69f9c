"""Every figure in README.md and docs/*.md comes from a results page, and every results page says what it measured.

A **figure** is a measured number written in a doc's prose: a decimal (0.221, 12.2, +4.6, 1.6e-5), a ratio
(3.3×, 2.07x), a percentage (46%), a time (490 s, 10 min 9 s), a speed (12.2 updates/s, 385,725 tokens/s) or a
count of runs (204 trials). Not figures: anything in a fenced block or a code span (commands, flags and their values:
`--max_train_steps 6000`), the number right after a code span (a flag's value or default: "`--dropout` 0.1",
"`--ddp_timeout` (default 1800 s)"; a library's version: "`BertForMaskedLM` (5.24)"), version numbers (torch 2.13.0, transformers 5.23, CC BY-SA 3.0), line
numbers, link targets and HTML comments; bare whole numbers (6,000 updates, 150 labels, 3 seeds) are settings
far more often than results and are not checked.

A figure stands in a **passage**: a paragraph, a list item (with the paragraph that introduces its list) or a
table (with the paragraph above it, the fenced blocks between the two, and the paragraph right below it). It
is **held** when a results page under benchmarks/results/ that the passage links holds the same value, its
digits as written (0.221 is not 0.22), or that value in hundredths (a fraction written as points or a
percentage: 0.046 as +4.6 or 4.6%). A passage may instead carry one of these comments on the line(s) right
above it (a table's: between its caption and the table):

    <!-- one-off -->                   its figures were measured once and have no results page; the passage
                                       must name the command that measured them (in a code span or its fenced
                                       block, one that exists in this repository), the commit (a hash) and the
                                       machine
    <!-- quoted -->                    its figures are quoted from outside sources (threads, papers) that each of
                                       its lines holding a figure links
    <!-- not figures: A; B (why) -->   A and B, written as in the passage, are settings, constants or arithmetic,
                                       not measurements (each must be in the passage; other figures still count)

A **results page** names the commit it measured (a hash) and the machine (a CPU or GPU by name).
"""

import dataclasses
import re
import subprocess
from decimal import Decimal
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
DOC_FILES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
RESULTS = REPO / "benchmarks" / "results"
RESULTS_PAGES = sorted(RESULTS.glob("*.md"))

NUMBER = r"\d{1,3}(?:,\d{3})+(?:\.\d+)?|\d+(?:\.\d+)?"
VALUE = rf"(?:{NUMBER})(?:e-\d+)?"  # 1.6e-5 too
RANGE = rf"(?:{NUMBER})(?:\s?[–-]\s?(?:{NUMBER}))*"  # 1.8–1.9×: both ends are figures
UNIT = (
    r"\s?(?:×|%)|x\b"  # ratios and percentages
    r"|\s(?:ms|s|min|minutes?|seconds?|hours?)\b"  # times
    r"|\s(?:[A-Za-z-]+\s){0,2}[A-Za-z]+/s\b"  # speeds: updates/s, M tokens/s
    r"|\s(?:[a-z-]+\s)?(?:trials|runs)\b"  # counts of runs
)
FIGURE = re.compile(rf"(?<![\w.#/@])(?<!\w-)(?:(?P<measured>{RANGE})(?:{UNIT})|(?P<decimal>\d+\.\d+(?:e-\d+)?)(?![\w.]))")
VERSION = re.compile(
    r"\b\d+\.\d+\.\d+\S*"
    r"|\b(?:torch|transformers|accelerate|datasets|tokenizers|Python|CUDA|cu|capability|BY-SA|mutmut|version)"
    r"\s?\d+(?:\.\d+)+(?:'s)?"
)
CODE_VALUE = re.compile(r"`[^`\n]+`\**,?\s*\(?(?:default:?\s*)?(?:" + NUMBER + r")(?:\s?(?:s|%))?")
COMMIT = re.compile(r"(?<![\w/.-])(?=[0-9a-f]*[a-f])(?=[0-9a-f]*\d)[0-9a-f]{7,40}(?![\w-])")
MACHINE = re.compile(r"EPYC|Xeon|H100|H200|A100|\bCPU|\bGPU|\bcores?\b", re.I)
MARKER = re.compile(r"<!--\s*(one-off|quoted|not figures:(?P<listed>.*?))\s*-->")
COMMAND = re.compile(r"python -m ((?:benchmarks|hfbert)(?:\.\w+)+)|python (\S+\.py)")


@dataclasses.dataclass
class Block:
    kind: str  # paragraph, item, table, fence, heading, comment
    line: int  # of its first line, from 1
    lines: list[str]

    @property
    def text(self) -> str:
        return "\n".join(self.lines)


def markdown_blocks(text: str) -> list[Block]:
    """The file's blocks in order; a blank line ends a paragraph, an item or a table."""
    blocks: list[Block] = []
    lines = text.splitlines()
    index = 0
    while index < len(lines):
        line, stripped = lines[index], lines[index].strip()
        if line.startswith("```"):
            end = next((i for i in range(index + 1, len(lines)) if lines[i].startswith("```")), len(lines) - 1)
            blocks.append(Block("fence", index + 1, lines[index : end + 1]))
            index = end + 1
            continue
        if not stripped:
            index += 1
            continue
        if stripped.startswith("<!--") and stripped.endswith("-->"):
            kind = "comment"
        elif line.startswith("#"):
            kind = "heading"
        elif stripped.startswith("|"):
            kind = "table"
        elif re.match(r"\s*(?:[-*]|\d+\.) ", line):
            kind = "item"
        else:
            kind = "paragraph"
        current = Block(kind, index + 1, [line])
        blocks.append(current)
        index += 1
        while kind in {"paragraph", "item", "table"} and index < len(lines) and lines[index].strip():
            following = lines[index]
            starts_block = following.startswith(("```", "#")) or following.strip().startswith("<!--")
            if starts_block or (following.strip().startswith("|") != (kind == "table")):
                break
            if kind == "item" and re.match(r"\s*(?:[-*]|\d+\.) ", following):
                break
            current.lines.append(following)
            index += 1
    return blocks


@dataclasses.dataclass
class Passage:
    doc: Path
    block: Block
    scope: str  # the text whose links and commands the passage's figures may stand on
    markers: set[str]  # one-off, quoted, not figures
    not_figures: list[str]  # what its <!-- not figures: ... --> comments list

    @property
    def id(self) -> str:
        return f"{self.doc.relative_to(REPO)}:{self.block.line}"


def scope_of(blocks: list[Block], index: int) -> str:
    """A passage and what it stands in: a table's caption above (and the fences between) and note below, a list
    item's introducing paragraph."""
    block, scope = blocks[index], [blocks[index].text]
    if block.kind == "table":
        above = index - 1
        while above >= 0 and blocks[above].kind in {"fence", "comment"}:
            scope.append(blocks[above].text)
            above -= 1
        if above >= 0 and blocks[above].kind in {"paragraph", "item"}:
            scope.append(blocks[above].text)
        if index + 1 < len(blocks) and blocks[index + 1].kind == "paragraph":
            scope.append(blocks[index + 1].text)
    elif block.kind == "item":
        first = index
        while first > 0 and blocks[first - 1].kind in {"item", "comment"}:
            first -= 1
        if first > 0 and blocks[first - 1].kind == "paragraph":
            scope.append(blocks[first - 1].text)
    return "\n".join(scope)


def passages(doc: Path) -> list[Passage]:
    blocks = markdown_blocks(doc.read_text(encoding="utf-8"))
    found = []
    for index, block in enumerate(blocks):
        if block.kind not in {"paragraph", "item", "table"}:
            continue
        markers, above = [], index - 1
        while above >= 0 and blocks[above].kind == "comment":
            markers += list(MARKER.finditer(blocks[above].text))
            above -= 1
        listed = [re.sub(r"\([^)]*\)\s*$", "", m.group("listed")) for m in markers if m.group("listed") is not None]
        not_figures = [item.strip() for items in listed for item in items.split(";")]
        kinds = {marker.group(1).split(":")[0] for marker in markers}
        found.append(Passage(doc, block, scope_of(blocks, index), kinds, not_figures))
    return found


def prose(text: str) -> str:
    """What a reader reads as numbers: no comments, code spans (nor the value right after one), link targets or
    version numbers (each replaced by a space, so that no two numbers run together)."""
    text = re.sub(r"<!--.*?-->", " ", text, flags=re.S)
    text = CODE_VALUE.sub(" ", text)
    text = re.sub(r"`[^`]*`", " ", text)
    text = re.sub(r"\]\([^)]*\)", "] ", text)
    text = re.sub(r"https?://\S+", " ", text)
    return VERSION.sub(" ", text)


def figures(text: str, exempt: list[str] = ()) -> list[str]:
    """The figures of a passage's text, as written (a range's two ends apart), but those listed as not figures."""
    text = prose(text)
    spans = [match.span() for item in exempt for match in re.finditer(re.escape(item), text)]
    found = []
    for match in FIGURE.finditer(text):
        if not any(start <= match.start() < end for start, end in spans):
            found += re.findall(VALUE, match.group("measured") or match.group("decimal"))
    return found


def value(number: str) -> Decimal:
    return Decimal(number.replace(",", ""))


def page_values(page: Path) -> set[Decimal]:
    """Every number a results page writes (its tables, prose and raw reports), as a value."""
    return {value(number) for number in re.findall(VALUE, page.read_text(encoding="utf-8"))}


def holds(values: set[Decimal], number: str) -> bool:
    """0.046 written as +4.6 points or 4.6 %, 0.46 as 46 %, count as the same figure."""
    figure = value(number)
    return any(scaled in values for scaled in (figure, figure / 100, figure * 100))


def linked_results_pages(passage: Passage) -> list[Path]:
    targets = re.findall(r"\]\(([^)\s#]+\.md)(?:#[^)\s]*)?\)", passage.scope)
    pages = {(passage.doc.parent / target).resolve() for target in targets}
    return [page for page in sorted(pages) if page.parent == RESULTS.resolve() and page.exists()]


def command_exists(match: re.Match) -> bool:
    module, script = match.groups()
    if module is not None:
        path = REPO.joinpath(*module.split("."))
        return path.with_suffix(".py").exists() or (path / "__main__.py").exists()
    return (REPO / script).exists()


def marker_problems(passage: Passage) -> list[str]:
    """What a passage's markers claim that the passage does not bear out."""
    problems = []
    if "one-off" in passage.markers:
        if not any(command_exists(match) for match in COMMAND.finditer(passage.scope)):
            problems.append("a one-off without the command that measured it (python -m benchmarks.NAME ...)")
        if not COMMIT.search(prose(passage.scope)):
            problems.append("a one-off without the commit it measured")
        if not MACHINE.search(passage.scope):
            problems.append("a one-off without the machine it ran on")
    if "quoted" in passage.markers:
        for line in passage.block.lines:
            if figures(line) and "](http" not in line:
                problems.append(f"quoted figures {figures(line)} on a line that links no source")
    for item in passage.not_figures:
        if not item or item not in prose(passage.block.text):
            problems.append(f"<!-- not figures: --> lists {item!r}, which the passage does not say")
    return problems


def unheld_figures(passage: Passage) -> list[str]:
    """The passage's figures that no linked results page holds, and what its markers fail to say."""
    problems, found = marker_problems(passage), figures(passage.block.text, passage.not_figures)
    if passage.markers & {"one-off", "quoted"} or not found:
        return problems
    pages = linked_results_pages(passage)
    values = set().union(*(page_values(page) for page in pages))
    unheld = [number for number in found if not holds(values, number)]
    if unheld:
        problems.append(f"{unheld} not in the results pages it links ({', '.join(p.name for p in pages) or 'none'})")
    return problems


ALL_PASSAGES = [passage for doc in DOC_FILES for passage in passages(doc)]


@pytest.mark.parametrize("doc", DOC_FILES, ids=lambda path: path.name)
def test_every_figure_in_the_docs_is_held_by_a_results_page_it_links(doc):
    failures = [
        f"{passage.id}: {problem}"
        for passage in ALL_PASSAGES
        if passage.doc == doc
        for problem in unheld_figures(passage)
    ]
    assert not failures, "\n".join(failures)


def test_a_figure_is_found_and_a_setting_a_version_or_code_is_not():
    text = (
        "On a 2-core EPYC the loop ran 3.3× the Trainer (4,107 tokens/s, 52% MFU, 12.2 updates/s, 490 s; NSP "
        "0.686, +4.6 ± 3.5 points, 1.8–1.9× from the batch) in 204 random trials, with `--max_train_steps 6000` "
        "and `--dropout` 0.1, `--ddp_timeout` (default 1800 s), `BertForMaskedLM` (5.24), -16% for mini, BERT-base 2 x, on torch 2.13.0 and transformers 5.23's tests, 6,000 updates, "
        "[a page](../x/1.5.md), ```x``` CC BY-SA 3.0."
    )
    assert figures(text) == ["3.3", "4,107", "52", "12.2", "490", "0.686", "4.6", "3.5", "1.8", "1.9", "204", "16"]
    assert figures("the fade over 0.25 of 600 s", exempt=["600 s"]) == ["0.25"]
    assert figures("up to 1.6e-5 in fp16, a rate of 1e-3") == ["1.6e-5"]


def test_a_figure_is_held_as_a_fraction_points_or_a_percentage(tmp_path):
    values = {value(number) for number in ["0.046", "0.46", "9689", "5.858"]}
    assert holds(values, "4.6") and holds(values, "46") and holds(values, "9,689") and holds(values, "5.858")
    assert not holds(values, "5.86") and not holds(values, "4.7")


def test_an_unheld_figure_and_a_marker_without_its_command_are_caught(tmp_path, monkeypatch):
    results = tmp_path / "benchmarks" / "results"
    results.mkdir(parents=True)
    (results / "page.md").write_text("hfbert at 1a2b3c4 on a 2-core EPYC: 0.221 and 490 s.\n")
    (tmp_path / "docs").mkdir()
    doc = tmp_path / "docs" / "doc.md"
    doc.write_text(
        "Held: 0.221 in 490 s ([page](../benchmarks/results/page.md)).\n\n"
        "Not held: 0.222 ([page](../benchmarks/results/page.md)).\n\n"
        "| table | 0.221 |\n|---|---|\n\nbelow the table, [page](../benchmarks/results/page.md)\n\n"
        "<!-- one-off -->\nA one-off on a CPU: 5.66× at 1a2b3c4.\n\n"
        "<!-- not figures: 600 s (the budget) -->\nThe budget, 600 s, and 0.5 (no page).\n\n"
        "<!-- not figures: 601 s (not there) -->\nNothing.\n\n"
        "<!-- quoted -->\n| [a thread](https://x.org/1) | loss 7.3 |\n| another | loss 7.5 |\n"
    )
    monkeypatch.setattr(f"{__name__}.REPO", tmp_path)
    monkeypatch.setattr(f"{__name__}.RESULTS", results)
    problems = {passage.block.line: unheld_figures(passage) for passage in passages(doc)}
    assert problems == {
        1: [],
        3: ["['0.222'] not in the results pages it links (page.md)"],
        5: [],
        8: [],
        11: ["a one-off without the command that measured it (python -m benchmarks.NAME ...)"],
        14: ["['0.5'] not in the results pages it links (none)"],
        17: ["<!-- not figures: --> lists '601 s', which the passage does not say"],
        20: ["quoted figures ['7.5'] on a line that links no source"],
    }


def known_commits(hashes: set[str]) -> set[str]:
    """The hashes that name a commit of this repository (all of them where there is no git history to ask)."""
    if not (REPO / ".git").exists():
        return hashes
    ordered = sorted(hashes)
    asked = "".join(f"{h}^{{commit}}\n" for h in ordered)
    answers = subprocess.run(["git", "cat-file", "--batch-check"], cwd=REPO, input=asked, capture_output=True,
                             text=True, check=True).stdout.splitlines()  # fmt: skip
    return {h for h, answer in zip(ordered, answers, strict=True) if answer.split()[1:2] == ["commit"]}


@pytest.mark.parametrize("page", RESULTS_PAGES, ids=lambda path: path.name)
def test_every_results_page_names_its_commit_and_machine(page):
    text = page.read_text(encoding="utf-8")
    hashes = set(COMMIT.findall(text))
    assert known_commits(hashes), f"{page.name} names no commit of this repository that it measured"
    assert MACHINE.search(text), f"{page.name} names no machine (the CPU or GPU it ran on)"


def test_every_speed_the_dry_run_quotes_is_held_by_the_results_page_it_names():
    """The plan's expected time printed 16.9 updates/s, which no results page held."""
    from hfbert.pretraining.extras.plan import MEASURED_SPEEDS

    for key, speed in MEASURED_SPEEDS.items():
        (page,) = re.findall(r"benchmarks/results/[\w.]+\.md", speed.measured)
        text = (REPO / page).read_text(encoding="utf-8")
        unheld = [number for number in figures(speed.measured) if not holds(page_values(REPO / page), number)]
        assert figures(speed.measured) and not unheld, f"{key}: {unheld} not in {page}"
        commits = COMMIT.findall(speed.measured)
        assert commits and all(commit in text for commit in commits), f"{key}: no commit, or one {page} lacks"
