"""Look inside a trained model folder: attention heatmaps, fill-mask, next-sentence probability, similarity.

Command line (writes PNGs and ``inspect.md`` into ``--output_dir``, default ``CHECKPOINT/inspect``)::

    python -m hfbert.inspect runs/hfbert-tiny-wikitext --text "The game was released in [MASK] ." \\
        --layer 1 --head 0 --pair "He sat down." "Then he ate." \\
        --sentences "The cat sat." "A dog ran." "Stocks fell today."

Library: `inspect_checkpoint` does the same from Python; `write_samples` writes ``samples.md`` (and its PNGs)
into a model folder at the end of a training run, from validation sentences that
`hfbert.pretraining.data.sample_sentences` picks. Every input is checked before any file is written; a bad one raises `InspectError` (a
`ValueError`) that names the value and the fix.
"""

from __future__ import annotations

import argparse
import contextlib
import string
import sys
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")  # headless: runs on servers without a display

import matplotlib.pyplot as plt  # after matplotlib.use: the backend is chosen before pyplot loads
import torch
import transformers
from transformers import AutoConfig, AutoModelForMaskedLM, AutoModelForPreTraining, AutoTokenizer

import hfbert  # noqa: F401  (registers model_type "hfbert" with the Auto classes)
from hfbert.files import FINAL_FOLDER_FIX, atomic_path, check_folder_readable

MASK = "[MASK]"
TASKS = ("attention", "fill-mask", "nsp", "similarity")
WEIGHT_FILES = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin")
TOKENIZER_FILES = ("tokenizer.json", "vocab.txt")
REPORT_NAME = "inspect.md"
SAMPLES_NAME = "samples.md"

# write_samples masks the first occurrence of the most frequent of these words that the sentence contains as a
# single token, preferring one not yet masked in an earlier sample: the 30 most frequent words of the shipped
# WikiText sample, most frequent first. A small model learns these first, so its top-5 is worth reading.
FREQUENT_WORDS = (
    "the", "of", "and", "in", "to", "a", "was", "on", "as", "that", "with", "by", "for", "at", "he", "his",
    "were", "from", "it", "had", "is", "an", "which", "be", "first", "this", "two", "their", "its", "but",
)  # fmt: skip


class InspectError(ValueError):
    """A bad checkpoint or input for `inspect_checkpoint` / `write_samples`; the message names the fix."""


@dataclass
class FillMaskResult:
    text: str
    predictions: list[list[dict[str, Any]]]  # one top-k list per [MASK], each {"token_str", "score", ...}


@dataclass
class NspResult:
    sentence_a: str
    sentence_b: str
    probability_follows: float  # softmax of seq_relationship_logits, index 0 (= B follows A)


@dataclass
class SimilarityResult:
    sentences: list[str]
    cls: list[list[float]]  # cosine similarity of the final [CLS] vectors
    mean: list[list[float]]  # cosine similarity of the final vectors averaged over non-padding tokens


@dataclass
class AttentionResult:
    tokens: list[str]
    layer: int
    head: int
    weights: list[list[float]]  # (query, key): row i is where token i attends


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
    """The model folder and the tokenizer folder, or `InspectError` saying what is missing."""
    folder = Path(checkpoint)
    if not folder.exists():
        raise InspectError(
            f"checkpoint folder {str(folder)!r} does not exist; pass the output folder of a training run "
            "(the one holding model.safetensors and config.json)"
        )
    if not folder.is_dir():
        raise InspectError(f"checkpoint {str(folder)!r} is a file; pass the folder that holds it instead")
    if not (folder / "config.json").is_file() or not any((folder / name).is_file() for name in WEIGHT_FILES):
        raise InspectError(
            f"{str(folder)!r} is not a saved model folder: it needs config.json and model.safetensors. A "
            "checkpoint-<step> folder holds resumable training state; inspect the run's output folder instead"
        )
    tokenizer_folder = folder if tokenizer_name is None else Path(tokenizer_name)
    if not any((tokenizer_folder / name).is_file() for name in TOKENIZER_FILES):
        where = "--tokenizer_name" if tokenizer_name is not None else "checkpoint folder"
        raise InspectError(
            f"the {where} {str(tokenizer_folder)!r} has no tokenizer (no tokenizer.json or vocab.txt); pass "
            "--tokenizer_name DIR with the tokenizer the model was trained with, or save it into the folder "
            "with tokenizer.save_pretrained(...)"
        )
    try:
        check_folder_readable(folder, FINAL_FOLDER_FIX)
        if tokenizer_folder != folder:
            check_folder_readable(
                tokenizer_folder, "pass another --tokenizer_name, or save the tokenizer there again"
            )
    except ValueError as error:
        raise InspectError(str(error)) from None
    return folder, tokenizer_folder


