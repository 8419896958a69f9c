"""--model_name_or_path: finding a source model, refusing what contradicts it, loading its exact weights."""

import logging

import pytest
import torch
import transformers
from accelerate import Accelerator
from conftest import (
    QUERY_WEIGHT,
    folder_with_its_own_code,
    query_of_another_shape,
    rewrite_weights,
    tiny_config,
    with_pickled_weights,
    yes_typed_at_any_prompt,
)

from hfbert import HfBertConfig, HfBertForPreTraining
from hfbert.checkpointing import MANIFEST_NAME, _write_manifest
from hfbert.errors import REFUSAL_EXIT_CODE, Refusal, stops_in_one_line
from hfbert.pretraining.cli import main
from hfbert.pretraining.settings import ModelSettings
from hfbert.pretraining.source_model import (
    check_source_fits,
    find_source_model,
    load_source_model,
    source_run_config,
)


@pytest.fixture
def tokenizer(sample_tokenizer):
    return sample_tokenizer


def model_config(tokenizer, **overrides) -> HfBertConfig:
    return tiny_config(**{"vocab_size": len(tokenizer), "pad_token_id": tokenizer.pad_token_id, **overrides})


def assert_same_weights(model: torch.nn.Module, expected: dict[str, torch.Tensor]) -> None:
    actual = model.state_dict()
    assert actual.keys() == expected.keys()
    for name, tensor in expected.items():
        assert torch.equal(actual[name], tensor), name


def hfbert_folder(path, tokenizer, **overrides):
    model = HfBertForPreTraining(model_config(tokenizer, **overrides))
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return model


def test_hfbert_final_folder_gives_its_exact_weights_and_tokenizer(tmp_path, tokenizer):
    model = hfbert_folder(tmp_path / "run", tokenizer)
    source = find_source_model(str(tmp_path / "run"))
    assert source.model_type == "hfbert" and source.tokenizer_location == str(tmp_path / "run")
    loaded = load_source_model(source, source_run_config(source, dropout=0.0))
    assert loaded.config.hidden_dropout_prob == loaded.config.attention_probs_dropout_prob == 0.0
    assert_same_weights(loaded, model.state_dict())


def test_stock_bert_folder_is_converted_with_both_heads(tmp_path, tokenizer):
    bert = transformers.BertForPreTraining(model_config(tokenizer).to_bert_config())
    bert.save_pretrained(tmp_path / "bert")
    tokenizer.save_pretrained(tmp_path / "bert")
    source = find_source_model(str(tmp_path / "bert"))
    assert source.model_type == "bert" and source.config.hidden_size == 32
    loaded = load_source_model(source, source_run_config(source, dropout=None))
    assert isinstance(loaded, HfBertForPreTraining)
    assert_same_weights(loaded, bert.state_dict())


def test_stock_bert_without_nsp_head_starts_that_head_fresh_with_a_warning(tmp_path, tokenizer, caplog):
    masked_lm = transformers.BertForMaskedLM(model_config(tokenizer).to_bert_config())
    masked_lm.save_pretrained(tmp_path / "mlm")
    source = find_source_model(str(tmp_path / "mlm"))
    with caplog.at_level(logging.WARNING, logger="hfbert.pretraining.source_model"):
        loaded = load_source_model(source, source.config)
    assert "cls.seq_relationship" in caplog.text
    assert torch.equal(
        loaded.bert.encoder.layer[0].attention.self.query.weight,
        masked_lm.bert.encoder.layer[0].attention.self.query.weight,
    )


def test_checkpoint_folder_with_config_gives_the_checkpointed_weights(tmp_path, tokenizer):
    model = HfBertForPreTraining(model_config(tokenizer))
    accelerator = Accelerator(cpu=True)
    prepared = accelerator.prepare(model)
    checkpoint = tmp_path / "checkpoint-7"
    accelerator.save_state(str(checkpoint), safe_serialization=True)
    model.config.save_pretrained(checkpoint)
    tokenizer.save_pretrained(checkpoint / "tokenizer")  # where an hfbert up to 88be5f0 saved it
    source = find_source_model(str(checkpoint))
    assert source.tokenizer_location == str(checkpoint / "tokenizer")
    assert_same_weights(load_source_model(source, source.config), accelerator.unwrap_model(prepared).state_dict())


