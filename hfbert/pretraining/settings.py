"""The settings of a pretraining run, grouped as litgpt groups them, and checked in one place.

Each group is a dataclass whose fields are also run_pretraining.py's flags, declared with transformers'
`HfArg` (default and `--help` text) for `HfArgumentParser`; the corpus group, `CorpusArguments`, is
`hfbert.corpus_arguments`'s. Each stage of `hfbert.pretraining` takes the group(s) it needs; `pretrain` takes the
bundle.
`PretrainingSettings.__post_init__` is the only place flags are validated, so every bad flag is refused
before any data is read or any file is written. Flag names follow transformers' run_mlm_no_trainer.py.
"""

from __future__ import annotations

import functools
import json
import math
import os
import subprocess
from dataclasses import asdict, dataclass, fields
from importlib.metadata import version
from pathlib import Path
from typing import Annotated, Any, Literal

from huggingface_hub.errors import StrictDataclassClassValidationError
from transformers.hf_argparser import HfArg

from hfbert.configuration_hfbert import PRESETS, HfBertConfig
from hfbert.corpus_arguments import CorpusArguments, check_output_outside_corpus, corpus_fingerprint
from hfbert.errors import Refusal
from hfbert.files import check_local_path_exists
from hfbert.flags import MUST_MATCH, declared
from hfbert.model_card import check_hub_model_id
from hfbert.tokenization import MAX_VOCAB_SIZE, VOCAB_SIZE_ABOVE_MAX

# The flags that only shape a fresh model, and why each has no meaning for a run from weights.
FRESH_MODEL_FLAGS = {
    "vocab_size": "the vocabulary is the source's tokenizer's (or --tokenizer_name's, which must match it)",
    "attention_init": "the source's weights are the start; nothing is initialised",
    "structured_attention_fade": "the source's weights hold no structured start to fade",
}


@dataclass
class DataSettings:
    """Tokenizer, NSP instances and masking."""

    tokenizer_name: str | None = HfArg(
        default=None,
        help="A trained tokenizer folder (train_tokenizer.py). Without it, a WordPiece tokenizer of "
        "--vocab_size is trained on the training corpus first and saved with the model.",
    )
    vocab_size: Annotated[int | None, MUST_MATCH] = HfArg(
        default=30522,
        help="Vocabulary of the tokenizer trained when --tokenizer_name is not given. Not with "
        "--model_name_or_path: the source's tokenizer is the run's.",
    )
    max_seq_length: Annotated[int, MUST_MATCH] = HfArg(
        default=128, help="Longest instance, [CLS] A [SEP] B [SEP] included."
    )
    short_seq_prob: Annotated[float, MUST_MATCH] = HfArg(
        default=0.1, help="Share of instances with a shorter random target."
    )
    dupe_factor: Annotated[int, MUST_MATCH] = HfArg(
        default=1,
        help="Passes over the corpus with fresh NSP pairings (google-research/bert). 1 (default) suits a "
        "corpus larger than the run; on a small one (the shipped sample) use 10-40, so NSP sees fresh pairs "
        "instead of memorising repeated ones.",
    )
    mlm_probability: Annotated[float, MUST_MATCH] = HfArg(
        default=0.15, help="Share of tokens chosen for the MLM loss during training."
    )
    max_predictions_per_seq: Annotated[int | None, MUST_MATCH] = HfArg(
        default=None,
        help="Static shapes (google-research/bert): at most this many masked tokens per row, padded to "
        "exactly this many, so every step has the same shapes (for torch.compile / CUDA graphs); extra "
        "masked tokens are unmasked. Unset: the mean plus three standard deviations, rounded up to a "
        "multiple of 8 (32 at length 128), on CUDA and under --torch_compile; on a CPU every masked token "
        "counts (dynamic shapes, faster there).",
    )
    objective: Annotated[Literal["mlm+nsp", "mlm"], MUST_MATCH] = HfArg(
        default="mlm+nsp",
        help="mlm+nsp (BERT): [CLS] A [SEP] B [SEP] pairs, masked LM plus next sentence prediction. mlm "
        "(RoBERTa): [CLS] segment [SEP] instances, each document's tokens cut into full-length segments "
        "(within the document), masked LM alone; the NSP head is still saved, untrained.",
    )
    whole_word_masking: Annotated[bool, MUST_MATCH] = HfArg(
        default=False,
        help="Choose whole words for the MLM loss (a token and its '##' continuations, each word with "
        "--mlm_probability), google-research/bert's --do_whole_word_mask; the 80/10/10 replacement is still "
        "per token, and static slots (--max_predictions_per_seq) drop whole words. Training only: evaluation "
        "keeps token-level masks, so that its figures compare across runs.",
    )
    dataloader_num_workers: int | None = HfArg(
        default=None,
        help="Processes that build batches (pad, mask) while the model steps. Unset: 4 on CUDA, 0 on a "
        "CPU (a worker would take a core from the step). Batches and masks do not depend on it.",
    )
    eval_mlm_probability: float = HfArg(
        default=0.15, help="Share of tokens masked at evaluation (kept at BERT's 15%% so runs compare)."
    )
    validation_split_percentage: Annotated[int, MUST_MATCH] = HfArg(
        default=5, help="Documents held out for evaluation when the corpus has no validation split."
    )
    max_eval_samples: int | None = HfArg(default=None, help="Evaluate on at most this many instances.")
    preprocessing_num_workers: int | None = HfArg(default=None, help="Processes for datasets.map.")
    stream_window_documents: Annotated[int | None, MUST_MATCH] = HfArg(
        default=1000,
        help="With --streaming: consecutive documents of the stream made into instances together: a window is tokenized and paired in a loader worker, an NSP pair's random "
        "B comes from another document of its window (google draws it from the whole corpus), and its "
        "instances are shuffled together: the window is the span instances are shuffled over, so give it "
        "as many documents as memory allows (benchmarks/results/streaming.md).",
    )
    stream_validation_documents: Annotated[int | None, MUST_MATCH] = HfArg(
        default=1000,
        help="With --streaming and a source without a validation split: the first N documents of the "
        "training stream are the fixed validation set, written once to the datasets cache; training skips "
        "them.",
    )


