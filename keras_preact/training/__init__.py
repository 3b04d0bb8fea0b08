"""Training with the paper's recipe (`TrainConfig`) on `model.fit`, through `tf.distribute`,
from TFDS.

Example:
>>> from keras_preact import training
>>> round(float(training.paper_schedule()(32000)), 4)
0.01
"""

from __future__ import annotations

import importlib

from keras_preact.training.config import TrainConfig

# What needs Keras (hence TensorFlow) loads on first use (PEP 562), so that
# `keras-preact train --help` reads TrainConfig at once.
_LAZY = {
    "PaperSchedule": "keras_preact.optim",
    "paper_schedule": "keras_preact.optim",
    "SGDWithL2": "keras_preact.optim",
    "TrainingDiverged": "keras_preact.training.trainer",
    "TrainingStopped": "keras_preact.training.trainer",
    "WorkerLost": "keras_preact.training.trainer",
    "evaluate": "keras_preact.training.evaluation",
    "train": "keras_preact.training.trainer",
}

__all__ = ["TrainConfig", *_LAZY]


def __getattr__(name: str):
    if name not in _LAZY:
        raise AttributeError(f"module 'keras_preact.training' has no attribute {name!r}")
    value = getattr(importlib.import_module(_LAZY[name]), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_LAZY])
