"""Corpus loading: any text source -> documents made of cleaned paragraphs.

Every source goes through `datasets.load_dataset`:

* a Hub dataset (or a local folder laid out like a Hub dataset repo): ``--dataset_name`` and
  ``--dataset_config_name``, optionally ``--streaming``;
* local files: ``--train_file`` / ``--validation_file`` — parquet, json/jsonl and csv through their
  ``datasets`` builders (text in ``--text_column``), every other extension (``.txt``, WikiText's ``.raw``,
  ...) as plain text, one row per line;
* nothing named: the WikiText-2 raw sample shipped inside this package (``hfbert/corpora/``).

The rows are then grouped into documents (pretraining needs document boundaries for next-sentence
prediction) according to ``--document_boundary``:

* ``heading``: WikiText layout, see "WikiText" below;
* ``blank_line``: one paragraph per line, documents separated by blank lines (the original BERT format);
* ``row``: every row is one document, its non-blank lines are its paragraphs.

The result has one column ``paragraphs`` (``list[str]``) per split ``train`` and, when the source has one,
``validation``. Without ``--streaming`` it is cached by `datasets` fingerprint, so a second load of the
same source reads the cache instead of regrouping.
"""

from __future__ import annotations

import codecs
import contextlib
import dataclasses
import functools
import glob
import json
import logging
import os
from collections.abc import Iterable, Iterator
from pathlib import Path

import datasets
import fsspec
from datasets.fingerprint import Hasher
from fsspec.utils import infer_compression
from huggingface_hub import HfApi
from huggingface_hub.errors import HfHubHTTPError, RepositoryNotFoundError

from hfbert.corpus_arguments import (
    SHIPPED_SAMPLE_DIR,
    CorpusArguments,
    CorpusError,
    DocumentBoundary,
    check_dataset_folder,
    corpus_fingerprint,
    is_file_collection,
    links_leading_out,
    local_files,
    some_of,
)
from hfbert.errors import Refusal
from hfbert.files import describe_write_failure, is_disk_full, sha256_file

# Extensions with a structured `datasets` builder; every other extension is read as plain text.
_BUILDER_BY_EXTENSION = {".parquet": "parquet", ".json": "json", ".jsonl": "json", ".csv": "csv"}
_HOW_DOCUMENTS_END = {
    "row": "a row a document",
    "blank_line": "documents end at blank lines",
    "heading": "documents start at WikiText article headings",
}
_BINARY_CHECK_BYTES = 8000
DOCUMENT_FEATURES = datasets.Features({"paragraphs": datasets.List(datasets.Value("string"))})
_ROWS_PER_READ = 1000
# Documents per Arrow write and per datasets.map batch: a batch's Python lists (and the tokenizer's encodings)
# are held at once, and datasets' default of 1,000 rows would hold a corpus of long documents whole.
DOCUMENTS_PER_BATCH = 32
_HUB_PROBE_TIMEOUT_S = 10
_UTF8_CHECK_BYTES_PER_READ = 1 << 24
# Part of the documents' cache key: an edited grouping must not reuse documents grouped by the old code.
_SOURCE = Hasher.hash(Path(__file__).read_bytes())
logger = logging.getLogger(__name__)


# ---------------------------------------------------------------------------------------------------------
# WikiText: everything specific to its markup lives here.
#
# WikiText (Merity et al. 2016) has one paragraph or heading per line. Lines begin and end with a space.
# Articles start at a heading with one "=" on each side (" = Title = "); sections and subsections are
# " = = Section = = ", " = = = Sub = = = ". Headings are structure, not training text. Blank lines (empty, or
# a single space in the Hub's copy) carry no text. Tokens are separated by spaces, and hyphens, commas and
# points inside a word were escaped as " @-@ ", " @,@ ", " @.@ " ("1 @,@ 000" is "1,000").
# ---------------------------------------------------------------------------------------------------------
WIKITEXT_ESCAPES = ((" @-@ ", "-"), (" @,@ ", ","), (" @.@ ", "."))


def is_wikitext_heading(line: str) -> bool:
    """True for any WikiText heading line (article, section or subsection)."""
    stripped = line.strip()
    return stripped.startswith("= ") and stripped.endswith(" =")


