"""Why the own-text folder loses to naive Bayes on benchmarks.own_text's sets: what its representation and its
tokenizer carry, measured on the rows fine-tuning uses (issue 55).

Per set of an own_text work folder (WORK/SET/train.csv, test.csv, own-text/), at each label count of --sizes
(the rows `hfbert.finetune --max_train_samples N` keeps, --data_seed 0):

- naive Bayes on word counts (benchmarks.downstream's) and a logistic regression on the same words (present or
  not): is it naive Bayes, or words, that is hard to beat?
- linear probes: a logistic regression on the frozen encoder's last layer ([CLS], and the mean over the text's
  tokens) of the own-text folder, of the same config from random weights (seed 0), and of --wikitext_folder.
  What the pretrained representation carries without any fine-tuning.
- the tokenizers' fit to the test split: the share of its words that a tokenizer leaves unknown or splits into
  pieces, over every word and over the polarity words (the --polar_words words with the largest naive Bayes
  log-odds over the whole training pool, seen at least 5 times).

Every logistic regression is L2-penalised, its penalty chosen on 3 stratified folds of the training rows (never
the test split), features standardised on the training rows, fitted full-batch with L-BFGS.

    python -m benchmarks.own_text_why --work_dir /work/ownbench-measure/movie_sentences --sets movie_sentences \
        --wikitext_folder /work/measure-runs/quick-start-bf16-seed1 --sizes 150 600 2400
"""

from __future__ import annotations

import argparse
import collections
import math
from collections.abc import Sequence
from pathlib import Path

import datasets
import numpy as np
import torch
from transformers import AutoConfig, AutoModel, AutoTokenizer

import hfbert  # noqa: F401 (registers the hfbert model type with transformers' Auto classes)
from benchmarks.downstream import naive_bayes_accuracy, words
from hfbert.analysis import quiet_libraries
from hfbert.files import write_json_atomic
from hfbert.finetune.data import few_labels, stratified_folds

PENALTIES = (1e-4, 1e-3, 1e-2, 1e-1, 1.0)
MAX_LENGTH = 128  # hfbert.finetune's --max_seq_length default
POOLINGS = ("cls", "mean")


def read_split(work: Path, split: str, names: list[str] | None = None) -> datasets.Dataset:
    rows = datasets.load_dataset("csv", data_files=str(work / f"{split}.csv"), split="train")
    names = names or sorted(rows.unique("label"))
    return rows.map(lambda row: {"labels": names.index(row["label"])})


def fit_logistic(x: torch.Tensor, y: torch.Tensor, classes: int, penalty: float) -> torch.nn.Linear:
    """Multinomial logistic regression, mean cross-entropy + penalty * |W|^2 / 2, full batch L-BFGS."""
    torch.manual_seed(0)
    linear = torch.nn.Linear(x.shape[1], classes)
    torch.nn.init.zeros_(linear.weight), torch.nn.init.zeros_(linear.bias)
    optimiser = torch.optim.LBFGS(linear.parameters(), max_iter=200, line_search_fn="strong_wolfe")

    def closure():
        optimiser.zero_grad()
        loss = torch.nn.functional.cross_entropy(linear(x), y) + penalty / 2 * linear.weight.pow(2).sum()
        loss.backward()
        return loss

    optimiser.step(closure)
    return linear


def standardised(train: torch.Tensor, *others: torch.Tensor) -> list[torch.Tensor]:
    mean, std = train.mean(0), train.std(0).clamp_min(1e-6)
    return [(tensor - mean) / std for tensor in (train, *others)]


def probe_accuracy(train_x, train_y, test_x, test_y, folds: list[tuple[np.ndarray, np.ndarray]]) -> dict:
    """The penalty with the best mean accuracy over the folds (the larger on a tie), refitted on every
    training row; its test accuracy."""
    classes = int(max(train_y.max(), test_y.max())) + 1
    scores = {}
    for penalty in PENALTIES:
        hits = []
        for held_in, held_out in folds:
            fold_in, fold_out = standardised(train_x[held_in], train_x[held_out])
            model = fit_logistic(fold_in, train_y[held_in], classes, penalty)
            with torch.no_grad():
                hits.append((model(fold_out).argmax(1) == train_y[held_out]).float().mean().item())
        scores[penalty] = float(np.mean(hits))
    penalty = max(PENALTIES, key=lambda value: (round(scores[value], 9), value))
    train_s, test_s = standardised(train_x, test_x)
    model = fit_logistic(train_s, train_y, classes, penalty)
    with torch.no_grad():
        accuracy = (model(test_s).argmax(1) == test_y).float().mean().item()
    return {"accuracy": accuracy, "penalty": penalty, "fold_accuracy": scores[penalty]}


