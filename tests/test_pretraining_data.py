import copy
import logging
import math
import random
import time
from collections import defaultdict

import pytest
from datasets import Dataset, DatasetDict, load_from_disk
from tokenizers import normalizers
from transformers import AutoTokenizer

import hfbert.pretraining.data as pretraining_data
import hfbert.pretraining.instances as pretraining_instances
from hfbert.corpus import DOCUMENTS_PER_BATCH
from hfbert.pretraining.data import (
    check_validation_split,
    split_sentences,
    split_validation_documents,
    tokenize_documents,
)
from hfbert.pretraining.instances import InstanceRecipe, truncation, write_instances

MAX_SEQ_LENGTH = 128


@pytest.fixture(scope="module")
def train_documents(sample_documents, tmp_path_factory):
    """The sample's train documents, file-backed under tmp so every cache file of these tests lands there."""
    path = tmp_path_factory.mktemp("documents")
    sample_documents["train"].save_to_disk(path)
    return load_from_disk(path)


@pytest.fixture(scope="module")
def tokenized(train_documents, sample_tokenizer):
    return tokenize_documents(train_documents, sample_tokenizer)


def recipe(tokenizer, objective="mlm+nsp", max_seq_length=MAX_SEQ_LENGTH, **kwargs) -> InstanceRecipe:
    ids = {"cls_token_id": tokenizer.cls_token_id, "sep_token_id": tokenizer.sep_token_id}
    return InstanceRecipe(objective, max_seq_length=max_seq_length, **ids, **kwargs)


def build(tokenized, tokenizer, pass_index=0, num_proc=None, **kwargs):
    return write_instances(tokenized, recipe(tokenizer, **kwargs), pass_index, num_proc=num_proc)


@pytest.fixture(scope="module")
def instances(tokenized, sample_tokenizer):
    return build(tokenized, sample_tokenizer)


@pytest.mark.parametrize(
    ("paragraph", "expected"),
    [
        # WikiText: punctuation is space-separated.
        ("The game 's release . It was good ! Why ?", ["The game 's release .", "It was good !", "Why ?"]),
        ("He went home. Then he slept.", ["He went home.", "Then he slept."]),
        ('She said "Go." Then she left.', ['She said "Go."', "Then she left."]),
        ("It ended in 1937 . 1938 was calm .", ["It ended in 1937 .", "1938 was calm ."]),
        # Initials, titles and lowercase continuations are not boundaries.
        ("J. R. R. Tolkien met Mr. Smith . He left", ["J. R. R. Tolkien met Mr. Smith .", "He left"]),
        ("Apples, pears, etc. and more.", ["Apples, pears, etc. and more."]),
        ("   ", []),
    ],
)
def test_split_sentences(paragraph, expected):
    assert split_sentences(paragraph) == expected


def test_tokenize_documents_splits_sentences_and_drops_empty(sample_tokenizer):
    documents = Dataset.from_dict(
        {"paragraphs": [["The cat sat . It slept .", "A dog barked ."], [], ["   "], ["Rain fell ."]]}
    )
    tokenized = tokenize_documents(documents, sample_tokenizer)
    assert tokenized.column_names == ["sentences"]
    assert len(tokenized) == 2
    expected = [
        sample_tokenizer(sentence, add_special_tokens=False)["input_ids"]
        for sentence in ["The cat sat .", "It slept .", "A dog barked ."]
    ]
    assert tokenized[0]["sentences"] == expected


def test_tokenize_documents_needs_paragraphs(sample_tokenizer):
    with pytest.raises(ValueError, match="'paragraphs' column"):
        tokenize_documents(Dataset.from_dict({"text": ["a"]}), sample_tokenizer)


def test_tokenized_sample_has_no_special_tokens(tokenized, sample_tokenizer):
    special_ids = set(sample_tokenizer.all_special_ids) - {sample_tokenizer.unk_token_id}
    sentences = [sentence for document in tokenized["sentences"] for sentence in document]
    assert len(sentences) > 1000
    assert all(sentence and not special_ids.intersection(sentence) for sentence in sentences)


