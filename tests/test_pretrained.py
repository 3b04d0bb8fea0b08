"""Published weights: records, hash checks, shipped files and downloads (file:// URLs here),
and the three ways to load them (`build`, the constructors, either form)."""

import dataclasses
import os

import numpy as np
import pytest

import keras_preact
from keras_preact import applications, cli, pretrained, scan


@pytest.fixture(scope="module")
def weights_h5(tmp_path_factory):
    """A preact-20 weights file (plain layer form) and the model it came from."""
    model = keras_preact.build("preact-20")
    for v in model.weights:  # distinct from a fresh init
        v.assign(np.random.default_rng(len(v.path)).normal(size=v.shape).astype("float32") * 0.1)
    path = tmp_path_factory.mktemp("w") / "preact-20-test.weights.h5"
    model.save_weights(path)
    return str(path), model


def record_for(path, **changes):
    fields = dict(model="preact-20", tag="test", dataset="cifar10", file=os.path.basename(path),
                  sha256=pretrained.sha256_of(path), val_accuracy=0.9123,
                  val_split="train[45000:]", command="keras-preact train preact-20 ...",
                  iterations=64000, precision="float32", wall_time_h=4.0, machine="2 vCPU",
                  keras_preact_version="0.1.0", url=f"file://{path}")
    return pretrained.WeightsRecord(**{**fields, **changes})


@pytest.fixture
def published(monkeypatch, tmp_path, weights_h5):
    """Registers a test record downloading from a file:// URL into a private Keras cache."""
    monkeypatch.setattr(pretrained, "_RECORDS", {})
    monkeypatch.setenv("KERAS_HOME", str(tmp_path / "keras_home"))
    pretrained.register(record_for(weights_h5[0]))
    return tmp_path / "keras_home" / pretrained.CACHE_SUBDIR


def _images():
    return np.random.default_rng(0).normal(size=(2, 32, 32, 3)).astype("float32")


def test_a_tag_downloads_once_verifies_and_loads_everywhere(published, weights_h5, tmp_path):
    _, source = weights_h5
    expected = np.asarray(source(_images()))
    built = keras_preact.build("preact-20", weights="test")
    assert os.listdir(published) == ["preact-20-test.weights.h5"]
    np.testing.assert_allclose(np.asarray(built(_images())), expected, atol=1e-6)
    constructed = applications.PreActResNet20(weights="test")
    np.testing.assert_allclose(np.asarray(constructed(_images())), expected, atol=1e-6)
    scanned = keras_preact.build("preact-20", weights="test", stages="scan")
    assert scan.is_scanned(scanned)
    np.testing.assert_allclose(np.asarray(scanned(_images())), expected, atol=1e-5)


def test_a_hash_mismatch_is_a_clear_error_and_nothing_stays_cached(
        monkeypatch, published, weights_h5):
    bad = dataclasses.replace(pretrained.released("preact-20")["test"], sha256="0" * 64)
    monkeypatch.setitem(pretrained._RECORDS, ("preact-20", "test"), bad)
    with pytest.raises(ValueError, match=r"does not have the published SHA-256 0{64} of weights "
                                         r"'test' of 'preact-20'; nothing was kept"):
        keras_preact.build("preact-20", weights="test")
    assert os.listdir(published) == []


def test_a_damaged_shipped_file_is_refused(monkeypatch, tmp_path, weights_h5):
    path, _ = weights_h5
    monkeypatch.setattr(pretrained, "_RECORDS", {})
    monkeypatch.setattr(pretrained, "PACKAGE_DIR", str(tmp_path))
    shipped = tmp_path / os.path.basename(path)
    shipped.write_bytes(open(path, "rb").read())
    pretrained.register(record_for(path, url=None))
    assert pretrained.weights_file("preact-20", "test") == str(shipped)
    with open(shipped, "r+b") as f:
        f.truncate(1000)
    with pytest.raises(ValueError, match=f"{shipped} has SHA-256 [0-9a-f]{{64}}, not the "
                                         "published .*the file is damaged"):
        applications.PreActResNet20(weights="test")


def test_unknown_tags_name_the_published_ones(published):
    with pytest.raises(ValueError, match=r"Unknown weights 'imagenet' for 'preact-20'.*"
                                         r"published tag: \['test'\]"):
        keras_preact.build("preact-20", weights="imagenet")
    with pytest.raises(ValueError, match="none published yet"):
        keras_preact.build("preact-56", weights="cifar10")


def test_list_weights_shows_each_tag_with_its_accuracy(published, capsys):
    assert cli.main(["list", "--weights"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].split() == ["preact-20", "test", "91.23", "%", "train[45000:]", "64000",
                              "float32", out[0].split()[-1]]
    assert out[0].endswith("preact-20-test.weights.h5")
    assert cli.main(["list", "resnet-*", "--weights"]) == 2
    assert "No published weights" in capsys.readouterr().err
