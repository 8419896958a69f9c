"""hfbert.tokenization: the trained tokenizer is a stock BERT tokenizer that the hfbert model agrees with."""

import errno
import json
import os
import random
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from conftest import DAMAGES, damage
from transformers import AutoTokenizer, BertTokenizer

import hfbert.tokenization
from hfbert import HfBertForPreTraining
from hfbert.corpus import load_documents
from hfbert.corpus_arguments import CorpusArguments
from hfbert.errors import REFUSAL_EXIT_CODE, Refusal, run_cli
from hfbert.files import run_folder_lock
from hfbert.tokenization import (
    MAX_WORD_CHARS,
    SPECIAL_TOKENS,
    ParagraphBatches,
    TokenizerTrainingArguments,
    bound_paragraphs,
    check_tokenizer_matches_config,
    load_tokenizer,
    main,
    measure_tokenizer,
    model_config_for_tokenizer,
    possible_continuation_forms,
    save_tokenizer,
    train_tokenizer,
)

REPO_ROOT = Path(__file__).resolve().parents[1]
SENTENCES = [
    "He starred in the play at the Royal Court Theatre.",
    "In 2006, Boulter starred alongside Whishaw in the play Citizenship.",
    "Café au lait, naïve résumé!",
]


@pytest.fixture(scope="module")
def saved_tokenizer_dir(sample_tokenizer, tmp_path_factory):
    folder = tmp_path_factory.mktemp("tokenizer") / "wordpiece"
    save_tokenizer(sample_tokenizer, folder)
    return folder



def test_a_tilde_in_the_tokenizers_output_dir_is_expanded(tmp_path, monkeypatch):
    """The fifth attack (c7ce483), F5, for train_tokenizer.py: the folder checked is the folder written."""
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert TokenizerTrainingArguments(output_dir="~/tok").output_dir == str(tmp_path / "home" / "tok")


def test_special_tokens_have_bert_ids(sample_tokenizer):
    assert sample_tokenizer.convert_tokens_to_ids(list(SPECIAL_TOKENS)) == [0, 1, 2, 3, 4]
    assert (sample_tokenizer.pad_token_id, sample_tokenizer.unk_token_id) == (0, 1)
    assert (sample_tokenizer.cls_token_id, sample_tokenizer.sep_token_id, sample_tokenizer.mask_token_id) == (
        2,
        3,
        4,
    )
    assert sample_tokenizer.mask_token == "[MASK]"
    assert len(sample_tokenizer) == 1000


def test_autotokenizer_round_trip(sample_tokenizer, saved_tokenizer_dir):
    loaded = AutoTokenizer.from_pretrained(saved_tokenizer_dir)
    assert isinstance(loaded, BertTokenizer) and loaded.is_fast
    assert loaded.pad_token_id == 0 and loaded.mask_token == "[MASK]"
    assert loaded.model_max_length == 512
    assert len(loaded) == len(sample_tokenizer) == 1000
    assert loaded.get_vocab() == sample_tokenizer.get_vocab()
    assert (
        loaded(SENTENCES, SENTENCES[::-1])["input_ids"]
        == sample_tokenizer(SENTENCES, SENTENCES[::-1])["input_ids"]
    )


def test_single_and_pair_layout(sample_tokenizer):
    first, second = SENTENCES[:2]
    ids_a = sample_tokenizer(first, add_special_tokens=False)["input_ids"]
    ids_b = sample_tokenizer(second, add_special_tokens=False)["input_ids"]
    single = sample_tokenizer(first)
    assert single["input_ids"] == [2, *ids_a, 3]
    assert single["token_type_ids"] == [0] * (len(ids_a) + 2)
    pair = sample_tokenizer(first, second)
    assert pair["input_ids"] == [2, *ids_a, 3, *ids_b, 3]
    assert pair["token_type_ids"] == [0] * (len(ids_a) + 2) + [1] * (len(ids_b) + 1)


@pytest.mark.parametrize("text", SENTENCES)
def test_decode_gives_back_the_normalised_text(sample_tokenizer, text):
    normalised = sample_tokenizer.backend_tokenizer.normalizer.normalize_str(text)
    assert normalised == normalised.lower() and "é" not in normalised  # lower-cased, accents stripped
    ids = sample_tokenizer(text)["input_ids"]
    assert sample_tokenizer.decode(ids, skip_special_tokens=True) == normalised


