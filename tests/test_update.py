"""The update (`hfbert.pretraining.training.Training.step`): it never reads a tensor back to the host (on a GPU that
waits for the device), the fp16 loss scaler included; compiled, it is one graph and gives eager's results."""

from contextlib import contextmanager
from types import SimpleNamespace

import pytest
import torch
from accelerate import Accelerator
from accelerate.optimizer import AcceleratedOptimizer
from accelerate.state import AcceleratorState, GradientState
from conftest import tiny_config
from test_collator import built_loaders
from test_speed_paths import pretraining_batch, static_batch
from torch.testing import assert_close

from hfbert import HfBertForPreTraining, modeling_hfbert
from hfbert.pretraining.callbacks import Callbacks
from hfbert.pretraining.cli import parse_args
from hfbert.pretraining.settings import DataSettings, OptimizationSettings
from hfbert.pretraining.training import LearningRateSchedule, Training, build_optimizer, compile_model

HOST_READS = ("item", "tolist", "cpu", "numpy", "__bool__", "__int__", "__float__")


@contextmanager
def host_reads_raise():
    """Every way Python reads a tensor's value back to the host raises (on a GPU each waits for the device)."""
    originals = {name: getattr(torch.Tensor, name) for name in HOST_READS}

    def refuse(name):
        def read(*args, **kwargs):
            raise AssertionError(f"Tensor.{name} inside an update: a host synchronisation on a GPU")

        return read

    try:
        for name in HOST_READS:
            setattr(torch.Tensor, name, refuse(name))
        yield
    finally:
        for name, original in originals.items():
            setattr(torch.Tensor, name, original)


@pytest.fixture
def accelerator():
    yield Accelerator(cpu=True)
    AcceleratorState._reset_state(reset_partial_state=True)
    GradientState._reset_state()


def training_of(accelerator: Accelerator, model, optimizer, optimization: OptimizationSettings) -> Training:
    """The training of a prepared `model` and `optimizer`, at the optimizer's own rate (a constant schedule), of
    batches whose epoch has no end."""
    schedule = LearningRateSchedule(optimizer.param_groups[0]["lr"], 0, "constant")
    batches = SimpleNamespace(batches_per_process=None)
    return Training(accelerator, model, optimizer, batches, None, schedule, optimization, None, None)


def prepared_training(accelerator: Accelerator, optimization: OptimizationSettings) -> Training:
    """The tiny model (no dropout: eager and compiled draw no masks alike), its optimizer, prepared; compiled
    as `setup_training` compiles it where `optimization` says."""
    torch.manual_seed(0)
    model = HfBertForPreTraining(tiny_config(hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0))
    if optimization.compiles_update(accelerator.device.type):
        compile_model(model, optimization.torch_compile_mode)
    optimizer = build_optimizer(model, optimization, accelerator.device)
    return training_of(accelerator, *accelerator.prepare(model, optimizer), optimization)


def with_loss_scaler(accelerator: Accelerator, training: Training, monkeypatch) -> torch.amp.GradScaler:
    """What accelerate sets up for fp16 on CUDA (it makes no scaler on a CPU), on the CPU."""
    scaler = torch.amp.GradScaler("cpu")
    monkeypatch.setattr(accelerator, "scaler", scaler)
    monkeypatch.setattr(accelerator, "native_amp", True)
    monkeypatch.setattr(type(accelerator), "mixed_precision", "fp16")
    training.optimizer = AcceleratedOptimizer(training.optimizer.optimizer, device_placement=False, scaler=scaler)
    return scaler


