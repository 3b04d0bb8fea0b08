"""TFDS input pipelines: the paper's CIFAR augmentation, fb.resnet.torch's ImageNet crops.

Images stay uint8 through caching, shuffling and augmentation; normalization
(`preprocessing.preprocess_input`) runs once per batch at the end, and evaluation uses the
shared `preprocessing.resize_for_eval` geometry, so training, `evaluate` and serving all see
the same numbers.
"""

from __future__ import annotations

import dataclasses

# TensorFlow and preprocessing (Keras) are imported where used: `keras-preact train --help`
# reads DATASETS (through TrainConfig) and must answer at once.


@dataclasses.dataclass(frozen=True)
class DatasetInfo:
    family: str  # preprocessing family: "cifar" or "imagenet"
    classes: int
    eval_split: str  # the held-out split `evaluate` uses by default ("test" / "validation")


DATASETS = {
    "cifar10": DatasetInfo("cifar", 10, "test"),
    "cifar100": DatasetInfo("cifar", 100, "test"),
    "imagenet2012": DatasetInfo("imagenet", 1000, "validation"),
}
CIFAR_PAD = 4  # zero pixels added on each side before the random 32x32 crop
# fb.resnet.torch RandomSizedCrop: 8 %-100 % of the area, aspect ratio 3/4-4/3.
IMAGENET_AREA = (0.08, 1.0)
IMAGENET_ASPECT = (3 / 4, 4 / 3)


def dataset_info(name: str) -> DatasetInfo:
    if name not in DATASETS:
        raise ValueError(f"Unknown dataset {name!r}. Valid datasets: {sorted(DATASETS)}.")
    return DATASETS[name]


def check_split(name: str, split: str, data_dir: str | None, download: bool = False) -> int:
    """Fails early, with a clear message, unless `split` of `name` is available.

    With `download`, a dataset that is not prepared yet is downloaded and prepared by TFDS as
    usual (CIFAR; ImageNet needs TFDS's manual download). A `data_dir` that does not exist is
    an error either way: a typo must not start a download somewhere else.
    Returns the number of examples in `split` (TFDS slicing syntax, e.g. "train[:45000]").
    """
    import os

    import tensorflow_datasets as tfds

    dataset_info(name)
    if data_dir is not None and os.path.exists(data_dir) and not os.path.isdir(data_dir):
        raise NotADirectoryError(f"The data dir {data_dir!r} is not a directory.")
    if data_dir is not None and not os.path.isdir(data_dir):
        raise FileNotFoundError(f"The data dir {data_dir!r} does not exist.")
    builder = tfds.builder(name, data_dir=data_dir)
    if not builder.is_prepared():
        if download and name != "imagenet2012":
            _download(builder, name)
        else:
            hint = (
                " ImageNet needs a manual download: `tfds build imagenet2012 --manual_dir DIR "
                "--data_dir D` (see the TFDS imagenet2012 page)."
                if name == "imagenet2012"
                else f" Prepare it with `tfds build {name} --data_dir D`, or allow the download."
            )
            raise FileNotFoundError(
                f"Dataset {name!r} is not prepared in data_dir={builder.data_dir_root!s}.{hint}"
            )
    base = split.split("[")[0]
    if base not in builder.info.splits:
        raise ValueError(
            f"Dataset {name!r} has no split {base!r} in {builder.data_dir_root}. "
            f"Available: {sorted(builder.info.splits)}. Received: split={split!r}"
        )
    bad = (f"Bad split {split!r} of dataset {name!r} (TFDS slicing, e.g. 'train[:45000]', "
           "'train[-5000:]', 'test[:10%]'): ")
    try:
        examples = builder.info.splits[split].num_examples
    except ValueError as error:  # TFDS': the cause on its last line
        raise ValueError(bad + str(error).splitlines()[-1]) from None
    if examples < 1:  # TFDS counts an empty or reversed slice, e.g. train[10:5], as <= 0
        raise ValueError(f"{bad}it holds {examples} examples")
    return examples


class DownloadFailed(ConnectionError):
    """TFDS could not download a dataset (no network, a proxy, the host down)."""


