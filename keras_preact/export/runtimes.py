"""Export for ONNX Runtime, LiteRT and OpenVINO: uint8 images in, probabilities out.

Every artifact holds the whole inference path, so the other side writes no preprocessing:

- input `images`: uint8 RGB `[batch, side, side, 3]` at the model's input size, batch dynamic;
- inside the graph: `keras_preact.preprocessing.preprocess_input` with the model's statistics
  (`keras_preact.api.preprocessing_of`: a `-timm` net takes timm's), the
  model in inference mode (BatchNorm with its moving statistics), softmax on a logits head;
- output `probabilities`: float32 `[batch, classes]`: softmax, or a sigmoid head's
  independent per-class probabilities as they are (the SavedModel's rule,
  `keras_preact.export.signatures.classifier_probabilities`; feature extractors and
  multi-output models are refused);
- class names (`keras_preact.labels.class_names`): ONNX `metadata_props["labels"]` and
  OpenVINO rt_info `keras_preact/labels` (JSON lists), LiteRT a `NAME.labels.txt` file beside
  `NAME.tflite` (one name per line: LiteRT has no metadata field the runtime reads).

Why not Keras' `model.export(path, format=...)`: it traces the model through an ExportArchive
that re-traces it with AutoGraph while collecting resources (three traces), and hands the
converters a function whose weights are still variables. OpenVINO's TensorFlow frontend then
finds each variable by scanning every capture of the graph (quadratic in depth): for
preact-1001 neither it nor the LiteRT export finished in reasonable time. Here the model is
traced once and its
variables frozen into constants (`inference_function`); the same frozen function goes to the
three converters Keras itself uses (tf2onnx, `openvino.convert_model`, `TFLiteConverter`).
Most of tf2onnx's time goes to its transpose optimizer, which moves the NHWC/NCHW transposes
around each convolution one node per sweep over the graph. Export times per runtime:
benchmarks/README.md (Serving runtimes); parity with Keras: tests/export/test_runtimes.py.

Scanned stages (`keras_preact.arch.scan`) are exported as the plain layer graph: tf2onnx leaves the
scanned loop as an op ONNX does not have (`PartitionedCall`), and in the plain graph each BN is
a constant scale and offset that the runtimes can fold into the neighbouring convolution.

Example:
>>> import os, tempfile, keras_preact
>>> path = export(keras_preact.build("preact-20", depth=8),
...               os.path.join(tempfile.mkdtemp(), "m.tflite"), format="litert")
>>> sorted(os.listdir(os.path.dirname(path)))
['m.labels.txt', 'm.tflite']
"""

from __future__ import annotations

import json
import os
from typing import TYPE_CHECKING

from keras_preact import files

# Keras and TensorFlow are imported inside the functions: the CLI reads FORMATS to build its
# parser, and `keras-preact --help` must not wait for TensorFlow.
if TYPE_CHECKING:
    import keras
    import tensorflow as tf

    from keras_preact.api import ModelOrPath

# Format -> file suffix the runtimes (and Keras' exporters) expect.
FORMATS = {"onnx": ".onnx", "litert": ".tflite", "openvino": ".xml"}
# Every format keras_preact exports (`keras_preact.export.export_model`): TF Serving's
# SavedModel (`saved_model`) first.
EXPORT_FORMATS = ("saved_model", *FORMATS)
INPUT_NAME = "images"
OUTPUT_NAME = "probabilities"
LABELS_KEY = "labels"
LITERT_LABELS_SUFFIX = ".labels.txt"
# A serialized ONNX model (protobuf) and a LiteRT model (FlatBuffers) hold at most 2 GiB.
SIZE_LIMIT_BYTES = {"onnx": 2**31, "litert": 2**31}


def output_files(path: str, format: str) -> list[str]:
    """The files `export(..., path, format=format)` writes: the model file first."""
    stem = os.path.splitext(path)[0]
    extra = {"litert": LITERT_LABELS_SUFFIX, "openvino": ".bin"}.get(format)
    return [path] + ([stem + extra] if extra else [])


def check_target(path: str, format: str) -> None:
    """ValueError or OSError (one line) unless `export(..., path, format=format)` can write
    there: a known format, the suffix its runtime expects, a directory that is (or can be
    made) a directory, none of `output_files` present. `export` checks first; the CLI calls it
    before it builds a model too."""
    if format not in FORMATS:
        raise ValueError(f"Unknown format {format!r}. Valid: {sorted(FORMATS)}.")
    if not path.endswith(FORMATS[format]):
        raise ValueError(
            f"A {format} export needs a path ending in {FORMATS[format]!r}. Received: {path!r}"
        )
    files.check_directory(os.path.dirname(os.path.abspath(path)))
    files.check_new(output_files(path, format))


def _check_model(model, format: str) -> None:
    size = 4 * model.count_params()  # float32 weights
    limit = SIZE_LIMIT_BYTES.get(format)
    if limit and size >= limit:
        raise ValueError(
            f"{model.name!r} has {size / 2**30:.2f} GiB of float32 weights: a {format} file "
            f"holds at most {limit / 2**30:.0f} GiB. Export it with format='openvino' or as a "
            "SavedModel."
        )