@dataclass
class ModelSettings:
    """Which BERT to build."""

    model_name_or_path: Annotated[str | None, MUST_MATCH] = HfArg(
        default=None,
        help="Start from these weights instead of a fresh initialisation (a new run: new optimizer, "
        "schedule and step count): an hfbert run's output folder or one of its checkpoint-<step> folders, "
        "or a transformers BERT folder or Hub id (converted, MLM and NSP heads kept). Its tokenizer is used "
        "unless --tokenizer_name is given. For BERT's phase 2 at length 512 and continued pretraining.",
    )
    config_name: Annotated[str | None, MUST_MATCH] = HfArg(
        default=None, help="A config.json (or its folder) for the model; overrides --model_size."
    )
    model_size: Annotated[Literal["tiny", "mini", "small", "medium", "base", "large"] | None, MUST_MATCH] = HfArg(
        default="mini",
        help=f"BERT size preset: {', '.join(PRESETS)}. With --model_name_or_path the source's size is the "
        "run's (given, it must agree).",
    )
    dropout: Annotated[float | None, MUST_MATCH] = HfArg(
        default=None,
        help="Hidden and attention dropout of the model (default: the config's, 0.1 for the presets).",
    )
    # not MUST_MATCH: a resume loads its weights over the start (the fade goes on subtracting from them)
    attention_init: Literal["structured", "bert"] | None = HfArg(
        default="bert",
        help="bert: transformers' initialisation throughout; the default, as the one start whose folders "
        "hfbert's model card does not send to --reinit_query_key before fine-tuning. On a small model and "
        "budget it learns far less: tiny on the shipped sample, 0.14 held-out MLM accuracy at 6,000 updates "
        "against the structured start's 0.22 (benchmarks/results/attention_start.md). structured: BERT's "
        "initialisation, except that position embeddings start as a cos/sin code and three attention heads "
        "start looking at the previous token, the next token and the same word in the other segment "
        "(hfbert.initialization); on a short budget it is what lifts held-out MLM accuracy off the unigram "
        "plateau and lets NSP generalise (docs/quality.md, 'Where the gain comes from'; the quick-start, "
        "quality-10min and own-text recipes use it). Not with --model_name_or_path (its weights are the start).",
    )
    structured_attention_fade: Annotated[float | None, MUST_MATCH] = HfArg(
        default=0.0,
        help="With the structured start: the fraction of the budget (updates or seconds, whichever is "
        "further along) over which its three heads' query/key patterns fade linearly to nothing, "
        "leaving BERT's random rows and what training learned. 0: they stay. The folder of a "
        "short run then fine-tunes better on few labels (benchmarks/results/downstream.md, 'Pretraining "
        "levers'); held-out MLM accuracy ends lower.",
    )


