"""`python -m hfbert.finetune`: check everything, then fine-tune the model (and the comparison) under every
seed, each at its rate (chosen on folds of the training rows unless passed), with one progress bar over every
fit and one line per finished fit; then write the results, the plot and (asked for) the model card."""

from __future__ import annotations

import dataclasses
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from tqdm.auto import tqdm

from hfbert.analysis import quiet_libraries
from hfbert.errors import Refusal, run_cli
from hfbert.files import check_folder_writable, check_reports_replaceable, record_reports, write_json_atomic
from hfbert.finetune.data import TaskData, encode, load_task, stratified_folds, task_columns
from hfbert.finetune.fit import FitResult, Stopped, finetune_once, stop_on_signals
from hfbert.finetune.models import (
    COMPARISON_ROLE,
    MODEL_ROLE,
    Candidate,
    build_model,
    describe,
    load_candidate,
    reinit_query_key_hint,
)
from hfbert.finetune.report import (
    add_to_model_card,
    check_model_card,
    paired_gain,
    plot_results,
    report_table,
    spread,
)
from hfbert.finetune.selection import choose_rate, selection_plan
from hfbert.finetune.settings import (
    PROG,
    RANDOM_INIT,
    FinetuneSettings,
    FinetuneTrainingArguments,
    parse_args,
)

RESULTS_NAME = "finetune_results.json"
PLOT_NAME = "finetune_results.png"


def check_before_work(settings: FinetuneSettings) -> tuple[list[Candidate], TaskData]:
    """Every check on the folders, the output places, the flags and the data, before any training: the
    models to fine-tune (the one under test first) and the task."""
    models, training, output = settings.models, settings.training, settings.output
    pair_task = task_columns(settings.data)[1] is not None
    load = {"training": training, "pair_task": pair_task, "trust_remote_code": models.trust_remote_code}
    candidates = [load_candidate(MODEL_ROLE, models.model_dir, "model_dir", **load)]
    if models.compare == RANDOM_INIT:
        if Path(RANDOM_INIT).exists():
            raise Refusal(
                f"--compare {RANDOM_INIT} means random initialisation, but a folder of that name is here too; "
                f"pass --compare ./{RANDOM_INIT} to compare with the folder"
            )
        candidates.append(dataclasses.replace(candidates[0], role=COMPARISON_ROLE, init=RANDOM_INIT))
    elif models.compare is not None:
        if Path(models.compare).resolve() == Path(models.model_dir).resolve():
            raise Refusal(
                f"--compare {models.compare} is the model folder itself; pass another folder or {RANDOM_INIT}"
            )
        candidates.append(load_candidate(COMPARISON_ROLE, models.compare, "--compare", **load))
    if output.output_dir is not None:
        check_folder_writable(output.output_dir, "--output_dir")
    else:
        check_folder_writable(models.model_dir, "model_dir (where the results go)")
    check_reports_replaceable(
        Path(output.output_dir or models.model_dir), (RESULTS_NAME, PLOT_NAME),
        "--output_dir" if output.output_dir else "model_dir", "the fine-tuning",
    )  # fmt: skip
    if output.update_model_card:
        check_folder_writable(models.model_dir, "--update_model_card's model_dir")
        check_model_card(Path(models.model_dir) / "README.md")
    if training.fp16 and not torch.cuda.is_available():
        raise Refusal("--fp16 needs a CUDA GPU and none is available; leave --fp16 out on a CPU")
    task = load_task(settings.data)
    if training.chooses_rate:  # rows too few for the folds are refused here, before any training
        stratified_folds(task.train, training.learning_rate_folds, settings.data.data_seed, task.label_names)
    return candidates, task


def run_fits(
    candidate: Candidate,
    task: TaskData,
    settings: FinetuneSettings,
    progress: tqdm | None,
    rate: float | None = None,
) -> dict[Any, FitResult]:
    """Without `rate`, `--learning_rate auto`'s fits, keyed by `FoldFit`: each rate of the candidate's grid on
    each fold of the training rows, scored on the fold's held-out rows (the evaluation split is never looked
    at). With `rate`, the candidate fine-tuned at it on every training row once per seed, keyed by seed, and
    scored on the evaluation split. Each finished fit is one line above the bar over every fit (alone with
    --quiet: the bar is off) and moves the bar one fit on; nothing is shown without a bar (`progress`
    None)."""
    training, epochs = settings.training, candidate.num_train_epochs
    train = encode(task, task.train, candidate.tokenizer, training.max_seq_length)  # once; folds select rows
    if rate is None:
        count, data_seed = training.learning_rate_folds, settings.data.data_seed
        folds = stratified_folds(train, count, data_seed, task.label_names)
        runs = {
            at: (at.seed, at.rate, *folds[at.fold], f"fold {at.fold + 1}/{count} (seed {at.seed})")
            for at in selection_plan(candidate.learning_rates, count, training.seeds)
        }
        metrics, rows = task.metrics[:1], "held-out training rows"
    else:
        evaluation = encode(task, task.evaluation, candidate.tokenizer, training.max_seq_length)
        runs = {seed: (seed, rate, train, evaluation, f"seed {seed}") for seed in training.seeds}
        metrics, rows = task.metrics, "evaluation rows"
    fits = {}
    for key, (seed, fit_rate, fit_on, scored_on, where) in runs.items():
        model = build_model(candidate, task.label_names, seed, training.reinit_query_key)
        fit = finetune_once(model, candidate.tokenizer, fit_on, scored_on, training, seed, fit_rate, epochs)
        fits[key] = fit
        if progress is None:
            continue
        scores = ", ".join(f"{metric} {fit.metrics[metric]:.3f}" for metric in metrics)
        line = f"{candidate.role} ({describe(candidate.folder, candidate.init)}), rate {fit_rate:g}, {where}"
        line += f": {scores} on {len(scored_on)} {rows}"
        progress.write(line + (f"; COLLAPSED: {fit.collapse}" if fit.collapse else ""))
        sys.stdout.flush()  # each line as its fit ends, also into a log file
        progress.update()
    return fits


