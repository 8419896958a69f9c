"""run_pretraining.py --model_name_or_path: phase 2 at a longer length and continued pretraining start from
the source's exact weights, as a new run; flags that contradict the source are refused before any work."""

import json
from unittest import mock

import pytest
import torch
import transformers
from conftest import tiny_config
from safetensors.torch import load_file
from test_training import run_args, train_in_process

from hfbert import HfBertForPreTraining
from hfbert.files import RUN_LOCK_NAME
from hfbert.pretraining import run, source_model
from hfbert.pretraining.cli import parse_args

PHASE_1 = ("--max_seq_length", "32", "--max_train_steps", "6", "--dupe_factor", "1")


def source_args(run_inputs, output_dir, source, *extra):
    """run_args without --config_name and --tokenizer_name: both come from the source."""
    args = run_args(run_inputs, output_dir, *extra)
    for flag in ("--config_name", "--tokenizer_name"):
        index = args.index(flag)
        del args[index : index + 2]
    return [*args, "--model_name_or_path", str(source)]


@pytest.fixture(scope="module")
def phase_1(tmp_path_factory, run_inputs):
    output_dir = tmp_path_factory.mktemp("phase1") / "run"
    train_in_process(run_args(run_inputs, output_dir, *PHASE_1))
    return output_dir


@pytest.mark.slow
def test_phase_2_starts_from_phase_1s_exact_weights_and_trains_the_longer_positions(
    tmp_path,
    run_inputs,
    phase_1,
):
    phase_1_bytes = (phase_1 / "model.safetensors").read_bytes()  # before phase 2 runs
    phase_1_weights = load_file(phase_1 / "model.safetensors")
    started = {}

    def load_and_record(source, config):
        model = load_source_model(source, config)
        started.update({name: tensor.clone() for name, tensor in model.state_dict().items()})
        return model

    load_source_model = source_model.load_source_model
    output_dir = tmp_path / "phase2"
    args = source_args(run_inputs, output_dir, phase_1, "--max_seq_length", "64", "--max_train_steps", "4")
    with mock.patch("hfbert.pretraining.run.load_source_model", side_effect=load_and_record):
        train_in_process(args)
    for name, tensor in phase_1_weights.items():
        assert torch.equal(started[name], tensor), name

    position = "bert.embeddings.position_embeddings.weight"
    phase_2_weights = load_file(output_dir / "model.safetensors")
    moved = (phase_2_weights[position] - phase_1_weights[position]).abs().amax(dim=1)
    assert (moved[32:64] > 1e-4).all()  # rows phase 1 never used now receive gradients
    summary = json.loads((output_dir / "training_args.json").read_text())
    assert summary["model_name_or_path"] == str(phase_1) and summary["max_seq_length"] == 64
    assert f"from `{phase_1}`" in (output_dir / "README.md").read_text()
    assert json.loads((output_dir / "eval_results.json").read_text())["step"] == 4  # a new run's steps
    assert (phase_1 / "model.safetensors").read_bytes() == phase_1_bytes  # phase 2 left phase 1 alone


def weights_at_the_first_update(args: list[str]) -> dict[str, torch.Tensor]:
    """Train with `args`; the model's weights as the loop starts, after loading, setup and any resume."""
    started = {}

    def fit_and_record(training, *rest):
        model = training.accelerator.unwrap_model(training.model)
        started.update({name: tensor.detach().cpu().clone() for name, tensor in model.state_dict().items()})
        return fit(training, *rest)

    fit = run.fit
    with mock.patch.object(run, "fit", side_effect=fit_and_record):
        train_in_process(args)
    return started


def assert_same_weights(weights: dict[str, torch.Tensor], source: dict[str, torch.Tensor]) -> None:
    assert set(source) <= set(weights) and len(source) > 10
    for name, tensor in source.items():
        assert torch.equal(weights[name], tensor), name


@pytest.mark.slow
def test_continued_pretraining_from_a_stock_bert_folder_and_from_a_checkpoint(tmp_path, run_inputs, phase_1):
    config = transformers.AutoConfig.from_pretrained(phase_1).to_bert_config()
    stock = tmp_path / "stock-bert"
    transformers.BertForPreTraining(config).save_pretrained(stock)
    transformers.AutoTokenizer.from_pretrained(run_inputs["tokenizer"]).save_pretrained(stock)
    started = weights_at_the_first_update(
        source_args(run_inputs, tmp_path / "from-stock", stock, "--max_train_steps", "2")
    )
    assert_same_weights(started, load_file(stock / "model.safetensors"))
    assert (tmp_path / "from-stock" / "model.safetensors").is_file()

    checkpointed = tmp_path / "checkpointed"
    train_in_process(run_args(run_inputs, checkpointed, *PHASE_1, "--checkpointing_steps", "3"))
    checkpoint = checkpointed / "checkpoint-3"
    assert (checkpoint / "config.json").is_file()  # a checkpoint is a folder a run can start from
    started = weights_at_the_first_update(
        source_args(run_inputs, tmp_path / "from-checkpoint", checkpoint, "--max_train_steps", "1")
    )
    assert_same_weights(started, load_file(checkpoint / "model.safetensors"))
    final = load_file(checkpointed / "model.safetensors")  # step 6, not the checkpoint's step 3
    assert not torch.equal(started["bert.pooler.dense.weight"], final["bert.pooler.dense.weight"])


def test_flags_that_contradict_the_source_are_refused_before_any_work(tmp_path, run_inputs):
    source = tmp_path / "source"
    tokenizer = transformers.AutoTokenizer.from_pretrained(run_inputs["tokenizer"])
    HfBertForPreTraining(tiny_config(vocab_size=len(tokenizer))).save_pretrained(source)
    tokenizer.save_pretrained(source)
    output_dir = tmp_path / "refused"
    for extra, message in (
        (("--max_seq_length", "256"), "--max_seq_length 256 exceeds"),
        (("--model_size", "base"), "--model_size base contradicts"),
    ):
        with pytest.raises(ValueError, match=message):
            train_in_process(source_args(run_inputs, output_dir, source, *extra))
        written = {path.name for path in output_dir.iterdir()} if output_dir.exists() else set()
        assert written <= {RUN_LOCK_NAME}  # no data read, nothing written
    with pytest.raises(ValueError, match="not a model folder"):
        train_in_process(source_args(run_inputs, output_dir, run_inputs["tokenizer"]))


def test_model_size_defaults_to_mini_only_without_a_source():
    assert parse_args(["--output_dir", "x"]).model.model_size == "mini"
    assert parse_args(["--output_dir", "x", "--model_name_or_path", "y"]).model.model_size is None
