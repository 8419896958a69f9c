"""WordPiece tokenizer training, and the link between a tokenizer and the model config built for it.

The tokenizer is a stock `transformers.BertTokenizer` (backed by the `tokenizers` library: BERT normalizer
with clean-text, CJK spacing and accent stripping tied to lower-casing; BERT pre-tokenizer; WordPiece with
``##`` continuations; ``[CLS] A [SEP]`` / ``[CLS] A [SEP] B [SEP]`` post-processor with token type ids 0/1;
WordPiece decoder). Its vocabulary is trained with ``train_new_from_iterator``, fed batches of paragraphs
streamed from the documents, so the corpus is never held in memory as one string.

Two guards around the `tokenizers` trainer:

* Work per input is bounded (`bound_paragraphs`): words longer than WordPiece's ``max_input_chars_per_word``
  (100 characters; encoding turns them into [UNK] anyway) are left out, and longer paragraphs are cut at
  whitespace or punctuation into pieces of at most 10,000 characters. Merging pairs inside one word costs the
  trainer time proportional to the word's length for every merge, so one 400,000-character word took 50 s
  and a 5 MB one never finished; cut pieces also spread one huge line over all threads.
* Training is reproducible (`train_tokenizer`): the trainer numbers the ``##`` forms of characters in the
  iteration order of a Rust HashMap, which is seeded at random in every process, and it breaks ties between
  equally frequent pairs by id, so the same corpus gave another vocabulary in every process (single-threaded
  too). A quick pass over the text in Python (`possible_continuation_forms`) finds every character that may
  continue a word; their ``##`` forms go to the trainer as extra special tokens, which it numbers in the
  order given, and the result is rebuilt as a plain BERT tokenizer with that vocabulary.
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import NamedTuple

import datasets
import regex
from tqdm.auto import tqdm
from transformers import AutoTokenizer, BertTokenizer, PreTrainedTokenizerBase
from transformers.hf_argparser import HfArg

from hfbert.checkpointing import FINAL_MODEL_FILES, find_checkpoints, finish_interrupted_replace
from hfbert.configuration_hfbert import HfBertConfig
from hfbert.corpus import describe_documents, load_documents
from hfbert.corpus_arguments import CorpusArguments, check_output_outside_corpus
from hfbert.errors import Refusal, run_cli
from hfbert.files import (
    RUN_LOCK_NAME,
    WRITE_ERRORS,
    check_local_files,
    check_local_path_exists,
    describe_write_failure,
    is_disk_full,
    not_replaceable,
    run_folder_lock,
    running_no_folder_code,
    staged_files,
    write_final_record,
    write_tokenizer,
)
from hfbert.flags import RefusingHfArgumentParser

SPECIAL_TOKENS = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")
"""BERT's special tokens; their position is their id, as in Hugging Face's BERT checkpoints."""
_PARAGRAPHS_PER_BATCH = 1000
_DOCUMENTS_PER_READ = 256
# Files that make a folder a saved tokenizer (overwriting one hfbert wrote needs no --overwrite_output_dir).
_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json")
# A saved tokenizer's files, hfbert's or another library's: those train_tokenizer.py would replace or leave beside its own.
_SAVED_TOKENIZER_FILES = (*_TOKENIZER_FILES, "special_tokens_map.json", "added_tokens.json", "vocab.txt")
CONTINUING_SUBWORD_PREFIX = "##"
MAX_WORD_CHARS = 100
"""WordPiece's ``max_input_chars_per_word``: a longer word encodes as [UNK], so training leaves it out."""
MAX_PIECE_CHARS = 10_000
"""Longest text handed to the trainer at once; longer paragraphs are cut at whitespace or punctuation."""
# Where BertPreTokenizer splits words whatever surrounds them: whitespace that BertNormalizer turns into a
# space (Unicode White_Space less \x0b, \x0c and \x85, which it deletes as control characters, gluing their
# neighbours) and ASCII punctuation. Unicode punctuation (also a break) is added where a miss is harmless.
_SURE_BREAKS = "\t\n\r \xa0\u1680\u2000-\u200a\u2028\u2029\u202f\u205f\u3000!-/:-@\\[-`{-~"
_WORD_BREAKS = _SURE_BREAKS + "\\p{P}"
_OVERLONG_WORD = regex.compile(f"[^{_WORD_BREAKS}]{{{MAX_WORD_CHARS + 1},}}")
_LAST_WORD_BREAK = regex.compile(f"(?r)[{_WORD_BREAKS}]")  # (?r): search backwards
# Cheap pre-check (stdlib re, C speed): only a paragraph with such a run can hold an overlong word.
_LONG_RUN = re.compile(f"[^{_SURE_BREAKS}]{{{MAX_WORD_CHARS + 1}}}")
# Removes the breaks and the character after each run of them: what is left follows a non-break character.
_BREAKS_AND_WORD_STARTS = re.compile(f"(?:^|[{_SURE_BREAKS}]+)[^{_SURE_BREAKS}]?")


