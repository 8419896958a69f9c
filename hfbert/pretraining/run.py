"""The whole run: `pretrain(settings)` composes the stages in the order of the flow, in one function.

    start               the process group, the precision and the Accelerator                    (process_group, precision)
    check_before_work   the run folder, the checkpoint to resume and its settings, Hub access   (checkpointing)
    data                corpus -> documents -> tokenizer -> model config -> NSP instances       (data)
    model               the model and its start (--attention_init, or a source's weights)     (build_model)
    batches             the loaders and each batch's shape                                     (batches; stream)
    training            its one owner: model, optimizer, schedule, budget, progress (prepared)  (training)
    fit                 the loop: step, log, evaluate, checkpoint, preemption; callbacks       (loop, callbacks)
    finish              final folder (model, tokenizer, card, curves, the callbacks' files), push (finish)
                        then the process group ended                                            (process_group)

The cached and the streamed data (--streaming) differ only inside the data stage (`data.prepare`) and the
training batches it leads to (`batches.build_loaders`). To pretrain another model through the same pipeline, pass its
class (or any function of the model config that builds it) as `pretrain`'s `model_class` (see `setup_training`
for what its forward must return, and benchmarks/time_to_quality.py); the stages before it (`start`,
`check_before_work`, `prepare_run_data`) are public too. Every process of a multi-process launch calls
`pretrain`.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import replace
from functools import partial
from pathlib import Path
from typing import Any

import torch
from accelerate import Accelerator
from accelerate.utils import set_seed

from hfbert.checkpointing import (
    RUN_SETTINGS_NAME,
    RunCheckpoints,
    check_run_folder,
    finish_interrupted_replace,
    read_manifest,
    read_run_settings,
    remove_checkpoints,
    resolve_resume_checkpoint,
    starts_over_with_auto,
)
from hfbert.configuration_hfbert import HfBertConfig
from hfbert.corpus import naming_cache_failures
from hfbert.files import check_local_files, check_run_folder_free, publish_files, run_folder_lock
from hfbert.initialization import init_structured_attention
from hfbert.model_card import check_hub_access
from hfbert.modeling_hfbert import HfBertForPreTraining
from hfbert.pretraining.batches import build_loaders, resolve_max_predictions, resolve_num_workers
from hfbert.pretraining.callbacks import Callback, Callbacks
from hfbert.pretraining.data import (
    PreparedData,
    build_model_config,
    cache_writers_first,
    check_corpus,
    check_stream_tokenizer,
    count_training_instances,
    prepare,
)
from hfbert.pretraining.extras.attention_shaping import ClsAttentionSpread, StructuredFade
from hfbert.pretraining.extras.cluster import check_output_dir_shared, check_processes_agree
from hfbert.pretraining.extras.health.corpus import CorpusHealth, cached_corpus_health
from hfbert.pretraining.extras.health.signatures import RunHealth, text_passes_per_update
from hfbert.pretraining.extras.plan import plan_lines, rehearse_data_stage
from hfbert.pretraining.extras.reshard import continue_on_this_split, keep_global_batch
from hfbert.pretraining.extras.samples import Samples
from hfbert.pretraining.finish import FinalFolder, finish, write_final_folder
from hfbert.pretraining.flops import ModelFlops, device_peak_flops
from hfbert.pretraining.loop import Preempted, PreemptionSignals, ProgressBar, Tracker, fit
from hfbert.pretraining.precision import build_accelerator, use_deterministic_algorithms
from hfbert.pretraining.process_group import (
    checked_on_main_process,
    end_process_group,
    form_process_group,
    release_ddp_wrapper,
)
from hfbert.pretraining.settings import (
    CORPUS_FINGERPRINT,
    PRECISION,
    PretrainingSettings,
    check_config_file,
    check_resume_settings,
    checkpoint_writer,
)
from hfbert.pretraining.source_model import SourceModel, check_source_model, load_source_model
from hfbert.pretraining.stream import check_stream_checkpoint
from hfbert.pretraining.training import Budget, setup_training
from hfbert.tokenization import load_tokenizer

logger = logging.getLogger(__name__)

# What `pretrain` trains: a model class, or any function of the model config that builds the model.
ModelClass = Callable[[HfBertConfig], torch.nn.Module]


def verify_data_resume(settings: PretrainingSettings, accelerator: Accelerator) -> tuple[Path | None, int]:
    """The checkpoint to resume (None: 'auto' found none, a fresh start), verified against its manifest, its
    place in the data checked to continue on this launch and the flags compared; and the gradient accumulation
    that continues its global batch on this number of processes. A cached run's place is global: on another
    number of processes, that accumulation is set in `settings` (see `hfbert.pretraining.extras.reshard`). A stream's
    positions are per process and per loader worker: only its own counts continue them."""
    checkpoint = resolve_resume_checkpoint(settings.output.output_dir, settings.output.resume_from_checkpoint)
    if checkpoint is None:
        return None, settings.optimization.gradient_accumulation_steps
    saved, on_cpu = read_run_settings(checkpoint), accelerator.device.type == "cpu"
    if not settings.corpus.streaming:
        saved_processes = int(read_manifest(checkpoint)["num_processes"])
        saved = keep_global_batch(
            saved, saved_processes, settings.optimization, accelerator.num_processes, str(checkpoint), on_cpu
        )
    device, precision = accelerator.device.type, accelerator.mixed_precision
    for note in check_resume_settings(saved, settings, str(checkpoint), device, precision):
        logger.warning(note)
    if settings.corpus.streaming:
        workers = resolve_num_workers(settings.data.dataloader_num_workers, accelerator.device)
        writer = checkpoint_writer(saved or {}, settings).description
        check_stream_checkpoint(checkpoint, accelerator.num_processes, workers, on_cpu, writer)
    return checkpoint, settings.optimization.gradient_accumulation_steps


def check_before_work(
    settings: PretrainingSettings, accelerator: Accelerator
) -> tuple[Path | None, SourceModel | None]:
    """Everything that can refuse the run before data is prepared or a file written, the one check `pretrain`
    and --dry_run both make: the run folder, the --config_name and --tokenizer_name files, the corpus (its
    files, rows and enough documents, on the main process), Hub access for a push, the checkpoint to resume
    (verified once, on the main process) and its settings, the source model, a named tokenizer against the model
    config, and that every process runs the same flags on the same corpus. Returns the checkpoint to resume from
    and the source model, if any."""
    output = settings.output
    check_run_folder(
        output.output_dir,
        resume_from_checkpoint=output.resume_from_checkpoint,
        overwrite_output_dir=output.overwrite_output_dir,
    )
    for flag, value in (
        ("--config_name", settings.model.config_name),
        ("--tokenizer_name", settings.data.tokenizer_name),
    ):
        if value is not None:  # a truncated or garbled file is named now, not deep inside transformers later
            check_local_files(value, flag, f"write or copy it again, or pass another {flag}")
    check_config_file(settings)  # --max_seq_length against its position embeddings, before a tokenizer is trained
    checked_on_main_process(
        accelerator, partial(check_corpus, settings.corpus, settings.data, accelerator.num_processes)
    )
    check_processes_agree(settings, None, accelerator)  # the flags, corpus and versions, on every rank
    if output.push_to_hub:
        check_hub_access(output.hub_model_id, token=output.hub_token, train_anyway=output.train_if_hub_unreachable)
    checkpoint = None
    if output.resume_from_checkpoint is not None:
        # Every process resumes the folder the main process verified, with the accumulation it chose.
        checkpoint, accumulation = checked_on_main_process(accelerator, partial(verify_data_resume, settings, accelerator))
        settings.optimization.gradient_accumulation_steps = accumulation
    source = check_source_model(settings.model, settings.data)
    if settings.corpus.streaming:
        check_stream_tokenizer(settings.data, checkpoint, source)
    if settings.data.tokenizer_name is not None and checkpoint is None:  # a resume uses its checkpoint's
        tokenizer = load_tokenizer(settings.data.tokenizer_name)
        build_model_config(settings.model, tokenizer, source)
    return checkpoint, source


def start(settings: PretrainingSettings) -> tuple[Accelerator, str]:
    """Logging, --deterministic and the Accelerator in the run's precision: the first thing a run does."""
    logging.basicConfig(format="%(asctime)s %(levelname)s %(name)s: %(message)s", level=logging.WARNING)
    if settings.optimization.deterministic:
        use_deterministic_algorithms()
    form_process_group(settings.output.ddp_timeout)  # several processes: this launch's group, with its timeout
    return build_accelerator(settings.optimization, settings.output)