def test_unseen_word_splits_into_pieces_not_unk(sample_tokenizer):
    word = "unfathomableness"
    assert word not in sample_tokenizer.get_vocab()
    tokens = sample_tokenizer.tokenize(word)
    assert len(tokens) > 1 and "[UNK]" not in tokens
    assert all(token.startswith("##") for token in tokens[1:]) and not tokens[0].startswith("##")
    assert sample_tokenizer.convert_tokens_to_string(tokens) == word


def test_no_lowercase_keeps_case_and_accents(sample_documents):
    cased = train_tokenizer(sample_documents["train"], vocab_size=1000, lowercase=False, show_progress=False)
    assert cased.backend_tokenizer.normalizer.normalize_str("Café Robert") == "Café Robert"
    assert any(token[0].isupper() for token in cased.get_vocab())


def test_vocab_size_below_the_alphabet_is_a_clear_error(sample_documents):
    with pytest.raises(
        ValueError, match=r"--vocab_size 50 is smaller than the 5 special tokens plus the \d+ single"
    ):
        train_tokenizer(sample_documents["train"], vocab_size=50, show_progress=False)
    with pytest.raises(ValueError, match=r"--vocab_size 5 leaves no room"):
        train_tokenizer(sample_documents["train"], vocab_size=5, show_progress=False)


def test_model_config_agrees_with_the_saved_tokenizer(saved_tokenizer_dir):
    tokenizer = AutoTokenizer.from_pretrained(saved_tokenizer_dir)
    config = model_config_for_tokenizer(
        tokenizer,
        "tiny",
        hidden_size=32,
        num_attention_heads=2,
        intermediate_size=64,
        max_position_embeddings=128,
    )
    assert config.vocab_size == len(tokenizer) == 1000
    assert config.pad_token_id == tokenizer.pad_token_id == 0
    model = HfBertForPreTraining(config).eval()
    assert model.get_input_embeddings().num_embeddings == len(tokenizer)
    batch = tokenizer(SENTENCES[0], SENTENCES[1], return_tensors="pt")
    with torch.no_grad():
        logits = model(**batch).prediction_logits
    assert logits.shape == (1, batch["input_ids"].shape[1], len(tokenizer))


def test_config_may_round_vocab_size_up(sample_tokenizer):
    config = model_config_for_tokenizer(sample_tokenizer, "tiny", vocab_size=1024)
    assert config.vocab_size == 1024


def test_mismatched_config_is_a_clear_error(sample_tokenizer):
    too_small = model_config_for_tokenizer(sample_tokenizer, "tiny")
    too_small.vocab_size = 999
    with pytest.raises(
        ValueError, match=r"the tokenizer has 1000 tokens but the model config's vocab_size is 999"
    ):
        check_tokenizer_matches_config(sample_tokenizer, too_small)
    with pytest.raises(ValueError, match=r"vocab_size is 900"):
        model_config_for_tokenizer(sample_tokenizer, "tiny", vocab_size=900)
    other_pad = model_config_for_tokenizer(sample_tokenizer, "tiny")
    other_pad.pad_token_id = 1
    with pytest.raises(
        ValueError, match=r"pad_token_id 0 differs from the model config's pad_token_id 1.*pad_token_id=0\)"
    ):
        check_tokenizer_matches_config(sample_tokenizer, other_pad)


def test_measure_tokenizer(sample_tokenizer, sample_documents):
    quality = measure_tokenizer(sample_tokenizer, sample_documents["validation"])
    assert quality.words > 30_000  # 37,903 whitespace words; punctuation marks count as words too
    assert quality.unk_rate < 0.001
    assert 1.0 < quality.tokens_per_word < 2.5


def test_paragraph_batches_count_bytes(sample_documents):
    batches = ParagraphBatches(sample_documents["train"], show_progress=False)
    paragraphs = [paragraph for batch in batches for paragraph in batch]
    expected = [paragraph for document in sample_documents["train"] for paragraph in document["paragraphs"]]
    assert paragraphs == expected
    assert batches.bytes_read == sum(len(paragraph.encode("utf-8")) for paragraph in expected)


