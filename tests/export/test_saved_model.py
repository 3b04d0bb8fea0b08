"""Exported SavedModels answer like the Keras model, without Keras.

Every signature is called in a subprocess where importing `keras` and `keras_preact` fails (TF
Serving has neither): `PROBE` loads the SavedModel with `tf.saved_model.load`, runs a plan of
requests and writes their outputs (or errors) as JSON for the tests to check here.
"""

from __future__ import annotations

import base64
import json
import os
import struct
import subprocess
import sys
import textwrap
import zlib

import keras
import numpy as np
import pytest
import tensorflow as tf

import keras_preact
from keras_preact.arch.introspect import output_kind, outputs_logits
from keras_preact.export import export_model
from keras_preact.export.signatures import MAX_ASPECT_RATIO, MAX_SIDE, crop_aspect_ratio
from keras_preact.labels import class_names
from keras_preact.preprocessing import (
    FAMILY_PREPROCESSING,
    Preprocessing,
    preprocess_input,
    resize_for_eval,
)

PROBE = textwrap.dedent(
    """
    import base64, json, resource, sys

    # A None entry makes `import keras...` raise ImportError (and find_spec answer None).
    for blocked in ("keras", "keras_preact", "tf_keras"):
        sys.modules[blocked] = None
    import numpy as np
    import tensorflow as tf

    def decode(spec):
        if "strings" in spec:
            return tf.constant([base64.b64decode(s) for s in spec["strings"]], tf.string)
        raw = np.frombuffer(base64.b64decode(spec["raw"]), spec["dtype"])
        return tf.constant(raw.reshape(spec["shape"]))

    def encode(value):
        value = value.numpy()
        if value.dtype == object:
            return [[s.decode() for s in row] for row in value]
        return value.tolist()

    def warmup_calls(export_dir):
        from tensorflow_serving.apis import prediction_log_pb2
        path = export_dir + "/assets.extra/tf_serving_warmup_requests"
        for record in tf.data.TFRecordDataset(path).as_numpy_iterator():
            request = prediction_log_pb2.PredictionLog.FromString(record).predict_log.request
            yield request.model_spec.signature_name, {
                k: tf.constant(tf.make_ndarray(v)) for k, v in request.inputs.items()}

    def peak_mb():
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024

    plan = json.load(open(sys.argv[1]))
    results, models, growth = {}, {}, {}
    for case in plan:
        model = models.setdefault(case["dir"], tf.saved_model.load(case["dir"]))
        before = peak_mb()
        if case.get("warmup"):
            results[case["id"]] = [
                [name, sorted(model.signatures[name](**inputs))]
                for name, inputs in warmup_calls(case["dir"])]
            continue
        try:
            inputs = {k: decode(v) for k, v in case["inputs"].items()}
            out = model.signatures[case["signature"]](**inputs)
            results[case["id"]] = {k: encode(v) for k, v in out.items()}
        except Exception as e:
            results[case["id"]] = {"error": type(e).__name__, "message": str(e)[:2000]}
        growth[case["id"]] = peak_mb() - before  # MB above the process's peak so far
    results["peak_growth_mb"] = growth
    results["keras_imported"] = [
        m for m, mod in sys.modules.items() if m.split(".")[0] in ("keras", "keras_preact") and mod]
    json.dump(results, open(sys.argv[2], "w"))
    """
)


def run_probe(plan: list[dict], tmp_path) -> dict:
    """Runs `plan` through PROBE in a fresh interpreter; returns {case id: outputs or error}."""
    plan_path, out_path, probe_path = (tmp_path / n for n in ("plan.json", "out.json", "probe.py"))
    plan_path.write_text(json.dumps(plan))
    probe_path.write_text(PROBE)
    subprocess.run(
        [sys.executable, str(probe_path), str(plan_path), str(out_path)],
        check=True,
        env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"},
        timeout=300,
    )
    return json.loads(out_path.read_text())


def array_input(x: np.ndarray) -> dict:
    return {"raw": base64.b64encode(x.tobytes()).decode(), "dtype": x.dtype.str, "shape": x.shape}


def strings_input(items: list[bytes]) -> dict:
    return {"strings": [base64.b64encode(s).decode() for s in items]}


