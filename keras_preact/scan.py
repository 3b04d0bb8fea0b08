"""Scanned stages: a stage's identical residual units run as one loop over stacked weights.

A full pre-activation unit with an identity shortcut is `x + F(x)` with
`F = conv_K(relu(bn_K(... conv_1(relu(bn_1(x))))))`; every unit of a stage after the first
has the same shapes. `ScannedUnits` holds the weights of those `n` units stacked on a
leading axis and runs them with one `tf.while_loop`, so the traced graph (and the time
TensorFlow spends optimizing it before the first step) no longer grows with depth:
preact-1001 becomes a graph of about the size of preact-20. The math is the plain layer
graph's: same convs, same BatchNormalization (batch statistics in training, the same moving
statistics update `m = 0.9 m + 0.1 batch`, epsilon 1e-5), same initializers, same
parameter count. Only TensorFlow's summation order differs (outputs agree to ~1e-6).

Build it with `keras_preact.build(name, stages="scan")`; convert a trained model either way
with `to_scanned` / `to_layered` (the plain graph is the one to export and inspect: its
`Add` layers show the identity path). `fused=True` (default) computes each BN with one
`FusedBatchNormV3` op instead of Keras' moments + normalize ops. In training, each
BN-ReLU-conv keeps only its input for the backward pass and recomputes the cheap BN + ReLU
there (about half the activation memory of autodiff, a few % more time); `recompute=True`
keeps only each unit's input and recomputes the whole unit (memory mode).

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
import json
import re

import keras
import numpy as np
from keras import ops

# TensorFlow is imported where it is used: keras_preact (hence this module) also imports on
# the jax and torch backends, where only stages='layers' builds.

from keras_preact import blocks
from keras_preact.blocks import BN_EPSILON, BN_MOMENTUM
from keras_preact.specs import CONVS_PER_UNIT, ResNetSpec

STAGES = ("layers", "scan")
SCAN_NAME = re.compile(r"^stage(\d+)_scan$")
UNIT_ADD = re.compile(r"^stage(\d+)_unit(\d{3})_add$")


def scannable(spec: ResNetSpec) -> bool:
    """Whether the units of `spec` are full pre-activation units with identity shortcuts
    (the only design whose unit is `x + F(x)` with nothing after), which `stages="scan"` runs."""
    return spec.unit == "full-preact" and spec.shortcut == "identity"


def check_scannable(spec: ResNetSpec) -> None:
    """Raises ValueError unless `scannable(spec)`."""
    if not scannable(spec):
        raise ValueError(
            "stages='scan' needs full pre-activation units with identity shortcuts. Received: "
            f"unit={spec.unit!r}, shortcut={spec.shortcut!r} (use stages='layers')."
        )


def scanned_units(x, spec: ResNetSpec, width: int, units: int, name: str, **options):
    """Applies `units` identical stride-1 units of `spec` (stage width `width`) to `x`."""
    check_scannable(spec)
    convs = [(f, k) for f, k, _ in blocks.branch_convs(spec, width, 1)]
    return ScannedUnits(units, convs, name=name, **options)(x)


def _stacked_init(initializer, units: int):
    """An initializer for `(units, *shape)` that draws each unit's slice like `initializer`
    draws `shape` (fans are computed per unit, as for the plain layers)."""

    def init(shape, dtype=None):
        return ops.stack([initializer(shape[1:], dtype=dtype) for _ in range(units)])

    return init


def _scan(fn, carry, xs: list, length: int, num_ys: int):
    """`jax.lax.scan` on one tf.while_loop: `carry, y_i = fn(carry, [x[i] for x in xs])`
    with `y_i` a list of `num_ys` float32 tensors.

    Stacked inputs go through TensorArrays (not `gather`), so each weight gradient is
    written once per iteration instead of being summed densely over all iterations.
    Returns the final carry and the `y_i` stacked on a new leading axis.
    """
    import tensorflow as tf

    xs_ta = [tf.TensorArray(x.dtype, size=length).unstack(x) for x in xs]
    ys_ta = [tf.TensorArray(tf.float32, size=length) for _ in range(num_ys)]

    def body(i, c, *ys):
        c, y = fn(c, [ta.read(i) for ta in xs_ta])
        return (i + 1, c, *[ta.write(i, v) for ta, v in zip(ys, y)])

    # One iteration at a time: unit i + 1 needs unit i's output anyway, and running ahead
    # would only hold more activations.
    _, carry, *ys_ta = tf.while_loop(
        lambda i, *_: i < length, body, (tf.constant(0), carry, *ys_ta),
        parallel_iterations=1, maximum_iterations=length,
    )
    return carry, [ta.stack() for ta in ys_ta]


@keras.saving.register_keras_serializable(package="keras_preact")
class ScannedUnits(keras.layers.Layer):
    """`units` identical full pre-activation units `x + F(x)`, run by one loop.

    Args:
        units: number of units.
        convs: `(filters, kernel)` of the branch's convs in order, e.g. bottleneck width 16:
            `[(16, 1), (16, 3), (64, 1)]`. The input must have `convs[-1][0]` channels.
        momentum, epsilon: the BatchNormalization settings of the plain layers.
        fused: compute BN with `FusedBatchNormV3` (one op forward, one backward) rather
            than Keras' moments + normalize ops. Same statistics and update.
        recompute: keep only each unit's input for the backward pass and recompute the
            unit (`tf.recompute_grad`): ~2/3 of the default's activation memory, ~1.2x
            the time.

    Weights are `bn{k}_gamma`, `bn{k}_beta`, `bn{k}_moving_mean`, `bn{k}_moving_variance`
    of shape `(units, channels)` and `conv{k}_kernel` of shape `(units, k, k, in, out)`:
    slice `u` holds the weights of the plain graph's unit `u + 2` of the stage.
    """

    def __init__(self, units: int, convs, momentum: float = BN_MOMENTUM,
                 epsilon: float = BN_EPSILON, fused: bool = True, recompute: bool = False,
                 **kwargs):
        super().__init__(autocast=False, **kwargs)  # casts are explicit in `call`
        if keras.backend.backend() != "tensorflow":
            raise ValueError("Scanned stages run a tf.while_loop: they need the TensorFlow "
                             f"backend. Received: backend {keras.backend.backend()!r} (use "
                             "stages='layers').")
        if not (isinstance(units, int) and units >= 1):
            raise ValueError(f"`units` must be a positive integer. Received: units={units!r}")
        self.units = units
        self.convs = [(int(f), int(k)) for f, k in convs]
        self.momentum = float(momentum)
        self.epsilon = float(epsilon)
        self.fused = bool(fused)
        self.recompute = bool(recompute)

    def build(self, input_shape):
        channels = input_shape[-1]
        if channels != self.convs[-1][0]:
            raise ValueError(
                f"{self.name}: the input needs {self.convs[-1][0]} channels (the last conv's "
                f"filters) for the identity shortcut. Received: input_shape={input_shape}"
            )
        n, c_in = self.units, channels
        ones, zeros = keras.initializers.Ones(), keras.initializers.Zeros()
        self.bn_weights, self.kernels = [], []
        for k, (filters, kernel) in enumerate(self.convs, start=1):
            bn = [self.add_weight((n, c_in), init, name=f"bn{k}_{what}", trainable=trainable)
                  for what, init, trainable in (("gamma", ones, True), ("beta", zeros, True),
                                                ("moving_mean", zeros, False),
                                                ("moving_variance", ones, False))]
            self.bn_weights.append(bn)
            self.kernels.append(self.add_weight(
                (n, kernel, kernel, c_in, filters), _stacked_init(blocks.CONV_INIT, n),
                name=f"conv{k}_kernel"))
            c_in = filters

    def _batch_norm(self, x, gamma, beta, mean, variance, training):
        """BN of the plain layer (statistics and arithmetic in float32); returns the output
        in the compute dtype and the batch mean and (biased) variance used."""
        import tensorflow as tf

        if self.fused:
            if training:
                y, mean, variance = tf.compat.v1.nn.fused_batch_norm(
                    x, gamma, beta, epsilon=self.epsilon, is_training=True)
                # The op returns the unbiased variance; Keras' moving average uses the biased.
                n = tf.cast(tf.reduce_prod(tf.shape(x)[:-1]), tf.float32)
                variance = variance * ((n - 1.0) / n)
            else:
                y, _, _ = tf.compat.v1.nn.fused_batch_norm(
                    x, gamma, beta, mean, variance, epsilon=self.epsilon, is_training=False)
            return ops.cast(y, self.compute_dtype), mean, variance
        x = ops.cast(x, "float32")
        if training:
            mean, variance = ops.moments(x, axes=(0, 1, 2))
        y = ops.batch_normalization(x, mean, variance, axis=-1, offset=beta, scale=gamma,
                                    epsilon=self.epsilon)
        return ops.cast(y, self.compute_dtype), mean, variance

    def _bn_relu_conv(self, x, gamma, beta, kernel):
        """`conv(relu(bn(x)))` in training, whose backward pass keeps only `x`.

        Autodiff would keep `x` (for BN) and `relu(bn(x))` (for the ReLU and the conv):
        the backward pass here recomputes the cheap BN + ReLU from `x` instead and runs the
        conv's two gradient ops directly, so the conv is not recomputed. Same gradients;
        the loop stores about half the activations. Returns the conv output and the batch
        (mean, variance)."""
        import tensorflow as tf

        def bn_relu(x, gamma, beta):
            y, mean, variance = self._batch_norm(x, gamma, beta, None, None, training=True)
            return ops.relu(y), mean, variance

        @tf.custom_gradient
        def forward(x, gamma, beta, kernel):
            a, mean, variance = bn_relu(x, gamma, beta)
            y = tf.nn.conv2d(a, kernel, strides=1, padding="SAME")

            def grad(dy, *_):  # the statistics only feed the moving averages
                # Recompute from identities of the saved tensors: taping the loop's saved
                # tensors themselves made the backward loop ~4x slower (measured).
                inputs = [tf.identity(t) for t in (x, gamma, beta)]
                with tf.GradientTape() as tape:
                    tape.watch(inputs)
                    a, _, _ = bn_relu(*inputs)
                conv = {"strides": [1, 1, 1, 1], "padding": "SAME"}
                da = tf.raw_ops.Conv2DBackpropInput(
                    input_sizes=tf.shape(a), filter=kernel, out_backprop=dy, **conv)
                dkernel = tf.raw_ops.Conv2DBackpropFilter(
                    input=a, filter_sizes=tf.shape(kernel), out_backprop=dy, **conv)
                return (*tape.gradient(a, inputs, output_gradients=da), dkernel)

            return (y, mean, variance), grad

        return forward(x, gamma, beta, kernel)

    def _unit(self, x, params, training):
        """One unit `x + F(x)`. `params` per conv: gamma, beta, kernel in training (the
        batch statistics are used), gamma, beta, moving mean, moving variance, kernel in
        inference. Returns the output and, in training, each BN's batch mean and variance."""
        y, stats = x, []
        per_conv = len(params) // len(self.convs)
        for k in range(len(self.convs)):
            p = params[per_conv * k: per_conv * (k + 1)]
            if training:
                y, mean, variance = self._bn_relu_conv(y, *p)
                stats += [mean, variance]
            else:
                y, _, _ = self._batch_norm(y, *p[:4], training=False)
                y = ops.conv(ops.relu(y), p[4], strides=1, padding="same")
        return ops.add(x, y), stats

    def call(self, inputs, training=False):
        training = bool(training) and self.trainable
        params = []
        for (gamma, beta, mean, variance), kernel in zip(self.bn_weights, self.kernels):
            bn = [gamma, beta] if training else [gamma, beta, mean, variance]
            params += [ops.cast(w, "float32") for w in bn] + [ops.cast(kernel, self.compute_dtype)]
        x = ops.cast(inputs, self.compute_dtype)

        def unit(x, *p):
            y, stats = self._unit(x, list(p), training)
            return (y, *stats) if training else y

        if self.recompute and training:
            import tensorflow as tf

            unit = tf.recompute_grad(unit)

        def step(x, p):
            out = unit(x, *p)
            return (out[0], list(out[1:])) if training else (out, [])

        x, stats = _scan(step, x, params, self.units, 2 * len(self.convs) if training else 0)
        if training:  # the plain BN layers' update, one stacked assign per variable
            m = self.momentum
            for k, (_, _, moving_mean, moving_var) in enumerate(self.bn_weights):
                moving_mean.assign(moving_mean * m + stats[2 * k] * (1.0 - m))
                moving_var.assign(moving_var * m + stats[2 * k + 1] * (1.0 - m))
        return x

    def compute_output_shape(self, input_shape):
        return input_shape

    def get_config(self) -> dict:
        return {**super().get_config(), "units": self.units,
                "convs": [list(c) for c in self.convs], "momentum": self.momentum,
                "epsilon": self.epsilon, "fused": self.fused, "recompute": self.recompute}


