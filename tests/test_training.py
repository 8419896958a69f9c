"""run_pretraining.py end to end: output folder, resume, kill-and-resume, two processes, push, bad input."""

import gc
import json
import math
import os
import re
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable
from pathlib import Path
from unittest import mock

import pytest
import torch
from accelerate.state import AcceleratorState, GradientState
from conftest import DAMAGES, damage, tiny_config
from safetensors import SafetensorError
from safetensors.torch import load_file
from torch.testing import assert_close

from hfbert.errors import CheckpointError, RunFailure
from hfbert.files import RUN_LOCK_NAME, run_folder_lock
from hfbert.modeling_hfbert import HfBertForPreTraining
from hfbert.pretraining.cli import main

REPO = Path(__file__).resolve().parents[1]
FINAL_FILES = {
    "README.md",
    "samples.md",
    "samples_attention.png",
    "samples_similarity.png",
    "config.json",
    "configuration_hfbert.py",
    "eval_results.json",
    "log_history.json",
    "model.safetensors",
    "modeling_hfbert.py",
    "tokenizer.json",
    "tokenizer_config.json",
    "training_args.json",
    "training_curves.png",
    "run_health.json",
}


# Two runs that must end bit-equal pass this: on a CPU they do anyway, on CUDA only with deterministic
# algorithms (cuBLAS and atomics otherwise differ slightly; measured on an H100, benchmarks/results/gpu_h100.md).
EXACT = ("--deterministic",)


def run_args(run_inputs: dict[str, Path], output_dir: Path, *extra: str) -> list[str]:
    return [
        "--tokenizer_name",
        str(run_inputs["tokenizer"]),
        "--config_name",
        str(run_inputs["config"]),
        "--output_dir",
        str(output_dir),
        "--per_device_train_batch_size",
        "8",
        "--per_device_eval_batch_size",
        "32",
        "--max_eval_samples",
        "64",
        "--learning_rate",
        "1e-3",
        "--mixed_precision",
        "no",
        "--logging_steps",
        "2",
        # Eager, as on a CPU: compiling each test's model (CUDA's default) would take the GPU suite past its time;
        # tests that compile say so (a later flag wins).
        "--torch_compile",
        "false",
        *extra,
    ]


def train_in_process(args: list[str], **kwargs) -> None:
    """main() in this process; accelerate's singletons and --deterministic are reset so the next run starts
    clean."""
    try:
        main(args, **kwargs)
    finally:
        AcceleratorState._reset_state(reset_partial_state=True)
        GradientState._reset_state()
        torch.use_deterministic_algorithms(False)


def subprocess_env() -> dict[str, str]:
    return {**os.environ, "PYTHONUNBUFFERED": "1", "TOKENIZERS_PARALLELISM": "false"}


def listing(folder: Path) -> dict[str, float]:
    return {str(path.relative_to(folder)): path.stat().st_mtime_ns for path in folder.rglob("*")}


# ----------------------------------------------------------------------------------------------- end to end


@pytest.mark.slow
def test_accelerate_launch_produces_a_folder_and_checkpoints_that_load_everywhere(tmp_path, run_inputs):
    output_dir = tmp_path / "run"
    command = [
        sys.executable, "-m", "accelerate.commands.launch", "--num_processes", "1", "--num_machines", "1",
        "--mixed_precision", "no", "--dynamo_backend", "no",
        str(REPO / "run_pretraining.py"),
        *run_args(run_inputs, output_dir, "--max_train_steps", "24", "--eval_steps", "12", "--checkpointing_steps", "12"),
    ]  # fmt: skip
    result = subprocess.run(command, capture_output=True, text=True, env=subprocess_env(), cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-4000:]
    assert f"Model, tokenizer, model card, curves and samples: {output_dir.resolve()}" in result.stdout
    assert "## Fill-mask" in result.stdout and "true word **" in result.stdout  # validation samples

    assert {path.name for path in output_dir.iterdir()} >= FINAL_FILES
    assert {path.name for path in output_dir.glob("checkpoint-*")} == {"checkpoint-12", "checkpoint-24"}
    eval_results = json.loads((output_dir / "eval_results.json").read_text())
    assert eval_results["step"] == 24
    assert set(eval_results) >= {
        "eval_mlm_loss", "eval_mlm_accuracy", "eval_perplexity", "eval_nsp_loss", "eval_nsp_accuracy",
    }  # fmt: skip
    assert (output_dir / "training_curves.png").read_bytes().startswith(b"\x89PNG")
    assert json.loads((output_dir / "config.json").read_text())["auto_map"]["AutoModelForMaskedLM"]
    card = (output_dir / "README.md").read_text()
    assert card.startswith("---\n") and "library_name: transformers" in card and "eval" in card.lower()

    # Every checkpoint loads as the final folder does (the last one with its weights), with hfbert and without.
    folders = (output_dir, output_dir / "checkpoint-12", output_dir / "checkpoint-24")
    for folder in folders:
        assert_loads_with_hfbert(folder)
    assert_loads_without_hfbert(*folders)
    final, last = (load_pretraining_model(folder).state_dict() for folder in (output_dir, output_dir / "checkpoint-24"))
    assert final.keys() == last.keys() and all(torch.equal(final[name], last[name]) for name in final)


def load_pretraining_model(folder: Path) -> torch.nn.Module:
    from transformers import AutoModelForPreTraining

    return AutoModelForPreTraining.from_pretrained(folder)


def assert_loads_with_hfbert(folder: Path) -> None:
    """This process, where hfbert is imported, loads the folder through the Auto classes and fill-mask."""
    from transformers import AutoModel, AutoModelForMaskedLM, AutoTokenizer, pipeline

    import hfbert

    assert type(AutoModel.from_pretrained(folder)) is hfbert.HfBertModel
    assert type(load_pretraining_model(folder)) is hfbert.HfBertForPreTraining
    assert type(AutoModelForMaskedLM.from_pretrained(folder)) is hfbert.HfBertForMaskedLM
    tokenizer = AutoTokenizer.from_pretrained(folder)
    assert tokenizer.is_fast and tokenizer.pad_token_id == 0
    predictions = pipeline("fill-mask", model=str(folder))(f"the game was {tokenizer.mask_token} in 1994 .")
    assert len(predictions) == 5 and all("sequence" in p and "score" in p for p in predictions)


def assert_loads_without_hfbert(*folders: Path) -> None:
    """A fresh process that cannot import hfbert loads each folder with trust_remote_code=True (one process for
    all: its start, not the loading, is most of the time)."""
    script = textwrap.dedent(
        f"""
        import sys

        class BlockHfbert:
            def find_spec(self, name, path=None, target=None):
                if name.split(".")[0] == "hfbert":
                    raise ModuleNotFoundError(name)

        sys.meta_path.insert(0, BlockHfbert())
        from transformers import (AutoModel, AutoModelForMaskedLM, AutoModelForPreTraining, AutoTokenizer,
                                  pipeline)

        for folder in {[str(folder) for folder in folders]!r}:
            for auto_class in (AutoModel, AutoModelForMaskedLM, AutoModelForPreTraining):
                model = auto_class.from_pretrained(folder, trust_remote_code=True)
                assert "transformers_modules" in type(model).__module__
            tokenizer = AutoTokenizer.from_pretrained(folder, trust_remote_code=True)
            fill_mask = pipeline("fill-mask", model=folder, trust_remote_code=True)
            print(len(fill_mask("the game was " + tokenizer.mask_token + " .")))
        """
    )
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=folders[0].parent)
    assert result.returncode == 0 and result.stdout.split() == ["5"] * len(folders), result.stderr[-3000:]


# ----------------------------------------------------------------------------------------------- resume


def final_weights(folder: Path) -> dict[str, torch.Tensor]:
    return load_file(folder / "model.safetensors")


def evaluated_steps(folder: Path) -> list[int]:
    """The updates after which the run in `folder` evaluated: with --eval_steps given to a resumed run only,
    the updates it ran itself (a resume that started again from update 0 evaluates earlier ones too)."""
    history = json.loads((folder / "log_history.json").read_text())
    return [row["step"] for row in history if "eval_mlm_loss" in row]


FINISHED_RUN = ("--max_train_steps", "4", "--checkpointing_steps", "2")


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory, run_inputs) -> Path:
    """One run of FINISHED_RUN's 4 updates (checkpoint-2, checkpoint-4 and the final folder) for the tests that
    resume from it or refuse to: read only; a test that changes it changes `copy_of` it."""
    output_dir = tmp_path_factory.mktemp("finished") / "run"
    train_in_process(run_args(run_inputs, output_dir, *FINISHED_RUN))
    return output_dir


def copy_of(run: Path, output_dir: Path, *, checkpoints: bool = True) -> Path:
    """`run` copied to `output_dir` (without its checkpoints: the final folder of a run that wrote none)."""
    shutil.copytree(run, output_dir, ignore=None if checkpoints else shutil.ignore_patterns("checkpoint-*"))
    return output_dir


@pytest.mark.slow
def test_half_then_resume_then_half_equals_straight_training(tmp_path, run_inputs):
    """Also: batches built by DataLoader workers equal those built in the loop's process, and evaluations in
    the middle of a run leave its RNG streams (masks, dropout) as they were. --deterministic makes it exact on
    CUDA too, where this suite runs the model on the GPU."""
    straight, resumed = tmp_path / "straight", tmp_path / "resumed"
    common = ("--max_train_steps", "10", *EXACT)
    train_in_process(run_args(run_inputs, straight, *common, "--checkpointing_steps", "5"))
    # The second run starts from the straight run's mid-epoch checkpoint at step 5, in a fresh output folder.
    resumed.mkdir()
    shutil.copytree(straight / "checkpoint-5", resumed / "checkpoint-5")
    train_in_process(
        run_args(
            run_inputs, resumed, *common, "--resume_from_checkpoint", "latest",
            "--dataloader_num_workers", "2", "--eval_steps", "2",
        )
    )  # fmt: skip
    evaluated = [row["step"] for row in json.loads((resumed / "log_history.json").read_text()) if "eval_mlm_loss" in row]
    assert evaluated == [6, 8, 10]
    expected, actual = final_weights(straight), final_weights(resumed)
    assert expected.keys() == actual.keys()
    for name, tensor in expected.items():
        assert torch.equal(actual[name], tensor), name
    straight_log = json.loads((straight / "training_args.json").read_text())
    assert straight_log["max_train_steps"] == 10


