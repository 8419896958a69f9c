"""Seconds to the first update, MB of text per second per process, cache bytes per byte of text and peak memory
of hfbert's data stage against what a user would do instead: transformers' run_mlm.py preprocessing (issue 32).

For each corpus size (``--megabytes``) and number of preprocessing processes (``--workers``), two programs run
in fresh processes on the same text, the same tokenizer and the same number of processes, each with a new,
empty ``HF_DATASETS_CACHE``:

- **hfbert**: ``run_pretraining.py --train_file X --validation_file V --tokenizer_name T --model_size tiny
  --max_seq_length 128 --dupe_factor D --max_train_steps 1 --preprocessing_num_workers W --mixed_precision no
  --max_eval_samples 32 --output_dir O``, driven only through its command line.
- **run_mlm**: what transformers' examples/pytorch/language-modeling/run_mlm.py does with ``--train_file X
  --validation_file V --tokenizer_name T --max_seq_length 128 --preprocessing_num_workers W`` (both splits):
  ``load_dataset("text", data_files=...)``, ``map(tokenize_function, batched=True, num_proc=W,
  remove_columns=["text"])`` with ``return_special_tokens_mask=True``, ``map(group_texts, batched=True,
  num_proc=W)`` into 128-token blocks, a ``BertForMaskedLM`` of hfbert's tiny size (2 layers, 128 wide, 2 heads,
  ``from_config`` then ``resize_token_embeddings`` as the script does), ``DataCollatorForLanguageModeling``
  (15%) and one AdamW update on one shuffled batch of 32 (the script hands these to Trainer; here the update is
  written out, so Trainer's own start-up is not counted against the baseline).

The corpus is the shipped sample's training text (``hfbert.corpus.SHIPPED_SAMPLE_FILES``) repeated, and cut
at a line, to the size asked for (1 MB = 10^6 bytes); it keeps WikiText's layout, so hfbert groups it with
``--document_boundary heading``. The validation file is the shipped one. The tokenizer (``--vocab_size``,
8192) is trained once on the sample with train_tokenizer.py before anything is timed. Both sides run fp32 and
with ``TOKENIZERS_PARALLELISM=false``, so that each preprocessing process tokenizes on one core.

How each column is measured:

- **s to first update**: from just before the process is started (so imports, model creation and the whole
  data stage count) to the moment the first optimizer update is done. hfbert: the first time its stderr shows
  the progress bar at ``pretraining: ... 1/N``: the loop moves the bar right after each update, and refreshes
  it (``set_postfix``) when it logs that update, which it always does for the last one; stderr is read as it is
  written, so evaluation and the final folder written after the update are not counted. The library holds no
  benchmark hook. Should the bar ever not be found, the process's whole wall time is used and the number is
  marked ``(wall)``. run_mlm: the baseline process writes a line to stderr right after ``optimizer.step()``
  and ends.
- **CPU s**: the user and system CPU seconds the process and its descendants (the ended ones too) had used at
  that moment (psutil). On a shared machine wall time grows with the other jobs' load and CPU time much less:
  CPU s is the steadier number for comparing sides and sizes, wall time the one that shows parallel speed-up.
- **MB/s per process**: text MB (the training file) / s to first update / W.
- **cache bytes / text byte**: the bytes of files in the run's fresh ``HF_DATASETS_CACHE`` after it ended (for
  hfbert plus whatever the run left in sub-folders of its output folder: the top-level files there are the
  final model folder, which does not depend on the corpus), over the training file's bytes.
- **peak RSS, all (main)**: the largest sum of resident memory over the process and all its descendants
  (datasets' ``num_proc`` workers), and in brackets the largest of the process alone, sampled with psutil
  every 0.1 s. datasets 5 runs even ``num_proc=1`` in one forked worker per ``map``, and the pages a worker
  shares with the process it was forked from (torch and the libraries, ~350 MiB) count in both, so the sum is
  an upper bound and the main process alone a lower one; proportional set sizes (PSS) would split shared pages,
  but reading them costs tens of ms per process and sample, a core's worth at this rate on a 2-core machine.
  Memory-mapped Arrow pages that were touched count, as they do in RSS.
- **second run s**: the same command again on the now-filled cache (new output folder): how long a second run
  with the same inputs waits for its first update, and whether it added to the cache (a warning says so).

Then the ratio of hfbert's time to the baseline's, and below the table how time grows with the corpus (linear:
the ratio of the sizes) and with W (linear: the ratio of the process counts). Runs of the two sides alternate
(hfbert first for one pair, the baseline first for the next), so load from other jobs hits both.

    python -m benchmarks.bench_data_stage --megabytes 10 100 --workers 1 2 [--dupe_factor 5] [--json out.json]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import resource
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # before datasets is imported: everything here is local
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")

REPO = Path(__file__).resolve().parents[1]  # `python -m benchmarks.<name>` runs from here
SIDES = ("hfbert", "run_mlm")
MB = 1e6
MIB = 1024 * 1024
POLL_SECONDS = 0.1
BATCH_SIZE = 32
# The loop's tqdm bar after the first update: "pretraining: 100%|##########| 1/1 [00:00<00:00, 1.31step/s]".
HFBERT_FIRST_UPDATE = re.compile(rb"pretraining:[^\r\n]*?\|\s*1/\d+\s")
BASELINE_FIRST_UPDATE = "bench_data_stage: first update done"
TINY = {"num_hidden_layers": 2, "hidden_size": 128, "num_attention_heads": 2}  # hfbert's PRESETS["tiny"]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--megabytes", type=float, nargs="+", default=[10.0, 100.0], help="corpus sizes (10^6 B)"
    )
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 2], help="--preprocessing_num_workers")
    parser.add_argument("--dupe_factor", type=int, default=5, help="hfbert's passes over the corpus")
    parser.add_argument("--max_seq_length", type=int, default=128)
    parser.add_argument("--vocab_size", type=int, default=8192, help="of the tokenizer both sides use")
    parser.add_argument("--sides", nargs="+", choices=SIDES, default=list(SIDES))
    parser.add_argument(
        "--no_second_run", action="store_true", help="skip the second run on the filled cache"
    )
    parser.add_argument(
        "--workdir", default=None, help="where corpora, caches and runs go (default: a temp dir)"
    )
    parser.add_argument("--json", default=None, help="also write the rows to this file")
    parser.add_argument("--logs", default=None, help="keep each run's stdout and stderr in this folder")
    # The baseline's own process: TRAIN_FILE VALIDATION_FILE TOKENIZER.
    parser.add_argument("--baseline_run", nargs=3, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--baseline_workers", type=int, default=1, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if min(args.megabytes) <= 0:
        parser.error("--megabytes must be > 0")
    for name in ("dupe_factor", "max_seq_length", "vocab_size"):
        if getattr(args, name) < 1:
            parser.error(f"--{name} {getattr(args, name)} must be >= 1")
    if min(args.workers) < 1:
        parser.error("--workers must be >= 1")
    return args


def baseline_run(
    train_file: str, validation_file: str, tokenizer_name: str, workers: int, max_seq_length: int
) -> None:
    """run_mlm.py's data path (not --line_by_line) up to the first update, in this process."""
    from itertools import chain

    import datasets
    import torch
    from torch.utils.data import DataLoader
    from transformers import AutoModelForMaskedLM, AutoTokenizer, BertConfig, DataCollatorForLanguageModeling

    raw_datasets = datasets.load_dataset(
        "text", data_files={"train": train_file, "validation": validation_file}
    )
    tokenizer = AutoTokenizer.from_pretrained(tokenizer_name)
    config = BertConfig(vocab_size=len(tokenizer), intermediate_size=4 * TINY["hidden_size"], **TINY)
    torch.manual_seed(42)
    model = AutoModelForMaskedLM.from_config(config)
    model.resize_token_embeddings(len(tokenizer))
    column_names = raw_datasets["train"].column_names
    text_column_name = "text" if "text" in column_names else column_names[0]

    def tokenize_function(examples):
        return tokenizer(examples[text_column_name], return_special_tokens_mask=True)

    tokenized_datasets = raw_datasets.map(
        tokenize_function,
        batched=True,
        num_proc=workers,
        remove_columns=column_names,
        desc="Running tokenizer on every text in dataset",
    )

    def group_texts(examples):  # run_mlm.py's, as written there
        concatenated_examples = {k: list(chain(*examples[k])) for k in examples.keys()}  # noqa: SIM118
        total_length = len(concatenated_examples[list(examples.keys())[0]])  # noqa: RUF015
        if total_length >= max_seq_length:
            total_length = (total_length // max_seq_length) * max_seq_length
        return {
            k: [t[i : i + max_seq_length] for i in range(0, total_length, max_seq_length)]
            for k, t in concatenated_examples.items()
        }

    tokenized_datasets = tokenized_datasets.map(
        group_texts, batched=True, num_proc=workers, desc=f"Grouping texts in chunks of {max_seq_length}"
    )
    collator = DataCollatorForLanguageModeling(tokenizer=tokenizer, mlm_probability=0.15)
    generator = torch.Generator().manual_seed(42)
    loader = DataLoader(
        tokenized_datasets["train"],
        batch_size=BATCH_SIZE,
        shuffle=True,
        collate_fn=collator,
        generator=generator,
    )
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.01)
    model.train()
    loss = model(**next(iter(loader))).loss
    loss.backward()
    optimizer.step()
    optimizer.zero_grad()
    print(BASELINE_FIRST_UPDATE, f"loss {loss.item():.3f}", file=sys.stderr, flush=True)