def set_options(model: keras.Model, *, fused: bool | None = None,
                recompute: bool | None = None) -> keras.Model:
    """Sets `fused` / `recompute` on every `ScannedUnits` layer of `model` (before it is
    compiled or first called: the options are read when the loop is traced).

    Example:
    >>> import keras_preact
    >>> m = set_options(keras_preact.build("preact-164", stages="scan", depth=20), recompute=True)
    >>> m.get_layer("stage1_scan").recompute
    True
    """
    for layer in _scanned_layers(model):
        if fused is not None:
            layer.fused = bool(fused)
        if recompute is not None:
            layer.recompute = bool(recompute)
    return model


def _scanned_layers(model: keras.Model) -> list[ScannedUnits]:
    return [layer for layer in model.layers if isinstance(layer, ScannedUnits)]


def is_scanned(model: keras.Model) -> bool:
    """Whether `model` runs any stage as a `ScannedUnits` loop (`build(..., stages="scan")`)."""
    return bool(_scanned_layers(model))


def _spec_of(model: keras.Model) -> ResNetSpec:
    """The spec of a full pre-activation net built by `keras_preact.build` (either form),
    read off its layers; `_convert` then checks the model really is that net."""
    return _spec_from({layer.name for layer in model.layers},
                      lambda name: model.get_layer(name).get_config(),
                      tuple(model.input_shape[1:]), model.name)


