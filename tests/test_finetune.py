"""python -m hfbert.finetune: a finished folder fine-tuned with transformers' Trainer against random init."""

import csv
import dataclasses
import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import time
from unittest import mock

import datasets
import numpy as np
import pytest
import torch
from conftest import (
    damage,
    folder_with_its_own_code,
    rewrite_weights,
    tiny_config,
    with_pickled_weights,
)
from transformers import AutoTokenizer

from hfbert import HfBertForPreTraining
from hfbert.checkpointing import MANIFEST_FORMAT_VERSION, MANIFEST_NAME
from hfbert.errors import Refusal
from hfbert.files import sha256_file
from hfbert.finetune.data import few_labels, load_task
from hfbert.finetune.fit import FitResult, classification_metrics
from hfbert.finetune.models import MODEL_ROLE, build_model, load_candidate
from hfbert.finetune.run import RESULTS_NAME, main
from hfbert.finetune.settings import RANDOM_INIT, FinetuneDataArguments, FinetuneTrainingArguments

TOPICS = {
    "sport": ["the team won the match", "he scored in the game", "the club played the season"],
    "ships": ["the ship was launched", "the vessel sank at sea", "the navy built the ship"],
}


@pytest.fixture(scope="module")
def folder(tmp_path_factory, sample_tokenizer):
    """A finished-looking model folder: tiny HfBertForPreTraining (untrained) + the sample tokenizer."""
    path = tmp_path_factory.mktemp("run") / "model"
    HfBertForPreTraining(tiny_config(vocab_size=len(sample_tokenizer))).save_pretrained(path)
    sample_tokenizer.save_pretrained(path)
    (path / "README.md").write_text("---\nlicense: apache-2.0\n---\n\n# model\n\nSome text to keep.\n")
    return path


def topic_rows(count: int, seed: int, pairs: bool = False) -> list[dict]:
    rng = random.Random(seed)
    rows = []
    for index in range(count):
        topic = sorted(TOPICS)[index % 2]
        row = {"text": rng.choice(TOPICS[topic]), "label": topic}
        if pairs:  # label: whether the second text is about the same topic
            same = rng.random() < 0.5
            other = topic if same else sorted(set(TOPICS) - {topic})[0]
            row.update(second=rng.choice(TOPICS[other]), label=int(same))
        rows.append(row)
    return rows


def write_csv(path, rows):
    datasets.Dataset.from_list(rows).to_csv(path, index=False)
    return path


def write_jsonl(path, rows):
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def args_for(folder, train, validation, output_dir, *extra):
    return [
        str(folder), "--train_file", str(train), "--validation_file", str(validation),
        "--learning_rate", "2e-3", "--num_train_epochs", "6", "--per_device_train_batch_size", "8",
        "--seeds", "1", "2", "--output_dir", str(output_dir), "--quiet", *extra,
    ]  # fmt: skip


def candidate(folder, init="pretrained"):
    """The model `hfbert.finetune` fine-tunes from `folder` (its pretrained weights, or random init)."""
    loaded = load_candidate(MODEL_ROLE, str(folder), "model_dir", FinetuneTrainingArguments(), False, False)
    return dataclasses.replace(loaded, init=init)


def fit_result(accuracy, majority_rate=0.5, epoch_losses=(0.7, 0.1)):
    """A FitResult as finetune_once returns it, scoring `accuracy`."""
    return FitResult({"accuracy": accuracy}, tuple(epoch_losses), (1, 1), majority_rate)


@pytest.mark.slow
def test_single_sentences_from_csv_learn_and_compare_with_random_init(tmp_path, folder):
    train = write_csv(tmp_path / "train.csv", topic_rows(48, seed=0))
    validation = write_csv(tmp_path / "validation.csv", topic_rows(32, seed=1))
    results = main(args_for(folder, train, validation, tmp_path / "out", "--compare", RANDOM_INIT))
    assert set(results["models"]) == {"model", "comparison"}
    assert results["models"]["comparison"]["init"] == RANDOM_INIT
    assert results["labels"] == ["ships", "sport"] and results["train_examples"] == 48
    for model in results["models"].values():
        assert min(model["summary"]["accuracy"]["per_seed"]) >= 0.9  # a separable task is learned
    assert set(results["gain"]) == {"accuracy"}
    assert json.loads((tmp_path / "out" / RESULTS_NAME).read_text())["seeds"] == [1, 2]
    assert (tmp_path / "out" / "finetune_results.png").stat().st_size > 0


@pytest.mark.slow
def test_sentence_pairs_from_jsonl_and_seeds_reproduce(tmp_path, folder):
    train = write_jsonl(tmp_path / "train.jsonl", topic_rows(40, seed=0, pairs=True))
    validation = write_jsonl(tmp_path / "validation.jsonl", topic_rows(20, seed=1, pairs=True))
    extra = ("--text_pair_column", "second", "--max_train_samples", "20", "--num_train_epochs", "1")
    first = main(args_for(folder, train, validation, tmp_path / "a", *extra))
    second = main(args_for(folder, train, validation, tmp_path / "b", *extra))
    assert first["train_examples"] == 20
    assert first["models"]["model"]["summary"] == second["models"]["model"]["summary"]


@pytest.mark.slow
def test_model_card_gains_model_index_and_keeps_its_text(tmp_path, folder):
    train = write_csv(tmp_path / "train.csv", topic_rows(16, seed=0))
    validation = write_csv(tmp_path / "validation.csv", topic_rows(8, seed=1))
    main(
        args_for(
            folder, train, validation, tmp_path / "out", "--num_train_epochs", "1", "--update_model_card"
        )
    )
    card = (folder / "README.md").read_text()
    assert "model-index" in card and "text-classification" in card and "Some text to keep." in card
    assert "re-initialised" not in card
    main(args_for(folder, train, validation, tmp_path / "out", "--num_train_epochs", "1", "--update_model_card",
                  "--reinit_query_key", "--seeds", "1"))  # fmt: skip
    assert "fine-tuned, query/key re-initialised, mean of 1 seed)" in (folder / "README.md").read_text()


def test_random_init_twin_has_the_same_config_and_other_weights(folder):
    names = ["a", "b"]
    pretrained = build_model(candidate(folder), names, seed=1)
    twin = build_model(candidate(folder, RANDOM_INIT), names, seed=1)
    assert pretrained.config.to_dict() == twin.config.to_dict()
    word_embeddings = "bert.embeddings.word_embeddings.weight"
    assert not torch.equal(pretrained.state_dict()[word_embeddings], twin.state_dict()[word_embeddings])
    saved = HfBertForPreTraining.from_pretrained(folder).state_dict()[word_embeddings]
    assert torch.equal(pretrained.state_dict()[word_embeddings], saved)
    again = build_model(candidate(folder, RANDOM_INIT), names, seed=1)
    assert torch.equal(again.state_dict()[word_embeddings], twin.state_dict()[word_embeddings])


@pytest.mark.parametrize(
    ("rows", "flags", "message"),
    [
        ([{"text": "a", "label": 0}], ("--label_column", "topic"), "no column 'topic'; its columns are"),
        ([{"text": "a", "label": 0.5}, {"text": "b", "label": 1.5}], (), "non-integer numbers"),
        ([{"text": "a", "label": 0}, {"text": "b", "label": 0}], (), "a single class"),
    ],
)
def test_bad_data_is_refused_before_training(tmp_path, folder, rows, flags, message):
    train = write_csv(tmp_path / "train.csv", rows)
    with (
        mock.patch("hfbert.finetune.run.finetune_once") as finetune_once,
        pytest.raises(ValueError, match=message),
    ):
        main(args_for(folder, train, train, tmp_path / "out", *flags))
    finetune_once.assert_not_called()


def test_labels_unseen_in_training_and_folders_without_a_model_are_refused(tmp_path, folder):
    train = write_csv(tmp_path / "train.csv", [{"text": "a", "label": "x"}, {"text": "b", "label": "y"}])
    validation = write_csv(tmp_path / "validation.csv", [{"text": "c", "label": "z"}])
    with pytest.raises(
        ValueError, match=r"validation\.csv has labels that --train_file .*train\.csv lacks: \['z'\]"
    ):
        main(args_for(folder, train, validation, tmp_path / "out"))
    (tmp_path / "tokenizer-only").mkdir()
    (tmp_path / "tokenizer-only" / "tokenizer.json").write_text("{}")
    with pytest.raises(ValueError, match="holds no model"):
        main(args_for(tmp_path / "tokenizer-only", train, train, tmp_path / "out"))
    with pytest.raises(Refusal, match="--train_file needs --validation_file"):
        main([str(folder), "--train_file", str(train)])  # no held-out file


