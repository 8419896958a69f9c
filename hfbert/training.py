"""BERT pretraining (masked LM + next sentence prediction) with accelerate: the library behind run_pretraining.py.

corpus (hfbert.corpus) -> tokenizer (hfbert.tokenization) -> NSP instances (hfbert.pretraining_data)
-> padded batches, masked per step (hfbert.collator) -> this loop -> checkpoints (hfbert.checkpointing)
-> final folder: model, tokenizer, eval_results.json, training_curves.png, model card (hfbert.model_card).

Argument names follow transformers' examples/pytorch/language-modeling/run_mlm_no_trainer.py.
"""

import logging
import math
import os
import shutil
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import datasets
import torch
import torch.nn.functional as F
import transformers
from accelerate import Accelerator, DataLoaderConfiguration
from accelerate.utils import parse_flag_from_env, set_seed
from torch.utils.data import DataLoader
from tqdm.auto import tqdm
from transformers import AutoTokenizer, DataCollatorWithPadding, HfArgumentParser, get_scheduler

from hfbert.checkpointing import (
    TrainingProgress,
    check_output_dir,
    load_checkpoint,
    remove_checkpoints,
    resolve_resume_checkpoint,
    save_checkpoint,
    write_json_atomic,
)
from hfbert.collator import DataCollatorForPretraining
from hfbert.configuration_hfbert import PRESETS, HfBertConfig
from hfbert.convert import bert_config_for
from hfbert.corpus import CorpusArguments, load_documents
from hfbert.model_card import build_model_card, push_to_hub, write_model_card
from hfbert.modeling_hfbert import IGNORE_INDEX, HfBertForPreTraining
from hfbert.plotting import plot_training_curves
from hfbert.pretraining_data import build_nsp_instances, tokenize_documents
from hfbert.tokenization import (
    check_tokenizer_matches_config,
    model_config_for_tokenizer,
    save_tokenizer,
    train_tokenizer,
)

# A plain logger: helpers log before any Accelerator exists; train() silences info on non-main processes.
logger = logging.getLogger(__name__)

CURVES_NAME = "training_curves.png"
EVAL_RESULTS_NAME = "eval_results.json"
TRAINING_ARGS_NAME = "training_args.json"
LOG_HISTORY_NAME = "log_history.json"
FILL_MASK_EXAMPLE = "The game was released in [MASK] ."


