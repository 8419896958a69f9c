"""hfbert.files: every crash-safe write (file, JSON, new folder, a run's final files), the checks of what a user
handed over, and the lock of one run per folder."""

import errno
import fcntl
import hashlib
import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
from pathlib import Path
from unittest import mock

import pytest
import torch
from conftest import DAMAGES, damage, tiny_config
from safetensors.torch import save_file

from hfbert import HfBertForPreTraining
from hfbert.checkpointing import check_run_folder
from hfbert.errors import CheckpointError, Refusal
from hfbert.files import (
    FINAL_READY,
    FINAL_RECORD,
    NEARLY_FULL_BYTES,
    RUN_LOCK_NAME,
    _folder_in_use,
    atomic_path,
    check_folder_writable,
    check_local_files,
    check_local_path_exists,
    check_readable,
    check_safetensors,
    describe_write_failure,
    holds_model,
    holds_tokenizer,
    is_disk_full,
    looks_like_local_path,
    publish_files,
    read_json,
    refuse_pickled_weights,
    run_folder_lock,
    sha256_file,
    staged_files,
    staged_folder,
    write_json_atomic,
)


def test_write_json_atomic(tmp_path):
    path = write_json_atomic(tmp_path / "eval_results.json", {"b": 1.5, "a": [1, 2]})
    # indented and key-sorted: a diff between two runs' files shows only the values that changed
    assert path.read_text() == '{\n  "a": [\n    1,\n    2\n  ],\n  "b": 1.5\n}\n'
    assert [p.name for p in tmp_path.iterdir()] == ["eval_results.json"]


def test_a_failed_atomic_write_keeps_the_old_file(tmp_path):
    path = tmp_path / "notes.txt"
    path.write_text("old")
    with pytest.raises(RuntimeError), atomic_path(path) as temp:
        temp.write_text("half")
        raise RuntimeError("crash")
    assert path.read_text() == "old" and [p.name for p in tmp_path.iterdir()] == ["notes.txt"]


def test_staged_folder_appears_whole_or_not_at_all(tmp_path):
    with pytest.raises(RuntimeError), staged_folder(tmp_path / "out") as staging:
        (staging / "a.txt").write_text("a")
        raise RuntimeError("crash")
    assert list(tmp_path.iterdir()) == []
    with staged_folder(tmp_path / "out") as staging:
        (staging / "a.txt").write_text("a")
    assert [p.name for p in (tmp_path / "out").iterdir()] == ["a.txt"]
    assert [p.name for p in tmp_path.iterdir()] == ["out"]


def write_set(folder, tag):
    for name in ("config.json", "model.safetensors", "README.md"):
        (folder / name).write_text(tag)


def test_final_files_replace_the_previous_set_and_keep_other_files(tmp_path):
    from hfbert.files import write_final_record

    write_set(tmp_path, "old")
    write_final_record(tmp_path, tmp_path)  # as hfbert published it
    (tmp_path / "checkpoint-4").mkdir()
    with staged_files(tmp_path) as staging:
        write_set(staging, "new")
    assert {p.name: p.read_text() for p in tmp_path.iterdir() if p.is_file() and p.name != FINAL_RECORD} == dict.fromkeys(
        ("config.json", "model.safetensors", "README.md"), "new"
    )
    assert sorted(p.name for p in tmp_path.iterdir() if p.is_dir()) == ["checkpoint-4"]


def test_a_crash_while_staging_leaves_the_previous_set(tmp_path):
    write_set(tmp_path, "old")
    with pytest.raises(RuntimeError), staged_files(tmp_path) as staging:
        (staging / "config.json").write_text("new")
        raise RuntimeError("crash")
    assert {p.name for p in tmp_path.iterdir()} == {"config.json", "model.safetensors", "README.md"}
    assert all(p.read_text() == "old" for p in tmp_path.iterdir())


