"""ONNX, LiteRT and OpenVINO exports answer like the Keras model, on real CIFAR-10 images.

Each artifact is run by its own runtime (onnxruntime, ai-edge-litert, openvino: the `deploy`
extra) on uint8 images, and compared with `model(preprocess_input(x))` in Keras. The nets'
BatchNorm statistics are set from real images first, so that the probabilities are neither
uniform nor saturated and a wrong weight or normalization shows.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time

import keras
import numpy as np
import pytest
import tensorflow as tf

import keras_preact
from keras_preact import cli, files
from keras_preact.api import load_for_inference, preprocessing_of
from keras_preact.arch import scan
from keras_preact.arch.introspect import outputs_logits
from keras_preact.cli import main as cli_main
from keras_preact.export import export_model
from keras_preact.export import runtimes as deploy
from keras_preact.export.loading import in_float32
from keras_preact.export.signatures import model_side
from keras_preact.labels import class_names
from keras_preact.preprocessing import preprocess_input, resize_for_eval

ort = pytest.importorskip("onnxruntime")
ov = pytest.importorskip("openvino")
litert = pytest.importorskip("ai_edge_litert.interpreter")

TOLERANCE = 1e-4  # float32 probabilities, any depth
# OpenVINO computes in bfloat16 on CPUs with bf16 units unless told otherwise.
OPENVINO_CONFIG = {"INFERENCE_PRECISION_HINT": "f32"}


@pytest.fixture(scope="module")
def cifar_images(cifar10_data_dir) -> np.ndarray:
    """64 real CIFAR-10 training images, uint8 [64, 32, 32, 3]."""
    import tensorflow_datasets as tfds

    data = tfds.load("cifar10", split="train[:64]", data_dir=cifar10_data_dir, batch_size=-1)
    return tfds.as_numpy(data)["image"]


def images_for(model: keras.Model, cifar: np.ndarray) -> np.ndarray:
    """`cifar` brought to the model's input size with its eval geometry, as uint8."""
    side = model_side(model)
    resized = resize_for_eval(cifar, preprocessing_of(model), side).numpy()
    return np.clip(np.round(resized), 0, 255).astype(np.uint8)


def calibrate(model: keras.Model, images: np.ndarray) -> keras.Model:
    """Sets every BatchNorm's moving statistics to those of `images` (one training-mode call
    with momentum 0): the activations of a trained net, without training."""
    layers = [layer for layer in model.layers if isinstance(layer, keras.layers.BatchNormalization)]
    for layer in layers:
        layer.momentum = 0.0
    model(preprocess_input(images, preprocessing_of(model).stats), training=True)
    for layer in layers:
        layer.momentum = 0.9
    return model


def reference(model: keras.Model, images: np.ndarray, preprocess=preprocess_input) -> np.ndarray:
    y = model(preprocess(images, preprocessing_of(model).stats), training=False)
    return (tf.nn.softmax(y) if outputs_logits(model) else y).numpy()


def run_onnx(path: str, images: np.ndarray) -> np.ndarray:
    session = ort.InferenceSession(path)
    return session.run([deploy.OUTPUT_NAME], {deploy.INPUT_NAME: images})[0]


def run_openvino(path: str, images: np.ndarray) -> np.ndarray:
    compiled = ov.Core().compile_model(path, "CPU", OPENVINO_CONFIG)
    return compiled(images)[deploy.OUTPUT_NAME]


def run_litert(path: str, images: np.ndarray) -> np.ndarray:
    runner = litert.Interpreter(path).get_signature_runner()
    return runner(**{deploy.INPUT_NAME: images})[deploy.OUTPUT_NAME]


RUNNERS = {"onnx": run_onnx, "openvino": run_openvino, "litert": run_litert}


