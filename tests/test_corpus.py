"""hfbert.corpus: every source gives cleaned documents; bad input gives one clear CorpusError."""

import csv
import gzip
import json
import os
import re
import shutil
import time
from pathlib import Path

import datasets
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from transformers import HfArgumentParser

import hfbert.corpus
from hfbert.corpus import (
    clean_wikitext_line,
    is_wikitext_article_heading,
    iter_documents,
    load_documents,
    resolve_document_boundary,
)
from hfbert.corpus_arguments import (
    SHIPPED_SAMPLE_DIR,
    SHIPPED_SAMPLE_FILES,
    CorpusArguments,
    CorpusError,
    check_output_outside_corpus,
    corpus_fingerprint,
)
from hfbert.errors import Refusal

HUB_CONFIG = "wikitext-2-raw-v1"
# The README front matter of the Hub's Salesforce/wikitext repo, reduced to one configuration.
HUB_README = f"""---
configs:
- config_name: {HUB_CONFIG}
  data_files:
  - split: train
    path: {HUB_CONFIG}/train-*
  - split: validation
    path: {HUB_CONFIG}/validation-*
  - split: test
    path: {HUB_CONFIG}/test-*
---
"""


def paragraphs_of(documents) -> list[list[str]]:
    return [document["paragraphs"] for document in documents]


def sample_lines(split: str) -> list[str]:
    return (SHIPPED_SAMPLE_DIR / SHIPPED_SAMPLE_FILES[split]).read_text(encoding="utf-8").splitlines()


def test_shipped_sample_is_cleaned_articles(sample_documents):
    assert set(sample_documents) == {"train", "validation"}
    assert sample_documents["train"].column_names == ["paragraphs"]
    assert (len(sample_documents["train"]), len(sample_documents["validation"])) == (33, 6)
    first = sample_documents["train"][0]["paragraphs"]
    assert first[0].startswith("Robert Boulter is an English film , television and theatre actor .")
    assert "guest-starring role" in first[0]  # " @-@ " restored
    for document in sample_documents["train"]:
        for paragraph in document["paragraphs"]:
            assert paragraph == paragraph.strip() and paragraph
            assert not paragraph.startswith("= ")
            assert "@-@" not in paragraph and "@,@" not in paragraph and "@.@" not in paragraph


@pytest.mark.parametrize(
    ("line", "paragraph", "starts_article"),
    [
        (" = Robert Boulter = ", "", True),
        (" = = Career = = ", "", False),
        (" = = = 2000 – 2005 = = = ", "", False),
        (" ", "", False),
        ("", "", False),
        (
            " a guest @-@ starring role in 1 @,@ 000 films , 2 @.@ 5 hours . ",
            "a guest-starring role in 1,000 films , 2.5 hours .",
            False,
        ),
        (" x = y is an equation = ", "x = y is an equation =", False),
    ],
)
def test_wikitext_line_rules(line, paragraph, starts_article):
    assert clean_wikitext_line(line) == paragraph
    assert is_wikitext_article_heading(line) == starts_article


@pytest.mark.parametrize(
    ("arguments", "boundary"),
    [
        (CorpusArguments(), "heading"),
        (CorpusArguments(dataset_name="Salesforce/wikitext", dataset_config_name=HUB_CONFIG), "heading"),
        (CorpusArguments(dataset_name="someone/books"), "row"),
        (CorpusArguments(train_file="wiki.train.raw"), "heading"),
        (CorpusArguments(train_file="books.txt"), "blank_line"),
        (CorpusArguments(train_file="books"), "blank_line"),
        (CorpusArguments(train_file="rows.parquet"), "row"),
        (CorpusArguments(train_file="rows.jsonl"), "row"),
        (CorpusArguments(train_file="rows.csv"), "row"),
        (CorpusArguments(train_file="books.txt", document_boundary="row"), "row"),
        # Compressed files (datasets decompresses them) keep their format's default.
        (CorpusArguments(train_file="wiki.train.raw.gz"), "heading"),
        (CorpusArguments(train_file="books.txt.bz2"), "blank_line"),
        (CorpusArguments(train_file="rows.jsonl.xz"), "row"),
    ],
)
def test_document_boundary_defaults(arguments, boundary):
    assert resolve_document_boundary(arguments) == boundary