def _spec_from(names: set[str], config_of, input_shape: tuple, what: str) -> ResNetSpec:
    """The spec of a net built by `keras_preact.build` (either form) from its layer `names`,
    `config_of(name)` (a layer's config, read only for `stage{s}_scan` and `predictions`) and
    input shape: of a model (`_spec_of`) or of a `.keras` file's config (`load_scanned`).
    Raises ValueError naming `what` for a net not built there; the caller checks the rest."""
    from keras_preact.preprocessing import family_of_layers

    units: dict[int, int] = {}
    for name in names:
        match = UNIT_ADD.match(name) or SCAN_NAME.match(name)
        if match:
            stage = int(match.group(1))
            extra = config_of(name)["units"] if SCAN_NAME.match(name) else 0
            units[stage] = max(units.get(stage, 0), extra + 1 if extra else int(match.group(2)))
    convs = sum(1 for k in (1, 2, 3) if f"stage1_unit001_conv{k}" in names)
    blocks_by_convs = {n: b for b, n in CONVS_PER_UNIT.items()}
    if not units or sorted(units) != list(range(1, len(units) + 1)) or convs not in blocks_by_convs:
        raise ValueError(f"{what!r} is not a network built by keras_preact.build "
                         f"(no stage{{s}}_unit{{uuu}}_* layers). Received: {what!r}")
    fields = {"family": family_of_layers(names), "block": blocks_by_convs[convs],
              "units": tuple(units[s] for s in sorted(units)),
              "input_shape": input_shape, "include_top": "predictions" in names}
    if fields["include_top"]:
        head = config_of("predictions")
        fields["classes"] = head["units"]
        fields["classifier_activation"] = None if head["activation"] == "linear" else head["activation"]
    else:
        fields["pooling"] = "avg" if "avg_pool" in names else "max" if "max_pool" in names else None
    try:
        return ResNetSpec(**fields)
    except ValueError as error:
        raise ValueError(f"{what!r} is not a network built by keras_preact.build: "
                         f"{error}") from None