def check_index(name: str, value: int, count: int, what: str) -> None:
    if not 0 <= value < count:
        raise InspectError(
            f"{name} {value} is out of range: this model has {count} {what}, so pass {name} between 0 and "
            f"{count - 1}"
        )


def check_length(tokenizer: Any, what: str, text: str, text_pair: str | None, limit: int) -> None:
    length = len(tokenizer(text, text_pair)["input_ids"])
    if length > limit:
        raise InspectError(
            f"{what} is {length} tokens long but the model takes at most {limit}; pass a shorter text"
        )


@contextlib.contextmanager
def quiet_transformers() -> Iterator[None]:
    """Silence load reports (e.g. the NSP head a masked-LM model leaves unused): they are noise here."""
    logging = transformers.utils.logging
    verbosity, bars = logging.get_verbosity(), logging.is_progress_bar_enabled()
    logging.set_verbosity_error()
    logging.disable_progress_bar()
    try:
        yield
    finally:
        logging.set_verbosity(verbosity)
        if bars:
            logging.enable_progress_bar()


# -------------------------------------------------------------------------------------------- computing


class Inspector:
    """A model folder loaded once for every analysis (eager attention, eval mode, no gradients)."""

    def __init__(self, checkpoint: Path, tokenizer_folder: Path, device: str = "cpu"):
        self.checkpoint = checkpoint
        self.device = torch.device(device)
        with quiet_transformers():
            self.tokenizer = AutoTokenizer.from_pretrained(tokenizer_folder)
            self.model, info = AutoModelForPreTraining.from_pretrained(
                checkpoint, attn_implementation="eager", output_loading_info=True
            )
        self.model.to(self.device).eval()
        self.config = self.model.config
        missing = info["missing_keys"]
        self.has_nsp_head = not any("seq_relationship" in key for key in missing)
        self.has_mlm_head = not any("predictions" in key for key in missing)
        self._fill_mask = None

    @property
    def max_length(self) -> int:
        return int(self.config.max_position_embeddings)

    def summary(self) -> str:
        c = self.config
        parameters = sum(p.numel() for p in self.model.parameters())
        return (
            f"{c.model_type}, {c.num_hidden_layers} layers, {c.num_attention_heads} heads, hidden size "
            f"{c.hidden_size}, vocabulary {c.vocab_size}, {parameters / 1e6:.2f}M parameters"
        )

    def _encode(self, *args: Any, **kwargs: Any) -> dict[str, torch.Tensor]:
        encoded = self.tokenizer(*args, return_tensors="pt", return_token_type_ids=True, **kwargs)
        return {key: value.to(self.device) for key, value in encoded.items()}

    @torch.no_grad()
    def attention(self, text: str, layer: int, head: int) -> AttentionResult:
        encoded = self._encode(text)
        output = self.model.base_model(**encoded, output_attentions=True)
        weights = output.attentions[layer][0, head].float().cpu()
        tokens = self.tokenizer.convert_ids_to_tokens(encoded["input_ids"][0].tolist())
        return AttentionResult(tokens=tokens, layer=layer, head=head, weights=weights.tolist())

    def fill_mask(self, text: str, top_k: int) -> FillMaskResult:
        predictions = self.fill_mask_pipeline(text, top_k=top_k)
        if predictions and isinstance(predictions[0], dict):  # one [MASK]: the pipeline drops a list level
            predictions = [predictions]
        return FillMaskResult(text=text, predictions=predictions)

    @property
    def fill_mask_pipeline(self) -> Any:
        if self._fill_mask is None:
            with quiet_transformers():
                model = AutoModelForMaskedLM.from_pretrained(self.checkpoint)
                self._fill_mask = transformers.pipeline(
                    "fill-mask", model=model, tokenizer=self.tokenizer, device=self.device
                )
        return self._fill_mask

    @torch.no_grad()
    def nsp(self, sentence_a: str, sentence_b: str) -> NspResult:
        encoded = self._encode(sentence_a, sentence_b, truncation="longest_first", max_length=self.max_length)
        logits = self.model(**encoded).seq_relationship_logits[0].float()
        probability = torch.softmax(logits, dim=-1)[0].item()
        return NspResult(sentence_a=sentence_a, sentence_b=sentence_b, probability_follows=probability)

    @torch.no_grad()
    def similarity(self, sentences: Sequence[str]) -> SimilarityResult:
        encoded = self._encode(list(sentences), padding=True, truncation=True, max_length=self.max_length)
        hidden = self.model.base_model(**encoded).last_hidden_state.float()
        mask = encoded["attention_mask"].unsqueeze(-1).to(hidden.dtype)
        mean = (hidden * mask).sum(dim=1) / mask.sum(dim=1)

        def cosine(vectors: torch.Tensor) -> list[list[float]]:
            unit = torch.nn.functional.normalize(vectors, dim=-1)
            return (unit @ unit.T).clamp(-1.0, 1.0).cpu().tolist()

        return SimilarityResult(sentences=list(sentences), cls=cosine(hidden[:, 0]), mean=cosine(mean))