def png(image: np.ndarray) -> bytes:
    return tf.io.encode_png(image).numpy()


def png_header_only(width: int, height: int) -> bytes:
    """A PNG signature + IHDR claiming `width` x `height` (no pixel data)."""
    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    chunk = b"IHDR" + ihdr
    crc = struct.pack(">I", zlib.crc32(chunk))
    return b"\x89PNG\r\n\x1a\n" + struct.pack(">I", 13) + chunk + crc


def example(encoded: bytes) -> bytes:
    feature = tf.train.Feature(bytes_list=tf.train.BytesList(value=[encoded]))
    return tf.train.Example(
        features=tf.train.Features(feature={"image/encoded": feature})
    ).SerializeToString()


def reference(model, images: np.ndarray, family: str, side: int) -> np.ndarray:
    """What the model says in Keras: eval geometry, training normalization, inference BN."""
    resized = resize_for_eval(images, FAMILY_PREPROCESSING[family], side)
    return model(preprocess_input(resized, family), training=False).numpy()


RNG = np.random.default_rng(0)
CIFAR_32 = RNG.integers(0, 256, (3, 32, 32, 3), dtype=np.uint8)
CIFAR_ODD = RNG.integers(0, 256, (2, 45, 37, 3), dtype=np.uint8)
IMAGENET_ODD = RNG.integers(0, 256, (2, 90, 71, 3), dtype=np.uint8)
MIXED = [RNG.integers(0, 256, s, dtype=np.uint8) for s in ((32, 32, 3), (50, 20, 3), (7, 9, 3))]
# Thin images: the ImageNet geometry scales the shorter side up, so these once took
# 256 x 1,048,576 floats (3 GB) at side 224, and 73 x 299,008 (262 MB) at the side 64 used here.
WIDE = RNG.integers(0, 256, (1, MAX_SIDE, 3), dtype=np.uint8)
TALL = RNG.integers(0, 256, (MAX_SIDE, 1, 3), dtype=np.uint8)


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    """Two tiny models exported once, and the probe's answers to every request below."""
    tmp = tmp_path_factory.mktemp("export")
    cifar = keras_preact.build("preact-20", depth=8)
    imagenet = keras_preact.build(
        "preact-18-imagenet", units=(1, 1, 1, 1), input_shape=(64, 64, 3), classes=7
    )
    c_dir = export_model(cifar, tmp / "models", name="cifar")
    i_dir = export_model(imagenet, tmp / "models", name="imagenet")
    jpeg = tf.io.encode_jpeg(MIXED[1]).numpy()
    def images(x):
        return {"images": array_input(x)}

    def image_bytes(items):
        return {"image_bytes": strings_input(items)}

    def examples(items):
        return {"inputs": strings_input([example(e) for e in items])}

    big = np.zeros((1, MAX_SIDE + 1, 2, 3), np.uint8)
    empty_example = tf.train.Example().SerializeToString()
    cases = {
        "c32": (c_dir, "serving_default", images(CIFAR_32)),
        "c_odd": (c_dir, "serving_default", images(CIFAR_ODD)),
        "i_odd": (i_dir, "serving_default", images(IMAGENET_ODD)),
        "i_png": (i_dir, "serving_bytes", image_bytes([png(IMAGENET_ODD[0])])),
        "c_png_mixed": (c_dir, "serving_bytes", image_bytes([png(m) for m in MIXED])),
        "c_jpeg": (c_dir, "serving_bytes", image_bytes([jpeg])),
        "c_example": (c_dir, "classify", examples([png(m) for m in MIXED])),
        "i_example": (i_dir, "classify", examples([png(IMAGENET_ODD[0])])),
        # Thin images right after small requests: their peak memory growth is measured.
        "i_wide": (i_dir, "serving_default", images(WIDE[None])),
        "i_tall_png": (i_dir, "serving_bytes", image_bytes([png(TALL)])),
        "i_tall_example": (i_dir, "classify", examples([png(TALL)])),
        "c_wide": (c_dir, "serving_default", images(WIDE[None])),
        # Bad inputs, each followed by the loaded model answering "c32" again.
        "bad_float": (c_dir, "serving_default", images(CIFAR_32.astype("float32"))),
        "bad_rank": (c_dir, "serving_default", images(CIFAR_32[0])),
        "too_big": (c_dir, "serving_default", images(big)),
        "empty_image": (c_dir, "serving_default", images(np.zeros((1, 0, 5, 3), np.uint8))),
        "bytes_empty": (c_dir, "serving_bytes", image_bytes([b""])),
        "bytes_corrupt_png": (c_dir, "serving_bytes", image_bytes([png(MIXED[0])[:60]])),
        "bytes_corrupt_jpeg": (c_dir, "serving_bytes", image_bytes([jpeg[:40] + b"\0" * 40])),
        "bytes_gif": (c_dir, "serving_bytes", image_bytes([b"GIF89a" + b"\0" * 30])),
        "bytes_huge_png": (c_dir, "serving_bytes", image_bytes([png_header_only(50_000, 50_000)])),
        "example_missing": (c_dir, "classify", {"inputs": strings_input([empty_example])}),
        "example_garbage": (c_dir, "classify", {"inputs": strings_input([b"not an Example"])}),
        "c32_again": (c_dir, "serving_default", images(CIFAR_32)),
    }
    plan = [{"id": k, "dir": d, "signature": s, "inputs": i} for k, (d, s, i) in cases.items()]
    plan += [{"id": f"warmup_{n}", "dir": d, "warmup": True}
             for n, d in {"c": c_dir, "i": i_dir}.items()]
    return {
        "models": {"c": cifar, "i": imagenet},
        "dirs": {"c": c_dir, "i": i_dir},
        "out": run_probe(plan, tmp),
    }


