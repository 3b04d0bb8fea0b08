"""TF Serving warm-up records: one PredictionLog per signature, run by the server at load time
so that the first real request does not pay for graph optimization and kernel selection."""

from __future__ import annotations

import os

import numpy as np
import tensorflow as tf

from keras_preact.export.signatures import EXAMPLE_FEATURE

WARMUP_FILE = os.path.join("assets.extra", "tf_serving_warmup_requests")


def warmup_requests(model_name: str, side: int) -> list:
    """PredictionLog protos calling `serving_default`, `serving_bytes` and `classify` with one
    mid-grey `side` x `side` image each.

    Example:
    >>> [log.predict_log.request.model_spec.signature_name for log in warmup_requests("m", 8)]
    ['serving_default', 'serving_bytes', 'classify']
    """
    from tensorflow_serving.apis import model_pb2, predict_pb2, prediction_log_pb2

    image = np.full((1, side, side, 3), 128, np.uint8)
    png = tf.io.encode_png(image[0]).numpy()
    example = tf.train.Example(
        features=tf.train.Features(
            feature={EXAMPLE_FEATURE: tf.train.Feature(bytes_list=tf.train.BytesList(value=[png]))}
        )
    ).SerializeToString()
    inputs = {
        "serving_default": ("images", image),
        "serving_bytes": ("image_bytes", np.array([png], object)),
        "classify": ("inputs", np.array([example], object)),
    }
    logs = []
    for signature, (key, value) in inputs.items():
        request = predict_pb2.PredictRequest(
            model_spec=model_pb2.ModelSpec(name=model_name, signature_name=signature)
        )
        request.inputs[key].CopyFrom(tf.make_tensor_proto(value))
        logs.append(
            prediction_log_pb2.PredictionLog(
                predict_log=prediction_log_pb2.PredictLog(request=request)
            )
        )
    return logs


def write_warmup(version_dir: str, model_name: str, side: int) -> str:
    """Writes `assets.extra/tf_serving_warmup_requests` under `version_dir`; returns its path."""
    path = os.path.join(version_dir, WARMUP_FILE)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with tf.io.TFRecordWriter(path) as writer:
        for log in warmup_requests(model_name, side):
            writer.write(log.SerializeToString())
    return path