def is_wikitext_article_heading(line: str) -> bool:
    """True for a heading that starts a new article: ``" = Title = "`` (one ``=`` on each side)."""
    return is_wikitext_heading(line) and not line.strip().startswith("= =")


def clean_wikitext_line(line: str) -> str:
    """The paragraph text of a WikiText line: ``""`` for blank and heading lines, escapes restored."""
    if is_wikitext_heading(line):
        return ""
    paragraph = line.strip()
    for escaped, plain in WIKITEXT_ESCAPES:
        paragraph = paragraph.replace(escaped, plain)
    return paragraph


def format_suffix(path: str | os.PathLike) -> str:
    """The suffix that names a file's format, behind a compression suffix that datasets (through fsspec) undoes:
    wiki.train.raw.gz is WikiText text."""
    path = Path(path)
    return path.with_suffix("").suffix if infer_compression(str(path)) else path.suffix


def _open_binary(path: Path) -> fsspec.core.OpenFile:
    return fsspec.open(str(path), "rb", compression="infer")  # decompressed as datasets reads it


# ---------------------------------------------------------------------------------------------------------


def resolve_document_boundary(args: CorpusArguments) -> DocumentBoundary:
    """The document boundary rule for ``args``: the explicit flag, else the default for its source (heading for
    WikiText: a dataset name with 'wikitext', the shipped sample, a .raw file; row for other datasets, for
    parquet/json/csv files and for the files of a folder or a glob; blank_line for one other text file)."""
    if args.document_boundary is not None:
        return args.document_boundary
    if args.dataset_name is not None:
        return "heading" if "wikitext" in args.dataset_name.lower() else "row"
    if args.train_file is None:  # the shipped WikiText sample
        return "heading"
    if is_file_collection(args.train_file) or format_suffix(args.train_file) in _BUILDER_BY_EXTENSION:
        return "row"
    return "heading" if format_suffix(args.train_file) == ".raw" else "blank_line"


def iter_documents(
    rows: datasets.Dataset | datasets.IterableDataset,
    text_column: str,
    boundary: DocumentBoundary,
    whole_files: bool = False,
) -> Iterator[dict[str, list[str]]]:
    """Group rows of text into documents ``{"paragraphs": [...]}``, in order. With `whole_files` (each row
    a file's whole text), a file's end also ends a document.

    Sequential on purpose: a document may span any number of rows, so grouping cannot be split into
    independent `map` batches. Documents without any paragraph are dropped.
    """
    texts = (text for batch in rows.iter(batch_size=_ROWS_PER_READ) for text in batch[text_column])
    # Rows are grouped one at a time where a row (or a file) ends a document, else all together.
    for group in ([text] for text in texts) if whole_files or boundary == "row" else [texts]:
        yield from _group_lines(group, boundary)


def _group_lines(texts: Iterable[str], boundary: DocumentBoundary) -> Iterator[dict[str, list[str]]]:
    paragraphs: list[str] = []
    for text in texts:
        # An empty row is a blank line; a row may also hold several lines.
        for line in (text or "").splitlines() or [""]:  # a missing cell (None) is an empty row
            if boundary == "heading":
                starts = is_wikitext_article_heading(line)
                paragraph = clean_wikitext_line(line)
            else:
                paragraph = line.strip()
                starts = boundary == "blank_line" and not paragraph
            if starts and paragraphs:
                yield {"paragraphs": paragraphs}
                paragraphs = []
            if paragraph:
                paragraphs.append(paragraph)
    if paragraphs:
        yield {"paragraphs": paragraphs}


_LOCAL_SOURCE_HINT = (
    "pass local files with --train_file/--validation_file, or a local folder laid out like the Hub repo "
    "with --dataset_name PATH"
)


