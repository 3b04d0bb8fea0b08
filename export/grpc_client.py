"""Query a keras-preact model on TF Serving's gRPC API (port 8500) with tensorflow-serving-api.

    python export/grpc_client.py IMAGE.jpg [--model preact-20] [--host 127.0.0.1:8500]
        [--classify]

Predict on `serving_bytes` (input `image_bytes`: the encoded file), or --classify: the Classify
API on `classify` (a tf.Example with `image/encoded`).
"""

from __future__ import annotations

import argparse

# TensorFlow (which tensorflow_serving's protos import) loads in seconds: only once the
# arguments are read, so that --help and a bad argument answer at once.


def predict_request(model: str, encoded: list[bytes]):
    """A PredictRequest for `serving_bytes` (input `image_bytes`)."""
    import tensorflow as tf
    from tensorflow_serving.apis import predict_pb2

    request = predict_pb2.PredictRequest()
    request.model_spec.name = model
    request.model_spec.signature_name = "serving_bytes"
    request.inputs["image_bytes"].CopyFrom(tf.make_tensor_proto(encoded, dtype=tf.string))
    return request


def classify_request(model: str, encoded: list[bytes]):
    """A ClassificationRequest for `classify`: one tf.Example per image (`image/encoded`)."""
    from tensorflow_serving.apis import classification_pb2

    request = classification_pb2.ClassificationRequest()
    request.model_spec.name = model
    request.model_spec.signature_name = "classify"
    for data in encoded:
        example = request.input.example_list.examples.add()
        example.features.feature["image/encoded"].bytes_list.value.append(data)
    return request


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("image")
    parser.add_argument("--model", default="preact-20")
    parser.add_argument("--host", default="127.0.0.1:8500")
    parser.add_argument("--classify", action="store_true")
    args = parser.parse_args()

    try:
        with open(args.image, "rb") as f:
            encoded = [f.read()]
    except OSError as error:
        parser.error(f"cannot read image {args.image!r}: {error.strerror}")
    import grpc
    import tensorflow as tf
    from tensorflow_serving.apis import prediction_service_pb2_grpc

    stub = prediction_service_pb2_grpc.PredictionServiceStub(grpc.insecure_channel(args.host))
    try:
        if args.classify:
            result = stub.Classify(classify_request(args.model, encoded), timeout=30.0)
            for c in result.result.classifications[0].classes:
                print(f"{c.score:.4f}  {c.label}")
            return
        outputs = stub.Predict(predict_request(args.model, encoded), timeout=30.0).outputs
    except grpc.RpcError as error:  # the server's status: UNAVAILABLE, NOT_FOUND, ...
        parser.exit(1, f"{parser.prog}: error: {args.host}: {error.code().name}: "
                       f"{error.details()}\n")
    labels = tf.make_ndarray(outputs["labels"])[0]
    scores = tf.make_ndarray(outputs["scores"])[0]
    for label, score in zip(labels, scores):
        print(f"{score:.4f}  {label.decode()}")


if __name__ == "__main__":
    main()