@pytest.mark.parametrize(
    ("compiled", "loss_scaler"),
    [(False, False), (False, True), pytest.param(True, True, marks=pytest.mark.slow)],
    ids=["eager fp32", "eager fp16 loss scaler", "compiled fp16 loss scaler"],
)
def test_an_update_never_reads_a_tensor_back_to_the_host(accelerator, monkeypatch, loss_scaler, compiled):
    torch._dynamo.reset()
    optimization = OptimizationSettings(max_grad_norm=1.0, torch_compile=compiled)
    training = prepared_training(accelerator, optimization)
    scaler = with_loss_scaler(accelerator, training, monkeypatch) if loss_scaler else None
    # The model's input checks read CPU tensors on purpose (nothing to wait for); on CUDA they assert on the
    # device instead (the GPU test in test_training.py runs them).
    monkeypatch.setattr(modeling_hfbert, "check_range", lambda *args: None)
    batch = static_batch(pretraining_batch())
    training.step(batch, Callbacks().loss)  # compiles: tracing may read values
    before = training.model.bert.embeddings.word_embeddings.weight.detach().clone()
    with host_reads_raise():
        for _ in range(2):
            training.step(batch, Callbacks().loss)
    interval = training.interval
    assert not torch.equal(training.model.bert.embeddings.word_embeddings.weight, before)  # the updates ran
    assert interval.batches == 3 and interval.clipped_updates == 3 and interval.grad_norm.item() > 0
    if loss_scaler:  # the scaler scaled the loss and let every (finite) update through
        assert scaler._scale is not None
        assert all(s["step"].item() == 3 for s in training.optimizer.optimizer.state.values())


def gradients_then_updates(training: Training, batch, updates: int):
    """The gradients of one backward, then the losses and the largest gradient norm of `updates` updates and
    the weights after them."""
    outputs = training.model(**batch, mlm_masked_rows_only=True, attention_padding="mask")  # as the step calls it
    (outputs.mlm_loss + outputs.nsp_loss).backward()
    gradients = {name: p.grad.clone() for name, p in training.model.named_parameters()}
    training.optimizer.zero_grad(set_to_none=True)
    losses = [training.step(batch, Callbacks().loss)[1].detach() for _ in range(updates)]
    weights = {name: p.detach().clone() for name, p in training.model.named_parameters()}
    return gradients, torch.stack(losses), training.interval.grad_norm, weights


@pytest.mark.slow
def test_the_compiled_update_is_one_graph_per_part_and_gives_eagers_gradients_losses_and_weights(accelerator):
    """Float32 on a CPU: inductor sums in other orders, so the results agree to rounding, 1e-5."""
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()
    batch = static_batch(pretraining_batch())
    runs = {}
    for compiled in (False, True):
        optimization = OptimizationSettings(learning_rate=1e-3, max_grad_norm=0.5, torch_compile=compiled)
        training = prepared_training(accelerator, optimization)
        runs[compiled] = gradients_then_updates(training, batch, 3)
    assert not counters["graph_break"], dict(counters["graph_break"])
    assert counters["stats"]["unique_graphs"] == 2, dict(counters["stats"])  # the model's and the clipping's
    (eager_gradients, *eager), (gradients, *compiled) = runs[False], runs[True]
    for name, gradient in gradients.items():
        assert_close(gradient, eager_gradients[name], atol=1e-5, rtol=1e-4, msg=name)
    eager_losses, eager_norm, eager_weights = eager
    losses, norm, weights = compiled
    assert_close(losses, eager_losses, atol=1e-5, rtol=1e-5)
    assert_close(norm, eager_norm, atol=1e-5, rtol=1e-5)
    assert eager_norm > 0.5  # clipping clipped
    for name, weight in weights.items():
        assert_close(weight, eager_weights[name], atol=1e-5, rtol=1e-5, msg=name)


def test_a_graph_break_in_the_model_fails_the_compiled_update(accelerator, monkeypatch):
    torch._dynamo.reset()
    check_inputs = modeling_hfbert.check_inputs

    def breaking(*args, **kwargs):
        torch._dynamo.graph_break()
        return check_inputs(*args, **kwargs)

    monkeypatch.setattr(modeling_hfbert, "check_inputs", breaking)
    optimization = OptimizationSettings(torch_compile=True)
    training = prepared_training(accelerator, optimization)
    with pytest.raises(torch._dynamo.exc.Unsupported, match="graph_break"):
        training.step(static_batch(pretraining_batch()), Callbacks().loss)


