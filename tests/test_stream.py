"""hfbert.pretraining.stream: instances made from a stream of documents, in windows, split by process and by
loader worker; a position restored from a checkpoint continues with exactly the next batch."""

import functools
import itertools
import json
import re
from pathlib import Path
from types import SimpleNamespace

import datasets
import pytest
import torch
from datasets import load_from_disk
from datasets.distributed import split_dataset_by_node

from hfbert.corpus import is_wikitext_article_heading, load_documents
from hfbert.corpus_arguments import SHIPPED_SAMPLE_DIR, SHIPPED_SAMPLE_FILES, CorpusArguments
from hfbert.errors import Refusal, RunFailure
from hfbert.pretraining.batches import build_loaders
from hfbert.pretraining.data import check_documents_left_to_train, tokenize_documents, validation_documents
from hfbert.pretraining.instances import InstanceRecipe, TokenizedDocuments, TrainingStream
from hfbert.pretraining.settings import DataSettings, OptimizationSettings
from hfbert.pretraining.stream import (
    PASS_KEY,
    STREAM_STATE_NAME,
    StreamPosition,
    check_stream_checkpoint,
    draw_id,
)

ARTICLES = 6


@pytest.fixture(scope="module")
def small_corpus(tmp_path_factory) -> Path:
    """The first 6 articles of the shipped sample's training text, as a WikiText .raw file."""
    lines = (SHIPPED_SAMPLE_DIR / SHIPPED_SAMPLE_FILES["train"]).read_text(encoding="utf-8").splitlines(keepends=True)
    starts = [number for number, line in enumerate(lines) if is_wikitext_article_heading(line)]
    path = tmp_path_factory.mktemp("corpus") / "small.raw"
    path.write_text("".join(lines[: starts[ARTICLES]]), encoding="utf-8")
    return path


def streamed(path: Path) -> datasets.IterableDataset:
    return load_documents(CorpusArguments(train_file=str(path), streaming=True))["train"]


def make_recipe(tokenizer, objective="mlm+nsp") -> InstanceRecipe:
    return InstanceRecipe(objective, tokenizer.cls_token_id, tokenizer.sep_token_id, max_seq_length=64, seed=5)


def stream_loader(documents, tokenizer, workers: int, window: int = 2, objective="mlm+nsp", rank: int = 0):
    data = DataSettings(dataloader_num_workers=workers)
    optimization = OptimizationSettings(per_device_train_batch_size=16, seed=5)
    stream = TrainingStream(documents, make_recipe(tokenizer, objective), tokenizer, window, rank)
    loader, _ = build_loaders(data, optimization, 16, torch.device("cpu"), tokenizer, stream, [])
    return loader


def take(loader, count: int) -> list[dict[str, torch.Tensor]]:
    batches = loader.epoch(0, None, SimpleNamespace(device=torch.device("cpu")))
    taken = [next(batches) for _ in range(count)]
    batches.close()  # ends the DataLoader's iterator and its workers
    return taken


def saved_state(loader, checkpoint: Path) -> Path:
    """`checkpoint` holding the stream_state.json a checkpoint of this one process would hold."""
    checkpoint.mkdir()
    for name, content in loader.checkpoint_files(SimpleNamespace(num_processes=1)).items():
        (checkpoint / name).write_text(json.dumps(content))
    return checkpoint


def assert_same_batches(expected, actual) -> None:
    assert len(expected) == len(actual)
    for number, (one, other) in enumerate(zip(expected, actual, strict=True)):
        assert one.keys() == other.keys()
        for key in one:
            assert torch.equal(one[key], other[key]), (number, key)


