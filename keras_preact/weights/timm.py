"""timm's ResNetV2 checkpoints (BatchNorm: `resnetv2_18`, `_34`, `_50`, `_101`) as zoo models.

timm's network is registered as `preact-{depth}-imagenet-timm` (`keras_preact.arch.registry`): the
pre-activation units of preact-{depth}-imagenet, with timm's conv - max-pool stem and
PyTorch's padding (`specs.STEMS`, `specs.PADDINGS`). A checkpoint maps onto it tensor by
tensor: every tensor is used once, every shape is checked, and a missing, unexpected or
misshapen tensor is a one-line error naming it. Only numpy and `safetensors` are needed,
not PyTorch.

Example (`checkpoint`: timm's `model.safetensors`, e.g. of `timm/resnetv2_50.a1h_in1k`):

    from keras_preact.weights.timm import from_timm
    model = from_timm("model.safetensors", "resnetv2_50")  # preact-50-imagenet-timm

>>> model_name("resnetv2_50"), timm_module("stage1_unit001_conv2")
('preact-50-imagenet-timm', 'stages.0.blocks.0.conv2')
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from typing import TYPE_CHECKING

import numpy as np

from keras_preact.arch.registry import TIMM_DEPTHS

if TYPE_CHECKING:  # numpy and safetensors only until a network is built
    from keras_preact.arch.network import ResNet

Checkpoint = str | os.PathLike | Mapping[str, np.ndarray]

# timm architecture -> the registered network that computes what it computes.
ARCHS = {f"resnetv2_{depth}": f"preact-{depth}-imagenet-timm" for depth in TIMM_DEPTHS}
# The overrides `from_timm` accepts: the rest would change what the tensors fit
# (`include_preprocessing` adds a weightless layer with timm's statistics).
FREE_FIELDS = ("input_shape", "classifier_activation", "include_preprocessing")
# PyTorch BatchNorm2d tensors in the order of a Keras BatchNormalization's weights
# (gamma, beta, moving mean, moving variance); its step counter is not used at inference.
BN_TENSORS = ("weight", "bias", "running_mean", "running_var")
BN_COUNTER = "num_batches_tracked"
# Zoo layer name -> timm module path (`keras_preact.arch.introspect` names the layers).
UNIT_LAYER = re.compile(r"stage(\d+)_unit(\d{3})_(bn|conv|shortcut_conv)(\d*)")
TIMM_MODULE = {"stem_conv": "stem.conv", "final_bn": "norm", "predictions": "head.fc"}
UNIT_MODULE = {"bn": "norm", "conv": "conv", "shortcut_conv": "downsample.conv"}


def timm_module(layer_name: str) -> str | None:
    """The timm module whose tensors a zoo layer holds, or None for a layer without weights.

    Example:
    >>> timm_module("stage2_unit001_shortcut_conv"), timm_module("stage4_unit003_bn2")
    ('stages.1.blocks.0.downsample.conv', 'stages.3.blocks.2.norm2')
    """
    if layer_name in TIMM_MODULE:
        return TIMM_MODULE[layer_name]
    match = UNIT_LAYER.fullmatch(layer_name)
    if match is None:
        return None
    stage, unit, kind, k = match.groups()
    block = f"stages.{int(stage) - 1}.blocks.{int(unit) - 1}"
    return f"{block}.{UNIT_MODULE[kind]}{k}"


def read_checkpoint(checkpoint: Checkpoint) -> dict[str, np.ndarray]:
    """The tensors of a `.safetensors` file (read with numpy), or a dict of arrays as given."""
    if isinstance(checkpoint, Mapping):
        return {str(key): np.asarray(value) for key, value in checkpoint.items()}
    if not isinstance(checkpoint, (str, os.PathLike)):
        raise ValueError("`checkpoint` must be a .safetensors path or a dict of numpy arrays. "
                         f"Received: a {type(checkpoint).__name__}")
    from safetensors import SafetensorError
    from safetensors.numpy import load_file

    try:
        return load_file(os.fspath(checkpoint))
    except FileNotFoundError:
        raise FileNotFoundError(f"No checkpoint file at {os.fspath(checkpoint)!r}.") from None
    except (SafetensorError, OSError, TypeError, ValueError) as error:  # truncated, bf16, ...
        raise ValueError(f"Could not read {os.fspath(checkpoint)!r} as a float safetensors "
                         f"checkpoint: {error}") from None


def _keras_weights(module: str, layer, tensors: dict, used: set) -> list[np.ndarray]:
    """The values of `layer`'s weights, in Keras' order and layout, from timm `module`'s
    tensors; each tensor taken is added to `used`."""
    def take(name: str, expected: tuple) -> np.ndarray:
        key = f"{module}.{name}"
        if key not in tensors:
            raise ValueError(f"The checkpoint lacks tensor {key!r} (for layer {layer.name!r}).")
        value = tensors[key]
        if value.shape != expected:
            raise ValueError(f"Tensor {key!r} has shape {value.shape}; layer {layer.name!r} "
                             f"needs {expected}.")
        used.add(key)
        return value.astype("float32")

    shapes = [tuple(w.shape) for w in layer.weights]
    if layer.__class__.__name__ == "BatchNormalization":
        used.update({f"{module}.{BN_COUNTER}"} & set(tensors))
        return [take(name, shape) for name, shape in zip(BN_TENSORS, shapes)]
    if layer.__class__.__name__ == "Conv2D":  # torch OIHW -> Keras HWIO
        h, w, i, o = shapes[0]
        return [take("weight", (o, i, h, w)).transpose(2, 3, 1, 0)]
    # The classifier: timm's is a 1x1 conv (out, in, 1, 1) with a bias.
    (i, o), bias = shapes
    return [take("weight", (o, i, 1, 1)).reshape(o, i).T, take("bias", bias)]


def assign(model: ResNet, tensors: dict[str, np.ndarray]) -> None:
    """Sets every weight of `model` (a `preact-*-imagenet-timm` network) from timm's
    `tensors`; a tensor left over is an error too."""
    used: set[str] = set()
    values = {}
    for layer in model.layers:
        if not layer.weights:
            continue
        module = timm_module(layer.name)
        if module is None:
            raise ValueError(f"Layer {layer.name!r} has no counterpart in timm's ResNetV2.")
        values[layer.name] = _keras_weights(module, layer, tensors, used)
    extra = sorted(set(tensors) - used)
    if extra:
        raise ValueError(f"The checkpoint has {len(extra)} tensor(s) this network does not use, "
                         f"e.g. {extra[0]!r} (shape {tensors[extra[0]].shape}): is it another "
                         "architecture?")
    for layer in model.layers:  # only once every tensor fits: no half-loaded model
        if layer.name in values:
            layer.set_weights(values[layer.name])


def model_name(arch: str) -> str:
    """The registered network of timm architecture `arch`.

    Example:
    >>> model_name("resnetv2_50")
    'preact-50-imagenet-timm'
    """
    if arch not in ARCHS:
        raise ValueError(f"Unknown timm architecture {arch!r}. Valid: {sorted(ARCHS)}.")
    return ARCHS[arch]


def from_timm(checkpoint: Checkpoint, arch: str, **overrides) -> ResNet:
    """A `keras.Model` computing what timm's `arch` computes with `checkpoint`'s weights.

    Args:
        checkpoint: a `.safetensors` file of a timm ResNetV2 (BatchNorm) state dict, e.g.
            the `model.safetensors` of `timm/resnetv2_50.a1h_in1k` on the Hugging Face Hub,
            or a dict of numpy arrays keyed like `model.state_dict()`.
        arch: "resnetv2_18", "resnetv2_34", "resnetv2_50" or "resnetv2_101".
        **overrides: `input_shape` (e.g. `(None, None, 3)`), `classifier_activation`
            (default "softmax"; None for timm's logits) and `include_preprocessing` (True:
            the model takes raw RGB pixels in [0, 255] and normalizes them as timm does).

    Returns:
        The registered network `model_name(arch)`, uncompiled, taking NHWC images
        normalized as the checkpoint was trained (timm's mean and std).
    """
    from keras_preact.arch.network import build_from_spec
    from keras_preact.arch.specs import resolve

    name = model_name(arch)
    fixed = sorted(set(overrides) - set(FREE_FIELDS))
    if fixed:
        raise ValueError(f"from_timm takes only the overrides {list(FREE_FIELDS)}: the others "
                         f"change what the checkpoint fits. Received: {fixed}")
    tensors = read_checkpoint(checkpoint)
    model = build_from_spec(resolve(name, **overrides), name=name)
    assign(model, tensors)
    return model