@pytest.mark.parametrize("boundary", ["row", "blank_line", "heading"])
def test_a_missing_cell_is_an_empty_row(boundary):
    """The fourth attack (aca973c): a local --dataset_name csv cell that pandas reads as NA (None) ended in an
    AttributeError traceback ('NoneType' object has no attribute 'splitlines')."""
    rows = datasets.Dataset.from_dict({"text": ["First one.", None, "Second one."]})
    expected = list(iter_documents(datasets.Dataset.from_dict({"text": ["First one.", "", "Second one."]}), "text", boundary))
    assert list(iter_documents(rows, "text", boundary)) == expected


def test_grouping_does_not_depend_on_read_batches(monkeypatch):
    rows = datasets.Dataset.from_dict({"text": sample_lines("train")})
    whole = list(iter_documents(rows, "text", "heading"))
    monkeypatch.setattr(hfbert.corpus, "_ROWS_PER_READ", 7)
    assert list(iter_documents(rows, "text", "heading")) == whole
    assert len(whole) == 33


def test_second_load_reads_the_cache(sample_documents, monkeypatch):
    yielded = []
    regroup = hfbert.corpus.iter_documents

    def counting_iter_documents(*args, **kwargs):
        for document in regroup(*args, **kwargs):
            yielded.append(document)
            yield document

    monkeypatch.setattr(hfbert.corpus, "iter_documents", counting_iter_documents)
    again = load_documents(CorpusArguments())
    assert len(yielded) == 2  # only the emptiness check's first document of each split, no regrouping
    assert again["train"]._fingerprint == sample_documents["train"]._fingerprint
    assert paragraphs_of(again["train"]) == paragraphs_of(sample_documents["train"])


def test_datasets_private_fingerprint_names_a_datasets_content_as_its_cache_does():
    """hfbert keys its caches on datasets' `Dataset._fingerprint`, which has no public accessor (corpus.py,
    data.py, instances.py, health/corpus.py): the same for the same rows, another for other rows, and the one a
    map was given. This fails when datasets changes it."""
    rows = datasets.Dataset.from_dict({"text": ["a", "b"]})
    assert rows._fingerprint == datasets.Dataset.from_dict({"text": ["a", "b"]})._fingerprint
    assert rows._fingerprint != datasets.Dataset.from_dict({"text": ["a", "c"]})._fingerprint
    assert rows.map(lambda batch: batch, batched=True, new_fingerprint="f0")._fingerprint == "f0"


def test_streaming_gives_the_same_documents(sample_documents):
    streamed = load_documents(CorpusArguments(streaming=True))
    assert isinstance(streamed, datasets.IterableDatasetDict)
    for split in ("train", "validation"):
        assert paragraphs_of(streamed[split]) == paragraphs_of(sample_documents[split])


def test_local_raw_files_match_the_shipped_sample(tmp_path, sample_documents):
    for name in SHIPPED_SAMPLE_FILES.values():
        shutil.copy(SHIPPED_SAMPLE_DIR / name, tmp_path / name)
    documents = load_documents(
        CorpusArguments(
            train_file=str(tmp_path / "wiki.train.raw"), validation_file=str(tmp_path / "wiki.valid.raw")
        )
    )
    for split in ("train", "validation"):
        assert paragraphs_of(documents[split]) == paragraphs_of(sample_documents[split])


def test_local_text_file_splits_documents_at_blank_lines(tmp_path):
    path = tmp_path / "books.txt"
    path.write_text(
        "First line of book one.\n  Second line @-@ kept as is.  \n\n\nBook two.\n\n", encoding="utf-8"
    )
    documents = load_documents(CorpusArguments(train_file=str(path)))
    assert list(documents) == ["train"]
    assert paragraphs_of(documents["train"]) == [
        ["First line of book one.", "Second line @-@ kept as is."],
        ["Book two."],
    ]


ROW_TEXTS = ["Title one\n\nFirst paragraph.\nSecond paragraph.\n", "  \n", "Only paragraph of two."]
ROW_DOCUMENTS = [["Title one", "First paragraph.", "Second paragraph."], ["Only paragraph of two."]]


def write_rows(path, column: str, texts: list[str]) -> None:
    if path.suffix == ".parquet":
        pq.write_table(pa.table({column: texts, "id": list(range(len(texts)))}), path)
    elif path.suffix == ".jsonl":
        path.write_text("".join(json.dumps({column: text, "id": i}) + "\n" for i, text in enumerate(texts)))
    else:
        with path.open("w", newline="") as file:
            writer = csv.writer(file)
            writer.writerow([column, "id"])
            writer.writerows([text, i] for i, text in enumerate(texts))