def stored_labels(path: str, format: str) -> list[str]:
    """The class names an artifact carries, read as a user of that runtime would."""
    if format == "onnx":
        meta = ort.InferenceSession(path).get_modelmeta().custom_metadata_map
        return json.loads(meta[deploy.LABELS_KEY])
    if format == "openvino":
        info = ov.Core().read_model(path).get_rt_info(["keras_preact", deploy.LABELS_KEY])
        return json.loads(info.astype(str))
    with open(deploy.output_files(path, format)[1]) as f:
        return f.read().splitlines()


def export_and_check(model, images, tmp_path, format: str) -> np.ndarray:
    """Exports `model` as `format`, then `check_artifact`."""
    path = deploy.export(model, tmp_path / f"model{deploy.FORMATS[format]}", format=format)
    return check_artifact(model, images, path, format)


def check_artifact(model, images, path, format: str, labels=None) -> np.ndarray:
    """Runs the artifact at `path`; asserts parity with Keras, top-1 and labels (default: the
    class count's); returns its probabilities."""
    got = RUNNERS[format](str(path), images)
    expected = reference(model, images)
    assert got.shape == expected.shape == (len(images), model.output_shape[-1])
    assert got.dtype == np.float32
    np.testing.assert_allclose(got, expected, atol=TOLERANCE, rtol=0)
    np.testing.assert_array_equal(got.argmax(axis=1), expected.argmax(axis=1))
    assert stored_labels(str(path), format) == list(labels or class_names(model.output_shape[-1]))
    return got


CASES = {
    # The paper's basic and bottleneck CIFAR nets; the bottleneck one with a logits head
    # (softmax added in the artifact) and CIFAR-100 names.
    "preact-20": lambda: keras_preact.build("preact-20"),
    "preact-164-logits": lambda: keras_preact.build(
        "preact-164", classes=100, classifier_activation=None
    ),
    "preact-18-imagenet": lambda: keras_preact.build("preact-18-imagenet"),
    # timm's network (ZeroPadding before strided convs, conv - max-pool stem) with timm's
    # preprocessing (mean = std = 127.5) inside, whole, at a small size.
    "preact-18-imagenet-timm": lambda: keras_preact.build(
        "preact-18-imagenet-timm", input_shape=(64, 64, 3)
    ),
}


@pytest.fixture(scope="module", params=list(CASES))
def case(request, cifar_images):
    model = CASES[request.param]()
    images = images_for(model, cifar_images)
    return calibrate(model, images[:32]), images[32:48]


@pytest.mark.parametrize("format", list(deploy.FORMATS))
def test_runtimes_match_keras(case, format, tmp_path):
    model, images = case
    probs = export_and_check(model, images, tmp_path, format)
    # The check sees a wrong normalization: scaling to [0, 1] instead moves the answer by
    # far more than the tolerance.
    rescaled = reference(model, images, lambda x, _: np.float32(x) / 255.0)
    assert np.abs(rescaled - probs).max() > 10 * TOLERANCE


@pytest.mark.large  # ~4.5 min, 10.5 GB peak
def test_preact_1001_full_depth_onnx(cifar_images, tmp_path):
    """3,339 layers, exported by the CLI in a process of its own: tf2onnx takes ~10 GB to
    convert them, which this (the test suite's) process would keep."""
    keras.utils.set_random_seed(0)  # 1001 layers of summation-order noise: same net every run
    model = calibrate(keras_preact.build("preact-1001"), cifar_images[:32])
    model.save(tmp_path / "preact-1001.keras")
    out = tmp_path / "preact-1001.onnx"
    command = ["export", str(tmp_path / "preact-1001.keras"), "--format", "onnx", "-o", str(out)]
    subprocess.run([sys.executable, "-m", "keras_preact.cli", *command], check=True, timeout=1800)
    check_artifact(model, cifar_images[32:48], out, "onnx")


def test_scanned_stages_export_as_the_plain_graph(cifar_images, tmp_path):
    plain = calibrate(keras_preact.build("preact-164", depth=29), cifar_images[:32])
    scanned = scan.to_scanned(plain)
    path = deploy.export(scanned, tmp_path / "m.onnx", format="onnx")
    np.testing.assert_allclose(
        run_onnx(path, cifar_images[32:40]), reference(plain, cifar_images[32:40]),
        atol=TOLERANCE, rtol=0,
    )


