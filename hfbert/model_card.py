"""Model card (README.md with Hub YAML metadata) for a finished run, and the upload of the run folder."""

from __future__ import annotations

import logging
import os
import re
from fnmatch import fnmatch
from pathlib import Path
from typing import Any

from huggingface_hub import CommitOperationAdd, EvalResult, HfApi, ModelCard, ModelCardData, constants
from huggingface_hub.errors import HFValidationError
from huggingface_hub.utils import filter_repo_objects, validate_repo_id

from hfbert.corpus_arguments import is_file_collection
from hfbert.errors import Refusal
from hfbert.files import (
    CHECKPOINT_PREFIX,
    FINAL_FOLDER_FIX,
    FINAL_RECORD,
    check_readable,
    not_as_published,
    recorded_final_files,
)
from hfbert.markdown import cell, code

MODEL_CARD_NAME = "README.md"
CURVES_NAME = "training_curves.png"
CARD_TAGS = ["hfbert", "bert", "fill-mask", "pretraining"]
# Without these the uploaded folder is not a loadable model; checked before anything touches the network.
REQUIRED_UPLOAD_FILES = ("config.json", "model.safetensors", MODEL_CARD_NAME)
# The names an hfbert final folder publishes, for a folder whose FINAL_RECORD is lost: what it holds beside them is
# the user's.
FINAL_FOLDER_NAMES = (
    "README.md", "config.json", "configuration_hfbert.py", "modeling_hfbert.py", "model.safetensors",
    "model-[0-9][0-9][0-9][0-9][0-9]-of-[0-9][0-9][0-9][0-9][0-9].safetensors", "model.safetensors.index.json",
    "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "vocab.txt", "eval_results.json",
    "training_args.json", "log_history.json", "run_health.json", "samples.md", "samples_similarity.png",
    "samples_attention.png", "training_curves.png",
)  # fmt: skip
# Checkpoints, hidden files (temporary files, .tmp-checkpoint-*, caches) and bytecode, at any depth.
NOT_UPLOADED = [f"{CHECKPOINT_PREFIX}*", ".*", "*/.*", "__pycache__/", "*/__pycache__/"]

logger = logging.getLogger(__name__)


def _table(rows: dict[str, Any], header: tuple[str, str]) -> str:
    def table_cell(value: Any) -> str:
        if isinstance(value, float):  # 1e-08 would read 0.0000 in the four decimals of the others
            value = f"{value:.3g}" if 0 < abs(value) < 0.01 else f"{value:.4f}"
        elif not isinstance(value, (int, type(None))):  # a flag's text shows as written: no Markdown, no HTML
            return cell(value)
        return str(value)

    lines = [f"| {header[0]} | {header[1]} |", "| --- | --- |"]
    lines += [f"| {key} | {table_cell(value)} |" for key, value in rows.items()]  # the keys are hfbert's names
    return "\n".join(lines)


def _metric_values(eval_results: dict[str, Any]) -> dict[str, float]:
    return {
        key.removeprefix("eval_"): float(value)
        for key, value in eval_results.items()
        if isinstance(value, (int, float)) and not isinstance(value, bool) and key not in ("step", "epoch")
    }


def _is_hub_id(name: str) -> bool:
    """A Hub repository id (the Hub's base_model metadata takes nothing else), not a local folder."""
    try:
        validate_repo_id(name)
    except HFValidationError:
        return False
    return not Path(name).expanduser().exists()


def card_model_name(name: str) -> str:
    """`name` as the card's title, metadata and snippets write it: a valid Hub repo id as it is; anything else (a
    run folder's name may hold quotes or newlines, which would write into the card's Python and Markdown) with
    each run of other characters than letters, digits, `-`, `_` and `.` made one `-`."""
    try:
        validate_repo_id(name)
        return name
    except HFValidationError:
        return re.sub(r"[^\w.-]+", "-", name, flags=re.ASCII).strip("-.")[:96] or "hfbert-model"


