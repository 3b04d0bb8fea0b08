"""Building blocks as plain functions on Keras tensors.

Initialization follows the reference Torch code: conv kernels ~ N(0, sqrt(2 / (k*k*n_out)))
(He, fan-out), no conv bias (a BN or an Add always follows), BN gamma=1 / beta=0 with Torch's
momentum and epsilon.
"""

from __future__ import annotations

from collections.abc import Callable

import keras

from keras_preact.arch.specs import DESIGNS, EXPANSION, ResNetSpec, branch_convs, needs_projection

# Blocks are plain functions from the functional graph's symbolic tensors to new ones.
Tensor = keras.KerasTensor

# Torch's BN: running averages with momentum 0.1 (Keras' 0.9), eps 1e-5.
BN_MOMENTUM = 0.9
BN_EPSILON = 1e-5


# One initializer per layer: a Keras initializer without a seed draws one at construction
# and reuses it, so a shared instance would give every same-shaped kernel the same values.
# Built at layer construction, the seeds follow `keras.utils.set_random_seed`.
def conv_init() -> keras.initializers.Initializer:
    return keras.initializers.VarianceScaling(2.0, "fan_out", "untruncated_normal")


def dense_init() -> keras.initializers.Initializer:
    """Torch nn.Linear's default U(-1/sqrt(fan_in), 1/sqrt(fan_in)); the references zero
    the bias."""
    return keras.initializers.VarianceScaling(1.0 / 3.0, "fan_in", "uniform")


