import re
import shutil
import struct

import pytest
import torch
from conftest import (
    DAMAGES,
    QUERY_WEIGHT,
    damage,
    folder_with_its_own_code,
    query_as_int32,
    query_of_another_shape,
    rewrite_weights,
    tiny_config,
    with_pickled_weights,
    yes_typed_at_any_prompt,
)
from transformers import BertConfig, BertForPreTraining

from hfbert import HfBertForMaskedLM, HfBertForPreTraining, HfBertModel
from hfbert.errors import REFUSAL_EXIT_CODE, Refusal, run_cli
from hfbert.inspect import (
    build_parser,
    check_model_folder,
    inspect_checkpoint,
    load_analysis,
    main,
)
from hfbert.pretraining.data import sample_sentences
from hfbert.pretraining.extras.samples import FREQUENT_WORDS, choose_masked_word, write_samples

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
TEXT = "The game was released in [MASK] and sold well ."
PAIR = ["The song was released in 2009 .", "It reached number one in the charts ."]
SENTENCES = ["The ship was built in 1900 .", "The vessel was launched in 1901 .", "He played for the club ."]
SAMPLE_SENTENCES = [
    "The game was released in Japan in 2011 and sold well .",
    "It was the first game in the series to be released on a handheld .",
    "Critics praised the story of the game and its music .",
    "The band toured the United States for most of the year .",
]


def png_size(path) -> tuple[int, int]:
    data = path.read_bytes()
    assert data[:8] == PNG_SIGNATURE and data.rstrip(b"\x00").endswith(b"IEND\xaeB`\x82")
    return struct.unpack(">II", data[16:24])


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory, sample_tokenizer):
    """A tiny HfBertForPreTraining folder with the 1000-token sample tokenizer (random weights)."""
    torch.manual_seed(0)
    folder = tmp_path_factory.mktemp("ckpt") / "hfbert-tiny"
    HfBertForPreTraining(tiny_config()).save_pretrained(folder)
    sample_tokenizer.save_pretrained(folder)
    return folder


def files_under(folder) -> set[str]:
    return {str(path.relative_to(folder)) for path in folder.rglob("*")}


def test_cli_writes_pngs_and_report(checkpoint, tmp_path, capsys):
    out = tmp_path / "out"
    argv = [str(checkpoint), "--text", TEXT, "--layer", "1", "--head", "2", "--top_k", "3"]
    argv += ["--pair", *PAIR, "--sentences", *SENTENCES, "--output_dir", str(out)]
    inspection = main(argv)
    assert sorted(p.name for p in out.iterdir()) == [
        ".hfbert-reports.json",  # what a rerun may replace
        "attention_layer1_head2.png",
        "inspect.md",
        "similarity.png",
    ]
    width, height = png_size(out / "attention_layer1_head2.png")
    assert width >= 400 and height >= 400
    width, height = png_size(out / "similarity.png")
    assert width > height >= 250
    report = (out / "inspect.md").read_text()
    assert report == capsys.readouterr().out.split("\nWrote ")[0]  # printed and written
    for heading in ("## Fill-mask", "## Attention, layer 1, head 2", "## Next sentence prediction"):
        assert heading in report
    assert "## Sentence similarity" in report and "[CLS] vector" in report and "mean-pooled" in report
    assert "![attention, layer 1, head 2](attention_layer1_head2.png)" in report

    # The numbers behind the report are sane.
    assert len(inspection.fill_mask.predictions) == 1 and len(inspection.fill_mask.predictions[0]) == 3
    attention = torch.tensor(inspection.attention.weights)
    assert inspection.attention.tokens[0] == "[CLS]" and inspection.attention.tokens[-1] == "[SEP]"
    assert attention.shape == (len(inspection.attention.tokens),) * 2
    torch.testing.assert_close(attention.sum(-1), torch.ones(len(attention)))
    assert 0.0 < inspection.nsp[0].probability_follows < 1.0
    for matrix in (inspection.similarity.cls, inspection.similarity.mean):
        matrix = torch.tensor(matrix)
        torch.testing.assert_close(matrix.diagonal(), torch.ones(3))
        torch.testing.assert_close(matrix, matrix.T)


def test_defaults_follow_the_inputs_and_write_into_the_checkpoint(checkpoint, sample_tokenizer):
    two_masks = "The [MASK] was released in [MASK] ."
    inspection = inspect_checkpoint(checkpoint, text=two_masks)
    try:
        assert inspection.attention.layer == 1 and inspection.attention.head == 0  # last layer, head 0
        assert len(inspection.fill_mask.predictions) == 2  # one top-k list per [MASK]
        assert all(len(top) == 5 for top in inspection.fill_mask.predictions)
        assert inspection.nsp == [] and inspection.similarity is None
        assert sorted(p.name for p in (checkpoint / "inspect").iterdir()) == [
            ".hfbert-reports.json",
            "attention_layer1_head0.png",
            "inspect.md",
        ]
    finally:
        shutil.rmtree(checkpoint / "inspect")