# -------------------------------------------------------------------------------------------- plotting


def _short(text: str, limit: int = 48) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


def plot_attention(result: AttentionResult, path: Path, title: str) -> Path:
    """Heatmap of one head's attention: queries down, keys across, every token labelled on both axes."""
    n = len(result.tokens)
    side = min(max(4.0, 0.32 * n + 2.0), 40.0)
    font = min(9.0, 0.6 * 72 * (side - 2.0) / n)  # 60% of a cell's height, in points
    figure, axis = plt.subplots(figsize=(side + 1.2, side), constrained_layout=True)
    # Scaled to the largest weight, so a diffuse head (an untrained model) still shows its pattern.
    top = max(max(row) for row in result.weights)
    image = axis.imshow(result.weights, cmap="viridis", vmin=0.0, vmax=top, interpolation="nearest")
    axis.set_xticks(range(n), result.tokens, rotation=90, fontsize=font)
    axis.set_yticks(range(n), result.tokens, fontsize=font)
    axis.xaxis.tick_top()
    axis.xaxis.set_label_position("top")
    axis.set_xlabel("attended to (key)")
    axis.set_ylabel("attending token (query)")
    figure.colorbar(image, ax=axis, fraction=0.046, pad=0.02, label="attention weight")
    axis.set_title(title, fontsize=10)
    return _save(figure, path)


def plot_similarity(result: SimilarityResult, path: Path, title: str) -> Path:
    """Two cosine-similarity heatmaps ([CLS], mean-pooled), each cell annotated, sentences numbered."""
    n = len(result.sentences)
    side = max(3.2, 0.55 * n + 1.6)
    figure, axes = plt.subplots(1, 2, figsize=(2 * side + 3.2, side + 0.6), constrained_layout=True)
    labels = [f"s{i + 1}" for i in range(n)]
    ylabels = [f"s{i + 1}: {_short(s, 32)}" for i, s in enumerate(result.sentences)]
    # One colour scale for both panels, at least 0.05 wide: an untrained model gives every pair ~1.
    low = min(m[i][j] for m in (result.cls, result.mean) for i in range(n) for j in range(n) if i != j)
    low = min(low, 0.95)
    for index, (axis, name, matrix) in enumerate(
        zip(axes, ("[CLS] vector", "mean-pooled vectors"), (result.cls, result.mean), strict=True)
    ):
        image = axis.imshow(matrix, cmap="magma", vmin=low, vmax=1.0, interpolation="nearest")
        for i in range(n):
            for j in range(n):
                shade = (matrix[i][j] - low) / (1.0 - low)
                axis.text(
                    j, i, f"{matrix[i][j]:.2f}", ha="center", va="center", fontsize=8,
                    color="black" if shade > 0.6 else "white",
                )  # fmt: skip
        axis.set_xticks(range(n), labels, fontsize=8)
        axis.set_yticks(range(n), ylabels if index == 0 else labels, fontsize=8)
        axis.set_title(f"cosine similarity, {name}", fontsize=10)
    figure.colorbar(image, ax=axes, fraction=0.03, pad=0.02, label="cosine similarity")
    figure.suptitle(title, fontsize=10)
    return _save(figure, path)