def test_an_interrupted_publish_never_mixes_sets_and_is_finished_later(tmp_path):
    from hfbert.files import write_final_record

    write_set(tmp_path, "old")
    write_final_record(tmp_path, tmp_path)  # as hfbert published it
    moved = []
    real_replace = __import__("os").replace

    def replace_then_crash(source, target):
        moved.append(target)
        if len(moved) == 2:
            raise OSError("killed")
        real_replace(source, target)

    with mock.patch("hfbert.files.os.replace", replace_then_crash):
        (tmp_path / FINAL_READY).mkdir()
        write_set(tmp_path / FINAL_READY, "new")
        with pytest.raises(OSError):
            publish_files(tmp_path)
    # Mid-publish: the old weights are gone, so no reader loads new config + old weights (or the reverse).
    assert not (tmp_path / "model.safetensors").exists()
    assert publish_files(tmp_path)  # the next run (or hfbert.push) finishes the job
    assert all(p.read_text() == "new" for p in tmp_path.iterdir() if p.name != FINAL_RECORD)
    assert not publish_files(tmp_path)


# ------------------------------------------------------------------------------------------- damaged files


@pytest.mark.parametrize("how", DAMAGES)
def test_a_damaged_json_file_is_named_with_the_problem_and_the_fix(tmp_path, how):
    path = write_json_atomic(tmp_path / "eval_results.json", {"eval_mlm_loss": 2.5, "step": 10, "x": "y" * 40})
    assert read_json(path, "FIX")["step"] == 10
    damage(path, how)
    with pytest.raises(ValueError) as error:
        read_json(path, "rerun it")
    problem = "is truncated" if how == "truncated" else "is not valid JSON"
    assert str(error.value).startswith(f"{path} {problem}") and str(error.value).endswith("; rerun it")


@pytest.mark.parametrize(
    ("content", "problem"),
    [
        (b"", "is empty (a write was cut short)"),
        (b"{}\xff", "is not JSON: not UTF-8 text (byte 2)"),
        # a cut inside a string: the parser stops at the string's start, not at the end of the text
        (b'{"a": "abc', "is truncated: its JSON stops mid-value after 10 bytes"),
    ],
)
def test_an_empty_binary_or_cut_json_file_is_named(tmp_path, content, problem):
    (tmp_path / "config.json").write_bytes(content)
    with pytest.raises(ValueError) as error:
        read_json(tmp_path / "config.json", "FIX")
    assert str(error.value) == f"{tmp_path / 'config.json'} {problem}; FIX"


@pytest.mark.parametrize("how", [*DAMAGES, "longer", "not safetensors"])
def test_a_damaged_safetensors_file_is_named_with_the_problem_and_the_fix(tmp_path, how):
    HfBertForPreTraining(tiny_config()).save_pretrained(tmp_path)
    path = tmp_path / "model.safetensors"
    check_safetensors(path, "FIX")
    if how == "longer":
        path.write_bytes(path.read_bytes() + b"extra")
    elif how == "not safetensors":
        path.write_text("version https://git-lfs.github.com/spec/v1\noid sha256:abc\nsize 123\n")
    else:
        damage(path, how)
    problem = {
        "truncated": "is truncated: ",
        "garbled": "is not a safetensors file",
        "longer": "is longer than its header says",
        "not safetensors": "is truncated or not a safetensors file",
    }[how]
    with pytest.raises(ValueError) as error:
        check_safetensors(path, "download it again")
    assert str(error.value).startswith(f"{path} {problem}") and str(error.value).endswith("; download it again")


# ------------------------------------------------------------------------------------------- failed writes


def free_bytes(free):
    return mock.patch("hfbert.files.shutil.disk_usage", return_value=mock.Mock(free=free))


def test_a_full_disk_is_told_by_its_errno_its_message_or_the_free_space_left(tmp_path):
    assert is_disk_full(OSError(errno.ENOSPC, "x")) and is_disk_full(OSError(errno.EDQUOT, "x"))
    assert is_disk_full(RuntimeError("I/O error: No space left on device"))
    assert is_disk_full(RuntimeError("Disk quota exceeded (os error 122)"))
    denied = OSError(errno.EACCES, "Permission denied")
    assert not is_disk_full(denied) and not is_disk_full(RuntimeError("unexpected pos 138880 vs 138768"))
    with free_bytes(NEARLY_FULL_BYTES - 1):
        assert is_disk_full(denied, tmp_path) and not is_disk_full(denied)
    with free_bytes(NEARLY_FULL_BYTES):
        assert not is_disk_full(denied, tmp_path)
    assert not is_disk_full(denied, tmp_path / "gone")  # disk_usage's own OSError: not a full disk


