"""The trainer under faults and hostile input: one run per RUN_DIR, advice that works, damaged
backups, failed starts, bad environment. Each error is one line that names its source."""

import json
import os
import signal
import subprocess
import sys
import time
import warnings

import numpy as np
import pytest

from keras_preact import cli, host, rundir, training
from keras_preact.training import callbacks, resume
from keras_preact.training.net import build_and_compile

TINY = {"depth": 8}
HOLD_LOCK = """
import sys, time
from keras_preact.training.resume import run_lock
with run_lock(sys.argv[1]):
    print("locked", flush=True)
    time.sleep(600)
"""


def test_a_second_trainer_on_a_live_run_dir_is_refused(tmp_path, capsys, cifar10_data_dir):
    run_dir = tmp_path / "run"
    holder = subprocess.Popen([sys.executable, "-c", HOLD_LOCK, str(run_dir)],
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "locked"
        assert cli.main(["train", "preact-20", "--override", "depth=8", "--output",
                         str(run_dir), "--data-dir", cifar10_data_dir]) == 2
        err = capsys.readouterr().err
        assert err == (f"keras-preact train: error: Another trainer is running in "
                       f"{str(run_dir)!r}; wait for it, or choose another --output.\n")
        assert os.listdir(run_dir) == []  # nothing written by the refused one
    finally:
        holder.kill()  # kill -9: the kernel releases the lock with the process
        holder.wait()
    with resume.run_lock(str(run_dir)):
        with pytest.raises(FileExistsError, match="Another trainer"):
            with resume.run_lock(str(run_dir)):
                pass


def test_a_diverged_run_resumes_with_the_lower_lr_its_error_advises(cifar10_data_dir, tmp_path):
    run_dir = str(tmp_path / "nan")
    common = dict(output=run_dir, data_dir=cifar10_data_dir, steps=12, steps_per_epoch=6,
                  batch_size=32, warmup_steps=4, val_examples=0, backup_every=2,
                  overrides=TINY, verbose=0)
    with pytest.raises(training.TrainingDiverged, match="Rerun with a lower --lr") as diverged:
        training.train("preact-20", lr=1e30, **common)
    assert json.load(open(os.path.join(run_dir, "config.json")))["diverged_at_step"] == (
        diverged.value.step)
    with pytest.raises(ValueError, match=r"only lr, warmup_steps, warmup_lr may change.*"
                                         r"batch_size: 32 -> 16"):
        training.train("preact-20", lr=0.1, **{**common, "batch_size": 16})
    model = training.train("preact-20", lr=0.1, **common)
    assert int(model.optimizer.iterations.numpy()) == 12
    config = json.load(open(os.path.join(run_dir, "config.json")))
    assert config["lr"] == 0.1
    assert config["changes"] == [{"at_step": diverged.value.step, "lr": [1e30, 0.1]}]
    assert 4 < diverged.value.step <= 12 and "diverged_at_step" not in config


def test_a_start_that_failed_before_its_first_backup_does_not_block_the_rerun(
        cifar10_data_dir, tmp_path):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    # What a start writes before training (its whole recipe, of which these are a part).
    (run_dir / "config.json").write_text(json.dumps({"model": "preact-20", "steps": 64000,
                                                     "lr": 0.5}))
    model = training.train("preact-20", output=str(run_dir), data_dir=cifar10_data_dir,
                           steps=2, batch_size=16, val_examples=0, overrides=TINY, verbose=0)
    assert int(model.optimizer.iterations.numpy()) == 2
    assert json.load(open(run_dir / "config.json"))["lr"] == 0.1


def _fit_with_backups(backup_dir, steps):
    from keras_preact.optim import paper_schedule

    model = build_and_compile("preact-20", paper_schedule(10, warmup_steps=0),
                              overrides=TINY)
    x = np.random.default_rng(0).normal(size=(4 * steps, 32, 32, 3)).astype("float32")
    y = np.arange(4 * steps) % 10
    model.fit(x, y, batch_size=4, epochs=1, verbose=0, shuffle=False, callbacks=[
        callbacks.RunBackup(backup_dir, every=1, steps_per_epoch=steps)])
    return model


def _damaged_latest_backup(tmp_path):
    """A backup dir whose newest backup (step 4) is cut in half, the one before intact."""
    backup_dir = str(tmp_path / "backup")
    _fit_with_backups(backup_dir, steps=4)
    latest = os.path.join(backup_dir, callbacks.BACKUP_FILE)
    with open(latest, "r+b") as f:
        f.truncate(os.path.getsize(latest) // 2)
    return backup_dir, latest


def test_a_damaged_backup_falls_back_to_the_previous_one(tmp_path):
    backup_dir, latest = _damaged_latest_backup(tmp_path)
    said = []
    fresh = _fit_with_backups(str(tmp_path / "other"), steps=1)
    assert callbacks.restore_backup(fresh, backup_dir, log=said.append) == 2
    assert len(said) == 1 and said[0].startswith(f"keras-preact: warning: {latest}: ")
    assert f"resuming from {backup_dir}/{callbacks.PREVIOUS_FILE} instead" in said[0]
    previous = os.path.join(backup_dir, callbacks.PREVIOUS_FILE)
    with open(previous, "r+b") as f:
        f.truncate(100)
    with pytest.raises(ValueError, match=f"No readable backup in {backup_dir} .*Delete "
                                         f"{backup_dir} to start over"):
        callbacks.restore_backup(fresh, backup_dir)


def test_after_falling_back_the_damaged_backup_leaves_the_rotation(tmp_path):
    """The next backup keeps the good one it resumed from as previous (it kept the damaged
    file there, and a second damage then left nothing to resume from)."""
    backup_dir, latest = _damaged_latest_backup(tmp_path)
    said = []
    model = _fit_with_backups(str(tmp_path / "other"), steps=1)
    assert callbacks.restore_backup(model, backup_dir, log=said.append) == 2
    damaged = os.path.join(backup_dir, callbacks.DAMAGED_FILE)
    assert said[0].endswith(f"instead (the damaged file is now {damaged})")
    backup = callbacks.RunBackup(backup_dir, every=1, steps_per_epoch=4, saved_step=2)
    backup.set_model(model)
    for step in (3, 4):  # the step-3 backup, good by the step-4 loss
        model.optimizer.iterations.assign(step)
        backup.on_train_batch_end(step - 3, {"loss": 2.0})
    assert backup.saved_step == 3
    with open(latest, "r+b") as f:  # damaged again: the previous one is still good
        f.truncate(os.path.getsize(latest) // 2)
    assert callbacks.restore_backup(model, backup_dir, log=said.append) == 2


def test_a_backup_needs_finite_weights_and_a_sane_loss(tmp_path):
    """A backup after a divergence that is still finite was kept as "the last good backup"
    (--lr 1000: the step-8 one, loss 3e9), and the rerun resumed from it to a 9 % net. A
    backup's loss is the next step's, computed with its weights."""
    backup_dir = tmp_path / "backup"
    model = _fit_with_backups(str(tmp_path / "other"), steps=1)
    backup = callbacks.RunBackup(str(backup_dir), every=1, steps_per_epoch=100)
    backup.set_model(model)
    chance = np.log(10)
    # The loss of each step (computed before its update), and the newest good backup after it.
    steps = [(2.3, None), (2.2, 1), (9.99 * chance, 2), (10.01 * chance, 2), (2.0, 4),
             (3e9, 4)]
    losses = []
    for step, (loss, newest) in enumerate(steps, start=1):
        losses.append(loss)
        model.optimizer.iterations.assign(step)
        backup.on_train_batch_end(step - 1, {"loss": np.float32(np.mean(losses))})
        assert backup.saved_step == newest
    assert json.load(open(backup_dir / callbacks.BACKUP_METADATA))["step"] == 4
    backup.on_epoch_end(0, {})  # a new epoch: its first loss is the step-6 backup's
    model.layers[-1].bias.assign(np.full(10, np.inf, "float32"))  # not finite: not saved
    for step in (7, 8):
        model.optimizer.iterations.assign(step)
        backup.on_train_batch_end(step - 7, {"loss": 2.0})
    assert backup.saved_step == 6 and backup.pending_step is None


@pytest.mark.parametrize("setup, argv, message", [
    (lambda d: (d / "afile").write_text("x"), ["--output", "{d}/afile"],
     "`output` must be a run directory; '{d}/afile' is a file"),
    (lambda d: (d / "afile").write_text("x"), ["--output", "{d}/afile/run"],
     "Not a directory: '{d}/afile"),
    (lambda d: (d / "run").mkdir() or (d / "run" / "config.json").write_text("{oops"),
     ["--output", "{d}/run"], "{d}/run/config.json is not a keras-preact run config "
                              r"\(Expecting property name"),
    (lambda d: (d / "run").mkdir() or (d / "run" / "config.json").write_text("[]"),
     ["--output", "{d}/run"], r"{d}/run/config.json is not a keras-preact run config \(\[\]\)"),
    # A user's own config.json in --output, with no backup beside it, was replaced.
    (lambda d: (d / "run").mkdir() or (d / "run" / "config.json").write_text('{"lr": 1}'),
     ["--output", "{d}/run"], "{d}/run/config.json is not a keras-preact run config "
                              r"\(no model, steps\)\. Move it away to start over, or choose "
                              "another --output.$"),
    # Both were an AttributeError traceback ('SessionLog' object has no attribute 'sessions').
    (lambda d: (d / "run").mkdir() or (d / "run" / "sessions.json").write_text('[{"mach'),
     ["--output", "{d}/run"], "{d}/run/sessions.json is not a keras-preact sessions file "
                              r"\(Unterminated string.*\)\. Move it away to start over, or "
                              "choose another --output.$"),
    (lambda d: (d / "run").mkdir() or (d / "run" / "sessions.json").write_text('["mine"]'),
     ["--output", "{d}/run"], "{d}/run/sessions.json is not a keras-preact sessions file "
                              r"\(an entry without machine, seconds, started, steps: mine\)"),
    (None, ["--output", "{d}/run", "--lr", "inf"], "Need finite lr > 0.*lr=inf"),
    (None, ["--output", "{d}/run", "--val-examples", "50000"],
     "'cifar10' has 50000 training examples: `val_examples` \\+ `batch_size` must not exceed"),
    (None, ["--output", "{d}/run", "--override", "input_shape=[8,8,3]"],
     r"CIFAR images are 32x32: .* Received: input_shape=\(8, 8, 3\)"),
])
def test_bad_run_dirs_and_settings_are_one_line(setup, argv, message, tmp_path, capsys,
                                                  cifar10_data_dir):
    import re

    if setup:
        setup(tmp_path)
    before = sorted(str(p) for p in tmp_path.rglob("*"))
    started_ns = time.time_ns()
    argv = [a.format(d=tmp_path) for a in argv]
    assert cli.main(["train", "preact-20", "--data-dir", cifar10_data_dir, *argv]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("keras-preact train: error: ")
    assert re.search(message.format(d=tmp_path), err), err
    assert sorted(str(p) for p in tmp_path.rglob("*")) == before  # nothing written
    for path in tmp_path.rglob("*.json"):  # nor replaced
        assert path.stat().st_mtime_ns <= started_ns, path


@pytest.mark.parametrize("value", ["not json", "[]", '{"cluster": []}'])
def test_a_malformed_tf_config_is_named(value, monkeypatch, tmp_path, capsys):
    monkeypatch.setenv("TF_CONFIG", value)
    assert cli.main(["train", "preact-20", "--output", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("keras-preact train: error: TF_CONFIG must be a JSON object")
    assert err.rstrip().endswith(f"Received: TF_CONFIG={value!r}")


@pytest.mark.parametrize("precision, flags, onednn, said", [
    ("float16", {"avx2"}, "1", "float16 has no fast kernels on CPUs"),
    ("bfloat16", {"avx2", "avx512f"}, "1", "this CPU has no bfloat16 instructions"),
    ("off", {"avx2"}, "0", "TensorFlow runs without its oneDNN kernels on this CPU"),
])
def test_slow_cpu_settings_warn(precision, flags, onednn, said, tmp_path, monkeypatch):
    monkeypatch.setattr(host, "cpu_flags", lambda: flags)
    monkeypatch.setattr(host, "_x86_linux", lambda: True)
    monkeypatch.setenv(host.ONEDNN, onednn)  # what TensorFlow reads; it is loaded already
    with pytest.warns(UserWarning, match=said) as caught:
        with pytest.raises(FileNotFoundError, match="does not exist"):
            training.train("preact-20", output=str(tmp_path / "r"), mixed_precision=precision,
                           data_dir=str(tmp_path / "missing"), overrides=TINY)
    assert len(slow_cpu_warnings(caught)) == 1


def test_a_cpu_with_bfloat16_and_onednn_gets_no_warning(tmp_path, monkeypatch):
    monkeypatch.setattr(host, "cpu_flags", lambda: {"avx512_bf16", "avx512_vnni"})
    monkeypatch.setattr(host, "_x86_linux", lambda: True)
    monkeypatch.delenv(host.ONEDNN, raising=False)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with pytest.raises(FileNotFoundError, match="does not exist"):
            training.train("preact-20", output=str(tmp_path / "r"), mixed_precision="bfloat16",
                           data_dir=str(tmp_path / "missing"), overrides=TINY)
    assert slow_cpu_warnings(caught) == []


def slow_cpu_warnings(caught) -> list[str]:
    return [str(w.message) for w in caught
            if any(k in str(w.message) for k in ("oneDNN", "float16", "bfloat16"))]


def _lonely_worker(run_dir, timeout_s: int, nohup: bool = False
                   ) -> tuple[subprocess.Popen, list[str]]:
    """Starts `keras-preact train` as worker 0 of a two-worker TF_CONFIG whose other worker
    never comes, as from a terminal (SIGHUP's default action, whatever this test run
    inherited) or under `nohup`; returns the process and the two addresses."""
    import socket

    addresses = []
    for _ in range(2):
        with socket.socket() as s:
            s.bind(("localhost", 0))
            addresses.append(f"localhost:{s.getsockname()[1]}")
    tf_config = {"cluster": {"worker": addresses}, "task": {"type": "worker", "index": 0}}
    process = subprocess.Popen(
        [sys.executable, "-m", "keras_preact.cli", "train", "preact-20", "--output",
         str(run_dir), "--connect-timeout", str(timeout_s), "--override", "depth=8"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env={**{k: v for k, v in os.environ.items() if k != "TF_CPP_MIN_LOG_LEVEL"},  # TFDS
             "TF_CONFIG": json.dumps(tf_config)},  # set it in this process: the CLI's default
        preexec_fn=lambda: signal.signal(signal.SIGHUP,
                                         signal.SIG_IGN if nohup else signal.SIG_DFL))
    return process, addresses


def test_a_worker_whose_peer_never_comes_gives_up_with_a_clear_line(tmp_path):
    started = time.monotonic()
    process, addresses = _lonely_worker(tmp_path / "run", 3)
    _, err = process.communicate(timeout=300)
    assert process.returncode == 2, err  # as any error the user can fix; 137 before
    lines = err.strip().splitlines()
    assert lines[0].startswith("keras-preact: waiting for the 2 workers of TF_CONFIG")
    assert lines[-1] == (
        f"keras-preact train: error: not every worker of TF_CONFIG ({', '.join(addresses)}) "
        "connected within 3 s; start them all with the same TF_CONFIG cluster, or raise "
        "--connect-timeout.")
    assert time.monotonic() - started < 250


@pytest.mark.parametrize("signum, target", [
    (signal.SIGINT, "parent"), (signal.SIGTERM, "parent"), (signal.SIGHUP, "parent"),
    (signal.SIGINT, "worker"), (signal.SIGHUP, "worker"),
    # Not (SIGTERM, "worker"): waiting for its peers, TensorFlow's coordination service takes
    # it as a preemption notice and goes on (distribute.STOP_GRACE_S); it works once training.
])
def test_a_stop_signal_to_either_process_ends_both_in_one_line(signum, target, tmp_path):
    # `kill`, `timeout`, `docker stop` and IDE stop buttons signal one pid (not the group):
    # the supervising parent passed on SIGTERM and SIGHUP only, and ignored SIGINT (#43).
    # A SIGTERM passed on while TensorFlow holds it ends the worker STOP_GRACE_S later.
    process, _ = _lonely_worker(tmp_path / "run", 300)
    assert process.stderr.readline().startswith("keras-preact: waiting for the 2 workers")
    (worker,) = [int(p) for p in subprocess.run(["pgrep", "-P", str(process.pid)],
                                                capture_output=True, text=True).stdout.split()]
    os.kill(process.pid if target == "parent" else worker, signum)
    _, err = process.communicate(timeout=60)
    assert process.returncode == 128 + signum
    what = "interrupted" if signum == signal.SIGINT else f"stopped by {signum.name}"
    assert err == f"keras-preact train: {what}; rerun the same command to resume\n"
    deadline = time.monotonic() + 10  # the watchdog's next look at its parent is 0.5 s away
    while time.monotonic() < deadline and _processes_naming(tmp_path / "run"):
        time.sleep(0.1)
    assert _processes_naming(tmp_path / "run") == b""


def test_under_nohup_a_sighup_to_either_process_is_ignored(tmp_path):
    """`nohup keras-preact train ...` asks for SIGHUP to be ignored: the supervising parent
    must not turn it into a stop (it did once it passed every stop signal on, #43)."""
    process, _ = _lonely_worker(tmp_path / "run", 300, nohup=True)
    assert process.stderr.readline().startswith("keras-preact: waiting for the 2 workers")
    (worker,) = [int(p) for p in subprocess.run(["pgrep", "-P", str(process.pid)],
                                                capture_output=True, text=True).stdout.split()]
    for pid in (process.pid, worker):
        os.kill(pid, signal.SIGHUP)
    time.sleep(2)
    assert process.poll() is None  # both still wait for the peer
    os.kill(process.pid, signal.SIGINT)
    _, err = process.communicate(timeout=60)
    assert process.returncode == 128 + signal.SIGINT
    assert err == "keras-preact train: interrupted; rerun the same command to resume\n"


def _processes_naming(path) -> bytes:
    return subprocess.run(["pgrep", "-f", str(path)], capture_output=True).stdout


def _interrupt_when(command, ready):
    """Runs the CLI `command` in a process of its own, sends it SIGINT (Ctrl-C) once
    `ready()`, and returns (exit status, stderr)."""
    quiet = {k: v for k, v in os.environ.items() if k != "TF_CPP_MIN_LOG_LEVEL"}  # TFDS sets it
    process = subprocess.Popen([sys.executable, "-m", "keras_preact.cli", *command],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                               env=quiet)
    deadline = time.monotonic() + 300
    while not ready() and process.poll() is None and time.monotonic() < deadline:
        time.sleep(0.02)
    process.send_signal(signal.SIGINT)
    _, err = process.communicate(timeout=60)
    return process.returncode, err


def test_ctrl_c_during_training_is_one_line_and_keeps_the_backup(cifar10_data_dir, tmp_path):
    run_dir = tmp_path / "run"
    command = ["train", "preact-20", "--override", "depth=8", "--output", str(run_dir),
               "--data-dir", cifar10_data_dir, "--steps", "100000", "--batch-size", "16",
               "--val-examples", "1000", "--backup-every", "5"]
    backup = run_dir / "backup" / "latest.weights.h5"
    status, err = _interrupt_when(command, backup.exists)
    assert status == cli.INTERRUPTED
    assert err == "keras-preact train: interrupted; rerun the same command to resume\n"
    assert not (run_dir / "model.keras").exists()
    with resume.run_lock(str(run_dir)):  # released
        pass
    saved = callbacks.restore_backup(build_and_compile(
        "preact-20", training.paper_schedule(100000), overrides=TINY), str(run_dir / "backup"))
    assert saved >= 5
    # The session is on record with the steps it made, though no epoch ended ([0, 0] before).
    (session,) = rundir.read_sessions(run_dir)
    assert session["steps"][0] == 0 and session["steps"][1] >= saved


def test_a_lost_worker_is_named_with_its_address(monkeypatch):
    from keras_preact.training import distribute

    monkeypatch.setenv("TF_CONFIG", json.dumps({"cluster": {"worker": ["a:2222", "b:2222"]},
                                                "task": {"type": "worker", "index": 0}}))
    # What a survivor's fit raised (tf.errors.UnavailableError) when worker 1 was killed.
    seen = ("Graph execution error:\n\nDetected at node CollectiveReduceV2_1 defined at (most "
            "recent call last):\n  File \"<frozen runpy>\", line 198\n\nCollective ops is "
            "aborted by: Socket closed\nAdditional GRPC error information from remote target "
            "/job:worker/replica:0/task:1 while calling /tensorflow.WorkerService/RecvBuf:\n"
            ":UNKNOWN:Error received from peer  {grpc_status:14, grpc_message:\"Socket closed\"}")
    assert distribute.lost_worker(RuntimeError(seen)) == "worker 1 at b:2222 (Socket closed)"
    # Or, when the coordination service noticed first (the node's placement names task 0):
    seen = ("Detected at node CollectiveReduceV2 on /job:worker/replica:0/task:0/device:CPU:0"
            "\nCollective ops is aborted by: Error reported from /job:worker/task:1: The "
            "following tasks are unhealthy (stopped sending heartbeats):\n"
            "/job:worker/replica:0/task:1\nThe tasks have crashed.")
    assert distribute.lost_worker(RuntimeError(seen)) == (
        "worker 1 at b:2222 (The following tasks are unhealthy (stopped sending heartbeats))")
    assert distribute.lost_worker(RuntimeError("OOM when allocating tensor")) is None
