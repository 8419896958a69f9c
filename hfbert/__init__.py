"""hfbert: BERT written from scratch as a native Hugging Face model package.

Importing hfbert registers its classes with the transformers Auto classes (`AutoConfig`, `AutoModel`,
`AutoModelForMaskedLM`, ...) and for `trust_remote_code` saving: `save_pretrained` writes `auto_map` into
config.json and copies `configuration_hfbert.py` and `modeling_hfbert.py` beside the weights, so a process
without hfbert installed loads the folder with `trust_remote_code=True`.
"""

import transformers

from . import modeling_hfbert
from .configuration_hfbert import PRESETS, HfBertConfig
from .modeling_hfbert import (
    AUTO_MAP,
    HfBertForMaskedLM,
    HfBertForNextSentencePrediction,
    HfBertForPreTraining,
    HfBertForPreTrainingOutput,
    HfBertForQuestionAnswering,
    HfBertForSequenceClassification,
    HfBertForTokenClassification,
    HfBertModel,
    HfBertPreTrainedModel,
)

__version__ = "0.1.0"

# Each Auto model class -> the hfbert class it builds, from AUTO_MAP (the list config.json gets).
_AUTO_CLASSES = {
    getattr(transformers, auto_name): getattr(modeling_hfbert, reference.rpartition(".")[2])
    for auto_name, reference in AUTO_MAP.items()
    if auto_name != "AutoConfig"
}

transformers.AutoConfig.register(HfBertConfig.model_type, HfBertConfig, exist_ok=True)
HfBertConfig.register_for_auto_class()
for _auto_class, _model_class in _AUTO_CLASSES.items():
    _auto_class.register(HfBertConfig, _model_class, exist_ok=True)
    _model_class.register_for_auto_class(_auto_class.__name__)

__all__ = [
    "PRESETS",
    "HfBertConfig",
    "HfBertForMaskedLM",
    "HfBertForNextSentencePrediction",
    "HfBertForPreTraining",
    "HfBertForPreTrainingOutput",
    "HfBertForQuestionAnswering",
    "HfBertForSequenceClassification",
    "HfBertForTokenClassification",
    "HfBertModel",
    "HfBertPreTrainedModel",
]