@dataclass
class PretrainingArguments:
    """Model, optimisation and output flags of run_pretraining.py (corpus flags: `CorpusArguments`)."""

    output_dir: str = field(metadata={"help": "Where checkpoints and the final model folder are written."})
    tokenizer_name: str | None = field(
        default=None,
        metadata={
            "help": "A trained tokenizer folder (train_tokenizer.py). Without it, a WordPiece tokenizer of "
            "--vocab_size is trained on the training corpus first and saved with the model."
        },
    )
    vocab_size: int = field(
        default=30522,
        metadata={"help": "Vocabulary of the tokenizer trained when --tokenizer_name is not given."},
    )
    config_name: str | None = field(
        default=None,
        metadata={"help": "A config.json (or its folder) for the model; overrides --model_size."},
    )
    model_size: Literal["tiny", "mini", "small", "medium", "base", "large"] = field(
        default="mini", metadata={"help": f"BERT size preset: {', '.join(PRESETS)}."}
    )
    model_implementation: Literal["hfbert", "transformers"] = field(
        default="hfbert",
        metadata={
            "help": "Train hfbert, or transformers.BertForPreTraining with the same initial weights (for "
            "side-by-side comparisons; its folder then loads with stock transformers)."
        },
    )
    max_seq_length: int = field(
        default=128, metadata={"help": "Longest instance, [CLS] A [SEP] B [SEP] included."}
    )
    short_seq_prob: float = field(
        default=0.1, metadata={"help": "Share of instances with a shorter random target."}
    )
    dupe_factor: int = field(
        default=1, metadata={"help": "Passes over the corpus with fresh NSP pairings (google-research/bert)."}
    )
    mlm_probability: float = field(
        default=0.15, metadata={"help": "Share of tokens chosen for the MLM loss."}
    )
    validation_split_percentage: int = field(
        default=5,
        metadata={"help": "Documents held out for evaluation when the corpus has no validation split."},
    )
    max_eval_samples: int | None = field(
        default=None, metadata={"help": "Evaluate on at most this many instances."}
    )
    per_device_train_batch_size: int = field(default=32, metadata={"help": "Batch size per process."})
    per_device_eval_batch_size: int = field(
        default=64, metadata={"help": "Evaluation batch size per process."}
    )
    gradient_accumulation_steps: int = field(default=1, metadata={"help": "Batches per optimizer update."})
    learning_rate: float = field(default=1e-4, metadata={"help": "Peak AdamW learning rate."})
    weight_decay: float = field(
        default=0.01, metadata={"help": "AdamW weight decay (none on biases, LayerNorm)."}
    )
    adam_beta1: float = field(default=0.9, metadata={"help": "AdamW beta1."})
    adam_beta2: float = field(default=0.999, metadata={"help": "AdamW beta2."})
    adam_epsilon: float = field(default=1e-6, metadata={"help": "AdamW epsilon (BERT used 1e-6)."})
    num_train_epochs: int = field(default=3, metadata={"help": "Epochs, unless --max_train_steps is given."})
    max_train_steps: int | None = field(
        default=None, metadata={"help": "Optimizer updates; overrides epochs."}
    )
    max_train_seconds: float | None = field(
        default=None,
        metadata={
            "help": "Stop after this much training time (evaluation and saving excluded), e.g. 3600; pair it "
            "with a schedule that does not depend on the end, e.g. constant_with_warmup."
        },
    )
    lr_scheduler_type: str = field(
        default="linear",
        metadata={"help": "transformers scheduler: linear, cosine, constant_with_warmup, ..."},
    )
    num_warmup_steps: int = field(default=0, metadata={"help": "Linear warmup updates."})
    max_grad_norm: float = field(default=1.0, metadata={"help": "Gradient clipping norm (0 disables)."})
    seed: int = field(
        default=42, metadata={"help": "Seed of initialisation, pairing, masking and shuffling."}
    )
    mixed_precision: Literal["auto", "no", "fp16", "bf16"] = field(
        default="auto",
        metadata={
            "help": "auto: what `accelerate launch --mixed_precision` asked for, else fp16 on CUDA, bf16 on a "
            "CPU with native bf16, fp32 otherwise. fp16 on a CPU warns and falls back."
        },
    )
    torch_compile: bool = field(default=False, metadata={"help": "Compile the model with torch.compile."})
    checkpointing_steps: str | None = field(
        default=None, metadata={"help": "Save the full training state every N updates, or 'epoch'."}
    )
    checkpoints_total_limit: int | None = field(
        default=None, metadata={"help": "Keep only the newest N checkpoints."}
    )
    resume_from_checkpoint: str | None = field(
        default=None, metadata={"help": "A checkpoint folder, or 'latest' (newest in --output_dir)."}
    )
    overwrite_output_dir: bool = field(
        default=False, metadata={"help": "Replace another run's checkpoints and model in --output_dir."}
    )
    eval_steps: int | None = field(
        default=None, metadata={"help": "Evaluate every N updates (default: each epoch)."}
    )
    logging_steps: int = field(default=10, metadata={"help": "Log the training loss every N updates."})
    preprocessing_num_workers: int | None = field(
        default=None, metadata={"help": "Processes for datasets.map."}
    )
    with_tracking: bool = field(
        default=False, metadata={"help": "Log metrics to the trackers of --report_to."}
    )
    report_to: str = field(
        default="all", metadata={"help": "accelerate trackers: tensorboard, wandb, ... or all."}
    )
    push_to_hub: bool = field(default=False, metadata={"help": "Upload the final folder to the Hub."})
    hub_model_id: str | None = field(
        default=None, metadata={"help": "Hub repo id, e.g. user/hfbert-mini-wikitext."}
    )
    hub_token: str | None = field(default=None, metadata={"help": "Hub token (default: the logged-in one)."})

    def __post_init__(self) -> None:
        steps = self.checkpointing_steps
        if steps not in (None, "epoch") and (not steps.isdigit() or int(steps) < 1):
            raise ValueError(
                f"--checkpointing_steps {self.checkpointing_steps!r} must be a positive number of updates "
                "or 'epoch'"
            )
        if self.push_to_hub and not self.hub_model_id:
            raise ValueError("--push_to_hub needs --hub_model_id (e.g. your-name/hfbert-mini-wikitext)")
        for name in (
            "per_device_train_batch_size",
            "per_device_eval_batch_size",
            "gradient_accumulation_steps",
        ):
            if getattr(self, name) < 1:
                raise ValueError(f"--{name} must be >= 1, got {getattr(self, name)}")
        if not 0.0 < self.mlm_probability < 1.0:
            raise ValueError(f"--mlm_probability {self.mlm_probability} must be in (0, 1)")