@dataclass
class OptimizationSettings:
    """Batches, optimizer, learning-rate schedule, budget and precision."""

    per_device_train_batch_size: Annotated[int, MUST_MATCH] = HfArg(
        default=32, help="Batch size per process."
    )
    gradient_accumulation_steps: Annotated[int, MUST_MATCH] = HfArg(
        default=1, help="Batches per optimizer update."
    )
    learning_rate: Annotated[float, MUST_MATCH] = HfArg(default=1e-4, help="Peak AdamW learning rate.")
    weight_decay: Annotated[float, MUST_MATCH] = HfArg(
        default=0.01, help="AdamW weight decay (none on biases, LayerNorm)."
    )
    adam_beta1: Annotated[float, MUST_MATCH] = HfArg(default=0.9, help="AdamW beta1.")
    adam_beta2: Annotated[float, MUST_MATCH] = HfArg(default=0.999, help="AdamW beta2.")
    adam_epsilon: Annotated[float, MUST_MATCH] = HfArg(default=1e-6, help="AdamW epsilon (BERT used 1e-6).")
    max_grad_norm: Annotated[float, MUST_MATCH] = HfArg(
        default=1.0, help="Gradient clipping norm (0 disables)."
    )
    lr_scheduler_type: Annotated[Literal["linear", "cosine", "constant"], MUST_MATCH] = HfArg(
        default="linear",
        help="After --num_warmup_steps of linear warmup: linear or cosine decay to zero at the end of "
        "the budget (--max_train_steps or --max_train_seconds, whichever comes first), or constant.",
    )
    num_warmup_steps: Annotated[int, MUST_MATCH] = HfArg(default=0, help="Linear warmup updates.")
    nsp_loss_weight: Annotated[float, MUST_MATCH] = HfArg(
        default=1.0, help="Weight of the NSP loss in the training loss (mlm + w * nsp)."
    )
    cls_attention_spread: Annotated[float, MUST_MATCH] = HfArg(
        default=0.0,
        help="Weight w of a penalty on [CLS]'s attention for looking at few tokens: w times one minus "
        "its entropy over the log of the input's length, averaged over layers and heads (training loss "
        "mlm + w * penalty + nsp). [CLS] is what a fine-tuned classifier reads, and no MLM loss reads its "
        "row. 0: none. Not with --torch_compile.",
    )
    num_train_epochs: int = HfArg(
        default=3, help="Epochs, unless --max_train_steps or --max_train_seconds is given."
    )
    max_train_steps: int | None = HfArg(default=None, help="Optimizer updates; overrides epochs.")
    max_train_seconds: float | None = HfArg(
        default=None,
        help="Stop after this much training time (evaluation and saving excluded), e.g. 600; the "
        "learning-rate schedule then reaches zero exactly at the budget.",
    )
    seed: Annotated[int, MUST_MATCH] = HfArg(
        default=42, help="Seed of initialisation, pairing, masking and shuffling."
    )
    mixed_precision: Annotated[Literal["auto", "no", "fp16", "bf16"], MUST_MATCH] = HfArg(
        default="auto",
        help="auto: what `accelerate launch --mixed_precision` asked for, else fp16 on CUDA, bf16 on a "
        "CPU with native bf16, fp32 otherwise. fp16 on a CPU warns and falls back; bf16 on a GPU below "
        "compute capability 8.0 is refused.",
    )
    torch_compile: Annotated[bool | None, MUST_MATCH] = HfArg(
        default=None,
        # nargs: for HfArgumentParser, which gives a bare flag its const only where the default is a bool
        metadata={"nargs": "?", "const": True},
        help="Compile the update with torch.compile on static shapes (rows padded to --max_seq_length, "
        "full batches, static masked slots): the model's forward (and the backward derived from it) as one "
        "graph, gradient clipping as another, so training and evaluation each compile once. Default: on CUDA (except with "
        "--deterministic or --cls_attention_spread), off on a CPU; `--torch_compile false` turns it off.",
    )
    torch_compile_mode: Annotated[
        Literal["default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs"], MUST_MATCH
    ] = HfArg(
        default="default",
        help="torch.compile's mode for the model: reduce-overhead and max-autotune replay CUDA graphs "
        "(no kernel launches from Python), max-autotune also tries kernels for each matmul; both compile "
        "longer and pay on a GPU only, where benchmarks/bench_loop.py measures which is faster.",
    )
    attention_padding: Annotated[Literal["mask", "varlen"], MUST_MATCH] = HfArg(
        default="mask",
        help="How training attention skips padding: mask (sdpa with a mask, as transformers), or varlen "
        "(each row attends within its own tokens, no mask: FlashAttention's variable-length kernel, CUDA in "
        "fp16/bf16 only; elsewhere sdpa one sequence at a time, slow). Evaluation always masks.",
    )
    deterministic: Annotated[bool, MUST_MATCH] = HfArg(
        default=False,
        help="Deterministic algorithms only (torch.use_deterministic_algorithms, CUBLAS_WORKSPACE_CONFIG, "
        "cuDNN): a GPU run repeatable bit for bit. Measured on an H100 (BERT-base, length 128, fp16): a "
        "resumed run equals a straight one, and the loop's throughput falls by 46%%, to 54%% (203,320 against "
        "376,420 tokens/s; docs/speed.md, 'On a GPU'). CPU training is deterministic without it (tested).",
    )

    def compiles_update(self, device_type: str) -> bool:
        """Whether the update is compiled on a `device_type` device: --torch_compile as given, else on CUDA
        unless --deterministic (bit-equal resumes are tested eager) or --cls_attention_spread (hooks)."""
        if self.torch_compile is not None:
            return self.torch_compile
        return device_type == "cuda" and not self.deterministic and not self.cls_attention_spread


