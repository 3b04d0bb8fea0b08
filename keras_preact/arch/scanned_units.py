"""`ScannedUnits`: a stage's identical residual units run as one loop over stacked weights.

A full pre-activation unit with an identity shortcut is `x + F(x)` with
`F = conv_K(relu(bn_K(... conv_1(relu(bn_1(x))))))`; every unit of a stage after the first
has the same shapes. `ScannedUnits` holds the weights of those `n` units stacked on a
leading axis and runs them with one loop, so the traced graph (and the time TensorFlow or
XLA spends optimizing it before the first step) no longer grows with depth: a
`tf.while_loop` on the TensorFlow backend, a `jax.lax.scan` on JAX
(`keras_preact.arch.jax_units`); the torch backend builds only stages='layers'. The math
is the plain layer graph's: same convs, same BatchNormalization (batch statistics in
training, the same moving statistics update `m = 0.9 m + 0.1 batch`, epsilon 1e-5), same
initializers, same parameter count, the same variables on both backends (a weights file
of one loads into the other); only the summation order differs.

`fused=True` (default) computes each BN with one `FusedBatchNormV3` op instead of Keras'
moments + normalize ops. In training, each BN-ReLU-conv keeps only its input for the
backward pass and recomputes the cheap BN + ReLU there (`recompute_bn=False` keeps their
output instead, the trainer's choice in mixed precision); `recompute=True` keeps only each
unit's input and recomputes the whole unit (memory mode). What each costs and saves is
measured in benchmarks/README.md. On JAX, BN is Keras' ops (XLA fuses them: `fused` picks
no op there) and `jax.checkpoint` keeps what the same options keep.

`keras_preact.arch.graph` builds these layers (`stages="scan"`); `keras_preact.arch.scan` converts
models between the two forms, and `keras_preact.weights` reads files into either.

Example:
>>> import keras_preact
>>> fast = keras_preact.build("preact-164", stages="scan", depth=20)
>>> [layer.units for layer in fast.layers if isinstance(layer, ScannedUnits)]
[1, 1, 1]
"""

from __future__ import annotations

import keras
from keras import ops

# TensorFlow (and JAX, in jax_units) is imported where it is used: keras_preact (hence this
# module) imports on every Keras backend.
from keras_preact.arch import blocks
from keras_preact.arch.blocks import BN_EPSILON, BN_MOMENTUM
from keras_preact.arch.specs import ResNetSpec


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


def scanned_units(x: blocks.Tensor, spec: ResNetSpec, width: int, units: int,
                  name: str) -> blocks.Tensor:
    """Applies `units` identical stride-1 units of `spec` (stage width `width`) to `x`."""
    check_scannable(spec)
    convs = [(f, k) for f, k, _ in blocks.branch_convs(spec, width, 1)]
    return ScannedUnits(units, convs, name=name)(x)


def _stacked_init(make_initializer, units: int):
    """An initializer for `(units, *shape)` that draws each unit's slice as the plain
    layer's `make_initializer()` draws `shape`: fans per unit, a fresh seed per unit."""
    initializers = [make_initializer() for _ in range(units)]

    def init(shape, dtype=None):
        return ops.stack([initializer(shape[1:], dtype=dtype) for initializer in initializers])

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


_CONV = {"strides": [1, 1, 1, 1], "padding": "SAME"}  # every conv in the loop: stride 1


def _conv(a, kernel):
    import tensorflow as tf

    return tf.nn.conv2d(a, kernel, **_CONV)


def _conv_grads(a, kernel, dy):
    """The gradients of `_conv(a, kernel)` w.r.t. `a` and `kernel`, given `dy`."""
    import tensorflow as tf

    da = tf.raw_ops.Conv2DBackpropInput(
        input_sizes=tf.shape(a), filter=kernel, out_backprop=dy, **_CONV)
    dkernel = tf.raw_ops.Conv2DBackpropFilter(
        input=a, filter_sizes=tf.shape(kernel), out_backprop=dy, **_CONV)
    return da, dkernel


def _biased(variance, x):
    """The fused BN op's batch variance (unbiased) as Keras' moving average uses it (biased)."""
    import tensorflow as tf

    n = tf.cast(tf.reduce_prod(tf.shape(x)[:-1]), tf.float32)
    return variance * ((n - 1.0) / n)