def parse_args(argv: list[str] | None = None) -> tuple[CorpusArguments, PretrainingArguments]:
    """Parse run_pretraining.py's command line (corpus flags + pretraining flags)."""
    parser = HfArgumentParser((CorpusArguments, PretrainingArguments))
    corpus_args, args = parser.parse_args_into_dataclasses(args=argv)
    return corpus_args, args


# ---------------------------------------------------------------------------------------------------------
# Precision
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


# ---------------------------------------------------------------------------------------------------------
# Data
# ---------------------------------------------------------------------------------------------------------


def build_model_config(args: PretrainingArguments, tokenizer: Any) -> HfBertConfig:
    """The model config (from --config_name or the --model_size preset), checked against the tokenizer and
    --max_seq_length before anything is trained or written."""
    if args.config_name is not None:
        config = HfBertConfig.from_pretrained(args.config_name)
        check_tokenizer_matches_config(tokenizer, config)
    else:
        config = model_config_for_tokenizer(tokenizer, args.model_size)
    if args.max_seq_length > config.max_position_embeddings:
        raise ValueError(
            f"--max_seq_length {args.max_seq_length} exceeds the model's max_position_embeddings "
            f"{config.max_position_embeddings}; pass --max_seq_length <= {config.max_position_embeddings}"
        )
    return config


def build_instances(
    documents: datasets.DatasetDict, tokenizer: Any, args: PretrainingArguments
) -> tuple[datasets.Dataset, datasets.Dataset]:
    """NSP instances for training (`dupe_factor` passes) and evaluation (one pass), cached by datasets."""
    if "validation" not in documents:
        held_out = documents["train"].train_test_split(
            test_size=args.validation_split_percentage / 100, seed=args.seed
        )
        documents = datasets.DatasetDict(train=held_out["train"], validation=held_out["test"])
    nsp = {
        "cls_token_id": tokenizer.cls_token_id,
        "sep_token_id": tokenizer.sep_token_id,
        "max_seq_length": args.max_seq_length,
        "short_seq_prob": args.short_seq_prob,
        "seed": args.seed,
        "num_proc": args.preprocessing_num_workers,
    }
    tokenized = {
        split: tokenize_documents(documents[split], tokenizer, num_proc=args.preprocessing_num_workers)
        for split in ("train", "validation")
    }
    train = datasets.concatenate_datasets(
        [
            build_nsp_instances(tokenized["train"], pass_index=index, **nsp)
            for index in range(args.dupe_factor)
        ]
    )
    evaluation = build_nsp_instances(tokenized["validation"], pass_index=0, **nsp)
    if args.max_eval_samples is not None:
        evaluation = evaluation.select(range(min(args.max_eval_samples, len(evaluation))))
    return train, evaluation


def masked_batch(
    batch: dict[str, torch.Tensor], collator: DataCollatorForPretraining, device: torch.device
) -> dict[str, torch.Tensor]:
    """Mask a padded CPU batch for MLM and move it to `device`.

    Masking happens here, in the loop, rather than in the DataLoader's collate_fn: accelerate's loader
    prefetches one batch ahead, so masks drawn there would come from the RNG state *after* a checkpoint and a
    resumed run would mask differently. Here they come from the RNG state accelerate saves and restores.
    """
    input_ids, labels = collator.torch_mask_tokens(batch["input_ids"].clone())
    masked = {**batch, "input_ids": input_ids, "labels": labels}
    return {key: value.to(device, non_blocking=True) for key, value in masked.items()}


