"""Move checkpoints between hfbert and `transformers`' own BERT.

Parameter names are identical on both sides, so a conversion is: load with one library's `from_pretrained`
(which understands every safetensors layout it ever wrote: legacy gamma/beta names, shards; a pickled .bin is
refused, never unpickled), load the state dict
strictly into the twin class of the other library, and save. The head is kept: BertForMaskedLM <->
HfBertForMaskedLM, BertForPreTraining <-> HfBertForPreTraining, and so on.

    python -m hfbert.convert to-transformers runs/hfbert-tiny exported/bert-tiny
    python -m hfbert.convert from-transformers path/to/bert-base-uncased converted/hfbert-base
"""

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import transformers
from transformers import AutoTokenizer, BertConfig

import hfbert
from hfbert.configuration_hfbert import HfBertConfig
from hfbert.errors import Refusal
from hfbert.files import (
    FINAL_FOLDER_FIX,
    check_folder_readable,
    check_local_path_exists,
    refuse_pickled_weights,
    running_no_folder_code,
    staged_folder,
)
from hfbert.flags import RefusingHfArgumentParser
from hfbert.modeling_hfbert import AUTO_MAP

_BOOKKEEPING_KEYS = {"model_type", "architectures", "auto_map", "transformers_version", "dtype"}


def _convert_config(config: transformers.PretrainedConfig, target: type) -> transformers.PretrainedConfig:
    """Every field but the bookkeeping ones, into `target`: HfBertConfig's fields are all BertConfig's."""
    shared = {key: value for key, value in config.to_dict().items() if key not in _BOOKKEEPING_KEYS}
    return target(**shared, attn_implementation=config._attn_implementation)


def bert_config_for(config: HfBertConfig) -> BertConfig:
    """The stock `transformers.BertConfig` of the same architecture."""
    return _convert_config(config, BertConfig)


def hfbert_config_for(config: BertConfig) -> HfBertConfig:
    """The `HfBertConfig` of a stock BERT config's architecture (BERT's decoder fields, such as is_decoder,
    ride along as extra attributes, unused)."""
    return _convert_config(config, HfBertConfig)


# Weights a folder may lack and still be the model it says: heads, which start fresh or are the task's own (a
# BertForMaskedLM folder lacks the NSP head and the pooler).
HEAD_WEIGHT_PREFIXES = ("cls.", "bert.pooler.", "classifier.", "qa_outputs.")
_MISMATCH_FIX = "its config.json and weights do not belong together: copy or download the folder again"


# How every command that checks what it loaded calls from_pretrained: weights of another shape reported in the
# loading info (not raised as a RuntimeError), and never a pickle (`hfbert.files.refuse_pickled_weights`).
LOAD_CHECKED = {"output_loading_info": True, "ignore_mismatched_sizes": True, "use_safetensors": True}


def check_weights_loaded(folder: str, loading_info: Mapping[str, Any], fix: str) -> None:
    """Refuse a model (from_pretrained with `LOAD_CHECKED`) whose encoder weights were not all in `folder` (e.g. a
    config.json with more layers than model.safetensors holds) or any of whose weights has another shape there
    than its config.json asks for: from_pretrained fills them with random values and carries on."""
    body = [key for key in loading_info["missing_keys"] if not key.startswith(HEAD_WEIGHT_PREFIXES)]
    if body:
        shown = ", ".join(body[:4]) + (", ..." if len(body) > 4 else "")
        raise Refusal(f"{folder} lacks encoder weights that its config.json asks for ({shown}); {fix}")
    mismatched = sorted(loading_info["mismatched_keys"])
    if mismatched:
        shown = ", ".join(
            f"{key}: {list(in_file)} in the file, {list(in_model)} in the model"
            for key, in_file, in_model in mismatched[:2]
        )
        more = f", and {len(mismatched) - 2} more" if len(mismatched) > 2 else ""
        raise Refusal(f"{folder} holds weights of other shapes than its config.json asks for ({shown}{more}); {fix}")


# The classes hfbert and transformers both have, by their name after HfBert / Bert: hfbert's model classes.
TWIN_CLASSES = tuple(
    reference.rpartition(".HfBert")[2] for auto_class, reference in AUTO_MAP.items() if auto_class != "AutoConfig"
)
_SOURCE_FIX = "pass a model folder (config.json and its weights) or a Hub model id"