def test_window_documents_give_the_cached_documents_instances(sample_documents, sample_tokenizer, tmp_path):
    """The same documents in memory (a window, as `StreamedInstances.window_spans` holds them) and in the cache
    pair the same way (without a stream key)."""
    sample_documents["train"].select(range(5)).save_to_disk(tmp_path / "documents")
    tokenized = tokenize_documents(load_from_disk(tmp_path / "documents"), sample_tokenizer)
    cached = TokenizedDocuments(tokenized)
    window = TokenizedDocuments(datasets.Dataset.from_dict({"sentences": tokenized["sentences"]}, features=tokenized.features))
    recipe = make_recipe(sample_tokenizer)
    assert len(window) == len(cached) == 5
    for document in range(5):
        spans = recipe.spans(window, 1, document)
        assert spans == recipe.spans(cached, 1, document)
        assert [recipe.row(window, span) for span in spans] == [recipe.row(cached, span) for span in spans]


@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.parametrize("stop_after", [7, 50])  # an odd count of batches (workers rotate), and past a pass
def test_a_restored_position_continues_with_exactly_the_next_batch(
    small_corpus, sample_tokenizer, workers, stop_after, tmp_path
):
    documents = streamed(small_corpus)
    straight = take(stream_loader(documents, sample_tokenizer, workers), 100)
    first = stream_loader(documents, sample_tokenizer, workers)
    head = take(first, stop_after)
    assert first.stream_pass == (0 if stop_after == 7 else 1)  # 6 articles: about 45 batches a pass
    resumed = stream_loader(documents, sample_tokenizer, workers)
    resumed.resume(saved_state(first, tmp_path / "checkpoint"), SimpleNamespace(process_index=0))
    assert_same_batches(straight, head + take(resumed, 100 - stop_after))


def test_the_documents_streams_own_state_places_no_row_inside_a_window(small_corpus, sample_tokenizer):
    """What hfbert keeps beside StatefulDataLoader's state: datasets' `IterableDataset.state_dict()` places the
    documents read, and a window's are all read before its first instance is made, so it is the same at every
    row of the window; resumed from it, the stream would go on with the next window. The position (window,
    row) goes on with the next row."""
    documents = streamed(small_corpus)
    dataset = stream_loader(documents, sample_tokenizer, workers=0).loader.dataset
    rows, states, positions = dataset.worker_rows(0, 1), [], []
    for _ in range(4):
        next(rows)
        states.append(documents.state_dict())
        positions.append(dataset.state_dict())
    following = next(rows)
    assert states[0] == states[-1] and positions[0] != positions[-1]  # the documents' state: no row

    def first_row(position: StreamPosition) -> dict:
        resumed = stream_loader(streamed(small_corpus), sample_tokenizer, workers=0).loader.dataset
        resumed.position = position
        return next(resumed.worker_rows(0, 1))

    assert first_row(StreamPosition(**positions[-1])) == following
    assert first_row(StreamPosition(0, 1, 0, states[-1])) != following  # the next window's first row


def test_workers_make_every_instance_of_a_pass_once(small_corpus, sample_tokenizer):
    """Loader workers split the windows between them: the instances of a pass, by draw id, are those made
    without workers, each once; the next pass pairs the sentences anew."""
    dataset = stream_loader(streamed(small_corpus), sample_tokenizer, workers=0).loader.dataset

    def instances(worker: int, workers: int, epoch: int = 0) -> dict[int, list[int]]:
        made = {}
        dataset.position = StreamPosition()
        for row in dataset.worker_rows(worker, workers):
            if row[PASS_KEY] > epoch:
                return made
            if row[PASS_KEY] == epoch:
                assert row["draw"] not in made
                made[row["draw"]] = row["input_ids"]
        raise AssertionError("the stream ended")

    alone = instances(0, 1)
    split = [instances(worker, 2) for worker in range(2)]
    assert split[0].keys().isdisjoint(split[1]) and split[0] | split[1] == alone and len(alone) > 600
    dataset.position = StreamPosition()
    windows = {dataset.position.window for _ in itertools.islice(dataset.worker_rows(1, 2), 50)}
    assert windows == {1}  # worker 1 of 2 makes windows 1, 3, ...
    assert sorted(instances(0, 1, epoch=1).values()) != sorted(alone.values())  # pass 1 pairs anew


