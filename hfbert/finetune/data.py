"""The labelled examples `python -m hfbert.finetune` trains and evaluates on, read and checked before any work.

Local csv / jsonl / json / parquet files are read with Python's own readers, not type-inferred: a label column
reads the same whether it holds 1, 1.0, "1" or "1.0", from any of the formats. Not `datasets.load_dataset`
(datasets 5.2): its csv builder types each column by its values ("NA" a missing value, "007" the number 7.0)
unless told every column's type, and its csv and json errors name no line of the file (pyarrow's "JSON parse
error ... in row 1" for a broken second line), where the refusals here name it. A row whose text or label is
missing (empty, null) is refused with the file, the column and the rows, never turned into a class "None" or
handed to the tokenizer. Hub sets (`--dataset_name`, GLUE's columns and metrics known)
go through the same checks. Every problem is a `Refusal` that names the file or flag and the fix.
"""

from __future__ import annotations

import codecs
import collections
import csv
import io
import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import datasets
import numpy as np
from transformers import PreTrainedTokenizerBase

from hfbert.corpus_arguments import check_dataset_folder
from hfbert.errors import Refusal
from hfbert.files import JSON_TOO_DEEP
from hfbert.finetune.settings import FinetuneDataArguments


@dataclass(frozen=True)
class GlueTask:
    """A GLUE classification task: its columns, its evaluation split and the metrics GLUE reports."""

    text_column: str
    text_pair_column: str | None
    metrics: tuple[str, ...]
    validation_split: str = "validation"


# GLUE's classification tasks (STS-B is a regression and is not offered).
GLUE_TASKS: dict[str, GlueTask] = {
    "cola": GlueTask("sentence", None, ("matthews_correlation", "accuracy")),
    "sst2": GlueTask("sentence", None, ("accuracy",)),
    "mrpc": GlueTask("sentence1", "sentence2", ("accuracy", "f1")),
    "qqp": GlueTask("question1", "question2", ("accuracy", "f1")),
    "mnli": GlueTask("premise", "hypothesis", ("accuracy",), "validation_matched"),
    "qnli": GlueTask("question", "sentence", ("accuracy",)),
    "rte": GlueTask("sentence1", "sentence2", ("accuracy",)),
    "wnli": GlueTask("sentence1", "sentence2", ("accuracy",)),
}
GLUE_NAMES = ("glue", "nyu-mll/glue")
FILE_FORMATS = (".csv", ".json", ".jsonl", ".parquet")
FILE_FIX = "pass a file with a header line and labelled rows"
# "1.0" written for the class 1 (pandas writes integer labels with a missing value as floats).
_INTEGRAL_FLOAT = re.compile(r"^([+-]?\d+)\.0*$")
# How programs write a missing value into a text file (pandas' to_csv writes "", json.dumps null).
_MISSING_WORDS = frozenset({"", "None", "null", "nan", "NaN"})


@dataclass(frozen=True)
class TaskData:
    """The labelled examples, as train and evaluation splits with integer labels 0..num_labels-1."""

    train: datasets.Dataset
    evaluation: datasets.Dataset
    text_column: str
    text_pair_column: str | None
    label_names: list[str]
    metrics: tuple[str, ...]
    evaluation_split: str  # the Hub split's name, or the validation file's name


# ------------------------------------------------------------------------------------------------ local files


def _read_text(path: Path, flag: str) -> str:
    data = path.read_bytes()
    if data.startswith((codecs.BOM_UTF16_LE, codecs.BOM_UTF16_BE)):  # "Unicode text" from Excel or PowerShell
        raise Refusal(f"{flag} {path} is UTF-16, not UTF-8; save it as UTF-8 (e.g. iconv -f utf-16 -t utf-8)")
    try:
        return data.decode("utf-8-sig")  # a byte-order mark (Excel's "CSV UTF-8") is fine
    except UnicodeDecodeError as error:
        raise Refusal(
            f"{flag} {path} is not UTF-8 text (byte {error.start}: {error.object[error.start : error.start + 4]!r}); "
            "save it as UTF-8 (e.g. iconv -f latin1 -t utf-8, or 'CSV UTF-8' in a spreadsheet)"
        ) from None


