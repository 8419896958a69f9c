"""What names a corpus: its flags and the fingerprint of its content.

`CorpusArguments` are the corpus flags train_tokenizer.py and run_pretraining.py share (checked when built);
`corpus_fingerprint` is the sha256 of a local corpus's files, recorded with a run's settings so that a resume
on edited text is refused. `hfbert.corpus` reads the text these name; `hfbert.pretraining.settings` bundles
the flags with the run's other groups. This module imports neither.
"""

from __future__ import annotations

import functools
import glob
import hashlib
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Literal

import datasets
from datasets.data_files import resolve_pattern
from transformers.hf_argparser import HfArg

from hfbert.errors import Refusal
from hfbert.files import sha256_file
from hfbert.flags import MUST_MATCH

DocumentBoundary = Literal["heading", "blank_line", "row"]
# The WikiText-2 raw sample shipped inside this package: the corpus when no source is named.
SHIPPED_SAMPLE_DIR = Path(__file__).parent / "corpora" / "wikitext-2-raw-sample"
SHIPPED_SAMPLE_FILES = {"train": "wiki.train.raw", "validation": "wiki.valid.raw"}


_PATHS_NAMED = 3  # the paths a refusal or a count names; the rest are counted


class CorpusError(Refusal):
    """A corpus cannot be loaded: missing file, empty corpus, unreachable Hub dataset, bad column ..."""


@dataclass
class CorpusArguments:
    """Where the text comes from (command-line flags through `transformers.HfArgumentParser`)."""

    dataset_name: Annotated[str | None, MUST_MATCH] = HfArg(
        default=None,
        help="Hub dataset id (e.g. Salesforce/wikitext) or a local folder laid out like a Hub dataset "
        "repo. Without it and without --train_file, the WikiText-2 sample shipped with hfbert is used.",
    )
    dataset_config_name: Annotated[str | None, MUST_MATCH] = HfArg(
        default=None,
        help="Configuration of --dataset_name (e.g. wikitext-103-raw-v1).",
    )
    train_file: Annotated[str | None, MUST_MATCH] = HfArg(
        default=None,
        help="Local training text: one file (plain text of any extension: .txt, .raw, ...; or "
        "parquet/json/jsonl/csv), a folder of such files (read recursively in sorted order, hidden files "
        "skipped) or a glob in quotes ('texts/*.txt'). Each plain text file of a folder or a glob is one "
        "document; one plain text file alone is split into documents at blank lines (see --document_boundary).",
    )
    validation_file: Annotated[str | None, MUST_MATCH] = HfArg(
        default=None,
        help="Local validation text: a file, a folder or a glob, as --train_file.",
    )
    text_column: Annotated[str, MUST_MATCH] = HfArg(
        default="text",
        help="Column holding the text in parquet/json/csv files and Hub datasets.",
    )
    streaming: Annotated[bool, MUST_MATCH] = HfArg(
        default=False,
        help="Stream the corpus instead of preparing it as a cached Arrow dataset (corpora too big for disk).",
    )
    document_boundary: Annotated[DocumentBoundary | None, MUST_MATCH] = HfArg(
        default=None,
        help="How rows become documents. heading: WikiText layout (' = Title = ' lines start articles, "
        "section headings dropped, @-@ @,@ @.@ escapes restored); blank_line: blank lines separate "
        "documents; row: each row is a document. Default: heading for WikiText sources (the shipped "
        "sample, dataset names containing 'wikitext', .raw files), row for parquet/json/csv files and for "
        "the files of a folder or a glob (a file a document), blank_line for one other text file.",
    )

    def __post_init__(self) -> None:
        if self.dataset_name is not None and self.train_file is not None:
            raise CorpusError(
                f"both --dataset_name {self.dataset_name} and --train_file {self.train_file} were given; "
                "pass only one of them"
            )
        for flag, value, needed, needed_value in (
            ("--validation_file", self.validation_file, "--train_file", self.train_file),
            ("--dataset_config_name", self.dataset_config_name, "--dataset_name", self.dataset_name),
        ):
            if value is not None and needed_value is None:
                raise CorpusError(f"{flag} {value} was given without {needed}; pass {needed} too")