def test_glue_columns_and_metrics_and_an_unreachable_hub(tmp_path, folder):
    def fake_glue(name, config):
        assert (name, config) == ("nyu-mll/glue", "mrpc")
        features = datasets.Features(
            {
                "sentence1": datasets.Value("string"),
                "sentence2": datasets.Value("string"),
                "label": datasets.ClassLabel(names=["not_equivalent", "equivalent"]),
            }
        )
        rows = [{"sentence1": "the ship", "sentence2": "the vessel", "label": i % 2} for i in range(8)]
        split = datasets.Dataset.from_list(rows, features=features)
        return datasets.DatasetDict(train=split, validation=split)

    glue = [
        str(folder),
        "--dataset_name",
        "nyu-mll/glue",
        "--dataset_config_name",
        "mrpc",
        "--seeds",
        "1",
        "--quiet",
    ]
    with (
        mock.patch("hfbert.finetune.data.datasets.load_dataset", side_effect=fake_glue),
        mock.patch(
            "hfbert.finetune.run.finetune_once",
            return_value=FitResult({"accuracy": 0.5, "f1": 0.4}, (0.7, 0.1), (4, 4), 0.5),
        ) as finetune_once,
    ):
        results = main([*glue, "--output_dir", str(tmp_path / "out")])
    train = finetune_once.call_args.args[2]
    assert set(train.column_names) >= {"input_ids", "token_type_ids", "labels"}
    assert max(train["token_type_ids"][0]) == 1  # the pair was encoded as two segments
    assert set(results["models"]["model"]["summary"]) == {"accuracy", "f1"}
    with pytest.raises(ValueError, match=r"could not be loaded .*connection to the Hub"):
        main(glue)  # HF_DATASETS_OFFLINE=1: the download is refused at the network boundary


def test_metrics_match_hand_computed_values():
    labels, predictions = np.array([1, 1, 0, 0, 1]), np.array([1, 0, 0, 1, 1])
    metrics = classification_metrics(predictions, labels)
    assert metrics["accuracy"] == pytest.approx(0.6)
    assert metrics["f1"] == pytest.approx(2 * 2 / (2 * 2 + 1 + 1))
    # MCC = (tp*tn - fp*fn) / sqrt((tp+fp)(tp+fn)(tn+fp)(tn+fn)) with tp=2, tn=1, fp=1, fn=1
    assert metrics["matthews_correlation"] == pytest.approx((2 * 1 - 1 * 1) / np.sqrt(3 * 3 * 2 * 2))


def test_few_labels_are_drawn_evenly_across_classes():
    train = datasets.Dataset.from_dict({"labels": [0] * 50 + [1] * 5 + [2] * 45})
    chosen = few_labels(train, 12, seed=0)
    assert sorted(np.bincount(chosen["labels"])) == [4, 4, 4]
    assert few_labels(train, 12, seed=0)["labels"] == chosen["labels"]


@pytest.mark.slow
def test_the_folders_tokenizer_loads_without_a_prompt_with_hfbert_imported_or_trust_remote_code(folder):
    # transformers 5 reads config.json (whose auto_map names remote code) before tokenizer_config.json, so a
    # bare AutoTokenizer.from_pretrained(folder) asks "run the custom code? [y/N]"; these two ways never do.
    with mock.patch("builtins.input", side_effect=AssertionError("AutoTokenizer asked a question")):
        assert "Bert" in type(AutoTokenizer.from_pretrained(folder)).__name__  # hfbert is imported here
    script = (
        "import sys; from transformers import AutoTokenizer; "
        f"t = AutoTokenizer.from_pretrained({str(folder)!r}, trust_remote_code=True); "
        "assert 'hfbert' not in sys.modules; print(type(t).__name__)"
    )
    result = subprocess.run(
        [sys.executable, "-c", script], stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0, result.stderr
    assert "Bert" in result.stdout and "custom code" not in result.stdout + result.stderr


def test_reinit_query_key_draws_only_the_attention_queries_and_keys_afresh(folder):
    names = ["a", "b"]
    kept = build_model(candidate(folder), names, seed=1)
    drawn = build_model(candidate(folder), names, seed=1, reinit_query_key=True)
    kept_weights, drawn_weights = kept.state_dict(), drawn.state_dict()
    redrawn = [
        name for name in kept_weights
        if name.endswith(".weight") and not torch.equal(kept_weights[name], drawn_weights[name])
    ]  # fmt: skip
    layers = kept.config.num_hidden_layers
    assert sorted(redrawn) == sorted(
        f"bert.encoder.layer.{i}.attention.self.{p}.weight" for i in range(layers) for p in ("query", "key")
    )
    query = drawn_weights["bert.encoder.layer.0.attention.self.query.weight"]
    assert abs(query.std().item() - kept.config.initializer_range) < 0.2 * kept.config.initializer_range
    assert not drawn_weights["bert.encoder.layer.0.attention.self.key.bias"].any()
    again = build_model(candidate(folder), names, seed=1, reinit_query_key=True)
    assert torch.equal(again.state_dict()["bert.encoder.layer.1.attention.self.key.weight"],
                       drawn_weights["bert.encoder.layer.1.attention.self.key.weight"])  # fmt: skip


@pytest.mark.parametrize(
    "training_args, hinted",
    [
        ({"attention_init": "structured", "model_name_or_path": None}, True),
        ({"attention_init": "bert", "model_name_or_path": None}, False),
        (
            {"attention_init": "structured", "model_name_or_path": "runs/phase1"},
            False,
        ),  # the start not applied
        (
            {"attention_init": "structured", "structured_attention_fade": 1.0},
            True,
        ),  # faded: still helped (main job)
        ({"attention_init": "structured", "structured_attention_fade": 0.0}, True),
        (None, False),  # a folder without training_args.json (a stock BERT)
        ("{not json", False),
    ],
)
def test_a_folder_pretrained_from_the_structured_start_gets_the_reinit_hint(tmp_path, training_args, hinted):
    from hfbert.finetune.models import reinit_query_key_hint

    if training_args is not None:
        text = training_args if isinstance(training_args, str) else json.dumps(training_args)
        (tmp_path / "training_args.json").write_text(text)
    hint = reinit_query_key_hint(str(tmp_path))
    assert (hint is not None) == hinted
    if hinted:
        assert "--reinit_query_key" in hint and str(tmp_path) in hint


def test_the_reinit_hint_says_where_it_helped_and_where_it_did_not(tmp_path):
    """The note said such folders fine-tuned better "in every measurement so far"; own_text.md measured two
    folders from the same start (the own-text recipe) that did not."""
    from hfbert.finetune.models import reinit_query_key_hint

    (tmp_path / "training_args.json").write_text(json.dumps({"attention_init": "structured"}))
    hint = reinit_query_key_hint(str(tmp_path))
    assert "every measurement" not in hint
    assert "downstream.md" in hint and "own_text.md" in hint


def test_reinit_query_key_refuses_a_model_without_bert_attention():
    from hfbert.finetune.models import reinitialise_query_key

    with pytest.raises(ValueError, match="no attention projections named query and key"):
        reinitialise_query_key(torch.nn.Sequential(torch.nn.Linear(2, 2)))


# ------------------------------------------------------------------------------------------------ issue 34


def refused_before_training(argv, message):
    """main(argv) raises a Refusal matching `message`, and nothing was fine-tuned."""
    with (
        mock.patch("hfbert.finetune.run.finetune_once") as finetune_once,
        pytest.raises(Refusal, match=message),
    ):
        main(argv)
    finetune_once.assert_not_called()


@pytest.fixture
def topic_files(tmp_path):
    return write_csv(tmp_path / "train.csv", topic_rows(8, seed=0)), write_csv(
        tmp_path / "dev.csv", topic_rows(4, 1)
    )


def checkpoint_like(folder, path):
    """A checkpoint-<step> folder as an hfbert up to 88be5f0 wrote it: the model and config, the tokenizer below
    (tokenizer/), a sha256 manifest."""
    path.mkdir(parents=True)
    for name in ("config.json", "model.safetensors", "configuration_hfbert.py", "modeling_hfbert.py"):
        shutil.copy(folder / name, path / name)
    (path / "tokenizer").mkdir()
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(folder / name, path / "tokenizer" / name)
    files = {
        p.relative_to(path).as_posix(): {"size": p.stat().st_size, "sha256": sha256_file(p)}
        for p in sorted(path.rglob("*")) if p.is_file()
    }  # fmt: skip
    manifest = {"format_version": MANIFEST_FORMAT_VERSION, "step": 4, "num_processes": 1, "files": files}
    (path / MANIFEST_NAME).write_text(json.dumps(manifest))
    return path


def test_a_checkpoint_folder_is_fine_tuned_with_its_tokenizer_and_refused_when_its_weights_changed(
    tmp_path, folder, topic_files
):
    checkpoint = checkpoint_like(folder, tmp_path / "run" / "checkpoint-4")
    with mock.patch("hfbert.finetune.run.finetune_once", return_value=fit_result(0.75)) as finetune_once:
        main(args_for(checkpoint, *topic_files, tmp_path / "out", "--seeds", "1"))
    assert finetune_once.call_count == 1
    weights = checkpoint / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[-1] ^= 1  # same size, readable header: only the checksum tells
    weights.write_bytes(bytes(data))
    refused_before_training(
        args_for(checkpoint, *topic_files, tmp_path / "out"), "model.safetensors is corrupted"
    )


def test_folders_without_a_tokenizer_are_refused_before_any_training(tmp_path, folder, topic_files):
    bare = tmp_path / "bare"
    shutil.copytree(folder, bare, ignore=shutil.ignore_patterns("tokenizer*"))
    refused_before_training(args_for(bare, *topic_files, tmp_path / "out"), "holds no tokenizer")
    refused_before_training(
        args_for(folder, *topic_files, tmp_path / "out", "--compare", str(bare)),
        r"--compare .*holds no tokenizer",
    )


def test_a_folder_without_config_or_with_unreadable_weights_is_refused(tmp_path, folder, topic_files):
    damaged = tmp_path / "damaged"
    shutil.copytree(folder, damaged)
    damage(damaged / "model.safetensors", "truncated")
    refused_before_training(
        args_for(damaged, *topic_files, tmp_path / "out"), "model.safetensors is truncated"
    )
    (damaged / "config.json").unlink()
    refused_before_training(
        args_for(folder, *topic_files, tmp_path / "out", "--compare", str(damaged)), "--compare"
    )


def test_an_output_folder_that_cannot_be_written_is_refused_before_training(
    tmp_path, folder, topic_files, read_only_folder
):
    refused_before_training(
        args_for(folder, *topic_files, read_only_folder), "--output_dir .* cannot be written"
    )


def test_max_seq_length_beyond_the_models_positions_is_refused(tmp_path, folder, topic_files):
    refused_before_training(
        args_for(folder, *topic_files, tmp_path / "out", "--max_seq_length", "512"),
        r"--max_seq_length 512 exceeds .*max_position_embeddings 128",
    )


def test_sample_counts_against_classes_and_rows_are_refused(tmp_path, folder, topic_files):
    three = write_csv(tmp_path / "three.csv", [{"text": f"row {i}", "label": i % 3} for i in range(9)])
    refused_before_training(
        args_for(folder, three, three, tmp_path / "out", "--max_train_samples", "2"),
        r"--max_train_samples 2 .* 3 classes",
    )
    refused_before_training(
        args_for(folder, *topic_files, tmp_path / "out", "--max_train_samples", "9"),
        r"--max_train_samples 9 .* 8",
    )
    refused_before_training(
        args_for(folder, *topic_files, tmp_path / "out", "--max_eval_samples", "5"),
        r"--max_eval_samples 5 .* 4",
    )


def write_bytes(path, data: bytes):
    path.write_bytes(data)
    return path


@pytest.mark.parametrize(
    ("name", "content", "message"),
    [
        ("empty.csv", b"", r"empty\.csv is empty"),
        ("header.csv", b"text,label\n", r"header\.csv has no data rows"),
        ("empty.jsonl", b"\n", r"empty\.jsonl is empty"),
        ("latin.csv", "text,label\ncaf\u00e9,1\nthe,0\n".encode("latin-1"),
         r"latin\.csv is not UTF-8 .*byte.*; save it as UTF-8 \(e\.g\. iconv -f latin1 -t utf-8, or 'CSV UTF-8' in a spreadsheet\)$"),
        ("text.csv", b"text,label\n,1\nthe ship,0\n", r"text\.csv: row 1 .* has an empty or missing 'text'"),
        ("label.csv", b"text,label\na ship,\nthe ship,0\nthe team,1\n", r"label\.csv: row 1 .* has an empty or missing 'label'"),
        ("null.jsonl", b'{"text": "a", "label": null}\n{"text": "b", "label": 1}\n{"text": "c", "label": 0}\n',
         r"null\.jsonl: row 1 .*missing 'label'"),
        ("garbled.jsonl", b'{"text": "a", "label": 1}\n{"text": "b", "lab\n', r"garbled\.jsonl line 2 is not JSON"),
        ("missing.csv", None, r"--validation_file .*missing\.csv: no such file"),
        ("utf16.csv", "text,label\nthe ship,0\n".encode("utf-16"), r"utf16\.csv is UTF-16, not UTF-8"),
        ("quote.csv", b'text,label\n"a ship,1\nthe ship,0\n', r"quote\.csv is not valid CSV"),
        ("list.jsonl", b'{"text": "a", "label": 1}\n[1, 2]\n', r"list\.jsonl .*not one object per row"),
    ],
)  # fmt: skip
def test_bad_validation_files_are_refused_naming_the_file(
    tmp_path, folder, topic_files, name, content, message
):
    validation = tmp_path / name if content is None else write_bytes(tmp_path / name, content)
    refused_before_training(args_for(folder, topic_files[0], validation, tmp_path / "out"), message)


def test_rows_longer_than_max_seq_length_are_truncated_to_it(tmp_path):
    from transformers import BertTokenizerFast

    from hfbert.finetune.data import TaskData, encode

    vocab = tmp_path / "vocab.txt"
    vocab.write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "ship", "sea"]) + "\n")
    tokenizer = BertTokenizerFast(vocab_file=str(vocab))
    rows = datasets.Dataset.from_list([{"text": "ship sea " * 50, "label": 0}, {"text": "ship", "label": 1}])
    task = TaskData(rows, rows, "text", None, ["0", "1"], ("accuracy",), "validation")
    lengths = [len(ids) for ids in encode(task, rows, tokenizer, max_seq_length=16)["input_ids"]]
    assert lengths == [16, 3]


