"""Weights files and forms: what goes into a network and in which form (plain layers or
scanned stages).

- `load_weights`: a `.weights.h5` or `.keras` file of either form into a network of either;
  `in_form`: a network in the other form, weights and all.
- `save_plain`: a network as a plain `.keras` file that Keras alone loads, its spec inside.
- `load`: a `.keras` file as the network it declares (`keras_preact.api.load_model`,
  `load_for_inference`): its own config (`network.ResNet`), the `SPEC_ENTRY` of a plain file
  keras_preact wrote (`save_plain`), or the network its caller says an older plain file
  holds (a run dir's recipe: `keras_preact.rundir.recipe`; this module reads no run dir).
- `stored_shapes`, `check_fits`: whether a weights file holds a network, checked without
  building it.

A plain file goes into a scanned network straight from the file (`_model_layout` reads
where each layer's weights are off the scanned network itself): no plain twin is built.

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
import re
import zipfile

import h5py
import keras

from keras_preact.arch.introspect import SCAN_LAYER, UNIT_PREFIX, unit_prefix
from keras_preact.arch.network import ResNet, build_from_spec, spec_in, spec_of
from keras_preact.arch.scan import (
    checked_weights,
    copy_weights,
    set_plain_weights,
    to_layered,
    to_scanned,
    unit_prefixes,
)
from keras_preact.arch.scanned_units import ScannedUnits, is_scanned, scannable
from keras_preact.arch.specs import ResNetSpec

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


@dataclasses.dataclass(frozen=True)
class KerasFile:
    """A `.keras` archive as read in one pass (`keras_preact.api`): its config.json, the
    bytes of its `SPEC_ENTRY` and of its weights file (each None when it has none), so a
    load opens the zip once."""

    path: str
    config: dict
    spec_entry: bytes | None
    weights: bytes | None


@dataclasses.dataclass(frozen=True)
class StoredLayer:
    """Where a file keeps one layer's weights: `model.layers` order, the layer's class (which
    names its group) and the shapes of its weights in `get_weights` order."""

    name: str
    kind: str
    shapes: tuple[tuple[int, ...], ...]


@contextlib.contextmanager
def _weights_h5(source: str | KerasFile):
    """The h5 file of weights in `source`: a `.weights.h5` file, a `.keras` archive's, or
    those a `KerasFile` holds."""
    if isinstance(source, KerasFile):
        if source.weights is None:
            raise OSError(f"not a whole .keras archive (KeyError: no {KERAS_WEIGHTS_FILE})")
        data = io.BytesIO(source.weights)
    elif not source.endswith(".keras"):
        with h5py.File(source, "r") as h5:
            yield h5
        return
    else:
        try:
            with zipfile.ZipFile(source) as archive:
                # Keras stores the weights uncompressed: read into memory (h5py seeks a lot,
                # and seeking back in a zip member rereads it), as much as the file holds.
                data = io.BytesIO(archive.read(KERAS_WEIGHTS_FILE))
        except (zipfile.BadZipFile, KeyError) as error:  # cut short, or not Keras' archive
            raise OSError(f"not a whole .keras archive ({type(error).__name__}: {error})") \
                from None
    with h5py.File(data, "r") as h5:
        yield h5


def _form(h5) -> str:
    """The form ("layers" or "scan") of the network an open weights file was saved from
    (Keras names the groups of scanned stages after their class: `scanned_units`, ...)."""
    scanned = "layers" in h5 and any(k.startswith("scanned_units") for k in h5["layers"])
    return "scan" if scanned else "layers"


def file_form(path: str) -> str:
    """The form ("layers" or "scan") of the network a weights file was saved from."""
    with _weights_h5(path) as h5:
        return _form(h5)


@functools.lru_cache(maxsize=8)
def stored_layout(spec: ResNetSpec, form: str = "layers") -> tuple[StoredLayer, ...]:
    """Each layer of `spec`'s network in form `form` as its files store it, read off the same
    net with at most two units per stage: units 2..n of a stage are alike (in the plain form
    each a run of layers like unit 2's; in the scanned form one loop whose weights stack
    n - 1 units). Keras orders a functional model's layers by their distance from the
    output, and every layer of unit u lies between the additions of units u - 1 and u."""
    template = build_from_spec(dataclasses.replace(
        spec, units=tuple(min(n, 2) for n in spec.units)), stages=form)

    def stored(layer, name: str | None = None, units: int | None = None) -> StoredLayer:
        shapes = tuple(tuple(w.shape) for w in layer.weights)
        if units is not None:  # a loop: one slice per unit
            shapes = tuple((units, *shape[1:]) for shape in shapes)
        return StoredLayer(name or layer.name, type(layer).__name__, shapes)

    layers: list[StoredLayer] = []
    expanded = set()  # the stages whose units 2..n are listed
    for layer in template.layers:
        match = UNIT_PREFIX.match(layer.name)
        scanned = SCAN_LAYER.fullmatch(layer.name)
        if scanned:
            layers.append(stored(layer, units=spec.units[int(scanned.group(1)) - 1] - 1))
        elif not (match and match.group(2) == "002"):
            layers.append(stored(layer))
        elif (stage := int(match.group(1))) not in expanded:
            expanded.add(stage)
            second = [x for x in template.layers
                      if x.name.startswith(unit_prefix(stage, 2) + "_")]
            layers += [stored(x, f"{unit_prefix(stage, u)}_{x.name[match.end():]}")
                       for u in range(2, spec.units[stage - 1] + 1) for x in second]
    return tuple(layers)


def plain_layers(spec: ResNetSpec) -> list[tuple[str, str]]:
    """`(name, class name)` of each layer of `spec`'s plain graph, in Keras' order (the
    order its files store weights in; `stored_layout`)."""
    return [(layer.name, layer.kind) for layer in stored_layout(spec)]


def _model_layout(model: ResNet, form: str) -> list[tuple[str, str]]:
    """`(name, class name)` of the layers of `model`'s network in form `form`, read off
    `model` itself, in Keras' order: a plain file's layout of a scanned `model` lists each
    loop's units as the plain graph's BN and conv layers (their ReLUs and additions hold no
    weights: their groups, misnumbered, are never read)."""
    if form == model.stages:
        return [(layer.name, type(layer).__name__) for layer in model.layers]
    layers = []
    for layer in model.layers:
        if not isinstance(layer, ScannedUnits):
            layers.append((layer.name, type(layer).__name__))
            continue
        for prefix in unit_prefixes(layer):
            for k in range(1, len(layer.convs) + 1):
                layers += [(f"{prefix}_bn{k}", "BatchNormalization"),
                           (f"{prefix}_conv{k}", "Conv2D")]
    return layers


def _stored_weights(h5, layers: list[tuple[str, str]]) -> dict[str, list]:
    """`{layer name: [h5py datasets]}`: Keras stores the weights of each layer of
    `model.layers` under `layers/{its class in snake case}`, suffixed `_1`, `_2`... after
    the first of a class (saving_lib `_save_container_state`)."""
    stored = set(h5["layers"]) if "layers" in h5 else set()  # layers with weights only
    seen: dict[str, int] = {}
    weights = {}
    for name, kind in layers:
        group = group_name(kind)
        seen[group] = seen.get(group, -1) + 1
        group += f"_{seen[group]}" if seen[group] else ""
        variables = h5[f"layers/{group}/vars"] if group in stored else {}
        weights[name] = [variables[str(i)] for i in range(len(variables))]
    return weights


def group_name(kind: str) -> str:
    """The h5 group Keras stores the first layer of class `kind` under (`batch_normalization`
    for BatchNormalization): Keras' own `to_snake_case`, which no public API offers
    (tests/weights/test_storage.py fails loudly should Keras rename it or change it)."""
    from keras.src.utils.naming import to_snake_case

    return to_snake_case(kind)


def stored_shapes(spec: ResNetSpec, path: str) -> list[tuple[StoredLayer, list[tuple]]]:
    """Each layer of `spec`'s network in the form the weights file `path` was saved in
    (`stored_layout`), with the shapes of the weights the file holds for it ([] for none):
    what `check_fits` compares, read without building the network."""
    try:
        with _weights_h5(path) as h5:
            layout = stored_layout(spec, _form(h5) if scannable(spec) else "layers")
            stored = _stored_weights(h5, [(layer.name, layer.kind) for layer in layout])
            return [(layer, [tuple(v.shape) for v in stored[layer.name]]) for layer in layout]
    except OSError as error:
        raise OSError(unreadable(path, error)) from None


def check_fits(path: str, name: str, layers: list[tuple[StoredLayer, list[tuple]]],
               keep: str | None = None) -> None:
    """A one-line ValueError unless the weights file `path` holds network `name` layer for
    layer (`layers`: `stored_shapes`), layer `keep` aside (a classifier of another class
    count, which a fine-tune replaces)."""
    wrong = [(layer, received) for layer, received in layers
             if layer.name != keep and received != list(layer.shapes)]
    if wrong:
        (layer, received), n = wrong[0], len(wrong)
        raise ValueError(
            f"The weights in {path!r} do not fit {name!r} as built (build the network the "
            f"file was saved from: same name and overrides): {n} layer{'s' * (n != 1)} of "
            f"another shape; {'the first' if n != 1 else 'it'} is {layer.name!r}, which needs "
            f"weights of shapes {list(layer.shapes)}. Received: {received}")


def _set_weights(model: ResNet, h5, keep: str | None = None) -> None:
    """Sets `model`'s weights (either form) from the open weights file `h5` (either form),
    all but those of layer `keep`, which keeps its own. KeyError or ValueError (naming a
    layer) for a file of another network."""
    form = _form(h5) if scannable(model.spec) else "layers"
    if form == "scan" and model.stages == "layers":  # the scanned form is quick to build
        scanned = build_from_spec(model.spec, name=model.name, stages="scan",
                                  dtype=model.dtype_policy)
        _set_weights(scanned, h5, keep)
        kept = keep and model.get_layer(keep).get_weights()
        copy_weights(scanned, model)
        if keep:
            model.get_layer(keep).set_weights(kept)
        return
    weights = _stored_weights(h5, _model_layout(model, form))
    if keep:
        weights[keep] = model.get_layer(keep).weights
    if form != model.stages:  # straight from the plain file into the scanned stages
        set_plain_weights(model, weights)
        return
    for layer in model.layers:
        if layer.weights and layer.name != keep:
            layer.set_weights(checked_weights(weights, layer.name,
                                              [v.shape for v in layer.weights]))


def load_weights(model: ResNet, path: str, *, keep: str | None = None) -> None:
    """`model.load_weights(path)` whatever form the file was saved from and `model` is in;
    with `keep`, every layer but that one (a classifier of another class count), which keeps
    its weights."""
    try:
        if keep is None and (file_form(path) if scannable(model.spec) else "layers") \
                == model.stages:
            model.load_weights(path)  # Keras' own, and Keras' words for a file that differs
        else:
            with _weights_h5(path) as h5:
                _set_weights(model, h5, keep)
    except (ValueError, KeyError) as error:
        raise ValueError(f"The weights in {path!r} do not fit {model.name!r} as built (build "
                         "the network the file was saved from: same name and overrides). "
                         f"Keras: {keras_says(error)}") from None
    except OSError as error:  # h5py's or `_weights_h5`'s, without the path
        raise OSError(unreadable(path, error)) from None


def keras_says(error: Exception) -> str:
    """Keras' message for weights that do not fit, in one line, as a person would say it:
    Keras goes on with the variable's values and every layer that failed, and counts them in
    words no API gives (`KERAS_LOAD_FAILURES`; tests/weights/test_records.py fails loudly
    should Keras reword it)."""
    says = " ".join(re.split("Target variable|List of objects", str(error))[0].split())
    counted = KERAS_LOAD_FAILURES.match(says)
    if counted:  # "A total of 1 objects could not be loaded. Example ... <Conv2D name=...>"
        n, name, cause = counted.groups()
        says = (f"{n} layer{'s' * (n != '1')} could not be loaded; "
                f"{'the first' if n != '1' else 'it'} is {name!r}: {cause}")
    return says


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
    >>> import os, tempfile
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


def declared(archive: KerasFile, recipe: ResNetSpec | None = None
             ) -> tuple[ResNetSpec, str, str, str | None] | None:
    """`(spec, form, name, dtype policy)` of the network the `.keras` file `archive`
    declares: its own `network.ResNet` config, else, for a plain file, its `SPEC_ENTRY` or
    (files written before it) `recipe`, the network its maker says it holds (a run dir's
    config.json, read by the caller: `keras_preact.rundir.recipe`); None for any other
    file."""
    config = archive.config
    if config.get("registered_name") == RESNET:
        own = config["config"]
        return spec_in(own), own["stages"], own["name"], own.get("dtype")
    try:  # the file's dtype policy: that of its stem conv
        spec = (recipe if archive.spec_entry is None
                else spec_in(json.loads(archive.spec_entry)))
        layers = config["config"]["layers"]
        stem = next(e for e in layers if e["name"] == "stem_conv")
        dtype = keras.dtype_policies.get(stem["config"]["dtype"]).name
    except (KeyError, TypeError, ValueError, StopIteration):
        return None
    # The file must hold that network, layer for layer (a file edited since does not).
    if spec is None or [(e["name"], e["class_name"]) for e in layers] != plain_layers(spec):
        return None
    return spec, "layers", config["config"]["name"], dtype


def load(archive: KerasFile, recipe: ResNetSpec | None = None, *, fast: bool = False,
         compile: bool = True) -> keras.Model:
    """The model in the `.keras` file `archive` (read once: `KerasFile`), as the network it
    `declared` (`recipe`: see there): in its saved form, or with `fast` in the scanned form
    where the design has one (same outputs; loaded without building the plain graph). Any
    other file is loaded by Keras as it is, as is a `ResNet` file without `fast` (it may hold
    an optimizer)."""
    config = archive.config
    network = declared(archive, recipe)
    if network is None or (not fast and config.get("registered_name") == RESNET):
        return keras.saving.load_model(archive.path, compile=compile)
    spec, form, name, dtype = network
    if fast and scannable(spec):
        form = "scan"
    model = build_from_spec(spec, name=name, stages=form, dtype=dtype)
    try:
        with _weights_h5(archive) as h5:
            _set_weights(model, h5)
    except (ValueError, KeyError):  # weights that do not fit: Keras names them
        return keras.saving.load_model(archive.path, compile=compile)
    except OSError as error:
        raise OSError(unreadable(archive.path, error)) from None
    return model
