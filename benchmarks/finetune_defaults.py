"""Is `python -m hfbert.finetune`'s default path (`--learning_rate auto`) a fair judge of a folder? On the sets
of benchmarks.downstream, fine-tune a folder and its random-init twin at every rate of a grid, on every fold
of the training rows (what `auto` chooses on) and under every seed on the test split (what it reports), with
hfbert.finetune's own functions. Every fit is independent of the rest (its rate, rows and seed fix it), so the
default path's result is read off the grid: the rate `auto` chooses from the fold fits, then the test scores
at that rate. Against it: the best fixed rate chosen in hindsight on the test split, and the fixed 1e-3.

    python -m benchmarks.finetune_defaults /tmp/w/main-job --work_dir /tmp/w/defaults \\
        --sets tweets movie_sentences chatbot_topics --train_sizes 150

Each fit is one line of work_dir/fits.jsonl (set, size, folder, init, rate); a stopped run goes on where it
stopped. `--report` only prints the tables from what is there.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
from collections.abc import Sequence
from pathlib import Path

from benchmarks.downstream import set_splits
from benchmarks.downstream_sets import SETS
from hfbert.analysis import quiet_libraries
from hfbert.finetune.fit import FitResult
from hfbert.finetune.models import size_defaults
from hfbert.finetune.report import paired_gain
from hfbert.finetune.run import check_before_work, run_fits
from hfbert.finetune.selection import FoldFit, choose_rate
from hfbert.finetune.settings import RANDOM_INIT, parse_args

FITS_NAME = "fits.jsonl"


def fit_from_json(row: dict) -> FitResult:
    metrics = {key: value for key, value in row.items() if key in ("accuracy", "f1", "matthews_correlation")}
    return FitResult(
        metrics, tuple(row["epoch_losses"]), tuple(row["predicted_counts"]), row["majority_rate"]
    )


def measure(folder: str, name: str, size: int, args: argparse.Namespace, done: set[tuple]) -> None:
    """Every rate's fold fits and seed fits for the folder and its twin, appended to fits.jsonl."""
    paths = set_splits(name, argparse.Namespace(**{**vars(args), "train_sizes": [size]}))
    settings = parse_args([
        folder, "--train_file", str(paths["train"]), "--validation_file", str(paths["test"]),
        "--max_train_samples", str(size), "--compare", RANDOM_INIT, "--quiet",
        "--learning_rate_grid", *map(str, args.rates), "--learning_rate_folds", str(args.folds),
        "--seeds", *map(str, args.seeds), "--output_dir", str(args.work_dir),
    ])  # fmt: skip
    candidates, task = check_before_work(settings)
    for candidate in candidates:
        for rate in args.rates:
            key = (name, size, folder, candidate.init, rate)
            if key in done:
                continue
            one_rate = dataclasses.replace(candidate, learning_rates=(rate,))
            folds = run_fits(one_rate, task, settings, None)
            seeds = run_fits(one_rate, task, settings, None, rate)
            row = {
                "set": name, "size": size, "folder": folder, "init": candidate.init, "rate": rate,
                "fold_fits": [{"fold": w.fold, "seed": w.seed, **r.as_json()} for w, r in folds.items()],
                "seed_fits": {str(seed): r.as_json() for seed, r in seeds.items()},
            }  # fmt: skip
            with open(args.work_dir / FITS_NAME, "a") as file:
                file.write(json.dumps(row) + "\n")
            done.add(key)
            mean = statistics.fmean(r.metrics["accuracy"] for r in seeds.values())
            collapsed = sum(bool(r.collapse) for r in [*folds.values(), *seeds.values()])
            print(
                f"{name} {size} {Path(folder).name} {candidate.init} {rate:g}: test {mean:.3f}, {collapsed} collapsed",
                flush=True,
            )


def read_fits(work_dir: Path) -> dict[tuple, dict]:
    path = work_dir / FITS_NAME
    rows = [json.loads(line) for line in path.read_text().splitlines()] if path.is_file() else []
    return {(r["set"], r["size"], r["folder"], r["init"], r["rate"]): r for r in rows}


def default_path(rows: dict[float, dict], grid: Sequence[float]) -> tuple[float, dict[str, FitResult]]:
    """The rate `--learning_rate auto` chooses from `grid`'s fold fits, and its test fits per seed."""
    fits = {
        FoldFit(rate, fit["fold"], fit["seed"]): fit_from_json(fit)
        for rate in grid
        for fit in rows[rate]["fold_fits"]
    }
    rate = choose_rate(fits, "accuracy").chosen
    return rate, {seed: fit_from_json(fit) for seed, fit in rows[rate]["seed_fits"].items()}


def test_mean(fits: dict[str, FitResult]) -> float:
    return statistics.fmean(fit.metrics["accuracy"] for fit in fits.values())