def fold_indices(train: datasets.Dataset, names: list[str]) -> list[tuple[np.ndarray, np.ndarray]]:
    """hfbert.finetune's 3 stratified folds of the training rows (--data_seed 0), as row indices."""
    indexed = train.add_column("row", list(range(len(train))))
    return [(np.asarray(a["row"]), np.asarray(b["row"])) for a, b in stratified_folds(indexed, 3, 0, names)]


def bag_of_words(train_texts: list[str], *others: list[str]) -> list[torch.Tensor]:
    """Word presence (benchmarks.downstream's words) over the training rows' vocabulary."""
    vocabulary = {word: index for index, word in enumerate(sorted({w for text in train_texts for w in words(text)}))}

    def encode(texts: list[str]) -> torch.Tensor:
        matrix = torch.zeros(len(texts), len(vocabulary))
        for row, text in enumerate(texts):
            for word in words(text):
                if word in vocabulary:
                    matrix[row, vocabulary[word]] = 1.0
        return matrix

    return [encode(texts) for texts in (train_texts, *others)]


@torch.no_grad()
def encoder_features(model, tokenizer, texts: list[str], batch_size: int = 64) -> dict[str, torch.Tensor]:
    """The last layer's [CLS] vector and its mean over the text's tokens (padding left out)."""
    model.eval()
    pooled = {pooling: [] for pooling in POOLINGS}
    for start in range(0, len(texts), batch_size):
        batch = tokenizer(texts[start : start + batch_size], truncation=True, max_length=MAX_LENGTH, padding=True, return_tensors="pt")
        hidden = model(**batch).last_hidden_state
        mask = batch["attention_mask"].unsqueeze(-1).to(hidden.dtype)
        pooled["cls"].append(hidden[:, 0])
        pooled["mean"].append((hidden * mask).sum(1) / mask.sum(1))
    return {pooling: torch.cat(chunks).float() for pooling, chunks in pooled.items()}


def encoders(own_folder: Path, wikitext_folder: str | None) -> dict[str, tuple]:
    """name -> (model, tokenizer): the own-text folder, its config from random weights, the WikiText folder."""
    own_tokenizer = AutoTokenizer.from_pretrained(own_folder)
    torch.manual_seed(0)
    found = {
        "own text": (AutoModel.from_pretrained(own_folder), own_tokenizer),
        "random weights": (AutoModel.from_config(AutoConfig.from_pretrained(own_folder)), own_tokenizer),
    }
    if wikitext_folder:
        found["WikiText main job"] = (AutoModel.from_pretrained(wikitext_folder), AutoTokenizer.from_pretrained(wikitext_folder))
    return found


def polar_words(pool: datasets.Dataset, count: int, min_count: int = 5) -> list[str]:
    """The `count` words of the training pool whose add-one naive Bayes log-odds between some class and the
    rest is largest in size (seen at least `min_count` times)."""
    by_class: dict[int, collections.Counter] = collections.defaultdict(collections.Counter)
    for text, label in zip(pool["text"], pool["labels"], strict=True):
        by_class[label].update(words(text))
    total = sum(by_class.values(), collections.Counter())
    size = {label: sum(counter.values()) for label, counter in by_class.items()}
    all_words = sum(size.values())

    def strength(word: str) -> float:
        return max(
            abs(math.log((counts[word] + 1) / (size[label] + len(total)))
                - math.log((total[word] - counts[word] + 1) / (all_words - size[label] + len(total))))
            for label, counts in by_class.items()
        )  # fmt: skip

    frequent = sorted(word for word, seen in total.items() if seen >= min_count)
    return sorted(frequent, key=lambda word: (-strength(word), word))[:count]