@pytest.mark.parametrize("suffix", [".parquet", ".jsonl", ".csv"])
def test_local_structured_files_give_one_document_per_row(tmp_path, suffix):
    train, validation = tmp_path / f"train{suffix}", tmp_path / f"validation{suffix}"
    write_rows(train, "body", ROW_TEXTS)
    write_rows(validation, "body", ROW_TEXTS[:1])
    documents = load_documents(
        CorpusArguments(train_file=str(train), validation_file=str(validation), text_column="body")
    )
    assert paragraphs_of(documents["train"]) == ROW_DOCUMENTS
    assert paragraphs_of(documents["validation"]) == ROW_DOCUMENTS[:1]


def hub_rows(lines: list[str]) -> list[str]:
    """The Hub copy's layout: rows end with a newline; blank rows ("" or " ") between paragraphs."""
    rows = [""]
    for index, line in enumerate(lines):
        rows += [line + "\n", " \n" if index % 2 else ""]
    return rows


@pytest.fixture
def hub_layout_folder(tmp_path):
    """A local folder laid out like the Hub's Salesforce/wikitext repo, holding the shipped sample."""
    folder = tmp_path / "wikitext"
    (folder / HUB_CONFIG).mkdir(parents=True)
    (folder / "README.md").write_text(HUB_README, encoding="utf-8")
    for split, source in (("train", "train"), ("validation", "validation"), ("test", "validation")):
        table = pa.table({"text": hub_rows(sample_lines(source))})
        pq.write_table(table, folder / HUB_CONFIG / f"{split}-00000-of-00001.parquet")
    return folder


@pytest.mark.parametrize("streaming", [False, True])
def test_hub_layout_folder_matches_the_shipped_sample(hub_layout_folder, sample_documents, streaming):
    arguments = CorpusArguments(
        dataset_name=str(hub_layout_folder), dataset_config_name=HUB_CONFIG, streaming=streaming
    )
    documents = load_documents(arguments)
    assert set(documents) == {"train", "validation"}  # the test split is not used
    for split in ("train", "validation"):
        assert paragraphs_of(documents[split]) == paragraphs_of(sample_documents[split])


def test_corpus_flags_parse():
    (arguments,) = HfArgumentParser(CorpusArguments).parse_args_into_dataclasses(
        ["--dataset_name", "Salesforce/wikitext", "--dataset_config_name", HUB_CONFIG, "--streaming"]
    )
    assert arguments == CorpusArguments(
        dataset_name="Salesforce/wikitext", dataset_config_name=HUB_CONFIG, streaming=True
    )


def test_offline_hub_id_is_one_quick_error():
    started = time.perf_counter()
    with pytest.raises(CorpusError, match=r"Salesforce/wikitext.*--train_file/--validation_file"):
        load_documents(CorpusArguments(dataset_name="Salesforce/wikitext", dataset_config_name=HUB_CONFIG))
    assert time.perf_counter() - started < 5


def test_unreachable_hub_is_one_quick_error(monkeypatch):
    class UnreachableHub:
        def dataset_info(self, repo_id, timeout=None):
            raise OSError("[Errno -2] Name or service not known")

    def must_not_load(*args, **kwargs):
        raise AssertionError("load_dataset would retry for ~25 s against an unreachable Hub")

    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(hfbert.corpus, "HfApi", UnreachableHub)
    monkeypatch.setattr(datasets, "load_dataset", must_not_load)
    with pytest.raises(
        CorpusError, match=r"cannot reach the Hugging Face Hub.*--train_file/--validation_file"
    ):
        load_documents(CorpusArguments(dataset_name="Salesforce/wikitext", dataset_config_name=HUB_CONFIG))


def test_missing_file_is_a_clear_error(tmp_path):
    with pytest.raises(CorpusError, match=r"--train_file .*missing\.raw does not exist"):
        load_documents(CorpusArguments(train_file=str(tmp_path / "missing.raw")))


@pytest.mark.parametrize("text", ["", "\n \n\n", " = Title = \n = = Section = = \n \n"])
def test_empty_corpus_is_a_clear_error(tmp_path, text):
    path = tmp_path / "empty.raw"
    path.write_text(text, encoding="utf-8")
    with pytest.raises(CorpusError, match=r"empty\.raw (is empty|has no text in its train split)"):
        load_documents(CorpusArguments(train_file=str(path)))


