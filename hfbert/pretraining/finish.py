"""Finish stage: the final folder of a run (model, tokenizer, metrics, curves, model card and the callbacks'
files, such as samples.md and run_health.json, written as one set) and the push to the Hub.

Everything is staged first and published together (`hfbert.files.staged_files`), so a crash never
leaves a mix of an earlier run's files and this run's.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import torch
from accelerate import Accelerator

from hfbert.checkpointing import (
    EVAL_RESULTS_NAME,
    LOG_HISTORY_NAME,
    TRAINING_ARGS_NAME,
    write_on_every_process,
)
from hfbert.files import staged_files, write_final_record, write_json_atomic, write_tokenizer
from hfbert.model_card import CURVES_NAME, MODEL_CARD_NAME, build_model_card, push_to_hub
from hfbert.plotting import plot_training_curves
from hfbert.pretraining.callbacks import Callback, StagedFinalFolder
from hfbert.pretraining.settings import OutputSettings, PretrainingSettings
from hfbert.pretraining.training import Training, TrainingProgress, check_weights_are_finite

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class FinalFolder:
    """The run's final folder, and the fill-mask section of its samples.md (printed at the end of a run;
    None where no samples were written, or on a process other than the main one)."""

    path: Path
    fill_mask: str | None = None
    process_group_ended: bool = True  # False: the entry point leaves with process_group.exit_now


def write_final_folder(
    tokenizer: Any,
    metrics: dict[str, float],
    summary: dict[str, Any],
    callbacks: Callback,
    settings: PretrainingSettings,
    model: torch.nn.Module,
    state_dict: dict[str, torch.Tensor],
    progress: TrainingProgress,
) -> FinalFolder:
    """Write model (with its code), the run's tokenizer, eval_results.json (the final evaluation's `metrics`),
    training_args.json (`summary`: every setting and the facts of the run), log_history.json (`progress`'s),
    what `callbacks` add (`Callback.on_final_folder`: samples.md, run_health.json), the curves and the model
    card into --output_dir as one set. Main process only."""
    output_dir, output = Path(settings.output.output_dir), settings.output
    model_name = (output.hub_model_id or output_dir.name).split("/")[-1]
    eval_results = {"step": progress.completed_steps, "train_seconds": progress.train_seconds, **metrics}
    with staged_files(output_dir) as staging:
        write_tokenizer(tokenizer, staging)
        write_json_atomic(staging / EVAL_RESULTS_NAME, eval_results)
        write_json_atomic(staging / TRAINING_ARGS_NAME, summary)
        write_json_atomic(staging / LOG_HISTORY_NAME, progress.log_history)
        # After the tokenizer's save (calling the tokenizer resets the truncation and padding its file keeps) and
        # before the model's (save_pretrained empties the state dict it is given and sets config fields).
        staged = StagedFinalFolder(staging, model_name, model.config, state_dict)
        callbacks.on_final_folder(staged)
        model.save_pretrained(staging, state_dict=state_dict)
        plot_training_curves(
            progress.log_history, staging / CURVES_NAME, title=f"{model_name} pretraining",
            reference_lines=staged.reference_lines,
        )
        card = build_model_card(
            model_name=model_name,
            training_config=summary,
            eval_results=eval_results,
            dataset_name=settings.corpus.dataset_name,
            dataset_config_name=settings.corpus.dataset_config_name,
            samples_name=staged.samples_name,
            health_section=staged.health_section,
            hub_model_id=output.hub_model_id,
        )
        card.save(staging / MODEL_CARD_NAME)  # staged: published with the rest of the folder
        write_final_record(staging, Path(output_dir))  # what a later save or --overwrite_output_dir may replace
    return FinalFolder(output_dir, staged.fill_mask)


def finish(
    accelerator: Accelerator,
    state: Training,
    output: OutputSettings,
    write: Callable[[torch.nn.Module, dict[str, torch.Tensor], TrainingProgress], FinalFolder],
) -> FinalFolder:
    """Gather the weights, write the final folder (`write`: `write_final_folder` given the run's tokenizer,
    metrics, summary, callbacks and settings, to which this adds the model, its weights and the progress; main
    process; a failure such as a full disk is explained on every process: what is intact and how to finish)
    and push it if asked. Weights that are no longer finite stop the run instead (`check_weights_are_finite`)."""
    accelerator.wait_for_everyone()
    check_weights_are_finite(accelerator, state, output.output_dir)
    output_dir = Path(output.output_dir)
    state_dict = accelerator.get_state_dict(state.model)  # on every process: gathers FSDP shards
    write_main = None
    if accelerator.is_main_process:  # compiled in place: the unwrapped model is never a wrapper
        write_main = partial(write, accelerator.unwrap_model(state.model), state_dict, state.progress)
    final = write_on_every_process(accelerator, write_main, output_dir, output_dir) or FinalFolder(output_dir)
    if accelerator.is_main_process and output.push_to_hub:  # after the agreement: not a write of the folder
        logger.info(f"Pushed to {push_to_hub(output_dir, output.hub_model_id, token=output.hub_token)}")
    return final