@keras.saving.register_keras_serializable(package="keras_preact")
class ScannedUnits(keras.layers.Layer):
    """`units` identical full pre-activation units `x + F(x)`, run by one loop.

    Args:
        units: how many units this loop runs (an int: a spec's `units` counts per stage).
        convs: `(filters, kernel)` of the branch's convs in order, e.g. bottleneck width 16:
            `[(16, 1), (16, 3), (64, 1)]`. The input must have `convs[-1][0]` channels.
        momentum, epsilon: the BatchNormalization settings of the plain layers.
        fused: compute BN with `FusedBatchNormV3` (one op forward, one backward) rather
            than Keras' moments + normalize ops. Same statistics and update. TensorFlow
            only: JAX always runs Keras' ops.
        recompute: keep only each unit's input for the backward pass and recompute the
            unit (`tf.recompute_grad`; on JAX `jax.checkpoint`): less memory for more time
            (benchmarks/README.md).
        recompute_bn: with `fused` (on JAX: always), recompute each BN + ReLU in the
            backward pass from the BN's input rather than keep its output (less memory,
            more time).

    Weights are `bn{k}_gamma`, `bn{k}_beta`, `bn{k}_moving_mean`, `bn{k}_moving_variance`
    of shape `(units, channels)` and `conv{k}_kernel` of shape `(units, k, k, in, out)`:
    slice `u` holds the weights of the plain graph's unit `u + 2` of the stage.
    """

    def __init__(self, units: int, convs, momentum: float = BN_MOMENTUM,
                 epsilon: float = BN_EPSILON, fused: bool = True, recompute: bool = False,
                 recompute_bn: bool = True, **kwargs):
        super().__init__(autocast=False, **kwargs)  # casts are explicit in `call`
        if keras.backend.backend() not in ("tensorflow", "jax"):
            raise ValueError("Scanned stages run on the TensorFlow and JAX backends. Received: "
                             f"backend {keras.backend.backend()!r} (use stages='layers').")
        if not (isinstance(units, int) and units >= 1):
            raise ValueError(f"`units` must be a positive integer. Received: units={units!r}")
        self.units = units
        self.convs = [(int(f), int(k)) for f, k in convs]
        self.momentum = float(momentum)
        self.epsilon = float(epsilon)
        self.fused = bool(fused)
        self.recompute = bool(recompute)
        self.recompute_bn = bool(recompute_bn)

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
            # float32 when read under mixed precision, as Keras' BN weights are.
            bn = [self.add_weight((n, c_in), init, name=f"bn{k}_{what}", trainable=trainable,
                                  autocast=False)
                  for what, init, trainable in (("gamma", ones, True), ("beta", zeros, True),
                                                ("moving_mean", zeros, False),
                                                ("moving_variance", ones, False))]
            self.bn_weights.append(bn)
            self.kernels.append(self.add_weight(
                (n, kernel, kernel, c_in, filters), _stacked_init(blocks.conv_init, n),
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
                variance = _biased(variance, x)
            else:
                y, _, _ = tf.compat.v1.nn.fused_batch_norm(
                    x, gamma, beta, mean, variance, epsilon=self.epsilon, is_training=False)
            return ops.cast(y, self.compute_dtype), mean, variance
        return blocks.batch_norm(x, gamma, beta, mean, variance, epsilon=self.epsilon,
                                 dtype=self.compute_dtype)

    def _bn_relu_conv(self, x, gamma, beta, kernel):
        """`conv(relu(bn(x)))` in training, with a hand-written backward pass that runs the
        conv's two gradient ops directly (the conv is never recomputed). Returns the conv
        output and the batch (mean, variance).

        `recompute_bn` (default): the backward pass keeps only `x` and recomputes the cheap
        BN + ReLU from it; autodiff would keep `x` and `relu(bn(x))`. Otherwise (fused BN
        only) it keeps both, as autodiff does, and feeds them straight to `ReluGrad` and the
        fused BN gradient: no recomputation, one more stored activation per conv. Same
        gradients either way; what each costs is in benchmarks/README.md."""
        if self.fused and not self.recompute_bn:
            return self._kept_bn_relu_conv(x, gamma, beta, kernel)
        return self._recomputed_bn_relu_conv(x, gamma, beta, kernel)

    def _recomputed_bn_relu_conv(self, x, gamma, beta, kernel):
        import tensorflow as tf

        def bn_relu(x, gamma, beta):
            y, mean, variance = self._batch_norm(x, gamma, beta, None, None, training=True)
            return ops.relu(y), mean, variance

        @tf.custom_gradient
        def forward(x, gamma, beta, kernel):
            a, mean, variance = bn_relu(x, gamma, beta)

            def grad(dy, *_):  # the statistics only feed the moving averages
                # Recompute from identities of the saved tensors: taping the loop's saved
                # tensors themselves made the backward loop slower (benchmarks/README.md).
                inputs = [tf.identity(t) for t in (x, gamma, beta)]
                with tf.GradientTape() as tape:
                    tape.watch(inputs)
                    a, _, _ = bn_relu(*inputs)
                da, dkernel = _conv_grads(a, kernel, dy)
                return (*tape.gradient(a, inputs, output_gradients=da), dkernel)

            return (_conv(a, kernel), mean, variance), grad

        return forward(x, gamma, beta, kernel)

    def _kept_bn_relu_conv(self, x, gamma, beta, kernel):
        import tensorflow as tf

        @tf.custom_gradient
        def forward(x, gamma, beta, kernel):
            empty = tf.constant([], tf.float32)
            y, mean, variance, *reserve = tf.raw_ops.FusedBatchNormV3(
                x=x, scale=gamma, offset=beta, mean=empty, variance=empty,
                epsilon=self.epsilon, is_training=True)
            a = tf.nn.relu(y)

            def grad(dy, *_):  # the statistics only feed the moving averages
                da, dkernel = _conv_grads(a, kernel, dy)
                # ReluGrad on the output: a > 0 exactly where bn(x) > 0.
                dx, dgamma, dbeta, _, _ = tf.raw_ops.FusedBatchNormGradV3(
                    y_backprop=tf.raw_ops.ReluGrad(gradients=da, features=a), x=x,
                    scale=gamma, reserve_space_1=reserve[0], reserve_space_2=reserve[1],
                    reserve_space_3=reserve[2], epsilon=self.epsilon, is_training=True)
                return dx, dgamma, dbeta, dkernel

            return (_conv(a, kernel), mean, _biased(variance, x)), grad

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
                y = _conv(ops.relu(y), p[4])
        return ops.add(x, y), stats

    def call(self, inputs, training=False):
        training = bool(training) and self.trainable
        params = []
        for (gamma, beta, mean, variance), kernel in zip(self.bn_weights, self.kernels):
            bn = [gamma, beta] if training else [gamma, beta, mean, variance]
            params += [ops.cast(w, "float32") for w in bn] + [ops.cast(kernel, self.compute_dtype)]
        x = ops.cast(inputs, self.compute_dtype)
        if keras.backend.backend() == "jax":
            from keras_preact.arch import jax_units

            x, stats = jax_units.scan_units(
                x, params, convs=len(self.convs), training=training, epsilon=self.epsilon,
                dtype=self.compute_dtype,
                saved=jax_units.saved_names(self.recompute, self.recompute_bn))
        else:
            x, stats = self._tf_scan(x, params, training)
        if training:  # the plain BN layers' update, one stacked assign per variable
            m = self.momentum
            for k, (_, _, moving_mean, moving_var) in enumerate(self.bn_weights):
                moving_mean.assign(moving_mean * m + stats[2 * k] * (1.0 - m))
                moving_var.assign(moving_var * m + stats[2 * k + 1] * (1.0 - m))
        return x

    def _tf_scan(self, x, params: list, training: bool):
        """The units on one tf.while_loop (`_scan`): the last output and, in training, each
        BN's batch mean and variance stacked over the units."""
        def unit(x, *p):
            y, stats = self._unit(x, list(p), training)
            return (y, *stats) if training else y

        if self.recompute and training:
            import tensorflow as tf

            unit = tf.recompute_grad(unit)

        def step(x, p):
            out = unit(x, *p)
            return (out[0], list(out[1:])) if training else (out, [])

        return _scan(step, x, params, self.units, 2 * len(self.convs) if training else 0)

    def compute_output_shape(self, input_shape):
        return input_shape

    def get_config(self) -> dict:
        return {**super().get_config(), "units": self.units,
                "convs": [list(c) for c in self.convs], "momentum": self.momentum,
                "epsilon": self.epsilon, "fused": self.fused, "recompute": self.recompute,
                "recompute_bn": self.recompute_bn}


def set_options(model: keras.Model, *, fused: bool | None = None,
                recompute: bool | None = None, recompute_bn: bool | None = None) -> keras.Model:
    """Sets `fused` / `recompute` / `recompute_bn` on every `ScannedUnits` layer of `model`
    (before it is compiled or first called: the options are read when the loop is traced).

    Example:
    >>> import keras_preact
    >>> m = set_options(keras_preact.build("preact-164", stages="scan", depth=20), recompute=True)
    >>> m.get_layer("stage1_scan").recompute
    True
    """
    for layer in scanned_layers(model):
        if fused is not None:
            layer.fused = bool(fused)
        if recompute is not None:
            layer.recompute = bool(recompute)
        if recompute_bn is not None:
            layer.recompute_bn = bool(recompute_bn)
    return model


def scanned_layers(model: keras.Model) -> list[ScannedUnits]:
    return [layer for layer in model.layers if isinstance(layer, ScannedUnits)]


def is_scanned(model: keras.Model) -> bool:
    """Whether `model` runs any stage as a `ScannedUnits` loop (`build(..., stages="scan")`)."""
    return bool(scanned_layers(model))