def is_file_collection(path: str) -> bool:
    """True for a --train_file that names several files: a folder (read recursively) or a glob (not a file
    whose name has glob characters)."""
    return Path(path).is_dir() or (glob.has_magic(path) and not Path(path).is_file())


def collection_files(path: str) -> list[Path]:
    """The files of a folder (recursively) or a glob, sorted, as `datasets` resolves data files: hidden files
    and folders are skipped unless the pattern names them, folder links are not followed, and a file link that
    leads out of the folder (the glob's folder: its part before the first wildcard) is skipped
    (`links_leading_out`): a corpus is what is in the folder the user named."""
    return _matched_files(path)[0]


def links_leading_out(path: str) -> list[Path]:
    """The file links of a folder or a glob that `collection_files` skips: they lead out of its folder."""
    return _matched_files(path)[1]


def collection_folder(path: str) -> tuple[Path, bool]:
    """The folder a folder or a glob reads files from (resolved), and whether it reads its subfolders: a folder is
    taken by its name as it is (`notes [draft]` or `**bold**` is no pattern) and read whole; a glob starts in the
    folder before its first wildcard and reaches in where a wildcard part is not its last or is `**`."""
    if Path(path).expanduser().is_dir():
        return Path(path).expanduser().resolve(), True
    parts = Path(path).expanduser().parts
    first = next((i for i, part in enumerate(parts) if glob.has_magic(part)), len(parts))
    pattern = parts[first:]
    return Path(*parts[:first]).resolve(), len(pattern) > 1 or "**" in pattern


def _matched_files(path: str) -> tuple[list[Path], list[Path]]:
    """(the files of a folder or a glob inside it, the links among them that lead out of it), each sorted."""
    folder, _ = collection_folder(path)
    pattern = f"{glob.escape(path.rstrip('/'))}/**" if Path(path).is_dir() else path
    try:
        matched = sorted(Path(name) for name in resolve_pattern(pattern, base_path=os.getcwd()))
    except FileNotFoundError:  # nothing matched
        return [], []
    inside: list[Path] = []
    leading_out: list[Path] = []
    for file in matched:
        (inside if file.resolve().is_relative_to(folder) else leading_out).append(file)
    return inside, leading_out


def local_files(args: CorpusArguments) -> dict[str, list[Path]]:
    """The files of a local-file source by split: a file, the files of a folder or a glob
    (`collection_files`), or the shipped sample when no --train_file is given."""
    if args.train_file is None:
        return {split: [SHIPPED_SAMPLE_DIR / name] for split, name in SHIPPED_SAMPLE_FILES.items()}
    paths = {"train": args.train_file, "validation": args.validation_file}
    return {
        split: collection_files(path) if is_file_collection(path) else [Path(path)]
        for split, path in paths.items()
        if path is not None
    }


def check_output_outside_corpus(args: CorpusArguments, output_dir: str | os.PathLike) -> None:
    """Refuse an `output_dir` inside a folder the corpus is read from (a folder --train_file or
    --validation_file, a local --dataset_name folder, or the folder a glob starts in where the glob reaches
    into its subfolders): what a run writes there would become part of the corpus, read by every later run."""
    output = Path(output_dir).expanduser().resolve()
    for flag, value in (("--train_file", args.train_file), ("--validation_file", args.validation_file),
                        ("--dataset_name", args.dataset_name)):  # fmt: skip
        if value is None or not is_file_collection(value):
            continue
        folder, reaches_in = collection_folder(value)
        if output == folder or (reaches_in and folder in output.parents):
            raise CorpusError(
                f"--output_dir {output_dir} is inside the folder {flag} {value} reads ({folder}): what the run "
                "writes there would become part of that corpus, and every later run on it would read it; pass an "
                "--output_dir outside it"
            )