def test_a_failed_write_is_described_by_what_went_wrong_and_the_file_it_names(tmp_path):
    path = tmp_path / "model.safetensors"
    full = OSError(errno.ENOSPC, "No space left on device")
    assert describe_write_failure(full, path) == f"no space left writing {path}"
    assert describe_write_failure(full, path, disk_full=False) == f"cannot write {path}: No space left on device"
    denied = PermissionError(errno.EACCES, "Permission denied", str(tmp_path / "optimizer.bin"))
    assert describe_write_failure(denied, path) == f"cannot write {tmp_path / 'optimizer.bin'}: Permission denied"
    assert describe_write_failure(RuntimeError("boom"), path) == f"writing {path} failed (RuntimeError: boom)"
    assert describe_write_failure(RuntimeError("boom"), path, disk_full=True) == f"no space left writing {path}"


def refuse_probe(*args, **kwargs):
    raise PermissionError(errno.EACCES, "Permission denied")


def test_an_unwritable_output_folder_is_refused_naming_the_flag_the_folder_and_the_fix(tmp_path):
    check_folder_writable(tmp_path / "new" / "run", "--output_dir")  # a folder to be made in a writable one
    assert list(tmp_path.iterdir()) == []  # the probe leaves nothing behind
    # Root writes anywhere (chmod does not stop it): the probe's failure is simulated.
    with mock.patch("hfbert.files.tempfile.NamedTemporaryFile", side_effect=refuse_probe) as probe:
        with pytest.raises(Refusal) as error:
            check_folder_writable(tmp_path, "--output_dir")
        assert str(error.value) == (
            f"--output_dir {tmp_path} cannot be written: Permission denied; pass a folder you can write to, "
            "or fix its permissions (or free space on its disk)"
        )
        with pytest.raises(Refusal) as error:
            check_folder_writable(tmp_path / "new" / "run", "--output_dir")
        assert str(error.value).startswith(
            f"--output_dir {tmp_path / 'new' / 'run'} cannot be written (it does not exist yet and its parent "
            f"{tmp_path} is not writable): Permission denied; "
        )
    assert probe.call_args.kwargs["dir"] == tmp_path


def test_sha256_file_reads_past_its_first_chunk(tmp_path):
    data = os.urandom((1 << 20) + 3)
    (tmp_path / "weights.bin").write_bytes(data)
    assert sha256_file(tmp_path / "weights.bin") == hashlib.sha256(data).hexdigest()


# ------------------------------------------------------------------------------------------- local paths


def test_a_value_is_a_local_path_by_its_start_its_separators_or_an_existing_parent(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "runs").mkdir()
    for name in ("./x", "/x", "~/x", "a/b/c", "runs/x"):
        assert looks_like_local_path(name), name
    for name in ("bert-base-uncased", "owner/name", "x"):
        assert not looks_like_local_path(name), name