def test_deterministic(checkpoint, tmp_path):
    first = inspect_checkpoint(checkpoint, sentences=SENTENCES, pair=PAIR, output_dir=tmp_path / "a")
    second = inspect_checkpoint(checkpoint, sentences=SENTENCES, pair=PAIR, output_dir=tmp_path / "b")
    assert (tmp_path / "a" / "inspect.md").read_text() == (tmp_path / "b" / "inspect.md").read_text()
    assert first.similarity == second.similarity and first.nsp == second.nsp


@pytest.fixture
def no_tokenizer(tmp_path, checkpoint):
    folder = tmp_path / "no-tokenizer"
    folder.mkdir()
    for name in ("config.json", "model.safetensors"):
        shutil.copy(checkpoint / name, folder / name)
    return folder


@pytest.mark.parametrize(
    "case, kwargs, message",
    [
        ("missing folder", {"checkpoint": "MISSING", "text": TEXT}, "does not exist"),
        ("no tokenizer", {"checkpoint": "NO_TOKENIZER", "text": TEXT}, "has no tokenizer"),
        ("no [MASK]", {"text": "The game was released ."}, "has no [MASK]"),
        ("layer", {"text": TEXT, "layer": 2}, "--layer 2 is out of range: this model has 2 layers, so pass "),
        ("negative layer", {"text": TEXT, "layer": -1}, "--layer between 0 and 1"),
        ("head", {"text": TEXT, "head": 4}, "--head between 0 and 3"),
        ("top_k", {"text": TEXT, "top_k": 0}, "--top_k 0 is out of range"),
        ("one sentence", {"sentences": ["Only one ."]}, "at least two sentences"),
        ("nothing", {}, "nothing to inspect"),
        ("task without input", {"text": TEXT, "tasks": ["nsp"]}, "task 'nsp' needs --pair"),
        ("too long", {"text": "word " * 200 + "[MASK]"}, "but the model takes at most 128"),
    ],
)
def test_refusals_name_the_value_and_write_nothing(checkpoint, no_tokenizer, tmp_path, case, kwargs, message):
    before = files_under(checkpoint)
    kwargs = {"checkpoint": checkpoint} | kwargs
    kwargs["checkpoint"] = {"MISSING": tmp_path / "missing", "NO_TOKENIZER": no_tokenizer}.get(
        kwargs["checkpoint"], kwargs["checkpoint"]
    )
    out = tmp_path / "out"
    with pytest.raises(Refusal) as raised:
        inspect_checkpoint(output_dir=out, **kwargs)
    assert message in str(raised.value)
    assert isinstance(raised.value, ValueError)
    assert not out.exists() and files_under(checkpoint) == before
    assert not (tmp_path / "missing").exists()


def test_attention_only_needs_no_mask(checkpoint, tmp_path):
    inspection = inspect_checkpoint(
        checkpoint, text="No mask here .", tasks=["attention"], output_dir=tmp_path
    )
    assert inspection.fill_mask is None and (tmp_path / "attention_layer1_head0.png").is_file()


def refused(argv, capsys) -> str:
    """The one line `python -m hfbert.inspect ARGV` prints for a refusal (exit code 2), run as __main__ runs it."""
    capsys.readouterr()
    with pytest.raises(SystemExit) as exited:
        run_cli(lambda: main(argv), prog="python -m hfbert.inspect")
    assert exited.value.code == REFUSAL_EXIT_CODE
    [line] = capsys.readouterr().err.splitlines()
    assert line.startswith("python -m hfbert.inspect: error: ")
    return line


@pytest.mark.parametrize("part", ["config", "tokenizer"])
def test_a_folder_whose_own_code_would_load_it_is_refused_in_one_line_without_running_it(
    checkpoint, tmp_path, capsys, part
):
    """transformers asked "run the custom code? [y/N]", and `echo y | python -m hfbert.inspect ...` ran it."""
    marker = tmp_path / "the-folders-code-ran"
    shipped = folder_with_its_own_code(checkpoint, tmp_path / "shipped", marker, part)
    with yes_typed_at_any_prompt() as asked:
        line = refused([str(shipped), "--text", TEXT], capsys)
    assert not asked.called and not marker.exists() and not (shipped / "inspect").exists()
    what = "model type (config.json)" if part == "config" else f"tokenizer (in {shipped})"
    assert f"checkpoint {shipped}: its {what} is not one transformers or hfbert knows" in line