def inference_function(model: keras.Model) -> tf.types.experimental.PolymorphicFunction:
    """The exported computation: a `tf.function` `images` (uint8) -> `{"probabilities"}`,
    traced once, with every weight frozen into a constant.

    Example:
    >>> import keras_preact
    >>> fn = inference_function(keras_preact.build("preact-20", depth=8))
    >>> fn.input_signature[0].shape.as_list(), list(fn.get_concrete_function().structured_outputs)
    ([None, 32, 32, 3], ['probabilities'])
    """
    import tensorflow as tf
    from tensorflow.python.framework.convert_to_constants import (
        convert_variables_to_constants_v2,
    )

    from keras_preact.api import preprocessing_of
    from keras_preact.export.signatures import classifier_probabilities, model_side
    from keras_preact.weights.storage import in_form

    model = in_form(model, "layers")
    # The SavedModel's rule: what the output holds decides the softmax; non-classifiers fail.
    probabilities = classifier_probabilities(model)
    side, preprocessing = model_side(model), preprocessing_of(model)
    spec = tf.TensorSpec([None, side, side, 3], tf.uint8, name=INPUT_NAME)

    # No AutoGraph: the call has no Python control flow on tensors, and converting a
    # 3,000-layer call is slow.
    @tf.function(input_signature=[spec], autograph=False)
    def serve(images):
        return probabilities(preprocessing.normalize(images))

    frozen = convert_variables_to_constants_v2(serve.get_concrete_function())

    # Freezing drops the input/output structure; a call of the frozen graph restores the
    # names, so the converters name the artifact's tensors `images` and `probabilities`.
    @tf.function(input_signature=[spec], autograph=False)
    def named(images):
        return {OUTPUT_NAME: frozen(images)[0]}

    return named


def _write_onnx(fn, path: str, metadata: dict) -> None:
    import onnx
    import tf2onnx

    proto, _ = tf2onnx.convert.from_function(fn, fn.input_signature)
    onnx.helper.set_model_props(proto, metadata)
    onnx.save(proto, path)


def _write_openvino(fn, path: str, metadata: dict) -> None:
    import openvino as ov

    ov_model = ov.convert_model(fn.get_concrete_function())
    for key, value in metadata.items():
        ov_model.set_rt_info(value, ["keras_preact", key])
    # save_model halves the weights to float16 by default: keep the float32 the model has.
    ov.save_model(ov_model, path, compress_to_fp16=False)


def _write_litert(fn, path: str, metadata: dict) -> None:
    import tensorflow as tf

    # The module makes the converter write a `serving_default` signature (inputs and outputs
    # by name); built-in ops only, so any stock LiteRT runtime runs the file (no Flex ops).
    root = tf.Module()
    root.serve = fn
    converter = tf.lite.TFLiteConverter.from_concrete_functions([fn.get_concrete_function()], root)
    data = converter.convert()
    with open(path, "wb") as f:
        f.write(data)
    with open(output_files(path, "litert")[1], "w") as f:
        f.write("".join(f"{name}\n" for name in json.loads(metadata[LABELS_KEY])))


WRITERS = {"onnx": _write_onnx, "litert": _write_litert, "openvino": _write_openvino}


def export(model_or_path: ModelOrPath, path: str | os.PathLike, *, format: str) -> str:
    """Writes `model_or_path` as one ONNX, LiteRT or OpenVINO artifact; returns its path.

    Args:
        model_or_path: a `keras.Model`, a `.keras` file or a trainer run dir: a classifier
            with one output, as `keras_preact.export.saved_model.export_saved_model` takes.
        path: the model file: `*.onnx`, `*.tflite` (plus `*.labels.txt` beside it) or `*.xml`
            (plus `*.bin`). Existing files are never overwritten (FileExistsError), nor is a
            path another export is writing (FileExistsError at once). The files appear all
            together once complete (`keras_preact.files.new_files`): an export killed at any
            moment leaves none of them.
        format: "onnx", "litert" or "openvino" (see `FORMATS`).

    OpenVINO on a CPU with bfloat16 units (AVX512-BF16, AMX) computes in bfloat16 unless the
    model is compiled with `{"INFERENCE_PRECISION_HINT": "f32"}`, for Keras' float32 outputs.

    Example:
    >>> import tempfile, keras_preact
    >>> out = os.path.join(tempfile.mkdtemp(), "m.onnx")
    >>> export(keras_preact.build("preact-20", depth=8), out, format="onnx") == out
    True
    """
    from keras_preact.api import preprocessing_of
    from keras_preact.export.loading import load_for_export
    from keras_preact.labels import class_names

    path = os.fspath(path)
    check_target(path, format)
    # From here until the files are in place, a second export to `path` is refused; a kill
    # leaves only hidden temporaries, which the next export replaces (`files.new_files`).
    with files.new_files(output_files(path, format)) as temps:
        model, name = load_for_export(model_or_path)
        _check_model(model, format)
        fn = inference_function(model)  # refuses a model that is not a classifier
        metadata = {
            "model": name,
            "preprocessing": preprocessing_of(model).stats,
            LABELS_KEY: json.dumps(list(class_names(model.output_shape[-1], model_or_path))),
        }
        WRITERS[format](fn, temps[0], metadata)  # it derives the companion's name: temps[1]
    return path
