"""The final folder's samples.md: what the trained model makes of a few validation sentences (fill-mask,
next-sentence prediction, similarity, attention), computed on the run's weights in memory (the callback
`Samples`)."""

from __future__ import annotations

import logging
import string
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from hfbert.analysis import (
    MASK,
    ModelAnalysis,
    nsp_lines,
    plot_attention,
    plot_similarity,
    similarity_section,
    write_text,
)
from hfbert.errors import Refusal
from hfbert.markdown import code
from hfbert.pretraining.callbacks import Callback, StagedFinalFolder
from hfbert.pretraining.data import SAMPLE_COUNT, SAMPLE_WORDS

logger = logging.getLogger(__name__)

SAMPLES_NAME = "samples.md"

# write_samples masks the first occurrence of the most frequent of these words that the sentence contains as a
# single token, preferring one not yet masked in an earlier sample: the 30 most frequent words of the shipped
# WikiText sample, most frequent first. A small model learns these first, so its top-5 is worth reading.
FREQUENT_WORDS = (
    "the", "of", "and", "in", "to", "a", "was", "on", "as", "that", "with", "by", "for", "at", "he", "his",
    "were", "from", "it", "had", "is", "an", "which", "be", "first", "this", "two", "their", "its", "but",
)  # fmt: skip


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
    folder: Path,
    analysis: ModelAnalysis,
    sentences: Sequence[str],
    *,
    other_sentence: str | None = None,
    model_name: str | None = None,
    top_k: int = 5,
    max_fill_mask: int = 4,
) -> str:
    """Write ``samples.md`` (with ``samples_similarity.png`` and ``samples_attention.png``) into `folder`; returns
    its fill-mask section (for the end-of-run summary).

    `sentences`: three or more consecutive validation sentences (see `hfbert.pretraining.data.sample_sentences`).
    ``samples.md`` holds fill-mask top-`top_k` for up to `max_fill_mask` of them, each with one frequent word
    masked (the rule is `choose_masked_word`) and the true word marked; the NSP probability for a real pair
    (sentences 1 and 2) and a random one (sentence 1 and `other_sentence`, or else the last, non-adjacent,
    sentence); the cosine similarity of all of them ([CLS] and mean-pooled); the attention map of the shortest
    one (last layer, head 0). `model_name` titles the page (default: the folder's name). Deterministic (eval
    mode, no sampling). ``samples.md`` is written last.
    """
    name = model_name or folder.name
    tokenizer = analysis.tokenizer
    limit = analysis.max_length
    # Only sentences the model takes whole (sample_sentences never picks longer ones).
    sentences = [s for s in sentences if s.strip() and len(tokenizer(s)["input_ids"]) <= limit]
    if len(sentences) < 2 or (other_sentence is None and len(sentences) < 3):
        raise Refusal(
            f"write_samples needs three or more sentences (two with other_sentence) of at most "
            f"{limit} tokens; got {len(sentences)} usable ones"
        )
    fill_mask = fill_mask_section(analysis, sentences, top_k, max_fill_mask)
    lines = [
        f"# Samples from {name}",
        "",
        f"Model: {analysis.summary()}. Written at the end of training from "
        "validation sentences; `python -m hfbert.inspect` runs the same analyses on any text.",
        "",
        fill_mask,
        "",
    ]
    lines += nsp_section(analysis, sentences, other_sentence)
    similarity = analysis.similarity(sentences)
    last_layer = analysis.config.num_hidden_layers - 1
    shortest = min(range(len(sentences)), key=lambda i: (len(tokenizer(sentences[i])["input_ids"]), i))
    attention = analysis.attention(sentences[shortest], last_layer, 0)
    lines += similarity_section(similarity, "samples_similarity.png")
    title = f"## Attention, layer {last_layer}, head 0, on s{shortest + 1} (the shortest sentence)"
    lines += [title, "", "![attention](samples_attention.png)"]

    plot_similarity(similarity, folder / "samples_similarity.png", f"{name}: validation sentences")
    plot_attention(attention, folder / "samples_attention.png", name)
    write_text(folder / SAMPLES_NAME, "\n".join(lines) + "\n")
    return fill_mask


