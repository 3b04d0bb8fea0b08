"""Class names for CIFAR-10, CIFAR-100 and ImageNet, and Keras-style `decode_predictions`."""

from __future__ import annotations

import os
from collections.abc import Sequence

import numpy as np
from numpy.typing import ArrayLike

from keras_preact.arch.specs import is_positive_int

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

# Where class names come from: the names themselves, or a run dir or model.keras whose run
# recorded them (`recorded_names`).
NameSource = str | os.PathLike | Sequence[str] | np.ndarray

# The 1000 human-readable ImageNet names in index order, one per line: package data, written
# once from tensorflow-datasets' `datasets.siscore.labels.IMAGENET_LABELS_LIST` (an internal
# module of another dataset; tests/test_applications.py checks the copy against it).
IMAGENET_FILE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "imagenet_classes.txt")


def imagenet_names() -> tuple[str, ...]:
    """The 1000 ImageNet class names in index order.

    Example:
    >>> imagenet_names()[1]
    'goldfish, Carassius auratus'
    """
    with open(IMAGENET_FILE, encoding="utf-8") as f:
        return tuple(f.read().splitlines())


def as_list(labels: Sequence[str] | np.ndarray) -> list:
    """`labels` (a list, tuple or array of names) as a list. A single string is refused: it
    would be taken as one label per character ("abcdefghij" as 10 labels).

    Example:
    >>> as_list(("cat", "dog"))
    ['cat', 'dog']
    """
    if isinstance(labels, (str, bytes)) or not isinstance(labels, (Sequence, np.ndarray)):
        raise ValueError(f"`labels` must be a list or tuple of names, one per item. "
                         f"Received: labels={labels!r}")
    return list(labels)


def check_names(labels: Sequence[str] | np.ndarray, classes: int) -> tuple[str, ...]:
    """`labels` as a tuple of `classes` strings, one per class; anything else (a single
    string included, see `as_list`) is a ValueError.

    Example:
    >>> check_names(["cat", "dog"], 2)
    ('cat', 'dog')
    """
    names = as_list(labels)
    if len(names) != classes or not all(isinstance(name, str) for name in names):
        raise ValueError(f"`labels` must be {classes} strings, one per class. Received "
                         f"{len(names)} items: {names[:3]}...")
    return tuple(names)


def recorded_names(source: object) -> tuple[str, ...] | None:
    """The class names a training run recorded (config.json "class_names": a folder's or a
    dataset's), for `source` = its run dir or its model.keras; None for anything else.

    Example:
    >>> import tempfile
    >>> from keras_preact import rundir
    >>> run_dir = tempfile.mkdtemp()
    >>> rundir.write_config(run_dir, {"class_names": ["cat", "dog"]})
    >>> open(os.path.join(run_dir, "model.keras"), "w").close()
    >>> recorded_names(run_dir), recorded_names(os.path.join(run_dir, "model.keras"))
    (('cat', 'dog'), ('cat', 'dog'))
    """
    from keras_preact import rundir

    names = rundir.recorded(source).get("class_names")
    return tuple(names) if isinstance(names, list) and names else None


def class_names(classes: int, source: NameSource | None = None) -> tuple[str, ...]:
    """Names for a classifier with `classes` outputs: those of `source` (a list of names, or a
    run dir or model.keras whose run recorded them, `recorded_names`); else CIFAR-10 (10),
    CIFAR-100 (100), ImageNet (1000); otherwise `class_0`, `class_1`, ...

    Example:
    >>> class_names(10)[:3]
    ('airplane', 'automobile', 'bird')
    >>> class_names(2, ["cat", "dog"])
    ('cat', 'dog')
    """
    if source is not None and not isinstance(source, (str, os.PathLike)) and isinstance(
            source, (Sequence, np.ndarray)):
        return check_names(source, classes)
    recorded = recorded_names(source)
    if recorded is not None:
        return check_names(recorded, classes)
    if classes == len(CIFAR10):
        return CIFAR10
    if classes == len(CIFAR100):
        return CIFAR100
    if classes == 1000:
        return imagenet_names()
    return tuple(f"class_{i}" for i in range(classes))


def decode_predictions(
    preds: ArrayLike, top: int = 5, class_names_from: NameSource | None = None
) -> list[list[tuple[int, str, float]]]:
    """Top-`top` (class index, name, score) per row of a `(batch, classes)` prediction; the
    names are `class_names(classes, class_names_from)`: pass a run dir (or a list of names)
    for a network fine-tuned on your own classes.

    Example:
    >>> decode_predictions(np.eye(10)[[3]], top=1)
    [[(3, 'cat', 1.0)]]
    >>> decode_predictions(np.eye(2)[[1]], top=1, class_names_from=["cat", "dog"])
    [[(1, 'dog', 1.0)]]
    """
    preds = np.asarray(preds)
    if preds.ndim != 2:
        raise ValueError(
            f"`decode_predictions` expects a (batch, classes) array. Received shape {preds.shape}."
        )
    if not is_positive_int(top):
        raise ValueError(f"`top` must be a positive integer. Received: top={top!r}")
    names = class_names(preds.shape[1], class_names_from)
    top = min(top, preds.shape[1])
    return [
        [(int(i), names[i], float(row[i])) for i in np.argsort(row)[::-1][:top]]
        for row in preds
    ]
