"""--model_name_or_path: the weights a new run starts from.

A source is an hfbert final folder, a checkpoint folder of an hfbert run (its `config.json` and
`model.safetensors` beside the training state), or a stock `transformers` BERT folder or Hub id, converted in
memory as `python -m hfbert.convert from-transformers` does (parameter names are identical, heads kept). All
that can refuse a source is read from its config and tokenizer (and a checkpoint's manifest) alone, before any
corpus is read; the weights are loaded, and checked to be finite and of a trained model's magnitude, when the
model is built.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from huggingface_hub.errors import HFValidationError, StrictDataclassClassValidationError
from huggingface_hub.utils import validate_repo_id
from transformers import AutoConfig, AutoTokenizer, BertForPreTraining, PreTrainedTokenizerBase

import hfbert  # noqa: F401  (registers model_type "hfbert" with AutoConfig)
from hfbert.checkpointing import MANIFEST_NAME, damaged_file, find_checkpoints, tokenizer_folder
from hfbert.configuration_hfbert import PRESET_FIELDS, PRESETS, HfBertConfig
from hfbert.errors import Refusal
from hfbert.files import (
    LOAD_CHECKED,
    REMOTE_CODE_MARK,
    check_local_files,
    check_local_path_exists,
    check_weights_loaded,
    check_weights_usable,
    folder_code_refusal,
    holds_weights,
    refuse_pickled_weights,
    running_no_folder_code,
)
from hfbert.modeling_hfbert import HfBertForPreTraining
from hfbert.pretraining.settings import DataSettings, ModelSettings
from hfbert.tokenization import load_tokenizer

logger = logging.getLogger(__name__)

FLAG = "--model_name_or_path"
_FIX = (
    "pass an hfbert run's output folder, one of its checkpoint-<step> folders, a transformers BERT folder "
    "(config.json with model_type 'bert' and its weights) or a Hub id such as bert-base-uncased"
)


@dataclass(frozen=True)
class SourceModel:
    """A model a run starts from, as found by `find_source_model`."""

    name: str  # as given: recorded as the run's base_model
    location: str  # the local folder or Hub id that from_pretrained reads
    model_type: str  # "hfbert" or "bert"
    config: HfBertConfig  # the source's architecture as an hfbert config
    tokenizer_location: str | None  # the folder or Hub id of its tokenizer, if it has one


def _read_config(location: str, name: str) -> Any:
    try:
        return AutoConfig.from_pretrained(location, trust_remote_code=False)
    except (OSError, ValueError, KeyError, StrictDataclassClassValidationError) as error:
        if REMOTE_CODE_MARK in str(error):
            raise folder_code_refusal(f"{FLAG} {name}", "model type (config.json)") from None
        # HfBertConfig's own ValueError reaches here wrapped by huggingface_hub's strict dataclass validation
        error = error.__cause__ if isinstance(error, StrictDataclassClassValidationError) else error
        reason = str(error).splitlines()[0] if str(error) else type(error).__name__
        raise Refusal(f"{FLAG} {name}: cannot read its config ({reason}); {_FIX}") from None


def _local_location(name: str, path: Path) -> tuple[str, str | None]:
    """(folder, tokenizer location) of a local source, after refusing what is no model folder."""
    if path.is_file():
        raise Refusal(f"{FLAG} {name} is a file; pass the folder that holds it ({path.parent}), or {_FIX}")
    check_local_files(path, FLAG, f"copy or write it again, or {_FIX}")
    if not (path / "config.json").is_file():
        checkpoint = (path / MANIFEST_NAME).is_file() or path.name.startswith("checkpoint-")
        reason = (
            "is a checkpoint written before checkpoints carried the model's config.json; resume that run to "
            "its end and start from its output folder"
            if checkpoint
            else "holds no config.json, so it is not a model folder"
        )
        raise Refusal(f"{FLAG} {name}: {path.absolute()} {reason}; {_FIX}")
    if not holds_weights(path):
        raise Refusal(f"{FLAG} {name}: {path.absolute()} has a config.json but no model weights; {_FIX}")
    refuse_pickled_weights(path, f"{FLAG} {name}")
    if (path / MANIFEST_NAME).is_file():
        _check_checkpoint_intact(name, path)
    tokenizer_location = tokenizer_folder(path)
    return str(path), None if tokenizer_location is None else str(tokenizer_location)


def _check_checkpoint_intact(name: str, checkpoint: Path) -> None:
    """A checkpoint source is verified against its manifest (sizes and sha256), as a resume verifies it."""
    problem = damaged_file(checkpoint)
    if problem is None:
        return
    others = [path for path in find_checkpoints(checkpoint.parent) if path.name != checkpoint.name]
    fix = (
        f"start from another of its run's checkpoints ({', '.join(path.name for path in others)}), e.g. {FLAG} "
        f"{others[-1]}"
        if others
        else f"copy the checkpoint again, or {_FIX}"
    )
    raise Refusal(f"{FLAG} {name}: the checkpoint is damaged: {problem}; {fix}")


def find_source_model(name: str) -> SourceModel:
    """The source named by --model_name_or_path: a local folder, else a Hub id (Refusal otherwise)."""
    path = Path(name).expanduser()
    check_local_path_exists(name, FLAG, _FIX)
    if path.exists():
        location, tokenizer_location = _local_location(name, path)
    else:
        try:
            validate_repo_id(name)
        except HFValidationError:
            raise Refusal(f"{FLAG} {name}: no such folder ({path.absolute()}); {_FIX}") from None
        location, tokenizer_location = name, name  # a Hub model carries its tokenizer
    config = _read_config(location, name)  # an HfBertConfig where model_type is "hfbert" (registered)
    if config.model_type not in ("hfbert", "bert"):
        raise Refusal(f"{FLAG} {name} holds a {config.model_type!r} model, not BERT; {_FIX}")
    hfbert_config = config if config.model_type == "hfbert" else HfBertConfig.from_bert_config(config)
    return SourceModel(name, location, config.model_type, hfbert_config, tokenizer_location)


def check_source_fits(
    source: SourceModel,
    tokenizer: PreTrainedTokenizerBase,
    source_tokenizer: PreTrainedTokenizerBase | None,
    model: ModelSettings,
    max_seq_length: int,
) -> None:
    """Refuse, naming the value and the fix, a run whose flags contradict its source model."""
    where, config_name, model_size = f"{FLAG} {source.name}", model.config_name, model.model_size
    if config_name is not None:
        raise Refusal(
            f"--config_name {config_name} and {where} both set the architecture; drop --config_name "
            "(the model's architecture is the source's)"
        )
    if model_size is not None:
        preset = dict(zip(PRESET_FIELDS, PRESETS[model_size], strict=True))
        differing = [key for key, value in preset.items() if getattr(source.config, key) != value]
        if differing:
            found = ", ".join(f"{key} {getattr(source.config, key)} (preset {preset[key]})" for key in differing)
            raise Refusal(f"--model_size {model_size} contradicts {where}: {found}; drop --model_size")
    if max_seq_length > source.config.max_position_embeddings:
        raise Refusal(
            f"--max_seq_length {max_seq_length} exceeds {where}'s max_position_embeddings "
            f"{source.config.max_position_embeddings}; pass --max_seq_length <= "
            f"{source.config.max_position_embeddings}"
        )
    if len(tokenizer) > source.config.vocab_size or tokenizer.pad_token_id != source.config.pad_token_id:
        raise Refusal(
            f"the tokenizer ({len(tokenizer)} tokens, pad id {tokenizer.pad_token_id}) does not fit {where} "
            f"(vocab_size {source.config.vocab_size}, pad_token_id {source.config.pad_token_id}); use the "
            "source's own tokenizer (drop --tokenizer_name)"
        )
    if source_tokenizer is not None and source_tokenizer.get_vocab() != tokenizer.get_vocab():
        raise Refusal(
            f"the tokenizer's vocabulary differs from {where}'s own ({len(tokenizer)} vs {len(source_tokenizer)} "
            "tokens, or other ids): its embeddings would mean other tokens; drop --tokenizer_name to use the "
            "source's tokenizer"
        )


def check_source_model(model: ModelSettings, data: DataSettings) -> SourceModel | None:
    """--model_name_or_path found and checked against the tokenizer and the flags, before any data is read."""
    if model.model_name_or_path is None:
        return None
    source = find_source_model(model.model_name_or_path)
    location = source.tokenizer_location
    source_tokenizer = None
    if location:
        with running_no_folder_code(f"{FLAG} {source.name}", f"tokenizer (in {location})"):
            source_tokenizer = AutoTokenizer.from_pretrained(location, trust_remote_code=False)
    if data.tokenizer_name is not None:
        tokenizer = load_tokenizer(data.tokenizer_name)
    elif source_tokenizer is not None:
        tokenizer = source_tokenizer
    else:
        raise Refusal(
            f"{FLAG} {source.name} holds no tokenizer; pass the tokenizer it was trained with as --tokenizer_name"
        )
    check_source_fits(source, tokenizer, source_tokenizer, model, data.max_seq_length)
    return source


def source_run_config(source: SourceModel, dropout: float | None) -> HfBertConfig:
    """The new run's model config: the source's, with --dropout applied."""
    config = HfBertConfig.from_dict(source.config.to_dict())
    if dropout is not None:
        config.hidden_dropout_prob = config.attention_probs_dropout_prob = dropout
    return config


def load_source_model(source: SourceModel, config: HfBertConfig) -> HfBertForPreTraining:
    """HfBertForPreTraining of `config` holding the source's weights (MLM and NSP heads included; a head the
    source lacks starts fresh, with a warning)."""
    if source.model_type == "hfbert":
        model, info = HfBertForPreTraining.from_pretrained(source.location, config=config, **LOAD_CHECKED)
    else:
        bert, info = BertForPreTraining.from_pretrained(source.location, config=config.to_bert_config(), **LOAD_CHECKED)
        model = HfBertForPreTraining(config)
        model.load_state_dict(bert.state_dict(), strict=True)
    missing, unexpected = list(info["missing_keys"]), list(info["unexpected_keys"])
    check_weights_loaded(f"{FLAG} {source.name}", info, _FIX)
    if missing:
        logger.warning(f"{FLAG} {source.name} has no weights for {', '.join(missing)}: initialised fresh.")
    if unexpected:
        logger.warning(f"{FLAG} {source.name}: weights not used by BertForPreTraining: {', '.join(unexpected)}")
    check_weights_usable(f"{FLAG} {source.name}", model.state_dict())
    return model