def test_folders_that_hold_no_model_are_refused(tmp_path, tokenizer):
    with pytest.raises(ValueError, match="no such folder"):
        find_source_model(str(tmp_path / "missing"))
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match=r"holds no config.json, so it is not a model folder"):
        find_source_model(str(tmp_path / "empty"))
    old = tmp_path / "run" / "checkpoint-20"
    old.mkdir(parents=True)
    (old / MANIFEST_NAME).write_text("{}")
    with pytest.raises(ValueError, match="checkpoint written before checkpoints carried"):
        find_source_model(str(old))
    renamed = tmp_path / "run" / "kept-step-20"  # a checkpoint the user renamed is told by its manifest
    renamed.mkdir()
    (renamed / MANIFEST_NAME).write_text("{}")
    with pytest.raises(ValueError, match="checkpoint written before checkpoints carried"):
        find_source_model(str(renamed))
    model_config(tokenizer).save_pretrained(tmp_path / "config-only")
    with pytest.raises(ValueError, match="no model weights"):
        find_source_model(str(tmp_path / "config-only"))
    (tmp_path / "file.txt").write_text("x")
    with pytest.raises(ValueError, match="is a file"):
        find_source_model(str(tmp_path / "file.txt"))
    transformers.GPT2LMHeadModel(transformers.GPT2Config(n_layer=1, n_embd=8, n_head=2)).save_pretrained(
        tmp_path / "gpt2"
    )
    with pytest.raises(ValueError, match="'gpt2' model, not BERT"):
        find_source_model(str(tmp_path / "gpt2"))


@pytest.mark.parametrize(
    "flag, part",
    [("--model_name_or_path", "config"), ("--model_name_or_path", "tokenizer"), ("--tokenizer_name", "tokenizer")],
)
def test_a_folder_whose_own_code_would_load_it_is_refused_in_one_line_without_running_it(
    tmp_path, tokenizer, capsys, flag, part
):
    """transformers asked "run the custom code? [y/N]", and `echo y | run_pretraining.py ...` ran it."""
    marker = tmp_path / "the-folders-code-ran"
    hfbert_folder(tmp_path / "run", tokenizer)
    shipped = folder_with_its_own_code(tmp_path / "run", tmp_path / "shipped", marker, part)
    capsys.readouterr()
    argv = [flag, str(shipped), "--output_dir", str(tmp_path / "out"), "--max_train_steps", "1"]
    with yes_typed_at_any_prompt() as asked, pytest.raises(SystemExit) as exited, stops_in_one_line("x.py"):
        main(argv)
    assert exited.value.code == REFUSAL_EXIT_CODE and not asked.called and not marker.exists()
    what = "model type (config.json)" if part == "config" else f"tokenizer (in {shipped})"
    assert capsys.readouterr().err.splitlines()[-1].startswith(
        f"x.py: error: {flag} {shipped}: its {what} is not one transformers or hfbert knows, and "
        "loading it would run the Python code the folder ships; "
    )
    assert not (tmp_path / "out").exists()


def test_unreachable_hub_id_is_named():
    with pytest.raises(ValueError, match="--model_name_or_path someone/no-such-bert: cannot read its config"):
        find_source_model("someone/no-such-bert")


def test_encoder_weights_missing_are_refused(tmp_path, tokenizer):
    hfbert_folder(tmp_path / "run", tokenizer)
    source = find_source_model(str(tmp_path / "run"))
    deeper = HfBertConfig.from_dict({**source.config.to_dict(), "num_hidden_layers": 3})
    with pytest.raises(ValueError, match="lacks encoder weights"):
        load_source_model(source, deeper)


def fits(source, tokenizer, source_tokenizer=None, max_seq_length=128, model_size=None, config_name=None):
    model = ModelSettings(model_size=model_size, config_name=config_name)
    check_source_fits(source, tokenizer, source_tokenizer, model, max_seq_length)


def test_flags_that_contradict_the_source_are_refused(tmp_path, tokenizer):
    hfbert_folder(tmp_path / "run", tokenizer)
    source = find_source_model(str(tmp_path / "run"))
    fits(source, tokenizer, tokenizer)
    with pytest.raises(ValueError, match=r"--max_seq_length 256 exceeds .* max_position_embeddings 128"):
        fits(source, tokenizer, max_seq_length=256)
    with pytest.raises(ValueError, match=r"--config_name c.json and --model_name_or_path"):
        fits(source, tokenizer, config_name="c.json")
    with pytest.raises(ValueError, match=r"--model_size mini contradicts .*hidden_size 32 \(preset 256\)"):
        fits(source, tokenizer, model_size="mini")


