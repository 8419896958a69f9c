"""BERT pretraining (masked LM + next sentence prediction) with accelerate, in four layers:

    prepare_data  corpus -> tokenizer -> NSP instances               (hfbert.corpus, tokenization, pretraining_data)
    setup_run     accelerator, model, optimizer, schedule, loaders -> one `Run`
    fit           the loop: step, log, evaluate, checkpoint           (hfbert.collator, hfbert.checkpointing)
    finish        final folder (model, tokenizer, card, curves, samples) and push   (hfbert.final_folder)

`pretrain(settings)` runs them in order; run_pretraining.py (hfbert.pretraining_cli) parses the flags into
`PretrainingSettings`. Every process of a multi-process launch calls `pretrain`.
"""

from __future__ import annotations

import logging
import math
import os
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import datasets
import torch
import transformers
from accelerate import Accelerator, DataLoaderConfiguration
from accelerate.utils import broadcast_object_list, parse_flag_from_env, set_seed
from torch.utils.data import DataLoader
from tqdm.auto import tqdm
from transformers import AutoTokenizer

from hfbert.checkpointing import (
    TOKENIZER_FOLDER,
    TrainingProgress,
    check_run_folder,
    load_checkpoint,
    read_run_settings,
    remove_checkpoints,
    resolve_resume_checkpoint,
    run_folder_lock,
    save_checkpoint,
)
from hfbert.collator import DataCollatorForPretraining, EpochDraws, InstanceDraws, default_max_predictions
from hfbert.configuration_hfbert import HfBertConfig
from hfbert.corpus import load_documents
from hfbert.files import check_local_files, publish_files
from hfbert.final_folder import write_final_folder
from hfbert.initialization import check_structured_attention_config, init_structured_attention
from hfbert.inspect import sample_sentences
from hfbert.model_card import check_hub_access, push_to_hub
from hfbert.modeling_hfbert import IGNORE_INDEX, HfBertForPreTraining
from hfbert.pretraining_data import (
    build_mlm_instances,
    build_nsp_instances,
    split_validation_documents,
    tokenize_documents,
)
from hfbert.pretraining_settings import PretrainingSettings, check_resume_settings
from hfbert.tokenization import (
    check_tokenizer_matches_config,
    load_tokenizer,
    model_config_for_tokenizer,
    save_tokenizer,
    train_tokenizer,
)

logger = logging.getLogger(__name__)

# Builds the model to pretrain from its config. The model's forward must take the batch plus
# `mlm_masked_rows_only=True` and return `mlm_loss`, `nsp_loss`, `prediction_logits` at the masked rows
# (row-major order of labels != -100) and `seq_relationship_logits`, as HfBertForPreTraining does; on the
# static path (the default on CUDA) the batch also holds `masked_positions` (B, P), and labels are (B, P).
ModelFactory = Callable[[HfBertConfig], torch.nn.Module]
TRAINED_TOKENIZER_DIR = ".tokenizer"  # hidden: never uploaded
UNBOUNDED_STEPS = 10**12  # the step budget of a run bounded by --max_train_seconds alone


def hfbert_model(config: HfBertConfig) -> HfBertForPreTraining:
    """The default model factory."""
    return HfBertForPreTraining(config)


# ---------------------------------------------------------------------------------------------------------
# prepare_data: corpus -> tokenizer -> instances
# ---------------------------------------------------------------------------------------------------------


@dataclass
class PretrainingData:
    """What the run trains on: tokenizer, the model config that matches it, and the NSP instances."""

    tokenizer: Any
    config: HfBertConfig
    train: datasets.Dataset
    evaluation: datasets.Dataset
    sample_sentences: list[str]  # validation sentences for the final folder's samples.md
    other_sentence: str | None  # a sentence of another validation document (the random NSP pair)


def load_run_tokenizer(
    settings: PretrainingSettings,
    documents: datasets.DatasetDict,
    accelerator: Accelerator,
    checkpoint: Path | None,
) -> Any:
    """The tokenizer of the run: a resumed run's own (saved in its checkpoint), --tokenizer_name, or one
    trained on the training corpus by the main process into `output_dir/.tokenizer`."""
    data, output_dir = settings.data, Path(settings.run.output_dir)
    if checkpoint is not None and (checkpoint / TOKENIZER_FOLDER).is_dir():
        tokenizer = AutoTokenizer.from_pretrained(checkpoint / TOKENIZER_FOLDER)
        logger.info(f"Resuming with the tokenizer saved in {checkpoint / TOKENIZER_FOLDER} (none is trained)")
        if data.tokenizer_name is not None:
            named = load_tokenizer(data.tokenizer_name)
            if named.get_vocab() != tokenizer.get_vocab():
                raise ValueError(
                    f"--tokenizer_name {data.tokenizer_name} differs from the tokenizer {checkpoint} was trained "
                    f"with ({len(named)} vs {len(tokenizer)} tokens, or other ids); drop --tokenizer_name to "
                    "resume with the checkpoint's own tokenizer"
                )
        return tokenizer
    if data.tokenizer_name is not None:
        return load_tokenizer(data.tokenizer_name)
    trained = output_dir / TRAINED_TOKENIZER_DIR
    if accelerator.is_main_process:
        logger.info(
            f"No --tokenizer_name given: training a WordPiece tokenizer (vocab_size={data.vocab_size}) on the "
            "training corpus first; it is saved with the model."
        )
        save_tokenizer(train_tokenizer(documents["train"], vocab_size=data.vocab_size), trained)
    accelerator.wait_for_everyone()
    return AutoTokenizer.from_pretrained(trained)