def test_validation_file_without_text_is_reported(tmp_path):
    train = tmp_path / "train.raw"
    shutil.copy(SHIPPED_SAMPLE_DIR / "wiki.train.raw", train)
    validation = tmp_path / "valid.raw"
    validation.write_text(" \n", encoding="utf-8")
    with pytest.raises(CorpusError, match=r"has no text in its validation split"):
        load_documents(CorpusArguments(train_file=str(train), validation_file=str(validation)))


def test_missing_text_column_is_a_clear_error(tmp_path):
    path = tmp_path / "rows.parquet"
    write_rows(path, "body", ROW_TEXTS)
    with pytest.raises(CorpusError, match=r"--text_column text is not a column .*'body'"):
        load_documents(CorpusArguments(train_file=str(path)))


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"dataset_name": "Salesforce/wikitext", "train_file": "a.txt"}, "pass only one of them"),
        ({"validation_file": "b.txt"}, "without --train_file"),
        ({"dataset_config_name": HUB_CONFIG}, "without --dataset_name"),
    ],
)
def test_contradictory_flags_are_a_clear_error(fields, message):
    with pytest.raises(CorpusError, match=message):
        CorpusArguments(**fields)


def arrow_files() -> set:
    return set(Path(datasets.config.HF_DATASETS_CACHE).rglob("*.arrow"))


@pytest.mark.parametrize("streaming", [False, True])
@pytest.mark.parametrize("bad_split", ["train", "validation"])
def test_invalid_utf8_names_the_file_the_offset_and_the_fix(tmp_path, streaming, bad_split):
    # Was a DatasetGenerationError around "'utf-8' codec can't decode byte 0xe9 in position 18" (position in
    # datasets' read chunk), without the file.
    good = "A first paragraph .\n\nA second document .\n"
    bad = "Hello world .\n\nCaf\xe9 au lait .\n".encode("latin-1")
    files = {"train": tmp_path / "train.txt", "validation": tmp_path / "valid.txt"}
    files["train"].write_text(good, encoding="utf-8")
    files["validation"].write_text(good, encoding="utf-8")
    files[bad_split].write_bytes(bad)
    before = arrow_files()
    args = CorpusArguments(
        train_file=str(files["train"]), validation_file=str(files["validation"]), streaming=streaming
    )
    flag = "--train_file" if bad_split == "train" else "--validation_file"
    with pytest.raises(CorpusError) as error:
        documents = load_documents(args)
        for split in documents.values():
            list(split)
    message = str(error.value)
    assert f"{flag} {files[bad_split]} is not valid UTF-8" in message
    assert "byte 0xe9 at byte offset 18 (line 3)" in message
    assert "iconv -f latin1 -t utf-8" in message
    assert arrow_files() == before


@pytest.mark.parametrize("streaming", [False, True])
def test_invalid_utf8_late_in_a_big_file_is_found(tmp_path, streaming):
    path = tmp_path / "big.txt"
    line = "Some ordinary text that goes on for a while .\n"
    path.write_bytes((line * 400_000).encode() + b"\xff\xfe broken\n")  # 18.8 MB, past datasets' first read
    with pytest.raises(CorpusError, match=rf"byte 0xff at byte offset {len(line) * 400_000} \(line 400001\)"):
        for _ in load_documents(CorpusArguments(train_file=str(path), streaming=streaming))["train"]:
            pass


def test_invalid_utf8_in_a_jsonl_file_is_named(tmp_path):
    path = tmp_path / "rows.jsonl"
    path.write_bytes(b'{"text": "fine"}\n{"text": "Caf\xe9"}\n')
    with pytest.raises(
        CorpusError, match=r"rows\.jsonl is not valid UTF-8: byte 0xe9 at byte offset 30 \(line 2\)"
    ):
        load_documents(CorpusArguments(train_file=str(path)))


@pytest.mark.parametrize(
    ("content", "offset"), [(bytes(range(256)) * 40, 0), (b"A title line\n" + b"\0" * 5000, 13)]
)
def test_a_binary_file_is_named_as_not_text(tmp_path, content, offset):
    """A binary file got the iconv advice of a text file in another encoding; a file of NULs got datasets'
    SchemaInferenceError."""
    path = tmp_path / "model.raw"
    path.write_bytes(content)
    with pytest.raises(CorpusError, match=rf"model\.raw is not a text file: it has a NUL byte at byte offset {offset}"):
        load_documents(CorpusArguments(train_file=str(path)))


