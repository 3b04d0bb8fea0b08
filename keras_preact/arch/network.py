"""`ResNet`: a network of the zoo as a Keras model that knows what it is.

A functional model whose config is its `ResNetSpec` and its form (plain layers or scanned
stages), as keras-hub's Backbone keeps its constructor arguments: `get_config()` is the spec,
`from_config` builds the network again, `spec_of(model)` reads it back. Every model
`keras_preact` builds is one; a `.keras` file of one names the class `keras_preact>ResNet`, so
loading it needs keras_preact installed (a run dir's `model.keras` is a plain Keras graph:
`keras_preact.weights.storage.save_plain`).

Example:
>>> import keras_preact
>>> model = keras_preact.build("resnet-110-exclusive-gating", depth=14)
>>> spec = spec_of(model)
>>> spec.shortcut, spec.gate_bias, spec.units, model.stages
('exclusive-gating', -6.0, (2, 2, 2), 'layers')
"""

from __future__ import annotations

import contextlib
import dataclasses

import keras

from keras_preact.arch.graph import cheap_variables, graph
from keras_preact.arch.scanned_units import scanned_layers, set_options
from keras_preact.arch.specs import ResNetSpec

SPEC_FIELDS = tuple(f.name for f in dataclasses.fields(ResNetSpec))
# What a scanned stage runs with besides its weights (`scanned_units.set_options`).
OPTIONS = ("fused", "recompute", "recompute_bn")


@keras.saving.register_keras_serializable(package="keras_preact")
class ResNet(keras.Model):
    """The functional model of `spec` in form `stages` ("layers" or "scan"; `options`: the
    scanned stages' `scanned_units.set_options`), built under dtype policy `dtype` (default:
    Keras' global policy). Layers, weights and outputs are those of a plain `keras.Model` of
    the same graph."""

    def __init__(self, spec: ResNetSpec, stages: str = "layers", input_tensor=None,
                 name: str = "resnet", dtype=None, options: dict | None = None, **kwargs):
        with _dtype_policy(dtype), cheap_variables():
            inputs, outputs = graph(spec, stages, input_tensor)
            super().__init__(inputs=inputs, outputs=outputs, name=name, dtype=dtype, **kwargs)
        self.spec = spec
        self.stages = stages
        set_options(self, **(options or {}))

    def __call__(self, inputs, *args, **kwargs):
        _check_pixels(self, inputs)
        return super().__call__(inputs, *args, **kwargs)

    def get_config(self) -> dict:
        loops = scanned_layers(self)
        return {"name": self.name, "trainable": self.trainable, "stages": self.stages,
                "dtype": keras.dtype_policies.serialize(self.dtype_policy),
                "options": {k: getattr(loops[0], k) for k in OPTIONS} if loops else None,
                **dataclasses.asdict(self.spec)}

    @classmethod
    def from_config(cls, config: dict) -> ResNet:
        rest = {k: v for k, v in config.items() if k not in SPEC_FIELDS}
        return cls(spec_in(config), **rest)


def _check_pixels(model: ResNet, inputs) -> None:
    """Refuses integer images (raw uint8 pixels) for a network that takes normalized ones:
    Keras would cast them to float and the network, seeing values 100x too large, would
    answer at chance level without a word."""
    dtype = getattr(inputs, "dtype", None)
    if model.spec.include_preprocessing or dtype is None:
        return
    dtype = keras.backend.standardize_dtype(dtype)
    if "int" in dtype:
        raise ValueError(
            f"{model.name!r} takes images normalized by "
            "`keras_preact.applications.preprocess_input`, or raw pixels when built with "
            f"`include_preprocessing=True`. Received: {dtype} images of shape "
            f"{tuple(inputs.shape)}; pass preprocess_input(images) or build the model "
            "with include_preprocessing=True."
        )


def spec_in(config: dict) -> ResNetSpec:
    """The spec in a `ResNet`'s config (`get_config`, or a `.keras` file's "config"); a
    field a file predates takes its default (`include_preprocessing`: False, as then)."""
    return ResNetSpec(**{field: config[field] for field in SPEC_FIELDS if field in config})


@contextlib.contextmanager
def _dtype_policy(dtype):
    """Keras' global dtype policy set to `dtype` (unless None) while the layers are made."""
    previous = keras.config.dtype_policy()
    if dtype is not None:
        keras.config.set_dtype_policy(keras.dtype_policies.get(dtype))
    try:
        yield
    finally:
        keras.config.set_dtype_policy(previous)


def build_from_spec(spec: ResNetSpec, name: str = "resnet",
                    input_tensor: keras.KerasTensor | None = None, stages: str = "layers",
                    dtype: str | keras.DTypePolicy | None = None) -> ResNet:
    """The network `spec` describes, in form `stages` ("layers" or "scan").

    Example:
    >>> from keras_preact.arch.specs import resolve
    >>> model = build_from_spec(resolve("preact-20", depth=20), stages="scan")
    >>> model.get_layer("stage1_scan").units, model.stages
    (2, 'scan')
    """
    return ResNet(spec, stages, input_tensor=input_tensor, name=name, dtype=dtype)


def spec_of(model: keras.Model) -> ResNetSpec:
    """The `ResNetSpec` of a network `keras_preact` built, in either form, or loaded
    (`keras_preact.load_model`); ValueError for any other model.

    Example:
    >>> import keras_preact
    >>> spec_of(keras_preact.build("preact-164", depth=11, include_top=False)).block
    'bottleneck'
    """
    if not isinstance(model, ResNet):
        raise ValueError("Expected a network built by keras_preact (keras_preact.build, an "
                         "applications constructor or keras_preact.load_model). Received: "
                         f"{type(model).__name__} {getattr(model, 'name', model)!r}")
    return model.spec


def network_in(model: keras.Model) -> ResNet | None:
    """`model` if it is a `ResNet`, else the one `ResNet` among its layers (a network
    wrapped with more layers, e.g. `keras.Sequential([net, keras.layers.Softmax()])`), else
    None."""
    if isinstance(model, ResNet):
        return model
    nested = [layer for layer in getattr(model, "layers", []) if isinstance(layer, ResNet)]
    return nested[0] if len(nested) == 1 else None


def network_of(model: keras.Model) -> ResNet:
    """`model`'s network (`network_in`), whose spec says its family and preprocessing; a
    one-line ValueError for any other model: which preprocessing it takes is never guessed
    (a CIFAR guess for an ImageNet net is a silently wrong answer)."""
    network = network_in(model)
    if network is None:
        raise ValueError(
            f"Cannot tell which preprocessing model {getattr(model, 'name', model)!r} takes: "
            "it holds no network keras_preact built (a .keras file loaded and saved again by "
            "Keras alone loses keras_preact's entry). Use the file keras_preact wrote (a run "
            "dir's model.keras, or keras_preact.build(...).save) or the network itself. "
            f"Received: {type(model).__name__}")
    return network


def family_of(model: keras.Model) -> str:
    """The family ("cifar" or "imagenet") of `model`'s network (`network_of`)."""
    return network_of(model).spec.family