def fit_count(candidates: Sequence[Candidate], training: FinetuneTrainingArguments) -> int:
    folds = training.learning_rate_folds if training.chooses_rate else 0
    return sum(len(training.seeds) + len(candidate.learning_rates) * folds for candidate in candidates)


def fit_candidate(
    candidate: Candidate, task: TaskData, settings: FinetuneSettings, progress: tqdm
) -> dict[str, Any]:
    """One model's entry in the results: its rate (chosen, or as passed) and its fits under every seed."""
    training, data_seed = settings.training, settings.data.data_seed
    selection, rate = None, training.learning_rate
    if training.chooses_rate:
        fits = run_fits(candidate, task, settings, progress)
        choice = choose_rate(fits, task.metrics[0])
        rate = choice.chosen
        fold_rows = len(task.train) // training.learning_rate_folds
        selection = {
            **choice.as_json(),
            "chosen_on": f"{training.learning_rate_folds} stratified folds of the {len(task.train)} training rows "
            f"(about {fold_rows} held out each, --data_seed {data_seed}), one fit per rate and fold",
            "folds": training.learning_rate_folds,
            "fold_fits": [{**dataclasses.asdict(where), **result.as_json()} for where, result in fits.items()],
        }
    per_seed = run_fits(candidate, task, settings, progress, rate)
    return {
        "folder": str(candidate.folder),
        "init": candidate.init,
        "learning_rate": rate,
        "num_train_epochs": candidate.num_train_epochs,
        "learning_rate_selection": selection,
        # per metric: mean and standard deviation over the seeds, and each seed's value (in --seeds' order)
        "summary": {metric: spread([fit.metrics[metric] for fit in per_seed.values()]) for metric in task.metrics},
        # {seed: why} for every seed whose fit collapsed (keys as strings, as JSON keeps them)
        "collapsed": {str(seed): fit.collapse for seed, fit in per_seed.items() if fit.collapse},
        "fits": {str(seed): fit.as_json() for seed, fit in per_seed.items()},
    }


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    """`python -m hfbert.finetune`: check everything, fine-tune the model (and the comparison) under every seed,
    write the results (finetune_results.json, atomically, keyed by role: "model", "comparison") and their plot
    in the output folder (and the model card if asked); returns the results."""
    from hfbert import finetune  # the package's docstring is --help's description

    settings = parse_args(argv, finetune.__doc__)
    with quiet_libraries():
        candidates, task = check_before_work(settings)
        training = settings.training
        hint = None if training.reinit_query_key else reinit_query_key_hint(settings.models.model_dir)
        if hint:
            print(hint, flush=True)
        results: dict[str, Any] = {
            "model_dir": str(settings.models.model_dir),
            "compare": settings.models.compare,
            "seeds": list(training.seeds),
            "train_examples": len(task.train),
            "evaluation_examples": len(task.evaluation),
            "evaluation_split": task.evaluation_split,
            "labels": task.label_names,
            "settings": settings.as_flags(),
            "models": {},
        }
        quiet, total = settings.output.quiet, fit_count(candidates, training)
        with tqdm(total=total, desc="fine-tuning", unit="fit", disable=quiet, dynamic_ncols=True) as bar:
            for candidate in candidates:
                results["models"][candidate.role] = fit_candidate(candidate, task, settings, bar)
        if len(candidates) > 1:
            models = results["models"]
            results["gain"] = paired_gain(
                models[MODEL_ROLE]["summary"], models[COMPARISON_ROLE]["summary"], training.seeds
            )
        output_dir = Path(settings.output.output_dir or settings.models.model_dir)
        output_dir.mkdir(parents=True, exist_ok=True)
        write_json_atomic(output_dir / RESULTS_NAME, results)
        plot_results(results, output_dir / PLOT_NAME)
        record_reports(output_dir, [output_dir / RESULTS_NAME, output_dir / PLOT_NAME])  # what a rerun may replace
        if settings.output.update_model_card:
            add_to_model_card(Path(settings.models.model_dir), results, settings.data)
    print("\n" + report_table(results))
    print(f"\nResults: {output_dir / RESULTS_NAME}, {output_dir / PLOT_NAME}")
    return results


def command_line() -> None:
    """The process entry point: a refusal is one line and exit 2 (run_cli); a stop by SIGTERM or Ctrl-C is one
    line and exit 128 + the signal, with the scratch folders removed and no results written."""
    try:
        with stop_on_signals():
            run_cli(main, prog=PROG)
    except Stopped as stopped:
        print(
            f"{PROG}: stopped by {stopped}; nothing of this run was kept ({RESULTS_NAME} and the model card are "
            "written only once every fine-tuning run has finished); run the command again",
            file=sys.stderr,
            flush=True,
        )
        raise SystemExit(128 + stopped.signal_number) from None
