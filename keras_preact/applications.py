"""Keras-Applications-style constructors: `PreActResNet164(...)`, `ResNet50(...)`, ...

Every constructor takes the Keras Applications arguments (`help(PreActResNet164)` lists them)
and builds the registered network of the same name through `keras_preact.build`'s single path
(`keras_preact.api.build_network`); `NAMES` is the table they are made from.

Example:
>>> from keras_preact.applications import PreActResNet164
>>> model = PreActResNet164(classes=100)
>>> model.output.shape
(None, 100)
"""

from __future__ import annotations

import keras

from keras_preact.api import build_network
from keras_preact.arch.specs import EXPANSION, get_spec
from keras_preact.labels import decode_predictions
from keras_preact.paper import PAPER_RESULTS
from keras_preact.preprocessing import preprocess_input
from keras_preact.weights import records

# The arguments of `application` and of every constructor (as Keras' resnet_v2.py shares one
# DOC), formatted with each one's defaults.
ARGS_DOC = """
    Args:{model_name_arg}
        include_top: whether to end with the classifier (global average pooling and a dense
            layer of `classes` units). False: the output is the last feature map (after
            the final BN-ReLU of pre-activation nets), or its pooled vector (`pooling`).
        weights: None (random initialization), a published tag of this network
            (`keras-preact list --weights`; a constructor's also builds its `-timm`
            variant for that variant's tags, `trained_as`), or the path to a
            `.weights.h5` file saved from it, in the plain or the scanned form
            (`keras_preact.arch.scan`). Weights were trained on RGB images: with weights the
            input needs 3 channels.
        input_tensor: optional Keras tensor (e.g. the output of `keras.Input()`) to use as
            the model's input; its shape is the input shape.
        input_shape: optional `(height, width, channels)`. Without weights any size (None:
            variable) and any channel count (grayscale, RGBA, multispectral) works.
            Default: the shape of `input_tensor`, else {input_shape}.
        pooling: with `include_top=False`, None (the 4D feature map), "avg" or "max"
            (global pooling to a 2D `(batch, channels)` output). Ignored otherwise.
        classes: outputs of the classifier; with `weights`, the number the weights were
            trained for. Default: {classes}.
        classifier_activation: the name of a Keras activation for the classifier, or None
            for logits. Ignored unless `include_top=True`.
        name: the model's name. Default: {name}.
        include_preprocessing: True: the model takes raw RGB pixels in [0, 255] (uint8 or
            float) and normalizes them itself, first, with the statistics of its weights
            (a weightless `keras.layers.Rescaling` layer named "preprocessing").
            Default False: the model takes `preprocess_input(x)`, as it is trained, served
            and exported (Keras' ResNet and ResNetV2 take it so too).

    Returns:
        An uncompiled `keras.Model` taking images normalized by `preprocess_input`, or raw
        pixels with `include_preprocessing=True`.
"""
# What `help(PreActResNet164)` shows before the arguments: the network, the paper's figure
# (`keras_preact.paper`) and an example.
CONSTRUCTOR_DOC = """Builds registered network `{model_name}` with Keras Applications arguments.

    {family} family, depth {depth}: {block} blocks, {unit} units, {shortcut} shortcuts.
    Paper error (%): {paper}.
    He et al., Identity Mappings in Deep Residual Networks (ECCV 2016), arXiv:1603.05027.

    Example (random initialization):

        from keras_preact.applications import {public_name}
        model = {public_name}(classes=100)
        print(model.output.shape)  # (None, 100)
        features = {public_name}(include_top=False, pooling="avg")
        print(features.output.shape)  # (None, {features})
{converted}"""
# For a constructor whose network has a variant with converted weights (`pretrained`,
# `ConvertedRecord`): those tags build the variant, the network the weights were trained as.
CONVERTED_DOC = """
    With `weights="{tag}"`: {note}
    (top-1 {top1} % by its source, not measured here), in the network they were trained
    as: `{variant}` (timm's conv - max-pool stem, PyTorch's symmetric
    padding). The model returned is that network, named so; it takes
    `preprocess_input(x, "{stats}")`,
    and evaluation and exports apply the source's crop ({crop_pct}, {interpolation}).

        model = {public_name}(weights="{tag}")  # model.name == "{variant}"
"""
# The suffix of a registered network's variant that computes what converted weights need.
VARIANT_SUFFIX = "-timm"