@dataclass
class ParagraphBatches:
    """Iterates over lists of paragraphs (about 1,000 a list) of ``documents``, counting the UTF-8 bytes it
    has read.

    A re-iterable object rather than a generator so `train_tokenizer` callers can read ``bytes_read``
    (input throughput) after training.
    """

    documents: datasets.Dataset | datasets.IterableDataset
    show_progress: bool = True
    bytes_read: int = field(default=0, init=False)

    def __iter__(self) -> Iterator[list[str]]:
        return self.iter_batches()

    def iter_batches(self, description: str = "Reading documents") -> Iterator[list[str]]:
        """The batches, with a progress bar named ``description``; ``bytes_read`` counts this pass only."""
        self.bytes_read = 0
        total = len(self.documents) if isinstance(self.documents, datasets.Dataset) else None
        batch: list[str] = []
        with tqdm(total=total, unit="doc", desc=description, disable=not self.show_progress) as progress:
            for rows in self.documents.iter(batch_size=_DOCUMENTS_PER_READ):
                for paragraphs in rows["paragraphs"]:
                    batch.extend(paragraphs)
                    self.bytes_read += sum(len(paragraph.encode()) for paragraph in paragraphs)
                if len(batch) >= _PARAGRAPHS_PER_BATCH:
                    yield batch
                    batch = []
                progress.update(len(rows["paragraphs"]))
                progress.set_postfix_str(f"{self.bytes_read / 1e6:.1f} MB", refresh=False)
        if batch:
            yield batch


def bound_paragraphs(paragraphs: list[str], max_chars: int = MAX_PIECE_CHARS) -> list[str]:
    """``paragraphs`` as the tokenizer trainer should see them: bounded work per word and per piece.

    Words (runs between whitespace and punctuation, as BertPreTokenizer splits them) longer than
    `MAX_WORD_CHARS` characters of raw text (control characters, which normalization deletes, count) are
    replaced by a space: WordPiece encodes them as [UNK], and the trainer's merges cost
    time proportional to a word's length, over and over. Paragraphs longer than ``max_chars`` (>= 2 *
    `MAX_WORD_CHARS`) are cut after their last whitespace or punctuation within every ``max_chars``
    characters, so the pre-tokenized words are unchanged. Other paragraphs are returned as they are.
    """
    if max_chars < 2 * MAX_WORD_CHARS:
        raise ValueError(f"max_chars {max_chars} must be at least {2 * MAX_WORD_CHARS}")
    bounded: list[str] = []
    for paragraph in paragraphs:
        if len(paragraph) > MAX_WORD_CHARS and _LONG_RUN.search(paragraph):
            paragraph = _OVERLONG_WORD.sub(" ", paragraph)
        start = 0  # a paragraph of at most max_chars goes whole, as paragraph[0:]
        while len(paragraph) - start > max_chars:
            end = start + max_chars
            cut = paragraph.rfind(" ", start, end)
            if cut < start + MAX_WORD_CHARS:
                # No space late enough: the last whitespace or punctuation mark. One lies in every
                # MAX_WORD_CHARS + 1 characters once the overlong words are gone.
                last_break = _LAST_WORD_BREAK.search(paragraph, start, end)
                cut = last_break.start() if last_break is not None else end - 1
            bounded.append(paragraph[start : cut + 1])
            start = cut + 1
        bounded.append(paragraph[start:])
    return bounded


