"""--dry_run: every check that runs before work, the refusals of the data stage met in memory, then the run's
plan printed, and nothing written.

What the plan counts before the data stage has run is estimated from the corpus's size in bytes, with ratios
measured on the shipped WikiText sample (each named below); a Hub corpus's size is unknown until it is
downloaded, and the plan says so rather than guess.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import datasets
import torch
from accelerate import Accelerator
from fsspec.compression import compr
from fsspec.utils import infer_compression
from transformers import PreTrainedTokenizerBase

from hfbert.checkpointing import tokenizer_folder
from hfbert.configuration_hfbert import HfBertConfig
from hfbert.corpus import stream_documents
from hfbert.corpus_arguments import is_file_collection, local_files
from hfbert.modeling_hfbert import HfBertForPreTraining
from hfbert.pretraining.batches import resolve_max_predictions
from hfbert.pretraining.data import (
    build_model_config,
    check_stream_validation_for_nsp,
    first_documents_with_text,
    load_run_tokenizer,
    split_needs,
    split_validation_documents,
    stream_validation_split,
)
from hfbert.pretraining.flops import flops_per_token
from hfbert.pretraining.instances import MIN_NSP_DOCUMENTS, check_documents_for_nsp, check_validation_for_mlm
from hfbert.pretraining.settings import DataSettings, PretrainingSettings, read_config_file
from hfbert.pretraining.source_model import SourceModel, source_run_config
from hfbert.pretraining.training import plan_budget
from hfbert.tokenization import load_tokenizer, model_config_for_tokenizer, train_tokenizer

# WordPiece tokens per byte of English WikiText (8,192 tokens, the shipped sample: 148,266 tokens in 687,982
# bytes); a larger vocabulary gives somewhat fewer.
TOKENS_PER_BYTE = 0.216
# An NSP instance holds this share of --max_seq_length on average (google's pairing, 10% shorter targets,
# documents' ends): the shipped sample's 1,424 instances a pass of 148,266 tokens at length 128.
INSTANCE_FILL = 0.81


@dataclass(frozen=True)
class MeasuredSpeed:
    """A process's optimizer updates per second where a results page measured them, and what it measured (the
    figures, the device, the commit and the page, which the plan prints)."""

    updates_per_second: float
    measured: str


def gpu_loop(tokens_per_second: int, device: str, commit: str, page: str) -> MeasuredSpeed:
    """bench_loop's BERT-base at length 128, batch 128, on the shipped sample (122.3 tokens an instance)."""
    return MeasuredSpeed(
        tokens_per_second / (128 * 122.3),
        f"{tokens_per_second:,} non-padding tokens/s of 122.3 an instance on an {device} at {commit}, {page}",
    )


def h200(tokens_per_second: int) -> MeasuredSpeed:
    return gpu_loop(tokens_per_second, "NVIDIA H200", "2422e49", "benchmarks/results/gpu_h200.md")


def h100(tokens_per_second: int) -> MeasuredSpeed:
    return gpu_loop(tokens_per_second, "NVIDIA H100", "4a0a8f0", "benchmarks/results/gpu_h100.md")


# Keyed by the device (`device_kind`), the model size, the per-device batch, the length and the update
# (`update_kind`): the README main job's CPU runs (tiny, the quick-start recipe) and the GPU reports' loops.
MEASURED_SPEEDS = {
    ("cpu, AVX2 only", "tiny", 16, 128, "fp32, eager"): MeasuredSpeed(
        6000 / 490, "6,000 updates in 490 s on a 2-core AMD EPYC at 27b5ed5, benchmarks/results/downstream.md"
    ),
    ("cpu, AVX-512", "tiny", 16, 128, "bf16, eager"): MeasuredSpeed(
        6000 / 288, "6,000 updates in 288 s on a 2-core Xeon at e097322, benchmarks/results/one_of_each.md"
    ),
    ("NVIDIA H200", "base", 128, 128, "fp16, compiled"): h200(385_725),
    ("NVIDIA H200", "base", 128, 128, "fp16, compiled, reduce-overhead"): h200(524_432),
    ("NVIDIA H200", "base", 128, 128, "fp16, eager"): h200(308_700),
    ("NVIDIA H200", "base", 128, 128, "fp16, eager, varlen"): h200(366_529),
    ("NVIDIA H200", "base", 128, 128, "bf16, eager"): h200(336_547),
    ("NVIDIA H200", "base", 128, 128, "fp16, eager, deterministic"): h200(232_027),
    ("NVIDIA H100 80GB HBM3", "base", 128, 128, "fp16, eager"): h100(376_420),
    ("NVIDIA H100 80GB HBM3", "base", 128, 128, "fp16, eager, deterministic"): h100(203_320),
}
ADAM_BYTES_PER_PARAMETER = 16  # fp32 weights, gradients and AdamW's two moments
# A compressed corpus file is decompressed this far to count its text; past it, its compression ratio so far
# estimates the rest (a second or so, whatever the file's size).
TEXT_SAMPLE_BYTES = 16_000_000