def generated_corpus(folder: Path, megabytes: float) -> Path:
    """The shipped sample's training text repeated to `megabytes` (the last copy cut after a line), as a
    WikiText .raw file, and the shipped validation file beside it as wiki.valid.raw."""
    from hfbert.corpus_arguments import SHIPPED_SAMPLE_DIR, SHIPPED_SAMPLE_FILES

    text = (SHIPPED_SAMPLE_DIR / SHIPPED_SAMPLE_FILES["train"]).read_bytes()
    target = int(megabytes * MB)
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "wiki.train.raw"
    copies, rest = divmod(target, len(text))
    with path.open("wb") as file:
        for _ in range(copies):
            file.write(text)
        file.write(text[: text.rfind(b"\n", 0, rest) + 1])  # the lines that fit in the rest
    shutil.copy(SHIPPED_SAMPLE_DIR / SHIPPED_SAMPLE_FILES["validation"], folder / "wiki.valid.raw")
    return path


def files_bytes(folder: Path) -> int:
    """Bytes of the files under `folder` (0 if it does not exist)."""
    return sum(path.stat().st_size for path in folder.rglob("*") if path.is_file() and not path.is_symlink())


def tree_rss(process) -> tuple[int, int]:
    """Resident bytes of `process` (a psutil.Process) and all its descendants together, and of `process` alone."""
    import psutil

    try:
        members = [process, *process.children(recursive=True)]
    except psutil.Error:
        return 0, 0
    sizes = [0] * len(members)
    for index, member in enumerate(members):
        with contextlib.suppress(psutil.Error):  # a worker that just ended
            sizes[index] = member.memory_info().rss
    return sum(sizes), sizes[0]


