"""Weights and form: what goes into a network and in which form (plain layers or scanned
stages), in one place.

- `build_network`: the one path from a name to a model (`keras_preact.build` and every
  `keras_preact.applications` constructor): spec, weights file, network, weights.
- `load_weights`: a `.weights.h5` or `.keras` file of either form into a network of either;
  `in_form`: a network in the other form, weights and all.
- `load`: a `.keras` file as the network it declares (`keras_preact.api.load_model`,
  `load_for_inference`): its own config (`network.ResNet`), the `SPEC_ENTRY` of a plain file
  keras_preact wrote (`save_plain`), or a run dir's `config.json` beside an older plain
  `model.keras`.
- `start_from` / `load_start`: the trained weights a training run starts from.

A plain file goes into a scanned network straight from the file (`plain_layers` says where
each layer's weights are): no plain twin is built.

Example:
>>> import os, tempfile
>>> path = os.path.join(tempfile.mkdtemp(), "m.weights.h5")
>>> build_network("preact-164", stages="scan", depth=20).save_weights(path)
>>> plain = build_network("preact-164", depth=20, weights=path)
>>> plain.stages, file_form(path)
('layers', 'scan')
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import io
import json
import os
import re
import zipfile

import h5py
import keras

from keras_preact import rundir
from keras_preact.builder import CLASSIFIER
from keras_preact.datasets import DATASETS
from keras_preact.introspect import UNIT_PREFIX, unit_prefix
from keras_preact.network import ResNet, build_from_spec, network_of, spec_in, spec_of
from keras_preact.preprocessing import Preprocessing
from keras_preact.pretrained import (
    HEAD_FIELDS,
    differences,
    preprocessing_for,
    released,
    weights_path,
)
from keras_preact.scan.convert import copy_weights, set_plain_weights, to_layered, to_scanned
from keras_preact.scanned_units import is_scanned, scannable
from keras_preact.specs import ResNetSpec, resolve

# A `.keras` archive's weights file (keras/src/saving/saving_lib.py).
KERAS_WEIGHTS_FILE = "model.weights.h5"
# The class name a `.keras` file of a `network.ResNet` declares.
RESNET = "keras_preact>ResNet"
# The archive entry, beside Keras' own (which Keras ignores), that names the network in a
# plain `.keras` file keras_preact wrote (`save_plain`): a copy outside its run dir still
# says which network, hence which preprocessing, it holds.
SPEC_ENTRY = "keras_preact.json"
# The start of Keras' message when some layers' weights do not fit (keras.saving).
KERAS_LOAD_FAILURES = re.compile(r"A total of (\d+) objects could not be loaded\. Example error "
                                 r"message for object <\w+ name=([^,>]+)[^>]*>: (.*)")


def build_network(name: str, *, stages: str = "layers", weights: str | None = None,
                  input_tensor: keras.KerasTensor | None = None, model_name: str | None = None,
                  dtype: str | keras.DTypePolicy | None = None,
                  **overrides) -> ResNet:
    """Registered network `name` with `overrides`, in form `stages`, with `weights` (None, a
    published tag or a `.weights.h5` file of either form), named `model_name` (default
    `name`), under dtype policy `dtype` (default Keras' global one). The weights file is
    found and checked before anything is built."""
    spec = resolve(name, **overrides)
    path = None if weights is None else weights_path(name, weights, spec)
    model = build_from_spec(spec, name=model_name or name, input_tensor=input_tensor,
                            stages=stages, dtype=dtype)
    if path is not None:
        load_weights(model, path)
    return model


@contextlib.contextmanager
def _weights_h5(path: str):
    """The h5 file of weights at `path`: a `.weights.h5` file, or a `.keras` archive's."""
    if not path.endswith(".keras"):
        with h5py.File(path, "r") as h5:
            yield h5
        return
    try:
        with zipfile.ZipFile(path) as archive:
            # Keras stores the weights uncompressed: read into memory (h5py seeks a lot, and
            # seeking back in a zip member rereads it), as much as the file holds on disk.
            data = io.BytesIO(archive.read(KERAS_WEIGHTS_FILE))
    except (zipfile.BadZipFile, KeyError) as error:  # cut short, or not Keras' archive
        raise OSError(f"not a whole .keras archive ({type(error).__name__}: {error})") \
            from None
    with h5py.File(data, "r") as h5:
        yield h5


def file_form(path: str) -> str:
    """The form ("layers" or "scan") of the network a weights file was saved from (Keras
    names the groups of scanned stages after their class: `scanned_units`, ...)."""
    with _weights_h5(path) as h5:
        scanned = "layers" in h5 and any(k.startswith("scanned_units") for k in h5["layers"])
    return "scan" if scanned else "layers"


@functools.lru_cache(maxsize=4)
def plain_layers(spec: ResNetSpec) -> list[tuple[str, str]]:
    """`(name, class name)` of each layer of `spec`'s plain graph, in Keras' order (the
    order its files store weights in), read off the same net with at most two units per
    stage: units 2..n of a stage are alike, each a run of layers like unit 2's. (Keras
    orders a functional model's layers by their distance from the output, and every layer of
    unit u lies between the additions of units u - 1 and u.)"""
    template = build_from_spec(dataclasses.replace(
        spec, units=tuple(min(n, 2) for n in spec.units)))
    layers: list[tuple[str, str]] = []
    expanded = set()  # the stages whose units 2..n are listed
    for layer in template.layers:
        match = UNIT_PREFIX.match(layer.name)
        if not (match and match.group(2) == "002"):
            layers.append((layer.name, type(layer).__name__))
        elif (stage := int(match.group(1))) not in expanded:
            expanded.add(stage)
            second = [(x.name[match.end():], type(x).__name__) for x in template.layers
                      if x.name.startswith(unit_prefix(stage, 2) + "_")]
            layers += [(f"{unit_prefix(stage, u)}_{role}", kind)
                       for u in range(2, spec.units[stage - 1] + 1) for role, kind in second]
    return layers


def _stored_weights(h5, layers: list[tuple[str, str]]) -> dict[str, list]:
    """`{layer name: [h5py datasets]}`: Keras stores the weights of each layer of
    `model.layers` under `layers/{its class in snake case}`, suffixed `_1`, `_2`... after
    the first of a class (saving_lib `_save_container_state`)."""
    from keras.src.utils.naming import to_snake_case  # the function Keras names them with

    stored = set(h5["layers"]) if "layers" in h5 else set()  # layers with weights only
    seen: dict[str, int] = {}
    weights = {}
    for name, kind in layers:
        group = to_snake_case(kind)
        seen[group] = seen.get(group, -1) + 1
        group += f"_{seen[group]}" if seen[group] else ""
        variables = h5[f"layers/{group}/vars"] if group in stored else {}
        weights[name] = [variables[str(i)] for i in range(len(variables))]
    return weights


def load_weights(model: ResNet, path: str) -> None:
    """`model.load_weights(path)` whatever form the file was saved from and `model` is in."""
    spec = spec_of(model)
    try:
        form = file_form(path) if scannable(spec) else "layers"
        if form == model.stages:
            model.load_weights(path)
        elif form == "layers":  # straight from the file into the scanned stages
            with _weights_h5(path) as h5:
                set_plain_weights(model, _stored_weights(h5, plain_layers(spec)))
        else:  # the scanned form is quick to build at any depth
            scanned = build_from_spec(spec, name=model.name, stages="scan",
                                      dtype=model.dtype_policy)
            scanned.load_weights(path)
            copy_weights(scanned, model)
    except (ValueError, KeyError) as error:
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
    except OSError as error:  # h5py's or `_weights_h5`'s, without the path
        raise OSError(unreadable(path, error)) from None


def unreadable(path: str, error: OSError) -> str:
    """The line for a weights file that cannot be read at all (cut short, not HDF5 or not a
    zip): what it is and what to do."""
    return (f"Could not read {path!r} as a {'.keras' if path.endswith('.keras') else '.weights.h5'}"
            f" file ({error}); pass a whole file keras_preact or Keras saved (a copy cut short "
            "by a full disk or a stopped transfer must be made again).")


def in_form(model: keras.Model, stages: str) -> keras.Model:
    """`model` in form `stages`: itself if it is in it, else its network rebuilt in that form
    with every weight (`scan.to_scanned` / `to_layered`; ValueError for a model that is not
    such a network, or not a full pre-activation one for "scan")."""
    if is_scanned(model) == (stages == "scan"):
        return model
    return to_scanned(model) if stages == "scan" else to_layered(model)


def save_plain(network: keras.Model, path: str) -> None:
    """Saves `network` (either form) as a file anyone can load: a plain Keras functional
    model of its layer graph, without the optimizer, so `keras.saving.load_model` needs
    neither keras_preact nor `safe_mode=False`; its spec goes in `SPEC_ENTRY`, which `load`
    reads (a run dir's `model.keras`). It writes `path` twice: give it a temporary one.

    Example:
    >>> import tempfile
    >>> path = os.path.join(tempfile.mkdtemp(), "m.keras")
    >>> save_plain(build_network("preact-18-imagenet-timm", input_shape=(64, 64, 3)), path)
    >>> type(keras.saving.load_model(path)).__name__  # Keras alone loads it
    'Functional'
    >>> with zipfile.ZipFile(path) as archive:  # and keras_preact knows what it is
    ...     spec_in(json.loads(archive.read(SPEC_ENTRY))).family
    'imagenet'
    """
    plain = in_form(network, "layers")
    keras.Model(plain.inputs, plain.outputs, name=plain.name).save(path)
    with zipfile.ZipFile(path, "a") as archive:
        archive.writestr(SPEC_ENTRY, json.dumps(dataclasses.asdict(spec_of(network))))


def declared(path: str, config: dict) -> tuple[ResNetSpec, str, str, str | None] | None:
    """`(spec, form, name, dtype policy)` of the network the `.keras` file `path` (its
    config.json: `config`) declares: its own `network.ResNet` config, else, for a plain
    file, its `SPEC_ENTRY` or (files written before it) the `config.json` of the run dir it
    is in; None for any other file."""
    if config.get("registered_name") == RESNET:
        own = config["config"]
        return spec_in(own), own["stages"], own["name"], own.get("dtype")
    try:  # the file's dtype policy: that of its stem conv
        spec = _plain_spec(path)
        layers = config["config"]["layers"]
        stem = next(e for e in layers if e["name"] == "stem_conv")
        dtype = keras.dtype_policies.get(stem["config"]["dtype"]).name
    except (KeyError, TypeError, ValueError, StopIteration):
        return None
    # The file must hold that network, layer for layer (a file edited since does not).
    if spec is None or [(e["name"], e["class_name"]) for e in layers] != plain_layers(spec):
        return None
    return spec, "layers", config["config"]["name"], dtype


def _plain_spec(path: str) -> ResNetSpec | None:
    """The spec a plain `.keras` file names: its `SPEC_ENTRY`, else its run dir's recipe."""
    with zipfile.ZipFile(path) as archive:
        if SPEC_ENTRY in archive.namelist():
            return spec_in(json.loads(archive.read(SPEC_ENTRY)))
    directory = os.path.dirname(os.path.abspath(path))
    if (os.path.basename(path) != rundir.MODEL
            or not os.path.isfile(os.path.join(directory, rundir.CONFIG))):
        return None
    run = rundir.read_config(directory)
    return resolve(run["model"], **run.get("overrides", {}))


def load(path: str, config: dict, *, fast: bool = False, compile: bool = True) -> keras.Model:
    """The model in the `.keras` file `path` (config.json: `config`), as the network it
    `declared`: in its saved form, or with `fast` in the scanned form where the design has
    one (same outputs; loaded without building the plain graph). Any other file is loaded
    by Keras as it is, as is a `ResNet` file without `fast` (it may hold an optimizer)."""
    network = declared(path, config)
    if network is None or (not fast and config.get("registered_name") == RESNET):
        return keras.saving.load_model(path, compile=compile)
    spec, form, name, dtype = network
    if fast and scannable(spec):
        form = "scan"
    model = build_from_spec(spec, name=name, stages=form, dtype=dtype)
    try:
        load_weights(model, path)
    except ValueError:  # weights that do not fit the declared network: Keras names them
        return keras.saving.load_model(path, compile=compile)
    return model


def preprocessing_of(model: keras.Model) -> Preprocessing:
    """The normalization and evaluation geometry `model` takes: its network's
    (`pretrained.preprocessing_for`: a `-timm` net takes timm's); a one-line ValueError for
    a model that holds none (`network.network_of`). The one answer for evaluation,
    SavedModel signatures and ONNX/LiteRT/OpenVINO exports.

    Example:
    >>> preprocessing_of(build_network("preact-18-imagenet-timm", input_shape=(64, 64, 3)))
    ... # doctest: +NORMALIZE_WHITESPACE
    Preprocessing(stats='inception', size=224, crop_pct=0.9, interpolation='bicubic',
                  in_model=False)
    """
    return preprocessing_for(network_of(model).spec)


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