def test_cli_refusal_is_one_line(checkpoint, tmp_path, capsys):
    line = refused([str(checkpoint), "--text", TEXT, "--head", "9", "--output_dir", str(tmp_path / "out")], capsys)
    assert "--head 9 is out of range: this model has 4 attention heads per layer" in line
    assert not (tmp_path / "out").exists()


def test_help_states_each_default_once():
    """The one help formatter adds a flag's default unless its help already says it ("default: ...")."""
    text = " ".join(build_parser().format_help().split())
    assert text.count("(default: 0)") == 1 and text.count("(default: cpu)") == 1 and "(default: None)" not in text


def test_tokenizer_from_another_folder(checkpoint, no_tokenizer, tmp_path):
    inspection = inspect_checkpoint(no_tokenizer, text=TEXT, tokenizer_name=checkpoint, output_dir=tmp_path)
    assert inspection.fill_mask is not None


def test_heads_missing_from_the_folder_are_refused(tmp_path, sample_tokenizer):
    mlm_only, encoder_only = tmp_path / "mlm", tmp_path / "encoder"
    HfBertForMaskedLM(tiny_config()).save_pretrained(mlm_only)
    HfBertModel(tiny_config()).save_pretrained(encoder_only)
    for folder in (mlm_only, encoder_only):
        sample_tokenizer.save_pretrained(folder)
    with pytest.raises(Refusal, match="no next-sentence head"):
        inspect_checkpoint(mlm_only, pair=PAIR, output_dir=tmp_path / "out")
    with pytest.raises(Refusal, match="no masked-LM head"):
        inspect_checkpoint(encoder_only, text=TEXT, output_dir=tmp_path / "out")
    assert not (tmp_path / "out").exists()
    # What such a folder does have still works.
    assert inspect_checkpoint(mlm_only, text=TEXT, output_dir=tmp_path / "out").fill_mask is not None


def test_a_config_with_more_layers_than_the_weights_is_refused(checkpoint, tmp_path):
    """The missing layer was filled with random values and inspect reported on that model, exit 0."""
    from test_convert import more_layers_in_config

    folder = tmp_path / "mixed"
    shutil.copytree(checkpoint, folder)
    more_layers_in_config(folder)
    with pytest.raises(Refusal, match=r"lacks encoder weights that its config.json asks for \(.*layer\.2\."):
        inspect_checkpoint(folder, text=TEXT, output_dir=tmp_path / "out")
    assert not (tmp_path / "out").exists()


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
def test_a_device_this_machine_lacks_is_refused_before_loading(checkpoint, tmp_path, capsys):
    """--device cuda without CUDA ended in torch's raw error after the model had loaded."""
    line = refused([str(checkpoint), "--text", TEXT, "--device", "cuda", "--output_dir", str(tmp_path / "out")], capsys)
    assert "--device cuda: this machine has no CUDA device torch can use; pass --device cpu" in line
    with pytest.raises(Refusal, match="--device gpu0 is not a torch device"):
        inspect_checkpoint(checkpoint, text=TEXT, device="gpu0", output_dir=tmp_path / "out")
    assert not (tmp_path / "out").exists()


def write_samples_from_folder(model_dir, sentences, **options):
    """The samples.md `write_samples` writes into a saved model folder, as a run does into its final one."""
    write_samples(model_dir, load_analysis(*check_model_folder(model_dir)), sentences, **options)
    return (model_dir / "samples.md").read_text()


def test_write_samples(checkpoint, tmp_path):
    model_dir = tmp_path / "run"
    shutil.copytree(checkpoint, model_dir)
    other = "The band toured Europe in the summer ."
    text = write_samples_from_folder(model_dir, SAMPLE_SENTENCES, other_sentence=other)
    for heading in ("## Fill-mask", "## Next sentence prediction", "## Sentence similarity", "## Attention"):
        assert heading in text
    assert text.count("[MASK]") >= 4 and text.count("true word **") == 4  # one masked word per sentence
    # Frequent words, a different one per sentence where possible: the, of, and, in ...
    assert "true word **`the`**" in text and "true word **`in`**" in text
    assert "| real (B is the next sentence) |" in text and "| random (B is another document) |" in text
    assert "![cosine similarity](samples_similarity.png)" in text
    for name in ("samples_similarity.png", "samples_attention.png"):
        assert png_size(model_dir / name)[0] >= 300
    assert not [p for p in model_dir.iterdir() if p.name.startswith(".")]  # no temporary files left
    assert write_samples_from_folder(model_dir, SAMPLE_SENTENCES, other_sentence=other) == text  # the same


