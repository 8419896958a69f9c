"""hfbert.pretraining.instances: instances made while training are the written ones, the cache holds the
documents once whatever --dupe_factor, and the epoch order shuffles windows of whole documents."""

import pickle
from collections import Counter

import numpy as np
import pytest
from datasets import Dataset, DatasetDict, load_from_disk

import hfbert.pretraining.batches as batches
import hfbert.pretraining.instances as instances_module
from hfbert.pretraining.batches import EpochDraws
from hfbert.pretraining.data import cached_instances, tokenize_documents, tokenized_features
from hfbert.pretraining.instances import (
    DrawnInstances,
    InstanceRecipe,
    TokenizedDocuments,
    count_instances,
    draw_training_instances,
    write_instances,
)
from hfbert.pretraining.settings import DataSettings


@pytest.fixture(scope="module")
def tokenized(sample_documents, sample_tokenizer, tmp_path_factory):
    """The sample's training documents tokenized, file-backed under tmp (so are the counts made from them)."""
    path = tmp_path_factory.mktemp("documents")
    sample_documents["train"].save_to_disk(path)
    return tokenize_documents(load_from_disk(path), sample_tokenizer)


def recipe(tokenizer, objective="mlm+nsp", **kwargs) -> InstanceRecipe:
    ids = {"cls_token_id": tokenizer.cls_token_id, "sep_token_id": tokenizer.sep_token_id}
    return InstanceRecipe(objective, max_seq_length=kwargs.pop("max_seq_length", 64), **ids, **kwargs)


def test_token_ids_are_stored_in_the_narrowest_type_the_vocabulary_fits(tokenized):
    assert tokenized.features["sentences"].feature.feature.dtype == "uint16"
    assert tokenized_features(1 << 16)["sentences"].feature.feature.dtype == "uint16"
    assert tokenized_features((1 << 16) + 1)["sentences"].feature.feature.dtype == "int32"


