"""The speed paths of hfbert.modeling_hfbert give the results of the plain computation.

Masked-rows pretraining (`mlm_masked_rows_only=True`, or `masked_positions` for the static-shape form) runs
the last encoder layer only at [CLS] and the masked positions (`last_layer_positions`) and the MLM head only
at the masked rows; asking for hidden states turns the first part off, so the paths are compared here.
"""

import inspect

import pytest
import torch
from conftest import tiny_config
from torch.nn.attention.varlen import varlen_attn
from torch.testing import assert_close

from hfbert import HfBertForMaskedLM, HfBertForPreTraining, modeling_hfbert
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


# ------------------------------------------------------------------------------ attention without a mask


def padded_pretraining_batch() -> dict[str, torch.Tensor]:
    """`pretraining_batch` with a fourth row that is all padding (what pad_to_batch_size adds)."""
    batch = pretraining_batch()
    filler = {"input_ids": 0, "attention_mask": 0, "token_type_ids": 0, "labels": -100}
    for key, value in filler.items():
        batch[key] = torch.cat([batch[key], torch.full_like(batch[key][:1], value)])
    batch["next_sentence_label"] = torch.tensor([0, 1, 1, -100])
    return batch


def sdpa_masks(monkeypatch) -> list:
    """The attn_mask of every F.scaled_dot_product_attention call made after this."""
    masks, sdpa = [], torch.nn.functional.scaled_dot_product_attention

    def recording_sdpa(*args, **kwargs):
        masks.append(kwargs.get("attn_mask"))
        return sdpa(*args, **kwargs)

    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", recording_sdpa)
    return masks


def twin_models(model_class: type = HfBertForPreTraining) -> tuple[torch.nn.Module, torch.nn.Module]:
    reference, model = model_class(tiny_config()).eval(), model_class(tiny_config()).eval()
    model.load_state_dict(reference.state_dict())
    return reference, model


@pytest.mark.parametrize("path", ["masked rows", "static slots", "dense head"])
def test_an_unpadded_batch_with_no_padding_promised_runs_sdpa_without_a_mask(monkeypatch, path):
    reference, model = twin_models()
    batch = pretraining_batch()
    batch["attention_mask"] = torch.ones_like(batch["attention_mask"])
    inputs = {"masked rows": {"mlm_masked_rows_only": True}, "static slots": {}, "dense head": {}}[path]
    if path == "static slots":
        batch = static_batch(batch)
    masks = sdpa_masks(monkeypatch)
    expected = reference(**batch, **inputs)
    assert len(masks) == 2 and all(mask is not None for mask in masks)  # the default builds the mask
    masks.clear()
    actual = model(**batch, **inputs, attention_padding="none")
    assert masks == [None, None]
    for name in ("loss", "prediction_logits", "seq_relationship_logits"):
        assert_close(actual[name], expected[name], **TIGHT, msg=name)
    expected.loss.backward()
    actual.loss.backward()
    assert_same_gradients(model, reference)


@pytest.mark.parametrize(
    ("padding", "attention_mask", "message"),
    [
        ("none", [[1, 1, 1, 0]], "promises no padding, but attention_mask has padding"),
        ("varlen", [[1, 0, 1, 1]], "has a row with padding before a token"),
        ("varlen", [[0, 1, 1, 1]], "has a row with padding before a token"),
        ("unpadded", [[1, 1, 1, 1]], "attention_padding must be one of"),
    ],
)
def test_an_attention_mask_that_breaks_the_promise_is_refused(padding, attention_mask, message):
    model = HfBertForPreTraining(tiny_config()).eval()
    with pytest.raises(ValueError, match=message):
        model(torch.tensor([[2, 7, 8, 3]]), attention_mask=torch.tensor(attention_mask), attention_padding=padding)


@pytest.mark.parametrize("how", ["eager model", "output_attentions"])
def test_varlen_refuses_what_only_eager_attention_gives(how):
    model = HfBertForPreTraining(tiny_config()).eval()
    kwargs = {"output_attentions": True}
    if how == "eager model":
        model.set_attn_implementation("eager")
        kwargs = {}
    with pytest.raises(ValueError, match="attention_padding='varlen' is the sdpa backend's unpadded form"):
        model(torch.tensor([[2, 7, 8, 3]]), attention_padding="varlen", **kwargs)


def test_varlen_offsets_split_each_row_into_its_tokens_then_its_padding():
    lengths = torch.tensor([3, 5, 1], dtype=torch.int32)
    queries, keys = modeling_hfbert.varlen_offsets(lengths, 5, 5, every_position=True)
    assert keys.tolist() == [0, 3, 5, 10, 10, 11, 15]
    assert queries.tolist() == keys.tolist()
    queries, keys = modeling_hfbert.varlen_offsets(lengths, 2, 5, every_position=False)
    assert queries.tolist() == [0, 2, 2, 4, 4, 6, 6]  # every query row attends to its row's tokens
    assert keys.tolist() == [0, 3, 5, 10, 10, 11, 15]
    assert queries.dtype == keys.dtype == torch.int32