def build_model_config(settings: PretrainingSettings, tokenizer: Any) -> HfBertConfig:
    """The model config (--config_name or the --model_size preset, --dropout applied), checked against the
    tokenizer, --max_seq_length and --attention_init."""
    model = settings.model
    if model.config_name is not None:
        config = HfBertConfig.from_pretrained(model.config_name)
        check_tokenizer_matches_config(tokenizer, config)
    else:
        config = model_config_for_tokenizer(tokenizer, model.model_size)
    if model.dropout is not None:
        config.hidden_dropout_prob = config.attention_probs_dropout_prob = model.dropout
    if model.attention_init == "structured":
        check_structured_attention_config(config)
    if settings.data.max_seq_length > config.max_position_embeddings:
        raise ValueError(
            f"--max_seq_length {settings.data.max_seq_length} exceeds the model's max_position_embeddings "
            f"{config.max_position_embeddings}; pass --max_seq_length <= {config.max_position_embeddings}"
        )
    return config


def build_instances(
    documents: datasets.DatasetDict, tokenizer: Any, settings: PretrainingSettings
) -> tuple[datasets.Dataset, datasets.Dataset]:
    """NSP instances for training (`dupe_factor` passes) and evaluation (one pass), cached by datasets."""
    data, seed = settings.data, settings.optimization.seed
    nsp = {
        "cls_token_id": tokenizer.cls_token_id,
        "sep_token_id": tokenizer.sep_token_id,
        "max_seq_length": data.max_seq_length,
        "short_seq_prob": data.short_seq_prob,
        "seed": seed,
        "num_proc": data.preprocessing_num_workers,
    }
    tokenized = {
        split: tokenize_documents(documents[split], tokenizer, num_proc=data.preprocessing_num_workers)
        for split in ("train", "validation")
    }
    if data.objective == "mlm":  # [CLS] segment [SEP], one pass (--dupe_factor is 1)
        segments = {key: nsp[key] for key in ("cls_token_id", "sep_token_id", "max_seq_length", "num_proc")}
        passes = [build_mlm_instances(tokenized["train"], **segments)]
        evaluation = build_mlm_instances(tokenized["validation"], **segments)
    else:
        passes = [build_nsp_instances(tokenized["train"], pass_index=i, **nsp) for i in range(data.dupe_factor)]
        evaluation = build_nsp_instances(tokenized["validation"], pass_index=0, **nsp)
    if data.max_eval_samples is not None:
        evaluation = evaluation.select(range(min(data.max_eval_samples, len(evaluation))))
    return datasets.concatenate_datasets(passes), evaluation


def prepare_data(
    settings: PretrainingSettings, accelerator: Accelerator, checkpoint: Path | None
) -> PretrainingData:
    """Corpus -> tokenizer -> model config -> NSP instances (the main process first, the others from cache)."""
    with accelerator.main_process_first():
        documents = load_documents(settings.corpus, num_proc=settings.data.preprocessing_num_workers)
        documents = split_validation_documents(
            documents, settings.data.validation_split_percentage, settings.optimization.seed
        )
    tokenizer = load_run_tokenizer(settings, documents, accelerator, checkpoint)
    config = build_model_config(settings, tokenizer)
    tokenizer.model_max_length = config.max_position_embeddings  # what the saved model accepts
    with accelerator.main_process_first():
        train, evaluation = build_instances(documents, tokenizer, settings)
    sentences, other = sample_sentences(documents["validation"])
    return PretrainingData(
        tokenizer=tokenizer,
        config=config,
        train=train,
        evaluation=evaluation,
        sample_sentences=sentences,
        other_sentence=other,
    )


# ---------------------------------------------------------------------------------------------------------
# setup_run: precision, accelerator, model, optimizer, schedule, loaders
# ---------------------------------------------------------------------------------------------------------


def cpu_has_native_bf16() -> bool:
    """True when the CPU executes bf16 dot products natively (AVX512-BF16 or AMX), where bf16 pays."""
    try:
        flags = Path("/proc/cpuinfo").read_text()
    except OSError:
        return False
    return "avx512_bf16" in flags or "amx_bf16" in flags


def resolve_mixed_precision(requested: str, launcher_choice: str | None, cuda: bool) -> tuple[str, str]:
    """The precision to train in and why. `launcher_choice` is ACCELERATE_MIXED_PRECISION, which accelerate
    launch sets to 'no' also when --mixed_precision was not given, so only fp16/bf16 there count as a choice."""
    if requested == "auto" and launcher_choice in ("fp16", "bf16"):
        requested, reason = launcher_choice, "accelerate launch --mixed_precision"
    elif requested == "auto":
        if cuda:
            return "fp16", "CUDA device (fp16 with loss scaling)"
        if cpu_has_native_bf16():
            return "bf16", "CPU with native bf16"
        return "no", "CPU without native bf16"
    else:
        reason = "--mixed_precision"
    if requested == "fp16" and not cuda:
        fallback = "bf16" if cpu_has_native_bf16() else "no"
        logger.warning(
            f"fp16 was asked for ({reason}) but there is no CUDA device and accelerate would silently ignore it "
            f"on a CPU; training in {fallback} instead."
        )
        return fallback, f"fp16 unavailable on CPU, fell back to {fallback}"
    return requested, reason