def test_draw_ids_are_unique_per_pass_rank_window_and_row():
    ids = {draw_id(epoch, rank, window, row) for epoch in range(3) for rank in range(3) for window in (0, 1, 7) for row in (0, 1, 99)}
    assert len(ids) == 3 * 3 * 3 * 3


def test_processes_share_the_stream_between_them(small_corpus):
    documents = streamed(small_corpus)
    every = [document["paragraphs"][0] for document in documents]
    ranks = [
        [document["paragraphs"][0] for document in split_dataset_by_node(documents, rank=rank, world_size=2)]
        for rank in range(2)
    ]
    assert sorted(ranks[0] + ranks[1]) == sorted(every) and set(ranks[0]).isdisjoint(ranks[1])


def test_a_worker_without_a_window_stops_the_run_with_one_line(small_corpus, sample_tokenizer):
    loader = stream_loader(streamed(small_corpus), sample_tokenizer, workers=2, window=100)
    with pytest.raises(RunFailure, match=r"gave loader worker 1 of 2 no instances.*--stream_window_documents") as error:
        take(loader, 200)
    assert "\n" not in str(error.value)


def test_the_mlm_objective_streams_segments(small_corpus, sample_tokenizer):
    (batch,) = take(stream_loader(streamed(small_corpus), sample_tokenizer, workers=0, objective="mlm"), 1)
    assert "next_sentence_label" not in batch and batch["input_ids"].shape[0] == 16


def test_held_out_validation_documents_are_the_streams_first_ones(small_corpus):
    corpus = CorpusArguments(train_file=str(small_corpus), streaming=True)
    documents = load_documents(corpus)
    data = DataSettings(stream_validation_documents=2)
    validation = validation_documents(documents, corpus, data)
    every = [document["paragraphs"] for document in documents["train"]]
    assert validation["paragraphs"] == every[:2]
    assert validation_documents(documents, corpus, data)._fingerprint == validation._fingerprint  # cached
    with pytest.raises(Refusal, match=f"the training stream has {ARTICLES} documents and --stream_validation_documents 50"):
        check_documents_left_to_train(documents["train"], DataSettings(stream_validation_documents=50), 1)
    check_documents_left_to_train(documents["train"], DataSettings(stream_validation_documents=ARTICLES - 2), 1)
    with pytest.raises(Refusal, match="leaving 1 to train on"):  # two processes: one document each is too few
        mlm = DataSettings(objective="mlm", stream_validation_documents=ARTICLES - 1)
        check_documents_left_to_train(documents["train"], mlm, 2)


def test_a_streaming_checkpoint_resumes_on_its_own_process_and_worker_counts_only(tmp_path):
    (tmp_path / STREAM_STATE_NAME).write_text(json.dumps({"num_processes": 2, "num_workers": 4, "ranks": [{}, {}]}))
    check = functools.partial(check_stream_checkpoint, on_cpu=True, writer="hfbert")
    check(tmp_path, num_processes=2, num_workers=4)
    with pytest.raises(Refusal, match="resumes on 2 processes only"):
        check(tmp_path, num_processes=1, num_workers=4)
    with pytest.raises(Refusal, match="pass --dataloader_num_workers 4"):
        check(tmp_path, num_processes=2, num_workers=0)
    with pytest.raises(Refusal, match="not written by a --streaming run"):
        check(tmp_path / "elsewhere", num_processes=2, num_workers=4)


