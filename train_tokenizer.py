"""Train a BERT WordPiece tokenizer: `python train_tokenizer.py --help`."""

from hfbert.tokenization import command_line

if __name__ == "__main__":
    command_line()
