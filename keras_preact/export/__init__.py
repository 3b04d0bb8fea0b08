"""Exports of a trained classifier, one entry: `export_model(model, path, format=...)`.

- "saved_model": a TF Serving version `path/NAME/VERSION/` (`saved_model`: signatures for
  uint8 images, image bytes and tf.Examples, preprocessing inside, `signatures`, `warmup`,
  `layout`);
- "onnx", "litert", "openvino": one artifact at `path` (`runtimes`): uint8 images in,
  preprocessing inside, probabilities out, class names in its metadata.

Every format is written to a temporary name and renamed into place once complete, and never
replaces what exists. What is exported is `loading.load_for_export`'s model (a SavedModel
in its `serving_form`, the other formats as the plain layer graph). Only `runtimes` is
imported up front (the CLI reads its formats); the rest needs TensorFlow and loads when used.

Example:
>>> import os, tempfile, keras_preact
>>> out = os.path.join(tempfile.mkdtemp(), "m.onnx")
>>> export_model(keras_preact.build("preact-20", depth=8), out, format="onnx") == out
True
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import TYPE_CHECKING

from keras_preact.export.runtimes import EXPORT_FORMATS

if TYPE_CHECKING:  # the CLI imports this package before Keras
    from keras_preact.api import ModelOrPath


def export_model(model_or_path: ModelOrPath, path: str | os.PathLike,
                 format: str = "saved_model", *, name: str | None = None,
                 version: int | None = None, labels: Sequence[str] | None = None,
                 new_labels: bool = False) -> str:
    """Exports a classifier (a `keras.Model`, a `.keras` file or a trainer run dir) in
    `format`, one of `EXPORT_FORMATS`; returns what was written.

    "saved_model": `path` is TF Serving's base dir; `name` (default: a run dir's own name or
    the model's), `version` (default: the next free one), `labels` (default: those the run
    recorded) and `new_labels` (allow other labels than the name's newest version has) as
    `saved_model.export_saved_model` takes them. "onnx", "litert", "openvino": `path` is the
    model file (`runtimes.export`); those take no name, version or labels.
    """
    if format not in EXPORT_FORMATS:
        raise ValueError(f"Unknown format {format!r}. Valid: {list(EXPORT_FORMATS)}.")
    if format == "saved_model":
        from keras_preact.export.saved_model import export_saved_model

        return export_saved_model(model_or_path, path, name=name, version=version,
                                  labels=labels, new_labels=new_labels)
    given = [k for k, v in {"name": name, "version": version, "labels": labels,
                            "new_labels": new_labels or None}.items() if v is not None]
    if given:
        raise ValueError(f"format={format!r} takes no {', '.join(given)} (SavedModel only).")
    from keras_preact.export.runtimes import export

    return export(model_or_path, path, format=format)


__all__ = ["EXPORT_FORMATS", "export_model"]
