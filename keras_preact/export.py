"""Export a model as a TF Serving SavedModel: `BASE/NAME/VERSION/`.

The SavedModel needs neither Keras nor keras_preact to run: preprocessing, resizing, top-k and
class names are TensorFlow ops in its signatures (see `keras_preact.serving.signatures`):

- `serving_default`: `images` uint8 `[batch, h, w, 3]` -> `probabilities`, `classes`, `scores`,
  `labels` (top k = min(5, classes));
- `serving_bytes`: `image_bytes` string `[batch]` of JPEG/PNG files -> the same outputs;
- `classify`: `inputs` string `[batch]` of tf.Examples with `image/encoded` -> `classes` (label
  strings) and `scores`, TF Serving's Classify API contract.

The image limits are in `keras_preact.serving.signatures` (`MAX_SIDE`, `MAX_ASPECT_RATIO`), the
rules for model names and versions in `keras_preact.serving.layout`.
"""

from __future__ import annotations

import os
from collections.abc import Sequence

import keras

from keras_preact import rundir, scan
from keras_preact.api import load_for_inference
from keras_preact.files import check_directory
from keras_preact.labels import recorded_names
from keras_preact.serving.layout import check_name, check_version, publish_version

RUN_FILES = (rundir.MODEL, rundir.CONFIG)


def load_for_export(model_or_path) -> tuple[keras.Model, str]:
    """`(model, default name)` from a `keras.Model`, a `.keras` file or a trainer run dir: the
    model as `load_for_inference` gives it; the name is a run dir's config.json `"model"`
    (the network it trained), else the model's."""
    if isinstance(model_or_path, (str, os.PathLike)):
        path = os.fspath(model_or_path)
        if not os.path.exists(path):
            raise FileNotFoundError(f"No model at {path}: expected a .keras file or a run dir.")
        if os.path.isdir(path):
            name = _run_model_name(path)  # a bad run dir fails before the model loads
            return load_for_inference(path), name
    model = load_for_inference(model_or_path)
    return model, model.name


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
    """The form a model is exported in: full pre-activation nets with scanned stages.

    Same outputs as the plain layer graph (`keras_preact.scan`), but a SavedModel with one
    loop per stage instead of a layer graph that grows with depth: it exports and loads in
    TF Serving much faster, at the same latency (benchmarks/export_speed.py measures both).
    Any other model is exported as it is.
    """
    if scan.is_scanned(model):
        return model
    try:
        scanned = scan.to_scanned(model)
    except ValueError:  # not a full pre-activation net of keras_preact.build
        return model
    # to_scanned rebuilds the net from its layers: ops outside layers (keras.ops.sigmoid on
    # the output) and extra outputs would be dropped, so such a model is exported as it is.
    if len(model.outputs) != 1 or len(model.operations) != len(model.layers):
        return model
    return scanned


def export_saved_model(
    model_or_path,
    base_dir: str,
    *,
    name: str | None = None,
    version: int | None = None,
    labels: Sequence[str] | None = None,
) -> str:
    """Exports a classifier for TF Serving as `base_dir/NAME/VERSION/`; returns that path.

    Args:
        model_or_path: a `keras.Model`, a `.keras` file or a trainer run dir. Its one output
            must be logits (softmax is added), softmax or sigmoid probabilities (served as
            they are); feature extractors and multi-output models are refused (ValueError).
        base_dir: the directory TF Serving's `--model_base_path` (or models.config) points
            above: the model goes to `base_dir/NAME/`.
        name: model and directory name (`keras_preact.serving.layout.check_name`); default the
            run dir's config `"model"` or `model.name`.
        version: a positive integer within int64; default the next free one. Existing
            versions are never overwritten (FileExistsError).
        labels: class names in index order; default `keras_preact.labels.class_names` (those
            a run dir recorded, e.g. its image folder's).

    Returns:
        The new version directory (`saved_model.pb`, `variables/`, `assets.extra/`).

    Raises:
        OSError: the file system failed (permission, read-only, disk full, ...); the message
            names the path. Nothing is left half-written.

    Example:
    >>> import tempfile, keras_preact
    >>> path = export_saved_model(keras_preact.build("preact-20", depth=8), tempfile.mkdtemp())
    >>> os.path.basename(path)
    '1'
    """
    import tensorflow as tf

    from keras_preact.serving.signatures import build_signatures, model_side
    from keras_preact.serving.warmup import write_warmup

    check_version(version)  # the arguments first: loading a model takes a while
    name = None if name is None else check_name(name)
    check_directory(os.fspath(base_dir))
    model, default_name = load_for_export(model_or_path)
    name = name or check_name(default_name)
    model = serving_form(model)
    if labels is None:  # a run dir's recorded names (a fine-tune on a folder), else defaults
        labels = recorded_names(model_or_path)
    functions = build_signatures(model, labels)  # refuses a model or labels it cannot serve
    side = model_side(model)

    def write(tmp_dir: str) -> None:
        # Plain tf.saved_model.save of concrete functions: the signature keys, input names and
        # dtypes are exactly the TensorSpecs'. (keras.export.ExportArchive gives the same
        # signatures but re-traces them while saving: twice the time for preact-1001.)
        signatures = {key: fn.get_concrete_function() for key, fn in functions.items()}
        root = tf.Module()
        root.model_variables = list(model.variables)  # what the signatures capture
        try:
            tf.saved_model.save(root, tmp_dir, signatures=signatures)
            write_warmup(tmp_dir, name, side)
        except tf.errors.OpError as e:
            # TensorFlow's file system reports OS errors as its own types: "PATH; REASON".
            reason = e.message.rsplit("; ", 1)[-1].split(" [Op:")[0]
            where = os.path.dirname(tmp_dir)
            raise OSError(f"Cannot write the export in {where}: {reason}") from None

    return publish_version(os.path.join(os.fspath(base_dir), name), version, write)


def export_model(model_or_path, path: str, *, format: str = "saved_model") -> str:
    """Exports a classifier in `format`, one of `keras_preact.deploy.EXPORT_FORMATS`; returns
    what was written.

    "saved_model": a TF Serving version under the base dir `path` (`export_saved_model`).
    "onnx", "litert", "openvino": one artifact at `path` (`keras_preact.deploy.export`): uint8
    images in, preprocessing inside, probabilities out, class names in its metadata.

    Example:
    >>> import tempfile, keras_preact
    >>> out = os.path.join(tempfile.mkdtemp(), "m.onnx")
    >>> export_model(keras_preact.build("preact-20", depth=8), out, format="onnx") == out
    True
    """
    from keras_preact import deploy

    if format not in deploy.EXPORT_FORMATS:
        raise ValueError(f"Unknown format {format!r}. Valid: {list(deploy.EXPORT_FORMATS)}.")
    if format == "saved_model":
        return export_saved_model(model_or_path, path)
    return deploy.export(model_or_path, path, format=format)