def designs() -> list[str]:
    """One registered name per distinct design (family, block, unit, shortcut, stem,
    padding): 23 names."""
    found = {}
    for name in keras_preact.list_models():
        spec = keras_preact.get_spec(name)
        key = (spec.family, spec.block, spec.unit, spec.shortcut, spec.stem, spec.padding)
        found.setdefault(key, name)
    return sorted(found.values())


# The ops the cases above do not have: post-activation units with projection shortcuts, the
# gates (sigmoid 1x1 conv, multiply, 1 - g) and the dropout shortcut (identity at inference).
OTHER_OPS = ("resnet-20", "resnet-110-exclusive-gating", "resnet-110-dropout")


@pytest.mark.parametrize(
    "name, format",
    [(name, "onnx") for name in designs()]
    + [(name, format) for name in OTHER_OPS for format in ("litert", "openvino")],
)
def test_every_registered_design_exports(name, format, cifar_images, tmp_path):
    """Every design of the registry, one unit per stage (ImageNet ones at 64x64), to ONNX
    (tf2onnx converts op by op: a design it cannot carry fails here); the other two formats
    on the designs whose ops the cases above lack."""
    spec = keras_preact.get_spec(name)
    overrides = {"units": (1,) * len(spec.units)}
    if spec.family == "imagenet":
        overrides["input_shape"] = (64, 64, 3)
    model = keras_preact.build(name, **overrides)
    images = images_for(model, cifar_images)
    calibrate(model, images[:32])
    export_and_check(model, images[32:40], tmp_path, format)


@pytest.fixture(scope="module")
def small_exports(tmp_path_factory):
    model = keras_preact.build("preact-20", depth=8)
    tmp = tmp_path_factory.mktemp("deploy")
    return {f: deploy.export(model, tmp / f"m{ext}", format=f) for f, ext in deploy.FORMATS.items()}


GOOD = np.zeros((2, 32, 32, 3), np.uint8)
WRONG_DTYPE = GOOD.astype(np.float32)
WRONG_SIDE = np.zeros((2, 64, 64, 3), np.uint8)


def test_onnx_runtime_rejects_wrong_dtype_and_shape(small_exports):
    session = ort.InferenceSession(small_exports["onnx"])
    invalid = ort.capi.onnxruntime_pybind11_state.InvalidArgument
    with pytest.raises(invalid, match=r"expected: \(tensor\(uint8\)\)"):
        session.run(None, {"images": WRONG_DTYPE})
    with pytest.raises(invalid, match="invalid dimensions for input: images"):
        session.run(None, {"images": WRONG_SIDE})
    with pytest.raises(invalid, match="Invalid rank for input: images"):
        session.run(None, {"images": GOOD[0]})


def test_openvino_rejects_wrong_dtype_and_shape(small_exports):
    request = ov.Core().compile_model(small_exports["openvino"], "CPU").create_infer_request()
    # An ov.Tensor is checked as it is; `compiled(array)` would convert a numpy array first.
    with pytest.raises(RuntimeError, match="model input tensor precision is: u8"):
        request.set_input_tensor(ov.Tensor(WRONG_DTYPE))
    with pytest.raises(RuntimeError, match=r"model input \(shape=\[\?,32,32,3\]\).*incompatible"):
        request.set_input_tensor(ov.Tensor(WRONG_SIDE))


def test_litert_rejects_wrong_dtype_and_shape(small_exports):
    interpreter = litert.Interpreter(small_exports["litert"])
    # The README says why a fresh file's `shape` reads batch 1: the size LiteRT allocates
    # first for the dynamic batch of `shape_signature`.
    assert list(interpreter.get_input_details()[0]["shape"]) == [1, 32, 32, 3]
    with pytest.raises(ValueError, match="FLOAT32 but expected type UINT8"):
        interpreter.get_signature_runner()(images=WRONG_DTYPE)
    # The signature runner resizes its input to anything; a strict resize (only the -1
    # batch dimension may change) is LiteRT's own check of the [-1, 32, 32, 3] input.
    index = interpreter.get_input_details()[0]["index"]
    assert list(interpreter.get_input_details()[0]["shape_signature"]) == [-1, 32, 32, 3]
    interpreter.resize_tensor_input(index, GOOD.shape, strict=True)
    with pytest.raises(RuntimeError, match="only allows mutating unknown dimensions"):
        interpreter.resize_tensor_input(index, WRONG_SIDE.shape, strict=True)


