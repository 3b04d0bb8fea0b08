"""Published weights: one record per (model name, tag), kept apart from the architecture
(the records themselves are data in `keras_preact.weights.published`).

A record says where a `.weights.h5` file is (shipped inside the package, or at a URL that
`keras.utils.get_file` downloads into Keras' cache), its SHA-256, how it was made (the exact
`keras-preact train` command, iterations, precision, wall time, machine, keras-preact
version) and its headline figure: accuracy on the dataset's official test split, measured on
the published file, beside the paper's figure for the network it stands against. Files are
in the plain layer form (Keras layer names), whatever form they were trained in.
`applications.*(weights=TAG)` and `keras_preact.build(name, weights=TAG)` load them through
`weights_file`.

Example:
>>> sorted(released("preact-20"))
['cifar10']
>>> os.path.basename(weights_file("preact-20", "cifar10"))
'preact-20-cifar10.weights.h5'
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import warnings

from keras_preact.arch.specs import HEAD_FIELDS, registered, resolve
from keras_preact.data.catalog import DATASETS
from keras_preact.preprocessing import RGB, Preprocessing, default_preprocessing

# Package data: small files ship inside the wheel, beside this module.
PACKAGE_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "released")
# Keras' cache subdirectory for files downloaded from a record's URL.
CACHE_SUBDIR = "keras_preact"
# The precision a published figure is scored in: what `build(name, weights=TAG)` computes in
# (Keras' default dtype policy), whatever precision the run trained in. A figure scored in the
# run's own mixed_bfloat16 differs by up to 0.09 points (benchmarks/README.md, "Published
# figures"); float32 reproduces on other CPUs.
SCORED_IN = "float32"
# The spec fields published weights leave free: the head's and the image size (channels
# aside: they must stay RGB).
FREE_FIELDS = HEAD_FIELDS + ("input_shape",)


@dataclasses.dataclass(frozen=True)
class WeightsRecord:
    """Where one published weights file is and how it was made."""

    model: str  # registered name, e.g. "preact-20"
    tag: str  # what users pass as `weights=`, e.g. "cifar10"
    dataset: str  # the TFDS dataset it was trained on, e.g. "cifar10"
    file: str  # file name: in PACKAGE_DIR, or the cache name of a download
    sha256: str
    # The headline figure: on the dataset's official held-out split (`test_split`), measured
    # on this file with `keras-preact evaluate NAME --weights TAG --split test`, in SCORED_IN.
    test_accuracy: float
    # The registered network whose paper figure (`keras_preact.paper`) this tag is compared
    # with, e.g. "resnet-20" (He et al. 2015) for preact-20, which the paper does not report.
    compare_with: str
    command: str  # the exact `keras-preact train ...` that made it
    iterations: int
    precision: str  # "float32" or a mixed precision policy
    wall_time_h: float
    machine: str
    keras_preact_version: str
    url: str | None = None  # None: shipped in the package
    note: str = ""  # e.g. a schedule shorter than the paper's
    # A run that held a slice of train out (--val-examples N) also has its accuracy there.
    val_accuracy: float | None = None
    val_split: str | None = None  # e.g. "train[-5000:]" of CIFAR-10
    # Every full training run ever made for this tag, oldest first, kept or not, one line
    # each (date, schedule, what it reached and what became of it); the last made this file.
    # A published figure is one run's, never the best of several: this is the evidence.
    runs: tuple[str, ...] = ()

    @property
    def test_split(self) -> str:
        """The split `test_accuracy` is measured on: "test" for CIFAR."""
        return DATASETS[self.dataset].eval_split


@dataclasses.dataclass(frozen=True)
class ConvertedRecord:
    """Weights converted from a checkpoint another library published (`keras_preact.weights.timm`):
    where the checkpoint is, its SHA-256 once known, and what its source reports for it. The
    converted `.weights.h5` is made on first use and kept in Keras' cache, beside a
    `sha256sum` file of both."""

    model: str  # the registered network that computes what the source's does
    tag: str
    dataset: str  # the TFDS dataset it was trained on, e.g. "imagenet2012"
    arch: str  # the source's architecture (`keras_preact.weights.timm.ARCHS`), e.g. "resnetv2_50"
    url: str  # the source's checkpoint, a .safetensors file
    # Of the file at `url`; None while nobody has downloaded it from here to record it: the
    # download is then not verified, and its SHA-256 is reported (`weights_file`).
    sha256: str | None
    top1: float  # the source's own ImageNet top-1 (%) at its eval crop; not measured here
    top1_source: str  # where that figure is published
    # The source's mean/std and eval geometry: what `model` takes (`preprocessing_for`).
    preprocessing: Preprocessing
    note: str = ""

    @property
    def file(self) -> str:
        """The converted weights' name in Keras' cache."""
        return f"{self.model}-{self.tag}.weights.h5"

    @property
    def source_file(self) -> str:
        """The downloaded checkpoint's name in Keras' cache."""
        return f"{self.model}-{self.tag}.safetensors"


_RECORDS: dict[tuple[str, str], WeightsRecord | ConvertedRecord] = {}


def register(record: WeightsRecord | ConvertedRecord) -> None:
    """Publishes `record` for its (model, tag), once (`keras_preact.weights.published` holds
    them)."""
    key = (record.model, record.tag)
    if key in _RECORDS:
        raise ValueError(f"Weights {record.tag!r} of {record.model!r} are already registered.")
    _RECORDS[key] = record


def released(model: str) -> dict[str, WeightsRecord | ConvertedRecord]:
    """The published tags of registered network `model`, by tag.

    Example:
    >>> record = released("preact-20")["cifar10"]
    >>> record.dataset, record.precision
    ('cifar10', 'bfloat16')
    """
    return {tag: r for (name, tag), r in _RECORDS.items() if name == model}


def all_records() -> list[WeightsRecord | ConvertedRecord]:
    """Every published record, in registry order (`keras_preact.list_models()`: family,
    depth, name), then by tag.

    Example:
    >>> [r.model for r in all_records()][:3]
    ['preact-20', 'resnet-20', 'preact-18-imagenet-timm']
    """
    order = {name: i for i, name in enumerate(registered())}
    return sorted(_RECORDS.values(), key=lambda r: (order[r.model], r.tag))


def list_models(pattern: str = "*", pretrained: bool = False) -> list[str]:
    """Registered names matching an fnmatch `pattern`, sorted by family, depth, then name;
    with `pretrained=True`, only those with published weights (`build(name, weights=TAG)`,
    tags in `released(name)`).

    Example:
    >>> list_models("preact-1??")
    ['preact-110', 'preact-164']
    >>> list_models("*-20", pretrained=True)
    ['preact-20', 'resnet-20']
    """
    if not isinstance(pretrained, bool):
        raise ValueError(f"`pretrained` must be True or False. Received: pretrained={pretrained!r}")
    published = {r.model for r in _RECORDS.values()}
    return [n for n in registered(pattern) if not pretrained or n in published]


def preprocessing_for(spec) -> Preprocessing:
    """The preprocessing the network `spec` describes takes: for a network registered for
    converted weights (the `-timm` nets, whose only weights are timm's), its source's (head and
    image size aside); for another timm stem (`stem="conv-pool"`), timm's ResNetV2 default;
    else its family's (`preprocessing.default_preprocessing`). `in_model`: whether the
    network normalizes its input itself (`include_preprocessing`).

    Example:
    >>> from keras_preact.arch.specs import resolve
    >>> preprocessing_for(resolve("preact-50-imagenet-timm", include_top=False)).crop_pct
    0.95
    >>> preprocessing_for(resolve("preact-50-imagenet")).stats
    'imagenet'
    """
    found = next((record.preprocessing for record in _RECORDS.values()
                  if isinstance(record, ConvertedRecord) and not differences(
                      spec, resolve(record.model), FREE_FIELDS + ("classes",))),
                 default_preprocessing(spec))
    return dataclasses.replace(found, in_model=spec.include_preprocessing)


def differences(spec, other, free: tuple[str, ...]) -> list[str]:
    """The fields, `free` ones aside, in which specs `spec` and `other` differ."""
    return [f.name for f in dataclasses.fields(spec)
            if f.name not in free and getattr(spec, f.name) != getattr(other, f.name)]


def sha256_of(path: str) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def weights_path(model_name: str, weights: str, spec) -> str:
    """The file `weights` stands for: a `.weights.h5` path, or a published tag of
    `model_name` (`weights_file`). Weights were trained on RGB images: `spec` must take 3
    channels; a tag's `spec` must be the network it was trained as, head and image size aside
    (`FREE_FIELDS`)."""
    if spec.input_shape[-1] != RGB:
        raise ValueError(
            "Weights are for RGB images: with `weights`, `input_shape` must have 3 channels "
            "(the stem conv was trained on 3). Use weights=None for other channel counts. "
            f"Received: input_shape={spec.input_shape}"
        )
    if str(weights).endswith(".weights.h5"):
        if not os.path.isfile(weights):
            raise FileNotFoundError(f"No weights file at {weights!r}.")
        return weights
    record = released(model_name).get(weights)
    if record is not None:  # checked before any download
        _check_trained_as(spec, record)
    return weights_file(model_name, weights)


def _check_trained_as(spec, record: WeightsRecord) -> None:
    """Refuses a `spec` other than the network `record`'s weights were trained as, except for
    the head and the image size (`FREE_FIELDS`), as Keras Applications allow."""
    trained = resolve(record.model, classes=DATASETS[record.dataset].classes)
    differ = differences(spec, trained, FREE_FIELDS + ("classes",) * (not spec.include_top))
    if differ:
        raise ValueError(
            f"Weights {record.tag!r} of {record.model!r} were trained with "
            + ", ".join(f"{name}={getattr(trained, name)!r}" for name in differ)
            + f"; only {', '.join(HEAD_FIELDS)} and the image size may differ (classes "
            "too with include_top=False). Received: "
            + ", ".join(f"{name}={getattr(spec, name)!r}" for name in differ)
        )


def weights_file(model: str, tag: str, cache_dir: str | None = None) -> str:
    """The local path of published weights `tag` of `model`, verified against its SHA-256.

    Shipped files are checked in place; a record with a URL is downloaded once into Keras'
    cache (`cache_dir`, default `~/.keras`, subdirectory `keras_preact`). A file whose hash
    does not match raises ValueError and is removed from the cache.
    """
    tags = released(model)
    if tag not in tags:
        raise ValueError(
            f"Unknown weights {tag!r} for {model!r}. Valid: None, a path to a '.weights.h5' "
            f"file, or a published tag: {sorted(tags) or 'none published yet'} "
            "(`keras-preact list --weights`)."
        )
    record = tags[tag]
    if isinstance(record, ConvertedRecord):
        return _converted(record, cache_dir)
    if record.url is None:
        path = os.path.join(PACKAGE_DIR, record.file)
        if not os.path.isfile(path):
            raise FileNotFoundError(f"The package lacks {path} (weights {tag!r} of {model!r}): "
                                    "reinstall keras-preact.")
        _check_hash(path, record)
        return path
    return _download(record, cache_dir)


def _cache_dir(cache_dir: str | None) -> str:
    """Keras' own default cache (KERAS_HOME, else ~/.keras), named here so that a file that
    fails its hash check can be removed from it."""
    cache_dir = os.path.expanduser(cache_dir or os.environ.get("KERAS_HOME")
                                   or os.path.join("~", ".keras"))
    os.makedirs(cache_dir, exist_ok=True)  # get_file falls back to /tmp when it is missing
    return cache_dir


def _download(record, cache_dir: str | None, file: str | None = None) -> str:
    """`record.url` in Keras' cache as `file` (default `record.file`), downloaded once and
    checked against `record.sha256` (unless None)."""
    import keras

    cache_dir = _cache_dir(cache_dir)
    file = file or record.file
    target = os.path.join(cache_dir, CACHE_SUBDIR, file)
    try:
        path = keras.utils.get_file(fname=file, origin=record.url, file_hash=record.sha256,
                                    cache_subdir=CACHE_SUBDIR, cache_dir=cache_dir)
    except ValueError:  # get_file keeps a file that failed its hash check: remove it
        if os.path.exists(target):
            os.remove(target)
        raise ValueError(f"{record.url} does not have the published SHA-256 {record.sha256} "
                         f"of weights {record.tag!r} of {record.model!r}; nothing was kept. "
                         "Retry later, or report it if it persists.") from None
    except Exception as error:  # get_file raises a bare Exception for URL failures
        raise ConnectionError(f"Could not download weights {record.tag!r} of {record.model!r} "
                              f"from {record.url} ({' '.join(str(error).split())}). Offline, "
                              f"download it elsewhere and put it at {target}.") from None
    return path


def _converted(record: ConvertedRecord, cache_dir: str | None) -> str:
    """The cached `.weights.h5` of `record`, converted from its downloaded source on first use
    (or when it no longer has the SHA-256 recorded beside it at conversion)."""
    from keras_preact import files

    path = os.path.join(_cache_dir(cache_dir), CACHE_SUBDIR, record.file)
    sums = path + ".sha256"  # `sha256sum -c` format: converted file, then its source
    if os.path.isfile(path) and os.path.isfile(sums):
        with open(sums) as f:
            if f.read().split()[:1] == [sha256_of(path)]:
                return path
    source = _download(record, cache_dir, record.source_file)
    source_sha256 = sha256_of(source)
    try:
        from keras_preact.weights.timm import from_timm

        model = from_timm(source, record.arch)
    except ValueError:  # a file cut short or not the checkpoint: download it again next time
        os.remove(source)
        raise
    with files.atomic_path(path) as tmp:
        model.save_weights(tmp)
    files.atomic_write(sums, lambda f: f.write(f"{sha256_of(path)}  {record.file}\n"
                                               f"{source_sha256}  {record.source_file}\n"))
    if record.sha256 is None:
        warnings.warn(f"{record.url} has no published SHA-256 in keras_preact yet, so it was "
                      f"not verified; the file downloaded has SHA-256 {source_sha256} "
                      f"(recorded in {sums}).", stacklevel=2)
    return path


def _check_hash(path: str, record: WeightsRecord) -> None:
    actual = sha256_of(path)
    if actual != record.sha256:
        raise ValueError(f"{path} has SHA-256 {actual}, not the published {record.sha256} of "
                         f"weights {record.tag!r} of {record.model!r}: the file is damaged; "
                         "reinstall keras-preact.")
