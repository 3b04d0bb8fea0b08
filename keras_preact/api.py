"""The package's Keras-side API, imported by `keras_preact` on first use (it imports Keras,
hence TensorFlow): `build`, `feature_extractor`, `load_model`; and `load_for_inference`, the
loader of evaluate, export, analysis and the CLI.
"""

from __future__ import annotations

import json
import os
import reprlib
import zipfile

import keras

# `.keras` files of models compiled by `training.net.build_and_compile` name its optimizer and
# schedule: registered for load_model.
from keras_preact import optim as _optim  # noqa: F401
from keras_preact import rundir
from keras_preact.arch import registry as _registry  # noqa: F401  (registers every name)
from keras_preact.arch.graph import allow_deep_graph, layer_bound, stage_outputs
from keras_preact.arch.network import ResNet, build_from_spec, network_of, spec_in
from keras_preact.arch.specs import ResNetSpec, get_spec, registered, resolve
from keras_preact.preprocessing import Preprocessing
from keras_preact.weights.records import preprocessing_for, weights_path
from keras_preact.weights.storage import (
    KERAS_WEIGHTS_FILE,
    RESNET,
    SPEC_ENTRY,
    KerasFile,
    load,
    load_weights,
)

# The most layers `load_model` builds by default: the bound of the largest registered network
# (resnet-1202). A file asking for more is refused before Keras reads it, since a deep graph
# needs a higher recursion limit and a small file can describe 100k chained layers.
MAX_LAYERS = max(layer_bound(get_spec(name)) for name in registered())
# Keras writes about 1 KB of config.json per layer (0.97-1.04 KB measured on this package's
# nets): twice that leaves room for a trainer's compile config and bounds what a compressed
# config.json may inflate to (a 0.85 MB file can hold 39 MB, 8 s of json.loads on 2 cores).
CONFIG_BYTES_PER_LAYER = 2048
# What evaluate, export and the analyses take: a model, a `.keras` file or a trainer run dir.
ModelOrPath = keras.Model | str | os.PathLike


def build_network(name: str, *, stages: str = "layers", weights: str | None = None,
                  input_tensor: keras.KerasTensor | None = None, model_name: str | None = None,
                  dtype: str | keras.DTypePolicy | None = None,
                  **overrides) -> ResNet:
    """Registered network `name` with `overrides`, in form `stages`, with `weights` (None, a
    published tag or a `.weights.h5` file of either form), named `model_name` (default
    `name`), under dtype policy `dtype` (default Keras' global one): the one path from a name
    to a model (`build` and every `keras_preact.applications` constructor). The weights file
    is found and checked before anything is built."""
    spec = resolve(name, **overrides)
    path = None if weights is None else weights_path(name, weights, spec)
    model = build_from_spec(spec, name=model_name or name, input_tensor=input_tensor,
                            stages=stages, dtype=dtype)
    if path is not None:
        load_weights(model, path)
    return model


def build(name: str, *, stages: str = "layers", weights: str | None = None,
          **overrides) -> ResNet:
    """Builds a registered network, optionally changed by `overrides`.

    Args:
        name: a registered name, see `list_models()`: e.g. `"preact-1001"`,
            `"resnet-110"`, `"preact-200-imagenet"`, `"resnet-164-bn-after-add"`.
        **overrides: any `ResNetSpec` field, e.g. `unit="relu-only-preact"` (Fig. 4),
            `shortcut="exclusive-gating", gate_bias=-6.0` (Table 1), `block="single"`
            (Table 3), `depth=56`, `classes=100`, `input_shape=(64, 64, 3)`,
            `include_top=False, pooling="avg"`, `classifier_activation=None`,
            `include_preprocessing=True` (raw RGB pixels in [0, 255] in, normalized by the
            model's first layer with its weights' statistics; default False: the model
            takes `preprocess_input(x)`, as the trainer feeds it and exports wrap it).
        stages: "layers" (default): one Keras layer per BN/ReLU/conv/Add, the graph
            to export and inspect. "scan": each stage's identical units run as one
            `keras_preact.arch.scan.ScannedUnits` loop: same math and parameters, start-up
            time independent of depth (full pre-activation, identity shortcuts only).
            `keras_preact.arch.scan.to_layered` / `to_scanned` convert trained weights.
        weights: None (random init), a published tag such as `"cifar10"`
            (`keras-preact list --weights`), or a `.weights.h5` file (of either form).

    Returns:
        An uncompiled `keras_preact.arch.network.ResNet` (a functional `keras.Model` that
        carries its spec: `keras_preact.spec_of`) taking RGB images normalized by
        `keras_preact.applications.preprocess_input` (or images of the channels
        `input_shape` gives, e.g. `(None, None, 1)`: any size, any channel count), or
        raw pixels with `include_preprocessing=True`.

    Example:
    >>> model = build("preact-110", classes=100)
    >>> model.output.shape
    (None, 100)
    """
    return build_network(name, stages=stages, weights=weights, **overrides)


