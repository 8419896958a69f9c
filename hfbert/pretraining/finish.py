"""The final folder of a run: model, tokenizer, metrics, curves, model card, written as one set.

Everything is staged first and published together (`hfbert.files.staged_files`), so a crash never
leaves a mix of an earlier run's files and this run's.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from hfbert.corpus import CorpusArguments
from hfbert.files import staged_files, write_json_atomic
from hfbert.inspect import write_samples
from hfbert.model_card import CURVES_NAME, build_model_card, write_model_card
from hfbert.plotting import plot_training_curves

EVAL_RESULTS_NAME = "eval_results.json"
TRAINING_ARGS_NAME = "training_args.json"
LOG_HISTORY_NAME = "log_history.json"


def write_final_folder(
    output_dir: Path,
    *,
    model: torch.nn.Module,
    state_dict: dict[str, torch.Tensor],
    tokenizer: Any,
    summary: dict[str, Any],
    eval_results: dict[str, float],
    log_history: list[dict[str, Any]],
    corpus: CorpusArguments,
    model_name: str,
    sample_sentences: tuple[list[str], str | None] = ([], None),
) -> Path:
    """Write model (with its code), tokenizer, eval_results.json, training_args.json, log_history.json, the
    curves, samples.md (fill-mask, NSP and similarity on `sample_sentences`: validation sentences and one of
    another document) and the model card into `output_dir` as one set. Main process only."""
    with staged_files(output_dir) as staging:
        model.save_pretrained(staging, state_dict=state_dict)
        tokenizer.save_pretrained(staging)
        write_json_atomic(staging / EVAL_RESULTS_NAME, eval_results)
        write_json_atomic(staging / TRAINING_ARGS_NAME, summary)
        write_json_atomic(staging / LOG_HISTORY_NAME, log_history)
        plot_training_curves(log_history, staging / CURVES_NAME, title=f"{model_name} pretraining")
        sentences, other_sentence = sample_sentences
        samples = None
        if len(sentences) >= 2:
            samples = write_samples(staging, sentences, other_sentence=other_sentence, model_name=model_name).name
        card = build_model_card(
            model_name=model_name,
            training_config=summary,
            eval_results=eval_results,
            dataset_name=corpus.dataset_name,
            dataset_config_name=corpus.dataset_config_name,
            samples_name=samples,
        )
        write_model_card(staging, card)
    return output_dir
