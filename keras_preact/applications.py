"""Keras-Applications-style constructors: `PreActResNet164(...)`, `ResNet50(...)`, ...

Every constructor takes the Keras Applications arguments (`help(PreActResNet164)` lists them)
and builds the registered network of the same name through `keras_preact.build`'s single path.

Example:
>>> from keras_preact.applications import PreActResNet164
>>> model = PreActResNet164(classes=100)
>>> model.output.shape
(None, 100)
"""

from __future__ import annotations

import keras

from keras_preact import pretrained
from keras_preact.builder import build_from_spec
from keras_preact.labels import decode_predictions
from keras_preact.paper import PAPER_RESULTS
from keras_preact.preprocessing import preprocess_input
from keras_preact.specs import EXPANSION, get_spec, resolve

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
            (`keras_preact.scan`). Weights were trained on RGB images: with weights the
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

    Returns:
        An uncompiled `keras.Model` taking images normalized by `preprocess_input`.
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
    include_top: bool = True,
    weights: str | None = None,
    input_tensor=None,
    input_shape: tuple | None = None,
    pooling: str | None = None,
    classes: int | None = None,
    classifier_activation: str | None = "softmax",
    name: str | None = None,
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
    spec = resolve(model_name, **overrides)
    # The weights file first: a missing file or unknown tag fails before any building.
    path = None if weights is None else pretrained.weights_path(model_name, weights, spec)
    model = build_from_spec(spec, name=name or model_name, input_tensor=input_tensor)
    if path is not None:
        pretrained.load_weights(model, spec, path)
    return model


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


def trained_as(model_name: str, weights) -> str:
    """The registered network a constructor of `model_name` builds for `weights`: its own,
    or its variant (`VARIANT_SUFFIX`) when `weights` is a tag published only for the variant.
    Weights never load into a network that computes something else.

    Example:
    >>> trained_as("preact-50-imagenet", "imagenet"), trained_as("preact-50-imagenet", None)
    ('preact-50-imagenet-timm', 'preact-50-imagenet')
    """
    variant = model_name + VARIANT_SUFFIX
    if (isinstance(weights, str) and weights not in pretrained.released(model_name)
            and weights in pretrained.released(variant)):
        return variant
    return model_name


def _converted_doc(public_name: str, model_name: str) -> str:
    variant = model_name + VARIANT_SUFFIX
    return "".join(
        CONVERTED_DOC.format(tag=tag, note=r.note.split(",")[0], top1=r.top1, variant=variant,
                             stats=r.preprocessing.stats, crop_pct=r.preprocessing.crop_pct,
                             interpolation=r.preprocessing.interpolation,
                             public_name=public_name)
        for tag, r in pretrained.released(variant).items()
        if tag not in pretrained.released(model_name))


def _constructor(public_name: str, model_name: str):
    spec = get_spec(model_name)

    def constructor(
        include_top: bool = True,
        weights: str | None = None,
        input_tensor=None,
        input_shape: tuple | None = None,
        pooling: str | None = None,
        classes: int = spec.classes,
        classifier_activation: str | None = "softmax",
        name: str | None = None,
    ) -> keras.Model:
        return application(
            trained_as(model_name, weights),
            include_top,
            weights,
            input_tensor,
            input_shape,
            pooling,
            classes,
            classifier_activation,
            name,
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


# CIFAR.
ResNet20 = _constructor("ResNet20", "resnet-20")
ResNet32 = _constructor("ResNet32", "resnet-32")
ResNet44 = _constructor("ResNet44", "resnet-44")
ResNet56 = _constructor("ResNet56", "resnet-56")
ResNet110 = _constructor("ResNet110", "resnet-110")
ResNet164 = _constructor("ResNet164", "resnet-164")
ResNet1001 = _constructor("ResNet1001", "resnet-1001")
ResNet1202 = _constructor("ResNet1202", "resnet-1202")
PreActResNet20 = _constructor("PreActResNet20", "preact-20")
PreActResNet32 = _constructor("PreActResNet32", "preact-32")
PreActResNet44 = _constructor("PreActResNet44", "preact-44")
PreActResNet56 = _constructor("PreActResNet56", "preact-56")
PreActResNet110 = _constructor("PreActResNet110", "preact-110")
PreActResNet164 = _constructor("PreActResNet164", "preact-164")
PreActResNet1001 = _constructor("PreActResNet1001", "preact-1001")
# ImageNet: the same names as Keras Applications' ResNet50 etc. (CIFAR depths, 6n+2 and
# 9n+2, never collide with ImageNet ones).
ResNet18 = _constructor("ResNet18", "resnet-18-imagenet")
ResNet34 = _constructor("ResNet34", "resnet-34-imagenet")
ResNet50 = _constructor("ResNet50", "resnet-50-imagenet")
ResNet101 = _constructor("ResNet101", "resnet-101-imagenet")
ResNet152 = _constructor("ResNet152", "resnet-152-imagenet")
ResNet200 = _constructor("ResNet200", "resnet-200-imagenet")
PreActResNet18 = _constructor("PreActResNet18", "preact-18-imagenet")
PreActResNet34 = _constructor("PreActResNet34", "preact-34-imagenet")
PreActResNet50 = _constructor("PreActResNet50", "preact-50-imagenet")
PreActResNet101 = _constructor("PreActResNet101", "preact-101-imagenet")
PreActResNet152 = _constructor("PreActResNet152", "preact-152-imagenet")
PreActResNet200 = _constructor("PreActResNet200", "preact-200-imagenet")

CONSTRUCTORS = {
    "ResNet20": ResNet20,
    "ResNet32": ResNet32,
    "ResNet44": ResNet44,
    "ResNet56": ResNet56,
    "ResNet110": ResNet110,
    "ResNet164": ResNet164,
    "ResNet1001": ResNet1001,
    "ResNet1202": ResNet1202,
    "PreActResNet20": PreActResNet20,
    "PreActResNet32": PreActResNet32,
    "PreActResNet44": PreActResNet44,
    "PreActResNet56": PreActResNet56,
    "PreActResNet110": PreActResNet110,
    "PreActResNet164": PreActResNet164,
    "PreActResNet1001": PreActResNet1001,
    "ResNet18": ResNet18,
    "ResNet34": ResNet34,
    "ResNet50": ResNet50,
    "ResNet101": ResNet101,
    "ResNet152": ResNet152,
    "ResNet200": ResNet200,
    "PreActResNet18": PreActResNet18,
    "PreActResNet34": PreActResNet34,
    "PreActResNet50": PreActResNet50,
    "PreActResNet101": PreActResNet101,
    "PreActResNet152": PreActResNet152,
    "PreActResNet200": PreActResNet200,
}

__all__ = ["application", "trained_as", "decode_predictions", "preprocess_input", *CONSTRUCTORS]