@dataclass
class OutputSettings:
    """Output folder, evaluation / logging / checkpoint schedules, resume and push."""

    output_dir: str = HfArg(help="Where checkpoints and the final model folder are written.")
    recipe: str | None = HfArg(
        default=None,
        help="A recipe: a shipped one's name (--list_recipes) or a .yaml/.json file of flags, the file's "
        "flags read as if given before the command line's (which override them); `run_pretraining.py "
        "recipe.yaml` is the same as --recipe recipe.yaml. training_args.json records it with every "
        "resolved flag. The shipped recipes: hfbert/recipes/.",
    )
    overwrite_output_dir: bool = HfArg(
        default=False,
        help="Replace an earlier run in --output_dir: what hfbert wrote there (checkpoints with a manifest, the "
        "final folder's files); a folder holding anything else is refused, naming it.",
    )
    dry_run: bool = HfArg(
        default=False,
        help="Run every check a run makes before work, print the plan (model, batch, updates, tokens, "
        "passes over the corpus, FLOPs, peak memory, checkpoint and data-stage sizes, the checkpoint a resume "
        "would start from, the expected time where the step was measured on this kind of device) and exit "
        "without writing anything.",
    )
    per_device_eval_batch_size: int = HfArg(default=64, help="Evaluation batch size per process.")
    eval_steps: int | None = HfArg(
        default=None, help="Evaluate every N updates (default: at the end of each epoch)."
    )
    logging_steps: int = HfArg(default=10, help="Log training metrics every N updates.")
    checkpointing_steps: str | None = HfArg(
        default=None, help="Save the full training state every N updates, or 'epoch'."
    )
    checkpoints_total_limit: int | None = HfArg(default=None, help="Keep only the newest N checkpoints.")
    resume_from_checkpoint: str | None = HfArg(
        default=None,
        help="A checkpoint folder, 'latest' (newest in --output_dir), or 'auto': the newest if there is "
        "one, else a fresh start (also over a run interrupted before its first checkpoint): one command "
        "for a first start and every requeue (Slurm --requeue, Kubernetes restarts).",
    )
    with_tracking: bool = HfArg(default=False, help="Log metrics to the trackers of --report_to.")
    report_to: str = HfArg(default="all", help="accelerate trackers: tensorboard, wandb, ... or all.")
    push_to_hub: bool = HfArg(default=False, help="Upload the final folder to the Hub.")
    hub_model_id: str | None = HfArg(default=None, help="Hub repo id, e.g. user/hfbert-mini-wikitext.")
    hub_token: str | None = HfArg(default=None, help="Hub token (default: the logged-in one).")
    train_if_hub_unreachable: bool = HfArg(
        default=False,
        help="With --push_to_hub, train even if the Hub check at start fails (push later with "
        "`python -m hfbert.push RUN_DIR --hub_model_id ...`).",
    )
    ddp_timeout: int = HfArg(
        default=1800,
        help="Seconds the processes of a multi-process or multi-node run wait for each other (forming the "
        "process group, any collective) before the run stops naming the master address and port "
        "(transformers' --ddp_timeout).",
    )

    def __post_init__(self) -> None:
        # One path for the checks and the writes: a '~' that no shell expanded (quoted, or from a recipe) was
        # checked under $HOME and written under ./~.
        self.output_dir = os.path.expanduser(self.output_dir)

    @property
    def checkpoint_steps(self) -> int | None:
        """--checkpointing_steps as a number of updates (None: never, or each epoch)."""
        return None if self.checkpointing_steps in (None, "epoch") else int(self.checkpointing_steps)

    @property
    def checkpoint_each_epoch(self) -> bool:
        return self.checkpointing_steps == "epoch"


# The budget flags: recorded by a checkpoint, and a resume may change them where the learning rate does not
# depend on them.
BUDGET_FLAGS = ("max_train_steps", "num_train_epochs", "max_train_seconds")
# Recorded with the settings: sha256 of the corpus's files (hfbert.corpus_arguments.corpus_fingerprint), not a flag.
CORPUS_FINGERPRINT = "corpus_sha256"
# Recorded with the settings: the values of --config_name's config as read (`config_values`), not a flag.
CONFIG_VALUES = "config_values"
# Recorded with the settings, not a flag either: the hfbert that wrote the checkpoint (`running_hfbert`).
WRITER = "hfbert"
# Recorded with the settings: the precision --mixed_precision resolved to ("no", "fp16", "bf16"), compared on
# resume in place of the flag, whose `auto` resolves by the device and the launcher.
PRECISION = "precision"
# A change after which the same checkpoint and batches train other weights raises the update's revision, saying
# what changed: a checkpoint of another revision cannot continue its run bit for bit, and is refused.
UPDATE_CHANGES = {2: "since commit cdd77a1 attention computes Q, K and V in one matmul, which rounds differently"}
UPDATE_REVISION = max(UPDATE_CHANGES)
# What a flag the command leaves unset resolves to on a device type, where that is not its value as it stands.
RESOLVED_WHEN_UNSET = {"torch_compile": lambda settings, device_type: settings.optimization.compiles_update(device_type)}
# Flags a resume takes from its checkpoint when the command leaves them unset: the tokenizer is the checkpoint's.
FROM_CHECKPOINT_WHEN_UNSET = ("vocab_size",)


