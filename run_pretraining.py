"""Pretrain BERT (masked LM + next sentence prediction) with accelerate.

    accelerate launch run_pretraining.py --model_size tiny --max_train_steps 300 --output_dir runs/hfbert-tiny

Run with --help for every flag; the library behind it is the package hfbert.pretraining (flags: hfbert.pretraining.settings).
"""

from hfbert.pretraining.cli import command_line

if __name__ == "__main__":
    command_line()
