"""Corpus loading: any text source -> documents made of cleaned paragraphs.

Every source goes through `datasets.load_dataset`:

* a Hub dataset (or a local folder laid out like a Hub dataset repo): ``--dataset_name`` and
  ``--dataset_config_name``, optionally ``--streaming``;
* local files: ``--train_file`` / ``--validation_file`` — parquet, json/jsonl and csv through their
  ``datasets`` builders (text in ``--text_column``), every other extension (``.txt``, WikiText's ``.raw``,
  ...) as plain text, one row per line;
* nothing named: the WikiText-2 raw sample shipped inside this package (``hfbert/data/``).

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
import json
import os
from collections.abc import Iterable, Iterator
from pathlib import Path

import datasets
import fsspec
from datasets.fingerprint import Hasher
from fsspec.utils import infer_compression
from huggingface_hub import HfApi
from huggingface_hub.errors import HfHubHTTPError, RepositoryNotFoundError

from hfbert.corpus_source import (
    SHIPPED_SAMPLE_DIR,
    CorpusArguments,
    CorpusError,
    DocumentBoundary,
    local_files,
)
from hfbert.errors import Refusal
from hfbert.files import describe_write_failure, is_disk_full, sha256_file

SPLITS = ("train", "validation")
# Extensions with a structured `datasets` builder; every other extension is read as plain text.
_BUILDER_BY_EXTENSION = {".parquet": "parquet", ".json": "json", ".jsonl": "json", ".csv": "csv"}
_BINARY_CHECK_BYTES = 8000  # as git does: a NUL byte in the first 8,000 bytes means binary
DOCUMENT_FEATURES = datasets.Features({"paragraphs": datasets.List(datasets.Value("string"))})
_ROWS_PER_READ = 1000
# Documents per Arrow write and per datasets.map batch: a batch's Python lists (and the tokenizer's encodings)
# are held at once, and datasets' default of 1,000 rows would hold a corpus of long documents whole.
DOCUMENTS_PER_BATCH = 32
_HUB_PROBE_TIMEOUT_S = 10
_UTF8_CHECK_BYTES_PER_READ = 1 << 24
# Part of the documents' cache key: an edited grouping must not reuse documents grouped by the old code.
_SOURCE = Hasher.hash(Path(__file__).read_bytes())


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


def _is_wikitext_source(args: CorpusArguments) -> bool:
    if args.dataset_name is not None:
        return "wikitext" in args.dataset_name.lower()
    return args.train_file is None or format_suffix(args.train_file) == ".raw"


# ---------------------------------------------------------------------------------------------------------


def resolve_document_boundary(args: CorpusArguments) -> DocumentBoundary:
    """The document boundary rule for ``args``: the explicit flag, else the default for its source."""
    if args.document_boundary is not None:
        return args.document_boundary
    if _is_wikitext_source(args):
        return "heading"
    if args.train_file is not None and format_suffix(args.train_file) not in _BUILDER_BY_EXTENSION:
        return "blank_line"
    return "row"


def _iter_texts(rows: datasets.Dataset | datasets.IterableDataset, text_column: str) -> Iterator[str]:
    for batch in rows.iter(batch_size=_ROWS_PER_READ):
        yield from batch[text_column]


def _clean_paragraphs(lines: Iterable[str], boundary: DocumentBoundary) -> Iterator[str]:
    for line in lines:
        paragraph = clean_wikitext_line(line) if boundary == "heading" else line.strip()
        if paragraph:
            yield paragraph


def _starts_document(line: str, boundary: DocumentBoundary) -> bool:
    if boundary == "heading":
        return is_wikitext_article_heading(line)
    return not line.strip()


def iter_documents(
    rows: datasets.Dataset | datasets.IterableDataset, text_column: str, boundary: DocumentBoundary
) -> Iterator[dict[str, list[str]]]:
    """Group rows of text into documents ``{"paragraphs": [...]}``, in order.

    Sequential on purpose: a document may span any number of rows, so grouping cannot be split into
    independent `map` batches. Documents without any paragraph are dropped.
    """
    if boundary == "row":
        for text in _iter_texts(rows, text_column):
            paragraphs = list(_clean_paragraphs(text.splitlines(), boundary))
            if paragraphs:
                yield {"paragraphs": paragraphs}
        return
    paragraphs: list[str] = []
    for text in _iter_texts(rows, text_column):
        # An empty row is a blank line; a row may also hold several lines.
        for line in text.splitlines() or [""]:
            if _starts_document(line, boundary) and paragraphs:
                yield {"paragraphs": paragraphs}
                paragraphs = []
            paragraphs.extend(_clean_paragraphs([line], boundary))
    if paragraphs:
        yield {"paragraphs": paragraphs}


def _check_hub_reachable(dataset_name: str) -> None:
    """Fail in seconds when the Hub cannot be reached (datasets itself retries for ~25 s, then fails vaguely)."""
    local_files_hint = (
        "pass local files with --train_file/--validation_file, or a local folder laid out like the Hub repo "
        "with --dataset_name PATH"
    )
    if datasets.config.HF_HUB_OFFLINE:
        return  # load_dataset then uses the local cache, or raises ConnectionError at once
    try:
        HfApi().dataset_info(dataset_name, timeout=_HUB_PROBE_TIMEOUT_S)
    except RepositoryNotFoundError as error:
        raise CorpusError(
            f"--dataset_name {dataset_name} is neither a local folder nor a dataset on the Hub you can access "
            f"(check the spelling, or log in with `hf auth login` for a gated or private dataset); "
            f"or {local_files_hint}"
        ) from error
    except HfHubHTTPError:
        raise
    # Network failures surface as the HTTP client's own exception types, which have no stable import path.
    except Exception as error:
        raise CorpusError(
            f"cannot reach the Hugging Face Hub to load --dataset_name {dataset_name} ({error!r}); "
            f"{local_files_hint}, or set HF_DATASETS_OFFLINE=1 to use a copy already in the datasets cache"
        ) from error


def _load_hub_dataset(
    args: CorpusArguments, num_proc: int | None
) -> datasets.DatasetDict | datasets.IterableDatasetDict:
    assert args.dataset_name is not None
    is_local_folder = os.path.isdir(args.dataset_name)
    if not is_local_folder:
        _check_hub_reachable(args.dataset_name)
    try:
        return datasets.load_dataset(
            args.dataset_name,
            args.dataset_config_name,
            streaming=args.streaming,
            num_proc=None if args.streaming else num_proc,
        )
    except ConnectionError as error:  # raised at once in offline mode when the dataset is not cached
        raise CorpusError(
            f"--dataset_name {args.dataset_name} is not in the local datasets cache and the Hub is offline "
            f"(HF_HUB_OFFLINE/HF_DATASETS_OFFLINE is set); pass local files with --train_file/--validation_file, "
            f"or a local folder laid out like the Hub repo with --dataset_name PATH"
        ) from error
    except FileNotFoundError as error:
        raise CorpusError(f"--dataset_name {args.dataset_name}: {error}") from error


def _flag_of(split: str) -> str:
    return "--train_file" if split == "train" else "--validation_file"


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


def find_binary_bytes(path: str | os.PathLike) -> int | None:
    """Byte offset of the first NUL byte in the first 8,000 bytes of ``path`` (decompressed), else None: text
    files have none, binary files (and a file of NULs) almost always do."""
    with _open_binary(Path(path)) as file:
        offset = file.read(_BINARY_CHECK_BYTES).find(b"\0")
    return None if offset < 0 else offset


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


def _unreadable_file_error(split: str, path: Path) -> CorpusError | None:
    """A CorpusError naming what is wrong with ``path`` (not UTF-8, a bad JSON line), else None."""
    if format_suffix(path) == ".parquet":
        return None
    flag = _flag_of(split)
    invalid = find_invalid_utf8(path)
    if invalid is not None:
        offset, line, bad_bytes = invalid
        return CorpusError(
            f"{flag} {path} is not valid UTF-8: byte 0x{bad_bytes[0]:02x} at byte offset {offset} "
            f"(line {line}) cannot be decoded. Convert the file to UTF-8 and pass the converted file, e.g. "
            f"`iconv -f latin1 -t utf-8 {path} > {path.with_suffix('.utf8' + path.suffix)}` (replace latin1 "
            "by the file's encoding if it is another one; `file -i` guesses it)"
        )
    if format_suffix(path) == ".jsonl":  # a .json file may also be one document spread over lines
        bad_line = find_invalid_json_line(path)
        if bad_line is not None:
            number, reason = bad_line
            return CorpusError(
                f"{flag} {path} line {number} is not a JSON object ({reason}); JSON Lines files hold one object "
                "per line, such as {\"text\": \"...\"}: fix or remove that line"
            )
    return None


@contextlib.contextmanager
def _naming_undecodable_files(files: dict[str, Path]) -> Iterator[None]:
    """Turn a failure while reading ``files`` into a CorpusError naming the first file that is not UTF-8 or
    (JSON Lines) has a line that is not a JSON object.

    The files are checked only after something failed (datasets reports a UnicodeDecodeError, a schema or
    Arrow error, wrapped in a DatasetGenerationError, without the file, and with a position inside its read
    buffer); other failures pass through unchanged.
    """
    try:
        yield
    except Exception as error:
        for split, path in files.items():
            named = _unreadable_file_error(split, path)
            if named is not None:
                raise named from error
        raise


def _load_local_files(args: CorpusArguments) -> datasets.IterableDatasetDict:
    """The files' rows, streamed whatever --streaming says: they are read once, while grouping them into
    documents, and datasets' Arrow copy of the raw rows would add the corpus's size to the cache again."""
    files = local_files(args)
    for split, path in files.items():
        flag = _flag_of(split)
        if not path.is_file():
            raise CorpusError(f"{flag} {path} does not exist or is not a file; pass the path of a text file")
        if path.stat().st_size == 0:
            raise CorpusError(f"{flag} {path} is empty; pass a file with text")
        binary_at = None if format_suffix(path) == ".parquet" else find_binary_bytes(path)
        if binary_at is not None:
            raise CorpusError(
                f"{flag} {path} is not a text file: it has a NUL byte at byte offset {binary_at}, as binary files "
                "do; pass a text file (.txt or WikiText .raw, UTF-8) or a .jsonl/.csv/.parquet file"
            )
    extensions = {format_suffix(path) for path in files.values()}
    builders = {_BUILDER_BY_EXTENSION.get(extension, "text") for extension in extensions}
    if len(builders) > 1:
        raise CorpusError(
            f"--train_file and --validation_file have different formats ({', '.join(sorted(extensions))}); "
            "pass files of the same format"
        )
    with _naming_undecodable_files(files):
        return datasets.load_dataset(
            builders.pop(),
            data_files={split: str(path) for split, path in files.items()},
            streaming=True,
        )


def _describe_source(args: CorpusArguments) -> str:
    if args.dataset_name is not None:
        return f"--dataset_name {args.dataset_name} --dataset_config_name {args.dataset_config_name}"
    if args.train_file is not None:
        return f"--train_file {args.train_file}"
    return f"the shipped sample {SHIPPED_SAMPLE_DIR}"


def _iter_documents_of_files(
    rows: datasets.IterableDataset,
    text_column: str,
    boundary: DocumentBoundary,
    files: dict[str, Path],
) -> Iterator[dict[str, list[str]]]:
    """`iter_documents` over streamed ``files``: decoding happens while iterating, so errors are named here."""
    with _naming_undecodable_files(files):
        yield from iter_documents(rows, text_column, boundary)


def _group_split(
    rows: datasets.Dataset | datasets.IterableDataset,
    split: str,
    text_column: str,
    boundary: DocumentBoundary,
    files: dict[str, Path],
    streaming: bool,
) -> datasets.Dataset | datasets.IterableDataset:
    gen_kwargs = {"rows": rows, "text_column": text_column, "boundary": boundary}
    if streaming:
        return datasets.IterableDataset.from_generator(
            _iter_documents_of_files,
            features=DOCUMENT_FEATURES,
            gen_kwargs={**gen_kwargs, "files": files},
        )
    with _naming_undecodable_files(files):
        return datasets.Dataset.from_generator(
            iter_documents,
            features=DOCUMENT_FEATURES,
            gen_kwargs=gen_kwargs,
            split=datasets.NamedSplit(split),
            writer_batch_size=DOCUMENTS_PER_BATCH,
            fingerprint=Hasher.hash(
                ["hfbert.corpus.iter_documents", _rows_fingerprint(rows, files), text_column, boundary, _SOURCE]
            ),
        )


def _rows_fingerprint(rows: datasets.Dataset | datasets.IterableDataset, files: dict[str, Path]) -> str:
    """What names the rows' content: the files' sha256 (streamed local files), else datasets' fingerprint
    of the source (hashing the Dataset object itself would be slow)."""
    if isinstance(rows, datasets.Dataset):
        return rows._fingerprint
    return Hasher.hash(sorted((split, sha256_file(path)) for split, path in files.items()))


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


@naming_cache_failures()
def load_documents(
    args: CorpusArguments, num_proc: int | None = None
) -> datasets.DatasetDict | datasets.IterableDatasetDict:
    """Load the corpus named by ``args`` as documents.

    Returns splits ``train`` and, when the source has one, ``validation``, each with a single column
    ``paragraphs`` (``list[str]``, cleaned: blank lines dropped, WikiText headings removed and escapes
    restored). A `datasets.IterableDatasetDict` with ``args.streaming``, else a cached `datasets.DatasetDict`.
    ``num_proc`` parallelises the source download/preparation. Raises `CorpusError` for a missing file,
    an unreachable Hub dataset, a missing text column or an empty training split.
    """
    source = (
        _load_hub_dataset(args, num_proc)
        if args.dataset_name is not None
        else _load_local_files(args)
    )
    if "train" not in source:
        raise CorpusError(f"{_describe_source(args)} has no 'train' split (it has {list(source)})")
    boundary = resolve_document_boundary(args)
    # Streamed files are decoded while iterating, and the json builder keeps invalid UTF-8 until the rows are
    # read here: decoding errors are named wherever rows are read.
    files_by_split = local_files(args) if args.dataset_name is None else {}
    dict_class = datasets.IterableDatasetDict if args.streaming else datasets.DatasetDict
    split_rows = {split: source[split] for split in SPLITS if split in source}
    # Every split is checked before any is grouped and written, so a refusal leaves nothing in the cache.
    for split, rows in split_rows.items():
        if rows.column_names is not None and args.text_column not in rows.column_names:
            raise CorpusError(
                f"--text_column {args.text_column} is not a column of {_describe_source(args)} "
                f"(columns: {rows.column_names}); pass --text_column with one of them"
            )
        # Checked on the rows (reads only up to the first document): datasets cannot build an empty split.
        split_files = {name: path for name, path in files_by_split.items() if name == split}
        with _naming_undecodable_files(split_files):
            first_document = next(iter_documents(rows, args.text_column, boundary), None)
        if first_document is None:
            raise CorpusError(
                f"{_describe_source(args)} has no text in its {split} split (document_boundary={boundary}); "
                "pass a corpus with text"
            )
    documents = dict_class()
    for split, rows in split_rows.items():
        split_files = {name: path for name, path in files_by_split.items() if name == split}
        documents[split] = _group_split(rows, split, args.text_column, boundary, split_files, args.streaming)
    return documents
