"""Peak resident memory of a whole pretraining run, split into the data stage and the loop's first updates, at
corpus sizes that differ by 10x or more: does memory grow with the corpus, and by how much?

Each size is the shipped sample's training text repeated (a generated corpus: only its size matters here),
run as `run_pretraining.py` in a fresh process (tiny model, a tokenizer trained once, untimed, on the sample).
A thread samples the process's VmRSS from /proc every 20 ms; the log line that closes the data stage
("... training instances ...") splits the samples into the data stage and the loop. Memory-mapped Arrow pages
that the process touched count in VmRSS, as they do for the operating system.

    python -m benchmarks.bench_run_memory --copies 1 10 --dupe_factor 5
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # before datasets is imported: the sample is local
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

REPO = Path(__file__).resolve().parents[1]
DATA_STAGE_DONE = "training instances"  # run.py logs it once the instances (and the model) exist, before the loop
MIB = 1024 * 1024


def resident_bytes(pid: int) -> dict[str, int]:
    """VmRSS (all resident pages) and RssAnon (the process's own memory: not file pages the kernel can drop)."""
    try:
        lines = Path(f"/proc/{pid}/status").read_text().splitlines()
    except (FileNotFoundError, ProcessLookupError):
        return {}
    fields = dict(line.split(":", 1) for line in lines if line.startswith(("VmRSS:", "RssAnon:")))
    return {name: int(value.split()[0]) * 1024 for name, value in fields.items()}


def run_and_sample(command: list[str], env: dict[str, str]) -> dict[str, float]:
    """Runs `command`; returns the peak RSS and anonymous RSS before and after the data stage closed, the
    instances and the seconds."""
    process = subprocess.Popen(command, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    peaks = {(phase, field): 0 for phase in ("data", "loop") for field in ("VmRSS", "RssAnon")}
    phase = ["data"]  # the reader thread moves it on; the sampler reads it
    lines: list[str] = []

    def read_output() -> None:
        for line in process.stdout:
            lines.append(line)
            if DATA_STAGE_DONE in line:
                phase[0] = "loop"

    reader = threading.Thread(target=read_output, daemon=True)
    reader.start()
    start = time.perf_counter()
    while process.poll() is None:
        for field, value in resident_bytes(process.pid).items():
            peaks[phase[0], field] = max(peaks[phase[0], field], value)
        time.sleep(0.02)
    reader.join()
    if process.returncode != 0:
        raise SystemExit(f"{' '.join(command)} exited {process.returncode}:\n{''.join(lines[-20:])}")
    summary = next(line for line in lines if DATA_STAGE_DONE in line)
    instances = int(summary.split(DATA_STAGE_DONE)[0].split()[-1])
    return {"data_mib": peaks["data", "VmRSS"] / MIB, "data_anon_mib": peaks["data", "RssAnon"] / MIB,
            "loop_mib": peaks["loop", "VmRSS"] / MIB, "loop_anon_mib": peaks["loop", "RssAnon"] / MIB,
            "instances": instances, "seconds": time.perf_counter() - start}  # fmt: skip


def generated_corpus(folder: Path, copies: int) -> Path:
    """The shipped sample's training text `copies` times over, as a WikiText .raw file."""
    from hfbert.corpus_arguments import SHIPPED_SAMPLE_DIR, SHIPPED_SAMPLE_FILES

    text = (SHIPPED_SAMPLE_DIR / SHIPPED_SAMPLE_FILES["train"]).read_text(encoding="utf-8")
    folder.mkdir(parents=True)
    path = folder / "wiki.train.raw"
    with path.open("w", encoding="utf-8") as file:
        for _ in range(copies):
            file.write(text)
    shutil.copy(SHIPPED_SAMPLE_DIR / SHIPPED_SAMPLE_FILES["validation"], folder / "wiki.valid.raw")
    return path


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--copies", type=int, nargs="+", default=[1, 10], help="corpus sizes, in sample copies")
    parser.add_argument("--dupe_factor", type=int, default=5)
    parser.add_argument("--max_train_steps", type=int, default=30, help="the loop's first updates")
    parser.add_argument("--vocab_size", type=int, default=8192)
    args = parser.parse_args(argv)
    if min(args.copies) < 1 or args.dupe_factor < 1 or args.max_train_steps < 1:
        parser.error("--copies, --dupe_factor and --max_train_steps must be >= 1")
    return args


def main(argv: list[str] | None = None) -> list[dict[str, float]]:
    args = parse_args(argv)
    from benchmarks.bench_pretraining import describe_machine
    from hfbert.corpus import load_documents
    from hfbert.corpus_arguments import CorpusArguments
    from hfbert.tokenization import train_tokenizer

    work = Path(tempfile.mkdtemp(prefix="bench-run-memory-"))
    rows = []
    try:
        tokenizer = train_tokenizer(load_documents(CorpusArguments())["train"], vocab_size=args.vocab_size)
        tokenizer.save_pretrained(work / "tokenizer")
        for copies in args.copies:
            corpus = generated_corpus(work / f"corpus-{copies}", copies)
            env = {**os.environ, "HF_DATASETS_CACHE": str(work / f"cache-{copies}")}  # no cache from another size
            command = [
                sys.executable, "run_pretraining.py", "--train_file", str(corpus),
                "--validation_file", str(corpus.parent / "wiki.valid.raw"), "--tokenizer_name", str(work / "tokenizer"),
                "--model_size", "tiny", "--dupe_factor", str(args.dupe_factor), "--max_train_steps",
                str(args.max_train_steps), "--per_device_train_batch_size", "16", "--max_eval_samples", "64",
                "--eval_steps", "100000", "--logging_steps", "10", "--output_dir", str(work / f"run-{copies}"),
            ]  # fmt: skip
            row = run_and_sample(command, env)
            row.update(copies=copies, corpus_mib=corpus.stat().st_size / MIB)
            rows.append(row)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    import torch

    print(f"Peak RSS of run_pretraining.py (tiny, --dupe_factor {args.dupe_factor}, {args.max_train_steps} updates); "
          f"{describe_machine(torch.device('cpu'))}\n")  # fmt: skip
    print("| corpus MiB | training instances | data stage peak MiB (anonymous) | loop peak MiB (anonymous) | seconds |"
          "\n|---:|---:|---:|---:|---:|")  # fmt: skip
    for row in rows:
        print(f"| {row['corpus_mib']:.1f} | {row['instances']:,} | {row['data_mib']:.0f} ({row['data_anon_mib']:.0f}) | "
              f"{row['loop_mib']:.0f} ({row['loop_anon_mib']:.0f}) | {row['seconds']:.0f} |")  # fmt: skip
    if len(rows) > 1:
        first, last = rows[0], rows[-1]
        extra = (last["instances"] - first["instances"]) / 1e6
        keys = ("data_mib", "data_anon_mib", "loop_mib", "loop_anon_mib")
        names = ("data stage", "data stage, anonymous", "loop", "loop, anonymous")
        for key, name in zip(keys, names, strict=True):
            print(f"\n{name}: {last[key] - first[key]:+.0f} MiB for {extra:.2f}M more instances "
                  f"({(last[key] - first[key]) / extra:.0f} MiB per million)")  # fmt: skip
    return rows


if __name__ == "__main__":
    main()
