"""The models a fine-tuning run compares: each folder checked before any work, its epochs and rate grid from
its size, and each fit's classifier built from it (pretrained or freshly initialised, optionally with its
attention queries and keys drawn afresh).

No folder's own Python runs unless the user passes --trust_remote_code: an hfbert folder loads through the
installed hfbert classes (registered with the Auto classes by `import hfbert`), so the code that runs is the
installed one, not the copy the folder ships for machines without hfbert."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file
from transformers import (
    AutoConfig,
    AutoModelForSequenceClassification,
    AutoTokenizer,
    PreTrainedTokenizerBase,
)
from transformers.models.auto.modeling_auto import MODEL_FOR_SEQUENCE_CLASSIFICATION_MAPPING as CLASSIFIERS

import hfbert  # noqa: F401  (registers model_type "hfbert" with the Auto classes)
from hfbert.checkpointing import (
    MANIFEST_NAME,
    TOKENIZER_FOLDER,
    TRAINING_ARGS_NAME,
    tokenizer_folder,
    verify_checkpoint,
)
from hfbert.errors import Refusal
from hfbert.files import (
    REMOTE_CODE_MARK,
    TOKENIZER_FILES,
    check_folder_readable,
    check_weights_usable,
    folder_code_refusal,
    holds_model,
    refuse_pickled_weights,
)
from hfbert.finetune.settings import (
    LARGER_MODEL_EPOCHS,
    LARGER_MODEL_RATES,
    RANDOM_INIT,
    SMALL_HIDDEN_SIZE,
    SMALL_MODEL_EPOCHS,
    SMALL_MODEL_RATES,
    FinetuneTrainingArguments,
)
from hfbert.model_card import pretrained_from_structured_start

# What the results are keyed by: the model under test, and what it is compared with (never a folder's name).
MODEL_ROLE = "model"
COMPARISON_ROLE = "comparison"
FOLDER_FIX = (
    "pass a finished run's output folder (or one of its checkpoint-<step> folders, or any BERT folder)"
)
TRUST_REMOTE_CODE_FIX = "pass --trust_remote_code if you trust that code"


def check_model_folder(folder: str, flag: str = "model_dir") -> Path:
    """Refuse, before any work, a folder that holds no model, a damaged one (unreadable JSON or safetensors,
    files that differ from a checkpoint's sha256 manifest, weights that are not finite), one whose weights are
    a pickle only or one without a tokenizer; returns the folder that holds its tokenizer (the folder, or an
    older checkpoint's tokenizer/)."""
    path, where = Path(folder), f"{flag} {folder}"
    if path.is_file():
        raise Refusal(f"{where}: is a file; pass the folder that holds it ({path.parent}), or {FOLDER_FIX}")
    if not path.is_dir():
        raise Refusal(f"{where}: no such folder; {FOLDER_FIX}")
    if not holds_model(path):
        raise Refusal(
            f"{where} holds no model (config.json and weights); {FOLDER_FIX}, not a tokenizer folder"
        )
    refuse_pickled_weights(path, where)
    if (path / MANIFEST_NAME).is_file():  # a checkpoint: every file as it was saved
        verify_checkpoint(path)
    tokenizer_location = tokenizer_folder(path)
    if tokenizer_location is None:
        raise Refusal(
            f"{where} holds no tokenizer ({', '.join(TOKENIZER_FILES)}, at its top or in {TOKENIZER_FOLDER}/); "
            f"{FOLDER_FIX}, or save the tokenizer it was trained with into it (tokenizer.save_pretrained(folder))"
        )
    try:
        for place in {path, tokenizer_location}:
            check_folder_readable(place, "copy or write the folder again")
    except ValueError as error:  # the file's own message, after the flag and folder
        raise Refusal(f"{where}: {error}") from None
    for weights in sorted(path.glob("*.safetensors")):  # a file at a time: a sharded model's too
        check_weights_usable(where, load_file(weights))
    return tokenizer_location


@dataclass(frozen=True)
class Candidate:
    """One model the run fine-tunes: the one under test (role "model") or the comparison."""

    role: str  # MODEL_ROLE or COMPARISON_ROLE: what the results are keyed by
    folder: str  # where its config (and, unless init is RANDOM_INIT, its weights) come from
    init: str  # "pretrained" or RANDOM_INIT
    tokenizer: PreTrainedTokenizerBase
    num_train_epochs: float  # --num_train_epochs, or the default for the model's size
    learning_rates: tuple[float, ...]  # the one --learning_rate, or the rates `auto` chooses from
    trust_remote_code: bool = False


def describe(folder: str, init: str) -> str:
    """A model as 'folder' or 'folder, random init', in the lines and the table."""
    return f"{folder}, random init" if init == RANDOM_INIT else folder


def load_config(folder: str, where: str, trust_remote_code: bool) -> Any:
    """The folder's config, refused in one line if it does not load or needs the folder's own code unasked."""
    try:
        return AutoConfig.from_pretrained(folder, trust_remote_code=trust_remote_code)
    except (OSError, ValueError, KeyError) as error:
        if REMOTE_CODE_MARK in str(error):
            raise folder_code_refusal(where, "model type (config.json)", TRUST_REMOTE_CODE_FIX) from None
        raise Refusal(
            f"{where}: its config.json cannot be read ({str(error).splitlines()[0]}); {FOLDER_FIX}"
        ) from None


def load_tokenizer(tokenizer_folder: Path, where: str, trust_remote_code: bool) -> PreTrainedTokenizerBase:
    try:
        return AutoTokenizer.from_pretrained(tokenizer_folder, trust_remote_code=trust_remote_code)
    except Exception as error:  # the Rust tokenizers raise plain Exceptions; transformers KeyError, OSError
        if REMOTE_CODE_MARK in str(error):
            what = f"tokenizer (in {tokenizer_folder})"
            raise folder_code_refusal(where, what, TRUST_REMOTE_CODE_FIX) from None
        raise Refusal(
            f"{where}: its tokenizer in {tokenizer_folder} cannot be loaded ({type(error).__name__}: "
            f"{str(error).splitlines()[0] if str(error) else ''}); save the tokenizer the model was trained with "
            "into the folder again"
        ) from None


def load_candidate(
    role: str, folder: str, flag: str, training: FinetuneTrainingArguments, pair_task: bool, trust_remote_code: bool
) -> Candidate:
    """Check `folder` and the flags against its config and tokenizer; refuses what would fail mid-training."""
    tokenizer_folder = check_model_folder(folder, flag)
    where = f"{flag} {folder}"
    config = load_config(folder, where, trust_remote_code)
    remote_classes = (getattr(config, "auto_map", None) or {}) if trust_remote_code else {}
    if "AutoModelForSequenceClassification" not in remote_classes and type(config) not in CLASSIFIERS:
        raise Refusal(
            f"{where} holds a {config.model_type!r} model, which has no sequence-classification class in "
            f"transformers; {FOLDER_FIX}"
        )
    tokenizer = load_tokenizer(tokenizer_folder, where, trust_remote_code)
    positions = getattr(config, "max_position_embeddings", None)
    if positions is not None and training.max_seq_length > positions:
        raise Refusal(
            f"--max_seq_length {training.max_seq_length} exceeds {where}'s max_position_embeddings {positions}; "
            f"pass --max_seq_length <= {positions}"
        )
    special = tokenizer.num_special_tokens_to_add(pair=pair_task)
    if training.max_seq_length <= special:
        raise Refusal(
            f"--max_seq_length {training.max_seq_length} leaves no room for text beside the {special} special "
            "tokens; pass a larger --max_seq_length (128 is usual)"
        )
    vocab_size = getattr(config, "vocab_size", None)
    if vocab_size is not None and len(tokenizer) > vocab_size:
        raise Refusal(
            f"{where}: its tokenizer has {len(tokenizer)} tokens but the model only {vocab_size} embeddings; "
            "save the tokenizer the model was trained with into the folder"
        )
    epochs, rates = training_settings(config, where, training)
    return Candidate(role, folder, "pretrained", tokenizer, epochs, rates, trust_remote_code)


def size_defaults(hidden_size: int) -> tuple[float, tuple[float, ...]]:
    """(epochs, the learning rates `--learning_rate auto` tries) for a model of `hidden_size`."""
    if hidden_size <= SMALL_HIDDEN_SIZE:
        return SMALL_MODEL_EPOCHS, SMALL_MODEL_RATES
    return LARGER_MODEL_EPOCHS, LARGER_MODEL_RATES


def training_settings(config: Any, where: str, training: FinetuneTrainingArguments) -> tuple[float, tuple[float, ...]]:
    """(epochs, learning rates to try) from the flags, and where they are left to the default, from the model's
    hidden size; refuses a config without one in that case."""
    epochs = training.num_train_epochs
    rates = training.learning_rate_grid if training.chooses_rate else [training.learning_rate]
    if epochs is None or rates is None:
        hidden_size = getattr(config, "hidden_size", None)
        if not isinstance(hidden_size, int):
            raise Refusal(
                f"{where}: its config has no hidden_size, which the default epochs and learning rates follow; "
                "pass --num_train_epochs and --learning_rate (or --learning_rate_grid)"
            )
        default_epochs, default_rates = size_defaults(hidden_size)
        epochs, rates = epochs or default_epochs, rates or default_rates  # flags are None or > 0, lists non-empty
    return epochs, tuple(rates)


def build_model(
    candidate: Candidate, label_names: list[str], seed: int, reinit_query_key: bool = False
) -> torch.nn.Module:
    """The classifier of `candidate`: its folder's pretrained weights, or (init = RANDOM_INIT) the same config
    freshly initialised under `seed`. The classification head is new either way; with `reinit_query_key` so
    are the pretrained model's attention queries and keys."""
    labels = {"id2label": dict(enumerate(label_names)), "label2id": {n: i for i, n in enumerate(label_names)}}
    options = {"num_labels": len(label_names), "trust_remote_code": candidate.trust_remote_code, **labels}
    torch.manual_seed(seed)  # the new head (and, for random_init, everything) starts from the seed
    if candidate.init == RANDOM_INIT:
        config = AutoConfig.from_pretrained(candidate.folder, **options)
        return AutoModelForSequenceClassification.from_config(
            config, trust_remote_code=candidate.trust_remote_code
        )
    model = AutoModelForSequenceClassification.from_pretrained(candidate.folder, use_safetensors=True, **options)
    if reinit_query_key:
        reinitialise_query_key(model)
    return model


@torch.no_grad()
def reinitialise_query_key(model: torch.nn.Module) -> int:
    """Draw every attention layer's query and key projections afresh, as BERT initialises them (N(0,
    initializer_range), zero bias), keeping the embeddings, values, outputs and feed-forward layers; returns
    how many projections were drawn. The attention patterns a small model learns in pretraining (the previous
    and next token, the same word) are sharp, and few-label fine-tuning does not unlearn them, while the rest
    of the weights transfer well (benchmarks/results/downstream.md). Drawn here rather than by the model's
    `_init_weights`, which skips tensors that `from_pretrained` loaded."""
    projections = [
        module
        for name, module in model.named_modules()
        if isinstance(module, torch.nn.Linear) and name.rsplit(".", 1)[-1] in ("query", "key")
    ]
    if not projections:
        raise Refusal(
            f"{type(model).__name__} has no attention projections named query and key (BERT's layout); "
            "fine-tune it without --reinit_query_key"
        )
    std = model.config.initializer_range
    for projection in projections:
        projection.weight.normal_(0.0, std)
        if projection.bias is not None:
            projection.bias.zero_()
    return len(projections)


def reinit_query_key_hint(folder: str) -> str | None:
    """A note for a folder that `run_pretraining.py` pretrained from the structured attention start (its
    training_args.json says so), faded or not: such folders pretrained on WikiText fine-tuned better with
    --reinit_query_key, two pretrained on their set's own text no differently. None for any other folder."""
    try:
        training_args = json.loads((Path(folder) / TRAINING_ARGS_NAME).read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(training_args, dict) or not pretrained_from_structured_start(training_args):
        return None
    return (
        f"Note: {folder} was pretrained from the structured attention start. Such folders pretrained on "
        "WikiText fine-tuned better with --reinit_query_key (tiny models, 150 and 1,500 labels: "
        "benchmarks/results/downstream.md in the hfbert repository), two pretrained on their set's own text no "
        "differently (benchmarks/results/own_text.md): compare a run with it."
    )
