"""hfbert's model against transformers' own BERT, and its behaviour on its own."""

import copy
import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
import transformers
from conftest import tiny_config
from torch.testing import assert_close
from transformers import AutoModel, AutoModelForMaskedLM, AutoModelForPreTraining, BertConfig
from transformers.testing_utils import CaptureLogger
from transformers.utils import logging

import hfbert
from hfbert import (
    HfBertConfig,
    HfBertForMaskedLM,
    HfBertForNextSentencePrediction,
    HfBertForPreTraining,
    HfBertForQuestionAnswering,
    HfBertForSequenceClassification,
    HfBertForTokenClassification,
    HfBertModel,
    modeling_hfbert,
)
from hfbert.pretraining.batches import masked_positions_from_labels

HEADS = [
    HfBertModel,
    HfBertForPreTraining,
    HfBertForMaskedLM,
    HfBertForNextSentencePrediction,
    HfBertForSequenceClassification,
    HfBertForTokenClassification,
    HfBertForQuestionAnswering,
]
LOSS_HEADS = [head for head in HEADS if head is not HfBertModel]
TIGHT = dict(atol=1e-5, rtol=1e-5)


def twin_of(model_class: type) -> type:
    """transformers' class for the same head: HfBertForMaskedLM -> BertForMaskedLM."""
    return getattr(transformers, model_class.__name__.replace("HfBert", "Bert", 1))


def bert_config(config: HfBertConfig) -> BertConfig:
    fields = ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size")
    fields += ("hidden_dropout_prob", "attention_probs_dropout_prob", "num_labels", "problem_type")
    return BertConfig(
        **{name: getattr(config, name) for name in fields},
        max_position_embeddings=config.max_position_embeddings,
        attn_implementation=config._attn_implementation,
    )