def _read_config(config_class: type, source: Path) -> transformers.PretrainedConfig:
    """The source's config, after refusing a source without one (or an unreachable Hub), of another
    model_type than `config_class`'s, or that names other than exactly one architecture."""
    try:
        found = transformers.PretrainedConfig.get_config_dict(source)[0].get("model_type")
    except OSError as error:
        reason = str(error).splitlines()[0] if str(error) else type(error).__name__
        raise Refusal(f"source {source}: cannot read its config ({reason}); {_SOURCE_FIX}") from None
    if found != config_class.model_type:
        raise Refusal(
            f"source {source} holds a {found!r} model, not {config_class.model_type!r}; to-transformers reads an "
            "hfbert folder (model_type 'hfbert'), from-transformers a transformers BERT one (model_type 'bert')"
        )
    config = config_class.from_pretrained(source)
    if len(config.architectures or []) != 1:
        raise Refusal(
            f"{source}/config.json must name exactly one architecture, got {config.architectures or []}; "
            "re-save the model with save_pretrained so it is recorded."
        )
    return config


def _convert(source_dir: str | os.PathLike, output_dir: str | os.PathLike, to_bert: bool) -> Path:
    """Load the source folder with its own library's class and save its state dict as the twin class of the
    other library (HfBertForX <-> BertForX), with the source's tokenizer if any, into a staged folder that
    appears whole."""
    check_local_path_exists(str(source_dir), "source", _SOURCE_FIX)
    source, output_dir = Path(source_dir), Path(output_dir)
    if source.is_dir():  # a truncated or garbled JSON / safetensors file is named
        check_folder_readable(
            source, f"copy or download {source} again (for an hfbert run's output folder: {FINAL_FOLDER_FIX})"
        )
        refuse_pickled_weights(source, f"source {source}")
    # refused before the weights are read
    if output_dir.exists() and (not output_dir.is_dir() or any(output_dir.iterdir())):
        raise Refusal(f"output_dir {output_dir} exists and is not an empty folder; pass a new output folder")
    config = _read_config(HfBertConfig if to_bert else BertConfig, source)
    architecture = config.architectures[0]
    if not to_bert and not architecture.startswith("Bert"):
        raise Refusal(f"{source} holds a {architecture}, not a BERT model; pass a transformers BERT folder")
    tokenizer = None
    if (source / "tokenizer_config.json").exists() or (source / "vocab.txt").exists():
        with running_no_folder_code(f"source {source}", f"tokenizer (in {source})"):
            tokenizer = AutoTokenizer.from_pretrained(source, trust_remote_code=False)
    libraries = {"HfBert": hfbert, "Bert": transformers}
    prefix, twin_prefix = ("HfBert", "Bert") if to_bert else ("Bert", "HfBert")
    if not architecture.startswith(prefix) or architecture.removeprefix(prefix) not in TWIN_CLASSES:
        names = [prefix + name for name in TWIN_CLASSES]
        raise Refusal(
            f"{source}/config.json names the architecture {architecture}, which "
            f"{'to' if to_bert else 'from'}-transformers does not convert; it converts {', '.join(names[:-1])} "
            f"and {names[-1]}"
        )
    model, info = getattr(libraries[prefix], architecture).from_pretrained(source, **LOAD_CHECKED)
    check_weights_loaded(str(source), info, _MISMATCH_FIX)
    twin_config = bert_config_for(config) if to_bert else hfbert_config_for(config)
    twin = getattr(libraries[twin_prefix], architecture.replace(prefix, twin_prefix, 1))(twin_config)
    twin.load_state_dict(model.state_dict(), strict=True)
    with staged_folder(output_dir) as staging:
        twin.save_pretrained(staging)
        if tokenizer is not None:
            tokenizer.save_pretrained(staging)
    return output_dir


def to_transformers(hfbert_dir: str | os.PathLike, output_dir: str | os.PathLike) -> Path:
    """Write an hfbert checkpoint as a stock BERT folder that `transformers.BertFor...` loads without
    `trust_remote_code` (weights, config with model_type "bert", tokenizer if present)."""
    return _convert(hfbert_dir, output_dir, to_bert=True)


def from_transformers(bert_dir: str | os.PathLike, output_dir: str | os.PathLike) -> Path:
    """Write a stock BERT folder (as `BertForPreTraining.save_pretrained` writes it, or bert-base-uncased's
    layout) as an hfbert checkpoint, keeping its head."""
    return _convert(bert_dir, output_dir, to_bert=False)


def main(argv: list[str] | None = None) -> None:
    parser = RefusingHfArgumentParser(description=__doc__)
    parser.add_argument("direction", choices=["to-transformers", "from-transformers"])
    parser.add_argument("source", help="checkpoint folder to read")
    parser.add_argument("output_dir", help="new folder to write (must not exist or be empty)")
    args = parser.parse_args(argv)
    convert = to_transformers if args.direction == "to-transformers" else from_transformers
    print(f"wrote {convert(args.source, args.output_dir)}")


if __name__ == "__main__":
    from hfbert.errors import run_cli

    run_cli(main, prog="python -m hfbert.convert")
