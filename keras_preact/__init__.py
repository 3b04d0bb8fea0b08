"""keras-preact: the networks of *Identity Mappings in Deep Residual Networks* (He et al.,
ECCV 2016) in Keras 3, by name.

Example:
>>> import keras_preact
>>> model = keras_preact.build("preact-164")
>>> model.count_params() > 1_700_000
True
"""

from __future__ import annotations

__version__ = "0.1.0"

import keras

from keras_preact import models as _models  # noqa: F401  (registers every name)
# A trainer's model.keras holds its optimizer and schedule: register them for load_model.
from keras_preact.training import optimizer as _optimizer  # noqa: F401
from keras_preact.training import schedule as _schedule  # noqa: F401
from keras_preact.builder import allow_deep_graph, build_from_spec
from keras_preact.specs import ResNetSpec, get_spec, list_models, resolve


def build(name: str, *, stages: str = "layers", **overrides) -> keras.Model:
    """Builds a registered network, optionally changed by `overrides`.

    Args:
        name: a registered name, see `list_models()`: e.g. `"preact-1001"`,
            `"resnet-110"`, `"preact-200-imagenet"`, `"resnet-164-bn-after-add"`.
        **overrides: any `ResNetSpec` field, e.g. `unit="relu-only-preact"` (Fig. 4),
            `shortcut="exclusive-gating", gate_bias=-6.0` (Table 1), `block="single"`
            (Table 3), `depth=56`, `classes=100`, `input_shape=(64, 64, 3)`,
            `include_top=False, pooling="avg"`, `classifier_activation=None`.
        stages: "layers" (default): one Keras layer per BN/ReLU/conv/Add, the graph
            to export and inspect. "scan": each stage's identical units run as one
            `keras_preact.scan.ScannedUnits` loop: same math and parameters, start-up
            time independent of depth (full pre-activation, identity shortcuts only).
            `keras_preact.scan.to_layered` / `to_scanned` convert trained weights.

    Returns:
        An uncompiled `keras.Model` taking RGB images normalized by
        `keras_preact.applications.preprocess_input`.

    Example:
    >>> model = build("preact-110", classes=100)
    >>> model.output.shape
    (None, 100)
    """
    return build_from_spec(resolve(name, **overrides), name=name, stages=stages)


def load_model(path: str, compile: bool = True) -> keras.Model:
    """Loads a `.keras` file, or the `model.keras` of a `keras-preact train` run dir.

    `keras.saving.load_model` with `safe_mode` on, plus room for Keras' recursive graph
    walk, which the 1000-layer nets need (Python's default recursion limit is too low).

    Example:
    >>> import os, tempfile
    >>> path = os.path.join(tempfile.mkdtemp(), "m.keras")
    >>> build("preact-20", depth=8).save(path)
    >>> load_model(path).name
    'preact-20'
    """
    import json
    import os
    import zipfile

    if os.path.isdir(path):
        path = os.path.join(path, "model.keras")
    try:
        with zipfile.ZipFile(path) as archive:
            config = json.loads(archive.read("config.json"))
    except (FileNotFoundError, IsADirectoryError):
        raise FileNotFoundError(
            f"No .keras file at {path!r}: expected a .keras file or the run dir of a "
            "finished `keras-preact train`."
        ) from None
    except (zipfile.BadZipFile, KeyError, json.JSONDecodeError) as e:
        raise ValueError(f"{path!r} is not a .keras model file ({e}).") from None
    allow_deep_graph(len(config.get("config", {}).get("layers", ())))
    return keras.saving.load_model(path, compile=compile)


__all__ = [
    "ResNetSpec",
    "build",
    "build_from_spec",
    "get_spec",
    "list_models",
    "load_model",
    "resolve",
]