def text_bytes(path: Path) -> tuple[int, bool]:
    """The bytes of text in `path` and whether the count is exact: its size, or for a file that datasets
    decompresses (fsspec's compression by suffix, as the run reads it) the bytes it decompresses to, counted up to
    `TEXT_SAMPLE_BYTES` and beyond that estimated by the compression ratio so far."""
    compression = infer_compression(str(path))
    if compression is None:
        return path.stat().st_size, True
    decompressed = 0
    with open(path, "rb") as raw, compr[compression](raw, mode="rb") as text:
        while chunk := text.read(1 << 20):
            decompressed += len(chunk)
            if decompressed >= TEXT_SAMPLE_BYTES:  # raw.tell(): the compressed bytes read so far
                return round(decompressed * path.stat().st_size / raw.tell()), False
    return decompressed, True


def corpus_estimate(settings: PretrainingSettings) -> tuple[int | None, str]:
    """The training corpus's tokens, estimated from its bytes of text (None: a Hub corpus, unknown before
    download), and the plan's line of it (with its files when --train_file names a folder or a glob, and the
    compressed size where files are compressed)."""
    corpus = settings.corpus
    if corpus.dataset_name is not None and not Path(corpus.dataset_name).is_dir():
        return None, "a Hub dataset: its size is unknown until it is downloaded"
    if corpus.dataset_name is not None:  # a local folder laid out like a Hub dataset: every file counts
        files = [path for path in Path(corpus.dataset_name).rglob("*") if path.is_file()]
    else:
        files = local_files(corpus)["train"]
    counts = [text_bytes(path) for path in files]
    size = sum(count for count, _ in counts)
    tokens = round(size * TOKENS_PER_BYTE)
    text = f"{size_text(size)}, ~{tokens:,} tokens"
    compressed = sum(path.stat().st_size for path in files if infer_compression(str(path)))
    if compressed:
        estimated = not all(exact for _, exact in counts)
        how = f" (estimated from the first {size_text(TEXT_SAMPLE_BYTES)} of each file's text)" if estimated else ""
        text = f"{size_text(size)} of text in {size_text(compressed)} compressed{how}, ~{tokens:,} tokens"
        text = f"~{text}" if estimated else text
    if corpus.train_file and is_file_collection(corpus.train_file):  # a folder or a glob: its files counted
        text = f"{len(files):,} files, {text}"
    return tokens, text


def hub_corpus_config(settings: PretrainingSettings, source: SourceModel | None) -> HfBertConfig:
    """The config a run on a Hub corpus would build, which `rehearse_data_stage` does not read: the source's,
    --config_name's, or the preset's with --tokenizer_name's vocabulary (a tokenizer to train: --vocab_size's,
    which it may come out below)."""
    model = settings.model
    if source is not None:
        return source_run_config(source, model.dropout)
    if model.config_name is not None:
        return read_config_file(model.config_name)
    if settings.data.tokenizer_name is not None:
        return model_config_for_tokenizer(load_tokenizer(settings.data.tokenizer_name), model.model_size)
    return HfBertConfig.from_preset(model.model_size, vocab_size=settings.data.vocab_size)


