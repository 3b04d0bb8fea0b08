"""The trainer on Keras' JAX backend, each run in a fresh process (the backend is chosen at
Keras' import): NumPy arrays with TensorFlow blocked, the command line on TFDS CIFAR-10 killed
and resumed, DataParallel over two host devices, and the one-line errors of TensorFlow's
flags."""

import json
import os
import re
import subprocess
import sys

import numpy as np
import pytest

from keras_preact import rundir
from tests.training.test_distribute import kill_after_backup

# Run before anything imports: TensorFlow (and TFDS) cannot be imported, as on a JAX machine
# that has none.
BLOCK_TF = 'import sys; sys.modules["tensorflow"] = sys.modules["tensorflow_datasets"] = None\n'

ARRAYS_RUN = BLOCK_TF + """
import json, os, sys
import numpy as np
from keras_preact import training
rng = np.random.default_rng(0)
images = rng.integers(0, 256, (600, 32, 32, 3), dtype=np.uint8)
labels = rng.integers(0, 10, 600)
model = training.train("preact-20", output=sys.argv[1], dataset=(images, labels),
                       class_names=[str(i) for i in range(10)], steps=int(sys.argv[4]),
                       batch_size=32, steps_per_epoch=5, val_examples=64, backup_every=5,
                       seed=0, verbose=0, mixed_precision=sys.argv[2], strategy=sys.argv[3],
                       deterministic=True, overrides={"depth": 8})
np.save(os.path.join(sys.argv[1], "probe.npy"), np.concatenate(
    [np.asarray(w, "float32").ravel() for w in model.trainable_weights]))
print(json.dumps({"step": int(model.optimizer.iterations.numpy()),
                  "optimizer": type(model.optimizer).__name__,
                  "tensorflow": sys.modules.get("tensorflow") is not None}))
"""


def _jax_env(**extra):
    return {**os.environ, "KERAS_BACKEND": "jax", "TF_CPP_MIN_LOG_LEVEL": "2", **extra}


def _train_arrays(run_dir, mixed_precision="off", strategy="auto", steps=12, **env):
    done = subprocess.run([sys.executable, "-c", ARRAYS_RUN, str(run_dir), mixed_precision,
                           strategy, str(steps)], capture_output=True, text=True, timeout=600,
                          env=_jax_env(**env))
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_numpy_arrays_train_on_jax_without_tensorflow(tmp_path):
    """What a JAX machine without TensorFlow runs (benchmarks/gpu_check.sh): the run dir is
    the TensorFlow trainer's but for TensorBoard's logs, which Keras writes with tf.summary;
    its model.keras loads into TensorFlow's Keras with the same weights."""
    import keras

    run_dir = tmp_path / "arrays"
    result = _train_arrays(run_dir, "bfloat16")
    assert result == {"step": 12, "optimizer": "SGDWithL2", "tensorflow": False}
    assert sorted(os.listdir(run_dir)) == ["config.json", "metrics.csv", "model.keras",
                                           "probe.npy", "sessions.json"]
    [session] = rundir.read_sessions(run_dir)
    assert session["backend"] == "jax" and session["steps"] == [0, 12]
    assert session["machine"].endswith("; JAX one device, replicas: 1")
    config = rundir.read_config(run_dir)
    assert config["dataset"] == "arrays" and config["stages"] == "scan"  # auto, as on TF
    assert {"jax", "keras", "keras_preact"} <= set(config["versions"])
    with open(run_dir / "metrics.csv") as f:
        assert [line.split(",")[1] for line in f.read().splitlines()[1:]] == ["5", "10", "12"]
    assert keras.backend.backend() == "tensorflow"  # this process: the weights cross over
    loaded = keras.saving.load_model(run_dir / "model.keras")
    probe = np.concatenate([np.asarray(w, "float32").ravel() for w in loaded.trainable_weights])
    np.testing.assert_array_equal(probe, np.load(run_dir / "probe.npy"))