def test_a_tokenizer_that_disagrees_with_the_source_is_refused(tmp_path, tokenizer, sample_documents):
    from hfbert.tokenization import train_tokenizer

    hfbert_folder(tmp_path / "small", tokenizer, vocab_size=len(tokenizer) - 1)
    with pytest.raises(ValueError, match="does not fit"):
        fits(find_source_model(str(tmp_path / "small")), tokenizer)
    hfbert_folder(tmp_path / "run", tokenizer)
    source = find_source_model(str(tmp_path / "run"))
    other = train_tokenizer(
        sample_documents["validation"], vocab_size=len(tokenizer), min_frequency=1, show_progress=False
    )
    assert len(other) <= len(tokenizer)
    with pytest.raises(ValueError, match=r"vocabulary differs from .*'s own"):
        fits(source, other, tokenizer)


@pytest.mark.parametrize("name", ["runs/bert-base-phase1", "./bert", "~/no-such-hfbert-folder", "a/b/c"])
def test_a_missing_local_folder_is_named_not_taken_for_a_hub_id(tmp_path, monkeypatch, name):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "runs").mkdir()  # phase 1 has not written runs/bert-base-phase1 yet
    with pytest.raises(Refusal, match=rf"--model_name_or_path {name}: no such folder"):
        find_source_model(name)


def damage_same_size(path):
    data = bytearray(path.read_bytes())
    data[-4:] = bytes(4)  # inside the last tensor: the header and size stay valid
    path.write_bytes(bytes(data))


def test_a_checkpoint_that_fails_its_manifest_is_refused_naming_the_file(tmp_path, tokenizer):
    run = tmp_path / "run"
    for step in (5, 10):
        checkpoint = run / f"checkpoint-{step}"
        hfbert_folder(checkpoint, tokenizer)
        _write_manifest(checkpoint, step, num_processes=1)
    find_source_model(str(run / "checkpoint-10"))  # intact
    damage_same_size(run / "checkpoint-10" / "model.safetensors")
    with pytest.raises(Refusal, match=r"checkpoint-10: the checkpoint is damaged: model.safetensors is corrupted.*checkpoint-5"):
        find_source_model(str(run / "checkpoint-10"))


@pytest.mark.parametrize("value", [float("nan"), float("inf"), 3e4])
def test_unusable_source_weights_are_named_with_the_tensor(tmp_path, tokenizer, value):
    model = HfBertForPreTraining(model_config(tokenizer))
    with torch.no_grad():
        model.bert.encoder.layer[1].output.dense.weight[0, 0] = value
    model.save_pretrained(tmp_path / "run")
    tokenizer.save_pretrained(tmp_path / "run")
    source = find_source_model(str(tmp_path / "run"))
    with pytest.raises(Refusal, match=r"its weights are unusable: bert.encoder.layer.1.output.dense.weight holds"):
        load_source_model(source, source.config)


# ------------------------------------------------------------------------------------------------ issue 64


def test_a_source_whose_weights_are_only_a_pickle_is_refused_and_never_unpickled(tmp_path, tokenizer):
    hfbert_folder(tmp_path / "run", tokenizer)
    pickled = with_pickled_weights(tmp_path / "run", tmp_path / "pickled", tmp_path / "the pickle ran")
    with pytest.raises(Refusal, match=rf"^--model_name_or_path {pickled}: its weights are pytorch_model.bin, a pickle"):
        find_source_model(str(pickled))
    assert not (tmp_path / "the pickle ran").exists()


def test_source_weights_of_another_shape_are_refused_naming_the_tensor(tmp_path, tokenizer):
    """transformers' RuntimeError ("You set `ignore_mismatched_sizes` to `False`") ended the run in a traceback."""
    hfbert_folder(tmp_path / "run", tokenizer)
    rewrite_weights(tmp_path / "run", query_of_another_shape)
    source = find_source_model(str(tmp_path / "run"))
    with pytest.raises(Refusal, match=rf"holds weights of other shapes than its config.json asks for \({QUERY_WEIGHT}: "):
        load_source_model(source, source.config)