@pytest.mark.slow
def test_a_fading_start_with_the_cls_penalty_resumes_exactly_and_ends_without_the_structure(tmp_path, run_inputs):
    straight, resumed = tmp_path / "straight", tmp_path / "resumed"
    common = ("--max_train_steps", "10", "--attention_init", "structured", "--structured_attention_fade", "0.6",
              "--cls_attention_spread", "1", *EXACT)  # fmt: skip
    train_in_process(run_args(run_inputs, straight, *common, "--checkpointing_steps", "4"))
    resumed.mkdir()
    shutil.copytree(straight / "checkpoint-4", resumed / "checkpoint-4")
    train_in_process(run_args(run_inputs, resumed, *common, "--resume_from_checkpoint", "latest"))
    expected, actual = final_weights(straight), final_weights(resumed)
    for name, tensor in expected.items():
        assert torch.equal(actual[name], tensor), name
    plain = tmp_path / "plain"  # the same start without the two levers ends elsewhere
    train_in_process(run_args(run_inputs, plain, "--max_train_steps", "10", "--attention_init", "structured"))
    query = "bert.encoder.layer.1.attention.self.query.weight"  # its largest entries: the next-token head's
    assert expected[query].abs().max() < final_weights(plain)[query].abs().max() / 4


@pytest.mark.slow
def test_killed_run_resumes_from_its_last_checkpoint_and_finishes(tmp_path, run_inputs, caplog):
    output_dir = tmp_path / "run"
    args = run_args(run_inputs, output_dir, "--max_train_steps", "400", "--checkpointing_steps", "3")
    # A constant schedule, so that the resumed run may deliberately stop earlier (--max_train_steps 12).
    args += ["--checkpoints_total_limit", "2", "--eval_steps", "1000", "--lr_scheduler_type", "constant"]
    command = [sys.executable, str(REPO / "run_pretraining.py"), *args]
    stderr = tmp_path / "stderr.txt"  # a file, not a pipe nobody reads while it runs: a full pipe blocks the run
    with stderr.open("w") as sink:
        process = subprocess.Popen(command, env=subprocess_env(), cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=sink)
    deadline = time.monotonic() + 240
    while not (output_dir / "checkpoint-6").exists():
        assert process.poll() is None, stderr.read_text()[-3000:]
        assert time.monotonic() < deadline, "no checkpoint-6 within 240 s"
        time.sleep(0.05)
    process.send_signal(signal.SIGKILL)
    process.wait()
    assert not (output_dir / "model.safetensors").exists()
    complete = [  # a checkpoint is complete once its manifest is written
        int(match[1])
        for path in output_dir.iterdir()
        if (match := re.fullmatch(r"checkpoint-(\d+)", path.name))
        and (path / "checkpoint_manifest.json").is_file()
    ]
    last = max(complete)
    assert 6 <= last < 12, complete

    resume = [*args, "--resume_from_checkpoint", "latest", "--eval_steps", "1"]
    resume[resume.index("400")] = "12"  # finish soon after the checkpoint it resumes from
    train_in_process(resume)  # in this process: only the kill needs a process of its own
    assert f"Resuming from {output_dir / f'checkpoint-{last}'}\n" in caplog.text
    assert evaluated_steps(output_dir) == list(range(last + 1, 13))  # the updates after it, and only those
    assert "--max_train_steps changed from 400 to 12" in caplog.text
    assert json.loads((output_dir / "eval_results.json").read_text())["step"] == 12
    assert len(list(output_dir.glob("checkpoint-*"))) <= 2


@pytest.mark.slow
def test_two_cpu_processes_with_torchrun(tmp_path, run_inputs):
    output_dir = tmp_path / "run"
    command = [
        sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--standalone",  # a free port, never another run's
        str(REPO / "run_pretraining.py"),
        *run_args(run_inputs, output_dir, "--max_train_steps", "6", "--checkpointing_steps", "3"),
    ]  # fmt: skip
    env = {**subprocess_env(), "ACCELERATE_USE_CPU": "1", "OMP_NUM_THREADS": "1"}
    result = subprocess.run(command, capture_output=True, text=True, env=env, cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-4000:]
    assert json.loads((output_dir / "training_args.json").read_text())["num_processes"] == 2
    manifest = json.loads((output_dir / "checkpoint-6" / "checkpoint_manifest.json").read_text())
    assert {"random_states_0.pkl", "random_states_1.pkl"} <= set(manifest["files"])
    assert result.stdout.count("Model, tokenizer, model card, curves and samples") == 1  # only the main process


def streaming_args(run_inputs: dict[str, Path], output_dir: Path, *extra: str) -> list[str]:
    """A --streaming run over the shipped sample in windows of 2 articles, 32 instances a batch (an update
    takes rows of several windows)."""
    args = run_args(run_inputs, output_dir, "--streaming", "--stream_window_documents", "2", *extra)
    args[args.index("--per_device_train_batch_size") + 1] = "32"
    return args


def loader_positions(rank: dict) -> tuple[int, list[dict]]:
    """The batches a process took and each loader worker's position, read from its `StatefulDataLoader` state
    in stream_state.json (torchdata's layout: without workers the loader's own; with workers a snapshot of
    theirs)."""
    if "_snapshot" not in rank:
        return rank["_num_yielded"], [rank["dataset_state"]]
    snapshot = rank["_snapshot"]
    taken = snapshot["_snapshot_step"] + rank["_steps_since_snapshot"]
    return taken, [worker["dataset_state"] for worker in snapshot["_worker_snapshots"].values()]


@pytest.mark.slow
@pytest.mark.parametrize("workers", ["0", "2"])
def test_a_resumed_streaming_run_equals_an_uninterrupted_one(tmp_path, run_inputs, workers):
    """N updates straight and N/2 + resume + N/2 give the same weights bit for bit: each loader worker
    continues after the last instance trained on, and with 2 workers an odd number of batches taken (5)
    rotates which worker makes the next batch."""
    straight, resumed = tmp_path / "straight", tmp_path / "resumed"
    common = ("--max_train_steps", "10", "--dataloader_num_workers", workers, *EXACT)
    train_in_process(streaming_args(run_inputs, straight, *common, "--checkpointing_steps", "5"))
    saved = json.loads((straight / "checkpoint-5" / "stream_state.json").read_text())
    taken, positions = loader_positions(saved["ranks"][0])
    assert saved["num_processes"] == 1 and taken == 5
    assert len(positions) == max(1, int(workers))
    resumed.mkdir()
    shutil.copytree(straight / "checkpoint-5", resumed / "checkpoint-5")
    train_in_process(streaming_args(run_inputs, resumed, *common, "--resume_from_checkpoint", "latest", "--eval_steps", "2"))
    assert evaluated_steps(resumed) == [6, 8, 10]  # updates 6 to 10 ran after the resume, not 1 to 10
    expected, actual = final_weights(straight), final_weights(resumed)
    for name, tensor in expected.items():
        assert torch.equal(actual[name], tensor), name
    summary = json.loads((straight / "training_args.json").read_text())
    assert summary["streaming"] and summary["train_instances"] is None and summary["planned_train_steps"] == 10
    assert {"eval_nsp_accuracy", "eval_mlm_accuracy"} <= json.loads((straight / "eval_results.json").read_text()).keys()


@pytest.mark.slow
def test_sigterm_saves_a_streams_position_and_the_resumed_run_equals_an_uninterrupted_one(tmp_path, run_inputs):
    output_dir = tmp_path / "run"
    args = streaming_args(
        run_inputs, output_dir, "--lr_scheduler_type", "constant", "--dataloader_num_workers", "2", *EXACT
    )
    returncode, message = start_and_signal(
        tmp_path, [*args, "--max_train_steps", "100000"], 3, lambda process: process.send_signal(signal.SIGTERM)
    )
    assert returncode == 128 + signal.SIGTERM, message[-3000:]
    assert resumed_equals_uninterrupted(tmp_path, args) >= 3


@pytest.mark.slow
def test_a_streaming_run_resumed_with_other_flags_or_another_corpus_is_refused_untouched(tmp_path, run_inputs):
    from hfbert.corpus_arguments import SHIPPED_SAMPLE_DIR, SHIPPED_SAMPLE_FILES

    corpus = tmp_path / "train.raw"
    shutil.copy(SHIPPED_SAMPLE_DIR / SHIPPED_SAMPLE_FILES["train"], corpus)
    output_dir = tmp_path / "run"
    args = streaming_args(
        run_inputs, output_dir, "--train_file", str(corpus), "--stream_validation_documents", "3",
        "--dataloader_num_workers", "0",  # the refusal below names it (a GPU's default is 4)
    )  # fmt: skip
    train_in_process([*args, "--max_train_steps", "2", "--checkpointing_steps", "2"])
    before = listing(output_dir)
    resume = [*args, "--max_train_steps", "2", "--resume_from_checkpoint", "latest"]

    def refused(argv: list[str], message: str) -> None:
        with pytest.raises(ValueError, match=re.escape(message)):
            train_in_process(argv)
        assert listing(output_dir) == before

    window = resume.index("--stream_window_documents") + 1
    refused([*resume[:window], "3", *resume[window + 1 :]], "--stream_window_documents 2 in the checkpoint, 3 now")
    refused([*resume, "--dataloader_num_workers", "2"], "pass --dataloader_num_workers 0")
    not_streaming = run_args(run_inputs, output_dir, "--train_file", str(corpus), "--max_train_steps", "2")
    not_streaming[not_streaming.index("--per_device_train_batch_size") + 1] = "32"
    refused([*not_streaming, "--resume_from_checkpoint", "latest"], "--streaming True in the checkpoint, False now")
    corpus.write_text(corpus.read_text().replace(" the ", " a "))
    refused(resume, f"the corpus ({corpus}) has changed")