@pytest.mark.parametrize(
    ("flags", "on_cuda", "on_cpu"),
    [
        ([], True, False),
        (["--torch_compile"], True, True),
        (["--torch_compile", "false"], False, False),
        (["--deterministic"], False, False),  # bit-equal resumes are tested eager
        (["--deterministic", "--torch_compile"], True, True),
        (["--cls_attention_spread", "0.1"], False, False),  # its hooks
    ],
)
def test_the_update_compiles_by_default_on_cuda_and_as_the_flag_says(
    flags, on_cuda, on_cpu, sample_tokenizer
):
    optimization = parse_args(["--output_dir", "unused", *flags]).optimization
    assert (optimization.compiles_update("cuda"), optimization.compiles_update("cpu")) == (on_cuda, on_cpu)
    data = DataSettings()
    batches, _ = built_loaders(sample_tokenizer, data, optimization, "cuda")  # a device object, no GPU needed
    assert (batches.loader.collate_fn.pad_to_length == data.max_seq_length) == on_cuda


def micro_batch(masked_per_row: int, seed: int) -> dict[str, torch.Tensor]:
    """Two unpadded rows of 16 tokens with `masked_per_row` MLM labels each."""
    input_ids = torch.randint(5, 1000, (2, 16), generator=torch.Generator().manual_seed(seed))
    labels = torch.full_like(input_ids, -100)
    labels[:, 1 : 1 + masked_per_row] = input_ids[:, 1 : 1 + masked_per_row]
    return {
        "input_ids": input_ids,
        "attention_mask": torch.ones_like(input_ids),
        "token_type_ids": (torch.arange(16) >= 8).long().expand(2, -1).clone(),
        "labels": labels,
        "next_sentence_label": torch.tensor([0, 1]),
    }


def test_an_accumulated_update_weighs_each_micro_batchs_own_mean_equally_whatever_its_masked_tokens():
    """hfbert's own loop: each micro-batch's loss (its own means over its masked tokens and rows) is divided by
    the accumulation steps, as accelerate divides it, so with 1 and 8 masked tokens a row the update is the mean
    of the two micro-batches' means, not the mean over all their masked tokens that one batch of the 4 rows
    gives."""
    accelerator = Accelerator(cpu=True)
    optimization = OptimizationSettings(max_grad_norm=0.0, gradient_accumulation_steps=2)
    torch.manual_seed(0)
    model = HfBertForPreTraining(tiny_config(hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0))
    start = {name: p.detach().clone() for name, p in model.named_parameters()}
    micro_batches = [micro_batch(1, seed=1), micro_batch(8, seed=2)]

    def sgd_update(loss: torch.Tensor) -> dict[str, torch.Tensor]:
        gradients = dict(zip(start, torch.autograd.grad(loss, list(model.parameters())), strict=True))
        return {name: weight - gradients[name] for name, weight in start.items()}

    outputs = [model(**batch, mlm_masked_rows_only=True) for batch in micro_batches]
    mean_of_means = sgd_update(sum(out.mlm_loss + out.nsp_loss for out in outputs) / 2)
    one_batch = {key: torch.cat([batch[key] for batch in micro_batches]) for key in micro_batches[0]}
    pooled = model(**one_batch, mlm_masked_rows_only=True)
    pooled_update = sgd_update(pooled.mlm_loss + pooled.nsp_loss)

    prepared, optimizer = accelerator.prepare(model, torch.optim.SGD(model.parameters(), lr=1.0))
    training = training_of(accelerator, prepared, optimizer, optimization)
    for batch in micro_batches:
        training.step(batch, Callbacks().loss)
    for name, weight in model.named_parameters():
        assert_close(weight, mean_of_means[name], atol=1e-6, rtol=1e-5, msg=name)
    assert not torch.allclose(model.cls.predictions.bias, pooled_update["cls.predictions.bias"], atol=1e-2)
