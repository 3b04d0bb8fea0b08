"""tf.distribute and faults, each in fresh processes: MirroredStrategy over two logical CPUs,
MultiWorkerMirroredStrategy with two workers via the CLI, SIGKILL then resume."""

import csv
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time

from keras_preact import rundir

TRAIN = [sys.executable, "-m", "keras_preact.cli", "train", "preact-20", "--override", "depth=14",
         "--warmup-steps", "0"]


def _env(**extra):
    """The environment of a user's console: without TF_CPP_MIN_LOG_LEVEL, which (set) asks for
    TensorFlow's C++ logs."""
    env = {k: v for k, v in os.environ.items() if k != "TF_CPP_MIN_LOG_LEVEL"}
    return {**env, **extra}


def _free_port():
    with socket.socket() as s:
        s.bind(("localhost", 0))
        return s.getsockname()[1]


def _finished(output: str) -> tuple[int, str]:
    match = re.search(r"finished at step (\d+); trainable weights sha256 (\w+)", output)
    assert match, output[-2000:]
    return int(match.group(1)), match.group(2)


MIRRORED = """
import json, sys, tensorflow as tf
cpu = tf.config.list_physical_devices("CPU")[0]
tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
from keras_preact import training
m = training.train("preact-20", output=sys.argv[1], data_dir=sys.argv[2], steps=8,
                   steps_per_epoch=4, batch_size=16, warmup_steps=0, val_examples=64,
                   strategy="mirrored", overrides={"depth": 14}, verbose=0)
print(json.dumps({"step": int(m.optimizer.iterations.numpy()),
                  "replicas": m.distribute_strategy.num_replicas_in_sync}))
"""


def test_mirrored_strategy_over_two_logical_cpus(tmp_path, cifar10_data_dir):
    run_dir = tmp_path / "mirrored"
    proc = subprocess.run([sys.executable, "-c", MIRRORED, str(run_dir), cifar10_data_dir],
                          capture_output=True, text=True, timeout=400, env=_env())
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert json.loads(proc.stdout.strip().splitlines()[-1]) == {"step": 8, "replicas": 2}
    config = json.load(open(run_dir / "config.json"))
    assert config["replicas"] == 2 and config["stages"] == "scan"
    with open(run_dir / "metrics.csv") as f:
        assert [int(r["step"]) for r in csv.DictReader(f)] == [4, 8]


def test_multi_worker_mirrored_two_workers_via_cli(tmp_path, cifar10_data_dir):
    run_dir = tmp_path / "mwms"
    ports = [_free_port(), _free_port()]
    cluster = {"worker": [f"localhost:{p}" for p in ports]}
    procs = [
        subprocess.Popen(
            [*TRAIN, "--output", str(run_dir), "--data-dir", cifar10_data_dir, "--steps", "12",
             "--steps-per-epoch", "6", "--batch-size", "16", "--val-examples", "64",
             "--backup-every", "5"],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
            env=_env(TF_CONFIG=json.dumps({"cluster": cluster,
                                           "task": {"type": "worker", "index": i}})),
        )
        for i in range(2)
    ]
    outputs = [p.communicate(timeout=500)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outputs[0][-3000:] + outputs[1][-3000:]
    chief, worker = _finished(outputs[0]), _finished(outputs[1])
    assert chief[0] == worker[0] == 12
    assert chief[1] == worker[1]  # identical weights on both workers
    assert f"model in {run_dir}/model.keras\n" in outputs[0]
    config = json.load(open(run_dir / "config.json"))
    # Scanned stages (the default for full pre-activation nets; depth 14 = 2 units a stage).
    assert config["replicas"] == 2 and config["strategy"] == "auto" and config["stages"] == "scan"
    # Only the chief wrote the run directory; the backup is gone once finished.
    assert sorted(os.listdir(run_dir)) == ["config.json", "logs", "metrics.csv", "model.keras",
                                           "sessions.json"]


def wait_for_backup(processes: list[subprocess.Popen], run_dir, step: int,
                    timeout: float = 400) -> None:
    """Returns once the backup in `run_dir` has reached `step`, all `processes` still
    running (an assertion error if one ended first)."""
    meta = run_dir / "backup" / "training_metadata.json"
    deadline = time.time() + timeout
    while time.time() < deadline and all(p.poll() is None for p in processes):
        if meta.exists() and json.loads(meta.read_text())["step"] >= step:
            break
        time.sleep(0.2)
    assert all(p.poll() is None for p in processes), "training ended before it could be killed"


def backup_step(run_dir) -> int:
    return json.loads((run_dir / "backup" / "training_metadata.json").read_text())["step"]


def kill_after_backup(argv: list[str], env: dict, run_dir, step: int = 10) -> int:
    """Starts `argv`, SIGKILLs it once its backup in `run_dir` has reached `step`; returns the
    backup's step."""
    first = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                             env=env)
    wait_for_backup([first], run_dir, step, timeout=300)
    first.send_signal(signal.SIGKILL)
    first.wait()
    return backup_step(run_dir)


