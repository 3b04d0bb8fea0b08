"""Published weights: one record per (model name, tag), kept apart from the architecture.

A record says where a `.weights.h5` file is (shipped inside the package, or at a URL that
`keras.utils.get_file` downloads into Keras' cache), its SHA-256, and how it was made: the
exact `keras-preact train` command, iterations, precision, wall time, machine, keras-preact
version and the validation accuracy it reached. Files are in the plain layer form (Keras
layer names), whatever form they were trained in. `applications.*(weights=TAG)` and
`keras_preact.build(name, weights=TAG)` load them through `weights_file`.

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
import re

# Package data: small files ship inside the wheel, beside this module.
PACKAGE_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "released")
# Keras' cache subdirectory for files downloaded from a record's URL.
CACHE_SUBDIR = "keras_preact"
# The spec fields published weights leave free (channels aside: they must stay RGB).
HEAD_FIELDS = ("include_top", "pooling", "classifier_activation", "input_shape")


@dataclasses.dataclass(frozen=True)
class WeightsRecord:
    """Where one published weights file is and how it was made."""

    model: str  # registered name, e.g. "preact-20"
    tag: str  # what users pass as `weights=`, e.g. "cifar10"
    dataset: str  # the TFDS dataset it was trained on, e.g. "cifar10"
    file: str  # file name: in PACKAGE_DIR, or the cache name of a download
    sha256: str
    val_accuracy: float  # on the validation slice the run held out (`val_split`)
    val_split: str  # e.g. "train[45000:]" of CIFAR-10
    command: str  # the exact `keras-preact train ...` that made it
    iterations: int
    precision: str  # "float32" or a mixed precision policy
    wall_time_h: float
    machine: str
    keras_preact_version: str
    url: str | None = None  # None: shipped in the package
    note: str = ""  # e.g. a schedule shorter than the paper's


_RECORDS: dict[tuple[str, str], WeightsRecord] = {}


def register(record: WeightsRecord) -> None:
    key = (record.model, record.tag)
    if key in _RECORDS:
        raise ValueError(f"Weights {record.tag!r} of {record.model!r} are already registered.")
    _RECORDS[key] = record


def released(model: str) -> dict[str, WeightsRecord]:
    """The published tags of registered network `model`, by tag.

    Example:
    >>> record = released("preact-20")["cifar10"]
    >>> record.dataset, record.precision
    ('cifar10', 'bfloat16')
    """
    return {tag: r for (name, tag), r in _RECORDS.items() if name == model}


def all_records() -> list[WeightsRecord]:
    """Every published record, sorted by model name and tag."""
    return sorted(_RECORDS.values(), key=lambda r: (r.model, r.tag))


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
    (`HEAD_FIELDS`)."""
    from keras_preact.preprocessing import RGB

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
    the head and the image size (`HEAD_FIELDS`), as Keras Applications allow."""
    from keras_preact.specs import resolve
    from keras_preact.training.data import dataset_info

    trained = resolve(record.model, classes=dataset_info(record.dataset).classes)
    free = HEAD_FIELDS + ("classes",) * (not spec.include_top)
    differ = [f.name for f in dataclasses.fields(spec)
              if f.name not in free and getattr(spec, f.name) != getattr(trained, f.name)]
    if differ:
        raise ValueError(
            f"Weights {record.tag!r} of {record.model!r} were trained with "
            + ", ".join(f"{name}={getattr(trained, name)!r}" for name in differ)
            + f"; only {', '.join(HEAD_FIELDS[:-1])} and the image size may differ (classes "
            "too with include_top=False). Received: "
            + ", ".join(f"{name}={getattr(spec, name)!r}" for name in differ)
        )


# The start of Keras' message when some layers' weights do not fit (keras.saving).
KERAS_LOAD_FAILURES = re.compile(r"A total of (\d+) objects could not be loaded\. Example error "
                                 r"message for object <\w+ name=([^,>]+)[^>]*>: (.*)")


def load_weights(model, spec, path: str) -> None:
    """`model.load_weights(path)` whatever form (plain or scanned stages, `keras_preact.scan`)
    the file was saved from and `model` is in: read into a twin of the file's form, then
    copied across."""
    from keras_preact import scan
    from keras_preact.builder import build_from_spec

    try:
        saved_scanned = scan.scannable(spec) and scan.holds_scanned_weights(path)
        if saved_scanned == scan.is_scanned(model):
            model.load_weights(path)
            return
        twin = build_from_spec(spec, name=model.name,
                               stages="scan" if saved_scanned else "layers")
        twin.load_weights(path)
    except ValueError as error:
        # Keras' message goes on with the variable's values and every layer that failed.
        keras_says = " ".join(re.split("Target variable|List of objects", str(error))[0].split())
        counted = KERAS_LOAD_FAILURES.match(keras_says)
        if counted:  # "A total of 1 objects could not be loaded. Example ... <Conv2D name=...>"
            n, name, cause = counted.groups()
            keras_says = (f"{n} layer{'s' * (n != '1')} could not be loaded; "
                          f"{'the first' if n != '1' else 'it'} is {name!r}: {cause}")
        raise ValueError(f"The weights in {path!r} do not fit {model.name!r} as built (build "
                         "the network the file was saved from: same name and overrides). "
                         f"Keras: {keras_says}") from None
    except OSError as error:  # h5py's, without the path
        raise OSError(f"Could not read {path!r} as a .weights.h5 file: {error}") from None
    scan.copy_weights(twin, model)


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
    if record.url is None:
        path = os.path.join(PACKAGE_DIR, record.file)
        if not os.path.isfile(path):
            raise FileNotFoundError(f"The package lacks {path} (weights {tag!r} of {model!r}): "
                                    "reinstall keras-preact.")
        _check_hash(path, record)
        return path
    return _download(record, cache_dir)


def _download(record: WeightsRecord, cache_dir: str | None) -> str:
    import keras

    # Keras' own default cache (KERAS_HOME, else ~/.keras), named here so that a file that
    # fails its hash check can be removed from it.
    cache_dir = os.path.expanduser(cache_dir or os.environ.get("KERAS_HOME")
                                   or os.path.join("~", ".keras"))
    os.makedirs(cache_dir, exist_ok=True)  # get_file falls back to /tmp when it is missing
    try:
        path = keras.utils.get_file(fname=record.file, origin=record.url,
                                    file_hash=record.sha256, cache_subdir=CACHE_SUBDIR,
                                    cache_dir=cache_dir)
    except ValueError:  # get_file keeps a file that failed its hash check: remove it
        target = os.path.join(cache_dir, CACHE_SUBDIR, record.file)
        if os.path.exists(target):
            os.remove(target)
        raise ValueError(f"{record.url} does not have the published SHA-256 {record.sha256} "
                         f"of weights {record.tag!r} of {record.model!r}; nothing was kept. "
                         "Retry later, or report it if it persists.") from None
    except Exception as error:  # get_file raises a bare Exception for URL failures
        raise ConnectionError(f"Could not download weights {record.tag!r} of "
                              f"{record.model!r} from {record.url}: {error}") from None
    return path


def _check_hash(path: str, record: WeightsRecord) -> None:
    actual = sha256_of(path)
    if actual != record.sha256:
        raise ValueError(f"{path} has SHA-256 {actual}, not the published {record.sha256} of "
                         f"weights {record.tag!r} of {record.model!r}: the file is damaged; "
                         "reinstall keras-preact.")


# Published weights. Made by tools/release_weights.py from the run's own files; the
# reproduction recipe and curves are in README.md, "Trained weights".
register(WeightsRecord(
    model="preact-20", tag="cifar10", dataset="cifar10", file="preact-20-cifar10.weights.h5",
    sha256="97d2cd8067a381f751635c66e8766f84eff9c02151fd5702d71051237a12791b",
    val_accuracy=0.9154, val_split="train[-5000:]",
    command="keras-preact train preact-20 --steps 32000 --warmup-steps 400 --mixed-precision "
            "bfloat16 --data-dir DATA_DIR --seed 0 --output runs/preact-20-cifar10",
    iterations=32000, precision="bfloat16", wall_time_h=1.62,
    machine="AMD EPYC, 2 cores, 24 GB, AVX2, AVX-512, AVX512-BF16, oneDNN on; "
            "OneDeviceStrategy, replicas: 1",
    keras_preact_version="0.1.0",
    note="32k iterations (half the paper's 64k; lr 0.01 for 400 iterations, then 0.1, 0.01, "
         "0.001 from 0 / 16k / 24k), trained on train[:45000] in bfloat16 mixed precision "
         "(Keras' mixed_bfloat16: float32 weights, BN statistics and loss), scanned stages, "
         "from independent He-normal draws per kernel (seed 0); one uninterrupted run; "
         "replaces a float32 tag (91.10 %) that had started from tied kernels, a bug fixed "
         "since"))
register(WeightsRecord(
    model="resnet-20", tag="cifar10", dataset="cifar10", file="resnet-20-cifar10.weights.h5",
    sha256="1ca6f18489e8c23c565b269db81d64848ad585de72d5b01829f5c88b856e71d3",
    val_accuracy=0.9064, val_split="train[-5000:]",
    command="keras-preact train resnet-20 --steps 24000 --warmup-steps 400 --mixed-precision "
            "bfloat16 --data-dir DATA_DIR --seed 0 --output runs/resnet-20-cifar10",
    iterations=24000, precision="bfloat16", wall_time_h=1.89,
    machine="2 vCPU AMD EPYC (AVX-512, AVX512-BF16, no AMX), 24 GB, no GPU; one uninterrupted "
            "run",
    keras_preact_version="0.1.0",
    note="24k iterations (three eighths of the paper's 64k; lr 0.01 for 400 iterations, then "
         "0.1, 0.01, 0.001 from 0 / 12k / 18k), trained on train[:45000] in bfloat16 mixed "
         "precision (Keras' mixed_bfloat16: float32 weights, BN statistics and loss), as the "
         "plain layer graph, from independent initial kernels (seed 0)"))