def _check_hub_reachable(dataset_name: str) -> None:
    """Fail in seconds when the Hub cannot be reached (datasets itself retries for ~25 s, then fails vaguely)."""
    if datasets.config.HF_HUB_OFFLINE:
        return  # load_dataset then uses the local cache, or raises ConnectionError at once
    try:
        HfApi().dataset_info(dataset_name, timeout=_HUB_PROBE_TIMEOUT_S)
    except RepositoryNotFoundError as error:
        raise CorpusError(
            f"--dataset_name {dataset_name} is neither a local folder nor a dataset on the Hub you can access "
            f"(check the spelling, or log in with `hf auth login` for a gated or private dataset); "
            f"or {_LOCAL_SOURCE_HINT}"
        ) from error
    except HfHubHTTPError:
        raise
    # Network failures surface as the HTTP client's own exception types, which have no stable import path.
    except Exception as error:
        raise CorpusError(
            f"cannot reach the Hugging Face Hub to load --dataset_name {dataset_name} ({error!r}); "
            f"{_LOCAL_SOURCE_HINT}, or set HF_DATASETS_OFFLINE=1 to use a copy already in the datasets cache"
        ) from error


def _load_hub_dataset(
    args: CorpusArguments, num_proc: int | None
) -> datasets.DatasetDict | datasets.IterableDatasetDict:
    assert args.dataset_name is not None
    local = os.path.isdir(args.dataset_name)
    if not local:
        _check_hub_reachable(args.dataset_name)
    try:
        if local:
            check_dataset_folder(args.dataset_name, args.dataset_config_name)
        return datasets.load_dataset(
            args.dataset_name,
            args.dataset_config_name,
            streaming=args.streaming,
            num_proc=None if args.streaming else num_proc,
            cache_dir=_content_keyed_cache(args) if local and not args.streaming else None,
        )
    except ConnectionError as error:  # raised at once in offline mode when the dataset is not cached
        raise CorpusError(
            f"--dataset_name {args.dataset_name} is not in the local datasets cache and the Hub is offline "
            f"(HF_HUB_OFFLINE/HF_DATASETS_OFFLINE is set); {_LOCAL_SOURCE_HINT}"
        ) from error
    except FileNotFoundError as error:
        raise CorpusError(f"--dataset_name {args.dataset_name}: {error}") from error


def _content_keyed_cache(args: CorpusArguments) -> str | None:
    """A datasets cache of its own for a local --dataset_name folder's content: datasets keys a local file by
    its path and mtime only, so text rewritten with its mtime kept (`cp -p`, `rsync -a`) would read the old
    rows while the run records the new content's sha256 (`corpus_fingerprint`)."""
    content = corpus_fingerprint(args)
    if content is None:  # a folder datasets refuses, which its loading names
        return None
    return str(Path(datasets.config.HF_DATASETS_CACHE) / "hfbert-local-folders" / content[:32])


def find_invalid_utf8(path: str | os.PathLike) -> tuple[int, int, bytes] | None:
    """``(byte offset, line number, bad bytes)`` of the first bytes of ``path`` that are not UTF-8, else None.

    Reads the file in 16 MB pieces (a truncated sequence at the very end counts as invalid).
    """
    offset, line, pending = 0, 1, b""
    with _open_binary(Path(path)) as file:
        while chunk := file.read(_UTF8_CHECK_BYTES_PER_READ):
            data = pending + chunk
            try:
                _, consumed = codecs.utf_8_decode(data, "strict", False)
            except UnicodeDecodeError as error:
                return (
                    offset + error.start,
                    line + data.count(b"\n", 0, error.start),
                    data[error.start : error.end],
                )
            line += data.count(b"\n", 0, consumed)
            offset += consumed
            pending = data[consumed:]
    return (offset, line, pending) if pending else None