def test_a_local_path_that_names_nothing_is_refused_and_a_hub_id_passes(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(Refusal) as error:
        check_local_path_exists("./missing", "--model_dir", "FIX")
    assert str(error.value) == f"--model_dir ./missing: no such folder ({tmp_path / 'missing'}); FIX"
    with pytest.raises(Refusal, match=r"^--train_file ~/gone\.csv: no such file \("):
        check_local_path_exists("~/gone.csv", "--train_file", "FIX", kind="file")
    Path("here").mkdir()
    check_local_path_exists("./here", "--model_dir", "FIX")
    check_local_path_exists("owner/name", "--model_dir", "FIX")


def test_a_damaged_file_in_a_local_flag_value_is_named_after_the_flag(tmp_path):
    (tmp_path / "config.json").write_text('{"hidden_size": ')
    (tmp_path / ".hidden.json").write_text("{")  # hidden: never read
    for value in (tmp_path, tmp_path / "config.json"):
        with pytest.raises(Refusal) as error:
            check_local_files(value, "--config_name", "FIX")
        assert str(error.value).startswith(f"--config_name {value}: {tmp_path / 'config.json'} is truncated")
    (tmp_path / "config.json").write_text("{}")
    check_local_files(tmp_path, "--config_name", "FIX")
    check_local_files("owner/name", "--config_name", "FIX")  # a Hub id: its loader's to check


def test_torch_files_are_checked_only_when_asked(tmp_path):
    (tmp_path / "optimizer.bin").write_bytes(b"PK\x03\x04 cut short")
    check_readable([tmp_path / "optimizer.bin", tmp_path / "missing.json"], "FIX")
    (tmp_path / "config.json").write_text("{")
    with pytest.raises(Refusal, match=r"config\.json is truncated: .*; FIX$"):  # past a missing file
        check_readable([tmp_path / "missing.json", tmp_path / "optimizer.bin", tmp_path / "config.json"], "FIX")
    with pytest.raises(Refusal, match=r"optimizer\.bin is truncated or not a torch\.save file .*; FIX$"):
        check_readable([tmp_path / "optimizer.bin"], "FIX", torch_files=True)


def safetensors_bytes(header: bytes, data: bytes = b"") -> bytes:
    return len(header).to_bytes(8, "little") + header + data


@pytest.mark.parametrize(
    ("content", "problem"),
    [
        (b"", "is empty: 0 bytes, too short for its header"),
        (b"\x02\x00\x00", "is truncated or not a safetensors file: 3 bytes, too short for its header"),
        (bytes(8), "is not a safetensors file (its header is not safetensors JSON)"),
        (safetensors_bytes(b"{}", b"x"), "is longer than its header says: 11 bytes, its header lists 10"),
        # sizes that add up, but 2 float32 do not fit in 4 bytes: only safetensors itself sees it
        (
            safetensors_bytes(b'{"w": {"dtype": "F32", "shape": [2], "data_offsets": [0, 4]}}', bytes(4)),
            "is not a valid safetensors file (",
        ),
    ],
)
def test_a_safetensors_file_too_short_for_its_header_or_inconsistent_is_named(tmp_path, content, problem):
    path = tmp_path / "model.safetensors"
    path.write_bytes(content)
    with pytest.raises(Refusal) as error:
        check_safetensors(path, "FIX")
    assert str(error.value).startswith(f"{path} {problem}") and str(error.value).endswith("; FIX")


def test_a_safetensors_file_of_just_its_header_passes(tmp_path):
    (tmp_path / "model.safetensors").write_bytes(safetensors_bytes(b"{}"))
    check_safetensors(tmp_path / "model.safetensors", "FIX")


def test_publish_moves_the_weights_last_and_the_record_after_them(tmp_path):
    from hfbert.files import write_final_record

    write_set(tmp_path, "old")
    write_final_record(tmp_path, tmp_path)
    ready = tmp_path / FINAL_READY
    ready.mkdir()
    for name in ("config.json", "model.safetensors", "tokenizer.json"):  # the weights sort in the middle
        (ready / name).write_text("new")
    write_final_record(ready, tmp_path)
    targets = []
    real_replace = os.replace

    def record(source, target):
        targets.append(Path(target).name)
        real_replace(source, target)

    with mock.patch("hfbert.files.os.replace", record):
        assert publish_files(tmp_path)
    # The record last: a publish interrupted before it leaves the old one, which the files not yet moved are as.
    assert targets[-2:] == ["model.safetensors", FINAL_RECORD] and len(targets) == 4
    assert not ready.exists()


@pytest.mark.parametrize("weights", ["model.safetensors", "model.safetensors.index.json", "pytorch_model.bin", None])
def test_a_model_folder_holds_a_config_and_weights_in_any_of_their_forms(tmp_path, weights):
    (tmp_path / "config.json").write_text("{}")
    if weights is not None:
        (tmp_path / weights).write_bytes(b"")
    assert holds_model(tmp_path) == (weights is not None)
    (tmp_path / "config.json").unlink()
    assert not holds_model(tmp_path)  # weights without a config are no model


def test_a_tokenizer_is_its_vocabulary_not_its_config(tmp_path):
    (tmp_path / "tokenizer_config.json").write_text("{}")
    assert not holds_tokenizer(tmp_path)
    for name in ("tokenizer.json", "vocab.txt"):
        (tmp_path / name).write_text("")
        assert holds_tokenizer(tmp_path)
        (tmp_path / name).unlink()


# ------------------------------------------------------------------------------------------------ issue 64


def test_json_nested_deeper_than_the_parser_reads_is_named_not_a_recursion_error(tmp_path):
    path = tmp_path / "config.json"
    path.write_text("[" * 100_000 + "]" * 100_000)
    with pytest.raises(Refusal) as error:
        read_json(path, "FIX")
    assert str(error.value) == f"{path} is not valid JSON (nested deeper than Python's JSON parser reads); FIX"
    (tmp_path / "model.safetensors").write_bytes(safetensors_bytes(b"[" * 100_000 + b"]" * 100_000))
    with pytest.raises(Refusal, match=r"is not a safetensors file \(its header is not safetensors JSON\); FIX$"):
        check_safetensors(tmp_path / "model.safetensors", "FIX")


@pytest.mark.parametrize("dtype", [torch.int32, torch.int64, torch.bool])
def test_a_weight_stored_as_integers_is_refused_and_an_integer_buffer_is_not(tmp_path, dtype):
    path = tmp_path / "model.safetensors"
    weights = {"bert.embeddings.position_ids": torch.arange(8)[None], "cls.bias": torch.zeros(4)}
    save_file(weights | {"bert.pooler.dense.weight": torch.ones(4, 4, dtype=dtype)}, path)
    with pytest.raises(Refusal) as error:
        check_safetensors(path, "FIX")
    stored = {torch.int32: "I32", torch.int64: "I64", torch.bool: "BOOL"}[dtype]
    assert str(error.value) == (
        f"{path} holds the weight bert.pooler.dense.weight as {stored}, not floating point (a model's weights "
        "are F32, F16 or BF16); FIX"
    )
    save_file(weights, path)  # position ids are integers in old BERT files, and no weight
    check_safetensors(path, "FIX")


@pytest.mark.parametrize("pickled", ["pytorch_model.bin", "pytorch_model.bin.index.json"])
def test_a_folder_whose_weights_are_only_a_pickle_is_refused_naming_the_safetensors_fix(tmp_path, pickled):
    (tmp_path / "config.json").write_text("{}")
    (tmp_path / pickled).write_bytes(b"never read")
    with pytest.raises(Refusal) as error:
        refuse_pickled_weights(tmp_path, "--flag x")
    assert str(error.value) == (
        f"--flag x: its weights are {pickled}, a pickle (torch.save's format), which hfbert never loads: "
        "unpickling a file can run any code it holds; convert it to model.safetensors where you trust it "
        "(from_pretrained with the model's class, then save_pretrained), or download the model's safetensors"
    )
    (tmp_path / "model.safetensors").write_bytes(b"")  # beside safetensors, the pickle is never read
    refuse_pickled_weights(tmp_path, "--flag x")


@pytest.mark.parametrize("shard", ["evil.bin", "../outside.safetensors", "sub/model.safetensors"])
def test_a_safetensors_index_naming_a_pickle_or_a_file_outside_the_folder_is_refused(tmp_path, shard):
    """The eighth attack (2b53043), K1: a model.safetensors.index.json whose weight_map named a torch.save shard
    (evil.bin) passed the pickle check, and transformers unpickled the shard (weights_only)."""
    (tmp_path / "config.json").write_text("{}")
    index = {"metadata": {}, "weight_map": {"a.weight": "model-00001-of-00002.safetensors", "b.weight": shard}}
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps(index))
    with pytest.raises(Refusal) as error:
        refuse_pickled_weights(tmp_path, "--flag x")
    assert str(error.value) == (
        f"--flag x: its model.safetensors.index.json names {shard} as a weight shard, which is no safetensors "
        "file beside it: hfbert loads weights only from safetensors files in the folder; download the model's "
        "safetensors shards, or save it again with save_pretrained where you trust it"
    )
    index["weight_map"]["b.weight"] = "model-00002-of-00002.safetensors"  # as save_pretrained shards: passes
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps(index))
    refuse_pickled_weights(tmp_path, "--flag x")


