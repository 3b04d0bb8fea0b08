"""Weights files and forms: what goes into a network and in which form (plain layers or
scanned stages).

- `load_weights`: a `.weights.h5` or `.keras` file of either form into a network of either;
  `in_form`: a network in the other form, weights and all.
- `save_plain`: a network as a plain `.keras` file that Keras alone loads, its spec inside.
- `load`: a `.keras` file as the network it declares (`keras_preact.api.load_model`,
  `load_for_inference`): its own config (`network.ResNet`), the `SPEC_ENTRY` of a plain file
  keras_preact wrote (`save_plain`), or a run dir's `config.json` beside an older plain
  `model.keras`.

A plain file goes into a scanned network straight from the file (`plain_layers` says where
each layer's weights are): no plain twin is built.

Example:
>>> import os, tempfile
>>> from keras_preact.api import build_network
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
from keras_preact.arch.introspect import UNIT_PREFIX, unit_prefix
from keras_preact.arch.network import ResNet, build_from_spec, spec_in, spec_of
from keras_preact.arch.scan import copy_weights, set_plain_weights, to_layered, to_scanned
from keras_preact.arch.scanned_units import is_scanned, scannable
from keras_preact.arch.specs import ResNetSpec, resolve

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
    >>> import keras_preact
    >>> save_plain(keras_preact.build("preact-18-imagenet-timm", input_shape=(64, 64, 3)), path)
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


