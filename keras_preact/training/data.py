"""TFDS input pipelines: the paper's CIFAR augmentation, fb.resnet.torch's ImageNet crops.

Images stay uint8 through caching, shuffling and augmentation; normalization
(`preprocessing.preprocess_input`) runs once per batch at the end, and evaluation uses the
shared `preprocessing.resize_for_eval` geometry, so training, `evaluate` and serving all see
the same numbers.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import shutil

# TensorFlow and preprocessing (Keras) are imported where used: `keras-preact train --help`
# reads DATASETS (through TrainConfig) and must answer at once.


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
# The share of a folder (as Keras' validation_split examples) or of a TFDS dataset's train
# without a validation split that is held out by default.
FOLDER_VAL_SHARE = 0.2
TFDS_VAL_SHARE = 0.1
CIFAR_PAD = 4  # zero pixels added on each side before the random 32x32 crop
# fb.resnet.torch RandomSizedCrop: 8 %-100 % of the area, aspect ratio 3/4-4/3.
IMAGENET_AREA = (0.08, 1.0)
IMAGENET_ASPECT = (3 / 4, 4 / 3)
DATASET_HELP = ("cifar10, cifar100, imagenet2012, any TFDS image-classification dataset by "
                "name (e.g. tf_flowers), or a folder with one subfolder of images per class")


def dataset_info(name: str, data_dir: str | None = None) -> DatasetInfo:
    """What the trainer needs to know of `--dataset` `name`: a paper dataset (`DATASETS`), an
    image folder (`folders.is_folder`) or any TFDS image-classification dataset; a one-line
    ValueError for anything else. A TFDS dataset's splits are known once it is prepared.

    Example:
    >>> dataset_info("cifar10").class_names[:2]
    ('airplane', 'automobile')
    """
    from keras_preact import labels
    from keras_preact.training import folders

    if not isinstance(name, str) or not name:
        raise ValueError(f"`dataset` must be a TFDS name or a folder. Received: {name!r}")
    if name in DATASETS:
        info = DATASETS[name]
        return dataclasses.replace(info, class_names=labels.class_names(info.classes))
    if folders.is_folder(name):
        folder = folders.scan(name)
        return DatasetInfo(None, len(folder.class_names), "all", folder.class_names,
                           val_share=FOLDER_VAL_SHARE)
    return _tfds_info(name, data_dir)


def _tfds_info(name: str, data_dir: str | None) -> DatasetInfo:
    """A TFDS dataset whose supervised keys are (Image, ClassLabel)."""
    import tensorflow_datasets as tfds

    try:
        builder = tfds.builder(name, data_dir=data_dir)
    except Exception as error:  # TFDS' DatasetNotFoundError lists every dataset it knows
        raise ValueError(f"Unknown dataset {name!r} ({type(error).__name__}). Valid: "
                         f"{DATASET_HELP}.") from None
    info = builder.info
    keys = info.supervised_keys or ()
    features = [info.features[k] if isinstance(k, str) and k in info.features else None
                for k in keys[:2]]
    if not (len(features) == 2 and isinstance(features[0], tfds.features.Image)
            and isinstance(features[1], tfds.features.ClassLabel)):
        raise ValueError(f"TFDS dataset {name!r} is not image classification: its supervised "
                         f"keys must be (Image, ClassLabel). Received: supervised_keys={keys!r}")
    splits = set(info.splits)
    held_out = next((s for s in ("test", "validation") if s in splits), None)
    val = "validation" if "validation" in splits and held_out != "validation" else None
    return DatasetInfo(None, features[1].num_classes, held_out, tuple(features[1].names),
                       val_split=val, val_share=0.0 if val else TFDS_VAL_SHARE)


def check_source(name: str, data_dir: str | None = None, download: bool = False):
    """What `check_split` checks first, without TensorFlow (the CLI calls it before TensorFlow
    starts, which takes 8-17 s on 2 busy cores): `name` is an image folder, or a TFDS
    image-classification dataset whose data dir exists and which is prepared or, with
    `download`, whose download hosts answer (one probe each, `PROBE_TIMEOUT_S` at most).
    Returns the TFDS builder (None for a folder).

    Example:
    >>> check_source("cifar10", "../shared/tensorflow_datasets").is_prepared()  # doctest: +SKIP
    True
    """
    import tensorflow_datasets as tfds

    from keras_preact.training import folders

    dataset_info(name, data_dir)
    if folders.is_folder(name):
        return None
    if data_dir is not None and os.path.exists(data_dir) and not os.path.isdir(data_dir):
        raise NotADirectoryError(f"The data dir {data_dir!r} is not a directory.")
    if data_dir is not None and not os.path.isdir(data_dir):
        raise FileNotFoundError(f"The data dir {data_dir!r} does not exist.")
    builder = tfds.builder(name, data_dir=data_dir)
    if _is_prepared(builder):
        return builder
    if download and name != "imagenet2012":
        _probe(builder.url_infos or {}, name)
        return builder
    hint = (
        " ImageNet needs a manual download: `tfds build imagenet2012 --manual_dir DIR "
        "--data_dir D` (see the TFDS imagenet2012 page)."
        if name == "imagenet2012"
        else f" Prepare it with `tfds build {name} --data_dir D`, or allow the download."
    )
    raise FileNotFoundError(
        f"Dataset {name!r} is not prepared in data_dir={builder.data_dir_root!s}.{hint}")


def check_split(name: str, split: str, data_dir: str | None, download: bool = False) -> int:
    """Fails early, with a clear message, unless `split` of `name` is available.

    With `download`, a dataset that is not prepared yet is downloaded and prepared by TFDS as
    usual (CIFAR; ImageNet needs TFDS's manual download). A `data_dir` that does not exist is
    an error either way: a typo must not start a download somewhere else. An image folder's
    images in `split` are decoded once (`folders.check_images`).
    Returns the number of examples in `split` (TFDS slicing syntax, e.g. "train[:45000]").
    """
    from keras_preact.training import folders

    if folders.is_folder(name):
        folder = folders.scan(name)
        examples = folders.count(folder, split)
        if examples < 1:
            raise ValueError(f"Split {split!r} of image folder {name!r} holds no images "
                             f"(it has {len(folder.files)}).")
        folders.check_images(folder, split)
        return examples
    builder = check_source(name, data_dir, download)
    if not _is_prepared(builder):
        _download(builder, name)
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


def _is_prepared(builder) -> bool:
    """`builder.is_prepared()` without the absl warning it logs when not ("Variant folder
    ... has no dataset_info.json"): `check_split` says so in its own words."""
    absl = logging.getLogger("absl")
    level = absl.level
    absl.setLevel(logging.ERROR)
    try:
        return builder.is_prepared()
    finally:
        absl.setLevel(level)


class DownloadFailed(ConnectionError):
    """TFDS could not download a dataset (no network, a proxy, the host down)."""


# Each download host is tried once, this long, before TFDS starts (`check_source`): TFDS
# retries every file 10 times with back-off (3.4 minutes of urllib3 warnings offline).
PROBE_TIMEOUT_S = 5


def _download(builder, name: str) -> None:
    """Downloads and prepares `name` into `builder`'s data dir; on failure, one line, and
    what the attempt created there (dataset, downloads and extraction dirs) is removed."""
    root = str(builder.data_dir_root)
    before = _paths(root)
    try:
        builder.download_and_prepare()
    except Exception as error:  # requests, urllib3 and TFDS raise many kinds for one cause
        _remove_new(root, before)
        cause = str(error).splitlines()[0][:300] if str(error) else ""
        raise DownloadFailed(_download_failed(name, f"{type(error).__name__}: {cause}")) from None


def _download_failed(name: str, cause: str) -> str:
    return (f"Could not download dataset {name!r} ({cause}). Without network, pass --data-dir "
            f"with a prepared copy, or run `tfds build {name} --data_dir DIR` on a machine with "
            "network and copy DIR here.")


def _probe(urls, name: str) -> None:
    """One HEAD request (through the environment's proxies, as TFDS' requests) to each host
    of `urls`; any HTTP answer will do. Datasets without recorded URLs, and FTP ones (no HEAD
    there), are not probed."""
    import urllib.error
    import urllib.parse
    import urllib.request

    hosts = {}
    for url in urls:
        if url.startswith(("http://", "https://")):
            hosts.setdefault(urllib.parse.urlsplit(url).netloc, url)
    for host, url in sorted(hosts.items()):
        try:
            urllib.request.urlopen(urllib.request.Request(url, method="HEAD"),
                                   timeout=PROBE_TIMEOUT_S).close()
        except urllib.error.HTTPError:
            pass  # the host answered
        except (OSError, ValueError) as error:  # URLError, timeouts, refused connections
            reason = getattr(error, "reason", error)
            raise DownloadFailed(_download_failed(name, f"{host} unreachable: {reason}")) from None


def _paths(root: str, depth: int = 3) -> set[str]:
    """`root` and what is in it `depth` levels down: where a TFDS download writes
    (NAME/VERSION, downloads/NAME/FILE.tmp, downloads/extracted)."""
    found = {root} if os.path.exists(root) else set()
    level = [root]
    for _ in range(depth):
        level = [os.path.join(d, n) for d in level
                 if os.path.isdir(d) and not os.path.islink(d) for n in os.listdir(d)]
        found.update(level)
    return found


def _remove_new(root: str, before: set[str]) -> None:
    """Removes what is under `root` now and was not in `before` (only that)."""
    for path in sorted(_paths(root) - before):  # a folder before what is in it
        if os.path.isdir(path) and not os.path.islink(path):
            shutil.rmtree(path, ignore_errors=True)
        elif os.path.lexists(path):
            os.remove(path)


def train_base(name) -> str:
    """The split the trainer trains (and carves validation) from: "train" of a TFDS dataset,
    "all" of an image folder or a tf.data.Dataset."""
    from keras_preact.training import folders

    return "all" if not isinstance(name, str) or folders.is_folder(name) else "train"


def train_val_splits(val_examples: int, base: str = "train") -> tuple[str, str | None]:
    """`train[:-N]` / `train[-N:]`: a validation slice carved from the training split (`base`:
    "all" for an image folder or a tf.data.Dataset).

    Example:
    >>> train_val_splits(5000), train_val_splits(60, "all")
    (('train[:-5000]', 'train[-5000:]'), ('all[:-60]', 'all[-60:]'))
    """
    if val_examples == 0:
        return base, None
    return f"{base}[:-{val_examples}]", f"{base}[-{val_examples}:]"


def default_val_examples(info: DatasetInfo, examples: int) -> int:
    """Examples held out of `examples` training ones when `val_examples` is not given: the
    paper datasets' 5000, else `info.val_share` of them (at least 1), or 0 when the dataset
    has a validation split of its own (`info.val_split`)."""
    if info.val_examples is not None:
        return info.val_examples
    return max(1, round(examples * info.val_share)) if info.val_share else 0


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


def _load(name, split: str, data_dir: str | None, shuffle_files: bool,
          seed: int | None = None):
    """`(uint8 RGB image, int64 label)` pairs of `split`: of a TFDS dataset (grayscale and
    RGBA converted), an image folder, or a `tf.data.Dataset` given as `name`."""
    import tensorflow as tf
    import tensorflow_datasets as tfds

    from keras_preact.training import folders

    if isinstance(name, tf.data.Dataset):
        return _slice(name, split).map(lambda x, y: (to_rgb(x), tf.cast(y, tf.int64)))
    if folders.is_folder(name):
        return folders.load(folders.scan(name), split)
    ds = tfds.load(
        name,
        split=split,
        data_dir=data_dir,
        download=False,
        as_supervised=True,
        shuffle_files=shuffle_files,
        read_config=tfds.ReadConfig(shuffle_seed=seed),
    )
    return ds.map(lambda x, y: (to_rgb(x), y))


def to_rgb(image):
    """A uint8 image with 1 (grayscale), 3 or 4 (RGBA: alpha dropped) channels as RGB."""
    import tensorflow as tf

    channels = image.shape[-1]
    if channels == 1:
        return tf.image.grayscale_to_rgb(image)
    if channels == 4:
        return image[..., :3]
    if channels != 3:
        raise ValueError(f"Images must have 1, 3 or 4 channels. Received: shape {image.shape}")
    return image


def count_examples(ds) -> int:
    """Elements of a finite `tf.data.Dataset` (counted once when TensorFlow cannot tell)."""
    import tensorflow as tf

    n = int(ds.cardinality())
    if n == tf.data.INFINITE_CARDINALITY:
        raise ValueError("The training tf.data.Dataset must be finite (one pass over your "
                         "images, unbatched): the trainer repeats it. Received an infinite one.")
    if n == tf.data.UNKNOWN_CARDINALITY:
        n = int(ds.reduce(0, lambda count, _: count + 1))
    return n


def _slice(ds, split: str):
    """`split` ("all", "all[:-N]", "all[-N:]") of a finite tf.data.Dataset."""
    from keras_preact.training.folders import select

    part = select(split)
    start, stop, _ = part.indices(count_examples(ds))
    return ds.skip(start).take(max(0, stop - start))


def _options(deterministic: bool = False):
    import tensorflow as tf

    options = tf.data.Options()
    # TFDS CIFAR is a single file: shard by data so every worker gets a distinct part of
    # each global batch instead of a warning and the same fallback.
    options.experimental_distribute.auto_shard_policy = (
        tf.data.experimental.AutoShardPolicy.DATA
    )
    options.deterministic = deterministic
    return options


def train_dataset(
    name,
    split: str,
    batch_size: int,
    data_dir: str | None = None,
    image_size: int | None = None,
    seed: int | None = None,
    *,
    preprocessing=None,
    deterministic: bool = False,
):
    """Infinite, augmented, shuffled, normalized `(images, labels)` batches of `batch_size`.

    `batch_size` is the *global* batch: `model.fit` under a `tf.distribute` strategy splits
    it across replicas (and shards it across workers). `preprocessing` (a
    `preprocessing.Preprocessing`; default: the dataset's family's) is the network's
    (`pretrained.preprocessing_for`): images of any size are first resized to 32x32 for CIFAR
    nets (`preprocessing.resize_for_eval`, as served) and crop-augmented to `image_size` for
    ImageNet nets, then normalized with its statistics. `deterministic`: the same batches in
    the same order on every run with the same `seed`.
    """
    import tensorflow as tf

    from keras_preact.preprocessing import FAMILY_PREPROCESSING, preprocess_input

    preprocessing = preprocessing or FAMILY_PREPROCESSING[dataset_info(name, data_dir).family]
    ds = _load(name, split, data_dir, shuffle_files=True, seed=seed)
    if preprocessing.crop_pct is None:  # whole small images: CIFAR's augmentation
        if not _cifar_sized(name):
            ds = ds.map(lambda x, y: (_resized(x, preprocessing, image_size), y),
                        num_parallel_calls=tf.data.AUTOTUNE)
        # 50k 32x32 uint8 images are 150 MB: cache decoded, shuffle the whole split.
        ds = ds.cache().shuffle(50_000, seed=seed).repeat()
        ds = ds.map(lambda x, y: (augment_cifar(x), y), num_parallel_calls=tf.data.AUTOTUNE)
    else:
        size = image_size or preprocessing.size
        ds = ds.shuffle(10_000, seed=seed).repeat()
        ds = ds.map(
            lambda x, y: (augment_imagenet(x, size), y), num_parallel_calls=tf.data.AUTOTUNE
        )
    ds = ds.batch(batch_size, drop_remainder=True)
    ds = ds.map(
        lambda x, y: (preprocess_input(x, preprocessing.stats), y),
        num_parallel_calls=tf.data.AUTOTUNE,
    )
    return ds.prefetch(tf.data.AUTOTUNE).with_options(_options(deterministic))


def _cifar_sized(name) -> bool:
    """CIFAR's own images are 32x32 already: nothing to resize."""
    return isinstance(name, str) and name in DATASETS and DATASETS[name].family == "cifar"


def _resized(image, preprocessing, size: int | None):
    """The served geometry (`preprocessing.resize_for_eval`), back in uint8 for the cache."""
    import tensorflow as tf

    from keras_preact.preprocessing import resize_for_eval

    resized = resize_for_eval(image, preprocessing, size)
    return tf.cast(tf.clip_by_value(tf.round(resized), 0, 255), tf.uint8)


def eval_dataset(
    name,
    split: str,
    batch_size: int,
    data_dir: str | None = None,
    image_size: int | None = None,
    cache: bool = False,
    *,
    preprocessing=None,
):
    """Un-augmented batches with the shared eval geometry (CIFAR 32; ImageNet 256 -> 224;
    timm's nets their source's), for a network taking `preprocessing` (default: the dataset's
    family's)."""
    import tensorflow as tf

    from keras_preact.preprocessing import FAMILY_PREPROCESSING, preprocess_input, resize_for_eval

    preprocessing = preprocessing or FAMILY_PREPROCESSING[dataset_info(name, data_dir).family]
    ds = _load(name, split, data_dir, shuffle_files=False)

    def prepare(image, label):
        image = resize_for_eval(image, preprocessing, image_size)
        return preprocess_input(image, preprocessing.stats), label

    ds = ds.map(prepare, num_parallel_calls=tf.data.AUTOTUNE)
    if cache:
        ds = ds.cache()
    ds = ds.batch(batch_size)
    return ds.prefetch(tf.data.AUTOTUNE).with_options(_options())