def prepare_run_data(
    settings: PretrainingSettings,
    accelerator: Accelerator,
    checkpoint: Path | None,
    source: SourceModel | None = None,
) -> tuple[PreparedData, CorpusHealth]:
    """The data stage and run health's corpus statistics (from the columns it cached), then the run folder
    made ready (checkpoints of a replaced run removed, an interrupted final folder published). Seeds the run
    first, so the model built next starts from the same weights."""
    set_seed(settings.optimization.seed)
    output_dir = Path(settings.output.output_dir)
    prepared = prepare(
        settings.corpus, settings.data, settings.model, settings.optimization.seed, output_dir, accelerator,
        checkpoint=checkpoint, source=source,
    )
    with cache_writers_first(accelerator), naming_cache_failures():  # one writer of the statistics' cache file
        corpus_health = cached_corpus_health(
            prepared.statistics_columns, prepared.eval_instances, prepared.tokenizer, settings.data.max_seq_length
        )
    if accelerator.is_main_process:
        if settings.output.overwrite_output_dir or starts_over_with_auto(output_dir, settings.output.resume_from_checkpoint):
            remove_checkpoints(output_dir)
        publish_files(output_dir)  # finishes a final folder whose publication was interrupted
    accelerator.wait_for_everyone()
    return prepared, corpus_health


