"""What a `--dataset` is (`dataset_info`: a paper dataset, an image folder or any TFDS
image-classification dataset) and whether its data is there (`check_source`, `check_split`:
prepared, or downloaded and prepared, with one line when that fails)."""

from __future__ import annotations

import dataclasses
import logging
import os
import shutil
from collections.abc import Sequence

# TensorFlow is imported where used: `keras-preact train --help` must answer at once.
from keras_preact.data import folders
from keras_preact.data.catalog import DATASETS, DatasetInfo

# The share of a folder (as Keras' validation_split examples) or of a TFDS dataset's train
# without a validation split that is held out by default.
FOLDER_VAL_SHARE = 0.2
TFDS_VAL_SHARE = 0.1
DATASET_HELP = ("cifar10, cifar100, imagenet2012, any TFDS image-classification dataset by "
                "name (e.g. tf_flowers), or a folder with one subfolder of images per class")


# What a `Source` is (`Source.kind`).
TFDS, FOLDER, IN_MEMORY_KIND, ARRAYS_KIND = "tfds", "folder", "in-memory", "arrays"
# The `dataset` a run on the caller's `tf.data.Dataset`, or on its NumPy `(images, labels)`,
# records (`training.train`).
IN_MEMORY, ARRAYS = "tf.data.Dataset", "arrays"


@dataclasses.dataclass(frozen=True)
class Source:
    """A dataset resolved once (`resolve`): what it is, its classes and splits, and what was
    read to learn them (a folder's listing, the caller's images), so that the trainer's
    checks, its input pipeline and `evaluate` take this object and nothing lists a folder or
    asks TFDS again."""

    name: str  # as config.json records it: a TFDS name, a folder's path, IN_MEMORY or ARRAYS
    kind: str  # TFDS, FOLDER, IN_MEMORY_KIND or ARRAYS_KIND
    info: DatasetInfo  # family, classes, class names, held-out and validation splits
    data_dir: str | None = None  # TFDS's
    folder: folders.ImageFolder | None = None  # a folder's classes and files (FOLDER)
    images: object = None  # the caller's tf.data.Dataset, or (images, labels) (ARRAYS_KIND)

    @property
    def base(self) -> str:
        """The split the trainer trains (and carves validation) from: "train" of a TFDS
        dataset, "all" of an image folder or the caller's images."""
        return "train" if self.kind == TFDS else "all"


def resolve(dataset, data_dir: str | None = None,
            class_names: Sequence[str] | None = None) -> Source:
    """`dataset` as a `Source`: a paper dataset (`DATASETS`), an image folder
    (`folders.is_folder`, listed here, once), any TFDS image-classification dataset, or the
    caller's `tf.data.Dataset` of (image, label) or NumPy `(images, labels)` (`data.arrays`:
    read without TensorFlow) with its `class_names` (which go only with such images); a
    `Source` is returned as it is. A one-line ValueError for anything else.
    A TFDS dataset's splits are known once it is prepared (`prepare`).

    Example:
    >>> source = resolve("cifar10")
    >>> source.kind, source.base, source.info.class_names[:2]
    ('tfds', 'train', ('airplane', 'automobile'))
    """
    from keras_preact import labels

    if isinstance(dataset, Source):
        return dataset
    if dataset is not None and not isinstance(dataset, str):  # the caller's images
        if class_names is None:
            raise ValueError("A tf.data.Dataset of (image, label), or (images, labels) arrays, "
                             "needs `class_names` (one per label, in label order).")
        names = labels.check_names(class_names, len(labels.as_list(class_names)))
        info = DatasetInfo(None, len(names), None, names)
        if isinstance(dataset, tuple):
            from keras_preact.data import arrays

            return Source(ARRAYS, ARRAYS_KIND, info, images=arrays.check(dataset, len(names)))
        return Source(IN_MEMORY, IN_MEMORY_KIND, info, images=dataset)
    if class_names is not None:
        raise ValueError(f"`class_names` go with a tf.data.Dataset: {dataset!r} names its own "
                         "classes.")
    if not dataset:
        raise ValueError(f"`dataset` must be a TFDS name or a folder. Received: {dataset!r}")
    if dataset in DATASETS:
        info = DATASETS[dataset]
        info = dataclasses.replace(info, class_names=labels.class_names(info.classes))
        return Source(dataset, TFDS, info, data_dir)
    if folders.is_folder(dataset):
        folder = folders.scan(dataset)
        info = DatasetInfo(None, len(folder.class_names), "all", folder.class_names,
                           val_share=FOLDER_VAL_SHARE)
        return Source(dataset, FOLDER, info, data_dir, folder=folder)
    return Source(dataset, TFDS, _tfds_info(dataset, data_dir), data_dir)