def test_sigkill_then_rerun_resumes_and_ends_at_the_same_step(tmp_path, cifar10_data_dir):
    run_dir = tmp_path / "killed"
    argv = [*TRAIN, "--output", str(run_dir), "--data-dir", cifar10_data_dir, "--steps", "40",
            "--steps-per-epoch", "15", "--batch-size", "32", "--val-examples", "0",
            "--backup-every", "5"]
    killed_at = kill_after_backup(argv, _env(), run_dir)
    assert not (run_dir / "model.keras").exists()

    second = subprocess.run(argv, capture_output=True, text=True, timeout=400, env=_env())
    assert second.returncode == 0, second.stderr[-3000:]
    resumed = int(re.search(r"resuming from step (\d+) of 40", second.stdout).group(1))
    assert resumed >= killed_at and resumed % 5 == 0
    assert _finished(second.stdout)[0] == 40
    with open(run_dir / "metrics.csv") as f:
        steps = [int(r["step"]) for r in csv.DictReader(f)]
    assert steps[-1] == 40 and steps == sorted(steps)
    assert json.load(open(run_dir / "config.json"))["stages"] == "scan"
    # Both processes are on record: the killed one up to its last epoch end, the rerun from
    # the backup it resumed from to the end.
    first_session, second_session = rundir.read_sessions(run_dir)
    assert first_session["steps"][0] == 0
    assert first_session["steps"][1] % 15 == 0 and first_session["steps"][1] <= killed_at
    assert second_session["steps"] == [resumed, 40] and second_session["seconds"] > 0


def test_a_worker_killed_mid_run_then_both_restarted_resume_to_identical_weights(
        tmp_path, cifar10_data_dir):
    """kill -9 one of two MWMS workers; the other ends in one line naming it (it was a
    traceback of CollectiveReduceV2), its steps on record; the same two commands resume from
    the chief's backup to the exact step count."""
    run_dir = tmp_path / "mwms-killed"

    def start_workers(ports):
        cluster = {"worker": [f"localhost:{p}" for p in ports]}
        return [
            subprocess.Popen(
                [*TRAIN, "--output", str(run_dir), "--data-dir", cifar10_data_dir, "--steps",
                 "30", "--steps-per-epoch", "10", "--batch-size", "16", "--val-examples", "0",
                 "--backup-every", "4"],
                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                env=_env(TF_CONFIG=json.dumps({"cluster": cluster,
                                               "task": {"type": "worker", "index": i}})))
            for i in range(2)
        ]

    ports = [_free_port(), _free_port()]
    first = start_workers(ports)
    wait_for_backup(first, run_dir, 8)
    first[1].send_signal(signal.SIGKILL)  # the worker
    first[1].wait()
    survivor = first[0].communicate(timeout=300)[0]
    assert first[0].returncode == 1, survivor[-3000:]
    assert re.fullmatch(rf"keras-preact train: error: Lost worker 1 at localhost:{ports[1]} "
                        r"\(.*\), at step \d+; the last good backup \(step \d+\) is kept in .*\. "
                        r"Restart every worker with the same command to resume\.",
                        survivor.strip().splitlines()[-1]), survivor[-3000:]
    # Only our lines: none of the C++ logs of TensorFlow's collectives (7 lines before the fix).
    assert all(line.startswith("keras-preact") for line in survivor.strip().splitlines()), \
        survivor[-3000:]
    (session,) = rundir.read_sessions(run_dir)
    killed_at = backup_step(run_dir)
    assert session["steps"][1] >= killed_at  # it was [0, 0]: no epoch had ended
    assert 8 <= killed_at < 30 and not (run_dir / "model.keras").exists()

    second = start_workers([_free_port(), _free_port()])
    outputs = [p.communicate(timeout=500)[0] for p in second]
    assert [p.returncode for p in second] == [0, 0], outputs[0][-3000:] + outputs[1][-3000:]
    for output in outputs:
        resumed = int(re.search(r"resuming from step (\d+) of 30", output).group(1))
        assert resumed >= killed_at
    chief, worker = _finished(outputs[0]), _finished(outputs[1])
    assert chief[0] == worker[0] == 30 and chief[1] == worker[1]
