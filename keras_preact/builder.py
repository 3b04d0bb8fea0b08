"""The one path from a spec to a Keras functional model: stem, stages, head."""

from __future__ import annotations

import sys

import keras

from keras_preact import blocks, scan
from keras_preact.specs import ResNetSpec


def stem(x, spec: ResNetSpec):
    """CIFAR: 3x3 conv (16). ImageNet: 7x7/2 conv (64) - BN - ReLU - 3x3/2 max-pool.

    A CIFAR pre-activation net leaves its stem un-normalized: the first unit's own
    pre-activation does it (resnet-pre-act.lua). Whatever that unit's design lacks of
    BN-ReLU (all of it for post-activation designs) is done here.
    """
    if spec.family == "imagenet":
        x = blocks.conv(x, spec.stem_width, 7, "stem_conv", strides=2)
        x = blocks.apply_ops(x, ("bn", "relu"), lambda kind: f"stem_{kind}")
        return keras.layers.MaxPooling2D(3, strides=2, padding="same", name="stem_pool")(x)
    x = blocks.conv(x, spec.stem_width, 3, "stem_conv")
    missing = tuple(op for op in ("bn", "relu") if op not in blocks.DESIGNS[spec.unit]["pre"])
    return blocks.apply_ops(x, missing, lambda kind: f"stem_{kind}")


def head(x, spec: ResNetSpec):
    """Pre-activation nets end with one more BN-ReLU after the last addition (their units
    leave the sum un-normalized), then global average pooling and the classifier."""
    x = blocks.apply_ops(x, blocks.DESIGNS[spec.unit]["pre"], lambda kind: f"final_{kind}")
    if spec.include_top:
        x = keras.layers.GlobalAveragePooling2D(name="avg_pool")(x)
        return keras.layers.Dense(
            spec.classes,
            activation=spec.classifier_activation,
            kernel_initializer=blocks.DENSE_INIT,
            # Under a mixed precision policy the softmax and the loss stay in float32.
            dtype="float32",
            name="predictions",
        )(x)
    if spec.pooling == "avg":
        return keras.layers.GlobalAveragePooling2D(name="avg_pool")(x)
    if spec.pooling == "max":
        return keras.layers.GlobalMaxPooling2D(name="max_pool")(x)
    return x


def outputs_logits(model: keras.Model) -> bool:
    """Whether `model`'s classifier outputs logits (`classifier_activation` other than
    softmax, e.g. None) rather than probabilities: what losses and serving need to know."""
    activation = getattr(model.layers[-1], "activation", None)
    return getattr(activation, "__name__", "") != "softmax"


def allow_deep_graph(layers: int) -> None:
    """Raises Python's recursion limit enough for a functional graph of `layers` layers.

    Keras builds, clones and loads functional models with a recursive graph walk
    (`keras/src/ops/function.py`, one frame per layer on the longest path); the default
    limit of 1000 stops at resnet-1202. Only ever raised, never lowered.
    """
    needed = 1000 + 2 * layers
    if sys.getrecursionlimit() < needed:
        sys.setrecursionlimit(needed)


def build_from_spec(spec: ResNetSpec, name: str = "resnet", input_tensor=None,
                    stages: str = "layers") -> keras.Model:
    """Builds the functional model described by `spec`.

    Layers are named `stem_*`, `stage{s}_unit{uuu}_*`, `final_*`, `predictions`: stable
    across versions, so weights saved by name keep loading. `stages="scan"` runs the
    identical units 2..n of each stage as one `keras_preact.scan.ScannedUnits` layer
    `stage{s}_scan` (same math and parameters, a graph that does not grow with depth).
    """
    if stages not in scan.STAGES:
        raise ValueError(f"Unknown stages {stages!r}. Valid: {list(scan.STAGES)}.")
    if stages == "scan":
        scan.check_scannable(spec)
    if input_tensor is None:
        inputs = keras.Input(shape=spec.input_shape, name="images")
        x = inputs
    else:
        sources = keras.utils.get_source_inputs(input_tensor)
        inputs = sources[0] if len(sources) == 1 else sources
        x = input_tensor
    x = stem(x, spec)
    for s, (n_units, width) in enumerate(zip(spec.units, spec.widths), start=1):
        for u in range(1, n_units + 1):
            if stages == "scan" and u == 2:
                x = scan.scanned_units(x, spec, width, n_units - 1, name=f"stage{s}_scan")
                break
            x = blocks.residual_unit(
                x,
                spec,
                width,
                strides=2 if (u == 1 and s > 1) else 1,
                prefix=f"stage{s}_unit{u:03d}",
                first=u == 1,
                # The ImageNet stem ends in BN-ReLU-pool: nothing left to pre-activate.
                skip_pre=spec.family == "imagenet" and s == 1 and u == 1,
            )
    # Up to ~5 layers per conv (conv, BN, ReLU, Add and the unit's output ops).
    allow_deep_graph(5 * spec.depth)
    return keras.Model(inputs, head(x, spec), name=name)