def _save(figure: Any, path: Path) -> Path:
    try:
        with atomic_path(path) as temp_path:
            figure.savefig(temp_path, format="png", dpi=110, bbox_inches="tight", pad_inches=0.15)
    finally:
        plt.close(figure)
    return path


# ------------------------------------------------------------------------------------------- markdown


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _code(text: str) -> str:
    return f"`{text}`" if "`" not in text else f"`` {text} ``"


def similarity_tables(result: SimilarityResult) -> list[str]:
    n = len(result.sentences)
    lines = [f"- s{i + 1}: {_cell(s)}" for i, s in enumerate(result.sentences)]
    for name, matrix in (("[CLS] vector", result.cls), ("mean-pooled (non-padding tokens)", result.mean)):
        lines += ["", f"Cosine similarity, {name}:", ""]
        lines.append("| | " + " | ".join(f"s{j + 1}" for j in range(n)) + " |")
        lines.append("|---" * (n + 1) + "|")
        lines += [
            f"| s{i + 1} | " + " | ".join(f"{v:.3f}" for v in row) + " |" for i, row in enumerate(matrix)
        ]
    return lines


def fill_mask_lines(result: FillMaskResult) -> list[str]:
    lines = [f"Text: {_code(result.text)}", ""]
    many = len(result.predictions) > 1
    for index, predictions in enumerate(result.predictions):
        if many:
            lines += [f"[MASK] {index + 1} of {len(result.predictions)}:", ""]
        lines += ["| rank | token | probability |", "|---|---|---|"]
        lines += [
            f"| {rank} | {_code(p['token_str'])} | {p['score']:.3f} |"
            for rank, p in enumerate(predictions, 1)
        ]
        lines.append("")
    return lines


def nsp_lines(results: Sequence[NspResult], names: Sequence[str] | None = None) -> list[str]:
    header = "| pair | A | B | P(B follows A) |" if names else "| A | B | P(B follows A) |"
    lines = [header, "|---" * header.count(" | ") + "|---|"]
    for index, result in enumerate(results):
        row = (
            f"| {_cell(result.sentence_a)} | {_cell(result.sentence_b)} | {result.probability_follows:.3f} |"
        )
        lines.append(f"| {names[index]} " + row if names else row)
    return lines


def render_report(inspection: Inspection, images: Mapping[str, str]) -> str:
    lines = [f"# Inside {inspection.checkpoint}", "", f"Model: {inspection.model_summary}.", ""]
    if inspection.fill_mask is not None:
        lines += ["## Fill-mask", "", *fill_mask_lines(inspection.fill_mask)]
    if inspection.attention is not None:
        a = inspection.attention
        lines += [
            f"## Attention, layer {a.layer}, head {a.head}",
            "",
            f"Row i shows where token i attends (each row sums to 1); tokens: {_code(' '.join(a.tokens))}",
            "",
            f"![attention, layer {a.layer}, head {a.head}]({images['attention']})",
            "",
        ]
    if inspection.nsp:
        lines += ["## Next sentence prediction", "", *nsp_lines(inspection.nsp), ""]
    if inspection.similarity is not None:
        lines += ["## Sentence similarity", "", *similarity_tables(inspection.similarity), ""]
        lines += [f"![cosine similarity]({images['similarity']})", ""]
    return "\n".join(lines).rstrip() + "\n"