def test_artifacts_name_their_input_and_output(small_exports):
    session = ort.InferenceSession(small_exports["onnx"])
    (inp,), (out,) = session.get_inputs(), session.get_outputs()
    assert (inp.name, inp.type, inp.shape[1:]) == ("images", "tensor(uint8)", [32, 32, 3])
    assert (out.name, out.shape[1:]) == ("probabilities", [10])
    assert isinstance(inp.shape[0], str)  # dynamic batch
    compiled = ov.Core().compile_model(small_exports["openvino"], "CPU")
    assert compiled.input().get_names() == {"images"}
    assert str(compiled.input().get_partial_shape()) == "[?,32,32,3]"
    assert compiled.output().get_names() == {"probabilities"}
    runner = litert.Interpreter(small_exports["litert"]).get_signature_list()
    assert runner == {"serving_default": {"inputs": ["images"], "outputs": ["probabilities"]}}


def test_export_refuses_bad_requests(small_exports, tmp_path):
    model = keras_preact.build("preact-20", depth=8)
    with pytest.raises(ValueError, match=r"Unknown format 'tfjs'. Valid: \['litert', 'onnx'"):
        deploy.export(model, tmp_path / "m.json", format="tfjs")
    with pytest.raises(ValueError, match=r"needs a path ending in '.tflite'. Received: .*m.onnx"):
        deploy.export(model, tmp_path / "m.onnx", format="litert")
    with pytest.raises(FileExistsError, match="Not overwriting .*m.xml"):
        deploy.export(model, small_exports["openvino"], format="openvino")
    assert sorted(p.name for p in tmp_path.iterdir()) == []


def test_export_refuses_a_model_over_the_format_size_limit(monkeypatch, tmp_path):
    model = keras_preact.build("preact-20", depth=8)
    monkeypatch.setattr(model, "count_params", lambda: 2**29)  # 2 GiB of float32
    for format in ("onnx", "litert"):
        with pytest.raises(ValueError, match=f"a {format} file holds at most 2 GiB"):
            deploy.export(model, tmp_path / f"m{deploy.FORMATS[format]}", format=format)
    assert list(tmp_path.iterdir()) == []


def test_cli_exports_a_keras_file(cifar_images, tmp_path, capsys):
    model = calibrate(keras_preact.build("preact-20", depth=8), cifar_images[:32])
    model.save(tmp_path / "m.keras")
    out = tmp_path / "deploy" / "m.tflite"
    command = ["export", str(tmp_path / "m.keras"), "--format", "litert", "-o", str(out)]
    assert cli_main(command) == 0
    assert capsys.readouterr().out.strip() == str(out)
    check_artifact(model, cifar_images[32:40], out, "litert")
    assert cli_main(["export", str(tmp_path / "m.keras"), "--format", "litert"]) == 2
    assert "--format litert needs -o PATH" in capsys.readouterr().err
    assert cli_main(["export", str(tmp_path / "m.keras"), "-o", str(tmp_path / "x.onnx")]) == 2
    assert "--format saved_model needs --base DIR" in capsys.readouterr().err


def test_export_model_dispatches_by_format(tmp_path):
    model = keras_preact.build("preact-20", depth=8)
    valid = r"Valid: \['saved_model', 'onnx', 'litert', 'openvino'\]"
    with pytest.raises(ValueError, match=r"Unknown format 'tfjs'. " + valid):
        export_model(model, tmp_path / "m.tfjs", format="tfjs")
    version_dir = export_model(model, tmp_path / "base")  # default: TF Serving's SavedModel
    assert version_dir == str(tmp_path / "base" / "preact-20" / "1")
    out = export_model(model, tmp_path / "m.xml", format="openvino")
    assert out == str(tmp_path / "m.xml") and (tmp_path / "m.bin").is_file()