@pytest.mark.parametrize("name", ["rows.jsonl", "rows.jsonl.gz"])
def test_a_bad_jsonl_line_is_named(tmp_path, name):
    """A line that is not JSON surfaced as datasets' DatasetGenerationError (from pyarrow's ArrowInvalid)."""
    path = tmp_path / name
    content = b'{"text": "fine"}\n\n{"text": broken}\n{"text": "fine too"}\n'
    path.write_bytes(gzip.compress(content) if name.endswith(".gz") else content)
    with pytest.raises(CorpusError, match=rf"{name} line 3 is not a JSON object \(Expecting value"):
        load_documents(CorpusArguments(train_file=str(path)))


def test_a_compressed_wikitext_file_is_read_as_wikitext(tmp_path):
    """wiki.train.raw.gz was split at blank lines with its headings kept as text."""
    plain = SHIPPED_SAMPLE_DIR / SHIPPED_SAMPLE_FILES["validation"]
    path = tmp_path / "wiki.valid.raw.gz"
    path.write_bytes(gzip.compress(plain.read_bytes()))
    expected = load_documents(CorpusArguments(train_file=str(plain)))["train"]["paragraphs"]
    assert load_documents(CorpusArguments(train_file=str(path)))["train"]["paragraphs"] == expected


def test_a_read_only_datasets_cache_is_named_with_the_fix(read_only_folder, monkeypatch):
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", read_only_folder)
    with pytest.raises(Refusal, match=rf"^The datasets cache {read_only_folder} cannot be used: cannot write .*HF_DATASETS_CACHE"):
        load_documents(CorpusArguments())


# ----------------------------------------------------------------------------------- folders and globs


def write_texts(folder: Path, texts: dict[str, str | bytes]) -> Path:
    for name, text in texts.items():
        path = folder / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(text if isinstance(text, bytes) else text.encode())
    return folder


TEXTS = {
    "b.txt": "Second file, first line.\n\nSecond file, after a blank line.\n",
    "a.txt": "First file.\n",
    "sub/c.txt": "A file in a subfolder.\n",
    "empty.txt": "",
    ".hidden.txt": "Skipped, as datasets skips hidden files.\n",
}


@pytest.mark.parametrize("streaming", [False, True])
def test_a_folder_is_read_recursively_in_sorted_order_a_file_a_document(tmp_path, streaming, caplog):
    folder = write_texts(tmp_path / "texts", TEXTS)
    with caplog.at_level("INFO", logger="hfbert.corpus"):
        documents = load_documents(CorpusArguments(train_file=str(folder), streaming=streaming))
    assert paragraphs_of(documents["train"]) == [
        ["First file."],
        ["Second file, first line.", "Second file, after a blank line."],
        ["A file in a subfolder."],
    ]
    found = "4 files" if streaming else "3 documents from 4 files"
    assert f"--train_file {folder}: {found}" in caplog.text


def test_a_glob_is_read_a_file_a_document(tmp_path, caplog):
    folder = write_texts(tmp_path / "texts", TEXTS)
    with caplog.at_level("INFO", logger="hfbert.corpus"):
        documents = load_documents(CorpusArguments(train_file=f"{folder}/*.txt"))
    assert paragraphs_of(documents["train"]) == [["First file."], ["Second file, first line.", "Second file, after a blank line."]]
    assert "2 documents from 3 files" in caplog.text


def test_blank_line_documents_in_a_folder_end_at_each_file(tmp_path, caplog):
    folder = write_texts(tmp_path / "texts", {"a.txt": "One.\n\nTwo.", "b.txt": "Three.\nStill three.\n"})
    with caplog.at_level("INFO", logger="hfbert.corpus"):
        documents = load_documents(CorpusArguments(train_file=str(folder), document_boundary="blank_line"))
    assert paragraphs_of(documents["train"]) == [["One."], ["Two."], ["Three.", "Still three."]]
    assert "3 documents from 2 files (documents end at blank lines and at each file's end)" in caplog.text