@dataclass
class PretrainingSettings:
    """Everything a pretraining run is told, passed whole to `hfbert.pretraining.run.pretrain`."""

    corpus: CorpusArguments
    data: DataSettings
    model: ModelSettings
    optimization: OptimizationSettings
    output: OutputSettings

    given: frozenset[str] = frozenset()  # flags named on the command line or in a recipe (`cli.parse_args`)

    def __post_init__(self) -> None:
        self.record_what_applies()
        self.validate()

    def record_what_applies(self) -> None:
        """Flags that shape only a fresh model, or only a stream: where they do not apply, one given is refused
        (rather than ignored, then recorded as the run's setting) and the run records None; a run from weights
        takes its size from the source unless --model_size is given (then checked against it)."""
        source = self.model.model_name_or_path
        dropped = self.unmade_model_flags()
        if not self.corpus.streaming:
            dropped |= dict.fromkeys(STREAM_FLAGS, "applies to --streaming runs only; add --streaming or")
        for name, reason in dropped.items():
            group = self.data if hasattr(self.data, name) else self.model
            if self.was_given(group, name):
                raise Refusal(f"--{name} {getattr(group, name)} {reason} drop --{name}")
            setattr(group, name, None)
        if source is not None:
            if not self.was_given(self.model, "model_size"):
                self.model.model_size = None
        elif self.model.attention_init == "bert" and not self.model.structured_attention_fade:
            self.model.structured_attention_fade = None  # no structured start to fade (a positive one is refused)

    def unmade_model_flags(self) -> dict[str, str]:
        """The flags that shape a model or a tokenizer this run does not make, each with what a refusal of it
        says between "--flag value" and "drop --flag": with --model_name_or_path the fresh model's
        (`FRESH_MODEL_FLAGS`), with --tokenizer_name the size of a tokenizer to train."""
        source, tokenizer = self.model.model_name_or_path, self.data.tokenizer_name
        if source is not None:
            return {
                name: f"only shapes a fresh model, and --model_name_or_path {source} starts from weights: {why};"
                for name, why in FRESH_MODEL_FLAGS.items()
            }
        if tokenizer is not None:
            return {
                "vocab_size": f"only sizes the tokenizer a run trains, and --tokenizer_name {tokenizer} is the run's "
                "tokenizer (the model's vocabulary is its size);"
            }
        return {}

    def was_given(self, group: Any, name: str) -> bool:
        """Whether a flag was given: named (`given`), or, in settings built in code, other than its default."""
        return name in self.given or getattr(group, name) != group.__dataclass_fields__[name].default

    def validate(self) -> None:
        """Refuse every bad flag and contradiction, naming the flag and the fix (the one place that checks)."""
        flat = self.to_dict()
        for field in (field for group in self.groups() for field in fields(group)):
            # nan passes every range below (nan <= 0 is False): --max_grad_norm nan would disable clipping.
            value = flat.get(field.name)
            if isinstance(value, float) and not math.isfinite(value):
                example = f", e.g. {field.default}" if isinstance(field.default, float) else ""
                raise Refusal(f"--{field.name} {value} must be a finite number{example}")
        for names, in_range, rule in FLAG_RANGES:
            for name in names:
                if flat[name] is not None and not in_range(flat[name]):
                    raise Refusal(f"--{name} {flat[name]} {rule}")
        _check_combinations(self)
        check_output_apart_from_source(self.model, self.output)
        check_output_outside_corpus(self.corpus, self.output.output_dir)
        if self.corpus.streaming:
            check_streaming(self)

    def checkpoint_settings(self) -> dict[str, Any]:
        """What a checkpoint records of the settings: the flags declared MUST_MATCH (a resumed run repeats
        them), the budget (`BUDGET_FLAGS`), the corpus's content fingerprint (`CORPUS_FINGERPRINT`), the values
        of --config_name's file (`CONFIG_VALUES`) and the hfbert that writes it (`WRITER`)."""
        groups = (self.corpus, self.data, self.model, self.optimization)
        recorded = {name: getattr(group, name) for group in groups for name in declared(group, MUST_MATCH)}
        budget = {name: getattr(self.optimization, name) for name in BUDGET_FLAGS}
        read = {CORPUS_FINGERPRINT: corpus_fingerprint(self.corpus), CONFIG_VALUES: config_values(self.model.config_name)}
        return recorded | budget | read | {WRITER: running_hfbert()}

    def group_of(self, name: str) -> Any:
        """The settings group that holds the flag `name`."""
        return next(group for group in self.groups() if name in {field.name for field in fields(group)})

    def to_dict(self) -> dict[str, Any]:
        """Every setting, flat (flag name -> value), without the Hub token."""
        flat = {name: value for group in self.groups() for name, value in asdict(group).items()}
        return {name: value for name, value in flat.items() if name != "hub_token"}

    def groups(self) -> tuple[Any, ...]:
        """The settings groups, in the order their flags are declared."""
        return self.corpus, self.data, self.model, self.optimization, self.output


# Each flag's range, checked in this order (a flag left unset, None, is not): the flags, whether a value is in
# it, and what the refusal says after "--flag value".
FLAG_RANGES = (
    (("max_seq_length", "dupe_factor", "per_device_train_batch_size", "gradient_accumulation_steps",
      "num_train_epochs", "learning_rate", "adam_epsilon", "per_device_eval_batch_size", "logging_steps",
      "ddp_timeout"), lambda value: value > 0, "must be > 0"),
    (("vocab_size", "max_eval_samples", "max_predictions_per_seq", "preprocessing_num_workers",
      "max_train_steps", "max_train_seconds", "eval_steps", "checkpoints_total_limit"),
     lambda value: value > 0, "must be > 0 (or leave it unset)"),
    (("dataloader_num_workers",), lambda value: value >= 0, "must be >= 0 (or leave it unset)"),
    (("max_seq_length",), lambda value: value >= 8, "must be >= 8 ([CLS] A [SEP] B [SEP])"),
    (("mlm_probability", "eval_mlm_probability"), lambda value: 0 < value < 1,
     "must be in (0, 1), e.g. 0.15"),
    (("short_seq_prob",), lambda value: 0 <= value <= 1, "must be in [0, 1]"),
    (("validation_split_percentage",), lambda value: 0 < value < 100, "must be in (0, 100)"),
    (("dropout",), lambda value: 0 <= value < 1, "must be in [0, 1)"),
    (("structured_attention_fade",), lambda value: 0 <= value <= 1,
     "must be a fraction of the budget in [0, 1], e.g. 1"),
    (("adam_beta1", "adam_beta2"), lambda value: 0 <= value < 1, "must be in [0, 1), e.g. 0.9 or 0.999"),
    (("weight_decay", "max_grad_norm", "num_warmup_steps", "nsp_loss_weight", "cls_attention_spread"),
     lambda value: value >= 0, "must be >= 0"),
    (("seed",), lambda value: 0 <= value < 2**32, "must be in [0, 2**32 - 1], e.g. 42"),  # accelerate's set_seed
    (("vocab_size",), lambda value: value <= MAX_VOCAB_SIZE, VOCAB_SIZE_ABOVE_MAX),
)  # fmt: skip