def use_deterministic_algorithms() -> None:
    """--deterministic: deterministic kernels only (an op without one raises). Not transformers'
    `enable_full_determinism`, which also sets CUDA_LAUNCH_BLOCKING=1 and so makes every launch wait for the GPU."""
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")  # read when cuBLAS starts: before any matmul
    torch.use_deterministic_algorithms(True)
    torch.backends.cudnn.deterministic = True
    torch.backends.cudnn.benchmark = False


def build_accelerator(settings: PretrainingSettings) -> tuple[Accelerator, str]:
    """The Accelerator in the resolved precision (logged), with loggers quiet on non-main processes."""
    use_cuda = torch.cuda.is_available() and not parse_flag_from_env("ACCELERATE_USE_CPU")
    precision, reason = resolve_mixed_precision(
        settings.optimization.mixed_precision, os.environ.get("ACCELERATE_MIXED_PRECISION"), use_cuda
    )
    accelerator = Accelerator(
        mixed_precision=precision,
        gradient_accumulation_steps=settings.optimization.gradient_accumulation_steps,
        log_with=settings.run.report_to if settings.run.with_tracking else None,
        project_dir=settings.run.output_dir,
        # Pinned batches are copied while the previous step runs (accelerate's loader moves one batch ahead).
        dataloader_config=DataLoaderConfiguration(non_blocking=torch.cuda.is_available()),
    )
    logging.getLogger("hfbert").setLevel(logging.INFO if accelerator.is_main_process else logging.WARNING)
    # accelerate warns at every save that the tied decoder weight is stored once; that is intended here.
    logging.getLogger("accelerate.utils.other").setLevel(logging.ERROR)
    if not accelerator.is_main_process:
        datasets.utils.logging.set_verbosity_error()
        transformers.utils.logging.set_verbosity_error()
    logger.info(
        f"Precision: {precision} ({reason}); device {accelerator.device}, {accelerator.num_processes} process(es)."
    )
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    if accelerator.device.type == "cpu" and torch.get_num_threads() == 1 and cores > accelerator.num_processes:
        logger.warning(
            f"Training on the CPU with 1 thread per process although {cores} cores are free: `accelerate launch` "
            "sets OMP_NUM_THREADS=1 on a machine without a GPU unless told otherwise. Use `accelerate launch "
            "--num_cpu_threads_per_process $(nproc) ...` (divided by --num_processes) for full speed."
        )
    return accelerator, precision


def optimizer_parameter_groups(model: torch.nn.Module, weight_decay: float) -> list[dict[str, Any]]:
    """AdamW groups as in BERT: weight decay on weight matrices only, none on biases and LayerNorm."""
    decay, no_decay = [], []
    for name, parameter in model.named_parameters():
        if not parameter.requires_grad:
            continue
        (no_decay if parameter.ndim < 2 or "LayerNorm" in name else decay).append(parameter)
    return [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]


@dataclass(frozen=True)
class LearningRateSchedule:
    """Linear warmup to `peak`, then linear or cosine decay to zero, or constant.

    transformers' schedulers only know steps; a time budget needs the elapsed time too, so the decay follows
    progress = max(step / max_steps, seconds / max_seconds) and reaches zero exactly when the budget that
    ends the run (steps or seconds) runs out (Izsak et al. 2021). It is a pure function of the checkpointed
    progress, so nothing about it needs saving.
    """

    peak: float
    warmup_steps: int
    max_steps: int
    max_seconds: float | None
    shape: str

    def __call__(self, step: int, seconds: float) -> float:
        if step < self.warmup_steps:
            return self.peak * (step + 1) / (self.warmup_steps + 1)
        if self.shape == "constant":
            return self.peak
        progress = (step - self.warmup_steps) / max(1, self.max_steps - self.warmup_steps)
        if self.max_seconds is not None:
            progress = max(progress, seconds / self.max_seconds)
        progress = min(progress, 1.0)
        if self.shape == "cosine":
            return self.peak * 0.5 * (1.0 + math.cos(math.pi * progress))
        return self.peak * (1.0 - progress)


def resolve_max_predictions(settings: PretrainingSettings, device: torch.device) -> int | None:
    """Static masked slots per row: --max_predictions_per_seq, else a default on CUDA (static shapes keep the
    step free of host synchronisation) and under --torch_compile; None (every masked token, dynamic shapes)
    on a CPU, where the dynamic path is measured faster."""
    data = settings.data
    if data.max_predictions_per_seq is not None:
        return data.max_predictions_per_seq
    if device.type == "cuda" or settings.optimization.torch_compile:
        return default_max_predictions(data.max_seq_length, data.mlm_probability)
    return None


def resolve_num_workers(requested: int | None, device: torch.device) -> int:
    """DataLoader workers: --dataloader_num_workers, else 4 on CUDA (batches are built while the GPU steps)
    and 0 on a CPU (a worker would take a core from the step; building a batch costs about a millisecond)."""
    if requested is not None:
        return requested
    return min(4, os.cpu_count() or 1) if device.type == "cuda" else 0