def test_keras_is_not_needed_to_serve(exported):
    assert exported["out"]["keras_imported"] == []
    assert "error" not in exported["out"]["c32"]


def check_outputs(out: dict, probs_ref: np.ndarray, names: tuple[str, ...]):
    """probabilities match to 1e-5; classes/scores/labels are their top-k."""
    probs = np.asarray(out["probabilities"])
    np.testing.assert_allclose(probs, probs_ref, atol=1e-5, rtol=0)
    k = min(5, len(names))
    assert np.asarray(out["classes"]).shape == (len(probs_ref), k)
    np.testing.assert_allclose(
        out["scores"], np.take_along_axis(probs, np.asarray(out["classes"]), 1), atol=0
    )
    np.testing.assert_allclose(out["scores"], -np.sort(-probs_ref, axis=1)[:, :k], atol=1e-5)
    assert out["labels"] == [[names[c] for c in row] for row in out["classes"]]


def test_uint8_matches_keras_at_model_size(exported):
    model = exported["models"]["c"]
    expected = model(preprocess_input(CIFAR_32), training=False).numpy()
    check_outputs(exported["out"]["c32"], expected, class_names(10))


@pytest.mark.parametrize(
    "case, key, images, family, side",
    [("c_odd", "c", CIFAR_ODD, "cifar", 32), ("i_odd", "i", IMAGENET_ODD, "imagenet", 64)],
)
def test_other_image_sizes_use_eval_geometry(exported, case, key, images, family, side):
    model = exported["models"][key]
    names = class_names(model.output_shape[-1])
    check_outputs(exported["out"][case], reference(model, images, family, side), names)


def test_png_bytes_equal_uint8_path(exported):
    out = exported["out"]
    np.testing.assert_allclose(
        out["i_png"]["probabilities"], out["i_odd"]["probabilities"][:1], atol=1e-6
    )
    model = exported["models"]["c"]
    expected = np.concatenate([reference(model, m[None], "cifar", 32) for m in MIXED])
    check_outputs(out["c_png_mixed"], expected, class_names(10))


def test_jpeg_bytes_decode_to_the_pixels_tf_decodes(exported):
    decoded = tf.io.decode_jpeg(tf.io.encode_jpeg(MIXED[1])).numpy()
    expected = reference(exported["models"]["c"], decoded[None], "cifar", 32)
    check_outputs(exported["out"]["c_jpeg"], expected, class_names(10))


