"""Held-out NSP accuracy of a trained folder over several fresh pairings of text it never trained on.

A run's own evaluation scores one pairing of the validation articles (a few hundred pairs, standard error
about 0.02), so two pairings of the same articles can differ by 0.05. This scores K pairings (seeds the run
never used), masked like the run's evaluation (15%, 80/10/10, fixed seed), and prints each pairing's
accuracy, their mean and spread, and the AUC of P(random) so that ranking and threshold can be told apart.

    python -m benchmarks.heldout_nsp runs/hfbert-quality                       # the shipped validation split
    python -m benchmarks.heldout_nsp runs/hfbert-quality --text_file other_articles.raw --pairings 10

A measurement tool, not a tuning signal: choose settings on a split of the training articles.
"""

import argparse
import statistics
from pathlib import Path

import datasets
import torch
from transformers import AutoTokenizer

from hfbert import HfBertForPreTraining
from hfbert.corpus import load_documents
from hfbert.corpus_arguments import SHIPPED_SAMPLE_DIR, SHIPPED_SAMPLE_FILES, CorpusArguments
from hfbert.pretraining.batches import DataCollatorForPretraining
from hfbert.pretraining.data import tokenize_documents
from hfbert.pretraining.instances import InstanceRecipe, write_instances


def auc(scores: torch.Tensor, labels: torch.Tensor) -> float:
    """P(score of a random pair > score of a real pair); ties count half."""
    random, real = scores[labels == 1], scores[labels == 0]
    greater = (random[:, None] > real[None]).float() + 0.5 * (random[:, None] == real[None]).float()
    return greater.mean().item()


@torch.no_grad()
def random_probabilities(model, tokenizer, instances, batch_size: int, seed: int) -> torch.Tensor:
    """(N,) P(B is random) for each instance, with 15% of tokens masked as in a run's evaluation."""
    collator = DataCollatorForPretraining(tokenizer, mlm_probability=0.15)  # pads and masks in one call
    probabilities = []
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        for start in range(0, len(instances), batch_size):
            rows = instances[start : start + batch_size]
            batch = collator(
                [
                    {"input_ids": ids, "token_type_ids": types}
                    for ids, types in zip(rows["input_ids"], rows["token_type_ids"], strict=True)
                ]
            )
            logits = model(
                input_ids=batch["input_ids"],
                attention_mask=batch["attention_mask"],
                token_type_ids=batch["token_type_ids"],
            ).seq_relationship_logits  # (B, 2)
            probabilities.append(logits.float().softmax(-1)[:, 1])
    return torch.cat(probabilities)


def main(argv: list[str] | None = None) -> list[float]:
    """Print the table; returns the accuracy of each pairing."""
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("model_dir", type=Path, help="a run's final folder (model and tokenizer)")
    parser.add_argument(
        "--text_file",
        type=Path,
        default=SHIPPED_SAMPLE_DIR / SHIPPED_SAMPLE_FILES["validation"],
        help="held-out text (default: the shipped validation split)",
    )
    parser.add_argument("--pairings", type=int, default=5, help="fresh pairings to score")
    parser.add_argument(
        "--seed", type=int, default=1000, help="seed of the pairings (runs use 42 by default)"
    )
    parser.add_argument("--max_seq_length", type=int, default=128)
    parser.add_argument("--batch_size", type=int, default=64)
    args = parser.parse_args(argv)
    if args.pairings < 1:
        parser.error(f"--pairings {args.pairings}: pass 1 or more")
    if not (args.model_dir / "config.json").is_file() or not (args.model_dir / "tokenizer.json").is_file():
        parser.error(f"{args.model_dir} has no config.json and tokenizer.json; pass a run's final folder")
    datasets.disable_progress_bars()  # one bar per pairing would bury the table
    tokenizer = AutoTokenizer.from_pretrained(args.model_dir)
    model = HfBertForPreTraining.from_pretrained(args.model_dir).eval()
    documents = load_documents(CorpusArguments(train_file=str(args.text_file)))["train"]
    tokenized = tokenize_documents(documents, tokenizer)
    accuracies = []
    print(f"\n{args.model_dir} on {args.text_file} ({len(documents)} documents)\n")
    print(
        "| pairing | pairs | NSP accuracy | AUC of P(random) | share predicted random |\n|---|---|---|---|---|"
    )
    for pairing in range(args.pairings):
        recipe = InstanceRecipe(
            "mlm+nsp", tokenizer.cls_token_id, tokenizer.sep_token_id, args.max_seq_length, seed=args.seed
        )
        instances = write_instances(tokenized, recipe, pass_index=pairing)
        labels = torch.tensor(instances["next_sentence_label"])
        probabilities = random_probabilities(
            model, tokenizer, instances, args.batch_size, args.seed + pairing
        )
        predicted = (probabilities > 0.5).long()
        accuracies.append((predicted == labels).float().mean().item())
        print(
            f"| {pairing} | {len(labels)} | {accuracies[-1]:.3f} | {auc(probabilities, labels):.3f} "
            f"| {predicted.float().mean().item():.2f} |"
        )
    spread = statistics.stdev(accuracies) if len(accuracies) > 1 else 0.0
    print(
        f"\nmean NSP accuracy over {args.pairings} pairings: {statistics.mean(accuracies):.3f} "
        f"(standard deviation across pairings {spread:.3f})"
    )
    return accuracies


if __name__ == "__main__":
    main()