def test_instance_layout(instances, sample_tokenizer):
    cls_id, sep_id = sample_tokenizer.cls_token_id, sample_tokenizer.sep_token_id
    assert len(instances) > 1000
    lengths = []
    for row in instances:
        input_ids, token_type_ids = row["input_ids"], row["token_type_ids"]
        lengths.append(len(input_ids))
        assert len(input_ids) <= MAX_SEQ_LENGTH
        assert len(token_type_ids) == len(input_ids)
        sep_positions = [i for i, token in enumerate(input_ids) if token == sep_id]
        assert input_ids[0] == cls_id and cls_id not in input_ids[1:]
        assert len(sep_positions) == 2 and sep_positions[1] == len(input_ids) - 1
        first_sep = sep_positions[0]
        assert first_sep >= 2 and first_sep <= len(input_ids) - 3  # A and B are both non-empty
        assert token_type_ids == [0] * (first_sep + 1) + [1] * (len(input_ids) - first_sep - 1)
        assert row["next_sentence_label"] in (0, 1)
    # Chunks are filled up to the target length, so most instances are (nearly) full.
    assert sum(lengths) / len(lengths) > 0.85 * MAX_SEQ_LENGTH


def _token_string(ids):
    return "," + ",".join(map(str, ids)) + ","


MIN_IDENTIFYING_TOKENS = 8


def test_segment_b_source(instances, tokenized, sample_tokenizer):
    """Label 0: B follows A in the same document. Label 1: B comes from a different document."""
    token_streams = [[t for sentence in doc for t in sentence] for doc in tokenized["sentences"]]
    documents = [_token_string(stream) for stream in token_streams]
    # Which documents hold each 8-gram, to find a segment's document without scanning all of them.
    documents_by_ngram = defaultdict(set)
    for index, stream in enumerate(token_streams):
        for start in range(len(stream) - MIN_IDENTIFYING_TOKENS + 1):
            documents_by_ngram[tuple(stream[start : start + MIN_IDENTIFYING_TOKENS])].add(index)

    def documents_containing(segment):
        candidates = documents_by_ngram[tuple(segment[:MIN_IDENTIFYING_TOKENS])]
        return {index for index in candidates if _token_string(segment) in documents[index]}

    sep_id = sample_tokenizer.sep_token_id
    checked = {0: 0, 1: 0}
    for row in instances:
        input_ids = row["input_ids"]
        first_sep = input_ids.index(sep_id)
        tokens_a, tokens_b = input_ids[1:first_sep], input_ids[first_sep + 1 : -1]
        # Short segments can occur in several documents; long ones identify their document.
        if min(len(tokens_a), len(tokens_b)) < MIN_IDENTIFYING_TOKENS:
            continue
        a_documents, b_documents = documents_containing(tokens_a), documents_containing(tokens_b)
        assert len(a_documents) == 1 and b_documents
        if row["next_sentence_label"] == 0:
            (document_index,) = a_documents
            assert document_index in b_documents
            doc, a_string = documents[document_index], _token_string(tokens_a)
            a_end = doc.index(a_string) + len(a_string) - 1
            assert _token_string(tokens_b) in doc[a_end:]
        else:
            assert not a_documents & b_documents
        checked[row["next_sentence_label"]] += 1
    assert min(checked.values()) > 300


@pytest.mark.parametrize("short_seq_prob", [0.0, 0.1])
def test_label_balance(tokenized, sample_tokenizer, short_seq_prob):
    """Each multi-sentence chunk is a fair coin; single-sentence chunks are always random, which adds a few
    points. The default short_seq_prob (0.1) must not skew it (targets are drawn per chunk). ~2000 instances:
    binomial sd ~0.011, so +-0.05 cannot flake."""
    labels = build(tokenized, sample_tokenizer, short_seq_prob=short_seq_prob)["next_sentence_label"]
    assert len(labels) > 1500
    assert abs(sum(labels) / len(labels) - 0.5) < 0.05


def test_short_seq_prob_draws_shorter_targets(tokenized, sample_tokenizer):
    """Targets drawn in [2, 125] instead of 125: chunks still end on a sentence boundary past the target, so
    the instances get only moderately shorter (106 vs 127 tokens on the sample), and more numerous."""
    full = build(tokenized, sample_tokenizer, short_seq_prob=0.0)
    short = build(tokenized, sample_tokenizer, short_seq_prob=1.0)

    def mean_length(dataset):
        return sum(map(len, dataset["input_ids"])) / len(dataset)

    assert mean_length(short) < 0.9 * mean_length(full)
    assert len(short) > len(full)


