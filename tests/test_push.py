"""python -m hfbert.push: pushing a finished run folder without retraining."""

import shutil
from unittest import mock

import pytest
from conftest import DAMAGES, damage, tiny_config

from hfbert import HfBertForPreTraining
from hfbert.errors import REFUSAL_EXIT_CODE, Refusal, run_cli
from hfbert.files import FINAL_READY, write_json_atomic
from hfbert.model_card import build_model_card
from hfbert.push import main


@pytest.fixture
def run_folder(tmp_path, sample_tokenizer):
    folder = tmp_path / "run"
    HfBertForPreTraining(tiny_config(vocab_size=len(sample_tokenizer))).save_pretrained(folder)
    sample_tokenizer.save_pretrained(folder)
    (folder / "README.md").write_text("card")
    (folder / "checkpoint-2").mkdir()
    (folder / "checkpoint-2" / "optimizer.bin").write_bytes(b"state")
    return folder


def push(folder, capsys, repo_id="me/m"):
    commit = mock.Mock(commit_url="https://huggingface.co/me/m/commit/1")
    with (
        mock.patch("huggingface_hub.constants.HF_HUB_OFFLINE", False),
        mock.patch("huggingface_hub.HfApi.whoami", return_value={"name": "me"}),
        mock.patch("huggingface_hub.HfApi.create_repo", return_value=mock.Mock(repo_id="me/m")),
        mock.patch("huggingface_hub.HfApi.create_commit", return_value=commit) as create_commit,
    ):
        main([str(folder), "--hub_model_id", repo_id])
    assert capsys.readouterr().out.strip() == commit.commit_url
    return {operation.path_in_repo: operation for operation in create_commit.call_args.kwargs["operations"]}


def test_push_uploads_the_final_files_without_checkpoints(run_folder, capsys):
    uploaded = push(run_folder, capsys).keys()
    assert {"config.json", "model.safetensors", "README.md", "tokenizer.json"} <= uploaded
    assert not any(name.startswith("checkpoint-") for name in uploaded)


def test_push_first_finishes_an_interrupted_publication(run_folder, capsys):
    ready = run_folder / FINAL_READY
    ready.mkdir()
    shutil.move(run_folder / "model.safetensors", ready / "model.safetensors")
    assert "model.safetensors" in push(run_folder, capsys)
    assert not ready.exists()


@pytest.mark.parametrize("hub_model_id", [None, "me/hfbert-x"])
def test_the_uploaded_cards_snippets_load_the_pushed_id_and_the_folders_card_is_kept(run_folder, capsys, hub_model_id):
    """The card was uploaded as training wrote it: from_pretrained("run") (the folder's name) or the id it
    trained with, not the id pushed to."""
    card = build_model_card(
        model_name=(hub_model_id or "run").split("/")[-1], training_config={"preset": "tiny"}, eval_results={},
        dataset_name=None, dataset_config_name=None, hub_model_id=hub_model_id,
    )  # fmt: skip
    card.save(run_folder / "README.md")
    written = (run_folder / "README.md").read_bytes()
    uploaded = push(run_folder, capsys, repo_id="you/other")["README.md"].path_or_fileobj.decode()
    assert uploaded.count('from_pretrained("you/other"') == 3 and 'model="you/other"' in uploaded
    assert "python -m hfbert.finetune other " in uploaded
    assert "\n# other\n" in uploaded and "\n# run\n" not in uploaded  # the title too (second attack, N5)
    assert "from_pretrained(\"run\"" not in uploaded and "me/hfbert-x" not in uploaded
    assert (run_folder / "README.md").read_bytes() == written


@pytest.mark.parametrize(
    ("hub_model_id", "message"),
    [
        ("a/b/c", "--hub_model_id a/b/c: Repo id must"),
        ("hfbert-x", "--hub_model_id hfbert-x has no namespace.*; pass <your-username>/hfbert-x$"),
    ],
)
def test_a_hub_model_id_the_hub_would_reject_is_refused_before_the_folder_is_touched(run_folder, hub_model_id, message):
    ready = run_folder / FINAL_READY  # an interrupted publication, which a push would finish first
    ready.mkdir()
    shutil.move(run_folder / "model.safetensors", ready / "model.safetensors")
    with pytest.raises(Refusal, match=message):
        main([str(run_folder), "--hub_model_id", hub_model_id])
    assert (ready / "model.safetensors").is_file() and not (run_folder / "model.safetensors").exists()


@pytest.mark.parametrize("how", DAMAGES)
@pytest.mark.parametrize(
    "name", ["model.safetensors", "config.json", "tokenizer.json", "eval_results.json", "log_history.json"]
)
def test_a_damaged_final_file_is_named_and_nothing_is_uploaded(run_folder, name, how):
    write_json_atomic(run_folder / "eval_results.json", {"step": 4, "eval_mlm_loss": 5.5})
    write_json_atomic(run_folder / "log_history.json", [{"step": 2, "loss": 6.0}, {"step": 4, "loss": 5.0}])
    damage(run_folder / name, how)
    with (
        mock.patch("huggingface_hub.HfApi.create_repo") as create_repo,
        pytest.raises(ValueError, match=r"nothing was uploaded") as error,
    ):
        main([str(run_folder), "--hub_model_id", "me/m"])
    assert f"{run_folder / name} is " in str(error.value)
    assert "--resume_from_checkpoint latest" in str(error.value)
    create_repo.assert_not_called()


def test_a_missing_folder_is_refused_in_one_line(tmp_path, capsys):
    with pytest.raises(SystemExit) as exited:
        run_cli(lambda: main([str(tmp_path / "nope"), "--hub_model_id", "me/m"]), prog="python -m hfbert.push")
    assert exited.value.code == REFUSAL_EXIT_CODE
    assert capsys.readouterr().err.splitlines() == [
        f"python -m hfbert.push: error: {tmp_path / 'nope'} is not a folder; pass the --output_dir of a finished run"
    ]


@pytest.mark.parametrize("cause", ["offline", "network"])
def test_an_unreachable_hub_is_named_and_nothing_is_uploaded(run_folder, cause):
    """Offline (HF_HUB_OFFLINE) or without a network the push ended in a raw Hub traceback."""
    offline = mock.patch("huggingface_hub.constants.HF_HUB_OFFLINE", cause == "offline")
    no_network = mock.patch("huggingface_hub.HfApi.whoami", side_effect=ConnectionError("no route to host"))
    create_commit = mock.patch("huggingface_hub.HfApi.create_commit")
    with offline, no_network, create_commit as committed, pytest.raises(ValueError) as refused:
        main([str(run_folder), "--hub_model_id", "me/m"])
    expected = "HF_HUB_OFFLINE is set" if cause == "offline" else "ConnectionError: no route to host"
    assert f"nothing was uploaded: the Hub cannot be used ({expected})" in str(refused.value)
    assert f"python -m hfbert.push {run_folder} --hub_model_id me/m" in str(refused.value)
    committed.assert_not_called()