def _csv_rows(path: Path, flag: str) -> list[dict[str, Any]]:
    text = _read_text(path, flag)
    # newline="": line breaks inside quoted fields stay in the text, as the csv module asks
    # strict: an unterminated quote is an error, not a field that swallows the rest of the file
    reader = csv.DictReader(io.StringIO(text, newline=""), strict=True)
    # A cell may be as long as the file (the module's default limit, 128 KB, refuses longer ones as invalid).
    limit = csv.field_size_limit(max(len(text), csv.field_size_limit()))
    try:
        return [_csv_row(row, reader, path, flag) for row in reader]
    except csv.Error as error:
        raise Refusal(
            f"{flag} {path} is not valid CSV (line {reader.line_num}: {error}); {FILE_FIX}"
        ) from None
    finally:
        csv.field_size_limit(limit)


def _csv_row(row: dict[str | None, Any], reader: csv.DictReader, path: Path, flag: str) -> dict[str, Any]:
    """A row as `csv.DictReader` reads it (every value a string, "" for an empty cell, None for a short row's
    missing ones), after refusing one with more fields than the header, which DictReader keeps under None: an
    unquoted comma in a text would otherwise shift the rest of the row into the label."""
    if None in row:
        header = reader.fieldnames or []
        raise Refusal(
            f"{flag} {path} line {reader.line_num} has {len(header) + len(row[None])} fields, and its header "
            f'{len(header)} ({", ".join(header)}): quote a text that holds a comma (e.g. "i liked it, a lot")'
        )
    return row


def _json_rows(path: Path, flag: str) -> list[dict[str, Any]]:
    text = _read_text(path, flag)
    if text.lstrip().startswith("["):  # one JSON array of objects
        try:
            rows = json.loads(text)
        except json.JSONDecodeError as error:
            raise Refusal(f"{flag} {path} is not JSON ({error}); {FILE_FIX}") from None
        except RecursionError:
            raise Refusal(f"{flag} {path} is not JSON ({JSON_TOO_DEEP}); {FILE_FIX}") from None
    else:  # JSON lines
        rows = []
        for number, line in enumerate(text.split("\n"), start=1):  # not splitlines: U+2028 may be in a text
            if line.strip():
                try:
                    rows.append(json.loads(line))
                except (json.JSONDecodeError, RecursionError) as error:
                    reason = getattr(error, "msg", JSON_TOO_DEEP)
                    raise Refusal(
                        f"{flag} {path} line {number} is not JSON ({reason}); write one JSON object per line"
                    ) from None
    if not all(isinstance(row, dict) for row in rows):
        raise Refusal(f"{flag} {path} holds JSON that is not one object per row; write one object per line")
    return rows


def _parquet_rows(path: Path, flag: str) -> list[dict[str, Any]]:
    import pyarrow
    import pyarrow.parquet

    try:
        return pyarrow.parquet.read_table(path).to_pylist()
    except (pyarrow.ArrowException, OSError) as error:
        raise Refusal(f"{flag} {path} is not a readable parquet file ({error}); write it again") from None


def read_labelled_file(path: str | Path, flag: str) -> list[dict[str, Any]]:
    """The rows of a local csv / json / jsonl / parquet file as dicts of the values as written (a csv's as
    strings); refuses a missing, empty, unreadable or non-UTF-8 file and one without rows, naming `flag`."""
    path = Path(path)
    if not path.is_file():
        raise Refusal(f"{flag} {path}: no such file; {FILE_FIX}")
    if path.suffix not in FILE_FORMATS:
        raise Refusal(f"{flag} {path}: use a {', '.join(FILE_FORMATS)} file")
    if not path.read_bytes().removeprefix(codecs.BOM_UTF8).strip():  # a byte-order mark alone is empty too
        raise Refusal(f"{flag} {path} is empty; {FILE_FIX}")
    reader = {".csv": _csv_rows, ".parquet": _parquet_rows}.get(path.suffix, _json_rows)
    rows = reader(path, flag)
    if not rows:
        raise Refusal(f"{flag} {path} has no data rows (a header or an empty list only); {FILE_FIX}")
    return rows


