"""A short real-CIFAR-10 run through `train`, its RUN_DIR, `evaluate`, faults and bad input."""

import csv
import io
import itertools
import json
import os
import shutil
from types import SimpleNamespace

import h5py
import numpy as np
import pytest

from keras_preact import cli, host, rundir, training

TINY = {"depth": 8}


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory, cifar10_data_dir):
    run_dir = str(tmp_path_factory.mktemp("run") / "preact-8")
    model = training.train(
        "preact-20", output=run_dir, data_dir=cifar10_data_dir, steps=90, steps_per_epoch=30,
        batch_size=64, warmup_steps=10, val_examples=500, backup_every=25, overrides=TINY,
        seed=0, verbose=0,
    )
    return run_dir, model


def _metrics(run_dir):
    with open(os.path.join(run_dir, "metrics.csv")) as f:
        return list(csv.DictReader(f))


def test_run_dir_layout_and_loss_falls(finished_run):
    run_dir, model = finished_run
    assert sorted(os.listdir(run_dir)) == ["config.json", "logs", "metrics.csv", "model.keras",
                                           "sessions.json"]
    assert sorted(os.listdir(os.path.join(run_dir, "logs"))) == ["train", "validation"]
    [session] = rundir.read_sessions(run_dir)
    assert session["steps"] == [0, 90] and session["seconds"] > 0
    assert session["machine"].startswith(host.describe() + "; OneDeviceStrategy, replicas: 1")
    hours, machines = rundir.training_time(run_dir)
    assert hours == pytest.approx(session["seconds"] / 3600) and machines == [session["machine"]]
    with open(os.path.join(run_dir, "metrics.csv")) as f:
        assert f.readline().strip() == ("epoch,step,lr,loss,accuracy,val_loss,val_accuracy,"
                                        "test_loss,test_accuracy")
    rows = _metrics(run_dir)
    assert [int(r["step"]) for r in rows] == [30, 60, 90]
    # lr of each epoch's last step (iterations 29, 59, 89): drops at 45 and 68 of 90 steps.
    assert [float(r["lr"]) for r in rows] == pytest.approx([0.1, 0.01, 0.001])
    losses = [float(r["loss"]) for r in rows]
    assert losses[-1] < losses[0] - 0.05 and losses[-1] < 2.2  # chance is ln 10 = 2.30
    config = json.load(open(os.path.join(run_dir, "config.json")))
    assert config["model"] == "preact-20" and config["overrides"] == TINY
    assert config["family"] == "cifar" and config["warmup_steps"] == 10
    assert config["steps"] == 90 and config["batch_size"] == 64 and config["replicas"] == 1
    assert set(config["versions"]) >= {"keras", "tensorflow", "keras_preact"}
    assert int(model.optimizer.iterations.numpy()) == 90


def test_without_a_validation_slice_each_epoch_is_scored_on_the_test_split(tmp_path,
                                                                          cifar10_data_dir):
    """--val-examples 0 (the paper's runs, on all of train): test-error curves as in Fig. 1,
    each row the trained model's own score on the official test split."""
    run_dir = str(tmp_path / "all-of-train")
    model = training.train("preact-20", output=run_dir, data_dir=cifar10_data_dir, steps=20,
                           steps_per_epoch=10, batch_size=32, val_examples=0, overrides=TINY,
                           seed=0, verbose=0)
    rows = _metrics(run_dir)
    assert [r["val_accuracy"] for r in rows] == ["", ""]
    assert all(float(r["test_loss"]) > 0 for r in rows)
    measured = training.evaluate(model, dataset="cifar10", split="test", data_dir=cifar10_data_dir)
    assert measured["examples"] == 10000
    assert float(rows[-1]["test_accuracy"]) == pytest.approx(measured["accuracy"], abs=1e-4)


# Loads RUN/model.keras with Keras alone (keras_preact cannot be imported), safe mode on.
KERAS_ALONE = """
import sys
sys.modules["keras_preact"] = None
import keras, numpy as np
model = keras.saving.load_model(sys.argv[1], safe_mode=True)
images = np.load(sys.argv[2])
np.save(sys.argv[3], model.predict(images, verbose=0))
print(getattr(model, "optimizer", None) is None, len(model.layers))
"""