@pytest.mark.slow
def test_a_streaming_run_from_a_hub_layout_folder_resumes_exactly(tmp_path, run_inputs):
    """--dataset_name (a local folder laid out like the Hub's Salesforce/wikitext, parquet files): the stream's
    position in its parquet rows goes through stream_state.json and the resumed run equals the straight one."""
    from test_corpus import HUB_CONFIG, hub_layout_folder

    folder = hub_layout_folder.__wrapped__(tmp_path)  # the fixture's function: test_corpus's Hub-layout folder
    source = ("--dataset_name", str(folder), "--dataset_config_name", HUB_CONFIG)
    straight, resumed = tmp_path / "straight", tmp_path / "resumed"
    common = (*source, "--max_train_steps", "7", "--dataloader_num_workers", "0", *EXACT)  # one stream position
    train_in_process(streaming_args(run_inputs, straight, *common, "--checkpointing_steps", "5"))
    (rank,) = json.loads((straight / "checkpoint-5" / "stream_state.json").read_text())["ranks"]
    _, (position,) = loader_positions(rank)
    assert position["window"] >= 1 and position["documents_state"] is not None  # a position inside the parquet rows
    resumed.mkdir()
    shutil.copytree(straight / "checkpoint-5", resumed / "checkpoint-5")
    resume = ("--resume_from_checkpoint", "latest", "--eval_steps", "1")
    train_in_process(streaming_args(run_inputs, resumed, *common, *resume))
    assert evaluated_steps(resumed) == [6, 7]  # updates 6 and 7 ran after the resume
    expected, actual = final_weights(straight), final_weights(resumed)
    for name, tensor in expected.items():
        assert torch.equal(actual[name], tensor), name


@pytest.mark.slow
def test_a_streaming_run_on_two_cpu_processes_resumes_exactly_on_two_only(tmp_path, run_inputs):
    """Each process streams its own share of the documents (split_dataset_by_node); the checkpoint holds both
    positions, a resume on 2 processes continues exactly, one on 1 process is refused before any work."""
    env = {**subprocess_env(), "ACCELERATE_USE_CPU": "1", "OMP_NUM_THREADS": "1"}

    def launch(processes: int, output_dir: Path, *extra: str) -> subprocess.CompletedProcess:
        launcher = ["-m", "torch.distributed.run", "--nproc_per_node", str(processes), "--standalone"]
        command = [
            sys.executable, *(launcher if processes > 1 else []),
            str(REPO / "run_pretraining.py"), *streaming_args(run_inputs, output_dir, "--max_train_steps", "6", *extra),
        ]  # fmt: skip
        return subprocess.run(command, capture_output=True, text=True, env=env, cwd=tmp_path)

    straight, resumed = tmp_path / "straight", tmp_path / "resumed"
    result = launch(2, straight, "--checkpointing_steps", "3")
    assert result.returncode == 0, result.stderr[-4000:]
    saved = json.loads((straight / "checkpoint-3" / "stream_state.json").read_text())
    ranks = [loader_positions(rank) for rank in saved["ranks"]]
    assert saved["num_processes"] == 2 and [taken for taken, _ in ranks] == [3, 3]
    assert ranks[0][1] != ranks[1][1]
    resumed.mkdir()
    shutil.copytree(straight / "checkpoint-3", resumed / "checkpoint-3")
    before = listing(resumed)
    one = launch(1, resumed, "--resume_from_checkpoint", "latest")
    assert one.returncode == 2 and "resumes on 2 processes only" in one.stderr, one.stderr[-3000:]
    assert listing(resumed) == before
    result = launch(2, resumed, "--resume_from_checkpoint", "latest", "--eval_steps", "1")
    assert result.returncode == 0, result.stderr[-4000:]
    assert evaluated_steps(resumed) == [4, 5, 6]  # updates 4 to 6 ran after the resume
    expected, actual = final_weights(straight), final_weights(resumed)
    for name, tensor in expected.items():
        assert torch.equal(actual[name], tensor), name


# ----------------------------------------------------------------------------------------------- hub


@pytest.mark.slow
def test_push_to_hub_uploads_exactly_the_final_folder(tmp_path, run_inputs):
    output_dir = tmp_path / "run"
    commit = mock.Mock(commit_url="https://huggingface.co/me/hfbert-tiny/commit/1")
    with (
        mock.patch(
            "huggingface_hub.HfApi.create_repo", return_value=mock.Mock(repo_id="me/m")
        ) as create_repo,
        mock.patch("huggingface_hub.HfApi.create_commit", return_value=commit) as create_commit,
        mock.patch("huggingface_hub.constants.HF_HUB_OFFLINE", False),
        mock.patch("huggingface_hub.HfApi.whoami", return_value={"name": "me"}),
    ):
        push = [
            "--max_train_steps",
            "4",
            "--checkpointing_steps",
            "2",
            "--push_to_hub",
            "--hub_model_id",
            "me/m",
        ]
        train_in_process(run_args(run_inputs, output_dir, *push))
    assert create_repo.call_args.args[0] == "me/m"
    assert create_commit.call_args.args[0] == "me/m"
    operations = create_commit.call_args.kwargs["operations"]
    uploaded = {operation.path_in_repo for operation in operations}
    assert uploaded == FINAL_FILES  # no checkpoints, no hidden tokenizer/staging folders
    upload_copy = tmp_path / "as-uploaded"
    upload_copy.mkdir()
    for operation in operations:  # a file's path, or the card's bytes
        with operation.as_file() as uploaded_file:
            (upload_copy / operation.path_in_repo).write_bytes(uploaded_file.read())
    assert_loads_without_hfbert(upload_copy)


# ------------------------------------------------------------------------------- another model, the same stages


def test_another_model_trains_through_the_public_stages(tmp_path, run_inputs):
    """The seam benchmarks/time_to_quality.py uses: `pretrain` with another model class (here a function of
    the config, recording the model it builds) in place of HfBertForPreTraining."""
    from hfbert.pretraining.cli import parse_args
    from hfbert.pretraining.run import pretrain

    output_dir = tmp_path / "run"
    settings = parse_args(run_args(run_inputs, output_dir, "--max_train_steps", "2", "--gradient_accumulation_steps", "2"))
    built = []

    def another_model(config):
        built.append(HfBertForPreTraining(config))
        return built[-1]

    try:
        assert pretrain(settings, model_class=another_model).path == output_dir
    finally:
        AcceleratorState._reset_state(reset_partial_state=True)
        GradientState._reset_state()
    [model] = built
    train_rows = [row for row in json.loads((output_dir / "log_history.json").read_text()) if "loss" in row]
    for key in ("train_mlm_loss", "train_mlm_accuracy", "train_nsp_loss", "train_nsp_accuracy"):
        assert all(math.isfinite(row[key]) for row in train_rows), key
    for row in train_rows:  # the logged loss is the mean over micro-batches, = MLM + NSP (weight 1)
        assert row["loss"] == pytest.approx(row["train_mlm_loss"] + row["train_nsp_loss"], abs=1e-3)
        assert row["model_flops_per_second"] > 0  # the MFU's numerator; "mfu" itself needs a known GPU peak
    saved = final_weights(output_dir)
    for name, tensor in model.state_dict().items():
        if name in saved:  # the saved weights are read onto the CPU; the model may sit on a GPU
            assert torch.equal(saved[name], tensor.cpu()), name


def test_nsp_loss_weight_weighs_the_nsp_term_of_the_loss(tmp_path, run_inputs):
    output_dir = tmp_path / "run"
    train_in_process(run_args(run_inputs, output_dir, "--max_train_steps", "2", "--nsp_loss_weight", "0.25"))
    train_rows = [row for row in json.loads((output_dir / "log_history.json").read_text()) if "loss" in row]
    assert train_rows
    for row in train_rows:  # NSP's loss is ~0.7: weight 1 instead of 0.25 is 0.5 off
        assert row["loss"] == pytest.approx(row["train_mlm_loss"] + 0.25 * row["train_nsp_loss"], abs=1e-3)
    assert json.loads((output_dir / "training_args.json").read_text())["nsp_loss_weight"] == 0.25


def test_attention_padding_varlen_reaches_every_training_step_and_not_evaluation(tmp_path, run_inputs):
    from hfbert import modeling_hfbert

    output_dir = tmp_path / "run"
    args = run_args(run_inputs, output_dir, "--max_train_steps", "2", "--attention_padding", "varlen")
    with mock.patch.object(modeling_hfbert, "varlen_attention", wraps=modeling_hfbert.varlen_attention) as varlen:
        train_in_process(args)
    layers = tiny_config().num_hidden_layers
    assert varlen.call_count == 2 * layers  # the two updates' forwards; evaluation masks
    assert all(varlen.call_args_list[0].args[3].lengths >= 1)
    assert json.loads((output_dir / "training_args.json").read_text())["attention_padding"] == "varlen"


@pytest.mark.parametrize("attention_init", ["structured", "bert"])
def test_runs_start_from_the_start_they_name(tmp_path, run_inputs, attention_init):
    output_dir = tmp_path / "run"
    flags = ["--max_train_steps", "1", "--learning_rate", "1e-7", "--attention_init", attention_init]
    train_in_process(run_args(run_inputs, output_dir, *flags))
    # The position code and the segment embeddings occupy the first half of the dims; one tiny step later
    # the second half is still ~0 for the structured start and N(0, 0.02) for transformers' init.
    weights = final_weights(output_dir)
    second_half = torch.cat(
        [weights[f"bert.embeddings.{name}_embeddings.weight"][:, 16:] for name in ("position", "token_type")]
    )
    assert (second_half.abs().max() < 1e-5) == (attention_init == "structured")
    summary = json.loads((output_dir / "training_args.json").read_text())
    assert summary["attention_init"] == attention_init


