"""run_pretraining.py whose weights all become NaN right after optimizer update DIVERGE_AT (an environment
variable; counted from this process's start), as a run diverging in fp16 or at too high a learning rate does:
the chaos soak's divergence fault (benchmarks/chaos.py) launches it in place of run_pretraining.py, with the
same flags. The fault is torch's global optimizer step hook, registered here: the library holds no hook for it.

    DIVERGE_AT=12 python benchmarks/diverging_pretraining.py --output_dir runs/x ...
"""

import os
import runpy
from pathlib import Path

import torch
from torch.optim.optimizer import register_optimizer_step_post_hook

DIVERGE_AT_ENV = "DIVERGE_AT"
SCRIPT = Path(__file__).resolve().parents[1] / "run_pretraining.py"


def diverge_after(update: int):
    """An optimizer step post hook that fills every parameter of the optimizer with NaN after its `update`-th step."""
    steps = 0

    def hook(optimizer: torch.optim.Optimizer, args: tuple, kwargs: dict) -> None:
        nonlocal steps
        steps += 1
        if steps == update:
            with torch.no_grad():
                for group in optimizer.param_groups:
                    for parameter in group["params"]:
                        parameter.fill_(float("nan"))

    return hook


if __name__ == "__main__":
    register_optimizer_step_post_hook(diverge_after(int(os.environ[DIVERGE_AT_ENV])))
    runpy.run_path(str(SCRIPT), run_name="__main__")  # sys.argv[0] becomes the script: its refusals say so
