"""Export a model as a TF Serving SavedModel: `BASE/NAME/VERSION/`.

The SavedModel needs neither Keras nor keras_preact to run: preprocessing, resizing, top-k and
class names are TensorFlow ops in its signatures (see `keras_preact.export.signatures`):

- `serving_default`: `images` uint8 `[batch, h, w, 3]` -> `probabilities`, `classes`, `scores`,
  `labels` (top k = min(5, classes));
- `serving_bytes`: `image_bytes` string `[batch]` of JPEG/PNG files -> the same outputs;
- `classify`: `inputs` string `[batch]` of tf.Examples with `image/encoded` -> `classes` (label
  strings) and `scores`, TF Serving's Classify API contract.

The image limits are in `keras_preact.export.signatures` (`MAX_SIDE`, `MAX_ASPECT_RATIO`), the
rules for model names and versions in `keras_preact.export.layout`.
"""

from __future__ import annotations

import os
from collections.abc import Sequence

from keras_preact.api import ModelOrPath
from keras_preact.export.layout import (
    check_name,
    check_same_labels,
    check_version,
    publish_version,
    write_labels,
)
from keras_preact.export.loading import load_for_export, serving_form
from keras_preact.files import check_directory
from keras_preact.labels import recorded_names


def export_saved_model(
    model_or_path: ModelOrPath,
    base_dir: str,
    *,
    name: str | None = None,
    version: int | None = None,
    labels: Sequence[str] | None = None,
    new_labels: bool = False,
) -> str:
    """Exports a classifier for TF Serving as `base_dir/NAME/VERSION/`; returns that path.

    Args:
        model_or_path: a `keras.Model`, a `.keras` file or a trainer run dir. Its one output
            must be logits (softmax is added), softmax or sigmoid probabilities (served as
            they are); feature extractors and multi-output models are refused (ValueError).
        base_dir: the directory TF Serving's `--model_base_path` (or models.config) points
            above: the model goes to `base_dir/NAME/`.
        name: model and directory name (`keras_preact.export.layout.check_name`); default a
            run dir's own name (`runs/mine` -> `mine`, so a fine-tune never takes over the
            published network's name), else `model.name`.
        version: a positive integer within int64; default the next free one. Existing
            versions are never overwritten (FileExistsError).
        labels: class names in index order; default `keras_preact.labels.class_names` (those
            a run dir recorded, e.g. its image folder's).
        new_labels: allow labels other than those of the newest version already under
            `base_dir/NAME` (`layout.check_same_labels`; refused by default).

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

    from keras_preact.export.signatures import build_signatures, model_side, served_labels
    from keras_preact.export.warmup import write_warmup

    check_version(version)  # the arguments first: loading a model takes a while
    name = None if name is None else check_name(name)
    check_directory(os.fspath(base_dir))
    model, default_name = load_for_export(model_or_path)
    if isinstance(model_or_path, (str, os.PathLike)) and os.path.isdir(model_or_path):
        default_name = os.path.basename(os.path.abspath(model_or_path))
    name = name or _default_name(default_name)
    model = serving_form(model)
    if labels is None:  # a run dir's recorded names (a fine-tune on a folder), else defaults
        labels = recorded_names(model_or_path)
    functions = build_signatures(model, labels)  # refuses a model or labels it cannot serve
    labels = served_labels(model, labels)
    model_dir = os.path.join(os.fspath(base_dir), name)
    check_same_labels(model_dir, labels, new_labels)
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
            write_labels(tmp_dir, labels)
        except tf.errors.OpError as e:
            # TensorFlow's file system reports OS errors as its own types: "PATH; REASON".
            reason = e.message.rsplit("; ", 1)[-1].split(" [Op:")[0]
            where = os.path.dirname(tmp_dir)
            raise OSError(f"Cannot write the export in {where}: {reason}") from None

    return publish_version(model_dir, version, write)


def _default_name(name: str) -> str:
    """`name` (a run dir's or a model's) if TF Serving can take it; else one line naming
    --name."""
    try:
        return check_name(name)
    except ValueError:
        raise ValueError(f"{name!r} cannot be a TF Serving model name (letters, digits, '.', "
                         "'_' or '-', starting with a letter or digit): give one with --name "
                         "(`name=`).") from None
