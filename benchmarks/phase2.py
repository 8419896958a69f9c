"""What BERT's phase 2 buys: held-out MLM accuracy on long instances after phase 1 alone, after phase 1 + a
short phase 2 at length 512 (--model_name_or_path phase 1's folder), and after phase 1 + the same number of
updates at length 128 (the control: more training without longer rows).

Everything runs as a user runs it (train_tokenizer.py, run_pretraining.py in subprocesses) on the shipped
WikiText-2 sample; each final folder is then scored on the validation split's NSP instances built at 128 and
at 512 tokens (15% masked, the same masks for every model), which no run trained on.

    python -m benchmarks.phase2 --work_dir /tmp/phase2
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # before datasets is imported: the sample is local
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import torch
from torch.utils.data import DataLoader
from transformers import AutoTokenizer

from hfbert import HfBertForPreTraining
from hfbert.corpus import load_documents
from hfbert.corpus_arguments import CorpusArguments
from hfbert.modeling_hfbert import IGNORE_INDEX
from hfbert.pretraining.batches import DataCollatorForPretraining, EpochDraws, InstanceDraws
from hfbert.pretraining.data import tokenize_documents
from hfbert.pretraining.instances import InstanceRecipe, write_instances

REPO = Path(__file__).resolve().parents[1]
SEED = 42


def run(script: str, *flags: str, log: Path) -> float:
    """Run one of the repository's CLIs; returns its wall seconds (raises with its log's tail on failure)."""
    start = time.perf_counter()
    with log.open("w") as out:
        result = subprocess.run([sys.executable, str(REPO / script), *flags], stdout=out, stderr=subprocess.STDOUT)
    if result.returncode:
        raise RuntimeError(f"{script} failed; see {log}:\n{log.read_text()[-3000:]}")
    return time.perf_counter() - start


def train(args: argparse.Namespace) -> dict[str, Path]:
    work = Path(args.work_dir)
    tokenizer, folders = work / "tokenizer", {}
    if not (tokenizer / "tokenizer.json").is_file():
        run("train_tokenizer.py", "--vocab_size", "8192", "--output_dir", str(tokenizer), log=work / "tokenizer.log")
    common = [
        "--tokenizer_name", str(tokenizer), "--dropout", "0", "--mixed_precision", "no",
        "--eval_steps", str(10**9), "--logging_steps", "100", "--dupe_factor", str(args.dupe_factor),
    ]  # fmt: skip
    phases = {
        "phase 1 (128)": [
            "--model_size", "tiny", "--max_seq_length", "128", "--max_predictions_per_seq", "20",
            "--per_device_train_batch_size", "32", "--learning_rate", "1e-3", "--num_warmup_steps", "200",
            "--max_train_steps", str(args.phase1_steps),
        ],
        "+ phase 2 (512)": [
            "--max_seq_length", "512", "--max_predictions_per_seq", "80", "--per_device_train_batch_size", "8",
            "--learning_rate", str(args.phase2_learning_rate), "--num_warmup_steps", str(args.phase2_steps // 10),
            "--max_train_steps", str(args.phase2_steps),
        ],
        "+ as many updates at 128 (control)": [
            "--max_seq_length", "128", "--max_predictions_per_seq", "20", "--per_device_train_batch_size", "32",
            "--learning_rate", str(args.phase2_learning_rate), "--num_warmup_steps", str(args.phase2_steps // 10),
            "--max_train_steps", str(args.phase2_steps),
        ],
    }  # fmt: skip
    for index, (name, flags) in enumerate(phases.items()):
        folder = work / f"run{index}"
        source = [] if index == 0 else ["--model_name_or_path", str(folders["phase 1 (128)"])]
        if not (folder / "model.safetensors").is_file():
            seconds = run("run_pretraining.py", *common, *source, *flags, "--output_dir", str(folder), log=work / f"run{index}.log")
            print(f"{name}: trained in {seconds:.0f} s", flush=True)
        folders[name] = folder
    return folders


@torch.no_grad()
def heldout_accuracy(folder: Path, max_seq_length: int, max_instances: int) -> tuple[float, float]:
    """(MLM accuracy, NSP accuracy) of `folder`'s model on validation instances of `max_seq_length`."""
    tokenizer = AutoTokenizer.from_pretrained(folder)
    model = HfBertForPreTraining.from_pretrained(folder).eval()
    validation = load_documents(CorpusArguments())["validation"]
    tokenized = tokenize_documents(validation, tokenizer)
    recipe = InstanceRecipe(
        "mlm+nsp", tokenizer.cls_token_id, tokenizer.sep_token_id, max_seq_length, short_seq_prob=0.0, seed=SEED
    )
    instances = write_instances(tokenized, recipe)
    instances = instances.select(range(min(max_instances, len(instances))))
    loader = DataLoader(
        InstanceDraws(instances),
        batch_size=16,
        sampler=EpochDraws(len(instances), SEED, shuffle=False),
        collate_fn=DataCollatorForPretraining(tokenizer, mlm_probability=0.15, seed=SEED),
    )
    correct = masked = nsp_correct = rows = 0
    for batch in loader:
        outputs = model(**batch)
        labels = batch["labels"]
        chosen = labels != IGNORE_INDEX
        correct += (outputs.prediction_logits.argmax(-1)[chosen] == labels[chosen]).sum().item()
        masked += chosen.sum().item()
        nsp_correct += (outputs.seq_relationship_logits.argmax(-1) == batch["next_sentence_label"]).sum().item()
        rows += len(labels)
    return correct / masked, nsp_correct / rows


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--work_dir", required=True, help="runs and logs go here; finished runs are reused")
    parser.add_argument("--phase1_steps", type=int, default=2000)
    parser.add_argument("--phase2_steps", type=int, default=200, help="updates of phase 2 and of the control")
    parser.add_argument("--phase2_learning_rate", type=float, default=5e-4)
    parser.add_argument("--dupe_factor", type=int, default=10)
    parser.add_argument("--max_eval_instances", type=int, default=256)
    args = parser.parse_args(argv)
    Path(args.work_dir).mkdir(parents=True, exist_ok=True)
    folders = train(args)
    print("\n| model | MLM acc. @128 | NSP acc. @128 | MLM acc. @512 | NSP acc. @512 |")
    print("|---|---|---|---|---|")
    for name, folder in folders.items():
        short = heldout_accuracy(folder, 128, args.max_eval_instances)
        long = heldout_accuracy(folder, 512, args.max_eval_instances)
        print(f"| {name} | {short[0]:.3f} | {short[1]:.3f} | {long[0]:.3f} | {long[1]:.3f} |", flush=True)


if __name__ == "__main__":
    main()
