"""Shared fixtures. Every test is offline: the Hub is never contacted."""

import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from unittest import mock

# Hermetic: no Hub, and a datasets cache of this session's own (subprocesses inherit it).
os.environ["HF_DATASETS_CACHE"] = tempfile.mkdtemp(prefix="hfbert-tests-datasets-")
os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["HF_DATASETS_OFFLINE"] = "1"
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import pytest
import torch
from accelerate.state import AcceleratorState, GradientState

from hfbert import HfBertConfig
from hfbert.checkpointing import MANIFEST_NAME

TINY_VOCAB_SIZE = 1000


def tiny_config(**overrides) -> HfBertConfig:
    """The test model size: 2 layers, hidden 32, 4 heads, vocabulary 1000."""
    sizes = dict(
        vocab_size=TINY_VOCAB_SIZE,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=64,
        max_position_embeddings=128,
    )
    return HfBertConfig(**{**sizes, **overrides})


@pytest.fixture(autouse=True)
def _seed_everything():
    torch.manual_seed(0)


@pytest.fixture(autouse=True)
def _fresh_accelerator_state():
    """Each test's Accelerator starts from nothing: a run or a Trainer earlier in this worker leaves
    accelerate's singletons set, and on CUDA (fp16 picked) a later run in another precision is refused."""
    reset_accelerator_state()
    yield
    reset_accelerator_state()


def reset_accelerator_state() -> None:
    AcceleratorState._reset_state(reset_partial_state=True)
    GradientState._reset_state()


@pytest.fixture(scope="session")
def sample_documents():
    """The shipped WikiText sample as documents (train + validation)."""
    from hfbert.corpus import load_documents
    from hfbert.corpus_arguments import CorpusArguments

    return load_documents(CorpusArguments())


@pytest.fixture(scope="session")
def sample_tokenizer(sample_documents):
    """A WordPiece tokenizer with a 1000-token vocabulary trained on the shipped sample."""
    from hfbert.tokenization import train_tokenizer

    return train_tokenizer(
        sample_documents["train"], vocab_size=TINY_VOCAB_SIZE, min_frequency=2, show_progress=False
    )


@pytest.fixture(scope="module")
def run_inputs(tmp_path_factory, sample_tokenizer) -> dict[str, Path]:
    """A saved tokenizer and a tiny model config for it, shared by every run in this module."""
    folder = tmp_path_factory.mktemp("inputs")
    sample_tokenizer.save_pretrained(folder / "tokenizer")
    tiny_config(vocab_size=len(sample_tokenizer)).save_pretrained(folder / "model-config")
    return {"tokenizer": folder / "tokenizer", "config": folder / "model-config" / "config.json"}


def folder_with_its_own_code(folder, path, marker, part: str = "config"):
    """A copy of `folder` whose config (`part` "config") or tokenizer ("tokenizer") names a class nothing
    registers, with the code for it in the folder; the code writes `marker` when imported (what running a
    folder's code can do)."""
    shutil.copytree(folder, path)
    if part == "config":
        config_file, module = "config.json", "configuration_shipped"
        base, shipped = "BertConfig", "ShippedConfig"
        named = {"model_type": "shipped", "auto_map": {"AutoConfig": f"{module}.{shipped}"}}
    else:
        config_file, module = "tokenizer_config.json", "tokenization_shipped"
        base, shipped = "BertTokenizer", "ShippedTokenizer"
        named = {"tokenizer_class": shipped, "auto_map": {"AutoTokenizer": [f"{module}.{shipped}", None]}}
    config = json.loads((path / config_file).read_text())
    (path / config_file).write_text(json.dumps(config | named))
    (path / f"{module}.py").write_text(
        f"import pathlib\npathlib.Path({str(marker)!r}).write_text('ran')\n"
        f"from transformers import {base}\n\n\nclass {shipped}({base}):\n    model_type = 'shipped'\n"
    )
    return path


