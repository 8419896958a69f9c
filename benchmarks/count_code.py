"""The size of a Python tree: its files, its code lines (no blank line, comment or docstring) and all its lines.

    python -m benchmarks.count_code hfbert

What docs/architecture.md and benchmarks/results/one_of_each.md count hfbert/ with.
"""

import argparse
import ast
import io
import tokenize
from pathlib import Path

NOT_CODE = {tokenize.COMMENT, tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT, tokenize.ENDMARKER}
DOCUMENTED = (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)


def docstring_lines(source: str) -> set[int]:
    lines = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, DOCUMENTED) and ast.get_docstring(node, clean=False) is not None:
            lines.update(range(node.body[0].lineno, node.body[0].end_lineno + 1))
    return lines


def line_counts(path: Path) -> tuple[int, int]:
    """The file's code lines (a line holding a token that is no comment or docstring) and all its lines."""
    source = path.read_text(encoding="utf-8")
    docstrings, code = docstring_lines(source), set()
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type not in NOT_CODE:
            code.update(line for line in range(token.start[0], token.end[0] + 1) if line not in docstrings)
    return len(code), len(source.splitlines())


def python_files(paths: list[Path]) -> list[Path]:
    return sorted(file for path in paths for file in ([path] if path.is_file() else path.rglob("*.py")))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("paths", nargs="+", type=Path, help="folders (every .py file under them) or files")
    files = python_files(parser.parse_args(argv).paths)
    counts = [line_counts(file) for file in files]
    code, total = sum(count[0] for count in counts), sum(count[1] for count in counts)
    print(f"{len(files):,} files, {code:,} code lines, {total:,} lines")


if __name__ == "__main__":
    main()