def build_model_card(
    *,
    model_name: str,
    training_config: dict[str, Any],
    eval_results: dict[str, Any],
    dataset_name: str | None,
    dataset_config_name: str | None,
    license: str = "apache-2.0",
    samples_name: str | None = None,
    health_section: str | None = None,
    hub_model_id: str | None = None,
) -> ModelCard:
    """The model card of a pretrained hfbert model: Hub metadata, training configuration, evaluation numbers,
    how to load it (from `hub_model_id`, the repo it is pushed to, namespace included; else from `model_name`),
    the training curves and, given `health_section` (markdown from
    `hfbert.pretraining.extras.health.report.health_card_section`), the run's health."""
    model_name = card_model_name(model_name)
    metrics = _metric_values(eval_results)
    base_model = training_config.get("model_name_or_path")  # the weights the run started from, if any
    card_data = ModelCardData(
        base_model=base_model if base_model and _is_hub_id(base_model) else None,
        library_name="transformers",
        license=license,
        datasets=[dataset_name] if dataset_name and _is_hub_id(dataset_name) else None,
        tags=CARD_TAGS,
        pipeline_tag="fill-mask",
        model_name=model_name,
        # model-index needs a dataset id; runs on local files keep their numbers in the body table only.
        eval_results=[
            EvalResult(
                task_type="fill-mask",
                dataset_type=dataset_name,
                dataset_name=dataset_name,
                dataset_config=dataset_config_name,
                dataset_split="validation",
                metric_type=metric,
                metric_value=value,
            )
            for metric, value in metrics.items()
        ]
        if dataset_name and _is_hub_id(dataset_name) and metrics
        else None,
    )
    body = card_body(
        model_name, corpus_description(dataset_name, dataset_config_name, training_config), metrics, samples_name,
        training_config, health_section, hub_model_id,
    )
    return ModelCard(f"---\n{card_data.to_yaml()}\n---\n{body}")


def corpus_description(dataset_name: str | None, dataset_config_name: str | None, training_config: dict[str, Any]) -> str:
    """The card's words for where the training text came from: a Hub dataset, a local dataset folder, local
    files (--train_file) or, with none of them, the sample shipped with hfbert."""
    configuration = f" (configuration {code(dataset_config_name)})" if dataset_config_name else ""
    if dataset_name and _is_hub_id(dataset_name):
        return f"the Hub dataset [{code(dataset_name)}](https://huggingface.co/datasets/{dataset_name}){configuration}"
    if dataset_name:
        return f"the local dataset folder {code(dataset_name)}{configuration}"
    if training_config.get("train_file"):
        validation = training_config.get("validation_file")
        files = "files" if is_file_collection(training_config["train_file"]) else "file"
        return f"the local {files} {code(training_config['train_file'])}" + (
            f" (validation: {code(validation)})" if validation else ""
        )
    return (
        "the WikiText-2 sample shipped with hfbert (articles of "
        "[`Salesforce/wikitext`](https://huggingface.co/datasets/Salesforce/wikitext), `wikitext-2-raw-v1`)"
    )


# What the run trained, by --objective (a run without the key predates the flag: BERT's two objectives).
_OBJECTIVES = {
    "mlm+nsp": "the masked language modelling (MLM) and next sentence prediction (NSP) objectives",
    "mlm": "the masked language modelling (MLM) objective alone (its next-sentence head is untrained)",
}


def pretrained_from_structured_start(training_config: dict[str, Any]) -> bool:
    """Whether the folder was pretrained from scratch from the structured attention start, faded or not: such
    folders pretrained on WikiText fine-tuned better with --reinit_query_key on every labelled set measured."""
    return (
        training_config.get("attention_init") == "structured"
        and not training_config.get("model_name_or_path")  # started from weights: the start was not applied
    )


# The card's advice for a folder `pretrained_from_structured_start`.
_QUERY_KEY_ADVICE = """A small model pretrained from the structured attention start may fine-tune better with
`--reinit_query_key`: its attention queries and keys are drawn afresh, and every other weight stays pretrained. The
start leaves sharp attention patterns that fine-tuning does not unlearn; `--structured_attention_fade` and
`--cls_attention_spread` in pretraining remove most of their harm, not all of it (the README's main job, pretrained
on WikiText, three labelled sets: +4.6 / +0.2 / +0.4 points over random weights as saved, +7.4 / +1.8 / +4.2 with
`--reinit_query_key`). Two folders pretrained on their set's own text scored the same with it as without (0.573
against 0.574 and 0.611 against 0.608): compare a run with it on your labels.

"""


