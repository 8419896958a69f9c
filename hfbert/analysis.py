"""Analyses of a pretrained BERT in memory: fill-mask, next-sentence probability, sentence similarity and
attention maps, their plots and their markdown. `hfbert.inspect` runs them on a model folder; the finish stage
of pretraining (`hfbert.pretraining.extras.samples`) on the run's final weights. `quiet_libraries` silences the
libraries' load reports and progress bars, here and in fine-tuning."""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import datasets
import torch
import transformers
from transformers import AutoModelForMaskedLM, AutoModelForPreTraining

import hfbert  # noqa: F401  (registers model_type "hfbert" with the Auto classes)
from hfbert.files import atomic_path
from hfbert.markdown import cell, code
from hfbert.plotting import plt, save_figure  # pyplot, with the headless backend chosen

# How a text given to fill-mask marks a word to predict (replaced by the tokenizer's own mask token).
MASK = "[MASK]"


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


@contextlib.contextmanager
def quiet_libraries() -> Iterator[None]:
    """No warnings and no progress bars from transformers and datasets while the block runs (restored after):
    load reports (the NSP head a masked-LM model leaves unused, each fine-tuning fit's new head) are noise to
    the commands' own lines and bars."""
    logging = transformers.utils.logging
    verbosity = logging.get_verbosity()
    showing_bars = [library for library in (logging, datasets) if library.is_progress_bar_enabled()]
    logging.set_verbosity_error()
    for library in showing_bars:
        library.disable_progress_bar()
    try:
        yield
    finally:
        logging.set_verbosity(verbosity)
        for library in showing_bars:
            library.enable_progress_bar()


# -------------------------------------------------------------------------------------------- computing


class ModelAnalysis:
    """A pretraining model (eager attention) and its tokenizer, for every analysis (eval mode, no gradients).

    `missing_keys`: the weights the model did not receive (from_pretrained's or load_state_dict's report), which
    tell whether it has its MLM and NSP heads. The fill-mask pipeline runs a masked-LM copy of the model's
    encoder and MLM head (built on first use)."""

    def __init__(self, model: torch.nn.Module, tokenizer: Any, missing_keys: Sequence[str], device: str = "cpu"):
        self.device = torch.device(device)
        self.tokenizer = tokenizer
        self.model = model.to(self.device).eval()
        self.config = self.model.config
        self.max_length = int(self.config.max_position_embeddings)
        self.has_nsp_head = not any("seq_relationship" in key for key in missing_keys)
        self.has_mlm_head = not any("predictions" in key for key in missing_keys)

    @classmethod
    def of_weights(cls, config: Any, state_dict: dict[str, torch.Tensor], tokenizer: Any) -> ModelAnalysis:
        """The analysis of weights in memory (e.g. a run's final state dict), on CPU copies of the model."""
        with quiet_libraries():
            model = AutoModelForPreTraining.from_config(config, attn_implementation="eager")
        missing = model.load_state_dict(state_dict, strict=False).missing_keys
        # A state dict read from a folder lacks tied weights (the decoder's); tied, they load anyway.
        return cls(model, tokenizer, [key for key in missing if key not in model.all_tied_weights_keys])

    def summary(self) -> str:
        c = self.config
        parameters = sum(p.numel() for p in self.model.parameters())
        return (
            f"{c.model_type}, {c.num_hidden_layers} layers, {c.num_attention_heads} heads, hidden size "
            f"{c.hidden_size}, vocabulary {c.vocab_size}, {parameters / 1e6:.2f}M parameters"
        )

    def _encode(self, *args: Any, **kwargs: Any) -> transformers.BatchEncoding:
        encoded = self.tokenizer(*args, return_tensors="pt", return_token_type_ids=True, **kwargs)
        return encoded.to(self.device)

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

    @functools.cached_property
    def fill_mask_pipeline(self) -> Any:
        with quiet_libraries():
            masked_lm = AutoModelForMaskedLM.from_config(self.config, dtype=self.model.dtype)
            # The same names as the pretraining model's: its NSP head is the one key left over.
            masked_lm.load_state_dict(self.model.state_dict(), strict=False)
            return transformers.pipeline(
                "fill-mask", model=masked_lm.eval(), tokenizer=self.tokenizer, device=self.device
            )

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


SAVEFIG = {"dpi": 110, "bbox_inches": "tight", "pad_inches": 0.15}  # the labels in full, a little margin


def plot_attention(result: AttentionResult, path: Path, model_name: str) -> Path:
    """Heatmap of one head's attention: queries down, keys across, every token labelled on both axes; titled
    with `model_name`, the layer and the head."""
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
    axis.set_title(f"{model_name}: attention, layer {result.layer}, head {result.head}", fontsize=10)
    return save_figure(figure, path, **SAVEFIG)


def plot_similarity(result: SimilarityResult, path: Path, title: str) -> Path:
    """Two cosine-similarity heatmaps ([CLS], mean-pooled), each cell annotated, sentences numbered."""
    n = len(result.sentences)
    side = max(3.2, 0.55 * n + 1.6)
    figure, axes = plt.subplots(1, 2, figsize=(2 * side + 3.2, side + 0.6), constrained_layout=True)
    labels = [f"s{i + 1}" for i in range(n)]
    ylabels = [f"s{i + 1}: {s if len(s) <= 32 else s[:31] + '…'}" for i, s in enumerate(result.sentences)]
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
    return save_figure(figure, path, **SAVEFIG)


def similarity_section(result: SimilarityResult, image: str) -> list[str]:
    """The markdown section of a similarity result: the sentences, both tables and the plot saved as `image`."""
    n = len(result.sentences)
    lines = ["## Sentence similarity", "", *(f"- s{i + 1}: {code(s)}" for i, s in enumerate(result.sentences))]
    for name, matrix in (("[CLS] vector", result.cls), ("mean-pooled (non-padding tokens)", result.mean)):
        lines += ["", f"Cosine similarity, {name}:", ""]
        lines.append("| | " + " | ".join(f"s{j + 1}" for j in range(n)) + " |")
        lines.append("|---" * (n + 1) + "|")
        lines += [
            f"| s{i + 1} | " + " | ".join(f"{v:.3f}" for v in row) + " |" for i, row in enumerate(matrix)
        ]
    return [*lines, "", f"![cosine similarity]({image})", ""]


def nsp_lines(results: Sequence[NspResult], names: Sequence[str] | None = None) -> list[str]:
    header = "| pair | A | B | P(B follows A) |" if names else "| A | B | P(B follows A) |"
    lines = [header, "|---" * header.count(" | ") + "|---|"]
    for index, result in enumerate(results):
        row = f"| {cell(result.sentence_a)} | {cell(result.sentence_b)} | {result.probability_follows:.3f} |"
        lines.append(f"| {names[index]} " + row if names else row)
    return lines


def write_text(path: Path, text: str) -> Path:
    with atomic_path(path) as temp_path:
        temp_path.write_text(text, encoding="utf-8")
    return path