# ---------------------------------------------------------------------------------------------------------
# Model and optimiser
# ---------------------------------------------------------------------------------------------------------


def build_model(config: HfBertConfig, implementation: str) -> torch.nn.Module:
    """hfbert's model, or transformers' BertForPreTraining holding the very same initial weights."""
    model = HfBertForPreTraining(config)
    if implementation == "hfbert":
        return model
    reference = transformers.BertForPreTraining(bert_config_for(config))
    reference.load_state_dict(model.state_dict(), strict=True)
    return reference


def optimizer_parameter_groups(model: torch.nn.Module, weight_decay: float) -> list[dict[str, Any]]:
    """AdamW groups as in BERT: weight decay on weight matrices only, none on biases and LayerNorm."""
    decay, no_decay = [], []
    for name, parameter in model.named_parameters():
        if not parameter.requires_grad:
            continue
        (no_decay if parameter.ndim < 2 or "LayerNorm" in name else decay).append(parameter)
    return [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]


# ---------------------------------------------------------------------------------------------------------
# Evaluation
# ---------------------------------------------------------------------------------------------------------


@torch.no_grad()
def evaluate(
    model: torch.nn.Module,
    dataloader: DataLoader,
    collator: DataCollatorForPretraining,
    accelerator: Accelerator,
    seed: int,
) -> dict[str, float]:
    """MLM loss, accuracy and perplexity, NSP loss and accuracy on the evaluation instances.

    The masks are drawn from a forked RNG seeded with `seed`, so every evaluation of a run scores the same
    masked tokens and the training RNG stream is untouched. (With several processes, accelerate repeats a few
    instances to even out the last batch; they count twice.)
    """
    model.eval()
    # mlm loss sum, mlm correct, masked tokens, nsp loss sum, nsp correct, instances
    totals = torch.zeros(6, dtype=torch.float64, device=accelerator.device)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        for batch in dataloader:
            batch = masked_batch(batch, collator, accelerator.device)
            output = model(**batch)
            masked = batch["labels"] != IGNORE_INDEX
            mlm_logits = output.prediction_logits
            if mlm_logits.dim() == 3:  # a dense head (transformers, or mlm_masked_rows_only=False)
                mlm_logits = mlm_logits[masked]
            mlm_logits, targets = mlm_logits.float(), batch["labels"][masked]
            nsp_logits, nsp_labels = output.seq_relationship_logits.float(), batch["next_sentence_label"]
            totals += torch.stack(
                [
                    F.cross_entropy(mlm_logits, targets, reduction="sum"),
                    (mlm_logits.argmax(-1) == targets).sum(),
                    masked.sum(),
                    F.cross_entropy(nsp_logits, nsp_labels, reduction="sum"),
                    (nsp_logits.argmax(-1) == nsp_labels).sum(),
                    torch.tensor(len(nsp_labels), device=accelerator.device),
                ]
            ).double()
    model.train()
    mlm_sum, mlm_correct, masked_tokens, nsp_sum, nsp_correct, instances = accelerator.reduce(
        totals, "sum"
    ).tolist()
    mlm_loss = mlm_sum / masked_tokens
    return {
        "eval_mlm_loss": mlm_loss,
        "eval_mlm_accuracy": mlm_correct / masked_tokens,
        "eval_perplexity": math.exp(min(mlm_loss, 50.0)),
        "eval_nsp_loss": nsp_sum / instances,
        "eval_nsp_accuracy": nsp_correct / instances,
    }


# ---------------------------------------------------------------------------------------------------------
# The run
# ---------------------------------------------------------------------------------------------------------