def build_loaders(
    settings: PretrainingSettings, data: PretrainingData, device: torch.device
) -> tuple[DataLoader, DataLoader, int | None]:
    """Training and evaluation loaders whose collate_fn builds finished batches (padded, masked, static form
    when asked) in worker processes, into pinned memory on CUDA; returns them and the static slot count.
    Under --torch_compile every batch has one shape: rows padded to --max_seq_length, full training batches
    (the last partial one of an epoch is dropped) and evaluation batches filled up with padding rows."""
    seed, compiled = settings.optimization.seed, settings.optimization.torch_compile
    max_predictions = resolve_max_predictions(settings, device)
    num_workers = resolve_num_workers(settings.data.dataloader_num_workers, device)
    shape = {
        "max_predictions_per_seq": max_predictions,
        "pad_to_length": settings.data.max_seq_length if compiled else None,
        "seed": seed,
    }
    loader_options = {
        "num_workers": num_workers,
        "pin_memory": device.type == "cuda",
        "persistent_workers": num_workers > 0,
        "prefetch_factor": 4 if num_workers > 0 else None,
    }
    train_batch = settings.optimization.per_device_train_batch_size
    train_loader = DataLoader(
        InstanceDraws(data.train),
        batch_size=train_batch,
        sampler=EpochDraws(len(data.train), seed),
        collate_fn=DataCollatorForPretraining(
            data.tokenizer,
            mlm_probability=settings.data.mlm_probability,
            whole_word_masking=settings.data.whole_word_masking,  # training only: evaluation stays token-level
            **shape,
        ),
        drop_last=compiled and len(data.train) >= train_batch,
        # Its own generator: otherwise each new iterator draws its workers' base seed from the global RNG
        # and shifts the training dropout stream (the evaluation loader's too, at every evaluation).
        generator=torch.Generator().manual_seed(seed),
        **loader_options,
    )
    eval_batch = settings.run.per_device_eval_batch_size
    eval_collator = DataCollatorForPretraining(
        data.tokenizer,
        mlm_probability=settings.data.eval_mlm_probability,
        pad_to_batch_size=eval_batch if compiled else None,
        **shape,
    )
    eval_loader = DataLoader(
        InstanceDraws(data.evaluation),
        batch_size=eval_batch,
        sampler=EpochDraws(len(data.evaluation), seed, shuffle=False),
        collate_fn=eval_collator,
        generator=torch.Generator().manual_seed(seed),
        **loader_options,
    )
    return train_loader, eval_loader, max_predictions


@dataclass
class Run:
    """One object holding everything `fit` and `finish` need."""

    settings: PretrainingSettings
    accelerator: Accelerator
    precision: str
    data: PretrainingData
    model: torch.nn.Module
    optimizer: torch.optim.Optimizer
    schedule: LearningRateSchedule
    train_loader: DataLoader
    eval_loader: DataLoader
    progress: TrainingProgress
    max_train_steps: int
    num_epochs: int
    summary: dict[str, Any]  # facts of the run for training_args.json, the tracker and the model card


def setup_run(
    settings: PretrainingSettings,
    data: PretrainingData,
    accelerator: Accelerator,
    precision: str,
    model_factory: ModelFactory,
) -> Run:
    """Build model, optimizer, schedule and loaders, prepared by accelerate (not yet resumed)."""
    optimization = settings.optimization
    model = model_factory(data.config)
    if settings.model.attention_init == "structured":  # a resumed run then loads its checkpoint over it
        init_structured_attention(model, seed=optimization.seed)
    num_parameters = sum(p.numel() for p in model.parameters())
    set_seed(optimization.seed, device_specific=True)  # same initial weights everywhere, distinct dropout
    train_loader, eval_loader, max_predictions = build_loaders(settings, data, accelerator.device)
    if optimization.torch_compile:  # static shapes throughout (see build_loaders): one graph, never dynamic
        # In place: the model stays itself, so checkpoints and the final folder keep its parameter names
        # (torch.compile's wrapper would prefix them with "_orig_mod.").
        model.compile(dynamic=False)
    optimizer = torch.optim.AdamW(
        optimizer_parameter_groups(model, optimization.weight_decay),
        lr=optimization.learning_rate,
        betas=(optimization.adam_beta1, optimization.adam_beta2),
        eps=optimization.adam_epsilon,
        fused=accelerator.device.type in ("cpu", "cuda"),  # one kernel for all parameters: measured faster
    )
    updates_per_epoch = math.ceil(
        math.ceil(len(train_loader) / accelerator.num_processes) / optimization.gradient_accumulation_steps
    )
    max_train_steps = optimization.max_train_steps or (
        # A time budget alone runs as many epochs as fit in it; otherwise --num_train_epochs.
        UNBOUNDED_STEPS if optimization.max_train_seconds else optimization.num_train_epochs * updates_per_epoch
    )
    schedule = LearningRateSchedule(
        peak=optimization.learning_rate,
        warmup_steps=optimization.num_warmup_steps,
        max_steps=max_train_steps,
        max_seconds=optimization.max_train_seconds,
        shape=optimization.lr_scheduler_type,
    )
    model, optimizer = accelerator.prepare(model, optimizer)
    train_loader = accelerator.prepare_data_loader(train_loader)
    eval_loader = accelerator.prepare_data_loader(eval_loader)
    progress = TrainingProgress()
    accelerator.register_for_checkpointing(progress)
    corpus = settings.corpus
    summary = {
        **settings.to_dict(),
        "model_class": type(accelerator.unwrap_model(model)).__name__,
        "num_parameters": num_parameters,
        "model_vocab_size": data.config.vocab_size,
        "precision": precision,
        "static_masked_slots": max_predictions,
        "num_processes": accelerator.num_processes,
        "planned_train_steps": max_train_steps,
        "train_instances": len(data.train),
        "eval_instances": len(data.evaluation),
        "corpus": corpus.dataset_name or corpus.train_file or "shipped WikiText-2 sample",
    }
    logger.info(
        f"{len(data.train)} training instances, {len(data.evaluation)} evaluation instances; up to "
        f"{max_train_steps} updates of {optimization.per_device_train_batch_size} x {accelerator.num_processes}"
        f" x {optimization.gradient_accumulation_steps} instances; {num_parameters / 1e6:.1f}M parameters."
    )
    return Run(
        settings=settings,
        accelerator=accelerator,
        precision=precision,
        data=data,
        model=model,
        optimizer=optimizer,
        schedule=schedule,
        train_loader=train_loader,
        eval_loader=eval_loader,
        progress=progress,
        max_train_steps=max_train_steps,
        num_epochs=math.ceil(max_train_steps / updates_per_epoch),
        summary=summary,
    )