def test_reproducible_and_independent_of_num_proc(tokenized, sample_tokenizer):
    # In memory, so nothing comes from a cache and both runs really compute.
    in_memory = Dataset.from_dict(tokenized.to_dict(), features=tokenized.features)
    one = build(in_memory, sample_tokenizer, num_proc=1)
    two = build(in_memory, sample_tokenizer, num_proc=2)
    assert one.to_dict() == two.to_dict()
    other_pass = build(in_memory, sample_tokenizer, num_proc=1, pass_index=1)
    assert other_pass["input_ids"] != one["input_ids"]


def corpus_share_in_instances(tokenized, tokenizer) -> tuple[float, int]:
    """Tokens in instances (besides [CLS] [SEP] [SEP]) per token of the corpus, and the instance count."""
    instances = build(tokenized, tokenizer, short_seq_prob=0.0)
    corpus = sum(len(sentence) for document in tokenized["sentences"] for sentence in document)
    return sum(len(ids) - 3 for ids in instances["input_ids"]) / corpus, len(instances)


def test_lower_cased_text_keeps_its_share_of_tokens(train_documents, tokenized, sample_tokenizer):
    # The sentence regex needs an upper-case letter after a full stop: lower-cased text has paragraph-long
    # "sentences", which used to be truncated away (issue 26: 42% of the sample's tokens lost).
    lower = train_documents.map(
        lambda row: {"paragraphs": [paragraph.lower() for paragraph in row["paragraphs"]]}
    )
    assert sum(map(len, tokenize_documents(lower, sample_tokenizer)["sentences"])) < 0.5 * sum(
        map(len, tokenized["sentences"])
    )
    original_share, original_count = corpus_share_in_instances(tokenized, sample_tokenizer)
    lower_share, lower_count = corpus_share_in_instances(
        tokenize_documents(lower, sample_tokenizer), sample_tokenizer
    )
    assert lower_share >= 0.97 * original_share and lower_count >= 0.95 * original_count


def test_a_long_line_without_punctuation_is_cut_into_instances_in_linear_time():
    # Token ids below 500 are the long line's, those above the other document's.
    line_length = 100_000
    line = [10 + index % 490 for index in range(line_length)]
    other = [[500 + index % 400 for index in range(start, start + 20)] for start in range(0, 400, 20)]
    tokenized = Dataset.from_dict({"sentences": [[line], other]})
    start = time.perf_counter()
    instances = write_instances(tokenized, InstanceRecipe("mlm+nsp", 1, 2, MAX_SEQ_LENGTH, short_seq_prob=0.0))
    assert time.perf_counter() - start < 5.0  # 0.2 s here; 3 s before, quadratic (11 s for 200,000 tokens)
    kept = []
    for ids, types, label in zip(
        instances["input_ids"], instances["token_type_ids"], instances["next_sentence_label"], strict=True
    ):
        if ids[1] < 500:  # A comes from the line; so does B when it really follows A
            kept += [
                token
                for token, kind in zip(ids[1:-1], types[1:-1], strict=True)
                if token != 2 and (kind == 0 or label == 0)
            ]
    # Pieces of half the instance: a pair of them is one token too long (2 x 63 > 125) and loses that token.
    assert len(kept) >= line_length * (1 - 1 / 120)
    assert all(token < 500 for token in kept)


def test_truncating_a_million_token_segment_takes_linear_time():
    start = time.perf_counter()
    (front, back), cut_b = truncation(1_000_000, 2, 125, random.Random(0))
    assert time.perf_counter() - start < 5.0  # under 1 s; hours when each token is deleted from a list's front
    assert 1_000_000 - front - back == 123 and cut_b == (0, 0)


def truncated_one_token_at_a_time(tokens_a, tokens_b, max_num_tokens, rng):  # google's loop
    while len(tokens_a) + len(tokens_b) > max_num_tokens:
        longer = tokens_a if len(tokens_a) > len(tokens_b) else tokens_b
        if rng.random() < 0.5:
            del longer[0]
        else:
            longer.pop()


