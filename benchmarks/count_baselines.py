"""What a pretraining corpus allows before any model: count baselines for held-out MLM and NSP accuracy.

Counts come from the training split; scores are on the validation instances run_pretraining.py evaluates on
(the same NSP pairs), masked the same way (15% of tokens, 80/10/10, with the training collator; fixed seed):

- MLM: always the most frequent token; copy the input where it is not [MASK] (right at the 10% kept
  positions, wrong at the 10% random ones) and, at [MASK], the most frequent token or the best guess from
  bigram counts of the left and right neighbours.
- NSP: one threshold, fitted on training pairs, on the share of rare words A and B have in common.

    python -m benchmarks.count_baselines

Without --tokenizer_name it trains the tokenizer that the quality recipe's run trains (--vocab_size 8192 on the
training split, as run_pretraining.py does without --tokenizer_name). A reference for reading the quality
numbers, not a tuning signal.
"""

import argparse
import collections
import itertools
import math

import torch
from transformers import AutoTokenizer

from hfbert.corpus import load_documents
from hfbert.corpus_arguments import CorpusArguments
from hfbert.pretraining.batches import DataCollatorForPretraining
from hfbert.pretraining.data import tokenize_documents
from hfbert.pretraining.instances import InstanceRecipe, write_instances
from hfbert.tokenization import train_tokenizer

CANDIDATES = 3000  # bigram predictions are searched among the most frequent tokens
COMMON_WORDS = 200  # NSP overlap ignores the most frequent tokens


def bigram_model(documents: list[list[list[int]]]) -> tuple[collections.Counter, collections.Counter]:
    unigrams, bigrams = collections.Counter(), collections.Counter()
    for sentences in documents:
        tokens = [token for sentence in sentences for token in sentence]
        unigrams.update(tokens)
        bigrams.update(itertools.pairwise(tokens))
    return unigrams, bigrams


def mlm_accuracies(instances, tokenizer, unigrams, bigrams) -> dict[str, float]:
    total, vocab = sum(unigrams.values()), len(tokenizer)
    most_frequent = unigrams.most_common(1)[0][0]
    candidates = [token for token, _ in unigrams.most_common(CANDIDATES)]
    unusable = set(tokenizer.all_special_ids)  # [MASK], [CLS], [SEP] and padding say nothing as neighbours

    def log_next(a: int, b: int) -> float:  # log P(b | a), add-0.1 smoothing towards the unigram
        prior = (unigrams[b] + 1) / total
        return math.log((bigrams[(a, b)] + 0.1 * prior * vocab) / (unigrams[a] + 0.1 * vocab))

    def bigram_guess(left: int | None, right: int | None) -> int:
        def score(word: int) -> float:
            value = math.log(unigrams[word] + 1) if left is None else log_next(left, word)
            return value + (0.0 if right is None else log_next(word, right))

        return max(candidates, key=score)

    collator = DataCollatorForPretraining(tokenizer, mlm_probability=0.15)
    torch.manual_seed(42)
    correct, count = collections.Counter(), 0
    for row in instances:
        inputs, labels = collator.mask_tokens(torch.tensor([row["input_ids"]]))
        inputs, labels = inputs[0].tolist(), labels[0].tolist()
        for i, label in enumerate(labels):
            if label == -100:
                continue
            count += 1
            copied = inputs[i] != tokenizer.mask_token_id  # a model cannot tell kept from random tokens
            left = inputs[i - 1] if inputs[i - 1] not in unusable else None
            right = inputs[i + 1] if i + 1 < len(inputs) and inputs[i + 1] not in unusable else None
            correct["unigram"] += label == most_frequent
            guess = inputs[i] if copied else most_frequent
            correct["copy, else most frequent"] += guess == label
            guess = inputs[i] if copied else bigram_guess(left, right)
            correct["copy, else bigram"] += guess == label
    return {name: value / count for name, value in correct.items()}


def nsp_accuracy(train_instances, eval_instances, unigrams, tokenizer) -> tuple[float, float]:
    common = {token for token, _ in unigrams.most_common(COMMON_WORDS)} | set(tokenizer.all_special_ids)

    def overlap(row) -> float:
        a, b = set(), set()
        for token, segment in zip(row["input_ids"], row["token_type_ids"], strict=True):
            if token not in common:
                (b if segment else a).add(token)
        return len(a & b) / math.sqrt(max(1, len(a)) * max(1, len(b)))

    def accuracy(pairs, threshold) -> float:  # label 0 = B follows A
        return sum((value > threshold) == (label == 0) for value, label in pairs) / len(pairs)

    train = [(overlap(row), row["next_sentence_label"]) for row in train_instances]
    threshold = max(sorted({value for value, _ in train}), key=lambda t: accuracy(train, t))
    return accuracy(train, threshold), accuracy([(overlap(r), r["next_sentence_label"]) for r in eval_instances], threshold)


def main(argv: list[str] | None = None) -> dict[str, float]:
    """Print the table; return each predictor's held-out accuracy by its name in the table."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tokenizer_name", help="a train_tokenizer.py folder (default: train one of --vocab_size)")
    parser.add_argument("--vocab_size", type=int, default=8192, help="the tokenizer trained without --tokenizer_name")
    parser.add_argument("--max_seq_length", type=int, default=128)
    args = parser.parse_args(argv)
    documents = load_documents(CorpusArguments())
    if args.tokenizer_name is None:
        tokenizer = train_tokenizer(documents["train"], vocab_size=args.vocab_size, show_progress=False)
    else:
        tokenizer = AutoTokenizer.from_pretrained(args.tokenizer_name)
    tokenized = {split: tokenize_documents(documents[split], tokenizer) for split in ("train", "validation")}
    recipe = InstanceRecipe("mlm+nsp", tokenizer.cls_token_id, tokenizer.sep_token_id, args.max_seq_length, seed=42)
    train_instances = write_instances(tokenized["train"], recipe)
    eval_instances = write_instances(tokenized["validation"], recipe)
    unigrams, bigrams = bigram_model(tokenized["train"]["sentences"])
    print(f"\n{len(eval_instances)} validation instances; counts from {sum(unigrams.values())} training tokens\n")
    print("| predictor | held-out accuracy |\n|---|---|")
    accuracies = {f"MLM: {name}": value for name, value in mlm_accuracies(eval_instances, tokenizer, unigrams, bigrams).items()}
    for name, value in accuracies.items():
        print(f"| {name} | {value:.3f} |")
    fitted, accuracies["NSP"] = nsp_accuracy(train_instances, eval_instances, unigrams, tokenizer)
    print(f"| NSP: rare-word overlap of A and B, one threshold (training pairs: {fitted:.3f}) | {accuracies['NSP']:.3f} |")
    return accuracies


if __name__ == "__main__":
    main()
