"""Input normalization shared by training, `applications.preprocess_input` and export.

One definition, so that a model trained here sees exactly the same numbers when it is
served from a SavedModel.
"""

from __future__ import annotations

import dataclasses
import warnings
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # `pretrained` (the CLI's `list`) reads this module: no imports to wait for
    import tensorflow as tf
    from numpy.typing import ArrayLike

# Per-channel RGB mean/std of the CIFAR-10 training set on the 0-255 scale, as
# fb.resnet.torch uses them (cifar10.lua); used for CIFAR-100 too.
CIFAR_MEAN = (125.3, 123.0, 113.9)
CIFAR_STD = (63.0, 62.1, 66.7)
# ImageNet statistics of fb.resnet.torch (imagenet.lua), on the 0-255 scale.
IMAGENET_MEAN = (123.675, 116.28, 103.53)
IMAGENET_STD = (58.395, 57.12, 57.375)

# timm's IMAGENET_INCEPTION_MEAN / _STD (0.5 on the [0, 1] scale): what its ResNetV2 ImageNet
# checkpoints (`keras_preact.weights.timm`, the `imagenet` tags of preact-*-imagenet-timm) take.
INCEPTION_MEAN = INCEPTION_STD = (127.5, 127.5, 127.5)

STATS = {"cifar": (CIFAR_MEAN, CIFAR_STD), "imagenet": (IMAGENET_MEAN, IMAGENET_STD),
         "inception": (INCEPTION_MEAN, INCEPTION_STD)}
# Channels of the images these statistics, and every weights file trained with them, are for.
RGB = len(CIFAR_MEAN)


def preprocess_input(x: ArrayLike, family: str = "cifar") -> ArrayLike:
    """Normalizes RGB images in [0, 255] (channels last) per channel.

    The statistics are RGB ones, so other channel counts (grayscale, RGBA, multispectral
    input of a model built with `weights=None`) are refused: normalize those with
    statistics of your own data, e.g. `keras.layers.Normalization`. NumPy images scaled to
    [0, 1] get a warning: they would come out as one dark colour. A model built with
    `include_preprocessing=True` does this itself and takes the raw pixels.

    Args:
        x: uint8 or float images, shape `(..., 3)`, RGB, values in [0, 255].
        family: whose statistics to use: `"cifar"`, `"imagenet"` (fb.resnet.torch's), or
            `"inception"` (mean = std = 127.5: timm's, for the `imagenet` tags of the
            `preact-*-imagenet-timm` nets; their record's `preprocessing`).

    Returns:
        float32 tensor of the same shape: `(x - mean) / std`.

    Raises:
        ValueError: for an unknown `family`, or a last axis of known size other than 3.

    Example:
    >>> import numpy as np
    >>> y = preprocess_input(np.full((1, 32, 32, 3), 128, "uint8"))
    >>> tuple(y.shape)
    (1, 32, 32, 3)
    """
    from keras import ops  # here: `pretrained` (the CLI's `list`) reads this module's data

    scale, offset = scale_and_offset(family)
    _warn_if_unit_scaled(x)
    x = ops.cast(x, "float32")
    if tuple(x.shape[-1:]) not in ((RGB,), (None,)):  # None: unknown while tracing
        raise ValueError(
            "`preprocess_input` normalizes RGB images with per-channel statistics: the last "
            f"axis must have 3 channels. Received: x.shape={tuple(x.shape)}"
        )
    # As `keras.layers.Rescaling` computes it (`include_preprocessing=True`): the same numbers.
    return x * ops.convert_to_tensor(scale, "float32") + ops.convert_to_tensor(offset, "float32")


def scale_and_offset(family: str) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """`(1 / std, -mean / std)` per channel of `family`'s statistics: `(x - mean) / std` as
    `x * scale + offset`, the form of `keras.layers.Rescaling`.

    Example:
    >>> scale_and_offset("inception")
    ((0.00784313725490196, 0.00784313725490196, 0.00784313725490196), (-1.0, -1.0, -1.0))
    """
    if family not in STATS:
        raise ValueError(f"Unknown preprocessing family {family!r}. Valid: {sorted(STATS)}.")
    mean, std = STATS[family]
    return tuple(1 / s for s in std), tuple(-m / s for m, s in zip(mean, std))


def _warn_if_unit_scaled(values) -> None:
    """Warns when float NumPy images all lie in [0, 1] and are not just black and white: most
    likely scaled to [0, 1] (`image / 255`), which the statistics, computed on [0, 255],
    would turn into one dark colour. Only host arrays, as a user loads images, are looked
    at: a tensor (symbolic in a pipeline, or on a device) passes unread."""
    import numpy as np

    if not (isinstance(values, np.ndarray) and values.dtype.kind == "f"):
        return
    if (values.size and values.min() >= 0 and values.max() <= 1
            and np.any((values > 0) & (values < 1))):
        warnings.warn(
            "preprocess_input takes pixels in [0, 255] and received values in [0, 1] "
            f"(min {values.min():.3g}, max {values.max():.3g}): multiply by 255 first.",
            stacklevel=3,
        )