def feature_extractor(name_or_model: str | keras.Model, **overrides) -> keras.Model:
    """A model whose output is each stage's feature map, `{"stage1": ..., "stageN": ...}`:
    the backbone of a detector or segmenter (keras-hub's `pyramid_outputs`, timm's
    `features_only`).

    The last stage's map is taken after the final BN-ReLU of pre-activation nets (their
    units leave the sum un-normalized), the others where the next stage takes them
    (`keras_preact.arch.graph.stage_outputs`). Strides 1, 2, 4 on CIFAR nets (32x32, 16x16,
    8x8 at 32x32 input); 4, 8, 16, 32 on ImageNet nets (56x56x256 ... 7x7x2048 for
    preact-50-imagenet at 224x224).

    Args:
        name_or_model: a registered name, built without its head (`include_top=False`), or
            a model built by `build` or an applications constructor (trained, loaded, or
            with scanned stages, which work as they are): the extractor shares its layers
            and weights, it does not copy them.
        **overrides: `build` overrides (and `stages=`), for a name only; e.g.
            `input_shape=(None, None, 3)` for any image size.

    Example:
    >>> features = feature_extractor("preact-164", depth=11)
    >>> {key: tuple(t.shape[1:]) for key, t in features.output.items()}
    {'stage1': (32, 32, 64), 'stage2': (16, 16, 128), 'stage3': (8, 8, 256)}
    >>> trained = build("preact-20", depth=8)
    >>> feature_extractor(trained).get_layer("final_bn") is trained.get_layer("final_bn")
    True
    """
    if isinstance(name_or_model, keras.Model):
        if overrides:
            raise ValueError(
                f"Overrides apply to a model name. Received a model ({name_or_model.name!r}) "
                f"and overrides {sorted(overrides)}."
            )
        model = name_or_model
    else:
        model = build(name_or_model, **{"include_top": False, **overrides})
    outputs = stage_outputs(model)  # first: it names what is wrong with a foreign model
    return keras.Model(model.input, outputs, name=f"{model.name}_features")


def load_model(path: str, compile: bool = True, max_layers: int = MAX_LAYERS) -> keras.Model:
    """Loads a `.keras` file, or the `model.keras` of a `keras-preact train` run dir.

    A network `keras_preact` built comes back as one (`keras_preact.spec_of` reads its
    spec): from its own file, or from a plain `model.keras` a run wrote, which names its
    network inside (older ones: the run dir's `config.json`). Any other file is
    `keras.saving.load_model`'s, with `safe_mode` on.
    Either way with room for Keras' recursive graph walk, which the 1000-layer nets need
    (Python's default recursion limit is too low).
    That room comes from the file's own layer count, so a file asking for more than
    `max_layers` layers (nested models included) is refused before Keras reads it; raise
    `max_layers` for a trusted file of a deeper custom net.

    Example:
    >>> import os, tempfile
    >>> path = os.path.join(tempfile.mkdtemp(), "m.keras")
    >>> build("preact-20", depth=8).save(path)
    >>> load_model(path).name
    'preact-20'
    """
    archive = _read(path, max_layers)
    return load(archive, _recipe(archive), compile=compile)


def load_for_inference(model_or_path: ModelOrPath, max_layers: int = MAX_LAYERS) -> keras.Model:
    """The model to evaluate, export or analyse: a `keras.Model` as it is, else
    `load_model(path, compile=False)` of a `.keras` file or run dir, except that a full
    pre-activation net comes back in its scanned form (`weights.storage.load`): same outputs,
    loaded without building its layer graph.

    Example:
    >>> import os, tempfile
    >>> path = os.path.join(tempfile.mkdtemp(), "m.keras")
    >>> build("preact-20", depth=14).save(path)
    >>> [layer.name for layer in load_for_inference(path).layers if "scan" in layer.name]
    ['stage1_scan', 'stage2_scan', 'stage3_scan']
    """
    if isinstance(model_or_path, keras.Model):
        return model_or_path
    if not isinstance(model_or_path, (str, os.PathLike)):
        raise ValueError(
            f"Expected a keras.Model, a .keras file or a run dir. Received: {model_or_path!r}"
        )
    archive = _read(os.fspath(model_or_path), max_layers)
    return load(archive, _recipe(archive), fast=True, compile=False)


