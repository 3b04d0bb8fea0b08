"""The command line as a new user meets it: fast answers, a quiet console, one-line errors."""

import os
import subprocess
import sys

import pytest

import keras_preact
from keras_preact import cli


def _no_network(monkeypatch):
    """No way out, with or without a network here: every request goes to a proxy that
    refuses (the discard port of this machine)."""
    for var in ("HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy"):
        monkeypatch.setenv(var, "http://127.0.0.1:9")
    for var in ("NO_PROXY", "no_proxy"):
        monkeypatch.delenv(var, raising=False)


@pytest.fixture
def tiny_model_file(tmp_path):
    path = tmp_path / "tiny.keras"
    keras_preact.build("preact-20", depth=8).save(path)
    return str(path)


@pytest.mark.parametrize("command", ["train", "evaluate"])
def test_a_failed_download_is_one_line_that_says_what_to_do(
        command, monkeypatch, tmp_path, capsys, tiny_model_file):
    _no_network(monkeypatch)
    empty = tmp_path / "tfds"
    empty.mkdir()
    target = ["preact-20", "--output", str(tmp_path / "run")] if command == "train" else [
        tiny_model_file]
    assert cli.main([command, *target, "--data-dir", str(empty)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1, err  # no absl warning, no urllib3 retries: the host probe
    assert err.startswith(f"keras-preact {command}: error: Could not download dataset 'cifar10' "
                          "(www.cs.toronto.edu unreachable: ")
    assert "pass --data-dir with a prepared copy" in err and "tfds build cifar10" in err
    assert not (tmp_path / "run").exists()
    assert list(empty.iterdir()) == []  # no empty cifar10/VERSION dir left behind


@pytest.mark.parametrize("backend", ["jax", "torch"])  # installed or not: never imported
def test_another_keras_backend_in_the_shell_runs_on_tensorflow(backend, cifar10_data_dir):
    """tf.data under Keras' JAX backend raised a raw NotImplementedError; now one warning."""
    env = {k: v for k, v in os.environ.items() if k != "TF_CPP_MIN_LOG_LEVEL"}  # as a user's
    done = subprocess.run(
        [sys.executable, "-m", "keras_preact.cli", "evaluate", "preact-20", "--weights",
         "cifar10", "--split", "test[:200]", "--data-dir", cifar10_data_dir],
        capture_output=True, text=True, timeout=600, env={**env, "KERAS_BACKEND": backend})
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stderr == (f"keras-preact evaluate: warning: KERAS_BACKEND={backend} ignored: "
                           f"keras-preact evaluate runs on TensorFlow (keras_preact.build runs "
                           f"on {backend} in Python).\n")
    assert done.stdout.startswith("cifar10 test[:200]: error ")
    assert float(done.stdout.split("accuracy ")[1].split(",")[0]) > 0.85  # the published net


def test_evaluate_defaults_to_the_labelled_held_out_split(monkeypatch, tiny_model_file):
    """imagenet2012's `test` split has no labels: its held-out split is `validation`."""
    from keras_preact.data import sources
    from keras_preact.training import evaluation

    asked = []

    def check_split(source, split, data_dir, download=False):
        asked.append((source.name, split))
        raise FileNotFoundError("stop here")

    monkeypatch.setattr(sources, "check_split", check_split)
    imagenet = keras_preact.build("preact-18-imagenet", units=(1, 1, 1, 1),
                                  input_shape=(64, 64, 3))
    for dataset, model in (("cifar10", tiny_model_file), ("imagenet2012", imagenet)):
        with pytest.raises(FileNotFoundError, match="stop here"):
            evaluation.evaluate(model, dataset=dataset)
    assert asked == [("cifar10", "test"), ("imagenet2012", "validation")]


def test_evaluate_refuses_a_model_that_does_not_fit_the_dataset_before_the_data(
        monkeypatch, tiny_model_file):
    """A 10-class model on cifar100 used to download CIFAR-100 (minutes of retries offline)
    before it was refused."""
    from keras_preact.data import sources
    from keras_preact.training import evaluation

    def check_split(*args, **kwargs):
        raise AssertionError("the data was touched")

    monkeypatch.setattr(sources, "check_split", check_split)
    with pytest.raises(ValueError, match=r"^Dataset 'cifar100' needs a cifar model with 100 "
                                         r"outputs. Received: a cifar model with 10 outputs.$"):
        evaluation.evaluate(tiny_model_file, dataset="cifar100")


FAST = """
import sys, time
started = time.perf_counter()
from keras_preact import cli
for argv in {argvs!r}:
    try:
        cli.main(argv)
    except SystemExit:  # --help
        pass
heavy = sorted(m for m in ("keras", "tensorflow", "tensorflow_datasets") if m in sys.modules)
print("HEAVY", heavy, round(time.perf_counter() - started, 2), file=sys.stderr)
"""


def test_help_and_list_never_import_tensorflow():
    """What makes `--help` and `list` answer at once (measured in benchmarks/README.md)."""
    argvs = [["--help"], ["list"], ["list", "preact-1??"], ["list", "--weights"],
             ["list", "--params"],
             *[[c, "--help"] for c in cli.COMMANDS]]
    done = subprocess.run([sys.executable, "-c", FAST.format(argvs=argvs)],
                          capture_output=True, text=True, timeout=120)
    assert "HEAVY [] " in done.stderr, done.stderr[-2000:]
    assert "preact-110" in done.stdout and "usage: keras-preact train" in done.stdout


def test_the_console_shows_only_our_lines(cifar10_data_dir, tmp_path):
    """No TensorFlow start-up lines, no third-party warnings; --verbose brings them back."""
    argv = [sys.executable, "-m", "keras_preact.cli", "train", "preact-20", "--override",
            "depth=8", "--steps", "2", "--batch-size", "16", "--val-examples", "16",
            "--data-dir", cifar10_data_dir]
    env = {k: v for k, v in os.environ.items() if k != "TF_CPP_MIN_LOG_LEVEL"}
    quiet = subprocess.run([*argv, "--output", str(tmp_path / "q")], capture_output=True,
                           text=True, timeout=600, env=env)
    assert quiet.returncode == 0 and quiet.stderr == "", quiet.stderr[-3000:]
    assert quiet.stdout.splitlines()[0] == ("keras-preact: cifar10: 10 classes, training on "
                                            "train[:-16] (49984 images), validating on "
                                            "train[-16:]")
    assert quiet.stdout.splitlines()[1].startswith("epoch 1/1 - step 2/2 - ")
    verbose = subprocess.run([*argv, "--output", str(tmp_path / "v"), "--verbose"],
                             capture_output=True, text=True, timeout=600, env=env)
    assert verbose.returncode == 0 and "I0000" in verbose.stderr


def test_evaluate_refuses_an_empty_split(tiny_model_file, cifar10_data_dir, capsys):
    """`--split ''` was read as no split, and scored the test split."""
    assert cli.main(["evaluate", tiny_model_file, "--split", "", "--data-dir",
                     cifar10_data_dir]) == 2
    err = capsys.readouterr().err
    assert err.startswith("keras-preact evaluate: error: Dataset 'cifar10' has no split ''")