def _write_text(path: Path, text: str) -> Path:
    with atomic_path(path) as temp_path:
        temp_path.write_text(text, encoding="utf-8")
    return path


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
    Every check runs before any file is written; a failed one raises `InspectError`.
    """
    folder, tokenizer_folder = check_model_folder(checkpoint, tokenizer_name)
    if tasks is None:
        tasks = [
            task
            for task, given in zip(TASKS, (text, text, pair, sentences), strict=True)
            if given is not None
        ]
        if not tasks:
            raise InspectError(
                "nothing to inspect: give --text (with [MASK] for fill-mask), --pair A B or --sentences S1 S2 ..."
            )
    for task in tasks:
        if task not in TASKS:
            raise InspectError(f"unknown task {task!r}; choose from {', '.join(TASKS)}")
    needs = {"attention": ("text", text), "fill-mask": ("text", text), "nsp": ("pair", pair)}
    needs["similarity"] = ("sentences", sentences)
    for task in tasks:
        name, value = needs[task]
        if value is None:
            raise InspectError(f"task {task!r} needs --{name}; pass it or leave {task!r} out of --tasks")
    if "fill-mask" in tasks and MASK not in text:
        raise InspectError(
            f"--text {text!r} has no {MASK}: fill-mask predicts the word at each {MASK}, so write {MASK} in "
            f'place of a word (e.g. "The game was released in {MASK} ."), or pass --tasks attention to '
            "draw the attention map only"
        )
    if "nsp" in tasks and len(pair) != 2:
        raise InspectError(f"--pair needs exactly two sentences, A and B; got {len(pair)}")
    if "similarity" in tasks and len(sentences) < 2:
        raise InspectError(f"--sentences needs at least two sentences to compare; got {len(sentences)}")

    config = AutoConfig.from_pretrained(folder)
    layer = config.num_hidden_layers - 1 if layer is None else layer
    if "attention" in tasks:
        check_index("--layer", layer, config.num_hidden_layers, "layers")
        check_index("--head", head, config.num_attention_heads, "attention heads per layer")
    if "fill-mask" in tasks and not 1 <= top_k <= config.vocab_size:
        raise InspectError(f"--top_k {top_k} is out of range; pass a value between 1 and {config.vocab_size}")

    inspector = Inspector(folder, tokenizer_folder, device)
    text = None if text is None else text.replace(MASK, inspector.tokenizer.mask_token)
    limit = inspector.max_length
    if text is not None and {"attention", "fill-mask"} & set(tasks):
        check_length(inspector.tokenizer, "--text", text, None, limit)
    if "nsp" in tasks:
        check_length(inspector.tokenizer, "--pair", pair[0], pair[1], limit)
        if not inspector.has_nsp_head:
            raise InspectError(
                f"{str(folder)!r} has no next-sentence head (it was saved from a model without one, e.g. "
                "HfBertForMaskedLM); NSP needs a folder saved from HfBertForPreTraining, so leave out --pair"
            )
    if "fill-mask" in tasks and not inspector.has_mlm_head:
        raise InspectError(
            f"{str(folder)!r} has no masked-LM head (it was saved from the bare encoder); fill-mask needs "
            "a folder saved from HfBertForPreTraining or HfBertForMaskedLM, so leave out [MASK] / fill-mask"
        )
    for index, sentence in enumerate(sentences if "similarity" in tasks else []):
        check_length(inspector.tokenizer, f"--sentences item {index + 1}", sentence, None, limit)

    inspection = Inspection(checkpoint=folder, model_summary=inspector.summary())
    if "attention" in tasks:
        inspection.attention = inspector.attention(text, layer, head)
    if "fill-mask" in tasks:
        inspection.fill_mask = inspector.fill_mask(text, top_k)
    if "nsp" in tasks:
        inspection.nsp = [inspector.nsp(pair[0], pair[1])]
    if "similarity" in tasks:
        inspection.similarity = inspector.similarity(sentences)

    # Everything is computed: only now touch the disk.
    out = folder / "inspect" if output_dir is None else Path(output_dir)
    out.mkdir(parents=True, exist_ok=True)
    images: dict[str, str] = {}
    if inspection.attention is not None:
        name = f"attention_layer{layer}_head{head}.png"
        title = f"{folder.name}: attention, layer {layer}, head {head}"
        inspection.files.append(plot_attention(inspection.attention, out / name, title))
        images["attention"] = name
    if inspection.similarity is not None:
        inspection.files.append(plot_similarity(inspection.similarity, out / "similarity.png", folder.name))
        images["similarity"] = "similarity.png"
    report = render_report(inspection, images)
    inspection.files.append(_write_text(out / REPORT_NAME, report))
    return inspection


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m hfbert.inspect",
        description="Look inside a trained model folder: attention heatmap, fill-mask top-k, next-sentence "
        "probability and sentence similarity. Writes PNGs and inspect.md, and prints the summary.",
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
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        inspection = inspect_checkpoint(
            args.checkpoint,
            text=args.text,
            pair=args.pair,
            sentences=args.sentences,
            tasks=args.tasks,
            layer=args.layer,
            head=args.head,
            top_k=args.top_k,
            output_dir=args.output_dir,
            tokenizer_name=args.tokenizer_name,
            device=args.device,
        )
    except InspectError as error:
        parser.error(str(error))
    report = next(path for path in inspection.files if path.name == REPORT_NAME)
    sys.stdout.write(report.read_text(encoding="utf-8"))
    print(f"\nWrote {', '.join(str(path) for path in inspection.files)}")
    return inspection


# ------------------------------------------------------------------------------- samples (training run)


def choose_masked_word(tokenizer: Any, sentence: str, used: set[str]) -> tuple[str, str] | None:
    """(masked sentence, true token): the first occurrence of the most frequent `FREQUENT_WORDS` entry in the
    sentence that the tokenizer keeps as one token, preferring one not in `used`; None if there is none.
    Words are the sentence's space-separated pieces without surrounding punctuation ("in," is "in")."""
    words = sentence.split(" ")
    cores = [word.strip(string.punctuation) for word in words]
    candidates = []
    for rank, frequent in enumerate(FREQUENT_WORDS):
        position = next((i for i, core in enumerate(cores) if core.lower() == frequent), None)
        if position is None:
            continue
        pieces = tokenizer.tokenize(cores[position])
        if len(pieces) == 1 and pieces[0] != tokenizer.unk_token:
            candidates.append((pieces[0] in used, rank, position, pieces[0]))
    if not candidates:
        return None
    _, _, position, token = min(candidates)
    words[position] = words[position].replace(cores[position], MASK, 1)
    return " ".join(words), token