def to_scanned(model: keras.Model, *, fused: bool = True, recompute: bool = False) -> keras.Model:
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
    return set_options(target, fused=fused, recompute=recompute)


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


def _unit_layers(stage: int, unit: int, n_convs: int) -> list[str]:
    prefix = f"stage{stage}_unit{unit:03d}"
    return [f"{prefix}_{kind}{k}" for k in range(1, n_convs + 1) for kind in ("bn", "relu", "conv")] + [
        f"{prefix}_add"]


def _build(spec: ResNetSpec, name: str, stages: str, dtype_policy) -> keras.Model:
    """`build_from_spec` under `dtype_policy` (that of the net converted or loaded)."""
    from keras_preact.builder import build_from_spec

    previous = keras.config.dtype_policy()
    keras.config.set_dtype_policy(dtype_policy)
    try:
        return build_from_spec(spec, name=name, stages=stages)
    finally:
        keras.config.set_dtype_policy(previous)


def _convert(model: keras.Model, stages: str) -> keras.Model:
    """Rebuilds `model`'s network in form `stages` under its dtype policy and copies every
    weight across; a model that is not exactly that network raises ValueError."""
    spec = _spec_of(model)
    check_scannable(spec)
    target = _build(spec, model.name, stages, model.get_layer("stem_conv").dtype_policy)
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
    for layer in _scanned_layers(scanned):
        stage = int(SCAN_NAME.match(layer.name).group(1))
        for unit in range(2, layer.units + 2):
            expected.update(_unit_layers(stage, unit, len(layer.convs)))
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
        _set_plain_weights(scanned, {layer.name: layer.get_weights() for layer in plain.layers})
    else:
        for name, values in _plain_weights(scanned).items():
            plain.get_layer(name).set_weights(values)


