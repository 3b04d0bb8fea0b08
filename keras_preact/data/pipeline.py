"""TFDS input pipelines: the paper's CIFAR augmentation, fb.resnet.torch's ImageNet crops.
The caller's NumPy arrays are fed without TensorFlow instead (`data.arrays`).

Images stay uint8 through caching, shuffling and augmentation; normalization
(`preprocessing.preprocess_input`) runs once per batch at the end, and evaluation uses the
shared `preprocessing.resize_for_eval` geometry, so training, `evaluate` and serving all see
the same numbers.
"""

from __future__ import annotations

from keras_preact.data import arrays, folders, sources
from keras_preact.data.augment import augment_cifar, augment_imagenet
from keras_preact.data.catalog import DatasetInfo


def train_base(name) -> str:
    """The split the trainer trains (and carves validation) from (`sources.Source.base`):
    "train" of a TFDS dataset, "all" of an image folder or a tf.data.Dataset."""
    if isinstance(name, sources.Source):
        return name.base
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


def _source(data, data_dir: str | None):
    """What the pipelines read: a `sources.Source` or a `tf.data.Dataset` as given, a name
    resolved (`sources.resolve`)."""
    import tensorflow as tf

    if isinstance(data, (sources.Source, tf.data.Dataset)):
        return data
    return sources.resolve(data, data_dir)


def _preprocessing(source, preprocessing):
    """`preprocessing`, or by default the dataset's family's (a `sources.Source`'s)."""
    from keras_preact.preprocessing import FAMILY_PREPROCESSING

    if preprocessing is not None:
        return preprocessing
    if not isinstance(source, sources.Source):
        raise ValueError("A tf.data.Dataset has no preprocessing family: pass `preprocessing`.")
    return FAMILY_PREPROCESSING[source.info.family]


def local_batch(batch_size: int, shard: tuple[int, int] | None) -> int:
    """What one process batches: the global `batch_size`, or its `shard`'s share of it
    (`(index, count)` of a multi-process JAX run, which checked that count divides it)."""
    return batch_size if shard is None else batch_size // shard[1]


