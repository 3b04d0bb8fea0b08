"""Input normalization shared by training, `applications.preprocess_input` and export.

One definition, so that a model trained here sees exactly the same numbers when it is
served from a SavedModel.
"""

from __future__ import annotations

import keras
from keras import ops

# Per-channel RGB mean/std of the CIFAR-10 training set on the 0-255 scale, as
# fb.resnet.torch uses them (cifar10.lua); used for CIFAR-100 too.
CIFAR_MEAN = (125.3, 123.0, 113.9)
CIFAR_STD = (63.0, 62.1, 66.7)
# ImageNet statistics of fb.resnet.torch (imagenet.lua), on the 0-255 scale.
IMAGENET_MEAN = (123.675, 116.28, 103.53)
IMAGENET_STD = (58.395, 57.12, 57.375)

STATS = {"cifar": (CIFAR_MEAN, CIFAR_STD), "imagenet": (IMAGENET_MEAN, IMAGENET_STD)}


def preprocess_input(x, family: str = "cifar"):
    """Normalizes RGB images in [0, 255] (channels last) per channel.

    Args:
        x: uint8 or float images, shape `(..., 3)`, RGB, values in [0, 255].
        family: `"cifar"` or `"imagenet"`: whose statistics to use.

    Returns:
        float32 tensor of the same shape: `(x - mean) / std`.

    Example:
    >>> import numpy as np
    >>> y = preprocess_input(np.full((1, 32, 32, 3), 128, "uint8"))
    >>> tuple(y.shape)
    (1, 32, 32, 3)
    """
    if family not in STATS:
        raise ValueError(
            f"Unknown preprocessing family {family!r}. Valid: {sorted(STATS)}."
        )
    mean, std = STATS[family]
    x = ops.cast(x, "float32")
    return (x - ops.convert_to_tensor(mean, "float32")) / ops.convert_to_tensor(
        std, "float32"
    )
