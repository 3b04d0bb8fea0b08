"""The datasets the zoo knows by name: what a published weights file was trained on and what
the trainer feeds (`keras_preact.data.pipeline` adds image folders and any TFDS dataset).

Example:
>>> DATASETS["cifar10"].classes, DATASETS["imagenet2012"].eval_split
(10, 'validation')
"""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class DatasetInfo:
    family: str | None  # preprocessing family it fixes ("cifar"/"imagenet"); None: the model's
    classes: int
    eval_split: str | None  # the labelled held-out split `evaluate` uses by default
    class_names: tuple[str, ...] = ()
    # The split the trainer validates on by default instead of carving train (a TFDS
    # dataset's own "validation"), and the share of train it carves when there is none.
    val_split: str | None = None
    val_share: float = 0.0
    val_examples: int | None = None  # a fixed count held out instead (the paper datasets)


# Validation held out of CIFAR and ImageNet's train by default (`val_examples`).
PAPER_VAL_EXAMPLES = 5000
DATASETS = {
    "cifar10": DatasetInfo("cifar", 10, "test", val_examples=PAPER_VAL_EXAMPLES),
    "cifar100": DatasetInfo("cifar", 100, "test", val_examples=PAPER_VAL_EXAMPLES),
    "imagenet2012": DatasetInfo("imagenet", 1000, "validation",
                                val_examples=PAPER_VAL_EXAMPLES),
}