def test_max_eval_samples_keeps_that_many_evaluation_rows_and_labels_stop_being_classes_past_half_the_rows(tmp_path):
    """Issue 45: --max_eval_samples's selection and the label column's cardinality edge had no fast test."""
    from hfbert.finetune.settings import parse_args

    rows = [{"text": f"row {i}", "label": i % 50} for i in range(100)]  # 50 classes in 100 rows: the edge
    path = write_csv(tmp_path / "rows.csv", rows)
    flags = ["model", "--train_file", str(path), "--validation_file", str(path)]
    task = load_task(parse_args([*flags, "--max_eval_samples", "7"]).data)
    assert len(task.label_names) == 50 and len(task.evaluation) == 7 and len(task.train) == 100
    wider = write_csv(tmp_path / "wider.csv", [*rows, {"text": "row 100", "label": 50}])  # 51 in 101 rows
    with pytest.raises(Refusal, match=r"--label_column label has 51 distinct values in 101 training examples: not "
                                      r"categorical; pass the column that holds the class$"):  # fmt: skip
        load_task(parse_args(["model", "--train_file", str(wider), "--validation_file", str(wider)]).data)


def test_texts_keep_their_line_breaks_and_unicode_separators(tmp_path):
    from hfbert.finetune.settings import parse_args

    texts = ["a ship\nat sea", "a team\u2028won", "the ship\x0csank", "the team lost"]
    rows = [{"text": text, "label": index % 2} for index, text in enumerate(texts)]
    jsonl = tmp_path / "rows.jsonl"
    jsonl.write_text("".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows), encoding="utf-8")
    for path in (write_csv(tmp_path / "rows.csv", rows), jsonl):
        task = load_task(
            parse_args(["model", "--train_file", str(path), "--validation_file", str(path)]).data
        )
        assert task.train["text"] == texts, path


def test_a_folder_with_a_tokenizer_config_but_no_vocabulary_is_refused(tmp_path, folder, topic_files):
    config_only = tmp_path / "config-only"
    shutil.copytree(folder, config_only, ignore=shutil.ignore_patterns("tokenizer.json"))
    refused_before_training(args_for(config_only, *topic_files, tmp_path / "out"), "holds no tokenizer")
    (config_only / "tokenizer.json").write_text("{}")  # JSON, but no tokenizer
    refused_before_training(
        args_for(config_only, *topic_files, tmp_path / "out"),
        r"tokenizer in .*config-only cannot be loaded .*; save the tokenizer the model was trained with into the "
        "folder again$",
    )
    missing = tmp_path / "missing"
    refused_before_training(
        args_for(missing, *topic_files, tmp_path / "out"),
        f"^model_dir {missing}: no such folder; pass a finished run's output folder",
    )


def test_a_tokenizer_larger_than_the_models_embeddings_is_refused_naming_the_fix(tmp_path, folder, topic_files):
    small = tmp_path / "small"
    shutil.copytree(folder, small)
    config = json.loads((small / "config.json").read_text())
    config["vocab_size"] = 10
    (small / "config.json").write_text(json.dumps(config))
    refused_before_training(
        args_for(small, *topic_files, tmp_path / "out"),
        r"its tokenizer has \d+ tokens but the model only 10 embeddings; save the tokenizer the model was "
        "trained with into the folder$",
    )


@pytest.mark.parametrize(
    "flags", [("--dataset_name", "nyu-mll/glue", "--validation_file", "dev.csv"),
              ("--train_file", "a.csv", "--validation_file", "b.csv", "--dataset_config_name", "sst2")],
)  # fmt: skip
def test_data_flags_that_would_be_ignored_are_refused(flags):
    from hfbert.finetune.settings import parse_args

    with pytest.raises(Refusal, match="with --"):  # names the flag it goes with
        parse_args(["model", *flags])


