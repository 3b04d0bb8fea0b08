"""The trainer on Keras' JAX backend, each run in a fresh process (the backend is chosen at
Keras' import): NumPy arrays with TensorFlow blocked, the command line on TFDS CIFAR-10 killed
and resumed, DataParallel over two host devices and over two processes, and the one-line
errors of TensorFlow's flags and of the multi-process variables."""

import json
import os
import re
import signal
import subprocess
import sys

import numpy as np
import pytest

from keras_preact import rundir
from keras_preact.training import distribute
from tests.training.test_distribute import (
    _env,
    _finished,
    _free_port,
    backup_step,
    kill_after_backup,
    wait_for_backup,
)

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
                       deterministic=True, stages=sys.argv[5], overrides={"depth": 8})
np.save(os.path.join(sys.argv[1], "probe.npy"), np.concatenate(
    [np.asarray(w, "float32").ravel() for w in model.trainable_weights]))
print(json.dumps({"step": int(model.optimizer.iterations.numpy()),
                  "optimizer": type(model.optimizer).__name__,
                  "tensorflow": sys.modules.get("tensorflow") is not None}))
"""


def _jax_env(**extra):
    return _env(KERAS_BACKEND="jax", **extra)


def _train_arrays(run_dir, mixed_precision="off", strategy="auto", steps=12, stages="auto",
                  **env):
    done = subprocess.run([sys.executable, "-c", ARRAYS_RUN, str(run_dir), mixed_precision,
                           strategy, str(steps), stages], capture_output=True, text=True,
                          timeout=600,
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
import os
from keras_preact import training
for env in ({}, {"KERAS_DISTRIBUTION_NUM_PROCESSES": "2", "KERAS_DISTRIBUTION_PROCESS_ID": "2"}):
    os.environ.update(env)
    for strategy in ("tpu", "multi-worker"):
        try:
            training.train("preact-20", output="/nonexistent/run", strategy=strategy)
        except ValueError as error:
            print(error)
"""


def test_tensorflow_only_flags_and_bad_process_variables_are_one_line_errors_on_jax():
    done = subprocess.run([sys.executable, "-c", ERRORS], capture_output=True, text=True,
                          timeout=300, env=_jax_env())
    assert done.returncode == 0, done.stderr[-3000:]
    tpu = ("--strategy tpu is TensorFlow's: on JAX use 'mirrored' (the local GPUs or TPU "
           "cores), 'multi-worker' or 'one-device'. Received: strategy='tpu', KERAS_BACKEND=jax")
    assert done.stdout.splitlines() == [
        tpu,
        "KERAS_DISTRIBUTION_NUM_PROCESSES must be an integer >= 1: the processes of the run, "
        "the same on every host. Received: KERAS_DISTRIBUTION_NUM_PROCESSES unset",
        tpu,
        "KERAS_DISTRIBUTION_PROCESS_ID must be this process' number, 0 to 1 "
        "(KERAS_DISTRIBUTION_NUM_PROCESSES=2). Received: KERAS_DISTRIBUTION_PROCESS_ID=2",
    ]


def _process_env(coordinator: str, index: int, count: int = 2, **extra) -> dict:
    """The environment of process `index` of a `count`-process JAX run."""
    return _jax_env(**{distribute.JOB_ADDRESSES: coordinator,
                       distribute.NUM_PROCESSES: str(count),
                       distribute.PROCESS_ID: str(index)}, **extra)


def _start_processes(argv: list[str], count: int = 2, **extra) -> list[subprocess.Popen]:
    """`argv` in `count` processes of one JAX run on this host (a free coordinator port)."""
    coordinator = f"localhost:{_free_port()}"
    return [subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                             env=_process_env(coordinator, i, count, **extra))
            for i in range(count)]


def _outputs(processes: list[subprocess.Popen]) -> list[tuple[int, str, str]]:
    """Each process' (exit status, stdout, stderr), once all have ended."""
    done = [(*p.communicate(timeout=500),) for p in processes]
    return [(p.returncode, out, err) for p, (out, err) in zip(processes, done)]