def tree_cpu_seconds(process) -> float:
    """CPU seconds (user + system) so far of `process` (a psutil.Process), its live descendants and the
    descendants that ended and were waited for."""
    import psutil

    total = 0.0
    try:
        members = [process, *process.children(recursive=True)]
    except psutil.Error:
        return 0.0
    for member in members:
        with contextlib.suppress(psutil.Error):
            times = member.cpu_times()
            total += times.user + times.system + times.children_user + times.children_system
    return total


def measure(
    command: list[str], env: dict[str, str], marker: re.Pattern[bytes], log: Path
) -> dict[str, float]:
    """Runs `command`; returns the seconds from its start to the first `marker` on its stderr (or to its end,
    `marker_found` False), its wall seconds and the peak RSS of its process tree and of the process alone.
    stdout and stderr go to `log`."""
    import psutil

    found: list[float] = []
    cpu_at_marker: list[float] = []
    children_before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    with log.open("wb") as output:
        process = subprocess.Popen(command, cwd=REPO, env=env, stdout=output, stderr=subprocess.PIPE)

        def read_stderr() -> None:
            seen = b""
            while chunk := os.read(process.stderr.fileno(), 65536):
                now = time.perf_counter()
                output.write(chunk)
                seen = seen[-4096:] + chunk  # a bar split across reads is still found
                if not found and marker.search(seen):
                    found.append(now)
                    cpu_at_marker.append(tree_cpu_seconds(handle))

        handle = psutil.Process(process.pid)
        reader = threading.Thread(target=read_stderr, daemon=True)
        reader.start()
        peak, main_peak = 0, 0
        try:
            while process.poll() is None:
                tree, main = tree_rss(handle)
                peak, main_peak = max(peak, tree), max(main_peak, main)
                time.sleep(POLL_SECONDS)
        finally:
            if process.poll() is None:  # interrupted: the run and its workers do not outlive the benchmark
                for member in [*handle.children(recursive=True), handle]:
                    with contextlib.suppress(psutil.Error):
                        member.kill()
                process.wait()
        end = time.perf_counter()
        reader.join()
        process.stderr.close()
    children_after = resource.getrusage(resource.RUSAGE_CHILDREN)
    total_cpu = sum(
        getattr(children_after, name) - getattr(children_before, name) for name in ("ru_utime", "ru_stime")
    )
    if process.returncode != 0:
        tail = log.read_bytes()[-3000:].decode("utf-8", "replace")
        raise SystemExit(f"{' '.join(command)} exited {process.returncode}:\n{tail}")
    return {
        "seconds": (found[0] if found else end) - start,
        "cpu_seconds": cpu_at_marker[0] if found else total_cpu,
        "marker_found": bool(found),
        "total_cpu_seconds": total_cpu,
        "wall_seconds": end - start,
        "peak_rss_mib": peak / MIB,
        "main_peak_rss_mib": main_peak / MIB,
        "load_average": os.getloadavg()[0],  # 1-minute, at the end: how busy the machine was meanwhile
    }