def test_tf_example_signature_equals_bytes_path(exported):
    out = exported["out"]
    assert set(out["c_example"]) == {"classes", "scores"}
    assert out["c_example"]["classes"] == out["c_png_mixed"]["labels"]
    np.testing.assert_allclose(out["c_example"]["scores"], out["c_png_mixed"]["scores"], atol=1e-6)
    assert out["i_example"]["classes"] == out["i_png"]["labels"]


@pytest.mark.parametrize("case, message", [
    ("bad_float", "expected to be a uint8 tensor but is a float tensor"),
    ("bad_rank", "must be 4-dimensional[32,32,3]"),
])
def test_wrong_dtype_or_rank_rejected_and_model_keeps_serving(exported, case, message):
    out = exported["out"]
    assert out[case]["error"] == "InvalidArgumentError" and message in out[case]["message"]
    assert out["c32_again"] == out["c32"]


@pytest.mark.parametrize(
    "case, message",
    [
        ("too_big", f"maximum of {MAX_SIDE}"),
        ("empty_image", "empty image"),
        ("bytes_empty", "not a JPEG or PNG"),
        ("bytes_gif", "not a JPEG or PNG"),
        ("bytes_huge_png", f"maximum of {MAX_SIDE}"),
        ("bytes_corrupt_png", "Invalid PNG data"),
        ("bytes_corrupt_jpeg", "Invalid JPEG data"),
        ("example_missing", "image/encoded"),
        ("example_garbage", "Could not parse example input"),
    ],
)
def test_bad_images_are_invalid_argument(exported, case, message):
    out = exported["out"][case]
    assert out.get("error") == "InvalidArgumentError", out
    assert message in out["message"], out["message"]


def cropped_reference(model, image: np.ndarray, family: str, side: int) -> np.ndarray:
    return reference(model, crop_aspect_ratio(tf.constant(image[None])).numpy(), family, side)


@pytest.mark.parametrize(
    "case, key, image, family, side",
    [
        ("i_wide", "i", WIDE, "imagenet", 64),
        ("i_tall_png", "i", TALL, "imagenet", 64),
        ("c_wide", "c", WIDE, "cifar", 32),
    ],
)
def test_thin_images_are_centre_cropped_to_the_max_aspect_ratio(
    exported, case, key, image, family, side
):
    model = exported["models"][key]
    expected = cropped_reference(model, image, family, side)
    check_outputs(exported["out"][case], expected, class_names(model.output_shape[-1]))


def test_thin_images_take_little_memory_in_every_signature(exported):
    out = exported["out"]
    assert out["i_tall_example"]["classes"] == out["i_tall_png"]["labels"]
    for case in ("i_wide", "i_tall_png", "i_tall_example", "c_wide"):
        assert out["peak_growth_mb"][case] < 100, (case, out["peak_growth_mb"][case])


def test_crop_aspect_ratio_bounds_the_longer_side_only():
    image = tf.reshape(tf.range(10 * 43 * 3), (10, 43, 3))
    cropped = crop_aspect_ratio(image).numpy()
    np.testing.assert_array_equal(cropped, image.numpy()[:, 1:41])  # centre 40 = 4 x 10
    batch = tf.zeros((2, 4 * MAX_ASPECT_RATIO + 3, 4, 3), tf.uint8)
    assert crop_aspect_ratio(batch).shape == (2, 4 * MAX_ASPECT_RATIO, 4, 3)
    within = tf.constant(IMAGENET_ODD)
    np.testing.assert_array_equal(crop_aspect_ratio(within).numpy(), IMAGENET_ODD)


@pytest.mark.parametrize(
    "signature, inputs",
    [
        ("serving_default", {"images": np.zeros((0, 32, 32, 3), np.uint8)}),
        ("serving_default", {"images": np.zeros((0, 0, 0, 3), np.uint8)}),
        ("serving_bytes", {"image_bytes": tf.constant([], tf.string)}),
        ("classify", {"inputs": tf.constant([], tf.string)}),
    ],
)
def test_a_batch_of_zero_gets_empty_outputs(exported, signature, inputs):
    out = tf.saved_model.load(exported["dirs"]["c"]).signatures[signature](**inputs)
    expected = {
        "probabilities": ((0, 10), tf.float32), "classes": ((0, 5), tf.int64),
        "scores": ((0, 5), tf.float32), "labels": ((0, 5), tf.string),
    }
    if signature == "classify":
        expected = {"classes": ((0, 5), tf.string), "scores": ((0, 5), tf.float32)}
    assert {k: (tuple(v.shape), v.dtype) for k, v in out.items()} == expected