# One training step of a tiny net on a fixed batch of 32: on one device, or on two processes
# that each feed their half (the input shard `backend.select` gives them).
STEP = BLOCK_TF + """
import sys
import numpy as np
from keras_preact.optim import paper_schedule
from keras_preact.training import backend
from keras_preact.training.net import build_and_compile
replicas = backend.select(sys.argv[2], 120)
net = build_and_compile("preact-20", paper_schedule(10, warmup_steps=0), seed=0,
                        overrides={"depth": 8})
rng = np.random.default_rng(0)
images = rng.normal(size=(32, 32, 32, 3)).astype("float32")
labels = rng.integers(0, 10, 32)
index, count = replicas.input_shard or (0, 1)
part = slice(index * 32 // count, (index + 1) * 32 // count)
net.fit(images[part], labels[part], batch_size=32 // count, epochs=1, shuffle=False, verbose=0)
if replicas.is_chief:  # BN's moving statistics too
    np.save(sys.argv[1], np.concatenate([np.asarray(w, "float32").ravel() for w in net.weights]))
print(replicas.kind, replicas.num_replicas, replicas.workers, replicas.is_chief)
"""


def test_a_step_on_two_processes_trains_what_one_process_does_on_the_whole_batch(tmp_path):
    """Two processes of one CPU device each, each feeding half of the global batch, make the
    step one process makes on all of it (BN over the global batch: one XLA program), to
    float error: the weights after it, BN statistics included, differ by at most 1.2e-7
    (one float32 step near 1; 3,866 of 78,330 values differ at all, by 9e-11 on average)."""
    one = subprocess.run([sys.executable, "-c", STEP, str(tmp_path / "one.npy"), "one-device"],
                         capture_output=True, text=True, timeout=300, env=_jax_env())
    assert one.returncode == 0, one.stderr[-3000:]
    assert one.stdout.split() == ["JAX", "one", "device", "1", "0", "True"]
    two = _outputs(_start_processes([sys.executable, "-c", STEP, str(tmp_path / "two.npy"),
                                     "multi-worker"]))
    assert [status for status, _, _ in two] == [0, 0], two[0][2][-3000:] + two[1][2][-3000:]
    assert [out.split()[-4:] for _, out, _ in two] == [["DataParallel", "2", "2", "True"],
                                                        ["DataParallel", "2", "2", "False"]]
    before = np.load(tmp_path / "one.npy")
    after_two = np.load(tmp_path / "two.npy")
    assert after_two.shape == before.shape
    np.testing.assert_allclose(after_two, before, rtol=0, atol=1e-6)


def _cli(run_dir, cifar10_data_dir, steps: int, spe: int, backup_every: int) -> list[str]:
    return [sys.executable, "-m", "keras_preact.cli", "train", "preact-20", "--override",
            "depth=8", "--output", str(run_dir), "--data-dir", cifar10_data_dir, "--steps",
            str(steps), "--steps-per-epoch", str(spe), "--batch-size", "16", "--val-examples",
            "64", "--backup-every", str(backup_every), "--strategy", "multi-worker"]


RUN_FILES = ["config.json", "logs", "metrics.csv", "model.keras", "sessions.json"]
# The one line a process of a two-process run prints while it starts.
WAITING = (r"keras-preact: waiting for the 2 processes of KERAS_DISTRIBUTION_NUM_PROCESSES=2 "
           r"\(coordinator localhost:\d+\) to connect, at most 300 s \(--connect-timeout\)\n")


def test_two_processes_via_cli_write_only_the_chiefs_run_dir(tmp_path, cifar10_data_dir):
    """`--strategy multi-worker` on JAX: two processes of one run on this host train to the
    same weights; only process 0 writes the run dir; the others' temp dirs are gone; each
    prints only its own lines (no Gloo or C++ ones)."""
    run_dir, temp = tmp_path / "run", tmp_path / "tmp"
    temp.mkdir()
    outputs = _outputs(_start_processes(_cli(run_dir, cifar10_data_dir, 6, 3, 2),
                                        TMPDIR=str(temp)))
    assert [status for status, _, _ in outputs] == [0, 0], outputs[0][2][-3000:]
    chief, worker = (_finished(out) for _, out, _ in outputs)
    assert chief == worker and chief[0] == 6  # the same weights in both
    for _, out, err in outputs:
        assert "[Gloo]" not in out
        assert re.fullmatch(WAITING, err), err[-3000:]
    assert sorted(os.listdir(run_dir)) == RUN_FILES and os.listdir(temp) == []
    with open(run_dir / "metrics.csv") as f:
        assert [line.split(",")[1] for line in f.read().splitlines()[1:]] == ["3", "6"]
    [session] = rundir.read_sessions(run_dir)
    assert session["machine"].endswith("; DataParallel, replicas: 2, workers: 2")
    assert session["backend"] == "jax" and session["steps"] == [0, 6]
    assert rundir.read_config(run_dir)["replicas"] == 2