def test_truncation_removes_the_tokens_googles_loop_removes():
    lengths = random.Random(0)
    for case in range(300):
        tokens_a = list(range(lengths.randint(1, 300)))
        tokens_b = list(range(1000, 1000 + lengths.randint(1, 300)))
        max_num_tokens = lengths.randint(2, 200)
        expected_a, expected_b, expected_rng = list(tokens_a), list(tokens_b), random.Random(case)
        truncated_one_token_at_a_time(expected_a, expected_b, max_num_tokens, expected_rng)
        rng = random.Random(case)
        cut_a, cut_b = truncation(len(tokens_a), len(tokens_b), max_num_tokens, rng)
        tokens_a = tokens_a[cut_a[0] : len(tokens_a) - cut_a[1]]
        tokens_b = tokens_b[cut_b[0] : len(tokens_b) - cut_b[1]]
        assert (tokens_a, tokens_b) == (expected_a, expected_b)
        assert rng.getstate() == expected_rng.getstate()  # the same draws: the next pair is drawn as before


def test_mlm_instances_cut_each_document_into_full_segments(tokenized, sample_tokenizer):
    instances = write_instances(tokenized, recipe(sample_tokenizer, "mlm", max_seq_length=64))
    assert instances.column_names == ["input_ids", "token_type_ids"]  # no next_sentence_label
    rows = instances["input_ids"]
    assert all(
        ids[0] == sample_tokenizer.cls_token_id and ids[-1] == sample_tokenizer.sep_token_id for ids in rows
    )
    assert all(
        set(types) == {0} and len(types) == len(ids)
        for ids, types in zip(rows, instances["token_type_ids"], strict=True)
    )
    # Every token of every document, in order; only a document's last segment is shorter than 62 tokens.
    streams = [[token for sentence in document for token in sentence] for document in tokenized["sentences"]]
    segments = iter(ids[1:-1] for ids in rows)
    for stream in streams:
        rebuilt = []
        while len(rebuilt) < len(stream):
            segment = next(segments)
            assert len(segment) == 62 or len(rebuilt) + len(segment) == len(stream)
            rebuilt += segment
        assert rebuilt == stream
    assert next(segments, None) is None


def test_documents_go_through_tokenizing_and_instances_a_bounded_batch_at_a_time(sample_tokenizer, monkeypatch):
    """datasets' default batch of 1,000 documents held a small corpus of long documents whole, so the data
    stage's peak memory grew with the corpus (benchmarks/bench_run_memory.py)."""
    sentence = "The cat sat on the mat . It was warm there ."
    documents = Dataset.from_dict({"paragraphs": [[sentence] * 3] * (3 * DOCUMENTS_PER_BATCH + 1)})
    batch_sizes = defaultdict(list)
    def recording(module, name):
        original = getattr(module, name)

        def record_then_call(batch, *args, **kwargs):
            batch_sizes[name].append(len(next(iter(batch.values()))))
            return original(batch, *args, **kwargs)

        return record_then_call

    monkeypatch.setattr(pretraining_data, "tokenize_batch", recording(pretraining_data, "tokenize_batch"))
    monkeypatch.setattr(pretraining_instances, "_rows_batch", recording(pretraining_instances, "_rows_batch"))
    tokenized = tokenize_documents(documents, sample_tokenizer)
    build(tokenized, sample_tokenizer)
    write_instances(tokenized, recipe(sample_tokenizer, "mlm"))
    assert set(batch_sizes) == {"tokenize_batch", "_rows_batch"}
    for sizes in batch_sizes.values():
        assert max(sizes) == DOCUMENTS_PER_BATCH and sum(sizes) >= len(documents)


def fail(*args, **kwargs):
    raise RuntimeError("rebuilt instead of loading from cache")


def test_second_tokenize_comes_from_cache(train_documents, tokenized, sample_tokenizer, monkeypatch):
    assert tokenized.cache_files
    monkeypatch.setattr(pretraining_data, "split_sentences", fail)
    again = tokenize_documents(train_documents, sample_tokenizer)
    assert again.cache_files == tokenized.cache_files


