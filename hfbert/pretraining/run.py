"""The whole run: `pretrain(settings)` composes the stages in the order of the flow.

    check_before_work   the run folder, the checkpoint to resume and its settings, Hub access   (checkpointing)
    precision           the precision and the Accelerator                                     (precision)
    data                corpus -> documents -> tokenizer -> model config -> NSP instances       (data; stream)
    batches             the batch plan and the loaders                                         (batches)
    setup               model, optimizer, schedule, budget, prepared by accelerate             (setup)
    fit                 the loop: step, log, evaluate, checkpoint, preemption                  (loop, evaluation)
    finish              final folder (model, tokenizer, card, curves, samples) and push         (finish)

Every stage is public; to pretrain another model through the same pipeline, compose them as `pretrain` does
with that model in place of `HfBertForPreTraining` (see `setup_training` for what its forward must return, and
benchmarks/time_to_quality.py). Every process of a multi-process launch calls `pretrain`.
"""

from __future__ import annotations

import logging
from contextlib import ExitStack
from functools import partial
from pathlib import Path
from typing import Any

import torch
from accelerate import Accelerator
from accelerate.utils import set_seed

from hfbert.checkpointing import (
    TOKENIZER_FOLDER,
    check_run_folder,
    load_checkpoint,
    read_manifest,
    read_run_settings,
    remove_checkpoints,
    resolve_resume_checkpoint,
    run_folder_lock,
    starts_over_with_auto,
)
from hfbert.files import check_local_files, publish_files
from hfbert.model_card import check_hub_access
from hfbert.modeling_hfbert import HfBertForPreTraining
from hfbert.pretraining.batches import BatchPlan, build_loaders, plan_batches, resolve_num_workers
from hfbert.pretraining.cluster import (
    check_output_dir_shared,
    check_processes_agree,
    checked_on_main_process,
    end_process_group,
    form_process_group,
    release_ddp_wrapper,
)
from hfbert.pretraining.data import PretrainingData, count_training_instances, prepare_data
from hfbert.pretraining.evaluation import ModelFlops, datasheet_peak_flops
from hfbert.pretraining.finish import FinalFolder, finish
from hfbert.pretraining.loop import CheckpointWriter, Preempted, PreemptionSignals, fit
from hfbert.pretraining.precision import build_accelerator, use_deterministic_algorithms
from hfbert.pretraining.reshard import continue_on_this_split, keep_global_batch, set_accumulation
from hfbert.pretraining.settings import (
    OptimizationSettings,
    PretrainingSettings,
    check_config_file,
    check_resume_settings,
)
from hfbert.pretraining.setup import Budget, TrainingState, count_parameters, setup_training
from hfbert.pretraining.source_model import SourceModel, check_source_model, load_source_model
from hfbert.pretraining.stream import (
    StreamLoader,
    TrainingStream,
    build_stream_loaders,
    check_stream_checkpoint,
    prepare_stream_data,
    read_stream_state,
)

logger = logging.getLogger(__name__)


def check_before_work(settings: PretrainingSettings, accelerator: Accelerator) -> Path | None:
    """Everything that can refuse the run, before data is read or a file written: the run folder, the
    checkpoint to resume (verified once, on the main process) and its settings, and Hub access for a push.
    Returns the checkpoint to resume from, if any."""
    run = settings.run
    check_run_folder(
        run.output_dir,
        resume_from_checkpoint=run.resume_from_checkpoint,
        overwrite_output_dir=run.overwrite_output_dir,
    )
    for flag, value in (
        ("--config_name", settings.model.config_name),
        ("--tokenizer_name", settings.data.tokenizer_name),
    ):
        if value is not None:  # a truncated or garbled file is named now, not deep inside transformers later
            check_local_files(value, flag, f"write or copy it again, or pass another {flag}")
    check_config_file(settings)  # --max_seq_length against its position embeddings, before a tokenizer is trained
    if run.push_to_hub:
        check_hub_access(run.hub_model_id, token=run.hub_token, train_anyway=run.train_if_hub_unreachable)
    if run.resume_from_checkpoint is None:
        return None
    # Every process resumes the folder the main process verified, with the accumulation it chose.
    checkpoint, accumulation = checked_on_main_process(accelerator, partial(verify_resume, settings, accelerator))
    set_accumulation(accelerator, settings.optimization, accumulation)
    return None if checkpoint is None else Path(checkpoint)