def test_tokenized_documents_read_what_the_rows_hold(tokenized):
    documents = TokenizedDocuments(tokenized)
    for index in (0, 1, len(tokenized) // 2, len(tokenized) - 1):
        sentences = tokenized[index]["sentences"]
        assert documents.tokens(index).tolist() == [token for sentence in sentences for token in sentence]
        assert np.diff(documents.sentence_offsets(index)).tolist() == [len(sentence) for sentence in sentences]
    with pytest.raises(IndexError):
        documents.tokens(len(tokenized))


@pytest.mark.parametrize("objective", ["mlm+nsp", "mlm"])
def test_drawn_instances_are_the_written_passes_in_order(tokenized, sample_tokenizer, objective):
    chosen = recipe(sample_tokenizer, objective, seed=3)
    passes = 2 if objective == "mlm+nsp" else 1
    drawn = draw_training_instances(tokenized, chosen, passes)
    written = [write_instances(tokenized, chosen, pass_index) for pass_index in range(passes)]
    assert len(drawn) == sum(map(len, written))
    expected = {name: [row for part in written for row in part[name]] for name in chosen.features()}
    every = drawn[list(range(len(drawn)))]
    assert every == expected
    assert drawn.write()[:] == expected  # rows on disk for a Trainer: the same, in the same order
    last = len(drawn) - 1
    assert drawn[last] == {name: column[last] for name, column in expected.items()}
    if objective == "mlm+nsp":  # another pass pairs the sentences differently
        assert written[0]["input_ids"] != written[1]["input_ids"]


def test_drawn_instances_pickle_as_file_paths_not_tokens(tokenized, sample_tokenizer):
    drawn = draw_training_instances(tokenized, recipe(sample_tokenizer), 1)
    drawn[[0, 10, 20]]  # fills its caches, which a worker does not inherit through pickle
    copy = pickle.loads(pickle.dumps(drawn))
    token_bytes = 2 * sum(len(sentence) for document in tokenized["sentences"] for sentence in document)
    assert len(pickle.dumps(drawn)) < 0.02 * token_bytes
    assert copy[[5, 500]] == drawn[[5, 500]]


def files_in(folder) -> dict:
    return {path: path.stat().st_size for path in folder.rglob("*") if path.is_file()}


def test_the_cache_grows_with_the_corpus_not_with_the_passes(tmp_path, sample_documents, sample_tokenizer):
    for split in ("train", "validation"):
        sample_documents[split].save_to_disk(tmp_path / split)
    documents = DatasetDict({split: load_from_disk(tmp_path / split) for split in ("train", "validation")})
    before = files_in(tmp_path)
    train, *_ = cached_instances(documents, sample_tokenizer, DataSettings(dupe_factor=1), seed=5)
    one_pass = files_in(tmp_path)
    more_train, *_ = cached_instances(documents, sample_tokenizer, DataSettings(dupe_factor=6), seed=5)
    six_passes = files_in(tmp_path)
    assert len(more_train) > 5.5 * len(train)
    tokens = sum(len(sentence) for document in documents["train"] for sentence in document["paragraphs"])
    first_run = sum(six_passes[path] for path in set(one_pass) - set(before))
    five_more_passes = sum(six_passes[path] for path in set(six_passes) - set(one_pass))
    # A pass costs a count per document (plus an Arrow file's header), whatever the instances hold.
    assert five_more_passes < 5 * (4 * len(documents["train"]) + 4096)
    assert five_more_passes < 0.01 * first_run
    assert tokens > 0


def test_counts_come_from_the_cache_the_second_time(tokenized, sample_tokenizer, monkeypatch):
    chosen = recipe(sample_tokenizer, seed=17)
    first = count_instances(tokenized, chosen, 0)

    def fail(*args, **kwargs):
        raise RuntimeError("paired again instead of reading the cached counts")

    monkeypatch.setattr(instances_module, "nsp_pairs", fail)
    assert (count_instances(tokenized, chosen, 0) == first).all()
    with pytest.raises(RuntimeError, match="paired again"):
        count_instances(tokenized, chosen, 1)


def test_an_epoch_of_windows_draws_every_instance_once_in_a_seeded_order(monkeypatch):
    monkeypatch.setattr(batches, "SHUFFLE_GROUP", 50)
    counts = np.random.default_rng(0).integers(1, 30, size=400)
    offsets = np.concatenate([[0], np.cumsum(counts)])
    sampler = EpochDraws(int(offsets[-1]), seed=3, unit_offsets=offsets)
    first = list(sampler)
    assert sorted(first) == list(range(len(sampler)))
    assert list(EpochDraws(int(offsets[-1]), seed=3, unit_offsets=offsets)) == first
    sampler.set_epoch(1)
    second = list(sampler)
    assert sorted(second) == [len(sampler) + index for index in range(len(sampler))]
    assert [draw - len(sampler) for draw in second] != first


def test_a_window_holds_whole_documents_and_mixes_them(monkeypatch):
    monkeypatch.setattr(batches, "SHUFFLE_GROUP", 50)
    offsets = np.arange(0, 10 * 100 + 1, 10)  # 100 units of 10 instances
    order = list(EpochDraws(1000, seed=9, unit_offsets=offsets))
    for start in range(0, 1000, 50):
        window = [draw // 10 for draw in order[start : start + 50]]
        assert sorted(Counter(window).values()) == [10] * 5  # five whole units
        assert window != sorted(window)  # shuffled, not unit after unit
    assert [draw // 10 for draw in order[::50]] != list(range(0, 100, 5))  # units in a seeded order


def test_a_process_pairs_each_document_once_per_epoch(tokenized, sample_tokenizer, monkeypatch):
    chosen = recipe(sample_tokenizer)
    drawn = draw_training_instances(tokenized, chosen, 2)
    calls = Counter()
    original = InstanceRecipe.spans

    def counting(self, documents, pass_index, document):
        calls[pass_index, document] += 1
        return original(self, documents, pass_index, document)

    monkeypatch.setattr(InstanceRecipe, "spans", counting)
    order = list(EpochDraws(len(drawn), seed=1, unit_offsets=drawn.unit_offsets))
    for start in range(0, len(order), 32):
        drawn[[draw % len(drawn) for draw in order[start : start + 32]]]
    assert len(calls) == 2 * len(tokenized) and set(calls.values()) == {1}


def test_counts_must_match_the_documents(tokenized, sample_tokenizer):
    with pytest.raises(ValueError, match="one count per document"):
        DrawnInstances(tokenized, recipe(sample_tokenizer), [np.ones(3, dtype=np.int32)])
    with pytest.raises(ValueError, match="flatten_indices"):
        TokenizedDocuments(tokenized.select([2, 1]))


def test_one_document_cannot_give_next_sentence_pairs():
    single = Dataset.from_dict({"sentences": [[[5, 6, 7], [8, 9]]]})
    with pytest.raises(ValueError, match="at least 2 documents"):
        count_instances(single, InstanceRecipe("mlm+nsp", 2, 3, 16), 0)
