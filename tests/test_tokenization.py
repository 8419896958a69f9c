"""hfbert.tokenization: the trained tokenizer is a stock BERT tokenizer that the hfbert model agrees with."""

import subprocess
import sys
from pathlib import Path

import pytest
import torch
from transformers import AutoTokenizer, BertTokenizer

from hfbert import HfBertForPreTraining
from hfbert.tokenization import (
    SPECIAL_TOKENS,
    ParagraphBatches,
    check_tokenizer_matches_config,
    main,
    measure_tokenizer,
    model_config_for_tokenizer,
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
    batches = ParagraphBatches(sample_documents["train"], batch_size=100, show_progress=False)
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


def test_main_refuses_a_foreign_non_empty_folder(tmp_path):
    (tmp_path / "notes.txt").write_text("mine")
    with pytest.raises(ValueError, match=r"is not empty and holds no tokenizer.*--overwrite_output_dir"):
        main(["--vocab_size", "1000", "--output_dir", str(tmp_path)])
    main(["--vocab_size", "1000", "--output_dir", str(tmp_path), "--overwrite_output_dir"])
    assert (tmp_path / "notes.txt").read_text() == "mine"
    assert len(AutoTokenizer.from_pretrained(tmp_path)) == 1000


def test_crash_while_saving_leaves_no_half_written_folder(sample_tokenizer, tmp_path, monkeypatch):
    def crash(self, folder, **kwargs):
        (Path(folder) / "tokenizer.json").write_text("{")
        raise OSError("disk full")

    monkeypatch.setattr(type(sample_tokenizer), "save_pretrained", crash)
    with pytest.raises(OSError, match="disk full"):
        save_tokenizer(sample_tokenizer, tmp_path / "tok")
    assert list(tmp_path.iterdir()) == []


@pytest.mark.slow
def test_train_tokenizer_script(tmp_path):
    output_dir = tmp_path / "tok"
    command = [sys.executable, "train_tokenizer.py", "--vocab_size", "1000", "--output_dir", str(output_dir)]
    result = subprocess.run(command, cwd=REPO_ROOT, capture_output=True, text=True, timeout=300, check=False)
    assert result.returncode == 0, result.stderr
    assert "vocabulary size:  1000" in result.stdout
    assert AutoTokenizer.from_pretrained(output_dir).pad_token_id == 0