# The SavedModel's rule for every format (serving.signatures.classifier_probabilities): a sigmoid
# head is served as it is; features and several outputs are refused in one line, in each.
def two_outputs():
    logits = keras_preact.build("preact-20", depth=8, classifier_activation=None)
    return keras.Model(logits.inputs, [logits.outputs[0], logits.get_layer("avg_pool").output])


@pytest.mark.parametrize("format", list(deploy.FORMATS))
def test_a_sigmoid_head_is_served_as_it_is(format, cifar_images, tmp_path):
    model = calibrate(keras_preact.build("preact-20", depth=8, classifier_activation="sigmoid"),
                      cifar_images[:32])
    path = deploy.export(model, tmp_path / f"m{deploy.FORMATS[format]}", format=format)
    got = RUNNERS[format](path, cifar_images[32:40])
    expected = model(preprocess_input(cifar_images[32:40]), training=False).numpy()
    np.testing.assert_allclose(got, expected, atol=TOLERANCE, rtol=0)
    assert np.abs(got.sum(axis=1) - 1).max() > 0.1  # not a softmax


@pytest.mark.parametrize("format", ["saved_model", *deploy.FORMATS])
@pytest.mark.parametrize("make, message", [
    (two_outputs, r"Expected a model with one output. Received 2 outputs: \[\(None, 10\), "),
    (lambda: keras_preact.build("preact-20", depth=8, include_top=False, pooling="avg"),
     r"one \(batch, classes\) output of logits or probabilities. Received: a model whose "
     r"output is features of shape \(None, 64\)"),
])
def test_models_that_are_not_classifiers_are_refused_in_every_format(format, make, message,
                                                                       tmp_path):
    path = tmp_path / ("base" if format == "saved_model" else f"m{deploy.FORMATS[format]}")
    with pytest.raises(ValueError, match=message):
        export_model(make(), path, format=format)
    assert os.listdir(tmp_path) == []


# Run by a Python of its own: exports with the CLI, but the writer is killed (SIGKILL) once it
# has written half of each file.
KILLED_MID_WRITE = """
import os, signal, sys
from keras_preact import cli
from keras_preact.export import runtimes as deploy
from keras_preact.export.loading import in_float32

format = sys.argv[1]
write = deploy.WRITERS[format]

def write_half_and_die(fn, path, metadata):
    write(fn, path, metadata)
    for f in deploy.output_files(path, format):
        os.truncate(f, os.path.getsize(f) // 2)
    os.kill(os.getpid(), signal.SIGKILL)

deploy.WRITERS[format] = write_half_and_die
cli.main(sys.argv[2:])
"""


@pytest.fixture(scope="module")
def small_model_file(cifar_images, tmp_path_factory):
    model = calibrate(keras_preact.build("preact-20", depth=8), cifar_images[:32])
    path = tmp_path_factory.mktemp("model") / "m.keras"
    model.save(path)
    return model, path


