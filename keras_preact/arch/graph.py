"""The one path from a spec to a Keras functional graph: stem, stages, head
(`keras_preact.arch.network.ResNet` is the model made of it)."""

from __future__ import annotations

import contextlib
import gc
import sys
from collections.abc import Iterator

import keras

from keras_preact.arch import blocks
from keras_preact.arch.introspect import FINAL_PREFIX, scan_layer, stage_of, unit_prefix
from keras_preact.arch.scanned_units import check_scannable, scanned_units
from keras_preact.arch.specs import STAGES, ResNetSpec, stem_ops
from keras_preact.preprocessing import default_preprocessing, scale_and_offset

# The most layers per weighted layer of any unit design: a one-conv unit with a gated shortcut
# (BN, ReLU, conv, gate, its complement, two products, add). Stem, final BN-ReLU and head fit
# in the two weighted layers `depth` counts beyond the units.
LAYERS_PER_CONV = 8
# The name of the normalization layer first in a network with `include_preprocessing=True`.
PREPROCESSING = "preprocessing"


def stem(x: blocks.Tensor, spec: ResNetSpec) -> blocks.Tensor:
    """CIFAR: 3x3 conv (16). ImageNet: 7x7/2 conv (64) - BN - ReLU - 3x3/2 max-pool, or with
    `stem="conv-pool"` (timm's ResNetV2) no BN-ReLU: the first unit pre-activates itself.

    A CIFAR pre-activation net leaves its stem un-normalized: the first unit's own
    pre-activation does it (resnet-pre-act.lua). Whatever that unit's design lacks of
    BN-ReLU (all of it for post-activation designs) is done here.
    """
    if spec.family == "imagenet":
        x = blocks.conv(x, spec.stem_width, spec.stem_kernel, "stem_conv", strides=2,
                        padding=spec.padding)
        x = blocks.apply_ops(x, stem_ops(spec), lambda kind: f"stem_{kind}")
        return blocks.max_pool(x, "stem_pool", spec.padding)
    x = blocks.conv(x, spec.stem_width, spec.stem_kernel, "stem_conv")
    return blocks.apply_ops(x, stem_ops(spec), lambda kind: f"stem_{kind}")


# The classifier layer's name: what a fine-tune to other classes initializes anew
# (`keras_preact.training.start.load_start`).
CLASSIFIER = "predictions"


def head(x: blocks.Tensor, spec: ResNetSpec) -> blocks.Tensor:
    """Pre-activation nets end with one more BN-ReLU after the last addition (their units
    leave the sum un-normalized), then global average pooling and the classifier."""
    x = blocks.apply_ops(x, blocks.DESIGNS[spec.unit]["pre"], lambda kind: FINAL_PREFIX + kind)
    if spec.include_top:
        x = keras.layers.GlobalAveragePooling2D(name="avg_pool")(x)
        return keras.layers.Dense(
            spec.classes,
            activation=spec.classifier_activation,
            kernel_initializer=blocks.dense_init(),
            # Under a mixed precision policy the softmax and the loss stay in float32.
            dtype="float32",
            name=CLASSIFIER,
        )(x)
    if spec.pooling == "avg":
        return keras.layers.GlobalAveragePooling2D(name="avg_pool")(x)
    if spec.pooling == "max":
        return keras.layers.GlobalMaxPooling2D(name="max_pool")(x)
    return x


def layer_bound(spec: ResNetSpec) -> int:
    """An upper bound on the layers of `spec`'s model (`len(model.layers)`).

    Example:
    >>> from keras_preact.arch.specs import get_spec
    >>> layer_bound(get_spec("resnet-1202"))
    9616
    """
    return LAYERS_PER_CONV * spec.depth


def stage_outputs(model: keras.Model) -> dict:
    """`{"stage1": tensor, ..., "stageN": tensor}`: each stage's output in a model built here.

    A stage's output is its last layer in `model.layers`: Keras lists a functional model's
    layers in topological order, and every layer of a stage feeds the stage's last one (for
    scanned stages, the loop `stage{s}_scan` of units 2..n). The last stage's output is
    taken after the final BN-ReLU (`final_*`) of pre-activation nets, whose units leave their
    sum un-normalized (as timm's ResNetV2 `forward_intermediates(norm=True)` does); the
    other stages give what the next stage receives.

    Example:
    >>> import keras_preact
    >>> outputs = stage_outputs(keras_preact.build("preact-20", depth=8))
    >>> {key: t._keras_history.operation.name for key, t in outputs.items()}
    {'stage1': 'stage1_unit001_add', 'stage2': 'stage2_unit001_add', 'stage3': 'final_relu'}
    """
    last: dict[int, keras.layers.Layer] = {}
    for layer in model.layers:
        stage = stage_of(layer.name)
        if stage is not None:
            last[stage] = layer
        elif layer.name.startswith(FINAL_PREFIX) and last:
            last[max(last)] = layer
    if sorted(last) != list(range(1, len(last) + 1)) or not last:
        raise ValueError(
            f"Model {model.name!r} has no stage1_* layers (or a stage is missing): build it with "
            "keras_preact.build() or a keras_preact.applications constructor. Received layers: "
            f"{[layer.name for layer in model.layers][:5]}..."
        )
    return {f"stage{s}": last[s].output for s in sorted(last)}