def _sharded(ds, shard: tuple[int, int] | None):
    """Part `index` of `count` equal parts of finite `ds` (the last `len % count` elements
    left out): every process of a run then reads as many batches, the same sizes."""
    if shard is None:
        return ds
    index, count = shard
    return ds.take(count_examples(ds) // count * count).shard(count, index)


def _load(source, split: str, shuffle_files: bool, seed: int | None = None,
          shard: tuple[int, int] | None = None):
    """`(uint8 RGB image, int64 label)` pairs of `split` of `source` (`_source`): of a TFDS
    dataset (grayscale and RGBA converted), an image folder (as listed once), or a
    `tf.data.Dataset`; with `shard` (`(index, count)`), part `index` of `count` equal parts
    of them (TFDS reads only its own: `tfds.even_splits`)."""
    import tensorflow as tf
    import tensorflow_datasets as tfds

    if isinstance(source, sources.Source) and source.kind == sources.IN_MEMORY_KIND:
        source = source.images
    if isinstance(source, tf.data.Dataset):
        return _sharded(_slice(source, split), shard).map(
            lambda x, y: (to_rgb(x), tf.cast(y, tf.int64)))
    if source.kind == sources.FOLDER:
        return _sharded(folders.load(source.folder, split), shard)
    if shard is not None:
        split = tfds.even_splits(split, n=shard[1], drop_remainder=True)[shard[0]]
    ds = tfds.load(
        source.name,
        split=split,
        data_dir=source.data_dir,
        download=False,
        as_supervised=True,
        shuffle_files=shuffle_files,
        # No TFDS auto-cache (on for small sets such as CIFAR), nor a cache of ours: read by
        # Keras under a tf.distribute strategy, an in-memory cache's first pass can end
        # early and keep part of the split for good (benchmarks/README.md, "Input pipeline").
        read_config=tfds.ReadConfig(shuffle_seed=seed, try_autocache=False),
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
    part = folders.select(split)
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
    shard: tuple[int, int] | None = None,
):
    """Infinite, augmented, shuffled, normalized `(images, labels)` batches of `batch_size`
    of `split` of `name`: a dataset's name (TFDS or a folder, in `data_dir`), a resolved
    `sources.Source` (read as resolved: a folder is not listed again) or a `tf.data.Dataset`.

    `batch_size` is the *global* batch: `model.fit` under a `tf.distribute` strategy splits
    it across replicas (and shards it across workers). `preprocessing` (a
    `preprocessing.Preprocessing`; default: the dataset's family's) is the network's
    (`pretrained.preprocessing_for`): images of any size are first resized to 32x32 for CIFAR
    nets (`preprocessing.resize_for_eval`, as served) and crop-augmented to `image_size` for
    ImageNet nets, then normalized with its statistics. `deterministic`: the same batches in
    the same order on every run with the same `seed`. NumPy arrays (a `sources.Source` of
    `sources.ARRAYS_KIND`) give an `arrays.Batches` (always deterministic) instead.
    `shard` (`(index, count)`, a process of a multi-process JAX run, `backend.Replicas`):
    part `index` of `count` equal parts of the split, in batches of `batch_size // count`.
    """
    if _is_arrays(name):
        return arrays.Batches(arrays.select(name.images, split, shard),
                              local_batch(batch_size, shard),
                              _fitting_arrays(name, preprocessing, image_size), train=True,
                              seed=seed)
    import tensorflow as tf

    source = _source(name, data_dir)
    preprocessing = _preprocessing(source, preprocessing)
    ds = _load(source, split, shuffle_files=True, seed=seed, shard=shard)
    if preprocessing.crop_pct is None:  # whole small images: CIFAR's augmentation
        if not _cifar_sized(source):
            ds = ds.map(lambda x, y: (_resized(x, preprocessing, image_size), y),
                        num_parallel_calls=tf.data.AUTOTUNE)
        if deterministic:
            ds = _replayable(ds, seed or 0)
        else:
            ds = ds.shuffle(50_000, seed=seed).repeat()  # 50k 32x32 images: the whole split
            ds = ds.map(lambda x, y: (augment_cifar(x), y), num_parallel_calls=tf.data.AUTOTUNE)
    else:
        size = image_size or preprocessing.size
        ds = ds.shuffle(10_000, seed=seed).repeat()
        ds = ds.map(
            lambda x, y: (augment_imagenet(x, size), y), num_parallel_calls=tf.data.AUTOTUNE
        )
    ds = ds.batch(local_batch(batch_size, shard), drop_remainder=True)
    ds = ds.map(
        lambda x, y: (_normalized(x, preprocessing), y),
        num_parallel_calls=tf.data.AUTOTUNE,
    )
    return ds.prefetch(tf.data.AUTOTUNE).with_options(_options(deterministic))


def _normalized(images, preprocessing):
    """`preprocessing.normalize` in TensorFlow ops, the same numbers: tf.data maps run
    TensorFlow whatever Keras' backend is (`keras.ops` would be JAX's under JAX)."""
    import tensorflow as tf

    from keras_preact.preprocessing import scale_and_offset

    images = tf.cast(images, tf.float32)
    if preprocessing.in_model:
        return images
    scale, offset = scale_and_offset(preprocessing.stats)
    return images * tf.constant(scale, tf.float32) + tf.constant(offset, tf.float32)


def _is_arrays(source) -> bool:
    return isinstance(source, sources.Source) and source.kind == sources.ARRAYS_KIND


def check_arrays(source: sources.Source, preprocessing, image_size: int | None) -> None:
    """A one-line ValueError unless NumPy `source`'s images are what its route feeds: whole
    images of the network's input size (no resizing or ImageNet-style crops, which are
    TensorFlow ops); nothing to check for other sources."""
    if _is_arrays(source):
        _fitting_arrays(source, preprocessing, image_size)


def _fitting_arrays(source: sources.Source, preprocessing, image_size: int | None):
    """`preprocessing` (the family default, CIFAR's, if None) once `check_arrays` passed."""
    from keras_preact.preprocessing import FAMILY_PREPROCESSING

    preprocessing = preprocessing or FAMILY_PREPROCESSING["cifar"]
    size = image_size or preprocessing.size
    shape = source.images[0].shape[1:3]
    if preprocessing.crop_pct is not None or shape != (size, size):
        net = "" if preprocessing.crop_pct is None else ", for an ImageNet-style network"
        raise ValueError(f"NumPy `dataset` arrays train CIFAR-style networks on images of their "
                         f"input size ({size}x{size}, pad-and-crop augmented): pass a "
                         f"tf.data.Dataset for others. Received: images of "
                         f"{shape[0]}x{shape[1]}{net}")
    return preprocessing


def _replayable(ds, seed: int):
    """`ds` (32x32 uint8 images) shuffled and crop-and-flip augmented as one endless stream
    that is the same in every run and from every iterator: each pass's order is a function
    of (seed, pass), each crop and flip of (seed, position in the stream). So a resumed run
    that skips the batches it trained on (`trainer._fit`) goes on with the batch the
    uninterrupted run had. A reshuffling `shuffle` draws each pass's order from a generator
    that every iterator of the dataset shares (Keras' fit reads a batch from a first one to
    build the model, and prefetching reads ahead by a varying amount), and stateful random
    ops in a parallel map draw in thread order: neither replays. Each pass is held in memory
    once, as one tensor (CIFAR's 45k images: 138 MB)."""
    import tensorflow as tf

    seed = tf.constant(seed, tf.int64)

    def permuted(images, labels, index):
        keys = tf.random.stateless_uniform(tf.shape(labels), seed=tf.stack([seed, index]))
        order = tf.argsort(keys)
        return tf.gather(images, order), tf.gather(labels, order)

    def one_pass(index):
        whole = ds.batch(2**31 - 1)  # the pass as one element
        return whole.map(lambda x, y: permuted(x, y, index)).unbatch()

    stream = tf.data.Dataset.counter().flat_map(one_pass).enumerate()
    return stream.map(lambda i, xy: (augment_cifar(xy[0], tf.stack([seed, i])), xy[1]),
                      num_parallel_calls=tf.data.AUTOTUNE)


def _cifar_sized(source) -> bool:
    """CIFAR's own images are 32x32 already: nothing to resize."""
    return isinstance(source, sources.Source) and source.info.family == "cifar"


def _resized(image, preprocessing, size: int | None):
    """The served geometry (`preprocessing.resize_for_eval`), back in uint8 to augment."""
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
    *,
    preprocessing=None,
    shard: tuple[int, int] | None = None,
):
    """Un-augmented batches of `split` of `name` (as `train_dataset` takes it) with the shared
    eval geometry (CIFAR 32; ImageNet 256 -> 224; timm's nets their source's), for a network
    taking `preprocessing` (default: the dataset's family's); NumPy arrays and `shard` as
    `train_dataset` takes them."""
    if _is_arrays(name):
        return arrays.Batches(arrays.select(name.images, split, shard),
                              local_batch(batch_size, shard),
                              _fitting_arrays(name, preprocessing, image_size), train=False)
    import tensorflow as tf

    from keras_preact.preprocessing import resize_for_eval

    source = _source(name, data_dir)
    preprocessing = _preprocessing(source, preprocessing)
    ds = _load(source, split, shuffle_files=False, shard=shard)

    def prepare(image, label):
        image = resize_for_eval(image, preprocessing, image_size)
        return _normalized(image, preprocessing), label

    ds = ds.map(prepare, num_parallel_calls=tf.data.AUTOTUNE)
    ds = ds.batch(local_batch(batch_size, shard))
    return ds.prefetch(tf.data.AUTOTUNE).with_options(_options())
