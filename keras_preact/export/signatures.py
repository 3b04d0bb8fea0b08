"""The serving signatures baked into an exported SavedModel.

Three entry points share one traced model call (`predict`), so a 1001-layer net is traced once:

- `serving_default`: `images` uint8 `[batch, height, width, 3]`, any height/width.
- `serving_bytes`: `image_bytes` string `[batch]`, encoded JPEG or PNG.
- `classify`: `inputs` string `[batch]` of serialized `tf.train.Example`s with an
  `image/encoded` bytes feature; outputs `classes` (label strings) and `scores`, the contract of
  TF Serving's Classify API (which accepts at most those two outputs).

Every image goes through the evaluation geometry (`resize_for_eval`) and the training
normalization (`preprocess_input`) of `keras_preact.preprocessing`, then the model in inference
mode (`training=False`: BatchNorm uses its moving statistics). Two limits bound the memory and
time of one image: its sides (`MAX_SIDE`, larger is an InvalidArgument) and its aspect ratio
(`MAX_ASPECT_RATIO`, a longer side is centre-cropped first). A batch of 0 gets empty outputs.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import keras
import tensorflow as tf

from keras_preact.api import preprocessing_of
from keras_preact.arch.introspect import output_kind
from keras_preact.labels import check_names, class_names
from keras_preact.preprocessing import resize_for_eval

# Largest accepted image height/width, in pixels: bounds the memory an image can take
# (a 4096x4096 RGB image decodes to 48 MiB).
MAX_SIDE = 4096
# Longest side / shorter side above which the longer side is centre-cropped before the eval
# geometry. The ImageNet geometry scales the *shorter* side to 256, so a 1x4096 image would
# become 256 x 1,048,576 floats (3 GB) of which only the centre 224x224 is used; at this ratio
# the resized image is at most 256 x 1024. Images up to 4:1 are served exactly as evaluated.
MAX_ASPECT_RATIO = 4
TOP_K = 5
EXAMPLE_FEATURE = "image/encoded"
JPEG_MAGIC = b"\xff\xd8\xff"
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def model_side(model: keras.Model) -> int:
    """The square input side the model expects (its preprocessing's eval size if unspecified)."""
    height, width = model.input_shape[1:3]
    if height != width:
        raise ValueError(
            f"Export needs a square model input. Received input shape {model.input_shape}."
        )
    return height or preprocessing_of(model).size


def classifier_probabilities(model: keras.Model) -> Callable[[tf.Tensor], tf.Tensor]:
    """`x -> class probabilities` for a classifier, in inference mode; refuses other models.

    Logits get a softmax; softmax and sigmoid outputs are served as they are (a sigmoid head's
    scores are independent per-class probabilities). Features (`include_top=False`) and models
    with several outputs raise ValueError.

    Example:
    >>> import keras_preact
    >>> call = classifier_probabilities(keras_preact.build("preact-20", depth=8))
    >>> tuple(call(tf.zeros((2, 32, 32, 3))).shape)
    (2, 10)
    """
    kind = output_kind(model)
    if kind == "features" or len(model.output_shape) != 2:
        raise ValueError(
            "Export needs a classifier with one (batch, classes) output of logits or "
            f"probabilities. Received: a model whose output is {kind} of shape "
            f"{model.output_shape} (a model built with include_top=False outputs features)."
        )

    def call(x):
        y = model(x, training=False)
        return tf.nn.softmax(y) if kind == "logits" else y

    return call


def _check_sides(height, width, what: str):
    """Assert ops: both sides in [1, MAX_SIDE] (InvalidArgument otherwise)."""
    sides = tf.cast(tf.stack([height, width]), tf.int64)
    return [
        tf.debugging.assert_positive(sides, message=f"{what}: empty image"),
        tf.debugging.assert_less_equal(
            sides,
            tf.constant(MAX_SIDE, tf.int64),
            message=f"{what}: image height/width above the maximum of {MAX_SIDE} pixels",
        ),
    ]


def crop_aspect_ratio(images: tf.Tensor) -> tf.Tensor:
    """Centre-crops the longer side of `images` (`[..., height, width, channels]`) to at most
    `MAX_ASPECT_RATIO` times the shorter one; images within the ratio are returned as they are.

    Example:
    >>> tuple(crop_aspect_ratio(tf.zeros((1, 4096, 3))).shape)
    (1, 4, 3)
    """
    shape = tf.shape(images)
    height, width = shape[-3], shape[-2]
    longest = MAX_ASPECT_RATIO * tf.minimum(height, width)
    new_height, new_width = tf.minimum(height, longest), tf.minimum(width, longest)
    top, left = (height - new_height) // 2, (width - new_width) // 2
    return images[..., top : top + new_height, left : left + new_width, :]


def _encoded_shape(data):
    """(height, width) read from a JPEG/PNG header, without decoding the pixels."""
    is_jpeg = tf.equal(tf.strings.substr(data, 0, 3), JPEG_MAGIC)
    is_png = tf.equal(tf.strings.substr(data, 0, 8), PNG_MAGIC)
    check = tf.debugging.Assert(
        is_jpeg | is_png,
        ["image_bytes: not a JPEG or PNG image; bytes received:", tf.strings.length(data)],
    )

    def png_shape():
        # IHDR: big-endian uint32 width then height at bytes 16-23. Padding keeps a truncated
        # file from failing here; decode_png reports it below.
        header = tf.strings.substr(tf.strings.join([data, b"\0" * 24]), 16, 8)
        digits = tf.cast(tf.io.decode_raw(header, tf.uint8), tf.int64)
        width, height = tf.unstack(
            tf.reduce_sum(tf.reshape(digits, (2, 4)) * [2**24, 2**16, 2**8, 1], axis=1)
        )
        return tf.stack([height, width])

    with tf.control_dependencies([check]):
        return tf.cond(
            is_jpeg,
            lambda: tf.cast(tf.image.extract_jpeg_shape(data)[:2], tf.int64),
            png_shape,
        )


def _traced(*specs: tf.TensorSpec):
    """tf.function with a fixed signature; no AutoGraph (no Python control flow on tensors
    here, and converting a 1001-layer model's call is slow)."""
    return tf.function(input_signature=list(specs), autograph=False)


def served_labels(model: keras.Model, labels: Sequence[str] | None = None) -> tuple[str, ...]:
    """The class names a classifier's signatures serve: `labels`, checked against its
    outputs, or `keras_preact.labels.class_names`' defaults."""
    num_classes = model.output_shape[-1]
    return class_names(num_classes) if labels is None else check_names(labels, num_classes)


def build_signatures(model: keras.Model, labels: Sequence[str] | None = None) -> dict:
    """`{signature name: tf.function}` for `model`, with `labels` as the class names (default
    `keras_preact.labels.class_names`). Checks the model and labels; traces nothing yet.

    Example:
    >>> import keras_preact
    >>> fns = build_signatures(keras_preact.build("preact-20", depth=8))
    >>> sorted(fns)
    ['classify', 'serving_bytes', 'serving_default']
    """
    probabilities = classifier_probabilities(model)  # first: it names a model that is no classifier
    preprocessing = preprocessing_of(model)
    side = model_side(model)
    num_classes = model.output_shape[-1]
    names = tf.constant(served_labels(model, labels), tf.string)
    k = min(TOP_K, num_classes)

    @_traced(tf.TensorSpec([None, side, side, 3], tf.float32))
    def predict(resized):
        probs = probabilities(preprocessing.normalize(resized))
        scores, classes = tf.math.top_k(probs, k)
        return {
            "probabilities": probs,
            "classes": tf.cast(classes, tf.int64),
            "scores": scores,
            "labels": tf.gather(names, classes),
        }

    def empty_outputs():
        traced = predict.get_concrete_function().structured_outputs
        return {key: tf.zeros([0, *t.shape[1:]], t.dtype) for key, t in traced.items()}

    def unless_empty(batch_size, compute):
        # The model's ops fail on a batch of 0; TF Serving clients expect empty outputs.
        return tf.cond(batch_size > 0, compute, empty_outputs)

    def geometry(images):
        return resize_for_eval(crop_aspect_ratio(images), preprocessing, side)

    def decode_one(data):
        height, width = tf.unstack(_encoded_shape(data))
        with tf.control_dependencies(_check_sides(height, width, "image_bytes")):
            image = tf.io.decode_image(data, channels=3, dtype=tf.uint8, expand_animations=False)
        return tf.ensure_shape(geometry(image), [side, side, 3])

    def predict_encoded(image_bytes):
        # One image at a time: each may have its own size until resized.
        def compute():
            resized = tf.map_fn(
                decode_one,
                image_bytes,
                fn_output_signature=tf.TensorSpec([side, side, 3], tf.float32),
            )
            return predict(resized)

        return unless_empty(tf.size(image_bytes), compute)

    @_traced(tf.TensorSpec([None, None, None, 3], tf.uint8, name="images"))
    def serving_default(images):
        shape = tf.shape(images)

        def compute():
            with tf.control_dependencies(_check_sides(shape[1], shape[2], "images")):
                resized = geometry(images)
            return predict(tf.ensure_shape(resized, [None, side, side, 3]))

        return unless_empty(shape[0], compute)

    @_traced(tf.TensorSpec([None], tf.string, name="image_bytes"))
    def serving_bytes(image_bytes):
        return predict_encoded(image_bytes)

    @_traced(tf.TensorSpec([None], tf.string, name="inputs"))
    def classify(inputs):
        features = tf.io.parse_example(
            inputs, {EXAMPLE_FEATURE: tf.io.FixedLenFeature([], tf.string)}
        )
        outputs = predict_encoded(features[EXAMPLE_FEATURE])
        return {"classes": outputs["labels"], "scores": outputs["scores"]}

    return {
        "serving_default": serving_default,
        "serving_bytes": serving_bytes,
        "classify": classify,
    }
