"""The deployment kit's clients build requests the exported signatures accept.

No server here: each request is decoded the way TF Serving decodes it (REST row format with
{"b64": ...}; gRPC TensorProtos; Classify's tf.Examples) and run on the loaded SavedModel.
"""

from __future__ import annotations

import base64
import importlib.util
import json
import os
import pathlib
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf

import keras_preact
from keras_preact.export import export_model
from keras_preact.labels import class_names
from keras_preact.weights import records

KIT = pathlib.Path(__file__).resolve().parents[2] / "export"


def load_kit_module(name: str):
    spec = importlib.util.spec_from_file_location(name, KIT / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def served(tmp_path_factory, cifar10_data_dir):
    """The published preact-20 exported, and real images of the official test split."""
    import tensorflow_datasets as tfds

    path = export_model(keras_preact.build("preact-20", weights="cifar10"),
                              tmp_path_factory.mktemp("kit"), name="m")
    images, labels = tfds.as_numpy(tfds.load(
        "cifar10", split=records.released("preact-20")["cifar10"].test_split,
        data_dir=cifar10_data_dir, download=False, as_supervised=True, batch_size=-1))
    images, labels = images[:2], labels[:2]
    encoded = [tf.io.encode_png(image).numpy() for image in images]
    signatures = tf.saved_model.load(path).signatures
    reference = signatures["serving_default"](images=tf.constant(images))
    # the served network gets these right: each request below must return the same
    truth = [class_names(10)[label].encode() for label in labels]
    assert reference["labels"][:, 0].numpy().tolist() == truth
    return signatures, images, encoded, reference


def rest_instances(value):
    """TF Serving's JSON decoding of one input: {"b64": s} -> bytes, lists -> a tensor."""
    if isinstance(value, dict):
        return base64.b64decode(value["b64"])
    return [rest_instances(v) for v in value] if isinstance(value, list) else value


def rest_example(features: dict) -> bytes:
    feature = {
        key: tf.train.Feature(bytes_list=tf.train.BytesList(value=[rest_instances(v)]))
        for key, v in features.items()
    }
    return tf.train.Example(features=tf.train.Features(feature=feature)).SerializeToString()


def test_rest_payloads(served):
    signatures, images, encoded, reference = served
    rest = load_kit_module("rest_client")
    payload = rest.uint8_payload(images)
    out = signatures[payload["signature_name"]](
        images=tf.constant(rest_instances(payload["instances"]), tf.uint8)
    )
    np.testing.assert_array_equal(out["probabilities"], reference["probabilities"])

    payload = rest.bytes_payload(encoded)
    out = signatures[payload["signature_name"]](
        image_bytes=tf.constant(rest_instances(payload["instances"]))
    )
    np.testing.assert_allclose(out["probabilities"], reference["probabilities"], atol=1e-6)

    payload = rest.classify_payload(encoded)
    out = signatures[payload["signature_name"]](
        inputs=tf.constant([rest_example(e) for e in payload["examples"]])
    )
    np.testing.assert_array_equal(out["classes"], reference["labels"])


def test_grpc_requests(served):
    signatures, _, encoded, reference = served
    grpc_client = load_kit_module("grpc_client")
    request = grpc_client.predict_request("m", encoded)
    assert request.model_spec.signature_name == "serving_bytes"
    inputs = {k: tf.constant(tf.make_ndarray(v)) for k, v in request.inputs.items()}
    out = signatures["serving_bytes"](**inputs)
    np.testing.assert_allclose(out["probabilities"], reference["probabilities"], atol=1e-6)

    request = grpc_client.classify_request("m", encoded)
    examples = [e.SerializeToString() for e in request.input.example_list.examples]
    out = signatures[request.model_spec.signature_name](inputs=tf.constant(examples))
    np.testing.assert_array_equal(out["classes"], reference["labels"])
    np.testing.assert_allclose(out["scores"], reference["scores"], atol=1e-6)


def test_the_kit_serves_the_model_its_clients_ask_for():
    """models.config is a valid ModelServerConfig; the clients' default model and section 0
    of export/README.md name the model it serves; the Kubernetes readiness probe names none
    (it was hard-coded to preact-20: a pod serving other models never became ready)."""
    import re

    from google.protobuf import text_format
    from tensorflow_serving.config import model_server_config_pb2

    config = text_format.Parse((KIT / "models.config").read_text(),
                               model_server_config_pb2.ModelServerConfig())
    served = {c.name: c.base_path for c in config.model_config_list.config}
    assert served == {"preact-20": "/models/preact-20"}  # every listed model must exist
    for client in ("rest_client", "grpc_client"):
        default = re.search(r'"--model", default="([^"]+)"', (KIT / f"{client}.py").read_text())
        assert default[1] in served, client
    deployment = (KIT / "kubernetes.yaml").read_text()
    probe = deployment.split("readinessProbe:")[1].split("resources:")[0]
    assert "tcpSocket: {port: rest}" in probe and "/v1/models" not in deployment
    assert "keras-preact export preact-20 --weights cifar10" in (KIT / "README.md").read_text()


def run_client(*args, **env) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, timeout=120,
                          env={**os.environ, **env})


