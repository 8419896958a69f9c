"""Pretrain BERT (masked LM + next sentence prediction) with accelerate.

    accelerate launch run_pretraining.py --model_size tiny --max_train_steps 300 --output_dir runs/hfbert-tiny

Run with --help for every flag; the library behind it is the package hfbert.pretraining (flags: hfbert.pretraining.settings).
"""

import os

# The launcher (torchrun) that started this process, read before the imports below (seconds): a worker whose
# launcher dies meanwhile is reparented, and so still stops (hfbert.pretraining.process_group.stop_with_the_launcher).
LAUNCHER_PID = os.getppid()

from hfbert.errors import stops_in_one_line  # noqa: E402
from hfbert.pretraining.cli import main  # noqa: E402

if __name__ == "__main__":
    with stops_in_one_line():
        main(launcher_pid=LAUNCHER_PID)
