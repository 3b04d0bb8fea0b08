"""Class names for CIFAR-10, CIFAR-100 and ImageNet, and Keras-style `decode_predictions`."""

from __future__ import annotations

import numpy as np

CIFAR10 = (
    "airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck",
)
# CIFAR-100 fine labels in their official index order.
CIFAR100 = tuple(
    """apple aquarium_fish baby bear beaver bed bee beetle bicycle bottle bowl boy bridge bus
    butterfly camel can castle caterpillar cattle chair chimpanzee clock cloud cockroach couch
    crab crocodile cup dinosaur dolphin elephant flatfish forest fox girl hamster house kangaroo
    keyboard lamp lawn_mower leopard lion lizard lobster man maple_tree motorcycle mountain mouse
    mushroom oak_tree orange orchid otter palm_tree pear pickup_truck pine_tree plain plate poppy
    porcupine possum rabbit raccoon ray road rocket rose sea seal shark shrew skunk skyscraper
    snail snake spider squirrel streetcar sunflower sweet_pepper table tank telephone television
    tiger tractor train trout tulip turtle wardrobe whale willow_tree wolf woman worm""".split()
)


def imagenet_names() -> tuple[str, ...]:
    # tensorflow-datasets ships the 1000 human-readable ImageNet names in index order.
    from tensorflow_datasets.datasets.siscore import labels

    return tuple(labels.IMAGENET_LABELS_LIST)


def class_names(classes: int) -> tuple[str, ...]:
    """Names for a classifier with `classes` outputs: CIFAR-10 (10), CIFAR-100 (100),
    ImageNet (1000); otherwise `class_0`, `class_1`, ...

    Example:
    >>> class_names(10)[:3]
    ('airplane', 'automobile', 'bird')
    """
    if classes == len(CIFAR10):
        return CIFAR10
    if classes == len(CIFAR100):
        return CIFAR100
    if classes == 1000:
        return imagenet_names()
    return tuple(f"class_{i}" for i in range(classes))


def decode_predictions(preds, top: int = 5) -> list[list[tuple[int, str, float]]]:
    """Top-`top` (class index, name, score) per row of a `(batch, classes)` prediction.

    Example:
    >>> decode_predictions(np.eye(10)[[3]], top=1)
    [[(3, 'cat', 1.0)]]
    """
    preds = np.asarray(preds)
    if preds.ndim != 2:
        raise ValueError(
            f"`decode_predictions` expects a (batch, classes) array. Received shape {preds.shape}."
        )
    names = class_names(preds.shape[1])
    top = min(top, preds.shape[1])
    return [
        [(int(i), names[i], float(row[i])) for i in np.argsort(row)[::-1][:top]]
        for row in preds
    ]