# What datasets reads a local dataset folder's configs and builder options from (README.md's YAML, which
# .huggingface.yaml overrides, and the legacy dataset_infos.json).
DATASET_FOLDER_OPTIONS = ("README.md", ".huggingface.yaml", "dataset_infos.json")


def dataset_folder_files(dataset_name: str, config_name: str | None) -> dict[str, list[Path]]:
    """The files `datasets.load_dataset` reads from a local --dataset_name folder, by split, as its builder resolves
    them (the folder's README.md `configs` included; a path there may lead out of the folder)."""
    builder = datasets.load_dataset_builder(dataset_name, config_name)
    return {str(split): [Path(name) for name in names] for split, names in (builder.config.data_files or {}).items()}


def check_dataset_folder(dataset_name: str, config_name: str | None) -> None:
    """Refuse a local --dataset_name folder (pretraining's or finetune's) from which datasets would read files
    outside it: a file link (datasets follows links, so they cannot be skipped) or a path its README.md's
    data_files name (`dataset_folder_files`)."""
    if links := links_leading_out(dataset_name):
        leads = "1 link leads" if len(links) == 1 else f"{len(links):,} links lead"
        raise CorpusError(
            f"--dataset_name {dataset_name}: {leads} out of the folder ({some_of(links)}), and datasets would "
            "read what it points to; copy that into the folder in its place, or remove the link"
        )
    folder = Path(dataset_name).resolve()
    files = (path for paths in dataset_folder_files(dataset_name, config_name).values() for path in paths)
    if outside := sorted(path for path in files if not path.resolve().is_relative_to(folder)):
        them = "it" if len(outside) == 1 else "them"
        raise CorpusError(
            f"--dataset_name {dataset_name}: its README.md's (or .huggingface.yaml's) data_files name "
            f"{'1 file' if len(outside) == 1 else f'{len(outside):,} files'} outside the folder "
            f"({some_of(outside)}), which datasets would read; copy {them} into the folder and name {them} there"
        )


def some_of(paths: list[Path]) -> str:
    """The first `_PATHS_NAMED` of `paths`, and how many more."""
    more = len(paths) - _PATHS_NAMED
    return ", ".join(map(str, paths[:_PATHS_NAMED])) + (f", and {more:,} more" if more > 0 else "")


def corpus_fingerprint(args: CorpusArguments) -> str | None:
    """sha256 of the content of the corpus's local files (the shipped sample without --train_file), recorded in
    every checkpoint so that a corpus edited before a resume is refused instead of silently changing the run.
    None for a Hub dataset (its revision is the Hub's) or a path that is no file (refused when loaded); for a local
    --dataset_name folder, the files datasets reads from it (`dataset_folder_files`) and its options' files."""
    if args.dataset_name is None:
        by_split = local_files(args)
    elif not os.path.isdir(args.dataset_name):
        return None
    else:
        try:
            by_split = dataset_folder_files(args.dataset_name, args.dataset_config_name)
        except (FileNotFoundError, ValueError):  # datasets' refusal of the folder, which its loading names
            return None
        folder = Path(args.dataset_name)  # the files of builder options (csv sep, skiprows ...), which change the rows
        by_split |= {name: [folder / name] for name in DATASET_FOLDER_OPTIONS if (folder / name).is_file()}
    files = [(split, path) for split, paths in sorted(by_split.items()) for path in paths]
    if not all(path.is_file() for _, path in files):
        return None
    stats = tuple((split, str(path.resolve()), path.stat().st_size, path.stat().st_mtime_ns) for split, path in files)
    return _fingerprint_of_files(stats)


@functools.lru_cache(maxsize=8)
def _fingerprint_of_files(stats: tuple[tuple[str, str, int, int], ...]) -> str:
    # Keyed by size and mtime too, so a file changed in between is hashed again (each checkpoint asks).
    digest = hashlib.sha256()
    for split, path, _size, _mtime in stats:
        digest.update(f"{split}\0{sha256_file(path)}\0".encode())
    return digest.hexdigest()