def _usage_sections(model_name: str, repo_id: str, training_config: dict[str, Any]) -> str:
    """The card's "How to load it" (from `repo_id`) and "Fine-tuning" (of the folder `model_name`, as a clone of
    the repo names it: hfbert.finetune reads local folders) sections."""
    return f"""## How to load it

With the `hfbert` package installed, importing it registers the model with the Auto classes:

```python
import hfbert  # registers the "hfbert" model type with transformers' Auto classes
from transformers import AutoModelForMaskedLM, AutoTokenizer, pipeline

tokenizer = AutoTokenizer.from_pretrained("{repo_id}")
model = AutoModelForMaskedLM.from_pretrained("{repo_id}")
fill_mask = pipeline("fill-mask", model=model, tokenizer=tokenizer)
print(fill_mask("The capital of France is [MASK]."))
```

Without `hfbert` installed, let transformers use the model code stored next to the weights:

```python
from transformers import AutoModelForMaskedLM, pipeline

model = AutoModelForMaskedLM.from_pretrained("{repo_id}", trust_remote_code=True)
fill_mask = pipeline("fill-mask", model="{repo_id}", trust_remote_code=True)
```

## Fine-tuning

`python -m hfbert.finetune` fine-tunes it with transformers' `Trainer` over several seeds, on a labelled file
or a Hub dataset, against the same config from random initialisation:

```bash
python -m hfbert.finetune {model_name} --train_file train.csv --validation_file dev.csv \\
    --text_column text --label_column label --compare random_init
```

Each model's learning rate (the comparison's too) is chosen on three folds of the training rows, never on the
evaluation file (`--learning_rate auto`, the default; a number skips the choice), and the epochs follow the
model's size: 20 for hidden size <= 256 (tiny, mini), 3 for larger ones. A seed whose fit collapsed is named, and
the gain is paired per seed with a 95% interval that says when it is within the seed-to-seed noise.
`finetune_results.json` says which rate was chosen, on what, and every fit's scores.

{_QUERY_KEY_ADVICE if pretrained_from_structured_start(training_config) else ""}"""


def card_body(
    model_name: str,
    corpus_description: str,
    metrics: dict[str, float],
    samples_name: str | None,
    training_config: dict[str, Any],
    health_section: str | None = None,
    hub_model_id: str | None = None,
) -> str:
    """The card's markdown below the metadata: what the model is, how to load it (from `hub_model_id`, else
    `model_name`), its numbers and config."""
    base_model = training_config.get("model_name_or_path")  # the weights the run started from, if any
    start = f"from {code(base_model)}" if base_model else "from scratch"
    objectives = _OBJECTIVES[training_config.get("objective", "mlm+nsp")]
    eval_section = (
        _table(metrics, ("metric", "value")) if metrics else "No evaluation was run (no validation split)."
    )
    samples_section = (
        f"## Samples\n\nFill-mask, next-sentence and similarity examples on validation sentences: [{samples_name}]"
        f"({samples_name}).\n\n"
        if samples_name
        else ""
    )
    return f"""
# {model_name}

A BERT model pretrained {start} with `hfbert` on {objectives}, trained on {corpus_description}. It is a native Hugging Face
model: the weights are in `model.safetensors`, and `config.json` maps the Auto classes (`auto_map`) to the
model code shipped in this folder.

{_usage_sections(model_name, hub_model_id or model_name, training_config)}## Evaluation

Measured on the validation split at the end of training (`eval_results.json`):

{eval_section}

{samples_section}## Training curves

![Training loss, learning rate and evaluation metrics over optimizer steps]({CURVES_NAME})

{health_section or ""}
## Training configuration

{_table(training_config, ("parameter", "value"))}
"""