# ----------------------------------------------------------------------------------------------- one run per folder


@pytest.mark.parametrize("kind", ["link", "folder", "hard link", "user's file"])
def test_a_lock_file_that_is_a_link_or_no_file_is_refused_and_nothing_is_written_through_it(tmp_path, kind):
    """The fourth attack (aca973c), F1: .hfbert-run.lock as a link to a file outside the folder: the lock opened it
    following the link, emptied it, wrote the holder into it and removed the link, before the run was refused.
    The eighth (2b53043), K5: a user's own file of that name was emptied and deleted."""
    output_dir, precious = tmp_path / "run", tmp_path / "precious.txt"
    output_dir.mkdir()
    precious.write_text("PRECIOUS DATA\n")
    lock = output_dir / RUN_LOCK_NAME
    if kind == "user's file":
        precious = precious.rename(lock)
    else:
        {"link": lock.symlink_to, "hard link": lock.hardlink_to}.get(kind, lambda _: lock.mkdir())(precious)
    with pytest.raises(CheckpointError) as refused, run_folder_lock(output_dir):
        pass
    shown = {
        "link": "a link", "hard link": "a file with 2 links (a hard link)",
        "user's file": "a file that holds no run lock (hfbert writes its pid, host and start time there)",
    }.get(kind, "no plain file")  # fmt: skip
    assert str(refused.value) == (
        f"--output_dir {output_dir}: {lock} is {shown}, where hfbert keeps its run lock (a plain file it writes and "
        "removes): remove it, then rerun"
    )
    assert precious.read_text() == "PRECIOUS DATA\n" and os.path.lexists(lock)  # kept as it was