def test_labels_are_read_alike_from_csv_jsonl_and_parquet(tmp_path):
    from hfbert.finetune.settings import parse_args

    texts = ["a ship", "a team", "a song", "the ship", "the team", "the song"]
    csv_path = write_bytes(tmp_path / "floats.csv", b"text,label\n" + b"".join(
        f"{text},{index % 3}.0\n".encode() for index, text in enumerate(texts)))  # fmt: skip
    mixed = write_jsonl(tmp_path / "mixed.jsonl", [
        {"text": text, "label": index % 3 if index % 2 else str(index % 3)} for index, text in enumerate(texts)])  # fmt: skip
    parquet = tmp_path / "floats.parquet"
    datasets.Dataset.from_dict({"text": texts, "label": [float(i % 3) for i in range(6)]}).to_parquet(parquet)
    label_ids = []
    for path in (csv_path, mixed, parquet):
        task = load_task(
            parse_args(["model", "--train_file", str(path), "--validation_file", str(path)]).data
        )
        assert task.label_names == ["0", "1", "2"], path
        label_ids.append(task.train["labels"])
    assert label_ids[0] == label_ids[1] == label_ids[2] == [0, 1, 2, 0, 1, 2]


def fake_build(candidate, *args, **kwargs):
    """Stands in for build_model: a marker naming where the model came from."""
    return mock.Mock(source=(str(candidate.folder), candidate.init))


@pytest.mark.parametrize("compare_name", ["pretrained", "random_init"])
def test_results_belong_to_the_model_they_came_from(tmp_path, folder, topic_files, compare_name):
    model = tmp_path / "model"
    shutil.copytree(folder, model)
    other = tmp_path / "cmp" / compare_name
    shutil.copytree(folder, other)
    accuracy = {(str(model), "pretrained"): 0.875, (str(other), "pretrained"): 0.125}
    with (
        mock.patch("hfbert.finetune.run.build_model", side_effect=fake_build),
        mock.patch(
            "hfbert.finetune.run.finetune_once",
            side_effect=lambda m, *rest: fit_result(accuracy[m.source], majority_rate=0.1),
        ),
    ):
        results = main(
            args_for(model, *topic_files, tmp_path / "out", "--compare", str(other), "--update_model_card")
        )
    assert set(results["models"]) == {"model", "comparison"}
    assert results["models"]["model"]["folder"] == str(model)
    assert results["models"]["model"]["summary"]["accuracy"]["per_seed"] == [0.875, 0.875]
    assert results["models"]["comparison"] == {
        "folder": str(other), "init": "pretrained", "learning_rate": 2e-3, "num_train_epochs": 6,
        "learning_rate_selection": None, "summary": mock.ANY, "collapsed": {}, "fits": mock.ANY}  # fmt: skip
    assert results["gain"]["accuracy"]["mean"] == pytest.approx(0.75)
    card = (model / "README.md").read_text()
    assert "0.875" in card and "0.125" not in card
    assert "dev.csv" in card and "name: train\n" not in card  # named after the files, not the stem "train"
    saved = json.loads((tmp_path / "out" / RESULTS_NAME).read_text())
    assert set(saved["models"]) == {"model", "comparison"}


def test_a_folder_named_random_init_in_the_working_directory_is_ambiguous(
    tmp_path, folder, topic_files, monkeypatch
):
    monkeypatch.chdir(tmp_path)
    shutil.copytree(folder, tmp_path / RANDOM_INIT)
    refused_before_training(
        args_for(folder, *topic_files, tmp_path / "out", "--compare", RANDOM_INIT), r"\./random_init"
    )


def finetune_command(*argv):
    return [sys.executable, "-m", "hfbert.finetune", *map(str, argv)]


