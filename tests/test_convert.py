"""Checkpoints move between hfbert and stock transformers BERT, both ways, outputs unchanged."""

import json
from unittest import mock

import pytest
import torch
import transformers
from conftest import (
    DAMAGES,
    QUERY_WEIGHT,
    damage,
    folder_with_its_own_code,
    query_of_another_shape,
    rewrite_weights,
    tiny_config,
    with_pickled_weights,
    yes_typed_at_any_prompt,
)
from test_modeling_hfbert import padded_batch
from torch.testing import assert_close

from hfbert import HfBertForMaskedLM, HfBertForPreTraining
from hfbert.convert import from_transformers, main, to_transformers
from hfbert.errors import REFUSAL_EXIT_CODE, Refusal, run_cli


@pytest.mark.parametrize("model_class", [HfBertForPreTraining, HfBertForMaskedLM], ids=lambda c: c.__name__)
def test_export_to_stock_bert_and_back_keeps_outputs(tmp_path, model_class):
    model = model_class(tiny_config()).eval()
    model.save_pretrained(tmp_path / "hfbert")
    batch = padded_batch()
    with torch.no_grad():
        expected = (
            model(**batch).logits if model_class is HfBertForMaskedLM else model(**batch).prediction_logits
        )

    stock_dir = to_transformers(tmp_path / "hfbert", tmp_path / "stock")
    config = json.loads((stock_dir / "config.json").read_text())
    assert (
        config["model_type"] == "bert" and "auto_map" not in config and "mlm_masked_rows_only" not in config
    )
    assert not list(stock_dir.glob("*.py"))
    stock_class = getattr(transformers, model_class.__name__.replace("HfBert", "Bert"))
    stock, info = stock_class.from_pretrained(stock_dir, output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"]
    with torch.no_grad():
        stock_out = stock.eval()(**batch)
    stock_logits = stock_out.logits if model_class is HfBertForMaskedLM else stock_out.prediction_logits
    assert_close(stock_logits, expected, atol=1e-5, rtol=1e-5)

    back_dir = from_transformers(stock_dir, tmp_path / "back")
    back = model_class.from_pretrained(back_dir).eval()
    for name, tensor in model.state_dict().items():
        assert torch.equal(back.state_dict()[name], tensor), name


def test_import_a_folder_written_by_bert_for_pretraining(tmp_path):
    config = transformers.BertConfig(
        vocab_size=1000, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64
    )
    stock = transformers.BertForPreTraining(config).eval()
    stock.save_pretrained(tmp_path / "stock")
    ours = HfBertForPreTraining.from_pretrained(
        from_transformers(tmp_path / "stock", tmp_path / "ours")
    ).eval()
    batch = padded_batch()
    with torch.no_grad():
        assert_close(ours(**batch).prediction_logits, stock(**batch).prediction_logits, atol=1e-5, rtol=1e-5)


def test_conversion_refuses_a_non_empty_output_folder_and_leaves_it_alone(tmp_path):
    HfBertForPreTraining(tiny_config()).save_pretrained(tmp_path / "hfbert")
    occupied = tmp_path / "occupied"
    occupied.mkdir()
    (occupied / "keep.txt").write_text("mine")
    with pytest.raises(Refusal, match="not an empty folder"):
        main(["to-transformers", str(tmp_path / "hfbert"), str(occupied)])
    assert [p.name for p in occupied.iterdir()] == ["keep.txt"]


@pytest.mark.parametrize("target", ["missing", "empty folder"])
def test_an_output_folder_that_is_a_link_is_refused_in_one_line_before_any_work(tmp_path, target):
    """The sixth attack (9c5ba80), G7: a dangling link, or a link to an empty folder, as the output folder ran the
    conversion, then ended in a NotADirectoryError traceback from its rename."""
    HfBertForPreTraining(tiny_config()).save_pretrained(tmp_path / "hfbert")
    if target == "empty folder":
        (tmp_path / "elsewhere").mkdir()
    (tmp_path / "out").symlink_to(tmp_path / "elsewhere")
    with mock.patch("hfbert.convert.staged_folder") as staged, pytest.raises(Refusal) as refused:
        main(["to-transformers", str(tmp_path / "hfbert"), str(tmp_path / "out")])
    assert str(refused.value) == (
        f"output_dir {tmp_path / 'out'} is a symbolic link (to {tmp_path / 'elsewhere'}): the conversion is written "
        "as a new folder in its place; pass the folder's own path or a new one"
    )
    staged.assert_not_called()


@pytest.mark.parametrize("how", DAMAGES)
@pytest.mark.parametrize("name", ["config.json", "model.safetensors"])
@pytest.mark.parametrize("direction", ["to-transformers", "from-transformers"])
def test_a_damaged_source_file_is_named_and_nothing_is_written(tmp_path, direction, name, how):
    model = HfBertForPreTraining(tiny_config())
    source = tmp_path / "source"
    if direction == "to-transformers":
        model.save_pretrained(source)
    else:
        to_transformers_dir = to_transformers(model.save_pretrained(tmp_path / "h") or tmp_path / "h", source)
        assert to_transformers_dir == source
    damage(source / name, how)
    with pytest.raises(ValueError) as error:
        main([direction, str(source), str(tmp_path / "out")])
    assert f"{source / name} is " in str(error.value) and "copy or download" in str(error.value)
    assert not (tmp_path / "out").exists()


def more_layers_in_config(folder) -> None:
    """config.json asks for a layer that model.safetensors does not hold (a folder assembled from two runs)."""
    config = json.loads((folder / "config.json").read_text())
    config["num_hidden_layers"] += 1
    (folder / "config.json").write_text(json.dumps(config))


@pytest.mark.parametrize("direction", ["to-transformers", "from-transformers"])
def test_a_config_with_more_layers_than_the_weights_is_refused(tmp_path, direction):
    """The missing layer was filled with random values and the conversion exited 0."""
    source = tmp_path / "source"
    if direction == "to-transformers":
        HfBertForPreTraining(tiny_config()).save_pretrained(source)
    else:
        transformers.BertForPreTraining(tiny_config().to_bert_config()).save_pretrained(source)
    more_layers_in_config(source)
    with pytest.raises(ValueError, match=r"lacks encoder weights that its config.json asks for \(.*layer\.2\."):
        main([direction, str(source), str(tmp_path / "out")])
    assert not (tmp_path / "out").exists()


def refusal_line(capsys, argv) -> str:
    """What `python -m hfbert.convert ARGV` prints on stderr, run as its __main__ runs it."""
    capsys.readouterr()  # what the test's setup printed
    with pytest.raises(SystemExit) as stopped:
        run_cli(lambda: main(argv), prog="python -m hfbert.convert")
    assert stopped.value.code == REFUSAL_EXIT_CODE
    [line] = capsys.readouterr().err.splitlines()
    return line


@pytest.mark.parametrize("part", ["config", "tokenizer"])
def test_a_folder_whose_own_code_would_load_it_is_refused_in_one_line_without_running_it(
    tmp_path, capsys, sample_tokenizer, part
):
    """A tokenizer naming its own class made transformers ask "run the custom code? [y/N]"; "y" ran it."""
    marker = tmp_path / "the-folders-code-ran"
    HfBertForPreTraining(tiny_config()).save_pretrained(tmp_path / "hfbert")
    sample_tokenizer.save_pretrained(tmp_path / "hfbert")
    shipped = folder_with_its_own_code(tmp_path / "hfbert", tmp_path / "shipped", marker, part)
    with yes_typed_at_any_prompt() as asked:
        line = refusal_line(capsys, ["to-transformers", str(shipped), str(tmp_path / "out")])
    assert not asked.called and not marker.exists() and not (tmp_path / "out").exists()
    expected = "holds a 'shipped' model, not 'hfbert'" if part == "config" else (
        f"source {shipped}: its tokenizer (in {shipped}) is not one transformers or hfbert knows"
    )
    assert expected in line


@pytest.mark.parametrize("source", ["path/to/bert-base-uncased", "./bert", "/no/such/bert"])
def test_a_missing_source_folder_is_one_line_naming_it(tmp_path, capsys, monkeypatch, source):
    monkeypatch.chdir(tmp_path)
    line = refusal_line(capsys, ["from-transformers", source, str(tmp_path / "out")])
    assert line.startswith(f"python -m hfbert.convert: error: source {source}: no such folder")
    assert not (tmp_path / "out").exists()


def test_a_hub_id_is_tried_up_to_the_network_and_refused_in_one_line(tmp_path, capsys):
    line = refusal_line(capsys, ["from-transformers", "someone/no-such-bert", str(tmp_path / "out")])
    assert line.startswith("python -m hfbert.convert: error: source someone/no-such-bert: cannot read its config")


def test_a_folder_that_is_no_bert_is_one_line(tmp_path, capsys):
    transformers.GPT2LMHeadModel(transformers.GPT2Config(n_layer=1, n_embd=8, n_head=2)).save_pretrained(
        tmp_path / "gpt2"
    )
    line = refusal_line(capsys, ["from-transformers", str(tmp_path / "gpt2"), str(tmp_path / "out")])
    assert "holds a 'gpt2' model, not 'bert'" in line


# ------------------------------------------------------------------------------------------------ issue 64


def stock_or_hfbert_folder(folder, direction):
    """A folder `direction` reads: an hfbert one for to-transformers, a stock BERT one for from-transformers."""
    if direction == "to-transformers":
        HfBertForPreTraining(tiny_config()).save_pretrained(folder)
    else:
        transformers.BertForPreTraining(tiny_config().to_bert_config()).save_pretrained(folder)
    return folder


@pytest.mark.parametrize("direction", ["to-transformers", "from-transformers"])
def test_weights_only_as_a_pickle_are_refused_and_never_unpickled(tmp_path, capsys, direction):
    source = stock_or_hfbert_folder(tmp_path / "source", direction)
    pickled = with_pickled_weights(source, tmp_path / "pickled", tmp_path / "the pickle ran")
    line = refusal_line(capsys, [direction, str(pickled), str(tmp_path / "out")])
    assert line.startswith(f"python -m hfbert.convert: error: source {pickled}: its weights are pytorch_model.bin")
    assert not (tmp_path / "the pickle ran").exists() and not (tmp_path / "out").exists()


@pytest.mark.parametrize("direction", ["to-transformers", "from-transformers"])
def test_weights_of_another_shape_are_refused_in_one_line(tmp_path, capsys, direction):
    """transformers' RuntimeError ("You set `ignore_mismatched_sizes` to `False`") ended in a traceback."""
    source = stock_or_hfbert_folder(tmp_path / "source", direction)
    rewrite_weights(source, query_of_another_shape)
    capsys.readouterr()
    with pytest.raises(SystemExit) as stopped:
        run_cli(lambda: main([direction, str(source), str(tmp_path / "out")]), prog="python -m hfbert.convert")
    assert stopped.value.code == REFUSAL_EXIT_CODE
    lines = capsys.readouterr().err.splitlines()  # transformers' load report of the mismatch, then the refusal
    assert "Traceback" not in lines and lines[-1].startswith("python -m hfbert.convert: error: ")
    assert f"{source} holds weights of other shapes than its config.json asks for ({QUERY_WEIGHT}: " in lines[-1]
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    ("direction", "architecture"),
    [("to-transformers", "HfBertForCausalLM"), ("to-transformers", "BertForPreTraining"),
     ("from-transformers", "BertLMHeadModel"), ("from-transformers", "BertForMultipleChoice")],
)  # fmt: skip
def test_an_architecture_without_a_twin_is_refused_naming_those_that_convert(tmp_path, capsys, direction, architecture):
    """An unknown name ended in an AttributeError traceback (getattr on the library)."""
    source = stock_or_hfbert_folder(tmp_path / "source", direction)
    config = json.loads((source / "config.json").read_text())
    (source / "config.json").write_text(json.dumps(config | {"architectures": [architecture]}))
    line = refusal_line(capsys, [direction, str(source), str(tmp_path / "out")])
    prefix = "HfBert" if direction == "to-transformers" else "Bert"
    assert line.endswith(
        f"{source}/config.json names the architecture {architecture}, which {direction} does not convert; it "
        f"converts {prefix}Model, {prefix}ForPreTraining, {prefix}ForMaskedLM, {prefix}ForNextSentencePrediction, "
        f"{prefix}ForSequenceClassification, {prefix}ForTokenClassification and {prefix}ForQuestionAnswering"
    )
    assert not (tmp_path / "out").exists()
