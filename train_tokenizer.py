"""Train a BERT WordPiece tokenizer: `python train_tokenizer.py --help`."""

from hfbert.errors import run_cli
from hfbert.tokenization import main

if __name__ == "__main__":
    run_cli(main)