def side_command(side: str, corpus: Path, tokenizer: Path, workers: int, output_dir: Path, args) -> list[str]:
    validation = corpus.parent / "wiki.valid.raw"
    if side == "run_mlm":
        return [
            sys.executable, "-m", "benchmarks.bench_data_stage", "--baseline_run", str(corpus), str(validation),
            str(tokenizer), "--baseline_workers", str(workers), "--max_seq_length", str(args.max_seq_length),
        ]  # fmt: skip
    return [
        sys.executable, "run_pretraining.py", "--train_file", str(corpus), "--validation_file", str(validation),
        "--document_boundary", "heading", "--tokenizer_name", str(tokenizer), "--model_size", "tiny",
        "--max_seq_length", str(args.max_seq_length), "--dupe_factor", str(args.dupe_factor),
        "--max_train_steps", "1", "--per_device_train_batch_size", str(BATCH_SIZE),
        "--preprocessing_num_workers", str(workers), "--mixed_precision", "no", "--max_eval_samples", "32",
        "--per_device_eval_batch_size", "32", "--seed", "42", "--output_dir", str(output_dir),
    ]  # fmt: skip


def cache_bytes(side: str, cache: Path, output_dir: Path) -> int:
    """The run's datasets cache, and for hfbert anything in sub-folders of its output folder."""
    extra = 0
    if side == "hfbert" and output_dir.is_dir():
        extra = sum(files_bytes(child) for child in output_dir.iterdir() if child.is_dir())
    return files_bytes(cache) + extra