def tokenizer_fit(tokenizer, texts: list[str], only: set[str] | None = None) -> dict:
    """Over the words the tokenizer's own pre-tokenizer finds in `texts` (lower-cased, those in `only` if
    given): the share left unknown, the share split into two or more pieces, pieces per word."""
    pre_tokenize = tokenizer.backend_tokenizer.pre_tokenizer.pre_tokenize_str
    normalise = tokenizer.backend_tokenizer.normalizer.normalize_str
    seen = [word for text in texts for word, _ in pre_tokenize(normalise(text)) if only is None or word in only]
    pieces = {word: tokenizer.tokenize(word) for word in set(seen)}
    unknown = sum(tokenizer.unk_token in pieces[word] for word in seen)
    split = sum(len(pieces[word]) > 1 and tokenizer.unk_token not in pieces[word] for word in seen)
    return {
        "words": len(seen),
        "unknown": unknown / max(len(seen), 1),
        "split": split / max(len(seen), 1),
        "pieces_per_word": sum(len(pieces[word]) for word in seen) / max(len(seen), 1),
    }


def measure_set(work: Path, args: argparse.Namespace) -> dict:
    pool = read_split(work, "train")
    names = sorted(pool.unique("label"))
    test = read_split(work, "test", names)
    test_y = torch.tensor(test["labels"])
    models = encoders(work / "own-text", args.wikitext_folder)
    report: dict = {"sizes": {}, "tokenizers": {}}
    test_features = {name: encoder_features(model, tokenizer, test["text"]) for name, (model, tokenizer) in models.items()}
    for size in args.sizes:
        train = few_labels(pool, size, seed=0)
        train_y, folds = torch.tensor(train["labels"]), fold_indices(train, names)
        row = report["sizes"][size] = {"naive Bayes, word counts": {"accuracy": naive_bayes_accuracy(train, test)}}
        train_words, test_words = bag_of_words(train["text"], test["text"])
        row["logistic regression, word presence"] = probe_accuracy(train_words, train_y, test_words, test_y, folds)
        for name, (model, tokenizer) in models.items():
            train_features = encoder_features(model, tokenizer, train["text"])
            for pooling in POOLINGS:
                row[f"probe, {name}, {pooling}"] = probe_accuracy(
                    train_features[pooling], train_y, test_features[name][pooling], test_y, folds
                )
        print(f"{work.name} {size}: " + ", ".join(f"{key} {value['accuracy']:.3f}" for key, value in row.items()), flush=True)
    polar = set(polar_words(pool, args.polar_words))
    for name, (_, tokenizer) in models.items():
        if name != "random weights":
            report["tokenizers"][name] = {
                "every word": tokenizer_fit(tokenizer, test["text"]),
                "polarity words": tokenizer_fit(tokenizer, test["text"], polar),
            }
    report["polar_words"] = sorted(polar)
    return report


def table(reports: dict[str, dict]) -> str:
    lines = ["| set | model | " + " | ".join(f"{size} labels" for size in next(iter(reports.values()))["sizes"]) + " |"]
    lines.append("|---|---|" + "---|" * len(next(iter(reports.values()))["sizes"]))
    for name, report in reports.items():
        rows = next(iter(report["sizes"].values()))
        for model in rows:
            cells = " | ".join(f"{report['sizes'][size][model]['accuracy']:.3f}" for size in report["sizes"])
            lines.append(f"| {name} | {model} | {cells} |")
    lines += ["", "| set | tokenizer | words | unknown | split into pieces | pieces per word |", "|---|---|---|---|---|---|"]
    for name, report in reports.items():
        for tokenizer, fits in report["tokenizers"].items():
            for over, fit in fits.items():
                lines.append(
                    f"| {name} | {tokenizer}, {over} | {fit['words']:,} | {100 * fit['unknown']:.1f}% | "
                    f"{100 * fit['split']:.1f}% | {fit['pieces_per_word']:.2f} |"
                )
    return "\n".join(lines)


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--work_dir", type=Path, required=True, help="benchmarks.own_text's --work_dir")
    parser.add_argument("--sets", nargs="+", required=True, help="its sets (folders WORK/SET)")
    parser.add_argument("--wikitext_folder", help="the README quick start's folder")
    parser.add_argument("--sizes", type=int, nargs="+", default=[150, 600, 2400], help="label counts")
    parser.add_argument("--polar_words", type=int, default=200, help="how many polarity words to check")
    parser.add_argument("--output", type=Path, help="the report as json (default: WORK/why.json)")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> dict[str, dict]:
    args = parse_args(argv)
    with quiet_libraries():
        reports = {name: measure_set(args.work_dir / name, args) for name in args.sets}
    write_json_atomic(args.output or args.work_dir / "why.json", {"settings": {**vars(args), "work_dir": str(args.work_dir), "output": str(args.output)}, "sets": reports})
    print("\n" + table(reports))
    return reports


if __name__ == "__main__":
    main()