def test_main_trains_saves_and_summarises(tmp_path, capsys):
    output_dir = tmp_path / "tok"
    main(["--vocab_size", "1000", "--output_dir", str(output_dir)])
    summary = capsys.readouterr().out
    for label in ("vocabulary size:  1000", "MB/s", "validation [UNK]:", "tokens per word:"):
        assert label in summary
    assert len(AutoTokenizer.from_pretrained(output_dir)) == 1000
    assert sorted(path.name for path in tmp_path.iterdir()) == ["tok"]  # no staging folder left behind
    main(["--vocab_size", "500", "--output_dir", str(output_dir)])  # a tokenizer folder may be replaced
    assert len(AutoTokenizer.from_pretrained(output_dir)) == 500


@pytest.mark.parametrize("pattern", ["{folder}", "{folder}/*.txt"])
def test_main_trains_on_a_folder_or_a_glob_of_text_files_a_file_a_document(tmp_path, capsys, pattern):
    folder = tmp_path / "texts"
    folder.mkdir()
    for number in range(3):
        (folder / f"{number}.txt").write_text(f"Text file number {number}.\n\nIts second paragraph.\n")
    train_file = pattern.format(folder=folder)
    main(["--vocab_size", "200", "--output_dir", str(tmp_path / "tok"), "--train_file", train_file])
    assert f"corpus:           --train_file {train_file}: 3 documents from 3 files (a file a document)" in capsys.readouterr().out


def test_main_refuses_a_glob_that_matches_nothing_before_any_work(tmp_path):
    with pytest.raises(Refusal, match=r"--train_file .*\*\.md matches no file; check the pattern"):
        main(["--vocab_size", "200", "--output_dir", str(tmp_path / "tok"), "--train_file", f"{tmp_path}/*.md"])
    assert not (tmp_path / "tok").exists()


def test_main_refuses_a_foreign_non_empty_folder(tmp_path):
    (tmp_path / "notes.txt").write_text("mine")
    with pytest.raises(ValueError, match=r"is not empty and holds no tokenizer.*--overwrite_output_dir"):
        main(["--vocab_size", "1000", "--output_dir", str(tmp_path)])
    main(["--vocab_size", "1000", "--output_dir", str(tmp_path), "--overwrite_output_dir"])
    assert (tmp_path / "notes.txt").read_text() == "mine"
    assert len(AutoTokenizer.from_pretrained(tmp_path)) == 1000



def test_main_replaces_only_a_tokenizer_it_wrote_itself(tmp_path, monkeypatch):
    """The sixth attack (9c5ba80), G2: any folder holding a tokenizer.json or tokenizer_config.json was
    overwritten with no flag and no message, a user's own tokenizer (or a Hub download) included. A retrain into
    hfbert's own tokenizer folder needs no flag; one of anyone else's needs --overwrite_output_dir."""
    main(["--vocab_size", "300", "--output_dir", str(tmp_path / "ours")])
    main(["--vocab_size", "400", "--output_dir", str(tmp_path / "ours")])  # hfbert's own: replaced, no flag
    assert len(AutoTokenizer.from_pretrained(tmp_path / "ours")) == 400
    theirs = tmp_path / "theirs"
    AutoTokenizer.from_pretrained(tmp_path / "ours").save_pretrained(theirs)  # as a user's or the Hub's folder
    (theirs / "vocab.txt").write_text("[PAD]\n[UNK]\nhello\n")
    before = {path.name: path.read_bytes() for path in theirs.iterdir()}
    refuse_to_read_the_corpus(monkeypatch)
    with pytest.raises(Refusal) as refused:
        main(["--vocab_size", "300", "--output_dir", str(theirs)])
    assert str(refused.value) == (
        f"--output_dir {theirs} holds a tokenizer hfbert did not write (tokenizer.json, tokenizer_config.json, "
        "vocab.txt), or one an hfbert wrote before it recorded its files; pass --overwrite_output_dir to replace "
        "it, or another --output_dir"
    )
    assert {path.name: path.read_bytes() for path in theirs.iterdir()} == before
    monkeypatch.undo()
    main(["--vocab_size", "300", "--output_dir", str(theirs), "--overwrite_output_dir"])  # replaced, as asked
    assert len(AutoTokenizer.from_pretrained(theirs)) == 300