def test_rest_client_without_a_server_is_one_line(tmp_path):
    image = tmp_path / "x.png"
    image.write_bytes(b"\x89PNG")
    done = run_client(str(KIT / "rest_client.py"), str(image), "--host", "http://127.0.0.1:9")
    assert done.returncode == 1 and "Traceback" not in done.stderr
    assert done.stderr.startswith("rest_client.py: error: no TF Serving at "
                                  "http://127.0.0.1:9/v1/models/preact-20:predict (")
    assert done.stderr.endswith("start it (export/README.md, step 0) or pass --host\n")
    assert done.stderr.count("\n") == 1
    missing = run_client(str(KIT / "rest_client.py"), str(tmp_path / "none.png"))
    assert missing.returncode == 2 and missing.stderr.splitlines()[-1] == (
        f"rest_client.py: error: cannot read image {str(tmp_path / 'none.png')!r}: "
        "No such file or directory")


def test_rest_client_names_what_the_server_answered(tmp_path):
    """An unknown model: TF Serving's 404 {"error": ...} as one line, not an HTTPError."""
    import http.server
    import threading

    class NotFound(http.server.BaseHTTPRequestHandler):
        def do_POST(self):
            body = json.dumps({"error": "Servable not found for request: Latest(nope)"})
            self.send_response(404)
            self.end_headers()
            self.wfile.write(body.encode())

        def log_message(self, *args):
            pass

    server = http.server.HTTPServer(("127.0.0.1", 0), NotFound)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    image = tmp_path / "x.png"
    image.write_bytes(b"\x89PNG")
    host = f"http://127.0.0.1:{server.server_port}"
    try:
        done = run_client(str(KIT / "rest_client.py"), str(image), "--host", host,
                          "--model", "nope")
    finally:
        server.shutdown()
    assert done.returncode == 1 and done.stderr == (
        f"rest_client.py: error: {host}/v1/models/nope:predict: HTTP 404 Not Found: Servable "
        "not found for request: Latest(nope)\n")


@pytest.mark.parametrize("client", ["rest_client", "grpc_client"])
def test_client_help_is_whole_and_needs_no_tensorflow(client):
    """grpc_client.py --help took 6.7 s (TensorFlow imported first); rest_client.py's
    description stopped mid-sentence."""
    probe = ("import runpy, sys\n"
             f"sys.argv = ['{client}.py', '--help']\n"
             "try:\n"
             f"    runpy.run_path({str(KIT / (client + '.py'))!r}, run_name='__main__')\n"
             "except SystemExit:\n"
             "    pass\n"
             "print('tensorflow' in sys.modules)\n")
    done = run_client("-c", probe)
    assert done.returncode == 0 and done.stdout.splitlines()[-1] == "False"
    doc = load_kit_module(client).__doc__
    assert " ".join(doc.split()) in " ".join(done.stdout.split())  # every line of it