@pytest.mark.parametrize("queries", ["every position", "a subset"])
def test_varlen_attention_is_per_row_eager_attention_over_the_row_tokens(queries):
    batch, heads, seq_len, head_size = 3, 2, 6, 4
    lengths = torch.tensor([6, 2, 4], dtype=torch.int32)
    key, value = torch.randn(2, batch, heads, seq_len, head_size).unbind(0)
    query_len = seq_len if queries == "every position" else 3
    query = torch.randn(batch, heads, query_len, head_size)
    rows = modeling_hfbert.RightPaddedRows(lengths)
    actual = modeling_hfbert.varlen_attention(query, key, value, rows, query_len == seq_len, 0.5, 0.0)
    assert actual.shape == (batch, query_len, heads, head_size)
    module = torch.nn.Module().eval()
    for row, length in enumerate(lengths.tolist()):
        expected, _ = modeling_hfbert.eager_attention_forward(
            module, query[row : row + 1], key[row : row + 1, :, :length], value[row : row + 1, :, :length], None, 0.5
        )
        compared = length if queries == "every position" else query_len  # padding's own output is unused
        assert_close(actual[row, :compared], expected[0, :compared], **TIGHT, msg=f"row {row}")


def test_the_private_flash_op_takes_the_arguments_varlen_passes_and_the_public_one_still_lacks_dropout():
    """varlen_attention calls aten's private _flash_attention_forward by position (the public varlen_attn has no
    dropout, which BERT trains with): this fails when torch moves those arguments or gives varlen_attn dropout."""
    schema = torch.ops.aten._flash_attention_forward.default._schema
    positional = [argument.name for argument in schema.arguments if not argument.kwarg_only]
    assert positional == [
        "query", "key", "value", "cum_seq_q", "cum_seq_k", "max_q", "max_k", "dropout_p", "is_causal", "return_debug_mask"
    ]
    assert "scale" in [argument.name for argument in schema.arguments if argument.kwarg_only]
    assert schema.returns[0].name == "output"
    assert not any("dropout" in name for name in inspect.signature(varlen_attn).parameters)


@pytest.mark.parametrize("model_class", [HfBertForPreTraining, HfBertForMaskedLM], ids=lambda c: c.__name__)
@pytest.mark.parametrize("path", ["masked rows", "static slots", "dense head", "checkpointed"])
def test_varlen_gives_the_masked_loss_logits_and_gradients(monkeypatch, model_class, path):
    reference, model = twin_models(model_class)
    batch = padded_pretraining_batch()
    if model_class is HfBertForMaskedLM:
        del batch["next_sentence_label"]
    inputs = {"mlm_masked_rows_only": True} if path in ("masked rows", "checkpointed") else {}
    if path == "static slots":
        batch = static_batch(batch)
    if path == "checkpointed":  # layers checkpoint in training only; no dropout, so the twins still agree
        for twin in (reference, model):
            twin.train()
            for module in twin.modules():
                if isinstance(module, torch.nn.Dropout):
                    module.p = 0.0
        model.activation_checkpointing_enable()
    expected = reference(**batch, **inputs)
    masks = sdpa_masks(monkeypatch)
    actual = model(**batch, **inputs, attention_padding="varlen")
    assert all(mask is None for mask in masks)
    key = "logits" if model_class is HfBertForMaskedLM else "prediction_logits"
    compared = {key: expected[key], "loss": expected.loss}
    # Outputs at padding (dense head) and at the all-padding row's empty slots differ and are never read.
    read = {"dense head": batch["attention_mask"], "static slots": batch["labels"] != -100}.get(path)
    if read is not None:
        compared[key], actual[key] = expected[key][read.bool()], actual[key][read.bool()]
    if model_class is HfBertForPreTraining:
        compared["seq_relationship_logits"] = expected.seq_relationship_logits[:3]  # the last row is padding
        actual["seq_relationship_logits"] = actual.seq_relationship_logits[:3]
    for name, value in compared.items():
        assert_close(actual[name], value, **TIGHT, msg=name)
    expected.loss.backward()
    actual.loss.backward()
    assert_same_gradients(model, reference)


def test_varlen_hidden_states_at_tokens_are_the_masked_ones_and_all_are_finite():
    reference, model = twin_models(HfBertForPreTraining)
    batch = padded_pretraining_batch()
    expected = reference(**batch, output_hidden_states=True).hidden_states
    actual = model(**batch, output_hidden_states=True, attention_padding="varlen").hidden_states
    keep = batch["attention_mask"].bool()
    for layer, (got, want) in enumerate(zip(actual, expected, strict=True)):
        assert torch.isfinite(got).all()
        assert_close(got[keep], want[keep], **TIGHT, msg=f"hidden state {layer}")