def holds_scanned_weights(path: str) -> bool:
    """Whether the `.weights.h5` file at `path` was saved from a model with scanned stages
    (Keras names its groups after the layer class: `scanned_units`, `scanned_units_1`...)."""
    import h5py

    with h5py.File(path, "r") as f:
        return "layers" in f and any(k.startswith("scanned_units") for k in f["layers"])


def _unit_weights(layer: ScannedUnits):
    """`(plain layer names, stacked weights)` for each BN and conv of `layer`'s units: slice
    `u` of each stacked weight is a weight of the `u`-th named layer, in `get_weights` order
    (BN: gamma, beta, moving mean, moving variance; conv: kernel)."""
    stage = int(SCAN_NAME.match(layer.name).group(1))
    prefix = [f"stage{stage}_unit{u:03d}" for u in range(2, layer.units + 2)]
    for k, (bn, kernel) in enumerate(zip(layer.bn_weights, layer.kernels), start=1):
        yield [f"{p}_bn{k}" for p in prefix], bn
        yield [f"{p}_conv{k}" for p in prefix], [kernel]


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


def _set_plain_weights(scanned: keras.Model, weights) -> None:
    """Sets every weight of `scanned` from those of its plain form, `weights` as
    `_plain_weights` gives them (arrays, or h5py datasets: each is read once its shape is
    checked). Raises KeyError for a missing layer, ValueError naming a layer whose shapes
    differ."""
    for layer in scanned.layers:
        if isinstance(layer, ScannedUnits):
            for names, stacked in _unit_weights(layer):
                per_unit = [_weights_of(weights, name, [v.shape[1:] for v in stacked])
                            for name in names]
                for k, v in enumerate(stacked):
                    v.assign(np.stack([values[k] for values in per_unit]))
        elif not isinstance(layer, keras.layers.InputLayer):
            layer.set_weights(_weights_of(weights, layer.name, [v.shape for v in layer.weights]))