# ------------------------------------------------------------------------------------------------ checks


def label_text(value: Any) -> str | None:
    """A label as the class name it stands for: 1, 1.0, "1" and "1.0" all give "1"; None for a missing one
    (None, NaN, empty)."""
    if isinstance(value, float) and value.is_integer():  # None and NaN read "None" and "nan" below: missing
        return str(int(value))
    text = str(value).strip()
    match = _INTEGRAL_FLOAT.match(text)
    if match:
        return str(int(match.group(1)))
    return None if text in _MISSING_WORDS else text


def _rows_have(numbers: list[int]) -> str:
    """'row 3 (data rows counted from 1) has' or '7 rows (3, 4, 9, 12, 20, ...; data rows counted from 1) have'."""
    if len(numbers) == 1:
        return f"row {numbers[0]} (data rows counted from 1) has"
    shown = ", ".join(map(str, numbers[:5])) + (", ..." if len(numbers) > 5 else "")
    return f"{len(numbers)} rows ({shown}; data rows counted from 1) have"


def _checked_labels(
    columns: dict[str, list], where: str, text_columns: list[str], label: str, names: list[str] | None
) -> list[str]:
    """The label column's values as class names (`names[i]` for a ClassLabel's i, else as `label_text` reads
    them), after refusing a missing text or label column, missing/empty texts or values that are not text (the
    tokenizer would fail on them mid-run), and missing labels."""
    for column in (*text_columns, label):
        if column not in columns:
            raise Refusal(
                f"{where} has no column {column!r}; its columns are {list(columns)} "
                "(choose with --text_column, --text_pair_column, --label_column)"
            )
    for column in text_columns:
        missing = [i for i, v in enumerate(columns[column], 1) if not isinstance(v, str) or not v.strip()]
        if missing:
            raise Refusal(
                f"{where}: {_rows_have(missing)} an empty or missing {column!r} (or one that is not text); "
                "remove or fill those rows"
            )
    if names:
        return [names[i] for i in columns[label]]
    labels = [label_text(value) for value in columns[label]]
    missing = [i for i, value in enumerate(labels, 1) if value is None]
    if missing:
        raise Refusal(
            f"{where}: {_rows_have(missing)} an empty or missing {label!r}; remove those rows or give them "
            "their class"
        )
    return labels


def _file_columns(rows: list[dict[str, Any]]) -> dict[str, list]:
    """The rows as columns, one for every key of any row (a JSON line may leave out a key the others have)."""
    names = [name for name in dict.fromkeys(key for row in rows for key in row) if name is not None]
    return {name: [row.get(name) for row in rows] for name in names}