def test_a_held_run_folder_refuses_a_second_run_naming_the_holder(tmp_path):
    output_dir = tmp_path / "run"
    with run_folder_lock(output_dir):
        before = sorted(path.name for path in output_dir.iterdir())
        with pytest.raises(CheckpointError) as refused, run_folder_lock(output_dir):
            pass
        assert sorted(path.name for path in output_dir.iterdir()) == before == [RUN_LOCK_NAME]
    message = str(refused.value)
    assert f"--output_dir {output_dir} is in use by another training run" in message
    assert f"pid {os.getpid()} on host {socket.gethostname()}" in message and "another --output_dir" in message
    assert not output_dir.exists()  # created for the lock, left empty: removed with it


def test_deleting_the_lock_file_does_not_let_a_second_run_in(tmp_path):
    """The lock was the file's alone: once someone deleted .hfbert-run.lock, a second run locked a new file."""
    output_dir = tmp_path / "run"
    with run_folder_lock(output_dir):
        (output_dir / RUN_LOCK_NAME).unlink()
        refused = rf"in use by another training run \(a run whose {RUN_LOCK_NAME} was deleted\)"
        with pytest.raises(CheckpointError, match=refused), run_folder_lock(output_dir):
            pass
    with run_folder_lock(output_dir):  # released with the first run
        pass


def test_the_lock_is_released_and_removed_when_the_run_fails(tmp_path):
    output_dir = tmp_path / "run"
    output_dir.mkdir()
    (output_dir / "checkpoint-2").mkdir()
    with pytest.raises(RuntimeError), run_folder_lock(output_dir):
        raise RuntimeError("training failed")
    assert [path.name for path in output_dir.iterdir()] == ["checkpoint-2"]
    with run_folder_lock(output_dir):  # free again
        pass


HOLD_THE_LOCK = textwrap.dedent(
    """
    import sys, time
    sys.path.insert(0, sys.argv[2])
    from hfbert.files import run_folder_lock
    with run_folder_lock(sys.argv[1]):
        print("held", flush=True)
        time.sleep(600)
    """
)


def test_a_lock_left_by_a_killed_run_does_not_block_the_next(tmp_path):
    output_dir = tmp_path / "run"
    repo = str(Path(__file__).parent.parent)
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLD_THE_LOCK, str(output_dir), repo], stdout=subprocess.PIPE, text=True
    )
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(CheckpointError, match=rf"pid {holder.pid} on host"), run_folder_lock(output_dir):
            pass
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait(timeout=30)
    assert (output_dir / RUN_LOCK_NAME).is_file()  # SIGKILL leaves the file; the kernel dropped the flock
    check_run_folder(output_dir, resume_from_checkpoint=None, overwrite_output_dir=False)  # looks empty
    with run_folder_lock(output_dir):
        pass
    assert list(output_dir.iterdir()) == []  # the stale file went with the new run's lock