def assert_loads_with_keras_alone(run_dir, model, tmp_path):
    """RUN/model.keras is the plain layer graph without training state, whatever form the
    run trained in, and gives the trained model's outputs."""
    import subprocess
    import sys

    from keras_preact.arch import scan

    images = np.random.default_rng(0).normal(size=(4, 32, 32, 3)).astype("float32")
    np.save(tmp_path / "x.npy", images)
    done = subprocess.run(
        [sys.executable, "-c", KERAS_ALONE, os.path.join(run_dir, "model.keras"),
         str(tmp_path / "x.npy"), str(tmp_path / "y.npy")],
        capture_output=True, text=True, env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"})
    assert done.returncode == 0, done.stderr[-2000:]
    no_optimizer, layers = done.stdout.split()[-2:]
    assert no_optimizer == "True"
    plain = scan.to_layered(model) if scan.is_scanned(model) else model
    assert int(layers) == len(plain.layers)
    np.testing.assert_allclose(np.load(tmp_path / "y.npy"),
                               np.asarray(model(images, training=False)), atol=1e-5)


def test_model_keras_loads_with_keras_alone(finished_run, tmp_path):
    assert_loads_with_keras_alone(*finished_run, tmp_path)


@pytest.mark.parametrize("steps, warmup", [(64000, 400), (32000, 200), (100, 1), (1, 0)])
def test_default_warmup_keeps_the_papers_share_of_any_run(steps, warmup):
    from keras_preact.training.trainer import default_warmup_steps

    assert default_warmup_steps(steps, "cifar") == warmup
    assert default_warmup_steps(steps, "imagenet") == 0


def test_progress_counts_iterations_not_nominal_epochs(cifar10_data_dir, tmp_path, capsys):
    """A run that stops inside its first (nominal 703-step) epoch says where it really is:
    a line per epoch (verbose=2, logs), or a live bar over the run's steps (1, terminals)."""
    import re

    for verbose, expected in [(2, r"^epoch 1/1 - step 12/12 - \d+s - accuracy: [\d.]+ - loss: "),
                              (1, r"\r *12/12 ━+ .*/step - accuracy: .*\nepoch 1/1 - step 12/12")]:
        training.train("preact-20", output=str(tmp_path / f"v{verbose}"),
                       data_dir=cifar10_data_dir, steps=12, batch_size=64, val_examples=0,
                       overrides=TINY, verbose=verbose)
        out = re.sub(r"\x1b\[[0-9;]*m", "", capsys.readouterr().out)  # colours
        assert re.search(expected, out, re.M), out
        assert "/703" not in out


def test_progress_lines_say_the_time_left_at_the_recent_pace(monkeypatch):
    """Resumed at step 1000 of 4000, 100 steps an epoch at 0.5 s a step, except one epoch
    paused for 950 s: 24 minutes left, then 7.8 h for that one line, then 22 minutes again
    (the run's average would still say 2.8 h). The first step (tracing, 20 s) is not in the
    first estimate; an epoch that ends within `LINE_EVERY_S` of the last line prints nothing;
    the last line has no estimate."""
    from keras_preact.training import callbacks

    steps = iter([1001, 1100, 1200, 1300, 1320, 4000])
    iterations = SimpleNamespace(numpy=lambda: next(steps))
    clock = iter([10.0, 30.0, 79.5, 1079.5, 1129.5, 1139.5, 2479.5])
    monkeypatch.setattr(callbacks.time, "monotonic", lambda: next(clock))
    out = io.StringIO()
    progress = callbacks.Progress(4000, 40, live=False, stream=out)
    progress.set_model(SimpleNamespace(optimizer=SimpleNamespace(iterations=iterations)))
    progress.on_train_begin()
    progress.on_train_batch_end(0)
    for epoch in (10, 11, 12, 13, 39):
        progress.on_epoch_end(epoch, {"loss": 0.5})
    assert out.getvalue().splitlines() == [
        "epoch 11/40 - step 1100/4000 - 70s - left: 24m - loss: 0.5000",
        "epoch 12/40 - step 1200/4000 - 1070s - left: 7.8h - loss: 0.5000",
        "epoch 13/40 - step 1300/4000 - 1120s - left: 22m - loss: 0.5000",
        "epoch 40/40 - step 4000/4000 - 2470s - loss: 0.5000"]
    assert 1139.5 - 1129.5 < callbacks.LINE_EVERY_S <= 1129.5 - 1079.5


def test_a_short_run_of_tiny_epochs_prints_a_bounded_number_of_lines(monkeypatch):
    """1000 steps at 3 an epoch (a 120-image folder at batch 32) printed 334 lines."""
    from keras_preact.training import callbacks

    clock = itertools.count(0.0, 0.4)  # 0.4 s between readings, one an epoch: 134 s in all
    monkeypatch.setattr(callbacks.time, "monotonic", lambda: next(clock))
    out, step = io.StringIO(), 0
    progress = callbacks.Progress(1000, 334, live=False, stream=out)
    progress.set_model(SimpleNamespace(optimizer=SimpleNamespace(
        iterations=SimpleNamespace(numpy=lambda: step))))
    progress.on_train_begin()
    for epoch in range(334):
        for _ in range(3):
            step = min(step + 1, 1000)
            progress.on_train_batch_end(0)
        progress.on_epoch_end(epoch, {})
    lines = out.getvalue().splitlines()
    assert len(lines) == 6  # the first, one every 30 s (at 31, 61, 91, 121 s), the last
    assert lines[0].startswith("epoch 1/334 - step 3/1000 - 1s - left: ")
    assert lines[-1].startswith("epoch 334/334 - step 1000/1000 - 134s")


@pytest.mark.parametrize("seconds, said", [(45, "45s"), (89.4, "89s"), (90, "2m"),
                                           (5399, "90m"), (5400, "1.5h"), (12240, "3.4h")])
def test_durations_read_as_a_person_would(seconds, said):
    from keras_preact.training.callbacks import _duration

    assert _duration(seconds) == said


def test_evaluate_computes_what_the_trainers_validation_computes(finished_run, cifar10_data_dir):
    """`evaluate` on the run's validation slice gives what fit's validation pass gives for the
    same weights: the trainer's own validation dataset through Keras' `evaluate`."""
    from keras_preact.data import pipeline

    run_dir, model = finished_run
    config = rundir.read_config(run_dir)
    _, val_split = pipeline.train_val_splits(config["val_examples"])
    result = training.evaluate(model, split=val_split, data_dir=cifar10_data_dir)
    trainers = model.evaluate(pipeline.eval_dataset("cifar10", val_split, config["batch_size"],
                                                cifar10_data_dir),
                              return_dict=True, verbose=0)
    assert result["examples"] == 500
    assert result["accuracy"] == pytest.approx(trainers["accuracy"], abs=1e-6)
    assert result["loss"] == pytest.approx(trainers["loss"], rel=1e-5)
    assert result["error"] == pytest.approx(100 * (1 - result["accuracy"]))


def test_evaluate_cli_json_last_line(finished_run, cifar10_data_dir, capsys):
    run_dir, _ = finished_run
    path = os.path.join(run_dir, "model.keras")
    assert cli.main(["evaluate", path, "--split", "train[-200:]", "--data-dir",
                     cifar10_data_dir, "--batch-size", "64", "--json"]) == 0
    last = capsys.readouterr().out.strip().splitlines()[-1]
    result = json.loads(last)
    assert list(result) == ["accuracy", "error", "loss", "examples"]
    assert result["examples"] == 200
    # the figures of the Python API for the same file and split (batch size aside)
    expected = training.evaluate(path, split="train[-200:]", data_dir=cifar10_data_dir)
    assert result["accuracy"] == pytest.approx(expected["accuracy"], abs=1e-6)
    assert result["loss"] == pytest.approx(expected["loss"], rel=1e-5)
    assert result["error"] == pytest.approx(100 * (1 - expected["accuracy"]))


def test_finished_or_changed_runs_are_refused(finished_run, cifar10_data_dir, tmp_path):
    run_dir, _ = finished_run
    with pytest.raises(FileExistsError, match="finished run"):
        training.train("preact-20", output=run_dir, data_dir=cifar10_data_dir, overrides=TINY)
    other = tmp_path / "other"
    other.mkdir()
    shutil.copy(os.path.join(run_dir, "config.json"), other / "config.json")
    (other / "backup").mkdir()  # a run with a backup has something to resume
    (other / "backup" / "latest.weights.h5").write_bytes(b"")
    with pytest.raises(ValueError, match=r"other settings.*lr: 0.1 -> 0.2"):
        training.train("preact-20", output=str(other), data_dir=cifar10_data_dir, steps=90,
                       steps_per_epoch=30, batch_size=64, warmup_steps=10, val_examples=500,
                       lr=0.2, overrides=TINY, verbose=0)


@pytest.mark.parametrize(
    "argv, message",
    [
        (["preact-99"], "Unknown model name 'preact-99'"),
        (["preact-20", "--dataset", "nosuchdata"], "Unknown dataset 'nosuchdata'"),
        (["preact-20", "--data-dir", "/nonexistent/tfds"], "data dir '/nonexistent/tfds' does not"),
        (["preact-20", "--data-dir", "/dev/null"], "data dir '/dev/null' is not a directory"),
        (["preact-20", "--override", "input_shape=[32,32,1]"],
         r"images are RGB: input_shape needs 3 channels. Received: input_shape=\(32, 32, 1\)"),
        (["preact-20", "--data-dir", "/", "--no-download"],
         "'cifar10' is not prepared in data_dir"),
        (["preact-20", "--steps", "0"], "`steps` must be a positive integer. Received: steps=0"),
        (["preact-20", "--steps", "100", "--warmup-steps", "100"],
         r"`warmup_steps` must be an integer in \[0, steps=100\)"),
        (["preact-20", "--batch-size", "0"], "`batch_size` must be a positive integer"),
        (["preact-20", "--override", "depth=7"], "depth 6n\\+2"),
        (["preact-20", "--override", "depth"], "--override expects FIELD=VALUE"),
        (["preact-200-imagenet"], "imagenet network; dataset 'cifar10' needs a cifar one"),
        (["resnet-110", "--stages", "scan"], "stages='scan' needs full pre-activation units"),
        (["resnet-110", "--recompute"], "`recompute` needs stages='scan'.*model='resnet-110'"),
    ],
)
def test_bad_input_fails_before_any_work(argv, message, tmp_path, capsys):
    out = tmp_path / "run"
    assert cli.main(["train", *argv, "--output", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("keras-preact train: error: ")
    assert __import__("re").search(message, err), err
    assert not out.exists()  # nothing was created


def test_nan_loss_stops_with_a_clear_error_and_keeps_the_last_good_backup(
    cifar10_data_dir, tmp_path
):
    # 4 warm-up steps at 0.01 are backed up (every 2); then lr 1e30 blows the weights up.
    run_dir = tmp_path / "nan"
    with pytest.raises(training.TrainingDiverged, match=r"NaN/inf at step \d+.*step 4\)"):
        training.train("preact-20", output=str(run_dir), data_dir=cifar10_data_dir, steps=40,
                       steps_per_epoch=20, batch_size=32, lr=1e30, warmup_steps=4,
                       val_examples=0, backup_every=2, overrides=TINY, verbose=0)
    meta = json.load(open(run_dir / "backup" / "training_metadata.json"))
    assert meta["step"] == 4
    assert not (run_dir / "model.keras").exists()
    arrays = []
    with h5py.File(run_dir / "backup" / "latest.weights.h5", "r") as f:
        f.visititems(lambda name, obj: arrays.append(obj[()]) if isinstance(obj, h5py.Dataset)
                     else None)
    assert len(arrays) > 20 and all(np.isfinite(a).all() for a in arrays)


def test_full_preact_nets_train_scanned_by_default_and_export(tmp_path, cifar10_data_dir):
    """Full pre-activation nets train with scanned stages by default (here with
    `recompute`); the exported SavedModel serves the trained weights."""
    import tensorflow as tf

    from keras_preact import export, preprocessing
    from keras_preact.arch import scan

    run_dir = str(tmp_path / "scan")
    model = training.train(
        "preact-164", output=run_dir, data_dir=cifar10_data_dir, steps=6, batch_size=16,
        steps_per_epoch=3, warmup_steps=0, val_examples=32, recompute=True,
        overrides={"depth": 20}, verbose=0,
    )
    assert scan.is_scanned(model) and model.get_layer("stage2_scan").recompute
    assert int(model.optimizer.iterations.numpy()) == 6
    assert json.load(open(os.path.join(run_dir, "config.json")))["stages"] == "scan"
    assert_loads_with_keras_alone(run_dir, model, tmp_path)
    version = export.export_model(run_dir, str(tmp_path / "serving"))
    images = np.random.default_rng(0).integers(0, 256, (2, 32, 32, 3), dtype=np.uint8)
    served = tf.saved_model.load(version).signatures["serving_default"](images=images)
    expected = model(preprocessing.preprocess_input(images), training=False)
    np.testing.assert_allclose(served["probabilities"].numpy(), np.asarray(expected), atol=1e-5)
    with pytest.raises(ValueError, match="`recompute` needs stages='scan' .* stages='layers'"):
        training.train("preact-20", output=str(tmp_path / "x"), data_dir=cifar10_data_dir,
                       stages="layers", recompute=True)
    assert not (tmp_path / "x").exists()


def test_auto_stages_scan_full_preact_nets_and_keep_a_resumed_runs_form(tmp_path):
    from keras_preact import resolve
    from keras_preact.training.resume import resolve_stages

    out = str(tmp_path)
    assert resolve_stages("auto", resolve("preact-1001"), out) == "scan"
    assert resolve_stages("auto", resolve("resnet-1001"), out) == "layers"
    assert resolve_stages("auto", resolve("resnet-164-relu-only-preact"), out) == "layers"
    (tmp_path / "config.json").write_text(json.dumps({"model": "preact-1001", "steps": 64000,
                                                      "stages": "layers"}))
    assert resolve_stages("auto", resolve("preact-1001"), out) == "layers"  # resumes as run
    with pytest.raises(ValueError, match=r"Unknown stages 'loop'. Valid: \['auto', 'layers'"):
        resolve_stages("loop", resolve("preact-20"), out)