def test_main_refuses_an_output_dir_inside_the_corpus_folder_before_any_work(tmp_path):
    """Issue 64, item 4: the tokenizer's files would become part of the corpus it was trained on."""
    texts = tmp_path / "texts"
    texts.mkdir()
    (texts / "one.txt").write_text("Some text here. And more.")
    with pytest.raises(Refusal, match=r"^--output_dir .*/texts/tok is inside the folder --train_file .*texts reads"):
        main(["--vocab_size", "200", "--output_dir", str(texts / "tok"), "--train_file", str(texts)])
    assert sorted(path.name for path in texts.iterdir()) == ["one.txt"]


def refuse_to_read_the_corpus(monkeypatch):
    def read(*args, **kwargs):
        raise AssertionError("the corpus was read before the flags were checked")

    monkeypatch.setattr(hfbert.tokenization, "load_documents", read)


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--min_frequency", "-3"], "--min_frequency -3 must be >= 0, e.g. 2"),
        (["--model_max_length", "0"], "--model_max_length 0 must be > 0, e.g. 512"),
        (["--vocab_size", "5"], "--vocab_size 5 leaves no room beside the 5 special tokens"),
        # The trainer aborted in Rust (exit 134, "memory allocation of 4535485464592 bytes failed").
        (["--vocab_size", "99999999999"], "--vocab_size 99999999999 is above 1,048,576"),
    ],
)
def test_main_refuses_bad_values_before_reading_the_corpus(tmp_path, monkeypatch, flags, message):
    refuse_to_read_the_corpus(monkeypatch)
    with pytest.raises(ValueError) as error:
        main(["--output_dir", str(tmp_path / "tok"), *flags])
    assert message in str(error.value)
    assert not (tmp_path / "tok").exists()


@pytest.mark.parametrize("missing", [False, True])
def test_main_refuses_a_read_only_output_folder_before_training(read_only_folder, monkeypatch, missing):
    refuse_to_read_the_corpus(monkeypatch)
    output_dir = read_only_folder / "tok" if missing else read_only_folder
    with pytest.raises(ValueError, match=rf"--output_dir {output_dir} cannot be written.*a folder you can write to"):
        main(["--vocab_size", "1000", "--output_dir", str(output_dir)])


@pytest.mark.parametrize("run", ["finished", "checkpointed"])
def test_main_refuses_a_pretraining_run_folder(tmp_path, monkeypatch, run):
    refuse_to_read_the_corpus(monkeypatch)
    (tmp_path / "tokenizer.json").write_text("{}")  # a run's folder holds a tokenizer too
    if run == "finished":
        (tmp_path / "model.safetensors").write_bytes(b"weights")
    else:
        (tmp_path / "checkpoint-10").mkdir()
        (tmp_path / "checkpoint-10" / "checkpoint_manifest.json").write_text("{}")
    for overwrite in ([], ["--overwrite_output_dir"]):
        with pytest.raises(ValueError, match=rf"--output_dir {tmp_path} holds a pretraining run .*another --output_dir"):
            main(["--vocab_size", "1000", "--output_dir", str(tmp_path), *overwrite])
    assert (tmp_path / "tokenizer.json").read_text() == "{}"


