"""The corpora of the made-to-fail runs of benchmarks/results/run_health.md, written as plain text files
(documents separated by blank lines, one paragraph a line: --document_boundary blank_line).

    python -m benchmarks.run_health_corpora shuffled OUT_DIR    # the shipped sample's sentences in random order
    python -m benchmarks.run_health_corpora repeated OUT_DIR    # a few paragraphs repeated

`shuffled`: every sentence of the shipped WikiText-2 sample, shuffled across the whole corpus and dealt into
documents of the sample's sizes: MLM learns from real sentences as before, and a sentence's successor is
as random as NSP's random B, so NSP cannot beat chance. `repeated`: 4 paragraphs, each in 200 documents.
"""

from __future__ import annotations

import random
import sys
from pathlib import Path

from hfbert.corpus import load_documents
from hfbert.corpus_arguments import CorpusArguments
from hfbert.pretraining.data import split_sentences

SENTENCES_PER_LINE = 4
REPEATED = (
    "The ship was launched in 1901 and served in the Atlantic fleet until the end of the war .",
    "She was sold for scrap in 1923 , after a fire in her engine room .",
    "The album reached number five on the charts and sold over a million copies .",
    "The band toured Europe for two years before they recorded their second album .",
)


def write_documents(documents: list[list[str]], path: Path) -> None:
    path.write_text("\n\n".join("\n".join(lines) for lines in documents) + "\n", encoding="utf-8")


def shuffled(split: str, seed: int) -> list[list[str]]:
    documents = load_documents(CorpusArguments())[split]
    sizes = [sum(len(split_sentences(p)) for p in d["paragraphs"]) for d in documents]
    sentences = [s for d in documents for p in d["paragraphs"] for s in split_sentences(p)]
    random.Random(seed).shuffle(sentences)
    out, start = [], 0
    for size in sizes:
        mine = sentences[start : start + size]
        start += size
        out.append([" ".join(mine[i : i + SENTENCES_PER_LINE]) for i in range(0, len(mine), SENTENCES_PER_LINE)])
    return out


def main() -> None:
    kind, folder = sys.argv[1], Path(sys.argv[2])
    folder.mkdir(parents=True, exist_ok=True)
    if kind == "shuffled":
        write_documents(shuffled("train", 1), folder / "train.txt")
        write_documents(shuffled("validation", 2), folder / "valid.txt")
    elif kind == "repeated":
        write_documents([[REPEATED[i % 4], REPEATED[(i + 1) % 4]] for i in range(200)], folder / "train.txt")
        write_documents([[REPEATED[i % 4], REPEATED[(i + 2) % 4]] for i in range(20)], folder / "valid.txt")
    else:
        raise SystemExit(f"unknown corpus {kind!r}: pass shuffled or repeated")


if __name__ == "__main__":
    main()
