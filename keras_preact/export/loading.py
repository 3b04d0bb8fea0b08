"""What an export starts from: a model, a `.keras` file or a run dir, loaded as
`load_for_inference` gives it and computing in float32, and the form a SavedModel is
exported in (`serving_form`)."""

from __future__ import annotations

import os

import keras

from keras_preact import rundir
from keras_preact.api import ModelOrPath, load_for_inference
from keras_preact.arch.network import ResNet, build_from_spec
from keras_preact.arch.scanned_units import scannable
from keras_preact.weights.storage import in_form

RUN_FILES = (rundir.MODEL, rundir.CONFIG)


def load_for_export(model_or_path: ModelOrPath) -> tuple[keras.Model, str]:
    """`(model, default name)` from a `keras.Model`, a `.keras` file or a trainer run dir: the
    model as `load_for_inference` gives it, `in_float32`; the name is a run dir's config.json
    `"model"` (the network it trained), else the model's."""
    if isinstance(model_or_path, (str, os.PathLike)):
        path = os.fspath(model_or_path)
        if not os.path.exists(path):
            raise FileNotFoundError(f"No model at {path}: expected a .keras file or a run dir.")
        if os.path.isdir(path):
            name = _run_model_name(path)  # a bad run dir fails before the model loads
            return in_float32(load_for_inference(path)), name
    model = in_float32(load_for_inference(model_or_path))
    return model, model.name


def in_float32(model: keras.Model) -> keras.Model:
    """`model` computing in float32: a network trained in mixed precision keeps its dtype
    policy in its `.keras` file, and exported as it is it would compute in bfloat16 or
    float16 (an ONNX file ONNX Runtime refuses to load; a SavedModel less accurate than
    float32). The same weights (float32 in every policy) in a float32 build; any other
    model that does not compute in float32 is a one-line ValueError."""
    policies = {layer.dtype_policy.name for layer in model.layers}
    if policies <= {"float32"}:
        return model
    if not isinstance(model, ResNet):
        raise ValueError(f"Exports compute in float32: rebuild {model.name!r} with dtype "
                         f"'float32' and copy its weights in. Received: layers with dtype "
                         f"policies {sorted(policies)}")
    twin = build_from_spec(model.spec, name=model.name, stages=model.stages, dtype="float32")
    twin.set_weights(model.get_weights())
    return twin


def _run_model_name(path: str) -> str:
    """The `"model"` of run dir `path`'s config, once the run dir is checked to hold
    `RUN_FILES`."""
    missing = [f for f in RUN_FILES if not os.path.isfile(os.path.join(path, f))]
    if missing:
        raise FileNotFoundError(
            f"{path} is not a run dir: missing {', '.join(missing)} "
            f"(a run dir holds {' and '.join(RUN_FILES)})."
        )
    name = rundir.read_config(path).get("model")
    if not isinstance(name, str):  # e.g. null, which would export a model named "None"
        raise ValueError(f"The \"model\" entry of {os.path.join(path, rundir.CONFIG)} must be "
                         f"a string. Received: {name!r}")
    return name


def serving_form(model: keras.Model) -> keras.Model:
    """The form a SavedModel is exported in: full pre-activation nets with scanned stages.

    Same outputs as the plain layer graph (`keras_preact.arch.scan`), but a SavedModel with one
    loop per stage instead of a layer graph that grows with depth: it exports and loads in
    TF Serving much faster, at the same latency (benchmarks/export_speed.py measures both).
    Any other model (another design, or a network wrapped with more layers or ops) is
    exported as it is.
    """
    if not (isinstance(model, ResNet) and scannable(model.spec)):
        return model
    return in_form(model, "scan")