def conv(x: Tensor, filters: int, kernel: int, name: str, strides: int = 1,
         padding: str = "same") -> Tensor:
    """A bias-free conv. `padding="symmetric"` (`specs.PADDINGS`) zero-pads a strided conv by
    (k - 1) // 2 on each side first (layer `{name}_pad`), as PyTorch does."""
    if padding == "symmetric" and strides > 1 and kernel > 1:
        x = keras.layers.ZeroPadding2D((kernel - 1) // 2, name=f"{name}_pad")(x)
    return keras.layers.Conv2D(
        filters,
        kernel,
        strides=strides,
        padding="valid" if padding == "symmetric" and strides > 1 else "same",
        use_bias=False,
        kernel_initializer=conv_init(),
        name=name,
    )(x)


def max_pool(x: Tensor, name: str, padding: str = "same") -> Tensor:
    """3x3/2 max-pool. "symmetric" is PyTorch's MaxPool2d(3, 2, padding=1): a stride-1 SAME
    pool (which pads one on each side, ignoring the padding), then every other row and column
    (layer `{name}_subsample`)."""
    if padding == "symmetric":
        x = keras.layers.MaxPooling2D(3, strides=1, padding="same", name=name)(x)
        return keras.layers.MaxPooling2D(1, strides=2, name=f"{name}_subsample")(x)
    return keras.layers.MaxPooling2D(3, strides=2, padding="same", name=name)(x)


class Namer:
    """Names the layers of one unit `{prefix}_{kind}{k}`, k counting each kind from 1.

    So a full pre-activation basic unit is bn1 relu1 conv1 bn2 relu2 conv2 add, and an
    original one conv1 bn1 relu1 conv2 bn2 add out_relu: stable, hierarchical names.
    """

    def __init__(self, prefix: str):
        self.prefix = prefix
        self.counts: dict[str, int] = {}

    def __call__(self, kind: str) -> str:
        self.counts[kind] = self.counts.get(kind, 0) + 1
        return f"{self.prefix}_{kind}{self.counts[kind]}"


def batch_norm(x, gamma, beta, mean, variance, *, epsilon: float, dtype: str):
    """`keras.layers.BatchNormalization`'s arithmetic as a function of its weights, for the
    scanned loops (`ScannedUnits`): statistics and normalization in float32, the output in
    `dtype`. `mean` and `variance` None: the batch statistics (training). Returns the output
    and the (biased) mean and variance used."""
    x = keras.ops.cast(x, "float32")
    if mean is None:
        mean, variance = keras.ops.moments(x, axes=(0, 1, 2))
    y = keras.ops.batch_normalization(x, mean, variance, axis=-1, offset=beta, scale=gamma,
                                      epsilon=epsilon)
    return keras.ops.cast(y, dtype), mean, variance


def apply_ops(x: Tensor, ops: tuple[str, ...], layer_name: Callable[[str], str]) -> Tensor:
    """Applies "bn" / "relu" in order; `layer_name(kind)` names each layer, e.g. a unit's
    `Namer` or `lambda kind: f"stem_{kind}"`."""
    for op in ops:
        if op == "bn":
            layer = keras.layers.BatchNormalization(
                momentum=BN_MOMENTUM, epsilon=BN_EPSILON, name=layer_name("bn")
            )
        else:
            layer = keras.layers.ReLU(name=layer_name("relu"))
        x = layer(x)
    return x


def residual_branch(x: Tensor, spec: ResNetSpec, width: int, strides: int,
                    namer: Namer) -> Tensor:
    """The convs of F with the design's `mid` ops between them and `end` ops after."""
    design = DESIGNS[spec.unit]
    convs = branch_convs(spec, width, strides)
    for k, (filters, kernel, stride) in enumerate(convs, start=1):
        x = conv(x, filters, kernel, namer("conv"), stride, spec.padding)
        x = apply_ops(x, design["mid"] if k < len(convs) else design["end"], namer)
    return x


def projection(x: Tensor, spec: ResNetSpec, filters: int, strides: int, prefix: str) -> Tensor:
    """1x1 conv shortcut; post-activation designs normalize it like their branch."""
    x = conv(x, filters, 1, f"{prefix}_shortcut_conv", strides, spec.padding)
    if not spec.preact:
        x = apply_ops(x, ("bn",), lambda kind: f"{prefix}_shortcut_{kind}")
    return x


def gate(x: Tensor, spec: ResNetSpec, prefix: str) -> tuple[Tensor, Tensor]:
    """Returns (g, 1 - g) with g = sigmoid(1x1 conv(x) + b_g), one gate per channel."""
    g = keras.layers.Conv2D(
        x.shape[-1],
        1,
        activation="sigmoid",
        kernel_initializer=conv_init(),
        bias_initializer=keras.initializers.Constant(spec.gate_bias),
        name=f"{prefix}_gate",
    )(x)
    return g, keras.layers.Rescaling(-1.0, offset=1.0, name=f"{prefix}_gate_complement")(g)


def residual_unit(x: Tensor, spec: ResNetSpec, width: int, strides: int, prefix: str, *,
                  first: bool, skip_pre: bool = False, raw_identity: bool = False) -> Tensor:
    """One residual unit: `post(shortcut(x) + F(pre(x)))` in the Fig. 4 design of `spec`.

    Args:
        first: first unit of a stage. Its pre-activation is shared by the residual branch
            and the shortcut (resnet-pre-act.lua, preresnet.lua), so the shortcut of a
            dimension-changing unit sees normalized input.
        skip_pre: the input is already activated (ImageNet stem), so no pre-activation.
        raw_identity: an identity shortcut carries `x` itself even in a first unit; only a
            projection shares the pre-activation (timm's ResNetV2, `stem="conv-pool"`).
    """
    design = DESIGNS[spec.unit]
    out_channels = width * EXPANSION[spec.block]
    namer = Namer(prefix)
    pre = x if skip_pre else apply_ops(x, design["pre"], namer)
    project = needs_projection(spec, x.shape[-1], out_channels, strides)
    shortcut = pre if first and (project or not raw_identity) else x
    residual = residual_branch(pre, spec, width, strides, namer)

    if project:
        shortcut = projection(shortcut, spec, out_channels, strides, prefix)
    elif spec.shortcut == "constant-scaling":
        shortcut = keras.layers.Rescaling(spec.shortcut_scale, name=f"{prefix}_shortcut_scale")(
            shortcut
        )
        if spec.residual_scale != 1.0:
            residual = keras.layers.Rescaling(
                spec.residual_scale, name=f"{prefix}_residual_scale"
            )(residual)
    elif spec.shortcut in ("exclusive-gating", "shortcut-only-gating"):
        g, one_minus_g = gate(shortcut, spec, prefix)
        shortcut = keras.layers.Multiply(name=f"{prefix}_shortcut_gated")([one_minus_g, shortcut])
        if spec.shortcut == "exclusive-gating":
            residual = keras.layers.Multiply(name=f"{prefix}_residual_gated")([g, residual])
    elif spec.shortcut == "dropout":
        # The paper's dropout shortcut "imposes a scale of lambda with an expectation of 0.5"
        # (Sec. 3.1): a plain mask. Keras' dropout is inverted (kept values x 1/(1-rate)), so
        # scale back; at inference the shortcut is then scaled by its expectation, 1 - rate.
        shortcut = keras.layers.Dropout(spec.dropout_rate, name=f"{prefix}_shortcut_dropout")(
            shortcut
        )
        shortcut = keras.layers.Rescaling(
            1.0 - spec.dropout_rate, name=f"{prefix}_shortcut_keep_scale"
        )(shortcut)

    x = keras.layers.Add(name=f"{prefix}_add")([shortcut, residual])
    return apply_ops(x, design["post"], lambda kind: f"{prefix}_out_{kind}")