def measure_side(side: str, corpus: Path, tokenizer: Path, workers: int, work: Path, args) -> dict:
    """One side at one size and number of processes: a first run on a fresh cache, then (unless
    --no_second_run) a second one on the filled cache. The cache and runs are deleted afterwards."""
    name = f"{side}-{corpus.parent.name}-w{workers}"
    cache, first_dir, second_dir = work / f"cache-{name}", work / f"run-{name}", work / f"run-{name}-again"
    env = {**os.environ, "HF_DATASETS_CACHE": str(cache), "TOKENIZERS_PARALLELISM": "false"}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    marker = (
        HFBERT_FIRST_UPDATE if side == "hfbert" else re.compile(re.escape(BASELINE_FIRST_UPDATE.encode()))
    )
    try:
        command = side_command(side, corpus, tokenizer, workers, first_dir, args)
        row = measure(command, env, marker, work / f"{name}.log")
        text_bytes = corpus.stat().st_size
        cached = cache_bytes(side, cache, first_dir)
        row.update(side=side, megabytes=text_bytes / MB, workers=workers, cache_bytes=cached)
        row["mb_per_second_per_process"] = text_bytes / MB / row["seconds"] / workers
        row["cache_bytes_per_text_byte"] = cached / text_bytes
        if side == "hfbert":
            row["output_dir_bytes"] = files_bytes(first_dir)
        if not args.no_second_run:
            command = side_command(side, corpus, tokenizer, workers, second_dir, args)
            again = measure(command, env, marker, work / f"{name}-again.log")
            row["second_run_seconds"] = again["seconds"]
            row["second_run_new_cache_bytes"] = cache_bytes(side, cache, first_dir) - cached
    finally:
        for folder in (cache, first_dir, second_dir):
            shutil.rmtree(folder, ignore_errors=True)
        if args.logs:
            Path(args.logs).mkdir(parents=True, exist_ok=True)
            for log in work.glob(f"{name}*.log"):
                shutil.copy(log, Path(args.logs) / log.name)
    return row


def train_tokenizer(folder: Path, vocab_size: int) -> None:
    """train_tokenizer.py on the shipped sample, untimed."""
    command = [sys.executable, "train_tokenizer.py", "--vocab_size", str(vocab_size), "--output_dir", str(folder)]  # fmt: skip
    subprocess.run(command, cwd=REPO, check=True, capture_output=True)


