"""Architecture as data: one frozen `ResNetSpec` per registered model name.

A spec says *what* a network is (family, block, units per stage, unit design, shortcut);
`keras_preact.arch.blocks` says *how* each piece is built. `build(name, **overrides)` is
`build_from_spec(resolve(name, **overrides))` (`keras_preact.api.build_network`), and nothing
else builds a model.
"""

from __future__ import annotations

import dataclasses
import difflib
import fnmatch
import math
import numbers
from typing import NamedTuple

from keras_preact.preprocessing import RGB

# Fig. 4 (a)-(e): where BN and ReLU sit in a residual unit.
UNITS = ("original", "bn-after-add", "relu-before-add", "relu-only-preact", "full-preact")
# Fig. 2 / Table 1: what the shortcut does on units that keep their dimensions.
SHORTCUTS = (
    "identity",
    "constant-scaling",
    "exclusive-gating",
    "shortcut-only-gating",
    "conv1x1",
    "dropout",
)
# basic: two 3x3 convs; bottleneck: 1x1-3x3-1x1 (4x wider output); single: one 3x3 conv
# (Table 3's "1-layer skip").
BLOCKS = ("basic", "bottleneck", "single")
CONVS_PER_UNIT = {"basic": 2, "bottleneck": 3, "single": 1}
EXPANSION = {"basic": 1, "bottleneck": 4, "single": 1}
FAMILIES = ("cifar", "imagenet")
# The stem: "paper" is the family's own (CIFAR: a 3x3 conv; ImageNet: fb.resnet.torch's 7x7/2
# conv-BN-ReLU-3x3/2 max-pool, after which the first unit skips its pre-activation).
# "conv-pool" (ImageNet only) is timm's ResNetV2 stem, 7x7/2 conv - max-pool with no BN-ReLU:
# the first unit pre-activates the pooled output itself.
STEMS = ("paper", "conv-pool")
# Zero padding of strided convs and the stem's max-pool. "same": TensorFlow's SAME, which
# pads a stride-2 layer on an even size one more at the bottom/right than at the top/left;
# "symmetric": PyTorch's (and Torch's) fixed (k - 1) / 2 on each side, what timm computes.
# Stride-1 layers pad alike either way.
PADDINGS = ("same", "symmetric")
POOLINGS = (None, "avg", "max")
# The forms a network is built in (`build(stages=...)`): the plain layer graph, or each
# stage's identical units as one loop (`keras_preact.arch.scanned_units`).
STAGES = ("layers", "scan")
# The fields that change what a network's head outputs (pooled features, logits) or where its
# input is normalized, not the network that was trained: published weights and the paper's
# figures hold whatever they are (`weights.records`, `paper`; each adds its own extras).
HEAD_FIELDS = ("include_top", "pooling", "classifier_activation", "include_preprocessing")

# Fig. 4: the ops before the first conv (`pre`), between convs (`mid`), at the end of the
# residual branch (`end`) and after the addition (`post`).
DESIGNS = {
    "original": {"pre": (), "mid": ("bn", "relu"), "end": ("bn",), "post": ("relu",)},
    "bn-after-add": {"pre": (), "mid": ("bn", "relu"), "end": (), "post": ("bn", "relu")},
    "relu-before-add": {"pre": (), "mid": ("bn", "relu"), "end": ("bn", "relu"), "post": ()},
    "relu-only-preact": {"pre": ("relu",), "mid": ("bn", "relu"), "end": ("bn",), "post": ()},
    "full-preact": {"pre": ("bn", "relu"), "mid": ("bn", "relu"), "end": (), "post": ()},
}


# ImageNet stage layouts of fb.resnet.torch (preresnet.lua), keyed by (block, depth).
IMAGENET_UNITS = {
    ("basic", 18): (2, 2, 2, 2),
    ("basic", 34): (3, 4, 6, 3),
    ("bottleneck", 50): (3, 4, 6, 3),
    ("bottleneck", 101): (3, 4, 23, 3),
    ("bottleneck", 152): (3, 8, 36, 3),
    ("bottleneck", 200): (3, 24, 36, 3),
}