def test_write_samples_without_other_sentence(checkpoint, tmp_path):
    model_dir = tmp_path / ".final-staging"
    shutil.copytree(checkpoint, model_dir)
    text = write_samples_from_folder(
        model_dir, SAMPLE_SENTENCES, model_name="someone/hfbert-tiny", max_fill_mask=2
    )
    assert text.startswith("# Samples from someone/hfbert-tiny\n")
    assert "1. `" in text and "2. `" in text and "3. `" not in text  # max_fill_mask
    assert "| random (B is sentence 4 of the same text, not adjacent) |" in text
    with pytest.raises(Refusal, match="three or more sentences"):
        write_samples_from_folder(model_dir, SAMPLE_SENTENCES[:2])


def test_choose_masked_word_prefers_frequent_unused_words(sample_tokenizer):
    sentence = "The club was founded in 1900 by the workers of the town."
    assert choose_masked_word(sample_tokenizer, sentence, set()) == (
        "[MASK] club was founded in 1900 by the workers of the town.",
        "the",
    )
    masked, word = choose_masked_word(sample_tokenizer, sentence, {"the"})
    assert word == "of" and masked == "The club was founded in 1900 by the workers [MASK] the town."
    # Punctuation around a word does not hide it, and stays in place.
    assert choose_masked_word(sample_tokenizer, "Zebras live in, near and around lakes", {"and"}) == (
        "Zebras live [MASK], near and around lakes",
        "in",
    )
    assert choose_masked_word(sample_tokenizer, "Zebras graze quietly .", set()) is None
    assert FREQUENT_WORDS[:3] == ("the", "of", "and")


def test_stock_bert_folder(tmp_path, sample_tokenizer):
    config = tiny_config().to_dict()
    config.pop("model_type", None)
    folder = tmp_path / "bert"
    BertForPreTraining(BertConfig(**config)).save_pretrained(folder)
    sample_tokenizer.save_pretrained(folder)
    inspection = inspect_checkpoint(
        folder, text=TEXT, pair=PAIR, sentences=SENTENCES, output_dir=tmp_path / "o"
    )
    assert inspection.model_summary.startswith("bert, 2 layers, 4 heads")
    assert inspection.fill_mask is not None and inspection.nsp and inspection.similarity is not None


def test_sample_sentences(sample_documents):
    documents = sample_documents["validation"]
    sentences, other = sample_sentences(documents, count=4)
    assert len(sentences) == 4 and all(6 <= len(s.split()) <= 40 for s in sentences)
    first_document = " ".join(documents[0]["paragraphs"])
    assert all(s in first_document for s in sentences)
    assert other is not None and other not in first_document
    assert sample_sentences(documents, count=4) == (sentences, other)  # deterministic
    assert sample_sentences([["One short line ."]]) == ([], None)


@pytest.mark.parametrize("how", DAMAGES)
@pytest.mark.parametrize("name", ["config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"])
def test_a_damaged_model_folder_file_is_named_with_the_fix(checkpoint, tmp_path, capsys, name, how):
    folder = tmp_path / "copy"
    shutil.copytree(checkpoint, folder)
    damage(folder / name, how)
    before = files_under(folder)
    error = refused([str(folder), "--text", TEXT], capsys)
    assert f"{folder / name} is " in error and "--resume_from_checkpoint latest" in error
    assert "Traceback" not in error and files_under(folder) == before  # nothing written


def test_a_missing_folder_is_one_line(tmp_path, capsys):
    line = refused([str(tmp_path / "missing")], capsys)
    assert f"checkpoint folder {str(tmp_path / 'missing')!r} does not exist" in line


# ------------------------------------------------------------------------------------------------ issue 64


def test_weights_only_as_a_pickle_are_refused_and_never_unpickled(checkpoint, tmp_path, capsys):
    marker = tmp_path / "the pickle ran"
    folder = with_pickled_weights(checkpoint, tmp_path / "pickled", marker)
    line = refused([str(folder), "--text", TEXT, "--output_dir", str(tmp_path / "out")], capsys)
    assert "its weights are pytorch_model.bin, a pickle" in line and "convert it to model.safetensors" in line
    assert not marker.exists() and not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (query_of_another_shape, rf"holds weights of other shapes than its config.json asks for \({QUERY_WEIGHT}: "
         r"\[16, 32\] in the file, \[32, 32\] in the model\)"),
        (query_as_int32, rf"holds the weight {QUERY_WEIGHT} as I32, not floating point"),
    ],
)  # fmt: skip
def test_weights_of_another_shape_or_not_floating_point_are_refused(checkpoint, tmp_path, capsys, change, message):
    """A wrong shape ended in transformers' RuntimeError traceback; int32 weights were cast and inspected."""
    folder = tmp_path / "changed"
    shutil.copytree(checkpoint, folder)
    rewrite_weights(folder, change)
    line = refused([str(folder), "--text", TEXT, "--output_dir", str(tmp_path / "out")], capsys)
    assert re.search(message, line), line
    assert not (tmp_path / "out").exists()