def possible_continuation_forms(
    batches: Iterable[list[str]], tokenizer: PreTrainedTokenizerBase
) -> list[str]:
    """Sorted ``##`` forms of every character that may continue a word of ``batches`` (lists of paragraphs).

    A superset of the forms the trainer creates with ``tokenizer``'s normalizer and pre-tokenizer: a
    character counts once it follows anything but whitespace or ASCII punctuation in the raw text (or comes
    second in the normalized form of one character, as Hangul does under NFD). Costs about what reading the
    text does: most paragraphs only hold characters already settled, and only those are turned into a set.
    """
    normalizer = tokenizer.backend_tokenizer.normalizer
    pre_tokenizer = tokenizer.backend_tokenizer.pre_tokenizer

    def word_characters(text: str) -> str:
        # The characters of normalized `text` that can stand inside a word: "a" + it stays one word.
        return "".join(
            words[0][0][1:]
            for character in normalizer.normalize_str(text)
            if len(words := pre_tokenizer.pre_tokenize_str(normalizer.normalize_str("a" + character))) == 1
        )

    forms: set[str] = set()
    settled: set[str] = set()  # raw characters whose forms are all in `forms`, or that never continue a word
    # Raw characters not yet seen after a word character -> the characters they would then add.
    pending: dict[str, str] = {}
    for batch in batches:
        for paragraph in batch:
            characters = set(paragraph)
            if characters <= settled:
                continue
            for character in characters - settled - pending.keys():
                normalized = normalizer.normalize_str(character)
                forms.update(word_characters(normalized[1:]))
                if first := word_characters(normalized[:1]):
                    pending[character] = first
                else:
                    settled.add(character)
            if characters.isdisjoint(pending):
                continue
            for character in set(_BREAKS_AND_WORD_STARTS.sub("", paragraph)) & pending.keys():
                forms.update(pending.pop(character))
                settled.add(character)
    return sorted(CONTINUING_SUBWORD_PREFIX + character for character in forms)


# Token ids are stored as uint16 up to 65,536 entries and int32 above, but the trainer aborted in Rust at 2**31.
MAX_VOCAB_SIZE = 1 << 20
VOCAB_SIZE_ABOVE_MAX = (
    f"is above {MAX_VOCAB_SIZE:,}, the largest vocabulary hfbert trains (BERT's is 30,522, multilingual ones "
    "250,002; the trainer reserves memory for every entry first); pass e.g. --vocab_size 30522"
)


def check_vocab_size(vocab_size: int) -> None:
    """Raise Refusal for a --vocab_size that leaves no room beside `SPECIAL_TOKENS`, or above `MAX_VOCAB_SIZE`
    (before any reading)."""
    if vocab_size > MAX_VOCAB_SIZE:
        raise Refusal(f"--vocab_size {vocab_size} {VOCAB_SIZE_ABOVE_MAX}")
    if vocab_size <= len(SPECIAL_TOKENS):
        raise Refusal(
            f"--vocab_size {vocab_size} leaves no room beside the {len(SPECIAL_TOKENS)} special tokens; "
            "pass a larger --vocab_size (e.g. 30522)"
        )