def prepare_tokenizer(
    args: PretrainingArguments, train_documents: datasets.Dataset, accelerator: Accelerator, output_dir: Path
) -> Any:
    """Load --tokenizer_name, or train one on the main process into `output_dir/.tokenizer` (hidden, so it is
    never uploaded) and load it everywhere; a resumed run reuses that folder instead of retraining."""
    if args.tokenizer_name is not None:
        return AutoTokenizer.from_pretrained(args.tokenizer_name)
    trained = output_dir / ".tokenizer"
    if accelerator.is_main_process and not (args.resume_from_checkpoint and trained.is_dir()):
        logger.info(
            f"No --tokenizer_name given: training a WordPiece tokenizer (vocab_size={args.vocab_size}) on the "
            f"training corpus first; it is saved with the model."
        )
        tokenizer = train_tokenizer(train_documents, vocab_size=args.vocab_size)
        save_tokenizer(tokenizer, trained)
    accelerator.wait_for_everyone()
    return AutoTokenizer.from_pretrained(trained)


def check_loss_is_finite(loss: torch.Tensor, precision: str, step: int, learning_rate: float) -> None:
    """Stop with advice on a NaN/inf loss; under fp16 the grad scaler skips such steps, so only warn."""
    if torch.isfinite(loss):
        return
    if precision == "fp16":
        logger.warning(
            f"Non-finite loss ({loss.item()}) at step {step}: the fp16 grad scaler skips this update."
        )
        return
    raise FloatingPointError(
        f"The training loss became {loss.item()} at step {step} (learning rate {learning_rate:.3g}, precision "
        f"{precision}). Lower --learning_rate, raise --num_warmup_steps or keep --max_grad_norm > 0, then resume "
        "from the last good checkpoint with --resume_from_checkpoint latest."
    )


def save_final_folder(
    model: torch.nn.Module,
    state_dict: dict[str, torch.Tensor],
    tokenizer: Any,
    output_dir: Path,
    *,
    training_config: dict[str, Any],
    eval_results: dict[str, float],
    log_history: list[dict[str, Any]],
    corpus_args: CorpusArguments,
    model_name: str,
) -> None:
    """Write model, tokenizer, eval_results.json, training_args.json, curves and model card into a staging
    folder, then move each file into `output_dir` whole (os.replace): a crash never leaves a torn file."""
    staging = output_dir / ".tmp-final"
    shutil.rmtree(staging, ignore_errors=True)
    model.save_pretrained(staging, state_dict=state_dict)
    tokenizer.save_pretrained(staging)
    write_json_atomic(staging / EVAL_RESULTS_NAME, eval_results)
    write_json_atomic(staging / TRAINING_ARGS_NAME, training_config)
    write_json_atomic(staging / LOG_HISTORY_NAME, log_history)
    plot_training_curves(log_history, staging / CURVES_NAME, title=f"{model_name} pretraining")
    card = build_model_card(
        model_name=model_name,
        training_config=training_config,
        eval_results=eval_results,
        dataset_name=corpus_args.dataset_name,
        dataset_config_name=corpus_args.dataset_config_name,
    )
    write_model_card(staging, card)
    for path in staging.iterdir():
        os.replace(path, output_dir / path.name)
    staging.rmdir()


def fill_mask_example(model_dir: Path, mask_token: str) -> str:
    """A few lines showing pipeline("fill-mask") on the saved folder."""
    # The MLM-only model leaves the pooler and NSP head unused; its load report would only be noise here.
    transformers.utils.logging.set_verbosity_error()
    fill_mask = transformers.pipeline("fill-mask", model=str(model_dir), device="cpu")
    text = FILL_MASK_EXAMPLE.replace("[MASK]", mask_token)
    predictions = fill_mask(text, top_k=5)
    lines = [f'pipeline("fill-mask", model="{model_dir}")("{text}"):']
    lines += [f"  {p['score']:.3f}  {p['sequence']}" for p in predictions]
    return "\n".join(lines)