def test_main_puts_back_a_checkpoint_that_a_crash_left_parked_and_refuses_its_run_folder(tmp_path, monkeypatch):
    """A same-step save killed between its two renames leaves the run's checkpoint parked; holding the folder,
    the tokenizer's training puts it back first, and so refuses the folder as the run it is."""
    refuse_to_read_the_corpus(monkeypatch)
    (tmp_path / ".replaced-checkpoint-10").mkdir()
    manifest = {"format_version": 1, "step": 10, "num_processes": 1, "files": {}}  # whole: it lists every file
    (tmp_path / ".replaced-checkpoint-10" / "checkpoint_manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(ValueError, match=r"holds a pretraining run \(checkpoint-10\)"):
        main(["--vocab_size", "1000", "--output_dir", str(tmp_path), "--overwrite_output_dir"])
    assert (tmp_path / "checkpoint-10" / "checkpoint_manifest.json").is_file()


def test_main_refuses_a_folder_another_tokenizer_is_being_trained_into(tmp_path, monkeypatch):
    refuse_to_read_the_corpus(monkeypatch)
    in_use = rf"--output_dir {tmp_path / 'tok'} is in use by another .*pid {os.getpid()}"
    with run_folder_lock(tmp_path / "tok"), pytest.raises(ValueError, match=in_use):  # we play the first run
        main(["--vocab_size", "1000", "--output_dir", str(tmp_path / "tok")])

def test_crash_while_saving_leaves_no_half_written_folder(sample_tokenizer, tmp_path, monkeypatch):
    def crash(self, folder, **kwargs):
        (Path(folder) / "tokenizer.json").write_text("{")
        raise OSError("disk full")

    monkeypatch.setattr(type(sample_tokenizer), "save_pretrained", crash)
    with pytest.raises(Refusal, match="disk full"):
        save_tokenizer(sample_tokenizer, tmp_path / "tok")
    assert list(tmp_path.iterdir()) == []



@pytest.mark.parametrize("code", [errno.ENOSPC, errno.EIO])
def test_a_failed_save_names_the_folder_and_says_free_space_only_for_a_full_disk(sample_tokenizer, tmp_path, monkeypatch, code):
    """The seventh attack (731f08a), S3: every failed save said to free space, whatever failed."""
    def failing(self, folder, **kwargs):
        raise OSError(code, os.strerror(code))

    monkeypatch.setattr(type(sample_tokenizer), "save_pretrained", failing)
    with pytest.raises(Refusal) as refused:
        save_tokenizer(sample_tokenizer, tmp_path / "tok")
    assert "; the tokenizer was not saved and the folder's previous files are intact: " in str(refused.value)
    assert ("free space (`df -h" in str(refused.value)) == (code == errno.ENOSPC)
    if code == errno.ENOSPC:
        assert str(refused.value).startswith(f"no space left writing {tmp_path / 'tok'}; the tokenizer was not saved")
    assert list(tmp_path.iterdir()) == []

@pytest.mark.slow
def test_train_tokenizer_script(tmp_path):
    output_dir = tmp_path / "tok"
    command = [sys.executable, "train_tokenizer.py", "--vocab_size", "1000", "--output_dir", str(output_dir)]
    result = subprocess.run(command, cwd=REPO_ROOT, capture_output=True, text=True, timeout=300, check=False)
    assert result.returncode == 0, result.stderr
    assert "vocabulary size:  1000" in result.stdout
    assert AutoTokenizer.from_pretrained(output_dir).pad_token_id == 0


TRAIN_AND_PRINT_VOCABS = """
import json, sys
from hfbert.corpus import load_documents
from hfbert.corpus_arguments import CorpusArguments
from hfbert.errors import REFUSAL_EXIT_CODE, Refusal, run_cli
from hfbert.tokenization import train_tokenizer
documents = load_documents(CorpusArguments())
vocabs = {
    size: json.loads(train_tokenizer(documents["train"], vocab_size=int(size), show_progress=False)
                     .backend_tokenizer.to_str())["model"]["vocab"]
    for size in sys.argv[1:]
}
print(json.dumps(vocabs))
"""


@pytest.mark.slow
def test_training_is_reproducible_across_processes():
    # The tokenizers trainer numbers the ## forms of characters in the iteration order of a Rust HashMap
    # (randomly seeded per process), and ties between equally frequent pairs go to the lower ids: the same
    # corpus gave another vocabulary in every process (with RAYON_NUM_THREADS=1 too).
    command = [sys.executable, "-c", TRAIN_AND_PRINT_VOCABS, "1000", "8192"]
    processes = [
        subprocess.Popen(command, cwd=REPO_ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for _ in range(2)
    ]
    outputs = [process.communicate(timeout=300) for process in processes]
    for process, (_, stderr) in zip(processes, outputs, strict=True):
        assert process.returncode == 0, stderr
    first, second = (json.loads(stdout.splitlines()[-1]) for stdout, _ in outputs)
    assert {size: len(vocab) for size, vocab in first.items()} == {"1000": 1000, "8192": 8192}
    assert first == second


def trainer_continuation_forms(documents, lowercase: bool) -> set[str]:
    """The ## forms the tokenizers trainer itself creates (it keeps them all, however small the vocabulary)."""
    untrained = BertTokenizer(do_lower_case=lowercase)
    alphabet = untrained.train_new_from_iterator(
        ParagraphBatches(documents, show_progress=False), vocab_size=6, continuing_subword_prefix="##"
    )
    return {token for token in alphabet.get_vocab() if token.startswith("##") and len(token) == 3}


@pytest.mark.parametrize("lowercase", [True, False])
def test_continuation_forms_are_the_trainers(sample_documents, lowercase):
    untrained = BertTokenizer(do_lower_case=lowercase)
    forms = possible_continuation_forms(
        ParagraphBatches(sample_documents["train"], show_progress=False), untrained
    )
    assert forms == sorted(forms)
    assert set(forms) == trainer_continuation_forms(sample_documents["train"], lowercase)
    assert "##a" in forms and "##ς" in forms and "##," not in forms


def test_continuation_forms_of_tricky_characters():
    untrained = BertTokenizer()
    paragraphs = [
        "£5 costs (£) more",  # £ only starts words: no ##£
        "Café",  # é continues a word and loses its accent: ##e
        "x中y",  # CJK characters are words of their own: no ##中
        "a\x0b\u00b0",  # \x0b is deleted, gluing ° to a: ##°
        "한",  # NFD turns one Hangul syllable into three letters: the last two continue it
    ]
    forms = possible_continuation_forms([paragraphs], untrained)
    assert "##£" not in forms and "##中" not in forms and "##(" not in forms
    assert {"##5", "##a", "##e", "##°", "##\u1161", "##\u11ab"} <= set(forms)


def test_a_missed_continuation_form_costs_a_second_training_not_reproducibility(
    sample_documents, sample_tokenizer, monkeypatch
):
    monkeypatch.setattr(hfbert.tokenization, "possible_continuation_forms", lambda batches, tokenizer: [])
    retrained = train_tokenizer(sample_documents["train"], vocab_size=1000, show_progress=False)
    assert retrained.get_vocab() == sample_tokenizer.get_vocab()
    assert not retrained.added_tokens_decoder.keys() - set(range(len(SPECIAL_TOKENS)))


def pre_tokenized_words(tokenizer, text: str) -> list[str]:
    backend = tokenizer.backend_tokenizer
    return [
        word for word, _ in backend.pre_tokenizer.pre_tokenize_str(backend.normalizer.normalize_str(text))
    ]


def test_bound_paragraphs_keeps_every_word_but_overlong_ones(sample_tokenizer):
    rng = random.Random(0)
    words = ["the", "Café", "1,000", "(a)", "naïve", "x" * MAX_WORD_CHARS, "y" * (MAX_WORD_CHARS + 1), "中文"]
    paragraph = " ".join(rng.choice(words) for _ in range(8000))
    paragraph += " " + ",".join(rng.choice("abc") for _ in range(15_000))  # 30,000 characters, no space
    paragraph += " " + "z\x0b" * 50 + " tail"  # \x0b is deleted: one 50-character word
    paragraph += " " + "ab\x0b" * 60 + " end"  # one 120-character word
    short = "A short paragraph ."
    pieces = bound_paragraphs([short, paragraph], max_chars=1000)
    assert pieces[0] == short
    assert max(len(piece) for piece in pieces) <= 1000
    expected = [
        word for word in pre_tokenized_words(sample_tokenizer, paragraph) if len(word) <= MAX_WORD_CHARS
    ]
    assert [word for piece in pieces[1:] for word in pre_tokenized_words(sample_tokenizer, piece)] == expected
    assert "y" * (MAX_WORD_CHARS + 1) not in "".join(pieces) and "x" * MAX_WORD_CHARS in expected
    with pytest.raises(ValueError, match="max_chars 150 must be at least 200"):
        bound_paragraphs([paragraph], max_chars=150)


def test_one_huge_line_trains_in_seconds(tmp_path):
    # The trainer's merges cost time proportional to a word's length, for every merge inside the word: one
    # 100,000-character word took 4 s, 400,000 took 50 s, a 3 MB one hours. One huge line of ordinary words
    # was pre-tokenized on one thread.
    rng = random.Random(0)
    blob = "".join(rng.choices("abcdefghijklmnop", k=3_000_000))
    words = ["".join(rng.choices("abcdefghijklmnopqrstuvwxyz", k=rng.randint(2, 9))) for _ in range(2000)]
    line = " ".join(rng.choices(words, k=300_000))  # about 2 MB
    corpus = tmp_path / "huge_line.txt"
    corpus.write_text(f"A first document .\n\n{blob}\n\n{line}\n\nThe last document .\n", encoding="utf-8")
    documents = load_documents(CorpusArguments(train_file=str(corpus)))
    started = time.perf_counter()
    tokenizer = train_tokenizer(documents["train"], vocab_size=2000, show_progress=False)
    seconds = time.perf_counter() - started
    assert seconds < 60, f"{seconds:.1f} s"
    assert len(tokenizer) == 2000 and sum(word in tokenizer.get_vocab() for word in words) > 500
    assert tokenizer.unk_token not in tokenizer.tokenize(line[:10_000])


@pytest.mark.parametrize("name", ["runs/missing/tokenizer", "/definitely/not/here", "./tok"])
def test_load_tokenizer_names_a_missing_folder_and_the_fix(tmp_path, monkeypatch, name):
    # Was transformers' "Repo id must be in the form 'repo_name' or 'namespace/repo_name'".
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ValueError) as error:
        load_tokenizer(name)
    message = str(error.value)
    assert f"--tokenizer_name {name}: no such folder ({Path(name).absolute()})" in message
    assert "train_tokenizer.py" in message and "leave --tokenizer_name out" in message
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("how", DAMAGES)
@pytest.mark.parametrize("name", ["tokenizer.json", "tokenizer_config.json"])
def test_load_tokenizer_names_a_damaged_file_and_the_fix(tmp_path, sample_tokenizer, name, how):
    sample_tokenizer.save_pretrained(tmp_path / "tok")
    damage(tmp_path / "tok" / name, how)
    with pytest.raises(ValueError) as refused:
        load_tokenizer(tmp_path / "tok")
    message = str(refused.value)
    assert message.startswith(f"--tokenizer_name {tmp_path / 'tok'}: {tmp_path / 'tok' / name} is ")
    assert "save the tokenizer there again" in message


def test_load_tokenizer_names_a_hub_id_that_cannot_be_loaded(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # the tests are offline: neither a local folder nor a reachable Hub repo
    with pytest.raises(
        ValueError, match=r"--tokenizer_name tokenizers/wikitext-103: no such folder .*nor .*Hub"
    ):
        load_tokenizer("tokenizers/wikitext-103")
    assert list(tmp_path.iterdir()) == []


def test_load_tokenizer_refuses_a_folder_or_file_without_a_tokenizer(tmp_path):
    (tmp_path / "notes.txt").write_text("mine")
    with pytest.raises(ValueError, match=r"holds no tokenizer \(no tokenizer\.json"):
        load_tokenizer(tmp_path)
    with pytest.raises(ValueError, match=r"notes\.txt is a file.*pass the folder"):
        load_tokenizer(tmp_path / "notes.txt")
    assert [path.name for path in tmp_path.iterdir()] == ["notes.txt"]


def test_load_tokenizer_loads_a_saved_tokenizer(saved_tokenizer_dir, sample_tokenizer):
    assert load_tokenizer(saved_tokenizer_dir).get_vocab() == sample_tokenizer.get_vocab()
    assert load_tokenizer(str(saved_tokenizer_dir)).get_vocab() == sample_tokenizer.get_vocab()


def refused(argv, capsys) -> str:
    """The one line train_tokenizer.py prints for a refusal (exit code 2), run as its __main__ runs it."""
    capsys.readouterr()
    with pytest.raises(SystemExit) as exited:
        run_cli(lambda: main(argv), prog="train_tokenizer.py")
    assert exited.value.code == REFUSAL_EXIT_CODE
    err = capsys.readouterr().err
    line = err.splitlines()[-1]  # after the trainer's progress bars, if it read the corpus
    assert line.startswith("train_tokenizer.py: error: ") and "Traceback" not in err
    return line


def test_a_refusal_after_reading_the_corpus_is_one_line_and_leaves_nothing_behind(tmp_path, capsys):
    line = refused(["--vocab_size", "6", "--output_dir", str(tmp_path / "tokenizers" / "new" / "tok")], capsys)
    assert "--vocab_size 6 is smaller than the 5 special tokens" in line
    assert list(tmp_path.iterdir()) == []  # neither tok nor the parents the run created


def test_an_offline_hub_dataset_is_one_line_and_the_users_folder_stays(tmp_path, capsys):
    (tmp_path / "mine").mkdir()  # the user's empty folder: never deleted
    line = refused(["--dataset_name", "x/y", "--output_dir", str(tmp_path / "mine")], capsys)
    assert "--dataset_name x/y is not in the local datasets cache and the Hub is offline" in line
    assert [path.name for path in tmp_path.iterdir()] == ["mine"]


@pytest.mark.parametrize("change", ["edited", "linked"])
def test_a_tokenizer_file_changed_since_hfbert_wrote_it_is_the_users(tmp_path, monkeypatch, change):
    """The seventh attack (731f08a), B1: hfbert's own tokenizer folder was judged by its file names, so a
    tokenizer.json the user edited (a token added), or a link put at its name, was replaced by a retrain."""
    main(["--vocab_size", "300", "--output_dir", str(tmp_path / "tok")])
    tokenizer_json = tmp_path / "tok" / "tokenizer.json"
    written = (tmp_path / "tok" / ".hfbert-final-files.json").stat().st_mtime_ns
    if change == "edited":
        tokenizer_json.write_text(tokenizer_json.read_text().replace('"[MASK]"', '"[MASK]", "mine"', 1))
    else:
        (tmp_path / "mine.json").write_bytes(tokenizer_json.read_bytes())
        tokenizer_json.unlink()
        tokenizer_json.symlink_to(tmp_path / "mine.json")
    os.utime(tokenizer_json, ns=(written + 10**9, written + 10**9), follow_symlinks=change == "edited")
    before = tokenizer_json.read_bytes()
    refuse_to_read_the_corpus(monkeypatch)
    with pytest.raises(Refusal, match=r"holds a tokenizer hfbert did not write \(tokenizer.json"):
        main(["--vocab_size", "300", "--output_dir", str(tmp_path / "tok")])
    assert tokenizer_json.read_bytes() == before and tokenizer_json.is_symlink() == (change == "linked")


@pytest.mark.parametrize("overwrite", [[], ["--overwrite_output_dir"]])
def test_main_refuses_a_folder_at_a_tokenizer_files_name_before_any_work(tmp_path, monkeypatch, overwrite):
    """The seventh attack (731f08a), S3: a user's folder at tokenizer_config.json in hfbert's own tokenizer folder
    failed the publish half way (tokenizer.json moved out of the top level) with a refusal saying the files were
    intact and to free disk space. A folder (or link) where the tokenizer writes a file is the user's."""
    main(["--vocab_size", "300", "--output_dir", str(tmp_path / "tok")])
    (tmp_path / "tok" / "tokenizer_config.json").unlink()
    (tmp_path / "tok" / "tokenizer_config.json").mkdir()
    (tmp_path / "tok" / "tokenizer_config.json" / "keep.txt").write_text("mine")
    before = sorted(path.relative_to(tmp_path).as_posix() for path in (tmp_path / "tok").rglob("*"))
    refuse_to_read_the_corpus(monkeypatch)
    with pytest.raises(Refusal) as refused:
        main(["--vocab_size", "300", "--output_dir", str(tmp_path / "tok"), *overwrite])
    assert str(refused.value) == (
        f"--output_dir {tmp_path / 'tok'} holds a folder at tokenizer_config.json, where the tokenizer writes a "
        "file: move it out of the folder, or pass another --output_dir"
    )
    assert sorted(path.relative_to(tmp_path).as_posix() for path in (tmp_path / "tok").rglob("*")) == before
