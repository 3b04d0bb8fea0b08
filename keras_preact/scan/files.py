"""Saved files of full pre-activation nets, read without Keras building their layer graph:
whether a `.weights.h5` holds scanned stages, and a plain `.keras` file loaded straight into
the scanned form (`load_scanned`).

Example:
>>> import os, tempfile, keras_preact
>>> path = os.path.join(tempfile.mkdtemp(), "m.weights.h5")
>>> keras_preact.build("preact-164", stages="scan", depth=20).save_weights(path)
>>> holds_scanned_weights(path)
True
"""

from __future__ import annotations

import dataclasses
import json
import re

import keras

from keras_preact.introspect import UNIT_PREFIX, config_spec, unit_prefix
from keras_preact.scan.convert import build_under, set_plain_weights
from keras_preact.scanned_units import scannable

# A `.keras` archive's weights file (keras/src/saving/saving_lib.py).
KERAS_WEIGHTS_FILE = "model.weights.h5"
# Saving tags objects that several layers share (the dtype policy) with their `id()` in the
# saving process: not part of the graph. Keys are sorted, so the tag is never first.
SHARED_ID = re.compile(r', "shared_object_id": \d+')


def holds_scanned_weights(path: str) -> bool:
    """Whether the `.weights.h5` file at `path` was saved from a model with scanned stages
    (Keras names its groups after the layer class: `scanned_units`, `scanned_units_1`...)."""
    import h5py

    with h5py.File(path, "r") as f:
        return "layers" in f and any(k.startswith("scanned_units") for k in f["layers"])


def load_scanned(path: str, config: dict) -> keras.Model | None:
    """The scanned form of the plain full pre-activation net in the `.keras` file `path`,
    without building its layer graph; `config` is the file's config.json. Uncompiled.

    The spec read off the layer names is built with `stages="scan"` (fast at any depth) and
    the file's weights (moving statistics included) go into it. The file must hold exactly
    the plain graph `keras_preact.build` makes of that spec (every layer config and
    connection is compared, under the file's dtype policy); None for any other file (other
    designs, scanned or foreign models): load those with Keras.

    Example:
    >>> import os, tempfile, json, zipfile, keras_preact
    >>> path = os.path.join(tempfile.mkdtemp(), "m.keras")
    >>> keras_preact.build("preact-164", depth=20).save(path)
    >>> config = json.loads(zipfile.ZipFile(path).read("config.json"))
    >>> load_scanned(path, config).get_layer("stage1_scan").units
    1
    """
    import io
    import zipfile

    import h5py

    spec, dtype_policy = config_spec(config), _dtype_policy(config)
    if spec is None or dtype_policy is None or not scannable(spec):
        return None
    name = config["config"]["name"]
    # Units 2..n of a stage are alike (names aside): 2 units stand for n in the comparison.
    template = build_under(dataclasses.replace(spec, units=tuple(min(n, 2) for n in spec.units)),
                      name, "layers", dtype_policy)
    if not _same_graph(config, template, spec.units):
        return None
    with zipfile.ZipFile(path) as archive:
        # Keras stores the weights uncompressed: read into memory (h5py seeks a lot, and
        # seeking back in a zip member rereads it), as much as the file holds on disk.
        if archive.getinfo(KERAS_WEIGHTS_FILE).compress_type != zipfile.ZIP_STORED:
            return None
        weights_file = io.BytesIO(archive.read(KERAS_WEIGHTS_FILE))
    model = build_under(spec, name, "scan", dtype_policy)
    with h5py.File(weights_file, "r") as h5:
        try:
            set_plain_weights(model, _file_weights(h5, config["config"]["layers"]))
        except (KeyError, ValueError):  # weights that do not fit the config: Keras names them
            return None
    return model


def _dtype_policy(config: dict) -> str | None:
    """The name of the dtype policy of a `.keras` config.json's stem conv, if Keras knows it."""
    try:  # the file's config may hold anything
        stem = next(entry for entry in config["config"]["layers"] if entry["name"] == "stem_conv")
        name = stem["config"]["dtype"]["config"]["name"]
        keras.dtype_policies.get(name)
    except (StopIteration, KeyError, TypeError, ValueError, AttributeError):
        return None
    return name