def allow_deep_graph(layers: int) -> None:
    """Raises Python's recursion limit enough for a functional graph of `layers` layers.

    Keras builds, clones and loads functional models with a recursive graph walk
    (`keras/src/ops/function.py`, one frame per layer on the longest path); the default
    limit of 1000 stops at resnet-1202. Only ever raised, never lowered.
    """
    needed = 1000 + 2 * layers
    if sys.getrecursionlimit() < needed:
        sys.setrecursionlimit(needed)


def graph(spec: ResNetSpec, stages: str = "layers",
          input_tensor: blocks.Tensor | None = None) -> tuple:
    """`(inputs, outputs)` of the functional graph `spec` describes, in form `stages`
    (`keras_preact.arch.network.ResNet` wraps them in a model).

    Layers are named `stem_*`, `stage{s}_unit{uuu}_*`, `final_*`, `predictions`: stable
    across versions, so weights saved by name keep loading. `stages="scan"` runs the
    identical units 2..n of each stage as one `keras_preact.arch.scanned_units.ScannedUnits` layer
    `stage{s}_scan` (same math and parameters, a graph that does not grow with depth).
    """
    if stages not in STAGES:
        raise ValueError(f"Unknown stages {stages!r}. Valid: {list(STAGES)}.")
    if stages == "scan":
        check_scannable(spec)
    if input_tensor is None:
        inputs = keras.Input(shape=spec.input_shape, name="images")
        x = inputs
    else:
        sources = keras.utils.get_source_inputs(input_tensor)
        inputs = sources[0] if len(sources) == 1 else sources
        x = input_tensor
    if spec.include_preprocessing:
        x = preprocessing_layer(spec)(x)
    x = stem(x, spec)
    for s, (n_units, width) in enumerate(zip(spec.units, spec.widths), start=1):
        for u in range(1, n_units + 1):
            if stages == "scan" and u == 2:
                x = scanned_units(x, spec, width, n_units - 1, name=scan_layer(s))
                break
            x = blocks.residual_unit(
                x,
                spec,
                width,
                strides=2 if (u == 1 and s > 1) else 1,
                prefix=unit_prefix(s, u),
                first=u == 1,
                # The paper's ImageNet stem ends in BN-ReLU-pool: nothing left to pre-activate.
                skip_pre=spec.family == "imagenet" and spec.stem == "paper" and s == 1 and u == 1,
                raw_identity=spec.stem == "conv-pool",
            )
    allow_deep_graph(layer_bound(spec))
    return inputs, head(x, spec)


def preprocessing_layer(spec: ResNetSpec) -> keras.layers.Rescaling:
    """The first layer of a network built with `include_preprocessing=True`:
    `preprocess_input` with the statistics its weights were trained with
    (`preprocessing.default_preprocessing`), as a weightless Keras layer any runtime loads."""
    scale, offset = scale_and_offset(default_preprocessing(spec).stats)
    # float32 whatever the policy: raw pixels up to 255 lose precision in bfloat16.
    return keras.layers.Rescaling(list(scale), list(offset), dtype="float32", name=PREPROCESSING)


@contextlib.contextmanager
def cheap_variables() -> Iterator[None]:
    """Creates the model's variables without two costs that grow with its size (measured in
    benchmarks/README.md, "Building a model"):

    - TensorFlow's eager `VarHandleOp` carries the variable's scoped name as an attribute
      ("stage1_unit001_conv1/kernel") and eager kernels are cached by attributes, so each new
      name instantiates a kernel (~0.5 ms; preact-1001 has 5,005 variables). Created outside
      the layer's name scope, a TensorFlow variable is named like its Keras variable
      ("kernel"); Keras' names and paths, which weights files use, do not change.
    - Python's cyclic garbage collector walks the growing graph of layers again and again:
      it is paused for the build.
    """
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        if keras.backend.backend() != "tensorflow":
            yield
            return
        import tensorflow as tf

        def unscoped(next_creator, **kwargs):
            with tf.name_scope(""):  # in eager mode "" resets the scope
                return next_creator(**kwargs)

        with tf.variable_creator_scope(unscoped):
            yield
    finally:
        if was_enabled:
            gc.enable()