@pytest.mark.parametrize("format", list(deploy.FORMATS))
def test_an_export_killed_mid_write_leaves_nothing_and_the_rerun_completes(
        format, small_model_file, cifar_images, tmp_path):
    model, model_file = small_model_file
    out = tmp_path / "out" / f"m{deploy.FORMATS[format]}"
    command = ["export", str(model_file), "--format", format, "-o", str(out)]
    killed = subprocess.run([sys.executable, "-c", KILLED_MID_WRITE, format, *command],
                            capture_output=True, timeout=300)
    assert killed.returncode == -signal.SIGKILL, killed.stderr.decode()
    left = os.listdir(out.parent)  # the half-written temporaries and the lock, all hidden
    assert len(left) == len(deploy.output_files(str(out), format)) + 1
    assert all(name.startswith(".") for name in left)

    assert cli_main(command) == 0  # the stale temporaries neither block nor stay
    names = [os.path.basename(f) for f in deploy.output_files(str(out), format)]
    assert sorted(os.listdir(out.parent)) == sorted(names)
    check_artifact(model, cifar_images[32:40], out, format)


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_an_export_stopped_by_a_signal_leaves_nothing(signum, small_model_file, tmp_path):
    """SIGTERM (as `timeout` and `docker stop` send) ends the export where it is; Ctrl-C
    (SIGINT) ends it in one line, exit 130, its temporaries removed. The signal comes while
    the export runs: it holds its lock from before the model loads until the files are in
    place."""
    _, model_file = small_model_file
    out = tmp_path / "m.onnx"
    lock = tmp_path / (files.LOCK_PREFIX + out.name + files.LOCK_SUFFIX)
    command = [sys.executable, "-m", "keras_preact.cli", "export", str(model_file),
               "--format", "onnx", "-o", str(out)]
    quiet = {k: v for k, v in os.environ.items() if k != "TF_CPP_MIN_LOG_LEVEL"}  # TFDS sets it
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               text=True, env=quiet)
    deadline = time.monotonic() + 120
    while not lock.exists() and process.poll() is None and time.monotonic() < deadline:
        time.sleep(0.01)
    process.send_signal(signum)
    _, err = process.communicate(timeout=60)
    assert not out.exists()
    if signum == signal.SIGINT:
        assert (process.returncode, err) == (cli.INTERRUPTED,
                                             "keras-preact export: interrupted\n")
        assert os.listdir(tmp_path) == []
    else:
        assert process.returncode == -signal.SIGTERM
        assert all(name.startswith(".") for name in os.listdir(tmp_path))
    assert cli_main(command[3:]) == 0
    assert os.listdir(tmp_path) == ["m.onnx"]


def test_ctrl_c_swallowed_by_the_writer_still_cancels_the_files(tmp_path):
    # tf2onnx has bare `except:` clauses: a KeyboardInterrupt raised inside one is lost, and
    # the export used to be put in place anyway (a flaky interrupt test in CI).
    out = tmp_path / "m.onnx"
    with pytest.raises(KeyboardInterrupt):
        with files.new_files([str(out)]) as (tmp,):
            try:
                os.kill(os.getpid(), signal.SIGINT)
                time.sleep(1)  # the handler runs here
            except:  # noqa: E722  (what the converter does)
                pass
            open(tmp, "w").write("complete")
    assert os.listdir(tmp_path) == []


def test_a_second_export_to_a_path_being_written_is_refused_at_once(tmp_path, capsys):
    out = tmp_path / "m.onnx"
    model = keras_preact.build("preact-20", depth=8)
    with files.new_files([str(out)]) as (tmp,):  # the first export, still writing
        with pytest.raises(FileExistsError, match=f"{out} is being written by another process"):
            deploy.export(model, out, format="onnx")
        assert cli_main(["export", "preact-20", "--weights", "cifar10", "--format", "onnx",
                         "-o", str(out)]) == 2
        err = capsys.readouterr().err
        assert err.startswith("keras-preact export: error: ") and err.count("\n") == 1
        with open(tmp, "wb") as f:
            f.write(b"the first export")
    assert out.read_bytes() == b"the first export"
    assert os.listdir(tmp_path) == ["m.onnx"]