def write_samples(
    model_dir: str | Path,
    sentences: Sequence[str],
    *,
    other_sentence: str | None = None,
    model_name: str | None = None,
    top_k: int = 5,
    max_fill_mask: int = 4,
    device: str = "cpu",
) -> Path:
    """Write ``samples.md`` (with ``samples_similarity.png`` and ``samples_attention.png``) into `model_dir`.

    `sentences`: three or more consecutive validation sentences (see `hfbert.pretraining.data.sample_sentences`). ``samples.md``
    holds fill-mask top-`top_k` for up to `max_fill_mask` of them, each with one frequent word masked (the
    rule is `choose_masked_word`) and the true word marked; the NSP probability for a real pair (sentences 1
    and 2) and a random one (sentence 1 and `other_sentence`, or else the last, non-adjacent, sentence); the
    cosine similarity of all of them ([CLS] and mean-pooled); the attention map of the shortest one (last
    layer, head 0). `model_name` titles the page (default: the folder's name). Deterministic (eval mode, no
    sampling). Returns the path of ``samples.md``, written last.
    """
    folder, tokenizer_folder = check_model_folder(model_dir)
    name = model_name or folder.name
    inspector = Inspector(folder, tokenizer_folder, device)
    tokenizer = inspector.tokenizer
    # Only sentences the model takes whole (sample_sentences never picks longer ones).
    sentences = [s for s in sentences if s.strip() and len(tokenizer(s)["input_ids"]) <= inspector.max_length]
    if len(sentences) < 2 or (other_sentence is None and len(sentences) < 3):
        raise InspectError(
            f"write_samples needs three or more sentences (two with other_sentence) of at most "
            f"{inspector.max_length} tokens; got {len(sentences)} usable ones"
        )

    lines = [
        f"# Samples from {name}",
        "",
        f"Model: {inspector.summary()}. Written by `hfbert.inspect.write_samples` from validation sentences; "
        "`python -m hfbert.inspect` runs the same analyses on any text.",
        "",
        "## Fill-mask",
        "",
        "Each sentence has one frequent word masked: the first occurrence of the most frequent word of a fixed "
        "list (" + ", ".join(FREQUENT_WORDS[:8]) + ", ...) that it contains, preferring one not masked in an "
        "earlier sentence. **Bold** marks the true word.",
        "",
    ]
    lines += fill_mask_samples(inspector, sentences, top_k, max_fill_mask) if inspector.has_mlm_head else []
    if not inspector.has_mlm_head:
        lines += ["This folder has no masked-LM head.", ""]

    lines += ["## Next sentence prediction", ""]
    if inspector.has_nsp_head:
        random_b, where = (other_sentence, "another document")
        if other_sentence is None:
            random_b, where = sentences[-1], f"sentence {len(sentences)} of the same text, not adjacent"
        results = [inspector.nsp(sentences[0], sentences[1]), inspector.nsp(sentences[0], random_b)]
        lines += nsp_lines(results, names=["real (B is the next sentence)", f"random (B is {where})"])
        lines += ["", "A model that learned NSP gives the real pair the higher probability.", ""]
    else:
        lines += ["This folder has no next-sentence head.", ""]

    similarity = inspector.similarity(sentences)
    last_layer = inspector.config.num_hidden_layers - 1
    shortest = min(range(len(sentences)), key=lambda i: (len(tokenizer(sentences[i])["input_ids"]), i))
    attention = inspector.attention(sentences[shortest], last_layer, 0)
    lines += ["## Sentence similarity", "", *similarity_tables(similarity), ""]
    lines += ["![cosine similarity](samples_similarity.png)", ""]
    lines += [f"## Attention, layer {last_layer}, head 0, on s{shortest + 1} (the shortest sentence)", ""]
    lines += ["![attention](samples_attention.png)"]

    plot_similarity(similarity, folder / "samples_similarity.png", f"{name}: validation sentences")
    plot_attention(
        attention, folder / "samples_attention.png", f"{name}: attention, layer {last_layer}, head 0"
    )
    return _write_text(folder / SAMPLES_NAME, "\n".join(lines) + "\n")