def test_warmup_records_name_signatures_and_run(exported):
    for key in ("c", "i"):
        calls = exported["out"][f"warmup_{key}"]
        assert [name for name, _ in calls] == ["serving_default", "serving_bytes", "classify"]
        assert calls[0][1] == ["classes", "labels", "probabilities", "scores"]
        assert calls[2][1] == ["classes", "scores"]


def test_saved_model_cli_lists_signatures(exported):
    cli = os.path.join(os.path.dirname(sys.executable), "saved_model_cli")
    command = [cli] if os.path.exists(cli) else ["saved_model_cli"]
    shown = subprocess.run(
        command + ["show", "--dir", exported["dirs"]["c"], "--all"],
        capture_output=True, text=True, check=True, timeout=300,
    ).stdout
    for line in (
        "signature_def['serving_default']", "signature_def['serving_bytes']",
        "signature_def['classify']", "inputs['images']", "dtype: DT_UINT8",
        "inputs['image_bytes']", "inputs['inputs']", "outputs['probabilities']",
        "outputs['labels']",
    ):
        assert line in shown


# What a model outputs decides what is served: one rule (`introspect.output_kind`) for the package.


def net(**overrides):
    return keras_preact.build("preact-20", depth=8, **overrides)


def logits_net():
    return net(classifier_activation=None)


def with_op(op):
    logits = logits_net()
    return keras.Model(logits.inputs, op(logits.outputs[0]))


def two_outputs():
    logits = logits_net()
    return keras.Model(logits.inputs, [logits.outputs[0], logits.get_layer("avg_pool").output])


class Subclassed(keras.Model):
    def call(self, x):
        return x


KINDS = {
    "default head": (net, "probabilities"),
    "logits head": (logits_net, "logits"),
    "sigmoid head": (lambda: net(classifier_activation="sigmoid"), "sigmoid"),
    "Softmax layer": (lambda: keras.Sequential([logits_net(), keras.layers.Softmax()]),
                      "probabilities"),
    "softmax op": (lambda: with_op(keras.ops.softmax), "probabilities"),
    "sigmoid op": (lambda: with_op(keras.ops.sigmoid), "sigmoid"),
    "Activation layer": (lambda: with_op(keras.layers.Activation("softmax")), "probabilities"),
    "log_softmax op": (lambda: with_op(keras.ops.log_softmax), "logits"),
    "nested": (lambda: keras.Sequential([net()]), "probabilities"),
    "nested sigmoid": (lambda: keras.Sequential([logits_net(), keras.layers.Activation(
        "sigmoid")]), "sigmoid"),
    "pooled features": (lambda: net(include_top=False, pooling="avg"), "features"),
    "feature map": (lambda: net(include_top=False), "features"),
    "relu head": (lambda: with_op(keras.layers.Dense(10, activation="relu")), "features"),
}


@pytest.mark.parametrize("case", list(KINDS))
def test_output_kind(case):
    make, kind = KINDS[case]
    model = make()
    assert output_kind(model) == kind
    if kind in ("logits", "probabilities"):
        assert outputs_logits(model) == (kind == "logits")
    else:
        with pytest.raises(ValueError, match=f"logits or softmax probabilities. .* is {kind}"):
            outputs_logits(model)


@pytest.mark.parametrize(
    "make, message",
    [(two_outputs, "one output. Received 2 outputs"), (Subclassed, "without a functional graph")],
)
def test_output_kind_refuses_what_it_cannot_tell(make, message):
    with pytest.raises(ValueError, match=message):
        output_kind(make())


@pytest.mark.parametrize("case", ["Softmax layer", "sigmoid head", "nested sigmoid",
                                  "logits head"])