def test_a_folder_and_the_same_file_alone_are_cached_apart(tmp_path):
    folder = write_texts(tmp_path / "texts", {"a.txt": "One.\nTwo.\n"})
    alone = load_documents(CorpusArguments(train_file=str(folder / "a.txt"), document_boundary="row"))
    assert paragraphs_of(alone["train"]) == [["One."], ["Two."]]
    assert paragraphs_of(load_documents(CorpusArguments(train_file=str(folder), document_boundary="row"))["train"]) == [
        ["One.", "Two."]
    ]


@pytest.mark.parametrize(
    ("case", "message"),
    [
        ("empty folder", r"--train_file {folder} holds no file \(hidden files are skipped\); pass a folder of text files"),
        ("glob matching nothing", r"--train_file {folder}/\*\.md matches no file; check the pattern"),
        ("binary file", r"--train_file {folder}: {folder}/sub/image\.png is not a text file: it has a NUL byte"),
        ("latin-1 file", r"--train_file {folder}: {folder}/sub/latin\.txt is not valid UTF-8: byte 0xe9"),
        ("mixed formats", r"--train_file {folder} has files of different formats \(\.jsonl, \.txt\)"),
        ("a folder with one validation file", r"--train_file {folder} and --validation_file .*a\.txt are read alike"),
    ],
)
def test_a_bad_folder_or_glob_is_one_line_naming_the_file_before_any_read(tmp_path, case, message):
    folder = tmp_path / "texts"
    folder.mkdir()
    write_texts(folder, {".hidden": "x"})
    if case != "empty folder":
        write_texts(folder, {"a.txt": "Fine text.\n"})
    extra = {
        "binary file": {"sub/image.png": b"\x89PNG\r\n\x1a\n\0\0\0"},
        "latin-1 file": {"sub/latin.txt": "Caf\xe9.\n".encode("latin-1")},
        "mixed formats": {"rows.jsonl": '{"text": "x"}\n'},
    }.get(case, {})
    write_texts(folder, extra)
    train_file = f"{folder}/*.md" if case == "glob matching nothing" else str(folder)
    validation_file = str(folder / "a.txt") if case == "a folder with one validation file" else None
    before = arrow_files()
    with pytest.raises(CorpusError, match="^" + message.format(folder=re.escape(str(folder)))):
        load_documents(CorpusArguments(train_file=train_file, validation_file=validation_file))
    assert arrow_files() == before


def folder_with_links_out(tmp_path) -> Path:
    """texts/ with two files, a link to one of them, and links that lead out of it: two to a file (absolute and
    relative) and one to a folder."""
    folder = write_texts(tmp_path / "texts", {"a.txt": "Kept.\n", "sub/b.txt": "Kept too.\n"})
    secret = write_texts(tmp_path / "elsewhere", {"password.txt": "hunter2\n"}) / "password.txt"
    (folder / "password.txt").symlink_to(secret)
    (folder / "relative.txt").symlink_to(Path("..") / "elsewhere" / "password.txt")
    (folder / "alias.txt").symlink_to("a.txt")  # inside the folder: read
    (folder / "linked").symlink_to(secret.parent, target_is_directory=True)  # folder links are not followed
    return folder


@pytest.mark.parametrize("streaming", [False, True])
@pytest.mark.parametrize("glob", [False, True])
def test_a_file_link_leading_out_of_a_folder_is_skipped_and_the_count_says_so(tmp_path, caplog, streaming, glob):
    """A link to a file holding a password was read, and its text quoted in samples.md, which is pushed."""
    folder = folder_with_links_out(tmp_path)
    train_file = f"{folder}/*.txt" if glob else str(folder)
    with caplog.at_level("INFO", logger="hfbert.corpus"):
        documents = load_documents(CorpusArguments(train_file=train_file, streaming=streaming))
    assert paragraphs_of(documents["train"]) == [["Kept."], ["Kept."], *([] if glob else [["Kept too."]])]
    found = ("3 files" if streaming else "3 documents from 3 files") if not glob else (
        "2 files" if streaming else "2 documents from 2 files"
    )
    skipped = f"2 links leading out of {train_file} skipped ({folder}/password.txt, {folder}/relative.txt)"
    assert f"--train_file {train_file}: {found}" in caplog.text and skipped in caplog.text
    fingerprint = corpus_fingerprint(CorpusArguments(train_file=train_file))
    (tmp_path / "elsewhere" / "password.txt").write_text("changed, and not read\n")
    assert corpus_fingerprint(CorpusArguments(train_file=train_file)) == fingerprint