def _weights_of(weights, name: str, shapes: list) -> list[np.ndarray]:
    """`weights[name]` as arrays, once checked to have `shapes`."""
    received = [tuple(v.shape) for v in weights[name]]
    if received != [tuple(shape) for shape in shapes]:
        raise ValueError(f"Layer {name!r} holds weights of shapes {received}; its place in the "
                         f"scanned form needs {[tuple(shape) for shape in shapes]}.")
    return [np.asarray(v) for v in weights[name]]


# A `.keras` archive's weights file (keras/src/saving/saving_lib.py).
KERAS_WEIGHTS_FILE = "model.weights.h5"
UNIT_PREFIX = re.compile(r"stage(\d+)_unit(\d{3})_")
# Saving tags objects that several layers share (the dtype policy) with their `id()` in the
# saving process: not part of the graph. Keys are sorted, so the tag is never first.
SHARED_ID = re.compile(r', "shared_object_id": \d+')


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

    found = _file_spec(config)
    if found is None:
        return None
    spec, layers, dtype_policy = found
    name = config["config"]["name"]
    # Units 2..n of a stage are alike (names aside): 2 units stand for n in the comparison.
    template = _build(dataclasses.replace(spec, units=tuple(min(n, 2) for n in spec.units)),
                      name, "layers", dtype_policy)
    if not _same_graph(config, template, spec.units):
        return None
    with zipfile.ZipFile(path) as archive:
        # Keras stores the weights uncompressed: read into memory (h5py seeks a lot, and
        # seeking back in a zip member rereads it), as much as the file holds on disk.
        if archive.getinfo(KERAS_WEIGHTS_FILE).compress_type != zipfile.ZIP_STORED:
            return None
        weights_file = io.BytesIO(archive.read(KERAS_WEIGHTS_FILE))
    model = _build(spec, name, "scan", dtype_policy)
    with h5py.File(weights_file, "r") as h5:
        try:
            _set_plain_weights(model, _file_weights(h5, config["config"]["layers"]))
        except (KeyError, ValueError):  # weights that do not fit the config: Keras names them
            return None
    return model


def _file_spec(config: dict):
    """`(spec, {layer name: entry}, dtype policy name)` of a scannable net of
    keras_preact.build in a `.keras` config.json, else None."""
    try:  # The file's config may hold anything: whatever does not parse is not our net.
        layers = {entry["name"]: entry for entry in config["config"]["layers"]}
        spec = _spec_from(set(layers), lambda name: layers[name]["config"],
                          tuple(layers["images"]["config"]["batch_shape"][1:]),
                          config["config"]["name"])
        dtype_policy = layers["stem_conv"]["config"]["dtype"]["config"]["name"]
        keras.dtype_policies.get(dtype_policy)
    except (KeyError, TypeError, ValueError, AttributeError):
        return None
    return (spec, layers, dtype_policy) if scannable(spec) else None


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
        wanted.update(name if u is None else UNIT_PREFIX.sub(f"stage{stage}_unit{u:03d}_", name, 1)
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
            name = UNIT_PREFIX.sub(r"stage\1_unit002_", name, 1)
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
