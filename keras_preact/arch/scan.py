"""Scanned stages: a stage's identical residual units run as one loop over stacked weights.

Build them with `keras_preact.build(name, stages="scan")`: each stage's units 2..n become one
`ScannedUnits` layer (`keras_preact.arch.scanned_units`), a graph that no longer grows with depth,
with the plain layer graph's math and parameter count. Convert a trained model either way with
`to_scanned` / `to_layered` (the plain graph is the one to inspect: its `Add` layers show the
identity path); `keras_preact.weights` loads a file of either form into either.
What the loop gains and costs is measured in benchmarks/README.md.

Example:
>>> import keras_preact
>>> from keras_preact import scan
>>> fast = keras_preact.build("preact-164", stages="scan", depth=20)
>>> plain = scan.to_layered(fast)
>>> plain.count_params() == fast.count_params()
True
"""

from __future__ import annotations

import dataclasses

import keras
import numpy as np
from keras import ops

from keras_preact.arch.introspect import stage_of, unit_prefix
from keras_preact.arch.network import ResNet, build_from_spec
from keras_preact.arch.scanned_units import (  # noqa: F401  (the form's public names)
    ScannedUnits,
    check_scannable,
    is_scanned,
    scannable,
    scanned_layers,
    scanned_units,
    set_options,
)
from keras_preact.arch.specs import STAGES  # noqa: F401


def to_scanned(model: keras.Model, *, fused: bool = True, recompute: bool = False,
               recompute_bn: bool = True) -> keras.Model:
    """The scanned form (`stages="scan"`) of a plain full pre-activation `model`, with its
    weights (moving statistics included): same outputs, same parameter count.

    Example:
    >>> import keras_preact
    >>> plain = keras_preact.build("preact-164", depth=20)
    >>> fast = to_scanned(plain)
    >>> fast.get_layer("stage1_scan").units, plain.count_params() == fast.count_params()
    (1, True)
    """
    target = _convert(model, "scan")
    return set_options(target, fused=fused, recompute=recompute, recompute_bn=recompute_bn)


def to_layered(model: keras.Model) -> keras.Model:
    """The plain layer graph of a scanned `model`, with its weights: same outputs, same
    parameter count, and the graph `keras_preact.build(name)` gives (to export, inspect
    or fine-tune with per-layer tools).

    Example:
    >>> import keras_preact
    >>> fast = keras_preact.build("preact-164", stages="scan", depth=20)
    >>> to_layered(fast).get_layer("stage1_unit002_add").name
    'stage1_unit002_add'
    """
    return _convert(model, "layers")


def _convert(model: keras.Model, stages: str) -> keras.Model:
    """Rebuilds `model`'s network in form `stages` under its dtype policy and copies every
    weight across; a model that is not exactly that network raises ValueError."""
    if not isinstance(model, ResNet):
        raise ValueError(f"Model {model.name!r} is not a network built by keras_preact.build. "
                         f"Received layers: {[layer.name for layer in model.layers][:5]}...")
    # The full pre-activation net of the model's stages and head: copy_weights names the
    # layers of any other design or shortcut that differ from it.
    spec = dataclasses.replace(model.spec, unit="full-preact", shortcut="identity")
    target = build_from_spec(spec, model.name, stages=stages, dtype=model.dtype_policy)
    copy_weights(model, target)
    return target


