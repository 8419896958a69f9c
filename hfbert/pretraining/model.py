"""The model stage: the model a run trains and its start, chosen once, here.

A fresh model starts as --attention_init says (`start_fresh_model`); a run from weights
(--model_name_or_path) starts from them and nothing is initialised. What the start leaves for training to do
(the structured start's fade) comes back as loop callbacks.
"""

from __future__ import annotations

import torch

from hfbert.configuration_hfbert import HfBertConfig
from hfbert.initialization import init_structured_attention
from hfbert.modeling_hfbert import HfBertForPreTraining
from hfbert.pretraining.attention_shaping import StructuredFade
from hfbert.pretraining.callbacks import Callback
from hfbert.pretraining.settings import ModelSettings
from hfbert.pretraining.source_model import SourceModel, load_source_model


def start_fresh_model(model: torch.nn.Module, settings: ModelSettings, seed: int) -> list[Callback]:
    """Initialise a freshly built `model` (HfBertForPreTraining, or another BERT through the same pipeline,
    see benchmarks/time_to_quality.py) as --attention_init says; returns the callbacks its start needs (the
    structured start's fade, under --structured_attention_fade). A resumed run then loads its checkpoint over
    these weights, and the fade goes on from the checkpoint's progress."""
    if settings.attention_init != "structured":
        return []  # bert: the model's own initialisation, as built
    fade = settings.structured_attention_fade or 0.0
    components = init_structured_attention(model, seed=seed, keep_random_rows=fade > 0)
    return [StructuredFade(model, components, fade)] if fade > 0 else []


def build_model(
    settings: ModelSettings, config: HfBertConfig, source: SourceModel | None, seed: int
) -> tuple[torch.nn.Module, list[Callback]]:
    """The model to train (fresh from `config`, or `source`'s weights) and the callbacks of its start."""
    if source is not None:
        return load_source_model(source, config), []
    model = HfBertForPreTraining(config)
    return model, start_fresh_model(model, settings, seed)


__all__ = ["build_model", "start_fresh_model"]