@dataclasses.dataclass(frozen=True)
class ResNetSpec:
    """Everything that defines one network. Fields double as `build()` overrides.

    `depth` is accepted as an override too and converted to `units` (see `resolve`).
    """

    family: str  # "cifar": 3x3 stem, 3 stages; "imagenet": 7x7/2 stem + max-pool, 4 stages.
    block: str
    units: tuple[int, ...]  # residual units per stage
    unit: str = "full-preact"
    shortcut: str = "identity"
    shortcut_scale: float = 0.5  # constant-scaling: lambda on the shortcut
    residual_scale: float = 1.0  # constant-scaling: factor on F (Table 1: 1 or 0.5)
    gate_bias: float = 0.0  # gating: initial bias b_g of the 1x1 gate conv
    dropout_rate: float = 0.5  # dropout shortcut
    classes: int = 10
    input_shape: tuple[int | None, int | None, int] = (32, 32, 3)
    include_top: bool = True
    pooling: str | None = None  # only used when include_top=False (Keras Applications)
    classifier_activation: str | None = "softmax"
    # True: the model takes raw RGB pixels in [0, 255] and normalizes them itself, first
    # (a `Rescaling` layer with the statistics its weights were trained with).
    include_preprocessing: bool = False
    stem: str = "paper"
    padding: str = "same"

    def __post_init__(self):
        # Every field is checked here, whatever made the spec (build, the constructors,
        # `--override` JSON): a wrong type is a clear ValueError, never a later TypeError.
        _check_choice("family", self.family, FAMILIES)
        _check_choice("block", self.block, BLOCKS)
        _check_choice("unit", self.unit, UNITS)
        _check_choice("shortcut", self.shortcut, SHORTCUTS)
        _check_choice("pooling", self.pooling, POOLINGS)
        _check_choice("stem", self.stem, STEMS)
        _check_choice("padding", self.padding, PADDINGS)
        if self.stem != "paper" and self.family != "imagenet":
            raise ValueError(f"stem={self.stem!r} is an ImageNet stem; the {self.family} family "
                             "has only stem='paper'.")
        stages = 3 if self.family == "cifar" else 4
        units = self.units
        if not (_is_sequence(units) and len(units) == stages and all(map(is_positive_int, units))):
            raise ValueError(
                f"`units` must be {stages} positive integers for the {self.family} "
                f"family. Received: units={units!r}"
            )
        self._set("units", tuple(int(n) for n in units))
        for field, low, high in NUMBERS:
            self._set(field, _number(field, getattr(self, field), low, high))
        if not is_positive_int(self.classes):
            raise ValueError(
                f"`classes` must be a positive integer. Received: classes={self.classes!r}"
            )
        self._set("classes", int(self.classes))
        shape = self.input_shape
        if not (_is_sequence(shape) and len(shape) == 3 and is_positive_int(shape[2])
                and all(d is None or is_positive_int(d) for d in shape[:2])):
            raise ValueError(
                "`input_shape` must be (height, width, channels), channels last: positive "
                f"integers, height and width may be None. Received: input_shape={shape!r}"
            )
        self._set("input_shape", tuple(None if d is None else int(d) for d in shape))
        for switch in ("include_top", "include_preprocessing"):
            if not isinstance(getattr(self, switch), bool):
                raise ValueError(f"`{switch}` must be True or False. "
                                 f"Received: {switch}={getattr(self, switch)!r}")
        if self.include_preprocessing and self.input_shape[2] != RGB:
            raise ValueError(
                "`include_preprocessing` normalizes RGB images with per-channel statistics: "
                "`input_shape` must have 3 channels (normalize other images yourself, e.g. "
                f"with keras.layers.Normalization). Received: input_shape={self.input_shape}"
            )
        if not (self.classifier_activation is None or _is_activation(self.classifier_activation)):
            raise ValueError(
                "`classifier_activation` must be None or the name of a Keras activation, e.g. "
                f"'softmax'. Received: classifier_activation={self.classifier_activation!r}"
            )

    def _set(self, field: str, value) -> None:
        """Stores the normalized form of a checked field (numpy scalars become int/float)."""
        object.__setattr__(self, field, value)

    @property
    def depth(self) -> int:
        """Weighted layers: convs in the units, plus the stem conv and the classifier."""
        return CONVS_PER_UNIT[self.block] * sum(self.units) + 2

    @property
    def stem_width(self) -> int:
        return 16 if self.family == "cifar" else 64

    @property
    def stem_kernel(self) -> int:
        return 7 if self.family == "imagenet" else 3

    @property
    def widths(self) -> tuple[int, ...]:
        """Bottleneck (inner) width of each stage; a unit outputs `width * EXPANSION`."""
        return (16, 32, 64) if self.family == "cifar" else (64, 128, 256, 512)

    @property
    def preact(self) -> bool:
        """Whether units normalize their *input* (Fig. 4 d, e) rather than their output."""
        return self.unit in ("relu-only-preact", "full-preact")