@pytest.mark.parametrize(
    ("content", "holder"),
    [
        ('{"pid": 7, "host": "node1", "started": "2026-11-26 10:00:00 UTC"}\n', "pid 7 on host node1, started 2026-11-26 10:00:00 UTC"),
        ('{"pid": 7, "ho', "a process that is still starting"),  # the holder is still writing it
        (None, f"a run whose {RUN_LOCK_NAME} was deleted"),
    ],
)
def test_a_refused_second_run_names_the_holder_as_far_as_its_lock_file_tells(tmp_path, content, holder):
    if content is not None:
        (tmp_path / RUN_LOCK_NAME).write_text(content)
    assert str(_folder_in_use(tmp_path / RUN_LOCK_NAME)) == (
        f"--output_dir {tmp_path} is in use by another training run ({holder}); wait for it to finish or stop it, "
        "or pass another --output_dir. Two runs in one folder would overwrite each other's checkpoints"
    )


def test_where_a_folder_cannot_be_flocked_the_lock_file_alone_holds_it(tmp_path):
    """NFS: flock on a directory fails (EBADF on a read-only descriptor); the run goes on with the file's lock."""
    real_flock = fcntl.flock

    def no_folder_flock(fd, operation):
        if os.path.isdir(f"/proc/self/fd/{fd}"):
            raise OSError(errno.EBADF, "Bad file descriptor")
        real_flock(fd, operation)

    output_dir = tmp_path / "run"
    with (
        mock.patch("hfbert.files.fcntl.flock", no_folder_flock),
        run_folder_lock(output_dir),
        pytest.raises(CheckpointError, match="is in use by another training run"),
        run_folder_lock(output_dir),
    ):
        pass
    assert not output_dir.exists()


@pytest.mark.parametrize("made", ["written", "link", "folder"])
def test_a_publish_replaces_no_file_written_at_its_names_since_the_last_one(tmp_path, made):
    """The ninth attack (16a18ca), B: a README.md (or samples.md) the user wrote into the output folder while the
    run trained was replaced by the final folder's publish, whose files were checked only before work. The
    complete set waits in `.final-ready` instead, published by the next run once the file is moved out."""
    from hfbert.files import write_final_record

    write_set(tmp_path, "old")
    write_final_record(tmp_path, tmp_path)  # as hfbert published the old set
    (tmp_path / "README.md").unlink()
    if made == "written":
        (tmp_path / "README.md").write_text("MY NOTES written during training")
    elif made == "link":
        (tmp_path / "README.md").symlink_to(tmp_path / "config.json")
    else:
        (tmp_path / "README.md").mkdir()
    shown = {"written": "README.md (changed since hfbert wrote it)", "link": "README.md (a link)"}.get(made, "README.md (a folder)")
    with pytest.raises(CheckpointError) as refused, staged_files(tmp_path) as staging:
        write_set(staging, "new")
    assert str(refused.value) == (
        f"The new files are complete in {tmp_path / FINAL_READY} but not published: {tmp_path} holds {shown}, which "
        "hfbert did not write there and publishing would replace: move it out of the folder, then rerun the command "
        "(a training run with --resume_from_checkpoint latest), which publishes them first"
    )
    assert {p.name: p.read_text() for p in tmp_path.iterdir() if p.is_file() and not p.is_symlink()} == {
        **dict.fromkeys(("config.json", "model.safetensors"), "old"), FINAL_RECORD: (tmp_path / FINAL_RECORD).read_text(),
        **({"README.md": "MY NOTES written during training"} if made == "written" else {}),
    }
    (tmp_path / "README.md").unlink() if made != "folder" else (tmp_path / "README.md").rmdir()
    assert publish_files(tmp_path)
    assert all(p.read_text() == "new" for p in tmp_path.iterdir() if p.name != FINAL_RECORD)
