"""benchmarks/bench_scaling.py's model of data-parallel efficiency, and its CPU measurement at a tiny size."""

from unittest import mock

import pytest

from benchmarks import bench_scaling


def test_the_gradient_bytes_are_every_parameter_once_in_fp32():
    # transformers' BertForPreTraining (bert-base-uncased, tied decoder) has 110,106,428 parameters.
    assert bench_scaling.gradient_bytes("base") == 4 * 110_106_428
    assert bench_scaling.gradient_bytes("large") > 3 * bench_scaling.gradient_bytes("base")
    assert 0 < bench_scaling.embedding_gradient_bytes("base") < bench_scaling.gradient_bytes("base") / 4


def test_a_ring_all_reduce_moves_2_n_minus_1_over_n_of_the_bytes_through_the_slowest_link():
    assert bench_scaling.ring_allreduce_seconds(450e9, 2) == pytest.approx(1.0)  # NVLink, one node
    assert bench_scaling.ring_allreduce_seconds(50e9, 64) == pytest.approx(2 * 63 / 64)  # InfiniBand across nodes


def test_efficiency_counts_what_the_backward_cannot_hide():
    assert bench_scaling.efficiency(step=3.0, allreduce=1.0) == pytest.approx(0.75)
    assert bench_scaling.efficiency(step=3.0, allreduce=1.0, last_bucket=0.5) == pytest.approx(3 / 3.5)
    assert bench_scaling.efficiency(step=3.0, allreduce=3.0, last_bucket=0.5) == pytest.approx(0.75)


def test_the_report_has_a_row_per_model_and_gpu_count():
    rows = bench_scaling.efficiency_rows(["base"], [8, 64])
    assert len(rows) == 4 and rows[2].startswith("| base | 440 | 52.6 | 8 | NVLink |")
    assert "| 64 | InfiniBand | 17.3 | 75% | 93% |" in rows[3]


@pytest.mark.slow
def test_main_measures_run_pretraining_per_process_count_and_reports_the_model(capsys):
    """The main path at its smallest: one process of 2 updates of 4 rows, then the efficiency table."""
    run = bench_scaling.subprocess.run
    with mock.patch.object(bench_scaling.subprocess, "run", side_effect=run) as launches:
        report = bench_scaling.main(
            ["--processes", "1", "--steps", "2", "--batch_size", "4", "--gpus", "8", "--sizes", "tiny"]
        )
    (command,) = [call.args[0] for call in launches.call_args_list]
    asked = {"--nproc_per_node": "1", "--per_device_train_batch_size": "4", "--max_train_steps": "2"}
    assert {flag: command[command.index(flag) + 1] for flag in asked} == asked, command
    assert list(report["tokens_per_second"]) == [1] and report["tokens_per_second"][1] > 0
    out = capsys.readouterr().out
    assert "run_pretraining.py, tiny, 4 rows per process, one thread each" in out
    assert f"| 1 | {report['tokens_per_second'][1]:,.0f} | 1.00x |" in out
    assert report["efficiency"] == bench_scaling.efficiency_rows(["tiny"], [8])
    assert "\n".join(report["efficiency"]) in out