def test_second_build_comes_from_cache(tokenized, sample_tokenizer, monkeypatch):
    first = build(tokenized, sample_tokenizer, seed=7)
    assert first.cache_files

    monkeypatch.setattr(pretraining_instances, "nsp_pairs", fail)
    second = build(tokenized, sample_tokenizer, seed=7)
    assert second.cache_files == first.cache_files
    assert second["input_ids"] == first["input_ids"]
    # Other parameters are a different cache key.
    with pytest.raises(RuntimeError, match="rebuilt"):
        build(tokenized, sample_tokenizer, seed=7, pass_index=1)


def test_the_cache_is_keyed_by_the_tokenizers_content_not_its_folder(
    train_documents, tokenized, sample_tokenizer, tmp_path, monkeypatch
):
    # A resumed run loads its tokenizer from checkpoint-N/tokenizer: a new folder each time, same content.
    sample_tokenizer.save_pretrained(tmp_path / "one")
    sample_tokenizer.save_pretrained(tmp_path / "two")
    one = AutoTokenizer.from_pretrained(tmp_path / "one")
    two = AutoTokenizer.from_pretrained(tmp_path / "two")
    first = tokenize_documents(train_documents, one)
    first_instances = build(first, one, seed=11)
    monkeypatch.setattr(pretraining_data, "split_sentences", fail)
    monkeypatch.setattr(pretraining_instances, "nsp_pairs", fail)
    second = tokenize_documents(train_documents, two)
    assert second.cache_files == first.cache_files
    assert build(second, two, seed=11).cache_files == first_instances.cache_files


def test_a_tokenizer_with_other_content_is_another_cache_key(
    train_documents, tokenized, sample_tokenizer, monkeypatch
):
    other = copy.deepcopy(sample_tokenizer)
    other.backend_tokenizer.normalizer = normalizers.Lowercase()
    monkeypatch.setattr(pretraining_data, "split_sentences", fail)
    with pytest.raises(RuntimeError, match="rebuilt"):
        tokenize_documents(train_documents, other)


def test_fewer_than_two_documents_is_an_error():
    single = Dataset.from_dict({"sentences": [[[5, 6, 7], [8, 9]]]})
    with pytest.raises(ValueError, match="at least 2 documents") as error:
        write_instances(single, InstanceRecipe("mlm+nsp", 2, 3, 16))
    for fix in ("--validation_file", "--validation_split_percentage", "--document_boundary"):
        assert fix in str(error.value)


def saved_documents(tmp_path, count: int, name: str = "train") -> Dataset:
    """``count`` one-paragraph documents, file-backed under ``tmp_path`` (so cache files would land there)."""
    paragraphs = [[f"Document {index} is here . It ends ."] for index in range(count)]
    Dataset.from_dict({"paragraphs": paragraphs}).save_to_disk(tmp_path / name)
    return load_from_disk(tmp_path / name)


def files_under(folder) -> list:
    return sorted(path for path in folder.rglob("*"))


def test_validation_share_is_split_off_like_train_test_split(tmp_path):
    train = saved_documents(tmp_path, 40)
    split = split_validation_documents(DatasetDict(train=train), 5, seed=42, min_documents=2)
    expected = train.train_test_split(test_size=0.05, seed=42)
    assert (len(split["train"]), len(split["validation"])) == (38, 2)
    assert split["train"]["paragraphs"] == expected["train"]["paragraphs"]
    assert split["validation"]["paragraphs"] == expected["test"]["paragraphs"]
    given = DatasetDict(train=train, validation=saved_documents(tmp_path, 2, "validation"))
    assert split_validation_documents(given, 5, seed=42, min_documents=2) is given


@pytest.mark.parametrize(
    ("count", "percentage", "expected"),
    [
        (
            40,
            99,
            [
                "--validation_split_percentage 99",
                "40 of the 40 documents",
                "0 for training",
                "--validation_split_percentage 95 (anything from 1 to 95",
                "--validation_file",
            ],
        ),
        # Too few documents for any split: datasets said "the resulting train set will be empty".
        (1, 5, ["the training corpus has 1 document", "--validation_file", "--document_boundary"]),
        (3, 5, ["the training corpus has 3 documents", "--validation_file", "--document_boundary"]),
        (3, 50, ["the training corpus has 3 documents", "--validation_file", "--document_boundary"]),
    ],
)
def test_a_split_without_two_documents_is_refused_with_the_fix(tmp_path, count, percentage, expected):
    train = saved_documents(tmp_path, count)
    before = files_under(tmp_path)
    with pytest.raises(ValueError) as error:
        split_validation_documents(DatasetDict(train=train), percentage, seed=42, min_documents=2)
    for part in expected:
        assert part in str(error.value)
    assert files_under(tmp_path) == before


