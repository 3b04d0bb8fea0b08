"""The caller's images as NumPy arrays, fed to `model.fit` without TensorFlow: `(images,
labels)` checked (`check`), sliced as the trainer's splits (`select`), the paper's CIFAR
augmentation in NumPy (`augment_cifar`), and `Batches`, a `keras.utils.PyDataset` that every
Keras backend reads. A JAX machine without TensorFlow trains from these
(`training.train(..., dataset=(images, labels))`).

Batch `i` of a `Batches` stream is a function of `(seed, i)` alone: the order of each pass
over the images is drawn from `(seed, pass)`, each batch's crops and flips from `(seed, i)`.
So any reader (Keras' first peek to build the model, a resumed run starting at the step it
stopped at) sees the same batches, without replaying any generator.
"""

from __future__ import annotations

import keras
import numpy as np

from keras_preact.data import folders
from keras_preact.data.augment import CIFAR_PAD
from keras_preact.preprocessing import Preprocessing, scale_and_offset


def check(dataset: tuple, classes: int) -> tuple[np.ndarray, np.ndarray]:
    """`dataset` as the trainer takes arrays: `(images, labels)`, uint8 RGB images
    `[n, h, w, 3]` and int labels `[n]` in `[0, classes)`; a one-line ValueError otherwise."""
    if len(dataset) != 2:
        raise ValueError(f"`dataset` arrays must be a pair (images, labels). Received: a tuple "
                         f"of {len(dataset)}")
    images, labels = (np.asarray(a) for a in dataset)
    if images.dtype != np.uint8 or images.ndim != 4 or images.shape[-1] != 3:
        raise ValueError(f"`dataset` images must be a uint8 array [n, height, width, 3] (RGB). "
                         f"Received: dtype {images.dtype}, shape {images.shape}")
    if not np.issubdtype(labels.dtype, np.integer) or labels.shape != images.shape[:1]:
        raise ValueError(f"`dataset` labels must be an int array [n] (n = {len(images)}, one "
                         f"per image). Received: dtype {labels.dtype}, shape {labels.shape}")
    if len(labels) and not 0 <= labels.min() <= labels.max() < classes:
        raise ValueError(f"`dataset` labels must lie in [0, {classes}) ({classes} class names)."
                         f" Received: labels from {labels.min()} to {labels.max()}")
    return images, labels.astype(np.int64)


def select(arrays: tuple[np.ndarray, np.ndarray], split: str,
           shard: tuple[int, int] | None = None):
    """`split` ("all", "all[:-N]", "all[-N:]": `pipeline.train_val_splits`) of the arrays;
    with `shard` (`(index, count)`), part `index` of `count` equal parts of it (every
    `count`-th pair from `index`, the last `len % count` left out).

    Example:
    >>> select((np.arange(7), np.arange(7)), "all[:-1]", shard=(1, 2))[0]
    array([1, 3, 5])
    """
    part = folders.select(split)
    chosen = tuple(a[part] for a in arrays)
    if shard is None:
        return chosen
    index, count = shard
    equal = len(chosen[1]) // count * count
    return tuple(a[:equal][index::count] for a in chosen)


def augment_cifar(images: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """The paper's CIFAR augmentation of a uint8 batch `[b, h, w, c]`, as
    `augment.augment_cifar` does it per image: 4-pixel zero padding, a random crop of the
    original size, a random horizontal flip."""
    count, height, width, _ = images.shape
    pad = CIFAR_PAD
    padded = np.pad(images, ((0, 0), (pad, pad), (pad, pad), (0, 0)))
    tops, lefts = rng.integers(0, 2 * pad + 1, size=(2, count))
    flips = rng.random(count) < 0.5
    out = np.empty_like(images)
    for i, (top, left, flip) in enumerate(zip(tops, lefts, flips)):
        crop = padded[i, top:top + height, left:left + width]
        out[i] = crop[:, ::-1] if flip else crop
    return out


class Batches(keras.utils.PyDataset):
    """Normalized `(images, labels)` batches of `batch_size` of uint8 `arrays`, for
    `model.fit`: with `train`, an endless stream of shuffled, CIFAR-augmented batches (each
    a function of `(seed, index)`, module doc); else one pass in order, the last batch short.

    `skip(n)` starts the stream `n` batches later (a resumed run: the batch of step `n + 1`).
    `preprocessing` is the network's (`preprocessing.Preprocessing`: its normalization).
    """

    def __init__(self, arrays: tuple[np.ndarray, np.ndarray], batch_size: int,
                 preprocessing: Preprocessing, *, train: bool, seed: int | None = None,
                 start: int = 0):
        super().__init__()  # one worker, in the training thread: NumPy slicing is fast
        self.images, self.labels = arrays
        self.batch_size, self.train, self.start = batch_size, train, start
        self.preprocessing = preprocessing
        # No seed: a fresh one, so that unseeded runs differ (as tf.data's do).
        self.seed = int(np.random.SeedSequence().entropy % 2**63) if seed is None else seed
        scale, offset = ((1.0,) * 3, (0.0,) * 3) if preprocessing.in_model else (
            scale_and_offset(preprocessing.stats))  # in the model: the pixels as they are
        self.scale, self.offset = np.float32(scale), np.float32(offset)

    @property
    def num_batches(self) -> int | None:
        """None when training: Keras then reads it as endless (fit's steps_per_epoch ends
        each epoch), and goes on with the next index in the next epoch."""
        return None if self.train else -(-len(self.labels) // self.batch_size)

    def skip(self, batches: int) -> Batches:
        return Batches((self.images, self.labels), self.batch_size, self.preprocessing,
                       train=self.train, seed=self.seed, start=self.start + batches)

    def __getitem__(self, index: int) -> tuple[np.ndarray, np.ndarray]:
        index += self.start
        size, n = self.batch_size, len(self.labels)
        if not self.train:
            part = slice(index * size, (index + 1) * size)
            return self._normalized(self.images[part]), self.labels[part]
        per_pass = n // size  # whole batches only (the rest of a pass is left out)
        order = np.random.default_rng((self.seed, 0, index // per_pass)).permutation(n)
        picked = order[(index % per_pass) * size:][:size]
        rng = np.random.default_rng((self.seed, 1, index))
        return self._normalized(augment_cifar(self.images[picked], rng)), self.labels[picked]

    def _normalized(self, images: np.ndarray) -> np.ndarray:
        # As `preprocessing.preprocess_input` computes it (scale, then offset), in NumPy.
        return images.astype(np.float32) * self.scale + self.offset
