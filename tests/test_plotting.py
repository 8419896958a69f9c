import math
import struct

import pytest

from hfbert.plotting import plot_training_curves

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def png_size(path) -> tuple[int, int]:
    data = path.read_bytes()
    assert data[:8] == PNG_SIGNATURE
    assert data[12:16] == b"IHDR"
    assert data.rstrip(b"\x00").endswith(b"IEND\xaeB`\x82")  # complete file, not cut off
    return struct.unpack(">II", data[16:24])


def training_rows(steps: int) -> list[dict]:
    return [
        {
            "step": step,
            "loss": 8.0 * math.exp(-step / 40) + 1.0,
            "learning_rate": 1e-4 * min(1.0, step / 10),
            "train_mlm_loss": 7.0 * math.exp(-step / 40) + 1.0,
            "train_mlm_accuracy": 0.05 + step / 300,
            "train_nsp_loss": 0.69 - step / 300,
            "train_nsp_accuracy": 0.5 + step / 250,
        }
        for step in range(1, steps + 1)
    ]


def eval_rows(steps: list[int]) -> list[dict]:
    return [
        {
            "step": step,
            "eval_mlm_loss": 7.0 - step / 40,
            "eval_mlm_accuracy": 0.05 + step / 400,
            "eval_perplexity": math.exp(7.0 - step / 40),
            "eval_nsp_loss": 0.69 - step / 1000,
            "eval_nsp_accuracy": 0.5 + step / 1000,
        }
        for step in steps
    ]


def test_plot_with_training_and_eval_history(tmp_path):
    history = training_rows(100)
    history[50:50] = eval_rows([50])  # eval rows interleaved with training rows, as the loop logs them
    history += eval_rows([100])
    path = plot_training_curves(history, tmp_path / "training_curves.png")
    assert path == tmp_path / "training_curves.png"
    width, height = png_size(path)
    assert 1000 <= width <= 4000 and 200 <= height <= 1000
    assert path.stat().st_size > 20_000  # six panels with curves and text, not an empty canvas
    assert [p.name for p in tmp_path.iterdir()] == ["training_curves.png"]  # no temp file left


@pytest.mark.parametrize("history", [training_rows(5), []], ids=["no-eval", "empty"])
def test_plot_without_eval_history(tmp_path, history):
    path = plot_training_curves(history, tmp_path / "curves.png")
    assert png_size(path)[0] >= 1000


def test_plot_overwrites_previous_png(tmp_path):
    path = tmp_path / "training_curves.png"
    path.write_bytes(b"old")
    plot_training_curves(training_rows(3), path)
    assert png_size(path)[0] >= 1000