@pytest.mark.parametrize(("count", "min_documents", "held_out"), [(12, 2, 2), (8, 2, 2), (4, 2, 2), (40, 2, 2), (12, 1, 1)])
def test_a_share_below_what_the_objective_needs_holds_out_that_many_and_says_so(
    tmp_path, caplog, count, min_documents, held_out
):
    """5% of a dozen documents is one (rounded up), where NSP needs 2 in each split (B comes from another
    document): 2 are held out, as Dataset.train_test_split(test_size=2) picks them, and one INFO line says so.
    Where 5% is enough (40 documents; 1 for --objective mlm) nothing is said."""
    train = saved_documents(tmp_path, count)
    with caplog.at_level(logging.INFO, "hfbert"):
        split = split_validation_documents(DatasetDict(train=train), 5, seed=42, min_documents=min_documents)
    assert (len(split["validation"]), len(split["train"])) == (held_out, count - held_out)
    expected = train.train_test_split(test_size=held_out, seed=42)
    assert split["validation"]["paragraphs"] == expected["test"]["paragraphs"]
    said = [(record.levelno, record.getMessage()) for record in caplog.records if "validation" in record.getMessage()]
    if math.ceil(count * 5 / 100) >= min_documents:
        assert said == []
    else:
        assert said == [(
            logging.INFO,
            f"--validation_split_percentage 5 holds out 1 of the {count} documents; next-sentence prediction needs "
            f"at least 2 documents in each split (B segments come from another document), so 2 are held out for "
            f"validation and {count - 2} train (--validation_file gives a validation corpus of your own)",
        )]  # fmt: skip


def test_a_validation_file_with_one_document_is_refused_with_the_fix(tmp_path):
    documents = DatasetDict(train=saved_documents(tmp_path, 10), validation=saved_documents(tmp_path, 1, "v"))
    with pytest.raises(ValueError, match=r"the validation split has 1 document;.*--validation_file"):
        split_validation_documents(documents, 5, seed=42, min_documents=2)
    documents = DatasetDict(
        train=saved_documents(tmp_path, 1, "t"), validation=saved_documents(tmp_path, 5, "w")
    )
    with pytest.raises(ValueError, match=r"the training split has 1 document;"):
        split_validation_documents(documents, 5, seed=42, min_documents=2)


def test_mlm_splits_need_one_document_each_not_nsp_two(tmp_path):
    """--objective mlm draws no B segment from another document: a split of one document is enough, none is not."""
    train = saved_documents(tmp_path, 20)
    split = split_validation_documents(DatasetDict(train=train), 5, seed=42, min_documents=1)
    assert (len(split["train"]), len(split["validation"])) == (19, 1)
    given = DatasetDict(train=train, validation=saved_documents(tmp_path, 1, "v"))
    assert split_validation_documents(given, 5, seed=42, min_documents=1) is given
    one = DatasetDict(train=saved_documents(tmp_path, 1, "one"))
    with pytest.raises(ValueError, match=r"the training corpus has 1 document .*--objective mlm needs at least 1 "):
        split_validation_documents(one, 5, seed=42, min_documents=1)
    with pytest.raises(ValueError, match=r"the validation split has 0 documents; --objective mlm needs at least 1"):
        check_validation_split(20, 0, 5, min_documents=1)


def test_validation_split_percentage_out_of_range_is_refused(tmp_path):
    with pytest.raises(ValueError, match=r"--validation_split_percentage 0 .*between 1 and 99"):
        split_validation_documents(DatasetDict(train=saved_documents(tmp_path, 40)), 0, seed=42, min_documents=2)


def test_max_seq_length_too_small_is_an_error():
    with pytest.raises(ValueError, match="max_seq_length 4"):
        InstanceRecipe("mlm+nsp", 2, 3, 4)
