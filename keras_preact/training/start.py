"""The trained weights a training run starts from (`--weights`): a published tag, a
`.weights.h5` file or a finished run dir, checked before any work (`start_from`) and loaded
into the network the run trains, with a new classifier for another class count
(`load_start`).
"""

from __future__ import annotations

import dataclasses
import os

from keras_preact import rundir
from keras_preact.arch.graph import CLASSIFIER
from keras_preact.arch.network import ResNet, spec_of
from keras_preact.arch.specs import ResNetSpec, resolve
from keras_preact.data.catalog import DATASETS
from keras_preact.weights import storage
from keras_preact.weights.records import FREE_FIELDS, differences, released, weights_path


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
        differ = differences(spec, trained, FREE_FIELDS + ("classes",))
        if differ:
            raise ValueError(f"The weights of run {weights!r} are for another network: "
                             + ", ".join(f"{n}={getattr(trained, n)!r}" for n in differ)
                             + ". Received: "
                             + ", ".join(f"{n}={getattr(spec, n)!r}" for n in differ))
        return _checked(model_name, spec, weights, path, trained.classes)
    if str(weights).endswith(".weights.h5"):
        return _checked(model_name, spec, weights, weights_path(model_name, weights, spec))
    record = released(model_name).get(weights)
    classes = DATASETS[record.dataset].classes if record else spec.classes
    path = weights_path(model_name, weights, dataclasses.replace(spec, classes=classes))
    return Start(weights, path, classes)


def _checked(model_name: str, spec: ResNetSpec, weights: str, path: str,
             classes: int | None = None) -> Start:
    """The start from weights file `path`, once checked to hold the network `spec` describes
    (a file of another network fails here, before a run dir is written), its classifier
    aside, without building that network (`storage.stored_shapes`). `classes`: the class
    count the file was trained for, default its classifier's (`CLASSIFIER`, found by name)."""
    layers = storage.stored_shapes(spec, path)
    kernel = next((received[:1] for layer, received in layers if layer.name == CLASSIFIER), [])
    if classes is None:
        if not (kernel and len(kernel[0]) == 2):  # [features, classes]; a bias need not be there
            raise ValueError(f"{path!r} holds no classifier kernel keras_preact can read (saved "
                             "with include_top=False, or not a keras_preact network's): train "
                             "starts from a whole classifier's weights, a published tag or a "
                             "run dir.")
        classes = int(kernel[0][-1])
    storage.check_fits(path, model_name, layers, keep=CLASSIFIER if classes != spec.classes
                       else None)
    return Start(weights, path, classes)


def load_start(model: ResNet, start: Start) -> tuple[list[str], list[str]]:
    """Loads `start` into `model` (in either form): every layer when the class counts match;
    else every layer but the classifier (`CLASSIFIER`), which keeps its initial weights;
    straight from the file into `model`, no other network built. Returns the names of the
    layers `(loaded, initialized)`."""
    with_weights = [layer.name for layer in model.layers if layer.weights]
    if start.classes == spec_of(model).classes:
        storage.load_weights(model, start.path)
        return with_weights, []
    storage.load_weights(model, start.path, keep=CLASSIFIER)
    return [name for name in with_weights if name != CLASSIFIER], [CLASSIFIER]