def test_a_process_killed_mid_run_ends_the_other_in_one_line_and_both_rerun_resume(
        tmp_path, cifar10_data_dir):
    """kill -9 of process 1: process 0 ends in one line (its collective fails, or JAX's
    distributed service ends it when the heartbeats stop), no traceback or C++ dump, its
    steps on record; the same two commands resume from the chief's backup to the end."""
    run_dir = tmp_path / "killed"
    argv = _cli(run_dir, cifar10_data_dir, 30, 10, 4)
    first = _start_processes(argv)
    wait_for_backup(first, run_dir, 8)
    first[1].send_signal(signal.SIGKILL)
    first[1].wait()
    status, _, err = _outputs(first[:1])[0]
    assert status == 1, err[-3000:]
    lost_line = err.splitlines()[-1]
    assert re.fullmatch(r"keras-preact train: error: Lost a peer process \(.+\), at step \d+; "
                        r"the last good backup \(step \d+\) is kept in .*\. Restart every "
                        r"worker with the same command to resume\.", lost_line
                        ) or lost_line == f"keras-preact train: error: {distribute.PEER_LOST}", err
    assert re.fullmatch(WAITING + re.escape(lost_line) + "\n", err), err[-3000:]
    killed_at = backup_step(run_dir)
    assert 8 <= killed_at < 30 and not (run_dir / "model.keras").exists()

    second = _outputs(_start_processes(argv))
    assert [status for status, _, _ in second] == [0, 0], second[0][2][-3000:]
    for _, out, _ in second:
        resumed = int(re.search(r"resuming from step (\d+) of 30", out).group(1))
        assert resumed >= killed_at
    chief, worker = (_finished(out) for _, out, _ in second)
    assert chief == worker and chief[0] == 30
    assert sorted(os.listdir(run_dir)) == RUN_FILES
    sessions = rundir.read_sessions(run_dir)
    assert len(sessions) == 2 and sessions[1]["steps"] == [resumed, 30]
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


def test_a_process_that_stops_answering_ends_the_other_after_the_heartbeat_timeout(
        tmp_path, cifar10_data_dir):
    """A process that hangs (SIGSTOP: its sockets stay open, its collectives never fail)
    ends the other once JAX's distributed service misses its heartbeats for
    HEARTBEAT_TIMEOUT_S: the service aborts it, and the supervising parent says so in one
    line, exit 1, instead of an abort's C++ dump or a wait without end."""
    run_dir = tmp_path / "hung"
    processes = _start_processes(_cli(run_dir, cifar10_data_dir, 60, 20, 4))
    wait_for_backup(processes, run_dir, 4)
    supervisor = processes[1].pid
    with open(f"/proc/{supervisor}/task/{supervisor}/children") as f:
        [worker] = [int(pid) for pid in f.read().split()]  # the process that trains
    os.kill(worker, signal.SIGSTOP)
    try:
        status, _, err = _outputs(processes[:1])[0]
    finally:
        processes[1].kill()  # and with it the stopped worker (PR_SET_PDEATHSIG)
        processes[1].wait()
    assert status == distribute.PEER_LOST_EXIT, err[-3000:]
    assert re.fullmatch(WAITING + re.escape(f"keras-preact train: error: {distribute.PEER_LOST}")
                        + "\n", err), err[-3000:]


def test_a_process_whose_peers_never_come_ends_after_the_connect_timeout(tmp_path):
    """--connect-timeout bounds the wait as under TF_CONFIG: one line, exit 2, nothing
    written (JAX's own timeout, which aborts, would come JAX_INIT_MARGIN_S later)."""
    run_dir = tmp_path / "alone"
    coordinator = f"localhost:{_free_port()}"
    done = subprocess.run(
        [sys.executable, "-m", "keras_preact.cli", "train", "preact-20", "--output",
         str(run_dir), "--strategy", "multi-worker", "--connect-timeout", "3"],
        capture_output=True, text=True, timeout=300, env=_process_env(coordinator, 0))
    assert done.returncode == distribute.CONNECT_TIMEOUT_EXIT, done.stderr[-3000:]
    group = f"KERAS_DISTRIBUTION_NUM_PROCESSES=2 (coordinator {coordinator})"
    assert done.stderr.splitlines() == [
        f"keras-preact: waiting for the 2 processes of {group} to connect, at most 3 s "
        "(--connect-timeout)",
        f"keras-preact train: error: not every process of {group} connected within 3 s; start "
        "every one with the same KERAS_DISTRIBUTION_JOB_ADDRESSES and "
        "KERAS_DISTRIBUTION_NUM_PROCESSES and its own KERAS_DISTRIBUTION_PROCESS_ID, or raise "
        "--connect-timeout."]
    assert not run_dir.exists()