def verify_resume(settings: PretrainingSettings, accelerator: Accelerator) -> tuple[str | None, int]:
    """The checkpoint to resume (None: 'auto' found none, a fresh start), verified against its manifest and the
    run's settings, and the gradient accumulation that keeps its global batch on this number of processes."""
    checkpoint = resolve_resume_checkpoint(settings.run.output_dir, settings.run.resume_from_checkpoint)
    if checkpoint is None:
        return None, settings.optimization.gradient_accumulation_steps
    on_cpu = accelerator.device.type == "cpu"
    if settings.corpus.streaming:  # its positions are per process: only its own process count continues them
        saved = read_run_settings(checkpoint)
        for note in check_resume_settings(saved, settings, str(checkpoint)):
            logger.warning(note)
        workers = resolve_num_workers(settings.data.dataloader_num_workers, accelerator.device)
        check_stream_checkpoint(checkpoint, accelerator.num_processes, workers, on_cpu)
        return str(checkpoint), settings.optimization.gradient_accumulation_steps
    saved = resharded_settings(settings, accelerator, checkpoint)
    for note in check_resume_settings(saved, settings, str(checkpoint)):
        logger.warning(note)
    return str(checkpoint), settings.optimization.gradient_accumulation_steps


def resharded_settings(settings: PretrainingSettings, accelerator: Accelerator, checkpoint: Path) -> dict | None:
    """The checkpoint's run settings as this launch must repeat them: on another number of processes, with
    the accumulation that keeps its global batch (set in `settings` too; see `hfbert.pretraining.reshard`)."""
    return keep_global_batch(
        read_run_settings(checkpoint),
        int(read_manifest(checkpoint)["num_processes"]),
        settings.optimization,
        accelerator.num_processes,
        str(checkpoint),
        on_cpu=accelerator.device.type == "cpu",
    )


def start(settings: PretrainingSettings) -> tuple[Accelerator, str]:
    """Logging, --deterministic and the Accelerator in the run's precision: the first thing a run does."""
    logging.basicConfig(format="%(asctime)s %(levelname)s %(name)s: %(message)s", level=logging.WARNING)
    if settings.optimization.deterministic:
        use_deterministic_algorithms()
    form_process_group(settings.run.ddp_timeout)  # several processes: this launch's group, with its timeout
    return build_accelerator(settings.optimization, settings.run)


def prepare_run_data(
    settings: PretrainingSettings,
    accelerator: Accelerator,
    checkpoint: Path | None,
    source: SourceModel | None = None,
) -> PretrainingData:
    """The data stage, then the run folder made ready (checkpoints of a replaced run removed, an interrupted
    final folder published). Seeds the run first, so the model built next starts from the same weights."""
    set_seed(settings.optimization.seed)
    prepare = prepare_stream_data if settings.corpus.streaming else prepare_data
    data = prepare(
        settings.corpus,
        settings.data,
        settings.model,
        settings.optimization.seed,
        Path(settings.run.output_dir),
        accelerator,
        checkpoint_tokenizer=None if checkpoint is None else checkpoint / TOKENIZER_FOLDER,
        source=source,
    )
    output_dir = Path(settings.run.output_dir)
    if accelerator.is_main_process:
        resume = settings.run.resume_from_checkpoint
        if settings.run.overwrite_output_dir or starts_over_with_auto(output_dir, resume):
            remove_checkpoints(output_dir)
        publish_files(output_dir)  # finishes a final folder whose publication was interrupted
    accelerator.wait_for_everyone()
    return data


def run_summary(
    settings: PretrainingSettings,
    model: torch.nn.Module,
    data: PretrainingData,
    precision: str,
    plan: BatchPlan,
    budget: Budget,
    num_processes: int,
) -> dict[str, Any]:
    """Facts of the run for training_args.json, the tracker and the model card."""
    corpus = settings.corpus
    return {
        **settings.to_dict(),
        "model_class": type(model).__name__,
        "num_parameters": count_parameters(model),
        "model_vocab_size": data.config.vocab_size,
        "precision": precision,
        "static_masked_slots": plan.max_predictions_per_seq,
        "num_processes": num_processes,
        "planned_train_steps": budget.planned_train_steps,
        "train_instances": count_training_instances(data.train),  # None for a stream: its length is unknown
        "eval_instances": len(data.evaluation),
        "corpus": corpus.dataset_name or corpus.train_file or "shipped WikiText-2 sample",
    }


def log_plan(
    data: PretrainingData,
    optimization: OptimizationSettings,
    budget: Budget,
    num_processes: int,
    num_parameters: int,
) -> None:
    train_count = count_training_instances(data.train)
    training = (
        f"{train_count} training instances"
        if train_count is not None
        else f"a stream of training instances (windows of {data.train.window_documents} documents)"
    )
    logger.info(
        f"{training}, {len(data.evaluation)} evaluation instances; "
        f"{budget.describe()}, each of {optimization.per_device_train_batch_size} x "
        f"{num_processes} x {optimization.gradient_accumulation_steps} instances; "
        f"{num_parameters / 1e6:.1f}M parameters."
    )


