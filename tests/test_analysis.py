"""hfbert.analysis: the analyses behind inspect and samples.md, on a model in memory."""

import pytest
import torch
from conftest import tiny_config

from hfbert import HfBertForMaskedLM, HfBertForPreTraining
from hfbert.analysis import ModelAnalysis


def test_weights_in_memory_keep_their_heads_also_without_the_tied_decoder(sample_tokenizer):
    torch.manual_seed(0)
    model = HfBertForPreTraining(tiny_config())
    state_dict = model.state_dict()
    without_decoder = {k: v for k, v in state_dict.items() if k != "cls.predictions.decoder.weight"}
    analysis = ModelAnalysis.of_weights(model.config, without_decoder, sample_tokenizer)
    assert analysis.has_mlm_head and analysis.has_nsp_head
    assert len(without_decoder) == len(state_dict) - 1  # the caller's dict is left as it was
    text = f"The game was released in {sample_tokenizer.mask_token} ."
    encoded = sample_tokenizer(text, return_tensors="pt")
    with torch.no_grad():
        expected = model.eval()(**encoded).prediction_logits.softmax(-1)
    position = encoded["input_ids"][0].tolist().index(sample_tokenizer.mask_token_id)
    best = analysis.fill_mask(text, top_k=1).predictions[0][0]
    assert best["token"] == int(expected[0, position].argmax())
    assert best["score"] == pytest.approx(float(expected[0, position].max()), rel=1e-4)


def test_weights_without_a_head_say_so(sample_tokenizer):
    masked_lm = HfBertForMaskedLM(tiny_config())
    analysis = ModelAnalysis.of_weights(masked_lm.config, masked_lm.state_dict(), sample_tokenizer)
    assert analysis.has_mlm_head and not analysis.has_nsp_head


def test_corpus_text_in_the_reports_shows_as_written_never_as_markdown_or_html():
    """The seventh attack (731f08a), B5: samples.md (pushed, linked from the card) held validation sentences raw
    in the NSP table and the similarity list, and the fill-mask code span was always fenced by two backticks, so
    a sentence holding `` closed it early: an image tag, a link and bold text rendered."""
    from hfbert.analysis import NspResult, SimilarityResult, nsp_lines, similarity_section
    from hfbert.markdown import code

    evil = "the best `` <img src=x onerror=alert(1)> [click here](http://evil.example) **LOUD** | `` end ."
    assert code(evil) == f"```{evil}```"  # a fence longer than any run of backticks inside
    assert nsp_lines([NspResult(evil, "b", 0.5)])[-1] == f"| {code(evil).replace('|', chr(92) + '|')} | `b` | 0.500 |"
    similarity = similarity_section(SimilarityResult([evil, "b"], [[1.0, 0.0], [0.0, 1.0]], [[1.0, 0.0], [0.0, 1.0]]), "s.png")
    assert f"- s1: {code(evil)}" in similarity