def test_a_folder_of_links_leading_out_of_it_holds_no_file(tmp_path):
    folder = folder_with_links_out(tmp_path)
    for name in ("a.txt", "alias.txt", "sub/b.txt"):
        (folder / name).unlink()
    with pytest.raises(CorpusError, match=re.escape(
        f"--train_file {folder} holds no file (hidden files are skipped; 2 links leading out of {folder} skipped "
        f"({folder}/password.txt, {folder}/relative.txt)); pass a folder of text files"
    )):  # fmt: skip
        load_documents(CorpusArguments(train_file=str(folder)))


def test_a_dataset_folder_with_a_file_link_leading_out_of_it_is_refused_before_any_read(hub_layout_folder, tmp_path):
    """datasets follows file links when it reads a local dataset folder, so it cannot skip them as a folder of
    --train_file does."""
    secret = write_texts(tmp_path / "elsewhere", {"password.parquet": "hunter2"}) / "password.parquet"
    link = hub_layout_folder / HUB_CONFIG / "test-00000-of-00001.parquet"
    link.unlink()
    link.symlink_to(secret)
    arguments = CorpusArguments(dataset_name=str(hub_layout_folder), dataset_config_name=HUB_CONFIG)
    before = arrow_files()
    with pytest.raises(CorpusError, match=re.escape(
        f"--dataset_name {hub_layout_folder}: 1 link leads out of the folder ({link}), and datasets would read "
        "what it points to; copy that into the folder in its place, or remove the link"
    )):  # fmt: skip
        load_documents(arguments)
    assert arrow_files() == before


@pytest.mark.parametrize("relative", [True, False])
def test_a_dataset_folder_whose_readme_names_files_outside_it_is_refused_before_any_read(
    hub_layout_folder, tmp_path, relative
):
    """The third attack (7c6b93a), F1: a local --dataset_name folder's README.md `data_files` naming
    ../secret/a.txt or an absolute path made datasets read files outside the folder; their text landed in
    samples.md, which is uploaded."""
    secret = write_texts(tmp_path / "secret", {"a.parquet": "hunter2"}) / "a.parquet"
    named = os.path.relpath(secret, hub_layout_folder) if relative else str(secret)
    readme = hub_layout_folder / "README.md"
    readme.write_text(HUB_README.replace(f"{HUB_CONFIG}/test-*", named), encoding="utf-8")
    arguments = CorpusArguments(dataset_name=str(hub_layout_folder), dataset_config_name=HUB_CONFIG)
    before = arrow_files()
    with pytest.raises(CorpusError) as refused:
        load_documents(arguments)
    assert str(refused.value) == (
        f"--dataset_name {hub_layout_folder}: its README.md's (or .huggingface.yaml's) data_files name 1 file outside the folder "
        f"({hub_layout_folder / named if relative else secret}), which datasets would read; copy it into the "
        "folder and name it there"
    )
    assert arrow_files() == before


def test_a_dataset_folders_fingerprint_is_the_content_of_the_files_datasets_reads(hub_layout_folder):
    """The third attack (7c6b93a), F3: a local --dataset_name folder had no fingerprint, so a resume on its
    edited files was accepted."""
    arguments = CorpusArguments(dataset_name=str(hub_layout_folder), dataset_config_name=HUB_CONFIG)
    fingerprint = corpus_fingerprint(arguments)
    assert fingerprint is not None
    (hub_layout_folder / "notes.txt").write_text("not a data file")
    assert corpus_fingerprint(arguments) == fingerprint
    train = hub_layout_folder / HUB_CONFIG / "train-00000-of-00001.parquet"
    pq.write_table(pa.table({"text": ["edited\n"]}), train)
    assert corpus_fingerprint(arguments) != fingerprint
    assert corpus_fingerprint(CorpusArguments(dataset_name="someone/on-the-hub")) is None  # the Hub's revision
    # The fourth attack (aca973c), F3: README.md's builder options (csv skiprows, sep, ...) change what is read
    # without touching the data files.
    edited = corpus_fingerprint(arguments)
    readme = hub_layout_folder / "README.md"
    readme.write_text(readme.read_text().replace("  data_files:", "  keep_default_na: false\n  data_files:"))
    assert corpus_fingerprint(arguments) != edited
    # The fifth attack (c7ce483), F2: .huggingface.yaml, which datasets reads over README.md's YAML.
    edited = corpus_fingerprint(arguments)
    options = HUB_README.strip().strip("-").strip().replace("  data_files:", "  sep: ','\n  data_files:")
    (hub_layout_folder / ".huggingface.yaml").write_text(options + "\n")
    assert corpus_fingerprint(arguments) != edited