def test_a_streaming_checkpoint_of_the_form_before_the_stateful_loader_is_refused_naming_its_writer(tmp_path):
    old = {"batches_taken": 5, "positions": [{"worker": 0, "epoch": 0, "window": 1, "row": 8, "state": None}]}
    (tmp_path / STREAM_STATE_NAME).write_text(json.dumps({"num_processes": 1, "num_workers": 0, "ranks": [old]}))
    with pytest.raises(Refusal) as error:
        check_stream_checkpoint(tmp_path, 1, 0, on_cpu=True, writer="hfbert 0.1.0 at commit 1234567")
    assert str(error.value) == (
        f"--resume_from_checkpoint {tmp_path} was written by hfbert 0.1.0 at commit 1234567, whose "
        "stream_state.json holds each loader worker's position in a form this hfbert does not read (it keeps "
        "torchdata's StatefulDataLoader state): finish the run with that hfbert (main's commit d734940, the last "
        f"to write that form, resumes it), or start a new run from its weights with --model_name_or_path {tmp_path}"
    )


def test_windows_are_shuffled_and_paired_by_their_own_seed(small_corpus, sample_tokenizer):
    """Two windows with the same document numbers pair differently (the stream key), and the instance order
    of a window is not its documents' order."""
    dataset = stream_loader(streamed(small_corpus), sample_tokenizer, workers=0).loader.dataset
    _, _, paragraphs = next(dataset.windows(None, 0))
    documents, spans = dataset.window_spans(0, 0, paragraphs)
    _, same_window = dataset.window_spans(0, 0, paragraphs)
    _, as_window_1 = dataset.window_spans(0, 1, paragraphs)
    assert spans == same_window and spans != as_window_1
    assert [span.document for span in spans] != sorted(span.document for span in spans)
    assert len(documents) == 2


def stream_run(small_corpus: Path, run_inputs: dict[str, Path], output_dir: Path, *extra: str) -> list[str]:
    """run_pretraining.py's flags for one update of a --streaming run over the small corpus, validation held out
    of the stream (no --max_eval_samples unless `extra` gives it)."""
    return [
        "--train_file", str(small_corpus), "--streaming", "--tokenizer_name", str(run_inputs["tokenizer"]),
        "--config_name", str(run_inputs["config"]), "--max_train_steps", "1", "--per_device_train_batch_size", "4",
        "--mixed_precision", "no", "--output_dir", str(output_dir), *extra,
    ]  # fmt: skip


def run_in_process(args: list[str]) -> None:
    from accelerate.state import AcceleratorState, GradientState

    from hfbert.pretraining.cli import main

    try:
        main(args)
    finally:
        AcceleratorState._reset_state(reset_partial_state=True)
        GradientState._reset_state()


@pytest.mark.parametrize(
    ("extra", "left"),
    [
        (["--stream_validation_documents", str(ARTICLES + 10)], 0),  # fewer documents than the validation needs
        (["--stream_validation_documents", str(ARTICLES)], 0),  # exactly as many: none left to train on
        (["--stream_validation_documents", str(ARTICLES - 1)], 1),  # one left: NSP pairs need two
        (["--stream_validation_documents", str(ARTICLES), "--max_eval_samples", "8"], 0),  # evaluated on fewer
    ],
)
def test_a_stream_too_small_for_its_validation_documents_is_refused_naming_the_flag_and_counts(
    small_corpus, run_inputs, tmp_path, extra, left
):
    """Issue 43 item 4: a small stream was refused for 'process 0's share of the training stream gives no
    instances', naming neither the validation documents nor their flag. The refusal names both counts and a
    --stream_validation_documents that fits, and that value trains."""
    held = int(extra[1])
    with pytest.raises(Refusal) as error:
        run_in_process(stream_run(small_corpus, run_inputs, tmp_path / "refused", *extra))
    message = str(error.value)
    assert "\n" not in message
    assert (
        f"the training stream has {ARTICLES} documents and --stream_validation_documents {held} holds out the first "
        f"{min(held, ARTICLES)} for validation, leaving {left} to train on" in message
    ), message
    fitting = re.search(r"pass --stream_validation_documents (\d+)", message).group(1)
    run_in_process(stream_run(small_corpus, run_inputs, tmp_path / "trained", "--stream_validation_documents", fitting))
    assert (tmp_path / "trained" / "model.safetensors").is_file()
