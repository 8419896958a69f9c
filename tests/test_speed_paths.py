"""The speed paths of hfbert.modeling_hfbert give the results of the plain computation.

Masked-rows pretraining runs the last encoder layer only at [CLS] and the masked positions
(`last_layer_positions`); asking for hidden states turns that off, so the two are compared here.
"""

import pytest
import torch
from conftest import tiny_config
from torch.testing import assert_close

from hfbert import HfBertForMaskedLM, HfBertForPreTraining

TIGHT = {"atol": 1e-6, "rtol": 1e-6}


def pretraining_batch() -> dict[str, torch.Tensor]:
    """Three rows: padded, with 0, 1 and 4 masked positions, so the gathered rows need padding too."""
    input_ids = torch.randint(5, 1000, (3, 16))
    attention_mask = torch.ones_like(input_ids)
    attention_mask[1, 10:] = 0
    attention_mask[2, 13:] = 0
    labels = torch.full_like(input_ids, -100)
    labels[1, 4] = 21
    labels[2, [1, 5, 6, 12]] = torch.tensor([7, 8, 9, 10])
    return {
        "input_ids": input_ids,
        "attention_mask": attention_mask,
        "token_type_ids": (torch.arange(16) >= 8).long().expand(3, -1).clone(),
        "labels": labels,
        "next_sentence_label": torch.tensor([0, 1, 1]),
    }


def test_last_layer_positions_are_cls_then_masked_ascending_padded_with_unmasked():
    model = HfBertForPreTraining(tiny_config())
    labels = pretraining_batch()["labels"]
    positions = model.last_layer_positions(labels, None, None)
    assert positions.shape == (3, 5)
    assert positions[2].tolist() == [0, 1, 5, 6, 12]
    assert positions[1, :2].tolist() == [0, 4]
    assert positions[0, 0] == 0
    padding = torch.ones_like(positions, dtype=torch.bool)
    padding[:, 0] = False
    padding[1, 1] = padding[2, 1:] = False
    assert (labels.gather(1, positions)[padding] == -100).all()


@pytest.mark.parametrize(
    ("labels", "config", "output_hidden_states"),
    [(False, {}, None), (True, {"mlm_masked_rows_only": False}, None), (True, {}, True)],
    ids=["no labels", "dense head", "hidden states asked for"],
)
def test_every_position_is_computed_when_needed(labels, config, output_hidden_states):
    model = HfBertForPreTraining(tiny_config(**config))
    batch_labels = pretraining_batch()["labels"] if labels else None
    assert model.last_layer_positions(batch_labels, None, output_hidden_states) is None


@pytest.mark.parametrize("model_class", [HfBertForPreTraining, HfBertForMaskedLM], ids=lambda c: c.__name__)
@pytest.mark.parametrize("gradient_checkpointing", [False, True], ids=["plain", "checkpointed"])
def test_last_layer_at_masked_rows_gives_the_full_loss_logits_and_gradients(
    model_class, gradient_checkpointing
):
    full, sparse = model_class(tiny_config()).eval(), model_class(tiny_config()).eval()
    sparse.load_state_dict(full.state_dict())
    if gradient_checkpointing:
        sparse.activation_checkpointing_enable()
    batch = pretraining_batch()
    if model_class is HfBertForMaskedLM:
        del batch["next_sentence_label"]
    full_out = full(**batch, output_hidden_states=True)
    sparse_out = sparse(**batch)
    compared = (
        ["loss", "logits"]
        if model_class is HfBertForMaskedLM
        else ["loss", "mlm_loss", "nsp_loss", "prediction_logits", "seq_relationship_logits"]
    )  # seq_relationship_logits: the pooler reads [CLS], column 0 of the gathered last layer
    for key in compared:
        assert_close(sparse_out[key], full_out[key], **TIGHT, msg=key)
    full_out.loss.backward()
    sparse_out.loss.backward()
    full_grads = dict(full.named_parameters())
    for name, parameter in sparse.named_parameters():
        assert_close(parameter.grad, full_grads[name].grad, **TIGHT, msg=name)
