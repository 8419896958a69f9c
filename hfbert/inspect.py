"""Look inside a trained model folder: attention heatmaps, fill-mask, next-sentence probability, similarity.

Command line (writes PNGs and ``inspect.md`` into ``--output_dir``, default ``CHECKPOINT/inspect``)::

    python -m hfbert.inspect runs/hfbert-tiny-wikitext --text "The game was released in [MASK] ." \\
        --layer 1 --head 0 --pair "He sat down." "Then he ate." \\
        --sentences "The cat sat." "A dog ran." "Stocks fell today."

Library: `inspect_checkpoint` does the same from Python; `check_model_folder` and `load_analysis` give
`hfbert.pretraining.extras.samples.write_samples` (``samples.md``, as a run writes it into its final folder) the analysis
of a saved folder. Every input is checked before any file is written; a bad one
raises `hfbert.errors.Refusal` (a `ValueError`) that names the value and the fix.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import torch
from transformers import AutoConfig, AutoModelForPreTraining, AutoTokenizer

import hfbert  # noqa: F401  (registers model_type "hfbert" with the Auto classes)
from hfbert.analysis import (
    MASK,
    AttentionResult,
    FillMaskResult,
    ModelAnalysis,
    NspResult,
    SimilarityResult,
    nsp_lines,
    plot_attention,
    plot_similarity,
    quiet_libraries,
    similarity_section,
    write_text,
)
from hfbert.errors import Refusal
from hfbert.files import (
    FINAL_FOLDER_FIX,
    LOAD_CHECKED,
    check_folder_readable,
    check_reports_replaceable,
    check_weights_loaded,
    holds_model,
    holds_tokenizer,
    record_reports,
    refuse_pickled_weights,
    running_no_folder_code,
)
from hfbert.flags import RefusingHfArgumentParser
from hfbert.markdown import code

TASKS = ("attention", "fill-mask", "nsp", "similarity")
MODEL_TYPE = "model type (config.json)"  # what a folder's own code would define, in its refusal
REPORT_NAME = "inspect.md"
SIMILARITY_PLOT = "similarity.png"


@dataclass
class Inspection:
    """Everything `inspect_checkpoint` computed, and the files it wrote."""

    checkpoint: Path
    model_summary: str
    attention: AttentionResult | None = None
    fill_mask: FillMaskResult | None = None
    nsp: list[NspResult] = field(default_factory=list)
    similarity: SimilarityResult | None = None
    files: list[Path] = field(default_factory=list)


# ----------------------------------------------------------------------------------------------- checks


def check_model_folder(checkpoint: str | Path, tokenizer_name: str | Path | None = None) -> tuple[Path, Path]:
    """The model folder and the tokenizer folder, or `Refusal` saying what is missing."""
    folder = Path(checkpoint)
    if not folder.exists():
        raise Refusal(
            f"checkpoint folder {str(folder)!r} does not exist; pass the output folder of a training run "
            "(the one holding model.safetensors and config.json)"
        )
    if not folder.is_dir():
        raise Refusal(f"checkpoint {str(folder)!r} is a file; pass the folder that holds it instead")
    if not holds_model(folder):
        raise Refusal(
            f"{str(folder)!r} is not a saved model folder: it needs config.json and model.safetensors. A "
            "checkpoint-<step> folder holds resumable training state; inspect the run's output folder instead"
        )
    refuse_pickled_weights(folder, str(folder))
    tokenizer_folder = folder if tokenizer_name is None else Path(tokenizer_name)
    if not holds_tokenizer(tokenizer_folder):
        where = "--tokenizer_name" if tokenizer_name is not None else "checkpoint folder"
        raise Refusal(
            f"the {where} {str(tokenizer_folder)!r} has no tokenizer (no tokenizer.json or vocab.txt); pass "
            "--tokenizer_name DIR with the tokenizer the model was trained with, or save it into the folder "
            "with tokenizer.save_pretrained(...)"
        )
    check_folder_readable(folder, FINAL_FOLDER_FIX)
    if tokenizer_folder != folder:
        check_folder_readable(
            tokenizer_folder, "pass another --tokenizer_name, or save the tokenizer there again"
        )
    return folder, tokenizer_folder


def check_index(name: str, value: int, count: int, what: str) -> None:
    if not 0 <= value < count:
        raise Refusal(
            f"{name} {value} is out of range: this model has {count} {what}, so pass {name} between 0 and "
            f"{count - 1}"
        )


def check_device(device: str) -> None:
    """Refuse a --device that torch cannot parse or this machine does not have, before the model loads."""
    try:
        parsed = torch.device(device)
    except RuntimeError as error:
        raise Refusal(
            f"--device {device} is not a torch device ({error}); pass cpu, cuda or cuda:N"
        ) from None
    if parsed.type == "cuda" and not torch.cuda.is_available():
        raise Refusal(f"--device {device}: this machine has no CUDA device torch can use; pass --device cpu")
    if parsed.type == "cuda" and parsed.index is not None and parsed.index >= torch.cuda.device_count():
        raise Refusal(
            f"--device {device}: this machine has {torch.cuda.device_count()} CUDA device(s); pass an index below it"
        )


def check_length(analysis: ModelAnalysis, what: str, text: str, text_pair: str | None = None) -> None:
    length = len(analysis.tokenizer(text, text_pair)["input_ids"])
    if length > analysis.max_length:
        raise Refusal(
            f"{what} is {length} tokens long but the model takes at most {analysis.max_length}; pass a "
            "shorter text"
        )


# -------------------------------------------------------------------------------------------- loading


def load_analysis(checkpoint: Path, tokenizer_folder: Path, device: str = "cpu") -> ModelAnalysis:
    """A model folder loaded once for every analysis (eager attention, eval mode, no gradients)."""
    check_device(device)
    where = f"checkpoint {checkpoint}"
    with quiet_libraries():
        with running_no_folder_code(where, f"tokenizer (in {tokenizer_folder})"):
            tokenizer = AutoTokenizer.from_pretrained(tokenizer_folder, trust_remote_code=False)
        with running_no_folder_code(where, MODEL_TYPE):
            model, info = AutoModelForPreTraining.from_pretrained(
                checkpoint, attn_implementation="eager", trust_remote_code=False, **LOAD_CHECKED
            )
    check_weights_loaded(str(checkpoint), info, FINAL_FOLDER_FIX)
    if len(tokenizer) > model.config.vocab_size:  # its last ids would index past the embeddings
        raise Refusal(
            f"{checkpoint}: its tokenizer has {len(tokenizer)} tokens but the model only {model.config.vocab_size} "
            "embeddings; pass --tokenizer_name with the tokenizer the model was trained with, or save that one "
            "into the folder"
        )
    return ModelAnalysis(model, tokenizer, info["missing_keys"], device)


# ---------------------------------------------------------------------------------------- inspect (CLI)


def inspect_checkpoint(
    checkpoint: str | Path,
    *,
    text: str | None = None,
    pair: Sequence[str] | None = None,
    sentences: Sequence[str] | None = None,
    tasks: Sequence[str] | None = None,
    layer: int | None = None,
    head: int = 0,
    top_k: int = 5,
    output_dir: str | Path | None = None,
    tokenizer_name: str | Path | None = None,
    device: str = "cpu",
) -> Inspection:
    """Run the asked analyses on a model folder and write PNGs plus ``inspect.md`` into `output_dir`.

    `tasks` defaults to every task whose input is given: ``attention`` and ``fill-mask`` for `text`, ``nsp``
    for `pair` (A, B), ``similarity`` for `sentences` (two or more). `layer` defaults to the last layer.
    Every check runs before any file is written; a failed one raises `Refusal`.
    """
    folder, tokenizer_folder = check_model_folder(checkpoint, tokenizer_name)
    tasks = choose_tasks(tasks, text, pair, sentences)
    with running_no_folder_code(f"checkpoint {folder}", MODEL_TYPE):
        config = AutoConfig.from_pretrained(folder, trust_remote_code=False)
    layer = config.num_hidden_layers - 1 if layer is None else layer
    if "attention" in tasks:
        check_index("--layer", layer, config.num_hidden_layers, "layers")
        check_index("--head", head, config.num_attention_heads, "attention heads per layer")
    if "fill-mask" in tasks and not 1 <= top_k <= config.vocab_size:
        raise Refusal(f"--top_k {top_k} is out of range; pass a value between 1 and {config.vocab_size}")

    out = folder / "inspect" if output_dir is None else Path(output_dir)
    names = [REPORT_NAME, *([attention_plot_name(layer, head)] if "attention" in tasks else [])]
    written = [*names, *([SIMILARITY_PLOT] if "similarity" in tasks else [])]
    check_reports_replaceable(out, written, "--output_dir", "the inspection")
    analysis = load_analysis(folder, tokenizer_folder, device)
    text = None if text is None else text.replace(MASK, analysis.tokenizer.mask_token)
    check_inputs_fit(analysis, folder, tasks, text, pair, sentences)

    inspection = Inspection(checkpoint=folder, model_summary=analysis.summary())
    if "attention" in tasks:
        inspection.attention = analysis.attention(text, layer, head)
    if "fill-mask" in tasks:
        inspection.fill_mask = analysis.fill_mask(text, top_k)
    if "nsp" in tasks:
        inspection.nsp = [analysis.nsp(pair[0], pair[1])]
    if "similarity" in tasks:
        inspection.similarity = analysis.similarity(sentences)
    # Everything is computed: only now touch the disk.
    write_inspection(inspection, out)
    return inspection


def attention_plot_name(layer: int, head: int) -> str:
    return f"attention_layer{layer}_head{head}.png"


def choose_tasks(
    tasks: Sequence[str] | None, text: str | None, pair: Sequence[str] | None, sentences: Sequence[str] | None
) -> Sequence[str]:
    """The tasks to run (default: every task whose input is given), each checked against its input."""
    needs = {"attention": ("text", text), "fill-mask": ("text", text), "nsp": ("pair", pair)}
    needs["similarity"] = ("sentences", sentences)
    if tasks is None:
        tasks = [task for task, (_, given) in needs.items() if given is not None]
        if not tasks:
            raise Refusal(
                "nothing to inspect: give --text (with [MASK] for fill-mask), --pair A B or --sentences S1 S2 ..."
            )
    for task in tasks:
        if task not in needs:
            raise Refusal(f"unknown task {task!r}; choose from {', '.join(TASKS)}")
        if needs[task][1] is None:
            raise Refusal(f"task {task!r} needs --{needs[task][0]}; pass it or leave {task!r} out of --tasks")
    if "fill-mask" in tasks and MASK not in text:
        raise Refusal(
            f"--text {text!r} has no {MASK}: fill-mask predicts the word at each {MASK}, so write {MASK} in "
            f'place of a word (e.g. "The game was released in {MASK} ."), or pass --tasks attention to '
            "draw the attention map only"
        )
    if "nsp" in tasks and len(pair) != 2:
        raise Refusal(f"--pair needs exactly two sentences, A and B; got {len(pair)}")
    if "similarity" in tasks and len(sentences) < 2:
        raise Refusal(f"--sentences needs at least two sentences to compare; got {len(sentences)}")
    return tasks


def check_inputs_fit(
    analysis: ModelAnalysis,
    folder: Path,
    tasks: Sequence[str],
    text: str | None,
    pair: Sequence[str] | None,
    sentences: Sequence[str] | None,
) -> None:
    """Every input fits the model (length) and the model has the heads its tasks need."""
    if text is not None and {"attention", "fill-mask"} & set(tasks):
        check_length(analysis, "--text", text)
    if "nsp" in tasks:
        check_length(analysis, "--pair", *pair)
        if not analysis.has_nsp_head:
            raise Refusal(
                f"{str(folder)!r} has no next-sentence head (it was saved from a model without one, e.g. "
                "HfBertForMaskedLM); NSP needs a folder saved from HfBertForPreTraining, so leave out --pair"
            )
    if "fill-mask" in tasks and not analysis.has_mlm_head:
        raise Refusal(
            f"{str(folder)!r} has no masked-LM head (it was saved from the bare encoder); fill-mask needs "
            "a folder saved from HfBertForPreTraining or HfBertForMaskedLM, so leave out [MASK] / fill-mask"
        )
    for index, sentence in enumerate(sentences if "similarity" in tasks else []):
        check_length(analysis, f"--sentences item {index + 1}", sentence)


def write_inspection(inspection: Inspection, out: Path) -> None:
    """The plots and ``inspect.md`` of a computed inspection, into `out` (their paths into `inspection.files`)."""
    folder = inspection.checkpoint
    out.mkdir(parents=True, exist_ok=True)
    lines = [f"# Inside {folder}", "", f"Model: {inspection.model_summary}.", ""]
    fill_mask = inspection.fill_mask
    if fill_mask is not None:  # a table per [MASK], numbered where there are several
        lines += ["## Fill-mask", "", f"Text: {code(fill_mask.text)}", ""]
        for index, predictions in enumerate(fill_mask.predictions):
            if len(fill_mask.predictions) > 1:
                lines += [f"[MASK] {index + 1} of {len(fill_mask.predictions)}:", ""]
            lines += ["| rank | token | probability |", "|---|---|---|"]
            lines += [
                f"| {rank} | {code(p['token_str'])} | {p['score']:.3f} |" for rank, p in enumerate(predictions, 1)
            ]
            lines.append("")
    if inspection.attention is not None:
        a = inspection.attention
        name = attention_plot_name(a.layer, a.head)
        inspection.files.append(plot_attention(a, out / name, folder.name))
        lines += [
            f"## Attention, layer {a.layer}, head {a.head}",
            "",
            f"Row i shows where token i attends (each row sums to 1); tokens: {code(' '.join(a.tokens))}",
            "",
            f"![attention, layer {a.layer}, head {a.head}]({name})",
            "",
        ]
    if inspection.nsp:
        lines += ["## Next sentence prediction", "", *nsp_lines(inspection.nsp), ""]
    if inspection.similarity is not None:
        inspection.files.append(plot_similarity(inspection.similarity, out / SIMILARITY_PLOT, folder.name))
        lines += similarity_section(inspection.similarity, SIMILARITY_PLOT)
    inspection.files.append(write_text(out / REPORT_NAME, "\n".join(lines).rstrip() + "\n"))
    record_reports(out, inspection.files)  # what a rerun may replace


def build_parser() -> argparse.ArgumentParser:
    parser = RefusingHfArgumentParser(
        prog="python -m hfbert.inspect",
        description="Look inside a trained model folder: attention heatmap, fill-mask top-k, next-sentence "
        "probability\nand sentence similarity. Writes PNGs and inspect.md, and prints the summary.",
    )
    parser.add_argument("checkpoint", help="model folder (model.safetensors, config.json, tokenizer files)")
    parser.add_argument(
        "--text", help='text for the attention map and fill-mask, e.g. "The game was [MASK] ."'
    )
    parser.add_argument(
        "--pair", nargs=2, metavar=("A", "B"), help="sentence pair for next sentence prediction"
    )
    parser.add_argument("--sentences", nargs="+", metavar="S", help="two or more sentences to compare")
    parser.add_argument(
        "--tasks", nargs="+", choices=TASKS, help="what to run (default: every task whose input is given)"
    )
    parser.add_argument("--layer", type=int, help="attention layer, from 0 (default: the last layer)")
    parser.add_argument("--head", type=int, default=0, help="attention head, from 0 (default: 0)")
    parser.add_argument("--top_k", type=int, default=5, help="fill-mask predictions per [MASK] (default: 5)")
    parser.add_argument("--output_dir", help="where to write (default: CHECKPOINT/inspect)")
    parser.add_argument("--tokenizer_name", help="tokenizer folder, if the checkpoint folder has none")
    parser.add_argument("--device", default="cpu", help="torch device (default: cpu)")
    return parser


def main(argv: list[str] | None = None) -> Inspection:
    args = build_parser().parse_args(argv)  # a refusal is one line through run_cli
    inspection = inspect_checkpoint(**vars(args))  # the flags are inspect_checkpoint's parameters
    report = next(path for path in inspection.files if path.name == REPORT_NAME)
    sys.stdout.write(report.read_text(encoding="utf-8"))
    print(f"\nWrote {', '.join(str(path) for path in inspection.files)}")
    return inspection


if __name__ == "__main__":
    from hfbert.errors import run_cli

    run_cli(main, prog="python -m hfbert.inspect")