def train_vocabulary(
    batches: ParagraphBatches,
    untrained: BertTokenizer,
    forms: list[str],
    vocab_size: int,
    min_frequency: int,
    show_progress: bool,
) -> dict[str, int]:
    """The WordPiece vocabulary (token -> id, in id order) the trainer learns, the ## forms of the corpus'
    characters (`forms`) numbered in a fixed order."""
    # The ## forms go in as special tokens, which the trainer numbers in the order given (after
    # SPECIAL_TOKENS and before the alphabet, which it sorts itself) instead of in HashMap order. Should the
    # scan have missed one, the trainer adds it in HashMap order: train again with it (still deterministic).
    for _attempt in range(2):
        trained = untrained.train_new_from_iterator(
            map(bound_paragraphs, batches.iter_batches("Reading documents (2/2: training)")),
            vocab_size=vocab_size,
            min_frequency=min_frequency,
            continuing_subword_prefix=CONTINUING_SUBWORD_PREFIX,
            new_special_tokens=forms,
            show_progress=show_progress,
        )
        missed = {token for token in trained.get_vocab() if token[:-1] == CONTINUING_SUBWORD_PREFIX} - set(forms)
        if not missed:
            break
        forms = sorted({*forms, *missed})
    # Rebuilt from the vocabulary so that the ## forms are ordinary vocabulary entries, not added tokens.
    vocab = dict(sorted(trained.get_vocab().items(), key=lambda token_and_id: token_and_id[1]))
    if list(vocab.values()) != list(range(len(vocab))):
        raise RuntimeError("the tokenizers trainer returned a vocabulary with gaps in its ids")
    return vocab


def train_tokenizer(
    documents: datasets.Dataset | datasets.IterableDataset | ParagraphBatches,
    *,
    vocab_size: int = 30522,
    min_frequency: int = 2,
    lowercase: bool = True,
    model_max_length: int = 512,
    show_progress: bool = True,
) -> BertTokenizer:
    """Train a BERT WordPiece tokenizer on the paragraphs of ``documents`` (column ``paragraphs``).

    Pass a `ParagraphBatches` over the documents instead to read its ``bytes_read`` (input size) afterwards.
    Returns a fast `transformers.BertTokenizer` whose vocabulary holds `SPECIAL_TOKENS` at ids 0-4 and at
    most ``vocab_size`` entries in all. ``lowercase`` also strips accents, as BERT's uncased models do.
    Raises Refusal when ``vocab_size`` cannot hold the special tokens plus the corpus' characters.

    Deterministic: the same documents and settings give the same vocabulary, with the same ids, in any process
    (see the module docstring for how). The corpus is read twice: once in Python for its characters, then by
    the trainer.
    Words longer than `MAX_WORD_CHARS` characters are left out (see `bound_paragraphs`).
    """
    check_vocab_size(vocab_size)
    batches = documents
    if not isinstance(batches, ParagraphBatches):
        batches = ParagraphBatches(documents, show_progress=show_progress)
    # BertTokenizer's defaults are BERT's special tokens, at ids 0-4 in the order of SPECIAL_TOKENS.
    untrained = BertTokenizer(do_lower_case=lowercase, model_max_length=model_max_length)
    forms = possible_continuation_forms(
        batches.iter_batches("Reading documents (1/2: characters)"), untrained
    )
    vocab = train_vocabulary(batches, untrained, forms, vocab_size, min_frequency, show_progress)
    tokenizer = BertTokenizer(vocab=vocab, do_lower_case=lowercase, model_max_length=model_max_length)
    if len(tokenizer) <= len(SPECIAL_TOKENS):
        raise Refusal("the corpus gave the tokenizer trainer no text; pass a corpus with text")
    if len(tokenizer) > vocab_size:
        # The trainer always keeps every character of the corpus (and its ## form) even past vocab_size.
        raise Refusal(
            f"--vocab_size {vocab_size} is smaller than the {len(SPECIAL_TOKENS)} special tokens plus the "
            f"{len(tokenizer) - len(SPECIAL_TOKENS)} single characters (and their ## forms) of this corpus; "
            f"pass --vocab_size well above {len(tokenizer)} so that words can be learned"
        )
    return tokenizer


class TokenizerQuality(NamedTuple):
    """How a tokenizer splits a corpus: its words (pre-tokenized; punctuation marks count as words), WordPiece
    tokens, the fraction of them that are [UNK] and the average tokens per word."""

    words: int
    tokens: int
    unk_rate: float
    tokens_per_word: float