# --------------------------------------------------------------------------- one projection for Q, K, V


def linear_weight_shapes(model: torch.nn.Module, batch: dict, **inputs) -> list[tuple[int, ...]]:
    """The weight shape of every F.linear call inside the self-attention modules during one forward."""
    shapes, linear = [], torch.nn.functional.linear

    def recording_linear(input, weight, bias=None):
        shapes.append(tuple(weight.shape))
        return linear(input, weight, bias)

    def recording(forward):
        def forward_recording_linear(*args, **kwargs):
            torch.nn.functional.linear = recording_linear
            try:
                return forward(*args, **kwargs)
            finally:
                torch.nn.functional.linear = linear

        return forward_recording_linear

    attentions = [layer.attention.self for layer in model.bert.encoder.layer]
    for attention in attentions:
        attention.forward = recording(attention.forward)
    try:
        model(**batch, **inputs)
    finally:
        for attention in attentions:
            del attention.forward
    return shapes


def test_queries_keys_and_values_are_one_matmul_under_transformers_names():
    model = HfBertForPreTraining(tiny_config()).eval()
    batch = pretraining_batch()
    d = model.config.hidden_size
    assert linear_weight_shapes(model, batch) == [(3 * d, d)] * 2
    # The last layer at [CLS] and the masked rows: queries there, keys and values everywhere.
    assert linear_weight_shapes(model, batch, mlm_masked_rows_only=True) == [(3 * d, d), (d, d), (2 * d, d)]
    names = set(model.state_dict())
    for part in ("query", "key", "value"):
        assert f"bert.encoder.layer.0.attention.self.{part}.weight" in names
    assert not [name for name in names if "qkv" in name]


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
def test_varlen_on_cuda_gives_the_masked_results_without_a_host_sync(dtype):
    """FlashAttention's variable-length kernel against sdpa with the mask, in half precision (so the two
    kernels round differently: 1e-2), at the static slots, with no host synchronisation in the step."""
    reference, model = (twin.cuda() for twin in twin_models())
    batch = {key: value.cuda() for key, value in static_batch(padded_pretraining_batch()).items()}
    with torch.autocast("cuda", dtype=dtype):
        expected = reference(**batch)
    expected.loss.backward()
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")  # any host synchronisation raises
    try:
        with torch.autocast("cuda", dtype=dtype):
            actual = model(**batch, attention_padding="varlen")
        actual.loss.backward()
    finally:
        torch.cuda.set_sync_debug_mode("default")
    loose = {"atol": 1e-2, "rtol": 1e-2}
    filled = batch["labels"] != -100
    assert_close(actual.prediction_logits[filled], expected.prediction_logits[filled], **loose)
    assert_close(actual.loss, expected.loss, **loose)
    for (name, parameter), twin in zip(model.named_parameters(), reference.parameters(), strict=True):
        assert_close(parameter.grad, twin.grad, **loose, msg=name)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_varlen_on_cuda_trains_with_attention_dropout_and_refuses_fp32():
    model = HfBertForPreTraining(tiny_config()).cuda().train()
    batch = {key: value.cuda() for key, value in static_batch(padded_pretraining_batch()).items()}
    with torch.autocast("cuda", dtype=torch.float16):
        first = model(**batch, attention_padding="varlen").loss
        second = model(**batch, attention_padding="varlen").loss
    first.backward()
    assert torch.isfinite(first) and first != second  # dropout draws differ
    assert all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None)
    with pytest.raises(ValueError, match="FlashAttention, which takes float16 or bfloat16"):
        model(**batch, attention_padding="varlen")


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_varlen_on_cuda_compiles_to_one_graph():
    model = HfBertForPreTraining(tiny_config(hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)).cuda()
    inputs = {key: value.cuda() for key, value in static_batch(padded_pretraining_batch()).items()}
    with torch.autocast("cuda", dtype=torch.float16):
        expected = model(**inputs, attention_padding="varlen").loss
        torch._dynamo.reset()
        compiled = torch.compile(model, fullgraph=True, dynamic=False)
        actual = compiled(**inputs, attention_padding="varlen").loss
    assert_close(actual, expected, atol=1e-3, rtol=1e-3)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_an_unpadded_batch_with_no_padding_promised_runs_on_the_flash_kernel():
    from torch.nn.attention import SDPBackend, sdpa_kernel

    model = HfBertForPreTraining(tiny_config()).cuda().eval()
    batch = {key: value.cuda() for key, value in pretraining_batch().items()}
    batch["attention_mask"] = torch.ones_like(batch["attention_mask"])
    with torch.autocast("cuda", dtype=torch.float16), sdpa_kernel(SDPBackend.FLASH_ATTENTION):
        assert torch.isfinite(model(**batch, attention_padding="none").loss)
        with pytest.raises(RuntimeError):  # a mask rules the flash kernel out
            model(**batch)
