"""The paper's training augmentation: CIFAR's pad-and-crop with flips (He et al. 2016),
fb.resnet.torch's ImageNet random-sized crops. uint8 images in and out."""

from __future__ import annotations

CIFAR_PAD = 4  # zero pixels added on each side before the random 32x32 crop
# fb.resnet.torch RandomSizedCrop: 8 %-100 % of the area, aspect ratio 3/4-4/3.
IMAGENET_AREA = (0.08, 1.0)
IMAGENET_ASPECT = (3 / 4, 4 / 3)


def augment_cifar(image, seed=None):
    """4-pixel zero padding, random 32x32 crop, random horizontal flip (paper, Appendix).
    With `seed` (a [2] int tensor), stateless: the same image and seed give the same crop and
    flip in any thread and any process (`data.train_dataset` with `deterministic`).

    Example:
    >>> import numpy as np
    >>> augment_cifar(np.zeros((32, 32, 3), "uint8")).shape
    TensorShape([32, 32, 3])
    """
    import tensorflow as tf

    height, width = image.shape[0] or 32, image.shape[1] or 32
    padded = tf.pad(image, [[CIFAR_PAD, CIFAR_PAD], [CIFAR_PAD, CIFAR_PAD], [0, 0]])
    if seed is None:
        image = tf.image.random_crop(padded, (height, width, 3))
        return tf.image.random_flip_left_right(image)
    crop, flip = tf.unstack(tf.random.experimental.stateless_split(seed, 2))
    image = tf.image.stateless_random_crop(padded, (height, width, 3), seed=crop)
    return tf.image.stateless_random_flip_left_right(image, seed=flip)


def augment_imagenet(image, size: int = 224):
    """Scale + aspect-ratio augmentation (fb.resnet.torch RandomSizedCrop) and a flip.

    fb.resnet.torch also jitters colour and adds PCA lighting noise; those are left out
    (the paper's Table 5 names only scale and aspect ratio).
    """
    import tensorflow as tf

    begin, crop_size, _ = tf.image.sample_distorted_bounding_box(
        tf.shape(image),
        bounding_boxes=tf.zeros((1, 0, 4)),
        area_range=IMAGENET_AREA,
        aspect_ratio_range=IMAGENET_ASPECT,
        min_object_covered=0.0,
        max_attempts=10,
        use_image_if_no_bounding_boxes=True,
    )
    image = tf.slice(image, begin, crop_size)
    image = tf.image.resize(image, (size, size))
    image = tf.image.random_flip_left_right(image)
    return tf.cast(tf.clip_by_value(tf.round(image), 0, 255), tf.uint8)
