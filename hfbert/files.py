"""Every crash-safe write of hfbert lives here: one file, one JSON file, a new folder, and a run's final files;
with them the checks of what a user handed over, and the lock that keeps one run to a folder.

The rule everywhere: write to a hidden temporary place next to the target, then rename (atomic on one file
system), so a crash never leaves a torn or half-written result and never destroys what was there before.
Hidden names (leading dot) are never uploaded and are ignored by every reader.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import re
import secrets
import shutil
import socket
import tempfile
import time
import zipfile
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping
from contextlib import ExitStack, contextmanager, suppress
from itertools import takewhile
from pathlib import Path
from typing import Any

try:
    import fcntl
except ImportError:  # Windows: no flock
    fcntl = None

import torch
from safetensors import SafetensorError, safe_open

from hfbert.errors import CheckpointError, Refusal

# A set of files for a folder is staged here, then renamed to FINAL_READY once complete (see publish_files).
FINAL_STAGING = ".final-staging"
FINAL_READY = ".final-ready"
# The names of the files a run's final folder published, there and earlier (hidden: never uploaded): with its
# checkpoints, what --overwrite_output_dir may replace.
FINAL_RECORD = ".hfbert-final-files.json"
# The names of a run folder's checkpoints (written by hfbert.checkpointing, never uploaded by hfbert.model_card).
CHECKPOINT_PREFIX = "checkpoint-"
# Moved into a run folder last, so a reader never loads new weights with an old config or vice versa.
COMMIT_FILE = "model.safetensors"

# What a failed write raises: OSError, and for a full disk also RuntimeError (torch.save) and SafetensorError
# (safetensors' "Error while serializing: I/O error: No space left on device", not an OSError).
WRITE_ERRORS = (OSError, RuntimeError, SafetensorError)


# How the tokenizers library (Rust) reports a failed write: a plain Exception, "<strerror> (os error <errno>)".
RUST_IO_ERROR = re.compile(r"^(?P<strerror>.+) \(os error (?P<errno>\d+)\)$")


def write_tokenizer(tokenizer: Any, folder: str | os.PathLike) -> None:
    """`tokenizer.save_pretrained(folder)`, whose failed writes raise the OSError they are (the tokenizers library
    raises a plain Exception, which would escape every WRITE_ERRORS handler)."""
    try:
        tokenizer.save_pretrained(folder)
    except Exception as error:
        match = RUST_IO_ERROR.match(str(error)) if type(error) is Exception else None
        if match is None:
            raise
        raise OSError(int(match["errno"]), match["strerror"]) from error


# Less free space than this right after a failed write: the disk is full, whatever the error says (torch.save
# reports a full disk as "unexpected pos 138880 vs 138768").
NEARLY_FULL_BYTES = 64 << 20


def is_disk_full(error: BaseException, folder: str | os.PathLike | None = None) -> bool:
    """Whether `error` (one of `WRITE_ERRORS`) reports a full disk (or quota), or, given the `folder` written
    to, the disk holding it is (nearly) full now: ask before the failed write's leftovers are removed."""
    if isinstance(error, OSError) and error.errno in (errno.ENOSPC, errno.EDQUOT):
        return True
    if "No space left on device" in str(error) or "Disk quota exceeded" in str(error):
        return True
    try:
        return folder is not None and shutil.disk_usage(folder).free < NEARLY_FULL_BYTES
    except OSError:
        return False


def describe_write_failure(error: BaseException, path: str | os.PathLike, disk_full: bool | None = None) -> str:
    """'no space left writing <path>' for a full disk (`is_disk_full(error)` unless `disk_full` says), else
    'writing <path> failed (<error>)'; the file the OSError names, if any, stands for `path`."""
    path = getattr(error, "filename", None) or path
    if is_disk_full(error) if disk_full is None else disk_full:
        return f"no space left writing {path}"
    if isinstance(error, OSError) and error.strerror:
        return f"cannot write {path}: {error.strerror}"
    return f"writing {path} failed ({type(error).__name__}: {error})"


@contextmanager
def atomic_path(path: str | os.PathLike) -> Iterator[Path]:
    """Yield a temporary path next to `path`; once the block succeeds, rename it onto `path`."""
    path = Path(path)
    temp_path = path.with_name(f".{path.name}.tmp-{secrets.token_hex(4)}")
    try:
        yield temp_path
        os.replace(temp_path, path)
    finally:
        temp_path.unlink(missing_ok=True)