def _same_graph(config: dict, template: keras.Model, units: tuple) -> bool:
    """Whether the `.keras` config.json `config` is the plain graph of `template`'s spec with
    `units` per stage, `template` being that net with at most 2 units per stage: its unit 2
    stands for units 2..n (same configs and connections once unit numbers are read as
    roles, see `_unit_roles`)."""
    expected = json.loads(template.to_json())
    template_units = tuple(min(n, 2) for n in units)
    reference = {entry["name"]: _unit_roles(entry, entry["name"], template_units)
                 for entry in expected["config"]["layers"]}
    wanted = set()
    for name in reference:
        match = UNIT_PREFIX.match(name)
        stage = int(match.group(1)) if match else 0
        copies = range(2, units[stage - 1] + 1) if match and match.group(2) == "002" else [None]
        wanted.update(name if u is None else f"{unit_prefix(stage, u)}_{name[match.end():]}"
                      for u in copies)
    layers = config["config"]["layers"]
    names = [entry["name"] for entry in layers]
    if len(set(names)) != len(names) or set(names) != wanted:
        return False

    def head(c: dict) -> dict:  # the model's own config: inputs, outputs, name, trainable
        return {**c, "config": {k: v for k, v in c["config"].items() if k != "layers"}}

    keys = ("module", "class_name", "registered_name", "config")
    if (_unit_roles({k: head(config).get(k) for k in keys}, None, units)
            != _unit_roles({k: head(expected).get(k) for k in keys}, None, template_units)):
        return False
    for entry in layers:
        name = entry["name"]
        match = UNIT_PREFIX.match(name)
        if match and match.group(2) != "001":  # units 2..n: compared with the template's 2
            name = f"{unit_prefix(int(match.group(1)), 2)}_{name[match.end():]}"
        if _unit_roles(entry, entry["name"], units) != reference[name]:
            return False
    return True


def _unit_roles(entry, owner: str | None, units: tuple) -> str:
    """`entry` as JSON with each `stage{s}_unit{uuu}_` named by the unit's role for the layer
    `owner`: its own unit, the unit before it, a stage's first or last unit, or another
    unit (which matches nothing). Unit 7 of a 9-unit stage then reads as unit 2 of a 2-unit
    one: `stage1_unit007_bn1` fed by `stage1_unit006_add` is "own bn1 fed by previous add"."""
    match = UNIT_PREFIX.match(owner or "")
    own = (int(match.group(1)), int(match.group(2))) if match else None

    def role(m) -> str:
        s, u = int(m.group(1)), int(m.group(2))
        if own == (s, u):
            name = "own"
        elif own == (s, u + 1):
            name = "previous"
        elif u == 1:
            name = "first"
        elif 1 <= s <= len(units) and u == units[s - 1]:
            name = "last"
        else:
            name = f"other{u}"
        return f"stage{s}_unit<{name}>_"

    return UNIT_PREFIX.sub(role, SHARED_ID.sub("", json.dumps(entry, sort_keys=True)))


def _file_weights(h5, layers: list) -> dict[str, list]:
    """`{layer name: [h5py datasets]}` of a `.keras` file: Keras stores the weights of each
    layer of `model.layers` (the config's order) under `layers/{its class in snake case}`,
    suffixed `_1`, `_2`... after the first of a class (saving_lib `_save_container_state`)."""
    from keras.src.utils.naming import to_snake_case  # the function Keras names them with

    stored = set(h5["layers"]) if "layers" in h5 else set()  # layers with weights only
    seen: dict[str, int] = {}
    weights = {}
    for entry in layers:
        group = to_snake_case(entry["class_name"])
        seen[group] = seen.get(group, -1) + 1
        group += f"_{seen[group]}" if seen[group] else ""
        variables = h5[f"layers/{group}/vars"] if group in stored else {}
        weights[entry["name"]] = [variables[str(i)] for i in range(len(variables))]
    return weights