def run_summary(
    settings: PretrainingSettings,
    model: torch.nn.Module,
    prepared: PreparedData,
    precision: str,
    static_slots: int | None,
    budget: Budget,
    num_processes: int,
) -> dict[str, Any]:
    """Facts of the run for training_args.json, the tracker and the model card; the plan they make is logged."""
    corpus, optimization = settings.corpus, settings.optimization
    summary = {
        **settings.to_dict(),
        "model_class": type(model).__name__,
        "num_parameters": sum(p.numel() for p in model.parameters()),
        "model_vocab_size": prepared.config.vocab_size,
        "precision": precision,
        "static_masked_slots": static_slots,
        "num_processes": num_processes,
        "planned_train_steps": budget.planned_train_steps,
        "train_instances": count_training_instances(prepared.train),  # None for a stream: its length is unknown
        "eval_instances": len(prepared.eval_instances),
        "corpus": corpus.dataset_name or corpus.train_file or "shipped WikiText-2 sample",
    }
    training = (
        f"{summary['train_instances']} training instances"
        if summary["train_instances"] is not None
        else f"a stream of training instances (windows of {settings.data.stream_window_documents} documents)"
    )
    logger.info(
        f"{training}, {summary['eval_instances']} evaluation instances; "
        f"{budget.describe()}, each of {optimization.per_device_train_batch_size} x "
        f"{num_processes} x {optimization.gradient_accumulation_steps} instances; "
        f"{summary['num_parameters'] / 1e6:.1f}M parameters."
    )
    return summary


def run_checkpoints(settings: PretrainingSettings, prepared: PreparedData, precision: str) -> RunCheckpoints:
    """Where and with what the run writes its checkpoints: its tokenizer and model config, and its settings
    with the corpus as the data stage read it (text edited since is not what trained) and the precision it
    trains in, compared on resume."""
    read = {CORPUS_FINGERPRINT: prepared.corpus_sha256, PRECISION: precision}
    recorded = settings.checkpoint_settings() | read
    output = settings.output
    return RunCheckpoints(
        output.output_dir, output.checkpoints_total_limit, prepared.tokenizer, prepared.config,
        {RUN_SETTINGS_NAME: recorded},
    )  # fmt: skip


def build_model(
    settings: PretrainingSettings, config: HfBertConfig, source: SourceModel | None, model_class: ModelClass
) -> tuple[torch.nn.Module, list[Callback]]:
    """The model to train, chosen once, here: `source`'s weights (--model_name_or_path, nothing initialised),
    or `model_class(config)` (HfBertForPreTraining, or another BERT through the same pipeline, see
    benchmarks/time_to_quality.py) started as --attention_init says; and the callbacks of its start (the
    structured start's fade, under --structured_attention_fade). A resumed run then loads its checkpoint over
    these weights, and the fade goes on from the checkpoint's progress."""
    if source is not None:
        return load_source_model(source, config), []
    model = model_class(config)
    if settings.model.attention_init != "structured":
        return model, []  # bert: the model's own initialisation, as built
    fade = settings.model.structured_attention_fade or 0.0
    components = init_structured_attention(model, seed=settings.optimization.seed, keep_random_rows=fade > 0)
    return model, [StructuredFade(model, components, fade)] if fade > 0 else []


