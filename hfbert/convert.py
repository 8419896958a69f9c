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
from pathlib import Path

import transformers
from transformers import AutoTokenizer, BertConfig

import hfbert
from hfbert.configuration_hfbert import HfBertConfig
from hfbert.errors import Refusal
from hfbert.files import (
    FINAL_FOLDER_FIX,
    LOAD_CHECKED,
    check_folder_readable,
    check_local_path_exists,
    check_weights_loaded,
    refuse_pickled_weights,
    running_no_folder_code,
    staged_folder,
)
from hfbert.flags import RefusingHfArgumentParser
from hfbert.modeling_hfbert import AUTO_MAP

_MISMATCH_FIX = "its config.json and weights do not belong together: copy or download the folder again"


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
    if output_dir.is_symlink():  # the staged folder is renamed into its path, which a link's is not
        raise Refusal(
            f"output_dir {output_dir} is a symbolic link (to {os.readlink(output_dir)}): the conversion is written "
            "as a new folder in its place; pass the folder's own path or a new one"
        )
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
    twin_config = config.to_bert_config() if to_bert else HfBertConfig.from_bert_config(config)
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