def markdown_table(rows: list[dict]) -> str:
    lines = [
        "| side | corpus MB | workers | s to first update | CPU s | MB/s per process | cache bytes / text byte | "
        "peak RSS MiB, all (main) | second run s | hfbert / run_mlm s (CPU s) |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for row in rows:
        seconds = f"{row['seconds']:.1f}" + ("" if row["marker_found"] else " (wall)")
        second = f"{row['second_run_seconds']:.1f}" if "second_run_seconds" in row else "-"
        ratio = f"{row['time_ratio']:.2f} ({row['cpu_ratio']:.2f})" if "time_ratio" in row else "-"
        lines.append(
            f"| {row['side']} | {row['megabytes']:.3g} | {row['workers']} | {seconds} | {row['cpu_seconds']:.1f} | "
            f"{row['mb_per_second_per_process']:.2f} | {row['cache_bytes_per_text_byte']:.2f} | "
            f"{row['peak_rss_mib']:.0f} ({row['main_peak_rss_mib']:.0f}) | {second} | {ratio} |"
        )
    return "\n".join(lines)


def scaling_lines(rows: list[dict], workers: list[int]) -> list[str]:
    """Time against corpus size (at each W) and against W (at each size), for each side."""
    seconds = {(row["side"], row["megabytes"], row["workers"]): row["seconds"] for row in rows}
    cpu = {(row["side"], row["megabytes"], row["workers"]): row["cpu_seconds"] for row in rows}
    sides = [side for side in SIDES if any(row["side"] == side for row in rows)]
    megabytes = sorted({row["megabytes"] for row in rows})
    lines = []
    if len(megabytes) > 1:
        small, large = megabytes[0], megabytes[-1]
        for count in workers:
            ratios = ", ".join(
                f"{side} {seconds[side, large, count] / seconds[side, small, count]:.1f}x "
                f"(CPU {cpu[side, large, count] / cpu[side, small, count]:.1f}x)"
                for side in sides
            )
            lines.append(f"- time at {large:.3g} MB / at {small:.3g} MB, {count} worker(s): {ratios} "
                         f"(linear: {large / small:.1f}x)")  # fmt: skip
    if len(workers) > 1:
        few, many = min(workers), max(workers)
        for size in megabytes:
            ratios = ", ".join(
                f"{side} {seconds[side, size, few] / seconds[side, size, many]:.2f}x" for side in sides
            )
            lines.append(f"- speed-up from {few} to {many} workers at {size:.3g} MB: {ratios} "
                         f"(linear: {many / few:.2f}x)")  # fmt: skip
    return lines


def main(argv: list[str] | None = None) -> list[dict]:
    args = parse_args(argv)
    if args.baseline_run is not None:
        baseline_run(*args.baseline_run, workers=args.baseline_workers, max_seq_length=args.max_seq_length)
        return []
    parent = Path(args.workdir) if args.workdir else None
    if parent is not None:
        parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="bench-data-stage-", dir=parent))
    rows: list[dict] = []
    try:
        train_tokenizer(work / "tokenizer", args.vocab_size)
        pair = 0
        for megabytes in args.megabytes:
            corpus = generated_corpus(work / f"corpus-{megabytes:g}MB", megabytes)
            for workers in args.workers:
                order = args.sides if pair % 2 == 0 else args.sides[::-1]  # alternate who goes first
                pair += 1
                measured = {
                    side: measure_side(side, corpus, work / "tokenizer", workers, work, args)
                    for side in order
                }
                if len(measured) == 2:
                    hfbert, run_mlm = measured["hfbert"], measured["run_mlm"]
                    hfbert["time_ratio"] = hfbert["seconds"] / run_mlm["seconds"]
                    hfbert["cpu_ratio"] = hfbert["cpu_seconds"] / run_mlm["cpu_seconds"]
                rows += [measured[side] for side in SIDES if side in measured]
                print(f"[{megabytes:g} MB, {workers} worker(s)] "
                      + ", ".join(f"{side} {row['seconds']:.1f} s" for side, row in measured.items()),
                      file=sys.stderr, flush=True)  # fmt: skip
            shutil.rmtree(corpus.parent)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    report(rows, args)
    return rows


def report(rows: list[dict], args: argparse.Namespace) -> None:
    import torch
    import transformers

    from benchmarks.bench_pretraining import describe_machine

    print(f"Data stage to the first update: hfbert run_pretraining.py (tiny, --dupe_factor {args.dupe_factor}) "
          f"against run_mlm.py's preprocessing; --max_seq_length {args.max_seq_length}, a {args.vocab_size}-token "
          f"tokenizer; {describe_machine(torch.device('cpu'))}, transformers {transformers.__version__}\n")  # fmt: skip
    print(markdown_table(rows))
    lines = scaling_lines(rows, args.workers)
    if lines:
        print("\n" + "\n".join(lines))
    loads = [row["load_average"] for row in rows]
    if loads:
        print(f"\n1-minute load average at the end of each first run: {min(loads):.1f} to {max(loads):.1f} "
              f"({os.cpu_count()} cores)")  # fmt: skip
    for row in rows:
        if row.get("second_run_new_cache_bytes", 0) > 0.01 * row["cache_bytes"]:
            print(f"\nwarning: {row['side']}'s second run at {row['megabytes']:.3g} MB, {row['workers']} worker(s) "
                  f"added {row['second_run_new_cache_bytes'] / MIB:.0f} MiB to the cache")  # fmt: skip
        if not row["marker_found"]:
            print(f"\nwarning: no first update seen on {row['side']}'s stderr at {row['megabytes']:.3g} MB; "
                  "its wall time is shown")  # fmt: skip
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1) + "\n")


if __name__ == "__main__":
    main()
