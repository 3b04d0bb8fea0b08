"""The trained weights a training run starts from (`--weights`): a published tag, a
`.weights.h5` file or a finished run dir, checked before any work (`start_from`) and loaded
into the network the run trains, with a new classifier for another class count
(`load_start`).
"""

from __future__ import annotations

import dataclasses
import os

import h5py

from keras_preact import rundir
from keras_preact.arch.graph import CLASSIFIER
from keras_preact.arch.network import ResNet, build_from_spec, spec_of
from keras_preact.arch.scanned_units import scannable
from keras_preact.arch.specs import ResNetSpec, resolve
from keras_preact.data.catalog import DATASETS
from keras_preact.weights.records import HEAD_FIELDS, differences, released, weights_path
from keras_preact.weights.storage import load_weights, unreadable


@dataclasses.dataclass(frozen=True)
class Start:
    """Trained weights a training run starts from (`start_from`)."""

    weights: str  # as given: a tag, a .weights.h5 file or a run dir
    path: str  # the file read: a .weights.h5 file or a run's model.keras
    classes: int  # the class count the file's classifier was trained for


def start_from(model_name: str, spec: ResNetSpec, weights: str) -> Start:
    """Where `weights` (a published tag of `model_name`, a `.weights.h5` file or a run dir)
    is and how many classes it was trained for, checked before any work: the network must be
    `spec`'s, the head aside (`load_start` replaces a classifier of another class count).
    """
    if os.path.isdir(weights):
        config = rundir.read_config(weights)
        path = os.path.join(weights, rundir.MODEL)
        if not os.path.isfile(path):
            raise FileNotFoundError(f"--weights {weights!r} is not a finished run: it has no "
                                    f"{rundir.MODEL}.")
        trained = resolve(config.get("model"), **config.get("overrides", {}))
        differ = differences(spec, trained, HEAD_FIELDS + ("classes",))
        if differ:
            raise ValueError(f"The weights of run {weights!r} are for another network: "
                             + ", ".join(f"{n}={getattr(trained, n)!r}" for n in differ)
                             + ". Received: "
                             + ", ".join(f"{n}={getattr(spec, n)!r}" for n in differ))
        return _loadable(spec, Start(weights, path, trained.classes))
    if str(weights).endswith(".weights.h5"):
        path = weights_path(model_name, weights, spec)
        classes = _classifier_classes(path)
        if classes is None:
            raise ValueError(f"{path!r} holds no classifier kernel keras_preact can read (saved "
                             "with include_top=False, or not a keras_preact network's): train "
                             "starts from a whole classifier's weights, a published tag or a "
                             "run dir.")
        return _loadable(spec, Start(weights, path, classes))
    record = released(model_name).get(weights)
    classes = DATASETS[record.dataset].classes if record else spec.classes
    path = weights_path(model_name, weights, dataclasses.replace(spec, classes=classes))
    return Start(weights, path, classes)


def _classifier_classes(path: str) -> int | None:
    """The class count of the classifier in `.weights.h5` file `path` (Keras names its group
    "dense...", its kernel [features, classes] is var 0; a bias need not be there), or None."""
    try:
        with h5py.File(path, "r") as f:
            layers = f.get("layers")
            heads = sorted(k for k in layers if k.startswith("dense")) if isinstance(
                layers, h5py.Group) else []
            kernel = f.get(f"layers/{heads[-1]}/vars/0") if heads else None
            shape = kernel.shape if isinstance(kernel, h5py.Dataset) else ()
    except OSError as error:
        raise OSError(unreadable(path, error)) from None
    return int(shape[-1]) if len(shape) == 2 else None


def _loadable(spec: ResNetSpec, start: Start) -> Start:
    """`start`, once its file is checked to load into the network `spec` describes (a file
    of another network fails here, before a run dir is written)."""
    trained = dataclasses.replace(spec, classes=start.classes)
    load_weights(build_from_spec(trained, stages="scan" if scannable(trained) else "layers"),
                 start.path)
    return start


def load_start(model: ResNet, start: Start) -> tuple[list[str], list[str]]:
    """Loads `start` into `model` (in either form): every layer when the class counts match;
    else every layer but the classifier, which keeps its initial weights (read through a
    network with the file's classifier). Returns the names of the layers `(loaded,
    initialized)`."""
    spec = spec_of(model)
    with_weights = [layer for layer in model.layers if layer.weights]
    if start.classes == spec.classes:
        load_weights(model, start.path)
        return [layer.name for layer in with_weights], []
    trained = build_from_spec(dataclasses.replace(spec, classes=start.classes),
                              name=model.name, stages=model.stages)
    load_weights(trained, start.path)
    head = model.get_layer(CLASSIFIER)  # the one layer whose shapes differ
    for layer in with_weights:
        if layer is not head:
            layer.set_weights(trained.get_layer(layer.name).get_weights())
    return [layer.name for layer in with_weights if layer is not head], [head.name]