def linear_output_dtypes_in_training(args: list[str]) -> set[torch.dtype]:
    """Train with `args`; the dtypes the first attention query projection outputs in the training steps."""
    from hfbert.pretraining.training import Training

    dtypes = set()
    step = Training.step

    def recording(training, *rest, **kwargs):
        query = training.accelerator.unwrap_model(training.model).bert.encoder.layer[0].attention.self.query
        hook = query.register_forward_hook(lambda module, inputs, output: dtypes.add(output.dtype))
        try:
            return step(training, *rest, **kwargs)
        finally:
            hook.remove()

    with mock.patch.object(Training, "step", recording):
        train_in_process(args)
    return dtypes


@pytest.mark.slow
def test_bf16_autocast_training(tmp_path, run_inputs):
    output_dir = tmp_path / "run"
    args = run_args(run_inputs, output_dir, "--max_train_steps", "3")
    args[args.index("--mixed_precision") + 1] = "bf16"
    assert linear_output_dtypes_in_training(args) == {torch.bfloat16}  # the updates ran under bf16 autocast
    assert json.loads((output_dir / "training_args.json").read_text())["precision"] == "bf16"
    results = json.loads((output_dir / "eval_results.json").read_text())
    assert all(math.isfinite(value) for value in results.values())
    weights = final_weights(output_dir)
    assert all(tensor.dtype == torch.float32 for tensor in weights.values())  # autocast keeps fp32 masters


@pytest.mark.slow
def test_max_train_seconds_stops_on_training_time(tmp_path, run_inputs):
    output_dir = tmp_path / "run"
    budget = ["--max_train_seconds", "1.0", "--eval_steps", "1", "--num_train_epochs", "1"]  # time, not epochs
    train_in_process(run_args(run_inputs, output_dir, *budget, "--lr_scheduler_type", "constant"))
    results = json.loads((output_dir / "eval_results.json").read_text())
    assert 1.0 <= results["train_seconds"] < 10.0 and 0 < results["step"] < 100000
    # A time budget alone is not capped by the epoch count.
    assert json.loads((output_dir / "training_args.json").read_text())["planned_train_steps"] is None
    history = json.loads((output_dir / "log_history.json").read_text())
    eval_rows = [row for row in history if "eval_mlm_loss" in row]
    assert eval_rows and eval_rows[-1]["step"] == results["step"]
    seconds = [row["train_seconds"] for row in history]
    assert seconds == sorted(seconds)  # training time only grows, evaluation time is not counted


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_defaults_to_fp16_with_loss_scaling(tmp_path, run_inputs):
    output_dir = tmp_path / "run"
    args = run_args(run_inputs, output_dir, "--max_train_steps", "4", "--checkpointing_steps", "4")
    args[args.index("--mixed_precision") + 1] = "auto"
    train_in_process(args)
    assert json.loads((output_dir / "training_args.json").read_text())["precision"] == "fp16"
    assert (
        "scaler.pt"
        in json.loads((output_dir / "checkpoint-4" / "checkpoint_manifest.json").read_text())["files"]
    )


# ----------------------------------------------------------------------------------------------- bad input


def write_config(folder: Path, **overrides) -> Path:
    tiny_config(**overrides).save_pretrained(folder)
    return folder / "config.json"


MISMATCHES = [
    ("vocab too small", r"the tokenizer has \d+ tokens but the model config's vocab_size is 500"),
    ("pad id differs", r"pad_token_id 0 differs from the model config's pad_token_id 1"),
    ("sequence too long", r"--max_seq_length 256 exceeds the max_position_embeddings 128 of --config_name"),
    ("one layer", r"needs at least 2 layers and 2 attention heads .* pass --attention_init bert"),
]


def mismatch_args(tmp_path: Path, run_inputs: dict[str, Path], output_dir: Path, case: str) -> list[str]:
    """A run whose tokenizer, config and flags disagree as `case` (one of MISMATCHES) says."""
    config = {
        "vocab too small": lambda: write_config(tmp_path / "c", vocab_size=500),
        "pad id differs": lambda: write_config(tmp_path / "c", pad_token_id=1),
        "sequence too long": lambda: run_inputs["config"],
        "one layer": lambda: write_config(tmp_path / "c", num_hidden_layers=1),
    }[case]()
    args = run_args(run_inputs, output_dir, "--max_train_steps", "2", "--overwrite_output_dir")
    args[args.index("--config_name") + 1] = str(config)
    if case == "sequence too long":
        args += ["--max_seq_length", "256"]
    if case == "one layer":  # what the structured start needs
        args += ["--attention_init", "structured"]
    return args


@pytest.mark.parametrize(("case", "message"), MISMATCHES)
def test_mismatched_tokenizer_config_or_length_stops_before_writing(tmp_path, run_inputs, case, message):
    output_dir = tmp_path / "run"
    with pytest.raises(ValueError, match=message):
        train_in_process(mismatch_args(tmp_path, run_inputs, output_dir, case))
    assert not output_dir.exists()


@pytest.mark.parametrize("how", DAMAGES)
@pytest.mark.parametrize("flag", ["--config_name", "--tokenizer_name"])
def test_a_damaged_config_or_tokenizer_file_is_named_before_any_work(tmp_path, run_inputs, flag, how):
    if flag == "--config_name":
        damaged = tmp_path / "config.json"
        shutil.copy(run_inputs["config"], damaged)
        given = damaged
    else:
        given = tmp_path / "tokenizer"
        shutil.copytree(run_inputs["tokenizer"], given)
        damaged = given / "tokenizer.json"
    damage(damaged, how)
    output_dir = tmp_path / "run"
    args = run_args(run_inputs, output_dir, "--max_train_steps", "2", "--overwrite_output_dir")
    args[args.index(flag) + 1] = str(given)
    with pytest.raises(ValueError) as refused:
        train_in_process(args)
    message = str(refused.value)
    assert message.startswith(f"{flag} {given}: {damaged} is ") and f"pass another {flag}" in message
    assert not output_dir.exists()


def test_output_dir_of_another_run_is_refused_untouched(tmp_path, run_inputs):
    output_dir = tmp_path / "run"
    (output_dir / "checkpoint-4").mkdir(parents=True)
    (output_dir / "model.safetensors").write_bytes(b"previous run")
    before = listing(output_dir)
    with pytest.raises(CheckpointError, match=r"--resume_from_checkpoint latest.*--overwrite_output_dir"):
        train_in_process(run_args(run_inputs, output_dir, "--max_train_steps", "2"))
    assert listing(output_dir) == before


@pytest.mark.slow
def test_truncated_checkpoint_is_refused_on_resume(tmp_path, run_inputs, finished_run):
    output_dir = copy_of(finished_run, tmp_path / "run")
    damage(output_dir / "checkpoint-4" / "model.safetensors", "truncated")  # as a disk does: the mtime kept
    before = listing(output_dir)
    args = run_args(run_inputs, output_dir, "--max_train_steps", "6", "--resume_from_checkpoint", "latest")
    with pytest.raises(CheckpointError, match=r"model.safetensors is truncated.*checkpoint-2"):
        train_in_process(args)
    assert listing(output_dir) == before


STREAM_REFUSALS = [
    ([], "--streaming needs --max_train_steps or --max_train_seconds"),
    (["--max_train_steps", "5"], "python train_tokenizer.py --streaming"),
    (["--max_train_steps", "5", "--tokenizer_name", "t", "--dupe_factor", "3"], "each pass over the stream pairs"),
    (["--max_train_steps", "5", "--tokenizer_name", "t", "--checkpointing_steps", "epoch"], "--checkpointing_steps N"),
]


@pytest.mark.parametrize(("flags", "message"), STREAM_REFUSALS)
def test_streaming_refuses_what_a_stream_cannot_do_before_any_work(tmp_path, flags, message):
    output_dir = tmp_path / "run"
    with pytest.raises(ValueError, match=re.escape(message)):
        train_in_process(["--output_dir", str(output_dir), "--streaming", "--dataset_name", "Salesforce/wikitext", *flags])
    assert not output_dir.exists()


BAD_FLAGS = [
    (["--model_size", "huge"], "invalid choice"),
    (["--objective", "nsp"], "invalid choice"),
]


@pytest.mark.parametrize(("flags", "message"), BAD_FLAGS)
def test_bad_flags_are_refused(flags, message, capsys):
    with pytest.raises((ValueError, SystemExit)) as error:
        main(["--output_dir", "unused", *flags])
    assert message in str(error.value) + capsys.readouterr().err


# ----------------------------------------------------------------------------------------------- units


# ----------------------------------------------------------------------------------------------- faults


@pytest.mark.slow
def test_a_batch_with_no_masked_token_trains_instead_of_stopping_on_nan(tmp_path, run_inputs):
    # Masking 2% of 2 x 16 tokens leaves most batches with nothing to predict: the MLM loss must count as zero
    # (NSP still trains), not NaN that stops the run (and stops it again on every resume).
    output_dir = tmp_path / "run"
    args = run_args(run_inputs, output_dir, "--max_train_steps", "6", "--per_device_train_batch_size", "2")
    args += ["--max_seq_length", "16", "--mlm_probability", "0.02", "--checkpointing_steps", "1"]
    train_in_process(args)
    history = json.loads((output_dir / "log_history.json").read_text())
    assert all(math.isfinite(row["loss"]) for row in history if "loss" in row)


