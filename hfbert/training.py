"""Moved: the training code is the package hfbert.pretraining (a module per stage); these names stay importable."""

from hfbert.pretraining.evaluation import TrainingWindow, check_loss_is_finite  # noqa: F401
from hfbert.pretraining.loop import Preempted, fit, train_step  # noqa: F401
from hfbert.pretraining.precision import resolve_mixed_precision  # noqa: F401
from hfbert.pretraining.run import pretrain  # noqa: F401
from hfbert.pretraining.setup import UNBOUNDED_STEPS, LearningRateSchedule, optimizer_parameter_groups  # noqa: F401