def _read(path: str, max_layers: int) -> KerasFile:
    """The `.keras` file of a file or run dir, read in one pass (its config.json, once
    checked to ask for at most `max_layers` layers (`load_model`), then keras_preact's entry
    and the weights), with room for Keras to build its layers."""
    path = rundir.model_file(path)
    try:
        with zipfile.ZipFile(path) as archive:
            size = archive.getinfo("config.json").file_size
            if size > max_layers * CONFIG_BYTES_PER_LAYER:  # read nothing a bomb inflates
                raise ValueError(
                    f"{path!r} holds a config.json of {size} bytes; load_model reads at most "
                    f"{max_layers * CONFIG_BYTES_PER_LAYER} for max_layers={max_layers} (pass "
                    "a larger max_layers for a trusted file)."
                )
            config = json.loads(archive.read("config.json"))
            layers = _count_layers(config, path)
            if layers > max_layers:
                raise ValueError(
                    f"{path!r} asks for a graph of {layers} layers; load_model builds at most "
                    f"max_layers={max_layers} (pass a larger max_layers for a trusted file)."
                )
            names = set(archive.namelist())
            entry = archive.read(SPEC_ENTRY) if SPEC_ENTRY in names else None
            weights = archive.read(KERAS_WEIGHTS_FILE) if KERAS_WEIGHTS_FILE in names else None
    except (FileNotFoundError, IsADirectoryError):
        raise FileNotFoundError(
            f"No .keras file at {path!r}: expected a .keras file or the run dir of a "
            "finished `keras-preact train`."
        ) from None
    except (zipfile.BadZipFile, KeyError, json.JSONDecodeError, RecursionError) as e:
        # RecursionError: JSON nested deeper than Python's recursion limit.
        cut = (" (a copy cut short by a full disk or a stopped transfer must be made again)"
               if isinstance(e, zipfile.BadZipFile) else "")
        raise ValueError(
            f"{path!r} is not a .keras model file ({type(e).__name__}: {e}){cut}."
        ) from None
    allow_deep_graph(layers)
    return KerasFile(path, config, entry, weights)


def _recipe(archive: KerasFile) -> ResNetSpec | None:
    """The network a plain `model.keras` written before `SPEC_ENTRY` holds, as its run dir's
    config.json names it (`rundir.recipe`); None for any other file, or a recipe that names
    no network."""
    if archive.spec_entry is not None or archive.config.get("registered_name") == RESNET:
        return None  # the file names its network itself
    run = rundir.recipe(archive.path)
    try:
        return None if run is None else resolve(run[0], **run[1])
    except (KeyError, TypeError, ValueError):
        return None


def _count_layers(config, path: str) -> int:
    """Layers in a `.keras` config.json, those of nested models included; for a network
    file (`network.ResNet`), the bound of the network its spec describes."""
    model = config.get("config") if isinstance(config, dict) else None
    if isinstance(model, dict) and config.get("registered_name") == RESNET:
        try:
            return layer_bound(spec_in(model))
        except (KeyError, TypeError, ValueError) as error:
            raise ValueError(f"{path!r} holds a network config that is not a spec: {error}") \
                from None
    if not (isinstance(model, dict) and isinstance(model.get("layers", []), list)):
        raise ValueError(
            f"{path!r} is not a .keras model file (config.json must hold a model config, "
            f'{{"config": {{"layers": [...]}}}}). Received: {reprlib.repr(config)}'
        )
    count, todo = 0, [model]  # a stack, not recursion: the nesting is the file's to choose
    while todo:
        layers = todo.pop().get("layers")
        if isinstance(layers, list):
            count += len(layers)
            todo.extend(layer["config"] for layer in layers
                        if isinstance(layer, dict) and isinstance(layer.get("config"), dict))
    return count


def preprocessing_of(model: keras.Model) -> Preprocessing:
    """The normalization and evaluation geometry `model` takes: its network's
    (`weights.records.preprocessing_for`: a `-timm` net takes timm's); a one-line ValueError for
    a model that holds none (`network.network_of`). The one answer for evaluation,
    SavedModel signatures and ONNX/LiteRT/OpenVINO exports.

    Example:
    >>> preprocessing_of(build_network("preact-18-imagenet-timm", input_shape=(64, 64, 3)))
    ... # doctest: +NORMALIZE_WHITESPACE
    Preprocessing(stats='inception', size=224, crop_pct=0.9, interpolation='bicubic',
                  in_model=False)
    """
    return preprocessing_for(network_of(model).spec)