def report(fits: dict[tuple, dict], grids: dict[str, Sequence[float]]) -> str:
    """Per set, size and grid: each model's default path against the best fixed rate in hindsight and 1e-3,
    its collapsed seeds, and the paired gain; then how often each rate collapsed."""
    lines = [
        "| set | labels | grid | model | default: rate, test acc | best fixed (hindsight) | fixed 1e-3 "
        "| default - best | default - 1e-3 | collapsed seeds at default |",
        "|---|---:|---|---|---|---|---|---:|---:|---|",
    ]
    gains = []
    groups = sorted({key[:4] for key in fits})
    for set_name, size, folder, init in groups:
        rows = {key[4]: row for key, row in fits.items() if key[:4] == (set_name, size, folder, init)}
        label = f"{Path(folder).name}" + (", random init" if init == RANDOM_INIT else "")
        by_rate = {
            rate: {s: fit_from_json(f) for s, f in row["seed_fits"].items()} for rate, row in rows.items()
        }
        best_rate = max(by_rate, key=lambda rate: test_mean(by_rate[rate]))
        for grid_name, grid in grids.items():
            if not set(grid) <= set(rows):
                continue
            rate, chosen = default_path(rows, grid)
            collapsed = [seed for seed, fit in chosen.items() if fit.collapse]
            fixed = test_mean(by_rate[1e-3]) if 1e-3 in by_rate else float("nan")
            lines.append(
                f"| {set_name} | {size} | {grid_name} | {label} | {rate:g}, {test_mean(chosen):.3f} | "
                f"{best_rate:g}, {test_mean(by_rate[best_rate]):.3f} | {fixed:.3f} | "
                f"{100 * (test_mean(chosen) - test_mean(by_rate[best_rate])):+.1f} | {100 * (test_mean(chosen) - fixed):+.1f} | "
                f"{', '.join(collapsed) or 'none'} |"
            )
            gains.append(((set_name, size, grid_name, folder, init), chosen))
    lines += ["", gain_lines(gains), "", collapse_lines(fits)]
    return "\n".join(lines)


def gain_lines(gains: list) -> str:
    """The default path's paired gain of each folder over its random twin, per set, size and grid."""
    lines = [
        "| set | labels | grid | folder | gain, points (per seed) | 95% interval | verdict |",
        "|---|---:|---|---|---|---|---|",
    ]
    results = {key: chosen for key, chosen in gains}
    for (set_name, size, grid_name, folder, init), chosen in gains:
        twin = results.get((set_name, size, grid_name, folder, RANDOM_INIT))
        if init == RANDOM_INIT or twin is None:
            continue
        seeds = sorted(chosen, key=int)
        summary = {"accuracy": {"per_seed": [chosen[s].metrics["accuracy"] for s in seeds]}}
        other = {"accuracy": {"per_seed": [twin[s].metrics["accuracy"] for s in seeds]}}
        gain = paired_gain(summary, other, [int(s) for s in seeds])["accuracy"]
        per_seed = ", ".join(f"{100 * v:+.1f}" for v in gain["per_seed"].values())
        low, high = (100 * v for v in gain["interval_95"])
        lines.append(
            f"| {set_name} | {size} | {grid_name} | {Path(folder).name} | {100 * gain['mean']:+.1f} ({per_seed}) | "
            f"[{low:+.1f}, {high:+.1f}] | {gain['verdict'].split(';')[0]} |"
        )
    return "\n".join(lines)


def collapse_lines(fits: dict[tuple, dict]) -> str:
    """How many fits collapsed at each rate, per label count (fold fits and test fits together)."""
    counts: dict[tuple, list[int]] = {}
    for (_, size, _, _, rate), row in fits.items():
        every = [*row["fold_fits"], *row["seed_fits"].values()]
        tally = counts.setdefault((size, rate), [0, 0])
        tally[0] += sum(bool(fit["collapsed"]) for fit in every)
        tally[1] += len(every)
    lines = ["| labels | rate | collapsed fits |", "|---:|---|---|"]
    for (size, rate), (bad, total) in sorted(counts.items()):
        lines.append(f"| {size} | {rate:g} | {bad} of {total} |")
    return "\n".join(lines)


def parse_arguments(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("folders", nargs="+", help="finished model folders (each with its random-init twin)")
    parser.add_argument("--work_dir", type=Path, required=True, help="the sets' splits and fits.jsonl")
    parser.add_argument("--sets", nargs="+", choices=list(SETS), default=["tweets"])
    parser.add_argument("--train_sizes", type=int, nargs="+", default=[150])
    parser.add_argument("--rates", type=float, nargs="+", default=[1e-4, 3e-4, 1e-3, 3e-3])
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    parser.add_argument("--folds", type=int, default=3)
    parser.add_argument("--report", action="store_true", help="print the tables from fits.jsonl; fit nothing")
    parser.add_argument("--source_csv", type=Path, help="benchmarks.downstream's: the tweets from this csv")
    parser.add_argument("--tune_per_class", type=int, help="benchmarks.downstream's (default: each set's own)")
    parser.add_argument("--test_per_class", type=int, help="benchmarks.downstream's (default: each set's own)")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> str:
    args = parse_arguments(argv)
    args.work_dir.mkdir(parents=True, exist_ok=True)
    if not args.report:
        done = set(read_fits(args.work_dir))
        with quiet_libraries():
            for name in args.sets:
                for size in args.train_sizes:
                    for folder in args.folders:
                        measure(folder, name, size, args, done)
    small_grid = size_defaults(128)[1]
    grids = {"default": small_grid, "with 3e-3": (*small_grid, 3e-3)}
    text = report(read_fits(args.work_dir), grids)
    print(text)
    return text


if __name__ == "__main__":
    main()