def train(corpus_args: CorpusArguments, args: PretrainingArguments) -> Path:
    """Pretrain and return the final model folder. Every process calls this (accelerate / torchrun)."""
    output_dir = Path(args.output_dir)
    logging.basicConfig(format="%(asctime)s %(levelname)s %(name)s: %(message)s", level=logging.WARNING)
    use_cuda = torch.cuda.is_available() and not parse_flag_from_env("ACCELERATE_USE_CPU")
    precision, precision_reason = resolve_mixed_precision(
        args.mixed_precision, os.environ.get("ACCELERATE_MIXED_PRECISION"), use_cuda
    )
    accelerator = Accelerator(
        mixed_precision=precision,
        gradient_accumulation_steps=args.gradient_accumulation_steps,
        log_with=args.report_to if args.with_tracking else None,
        project_dir=str(output_dir),
        dataloader_config=DataLoaderConfiguration(use_seedable_sampler=True),
    )
    logging.getLogger("hfbert").setLevel(logging.INFO if accelerator.is_main_process else logging.WARNING)
    # accelerate warns at every save that the tied decoder weight is stored once; that is intended here.
    logging.getLogger("accelerate.utils.other").setLevel(logging.ERROR)
    if not accelerator.is_main_process:
        datasets.utils.logging.set_verbosity_error()
        transformers.utils.logging.set_verbosity_error()
    logger.info(
        f"Precision: {precision} ({precision_reason}); device {accelerator.device}, "
        f"{accelerator.num_processes} process(es)."
    )

    # Everything that can refuse the run does so before a single file is written.
    check_output_dir(
        output_dir,
        resume_from_checkpoint=args.resume_from_checkpoint,
        overwrite_output_dir=args.overwrite_output_dir,
    )
    checkpoint = (
        resolve_resume_checkpoint(output_dir, args.resume_from_checkpoint)
        if args.resume_from_checkpoint
        else None
    )
    if corpus_args.streaming:
        raise ValueError(
            "run_pretraining.py pairs sentences across the whole corpus (next sentence prediction) and needs the "
            "datasets cache: drop --streaming (train_tokenizer.py supports it)"
        )
    set_seed(args.seed)
    with accelerator.main_process_first():
        documents = load_documents(corpus_args, num_proc=args.preprocessing_num_workers)
    tokenizer = prepare_tokenizer(args, documents["train"], accelerator, output_dir)
    config = build_model_config(args, tokenizer)
    tokenizer.model_max_length = config.max_position_embeddings  # what the saved model accepts
    with accelerator.main_process_first():
        train_instances, eval_instances = build_instances(documents, tokenizer, args)
    if accelerator.is_main_process and args.overwrite_output_dir:
        remove_checkpoints(output_dir)
    accelerator.wait_for_everyone()

    model = build_model(config, args.model_implementation)
    num_parameters = sum(p.numel() for p in model.parameters())
    set_seed(args.seed, device_specific=True)  # same initial weights everywhere, distinct masks and dropout
    collator = DataCollatorForPretraining(tokenizer, mlm_probability=args.mlm_probability)
    pad = DataCollatorWithPadding(tokenizer, pad_to_multiple_of=collator.pad_to_multiple_of)
    train_loader = DataLoader(
        train_instances,
        batch_size=args.per_device_train_batch_size,
        shuffle=True,
        collate_fn=pad,
        # Its own generator: otherwise each epoch's iterator draws from the global RNG and shifts the masks.
        generator=torch.Generator().manual_seed(args.seed),
    )
    eval_loader = DataLoader(eval_instances, batch_size=args.per_device_eval_batch_size, collate_fn=pad)
    if args.torch_compile:
        model = torch.compile(model)
    optimizer = torch.optim.AdamW(
        optimizer_parameter_groups(model, args.weight_decay),
        lr=args.learning_rate,
        betas=(args.adam_beta1, args.adam_beta2),
        eps=args.adam_epsilon,
        fused=accelerator.device.type in ("cpu", "cuda"),  # one kernel for all parameters: measured faster
    )
    updates_per_epoch = math.ceil(
        math.ceil(len(train_loader) / accelerator.num_processes) / args.gradient_accumulation_steps
    )
    max_train_steps = args.max_train_steps or args.num_train_epochs * updates_per_epoch
    num_epochs = math.ceil(max_train_steps / updates_per_epoch)
    # accelerate steps a prepared scheduler once per process for every optimizer update.
    scheduler = get_scheduler(
        args.lr_scheduler_type,
        optimizer,
        num_warmup_steps=args.num_warmup_steps * accelerator.num_processes,
        num_training_steps=max_train_steps * accelerator.num_processes,
    )
    model, optimizer, scheduler = accelerator.prepare(model, optimizer, scheduler)
    # Batches stay on the CPU until they are masked (see masked_batch).
    train_loader = accelerator.prepare_data_loader(train_loader, device_placement=False)
    eval_loader = accelerator.prepare_data_loader(eval_loader, device_placement=False)
    progress = TrainingProgress()
    accelerator.register_for_checkpointing(progress)
    if checkpoint is not None:
        logger.info(f"Resuming from {checkpoint}")
        load_checkpoint(accelerator, checkpoint)

    training_config = {
        "model_implementation": args.model_implementation,
        "model_size": args.model_size if args.config_name is None else args.config_name,
        "num_parameters": num_parameters,
        "vocab_size": config.vocab_size,
        "max_seq_length": args.max_seq_length,
        "precision": precision,
        "num_processes": accelerator.num_processes,
        "per_device_train_batch_size": args.per_device_train_batch_size,
        "gradient_accumulation_steps": args.gradient_accumulation_steps,
        "learning_rate": args.learning_rate,
        "lr_scheduler_type": args.lr_scheduler_type,
        "num_warmup_steps": args.num_warmup_steps,
        "weight_decay": args.weight_decay,
        "max_train_steps": max_train_steps,
        "mlm_probability": args.mlm_probability,
        "train_instances": len(train_instances),
        "eval_instances": len(eval_instances),
        "seed": args.seed,
        "corpus": corpus_args.dataset_name or corpus_args.train_file or "shipped WikiText-2 sample",
    }
    if args.with_tracking:
        accelerator.init_trackers("hfbert-pretraining", config=training_config)
    logger.info(
        f"{len(train_instances)} training instances, {len(eval_instances)} evaluation instances; "
        f"{max_train_steps} updates of {args.per_device_train_batch_size} x {accelerator.num_processes} x "
        f"{args.gradient_accumulation_steps} instances; {num_parameters / 1e6:.1f}M parameters."
    )

    def log(row: dict[str, Any]) -> None:
        progress.log_history.append(row)
        if args.with_tracking:
            accelerator.log({k: v for k, v in row.items() if k != "step"}, step=row["step"])

    def run_evaluation() -> dict[str, float]:
        metrics = evaluate(model, eval_loader, collator, accelerator, seed=args.seed)
        log({"step": progress.completed_steps, "train_seconds": progress.train_seconds, **metrics})
        logger.info(
            f"step {progress.completed_steps}: " + ", ".join(f"{k} {v:.4f}" for k, v in metrics.items())
        )
        return metrics

    bar = tqdm(
        total=None if args.max_train_seconds else max_train_steps,  # a time budget ends at an unknown step
        initial=progress.completed_steps,
        disable=not accelerator.is_local_main_process,
        desc="pretraining",
        unit="step",
        dynamic_ncols=True,
    )

    def out_of_budget() -> bool:
        if progress.completed_steps >= max_train_steps:
            return True
        if args.max_train_seconds is None:
            return False
        # Every process must stop at the same step, so the slowest clock decides.
        over = torch.tensor(
            float(progress.train_seconds >= args.max_train_seconds), device=accelerator.device
        )
        return accelerator.reduce(over, "max").item() > 0

    window_loss = torch.zeros((), device=accelerator.device)
    window_tokens = torch.zeros((), device=accelerator.device)
    window_batches, window_seconds = 0, progress.train_seconds
    clock = time.perf_counter()  # start of the current stretch of training time
    metrics: dict[str, float] | None = None
    model.train()
    for epoch in range(progress.epoch, num_epochs):
        if out_of_budget():
            break
        train_loader.set_epoch(epoch)
        batches = (
            accelerator.skip_first_batches(train_loader, progress.batch_in_epoch)
            if progress.batch_in_epoch
            else train_loader
        )
        for batch in batches:
            batch = masked_batch(batch, collator, accelerator.device)
            with accelerator.accumulate(model):
                loss = model(**batch).loss
                check_loss_is_finite(
                    loss, precision, progress.completed_steps + 1, scheduler.get_last_lr()[0]
                )
                accelerator.backward(loss)
                if accelerator.sync_gradients and args.max_grad_norm > 0:
                    accelerator.clip_grad_norm_(model.parameters(), args.max_grad_norm)
                optimizer.step()
                scheduler.step()
                optimizer.zero_grad(set_to_none=True)
            progress.batch_in_epoch += 1
            window_loss += loss.detach()
            window_tokens += batch["attention_mask"].sum()
            window_batches += 1
            if not accelerator.sync_gradients:
                continue
            progress.completed_steps += 1
            step = progress.completed_steps
            now = time.perf_counter()
            progress.train_seconds += now - clock
            clock = now
            bar.update(1)
            if step % args.logging_steps == 0 or step == max_train_steps:
                seconds = progress.train_seconds - window_seconds
                row = {
                    "step": step,
                    "epoch": epoch,
                    "train_seconds": progress.train_seconds,
                    "loss": accelerator.reduce(window_loss, "mean").item() / window_batches,
                    "learning_rate": scheduler.get_last_lr()[0],
                    "tokens_per_second": accelerator.reduce(window_tokens, "sum").item() / seconds,
                }
                log(row)
                bar.set_postfix(
                    loss=f"{row['loss']:.3f}",
                    lr=f"{row['learning_rate']:.2e}",
                    tok_s=f"{row['tokens_per_second']:.0f}",
                )
                window_loss.zero_()
                window_tokens.zero_()
                window_batches, window_seconds = 0, progress.train_seconds
            if args.eval_steps and step % args.eval_steps == 0:
                metrics = run_evaluation()
            if args.checkpointing_steps not in (None, "epoch") and step % int(args.checkpointing_steps) == 0:
                save_checkpoint(accelerator, output_dir, step, args.checkpoints_total_limit)
            clock = time.perf_counter()  # evaluation and saving are not training time
            if out_of_budget():
                break
        else:  # the epoch ran to its end
            progress.epoch += 1
            progress.batch_in_epoch = 0
            if not args.eval_steps:
                metrics = run_evaluation()
            if args.checkpointing_steps == "epoch":
                save_checkpoint(
                    accelerator, output_dir, progress.completed_steps, args.checkpoints_total_limit
                )
    bar.close()
    last_eval = next((row["step"] for row in reversed(progress.log_history) if "eval_mlm_loss" in row), None)
    if metrics is None or last_eval != progress.completed_steps:
        metrics = run_evaluation()

    accelerator.wait_for_everyone()
    model_name = (args.hub_model_id or output_dir.name).split("/")[-1]
    state_dict = accelerator.get_state_dict(model)  # on every process: gathers FSDP shards
    if accelerator.is_main_process:
        save_final_folder(
            accelerator.unwrap_model(model, keep_torch_compile=False),
            state_dict,
            tokenizer,
            output_dir,
            training_config=training_config,
            eval_results={
                "step": progress.completed_steps,
                "train_seconds": progress.train_seconds,
                **metrics,
            },
            log_history=progress.log_history,
            corpus_args=corpus_args,
            model_name=model_name,
        )
        if args.push_to_hub:
            url = push_to_hub(output_dir, args.hub_model_id, token=args.hub_token)
            logger.info(f"Pushed to {url}")
    accelerator.wait_for_everyone()
    accelerator.end_training()
    return output_dir


def main(argv: list[str] | None = None) -> None:
    """Entry point of run_pretraining.py."""
    corpus_args, args = parse_args(argv)
    output_dir = train(corpus_args, args)
    if int(os.environ.get("RANK", "0")) == 0:
        print(f"\nModel, tokenizer, model card and curves: {output_dir.resolve()}")
        print(fill_mask_example(output_dir, AutoTokenizer.from_pretrained(output_dir).mask_token))
        sys.stdout.flush()