@pytest.mark.slow
@pytest.mark.parametrize("learning_rate", ["1e4", "1e9"])
def test_a_diverging_run_keeps_its_last_finite_checkpoint_and_names_it(tmp_path, run_inputs, learning_rate):
    """Issue 64: the loss is read at logging steps only, so NaN weights were checkpointed every update and
    --checkpoints_total_limit rotated every finite checkpoint away."""
    output_dir = tmp_path / "run"
    args = run_args(run_inputs, output_dir, "--max_train_steps", "8", "--checkpointing_steps", "1")
    args += ["--checkpoints_total_limit", "2", "--eval_steps", "8", "--num_warmup_steps", "8", "--max_grad_norm", "0"]
    args[args.index("--learning_rate") + 1] = learning_rate
    args[args.index("--logging_steps") + 1] = "8"
    with pytest.raises(RunFailure) as stopped:
        train_in_process(args)
    kept = sorted(output_dir.glob("checkpoint-*"), key=lambda path: int(path.name.split("-")[1]))
    assert kept, "no checkpoint kept"
    for checkpoint in kept:
        weights = load_file(checkpoint / "model.safetensors")
        assert all(bool(tensor.isfinite().all()) for tensor in weights.values()), checkpoint.name
    assert f"The last checkpoint whose weights are all finite is {kept[-1]} " in str(stopped.value)


@pytest.mark.slow
def test_weights_that_diverge_at_the_last_update_write_no_final_folder(tmp_path, run_inputs):
    """The final folder is written only from finite weights too: NaN after the last update was published, exit 0."""
    from torch.optim.optimizer import register_optimizer_step_post_hook

    from benchmarks.diverging_pretraining import diverge_after

    output_dir = tmp_path / "run"
    hook = register_optimizer_step_post_hook(diverge_after(4))
    try:
        with pytest.raises(RunFailure, match=r"^The weights became non-finite .* at step 4 .* is .*checkpoint-3 "):
            train_in_process(run_args(run_inputs, output_dir, "--max_train_steps", "4", "--checkpointing_steps", "3"))
    finally:
        hook.remove()
    assert sorted(path.name for path in output_dir.iterdir()) == ["checkpoint-3"]


@pytest.mark.slow
def test_a_run_resumed_into_a_new_folder_that_diverges_names_the_checkpoint_it_resumed(tmp_path, run_inputs):
    """The sixth attack (9c5ba80), G6: resumed from another folder's checkpoint-3 into a new --output_dir, a run
    diverging before its first checkpoint named no finite checkpoint (only the new folder was looked in)."""
    from torch.optim.optimizer import register_optimizer_step_post_hook

    from benchmarks.diverging_pretraining import diverge_after

    first, second = tmp_path / "first", tmp_path / "second"
    train_in_process(run_args(run_inputs, first, "--max_train_steps", "6", "--checkpointing_steps", "3"))
    hook = register_optimizer_step_post_hook(diverge_after(2))  # update 5, before the resumed run's checkpoint
    try:
        with pytest.raises(RunFailure) as stopped:
            args = run_args(run_inputs, second, "--max_train_steps", "6", "--checkpointing_steps", "6")
            train_in_process([*args, "--resume_from_checkpoint", str(first / "checkpoint-3")])
    finally:
        hook.remove()
    assert f"The last checkpoint whose weights are all finite is {first / 'checkpoint-3'} " in str(stopped.value)


def test_an_output_dir_that_is_a_file_is_refused_before_any_work(tmp_path, run_inputs):
    output_file = tmp_path / "run"
    output_file.write_text("not a folder")
    with pytest.raises(CheckpointError, match=r"--output_dir .*run is a file, not a folder"):
        train_in_process(run_args(run_inputs, output_file, "--max_train_steps", "2"))
    assert output_file.read_text() == "not a folder"


def test_a_second_run_on_a_folder_in_use_is_refused_before_any_work(tmp_path, run_inputs):
    output_dir = tmp_path / "run"
    with run_folder_lock(output_dir):  # this process plays the first run
        (output_dir / ".tmp-checkpoint-2").mkdir()  # the first run is mid-save
        before = listing(output_dir)
        with pytest.raises(CheckpointError, match=rf"{re.escape(str(output_dir))} is in use .*pid {os.getpid()} on host"):
            train_in_process(run_args(run_inputs, output_dir, "--max_train_steps", "2"))
        assert listing(output_dir) == before
    train_in_process(run_args(run_inputs, output_dir, "--max_train_steps", "2", "--overwrite_output_dir"))
    assert (output_dir / "model.safetensors").is_file() and not (output_dir / RUN_LOCK_NAME).exists()


