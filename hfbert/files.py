"""Every crash-safe write of hfbert lives here: one file, one JSON file, a new folder, and a run's final files.

The rule everywhere: write to a hidden temporary place next to the target, then rename (atomic on one file
system), so a crash never leaves a torn or half-written result and never destroys what was there before.
Hidden names (leading dot) are never uploaded and are ignored by every reader.
"""

from __future__ import annotations

import hashlib
import json
import os
import secrets
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

# A set of files for a folder is staged here, then renamed to FINAL_READY once complete (see publish_files).
FINAL_STAGING = ".final-staging"
FINAL_READY = ".final-ready"
# Moved into a run folder last, so a reader never loads new weights with an old config or vice versa.
COMMIT_FILE = "model.safetensors"


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


def write_json_atomic(path: str | os.PathLike, obj: Any) -> Path:
    """Write `obj` as indented, key-sorted JSON to `path` atomically."""
    with atomic_path(path) as temp_path:
        temp_path.write_text(json.dumps(obj, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    return Path(path)


def sha256_file(path: str | os.PathLike) -> str:
    """Hex sha256 of a file, read in 1 MiB chunks."""
    digest = hashlib.sha256()
    with open(path, "rb") as file:
        for chunk in iter(lambda: file.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


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
def staged_files(folder: str | os.PathLike, commit_file: str = COMMIT_FILE) -> Iterator[Path]:
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
    publish_files(folder, commit_file)


def publish_files(folder: str | os.PathLike, commit_file: str = COMMIT_FILE) -> bool:
    """Move a complete `.final-ready` set into `folder` (idempotent: also finishes an interrupted publish).

    The old `commit_file` is removed first and the new one moved in last, so during the moves a reader finds
    no weights at all (a loud error), never new weights beside an old config. Returns whether anything was
    published.
    """
    folder = Path(folder)
    ready = folder / FINAL_READY
    if not ready.is_dir():
        return False
    if (ready / commit_file).exists():
        (folder / commit_file).unlink(missing_ok=True)
    for path in sorted(ready.iterdir(), key=lambda p: p.name == commit_file):
        target = folder / path.name
        if path.is_dir():
            shutil.rmtree(target, ignore_errors=True)
        os.replace(path, target)
    ready.rmdir()
    return True