def test_a_tokenizer_larger_than_the_models_vocabulary_is_refused(checkpoint, tmp_path, capsys, sample_tokenizer):
    """Its ids past the embedding table ended in an IndexError traceback."""
    folder = tmp_path / "larger-tokenizer"
    shutil.copytree(checkpoint, folder)
    larger = sample_tokenizer.__class__.from_pretrained(checkpoint)
    larger.add_tokens(["zeppelin", "quasar"])
    larger.save_pretrained(folder)
    line = refused([str(folder), "--text", "A zeppelin or a quasar [MASK] .", "--output_dir", str(tmp_path / "o")], capsys)
    assert line.endswith(
        f"{folder}: its tokenizer has 1002 tokens but the model only 1000 embeddings; pass --tokenizer_name with "
        "the tokenizer the model was trained with, or save that one into the folder"
    )
    assert not (tmp_path / "o").exists()


def test_a_users_file_of_a_name_the_inspection_writes_is_refused(checkpoint, tmp_path):
    """The sixth attack (9c5ba80), G4: a user's inspect.md in RUN/inspect/ was replaced by the report; a rerun
    into an earlier inspection's folder replaces it, and other files are kept."""
    out = tmp_path / "out"
    inspect_checkpoint(checkpoint, text=TEXT, output_dir=out)
    inspect_checkpoint(checkpoint, text=TEXT, output_dir=out)  # hfbert's own: replaced
    theirs = tmp_path / "theirs"
    theirs.mkdir()
    (theirs / "inspect.md").write_text("my own analysis")
    with pytest.raises(Refusal) as refused:
        inspect_checkpoint(checkpoint, text=TEXT, output_dir=theirs)
    assert str(refused.value) == (
        f"--output_dir {theirs} holds inspect.md, which the inspection would replace and which hfbert did not "
        "write as it is (a file of yours, or one changed since: .hfbert-reports.json there records what hfbert "
        "wrote): move it out of the folder, or pass another --output_dir"
    )
    assert [path.name for path in theirs.iterdir()] == ["inspect.md"]
    (theirs / "inspect.md").rename(theirs / "notes.md")  # other files are kept beside the inspection
    inspect_checkpoint(checkpoint, text=TEXT, output_dir=theirs)
    assert (theirs / "notes.md").read_text() == "my own analysis"
    # The seventh attack (731f08a), B6: a user's attention_layer0_head0.png beside an earlier report of layer 1
    # was replaced by a rerun at layer 0: only what the earlier report shows is hfbert's.
    inspect_checkpoint(checkpoint, text=TEXT, output_dir=theirs, layer=1)
    (theirs / "attention_layer0_head0.png").unlink(missing_ok=True)
    (theirs / "attention_layer0_head0.png").write_text("mine")
    with pytest.raises(Refusal, match=r"holds attention_layer0_head0.png, which the inspection would replace"):
        inspect_checkpoint(checkpoint, text=TEXT, output_dir=theirs, layer=0)
    assert (theirs / "attention_layer0_head0.png").read_text() == "mine"


def test_an_inspection_rerun_keeps_a_report_the_user_edited(checkpoint, tmp_path):
    """The eighth attack (2b53043), K4: a rerun replaced hfbert's own inspect.md after the user added notes to
    it. Only files as the inspection wrote them (its record: size and sha256) are replaced."""
    out = tmp_path / "out"
    inspect_checkpoint(checkpoint, text=TEXT, output_dir=out)
    (out / "inspect.md").write_text((out / "inspect.md").read_text() + "\nMy notes.\n")
    with pytest.raises(Refusal) as refused:
        inspect_checkpoint(checkpoint, text=TEXT, output_dir=out)
    assert str(refused.value) == (
        f"--output_dir {out} holds inspect.md, which the inspection would replace and which hfbert did not write "
        "as it is (a file of yours, or one changed since: .hfbert-reports.json there records what hfbert wrote): "
        "move it out of the folder, or pass another --output_dir"
    )
    assert "My notes." in (out / "inspect.md").read_text()