def test_two_host_devices_train_what_one_does_and_float16_scales_the_loss(tmp_path):
    """`--strategy mirrored` on JAX is DataParallel over the local devices. Each step is one
    program over the global batch, so BN's batch statistics are the global batch's: a step on
    two devices trains what it does on one (the same batch, seed and weights) to float
    error, 1e-8 (BN over each device's 16 images would change the step's gradients by
    percents). Later steps drift apart slowly, as different summation orders do."""
    two = {"XLA_FLAGS": "--xla_force_host_platform_device_count=2"}
    assert _train_arrays(tmp_path / "one", "off", "one-device", 1, **two)["step"] == 1
    assert _train_arrays(tmp_path / "two", "off", "mirrored", 1, **two)["step"] == 1
    assert rundir.read_config(tmp_path / "two")["replicas"] == 2
    [session] = rundir.read_sessions(tmp_path / "two")
    assert session["machine"].endswith("; DataParallel, replicas: 2")
    np.testing.assert_allclose(np.load(tmp_path / "two" / "probe.npy"),
                               np.load(tmp_path / "one" / "probe.npy"), atol=1e-6)
    # float16: Keras wraps the optimizer in its LossScaleOptimizer, on JAX too.
    half = _train_arrays(tmp_path / "half", "float16", "mirrored", **two)
    assert half == {"step": 12, "optimizer": "LossScaleOptimizer", "tensorflow": False}


def test_cli_on_jax_trains_tfds_cifar_and_resumes_after_sigkill(tmp_path, cifar10_data_dir):
    """`KERAS_BACKEND=jax keras-preact train`: tf.data input, the same run dir, killed with
    SIGKILL and rerun, it resumes from the backup; each session names its backend."""
    run_dir = tmp_path / "killed"
    argv = [sys.executable, "-m", "keras_preact.cli", "train", "preact-20", "--override",
            "depth=8", "--output", str(run_dir), "--data-dir", cifar10_data_dir, "--steps", "40",
            "--steps-per-epoch", "15", "--batch-size", "32", "--val-examples", "0",
            "--backup-every", "5", "--mixed-precision", "bfloat16"]
    killed_at = kill_after_backup(argv, _jax_env(), run_dir)

    second = subprocess.run(argv, capture_output=True, text=True, timeout=400, env=_jax_env())
    assert second.returncode == 0, second.stderr[-3000:]
    assert "warning" not in second.stderr  # KERAS_BACKEND=jax is not ignored
    resumed = int(re.search(r"resuming from step (\d+) of 40", second.stdout).group(1))
    assert resumed >= killed_at
    assert "finished at step 40" in second.stdout
    assert sorted(os.listdir(run_dir)) == ["config.json", "logs", "metrics.csv", "model.keras",
                                           "sessions.json"]
    sessions = rundir.read_sessions(run_dir)
    assert [s["backend"] for s in sessions] == ["jax", "jax"]
    assert sessions[1]["steps"] == [resumed, 40]


ERRORS = """
from keras_preact import training
for fields in ({"strategy": "tpu"}, {"strategy": "multi-worker"}):
    try:
        training.train("preact-20", output="/nonexistent/run", **fields)
    except ValueError as error:
        print(error)
"""


def test_tensorflow_only_flags_are_one_line_errors_on_jax():
    done = subprocess.run([sys.executable, "-c", ERRORS], capture_output=True, text=True,
                          timeout=300, env=_jax_env())
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.splitlines() == [
        "--strategy tpu is TensorFlow's: on JAX use 'mirrored' (the local GPUs or TPU cores) "
        "or 'one-device'. Received: strategy='tpu', KERAS_BACKEND=jax",
        "--strategy multi-worker is TensorFlow's: on JAX use 'mirrored' (the local GPUs or TPU "
        "cores) or 'one-device'. Received: strategy='multi-worker', KERAS_BACKEND=jax",
    ]


@pytest.mark.parametrize("dataset, message", [
    ((np.zeros((4, 32, 32, 3), "float32"), np.zeros(4, "int64")),
     "`dataset` images must be a uint8 array [n, height, width, 3] (RGB). Received: dtype "
     "float32, shape (4, 32, 32, 3)"),
    ((np.zeros((4, 32, 32, 3), "uint8"), np.array([0, 1, 2, 10])),
     "`dataset` labels must lie in [0, 10) (10 class names). Received: labels from 0 to 10"),
    ((np.zeros((4, 32, 32, 3), "uint8"),), "`dataset` arrays must be a pair (images, labels). "
     "Received: a tuple of 1"),
])
def test_bad_arrays_are_one_line_errors(dataset, message):
    from keras_preact.data import sources

    with pytest.raises(ValueError) as error:
        sources.resolve(dataset, class_names=[str(i) for i in range(10)])
    assert str(error.value) == message
