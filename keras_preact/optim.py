"""The paper's optimizer and learning-rate schedule, Keras objects a compiled `.keras` file
may name (registered as `keras_preact>SGDWithL2`, `keras_preact>PaperSchedule`), beside the
models as timm keeps `timm.optim` and `timm.scheduler`; `keras_preact.training` uses them.

`SGDWithL2`: SGD with the paper's weight decay: `gradient += wd * w` before momentum.

The reference code (resnet-1k-layers, fb.resnet.torch) uses Torch `optim.sgd` with
`weightDecay=1e-4`, which adds `1e-4 * w` to the gradient of *every* parameter (conv kernels,
BN gamma/beta, the classifier's weights and bias), and the momentum buffer then accumulates it.
The models carry no regularizers, so the decay lives here. This differs from Keras'
`weight_decay=` argument, which is decoupled (AdamW style: `w -= lr * wd * w` outside the
momentum) and from an L2 regularizer only by bookkeeping: a Keras `l2=5e-5` on every weight
gives the same gradient, but would have to be attached to each layer, BN included.

`PaperSchedule`: the paper's learning-rate schedule, indexed by optimizer iterations.

Because the schedule is a pure function of `optimizer.iterations`, a run restored from a
backup (which restores `iterations`) continues the schedule where it stopped.
"""

from __future__ import annotations

import keras
from keras import ops

from keras_preact.paper import CIFAR_RECIPE


@keras.saving.register_keras_serializable(package="keras_preact")
class SGDWithL2(keras.optimizers.SGD):
    """`keras.optimizers.SGD` whose update first adds `l2 * variable` to the gradient.

    Example:
    >>> import numpy as np
    >>> opt = SGDWithL2(learning_rate=0.1, momentum=0.0, l2=0.5)
    >>> w = keras.Variable(np.array([2.0], "float32"))
    >>> _ = opt.apply_gradients([(np.array([0.0], "float32"), w)])
    >>> round(float(w.numpy()[0]), 6)  # 2 - 0.1 * (0 + 0.5 * 2)
    1.9
    """

    def __init__(self, learning_rate=CIFAR_RECIPE.lr, momentum=CIFAR_RECIPE.momentum,
                 nesterov=False, l2=CIFAR_RECIPE.weight_decay, **kwargs):
        super().__init__(
            learning_rate=learning_rate, momentum=momentum, nesterov=nesterov, **kwargs
        )
        if l2 < 0:
            raise ValueError(f"`l2` must be >= 0. Received: l2={l2!r}")
        self.l2 = float(l2)

    def update_step(self, gradient, variable, learning_rate):
        if self.l2:
            gradient = ops.add(
                ops.cast(gradient, variable.dtype),
                ops.multiply(ops.cast(self.l2, variable.dtype), variable),
            )
        super().update_step(gradient, variable, learning_rate)

    def get_config(self) -> dict:
        return {**super().get_config(), "l2": self.l2}


@keras.saving.register_keras_serializable(package="keras_preact")
class PaperSchedule(keras.optimizers.schedules.LearningRateSchedule):
    """Piecewise-constant lr: `warmup_lr` for `warmup_steps`, then `base_lr`, x0.1 at each
    boundary (given as fractions of `total_steps`).

    Example:
    >>> s = PaperSchedule(64000, 0.1, warmup_steps=400, warmup_lr=0.01)
    >>> [round(float(s(i)), 4) for i in (0, 400, 32000, 48000)]
    [0.01, 0.1, 0.01, 0.001]
    """

    def __init__(
        self,
        total_steps: int = CIFAR_RECIPE.steps,
        base_lr: float = CIFAR_RECIPE.lr,
        warmup_steps: int = CIFAR_RECIPE.warmup_steps,
        warmup_lr: float = CIFAR_RECIPE.warmup_lr,
        boundaries: tuple[float, ...] = CIFAR_RECIPE.lr_drops,
        decay: float = 0.1,
    ):
        if not (isinstance(total_steps, int) and total_steps >= 1):
            raise ValueError(f"`total_steps` must be a positive integer. Received: {total_steps!r}")
        if not (isinstance(warmup_steps, int) and 0 <= warmup_steps < total_steps):
            raise ValueError(
                f"`warmup_steps` must be an integer in [0, total_steps={total_steps}). "
                f"Received: {warmup_steps!r}"
            )
        if not all(0.0 < b < 1.0 for b in boundaries):
            raise ValueError(f"`boundaries` must be fractions in (0, 1). Received: {boundaries!r}")
        if base_lr <= 0 or warmup_lr <= 0:
            raise ValueError(
                "Learning rates must be positive. "
                f"Received: base_lr={base_lr}, warmup_lr={warmup_lr}"
            )
        self.total_steps = total_steps
        self.base_lr = float(base_lr)
        self.warmup_steps = warmup_steps
        self.warmup_lr = float(warmup_lr)
        self.boundaries = tuple(float(b) for b in boundaries)
        self.decay = float(decay)

    @property
    def boundary_steps(self) -> tuple[int, ...]:
        """Iterations at which the lr is multiplied by `decay` (32000, 48000 for 64k)."""
        return tuple(int(round(b * self.total_steps)) for b in self.boundaries)

    def __call__(self, step):
        step = ops.cast(step, "float32")
        drops = sum(ops.cast(step >= s, "float32") for s in self.boundary_steps)
        lr = self.base_lr * ops.power(self.decay, drops)
        return ops.where(step < self.warmup_steps, self.warmup_lr, lr)

    def get_config(self) -> dict:
        return {
            "total_steps": self.total_steps,
            "base_lr": self.base_lr,
            "warmup_steps": self.warmup_steps,
            "warmup_lr": self.warmup_lr,
            "boundaries": list(self.boundaries),
            "decay": self.decay,
        }

    @classmethod
    def from_config(cls, config: dict) -> PaperSchedule:
        return cls(**{**config, "boundaries": tuple(config["boundaries"])})


def paper_schedule(
    total_steps: int = CIFAR_RECIPE.steps,
    base_lr: float = CIFAR_RECIPE.lr,
    warmup_steps: int = CIFAR_RECIPE.warmup_steps,
    warmup_lr: float = CIFAR_RECIPE.warmup_lr,
    boundaries: tuple[float, ...] = CIFAR_RECIPE.lr_drops,
) -> PaperSchedule:
    """The paper's CIFAR schedule (Appendix): lr 0.1, /10 at 32k and 48k, stop at 64k, with
    lr 0.01 for the first 400 iterations. Drops sit at 50 % and 75 % of `total_steps`.

    For ImageNet (/10 at epochs 30 and 60 of 90) pass `boundaries=paper.IMAGENET_LR_DROPS` and
    `warmup_steps=0`. Scale `base_lr` linearly with the global batch size (0.1 per 128 on
    CIFAR, 0.1 per 256 on ImageNet).

    Example:
    >>> s = paper_schedule()
    >>> s.boundary_steps
    (32000, 48000)
    >>> round(float(s(47999)), 4), round(float(s(48000)), 4)
    (0.01, 0.001)
    """
    return PaperSchedule(total_steps, base_lr, warmup_steps, warmup_lr, boundaries)
