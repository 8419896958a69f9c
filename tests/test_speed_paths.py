"""The speed paths of hfbert.modeling_hfbert give the results of the plain computation.

Masked-rows pretraining (`mlm_masked_rows_only=True`, or `masked_positions` for the static-shape form) runs
the last encoder layer only at [CLS] and the masked positions (`last_layer_positions`) and the MLM head only
at the masked rows; asking for hidden states turns the first part off, so the paths are compared here.
"""

import pytest
import torch
from conftest import tiny_config
from torch.testing import assert_close

from hfbert import HfBertForMaskedLM, HfBertForPreTraining
from hfbert.pretraining.batches import masked_positions_from_labels

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


def static_batch(batch: dict[str, torch.Tensor], slots: int = 5) -> dict[str, torch.Tensor]:
    positions, labels, input_ids = masked_positions_from_labels(batch["labels"], slots, batch["input_ids"])
    return {**batch, "input_ids": input_ids, "labels": labels, "masked_positions": positions}


def assert_same_gradients(model: torch.nn.Module, reference: torch.nn.Module) -> None:
    reference_grads = dict(reference.named_parameters())
    for name, parameter in model.named_parameters():
        assert_close(parameter.grad, reference_grads[name].grad, **TIGHT, msg=name)


def test_last_layer_positions_are_cls_then_masked_ascending_padded_with_unmasked():
    model = HfBertForPreTraining(tiny_config())
    labels = pretraining_batch()["labels"]
    positions = model.last_layer_positions(labels)
    assert positions.shape == (3, 5)
    assert positions[2].tolist() == [0, 1, 5, 6, 12]
    assert positions[1, :2].tolist() == [0, 4]
    assert positions[0, 0] == 0
    padding = torch.ones_like(positions, dtype=torch.bool)
    padding[:, 0] = False
    padding[1, 1] = padding[2, 1:] = False
    assert (labels.gather(1, positions)[padding] == -100).all()


def test_static_last_layer_positions_are_cls_then_the_slots():
    model = HfBertForPreTraining(tiny_config())
    positions = model.last_layer_positions(None, masked_positions=torch.tensor([[3, 4], [5, 0]]))
    assert positions.tolist() == [[0, 3, 4], [0, 5, 0]]


@pytest.mark.parametrize(
    ("labels", "rows_only", "every_position", "attn_implementation"),
    [
        (False, True, False, "sdpa"),
        (True, False, False, "sdpa"),
        (True, True, True, "sdpa"),
        (True, True, False, "flex_attention"),
    ],
    ids=["no labels", "dense head", "hidden states asked for", "backend other than eager/sdpa"],
)
def test_every_position_is_computed_when_needed(labels, rows_only, every_position, attn_implementation):
    model = HfBertForPreTraining(tiny_config())
    model.config._attn_implementation = attn_implementation
    batch_labels = pretraining_batch()["labels"] if labels else None
    assert model.last_layer_positions(batch_labels, rows_only, None, every_position) is None


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
    full_out = full(**batch, output_hidden_states=True)  # dense head, every position
    sparse_out = sparse(**batch, mlm_masked_rows_only=True)
    key = "logits" if model_class is HfBertForMaskedLM else "prediction_logits"
    masked = batch["labels"] != -100
    assert_close(sparse_out[key], full_out[key][masked], **TIGHT)
    compared = (
        ["loss"]
        if model_class is HfBertForMaskedLM
        else ["loss", "mlm_loss", "nsp_loss", "seq_relationship_logits"]
    )  # seq_relationship_logits: the pooler reads [CLS], column 0 of the gathered last layer
    for name in compared:
        assert_close(sparse_out[name], full_out[name], **TIGHT, msg=name)
    full_out.loss.backward()
    sparse_out.loss.backward()
    assert_same_gradients(sparse, full)


@pytest.mark.parametrize("model_class", [HfBertForPreTraining, HfBertForMaskedLM], ids=lambda c: c.__name__)
@pytest.mark.parametrize(
    "every_position", [False, True], ids=["last layer at slots", "hidden states asked for"]
)
def test_static_path_gives_the_dynamic_loss_logits_and_gradients(model_class, every_position):
    dynamic, static = model_class(tiny_config()).eval(), model_class(tiny_config()).eval()
    static.load_state_dict(dynamic.state_dict())
    batch = pretraining_batch()
    if model_class is HfBertForMaskedLM:
        del batch["next_sentence_label"]
    dynamic_out = dynamic(**batch, mlm_masked_rows_only=True)
    static_inputs = static_batch(batch)
    static_out = static(**static_inputs, output_hidden_states=every_position)
    key = "logits" if model_class is HfBertForMaskedLM else "prediction_logits"
    filled = static_inputs["labels"] != -100
    assert static_out[key].shape == (3, 5, 1000)
    assert_close(static_out[key][filled], dynamic_out[key], **TIGHT)
    assert_close(static_out.loss, dynamic_out.loss, **TIGHT)
    if model_class is HfBertForPreTraining:
        assert_close(static_out.seq_relationship_logits, dynamic_out.seq_relationship_logits, **TIGHT)
    dynamic_out.loss.backward()
    static_out.loss.backward()
    assert_same_gradients(static, dynamic)


def test_masked_positions_from_labels_keeps_order_pads_and_caps():
    labels = torch.full((3, 8), -100)
    labels[0, [6, 2]] = torch.tensor([16, 12])
    labels[2, [1, 3, 4, 5, 7]] = torch.tensor([11, 13, 14, 15, 17])
    input_ids = torch.arange(24).reshape(3, 8) + 100
    input_ids[labels != -100] = 4  # [MASK]
    positions, masked_labels, restored = masked_positions_from_labels(labels, 3, input_ids)
    assert positions[:2].tolist() == [[2, 6, 0], [0, 0, 0]]
    assert masked_labels[:2].tolist() == [[12, 16, -100], [-100, -100, -100]]
    kept = positions[2].tolist()
    assert kept == sorted(kept) and set(kept) < {1, 3, 4, 5, 7}
    assert masked_labels[2].tolist() == [labels[2, p].item() for p in kept]
    dropped = sorted({1, 3, 4, 5, 7} - set(kept))
    assert restored[2, dropped].tolist() == labels[2, dropped].tolist()  # the excess is unmasked
    assert (restored[2, kept] == 4).all() and torch.equal(restored[:2], input_ids[:2])
    wide_positions, wide_labels, _ = masked_positions_from_labels(labels, 10)  # more slots than tokens
    assert wide_positions.shape == wide_labels.shape == (3, 10)
    assert (wide_labels != -100).sum() == (labels != -100).sum()


@pytest.mark.slow
def test_static_path_compiles_to_one_graph():
    model = HfBertForPreTraining(tiny_config(hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0))
    inputs = static_batch(pretraining_batch())
    expected = model(**inputs).loss
    torch._dynamo.reset()
    compiled = torch.compile(model, fullgraph=True, dynamic=False)
    assert_close(compiled(**inputs).loss, expected, atol=1e-5, rtol=1e-5)