def _check_combinations(settings: PretrainingSettings) -> None:
    """Refuse flags that are each in range but contradict one another (or the --model_size preset)."""
    data, model, optimization, output = settings.data, settings.model, settings.optimization, settings.output
    # --objective mlm builds its segments without randomness, so more passes would only repeat them.
    if data.objective == "mlm" and data.dupe_factor != 1:
        raise Refusal(
            f"--dupe_factor {data.dupe_factor} with --objective mlm would repeat the same segments (they are "
            "cut without randomness; the masks change every epoch anyway): drop --dupe_factor and raise "
            "--num_train_epochs or --max_train_steps instead"
        )
    fade = model.structured_attention_fade
    if fade and model.attention_init != "structured":
        raise Refusal(
            f"--structured_attention_fade {fade} fades the structured start, and --attention_init "
            f"{model.attention_init} has none; drop --structured_attention_fade or pass --attention_init structured"
        )
    # A --config_name file or a --model_name_or_path source is read by check_before_work, before any work.
    if model.config_name is None and model.model_name_or_path is None:
        preset = HfBertConfig.from_preset(model.model_size)
        check_max_seq_length(data.max_seq_length, preset, f"--model_size {model.model_size}")
    if optimization.cls_attention_spread and optimization.torch_compile is True:
        raise Refusal(
            f"--cls_attention_spread {optimization.cls_attention_spread} reads the attention through forward "
            "hooks, which a compiled model is not tested with; drop --torch_compile or --cls_attention_spread"
        )
    steps = output.checkpointing_steps
    if steps not in (None, "epoch") and (not steps.isdigit() or int(steps) < 1):
        raise Refusal(f"--checkpointing_steps {steps!r} must be a positive number of updates or 'epoch'")
    if output.checkpoints_total_limit is not None and steps is None:
        raise Refusal(
            "--checkpoints_total_limit was given without --checkpointing_steps; pass --checkpointing_steps "
            "N or 'epoch' too"
        )
    if output.push_to_hub and not output.hub_model_id:
        raise Refusal("--push_to_hub needs --hub_model_id (e.g. your-name/hfbert-mini-wikitext)")
    if output.hub_model_id is not None:  # pushed or not: the model card's snippets load it
        check_hub_model_id(output.hub_model_id)


def check_output_apart_from_source(model: ModelSettings, output: OutputSettings) -> None:
    """A run never writes into its own source: --overwrite_output_dir would delete the source's checkpoints,
    the final save would replace its weights and the card would say the model was pretrained from itself."""
    if model.model_name_or_path is None or not Path(model.model_name_or_path).expanduser().exists():
        return  # a Hub id, or a missing folder (refused with the fix when the source is read)
    folder = Path(output.output_dir).expanduser().resolve()
    source = Path(model.model_name_or_path).expanduser().resolve()
    if folder == source or (folder.exists() and os.path.samefile(folder, source)):
        relation = "is"
    elif folder in source.parents:
        relation = "contains"
    elif source in folder.parents:
        relation = "is inside"
    else:
        return
    raise Refusal(
        f"--output_dir {output.output_dir} {relation} the --model_name_or_path folder "
        f"{model.model_name_or_path}: the run would write into or over the weights it starts from; pass a "
        "new --output_dir outside it"
    )


def check_max_seq_length(max_seq_length: int, config: HfBertConfig, source: str) -> None:
    """Refuse a --max_seq_length the model's position embeddings cannot hold (before a tokenizer is trained)."""
    if max_seq_length > config.max_position_embeddings:
        raise Refusal(
            f"--max_seq_length {max_seq_length} exceeds the max_position_embeddings {config.max_position_embeddings} "
            f"of {source}; pass --max_seq_length <= {config.max_position_embeddings}"
        )


def check_config_file(settings: PretrainingSettings) -> None:
    """The checks of `PretrainingSettings.validate` that need --config_name's file (read here, after
    `hfbert.files.check_local_files` has named a damaged one)."""
    if settings.model.config_name is not None:
        config = read_config_file(settings.model.config_name)
        check_max_seq_length(settings.data.max_seq_length, config, f"--config_name {settings.model.config_name}")


def config_values(config_name: str | None) -> dict[str, Any] | None:
    """What a resume compares of --config_name's config: every value but the version of transformers that wrote
    it (None without the flag; the flag's value is compared apart, as a flag)."""
    if config_name is None:
        return None
    values = json.loads(read_config_file(config_name).to_json_string(use_diff=False))  # as run_settings.json holds it
    values.pop("transformers_version", None)
    return values


def read_config_file(config_name: str) -> HfBertConfig:
    """--config_name's config. What transformers raises for it (no such file, a Hub id it cannot reach, values
    HfBertConfig refuses such as a hidden_size that the heads do not divide) is refused naming the flag."""
    fix = "pass a config.json written by HfBertConfig.save_pretrained (or its folder), or --model_size instead"
    check_local_path_exists(config_name, "--config_name", fix, kind="file or folder")
    try:
        return HfBertConfig.from_pretrained(config_name)
    except (OSError, ValueError, StrictDataclassClassValidationError) as error:
        # HfBertConfig's own ValueError reaches here wrapped by huggingface_hub's strict dataclass validation
        refused = error.__cause__ if isinstance(error, StrictDataclassClassValidationError) else error
        reason = str(refused).splitlines()[0] if str(refused) else type(refused).__name__
        raise Refusal(f"--config_name {config_name}: {reason}; {fix}") from None