def fill_mask_samples(inspector: Inspector, sentences: Sequence[str], top_k: int, limit: int) -> list[str]:
    """Markdown for `write_samples`: each sentence with its word masked, the top-k, the true word marked."""
    tokenizer = inspector.tokenizer
    lines: list[str] = []
    used: list[str] = []
    for sentence in sentences:
        choice = choose_masked_word(tokenizer, sentence, set(used))
        if choice is None:
            continue
        masked, true_token = choice
        used.append(true_token)
        text = masked.replace(MASK, tokenizer.mask_token)
        predictions = inspector.fill_mask(text, top_k).predictions[0]
        hits = [tokenizer.convert_ids_to_tokens(p["token"]) == true_token for p in predictions]
        cells = [
            f"**{p['token_str'].strip()}** {p['score']:.3f}"
            if hit
            else f"{p['token_str'].strip()} {p['score']:.3f}"
            for p, hit in zip(predictions, hits, strict=True)
        ]
        if any(hits):
            verdict = f"true word **{true_token}** is number {hits.index(True) + 1} of the top {top_k}"
        else:
            score = inspector.fill_mask_pipeline(text, targets=[true_token], top_k=1)[0]["score"]
            verdict = f"true word **{true_token}** is not in the top {top_k} (probability {score:.3f})"
        lines += [f"{len(used)}. {_code(masked)}: {verdict}", "", f"   top {top_k}: " + " · ".join(cells), ""]
        if len(used) == limit:
            break
    return lines or ["No sentence contains one of the frequent words.", ""]


if __name__ == "__main__":
    main()


__all__ = [
    "InspectError",
    "Inspection",
    "choose_masked_word",
    "inspect_checkpoint",
    "main",
    "write_samples",
]
