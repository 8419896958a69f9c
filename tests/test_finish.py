"""hfbert.pretraining.finish (and samples): the final folder written as one set, its samples computed on the
weights in memory, and the fill-mask section handed back instead of parsed out of samples.md."""

import json
import logging
import math

import torch
from conftest import tiny_config
from test_inspect import write_samples_from_folder

from hfbert import HfBertForPreTraining
from hfbert.pretraining.cli import parse_args
from hfbert.pretraining.extras.samples import Samples
from hfbert.pretraining.finish import FinalFolder, write_final_folder
from hfbert.pretraining.training import TrainingProgress

SENTENCES = [
    "The game was released in Japan in 2011 and sold well .",
    "It was the first game in the series to be released on a handheld .",
    "Critics praised the story of the game and its music .",
]
OTHER = "The band toured Europe in the summer ."


def write(output_dir, model, tokenizer, sentences=(SENTENCES, OTHER), flags=()) -> FinalFolder:
    samples = Samples(tokenizer, sentences[0], other_sentence=sentences[1])
    history = [{"step": 1, "loss": 7.0, "learning_rate": 1e-4}, {"step": 2, "eval_mlm_loss": 6.5}]
    progress = TrainingProgress(completed_steps=2, train_seconds=3.0, log_history=history)
    metrics = {"eval_mlm_loss": 6.5, "eval_mlm_accuracy": 0.01}
    summary = {"precision": "no", "corpus": "shipped WikiText-2 sample"}
    settings = parse_args(["--output_dir", str(output_dir), *flags])
    return write_final_folder(tokenizer, metrics, summary, samples, settings, model, model.state_dict(), progress)


def test_the_final_folder_is_one_set_with_samples_from_the_weights_in_memory(tmp_path, sample_tokenizer):
    torch.manual_seed(0)
    model = HfBertForPreTraining(tiny_config())
    final = write(tmp_path / "run", model, sample_tokenizer)
    folder = final.path
    for name in ("config.json", "model.safetensors", "README.md", "samples.md", "samples_attention.png",
                 "training_curves.png", "eval_results.json", "training_args.json", "log_history.json"):  # fmt: skip
        assert (folder / name).is_file(), name
    assert json.loads((folder / "eval_results.json").read_text()) == {
        "step": 2, "train_seconds": 3.0, "eval_mlm_loss": 6.5, "eval_mlm_accuracy": 0.01
    }
    samples = (folder / "samples.md").read_text()
    # The section handed back is the one in samples.md, with the model's MLM head (not "no masked-LM head").
    assert final.fill_mask.startswith("## Fill-mask") and final.fill_mask in samples
    assert final.fill_mask.count("true word **") == 3
    assert "[samples.md](samples.md)" in (folder / "README.md").read_text()
    # In memory or reloaded from the folder, the same weights give the same samples.
    reloaded = tmp_path / "reloaded"
    folder.rename(reloaded)
    write_samples_from_folder(reloaded, SENTENCES, other_sentence=OTHER, model_name="run")
    assert (reloaded / "samples.md").read_text().split("\n", 4)[4] == samples.split("\n", 4)[4]


def test_without_sample_sentences_there_are_no_samples_and_the_log_says_why(tmp_path, sample_tokenizer, caplog):
    """The seventh attack (731f08a), S4: validation documents of one sentence each left no samples.md, and no
    word of it."""
    with caplog.at_level(logging.INFO, logger="hfbert.pretraining.extras.samples"):
        final = write(tmp_path / "run", HfBertForPreTraining(tiny_config()), sample_tokenizer, sentences=([], None))
    assert final.fill_mask is None and not (final.path / "samples.md").exists()
    assert "samples.md" not in (final.path / "README.md").read_text()
    assert caplog.messages == [
        "No samples.md in the final folder: no validation document holds 4 consecutive sentences of 6-40 words "
        "(samples.md shows what the model makes of them)"
    ]


def test_the_cards_snippets_load_the_hub_model_id_namespace_included(tmp_path, sample_tokenizer):
    """With --hub_model_id me/hfbert-x they said from_pretrained("hfbert-x"), which is not the pushed repo."""
    folder = write(tmp_path / "run", HfBertForPreTraining(tiny_config()), sample_tokenizer, ([], None),
                   flags=["--hub_model_id", "me/hfbert-x"]).path  # fmt: skip
    card = (folder / "README.md").read_text()
    assert card.count('from_pretrained("me/hfbert-x"') == 3 and 'pipeline("fill-mask", model="me/hfbert-x"' in card
    assert '"hfbert-x"' not in card and "\n# hfbert-x\n" in card  # the title is the model's name