class Samples(Callback):
    """Writes samples.md into the final folder from the run's sample sentences and `other_sentence` (the data
    stage's `PreparedData.sample_sentences`; none from fewer than two), on CPU copies of the final weights."""

    def __init__(self, tokenizer: Any, sentences: Sequence[str], other_sentence: str | None):
        self.tokenizer, self.sentences, self.other_sentence = tokenizer, sentences, other_sentence

    def on_final_folder(self, folder: StagedFinalFolder) -> None:
        if len(self.sentences) < 2:
            logger.info(
                f"No {SAMPLES_NAME} in the final folder: no validation document holds {SAMPLE_COUNT} consecutive "
                f"sentences of {SAMPLE_WORDS[0]}-{SAMPLE_WORDS[1]} words ({SAMPLES_NAME} shows what the model "
                "makes of them)"
            )
            return
        analysis = ModelAnalysis.of_weights(folder.config, folder.weights, self.tokenizer)
        folder.fill_mask = write_samples(
            folder.path, analysis, self.sentences, other_sentence=self.other_sentence, model_name=folder.model_name
        )
        folder.samples_name = SAMPLES_NAME


def fill_mask_section(analysis: ModelAnalysis, sentences: Sequence[str], top_k: int, limit: int) -> str:
    """samples.md's fill-mask section: each sentence with a frequent word masked, the top-k, the true word marked."""
    lines = [
        "## Fill-mask",
        "",
        "Each sentence has one frequent word masked: the first occurrence of the most frequent word of a fixed "
        "list (" + ", ".join(FREQUENT_WORDS[:8]) + ", ...) that it contains, preferring one not masked in an "
        "earlier sentence. **Bold** marks the true word.",
        "",
    ]
    if not analysis.has_mlm_head:
        return "\n".join([*lines, "This folder has no masked-LM head."])
    tokenizer = analysis.tokenizer
    used: list[str] = []
    for sentence in sentences:
        choice = choose_masked_word(tokenizer, sentence, set(used))
        if choice is None:
            continue
        masked, true_token = choice
        used.append(true_token)
        text = masked.replace(MASK, tokenizer.mask_token)
        predictions = analysis.fill_mask(text, top_k).predictions[0]
        hits = [tokenizer.convert_ids_to_tokens(p["token"]) == true_token for p in predictions]
        cells = []
        for p, hit in zip(predictions, hits, strict=True):
            word = p["token_str"].strip()
            cells.append(f"**{code(word)}** {p['score']:.3f}" if hit else f"{code(word)} {p['score']:.3f}")
        if any(hits):
            verdict = f"true word **{code(true_token)}** is number {hits.index(True) + 1} of the top {top_k}"
        else:
            score = analysis.fill_mask_pipeline(text, targets=[true_token], top_k=1)[0]["score"]
            verdict = f"true word **{code(true_token)}** is not in the top {top_k} (probability {score:.3f})"
        lines += [f"{len(used)}. {code(masked)}: {verdict}", "", f"   top {top_k}: " + " · ".join(cells), ""]
        if len(used) == limit:
            break
    if not used:
        lines += ["No sentence contains one of the frequent words.", ""]
    return "\n".join(lines).strip()


def nsp_section(analysis: ModelAnalysis, sentences: Sequence[str], other_sentence: str | None) -> list[str]:
    """samples.md's NSP section: a real pair (sentences 1 and 2) against a random one."""
    lines = ["## Next sentence prediction", ""]
    if not analysis.has_nsp_head:
        return [*lines, "This folder has no next-sentence head.", ""]
    random_b, where = (other_sentence, "another document")
    if other_sentence is None:
        random_b, where = sentences[-1], f"sentence {len(sentences)} of the same text, not adjacent"
    results = [analysis.nsp(sentences[0], sentences[1]), analysis.nsp(sentences[0], random_b)]
    lines += nsp_lines(results, names=["real (B is the next sentence)", f"random (B is {where})"])
    return [*lines, "", "A model that learned NSP gives the real pair the higher probability.", ""]