def dataset_info(name: str, data_dir: str | None = None) -> DatasetInfo:
    """What the trainer needs to know of `--dataset` `name` (`resolve`'s `info`): a paper
    dataset, an image folder or any TFDS image-classification dataset; a one-line ValueError
    for anything else.

    Example:
    >>> dataset_info("cifar10").class_names[:2]
    ('airplane', 'automobile')
    """
    if not isinstance(name, str):
        raise ValueError(f"`dataset` must be a TFDS name or a folder. Received: {name!r}")
    return resolve(name, data_dir).info


# What `evaluate` reads when neither the model's run nor the caller names a dataset.
DEFAULT_EVAL_DATASET = "cifar10"


def eval_source(model: object, dataset: str | None = None, data_dir: str | None = None,
                split: str | None = None) -> tuple[str, str | None, str | None]:
    """`(dataset, data_dir, split)` that `evaluate` reads for `model`: those given; with no
    `dataset`, for a run dir (or its model.keras) the run's own dataset and data dir, and on
    a folder the images the run held out (its `val_split`), since the rest trained it; else
    `DEFAULT_EVAL_DATASET`. A `split` left None is the dataset's held-out one. No TensorFlow.

    Example:
    >>> eval_source("preact-20"), eval_source("preact-20", "cifar100", split="test")
    (('cifar10', None, None), ('cifar100', None, 'test'))
    """
    from keras_preact import rundir

    run = rundir.recorded(model) if dataset is None else {}
    if not run.get("dataset"):
        return dataset or DEFAULT_EVAL_DATASET, data_dir, split
    dataset, data_dir = run["dataset"], data_dir or run.get("data_dir")
    if dataset in (IN_MEMORY, ARRAYS):
        raise ValueError(f"{os.fspath(model)!r} trained on the caller's {dataset}, which "
                         "evaluate cannot read again: pass --dataset.")
    if split is None and folders.is_folder(dataset):
        split = run.get("val_split")
        if split is None:
            raise ValueError(f"{os.fspath(model)!r} trained on every image of folder "
                             f"{dataset!r} (--val-examples 0): pass --dataset with other images.")
    return dataset, data_dir, split


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


def check_source(dataset: str | Source, data_dir: str | None = None, download: bool = False):
    """What `check_split` checks first, with no TensorFlow op: `dataset` (a name, or a `Source`
    with its own data dir) is an image folder, or a TFDS image-classification dataset whose
    data dir exists and which is prepared or, with `download`, whose download hosts answer
    (one probe each, `PROBE_TIMEOUT_S` at most). Returns the TFDS builder (None for a folder).

    Example:
    >>> check_source("cifar10", "../shared/tensorflow_datasets").is_prepared()  # doctest: +SKIP
    True
    """
    import tensorflow_datasets as tfds

    source = resolve(dataset, data_dir)
    if source.kind == FOLDER:
        return None
    name, data_dir = source.name, source.data_dir
    if data_dir is not None and os.path.exists(data_dir) and not os.path.isdir(data_dir):
        raise NotADirectoryError(f"The data dir {data_dir!r} is not a directory.")
    if data_dir is not None and not os.path.isdir(data_dir):
        # A relative path is the working directory's: a notebook kernel's is notebooks/.
        where = "" if os.path.isabs(data_dir) else f" (from {os.getcwd()}: pass an absolute path)"
        raise FileNotFoundError(f"The data dir {data_dir!r} does not exist{where}.")
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


def check_split(dataset: str | Source, split: str, data_dir: str | None = None,
                download: bool = False) -> int:
    """Fails early, with a clear message, unless `split` of `dataset` (a name, or a `Source`
    with its own data dir) is available.

    With `download`, a dataset that is not prepared yet is downloaded and prepared by TFDS as
    usual (CIFAR; ImageNet needs TFDS's manual download). A `data_dir` that does not exist is
    an error either way: a typo must not start a download somewhere else. An image folder's
    images in `split` are decoded once (`folders.check_images`).
    Returns the number of examples in `split` (TFDS slicing syntax, e.g. "train[:45000]").
    """
    source = resolve(dataset, data_dir)
    name = source.name
    if source.kind == FOLDER:
        examples = folders.count(source.folder, split)
        if examples < 1:
            raise ValueError(f"Split {split!r} of image folder {name!r} holds no images "
                             f"(it has {len(source.folder.files)}).")
        folders.check_images(source.folder, split)
        return examples
    builder = check_source(source, download=download)
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


def prepare(source: Source, download: bool = False) -> tuple[Source, int]:
    """`source` once its training split (`Source.base`) is there (`check_split`: a TFDS
    dataset downloaded and prepared with `download`, a folder's images each decoded once),
    and the examples in that split. A TFDS dataset's splits are known once it is prepared:
    its info is read again then (the paper datasets' are known before)."""
    examples = check_split(source, source.base, source.data_dir, download)
    if source.kind == TFDS and source.name not in DATASETS:
        source = resolve(source.name, source.data_dir)
    return source, examples


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
