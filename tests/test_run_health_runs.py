"""Run health end to end: each signature named by a tiny run made to show it, in run_health.json, the log and
the model card (slow: each run trains for seconds)."""

import json
import logging
import shutil
from pathlib import Path

import pytest
from test_training import EXACT, run_args, train_in_process

from benchmarks.run_health_corpora import REPEATED, shuffled, write_documents


def health_of(folder: Path) -> dict:
    return json.loads((folder / "run_health.json").read_text())


def kinds_of(folder: Path) -> list[str]:
    return [event["kind"] for event in health_of(folder)["events"]]


def corpus_files(folder: Path, train: list[list[str]], validation: list[list[str]]) -> list[str]:
    folder.mkdir()
    write_documents(train, folder / "train.txt")
    write_documents(validation, folder / "valid.txt")
    return ["--train_file", str(folder / "train.txt"), "--validation_file", str(folder / "valid.txt")]


@pytest.mark.slow
def test_repeated_paragraphs_are_named_before_the_first_update(tmp_path, run_inputs, caplog):
    repeated = [[REPEATED[i % 4], REPEATED[(i + 1) % 4]] for i in range(60)]
    corpus = corpus_files(tmp_path / "corpus", repeated, repeated[:8])
    with caplog.at_level(logging.INFO, logger="hfbert"):
        train_in_process(run_args(run_inputs, tmp_path / "run", *corpus, "--max_train_steps", "2"))
    event = health_of(tmp_path / "run")["events"][0]
    assert (event["kind"], event["update"]) == ("duplicate_text", 0)
    messages = [record.getMessage() for record in caplog.records]
    warned = next(i for i, m in enumerate(messages) if m.startswith("Run health, duplicate_text"))
    evaluated = next(i for i, m in enumerate(messages) if m.startswith("step "))  # the first evaluation's line
    assert warned < evaluated
    assert "## Run health" in (tmp_path / "run" / "README.md").read_text()


@pytest.mark.slow
def test_a_rate_too_small_to_learn_sits_on_the_unigram_plateau(tmp_path, run_inputs):
    args = ("--learning_rate", "1e-9", "--max_train_steps", "8", "--eval_steps", "4")
    train_in_process(run_args(run_inputs, tmp_path / "run", *args))
    health = health_of(tmp_path / "run")
    assert kinds_of(tmp_path / "run") == ["unigram_plateau"]
    assert health["events"][0]["update"] == 4  # the first evaluation past a quarter of the budget
    assert health["status"] == "1 open warning(s): unigram_plateau (update 4)"  # never outgrown
    assert health["baselines"]["unigram_mlm_loss"] < json.loads((tmp_path / "run" / "eval_results.json").read_text())[
        "eval_mlm_loss"
    ]


@pytest.mark.slow
def test_a_rate_far_too_high_spikes(tmp_path, run_inputs):
    args = ("--learning_rate", "3", "--num_warmup_steps", "10", "--max_train_steps", "16", "--eval_steps", "16")
    train_in_process(run_args(run_inputs, tmp_path / "run", *args))
    spike = next(event for event in health_of(tmp_path / "run")["events"] if event["kind"] == "loss_spike")
    assert spike["update"] <= 16 and "running median" in spike["message"]  # finite: the run went on to its end


@pytest.mark.slow
def test_shuffled_sentences_leave_nsp_at_chance(tmp_path, run_inputs):
    corpus = corpus_files(tmp_path / "corpus", shuffled("train", 1), shuffled("validation", 2))
    args = ("--learning_rate", "1e-2", "--num_warmup_steps", "5", "--max_train_steps", "40", "--eval_steps", "10")
    train_in_process(run_args(run_inputs, tmp_path / "run", *corpus, *args))
    assert "nsp_at_chance" in kinds_of(tmp_path / "run")


@pytest.mark.slow
def test_a_resumed_run_keeps_its_events_without_naming_them_again(tmp_path, run_inputs, caplog):
    straight, resumed = tmp_path / "straight", tmp_path / "resumed"
    args = ("--learning_rate", "3", "--num_warmup_steps", "10", "--max_train_steps", "16", "--eval_steps", "16", *EXACT)
    train_in_process(run_args(run_inputs, straight, *args, "--checkpointing_steps", "14"))
    resumed.mkdir()
    shutil.copytree(straight / "checkpoint-14", resumed / "checkpoint-14")
    caplog.clear()  # the straight run's lines
    with caplog.at_level(logging.INFO, logger="hfbert"):
        train_in_process(run_args(run_inputs, resumed, *args, "--resume_from_checkpoint", "latest"))
    assert health_of(resumed)["events"] == health_of(straight)["events"]
    assert "loss_spike" in kinds_of(resumed)
    messages = [record.getMessage() for record in caplog.records]
    assert any(m.startswith("Run health: resumed with the earlier events: 1 open warning(s): loss_spike") for m in messages)
    assert not [m for m in messages if m.startswith("Run health, loss_spike")]