@contextmanager
def yes_typed_at_any_prompt() -> Iterator[mock.Mock]:
    """What `echo y | COMMAND` answers transformers' "Do you wish to run the custom code? [y/N]"; yields the
    mock of `input`, so that a test can assert that nothing was asked."""
    with mock.patch("builtins.input", return_value="y") as asked:
        yield asked


DAMAGES = ("truncated", "garbled")


def damage(path, how: str) -> None:
    """Cut `path` to half its size ("truncated"), or overwrite 8 bytes near its start ("garbled": a JSON file
    stops parsing, a safetensors file's header too), keeping its size, as a disk's damage would: its modification
    time kept and, in a checkpoint, its change time no later than the manifest's time (a disk's damage leaves the
    change time as hfbert left it, but a write sets it, so the manifest's time is moved up to it instead; a file
    changed later is the user's)."""
    path = Path(path)
    data, times = path.read_bytes(), path.stat()
    if how == "truncated":
        path.write_bytes(data[: len(data) // 2])
    else:
        path.write_bytes(data[:8] + b'"}]{#!@%' + data[16:])  # ends any string or object
    os.utime(path, ns=(times.st_atime_ns, times.st_mtime_ns))
    for manifest in (folder / MANIFEST_NAME for folder in path.parents):
        if manifest.is_file() and manifest != path:
            changed = max(manifest.stat().st_mtime_ns, path.stat().st_ctime_ns)
            os.utime(manifest, ns=(changed, changed))
            break


@pytest.fixture
def read_only_folder(tmp_path):
    """An empty folder nobody can create files in: chmod for a user, the immutable attribute for root (whom
    permissions do not stop); skipped where neither works."""
    import subprocess

    folder = tmp_path / "read-only"
    folder.mkdir()
    as_root = os.geteuid() == 0
    if as_root:
        subprocess.run(["chattr", "+i", str(folder)], capture_output=True, check=False)
    else:
        folder.chmod(0o555)
    try:
        (folder / "probe").touch()
        (folder / "probe").unlink()
        pytest.skip("cannot make a read-only folder here")
    except OSError:
        pass
    yield folder
    if as_root:
        subprocess.run(["chattr", "-i", str(folder)], check=True)
    else:
        folder.chmod(0o755)


class _CreatesWhenUnpickled:
    """Unpickled, creates the file `path`: what a hostile pickle can do with any code it names."""

    def __init__(self, path) -> None:
        self.path = str(path)

    def __reduce__(self):
        return (open, (self.path, "w"))


def with_pickled_weights(folder: Path, copy: Path, marker: Path) -> Path:
    """A copy of model folder `folder` whose weights are only a pytorch_model.bin that creates `marker` when
    unpickled."""
    import shutil

    shutil.copytree(folder, copy, ignore=shutil.ignore_patterns("*.safetensors"))
    torch.save({"bert.embeddings.word_embeddings.weight": _CreatesWhenUnpickled(marker)}, copy / "pytorch_model.bin")
    return copy


def rewrite_weights(folder: Path, change) -> None:
    """Replace `folder`'s model.safetensors by `change(its tensors)` (a dict of name -> tensor)."""
    from safetensors.torch import load_file, save_file

    path = folder / "model.safetensors"
    save_file(change(load_file(path)), path, metadata={"format": "pt"})


QUERY_WEIGHT = "bert.encoder.layer.0.attention.self.query.weight"


def query_of_another_shape(tensors: dict) -> dict:
    """Layer 0's query projection cut to half its rows: a file that does not fit its config.json."""
    return tensors | {QUERY_WEIGHT: tensors[QUERY_WEIGHT][: len(tensors[QUERY_WEIGHT]) // 2]}


def query_as_int32(tensors: dict) -> dict:
    return tensors | {QUERY_WEIGHT: tensors[QUERY_WEIGHT].to(torch.int32)}