# ---------------------------------------------------------------------------------------------------------
# fit: the loop, its metrics and evaluation
# ---------------------------------------------------------------------------------------------------------


# Sums that make every MLM/NSP metric, accumulated on the device and reduced once per log or evaluation.
STATISTICS = ("mlm_loss_sum", "mlm_correct", "masked_tokens", "nsp_loss_sum", "nsp_correct", "instances")


def batch_statistics(outputs: Any, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    """(6,) float64 sums of a batch (see STATISTICS), from the masked-rows outputs; no host synchronisation."""
    labels = batch["labels"]
    masked_tokens = (labels != IGNORE_INDEX).sum()
    predictions = outputs.prediction_logits.argmax(-1)  # (M,) dynamic path, (B, P) static path
    if predictions.shape != labels.shape:  # dynamic: rows in the row-major order of labels != -100
        labels = labels[labels != IGNORE_INDEX]
    if "next_sentence_label" in batch:
        nsp_labels = batch["next_sentence_label"]
        instances = (nsp_labels != IGNORE_INDEX).sum()  # padding rows of a filled-up batch carry -100
        nsp_loss_sum = outputs.nsp_loss.detach().float() * instances
        nsp_correct = (outputs.seq_relationship_logits.argmax(-1) == nsp_labels).sum()
    else:  # --objective mlm
        instances = nsp_loss_sum = nsp_correct = torch.zeros((), device=labels.device)
    return torch.stack(
        [
            outputs.mlm_loss.detach().float() * masked_tokens,
            (predictions == labels).sum(),  # -100 never equals a prediction
            masked_tokens,
            nsp_loss_sum,
            nsp_correct,
            instances,
        ]
    ).double()


def metrics_from_statistics(totals: torch.Tensor, prefix: str) -> dict[str, float]:
    """MLM loss, accuracy, perplexity and NSP loss, accuracy from summed statistics."""
    mlm_sum, mlm_correct, masked, nsp_sum, nsp_correct, instances = totals.tolist()
    mlm_loss = mlm_sum / max(masked, 1.0)
    metrics = {
        f"{prefix}mlm_loss": mlm_loss,
        f"{prefix}mlm_accuracy": mlm_correct / max(masked, 1.0),
        f"{prefix}perplexity": math.exp(min(mlm_loss, 50.0)),
    }
    if instances == 0:  # --objective mlm: no NSP labels
        return metrics
    return metrics | {
        f"{prefix}nsp_loss": nsp_sum / max(instances, 1.0),
        f"{prefix}nsp_accuracy": nsp_correct / max(instances, 1.0),
    }


@torch.no_grad()
def evaluate(run: Run) -> dict[str, float]:
    """MLM loss, accuracy and perplexity, NSP loss and accuracy on the evaluation instances.

    The evaluation loader's masks come from its batches' draw ids (`hfbert.collator`), so every evaluation of a
    run scores the same masked tokens and no RNG stream of training, CPU or CUDA, is touched. (With several
    processes, accelerate repeats a few instances to even out the last batch; they count twice.)
    """
    accelerator = run.accelerator
    run.model.eval()
    totals = torch.zeros(len(STATISTICS), dtype=torch.float64, device=accelerator.device)
    for batch in run.eval_loader:
        totals += batch_statistics(run.model(**batch, mlm_masked_rows_only=True), batch)
    run.model.train()
    return metrics_from_statistics(accelerator.reduce(totals, "sum"), prefix="eval_")


def check_loss_is_finite(loss: torch.Tensor, precision: str, step: int, learning_rate: float) -> None:
    """Stop with advice on a NaN/inf loss; under fp16 the grad scaler skips such steps, so only warn."""
    if torch.isfinite(loss):
        return
    if precision == "fp16":
        logger.warning(f"Non-finite loss ({loss.item()}) at step {step}: the fp16 grad scaler skips this update.")
        return
    raise FloatingPointError(
        f"The training loss became {loss.item()} at step {step} (learning rate {learning_rate:.3g}, precision "
        f"{precision}). Lower --learning_rate, raise --num_warmup_steps or keep --max_grad_norm > 0, then resume "
        "from the last good checkpoint with --resume_from_checkpoint latest."
    )


@dataclass
class TrainingWindow:
    """Training statistics since the last log row, kept on the device (read once per logging interval)."""

    totals: torch.Tensor
    tokens: torch.Tensor
    loss: torch.Tensor
    start_seconds: float
    batches: int = 0

    @classmethod
    def start(cls, device: torch.device, seconds: float) -> TrainingWindow:
        zeros = torch.zeros(len(STATISTICS), dtype=torch.float64, device=device)
        scalar = torch.zeros((), dtype=torch.float64, device=device)
        return cls(totals=zeros, tokens=scalar, loss=scalar.clone(), start_seconds=seconds)

    def add(self, outputs: Any, loss: torch.Tensor, batch: dict[str, torch.Tensor]) -> None:
        self.totals += batch_statistics(outputs, batch)
        self.tokens += batch["attention_mask"].sum()
        self.loss += loss.detach()
        self.batches += 1

    def row(self, run: Run, epoch: int, learning_rate: float) -> dict[str, Any]:
        """The log row of this window (reduced over processes)."""
        accelerator, progress = run.accelerator, run.progress
        seconds = max(progress.train_seconds - self.start_seconds, 1e-9)
        return {
            "step": progress.completed_steps,
            "epoch": epoch,
            "train_seconds": progress.train_seconds,
            "loss": accelerator.reduce(self.loss, "mean").item() / max(self.batches, 1),
            **metrics_from_statistics(accelerator.reduce(self.totals, "sum"), prefix="train_"),
            "learning_rate": learning_rate,
            "tokens_per_second": accelerator.reduce(self.tokens, "sum").item() / seconds,
        }


def log_row(run: Run, row: dict[str, Any]) -> None:
    """Append a row to the run's history (saved with checkpoints and the final folder) and the tracker."""
    run.progress.log_history.append(row)
    if run.settings.run.with_tracking:
        run.accelerator.log({k: v for k, v in row.items() if k != "step"}, step=row["step"])


def run_evaluation(run: Run) -> dict[str, float]:
    """Evaluate, log the row and return the metrics."""
    metrics = evaluate(run)
    log_row(run, {"step": run.progress.completed_steps, "train_seconds": run.progress.train_seconds, **metrics})
    logger.info(f"step {run.progress.completed_steps}: " + ", ".join(f"{k} {v:.4f}" for k, v in metrics.items()))
    return metrics


def synced_train_seconds(run: Run) -> float:
    """Training seconds so far as the slowest process sees them, so that every process takes the same
    decisions (stop, learning rate). Costs one reduction, only when a time budget is set."""
    if run.schedule.max_seconds is None or run.accelerator.num_processes == 1:
        return run.progress.train_seconds
    seconds = torch.tensor(run.progress.train_seconds, dtype=torch.float64, device=run.accelerator.device)
    return run.accelerator.reduce(seconds, "max").item()


def train_step(run: Run, batch: dict[str, torch.Tensor], learning_rate: float) -> tuple[Any, torch.Tensor]:
    """Forward, backward and (at the end of an accumulation) the optimizer update of one micro-batch."""
    accelerator, optimization = run.accelerator, run.settings.optimization
    with accelerator.accumulate(run.model):
        outputs = run.model(**batch, mlm_masked_rows_only=True)
        loss = outputs.mlm_loss
        if outputs.nsp_loss is not None:  # None under --objective mlm
            loss = loss + optimization.nsp_loss_weight * outputs.nsp_loss
        # On CUDA the check waits for the device, so it runs once per logging interval instead (in fit).
        if accelerator.device.type != "cuda":
            check_loss_is_finite(loss, run.precision, run.progress.completed_steps + 1, learning_rate)
        accelerator.backward(loss)
        if accelerator.sync_gradients and optimization.max_grad_norm > 0:
            accelerator.clip_grad_norm_(run.model.parameters(), optimization.max_grad_norm)
        run.optimizer.step()
        run.optimizer.zero_grad(set_to_none=True)
    return outputs, loss


def is_due(step: int, every: int | None) -> bool:
    return every is not None and step % every == 0


def out_of_budget(run: Run, seconds: float) -> bool:
    """Whether the step budget, or the time budget (`seconds` synced over processes), is spent."""
    over_time = run.schedule.max_seconds is not None and seconds >= run.schedule.max_seconds
    return run.progress.completed_steps >= run.max_train_steps or over_time


class Preempted(RuntimeError):
    """The run stopped on a scheduler's signal after writing a checkpoint; the message says how to resume."""

    def __init__(self, message: str, signal_number: int):
        super().__init__(message)
        self.signal_number = signal_number


class PreemptionSignals:
    """While active, SIGTERM and SIGUSR1 (what Slurm and Kubernetes send before they kill) are recorded
    instead of ending the process, so the loop can finish its update and write a checkpoint; a second signal
    during that save changes nothing. Previous handlers come back on exit. Only the main thread can install
    handlers; elsewhere signals keep their handlers."""

    SIGNALS = (signal.SIGTERM, signal.SIGUSR1)

    def __init__(self) -> None:
        self.signal_number: int | None = None
        self._previous: dict[int, Any] = {}

    def record(self, signal_number: int, frame: Any) -> None:
        self.signal_number = self.signal_number or signal_number

    def __enter__(self) -> PreemptionSignals:
        if threading.current_thread() is threading.main_thread():
            self._previous = {number: signal.signal(number, self.record) for number in self.SIGNALS}
        return self

    def __exit__(self, *exc_info: Any) -> None:
        for number, handler in self._previous.items():
            signal.signal(number, handler)

    def agreed(self, run: Run, due: bool) -> bool:
        """Whether every process stops now. One process: as soon as a signal came. Several: at logging steps,
        where a reduction tells all of them (a signal may reach them at different updates)."""
        if run.accelerator.num_processes == 1:
            return self.signal_number is not None
        if not due:
            return False
        flag = torch.tensor(float(self.signal_number or 0), device=run.accelerator.device)
        self.signal_number = int(run.accelerator.reduce(flag, "max").item()) or None
        return self.signal_number is not None


def stop_for_preemption(run: Run, signal_number: int, checkpoint_saved: bool) -> None:
    """Write a checkpoint at this update (unless one was just written) and raise `Preempted`."""
    checkpoint = save_run_checkpoint(run) if not checkpoint_saved else None
    name = signal.Signals(signal_number).name
    where = checkpoint or Path(run.settings.run.output_dir) / f"checkpoint-{run.progress.completed_steps}"
    raise Preempted(
        f"Stopped by {name} after update {run.progress.completed_steps}; the training state is saved in "
        f"{where}. Resume with the same command plus --resume_from_checkpoint latest.",
        signal_number,
    )


def log_window(run: Run, window: TrainingWindow, epoch: int, learning_rate: float, bar: tqdm) -> None:
    """Read the window's statistics (the one host synchronisation of a logging interval) into the log and bar."""
    row = window.row(run, epoch, learning_rate)
    check_loss_is_finite(torch.tensor(row["loss"]), run.precision, row["step"], learning_rate)
    log_row(run, row)
    bar.set_postfix(
        mlm=f"{row['train_mlm_loss']:.3f}",
        mlm_acc=f"{row['train_mlm_accuracy']:.3f}",
        nsp=f"{row.get('train_nsp_loss', math.nan):.3f}",  # nan under --objective mlm
        nsp_acc=f"{row.get('train_nsp_accuracy', math.nan):.3f}",
        lr=f"{learning_rate:.2e}",
        tok_s=f"{row['tokens_per_second']:.0f}",
    )


def fit(run: Run) -> dict[str, float]:
    """Train until the step or time budget runs out; log, evaluate and checkpoint on their schedules. On
    SIGTERM/SIGUSR1, write a checkpoint and raise `Preempted`. Returns the final evaluation metrics."""
    accelerator, progress, settings = run.accelerator, run.progress, run.settings
    every_checkpoint = settings.run.checkpointing_steps
    checkpoint_steps = int(every_checkpoint) if every_checkpoint not in (None, "epoch") else None
    bar = tqdm(
        total=None if run.schedule.max_seconds else run.max_train_steps,  # a time budget ends at an unknown step
        initial=progress.completed_steps,
        disable=not accelerator.is_local_main_process,
        desc="pretraining",
        unit="step",
        dynamic_ncols=True,
    )
    window = TrainingWindow.start(accelerator.device, progress.train_seconds)
    clock = time.perf_counter()  # start of the current stretch of training time
    seconds = synced_train_seconds(run)
    metrics: dict[str, float] | None = None
    run.model.train()
    with PreemptionSignals() as preemption:
        for epoch in range(progress.epoch, run.num_epochs):
            if out_of_budget(run, seconds):
                break
            run.train_loader.set_epoch(epoch)
            batches = run.train_loader
            if progress.batch_in_epoch:  # resumed mid-epoch
                batches = accelerator.skip_first_batches(run.train_loader, progress.batch_in_epoch)
            for batch in batches:
                learning_rate = run.schedule(progress.completed_steps, seconds)
                for group in run.optimizer.param_groups:
                    group["lr"] = learning_rate
                outputs, loss = train_step(run, batch, learning_rate)
                progress.batch_in_epoch += 1
                window.add(outputs, loss, batch)
                if not accelerator.sync_gradients:
                    continue
                progress.completed_steps += 1
                step, now = progress.completed_steps, time.perf_counter()
                progress.train_seconds += now - clock
                seconds = synced_train_seconds(run)
                bar.update(1)
                log_due = is_due(step, settings.run.logging_steps) or step == run.max_train_steps
                if log_due:
                    log_window(run, window, epoch, learning_rate, bar)
                    window = TrainingWindow.start(accelerator.device, progress.train_seconds)
                if is_due(step, settings.run.eval_steps):
                    metrics = run_evaluation(run)
                if is_due(step, checkpoint_steps):
                    save_run_checkpoint(run)
                if preemption.agreed(run, due=log_due):
                    bar.close()
                    stop_for_preemption(run, preemption.signal_number, is_due(step, checkpoint_steps))
                clock = time.perf_counter()  # evaluation and saving are not training time
                if out_of_budget(run, seconds):
                    break
            else:  # the epoch ran to its end
                progress.epoch += 1
                progress.batch_in_epoch = 0
                if settings.run.eval_steps is None:
                    metrics = run_evaluation(run)
                if every_checkpoint == "epoch":
                    save_run_checkpoint(run)
                clock = time.perf_counter()
    bar.close()
    last_eval = next((row["step"] for row in reversed(progress.log_history) if "eval_mlm_loss" in row), None)
    if metrics is None or last_eval != progress.completed_steps:
        metrics = run_evaluation(run)
    return metrics


def save_run_checkpoint(run: Run) -> Path:
    """A checkpoint with the run's settings (compared on resume) and its tokenizer (reused on resume)."""
    return save_checkpoint(
        run.accelerator,
        run.settings.run.output_dir,
        run.progress.completed_steps,
        run.settings.run.checkpoints_total_limit,
        run_settings=run.settings.resume_invariant(),
        tokenizer=run.data.tokenizer,
    )


# ---------------------------------------------------------------------------------------------------------
# finish, and the whole run
# ---------------------------------------------------------------------------------------------------------


def finish(run: Run, metrics: dict[str, float]) -> Path:
    """Gather the weights, write the final folder (main process) and push it if asked."""
    accelerator, settings = run.accelerator, run.settings
    accelerator.wait_for_everyone()
    output_dir = Path(settings.run.output_dir)
    state_dict = accelerator.get_state_dict(run.model)  # on every process: gathers FSDP shards
    if accelerator.is_main_process:
        write_final_folder_or_explain(
            output_dir,
            model=accelerator.unwrap_model(run.model),  # compiled in place: never a wrapper
            state_dict=state_dict,
            tokenizer=run.data.tokenizer,
            summary=run.summary,
            eval_results={"step": run.progress.completed_steps, "train_seconds": run.progress.train_seconds, **metrics},
            log_history=run.progress.log_history,
            corpus=settings.corpus,
            model_name=(settings.run.hub_model_id or output_dir.name).split("/")[-1],
            sample_sentences=(run.data.sample_sentences, run.data.other_sentence),
        )
        if settings.run.push_to_hub:
            logger.info(f"Pushed to {push_to_hub(output_dir, settings.run.hub_model_id, token=settings.run.hub_token)}")
    accelerator.wait_for_everyone()
    accelerator.end_training()
    return output_dir


def write_final_folder_or_explain(output_dir: Path, **contents: Any) -> None:
    """`write_final_folder`, with a failure (e.g. a full disk) explained: what is intact and how to finish."""
    try:
        write_final_folder(output_dir, **contents)
    except (OSError, RuntimeError) as error:  # torch reports a full disk as a RuntimeError
        raise OSError(
            f"Writing the final folder {output_dir} failed ({type(error).__name__}: {error}); its previous files, "
            f"if any, are intact. If the disk is full (check with `df -h {output_dir}`), free space, then rerun "
            "the same command with --resume_from_checkpoint latest: a run resumed at its last step goes straight "
            "to this save (with --checkpointing_steps, the last checkpoint is at most that many steps back)"
        ) from error


def check_before_work(settings: PretrainingSettings, accelerator: Accelerator) -> Path | None:
    """Everything that can refuse the run, before data is read or a file written: the run folder, the
    checkpoint to resume (verified once, on the main process) and its settings, and Hub access for a push.
    Returns the checkpoint to resume from, if any."""
    run = settings.run
    check_run_folder(
        run.output_dir, resume_from_checkpoint=run.resume_from_checkpoint, overwrite_output_dir=run.overwrite_output_dir
    )
    for flag, value in (("--config_name", settings.model.config_name), ("--tokenizer_name", settings.data.tokenizer_name)):
        if value is not None:  # a truncated or garbled file is named now, not deep inside transformers later
            check_local_files(value, flag, f"write or copy it again, or pass another {flag}")
    if run.push_to_hub:
        check_hub_access(run.hub_model_id, token=run.hub_token, train_anyway=run.train_if_hub_unreachable)
    if run.resume_from_checkpoint is None:
        return None
    verified = [None]
    if accelerator.is_main_process:
        checkpoint = resolve_resume_checkpoint(run.output_dir, run.resume_from_checkpoint)
        for note in check_resume_settings(read_run_settings(checkpoint), settings, str(checkpoint)):
            logger.warning(note)
        verified = [str(checkpoint)]
    if accelerator.num_processes > 1:  # every process resumes the folder the main process verified
        broadcast_object_list(verified, from_process=0)
    return Path(verified[0])


def pretrain(settings: PretrainingSettings, model_factory: ModelFactory = hfbert_model) -> Path:
    """Pretrain and return the final model folder: prepare_data -> setup_run -> fit -> finish."""
    logging.basicConfig(format="%(asctime)s %(levelname)s %(name)s: %(message)s", level=logging.WARNING)
    if settings.optimization.deterministic:
        use_deterministic_algorithms()
    accelerator, precision = build_accelerator(settings)
    with run_folder_lock(settings.run.output_dir, main_process=accelerator.is_main_process):
        checkpoint = check_before_work(settings, accelerator)
        set_seed(settings.optimization.seed)
        data = prepare_data(settings, accelerator, checkpoint)
        output_dir = Path(settings.run.output_dir)
        if accelerator.is_main_process:
            if settings.run.overwrite_output_dir:
                remove_checkpoints(output_dir)
            publish_files(output_dir)  # finishes a final folder whose publication was interrupted
        accelerator.wait_for_everyone()
        run = setup_run(settings, data, accelerator, precision, model_factory)
        if checkpoint is not None:
            logger.info(f"Resuming from {checkpoint}")
            load_checkpoint(accelerator, checkpoint)
        if settings.run.with_tracking:
            accelerator.init_trackers("hfbert-pretraining", config=run.summary)
        metrics = fit(run)
        return finish(run, metrics)