@pytest.mark.slow
def test_a_refusal_is_one_line_and_exit_code_2(tmp_path, folder):
    empty = write_bytes(tmp_path / "empty.csv", b"")
    result = subprocess.run(
        finetune_command(folder, "--train_file", empty, "--validation_file", empty, "--seeds", "1", "--quiet"),
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert result.returncode == 2, result.stderr
    assert result.stderr.strip().splitlines() == [f"python -m hfbert.finetune: error: --train_file {empty} is empty; "
                                                  "pass a file with a header line and labelled rows"]  # fmt: skip


@pytest.mark.slow
def test_quiet_prints_only_the_results(tmp_path, folder):
    train = write_csv(tmp_path / "train.csv", topic_rows(8, seed=0))
    result = subprocess.run(
        finetune_command(folder, "--train_file", train, "--validation_file", train, "--seeds", "1",
                         "--num_train_epochs", "1", "--output_dir", tmp_path / "out", "--quiet", "--compare", RANDOM_INIT),
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    output = result.stdout + result.stderr
    for noise in ("LOAD REPORT", "Map", "Loading weights", "it/s", "train_runtime", "eval_loss"):
        assert noise not in output


@pytest.mark.slow
def test_sigterm_during_fine_tuning_says_so_and_leaves_no_temporary_folder(tmp_path, folder):
    train = write_csv(tmp_path / "train.csv", topic_rows(64, seed=0))
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    process = subprocess.Popen(
        finetune_command(folder, "--train_file", train, "--validation_file", train, "--seeds", "1",
                         "--num_train_epochs", "1000", "--output_dir", tmp_path / "out", "--quiet"),
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env={**os.environ, "TMPDIR": str(scratch)},
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 240
        while (
            not list(scratch.glob("hfbert-finetune-*")) and time.monotonic() < deadline and process.poll() is None
        ):
            time.sleep(0.2)
        assert list(scratch.glob("hfbert-finetune-*")), (
            "the Trainer's scratch folder never appeared: nothing to clean up"
        )
        time.sleep(1)  # into trainer.train()
        process.send_signal(signal.SIGTERM)
        _, stderr = process.communicate(timeout=120)
        assert process.returncode == 128 + signal.SIGTERM, stderr
        assert stderr.strip().splitlines()[-1].startswith("python -m hfbert.finetune: stopped by SIGTERM")
        assert not list(scratch.glob("hfbert-finetune-*"))
    finally:  # a failed assertion must not leave a 1000-epoch fine-tuning running
        process.kill()
        process.wait()
    assert not (tmp_path / "out").exists()


@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")  # the ignored Stopped, on purpose
def test_a_stop_signal_lost_in_a_finalizer_still_stops_at_the_next_update():
    """Python ignores an exception raised inside __del__ ("Exception ignored in ..."): a SIGTERM whose handler
    ran there would let fine-tuning go on (seen: the SIGTERM test's run kept training, under load)."""
    from hfbert.finetune.fit import StopAtNextUpdate, Stopped, stop_on_signals

    class SignalsInItsFinalizer:
        def __del__(self):
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(0.1)  # the handler runs here, and its Stopped is ignored

    with stop_on_signals():
        SignalsInItsFinalizer()
        with pytest.raises(Stopped, match="SIGTERM"):
            StopAtNextUpdate().on_step_end(None, None, None)
    StopAtNextUpdate().on_step_end(None, None, None)  # the block is over: nothing is pending


def test_a_compare_folder_without_a_sequence_classifier_is_refused_before_the_model_trains(
    tmp_path, folder, topic_files
):
    from safetensors.torch import save_file
    from transformers import ViTConfig

    vision = tmp_path / "vision"
    ViTConfig(hidden_size=8, num_hidden_layers=1, num_attention_heads=2, intermediate_size=8).save_pretrained(
        vision
    )
    save_file({"weight": torch.zeros(2)}, vision / "model.safetensors")
    shutil.copy(folder / "tokenizer.json", vision / "tokenizer.json")
    refused_before_training(
        args_for(folder, *topic_files, tmp_path / "out", "--compare", str(vision)),
        r"--compare .*vit.* no sequence-classification",
    )


def test_a_model_card_whose_metadata_does_not_parse_is_refused_before_training(tmp_path, folder, topic_files):
    model = tmp_path / "model"
    shutil.copytree(folder, model)
    (model / "README.md").write_text("---\nlicense: [apache\n---\n\n# model\n")
    argv = args_for(model, *topic_files, tmp_path / "out", "--update_model_card")
    refused_before_training(argv, r"metadata of .*README\.md .*cannot be read")


def test_a_json_line_without_the_pair_column_is_a_missing_text_not_a_missing_column(tmp_path, folder):
    rows = [{"text": "a ship", "label": 0}, {"text": "a team", "second": "it won", "label": 1}]
    pairs = write_jsonl(tmp_path / "pairs.jsonl", rows)
    refused_before_training(
        args_for(folder, pairs, pairs, tmp_path / "out", "--text_pair_column", "second"),
        r"pairs\.jsonl: row 1 .* has an empty or missing 'second'",
    )


# ------------------------------------------------------------------------------------------------ issue 33, item 4


# Fold scores per rate for the recorded runs below: 3e-4 is best on two folds but collapses (at the majority-class
# rate 0.5) on the third, 1e-4 is steady but low, 1e-3 wins on mean minus spread.
FOLD_SCORES = {1e-4: [0.6, 0.6, 0.6], 3e-4: [0.95, 0.95, 0.5], 1e-3: [0.9, 0.7, 0.9]}


def recording_finetune(calls):
    """Stands in for finetune_once: records what each run trained and was scored on; selection runs score
    FOLD_SCORES (in fold order, per model and rate), the final runs 0.8."""

    def finetune_once(model, tokenizer, train, evaluation, training, seed, learning_rate, epochs):
        earlier = [c for c in calls if c["init"] == model.source[1] and c["rate"] == learning_rate]
        calls.append({
            "init": model.source[1], "train": [tuple(ids) for ids in train["input_ids"]],
            "evaluation": [tuple(ids) for ids in evaluation["input_ids"]], "rate": learning_rate, "epochs": epochs,
            "seed": seed,
        })  # fmt: skip
        scores = FOLD_SCORES.get(learning_rate, [])
        return fit_result(
            scores[len(earlier)] if len(earlier) < len(scores) and len(evaluation) < 10 else 0.8
        )

    return finetune_once


def encoded(folder, rows):
    tokenizer = AutoTokenizer.from_pretrained(folder)
    return {tuple(tokenizer(row["text"], truncation=True, max_length=128)["input_ids"]) for row in rows}


def test_auto_chooses_each_models_rate_on_folds_of_the_training_rows_and_never_on_the_evaluation_file(
    tmp_path, folder
):
    train_rows = [{"text": f"{text} number {i}", "label": topic} for i, (topic, text) in
                  enumerate((t, x) for t in sorted(TOPICS) for x in TOPICS[t] for _ in range(3))]  # fmt: skip
    evaluation_rows = [{"text": "the harbour was full of boats", "label": "ships"},
                       {"text": "the referee stopped the race", "label": "sport"}] * 6  # fmt: skip
    train = write_csv(tmp_path / "train.csv", train_rows)
    validation = write_csv(tmp_path / "validation.csv", evaluation_rows)
    argv = [str(folder), "--train_file", str(train), "--validation_file", str(validation), "--seeds", "4", "5",
            "--compare", RANDOM_INIT, "--output_dir", str(tmp_path / "out"), "--quiet"]  # fmt: skip
    calls = []
    with (
        mock.patch("hfbert.finetune.run.build_model", side_effect=fake_build),
        mock.patch("hfbert.finetune.run.finetune_once", side_effect=recording_finetune(calls)),
    ):
        results = main(argv)
    training_ids, evaluation_ids = encoded(folder, train_rows), encoded(folder, evaluation_rows)
    for init in ("pretrained", RANDOM_INIT):  # the comparison gets its own choice, made the same way
        runs = [call for call in calls if call["init"] == init]
        selection, final = runs[:9], runs[9:]
        assert [(call["rate"], call["seed"]) for call in selection] == [
            (rate, seed) for rate in (1e-4, 3e-4, 1e-3) for seed in (4, 5, 4)
        ]  # fold i with seed i of --seeds, in turn
        assert all(call["epochs"] == 20 for call in selection)  # tiny folder: 20 epochs
        for rate in (1e-4, 3e-4, 1e-3):
            folds = [call for call in selection if call["rate"] == rate]
            held_out = [row for call in folds for row in call["evaluation"]]
            assert sorted(held_out) == sorted(training_ids)  # every training row held out exactly once
            for call in folds:
                assert len(call["evaluation"]) == 6 and len(call["train"]) == 12
                assert not set(call["evaluation"]) & set(call["train"])
                assert not (set(call["evaluation"]) | set(call["train"])) & evaluation_ids
        assert [(call["rate"], call["seed"]) for call in final] == [(1e-3, 4), (1e-3, 5)]
        assert all(set(call["evaluation"]) == evaluation_ids and len(call["train"]) == 18 for call in final)
    saved = json.loads((tmp_path / "out" / RESULTS_NAME).read_text())
    for role in ("model", "comparison"):
        model = saved["models"][role]
        assert model["learning_rate"] == 1e-3 and model["num_train_epochs"] == 20
        selection = model["learning_rate_selection"]
        assert selection["fold_scores"] == {f"{rate:g}": scores for rate, scores in FOLD_SCORES.items()}
        assert (
            list(selection["dropped"]) == ["0.0003"]
            and "fold 3 (seed 4) collapsed" in selection["dropped"]["0.0003"]
        )
        assert (
            selection["folds"] == 3 and "3 stratified folds of the 18 training rows" in selection["chosen_on"]
        )
    assert results["models"] == saved["models"]


def test_an_explicit_learning_rate_skips_the_choice(tmp_path, folder, topic_files):
    calls = []
    with (
        mock.patch("hfbert.finetune.run.build_model", side_effect=fake_build),
        mock.patch("hfbert.finetune.run.finetune_once", side_effect=recording_finetune(calls)),
    ):
        results = main([str(folder), "--train_file", str(topic_files[0]), "--validation_file", str(topic_files[1]),
                        "--learning_rate", "5e-5", "--num_train_epochs", "3", "--seeds", "1", "2",
                        "--output_dir", str(tmp_path / "out"), "--quiet"])  # fmt: skip
    assert [(call["rate"], call["epochs"], len(call["train"])) for call in calls] == [
        (5e-5, 3, 8),
        (5e-5, 3, 8),
    ]
    model = results["models"]["model"]
    assert model["learning_rate"] == 5e-5 and model["learning_rate_selection"] is None


def test_a_held_out_split_too_small_for_the_classes_is_refused_before_training(tmp_path, folder, topic_files):
    argv = [str(folder), "--train_file", str(topic_files[0]), "--validation_file", str(topic_files[1]),
            "--output_dir", str(tmp_path / "out"), "--quiet"]  # fmt: skip
    refused_before_training(
        [*argv, "--max_train_samples", "4"],
        r"holds out each of 3 folds of the 4 training rows .* classes 'ships' \(2\), 'sport' \(2\) have fewer rows than "
        r"folds; pass more training rows \(a larger --max_train_samples\), fewer --learning_rate_folds",
    )
    with mock.patch("hfbert.finetune.run.finetune_once", return_value=fit_result(0.75)) as finetune_once:
        main([*argv, "--max_train_samples", "4", "--learning_rate_folds", "2", "--seeds", "1"])
    assert finetune_once.call_count == 3 * 2 + 1  # the default grid's three rates on two folds, then the seed


@pytest.mark.parametrize(
    "hidden_size, epochs, rates", [(128, 20, (1e-4, 3e-4, 1e-3)), (256, 20, (1e-4, 3e-4, 1e-3)),
                                   (768, 3, (2e-5, 3e-5, 5e-5, 1e-4)), (1024, 3, (2e-5, 3e-5, 5e-5, 1e-4))]
)  # fmt: skip
def test_epochs_and_rates_default_by_model_size(hidden_size, epochs, rates):
    from hfbert.finetune.models import size_defaults

    assert size_defaults(hidden_size) == (epochs, rates)


def test_a_config_without_hidden_size_needs_explicit_epochs_and_rate():
    from hfbert.finetune.models import training_settings
    from hfbert.finetune.settings import parse_args

    files = ["model", "--train_file", "t.csv", "--validation_file", "v.csv"]
    with pytest.raises(
        Refusal, match=r"model_dir model: its config has no hidden_size.*pass --num_train_epochs"
    ):
        training_settings(object(), "model_dir model", parse_args(files).training)
    explicit = parse_args([*files, "--learning_rate", "1e-3", "--num_train_epochs", "4"])
    assert training_settings(object(), "model_dir model", explicit.training) == (4.0, (1e-3,))


@pytest.mark.parametrize(
    "flags, message",
    [(["--learning_rate", "fast"], "neither 'auto' nor a number"),
     (["--learning_rate", "1e-3", "--learning_rate_grid", "1e-4"], "--learning_rate_grid goes with"),
     (["--learning_rate_grid", "1e-4", "1e-4"], "distinct rates"), (["--learning_rate", "0"], "must be > 0")],
)  # fmt: skip
def test_learning_rate_flags_that_cannot_work_are_refused(flags, message):
    from hfbert.finetune.settings import parse_args

    with pytest.raises(Refusal) as refused:
        parse_args(["model", "--train_file", "t.csv", "--validation_file", "v.csv", *flags])
    assert message in str(refused.value)


@pytest.mark.parametrize(
    "flags, message",
    [(["--learning_rate_grid", "0", "1e-4"], "--learning_rate_grid [0.0, 0.0001]: distinct rates > 0"),
     (["--warmup_ratio", "1"], "--warmup_ratio 1.0 must be in [0, 1)"),
     (["--warmup_ratio", "-0.1"], "--warmup_ratio -0.1 must be in [0, 1)"),
     (["--max_eval_samples", "0"], "--max_eval_samples 0 must be >= 1"),
     (["--max_train_samples", "1"], "--max_train_samples 1 must be >= 2")],
)  # fmt: skip
def test_flags_at_the_edge_of_their_range_are_refused_and_the_edge_itself_is_not(flags, message):
    """Issue 45: mutation testing of the flag checks left the boundaries untested (0 in the grid, a ratio of 1)."""
    from hfbert.finetune.settings import parse_args

    files = ["model", "--train_file", "t.csv", "--validation_file", "v.csv"]
    with pytest.raises(Refusal) as refused:
        parse_args([*files, *flags])
    assert message in str(refused.value)
    edges = ["--warmup_ratio", "0", "--max_eval_samples", "1", "--max_train_samples", "2"]
    assert parse_args([*files, *edges]).training.warmup_ratio == 0


def test_local_training_rows_need_a_validation_file_and_the_refusal_says_why():
    from hfbert.finetune.settings import parse_args

    with pytest.raises(Refusal) as refused:
        parse_args(["model", "--train_file", "t.csv"])
    assert str(refused.value) == "--train_file needs --validation_file: results are measured on held-out examples"


@pytest.mark.slow
def test_auto_learning_rate_trains_end_to_end_with_the_trainer(tmp_path, folder):
    train = write_csv(tmp_path / "train.csv", topic_rows(20, seed=0))
    validation = write_csv(tmp_path / "validation.csv", topic_rows(8, seed=1))
    results = main([str(folder), "--train_file", str(train), "--validation_file", str(validation), "--seeds", "1",
                    "--learning_rate_grid", "1e-4", "3e-3", "--num_train_epochs", "2",
                    "--output_dir", str(tmp_path / "out"), "--quiet"])  # fmt: skip
    selection = results["models"]["model"]["learning_rate_selection"]
    assert set(selection["fold_scores"]) == {"0.0001", "0.003"} and selection["folds"] == 3
    assert [(fit["rate"], fit["fold"], fit["seed"]) for fit in selection["fold_fits"]] == [
        (rate, fold, 1) for rate in (1e-4, 3e-3) for fold in range(3)
    ]
    assert all(
        len(fit["epoch_losses"]) == 2 and sum(fit["predicted_counts"]) in (6, 7)
        for fit in selection["fold_fits"]
    )
    assert results["models"]["model"]["learning_rate"] in (1e-4, 3e-3)
    assert len(results["models"]["model"]["fits"]["1"]["epoch_losses"]) == 2


# ------------------------------------------------------------------------------------------------ issue 42


def fold_fits(scores_by_rate, collapsed=()):
    """{FoldFit: FitResult} scoring `scores_by_rate` (fold order); (rate, fold) in `collapsed` at the majority rate."""
    from hfbert.finetune.selection import FoldFit

    return {
        FoldFit(rate, fold, fold + 1): fit_result(0.5 if (rate, fold) in collapsed else score)
        for rate, scores in scores_by_rate.items() for fold, score in enumerate(scores)
    }  # fmt: skip


def test_the_rate_choice_drops_a_rate_with_a_collapsed_or_underfitted_fold_and_prefers_a_steady_rate():
    from hfbert.finetune.selection import FoldFit, choose_rate

    steady_vs_erratic = fold_fits({1e-3: [0.9, 0.9, 0.9], 3e-3: [1.0, 1.0, 0.75]})  # mean 0.917, spread 0.144
    assert choose_rate(steady_vs_erratic, "accuracy").chosen == 1e-3
    best_but_collapsed = fold_fits({1e-4: [0.6, 0.6, 0.6], 3e-4: [1.0, 1.0, 1.0]}, collapsed={(3e-4, 2)})
    choice = choose_rate(best_but_collapsed, "accuracy")
    assert choice.chosen == 1e-4 and list(choice.dropped) == [3e-4] and choice.note is None
    assert (
        "fold 3 (seed 3) collapsed: accuracy 0.500, no better than the majority-class rate 0.500"
        in choice.dropped[3e-4]
    )
    assert (
        choose_rate(fold_fits({1e-4: [0.7, 0.7], 3e-4: [0.7, 0.7]}), "accuracy").chosen == 1e-4
    )  # a tie: lower
    everything = fold_fits(
        {1e-4: [0.7, 0.7], 3e-4: [0.9, 0.9], 1e-3: [0.8, 0.8]}, collapsed={(1e-4, 0), (3e-4, 0), (3e-4, 1), (1e-3, 1)}
    )
    choice = choose_rate(everything, "accuracy")  # 1e-4 and 1e-3 collapsed once, 3e-4 (ranked best: 0.5) twice
    assert choice.ranking[3e-4] > choice.ranking[1e-4] > choice.ranking[1e-3] and choice.chosen == 1e-4
    assert choice.note.startswith("a fit collapsed or underfitted at every rate of the grid, so the rate with the fewest")
    # 1e-4 scores best on every fold, but its training loss stayed at 80% of its start on one: dropped
    underfitted = fold_fits({1e-4: [0.9, 0.9, 0.9], 1e-3: [0.8, 0.8, 0.8]})
    underfitted[FoldFit(1e-4, 1, 2)] = fit_result(0.9, epoch_losses=(1.0, 0.8))
    choice = choose_rate(underfitted, "accuracy")
    assert choice.chosen == 1e-3 and choice.dropped[1e-4].startswith(
        "fold 2 (seed 2) underfitted: training loss still 80% of its first epoch's (1.000 -> 0.800)"
    )


def test_the_selection_plan_fits_each_rate_on_each_fold_with_the_seeds_in_turn():
    from hfbert.finetune.selection import FoldFit, selection_plan

    assert selection_plan([3e-4, 1e-4], 3, [7, 8]) == [
        FoldFit(1e-4, 0, 7), FoldFit(1e-4, 1, 8), FoldFit(1e-4, 2, 7),
        FoldFit(3e-4, 0, 7), FoldFit(3e-4, 1, 8), FoldFit(3e-4, 2, 7),
    ]  # fmt: skip


def test_the_rate_choice_reports_each_rate_s_fold_scores_in_fold_order():
    from hfbert.finetune.selection import choose_rate

    fits = fold_fits({1e-4: [0.6, 0.8], 3e-4: [1.0, 1.0]}, collapsed={(3e-4, 1)})
    choice = choose_rate(dict(reversed(fits.items())), "accuracy")
    assert choice.as_json() == {
        "chosen": 1e-4,
        "metric": "accuracy",
        "rule": "rates with a collapsed or underfitted fold dropped; the best mean minus spread over the folds "
        "(lower rate on a tie)",
        "fold_scores": {"0.0001": [0.6, 0.8], "0.0003": [1.0, 0.5]},
        "mean_minus_spread": {"0.0001": pytest.approx(0.7 - 0.1414214), "0.0003": pytest.approx(0.75 - 0.3535534)},
        "dropped": {"0.0003": choice.dropped[3e-4]},
        "note": None,
    }
    assert choice.dropped[3e-4].startswith("fold 2 (seed 2) collapsed: ")


@pytest.mark.parametrize(
    "accuracy, majority_rate, losses, collapsed",
    [(0.2, 0.2, (1.6, 0.1), "no better than the majority-class rate 0.200"),
     (0.432, 0.2, (1.6, 1.61), "training loss never fell below its start (1.600 in the first epoch, 1.610 in the last)"),
     (0.432, 0.2, (1.6, 1.2), None), (0.21, 0.2, (1.6,), None)],
)  # fmt: skip
def test_a_fit_collapsed_at_the_majority_class_rate_or_when_its_loss_never_fell(
    accuracy, majority_rate, losses, collapsed
):
    result = fit_result(accuracy, majority_rate, losses)
    assert (result.collapse is None) == (collapsed is None)
    if collapsed:
        assert collapsed in result.collapse and result.as_json()["collapsed"] == result.collapse


@pytest.mark.parametrize(
    "losses, underfit",
    [((1.0, 0.71), "training loss still 71% of its first epoch's (1.000 -> 0.710)"), ((1.0, 0.7), None),
     ((1.0, 1.2), "120%"), ((1.0,), None)],
)  # fmt: skip
def test_a_fit_underfitted_when_its_training_loss_stayed_above_seventy_percent_of_its_start(losses, underfit):
    result = fit_result(0.9, 0.5, losses)
    assert (result.underfit is None) == (underfit is None)
    if underfit:
        assert underfit in result.underfit and result.as_json()["underfit"] == result.underfit


def test_the_gain_is_paired_per_seed_with_an_interval_and_says_when_it_is_within_the_noise():
    from hfbert.finetune.report import paired_gain

    model = {"accuracy": {"per_seed": [0.80, 0.70, 0.78]}}
    comparison = {"accuracy": {"per_seed": [0.76, 0.74, 0.72]}}
    gain = paired_gain(model, comparison, [1, 2, 3])["accuracy"]
    assert gain["per_seed"] == pytest.approx({"1": 0.04, "2": -0.04, "3": 0.06})
    assert gain["mean"] == pytest.approx(0.02) and gain["std"] == pytest.approx(0.0529, abs=1e-4)
    assert gain["interval_95"] == pytest.approx(
        [0.02 - 4.303 * 0.052915 / 3**0.5, 0.02 + 4.303 * 0.052915 / 3**0.5], abs=1e-4
    )
    assert (gain["ahead_at"], gain["behind_at"]) == (2, 1)
    assert (
        gain["verdict"].startswith("within the seed-to-seed noise")
        and "--seeds 1 2 3 4 5 6" in gain["verdict"]
    )
    clear = paired_gain({"accuracy": {"per_seed": [0.9, 0.91, 0.92]}}, comparison, [1, 2, 3])["accuracy"]
    assert clear["verdict"] == "ahead beyond the seed-to-seed noise" and clear["interval_95"][0] > 0
    one = paired_gain({"accuracy": {"per_seed": [0.9]}}, {"accuracy": {"per_seed": [0.8]}}, [7])["accuracy"]
    assert one["interval_95"] is None and one["verdict"].startswith("one seed: no spread")


def test_a_collapsed_seed_is_named_in_the_output_the_results_and_the_card_and_one_line_per_fit(
    tmp_path, folder, topic_files, capsys
):
    model = tmp_path / "model"
    shutil.copytree(folder, model)
    fits = iter(
        [
            fit_result(0.75),
            fit_result(0.5),
            fit_result(0.75),
            fit_result(0.625),
            fit_result(0.75),
            fit_result(0.5),
        ]
    )
    with (
        mock.patch("hfbert.finetune.run.build_model", side_effect=fake_build),
        mock.patch("hfbert.finetune.run.finetune_once", side_effect=lambda *args: next(fits)),
    ):
        results = main([str(model), "--train_file", str(topic_files[0]), "--validation_file", str(topic_files[1]),
                        "--learning_rate", "1e-3", "--seeds", "1", "2", "3", "--compare", RANDOM_INIT,
                        "--output_dir", str(tmp_path / "out"), "--update_model_card"])  # fmt: skip
    out, err = capsys.readouterr()
    why = "accuracy 0.500, no better than the majority-class rate 0.500"
    assert results["models"]["model"]["collapsed"] == {"2": why}
    assert results["models"]["comparison"]["collapsed"] == {"3": why}
    fit_lines = [line for line in out.splitlines() if line.startswith(("model (", "comparison ("))]
    assert len(fit_lines) == 6 and fit_lines[1].endswith(f"on 4 evaluation rows; COLLAPSED: {why}")
    assert "| model | " in out and "0.750, 0.500 (collapsed), 0.750" in out
    assert f"COLLAPSED: the model's seed 2: {why}; its mean above counts it" in out
    assert "fine-tuning: 100%" in err and "6/6" in err  # one bar over the six fits
    gain = results["gain"]["accuracy"]
    assert gain["per_seed"] == pytest.approx({"1": 0.125, "2": -0.25, "3": 0.25})
    assert "within the seed-to-seed noise" in gain["verdict"]
    assert "paired per seed: +0.042 ± 0.260 over 3 seeds (+0.125, -0.250, +0.250), 95% interval" in out
    from huggingface_hub import ModelCard

    (entry,) = [e for e in ModelCard.load(model / "README.md").data.eval_results if e.dataset_type == "dev.csv"]
    assert entry.metric_value == pytest.approx(round((0.75 + 0.5 + 0.75) / 3, 4))
    assert entry.metric_args == {
        "seeds": [1, 2, 3], "per_seed": [0.75, 0.5, 0.75], "learning_rate": 0.001, "learning_rate_choice": "as passed",
        "num_train_epochs": 20.0, "collapsed_seeds": ["2"],
    }  # fmt: skip


def test_no_code_from_a_folder_runs_unless_the_user_passes_trust_remote_code(tmp_path, folder, topic_files):
    marker = tmp_path / "the-folders-code-ran"
    shipped = folder_with_its_own_code(folder, tmp_path / "shipped", marker)
    argv = args_for(shipped, *topic_files, tmp_path / "out")
    refused_before_training(argv, r"model_dir .*shipped: its model type \(config.json\) is not one transformers or "
                                  r"hfbert knows, and loading it would run the Python code the folder ships; pass "
                                  r"--trust_remote_code if you trust that code")  # fmt: skip
    assert not marker.exists()
    refused_before_training(
        args_for(folder, *topic_files, tmp_path / "out", "--compare", str(shipped)),
        "--compare .*shipped: its model type",
    )
    assert not marker.exists()
    with pytest.raises(Refusal, match="no sequence-classification class"):  # consent given: the code runs
        main([*argv, "--trust_remote_code"])
    assert marker.read_text() == "ran"


def test_an_hfbert_folder_runs_the_installed_hfbert_not_the_copy_it_ships(tmp_path, folder, topic_files):
    marker = tmp_path / "the-folders-copy-ran"
    model = tmp_path / "model"
    shutil.copytree(folder, model)
    for name in ("configuration_hfbert.py", "modeling_hfbert.py"):
        code = (model / name).read_text() if (model / name).is_file() else ""
        (model / name).write_text(f"import pathlib\npathlib.Path({str(marker)!r}).write_text('ran')\n{code}")
    assert "auto_map" in json.loads((model / "config.json").read_text())
    with mock.patch("hfbert.finetune.run.finetune_once", return_value=fit_result(0.75)) as finetune_once:
        main(args_for(model, *topic_files, tmp_path / "out", "--seeds", "1"))
    assert type(finetune_once.call_args.args[0]).__module__ == "hfbert.modeling_hfbert"
    assert not marker.exists()


# ------------------------------------------------------------------------------------------------ mutation testing


def test_a_json_array_file_is_read_as_its_rows_with_each_value_as_written(tmp_path):
    from hfbert.finetune.data import read_labelled_file

    rows = [{"text": "a ship", "label": "ships"}, {"text": "a goal", "label": 1}]  # a string beside a number
    path = tmp_path / "train.json"
    path.write_text(json.dumps(rows))
    assert read_labelled_file(path, "--train_file") == rows


def test_a_csv_is_read_as_the_text_written_with_no_value_typed_or_taken_for_a_missing_one(tmp_path):
    from hfbert.finetune.data import read_labelled_file

    path = tmp_path / "train.csv"
    path.write_bytes(b"\xef\xbb\xbftext,label\nNA,007\n12,1.0\n\"a ship\nat sea\",\n")  # a byte-order mark first
    assert read_labelled_file(path, "--train_file") == [
        {"text": "NA", "label": "007"}, {"text": "12", "label": "1.0"}, {"text": "a ship\nat sea", "label": ""}
    ]  # fmt: skip


def test_rows_with_a_problem_are_counted_and_the_first_five_shown():
    from hfbert.finetune.data import _rows_have

    assert _rows_have([3]) == "row 3 (data rows counted from 1) has"
    assert _rows_have([3, 4, 9, 12, 20]) == "5 rows (3, 4, 9, 12, 20; data rows counted from 1) have"
    assert _rows_have([3, 4, 9, 12, 20, 21]) == "6 rows (3, 4, 9, 12, 20, ...; data rows counted from 1) have"


def test_few_labels_takes_the_rest_from_the_larger_class_once_the_smaller_runs_out():
    from hfbert.finetune.data import few_labels

    train = datasets.Dataset.from_dict({"labels": [0, 0, 1, 1, 1, 1, 1, 1]})
    chosen = few_labels(train, 6, seed=0)
    assert sorted(chosen["labels"]) == [0, 0, 1, 1, 1, 1]


@pytest.mark.parametrize(
    ("error", "shown"), [(ValueError("no such dataset\nsecond line"), "ValueError: no such dataset"), (ConnectionError(), "ConnectionError: ")]
)
def test_a_hub_set_that_cannot_be_loaded_is_named_with_the_first_line_of_why(error, shown):
    from hfbert.finetune.data import _load_hub
    from hfbert.finetune.settings import parse_args

    settings = parse_args(["model", "--dataset_name", "someone/set"])
    with mock.patch("hfbert.finetune.data.datasets.load_dataset", side_effect=error), pytest.raises(Refusal) as refused:
        _load_hub(settings.data)
    assert str(refused.value) == (
        f"--dataset_name someone/set (--dataset_config_name None) could not be loaded ({shown}); check the name "
        "and your connection to the Hub, or pass --train_file/--validation_file"
    )


def test_a_hub_set_without_the_evaluation_split_is_refused_naming_its_splits():
    from hfbert.finetune.data import _load_hub
    from hfbert.finetune.settings import parse_args

    settings = parse_args(["model", "--dataset_name", "someone/set"])
    splits = datasets.DatasetDict({"train": datasets.Dataset.from_dict({"text": ["a"], "label": [0]})})
    with mock.patch("hfbert.finetune.data.datasets.load_dataset", return_value=splits), pytest.raises(Refusal) as refused:
        _load_hub(settings.data)
    assert str(refused.value) == "--dataset_name someone/set has no 'validation' split; it has ['train']"


def test_a_local_dataset_folder_whose_readme_names_files_outside_it_is_refused_before_any_read(tmp_path):
    """The fourth attack's brief (finetune beside the third attack's F1): a local --dataset_name folder whose
    README.md data_files name a file outside it; datasets would read that file."""
    from hfbert.finetune.data import _load_hub
    from hfbert.finetune.settings import parse_args

    secret = tmp_path / "secret.csv"
    secret.write_text("text,label\nhunter2,0\n")
    folder = tmp_path / "my-set"
    folder.mkdir()
    (folder / "train.csv").write_text("text,label\nfine,1\n")
    (folder / "README.md").write_text(
        "---\nconfigs:\n- config_name: default\n  data_files:\n  - split: train\n    path: train.csv\n"
        "  - split: validation\n    path: ../secret.csv\n---\n"
    )
    settings = parse_args(["model", "--dataset_name", str(folder)])
    with mock.patch("hfbert.finetune.data.datasets.load_dataset") as load, pytest.raises(Refusal) as refused:
        _load_hub(settings.data)
    assert str(refused.value) == (
        f"--dataset_name {folder}: its README.md's (or .huggingface.yaml's) data_files name 1 file outside the folder ({folder}/../secret.csv), "
        "which datasets would read; copy it into the folder and name it there"
    )
    load.assert_not_called()


# ------------------------------------------------------------------------------------------------ issue 64


def test_a_folder_whose_weights_are_only_a_pickle_is_refused_and_never_unpickled(tmp_path, folder, topic_files):
    marker = tmp_path / "the pickle ran"
    pickled = with_pickled_weights(folder, tmp_path / "pickled", marker)
    refused_before_training(
        args_for(pickled, *topic_files, tmp_path / "out"),
        rf"^model_dir {pickled}: its weights are pytorch_model.bin, a pickle .*convert it to model.safetensors",
    )
    refused_before_training(
        args_for(folder, *topic_files, tmp_path / "out", "--compare", str(pickled)),
        rf"^--compare {pickled}: its weights are pytorch_model.bin, a pickle",
    )
    assert not marker.exists()


def test_non_finite_weights_are_refused_not_reported_as_a_collapsed_fit(tmp_path, folder, topic_files):
    nan = tmp_path / "nan"
    shutil.copytree(folder, nan)
    name = "bert.encoder.layer.1.output.dense.weight"
    rewrite_weights(nan, lambda tensors: tensors | {name: torch.full_like(tensors[name], float("nan"))})
    refused_before_training(
        args_for(nan, *topic_files, tmp_path / "out"),
        rf"^model_dir {nan}: its weights are unusable: {name} holds 2048 non-finite values \(nan or inf\)",
    )


def test_json_nested_deeper_than_the_parser_reads_is_refused_naming_the_file(tmp_path, folder, topic_files):
    """A RecursionError traceback, from the data file and from the folder's config.json alike."""
    nested = "[" * 100_000 + "]" * 100_000
    array = write_bytes(tmp_path / "nested.json", f"[{nested}]".encode())
    lines = write_bytes(tmp_path / "nested.jsonl", f'{{"text": {nested}, "label": 1}}\n'.encode())
    refused_before_training(
        args_for(folder, topic_files[0], array, tmp_path / "out"),
        r"nested\.json is not JSON \(nested deeper than Python's JSON parser reads\)",
    )
    refused_before_training(
        args_for(folder, topic_files[0], lines, tmp_path / "out"),
        r"nested\.jsonl line 1 is not JSON \(nested deeper than Python's JSON parser reads\)",
    )
    deep = tmp_path / "deep-config"
    shutil.copytree(folder, deep)
    (deep / "config.json").write_text((deep / "config.json").read_text().rstrip()[:-1] + f', "x": {nested}}}')
    refused_before_training(
        args_for(deep, *topic_files, tmp_path / "out"),
        r"config\.json is not valid JSON \(nested deeper than Python's JSON parser reads\)",
    )


def test_a_csv_row_with_more_fields_than_the_header_is_refused_naming_its_line(tmp_path, folder, topic_files):
    """`i liked it, a lot,1` (an unquoted comma) became a third class 'a lot'."""
    train = write_bytes(
        tmp_path / "train.csv", b"text,label\nthe ship sank,0\n\"the team, won\",1\ni liked it, a lot,1\nthe navy,0\n"
    )
    refused_before_training(
        args_for(folder, train, topic_files[1], tmp_path / "out"),
        r"^--train_file .*train\.csv line 4 has 3 fields, and its header 2 \(text, label\): quote a text that "
        r'holds a comma \(e\.g\. "i liked it, a lot"\)$',
    )


def test_a_csv_cell_longer_than_the_csv_modules_default_limit_is_read(tmp_path):
    """A valid csv with a 150 KB cell was refused as invalid csv (csv's field size limit, 128 KB)."""
    long_text = "the ship sailed " * 10_000  # 160,000 characters
    train = write_csv(tmp_path / "train.csv", [{"text": long_text, "label": 0}, {"text": "the team", "label": 1}])
    task = load_task(FinetuneDataArguments(train_file=str(train), validation_file=str(train)))
    assert task.train["text"][0] == long_text
    assert csv.field_size_limit() == 131072  # the module's limit is as it was


def test_results_of_the_same_name_that_hfbert_did_not_write_are_refused_before_training(tmp_path, folder, topic_files):
    """The sixth attack (9c5ba80), G4: a user's finetune_results.json (or .png) in --output_dir was replaced by
    the run's; a rerun into a folder holding hfbert's own results replaces them."""
    out = tmp_path / "out"
    with mock.patch("hfbert.finetune.run.finetune_once", return_value=fit_result(0.75)):
        main(args_for(folder, *topic_files, out, "--seeds", "1"))
        main(args_for(folder, *topic_files, out, "--seeds", "2"))  # hfbert's own: replaced
    assert json.loads((out / "finetune_results.json").read_text())["seeds"] == [2]
    for name, content in [("finetune_results.json", '{"mine": "important"}'), ("finetune_results.png", "mine")]:
        theirs = tmp_path / f"theirs-{name}"
        theirs.mkdir()
        (theirs / name).write_text(content)
        refused_before_training(
            args_for(folder, *topic_files, theirs),
            rf"--output_dir {theirs} holds {name}, which the fine-tuning would replace and which hfbert did not "
            r"write as it is \(a file of yours",
        )
        assert (theirs / name).read_text() == content


@pytest.mark.parametrize("edit", ["results edited", "plot replaced"])
def test_a_rerun_keeps_results_the_user_edited(tmp_path, folder, topic_files, edit):
    """The eighth attack (2b53043), K4: a rerun replaced hfbert's own finetune_results.json after the user edited
    it, and a plot of the user's beside hfbert's results. Only files as the run wrote them (its record: size and
    sha256) are replaced."""
    out = tmp_path / "out"
    with mock.patch("hfbert.finetune.run.finetune_once", return_value=fit_result(0.75)):
        main(args_for(folder, *topic_files, out, "--seeds", "1"))
    name = "finetune_results.json" if edit == "results edited" else "finetune_results.png"
    results = json.loads((out / "finetune_results.json").read_text())
    mine = json.dumps({**results, "note": "mine"}) if name.endswith(".json") else "my plot"
    (out / name).write_text(mine)
    refused_before_training(
        args_for(folder, *topic_files, out),
        rf"--output_dir {out} holds {name}, which the fine-tuning would replace and which hfbert did not write as "
        r"it is \(a file of yours, or one changed since: .hfbert-reports.json there records what hfbert wrote\): "
        r"move it out of the folder, or pass another --output_dir",
    )
    assert (out / name).read_text() == mine


@pytest.mark.parametrize("kind", ["link", "dangling link", "folder"])
def test_a_model_card_that_is_no_regular_file_is_refused_before_training(tmp_path, folder, topic_files, kind):
    """The eleventh attack (9a79a7c), X1: --update_model_card replaced a README.md linked to a file outside the
    folder with a regular file of that file's text plus the results (a push then sent the outside text), and a
    dangling link silently; a folder there ended in IsADirectoryError after the whole fine-tuning."""
    model = tmp_path / "model"
    shutil.copytree(folder, model, ignore=shutil.ignore_patterns("README.md"))
    secret = tmp_path / "diary.md"
    if kind == "folder":
        (model / "README.md").mkdir()
    else:
        if kind == "link":
            secret.write_text("SECRET diary")
        (model / "README.md").symlink_to(secret)
    shown = "a folder" if kind == "folder" else f"a symbolic link (to {secret})"
    refused_before_training(
        args_for(model, *topic_files, tmp_path / "out", "--update_model_card"),
        re.escape(
            f"--update_model_card: {model / 'README.md'} is {shown}, and the card is written as a regular file "
            "in its place: put the card itself there, or remove it and a new one is written"
        ),
    )
    assert (model / "README.md").is_dir() if kind == "folder" else (model / "README.md").is_symlink()
    assert kind != "link" or secret.read_text() == "SECRET diary"