@pytest.mark.parametrize("arguments, message", [
    (["--format", "onnx", "-o", "/sys/m.onnx"], "Cannot write in /sys: Permission denied."),
    (["--format", "openvino", "-o", "/sys/m/m.xml"],
     r"Cannot write in /sys/m: Permission denied \(in /sys\)."),
    (["--format", "onnx", "-o", "{tmp}/afile/m.onnx"],
     "Cannot write in {tmp}/afile: {tmp}/afile is a file, not a directory."),
    (["--format", "litert", "-o", "{tmp}/m.onnx"],
     r"A litert export needs a path ending in '.tflite'. Received: '{tmp}/m.onnx'"),
    (["--format", "onnx", "-o", "{tmp}/afile"], "needs a path ending in '.onnx'"),
    (["--format", "litert", "-o", "{tmp}/m.tflite"], "Not overwriting {tmp}/m.labels.txt"),
    (["--base", "{tmp}/afile/base"], "{tmp}/afile is a file, not a directory."),
    (["--base", "/sys/base"], r"Cannot write in /sys/base: Permission denied \(in /sys\)."),
    (["--format", "onnx", "-o", "{tmp}/m.onnx", "--version", "0"], "takes no --base, --name"),
    (["--format", "onnx", "-o", "{tmp}/m.onnx", "--name", ""], "takes no --base, --name"),
])
def test_cli_checks_paths_before_the_model_is_built(arguments, message, tmp_path, monkeypatch,
                                                    capsys):
    from keras_preact.commands import export_cmd

    (tmp_path / "afile").write_text("x")
    (tmp_path / "m.labels.txt").write_text("cat\n")
    monkeypatch.setattr(export_cmd, "model_from_args",
                        lambda args: pytest.fail("the model was built before the path check"))
    command = ["export", "preact-20", "--weights", "cifar10"]
    assert cli_main(command + [a.format(tmp=tmp_path) for a in arguments]) == 2
    err = capsys.readouterr().err
    assert err.startswith("keras-preact export: error: ") and err.count("\n") == 1
    assert re.search(message.format(tmp=tmp_path), err), err
    assert sorted(os.listdir(tmp_path)) == ["afile", "m.labels.txt"]


def test_a_run_trained_on_jax_exports_to_every_format(cifar_images, tmp_path, capsys):
    """#39: a run that trained on Keras' JAX backend (scanned stages, in a process without
    TensorFlow) exports from its run dir with `keras-preact export` in this TensorFlow process,
    to every format; each answers like the run's Keras model."""
    from tests.training.test_jax import _train_arrays

    run_dir = tmp_path / "jax-run"
    _train_arrays(run_dir, "bfloat16", stages="scan")
    assert json.loads((run_dir / "config.json").read_text())["stages"] == "scan"
    trained = load_for_inference(run_dir)
    assert "mixed_bfloat16" in {layer.dtype_policy.name for layer in trained.layers}
    model = in_float32(trained)  # what is exported: the run's weights, computing in float32
    assert [w.dtype for w in model.weights] == [w.dtype for w in trained.weights]
    np.testing.assert_array_equal(model.get_weights()[-1], trained.get_weights()[-1])
    images = cifar_images[:16]
    for format, suffix in deploy.FORMATS.items():
        out = tmp_path / f"model{suffix}"
        assert cli_main(["export", str(run_dir), "--format", format, "-o", str(out)]) == 0
        check_artifact(model, images, out, format, labels=[str(i) for i in range(10)])
    assert cli_main(["export", str(run_dir), "--base", str(tmp_path / "base")]) == 0
    served = tf.saved_model.load(capsys.readouterr().out.strip().splitlines()[-1])
    probabilities = served.signatures["serving_default"](images=tf.constant(images))
    np.testing.assert_allclose(probabilities["probabilities"].numpy(), reference(model, images),
                               atol=TOLERANCE, rtol=0)


def test_a_model_that_does_not_compute_in_float32_is_refused_unless_ours(tmp_path):
    inputs = keras.Input((8, 8, 3))
    outputs = keras.layers.Dense(2, dtype="mixed_float16")(keras.layers.Flatten()(inputs))
    with pytest.raises(ValueError, match=re.escape(
            "Exports compute in float32: rebuild 'mixed' with dtype 'float32' and copy its "
            "weights in. Received: layers with dtype policies ['float32', 'mixed_float16']")):
        export_model(keras.Model(inputs, outputs, name="mixed"), tmp_path / "m.onnx", "onnx")
    assert list(tmp_path.iterdir()) == []