def check_folder_writable(folder: str | os.PathLike, flag: str) -> None:
    """Raise a Refusal naming `flag`, the folder and the fix unless a file can be created in `folder` (or,
    while it does not exist yet, in its nearest existing parent). Tries it: os.access says yes to root even on
    a read-only mount."""
    folder = Path(folder).absolute()
    existing = next(path for path in (folder, *folder.parents) if path.exists())
    try:
        with tempfile.NamedTemporaryFile(dir=existing, prefix=".hfbert-write-probe-"):
            pass
    except OSError as error:
        where = "" if existing == folder else f" (it does not exist yet and its parent {existing} is not writable)"
        raise Refusal(
            f"{flag} {folder} cannot be written{where}: {error.strerror or error}; pass a folder you can write "
            "to, or fix its permissions (or free space on its disk)"
        ) from None


def write_json_atomic(path: str | os.PathLike, obj: Any) -> Path:
    """Write `obj` as indented, key-sorted JSON to `path` atomically."""
    with atomic_path(path) as temp_path:
        temp_path.write_text(json.dumps(obj, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    return Path(path)


def sha256_file(path: str | os.PathLike) -> str:
    """Hex sha256 of a file, read in chunks."""
    with open(path, "rb") as file:
        return hashlib.file_digest(file, "sha256").hexdigest()


@contextmanager
def staged_folder(folder: str | os.PathLike) -> Iterator[Path]:
    """Yield an empty hidden folder next to `folder`; when the block succeeds it becomes `folder` in one rename.

    `folder` must not exist or be empty (the caller refuses anything else first). On failure the staging
    folder is removed and `folder` is untouched.
    """
    folder = Path(folder)
    folder.parent.mkdir(parents=True, exist_ok=True)
    # Not tempfile.mkdtemp: its 0700 mode would become the folder's mode.
    staging = folder.parent / f".{folder.name}.tmp-{secrets.token_hex(4)}"
    staging.mkdir()
    try:
        yield staging
        if folder.is_dir() and not any(folder.iterdir()):
            folder.rmdir()
        os.replace(staging, folder)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


@contextmanager
def staged_files(
    folder: str | os.PathLike, commit_file: str = COMMIT_FILE, replacing: Collection[str] = ()
) -> Iterator[Path]:
    """Stage a set of files (a run's model, tokenizer, card, ...; a tokenizer's files) and publish them into
    `folder` as one set, keeping the folder's other files.

    A run folder also holds checkpoints, so it cannot be swapped as a whole; instead: the block writes into
    `.final-staging`; on success that folder is renamed to `.final-ready` (the complete set now exists, in one
    rename), then `publish_files` moves it into place. A crash at any point leaves either the previous
    set, or a complete `.final-ready` that the next run (or `python -m hfbert.push`) publishes.
    """
    folder = Path(folder)
    created = not folder.exists()
    staging = folder / FINAL_STAGING
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    try:
        yield staging
        ready = folder / FINAL_READY
        shutil.rmtree(ready, ignore_errors=True)
        os.replace(staging, ready)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
        if created and not any(folder.iterdir()):  # a failed first save leaves no empty folder behind
            folder.rmdir()
    publish_files(folder, commit_file, replacing)


def recorded_final_files(folder: str | os.PathLike) -> set[str]:
    """The names `FINAL_RECORD` lists in `folder` (none where it is missing or unreadable)."""
    return set(_read_record(Path(folder) / FINAL_RECORD))


def _recorded_entry(path: Path) -> dict[str, Any]:
    """What a record holds of the file `path`: its size and sha256."""
    return {"size": path.stat().st_size, "sha256": sha256_file(path)}


def _as_recorded(path: Path, entry: dict[str, Any] | None) -> bool:
    """Whether `path` is a plain file, byte for byte the one `entry` (`_recorded_entry`; None: unrecorded) holds."""
    if not entry or path.is_symlink() or not path.is_file():
        return False
    return path.stat().st_size == entry.get("size") and sha256_file(path) == entry.get("sha256")


def write_final_record(staging: Path, folder: Path) -> None:
    """Record in `staging` (to be published into `folder`) what a later save, --overwrite_output_dir or push may
    replace: each staged file's size and sha256, and what earlier saves published in `folder` that is left."""
    earlier = {name: entry for name, entry in _read_record(folder / FINAL_RECORD).items() if (folder / name).exists()}
    staged = {
        path.name: _recorded_entry(path)
        for path in sorted(staging.iterdir())
        if path.is_file() and path.name != FINAL_RECORD
    }
    write_json_atomic(staging / FINAL_RECORD, dict(sorted({**earlier, **staged}.items())))


def not_as_published(folder: str | os.PathLike, names: Iterable[str]) -> list[str]:
    """Which of `names`, published in `folder` by its `FINAL_RECORD`, are not as published there: a file of
    another size or sha256 than recorded, whatever its time (`mv` and `cp -p` keep an older one), so a user's file
    or a damaged one, which the user moves out. A record an older hfbert wrote holds names only: there a file
    modified after the record counts as changed (an edit cannot be told from a `cp -r` copy)."""
    folder = Path(folder)
    record = _read_record(folder / FINAL_RECORD)
    try:
        written_ns = (folder / FINAL_RECORD).stat().st_mtime_ns
    except OSError:
        return []
    return [
        name
        for name in names
        if name in record
        and (folder / name).is_file()
        and not (folder / name).is_symlink()
        and (
            not _as_recorded(folder / name, record[name])
            if record[name]
            else (folder / name).stat().st_mtime_ns > written_ns
        )
    ]


# The record of the reports and results that hfbert's tools (inspect, finetune) wrote in a folder: what a rerun
# may replace. Hidden, so never pushed; a user's file, or hfbert's edited since, is not as recorded.
REPORTS_RECORD = ".hfbert-reports.json"


def check_reports_replaceable(folder: Path, names: Iterable[str], flag: str, writer: str) -> None:
    """Refuse, before any work, to let `writer` ("the inspection") replace files of `names` in `folder` that are
    not as `REPORTS_RECORD` records them: a user's file of that name, a link, or hfbert's own edited since."""
    record = _read_record(folder / REPORTS_RECORD)
    theirs = [
        name
        for name in names
        if ((folder / name).exists() or (folder / name).is_symlink()) and not _as_recorded(folder / name, record.get(name))
    ]
    if theirs:
        raise Refusal(
            f"{flag} {folder} holds {', '.join(theirs)}, which {writer} would replace and which hfbert did not "
            f"write as {'they are' if len(theirs) > 1 else 'it is'} (a file of yours, or one changed since: "
            f"{REPORTS_RECORD} there records what hfbert wrote): move {'them' if len(theirs) > 1 else 'it'} out of "
            "the folder, or pass another --output_dir"
        )


def record_reports(folder: Path, paths: Iterable[Path]) -> None:
    """Add the files `paths` (just written in `folder`) to its `REPORTS_RECORD`, keeping entries of files still
    there as recorded."""
    record = _read_record(folder / REPORTS_RECORD)
    kept = {name: entry for name, entry in record.items() if _as_recorded(folder / name, entry)}
    written = {path.name: _recorded_entry(path) for path in paths}
    write_json_atomic(folder / REPORTS_RECORD, dict(sorted({**kept, **written}.items())))


def _read_record(path: Path) -> dict[str, Any]:
    """A record of files at `path` (`FINAL_RECORD`, `REPORTS_RECORD`): name -> `_recorded_entry` ({} for each name
    of an older hfbert's names-only record, a list); {} where it is missing, unreadable or not one."""
    try:
        record = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    if isinstance(record, list):
        return {name: {} for name in record if isinstance(name, str)}
    return {name: entry for name, entry in record.items() if isinstance(entry, dict)} if isinstance(record, dict) else {}


def not_replaceable(folder: str | os.PathLike, names: Iterable[str]) -> dict[str, str]:
    """Which of `names` in `folder` a save of hfbert's may not replace, each with how a refusal names it: all but
    files its `FINAL_RECORD` lists as published there (a link or a folder at such a name, or a file not as
    published, `not_as_published`, is the user's)."""
    folder = Path(folder)
    present = [name for name in names if (folder / name).exists() or (folder / name).is_symlink()]
    published, changed = recorded_final_files(folder), set(not_as_published(folder, present))
    theirs = {}
    for name in present:
        if name not in published:
            theirs[name] = name
        elif (folder / name).is_symlink():  # hfbert publishes regular files only
            theirs[name] = f"{name} (a link)"
        elif (folder / name).is_dir():
            theirs[name] = f"{name} (a folder)"
        elif name in changed:
            theirs[name] = f"{name} (changed since hfbert wrote it)"
    return theirs


# The largest file whose sha256 `changed_since` takes: the JSON and text a user edits, never the weights.
_HASHED_EDIT_BYTES = 1 << 20


def changed_since(path: Path, recorded: dict[str, Any], written_ns: int) -> bool:
    """Whether the file `path`, recorded (`recorded`: its size and sha256) by a record written last at
    `written_ns`, was changed after it: its inode changed later and it is no longer as recorded. The change time
    tells a user's edit or file put in place (an edit, `mv`, `cp -p` and `ln` all set it, even where they keep an
    older modification time) from a disk's damage (which leaves it), the record an edit from a copy (`cp -r`:
    every file newer, none changed)."""
    stat = path.stat()
    if path.is_symlink() or stat.st_ctime_ns <= written_ns:
        return False
    if stat.st_size != recorded["size"]:
        return True
    return stat.st_size <= _HASHED_EDIT_BYTES and sha256_file(path) != recorded.get("sha256")


def publish_files(folder: str | os.PathLike, commit_file: str = COMMIT_FILE, replacing: Collection[str] = ()) -> bool:
    """Move a complete `.final-ready` set into `folder` (idempotent: also finishes an interrupted publish).

    The old `commit_file` is removed first and the new one moved in last, so during the moves a reader finds
    no weights at all (a loud error), never new weights beside an old config. A file of the user's at one of its
    names is refused (`not_replaceable`) unless the user asked to replace files of that name (`replacing`).
    Returns whether anything was published.
    """
    folder = Path(folder)
    ready = folder / FINAL_READY
    if not ready.is_dir():
        return False
    # Checked again here, not only before work: a user may have written a file at one of the names meanwhile.
    names = [path.name for path in ready.iterdir() if path.name != FINAL_RECORD and path.name not in replacing]
    if theirs := not_replaceable(folder, names):
        raise CheckpointError(
            f"The new files are complete in {ready} but not published: {folder} holds {', '.join(theirs.values())}, which "
            f"hfbert did not write there and publishing would replace: move {'it' if len(theirs) == 1 else 'them'} "
            "out of the folder, then rerun the command (a training run with --resume_from_checkpoint latest), "
            "which publishes them first"
        )
    if (ready / commit_file).exists():
        (folder / commit_file).unlink(missing_ok=True)
    # The record last: an interrupted publish leaves the old one, which the files still to move are as.
    for path in sorted(ready.iterdir(), key=lambda p: (p.name == FINAL_RECORD, p.name == commit_file)):
        os.replace(path, folder / path.name)
    ready.rmdir()
    return True


# ----------------------------------------------------------------------------------------------------------
# Reading what a user handed over or a run left behind: a damaged file is named, with what is wrong and the fix,
# instead of a JSONDecodeError or SafetensorError from deep inside a library.
# ----------------------------------------------------------------------------------------------------------


# The fix for a damaged file in a run's output folder (or a copy of one).
FINAL_FOLDER_FIX = (
    "rewrite the folder: move the damaged file out of it, then rerun the training command with "
    "--resume_from_checkpoint latest (a run resumed at its last step goes straight to the final save), or copy "
    "or download the folder again"
)


def _unreadable(path: Path, problem: str, fix: str) -> Refusal:
    return Refusal(f"{path} {problem}; {fix}")


# Why json.loads raised RecursionError (its parser recurses once a nesting level).
JSON_TOO_DEEP = "nested deeper than Python's JSON parser reads"


def read_json(path: str | os.PathLike, fix: str) -> Any:
    """The parsed JSON in `path`; a Refusal naming the file, whether it is empty, truncated or not JSON
    at all, and `fix` (what the user can do), if it cannot be parsed."""
    path = Path(path)
    raw = path.read_bytes()
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as error:
        raise _unreadable(path, f"is not JSON: not UTF-8 text (byte {error.start})", fix) from None
    if not text.strip():
        raise _unreadable(path, "is empty (a write was cut short)", fix)
    try:
        return json.loads(text)
    except RecursionError:
        raise _unreadable(path, f"is not valid JSON ({JSON_TOO_DEEP})", fix) from None
    except json.JSONDecodeError as error:
        ran_out = error.pos >= len(text.rstrip()) or error.msg.startswith("Unterminated string")
        if ran_out:  # the text stops mid-value: a cut-short write or copy
            problem = f"is truncated: its JSON stops mid-value after {len(raw)} bytes"
        else:
            problem = f"is not valid JSON ({error.msg} at line {error.lineno}, column {error.colno})"
        raise _unreadable(path, problem, fix) from None


# The last part of a trained parameter's name (gamma and beta: LayerNorm in old BERT files); buffers such as
# old BERT files' position_ids are integers.
WEIGHT_NAMES = ("weight", "bias", "gamma", "beta")


def check_safetensors(path: str | os.PathLike, fix: str) -> None:
    """Raise a Refusal naming `path`, what is wrong (truncated, not safetensors, a weight that is not floating
    point) and `fix`, unless its header parses, the tensors it lists fit the file exactly and every weight
    (`WEIGHT_NAMES`) is floating point. Reads the header only, not the tensors."""
    path = Path(path)
    size = path.stat().st_size
    with open(path, "rb") as file:
        header_size = int.from_bytes(file.read(8), "little")  # fewer than 8 bytes: the size check refuses
        if 8 + header_size > size:
            problem = "is truncated or not a safetensors file: " if size else "is empty: "
            raise _unreadable(path, f"{problem}{size} bytes, too short for its header", fix)
        header_bytes = file.read(header_size)
    try:
        header = json.loads(header_bytes)
        ends = [entry["data_offsets"][1] for name, entry in header.items() if name != "__metadata__"]
    except (ValueError, TypeError, KeyError, IndexError, AttributeError, RecursionError):
        raise _unreadable(path, "is not a safetensors file (its header is not safetensors JSON)", fix) from None
    expected = 8 + header_size + max(ends, default=0)
    if expected != size:
        state = "truncated" if size < expected else "longer than its header says"
        raise _unreadable(path, f"is {state}: {size} bytes, its header lists {expected}", fix)
    try:  # what the size checks cannot see: dtypes, shapes and offsets that disagree
        with safe_open(path, framework="pt"):
            pass
    except SafetensorError as error:
        raise _unreadable(path, f"is not a valid safetensors file ({error})", fix) from None
    for name, entry in header.items():  # from_pretrained would cast integer weights to float without a word
        if name.rsplit(".", 1)[-1] in WEIGHT_NAMES and not entry["dtype"].startswith(("F", "BF")):
            problem = f"holds the weight {name} as {entry['dtype']}, not floating point"
            raise _unreadable(path, f"{problem} (a model's weights are F32, F16 or BF16)", fix)


def check_readable(paths: Iterable[str | os.PathLike], fix: str, *, torch_files: bool = False) -> None:
    """`read_json` every existing *.json and `check_safetensors` every existing *.safetensors in `paths`
    (missing files are the caller's to report); with `torch_files`, refuse every *.bin / *.pkl that does not
    end like a `torch.save` file (a zip archive whose central directory is intact: a cut-short copy loses it;
    torch >= 1.6 writes them so)."""
    for path in map(Path, paths):
        if not path.is_file():
            continue
        if path.suffix == ".json":
            read_json(path, fix)
        elif path.suffix == ".safetensors":
            check_safetensors(path, fix)
        elif torch_files and path.suffix in (".bin", ".pkl") and not zipfile.is_zipfile(path):
            raise _unreadable(path, "is truncated or not a torch.save file (no zip directory at its end)", fix)


def check_folder_readable(folder: str | os.PathLike, fix: str) -> None:
    """`check_readable` on the JSON and safetensors files at the top of `folder` (hidden files skipped)."""
    check_readable(sorted(path for path in Path(folder).iterdir() if not path.name.startswith(".")), fix)


def check_local_files(name_or_path: str | os.PathLike, flag: str, fix: str) -> None:
    """For a flag naming a local file or folder (a Hub id is left to its loader): a Refusal starting with
    `flag` and the value, naming a truncated or garbled JSON / safetensors file in it, and `fix`."""
    path = Path(name_or_path).expanduser()
    try:
        if path.is_file():
            read_json(path, fix)  # --config_name's one-file form: a config.json
        elif path.is_dir():
            check_folder_readable(path, fix)
    except ValueError as error:
        raise Refusal(f"{flag} {name_or_path}: {error}") from None


def looks_like_local_path(name: str) -> bool:
    """Whether a value that may be a local path or a Hub repo id ('bert-base-uncased', 'owner/name') can only
    mean a local path: it starts with '.', '/' or '~', has more than one separator, or its parent folder exists."""
    if name.startswith((".", "/", "~")) or name.count(os.sep) > 1:
        return True
    parent = Path(name).parent
    return parent != Path(".") and parent.is_dir()


def check_local_path_exists(name: str, flag: str, fix: str, kind: str = "folder") -> None:
    """Refuse a value that looks like a local path (`looks_like_local_path`) but names nothing, before a loader
    reports it as a bad Hub repo id or a failed Hub connection. Hub ids pass untouched."""
    path = Path(name).expanduser()
    if path.exists() or not looks_like_local_path(name):
        return
    raise Refusal(f"{flag} {name}: no such {kind} ({path.absolute()}); {fix}")


# ----------------------------------------------------------------------------------------------------------
# A saved model folder (a run's final folder, a checkpoint's, any transformers model's): what each command that
# reads one checks it holds before loading, refusing in its own words.
# ----------------------------------------------------------------------------------------------------------

# A model's weights: one safetensors file, a sharded model's index, or a torch.save file.
SAFETENSORS_WEIGHT_FILES = ("model.safetensors", "model.safetensors.index.json")
WEIGHT_FILES = (*SAFETENSORS_WEIGHT_FILES, "pytorch_model.bin")
# torch.save's weights (one file, or a sharded model's index): loading them unpickles them.
PICKLED_WEIGHT_FILES = ("pytorch_model.bin", "pytorch_model.bin.index.json")
# A tokenizer's vocabulary: tokenizer_config.json alone holds none.
TOKENIZER_FILES = ("tokenizer.json", "vocab.txt")


def holds_weights(folder: str | os.PathLike) -> bool:
    """Whether `folder` holds a model's weights (one of `WEIGHT_FILES`)."""
    return any((Path(folder) / name).is_file() for name in WEIGHT_FILES)


def refuse_pickled_weights(folder: str | os.PathLike, where: str) -> None:
    """Refuse a folder whose weights are a pickle only (`PICKLED_WEIGHT_FILES`, no safetensors beside them), or
    whose safetensors index names a shard that is no safetensors file in it: transformers' loader unpickles such a
    file (torch's restricted unpickler, whose refusals are tracebacks), and unpickling a hostile file can run its
    code. Every command that loads weights asks this first."""
    folder = Path(folder)
    if (folder / "model.safetensors").is_file():
        return
    index = folder / "model.safetensors.index.json"
    if index.is_file():
        _refuse_unsafe_shards(index, where)
        return
    pickled = next((name for name in PICKLED_WEIGHT_FILES if (folder / name).is_file()), None)
    if pickled is not None:
        raise Refusal(
            f"{where}: its weights are {pickled}, a pickle (torch.save's format), which hfbert never loads: "
            "unpickling a file can run any code it holds; convert it to model.safetensors where you trust it "
            "(from_pretrained with the model's class, then save_pretrained), or download the model's safetensors"
        )


def _refuse_unsafe_shards(index: Path, where: str) -> None:
    """A safetensors index whose weight_map names a shard that is no safetensors file in its folder (a pickle,
    which transformers' loader would unpickle, or a path out of the folder) is refused, naming it."""
    try:
        weight_map = json.loads(index.read_text(encoding="utf-8"))["weight_map"]
        shards = sorted(set(weight_map.values()))
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return  # unreadable: transformers refuses it, and no shard is named to load
    for shard in shards:
        if not isinstance(shard, str) or not shard.endswith(".safetensors") or Path(shard).name != shard:
            raise Refusal(
                f"{where}: its {index.name} names {shard} as a weight shard, which is no safetensors file beside "
                "it: hfbert loads weights only from safetensors files in the folder; download the model's "
                "safetensors shards, or save it again with save_pretrained where you trust it"
            )


def holds_model(folder: str | os.PathLike) -> bool:
    """Whether `folder` holds a saved model: its config.json and its weights."""
    return (Path(folder) / "config.json").is_file() and holds_weights(folder)


def holds_tokenizer(folder: str | os.PathLike) -> bool:
    """Whether `folder` holds a tokenizer's vocabulary (one of `TOKENIZER_FILES`)."""
    return any((Path(folder) / name).is_file() for name in TOKENIZER_FILES)


# Weights a folder may lack and still be the model it says: heads, which start fresh or are the task's own (a
# BertForMaskedLM folder lacks the NSP head and the pooler).
HEAD_WEIGHT_PREFIXES = ("cls.", "bert.pooler.", "classifier.", "qa_outputs.")


# How every command that checks what it loaded calls from_pretrained: weights of another shape reported in the
# loading info (not raised as a RuntimeError), and never a pickle (`refuse_pickled_weights`).
LOAD_CHECKED = {"output_loading_info": True, "ignore_mismatched_sizes": True, "use_safetensors": True}


def check_weights_loaded(folder: str, loading_info: Mapping[str, Any], fix: str) -> None:
    """Refuse a model (from_pretrained with `LOAD_CHECKED`) whose encoder weights were not all in `folder` (e.g. a
    config.json with more layers than model.safetensors holds) or any of whose weights has another shape there
    than its config.json asks for: from_pretrained fills them with random values and carries on."""
    body = [key for key in loading_info["missing_keys"] if not key.startswith(HEAD_WEIGHT_PREFIXES)]
    if body:
        shown = ", ".join(body[:4]) + (", ..." if len(body) > 4 else "")
        raise Refusal(f"{folder} lacks encoder weights that its config.json asks for ({shown}); {fix}")
    mismatched = sorted(loading_info["mismatched_keys"])
    if mismatched:
        shown = ", ".join(
            f"{key}: {list(in_file)} in the file, {list(in_model)} in the model"
            for key, in_file, in_model in mismatched[:2]
        )
        more = f", and {len(mismatched) - 2} more" if len(mismatched) > 2 else ""
        raise Refusal(f"{folder} holds weights of other shapes than its config.json asks for ({shown}{more}); {fix}")


# A weight beyond this is no trained model's: training from it ends in a NaN loss at the first step.
ABSURD_WEIGHT = 1e4


def check_weights_usable(where: str, weights: Mapping[str, torch.Tensor]) -> None:
    """Refuse, naming the tensor, weights (a state dict) that are not finite or far beyond any trained model's
    (|w| > `ABSURD_WEIGHT`): training from them ends in a NaN loss at the first step, blamed on the learning
    rate, and fine-tuning in a fit that looks collapsed."""
    for tensor_name, tensor in weights.items():
        if not tensor.is_floating_point() or not tensor.numel():
            continue
        if not bool(tensor.isfinite().all()):
            problem = f"{int((~tensor.isfinite()).sum())} non-finite values (nan or inf)"
        elif (largest := float(tensor.abs().max())) > ABSURD_WEIGHT:
            problem = f"|weight| up to {largest:.3g} (above {ABSURD_WEIGHT:g}, far beyond a trained model's)"
        else:
            continue
        raise Refusal(
            f"{where}: its weights are unusable: {tensor_name} holds {problem}; start from an earlier checkpoint "
            "of the run that wrote them, or from another model"
        )


# How transformers says that only a folder's own Python loads it: the end of the ValueError that
# `from_pretrained(..., trust_remote_code=False)` raises. Left at None, it asks "run the custom code? [y/N]"
# on stdin instead, and `echo y | ...` runs the folder's code: hfbert passes False wherever the user did not ask.
REMOTE_CODE_MARK = "trust_remote_code=True"
# What a command without --trust_remote_code says to do about such a folder.
NO_FOLDER_CODE_FIX = (
    "hfbert runs a folder's own code only in `python -m hfbert.finetune --trust_remote_code`: pass an hfbert "
    "run's folder or a BERT folder, whose model and tokenizer transformers knows"
)


def folder_code_refusal(where: str, what: str, fix: str = NO_FOLDER_CODE_FIX) -> Refusal:
    """The refusal of a folder whose `what` (its model type, its tokenizer) only the Python it ships defines."""
    return Refusal(
        f"{where}: its {what} is not one transformers or hfbert knows, and loading it would run the Python code "
        f"the folder ships; {fix}"
    )


@contextmanager
def running_no_folder_code(where: str, what: str, fix: str = NO_FOLDER_CODE_FIX) -> Iterator[None]:
    """Around a `from_pretrained(..., trust_remote_code=False)`: transformers' refusal to run the folder's own
    code as `folder_code_refusal`, one line; every other error as it is."""
    try:
        yield
    except ValueError as error:
        if REMOTE_CODE_MARK not in str(error):
            raise
        raise folder_code_refusal(where, what, fix) from None


# ----------------------------------------------------------------------------------------------------------
# One run per folder: the lock a pretraining run (or a tokenizer's training) holds on its output folder.
# ----------------------------------------------------------------------------------------------------------

# Held (flock) by the run writing into a folder; hidden, so never uploaded and not one of the user's files.
RUN_LOCK_NAME = ".hfbert-run.lock"


def _folder_in_use(lock_path: Path) -> CheckpointError:
    """The refusal of a second run, naming the holder as far as its lock file tells."""
    try:
        holder = json.loads(lock_path.read_text(encoding="utf-8"))
        holder = f"pid {holder['pid']} on host {holder['host']}, started {holder['started']}"
    except FileNotFoundError:
        holder = f"a run whose {lock_path.name} was deleted"
    except (OSError, ValueError, KeyError, TypeError):  # the holder is still writing it
        holder = "a process that is still starting"
    return CheckpointError(
        f"--output_dir {lock_path.parent} is in use by another training run ({holder}); "
        "wait for it to finish or stop it, or pass another --output_dir. Two runs in one folder would "
        "overwrite each other's checkpoints"
    )


def _flock(fd: int, lock_path: Path) -> None:
    """Take `fd`'s exclusive flock; if another run holds it, close `fd` and refuse naming that run."""
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise _folder_in_use(lock_path) from None


def _lock_folder_itself(output_dir: Path) -> int | None:
    """A descriptor of `output_dir` holding its exclusive flock, which deleting the lock file cannot release.
    None where the filesystem cannot flock a directory (NFS turns flock into POSIX locks, which need a writable
    descriptor): the lock file alone holds the folder there."""
    fd = os.open(output_dir, os.O_RDONLY | os.O_DIRECTORY)
    try:
        _flock(fd, output_dir / RUN_LOCK_NAME)
    except OSError:
        os.close(fd)
        return None
    return fd


def check_run_folder_free(output_dir: str | os.PathLike) -> None:
    """Refuse an `output_dir` that another run holds (`run_folder_lock`) without taking it or writing anything:
    what --dry_run checks in place of the lock."""
    output_dir = Path(output_dir)
    if fcntl is not None and output_dir.is_dir():
        fd = _lock_folder_itself(output_dir)
        if fd is not None:
            os.close(fd)


def _open_locked(lock_path: Path) -> int:
    """A descriptor of `lock_path` holding its exclusive flock; raises `CheckpointError` if another run holds it."""
    while True:
        fd = os.open(lock_path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o644)  # a link made since: ELOOP
        _flock(fd, lock_path)
        with suppress(FileNotFoundError):  # a removed lock file is not the one locked
            if os.fstat(fd).st_ino == os.stat(lock_path).st_ino:
                return fd
        os.close(fd)  # the previous holder removed the file between our open and flock: lock the new one


def _not_a_lock_file(lock_path: Path) -> str | None:
    """What `lock_path` is where it is no file this run may write: a link, a hard link (another name of a file
    elsewhere) or no plain file; None where it is missing or a plain file of one name."""
    if lock_path.is_symlink():
        return "a link"
    if not lock_path.exists():
        return None
    if not lock_path.is_file():
        return "no plain file"
    links = lock_path.stat().st_nlink
    return f"a file with {links} links (a hard link)" if links > 1 else None


def _not_its_lock(lock_path: Path, problem: str) -> CheckpointError:
    """The refusal of a run whose lock file is `problem` (`_not_a_lock_file`, `_NO_RUN_LOCK`): left as it is."""
    return CheckpointError(
        f"--output_dir {lock_path.parent}: {lock_path} is {problem}, where hfbert keeps its run lock (a plain file "
        "it writes and removes): remove it, then rerun"
    )


# What a lock file holding something else is: a user's file of that name, never emptied or removed.
_NO_RUN_LOCK = "a file that holds no run lock (hfbert writes its pid, host and start time there)"


def _holds_a_run_lock(fd: int) -> bool:
    """Whether the locked file `fd` is one `run_folder_lock` wrote: empty (a holder that died before writing)
    or naming its holder. Read holding its flock, so no holder is writing it meanwhile."""
    text = os.pread(fd, 4096 + 1, 0)
    if not text.strip():
        return True
    try:
        holder = json.loads(text)
    except ValueError:
        return False
    return isinstance(holder, dict) and set(holder) == set(_lock_holder())


def _lock_holder() -> dict[str, Any]:
    """What a run writes in its lock file: who holds the folder (as the refusal of a second run names it)."""
    return {"pid": os.getpid(), "host": socket.gethostname(), "started": time.strftime("%Y-%m-%d %H:%M:%S %Z")}


def _missing_folders(folder: Path) -> list[Path]:
    """`folder` and those of its parents that do not exist yet, deepest first: what mkdir(parents=True) creates."""
    folder = folder.absolute()
    return list(takewhile(lambda path: not path.exists(), (folder, *folder.parents)))


def _remove_if_empty(created: list[Path]) -> None:
    """Remove the folders a run created (deepest first) while they are empty: a refused or failed run leaves
    nothing of its own behind, and never touches a folder the user had."""
    for path in created:
        if not path.is_dir() or any(path.iterdir()):
            return
        path.rmdir()


@contextmanager
def run_folder_lock(output_dir: str | os.PathLike, first: Callable[[Path], Any] = lambda folder: None) -> Iterator[None]:
    """Hold `output_dir` for this run: a second run on the same folder is refused with `CheckpointError`
    naming the holder's pid, host and start time.

    The lock is a flock on the folder (created if needed) and on `output_dir/.hfbert-run.lock`, which names the
    holder; the kernel releases both when the holder dies, even by SIGKILL: a crashed run never blocks the
    next, and a deleted lock file does not let a second run in. Take it on the main process only, before
    anything else reads or writes the folder: holding it, the run does `first(output_dir)` before anything else
    (a pretraining run finishes a same-step checkpoint replace that a crash interrupted). On exit the lock file
    is removed, and the folder too if this run created it and left nothing in it (with the parents it created).
    """
    output_dir = Path(output_dir)
    if fcntl is None or (output_dir.exists() and not output_dir.is_dir()):
        yield  # a file in the way is refused by check_run_folder, with the fix
        return
    check_folder_writable(output_dir, "--output_dir")  # named here, not as a raw OSError on the lock file
    created = _missing_folders(output_dir)
    output_dir.mkdir(parents=True, exist_ok=True)
    lock_path = output_dir / RUN_LOCK_NAME
    if problem := _not_a_lock_file(lock_path):  # never written through: it may be another file's name
        raise _not_its_lock(lock_path, problem)
    with ExitStack() as release:  # undone last to first, also where taking the lock file's flock fails
        folder_fd = _lock_folder_itself(output_dir)
        if folder_fd is not None:
            release.callback(os.close, folder_fd)
        fd = _open_locked(lock_path)
        release.callback(os.close, fd)
        if not _holds_a_run_lock(fd):
            raise _not_its_lock(lock_path, _NO_RUN_LOCK)
        release.callback(_remove_if_empty, created)
        # Removed while still held: a run that opened it meanwhile sees another inode and locks a new file.
        release.callback(lock_path.unlink, missing_ok=True)
        # Written in place, not via a renamed temporary file: the flock belongs to this file's inode.
        os.ftruncate(fd, 0)
        os.write(fd, (json.dumps(_lock_holder()) + "\n").encode("utf-8"))
        first(output_dir)  # the holder's first act: a crashed holder may have left work half done
        yield