def test_a_run_puts_back_a_checkpoint_that_a_crash_left_parked_before_it_checks_the_folder(tmp_path, run_inputs):
    """A same-step save killed between its two renames leaves no checkpoint-2, only the parked copy: the run
    holding the folder puts it back first, so the folder is refused as the run it holds, with that fix."""
    output_dir = tmp_path / "run"
    (output_dir / ".replaced-checkpoint-2").mkdir(parents=True)
    manifest = {"format_version": 1, "step": 2, "num_processes": 1, "files": {}}  # whole: it lists every file
    (output_dir / ".replaced-checkpoint-2" / "checkpoint_manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(CheckpointError, match=r"already holds another run's output \(checkpoint-2\)"):
        train_in_process(run_args(run_inputs, output_dir, "--max_train_steps", "2"))
    assert sorted(path.name for path in output_dir.iterdir()) == ["checkpoint-2"]


def test_a_folder_of_the_users_own_files_is_refused_untouched(tmp_path, run_inputs):
    output_dir = tmp_path / "mine"
    output_dir.mkdir()
    (output_dir / "README.md").write_text("my notes")
    (output_dir / "tokenizer.json").write_text("{}")
    before = listing(output_dir)
    with pytest.raises(CheckpointError, match=r"not empty and holds no hfbert run \(README.md, tokenizer.json\); pass a new"):
        train_in_process(run_args(run_inputs, output_dir, "--max_train_steps", "2"))
    with pytest.raises(CheckpointError, match=r"hfbert wrote in .*, and it also holds README.md, tokenizer.json: move"):
        train_in_process(run_args(run_inputs, output_dir, "--max_train_steps", "2", "--overwrite_output_dir"))
    assert listing(output_dir) == before and (output_dir / "README.md").read_text() == "my notes"


@pytest.mark.slow
def test_overwrite_output_dir_replaces_an_earlier_run_and_refuses_what_else_the_folder_holds(tmp_path, run_inputs, finished_run):
    """Issue 64, item 2: --overwrite_output_dir deleted a Trainer's checkpoint-7 and replaced the user's
    README.md and config.json; now it replaces what hfbert wrote and nothing else."""
    output_dir = copy_of(finished_run, tmp_path / "run")
    args = run_args(run_inputs, output_dir, "--max_train_steps", "2", "--checkpointing_steps", "2")
    (output_dir / "checkpoint-2" / "checkpoint_manifest.json").rename(output_dir / "kept-manifest.json")
    for name in ("checkpoint-2", "kept-manifest.json"):
        with pytest.raises(CheckpointError, match=rf"hfbert wrote in .*, and it also holds {name}"):
            train_in_process([*args, "--overwrite_output_dir"])
        if name == "checkpoint-2":
            (output_dir / "kept-manifest.json").rename(output_dir / "checkpoint-2" / "checkpoint_manifest.json")
            (output_dir / "kept-manifest.json").write_text("mine")
    (output_dir / "kept-manifest.json").unlink()
    train_in_process([*args, "--overwrite_output_dir"])  # the earlier run, all of it hfbert's: replaced
    assert {path.name for path in output_dir.iterdir()} >= FINAL_FILES | {"checkpoint-2"}


def test_a_run_killed_during_its_first_save_points_to_a_way_out(tmp_path, run_inputs):
    output_dir = tmp_path / "run"
    (output_dir / ".tmp-checkpoint-3").mkdir(parents=True)
    (output_dir / ".tokenizer").mkdir()
    for extra in ([], ["--resume_from_checkpoint", "latest"]):  # started again or resumed: the same way out
        with pytest.raises(CheckpointError, match=r"no complete checkpoint.*--overwrite_output_dir"):
            train_in_process(run_args(run_inputs, output_dir, "--max_train_steps", "2", *extra))
    train_in_process(run_args(run_inputs, output_dir, "--max_train_steps", "2", "--overwrite_output_dir"))
    assert (output_dir / "model.safetensors").is_file() and not (output_dir / ".tmp-checkpoint-3").exists()



def test_a_read_only_output_dir_is_named_before_any_work(read_only_folder, run_inputs):
    with pytest.raises(ValueError, match=rf"--output_dir {read_only_folder} cannot be written.*write to"):
        train_in_process(run_args(run_inputs, read_only_folder, "--max_train_steps", "2"))


def test_a_max_seq_length_beyond_the_position_embeddings_is_refused_before_a_tokenizer_is_trained(tmp_path, run_inputs):
    args = run_args(run_inputs, tmp_path / "run", "--max_train_steps", "2", "--max_seq_length", "256")
    del args[args.index("--tokenizer_name") : args.index("--tokenizer_name") + 2]  # would train one into .tokenizer
    with pytest.raises(ValueError, match=r"--max_seq_length 256 exceeds the max_position_embeddings 128 of --config_name"):
        train_in_process(args)
    assert not (tmp_path / "run").exists()


def test_a_full_disk_at_the_final_save_names_the_intact_checkpoint_and_the_resume_finishes(tmp_path, run_inputs):
    output_dir = tmp_path / "run"
    args = run_args(run_inputs, output_dir, "--max_train_steps", "2", "--checkpointing_steps", "2")

    def full_disk(self, folder, **kwargs):  # safetensors' own error: no OSError
        (Path(folder) / "model.safetensors").write_bytes(b"\0" * 100)
        raise SafetensorError("Error while serializing: I/O error: No space left on device (os error 28)")

    with mock.patch.object(HfBertForPreTraining, "save_pretrained", full_disk), pytest.raises(RunFailure) as error:
        train_in_process(args)
    assert str(error.value).startswith(
        f"no space left writing {output_dir}; the last complete checkpoint {output_dir / 'checkpoint-2'} is intact; "
        "free space"
    )
    assert str(error.value).endswith("resume with the same command plus --resume_from_checkpoint latest")
    assert sorted(path.name for path in output_dir.iterdir()) == ["checkpoint-2"]
    train_in_process([*args, "--resume_from_checkpoint", "latest", "--eval_steps", "1"])
    assert evaluated_steps(output_dir) == [2]  # no update ran again, only the final evaluation
    expected, actual = load_file(output_dir / "checkpoint-2" / "model.safetensors"), final_weights(output_dir)
    assert expected.keys() == actual.keys()
    for name, tensor in expected.items():  # the final folder holds the checkpoint's weights
        assert torch.equal(actual[name], tensor), name


@pytest.mark.slow
def test_resuming_into_a_folder_of_another_finished_run_is_refused_untouched(tmp_path, run_inputs, finished_run):
    first, finished = finished_run, copy_of(finished_run, tmp_path / "B", checkpoints=False)
    before = listing(finished)
    resume = ["--resume_from_checkpoint", str(first / "checkpoint-2")]
    with pytest.raises(CheckpointError, match=rf"--output_dir {finished} already holds another run \(.*model.safetensors"):
        train_in_process(run_args(run_inputs, finished, "--max_train_steps", "2", *resume))
    assert listing(finished) == before


def test_one_auto_command_starts_a_run_interrupted_during_data_preparation_and_then_resumes_it(tmp_path, run_inputs, caplog):
    output_dir = tmp_path / "run"
    (output_dir / ".tokenizer").mkdir(parents=True)  # SIGTERM while preparing data: no checkpoint yet
    crashed = {"pid": 999999, "host": "node-7", "started": "2026-11-24 03:16:19 UTC"}  # as a killed run left it
    (output_dir / RUN_LOCK_NAME).write_text(json.dumps(crashed) + "\n")
    args = run_args(run_inputs, output_dir, "--max_train_steps", "2", "--checkpointing_steps", "2")
    args += ["--resume_from_checkpoint", "auto"]
    train_in_process(args)
    assert (output_dir / "model.safetensors").is_file() and "Resuming from" not in caplog.text
    train_in_process(args)  # the requeued job: the same command resumes the newest checkpoint
    assert f"Resuming from {output_dir / 'checkpoint-2'}" in caplog.text


@pytest.fixture
def tiny_disk(tmp_path):
    """A 1.2 MB tmpfs (root only; skipped elsewhere): room for one tiny checkpoint, not two."""
    disk = tmp_path / "disk"
    disk.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1200k", "tmpfs", str(disk)], capture_output=True).returncode:
        pytest.skip("cannot mount a tmpfs here (needs root)")
    yield disk
    gc.collect()  # a run that failed in this process: the frames of its traceback hold its open files there
    subprocess.run(["umount", str(disk)], check=True)


@pytest.mark.slow
def test_a_really_full_disk_while_checkpointing_names_the_intact_checkpoint(tmp_path, run_inputs, tiny_disk):
    # torch.save reports it as "unexpected pos 138880 vs 138768", naming no full disk: the free space tells.
    output_dir = tiny_disk / "run"
    args = run_args(run_inputs, output_dir, "--max_train_steps", "6", "--checkpointing_steps", "2")
    with pytest.raises(RunFailure) as failed:  # the entry point's exit code 1
        train_in_process(args)
    assert (
        f"no space left writing {output_dir / 'checkpoint-4'}; the last complete checkpoint "
        f"{output_dir / 'checkpoint-2'} is intact; free space"
    ) in str(failed.value)
    assert sorted(path.name for path in output_dir.iterdir()) == ["checkpoint-2"]

@pytest.mark.slow
def test_changed_flags_on_resume_are_refused_naming_both_values(tmp_path, run_inputs, finished_run):
    output_dir = copy_of(finished_run, tmp_path / "run")
    before = listing(output_dir)
    changed = run_args(run_inputs, output_dir, *FINISHED_RUN, "--resume_from_checkpoint", "latest")
    changed[changed.index("--learning_rate") + 1] = "5e-4"
    changed[changed.index("--per_device_train_batch_size") + 1] = "4"
    with pytest.raises(ValueError, match=r"--learning_rate 0.001 in the checkpoint, 0.0005 now") as error:
        train_in_process(changed)
    assert "--per_device_train_batch_size 8 in the checkpoint, 4 now" in str(error.value)
    assert listing(output_dir) == before



@pytest.mark.slow
def test_a_corpus_edited_before_the_resume_is_refused_naming_it(tmp_path, run_inputs):
    from hfbert.corpus_arguments import SHIPPED_SAMPLE_DIR, SHIPPED_SAMPLE_FILES

    corpus = {split: tmp_path / name for split, name in SHIPPED_SAMPLE_FILES.items()}
    for split, path in corpus.items():
        shutil.copy(SHIPPED_SAMPLE_DIR / SHIPPED_SAMPLE_FILES[split], path)
    output_dir = tmp_path / "run"
    args = run_args(run_inputs, output_dir, "--max_train_steps", "4", "--checkpointing_steps", "2")
    args += ["--train_file", str(corpus["train"]), "--validation_file", str(corpus["validation"])]
    train_in_process(args)
    corpus["train"].write_text(corpus["train"].read_text().replace(" the ", " a "))
    before = listing(output_dir)
    with pytest.raises(ValueError, match=rf"the corpus \({corpus['train']}, {corpus['validation']}\) has changed"):
        train_in_process([*args, "--resume_from_checkpoint", "latest"])
    assert listing(output_dir) == before


@pytest.mark.slow
def test_a_corpus_edited_while_the_run_trains_is_recorded_as_read_and_the_resume_on_the_edit_refused(
    tmp_path, run_inputs, monkeypatch
):
    """Issue 64, item 5: the fingerprint was taken when a checkpoint was written, so text edited mid-run was
    recorded as what trained, and the resume on it was accepted (2.4e-4 from the straight run)."""
    from hfbert.corpus_arguments import SHIPPED_SAMPLE_DIR, SHIPPED_SAMPLE_FILES
    from hfbert.pretraining import run

    corpus = tmp_path / "train.raw"
    shutil.copy(SHIPPED_SAMPLE_DIR / SHIPPED_SAMPLE_FILES["train"], corpus)
    read_then_edited = run.prepare_run_data

    def prepare_then_edit(*args, **kwargs):
        data = read_then_edited(*args, **kwargs)
        corpus.write_text(corpus.read_text().replace(" the ", " a "))  # after the run read it
        return data

    monkeypatch.setattr(run, "prepare_run_data", prepare_then_edit)
    output_dir = tmp_path / "run"
    args = run_args(run_inputs, output_dir, "--max_train_steps", "4", "--checkpointing_steps", "2")
    args += ["--train_file", str(corpus), "--validation_file", str(SHIPPED_SAMPLE_DIR / SHIPPED_SAMPLE_FILES["validation"])]
    train_in_process(args)
    monkeypatch.undo()
    before = listing(output_dir)
    with pytest.raises(ValueError, match=rf"the corpus \({corpus}, .*\) has changed since the checkpoint was written"):
        train_in_process([*args, "--resume_from_checkpoint", "latest"])
    assert listing(output_dir) == before


def datasets_cache_files() -> set[Path]:
    return set(Path(os.environ["HF_DATASETS_CACHE"]).rglob("cache-*.arrow"))


@pytest.mark.slow
def test_a_resume_and_a_second_identical_run_reuse_the_preprocessing_cache(tmp_path, run_inputs, finished_run):
    # The resume loads its tokenizer from checkpoint-2, another folder than --tokenizer_name.
    after_first = datasets_cache_files()  # finished_run's among them
    resume = run_args(run_inputs, tmp_path / "resumed", "--max_train_steps", "4")
    train_in_process([*resume, "--resume_from_checkpoint", str(finished_run / "checkpoint-2")])
    assert datasets_cache_files() == after_first
    train_in_process(run_args(run_inputs, tmp_path / "second", "--max_train_steps", "2"))
    assert datasets_cache_files() == after_first


@pytest.mark.slow
def test_resume_into_a_new_folder_uses_the_checkpoints_own_tokenizer(tmp_path, run_inputs, finished_run):
    first = finished_run
    saved_vocab = json.loads((first / "checkpoint-2" / "tokenizer.json").read_text())["model"]["vocab"]
    # Without --tokenizer_name a fresh run would train a new tokenizer; a resumed one must use its checkpoint's.
    args = run_args(run_inputs, tmp_path / "second", "--max_train_steps", "4")
    del args[args.index("--tokenizer_name") : args.index("--tokenizer_name") + 2]
    args += ["--resume_from_checkpoint", str(first / "checkpoint-2")]
    train_in_process(args)
    final_vocab = json.loads((tmp_path / "second" / "tokenizer.json").read_text())["model"]["vocab"]
    assert final_vocab == saved_vocab


def test_push_is_checked_before_any_work(tmp_path, run_inputs, monkeypatch):
    output_dir = tmp_path / "run"
    push = ["--max_train_steps", "2", "--push_to_hub", "--hub_model_id", "me/m"]
    with pytest.raises(ValueError, match=r"--push_to_hub me/m: the Hub cannot be used.*python -m hfbert.push"):
        train_in_process(run_args(run_inputs, output_dir, *push))
    assert not output_dir.exists()


def test_a_missing_tokenizer_folder_is_named_before_any_work(tmp_path, run_inputs):
    args = run_args(run_inputs, tmp_path / "run", "--max_train_steps", "2")
    args[args.index("--tokenizer_name") + 1] = str(tmp_path / "no-such-tokenizer")
    with pytest.raises(ValueError, match=r"--tokenizer_name .*no-such-tokenizer: no such folder"):
        train_in_process(args)
    assert not (tmp_path / "run").exists()


def test_a_corpus_too_small_to_split_names_the_flags(tmp_path, run_inputs):
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("\n\n".join(f"Document {i} has one sentence. And another one here." for i in range(3)))
    args = run_args(run_inputs, tmp_path / "run", "--max_train_steps", "2", "--train_file", str(corpus))
    with pytest.raises(ValueError, match=r"the training corpus has 3 documents .*cannot be split.*--validation_file"):
        train_in_process(args)
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("whole_word_masking", [False, True])
def test_static_shape_masking_trains_through_the_loop(tmp_path, run_inputs, whole_word_masking):
    output_dir = tmp_path / "run"
    extra = ["--whole_word_masking"] if whole_word_masking else []
    train_in_process(
        run_args(run_inputs, output_dir, "--max_train_steps", "2", "--max_predictions_per_seq", "20", *extra)
    )
    rows = [row for row in json.loads((output_dir / "log_history.json").read_text()) if "loss" in row]
    assert rows and all(math.isfinite(row["train_mlm_loss"]) and row["train_mlm_accuracy"] >= 0 for row in rows)
    recorded = json.loads((output_dir / "training_args.json").read_text())
    assert recorded["max_predictions_per_seq"] == 20 and recorded["whole_word_masking"] is whole_word_masking


@pytest.mark.slow
def test_the_mlm_objective_trains_masked_lm_alone_and_saves_the_nsp_head(tmp_path, run_inputs):
    output_dir = tmp_path / "run"
    train_in_process(run_args(run_inputs, output_dir, "--max_train_steps", "4", "--objective", "mlm", "--checkpointing_steps", "2"))
    rows = json.loads((output_dir / "log_history.json").read_text())
    trained = [row for row in rows if "loss" in row]
    assert trained and all(math.isclose(row["loss"], row["train_mlm_loss"], rel_tol=1e-3) for row in trained)
    assert not [key for row in rows for key in row if "nsp" in key]
    assert "eval_mlm_accuracy" in rows[-1]
    assert json.loads((output_dir / "training_args.json").read_text())["objective"] == "mlm"
    # The NSP head is saved, unchanged by training (no loss reaches it); the MLM head trained.
    early, final = final_weights(output_dir / "checkpoint-2"), final_weights(output_dir)
    assert torch.equal(early["cls.seq_relationship.weight"], final["cls.seq_relationship.weight"])
    assert not torch.equal(early["cls.predictions.transform.dense.weight"], final["cls.predictions.transform.dense.weight"])


def start_and_signal(tmp_path: Path, args: list[str], after_update: int, send: Callable[[subprocess.Popen], None]) -> tuple[int, str]:
    """Start run_pretraining.py in a session (process group) of its own, call `send` once its progress bar
    shows `after_update` updates or more; return its exit status and stderr. At or past, not equal: tqdm
    redraws at most every 0.1 s, so a fast run's bar skips counts (waiting for "| 3/" missed it 2 runs in 3)."""
    stderr = tmp_path / "stderr.txt"
    with stderr.open("w") as sink:
        process = subprocess.Popen(
            [sys.executable, str(REPO / "run_pretraining.py"), *args],
            env=subprocess_env(), cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=sink, start_new_session=True,
        )  # fmt: skip
        deadline = time.monotonic() + 240
        while max(map(int, re.findall(r"pretraining: [^|]*\|[^|]*\| (\d+)/", stderr.read_text())), default=0) < after_update:
            assert process.poll() is None, stderr.read_text()[-3000:]
            assert time.monotonic() < deadline, f"not {after_update} updates within 240 s"
            time.sleep(0.05)
        send(process)
        returncode = process.wait(timeout=120)
    return returncode, stderr.read_text()


def resumed_equals_uninterrupted(tmp_path: Path, args: list[str], extra: tuple[str, ...] = ()) -> int:
    """Resume the stopped run in args' --output_dir (its one checkpoint) 3 updates further, train the same
    budget straight into another folder, assert equal weights; returns the step the run had stopped at."""
    output_dir = Path(args[args.index("--output_dir") + 1])
    (checkpoint,) = output_dir.glob("checkpoint-*")
    stopped_at = int(checkpoint.name.split("-")[1])
    budget = ["--max_train_steps", str(stopped_at + 3)]
    train_in_process([*args, *budget, *extra, "--resume_from_checkpoint", "latest", "--eval_steps", "1"])
    assert evaluated_steps(output_dir) == [stopped_at + 1, stopped_at + 2, stopped_at + 3]  # after the resume
    straight = [*args, *budget, *extra]
    straight[straight.index("--output_dir") + 1] = str(tmp_path / "uninterrupted")
    train_in_process(straight)
    expected, actual = final_weights(tmp_path / "uninterrupted"), final_weights(output_dir)
    for name, tensor in expected.items():
        assert torch.equal(actual[name], tensor), name
    return stopped_at


@pytest.mark.slow
def test_sigterm_saves_a_checkpoint_and_the_resumed_run_equals_an_uninterrupted_one(tmp_path, run_inputs):
    output_dir = tmp_path / "run"
    # A constant schedule, so that the resumed run may stop at a budget chosen after the signal.
    args = run_args(run_inputs, output_dir, "--lr_scheduler_type", "constant", "--eval_steps", "1000", *EXACT)

    def two_signals(process):
        # Two signals at once: the first one handled stops the run, the other changes nothing (which comes
        # first is a race: Python runs pending handlers in signal-number order).
        process.send_signal(signal.SIGTERM)
        process.send_signal(signal.SIGUSR1)

    returncode, message = start_and_signal(tmp_path, [*args, "--max_train_steps", "100000"], 2, two_signals)
    assert returncode in (128 + signal.SIGTERM, 128 + signal.SIGUSR1), returncode
    first = signal.Signals(returncode - 128)
    assert f"Stopped by {first.name} after update" in message and "--resume_from_checkpoint latest" in message
    assert not (output_dir / "model.safetensors").exists()
    assert resumed_equals_uninterrupted(tmp_path, args) >= 2


@pytest.mark.slow
def test_sigterm_to_the_whole_process_group_with_dataloader_workers_saves_a_checkpoint(tmp_path, run_inputs):
    # Slurm and `kill -TERM -- -PGID` signal every process of the job, DataLoader workers too; a worker
    # killed by it made the loop fail with "DataLoader worker (pid N) is killed by signal: Terminated".
    output_dir = tmp_path / "run"
    args = run_args(run_inputs, output_dir, "--lr_scheduler_type", "constant", "--eval_steps", "1000", *EXACT)
    workers = ("--dataloader_num_workers", "2")
    returncode, message = start_and_signal(
        tmp_path,
        [*args, *workers, "--max_train_steps", "100000"],
        2,
        lambda process: os.killpg(process.pid, signal.SIGTERM),
    )
    assert returncode == 128 + signal.SIGTERM, message[-3000:]
    assert "Stopped by SIGTERM after update" in message and "--resume_from_checkpoint latest" in message
    resumed_equals_uninterrupted(tmp_path, args, workers)



@pytest.fixture
def unhandled_signals_fail():
    """SIGTERM and SIGINT that reach this process while no run handles them fail the test, instead of ending
    pytest (SIGTERM) or the whole session (SIGINT); every run puts these handlers back when it ends."""

    def fail(signal_number, frame):
        raise AssertionError(f"{signal.Signals(signal_number).name} reached the test process unhandled")

    previous = {number: signal.signal(number, fail) for number in (signal.SIGTERM, signal.SIGINT)}
    yield fail
    for number, handler in previous.items():
        signal.signal(number, handler)


def signal_first(monkeypatch, module, name: str, signal_name: str) -> None:
    """`module.name` first sends this process `signal_name`: a signal that arrives exactly there. In this
    process: a run sent a signal by itself is what a launch sent one there would be, less the interpreter's start."""
    original = getattr(module, name)

    def signalling_first(*args, **kwargs):
        os.kill(os.getpid(), signal.Signals[signal_name])
        return original(*args, **kwargs)

    monkeypatch.setattr(module, name, signalling_first)


@pytest.mark.slow
@pytest.mark.parametrize("signal_name", ["SIGTERM", "SIGINT"])
def test_a_signal_during_the_final_evaluation_leaves_a_checkpoint_to_resume(
    tmp_path, run_inputs, signal_name, monkeypatch, capsys, unhandled_signals_fail
):
    from hfbert.pretraining import loop

    # Only the final evaluation: --eval_steps beyond the budget. Without --checkpointing_steps, too.
    output_dir = tmp_path / "run"
    args = run_args(run_inputs, output_dir, "--max_train_steps", "3", "--eval_steps", "1000", *EXACT)
    with monkeypatch.context() as patched:
        signal_first(patched, loop, "run_evaluation", signal_name)
        with pytest.raises(SystemExit) as stopped:
            train_in_process(args)
    stderr = capsys.readouterr().err
    assert stopped.value.code == 128 + signal.Signals[signal_name], stderr[-3000:]
    assert f"Stopped by {signal_name} after update 3; the training state is saved in {output_dir / 'checkpoint-3'}" in stderr
    assert "--resume_from_checkpoint latest" in stderr
    assert not (output_dir / "model.safetensors").exists()
    if signal_name == "SIGTERM":  # the resumed run goes straight to the final evaluation and save
        train_in_process([*args, "--resume_from_checkpoint", "latest", "--eval_steps", "1"])
        # No update ran again: 1 and 2 not evaluated (3 twice: the stopped run's row is in the checkpoint).
        assert set(evaluated_steps(output_dir)) == {3}
        straight = run_args(run_inputs, tmp_path / "straight", "--max_train_steps", "3", "--eval_steps", "1000", *EXACT)
        train_in_process(straight)
        expected, actual = final_weights(tmp_path / "straight"), final_weights(output_dir)
        assert all(torch.equal(actual[name], tensor) for name, tensor in expected.items())


@pytest.mark.slow
def test_a_signal_during_the_final_save_lets_it_finish(tmp_path, run_inputs, monkeypatch, unhandled_signals_fail):
    from hfbert.pretraining import run

    output_dir = tmp_path / "run"
    signal_first(monkeypatch, run, "write_final_folder", "SIGTERM")
    train_in_process(run_args(run_inputs, output_dir, "--max_train_steps", "2"))  # returns: no exit, no SystemExit
    assert {path.name for path in output_dir.iterdir()} >= FINAL_FILES


SIX_UPDATES = ("--max_train_steps", "6", "--eval_steps", "1000", *EXACT)


@pytest.fixture(scope="module")
def six_updates_straight(tmp_path_factory, run_inputs) -> Path:
    """An uninterrupted run of SIX_UPDATES, which the runs stopped and resumed in this process end equal to."""
    output_dir = tmp_path_factory.mktemp("straight") / "run"
    train_in_process(run_args(run_inputs, output_dir, *SIX_UPDATES))
    return output_dir


@pytest.mark.parametrize("checkpointing_steps", [None, "2"])
def test_a_signal_in_this_process_stops_after_its_update_with_a_checkpoint_and_the_resume_is_exact(
    tmp_path, run_inputs, monkeypatch, capsys, checkpointing_steps, six_updates_straight
):
    """The preemption path in-process (the subprocess tests above cover real launches), so that mutation
    testing of loop.py maps it: SIGUSR1 during update 4 stops after update 4, with checkpoint-4 (written for
    the stop, or the scheduled one at 4) and no final folder; the resume runs updates 5 and 6 only and equals
    a straight run."""
    from hfbert.pretraining.training import Training

    step = Training.step

    def signal_during_update_4(training, *rest, **kwargs):
        if training.progress.completed_steps == 3:
            os.kill(os.getpid(), signal.SIGUSR1)
        return step(training, *rest, **kwargs)

    output_dir = tmp_path / "run"
    args = run_args(run_inputs, output_dir, *SIX_UPDATES)
    if checkpointing_steps is not None:
        args += ["--checkpointing_steps", checkpointing_steps]
    with monkeypatch.context() as patched:
        patched.setattr(Training, "step", signal_during_update_4)
        with pytest.raises(SystemExit) as stopped:
            train_in_process(args)
    assert stopped.value.code == 128 + signal.SIGUSR1
    assert (
        f"Stopped by SIGUSR1 after update 4; the training state is saved in {output_dir / 'checkpoint-4'}. "
        "Resume with the same command plus --resume_from_checkpoint latest." in capsys.readouterr().err
    )
    expected = ["checkpoint-4"] if checkpointing_steps is None else ["checkpoint-2", "checkpoint-4"]
    assert sorted(path.name for path in output_dir.glob("checkpoint-*")) == expected
    assert not (output_dir / "model.safetensors").exists()
    assert signal.getsignal(signal.SIGUSR1) is signal.SIG_DFL  # the handlers the run found are back
    train_in_process([*args, "--resume_from_checkpoint", "latest", "--eval_steps", "1"])
    assert evaluated_steps(output_dir) == [5, 6]
    straight, resumed = final_weights(six_updates_straight), final_weights(output_dir)
    assert straight.keys() == resumed.keys()
    assert all(torch.equal(resumed[name], tensor) for name, tensor in straight.items())

@pytest.mark.slow
def test_compiled_training_and_evaluation_compile_once_without_graph_breaks(tmp_path, run_inputs):
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()
    output_dir = tmp_path / "run"
    compiled = ("--max_train_steps", "6", "--eval_steps", "2", "--checkpointing_steps", "3", "--torch_compile")
    train_in_process(run_args(run_inputs, output_dir, *compiled))
    assert not counters["graph_break"], dict(counters["graph_break"])
    # One graph for training, one for evaluation (eval mode, no grad), one for clipping; evaluations 2 and 3 and
    # the training steps after each evaluation reuse them.
    assert counters["stats"]["unique_graphs"] == 3, dict(counters["stats"])
    summary = json.loads((output_dir / "training_args.json").read_text())
    assert summary["static_masked_slots"] == 32
    assert summary["model_class"] == "HfBertForPreTraining"  # the model, not torch.compile's wrapper
    history = json.loads((output_dir / "log_history.json").read_text())
    evaluations = [row for row in history if "eval_mlm_loss" in row]
    assert [row["step"] for row in evaluations] == [2, 4, 6]
    # The compile time, once: in the first training row after the second update (logging every 2 updates).
    assert [row["step"] for row in history if "compile_seconds" in row] == [2]
    assert next(row["compile_seconds"] for row in history if "compile_seconds" in row) > 1.0
    assert all(math.isfinite(row["eval_mlm_loss"]) for row in evaluations)
    # Checkpoint and final folder name the model's own parameters, not the compiled wrapper's "_orig_mod.*",
    # which from_pretrained would not load.
    expected = set(final_weights(output_dir))
    assert not any("_orig_mod" in name for name in expected)
    assert set(load_file(output_dir / "checkpoint-6" / "model.safetensors")) == expected


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("torch_compile", ["false", "true"], ids=["eager", "compiled"])
def test_cuda_training_steps_never_wait_for_the_device(tmp_path, run_inputs, monkeypatch, torch_compile):
    """Every update but the logging ones and the first (which compiles: autotuning waits for the device) runs
    under torch.cuda.set_sync_debug_mode("error"): any host synchronisation raises (loader, step, clipping, the
    fp16 scaler, optimizer, window statistics)."""
    from hfbert.pretraining import training

    def strict(function):
        calls = []

        def run_strictly(*args, **kwargs):
            calls.append(None)
            if len(calls) == 1:
                return function(*args, **kwargs)
            torch.cuda.set_sync_debug_mode("error")
            try:
                return function(*args, **kwargs)
            finally:
                torch.cuda.set_sync_debug_mode("default")

        return run_strictly

    monkeypatch.setattr(training.Training, "step", strict(training.Training.step))
    monkeypatch.setattr(training.LogInterval, "add", strict(training.LogInterval.add))
    output_dir = tmp_path / "run"
    # The last value of a repeated flag wins: the precision CUDA picks (fp16), logging every 3 updates.
    extra = ("--max_train_steps", "6", "--mixed_precision", "auto", "--logging_steps", "3")
    extra += ("--torch_compile", torch_compile)
    train_in_process(run_args(run_inputs, output_dir, *extra))
    summary = json.loads((output_dir / "training_args.json").read_text())
    assert summary["precision"] == "fp16" and summary["static_masked_slots"] == 32


def logged_losses(folder: Path) -> dict[tuple[int, str], float]:
    """Training and held-out losses in log_history.json by (update, name)."""
    rows = json.loads((folder / "log_history.json").read_text())
    names = ("loss", "eval_mlm_loss", "eval_nsp_loss")
    return {(row["step"], name): row[name] for row in rows for name in names if name in row}


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_graphs_train_evaluate_checkpoint_and_resume_as_the_default_compile_does(tmp_path, run_inputs):
    """--torch_compile_mode reduce-overhead replays CUDA graphs, which reuse their inputs' and outputs' memory:
    a batch not copied in, a loss read after the next replay, or a graph kept across an evaluation would show
    here as losses, evaluations or weights apart from the default compile's (fp16, the CUDA default). Its
    resumed run ends where the straight one does, to the rounding two GPU runs differ by."""
    default, graphs, resumed = tmp_path / "default", tmp_path / "graphs", tmp_path / "resumed"
    common = ("--max_train_steps", "10", "--mixed_precision", "auto", "--torch_compile", "true",
              "--eval_steps", "4", "--checkpointing_steps", "5")  # fmt: skip
    train_in_process(run_args(run_inputs, default, *common))
    graphed = (*common, "--torch_compile_mode", "reduce-overhead")
    train_in_process(run_args(run_inputs, graphs, *graphed))
    resumed.mkdir()
    shutil.copytree(graphs / "checkpoint-5", resumed / "checkpoint-5")
    train_in_process(run_args(run_inputs, resumed, *graphed, "--resume_from_checkpoint", "latest"))
    expected, actual = logged_losses(default), logged_losses(graphs)
    assert expected.keys() == actual.keys() and (8, "eval_mlm_loss") in expected
    for key, loss in expected.items():
        assert math.isclose(actual[key], loss, rel_tol=2e-3, abs_tol=2e-3), (key, actual[key], loss)
    for other in (default, resumed):
        weights = final_weights(other)
        for name, tensor in final_weights(graphs).items():
            assert_close(weights[name], tensor, rtol=2e-3, atol=2e-3, msg=f"{other.name}: {name}")


def test_every_file_a_final_folder_publishes_is_recorded_byte_for_byte_and_named_for_a_lost_record(finished_run):
    """The record (`FINAL_RECORD`) holds each published file's size and sha256 (what a push uploads and a resume
    may replace), and `FINAL_FOLDER_NAMES` (what a folder whose record was lost pushes) names every one of them:
    the list is kept by the final folder itself."""
    from fnmatch import fnmatch

    from hfbert.files import FINAL_RECORD, not_as_published, recorded_final_files
    from hfbert.model_card import FINAL_FOLDER_NAMES

    record = json.loads((finished_run / FINAL_RECORD).read_text())
    assert set(record) == recorded_final_files(finished_run) and {"model.safetensors", "README.md"} <= set(record)
    assert all(set(entry) == {"size", "sha256"} for entry in record.values())
    assert not_as_published(finished_run, record) == []
    assert [name for name in record if not any(fnmatch(name, pattern) for pattern in FINAL_FOLDER_NAMES)] == []
