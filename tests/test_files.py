"""hfbert.files: every crash-safe write (file, JSON, new folder, a run's final files)."""

import json
from unittest import mock

import pytest
from conftest import DAMAGES, damage, tiny_config

from hfbert import HfBertForPreTraining
from hfbert.files import (
    FINAL_READY,
    atomic_path,
    check_safetensors,
    publish_files,
    read_json,
    staged_files,
    staged_folder,
    write_json_atomic,
)


def test_write_json_atomic(tmp_path):
    path = write_json_atomic(tmp_path / "eval_results.json", {"b": 1.5, "a": [1, 2]})
    assert json.loads(path.read_text()) == {"a": [1, 2], "b": 1.5}
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
    write_set(tmp_path, "old")
    (tmp_path / "checkpoint-4").mkdir()
    with staged_files(tmp_path) as staging:
        write_set(staging, "new")
    assert {p.name: p.read_text() for p in tmp_path.iterdir() if p.is_file()} == dict.fromkeys(
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
    write_set(tmp_path, "old")
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
    assert all(p.read_text() == "new" for p in tmp_path.iterdir())
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


@pytest.mark.parametrize(("content", "problem"), [(b"", "is empty"), (b"\xff\xfe{}", "not UTF-8")])
def test_an_empty_or_binary_json_file_is_named(tmp_path, content, problem):
    (tmp_path / "config.json").write_bytes(content)
    with pytest.raises(ValueError, match=problem):
        read_json(tmp_path / "config.json", "FIX")


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