def _download(builder, name: str) -> None:
    """`builder.download_and_prepare()`; on failure, one-line DownloadFailed, and the
    directories the attempt made are removed (an empty dataset dir left by TFDS made every
    later TFDS call warn about it)."""
    import os
    import shutil

    from keras_preact.files import missing_dirs

    made = [dirs[-1] for dirs in (missing_dirs(builder.data_dir), missing_dirs(
        os.path.join(builder.data_dir_root, "downloads"))) if dirs]  # the top-most of each
    try:
        builder.download_and_prepare()
    except Exception as error:  # requests, urllib3 and TFDS raise many kinds for one cause
        for path in made:
            shutil.rmtree(path, ignore_errors=True)
        cause = str(error).splitlines()[0][:300] if str(error) else ""
        raise DownloadFailed(
            f"Could not download dataset {name!r} ({type(error).__name__}: {cause}). Without "
            f"network, pass --data-dir with a prepared copy, or run `tfds build {name} "
            "--data_dir DIR` on a machine with network and copy DIR here."
        ) from None


def train_val_splits(val_examples: int) -> tuple[str, str | None]:
    """`train[:-N]` / `train[-N:]`: a validation slice carved from the training split."""
    if val_examples == 0:
        return "train", None
    return f"train[:-{val_examples}]", f"train[-{val_examples}:]"


def augment_cifar(image, seed=None):
    """4-pixel zero padding, random 32x32 crop, random horizontal flip (paper, Appendix).

    Example:
    >>> import numpy as np
    >>> augment_cifar(np.zeros((32, 32, 3), "uint8")).shape
    TensorShape([32, 32, 3])
    """
    import tensorflow as tf

    height, width = image.shape[0] or 32, image.shape[1] or 32
    padded = tf.pad(image, [[CIFAR_PAD, CIFAR_PAD], [CIFAR_PAD, CIFAR_PAD], [0, 0]])
    image = tf.image.random_crop(padded, (height, width, 3), seed=seed)
    return tf.image.random_flip_left_right(image, seed=seed)


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


def _load(name: str, split: str, data_dir: str | None, shuffle_files: bool):
    import tensorflow_datasets as tfds

    return tfds.load(
        name,
        split=split,
        data_dir=data_dir,
        download=False,
        as_supervised=True,
        shuffle_files=shuffle_files,
    )


def _options():
    import tensorflow as tf

    options = tf.data.Options()
    # TFDS CIFAR is a single file: shard by data so every worker gets a distinct part of
    # each global batch instead of a warning and the same fallback.
    options.experimental_distribute.auto_shard_policy = (
        tf.data.experimental.AutoShardPolicy.DATA
    )
    options.deterministic = False
    return options


def train_dataset(
    name: str,
    split: str,
    batch_size: int,
    data_dir: str | None = None,
    image_size: int | None = None,
    seed: int | None = None,
):
    """Infinite, augmented, shuffled, normalized `(images, labels)` batches of `batch_size`.

    `batch_size` is the *global* batch: `model.fit` under a `tf.distribute` strategy splits
    it across replicas (and shards it across workers).
    """
    import tensorflow as tf

    from keras_preact import preprocessing

    info = dataset_info(name)
    ds = _load(name, split, data_dir, shuffle_files=True)
    if info.family == "cifar":
        # 50k 32x32 uint8 images are 150 MB: cache decoded, shuffle the whole split.
        ds = ds.cache().shuffle(50_000, seed=seed).repeat()
        ds = ds.map(lambda x, y: (augment_cifar(x), y), num_parallel_calls=tf.data.AUTOTUNE)
    else:
        size = image_size or preprocessing.EVAL_SIZE["imagenet"]
        ds = ds.shuffle(10_000, seed=seed).repeat()
        ds = ds.map(
            lambda x, y: (augment_imagenet(x, size), y), num_parallel_calls=tf.data.AUTOTUNE
        )
    ds = ds.batch(batch_size, drop_remainder=True)
    ds = ds.map(
        lambda x, y: (preprocessing.preprocess_input(x, info.family), y),
        num_parallel_calls=tf.data.AUTOTUNE,
    )
    return ds.prefetch(tf.data.AUTOTUNE).with_options(_options())


def eval_dataset(
    name: str,
    split: str,
    batch_size: int,
    data_dir: str | None = None,
    image_size: int | None = None,
    cache: bool = False,
):
    """Un-augmented batches with the shared eval geometry (CIFAR 32; ImageNet 256 -> 224)."""
    import tensorflow as tf

    from keras_preact import preprocessing

    info = dataset_info(name)
    ds = _load(name, split, data_dir, shuffle_files=False)

    def prepare(image, label):
        image = preprocessing.resize_for_eval(image, info.family, image_size)
        return preprocessing.preprocess_input(image, info.family), label

    ds = ds.map(prepare, num_parallel_calls=tf.data.AUTOTUNE)
    if cache:
        ds = ds.cache()
    ds = ds.batch(batch_size)
    return ds.prefetch(tf.data.AUTOTUNE).with_options(_options())