def test_the_callbacks_files_card_sections_and_reference_lines_are_part_of_the_one_set(tmp_path, sample_tokenizer, monkeypatch):
    """Run health and the samples are callbacks that finish does not know by name (`on_final_folder`): their
    files are published with the rest, the card links the samples and holds the health section, and the curves
    draw the health's baselines."""
    from test_run_health import BUDGET, corpus_with_duplicates

    from hfbert.pretraining import finish
    from hfbert.pretraining.callbacks import Callbacks
    from hfbert.pretraining.extras.health.signatures import RunHealth

    drawn = {}
    monkeypatch.setattr(finish, "plot_training_curves", lambda *args, **kwargs: drawn.update(kwargs))
    model, progress = HfBertForPreTraining(tiny_config()), TrainingProgress(completed_steps=2)
    callbacks = Callbacks([RunHealth(corpus_with_duplicates(), BUDGET, None, True), Samples(sample_tokenizer, SENTENCES, OTHER)])
    settings = parse_args(["--output_dir", str(tmp_path / "run")])
    final = write_final_folder(sample_tokenizer, {}, {}, callbacks, settings, model, model.state_dict(), progress)
    published = json.loads((final.path / ".hfbert-final-files.json").read_text())
    assert {"run_health.json", "samples.md", "samples_attention.png"} <= set(published)
    assert json.loads((final.path / "run_health.json").read_text())["event_kinds"][0] == "duplicate_text"
    card = (final.path / "README.md").read_text()
    assert "## Run health" in card and "duplicate_text" in card and "[samples.md](samples.md)" in card
    assert drawn["reference_lines"] == [("MLM loss", 7.0, "unigram baseline"), ("NSP loss", math.log(2), "chance"),
                                        ("NSP accuracy", 0.5, "chance")]  # fmt: skip
    assert final.fill_mask.startswith("## Fill-mask")


def test_the_tokenizer_is_saved_before_the_samples_call_it(tmp_path, sample_tokenizer):
    """A call resets the truncation (and padding) a tokenizer's file keeps: saved after the samples, a
    --tokenizer_name folder with truncation would reach the final folder without it."""
    from transformers import AutoTokenizer

    sample_tokenizer.save_pretrained(tmp_path / "tokenizer")
    tokenizer = AutoTokenizer.from_pretrained(tmp_path / "tokenizer")
    tokenizer.backend_tokenizer.enable_truncation(max_length=64)
    folder = write(tmp_path / "run", HfBertForPreTraining(tiny_config()), tokenizer).path
    assert (folder / "samples.md").is_file()
    assert json.loads((folder / "tokenizer.json").read_text())["truncation"]["max_length"] == 64


class OtherRankOfTwo:
    """What finish uses of the Accelerator of the second process of two."""

    num_processes, is_main_process = 2, False

    def wait_for_everyone(self) -> None:
        pass

    def reduce(self, tensor, reduction):  # the weights' finiteness, agreed: this process's alike
        return tensor

    def get_state_dict(self, model):
        return {}

    def end_training(self) -> None:
        raise AssertionError("the run ended as if its final folder were written")


def test_a_final_folder_that_fails_on_the_main_process_stops_every_process_with_its_refusal(tmp_path, monkeypatch):
    """The soak's trial 425801368 (issue 44): the disk filled while rank 0 wrote the final folder; rank 0 printed
    the refusal, and rank 1, waiting in the final barrier, a traceback of gloo's 'Connection closed by peer'."""
    import pytest

    from hfbert import checkpointing
    from hfbert.errors import RunFailure
    from hfbert.pretraining.finish import finish

    refusal = f"no space left writing {tmp_path}; the last complete checkpoint {tmp_path}/checkpoint-28 is intact"
    monkeypatch.setattr(checkpointing, "gather_object", lambda mine: [refusal, *mine])
    with pytest.raises(RunFailure) as stopped:
        model = torch.nn.Linear(2, 2)
        optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
        state = type("State", (), {"model": model, "optimizer": optimizer, "progress": TrainingProgress()})()
        finish(OtherRankOfTwo(), state, parse_args(["--output_dir", str(tmp_path)]).output, write_final_folder)
    assert str(stopped.value) == refusal