@dataclasses.dataclass(frozen=True)
class Preprocessing:
    """What a network's images go through: normalization with the statistics its weights were
    trained with (`preprocess_input`), and for evaluation and serving a geometry
    (`resize_for_eval`). `keras_preact.api.preprocessing_of(model)` says which."""

    stats: str  # key of `STATS`: the mean/std
    size: int  # evaluation side when the network's input size is unspecified
    # Evaluation: resize the shorter side to size / crop_pct, then centre-crop size x size.
    # None: resize the whole image to size x size (CIFAR's images are the whole scene).
    crop_pct: float | None
    interpolation: str = "bilinear"  # of that resize (`tf.image.resize` method)
    # True: the network normalizes its input itself (`include_preprocessing=True`), so the
    # pipelines and exports feeding it leave the pixels in [0, 255] (`normalize`).
    in_model: bool = False

    def normalize(self, images: ArrayLike) -> ArrayLike:
        """What a pipeline feeding the network does to resized images in [0, 255]:
        `preprocess_input` with `stats`, or only the cast to float32 when `in_model`."""
        if self.in_model:
            from keras import ops

            return ops.cast(images, "float32")
        return preprocess_input(images, self.stats)


# The preprocessing of each family's own networks (fb.resnet.torch's: CIFAR's 32x32 images
# whole; ImageNet resized to 256 on the shorter side, centre 224). Networks registered for
# converted weights take their source's geometry instead (`pretrained.preprocessing_for`).
FAMILY_PREPROCESSING = {
    "cifar": Preprocessing("cifar", size=32, crop_pct=None),
    "imagenet": Preprocessing("imagenet", size=224, crop_pct=224 / 256),
}
# timm's pretrained configs (timm/models/resnetv2.py `_cfg` and its tags): Inception mean/std
# (0.5), eval at 224 after resizing the shorter side to 224 / crop_pct.
TIMM_DEFAULT = Preprocessing("inception", size=224, crop_pct=0.875)


def default_preprocessing(spec) -> Preprocessing:
    """What a network `spec` takes before any published record says more: timm's ResNetV2
    default for timm's stem (`stem="conv-pool"`), else its family's. A record of converted
    weights changes the geometry only, never these statistics (`tests/weights/test_timm.py`), so
    they are what `include_preprocessing` bakes in (`builder.preprocessing_layer`).

    Example:
    >>> from keras_preact.arch.specs import resolve
    >>> default_preprocessing(resolve("preact-50-imagenet-timm")).stats
    'inception'
    """
    return TIMM_DEFAULT if spec.stem == "conv-pool" else FAMILY_PREPROCESSING[spec.family]


def resize_for_eval(images: ArrayLike, preprocessing: Preprocessing,
                    size: int | None = None) -> tf.Tensor:
    """Evaluation geometry, shared by the eval pipeline and the serving signatures.

    Resize to `size` x `size` (`crop_pct=None`, a no-op for CIFAR's 32x32 input); else resize
    the shorter side to `size / crop_pct` (ImageNet: 256 for 224), then centre-crop `size` x
    `size`; with `preprocessing.interpolation`.

    Args:
        images: `(batch, height, width, 3)` or `(height, width, 3)` uint8/float tensor.
        preprocessing: the network's (`keras_preact.api.preprocessing_of`).
        size: output side; defaults to `preprocessing.size`.

    Returns:
        float32 images of side `size`, values still in [0, 255].

    Example:
    >>> import numpy as np
    >>> images = np.zeros((1, 300, 400, 3), "uint8")  # shorter side to 256, centre 224
    >>> resize_for_eval(images, FAMILY_PREPROCESSING["imagenet"]).shape
    TensorShape([1, 224, 224, 3])
    """
    import tensorflow as tf  # tf.data and SavedModel code paths only

    size = size or preprocessing.size
    method = preprocessing.interpolation
    # No cast first: tf.image.resize reads uint8 and returns float32, so a large input is never
    # copied at full size as floats (192 MB for a 4096x4096 image).
    if preprocessing.crop_pct is None:
        return tf.image.resize(images, (size, size), method=method)
    shape = tf.shape(images)
    height, width = tf.cast(shape[-3], tf.float32), tf.cast(shape[-2], tf.float32)
    scale = size / preprocessing.crop_pct / tf.minimum(height, width)
    new_hw = tf.cast(tf.round(tf.stack([height * scale, width * scale])), tf.int32)
    # Bicubic overshoots: clip back to the pixel range the statistics were computed on.
    images = tf.clip_by_value(tf.image.resize(images, new_hw, method=method), 0.0, 255.0)
    top = (new_hw[0] - size) // 2
    left = (new_hw[1] - size) // 2
    return images[..., top : top + size, left : left + size, :]