def pretrain(settings: PretrainingSettings, model_class: ModelClass = HfBertForPreTraining) -> FinalFolder:
    """Pretrain `model_class` (HfBertForPreTraining, or any model with its training outputs: see
    `setup_training`), unless --model_name_or_path names the weights to start from; returns the final folder
    (its path, and the fill-mask section of its samples to print). Every process of a launch calls it."""
    accelerator, precision = start(settings)
    optimization = settings.optimization
    with ExitStack() as held:  # the run folder's lock, taken by the main process; its refusal ends every rank
        lock = run_folder_lock(settings.output.output_dir, finish_interrupted_replace)
        checked_on_main_process(accelerator, partial(held.enter_context, lock))
        check_output_dir_shared(Path(settings.output.output_dir), accelerator)
        checkpoint, source = check_before_work(settings, accelerator)
        prepared, corpus_health = prepare_run_data(settings, accelerator, checkpoint, source)
        check_processes_agree(settings, prepared, accelerator)  # before the first update, on every rank
        model, start_callbacks = build_model(settings, prepared.config, source, model_class)
        set_seed(optimization.seed, device_specific=True)  # same initial weights everywhere, distinct dropout
        device, eval_batch_size = accelerator.device, settings.output.per_device_eval_batch_size
        batches, eval_loader = build_loaders(
            settings.data, optimization, eval_batch_size, device, prepared.tokenizer, prepared.train, prepared.eval_instances
        )
        slots = resolve_max_predictions(settings.data, optimization, device)
        peak_flops, peak_line = device_peak_flops(device, precision)  # the peak the logged MFU is against
        flops = ModelFlops(model.config, static_slots=slots, peak_flops_per_process=peak_flops)
        checkpoints = run_checkpoints(settings, prepared, precision)
        training, eval_loader = setup_training(model, batches, eval_loader, optimization, accelerator, checkpoints, flops)
        summary = run_summary(settings, model, prepared, precision, slots, training.budget, accelerator.num_processes)
        if checkpoint is not None:  # go on from its place in the data, on this run's split
            logger.info(f"Resuming from {checkpoint}")
            training.resume(checkpoint)
            continue_on_this_split(accelerator, training.progress.completed_steps, checkpoint, optimization.seed)
        logger.info(peak_line)
        # What the loop does besides the step: the start's, the bar, the [CLS] penalty, the trackers, the health;
        # and what the final folder holds besides the model: the health's report and the samples.
        callbacks = [*start_callbacks, ProgressBar(accelerator, training.budget)]
        if optimization.cls_attention_spread:
            callbacks.append(ClsAttentionSpread(model, optimization.cls_attention_spread))
        if settings.output.with_tracking:
            accelerator.init_trackers("hfbert-pretraining", config=summary)
            callbacks.append(Tracker(accelerator))
        # the run's budget and passes, as a replay of log_history.json with training_args.json finds them
        health = RunHealth(corpus_health, training.budget, text_passes_per_update(summary), accelerator.is_main_process)
        samples = Samples(prepared.tokenizer, prepared.sample_sentences, prepared.other_sentence)
        attached = Callbacks([*callbacks, health, samples])
        try:
            metrics = fit(training, eval_loader, attached, settings.output)
        except Preempted as stopped:  # every rank stops at the same update: its process group ends now, not at exit
            release_ddp_wrapper(accelerator, training)
            stopped.process_group_ended = end_process_group(accelerator)
            raise
        release_ddp_wrapper(accelerator, training)  # before the process group ends
        write = partial(write_final_folder, prepared.tokenizer, metrics, summary, attached, settings)
        with PreemptionSignals():  # a signal during the final save (staged, shorter than a checkpoint) waits
            final = finish(accelerator, training, settings.output, write)
            return replace(final, process_group_ended=end_process_group(accelerator))


def dry_run(settings: PretrainingSettings) -> str:
    """--dry_run: the checks `pretrain` makes before work (`check_before_work`; the run folder's lock is tested,
    not taken, which would create the folder), the refusals its data stage makes (`rehearse_data_stage`, in
    memory), then the plan, as text; nothing is written."""
    accelerator, _ = start(settings)
    check_run_folder_free(settings.output.output_dir)
    checkpoint, source = check_before_work(settings, accelerator)
    rehearsal = partial(rehearse_data_stage, settings, accelerator, checkpoint, source)
    config = checked_on_main_process(accelerator, rehearsal)  # the main process's refusal ends every rank
    return "\n".join(plan_lines(settings, accelerator, checkpoint, source, config))