def upload_file_set(folder: str | os.PathLike) -> list[str]:
    """The files of a run folder that `push_to_hub` uploads (relative POSIX paths, sorted): what its final folder
    published, the names its `FINAL_RECORD` lists (model, tokenizer, card, eval results, curves, samples); never
    checkpoints, temporary or hidden files, nor a file of the user's. A folder without that record (lost, or
    finished by an hfbert before it, 7090c6f) uploads its top-level files of the names final folders publish
    (`FINAL_FOLDER_NAMES`)."""
    recorded = recorded_final_files(folder)
    if not recorded:  # lost (`cp -r run/*` leaves hidden files behind), empty, or from before it existed
        return [
            name
            for name in _visible_files(folder)
            if "/" not in name and any(fnmatch(name, name_of) for name_of in FINAL_FOLDER_NAMES)  # top level only
        ]
    return [name for name in _visible_files(folder) if name in recorded]  # hfbert publishes files


def _visible_files(folder: str | os.PathLike) -> list[str]:
    """A run folder's files and file links but checkpoints, temporary and hidden ones (relative POSIX paths,
    sorted)."""
    folder = Path(folder)
    files = (path.relative_to(folder).as_posix() for path in folder.rglob("*") if path.is_file() or path.is_symlink())
    return sorted(filter_repo_objects(files, ignore_patterns=NOT_UPLOADED))


def _check_no_links(folder: Path, files: list[str]) -> None:
    """A link among the files to upload would send its target's bytes (a file outside the folder) under hfbert's
    name: refused, naming it, before anything is read. A hard link too, whatever the record says (there may be
    none, or one without sizes, and the card is the user's to edit): hfbert's files have one name."""
    for path in (folder / name for name in files):
        if path.is_symlink():
            raise Refusal(
                f"--push_to_hub: nothing was uploaded: {path} is a symbolic link (to {os.readlink(path)}), and a "
                "push uploads no file through a link: put the file itself there, or remove the link"
            )
        if (names := path.stat().st_nlink) > 1:
            raise Refusal(
                f"--push_to_hub: nothing was uploaded: {path} is a hard link (a file with {names} names, one of "
                "them maybe outside the folder), and a push uploads only files hfbert wrote, which have one name: "
                f"put a copy of the file there (`cp {path} {path}.copy && mv {path}.copy {path}`), or remove it"
            )


def push_to_hub(
    folder: str | os.PathLike, repo_id: str, *, token: str | None = None, private: bool = False
) -> str:
    """Create `repo_id` on the Hub if needed and upload exactly `upload_file_set(folder)` in one commit.

    Returns the commit URL.
    """
    check_hub_model_id(repo_id)
    folder = Path(folder)
    files = upload_file_set(folder)
    missing = [name for name in REQUIRED_UPLOAD_FILES if name not in files]
    if missing:
        raise Refusal(
            f"--push_to_hub: {folder} lacks {', '.join(missing)}; push only a finished run's output folder "
            "(training writes these files at the end)"
        )
    left_out = sorted(set(_visible_files(folder)) - set(files))
    if left_out:
        why = f"its {FINAL_RECORD} does not list them" if recorded_final_files(folder) else (
            f"the folder has no {FINAL_RECORD}, and a final folder publishes no file of those names"
        )
        logger.warning(
            f"--push_to_hub: not uploading {', '.join(left_out)}: hfbert did not write them ({why}); if they "
            f"belong on the Hub, upload them yourself (`hf upload {repo_id} <file>`)"
        )
    _check_no_links(folder, files)
    changed = not_as_published(folder, [name for name in files if name != MODEL_CARD_NAME])  # users edit the card
    if changed:  # e.g. a hard link to a file from outside the folder at a published name
        raise Refusal(
            f"--push_to_hub: nothing was uploaded: {folder / changed[0]} is not the file the run published there "
            f"(another size or sha256 than its {FINAL_RECORD} records, or modified after a record of names only, "
            "as an older hfbert wrote): put back the run's file, or leave it out of the folder and upload it "
            f"yourself (`hf upload {repo_id} <file>`)"
        )
    try:  # every JSON and safetensors file that would be uploaded: a damaged one is named, nothing uploaded
        check_readable((folder / name for name in files), FINAL_FOLDER_FIX)
    except ValueError as error:
        raise Refusal(f"--push_to_hub: nothing was uploaded: {error}") from None
    problem = hub_access_problem(token)
    if problem is not None:  # asked in seconds, not after huggingface_hub's retries
        raise Refusal(
            f"--push_to_hub: nothing was uploaded: the Hub cannot be used ({problem}); log in with `hf auth login` "
            f"or pass --hub_token, unset HF_HUB_OFFLINE, or check the network, then push the folder with "
            f"`python -m hfbert.push {folder} --hub_model_id {repo_id}`"
        )
    api = HfApi(token=token)
    repo_url = api.create_repo(repo_id, private=private, exist_ok=True)
    # create_commit with our own list (rather than upload_folder's patterns) keeps upload_file_set the single
    # definition of what is uploaded.
    operations = [  # the card as `card_for` gives it, every other file as it is
        CommitOperationAdd(name, card_for(folder, repo_id) if name == MODEL_CARD_NAME else folder / name)
        for name in files
    ]
    commit = api.create_commit(repo_url.repo_id, operations=operations, commit_message="Upload hfbert model")
    return commit.commit_url