def test_a_dataset_folder_edited_with_its_modification_time_kept_is_read_again(hub_layout_folder):
    """The fifth attack (c7ce483), F3: datasets keys a local folder's cache by each file's path and mtime, so
    text rewritten with its mtime kept (`cp -p`, `rsync -a`) trained the cached rows while the run recorded
    the new content's sha256. The cache is keyed by the content hfbert records."""
    arguments = CorpusArguments(dataset_name=str(hub_layout_folder), dataset_config_name=HUB_CONFIG)
    before = load_documents(arguments)["validation"]
    validation = hub_layout_folder / HUB_CONFIG / "validation-00000-of-00001.parquet"
    kept = validation.stat()
    pq.write_table(pa.table({"text": ["", " = Zebras = \n", "", " zebra zebra zebra .\n"]}), validation)
    os.utime(validation, ns=(kept.st_atime_ns, kept.st_mtime_ns))
    after = load_documents(arguments)["validation"]
    assert paragraphs_of(after) == [["zebra zebra zebra ."]]
    assert after._fingerprint != before._fingerprint  # so every cache built from the rows is rebuilt too


def test_a_file_whose_name_looks_like_a_glob_is_one_file(tmp_path):
    path = tmp_path / "notes[1].txt"
    path.write_text("One.\n\nTwo.\n")
    assert paragraphs_of(load_documents(CorpusArguments(train_file=str(path)))["train"]) == [["One."], ["Two."]]


def test_an_unreadable_file_in_a_folder_is_named(tmp_path, monkeypatch):
    folder = write_texts(tmp_path / "texts", {"a.txt": "Fine.\n", "b.txt": "Locked.\n"})
    (folder / "b.txt").chmod(0)
    if os.geteuid() == 0:  # root reads a file whatever its permissions: fail the open as it fails for a user
        opened = hfbert.corpus._open_binary

        def refusing_b(path):
            if path.name == "b.txt":
                raise PermissionError(13, "Permission denied")
            return opened(path)

        monkeypatch.setattr(hfbert.corpus, "_open_binary", refusing_b)
    with pytest.raises(CorpusError, match=rf"^--train_file {folder}: {folder}/b\.txt cannot be read \(Permission denied\)"):
        load_documents(CorpusArguments(train_file=str(folder)))


@pytest.mark.parametrize("streaming", [False, True])
@pytest.mark.parametrize("name", ["c9 | **bold** |", "notes [draft]", "what?"])
def test_a_folder_whose_name_has_glob_characters_is_read_as_the_folder(tmp_path, name, streaming):
    """The seventh attack (731f08a), S2: a --train_file folder whose name holds `**` ended in fsspec's
    ValueError traceback (the name was read as a pattern); `[draft]` or `?` would match other folders' files."""
    folder = write_texts(tmp_path / name, {"a.txt": "Kept.\n", "sub/b.txt": "Kept too.\n"})
    write_texts(tmp_path / "notes d", {"other.txt": "Not this folder's.\n"})
    documents = load_documents(CorpusArguments(train_file=str(folder), streaming=streaming))
    assert paragraphs_of(documents["train"]) == [["Kept."], ["Kept too."]]
    assert corpus_fingerprint(CorpusArguments(train_file=str(folder))) != corpus_fingerprint(
        CorpusArguments(train_file=str(tmp_path / "notes d"))
    )


def test_an_output_inside_a_corpus_folder_whose_name_has_glob_characters_is_refused(tmp_path):
    """The tenth attack (47cc435): `--train_file "g[1]/"` is read as that folder (S2), but the output check took
    `g[1]` for a pattern starting in its parent, so `--output_dir g[1]/out` wrote the run into the corpus."""
    folder = write_texts(tmp_path / "g[1]", {"a.txt": "Kept.\n"})
    with pytest.raises(CorpusError, match=re.escape(f"--output_dir {folder / 'out'} is inside the folder --train_file")):
        check_output_outside_corpus(CorpusArguments(train_file=f"{folder}/"), folder / "out")