def measure_tokenizer(
    tokenizer: PreTrainedTokenizerBase, documents: datasets.Dataset | datasets.IterableDataset
) -> TokenizerQuality:
    """Count words, tokens and [UNK] tokens of ``tokenizer`` over the paragraphs of ``documents``."""
    words = tokens = unknown_tokens = 0
    for batch in ParagraphBatches(documents, show_progress=False):
        for encoding in tokenizer.backend_tokenizer.encode_batch(batch, add_special_tokens=False):
            tokens += len(encoding.ids)
            unknown_tokens += encoding.ids.count(tokenizer.unk_token_id)
            words += len({word_id for word_id in encoding.word_ids if word_id is not None})
    return TokenizerQuality(words, tokens, unknown_tokens / max(tokens, 1), tokens / max(words, 1))


def model_config_for_tokenizer(
    tokenizer: PreTrainedTokenizerBase, preset: str = "base", **overrides: object
) -> HfBertConfig:
    """The model config for ``tokenizer``: preset ``preset`` with the tokenizer's vocab size and pad id.

    The one place a config is derived from a tokenizer. ``overrides`` may change any field, including
    ``vocab_size`` (e.g. rounded up to a multiple of 8), as long as the tokenizer still fits.
    """
    config_fields = {"vocab_size": len(tokenizer), "pad_token_id": tokenizer.pad_token_id, **overrides}
    config = HfBertConfig.from_preset(preset, **config_fields)
    check_tokenizer_matches_config(tokenizer, config)
    return config


def check_tokenizer_matches_config(tokenizer: PreTrainedTokenizerBase, config: HfBertConfig) -> None:
    """Raise Refusal when ``tokenizer`` produces ids the model of ``config`` cannot embed or pads wrongly."""
    if len(tokenizer) > config.vocab_size:
        raise Refusal(
            f"the tokenizer has {len(tokenizer)} tokens but the model config's vocab_size is {config.vocab_size}; "
            f"build the config with hfbert.tokenization.model_config_for_tokenizer (or vocab_size >= {len(tokenizer)})"
        )
    if tokenizer.pad_token_id != config.pad_token_id:
        raise Refusal(
            f"the tokenizer's pad_token_id {tokenizer.pad_token_id} differs from the model config's "
            f"pad_token_id {config.pad_token_id}; build the config with "
            f"hfbert.tokenization.model_config_for_tokenizer (or pad_token_id={tokenizer.pad_token_id})"
        )


_LOAD_TOKENIZER_FIX = (
    "pass the --output_dir of train_tokenizer.py (a folder holding tokenizer.json), a tokenizer on the Hub "
    "(e.g. bert-base-uncased), or leave --tokenizer_name out to train a tokenizer on the training corpus"
)


def load_tokenizer(name_or_path: str | os.PathLike) -> PreTrainedTokenizerBase:
    """Load ``--tokenizer_name``: a local folder (``~`` expanded) or a Hub id, with `AutoTokenizer`.

    Raises Refusal naming the value and the fix, before anything is downloaded or written, for a missing
    folder (transformers would say "Repo id must be in the form ..."), a file, or a folder without tokenizer
    files; and for a Hub-style id that is no local folder and cannot be loaded from the Hub (offline, typo).
    """
    path = Path(name_or_path).expanduser()
    if path.is_file():
        raise Refusal(
            f"--tokenizer_name {name_or_path} is a file; pass the folder holding the tokenizer files "
            f"({path.parent}), or {_LOAD_TOKENIZER_FIX}"
        )
    if path.is_dir():
        if not any((path / name).is_file() for name in (*_TOKENIZER_FILES, "vocab.txt")):
            raise Refusal(
                f"--tokenizer_name {name_or_path}: the folder {path.absolute()} holds no tokenizer (no "
                f"tokenizer.json, tokenizer_config.json or vocab.txt); {_LOAD_TOKENIZER_FIX}"
            )
        check_local_files(path, "--tokenizer_name", f"save the tokenizer there again, or {_LOAD_TOKENIZER_FIX}")
        with running_no_folder_code(f"--tokenizer_name {name_or_path}", f"tokenizer (in {path})"):
            return AutoTokenizer.from_pretrained(path, trust_remote_code=False)
    check_local_path_exists(str(name_or_path), "--tokenizer_name", _LOAD_TOKENIZER_FIX)
    try:  # a name that is no valid repo id fails at once, before any download, naming what is wrong
        return AutoTokenizer.from_pretrained(str(name_or_path), trust_remote_code=False)
    except (OSError, ValueError) as error:
        reason = str(error).splitlines()[0] if str(error) else type(error).__name__
        raise Refusal(
            f"--tokenizer_name {name_or_path}: no such folder ({path.absolute()}), nor a tokenizer that could be "
            f"loaded from the Hub ({reason}); {_LOAD_TOKENIZER_FIX}"
        ) from error