def copy_weights(source: keras.Model, target: keras.Model) -> None:
    """Copies every weight (moving statistics included) of `source` into `target`: two
    forms of one full pre-activation network, scanned and plain, either way round (or two
    plain ones). Raises ValueError, naming the layers, if they are not the same network.

    Example:
    >>> import keras_preact
    >>> fast = keras_preact.build("preact-164", stages="scan", depth=20)
    >>> plain = keras_preact.build("preact-164", depth=20)
    >>> copy_weights(fast, plain)
    >>> bool((plain.get_layer("stage1_unit002_conv1").kernel.numpy()
    ...       == fast.get_layer("stage1_scan").kernels[0].numpy()[0]).all())
    True
    """
    to_scan = is_scanned(target)
    scanned, plain = (target, source) if to_scan else (source, target)
    if is_scanned(plain):
        raise ValueError("copy_weights copies between a scanned and a plain model. Received "
                         f"two scanned models: {source.name!r} and {target.name!r}")

    # Every layer of the plain form is either a layer of the scanned form (same config)
    # or part of one of its scanned units. Input layers (no weights) may be named freely.
    def names(model):
        return {layer.name for layer in model.layers
                if not isinstance(layer, (ScannedUnits, keras.layers.InputLayer))}

    expected = names(scanned)
    for layer in scanned_layers(scanned):  # a unit: bn1 relu1 conv1 ... convK add
        kinds = [f"{op}{k}" for k in range(1, len(layer.convs) + 1)
                 for op in ("bn", "relu", "conv")]
        expected.update(f"{prefix}_{kind}" for prefix in unit_prefixes(layer)
                        for kind in kinds + ["add"])
    if names(plain) != expected:
        diff = sorted(names(plain) ^ expected)[:5]
        raise ValueError(f"{source.name!r} and {target.name!r} are not two forms of one full "
                         f"pre-activation network of keras_preact.build. Layers that differ: "
                         f"{diff}")

    for layer in scanned.layers:
        if isinstance(layer, ScannedUnits):
            for plain_names, _ in _unit_weights(layer):
                for plain_layer in map(plain.get_layer, plain_names):
                    if (isinstance(plain_layer, keras.layers.BatchNormalization) and
                            (plain_layer.momentum, plain_layer.epsilon) != (layer.momentum,
                                                                            layer.epsilon)):
                        raise ValueError(
                            f"{plain_layer.name}: momentum/epsilon {plain_layer.momentum}/"
                            f"{plain_layer.epsilon} differ from {layer.name}'s "
                            f"{layer.momentum}/{layer.epsilon}.")
        elif not isinstance(layer, keras.layers.InputLayer):
            other = plain.get_layer(layer.name)
            if other.get_config() != layer.get_config():
                raise ValueError(f"Layer {layer.name!r} differs between the two forms. "
                                 f"Received: {other.get_config()} and {layer.get_config()}")
    if to_scan:
        set_plain_weights(scanned, {layer.name: layer.get_weights() for layer in plain.layers})
    else:
        for name, values in _plain_weights(scanned).items():
            plain.get_layer(name).set_weights(values)


def unit_prefixes(layer: ScannedUnits) -> list[str]:
    """The plain graph's prefixes of `layer`'s units: units 2..n of its stage."""
    return [unit_prefix(stage_of(layer.name), u) for u in range(2, layer.units + 2)]


def _unit_weights(layer: ScannedUnits):
    """`(plain layer names, stacked weights)` for each BN and conv of `layer`'s units: slice
    `u` of each stacked weight is a weight of the `u`-th named layer, in `get_weights` order
    (BN: gamma, beta, moving mean, moving variance; conv: kernel)."""
    prefixes = unit_prefixes(layer)
    for k, (bn, kernel) in enumerate(zip(layer.bn_weights, layer.kernels), start=1):
        yield [f"{p}_bn{k}" for p in prefixes], bn
        yield [f"{p}_conv{k}" for p in prefixes], [kernel]


def _plain_weights(scanned: keras.Model) -> dict[str, list[np.ndarray]]:
    """The weights of `scanned`'s plain form: `{plain layer name: its get_weights()}`."""
    weights = {}
    for layer in scanned.layers:
        if isinstance(layer, ScannedUnits):
            for names, stacked in _unit_weights(layer):
                values = [ops.convert_to_numpy(v) for v in stacked]
                weights.update({name: [v[u] for v in values] for u, name in enumerate(names)})
        elif not isinstance(layer, keras.layers.InputLayer):
            weights[layer.name] = layer.get_weights()
    return weights


def set_plain_weights(scanned: keras.Model, weights) -> None:
    """Sets every weight of `scanned` from those of its plain form, `weights` as
    `{plain layer name: its weights}` (arrays, or h5py datasets: each is read once its shape
    is checked). Raises KeyError for a missing layer, ValueError naming a layer whose shapes
    differ."""
    for layer in scanned.layers:
        if isinstance(layer, ScannedUnits):
            for names, stacked in _unit_weights(layer):
                per_unit = [checked_weights(weights, name, [v.shape[1:] for v in stacked])
                            for name in names]
                for k, v in enumerate(stacked):
                    v.assign(np.stack([values[k] for values in per_unit]))
        elif not isinstance(layer, keras.layers.InputLayer):
            layer.set_weights(checked_weights(weights, layer.name,
                                              [v.shape for v in layer.weights]))


def checked_weights(weights, name: str, shapes: list) -> list[np.ndarray]:
    """`weights[name]` as arrays, once checked to have `shapes`."""
    received = [tuple(v.shape) for v in weights[name]]
    if received != [tuple(shape) for shape in shapes]:
        raise ValueError(f"Layer {name!r} holds weights of shapes {received}; its place in the "
                         f"scanned form needs {[tuple(shape) for shape in shapes]}.")
    return [np.asarray(v) for v in weights[name]]

__all__ = ["STAGES", "ScannedUnits", "check_scannable", "copy_weights", "is_scanned",
           "scannable", "scanned_units", "set_options", "to_layered", "to_scanned"]