def _label_names(train: list[str], evaluation: list[str], column: str, where: tuple[str, str]) -> list[str]:
    """The classes, sorted (numerically where they all are integers); refuses labels that are not categories."""
    values = set(train)
    if any(_is_fraction(value) for value in values):
        raise Refusal(
            f"--label_column {column} holds non-integer numbers ({sorted(values)[:3]} ...): a regression target, "
            "not categories; this tool fine-tunes classifiers"
        )
    if len(values) > max(50, len(train) // 2):
        raise Refusal(
            f"--label_column {column} has {len(values)} distinct values in {len(train)} training examples: not "
            "categorical; pass the column that holds the class"
        )
    integral = all(re.fullmatch(r"[+-]?\d+", value) for value in values)
    names = sorted(values, key=int) if integral else sorted(values)
    unseen = sorted(set(evaluation) - values)
    if unseen:
        raise Refusal(
            f"{where[1]} has labels that {where[0]} lacks: {unseen[:5]}; a classifier cannot learn them (use "
            "splits with the same classes)"
        )
    if len(names) < 2:
        raise Refusal(f"--label_column {column} has a single class {names}; a classifier needs two or more")
    return names


def _is_fraction(value: str) -> bool:
    try:
        return not float(value).is_integer()
    except ValueError:
        return False


# ------------------------------------------------------------------------------------------------ loading


def _glue_task(data: FinetuneDataArguments) -> GlueTask | None:
    return GLUE_TASKS.get(data.dataset_config_name or "") if data.dataset_name in GLUE_NAMES else None


def task_columns(data: FinetuneDataArguments) -> tuple[str, str | None, str, tuple[str, ...]]:
    """(text column, pair column, label column, metrics) from the flags, with GLUE's defaults."""
    task = _glue_task(data)
    text = data.text_column or (task.text_column if task else "text")
    pair = data.text_pair_column or (task.text_pair_column if task else None)
    metrics = task.metrics if task else ("accuracy",)
    return text, pair, data.label_column, metrics


def _load_hub(data: FinetuneDataArguments) -> tuple[tuple, str, list[str] | None]:
    """The train and evaluation splits as (where, columns) each, the evaluation split's name, and the
    ClassLabel's names if the label column is one (its rows at -1, GLUE's unlabelled test rows, dropped)."""
    task = _glue_task(data)
    if Path(data.dataset_name).is_dir():
        check_dataset_folder(data.dataset_name, data.dataset_config_name)
    try:
        splits = datasets.load_dataset(data.dataset_name, data.dataset_config_name)
    except Exception as error:  # datasets raises many types for offline / missing / typo
        raise Refusal(
            f"--dataset_name {data.dataset_name} (--dataset_config_name {data.dataset_config_name}) could not "
            f"be loaded ({type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}); check the "
            "name and your connection to the Hub, or pass --train_file/--validation_file"
        ) from None
    validation = task.validation_split if task else data.validation_split
    for split in ("train", validation):
        if split not in splits:
            raise Refusal(f"--dataset_name {data.dataset_name} has no {split!r} split; it has {list(splits)}")
    train, evaluation, label = splits["train"], splits[validation], data.label_column
    feature = train.features.get(label)
    names = list(feature.names) if isinstance(feature, datasets.ClassLabel) else None
    if names:
        train, evaluation = (split.filter(lambda row: row[label] >= 0) for split in (train, evaluation))
    where_train = f"--dataset_name {data.dataset_name} 'train'"
    return ((where_train, train.to_dict()), (repr(validation), evaluation.to_dict())), validation, names


def load_task(data: FinetuneDataArguments) -> TaskData:
    """The task's splits with integer labels 0..n-1, after every check on the files, columns, texts, labels
    and the sample-count flags."""
    text, pair, label, metrics = task_columns(data)
    text_columns = [column for column in (text, pair) if column is not None]
    if label in text_columns:
        raise Refusal(f"--label_column {label} is also a text column; pass the column that holds the class")
    if data.dataset_name is not None:
        sources, split_name, names = _load_hub(data)
    else:
        names, split_name = None, Path(data.validation_file).name
        files = (("--train_file", data.train_file), ("--validation_file", data.validation_file))
        # a generator: the training file is read and checked before the validation file is read
        sources = ((f"{flag} {path}", _file_columns(read_labelled_file(path, flag))) for flag, path in files)
    splits = [
        (columns, _checked_labels(columns, where, text_columns, label, names), where) for where, columns in sources
    ]
    (_, train_labels, train_where), (_, evaluation_labels, evaluation_where) = splits
    names = names or _label_names(train_labels, evaluation_labels, label, (train_where, evaluation_where))
    check_sample_counts(data, len(train_labels), len(evaluation_labels), len(set(train_labels)))
    index = {name: i for i, name in enumerate(names)}
    train_set, evaluation_set = (
        datasets.Dataset.from_dict(
            {**{c: columns[c] for c in text_columns}, "labels": [index[v] for v in labels]}
        )
        for columns, labels, _ in splits
    )
    if data.max_train_samples is not None:
        train_set = few_labels(train_set, data.max_train_samples, data.data_seed)
    if data.max_eval_samples is not None:
        evaluation_set = evaluation_set.shuffle(seed=data.data_seed).select(range(data.max_eval_samples))
    return TaskData(train_set, evaluation_set, text, pair, names, metrics, split_name)


def check_sample_counts(data: FinetuneDataArguments, train_rows: int, evaluation_rows: int, classes: int) -> None:
    """Refuse --max_train_samples / --max_eval_samples that the splits cannot honour."""
    if data.max_train_samples is not None:
        if data.max_train_samples > train_rows:
            raise Refusal(
                f"--max_train_samples {data.max_train_samples} exceeds the training split's {train_rows} rows; "
                f"pass at most {train_rows}, or leave it out to train on every row"
            )
        if data.max_train_samples < classes:
            raise Refusal(
                f"--max_train_samples {data.max_train_samples} is fewer than the {classes} classes, so some class "
                f"would have no example; pass at least {classes}"
            )
    if data.max_eval_samples is not None and data.max_eval_samples > evaluation_rows:
        raise Refusal(
            f"--max_eval_samples {data.max_eval_samples} exceeds the evaluation split's {evaluation_rows} rows; "
            f"pass at most {evaluation_rows}, or leave it out to evaluate on every row"
        )


def _shuffled_by_class(labels: np.ndarray, seed: int) -> list[np.ndarray]:
    """Each class's row numbers (classes in increasing order), shuffled by one generator seeded with `seed`."""
    generator = np.random.default_rng(seed)
    return [generator.permutation(np.flatnonzero(labels == label)) for label in np.unique(labels)]


def few_labels(train: datasets.Dataset, count: int, seed: int) -> datasets.Dataset:
    """`count` training examples drawn as evenly across the classes as they allow (stratified), by `seed`."""
    by_class = _shuffled_by_class(np.asarray(train["labels"]), seed)
    # round by round, one row of each class that still has one: sort by (round, class)
    rounds = sorted(
        (turn, klass, int(row)) for klass, rows in enumerate(by_class) for turn, row in enumerate(rows)
    )
    return train.select(sorted(row for _, _, row in rounds[:count]))


def stratified_folds(
    train: datasets.Dataset, folds: int, seed: int, label_names: list[str]
) -> list[tuple[datasets.Dataset, datasets.Dataset]]:
    """`folds` (held in, held out) pairs of the training rows, each row held out once and every class spread
    evenly over the folds (drawn by `seed`); refuses rows too few for every class to be in every fold.
    Written here because datasets splits off one test share (train_test_split), not k folds."""
    labels = np.asarray(train["labels"])
    counts = collections.Counter(labels.tolist())
    thin = [f"{label_names[label]!r} ({count})" for label, count in sorted(counts.items()) if count < folds]
    if thin:
        raise Refusal(
            f"--learning_rate auto holds out each of {folds} folds of the {len(train)} training rows in turn to "
            f"choose the rate, and {'classes' if len(thin) > 1 else 'class'} {', '.join(thin[:5])} "
            f"{'have' if len(thin) > 1 else 'has'} fewer rows than folds; pass more training rows "
            f"(a larger --max_train_samples), fewer --learning_rate_folds, or a --learning_rate such as 1e-3"
        )
    order = np.concatenate(_shuffled_by_class(labels, seed))
    held_out = [np.sort(order[fold::folds]) for fold in range(folds)]
    every_row = np.arange(len(train))
    return [(train.select(np.setdiff1d(every_row, rows)), train.select(rows)) for rows in held_out]


def encode(
    task: TaskData, split: datasets.Dataset, tokenizer: PreTrainedTokenizerBase, max_seq_length: int
) -> datasets.Dataset:
    """`split` (rows of `task`) as token ids and labels, truncated to `max_seq_length`."""

    def encode_rows(rows: dict[str, list]) -> dict[str, list]:
        pair = rows[task.text_pair_column] if task.text_pair_column else None
        return tokenizer(rows[task.text_column], pair, truncation=True, max_length=max_seq_length)

    return split.map(
        encode_rows, batched=True, remove_columns=[c for c in split.column_names if c != "labels"]
    )