def check_output_dir(output_dir: str | os.PathLike, overwrite_output_dir: bool) -> None:
    """Refuse a run folder (its model goes with its tokenizer) always, and unless ``overwrite_output_dir`` a
    non-empty ``output_dir`` that is not a tokenizer hfbert saved (its ``FINAL_RECORD`` lists every tokenizer file
    there)."""
    folder = Path(output_dir)
    if folder.exists() and not folder.is_dir():
        raise Refusal(f"--output_dir {folder} is a file; pass a folder path")
    found = [name for name in FINAL_MODEL_FILES if (folder / name).exists()]
    if found or find_checkpoints(folder):
        found = found or [path.name for path in find_checkpoints(folder)]
        raise Refusal(
            f"--output_dir {folder} holds a pretraining run ({', '.join(found)}): its tokenizer belongs to that model, and "
            "a new one would silently disagree with it; pass another --output_dir"
        )
    folders = [name for name in _SAVED_TOKENIZER_FILES if (folder / name).is_dir()]
    if folders:  # publishing a file onto it would fail half way, whatever the flags
        raise Refusal(
            f"--output_dir {folder} holds a folder at {', '.join(folders)}, where the tokenizer writes a file: "
            f"move {'it' if len(folders) == 1 else 'them'} out of the folder, or pass another --output_dir"
        )
    theirs = list(not_replaceable(folder, _SAVED_TOKENIZER_FILES).values())
    if theirs and not overwrite_output_dir:
        raise Refusal(
            f"--output_dir {folder} holds a tokenizer hfbert did not write ({', '.join(sorted(theirs))}), or one an "
            "hfbert wrote before it recorded its files; pass --overwrite_output_dir to replace it, or another "
            "--output_dir"
        )
    if (
        folder.is_dir()
        and any(path.name != RUN_LOCK_NAME for path in folder.iterdir())
        and not any((folder / name).is_file() for name in _TOKENIZER_FILES)
        and not overwrite_output_dir
    ):
        raise Refusal(
            f"--output_dir {folder} is not empty and holds no tokenizer; pass an empty or new folder, "
            "or --overwrite_output_dir to write the tokenizer files into it"
        )


def save_tokenizer(tokenizer: PreTrainedTokenizerBase, output_dir: str | os.PathLike, replace_any: bool = False) -> None:
    """``save_pretrained`` staged and published as one set (``hfbert.files.staged_files``), with the record of
    its files (``FINAL_RECORD``: what a later save may replace): a crash never leaves a half-written tokenizer,
    and other files in ``output_dir`` are kept. Tokenizer files hfbert did not write there are replaced only
    with `replace_any` (--overwrite_output_dir)."""
    replacing = _SAVED_TOKENIZER_FILES if replace_any else ()
    try:
        with staged_files(output_dir, commit_file="tokenizer.json", replacing=replacing) as staging:
            write_tokenizer(tokenizer, staging)
            write_final_record(staging, Path(output_dir))
    except WRITE_ERRORS as error:
        space = f"free space (`df -h {output_dir}`) or " if is_disk_full(error, output_dir) else ""
        raise Refusal(
            f"{describe_write_failure(error, output_dir)}; the tokenizer was not saved and the folder's previous "
            f"files are intact: {space}pass another --output_dir, then rerun"
        ) from error