def card_for(folder: Path, repo_id: str) -> bytes:
    """The folder's model card as uploaded to `repo_id`: its snippets load `repo_id` (training wrote the id it was
    given, or the folder's name) and fine-tune a clone of it, its title is `repo_id`'s name; the folder's own file
    is left as it is."""
    text = (folder / MODEL_CARD_NAME).read_bytes().decode("utf-8", "surrogateescape")  # any bytes, kept as they are
    # Only the ids training wrote, not a line of the user's about another model: its title's name is the model's
    # name, which its snippets load (under the --hub_model_id namespace, if any) and fine-tune.
    if not (title := re.search(r"^# (.+)$", text, flags=re.MULTILINE)):
        return text.encode("utf-8", "surrogateescape")
    name, new_name = title[1], repo_id.split("/")[-1]
    for call in ("from_pretrained(", "model="):
        text = re.sub(rf'{re.escape(call)}"(?:[^"/\n]+/)?{re.escape(name)}"', f'{call}"{repo_id}"', text)
    text = re.sub(rf"(python -m hfbert\.finetune ){re.escape(name)}(?=\s)", rf"\g<1>{new_name}", text)
    text = text[: title.start()] + f"# {new_name}" + text[title.end() :]
    return text.encode("utf-8", "surrogateescape")


def check_hub_model_id(repo_id: str) -> None:
    """Refuse a --hub_model_id the Hub would reject, or one without a namespace (the Hub would create
    <user>/<id>, which the card's snippets would not load), before anything is trained or uploaded."""
    try:
        validate_repo_id(repo_id)
    except HFValidationError as error:
        raise Refusal(f"--hub_model_id {repo_id}: {error}; pass your-name/model-name") from None
    if "/" not in repo_id:
        raise Refusal(
            f"--hub_model_id {repo_id} has no namespace, so the model card's snippets would load {repo_id}, not "
            f"the repo the Hub creates under your name; pass <your-username>/{repo_id}"
        )


def hub_access_problem(token: str | None = None) -> str | None:
    """Why the Hub cannot be used for a push right now (offline mode, no token, a token the Hub refuses, no
    network), asked in seconds; None when it can."""
    if constants.HF_HUB_OFFLINE:
        return "HF_HUB_OFFLINE is set"
    try:
        HfApi(token=token).whoami(token=token)
    # The causes (no token, HTTP errors, the HTTP client's network errors) share no base class worth naming.
    except Exception as error:
        return f"{type(error).__name__}: {error}"
    return None


def check_hub_access(repo_id: str, *, token: str | None = None, train_anyway: bool = False) -> None:
    """Fail in seconds, before training, when a push at the end could not work. With `train_anyway` the
    problem is only logged."""
    check_hub_model_id(repo_id)
    problem = hub_access_problem(token)
    if problem is None:
        return
    message = (
        f"--push_to_hub {repo_id}: the Hub cannot be used ({problem}); log in with `hf auth login` or pass "
        "--hub_token, check the network, or add --train_if_hub_unreachable to train now and push later with "
        f"`python -m hfbert.push OUTPUT_DIR --hub_model_id {repo_id}`"
    )
    if not train_anyway:
        raise Refusal(message)
    logger.warning(message)