def test_served_probabilities_follow_the_output_kind(case, tmp_path):
    """A Softmax-layer head was served softmax(softmax(x)) (0.619 -> 0.434), a sigmoid head
    softmax(sigmoid(x)), a sigmoid op lost in the scanned serving form: each kind gets
    exactly one normalization. (A sigmoid op on the network's own output tensor makes a plain
    graph, whose preprocessing nobody can tell: `test_a_graph_that_lost_its_network_...`.)"""
    make, kind = KINDS[case]
    model = make()
    path = export_model(model, tmp_path, name="m")
    served = tf.saved_model.load(path).signatures["serving_default"](images=CIFAR_32)
    outputs = model(preprocess_input(CIFAR_32), training=False)
    expected = tf.nn.softmax(outputs) if kind == "logits" else outputs
    np.testing.assert_allclose(served["probabilities"], expected, atol=1e-5)


def test_a_graph_that_lost_its_network_is_refused_not_taken_for_cifar(tmp_path, capsys):
    """A run dir's model.keras loaded with Keras alone and saved again (keras_preact's entry
    gone), and a plain graph over a network's layers: which preprocessing either takes is
    not guessed (it was CIFAR's, for an ImageNet net too) (#43)."""
    from keras_preact import cli
    from keras_preact.weights import storage

    path = str(tmp_path / "resaved.keras")
    imagenet = keras_preact.build("preact-18-imagenet", input_shape=(64, 64, 3),
                                  units=(1, 1, 1, 1), classes=10)
    storage.save_plain(imagenet, str(tmp_path / "m.keras"))
    keras.saving.load_model(str(tmp_path / "m.keras")).save(path)
    line = ("Cannot tell which preprocessing model 'preact-18-imagenet' takes: it holds no "
            "network keras_preact built (a .keras file loaded and saved again by Keras alone "
            "loses keras_preact's entry). Use the file keras_preact wrote (a run dir's "
            "model.keras, or keras_preact.build(...).save) or the network itself. Received: "
            "Functional")
    for command in (["evaluate", path], ["export", path, "--base", str(tmp_path / "base")],
                    ["export", path, "--format", "onnx", "-o", str(tmp_path / "m.onnx")]):
        assert cli.main(command) == 2
        assert capsys.readouterr().err == f"keras-preact {command[0]}: error: {line}\n"
    assert not (tmp_path / "base").exists() and not (tmp_path / "m.onnx").exists()
    with pytest.raises(ValueError, match="Cannot tell which preprocessing model"):
        export_model(with_op(keras.ops.sigmoid), tmp_path / "base")


def test_a_timm_net_serves_with_timms_preprocessing(tmp_path):
    """preact-18-imagenet-timm's signatures resize as timm evaluates (shorter side to
    side / 0.9, bicubic, centre crop) and normalize with timm's mean = std = 127.5: the
    SavedModel answers as the Keras model on those images, and not as on fb.resnet.torch's."""
    model = keras_preact.build("preact-18-imagenet-timm", input_shape=(64, 64, 3), classes=7)
    out = run_probe([{"id": "odd", "dir": export_model(model, tmp_path, name="timm"),
                      "signature": "serving_default", "inputs": {"images": array_input(
                          IMAGENET_ODD)}}], tmp_path)["odd"]

    def keras_answer(preprocessing):
        resized = resize_for_eval(IMAGENET_ODD, preprocessing, 64)
        return model(preprocess_input(resized, preprocessing.stats), training=False).numpy()

    timm = Preprocessing("inception", size=224, crop_pct=0.9, interpolation="bicubic")
    check_outputs(out, keras_answer(timm), class_names(7))
    fb = np.abs(keras_answer(FAMILY_PREPROCESSING["imagenet"]) - out["probabilities"]).max()
    assert fb > 1e-3


def test_a_net_that_normalizes_itself_is_served_normalized_once(tmp_path):
    """`include_preprocessing=True`: the signatures leave the pixels to the model's own first
    layer, so the SavedModel answers as the net that takes `preprocess_input` does."""
    plain, raw = net(), net(include_preprocessing=True)
    raw.set_weights(plain.get_weights())
    path = export_model(raw, tmp_path, name="raw")
    served = tf.saved_model.load(path).signatures["serving_default"](images=CIFAR_32)
    expected = plain(preprocess_input(CIFAR_32), training=False)
    np.testing.assert_allclose(served["probabilities"], expected, atol=1e-6)
