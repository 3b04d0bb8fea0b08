"""SGD with the paper's weight decay: `gradient += wd * w` before momentum.

The reference code (resnet-1k-layers, fb.resnet.torch) uses Torch `optim.sgd` with
`weightDecay=1e-4`, which adds `1e-4 * w` to the gradient of *every* parameter (conv kernels,
BN gamma/beta, the classifier's weights and bias), and the momentum buffer then accumulates it.
The models carry no regularizers, so the decay lives here. This differs from Keras'
`weight_decay=` argument, which is decoupled (AdamW style: `w -= lr * wd * w` outside the
momentum) and from an L2 regularizer only by bookkeeping: a Keras `l2=5e-5` on every weight
gives the same gradient, but would have to be attached to each layer, BN included.
"""

from __future__ import annotations

import keras
from keras import ops


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

    def __init__(self, learning_rate=0.1, momentum=0.9, nesterov=False, l2=1e-4, **kwargs):
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