def device_kind(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    # the vector instructions torch's CPU kernels run with on this machine
    return "cpu, AVX-512" if torch.backends.cpu.get_cpu_capability() == "AVX512" else "cpu, AVX2 only"


def update_kind(settings: PretrainingSettings, accelerator: Accelerator) -> str:
    """How the run's update runs, as MEASURED_SPEEDS names it: its precision, eager or compiled (and the mode),
    and the levers that change its speed."""
    optimization = settings.optimization
    compiled = optimization.compiles_update(accelerator.device.type)
    parts = [{"no": "fp32"}.get(accelerator.mixed_precision, accelerator.mixed_precision)]
    parts.append("compiled" if compiled else "eager")
    if compiled and optimization.torch_compile_mode != "default":
        parts.append(optimization.torch_compile_mode)
    if optimization.attention_padding == "varlen":
        parts.append("varlen")
    if optimization.deterministic:
        parts.append("deterministic")
    return ", ".join(parts)


def size_text(count: float) -> str:
    return f"{count / 1e9:.2f} GB" if count >= 1e8 else f"{count / 1e6:.1f} MB"


def plan_lines(
    settings: PretrainingSettings,
    accelerator: Accelerator,
    checkpoint: Path | None,
    source: SourceModel | None,
    config: HfBertConfig | None,
) -> list[str]:
    """What a run would do, counted before it does it: the --dry_run plan, a line each. `config`: the model's, as
    `rehearse_data_stage` built it (None for a Hub corpus)."""
    optimization = settings.optimization
    config = hub_corpus_config(settings, source) if config is None else config
    with torch.device("meta"):  # counts parameters without allocating them
        parameters = sum(p.numel() for p in HfBertForPreTraining(config).parameters())
    batch, processes = optimization.per_device_train_batch_size, accelerator.num_processes
    global_batch = batch * processes * optimization.gradient_accumulation_steps
    corpus_tokens, corpus = corpus_estimate(settings)
    peak = ADAM_BYTES_PER_PARAMETER * parameters + activation_bytes(config, batch, settings.data.max_seq_length)
    lines = [
        f"model: {config.num_hidden_layers} layers x {config.hidden_size}, vocabulary {config.vocab_size}: "
        f"{parameters / 1e6:.1f}M parameters",
        f"batch: {batch} x {processes} processes x {optimization.gradient_accumulation_steps} accumulation = "
        f"{global_batch} instances",
        f"corpus: {corpus}",
        *budget_lines(settings, accelerator, config, global_batch, corpus_tokens),
        f"peak memory: ~{size_text(peak)} a process (fp32 weights, gradients, AdamW and "
        "activations by Korthikanti et al. 2022's count)",
        f"each checkpoint: ~{size_text(12 * parameters)}; the final folder: ~{size_text(4 * parameters)}",
        data_stage_line(settings, corpus_tokens),
        f"resume: from {checkpoint}" if checkpoint is not None else "resume: none, a fresh start",
    ]
    return ["Plan (--dry_run: every check passed, nothing was written; ~ marks an estimate):"] + [
        f"  {line}" for line in lines
    ]


def budget_lines(
    settings: PretrainingSettings,
    accelerator: Accelerator,
    config: HfBertConfig,
    global_batch: int,
    corpus_tokens: int | None,
) -> list[str]:
    """The updates (--max_train_steps, or those of the epochs or of a time budget on a measured device), the
    tokens and passes they take, their compute and their time."""
    data, optimization = settings.data, settings.optimization
    instance_tokens = INSTANCE_FILL * data.max_seq_length
    device = device_kind(accelerator.device)
    shape = (settings.model.model_size, optimization.per_device_train_batch_size, data.max_seq_length)
    update = update_kind(settings, accelerator)
    speed = MEASURED_SPEEDS.get((device, *shape, update)) if accelerator.num_processes == 1 else None
    seconds = optimization.max_train_seconds
    if corpus_tokens is None and optimization.max_train_steps is None and seconds is None:
        return ["updates: those of the epochs, unknown until the Hub dataset is downloaded"]
    instances = None if corpus_tokens is None else data.dupe_factor * corpus_tokens / instance_tokens
    batches = None if instances is None else math.ceil(instances / optimization.per_device_train_batch_size)
    updates = plan_budget(optimization, batches, accelerator.num_processes).planned_train_steps  # the run's count
    if updates is None and speed is not None:
        updates = int(seconds * speed.updates_per_second)
    if updates is None:
        return [f"updates: as many as fit in {seconds:g} s (the step is not measured on this device)"]
    tokens_seen = updates * global_batch * instance_tokens
    lines = [f"updates: {updates:,}; ~{tokens_seen:,.0f} tokens seen"]
    if corpus_tokens:
        lines.append(f"passes over the corpus: ~{tokens_seen / corpus_tokens:.1f}")
    static_slots = resolve_max_predictions(data, optimization, accelerator.device)
    head_rows = data.mlm_probability * instance_tokens if static_slots is None else static_slots
    flops = flops_per_token(config, instance_tokens, head_rows) * tokens_seen
    lines.append(f"compute: ~{flops:.2e} FLOPs (the loop's own formula, forward and backward)")
    if speed is None:
        size, batch, length = shape
        lines.append(
            f"expected training time: not measured for {size}, batch {batch}, length {length}, {update}, "
            f"{accelerator.num_processes} process(es) on {device}"
        )
    else:
        rate = speed.updates_per_second
        lines.append(
            f"expected training time: ~{updates / rate / 60:.0f} min ({rate:.1f} updates/s, {update}: {speed.measured})"
        )
    return lines


def data_stage_line(settings: PretrainingSettings, corpus_tokens: int | None) -> str:
    if settings.corpus.streaming:
        return "data stage: the validation set only, in the datasets cache (--streaming)"
    if corpus_tokens is None:
        return "data stage: unknown (a Hub corpus)"
    # uint16 token ids, the sentence offsets beside them and the Arrow files' overhead: ~2.2 bytes a token
    return f"data stage: ~{size_text(2.2 * corpus_tokens)} in the datasets cache"


def activation_bytes(config: HfBertConfig, batch: int, length: int) -> float:
    """Activations kept for backward: per layer 34 s b h + 5 a s^2 b bytes at 16 bits (Korthikanti et al.
    2022, no recomputation), doubled for fp32."""
    per_layer = 34 * length * batch * config.hidden_size + 5 * config.num_attention_heads * length**2 * batch
    return 2 * per_layer * config.num_hidden_layers


def rehearse_data_stage(
    settings: PretrainingSettings,
    accelerator: Accelerator,
    checkpoint: Path | None,
    source: SourceModel | None,
) -> HfBertConfig | None:
    """The refusals the run's data stage (`hfbert.pretraining.data.prepare`) makes after
    `check_before_work`, made by the same functions on the streamed corpus, in memory: the tokenizer the run
    would use (one it would train, trained here: --vocab_size against the corpus's characters), the model
    config against it, and the documents with text each split needs (`rehearse_documents_with_text`). Returns
    that model config, the run's. A Hub corpus is checked by the run (None)."""
    corpus, data = settings.corpus, settings.data
    if corpus.dataset_name is not None and not Path(corpus.dataset_name).is_dir():
        return None
    documents = stream_documents(corpus) if corpus.streaming else streamed_splits(settings)
    resumes_tokenizer = checkpoint is not None and tokenizer_folder(checkpoint) is not None
    trains_tokenizer = data.tokenizer_name is None and source is None and not resumes_tokenizer
    if trains_tokenizer and not corpus.streaming:  # the run trains and saves one
        tokenizer = train_tokenizer(documents["train"], vocab_size=data.vocab_size, show_progress=False)
    else:  # no tokenizer to train (a stream never trains one): nothing is written
        output_dir = Path(settings.output.output_dir)
        tokenizer = load_run_tokenizer(data, output_dir, documents, accelerator, checkpoint, source)
    config = build_model_config(settings.model, tokenizer, source)
    rehearse_documents_with_text(documents, tokenizer, data, corpus.streaming)
    return config


def rehearse_documents_with_text(
    documents: datasets.IterableDatasetDict,
    tokenizer: PreTrainedTokenizerBase,
    data: DataSettings,
    streaming: bool,
) -> None:
    """The run's refusals of splits with too few documents with text after tokenizing, in the run's order: for
    NSP each split (a stream: its validation documents, `stream_validation_split`), for --objective mlm the
    validation split."""
    if streaming:
        stream, count = stream_validation_split(documents, data)
        validation = stream if count is None else stream.take(count)
    else:
        validation = documents["validation"]
    if data.objective == "mlm":
        check_validation_for_mlm(first_documents_with_text(validation, tokenizer, 1))
    elif streaming:
        check_stream_validation_for_nsp(first_documents_with_text(validation, tokenizer, MIN_NSP_DOCUMENTS))
    else:
        for split in ("train", "validation"):
            check_documents_for_nsp(first_documents_with_text(documents[split], tokenizer, MIN_NSP_DOCUMENTS))


def streamed_splits(settings: PretrainingSettings) -> datasets.IterableDatasetDict:
    """The run's training and validation documents, streamed: the validation corpus, or the documents
    `split_validation_documents` holds out of the training corpus, chosen by index as the run chooses them."""
    documents = stream_documents(settings.corpus)
    if "validation" in documents:
        return documents
    train = documents["train"]
    indices = datasets.Dataset.from_dict({"index": list(range(sum(1 for _ in train)))})  # in memory
    percentage, seed = settings.data.validation_split_percentage, settings.optimization.seed
    needs = split_needs(settings.data.objective)
    split = split_validation_documents(datasets.DatasetDict(train=indices), percentage, seed, needs)
    held_out = set(split["validation"]["index"])
    return datasets.IterableDatasetDict(
        train=train.filter(lambda _, index: index not in held_out, with_indices=True),
        validation=train.filter(lambda _, index: index in held_out, with_indices=True),
    )