def branch_convs(spec: ResNetSpec, width: int, strides: int) -> list[tuple[int, int, int]]:
    """(filters, kernel, strides) of the residual branch. Stride sits on the 3x3 conv, as in
    fb.resnet.torch and timm (resnet-1k-layers strides the first 1x1: same parameters)."""
    if spec.block == "bottleneck":
        return [(width, 1, 1), (width, 3, strides), (width * EXPANSION["bottleneck"], 1, 1)]
    if spec.block == "basic":
        return [(width, 3, strides), (width, 3, 1)]
    return [(width, 3, strides)]


def needs_projection(spec: ResNetSpec, in_channels: int, out_channels: int, strides: int) -> bool:
    """Whether a unit's shortcut is a 1x1 conv: it changes the shape, or the design asks."""
    return strides != 1 or in_channels != out_channels or spec.shortcut == "conv1x1"


def stem_ops(spec: ResNetSpec) -> tuple[str, ...]:
    """The BN / ReLU after the stem conv: the ImageNet paper stem's BN-ReLU, none for timm's
    conv-pool stem, and on CIFAR whatever the first unit's design lacks of BN-ReLU."""
    if spec.family == "imagenet":
        return ("bn", "relu") if spec.stem == "paper" else ()
    return tuple(op for op in ("bn", "relu") if op not in DESIGNS[spec.unit]["pre"])


class ParamCounts(NamedTuple):
    """A model's parameter counts, as `model.count_params()` splits them."""

    trainable: int
    non_trainable: int  # BN moving means and variances


def param_counts(spec: ResNetSpec) -> ParamCounts:
    """The parameters of `build_from_spec(spec)`, counted from the spec, no model built.

    Example:
    >>> param_counts(get_spec("preact-164"))
    ParamCounts(trainable=1703258, non_trainable=24224)
    """
    design = DESIGNS[spec.unit]
    weights = spec.stem_kernel ** 2 * spec.input_shape[2] * spec.stem_width
    bn = spec.stem_width * ("bn" in stem_ops(spec))  # channels normalized by a BN
    channels = spec.stem_width
    for s, (n_units, width) in enumerate(zip(spec.units, spec.widths)):
        out = width * EXPANSION[spec.block]
        # The first unit of a stage (maybe strided and projected), then n - 1 identical ones.
        for u, repeats in ((0, 1), (1, n_units - 1)):
            strides = 2 if (u == 0 and s > 0) else 1
            skip_pre = spec.family == "imagenet" and spec.stem == "paper" and s == u == 0
            w = 0
            b = channels * ("bn" in design["pre"] and not skip_pre)
            c = channels
            convs = branch_convs(spec, width, strides)
            for k, (filters, size, _) in enumerate(convs, start=1):
                w += size * size * c * filters
                b += filters * ("bn" in design["mid" if k < len(convs) else "end"])
                c = filters
            if needs_projection(spec, channels, out, strides):
                w += channels * out
                b += out * (not spec.preact)
            elif spec.shortcut in ("exclusive-gating", "shortcut-only-gating"):
                w += channels * channels + channels  # the gate's 1x1 conv and bias
            b += out * ("bn" in design["post"])
            weights += repeats * w
            bn += repeats * b
            channels = out
    bn += channels * ("bn" in design["pre"])  # the head's final BN
    if spec.include_top:
        weights += channels * spec.classes + spec.classes
    return ParamCounts(weights + 2 * bn, 2 * bn)  # BN: gamma, beta; moving mean, variance


# Numeric fields and their valid range [low, high).
NUMBERS = (
    ("shortcut_scale", -math.inf, math.inf),
    ("residual_scale", -math.inf, math.inf),
    ("gate_bias", -math.inf, math.inf),
    ("dropout_rate", 0.0, 1.0),
)


def _is_sequence(value) -> bool:
    return isinstance(value, (tuple, list))


def is_positive_int(value) -> bool:
    """A positive integer, numpy's included; True is not one (bool is an int in Python)."""
    return isinstance(value, numbers.Integral) and not isinstance(value, bool) and value >= 1


def _number(field: str, value, low: float, high: float) -> float:
    """`value` as a float if it is a finite real number in [low, high), else ValueError."""
    if (isinstance(value, numbers.Real) and not isinstance(value, bool) and math.isfinite(value)
            and low <= value < high):
        return float(value)
    valid = "a finite number" if math.isinf(low) else f"a number in [{low:g}, {high:g})"
    raise ValueError(f"`{field}` must be {valid}. Received: {field}={value!r}")