STREAM_FLAGS = ("stream_window_documents", "stream_validation_documents")


def check_streaming(settings: PretrainingSettings) -> None:
    """What a --streaming run cannot do, refused before any work: a stream has no length (so no epochs to
    count a budget or a checkpoint schedule in), a tokenizer cannot be trained on a stream inside the run, and
    each pass over the stream pairs the sentences anew (so --dupe_factor has nothing to add)."""
    data, optimization, output = settings.data, settings.optimization, settings.output
    if optimization.max_train_steps is None and optimization.max_train_seconds is None:
        raise Refusal(
            "--streaming needs --max_train_steps or --max_train_seconds: a stream's length is unknown, so "
            "--num_train_epochs cannot be the budget"
        )
    if output.checkpointing_steps == "epoch":
        raise Refusal(
            "--checkpointing_steps epoch has no meaning with --streaming (a stream's passes are not counted "
            "ahead); pass --checkpointing_steps N (updates)"
        )
    if data.dupe_factor != 1:
        raise Refusal(
            f"--dupe_factor {data.dupe_factor} with --streaming: each pass over the stream pairs the sentences "
            "anew, so drop --dupe_factor (more updates, --max_train_steps, give more passes)"
        )
    has_tokenizer = data.tokenizer_name is not None or settings.model.model_name_or_path is not None
    if not has_tokenizer and output.resume_from_checkpoint is None:
        raise Refusal(
            "--streaming needs a trained tokenizer (a tokenizer is not trained on a stream inside the run): "
            "train one first with `python train_tokenizer.py --streaming <the same corpus flags> --output_dir "
            "tokenizer` and pass --tokenizer_name tokenizer (or --model_name_or_path)"
        )
    least = 2 if data.objective == "mlm+nsp" else 1  # NSP draws a random B from another document
    for name in STREAM_FLAGS:
        if getattr(data, name) < least:
            raise Refusal(
                f"--{name} {getattr(data, name)} must be >= {least}"
                + (" (next sentence prediction draws B from another document)" if least > 1 else "")
            )


def flag_difference(name: str, saved: Any, settings: PretrainingSettings, device_type: str) -> str | None:
    """How the flag `name` differs from the checkpoint's `saved` value, None where it does not: a flag the command
    leaves unset compares by what it resolves to on `device_type` (an older hfbert may have recorded its own
    default, such as --torch_compile False where today's is None)."""
    group = settings.group_of(name)
    now = getattr(group, name)
    if saved == now or (name in FROM_CHECKPOINT_WHEN_UNSET and not settings.was_given(group, name)):
        return None
    if name not in RESOLVED_WHEN_UNSET or settings.was_given(group, name):
        return f"--{name} {saved!r} in the checkpoint, {now!r} now"
    resolved = RESOLVED_WHEN_UNSET[name](settings, device_type)
    return None if saved == resolved else f"--{name} {saved!r} in the checkpoint, unset now ({resolved!r} on {device_type})"


@functools.cache
def running_hfbert() -> dict[str, Any]:
    """This hfbert, as a checkpoint records the one that wrote it: its version, its commit where it runs from a git
    clone (None otherwise, e.g. installed from a wheel) and its update's revision."""
    package = Path(__file__).resolve().parents[1]
    try:
        found = subprocess.run(
            ["git", "rev-parse", "--show-toplevel", "HEAD"], cwd=package, capture_output=True, text=True, timeout=60
        ).stdout.split()
    except (OSError, subprocess.SubprocessError):
        found = []
    # The clone's own commit only: an installed hfbert may lie inside another project's repository.
    commit = found[1] if len(found) == 2 and Path(found[0]).resolve() == package.parent else None
    return {"version": version("hfbert"), "commit": commit, "update_revision": UPDATE_REVISION}


@dataclass(frozen=True)
class CheckpointWriter:
    """The hfbert that wrote a checkpoint, as far as the checkpoint tells, and how to finish its run with it."""

    description: str
    update_revision: int
    fix: str = "finish the run with that hfbert"


def checkpoint_writer(saved: dict[str, Any], settings: PretrainingSettings) -> CheckpointWriter:
    """The writer a checkpoint's run settings record. An hfbert up to commit 88be5f0 recorded none: where it
    recorded --torch_compile False and the command leaves that flag unset, the run had that hfbert's default, so
    an hfbert before commit ca7ff39 wrote it, whose update is revision 1 (ca7ff39 itself, with today's default
    and revision 1, is not told apart); the others' update is today's."""
    record = saved.get(WRITER)
    if record is not None:
        commit = f" at commit {record['commit'][:7]}" if record.get("commit") else ""
        return CheckpointWriter(f"hfbert {record['version']}{commit}", record["update_revision"])
    if saved.get("torch_compile") is False and not settings.was_given(settings.optimization, "torch_compile"):
        return CheckpointWriter(
            "an hfbert before commit ca7ff39 (it names no version and records --torch_compile False, that "
            "hfbert's default; a run given --torch_compile false by a later hfbert resumes with it given again)",
            1,
            "finish the run with that hfbert (main's commit acd87e8, the last before ca7ff39, resumes it)",
        )
    return CheckpointWriter("an hfbert up to commit 88be5f0", UPDATE_REVISION)