def find_invalid_json_line(path: str | os.PathLike) -> tuple[int, str] | None:
    """``(line number, reason)`` of the first non-empty line of a JSON Lines file that is not a JSON object."""
    with _open_binary(Path(path)) as file:
        for number, line in enumerate(file, start=1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except ValueError as error:
                return number, str(error)
            if not isinstance(row, dict):
                return number, f"it is a JSON {type(row).__name__}, not an object"
    return None


def check_corpus_files(args: CorpusArguments) -> dict[str, list[Path]]:
    """The local files of ``args`` by split (`local_files`), each checked to be a readable text file (valid
    UTF-8; JSON Lines files one object a line; parquet files are not text), all of one format: refused with
    one `CorpusError` naming the file and the fix. Every file is read once a process (keyed by its size and
    modification time), so the run's check before work and its data stage do not read it twice."""
    files = local_files(args)
    if args.validation_file is not None and is_file_collection(args.validation_file) != is_file_collection(
        args.train_file
    ):
        raise CorpusError(
            f"--train_file {args.train_file} and --validation_file {args.validation_file} are read alike, and one "
            "is a folder or a glob, the other one file; pass two files, or two folders or globs"
        )
    flags = {"train": ("--train_file", args.train_file), "validation": ("--validation_file", args.validation_file)}
    extensions = {format_suffix(path) for paths in files.values() for path in paths}
    if len({_BUILDER_BY_EXTENSION.get(extension, "text") for extension in extensions}) > 1:
        where = " and ".join(f"{flags[split][0]} {flags[split][1]}" for split in files)
        raise CorpusError(
            f"{where} {'has' if len(files) == 1 else 'have'} files of different formats "
            f"({', '.join(sorted(extensions))}); pass files of one format"
        )
    for split, paths in files.items():
        flag, given = flags[split]
        collection = given is not None and is_file_collection(given)
        if collection and not paths:
            skipped = skipped_links(given)
            raise CorpusError(
                f"{flag} {given} holds no file (hidden files are skipped{f'; {skipped}' if skipped else ''}); "
                "pass a folder of text files"
                if Path(given).is_dir()
                else f"{flag} {given} matches no file{f' ({skipped})' if skipped else ''}; check the pattern, "
                "and quote it so that the shell passes it as it is"
            )
        for path in paths:
            name = f"{flag} {given}: {path}" if collection else f"{flag} {path}"
            if not path.is_file():
                raise CorpusError(
                    f"{name} does not exist or is not a file; pass a text file, a folder of text files or a glob "
                    "in quotes ('texts/*.txt')"
                )
            stat = path.stat()
            if not collection and stat.st_size == 0:  # in a folder, an empty file is no document
                raise CorpusError(f"{name} is empty; pass a file with text")
            reason = _file_refusal(path, stat.st_size, stat.st_mtime_ns)
            if reason is not None:
                raise CorpusError(f"{name} {reason}")
    return files


@functools.lru_cache(maxsize=4096)
def _file_refusal(path: Path, _size: int, _mtime_ns: int) -> str | None:
    """Why ``path`` cannot be read as corpus text (unreadable, binary, not UTF-8, a bad JSON line), else None."""
    if format_suffix(path) == ".parquet":
        return None
    try:
        # As git does: a NUL byte in the first 8,000 bytes (decompressed) means binary; text files have none.
        with _open_binary(path) as file:
            binary_at = file.read(_BINARY_CHECK_BYTES).find(b"\0")
    except OSError as error:
        return f"cannot be read ({error.strerror or error}); make it readable (chmod a+r) or leave it out"
    if binary_at >= 0:
        return (
            f"is not a text file: it has a NUL byte at byte offset {binary_at}, as binary files do; pass text "
            "files (.txt or WikiText .raw, UTF-8) or .jsonl/.csv/.parquet files"
        )
    invalid = find_invalid_utf8(path)
    if invalid is not None:
        offset, line, bad_bytes = invalid
        return (
            f"is not valid UTF-8: byte 0x{bad_bytes[0]:02x} at byte offset {offset} (line {line}) cannot be "
            f"decoded. Convert the file to UTF-8 and pass the converted file, e.g. `iconv -f latin1 -t utf-8 "
            f"{path} > {path.with_suffix('.utf8' + path.suffix)}` (replace latin1 by the file's encoding if it "
            "is another one; `file -i` guesses it)"
        )
    if format_suffix(path) == ".jsonl":  # a .json file may also be one document spread over lines
        bad_line = find_invalid_json_line(path)
        if bad_line is not None:
            number, reason = bad_line
            return (
                f"line {number} is not a JSON object ({reason}); JSON Lines files hold one object per line, such "
                'as {"text": "..."}: fix or remove that line'
            )
    return None


def skipped_links(given: str | None) -> str | None:
    """What a folder or a glob (`given`) left out, as its count and refusals say it: '2 links leading out of
    texts/ skipped (texts/a.txt, texts/b.txt)'; None when nothing was (or `given` is one file, or None)."""
    links = links_leading_out(given) if given is not None and is_file_collection(given) else []
    if not links:
        return None
    return f"{len(links):,} link{'s' if len(links) != 1 else ''} leading out of {given} skipped ({some_of(links)})"


def reads_whole_files(args: CorpusArguments) -> bool:
    """True when each row is a whole file: the plain text files of a folder or a glob (a file a document)."""
    return (
        args.train_file is not None  # then no --dataset_name (CorpusArguments refuses both)
        and is_file_collection(args.train_file)
        and all(
            _BUILDER_BY_EXTENSION.get(format_suffix(path)) is None
            for paths in local_files(args).values()
            for path in paths
        )
    )


def _load_local_files(args: CorpusArguments) -> datasets.IterableDatasetDict:
    """The files' rows, streamed whatever --streaming says: they are read once, while grouping them into
    documents, and datasets' Arrow copy of the raw rows would add the corpus's size to the cache again.
    The plain text files of a folder or a glob are read whole, one row each."""
    files = check_corpus_files(args)
    whole = {"sample_by": "document"} if reads_whole_files(args) else {}
    return datasets.load_dataset(
        _BUILDER_BY_EXTENSION.get(format_suffix(files["train"][0]), "text"),
        # escaped: datasets resolves data files as patterns, and a file named "notes[1].txt" matches no file
        data_files={split: [glob.escape(str(path)) for path in paths] for split, paths in files.items()},
        streaming=True,
        **whole,
    )


def _describe_corpus(args: CorpusArguments) -> str:
    if args.dataset_name is not None:
        return f"--dataset_name {args.dataset_name} --dataset_config_name {args.dataset_config_name}"
    if args.train_file is not None:
        return f"--train_file {args.train_file}"
    return f"the shipped sample {SHIPPED_SAMPLE_DIR}"


def _group_split(
    rows: datasets.Dataset | datasets.IterableDataset, split: str, args: CorpusArguments
) -> datasets.Dataset | datasets.IterableDataset:
    gen_kwargs = {
        "rows": rows,
        "text_column": args.text_column,
        "boundary": resolve_document_boundary(args),
        "whole_files": reads_whole_files(args),
    }
    if args.streaming:
        return datasets.IterableDataset.from_generator(
            iter_documents, features=DOCUMENT_FEATURES, gen_kwargs=gen_kwargs
        )
    # What names the rows' content: datasets' fingerprint of the source (which names a local folder's files by
    # path and mtime only, so their sha256 beside it), else (streamed local files) the files' sha256: hashing
    # the IterableDataset object itself would be slow.
    if isinstance(rows, datasets.Dataset):
        # _fingerprint: private, kept: datasets has no public accessor (test_corpus checks it)
        content = Hasher.hash([rows._fingerprint, corpus_fingerprint(args)])
    else:
        content = Hasher.hash([(split, sha256_file(path)) for path in local_files(args)[split]])
    grouping = list(gen_kwargs.values())[1:]  # the text column, the boundary and whether rows are files
    return datasets.Dataset.from_generator(
        iter_documents,
        features=DOCUMENT_FEATURES,
        gen_kwargs=gen_kwargs,
        split=datasets.NamedSplit(split),
        writer_batch_size=DOCUMENTS_PER_BATCH,
        fingerprint=Hasher.hash(["hfbert.corpus.iter_documents", content, *grouping, _SOURCE]),
    )


@contextlib.contextmanager
def naming_cache_failures() -> Iterator[None]:
    """Turn a failed write into the datasets cache (a full disk, a read-only or foreign cache folder), which
    datasets and pyarrow raise as a bare OSError, into one naming the cache and the fix."""
    try:
        yield
    except OSError as error:
        cache = str(datasets.config.HF_DATASETS_CACHE)
        in_cache = str(getattr(error, "filename", None) or "").startswith(cache)
        if not (is_disk_full(error) or in_cache):
            raise
        raise Refusal(
            f"The datasets cache {cache} cannot be used: {describe_write_failure(error, cache)}; free space "
            "there, or point HF_DATASETS_CACHE at a writable folder on a disk with room, then rerun the same command",
        ) from error


def _checked_rows(
    args: CorpusArguments, num_proc: int | None
) -> dict[str, datasets.Dataset | datasets.IterableDataset]:
    """The source's rows by split, after every check that reads no more than its first document."""
    rows = _load_hub_dataset(args, num_proc) if args.dataset_name is not None else _load_local_files(args)
    if "train" not in rows:
        raise CorpusError(f"{_describe_corpus(args)} has no 'train' split (it has {list(rows)})")
    boundary = resolve_document_boundary(args)
    split_rows = {split: rows[split] for split in ("train", "validation") if split in rows}
    # Every split is checked before any is grouped and written, so a refusal leaves nothing in the cache.
    for split, rows in split_rows.items():
        if rows.column_names is not None and args.text_column not in rows.column_names:
            raise CorpusError(
                f"--text_column {args.text_column} is not a column of {_describe_corpus(args)} "
                f"(columns: {rows.column_names}); pass --text_column with one of them"
            )
        # Checked on the rows (reads only up to the first document): datasets cannot build an empty split.
        if next(iter_documents(rows, args.text_column, boundary, reads_whole_files(args)), None) is None:
            raise CorpusError(
                f"{_describe_corpus(args)} has no text in its {split} split (document_boundary={boundary}); "
                "pass a corpus with text"
            )
    return split_rows


def stream_documents(args: CorpusArguments) -> datasets.IterableDatasetDict:
    """`load_documents` streamed whatever ``args.streaming`` says, without its log line: every check it makes,
    nothing written (a Hub dataset is streamed too)."""
    args = dataclasses.replace(args, streaming=True)
    return datasets.IterableDatasetDict(
        {split: _group_split(rows, split, args) for split, rows in _checked_rows(args, None).items()}
    )


@naming_cache_failures()
def load_documents(
    args: CorpusArguments, num_proc: int | None = None
) -> datasets.DatasetDict | datasets.IterableDatasetDict:
    """Load the corpus named by ``args`` as documents, and log what was found (`describe_documents`).

    Returns splits ``train`` and, when the source has one, ``validation``, each with a single column
    ``paragraphs`` (``list[str]``, cleaned: blank lines dropped, WikiText headings removed and escapes
    restored). A `datasets.IterableDatasetDict` with ``args.streaming``, else a cached `datasets.DatasetDict`.
    ``num_proc`` parallelises the source download/preparation. Raises `CorpusError` for a missing or
    unreadable file (`check_corpus_files`), an unreachable Hub dataset, a missing text column or an empty split.
    """
    dict_class = datasets.IterableDatasetDict if args.streaming else datasets.DatasetDict
    rows = _checked_rows(args, num_proc)
    documents = dict_class({split: _group_split(split_rows, split, args) for split, split_rows in rows.items()})
    for split, grouped in documents.items():
        logger.info(describe_documents(args, split, grouped))
    return documents


def describe_documents(
    args: CorpusArguments, split: str, documents: datasets.Dataset | datasets.IterableDataset
) -> str:
    """What a split of `load_documents` holds, as the log says it: '--train_file texts: 1,525 documents from
    1,525 files (a file a document)'; a stream's documents are not counted."""
    how = _HOW_DOCUMENTS_END[resolve_document_boundary(args)]
    if reads_whole_files(args):
        how = "a file a document" if resolve_document_boundary(args) == "row" else f"{how} and at each file's end"
    corpus = _describe_corpus(args) if split == "train" else f"--validation_file {args.validation_file}"
    if split == "validation" and args.validation_file is None:
        corpus = f"{_describe_corpus(args)}, validation split"
    count = None if args.dataset_name is not None else len(local_files(args)[split])
    files = "" if count is None else f"{count:,} file" + ("s" if count != 1 else "")
    links = skipped_links(args.train_file if split == "train" else args.validation_file)
    skipped = f"; {links}" if links else ""
    if args.streaming:
        return f"{corpus}: {files or 'its ' + split + ' split'}, streamed ({how}){skipped}"
    counted = f"{len(documents):,} documents" + (f" from {files}" if files else "")
    return f"{corpus}: {counted} ({how}){skipped}"