@dataclass
class TokenizerTrainingArguments:
    """Tokenizer training options (command-line flags of train_tokenizer.py)."""

    output_dir: str = HfArg(help="Folder to save the tokenizer in (AutoTokenizer.from_pretrained loads it).")
    vocab_size: int = HfArg(default=30522, help="Vocabulary size, special tokens included.")
    min_frequency: int = HfArg(default=2, help="Minimum count for a merge to enter the vocabulary.")
    lowercase: bool = HfArg(
        default=True, help="Lower-case and strip accents (uncased BERT); --no_lowercase keeps case."
    )
    model_max_length: int = HfArg(
        default=512, help="Longest sequence the model will take, saved as tokenizer.model_max_length."
    )
    overwrite_output_dir: bool = HfArg(
        default=False,
        help="Write into a non-empty --output_dir that holds no tokenizer hfbert wrote (another tokenizer's files "
        "there are replaced, other files kept).",
    )

    def __post_init__(self) -> None:
        self.output_dir = os.path.expanduser(self.output_dir)  # the folder checked is the folder written
        # Refused at parse time, before the corpus is read (the trainer would raise OverflowError on -3).
        check_vocab_size(self.vocab_size)
        if self.min_frequency < 0:
            raise Refusal(f"--min_frequency {self.min_frequency} must be >= 0, e.g. 2")
        if self.model_max_length <= 0:
            raise Refusal(f"--model_max_length {self.model_max_length} must be > 0, e.g. 512")


def main(argv: list[str] | None = None) -> None:
    """Command line: train a tokenizer on a corpus, save it, print a summary."""
    corpus_args, training_args = RefusingHfArgumentParser((CorpusArguments, TokenizerTrainingArguments)).parse_flags(argv)
    check_output_outside_corpus(corpus_args, training_args.output_dir)
    # Held from the check to the save: two tokenizers trained into one folder would both report "Saved".
    # Holding it, a run folder's checkpoint that a crash left parked is put back: the folder is refused as the run.
    with run_folder_lock(training_args.output_dir, finish_interrupted_replace):  # checks that it is writable first
        check_output_dir(training_args.output_dir, training_args.overwrite_output_dir)
        train_and_save(corpus_args, training_args)


def command_line() -> None:
    """The process entry point of train_tokenizer.py, `python -m hfbert.tokenization` and hfbert-tokenizer."""
    run_cli(main)


def train_and_save(corpus_args: CorpusArguments, training_args: TokenizerTrainingArguments) -> None:
    """Train the tokenizer of train_tokenizer.py, save it and print a summary."""
    documents = load_documents(corpus_args)

    started = time.perf_counter()
    batches = ParagraphBatches(documents["train"])
    tokenizer = train_tokenizer(
        batches,
        vocab_size=training_args.vocab_size,
        min_frequency=training_args.min_frequency,
        lowercase=training_args.lowercase,
        model_max_length=training_args.model_max_length,
    )
    seconds = time.perf_counter() - started
    save_tokenizer(tokenizer, training_args.output_dir, replace_any=training_args.overwrite_output_dir)

    megabytes = batches.bytes_read / 1e6
    lines = [
        f"Saved tokenizer to {training_args.output_dir}",
        f"  corpus:           {describe_documents(corpus_args, 'train', documents['train'])}",
        f"  vocabulary size:  {len(tokenizer)}",
        f"  training time:    {seconds:.2f} s on {megabytes:.1f} MB ({megabytes / seconds:.1f} MB/s)",
    ]
    if "validation" in documents:
        quality = measure_tokenizer(tokenizer, documents["validation"])
        lines += [
            f"  validation [UNK]: {quality.unk_rate:.4%} of {quality.tokens} tokens",
            f"  tokens per word:  {quality.tokens_per_word:.3f}",
        ]
    else:
        lines.append("  no validation split: pass --validation_file for [UNK] rate and tokens per word")
    print("\n".join(lines))


if __name__ == "__main__":
    command_line()
