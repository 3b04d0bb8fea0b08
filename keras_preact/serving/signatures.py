"""The serving signatures baked into an exported SavedModel.

Three entry points share one traced model call (`predict`), so a 1001-layer net is traced once:

- `serving_default`: `images` uint8 `[batch, height, width, 3]`, any height/width.
- `serving_bytes`: `image_bytes` string `[batch]`, encoded JPEG or PNG.
- `classify`: `inputs` string `[batch]` of serialized `tf.train.Example`s with an
  `image/encoded` bytes feature; outputs `classes` (label strings) and `scores`, the contract of
  TF Serving's Classify API (which accepts at most those two outputs).

Every image goes through the evaluation geometry (`resize_for_eval`) and the training
normalization (`preprocess_input`) of `keras_preact.preprocessing`, then the model in inference
mode (`training=False`: BatchNorm uses its moving statistics).
"""

from __future__ import annotations

import keras
import tensorflow as tf

from keras_preact.builder import outputs_logits
from keras_preact.preprocessing import EVAL_SIZE, family_of, preprocess_input, resize_for_eval

# Largest accepted image height/width, in pixels: bounds the memory a request can take
# (a 4096x4096 RGB image decodes to 48 MiB).
MAX_SIDE = 4096
TOP_K = 5
EXAMPLE_FEATURE = "image/encoded"
JPEG_MAGIC = b"\xff\xd8\xff"
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def model_side(model: keras.Model) -> int:
    """The square input side the model expects (its family's eval size if unspecified)."""
    height, width = model.input_shape[1:3]
    if height != width:
        raise ValueError(
            f"Export needs a square model input. Received input shape {model.input_shape}."
        )
    return height or EVAL_SIZE[family_of(model)]


def _probabilities(model: keras.Model):
    """The model's call in inference mode, with softmax added to a logits head."""
    if len(model.output_shape) != 2:
        raise ValueError(
            "Export needs a classifier with a (batch, classes) output. "
            f"Received output shape {model.output_shape}."
        )
    is_logits = outputs_logits(model)

    def call(x):
        y = model(x, training=False)
        return tf.nn.softmax(y) if is_logits else y

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


def build_signatures(model: keras.Model, labels) -> dict:
    """`{signature name: tf.function}` for `model`, with `labels` as the class names.

    Example:
    >>> import keras_preact
    >>> from keras_preact.labels import class_names
    >>> fns = build_signatures(keras_preact.build("preact-20", depth=8), class_names(10))
    >>> sorted(fns)
    ['classify', 'serving_bytes', 'serving_default']
    """
    family = family_of(model)
    side = model_side(model)
    probabilities = _probabilities(model)
    names = tf.constant(list(labels), tf.string)
    k = min(TOP_K, len(labels))

    @_traced(tf.TensorSpec([None, side, side, 3], tf.float32))
    def predict(resized):
        probs = probabilities(preprocess_input(resized, family))
        scores, classes = tf.math.top_k(probs, k)
        return {
            "probabilities": probs,
            "classes": tf.cast(classes, tf.int64),
            "scores": scores,
            "labels": tf.gather(names, classes),
        }

    def decode_one(data):
        height, width = tf.unstack(_encoded_shape(data))
        with tf.control_dependencies(_check_sides(height, width, "image_bytes")):
            image = tf.io.decode_image(data, channels=3, dtype=tf.uint8, expand_animations=False)
        return tf.ensure_shape(resize_for_eval(image, family, side), [side, side, 3])

    def predict_encoded(image_bytes):
        # One image at a time: each may have its own size until resized.
        resized = tf.map_fn(
            decode_one, image_bytes, fn_output_signature=tf.TensorSpec([side, side, 3], tf.float32)
        )
        return predict(resized)

    @_traced(tf.TensorSpec([None, None, None, 3], tf.uint8, name="images"))
    def serving_default(images):
        shape = tf.shape(images)
        with tf.control_dependencies(_check_sides(shape[1], shape[2], "images")):
            resized = resize_for_eval(images, family, side)
        return predict(tf.ensure_shape(resized, [None, side, side, 3]))

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