def check_update_revision(writer: CheckpointWriter, checkpoint: str) -> None:
    """Refuse a checkpoint whose writer's update this hfbert does not repeat bit for bit, naming the writer, what
    changed and what resumes it."""
    revision = writer.update_revision
    if revision == UPDATE_REVISION:
        return
    if revision > UPDATE_REVISION:  # a newer hfbert's: what changed is not known here
        changes = f"its update's revision {revision} is newer than this hfbert's, {UPDATE_REVISION}"
    else:
        changes = "; ".join(change for number, change in sorted(UPDATE_CHANGES.items()) if revision < number)
    raise Refusal(
        f"--resume_from_checkpoint {checkpoint} was written by {writer.description}, whose update this hfbert does "
        f"not repeat bit for bit ({changes}): {writer.fix}, or start a new run from its weights with "
        f"--model_name_or_path {checkpoint}"
    )


def _changed_content(saved: dict[str, Any], current: dict[str, Any], settings: PretrainingSettings) -> list[str]:
    """What changed in the files the flags name, their values alike: the corpus's content (`CORPUS_FINGERPRINT`)
    and the --config_name file's values (`CONFIG_VALUES`). A checkpoint that records neither compares neither."""
    changed = []
    if saved.get(CORPUS_FINGERPRINT) not in (None, current[CORPUS_FINGERPRINT]):
        corpus = settings.corpus
        files = corpus.train_file or corpus.dataset_name or "the shipped sample"
        changed.append(
            f"the corpus ({files}{', ' + corpus.validation_file if corpus.validation_file else ''}) has changed "
            f"since the checkpoint was written (content sha256 {saved[CORPUS_FINGERPRINT][:12]}... then, "
            f"{str(current[CORPUS_FINGERPRINT])[:12]}... now): restore the files it was trained on"
        )
    then, now = saved.get(CONFIG_VALUES), current[CONFIG_VALUES]
    if then is not None and now is not None and then != now:  # the file edited: the flag's value is the same
        differ = sorted(name for name in then.keys() | now.keys() if then.get(name) != now.get(name))
        changed.append(
            f"--config_name {settings.model.config_name} holds other values than when the checkpoint was written ("
            + "; ".join(f"{name} {then.get(name)!r} then, {now.get(name)!r} now" for name in differ[:6])
            + "): restore the file it was trained with"
        )
    return changed


def precision_name(precision: str) -> str:
    """A resolved precision as the log and the messages name it: accelerate's "no" is fp32."""
    return "fp32" if precision == "no" else precision


def check_resume_settings(
    saved: dict[str, Any] | None, settings: PretrainingSettings, checkpoint: str, device_type: str, precision: str
) -> list[str]:
    """Compare a checkpoint's recorded settings with this launch's on a `device_type` device training in
    `precision` (as resolved: "no", "fp16" or "bf16"); raise on any difference that would change the run, naming
    each flag with both values, and on a checkpoint whose update this hfbert does not repeat bit for bit, naming
    the hfbert that wrote it. Returns notes on deliberate changes (for the log)."""
    if saved is None:
        return [f"{checkpoint} records no run settings (written by an older hfbert); flags are not checked"]
    check_update_revision(checkpoint_writer(saved, settings), checkpoint)
    current = settings.checkpoint_settings()
    # Flags of a model or tokenizer the run does not make (older hfbert recorded their ignored defaults): none to
    # compare.
    unused = settings.unmade_model_flags()
    resolved = ("mixed_precision",) if PRECISION in saved else ()  # compared as what it resolved to, below
    changed = [
        difference
        for name in sorted(current)
        if name not in (*BUDGET_FLAGS, CORPUS_FINGERPRINT, CONFIG_VALUES, WRITER, *unused, *resolved)
        and name in saved
        and (difference := flag_difference(name, saved[name], settings, device_type)) is not None
    ]
    if saved.get(PRECISION, precision) != precision:
        then, now = precision_name(saved[PRECISION]), precision_name(precision)
        changed.append(
            f"the checkpoint trained in {then} and this launch would train in {now} (--mixed_precision "
            f"{settings.optimization.mixed_precision} on {device_type}): pass --mixed_precision {saved[PRECISION]}"
        )
    changed += _changed_content(saved, current, settings)
    notes = []
    fade, schedule = settings.model.structured_attention_fade, settings.optimization.lr_scheduler_type
    for name in BUDGET_FLAGS:
        if saved.get(name, current[name]) == current[name]:
            continue
        if fade:
            why = f"--structured_attention_fade {fade} is laid out over the planned budget"
        elif schedule == "constant":
            then, now = saved[name], current[name]
            notes.append(f"--{name} changed from {then!r} to {now!r}: training continues to the new budget")
            continue
        else:
            why = (
                f"the {schedule} learning-rate schedule is laid out over the planned budget, so changing it "
                "makes the learning rate jump; only a constant schedule can be extended"
            )
        changed.append(f"--{name} {saved[name]!r} in the checkpoint, {current[name]!r} now ({why})")
    if changed:
        raise Refusal(
            f"--resume_from_checkpoint {checkpoint}: these flags differ from the run that wrote the checkpoint: "
            + "; ".join(changed)
            + ". Resume with the original values (see run_settings.json in the checkpoint), or start a new run "
            "with a new --output_dir"
        )
    return notes