def _is_activation(name) -> bool:
    """Whether `name` is a string naming a Keras activation ("softmax", "sigmoid", ...)."""
    if name in ("softmax", "sigmoid", "linear"):  # the common heads, without importing Keras
        return True
    import keras

    try:
        return isinstance(name, str) and callable(keras.activations.get(name))
    except ValueError:
        return False


def _check_choice(field: str, value, valid: tuple) -> None:
    if value not in valid:
        raise ValueError(f"Unknown {field} {value!r}. Valid {field}s: {list(valid)}.")


def units_for_depth(family: str, block: str, depth: int) -> tuple[int, ...]:
    """Stage layout for a depth: 6n+2 (basic), 9n+2 (bottleneck), 3n+2 (single) on CIFAR."""
    _check_choice("family", family, FAMILIES)
    _check_choice("block", block, BLOCKS)
    if family == "imagenet":
        valid = sorted(d for b, d in IMAGENET_UNITS if b == block)
        if (block, depth) not in IMAGENET_UNITS:
            raise ValueError(
                f"No ImageNet layout for depth={depth!r} with {block!r} units. Valid "
                f"depths: {valid} (or pass units=(a, b, c, d) for a custom layout)."
            )
        return IMAGENET_UNITS[(block, depth)]
    step = 3 * CONVS_PER_UNIT[block]
    if not is_positive_int(depth) or depth < step + 2 or (depth - 2) % step:
        raise ValueError(
            f"CIFAR nets with {block!r} units have depth {step}n+2 (n >= 1), e.g. "
            f"{[step * n + 2 for n in (1, 3, 18)]}. Received: depth={depth!r}"
        )
    return ((int(depth) - 2) // step,) * 3


def resolve(name: str, **overrides) -> ResNetSpec:
    """The spec of a registered name with `overrides` applied and validated.

    `depth=` (or a new `block=` alone, which keeps the depth) is turned into `units`.

    Example:
    >>> spec = resolve("preact-164", depth=1001)
    >>> spec.units, spec.block
    ((111, 111, 111), 'bottleneck')
    >>> resolve("preact-164", widht=2)
    Traceback (most recent call last):
    ...
    ValueError: Unknown override(s) ['widht'] for 'preact-164'. Valid: [...].
    """
    spec = get_spec(name)
    fields = {f.name for f in dataclasses.fields(ResNetSpec)} | {"depth"}
    unknown = sorted(set(overrides) - fields)
    if unknown:
        raise ValueError(f"Unknown override(s) {unknown} for {name!r}. Valid: {sorted(fields)}.")
    if "units" in overrides and "depth" in overrides:
        raise ValueError("Pass `depth` or `units`, not both.")
    if "units" not in overrides and ("depth" in overrides or "block" in overrides):
        block = overrides.get("block", spec.block)
        depth = overrides.pop("depth", spec.depth)
        overrides["units"] = units_for_depth(spec.family, block, depth)
    return dataclasses.replace(spec, **overrides)


_REGISTRY: dict[str, ResNetSpec] = {}


def register(name: str, spec: ResNetSpec) -> None:
    """Registers `spec` under `name`, once (`keras_preact.arch.registry` registers every
    network)."""
    if name in _REGISTRY:
        raise ValueError(f"Model {name!r} is already registered.")
    _REGISTRY[name] = spec


def get_spec(name: str) -> ResNetSpec:
    """The registered spec of `name`; a ValueError suggests the closest names.

    Example:
    >>> get_spec("preact-1001").units
    (111, 111, 111)
    >>> get_spec("preact-1010")
    Traceback (most recent call last):
    ...
    ValueError: Unknown model name 'preact-1010'. Did you mean ['preact-110', 'preact-1001'...
    """
    if name not in _REGISTRY:
        close = difflib.get_close_matches(str(name), list(_REGISTRY), n=3, cutoff=0.5)
        hint = f" Did you mean {close}?" if close else ""
        raise ValueError(
            f"Unknown model name {name!r}.{hint} See keras_preact.list_models() "
            f"for all {len(_REGISTRY)} names."
        )
    return _REGISTRY[name]


def registered(pattern: str = "*") -> list[str]:
    """Registered names matching an fnmatch `pattern`, sorted by family, depth, then name
    (`keras_preact.list_models` adds the published-weights filter).

    Example:
    >>> registered("preact-1??")
    ['preact-110', 'preact-164']
    """
    names = fnmatch.filter(_REGISTRY, pattern)
    return sorted(names, key=lambda n: (_REGISTRY[n].family, _REGISTRY[n].depth, n))