def padded_batch(vocab_size: int = 1000, batch: int = 3, seq_len: int = 16) -> dict[str, torch.Tensor]:
    """Sentence pairs with both token types; row 1 and row 2 are padded."""
    generator = torch.Generator().manual_seed(1234)
    input_ids = torch.randint(5, vocab_size, (batch, seq_len), generator=generator)
    attention_mask = torch.ones_like(input_ids)
    attention_mask[1, 11:] = 0
    attention_mask[2, 5:] = 0
    input_ids[attention_mask == 0] = 0
    token_type_ids = torch.zeros_like(input_ids)
    token_type_ids[:, seq_len // 2 :] = 1
    token_type_ids[attention_mask == 0] = 0
    return {"input_ids": input_ids, "attention_mask": attention_mask, "token_type_ids": token_type_ids}


def labels_for(model_class: type, batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    input_ids = batch["input_ids"]
    mlm_labels = torch.full_like(input_ids, -100)
    mlm_labels[:, 2] = input_ids[:, 2]
    mlm_labels[0, 9] = 17
    sentence_labels = torch.tensor([0, 1, 0])
    token_labels = (input_ids % 2).masked_fill(batch["attention_mask"] == 0, -100)
    return {
        HfBertModel: {},
        HfBertForPreTraining: {"labels": mlm_labels, "next_sentence_label": sentence_labels},
        HfBertForMaskedLM: {"labels": mlm_labels},
        HfBertForNextSentencePrediction: {"labels": sentence_labels},
        HfBertForSequenceClassification: {"labels": sentence_labels},
        HfBertForTokenClassification: {"labels": token_labels},
        HfBertForQuestionAnswering: {
            "start_positions": torch.tensor([1, 3, 2]),
            "end_positions": torch.tensor([4, 9, 3]),
        },
    }[model_class]


def twins(model_class: type, **config_overrides) -> tuple[torch.nn.Module, torch.nn.Module]:
    """A randomly initialised transformers model and the hfbert model holding a copy of its weights."""
    config = tiny_config(**config_overrides)
    reference = twin_of(model_class)(bert_config(config)).eval()
    ours = model_class(config).eval()
    ours.load_state_dict(reference.state_dict(), strict=True)
    return reference, ours


# ------------------------------------------------------------------------------------------- parity


@pytest.mark.parametrize("model_class", HEADS, ids=lambda cls: cls.__name__)
@pytest.mark.parametrize("attn_implementation", ["sdpa", "eager"])
def test_outputs_match_transformers(model_class, attn_implementation):
    reference, ours = twins(model_class, attn_implementation=attn_implementation)
    batch = padded_batch()
    output_attentions = attn_implementation == "eager"
    with torch.no_grad():
        expected = reference(**batch, output_hidden_states=True, output_attentions=output_attentions)
        actual = ours(**batch, output_hidden_states=True, output_attentions=output_attentions)
    # transformers' encoder-only BertModel also fills `cross_attentions`; hfbert has no cross-attention.
    compared = [key for key in expected if key not in ("loss", "cross_attentions")]
    assert {"hidden_states"} < set(compared)
    assert output_attentions == ("attentions" in compared)
    for key in compared:
        assert_close(actual[key], expected[key], **TIGHT, msg=f"{model_class.__name__}.{key}")


@pytest.mark.parametrize("model_class", LOSS_HEADS, ids=lambda c: c.__name__)
def test_loss_matches_transformers(model_class):
    reference, ours = twins(model_class)
    batch = padded_batch()
    labels = labels_for(model_class, batch)
    expected = reference(**batch, **labels)
    actual = ours(**batch, **labels)
    assert_close(actual.loss, expected.loss, **TIGHT)
    expected.loss.backward()
    actual.loss.backward()
    reference_grads = dict(reference.named_parameters())
    for name, parameter in ours.named_parameters():
        assert_close(parameter.grad, reference_grads[name].grad, **TIGHT, msg=name)


@pytest.mark.parametrize("model_class", [HfBertForPreTraining, HfBertForMaskedLM], ids=lambda c: c.__name__)
def test_logits_with_labels_are_dense_by_default_as_in_transformers(model_class):
    reference, ours = twins(model_class)
    batch = padded_batch()
    labels = labels_for(model_class, batch)
    with torch.no_grad():
        expected = reference(**batch, **labels)
        actual = ours(**batch, **labels)
    key = "prediction_logits" if model_class is HfBertForPreTraining else "logits"
    assert actual[key].shape == (3, 16, ours.config.vocab_size)
    assert_close(actual[key], expected[key], **TIGHT)


@pytest.mark.parametrize("model_class", [HfBertForPreTraining, HfBertForMaskedLM], ids=lambda c: c.__name__)
def test_masked_rows_logits_are_the_dense_logits_at_masked_positions(model_class):
    reference, ours = twins(model_class)
    batch = padded_batch()
    labels = labels_for(model_class, batch)
    with torch.no_grad():
        expected = reference(**batch, **labels)
        actual = ours(**batch, **labels, mlm_masked_rows_only=True)
    key = "prediction_logits" if model_class is HfBertForPreTraining else "logits"
    masked = labels["labels"] != -100
    assert actual[key].shape == (int(masked.sum()), ours.config.vocab_size)
    assert_close(actual[key], expected[key][masked], **TIGHT)
    if model_class is HfBertForMaskedLM:
        assert_close(actual.loss, expected.loss, **TIGHT)


def test_weights_copy_back_into_transformers_unchanged():
    reference, ours = twins(HfBertForPreTraining)
    back = twin_of(HfBertForPreTraining)(bert_config(ours.config))
    back.load_state_dict(ours.state_dict(), strict=True)
    for name, tensor in reference.state_dict().items():
        assert torch.equal(back.state_dict()[name], tensor), name


def test_masked_rows_head_gives_the_dense_loss_and_gradients():
    _, sparse = twins(HfBertForPreTraining)
    _, dense = twins(HfBertForPreTraining)
    dense.load_state_dict(sparse.state_dict())
    batch = padded_batch()
    labels = labels_for(HfBertForPreTraining, batch)
    sparse_out, dense_out = sparse(**batch, **labels, mlm_masked_rows_only=True), dense(**batch, **labels)
    assert dense_out.prediction_logits.shape == (3, 16, 1000)
    assert_close(sparse_out.loss, dense_out.loss, atol=1e-6, rtol=1e-6)
    sparse_out.loss.backward()
    dense_out.loss.backward()
    dense_grads = dict(dense.named_parameters())
    for name, parameter in sparse.named_parameters():
        assert_close(parameter.grad, dense_grads[name].grad, atol=1e-6, rtol=1e-6, msg=name)


def test_pretraining_loss_is_the_part_whose_labels_are_given():
    _, model = twins(HfBertForPreTraining)
    batch = padded_batch()
    labels = labels_for(HfBertForPreTraining, batch)
    both = model(**batch, **labels)
    mlm_only = model(**batch, labels=labels["labels"])
    nsp_only = model(**batch, next_sentence_label=labels["next_sentence_label"])
    assert_close(both.loss, both.mlm_loss + both.nsp_loss)
    assert_close(mlm_only.loss, both.mlm_loss)
    assert_close(nsp_only.loss, both.nsp_loss)
    assert model(**batch).loss is None


def labelled_items(labels: dict[str, torch.Tensor]) -> int:
    """What transformers' Trainer counts for num_items_in_batch: `labels` != -100 (QA has no `labels`: rows)."""
    counted = labels.get("labels", labels.get("start_positions"))
    return int((counted != -100).sum())


@pytest.mark.parametrize("model_class", LOSS_HEADS, ids=lambda c: c.__name__)
def test_a_loss_given_num_items_in_batch_is_its_sum_over_that_count(model_class):
    """Its own count gives transformers' mean; twice it (this batch half of an accumulation), half the loss."""
    _, ours = twins(model_class)
    batch = padded_batch()
    labels = labels_for(model_class, batch)
    mean = ours(**batch, **labels).loss
    count = labelled_items(labels)
    assert_close(ours(**batch, **labels, num_items_in_batch=torch.tensor(count)).loss, mean, **TIGHT)
    assert_close(ours(**batch, **labels, num_items_in_batch=2 * count).loss, mean / 2, **TIGHT)


@pytest.mark.parametrize("problem_type", ["regression", "multi_label_classification"])
def test_sequence_classification_takes_num_items_in_batch_in_every_problem_type(problem_type):
    num_labels = 1 if problem_type == "regression" else 3
    model = HfBertForSequenceClassification(tiny_config(num_labels=num_labels, problem_type=problem_type)).eval()
    batch = padded_batch()
    labels = torch.tensor([[0.0, 1.0, 1.0], [1.0, 0.0, 0.0], [0.0, 0.0, 1.0]])[:, :num_labels].squeeze(-1)
    mean = model(**batch, labels=labels).loss
    count = labels.numel()  # Trainer's count: every float label, a row's num_labels of them for multi-label
    assert_close(model(**batch, labels=labels, num_items_in_batch=2 * count).loss, mean / 2, **TIGHT)


@pytest.mark.parametrize("path", ["dense head", "masked rows", "static slots"])
def test_pretraining_nsp_under_num_items_in_batch_is_weighted_by_this_batchs_share_of_the_masked_tokens(path):
    """Trainer's count is MLM's masked tokens; NSP's rows normalise exactly only when every micro-batch has the
    same masked tokens per row (docs/model.md). A batch with nothing masked adds no NSP loss then."""
    _, model = twins(HfBertForPreTraining)
    batch = padded_batch()
    labels = labels_for(HfBertForPreTraining, batch)
    inputs = {**batch, **labels}
    if path == "static slots":
        positions, slot_labels, input_ids = masked_positions_from_labels(labels["labels"], 4, batch["input_ids"])
        inputs.update(input_ids=input_ids, labels=slot_labels, masked_positions=positions)
    options = {"mlm_masked_rows_only": path == "masked rows"}
    mean = model(**inputs, **options)
    masked = labelled_items(labels)  # 4 in 3 rows
    given = model(**inputs, **options, num_items_in_batch=torch.tensor(10))
    assert_close(given.mlm_loss, mean.mlm_loss * masked / 10, **TIGHT)
    assert_close(given.nsp_loss, mean.nsp_loss * masked / 10, **TIGHT)
    nothing_masked = {**inputs, "labels": torch.full_like(inputs["labels"], -100)}
    empty = model(**nothing_masked, **options, num_items_in_batch=torch.tensor(10))
    assert empty.nsp_loss == 0 and empty.mlm_loss == 0


# ------------------------------------------------------------------------------------------- save / load


def test_save_load_round_trip_twice(tmp_path):
    _, model = twins(HfBertForPreTraining)
    batch = padded_batch()
    with torch.no_grad():
        expected = model(**batch).prediction_logits
    current = model
    for round_trip in range(2):
        folder = tmp_path / f"round-{round_trip}"
        current.save_pretrained(folder)
        assert (folder / "model.safetensors").exists()
        current, info = HfBertForPreTraining.from_pretrained(folder, output_loading_info=True)
        assert not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"]
        embeddings = current.bert.embeddings.word_embeddings.weight
        assert current.cls.predictions.decoder.weight.data_ptr() == embeddings.data_ptr()
        assert current.cls.predictions.decoder.bias.data_ptr() == current.cls.predictions.bias.data_ptr()
        with torch.no_grad():
            assert_close(current.eval()(**batch).prediction_logits, expected, **TIGHT)


def test_saved_folder_loads_through_every_auto_class(tmp_path):
    _, model = twins(HfBertForPreTraining)
    model.save_pretrained(tmp_path)
    assert {"configuration_hfbert.py", "modeling_hfbert.py"} <= {p.name for p in tmp_path.iterdir()}
    config = transformers.AutoConfig.from_pretrained(tmp_path)
    assert set(config.auto_map) >= {
        "AutoConfig",
        "AutoModel",
        "AutoModelForMaskedLM",
        "AutoModelForPreTraining",
    }
    assert type(AutoModel.from_pretrained(tmp_path)) is HfBertModel
    assert type(AutoModelForMaskedLM.from_pretrained(tmp_path)) is HfBertForMaskedLM
    assert type(AutoModelForPreTraining.from_pretrained(tmp_path)) is HfBertForPreTraining


@pytest.mark.slow
def test_fresh_process_loads_with_trust_remote_code_without_hfbert(tmp_path):
    _, model = twins(HfBertForPreTraining)
    model.save_pretrained(tmp_path)
    batch = padded_batch()
    with torch.no_grad():
        expected = model(**batch).prediction_logits
    torch.save({"batch": batch, "expected": expected}, tmp_path / "expected.pt")
    script = textwrap.dedent(
        f"""
        import sys

        class BlockHfbert:  # hfbert must not be importable: only the code copied into the folder may run
            def find_spec(self, name, path=None, target=None):
                if name.split(".")[0] == "hfbert":
                    raise ModuleNotFoundError(name)

        sys.meta_path.insert(0, BlockHfbert())
        try:
            import hfbert
            sys.exit("hfbert was importable")
        except ModuleNotFoundError:
            pass
        import torch
        from transformers import AutoModel, AutoModelForMaskedLM, AutoModelForPreTraining

        data = torch.load({str(tmp_path / "expected.pt")!r})
        for auto_class in (AutoModel, AutoModelForMaskedLM):
            auto_class.from_pretrained({str(tmp_path)!r}, trust_remote_code=True)
        model = AutoModelForPreTraining.from_pretrained({str(tmp_path)!r}, trust_remote_code=True).eval()
        assert "transformers_modules" in type(model).__module__, type(model).__module__
        with torch.no_grad():
            torch.testing.assert_close(model(**data["batch"]).prediction_logits, data["expected"])
        print("ok")
        """
    )
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=tmp_path)
    assert result.returncode == 0 and result.stdout.strip().endswith("ok"), result.stderr[-3000:]


def test_resize_token_embeddings_keeps_the_tie():
    _, model = twins(HfBertForPreTraining)
    model.resize_token_embeddings(1010)
    embeddings = model.bert.embeddings.word_embeddings.weight
    assert embeddings.shape == (1010, 32) and model.config.vocab_size == 1010
    assert model.cls.predictions.decoder.weight is embeddings
    assert model.cls.predictions.decoder.bias is model.cls.predictions.bias
    assert model.cls.predictions.bias.shape == (1010,)
    batch = padded_batch(vocab_size=1010)
    assert model(**batch).prediction_logits.shape == (3, 16, 1010)


def offload_maps(model: torch.nn.Module) -> dict[str, dict]:
    """from_pretrained arguments putting part (explicit map) or all (tiny max_memory) of `model` on disk."""
    prefix = "bert." if hasattr(model, "bert") else ""
    explicit = {f"{prefix}embeddings": "cpu", f"{prefix}encoder": "disk", f"{prefix}pooler": "cpu"}
    if prefix:  # the heads
        explicit.update({name: "cpu" for name, _ in model.named_children() if name != "bert"})
    return {
        "explicit cpu+disk": {"device_map": explicit},
        "auto, all on disk": {"device_map": "auto", "max_memory": {"cpu": 1000}},
    }


@pytest.mark.parametrize(
    "model_class",
    [HfBertModel, HfBertForPreTraining, HfBertForSequenceClassification],
    ids=lambda cls: cls.__name__,
)
@pytest.mark.parametrize("map_name", ["explicit cpu+disk", "auto, all on disk"])
@pytest.mark.parametrize("with_token_types", [True, False], ids=["token_type_ids", "no_token_type_ids"])
def test_disk_offload_gives_the_outputs_of_the_loaded_model(
    tmp_path, model_class, map_name, with_token_types
):
    # Without token_type_ids the embeddings once read token_type_embeddings.weight[0] directly, which under
    # offload is a meta tensor (only the module's own hook loads it): "Tensor on device meta".
    model = model_class(tiny_config()).eval()
    model.save_pretrained(tmp_path / "model")
    batch = padded_batch()
    if not with_token_types:
        del batch["token_type_ids"]
    kwargs = offload_maps(model)[map_name]
    offloaded = model_class.from_pretrained(tmp_path / "model", offload_folder=tmp_path / "offload", **kwargs)
    assert "disk" in offloaded.hf_device_map.values()
    with torch.no_grad():
        expected, got = model(**batch), offloaded(**batch)
    assert_close(got.to_tuple(), expected.to_tuple(), **TIGHT)


# ------------------------------------------------------------------------------------------- behaviour


def test_eager_and_sdpa_agree_in_fp32_and_bf16():
    """The attention weights are scaled up 3x: at the initial std of 0.02 attention is nearly uniform and
    moves the logits too little for a wrong attention (padding attended in bf16: 0.005) to stand out from
    bf16 rounding (0.002). Scaled, the two backends differ by 0.003 in bf16 and that bug by 0.03."""
    _, sdpa = twins(HfBertForPreTraining, attn_implementation="sdpa")
    with torch.no_grad():
        for name, parameter in sdpa.named_parameters():
            if ".attention." in name and "LayerNorm" not in name and name.endswith(".weight"):
                parameter.mul_(3.0)
    eager = HfBertForPreTraining(tiny_config(attn_implementation="eager")).eval()
    eager.load_state_dict(sdpa.state_dict())
    batch = padded_batch()
    with torch.no_grad():
        assert_close(eager(**batch).prediction_logits, sdpa(**batch).prediction_logits, **TIGHT)
        eager, sdpa = eager.to(torch.bfloat16), sdpa.to(torch.bfloat16)
        assert_close(
            eager(**batch).prediction_logits.float(),
            sdpa(**batch).prediction_logits.float(),
            atol=0.01,
            rtol=0.01,
        )


def test_a_row_alone_equals_the_row_inside_a_padded_batch():
    _, model = twins(HfBertModel)
    batch = padded_batch()
    with torch.no_grad():
        in_batch = model(**batch).last_hidden_state[2, :5]
        alone = model(**{key: value[2:3, :5] for key, value in batch.items()}).last_hidden_state[0]
    assert_close(alone, in_batch, **TIGHT)


def test_eval_is_deterministic_and_dropout_is_active_in_training():
    _, model = twins(HfBertForPreTraining)
    batch = padded_batch()
    with torch.no_grad():
        assert torch.equal(model(**batch).prediction_logits, model(**batch).prediction_logits)
        model.train()
        assert not torch.equal(model(**batch).prediction_logits, model(**batch).prediction_logits)


def test_every_parameter_receives_a_gradient_from_the_pretraining_loss():
    _, model = twins(HfBertForPreTraining)
    batch = padded_batch()
    model(**batch, **labels_for(HfBertForPreTraining, batch)).loss.backward()
    no_gradient = [
        name for name, p in model.named_parameters() if p.grad is None or not p.grad.abs().sum() > 0
    ]
    assert no_gradient == []


def test_gradient_checkpointing_gives_the_same_gradients():
    _, plain = twins(HfBertForPreTraining, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    checkpointed = HfBertForPreTraining(plain.config)
    checkpointed.load_state_dict(plain.state_dict())
    checkpointed.activation_checkpointing_enable()
    assert checkpointed.is_activation_checkpointing
    batch = padded_batch()
    labels = labels_for(HfBertForPreTraining, batch)
    for model in (plain.train(), checkpointed.train()):
        model(**batch, **labels).loss.backward()
    plain_grads = dict(plain.named_parameters())
    for name, parameter in checkpointed.named_parameters():
        assert_close(parameter.grad, plain_grads[name].grad, **TIGHT, msg=name)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_precision_with_padding_and_an_all_padding_row_gives_no_nan(dtype):
    _, model = twins(HfBertForPreTraining)
    model = model.to(dtype)
    batch = padded_batch()
    batch["attention_mask"][1] = 0
    with torch.no_grad():
        output = model(**batch, output_hidden_states=True)
    for tensor in (output.prediction_logits, output.seq_relationship_logits, *output.hidden_states):
        assert torch.isfinite(tensor).all()


def test_output_attentions_on_sdpa_runs_eager_for_that_call_with_a_warning():
    _, model = twins(HfBertModel, attn_implementation="sdpa")
    eager = HfBertModel(tiny_config(attn_implementation="eager")).eval()
    eager.load_state_dict(model.state_dict())
    batch = padded_batch()
    logging.warning_once.cache_clear()
    with torch.no_grad(), CaptureLogger(modeling_hfbert.logger) as captured:
        fallback = model(**batch, output_attentions=True)
        expected = eager(**batch, output_attentions=True)
    assert "run eager attention" in captured.out
    assert model.config._attn_implementation == "sdpa"  # for this call only
    assert len(fallback.attentions) == 2 and fallback.attentions[0].shape == (3, 4, 16, 16)
    for actual, wanted in zip(fallback.attentions, expected.attentions, strict=True):
        assert_close(actual, wanted, **TIGHT)
    assert_close(fallback.last_hidden_state, expected.last_hidden_state, **TIGHT)
    model.set_attn_implementation("eager")
    assert model(**batch, output_attentions=True).attentions[1].shape == (3, 4, 16, 16)


def test_attention_goes_through_transformers_attention_interface():
    from transformers import AttentionInterface, AttentionMaskInterface
    from transformers.integrations.sdpa_attention import sdpa_attention_forward
    from transformers.masking_utils import sdpa_mask

    calls = []

    def counting_sdpa(module, query, key, value, attention_mask, **kwargs):
        calls.append(tuple(query.shape))
        return sdpa_attention_forward(module, query, key, value, attention_mask, **kwargs)

    AttentionInterface.register("hfbert_test_sdpa", counting_sdpa)
    AttentionMaskInterface.register("hfbert_test_sdpa", sdpa_mask)
    _, reference = twins(HfBertForPreTraining, attn_implementation="sdpa")
    custom = HfBertForPreTraining(copy.deepcopy(reference.config)).eval()
    custom.load_state_dict(reference.state_dict())
    custom.set_attn_implementation("hfbert_test_sdpa")
    batch = padded_batch()
    labels = labels_for(HfBertForPreTraining, batch)
    with torch.no_grad():
        expected = reference(**batch, **labels, mlm_masked_rows_only=True)
        actual = custom(**batch, **labels, mlm_masked_rows_only=True)
    # Both layers ran through it, at every position: the last-layer row subset is for eager and sdpa only.
    assert calls == [(3, 4, 16, 8), (3, 4, 16, 8)]
    for key in ("loss", "prediction_logits", "seq_relationship_logits"):
        assert_close(actual[key], expected[key], **TIGHT, msg=key)


def test_return_dict_false_gives_a_tuple():
    _, model = twins(HfBertForPreTraining)
    batch = padded_batch()
    with torch.no_grad():
        as_tuple = model(**batch, return_dict=False)
        as_output = model(**batch)
    assert isinstance(as_tuple, tuple)
    assert torch.equal(as_tuple[0], as_output.prediction_logits)


# ------------------------------------------------------------------------------------------- bad input


def bad_input_cases() -> list[tuple[str, dict, str]]:
    batch = padded_batch()
    too_large = batch["input_ids"].clone()
    too_large[0, 3] = 1000
    negative = batch["input_ids"].clone()
    negative[1, 0] = -1
    bad_types = batch["token_type_ids"].clone()
    bad_types[0, 0] = 2
    return [
        (
            "id >= vocab_size",
            {**batch, "input_ids": too_large},
            r"input_ids contains 1000, outside \[0, vocab_size=1000\)",
        ),
        ("negative id", {**batch, "input_ids": negative}, r"input_ids contains -1"),
        (
            "too long",
            {"input_ids": torch.ones(1, 129, dtype=torch.long)},
            r"Sequence length 129 exceeds max_position_embeddings=128",
        ),
        (
            "token type >= type_vocab_size",
            {**batch, "token_type_ids": bad_types},
            r"token_type_ids contains 2",
        ),
        (
            "mask shape",
            {**batch, "attention_mask": batch["attention_mask"][:, :8]},
            r"attention_mask has shape \(3, 8\)",
        ),
        (
            "type shape",
            {**batch, "token_type_ids": batch["token_type_ids"][:2]},
            r"token_type_ids has shape \(2, 16\)",
        ),
        ("1-D ids", {"input_ids": batch["input_ids"][0]}, r"shape \(batch, seq_len\)"),
        (
            "masked position >= seq_len",
            {**batch, "masked_positions": torch.tensor([[1], [2], [16]]), "labels": torch.ones(3, 1).long()},
            r"masked_positions contains 16, outside \[0, seq_len=16\)",
        ),
        (
            "static labels shape",
            {**batch, "masked_positions": torch.ones(3, 2).long(), "labels": torch.ones(3, 16).long()},
            r"labels must have the same shape",
        ),
        ("no ids", {"attention_mask": batch["attention_mask"]}, r"exactly one of input_ids or inputs_embeds"),
    ]


@pytest.mark.parametrize(
    ("case", "inputs", "message"), bad_input_cases(), ids=[c[0] for c in bad_input_cases()]
)
def test_bad_input_raises_a_clear_error(case, inputs, message):
    _, model = twins(HfBertForPreTraining)
    with pytest.raises(ValueError, match=message):
        model(**inputs)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_forward_does_not_synchronise():
    _, model = twins(HfBertForPreTraining)
    model = model.cuda()
    batch = {key: value.cuda() for key, value in padded_batch().items()}
    labels = torch.full_like(batch["input_ids"], -100)
    labels[:, 3] = 7
    positions, masked_labels, _ = masked_positions_from_labels(labels, 4)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")  # any host synchronisation raises
    try:
        model(**batch).prediction_logits.sum()
        model(**batch, masked_positions=positions, labels=masked_labels).loss.backward()
    finally:
        torch.cuda.set_sync_debug_mode("default")


# A device-side assert poisons the CUDA context of the process for good: every later CUDA call in it fails. So
# the bad ids go to a child process, and this pytest worker's context stays usable for the tests after it.
BAD_IDS_ON_CUDA = textwrap.dedent(
    """
    import sys
    import torch
    sys.path[:0] = sys.argv[1:3]  # tests/ (for conftest) and the repository (for hfbert)
    from conftest import tiny_config
    from hfbert import HfBertForPreTraining

    model = HfBertForPreTraining(tiny_config()).cuda().eval()
    ids = torch.full((2, 8), 5, device="cuda")
    ids[0, 0] = 1000  # vocab_size is 1000
    try:
        model(input_ids=ids)
        torch.cuda.synchronize()
    except RuntimeError as error:
        print(f"RuntimeError: {error}")
        sys.exit(3)
    print("no error")
    """
)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_bad_ids_on_cuda_fail_with_the_range_message():
    tests_folder = Path(__file__).parent
    command = [sys.executable, "-c", BAD_IDS_ON_CUDA, str(tests_folder), str(tests_folder.parent)]
    result = subprocess.run(command, capture_output=True, text=True, timeout=300)
    output = result.stdout + result.stderr
    assert result.returncode == 3, output[-3000:]
    # The RuntimeError names the device-side assert (check_range's torch._assert_async or the lookup's own).
    assert "device-side assert" in output, output[-3000:]
    assert torch.zeros(1, device="cuda").add(1).item() == 1  # this process's context is still healthy


def test_old_config_with_mlm_masked_rows_only_loads_quietly_and_drops_it(tmp_path):
    model = HfBertForPreTraining(tiny_config())
    model.save_pretrained(tmp_path)
    config_file = tmp_path / "config.json"
    saved = json.loads(config_file.read_text())
    assert "mlm_masked_rows_only" not in saved
    config_file.write_text(json.dumps({**saved, "mlm_masked_rows_only": True}))
    logging.warning_once.cache_clear()
    with CaptureLogger(logging.get_logger("transformers")) as captured:
        loaded = HfBertForPreTraining.from_pretrained(tmp_path)
    assert captured.out == ""
    assert not hasattr(loaded.config, "mlm_masked_rows_only")
    assert "mlm_masked_rows_only" not in loaded.config.to_dict()
    batch = padded_batch()
    labels = labels_for(HfBertForPreTraining, batch)
    assert loaded(**batch, **labels).prediction_logits.shape == (3, 16, 1000)  # dense, as in transformers


def test_import_registers_every_auto_class():
    config = tiny_config()
    assert type(transformers.AutoConfig.for_model("hfbert")) is HfBertConfig
    for auto_class, model_class in hfbert._AUTO_CLASSES.items():
        assert type(auto_class.from_config(config)) is model_class