def train(
    settings: PretrainingSettings,
    accelerator: Accelerator,
    precision: str,
    data: PretrainingData,
    model: torch.nn.Module,
    checkpoint: Path | None,
    weights_loaded: bool = False,
) -> FinalFolder:
    """Batches -> setup -> resume -> fit -> finish for `model` (fresh from `data.config`, or holding a source
    model's weights: `weights_loaded`, and then no --attention_init over them); returns the final folder."""
    optimization = settings.optimization
    set_seed(optimization.seed, device_specific=True)  # same initial weights everywhere, distinct dropout
    plan = plan_batches(
        settings.data, optimization, settings.run.per_device_eval_batch_size, accelerator.device
    )
    loaders = build_stream_loaders if isinstance(data.train, TrainingStream) else build_loaders
    train_loader, eval_loader = loaders(plan, data.tokenizer, data.train, data.evaluation)
    attention_init = "bert" if weights_loaded else settings.model.attention_init
    fade = 0.0 if weights_loaded else settings.model.structured_attention_fade or 0.0
    state, train_loader, eval_loader, budget, shaping = setup_training(
        model, train_loader, eval_loader, optimization, attention_init, fade, accelerator
    )
    stream_loader = train_loader if isinstance(train_loader, StreamLoader) else None
    summary = run_summary(settings, model, data, precision, plan, budget, accelerator.num_processes)
    log_plan(data, optimization, budget, accelerator.num_processes, summary["num_parameters"])
    if checkpoint is not None:
        resume_from(accelerator, state, checkpoint, stream_loader, optimization.seed)
    if settings.run.with_tracking:
        accelerator.init_trackers("hfbert-pretraining", config=summary)
    checkpoints = CheckpointWriter(
        settings.run.output_dir,
        settings.run.checkpoints_total_limit,
        settings.resume_invariant(),
        data.tokenizer,
        data.config,
        stream=stream_loader,
    )
    flops = ModelFlops(data.config, model, datasheet_peak_flops(accelerator.device, precision))
    try:
        metrics = fit(
            accelerator,
            state,
            train_loader,
            eval_loader,
            budget,
            optimization,
            settings.run,
            precision,
            checkpoints,
            flops,
            shaping,
        )
    except Preempted:  # every rank stops at the same update: its process group ends now, not at exit
        release_ddp_wrapper(accelerator, state)
        end_process_group(accelerator)
        raise
    release_ddp_wrapper(accelerator, state)  # before the process group ends, in finish
    with PreemptionSignals():  # a signal during the final save (staged, shorter than a checkpoint) waits
        return finish_run(accelerator, state, data, settings, summary, metrics)


def resume_from(
    accelerator: Accelerator,
    state: TrainingState,
    checkpoint: Path,
    stream_loader: StreamLoader | None,
    seed: int,
) -> None:
    """Load `checkpoint` into the prepared state and go on from its place in the data, on this run's split."""
    logger.info(f"Resuming from {checkpoint}")
    saved_processes = load_checkpoint(accelerator, checkpoint)
    continue_on_this_split(accelerator, state.progress, checkpoint, saved_processes, seed)
    if stream_loader is not None:
        stream_loader.resume(read_stream_state(checkpoint), accelerator.process_index)


def finish_run(
    accelerator: Accelerator,
    state: TrainingState,
    data: PretrainingData,
    settings: PretrainingSettings,
    summary: dict[str, Any],
    metrics: dict[str, float],
) -> FinalFolder:
    """The finish stage for a trained state: the final folder, its samples and card, the push."""
    progress = state.progress
    return finish(
        accelerator,
        state.model,
        data.tokenizer,
        settings.run,
        settings.corpus,
        summary,
        eval_results={"step": progress.completed_steps, "train_seconds": progress.train_seconds, **metrics},
        log_history=progress.log_history,
        sample_sentences=(data.sample_sentences, data.other_sentence),
    )


def pretrain(settings: PretrainingSettings) -> Path:
    """Pretrain HfBertForPreTraining and return the final model folder."""
    return pretrain_run(settings).path


def pretrain_run(settings: PretrainingSettings) -> FinalFolder:
    """`pretrain`, returning the final folder with the fill-mask section of its samples."""
    accelerator, precision = start(settings)
    with ExitStack() as held:  # the run folder's lock, taken by the main process; its refusal ends every rank
        checked_on_main_process(accelerator, partial(held.enter_context, run_folder_lock(settings.run.output_dir)))
        check_output_dir_shared(Path(settings.run.output_dir), accelerator)
        checkpoint = check_before_work(settings, accelerator)
        source = check_source_model(settings.model, settings.data)
        data = prepare_run_data(settings, accelerator, checkpoint, source)
        check_processes_agree(settings, data, accelerator)  # before the first update, on every rank
        if source is None:
            return train(settings, accelerator, precision, data, HfBertForPreTraining(data.config), checkpoint)
        model = load_source_model(source, data.config)
        return train(settings, accelerator, precision, data, model, checkpoint, weights_loaded=True)