def application(
    model_name: str,
    *,
    include_top: bool = True,
    weights: str | None = None,
    input_tensor: keras.KerasTensor | None = None,
    input_shape: tuple | None = None,
    pooling: str | None = None,
    classes: int | None = None,
    classifier_activation: str | None = "softmax",
    name: str | None = None,
    include_preprocessing: bool = False,
) -> keras.Model:
    """Builds registered network `model_name` (`keras_preact.list_models()`) with Keras
    Applications arguments: what every constructor calls.

    Example:
    >>> gray = application("preact-20", include_top=False, input_shape=(None, None, 1))
    >>> gray.output.shape
    (None, None, None, 64)
    """
    overrides = {
        "include_top": include_top,
        "pooling": pooling,
        "classifier_activation": classifier_activation,
        "include_preprocessing": include_preprocessing,
    }
    if classes is not None:
        overrides["classes"] = classes
    if input_tensor is not None:
        if not keras.backend.is_keras_tensor(input_tensor):  # else keras.Model prints it all
            raise ValueError(
                "`input_tensor` must be a Keras tensor, e.g. `keras.Input((32, 32, 3))`. "
                f"Received: a {type(input_tensor).__module__}.{type(input_tensor).__name__}"
                f" of shape {tuple(getattr(input_tensor, 'shape', ()))}"
            )
        # The tensor's shape is the input's; an `input_shape` may only repeat it.
        tensor_shape = tuple(input_tensor.shape[1:])
        if input_shape is not None and not _compatible(input_shape, tensor_shape):
            raise ValueError(
                "`input_shape` differs from the shape of `input_tensor`. Received: "
                f"input_shape={input_shape!r} and an input_tensor of shape "
                f"{tuple(input_tensor.shape)}"
            )
        input_shape = tensor_shape
    if input_shape is not None:
        overrides["input_shape"] = input_shape
    return build_network(model_name, weights=weights, input_tensor=input_tensor, model_name=name,
                         **overrides)


application.__doc__ += ARGS_DOC.format(
    model_name_arg="\n        model_name: a registered name, see `keras_preact.list_models()`.",
    input_shape="`keras_preact.get_spec(model_name).input_shape`",
    classes="`keras_preact.get_spec(model_name).classes`",
    name="`model_name`",
)


def _compatible(input_shape, tensor_shape: tuple) -> bool:
    """Whether `input_shape` matches `tensor_shape`, None matching any size."""
    return (isinstance(input_shape, (tuple, list)) and len(input_shape) == len(tensor_shape)
            and all(d is None or d == t for d, t in zip(input_shape, tensor_shape)))


def trained_as(model_name: str, weights: str | None) -> str:
    """The registered network a constructor of `model_name` builds for `weights`: its own,
    or its variant (`VARIANT_SUFFIX`) when `weights` is a tag published only for the variant.
    Weights never load into a network that computes something else.

    Example:
    >>> trained_as("preact-50-imagenet", "imagenet"), trained_as("preact-50-imagenet", None)
    ('preact-50-imagenet-timm', 'preact-50-imagenet')
    """
    variant = model_name + VARIANT_SUFFIX
    if (isinstance(weights, str) and weights not in records.released(model_name)
            and weights in records.released(variant)):
        return variant
    return model_name


def _converted_doc(public_name: str, model_name: str) -> str:
    variant = model_name + VARIANT_SUFFIX
    return "".join(
        CONVERTED_DOC.format(tag=tag, note=r.note.split(",")[0], top1=r.top1, variant=variant,
                             stats=r.preprocessing.stats, crop_pct=r.preprocessing.crop_pct,
                             interpolation=r.preprocessing.interpolation,
                             public_name=public_name)
        for tag, r in records.released(variant).items()
        if tag not in records.released(model_name))


def _constructor(public_name: str, model_name: str):
    spec = get_spec(model_name)

    # Keras Applications' signature, positional arguments included (`ResNet50(True, None)`).
    def constructor(
        include_top: bool = True,
        weights: str | None = None,
        input_tensor=None,
        input_shape: tuple | None = None,
        pooling: str | None = None,
        classes: int = spec.classes,
        classifier_activation: str | None = "softmax",
        name: str | None = None,
        include_preprocessing: bool = False,
    ) -> keras.Model:
        return application(
            trained_as(model_name, weights), include_top=include_top, weights=weights,
            input_tensor=input_tensor, input_shape=input_shape, pooling=pooling, classes=classes,
            classifier_activation=classifier_activation, name=name,
            include_preprocessing=include_preprocessing,
        )

    constructor.__name__ = constructor.__qualname__ = public_name
    constructor.__doc__ = CONSTRUCTOR_DOC.format(
        model_name=model_name, public_name=public_name, family=spec.family, depth=spec.depth,
        block=spec.block, unit=spec.unit, shortcut=spec.shortcut,
        paper=PAPER_RESULTS.get(model_name, "not reported"),
        features=spec.widths[-1] * EXPANSION[spec.block],
        converted=_converted_doc(public_name, model_name),
    ) + ARGS_DOC.format(model_name_arg="", input_shape=spec.input_shape, classes=spec.classes,
                        name=repr(model_name))
    return constructor


# Constructor name -> registered network. ImageNet nets take Keras Applications' names
# (ResNet50 ...): CIFAR depths, 6n+2 and 9n+2, never collide with ImageNet ones.
NAMES = {
    **{f"ResNet{d}": f"resnet-{d}" for d in (20, 32, 44, 56, 110, 164, 1001, 1202)},
    **{f"PreActResNet{d}": f"preact-{d}" for d in (20, 32, 44, 56, 110, 164, 1001)},
    **{f"ResNet{d}": f"resnet-{d}-imagenet" for d in (18, 34, 50, 101, 152, 200)},
    **{f"PreActResNet{d}": f"preact-{d}-imagenet" for d in (18, 34, 50, 101, 152, 200)},
}
CONSTRUCTORS = {public: _constructor(public, name) for public, name in NAMES.items()}
globals().update(CONSTRUCTORS)

__all__ = ["application", "trained_as", "decode_predictions", "preprocess_input", *CONSTRUCTORS]
