"""Tokenizer benchmark: WordPiece training time and batch-encode throughput.

Runs on the shipped WikiText-2 sample and on a generated WikiText-style corpus of ``--size_mb`` MB
(deterministic: random spans of the sample's words, 5% of them swapped for words from a pool of 200,000
made-up compounds, so the corpus has about as many distinct words as ~100 MB of real Wikipedia text).
Encode throughput is measured with batch encoding (the fast tokenizer's __call__) on up to
``--encode_mb`` MB of each corpus. Two more corpora hold a single line of ``--line_mb`` MB: the sample's words
joined by spaces, and random letters without any whitespace (one huge word, which used to make training time
grow with the square of its length). Prints a markdown table and the ratio to the targets (sample < 1 s,
100 MB < 60 s, a single line < 10 s).

    python -m benchmarks.bench_tokenizer [--size_mb 100] [--line_mb 5] [--vocab_size 30522]
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

SEED = 1234
TARGET_SECONDS = {"shipped sample": 1.0, "generated": 60.0, "single line": 10.0}
PARAGRAPHS_PER_ARTICLE = 20
COMPOUND_WORD_RATE = 0.05
COMPOUND_POOL_SIZE = 200_000


@dataclass
class Measurement:
    corpus: str
    megabytes: float
    load_seconds: float
    train_seconds: float
    vocab_size: int
    encode_tokens_per_second: float


def write_generated_corpus(path: Path, size_mb: float, sample_words: list[str]) -> None:
    """Write ``size_mb`` MB of WikiText-raw-formatted text built from ``sample_words`` with a seeded RNG."""
    rng = random.Random(SEED)
    compounds = [
        rng.choice(sample_words) + rng.choice(sample_words).lower() for _ in range(COMPOUND_POOL_SIZE)
    ]
    target_bytes = int(size_mb * 1e6)
    written = 0
    with path.open("w", encoding="utf-8") as file:
        article = 0
        while written < target_bytes:
            lines = [f" = Generated article {article} = "]
            for _ in range(PARAGRAPHS_PER_ARTICLE):
                start = rng.randrange(len(sample_words) - 200)
                words = sample_words[start : start + rng.randint(40, 200)]
                for _ in range(round(len(words) * COMPOUND_WORD_RATE)):
                    words[rng.randrange(len(words))] = rng.choice(compounds)
                lines.append(" " + " ".join(words) + " ")
            text = "\n".join(lines) + "\n"
            file.write(text)
            written += len(text.encode("utf-8"))
            article += 1


def write_single_line(path: Path, size_mb: float, sample_words: list[str] | None) -> None:
    """One line of ``size_mb`` MB: ``sample_words`` in random order, or random letters without whitespace."""
    rng = random.Random(SEED)
    target_chars = int(size_mb * 1e6)
    if sample_words is None:
        line = "".join(rng.choices("abcdefghijklmnopqrstuvwxyz", k=target_chars))
    else:
        words: list[str] = []
        length = 0
        while length < target_chars:
            words.append(rng.choice(sample_words))
            length += len(words[-1]) + 1
        line = " ".join(words)
    path.write_text(f"A first paragraph .\n\n{line}\n\nA last paragraph .\n", encoding="utf-8")


def measure(corpus: str, train_file: Path | None, vocab_size: int, encode_mb: float) -> Measurement:
    from hfbert.corpus import load_documents
    from hfbert.corpus_arguments import CorpusArguments
    from hfbert.tokenization import ParagraphBatches, train_tokenizer

    started = time.perf_counter()
    documents = load_documents(CorpusArguments(train_file=None if train_file is None else str(train_file)))
    load_seconds = time.perf_counter() - started

    batches = ParagraphBatches(documents["train"], show_progress=False)
    started = time.perf_counter()
    tokenizer = train_tokenizer(batches, vocab_size=vocab_size, show_progress=False)
    train_seconds = time.perf_counter() - started

    tokens = 0
    encode_batches = ParagraphBatches(documents["train"], show_progress=False)
    started = time.perf_counter()
    for batch in encode_batches:
        tokens += sum(len(ids) for ids in tokenizer(batch)["input_ids"])
        if encode_batches.bytes_read >= encode_mb * 1e6:
            break
    encode_seconds = time.perf_counter() - started
    return Measurement(
        corpus=corpus,
        megabytes=batches.bytes_read / 1e6,
        load_seconds=load_seconds,
        train_seconds=train_seconds,
        vocab_size=len(tokenizer),
        encode_tokens_per_second=tokens / encode_seconds,
    )


def print_table(measurements: list[Measurement]) -> None:
    print(f"\n{os.cpu_count()} CPU cores\n")
    print(
        "| corpus | MB | load s (uncached) | train s | train MB/s | vocab | encode tokens/s | target | "
        "target / measured |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for m in measurements:
        target = next(seconds for name, seconds in TARGET_SECONDS.items() if m.corpus.startswith(name))
        print(
            f"| {m.corpus} | {m.megabytes:.1f} | {m.load_seconds:.2f} | {m.train_seconds:.2f} | "
            f"{m.megabytes / m.train_seconds:.1f} | {m.vocab_size} | {m.encode_tokens_per_second:,.0f} | "
            f"< {target:.0f} s | {target / m.train_seconds:.1f}x |"
        )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--size_mb", type=float, default=100.0, help="Size of the generated corpus (0: skip it)."
    )
    parser.add_argument(
        "--line_mb", type=float, default=5.0, help="Size of the single-line corpora (0: skip them)."
    )
    parser.add_argument("--vocab_size", type=int, default=30522)
    parser.add_argument("--encode_mb", type=float, default=10.0, help="Text to batch-encode per corpus.")
    args = parser.parse_args()

    workdir = Path(tempfile.mkdtemp(prefix="hfbert-bench-tokenizer-"))
    # A private datasets cache: "load s" is then an uncached load, and the big corpus' cache is removed after.
    os.environ["HF_DATASETS_CACHE"] = str(workdir / "datasets-cache")
    try:
        from hfbert.corpus_arguments import SHIPPED_SAMPLE_DIR, SHIPPED_SAMPLE_FILES

        measurements = [measure("shipped sample", None, args.vocab_size, args.encode_mb)]
        sample_text = (SHIPPED_SAMPLE_DIR / SHIPPED_SAMPLE_FILES["train"]).read_text(encoding="utf-8")
        sample_lines = [line for line in sample_text.split("\n") if not line.startswith(" =")]
        sample_words = " ".join(sample_lines).split()
        if args.line_mb > 0:
            for kind, words in (("words", sample_words), ("no whitespace", None)):
                single_line = workdir / f"single-line-{kind.replace(' ', '-')}.txt"
                write_single_line(single_line, args.line_mb, words)
                name = f"single line, {args.line_mb:g} MB, {kind}"
                measurements.append(measure(name, single_line, args.vocab_size, args.encode_mb))
        if args.size_mb > 0:
            generated = workdir / "generated.train.raw"
            started = time.perf_counter()
            write_generated_corpus(generated, args.size_mb, sample_words)
            print(
                f"generated {generated.stat().st_size / 1e6:.1f} MB in {time.perf_counter() - started:.1f} s"
            )
            measurements.append(
                measure(f"generated {args.size_mb:g} MB", generated, args.vocab_size, args.encode_mb)
            )
        print_table(measurements)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    main()
