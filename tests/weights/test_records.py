"""Published weights: records, hash checks, shipped files and downloads (file:// URLs here),
and the three ways to load them (`build`, the constructors, either form)."""

import dataclasses
import os
import re

import numpy as np
import pytest

import keras_preact
from keras_preact import applications, cli
from keras_preact.arch import scan
from keras_preact.weights import records


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
                  sha256=records.sha256_of(path), test_accuracy=0.9123,
                  compare_with="resnet-20", command="keras-preact train preact-20 ...",
                  iterations=64000, precision="float32", wall_time_h=4.0, machine="2 vCPU",
                  keras_preact_version="0.1.0", url=f"file://{path}")
    return records.WeightsRecord(**{**fields, **changes})


@pytest.fixture
def published(monkeypatch, tmp_path, weights_h5):
    """Registers a test record downloading from a file:// URL into a private Keras cache."""
    monkeypatch.setattr(records, "_RECORDS", {})
    monkeypatch.setenv("KERAS_HOME", str(tmp_path / "keras_home"))
    records.register(record_for(weights_h5[0]))
    return tmp_path / "keras_home" / records.CACHE_SUBDIR


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
    bad = dataclasses.replace(records.released("preact-20")["test"], sha256="0" * 64)
    monkeypatch.setitem(records._RECORDS, ("preact-20", "test"), bad)
    with pytest.raises(ValueError, match=r"does not have the published SHA-256 0{64} of weights "
                                         r"'test' of 'preact-20'; nothing was kept"):
        keras_preact.build("preact-20", weights="test")
    assert os.listdir(published) == []


def test_a_damaged_shipped_file_is_refused(monkeypatch, tmp_path, weights_h5):
    path, _ = weights_h5
    monkeypatch.setattr(records, "_RECORDS", {})
    monkeypatch.setattr(records, "PACKAGE_DIR", str(tmp_path))
    shipped = tmp_path / os.path.basename(path)
    shipped.write_bytes(open(path, "rb").read())
    records.register(record_for(path, url=None))
    assert records.weights_file("preact-20", "test") == str(shipped)
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
    header, _, *out = capsys.readouterr().out.splitlines()
    assert header.split()[:4] == ["name", "weights", "test", "accuracy"]
    assert out[0].split() == ["preact-20", "test", "91.23", "%", "(8.77", "%)", "resnet-20:",
                              "8.75", "(He", "et", "al.", "2015)", "64000", "float32",
                              out[0].split()[-1]]
    assert out[0].endswith("preact-20-test.weights.h5")
    assert cli.main(["list", "resnet-*", "--weights"]) == 2
    assert capsys.readouterr().err == (
        "keras-preact list: error: No published weights for models matching 'resnet-*'. "
        "Published: preact-20 (test).\n")


def test_a_tag_loads_only_into_the_network_it_was_trained_as(published):
    """Another head size or depth was a page of Keras' variable dump; now one line, before
    any download. The head and the image size stay free, as in Keras Applications."""
    with pytest.raises(ValueError) as error:
        applications.PreActResNet20(weights="test", classes=100)
    assert str(error.value) == (
        "Weights 'test' of 'preact-20' were trained with classes=10; only include_top, pooling, "
        "classifier_activation, include_preprocessing and the image size may differ (classes "
        "too with "
        "include_top=False). Received: classes=100")
    with pytest.raises(ValueError, match=r"trained with units=\(3, 3, 3\), unit='full-preact'; "
                                         r".* Received: units=\(1, 1, 1\), unit='original'$"):
        keras_preact.build("preact-20", weights="test", depth=8, unit="original")
    assert not published.exists()  # refused before downloading anything
    backbone = applications.PreActResNet20(weights="test", include_top=False, classes=100,
                                           pooling="avg", input_shape=(40, 40, 3))
    assert backbone.output.shape == (None, 64)


def test_a_weights_file_of_another_network_is_a_one_line_error(weights_h5, tmp_path):
    path, _ = weights_h5
    with pytest.raises(ValueError) as error:
        keras_preact.build("preact-20", weights=path, depth=8)
    message = str(error.value)
    assert "\n" not in message and len(message) < 600, message
    assert message.startswith(f"The weights in {path!r} do not fit 'preact-20' as built "
                              "(build the network the file was saved from: same name and "
                              "overrides). Keras: ")
    assert "variable.shape=(3, 3, 16, 32), Received: value.shape=(3, 3, 16, 16)" in message
    # Keras' "A total of 1 objects could not be loaded. Example error message for object
    # <Conv2D name=..., built=True>:", as a person would say it.
    assert re.search(r"Keras: \d+ layers could not be loaded; the first is 'stage\w+': The "
                     r"shape of the target variable", message), message
    resnet = os.path.join(records.PACKAGE_DIR,
                          "resnet-20-cifar10.weights.h5")
    with pytest.raises(ValueError, match=r"Keras: 1 layer could not be loaded; it is "
                                         r"'stage3_unit001_bn2': The shape of the target"):
        keras_preact.build("preact-20", weights=resnet)
    backbone = str(tmp_path / "backbone.weights.h5")
    keras_preact.build("preact-20", depth=8, include_top=False).save_weights(backbone)
    with pytest.raises(ValueError, match=r"do not fit .* Layer 'predictions' expected 2 "
                                         r"variables, but received 0 variables during loading. "
                                         r"Expected: \['kernel', 'bias'\]$"):
        keras_preact.build("preact-20", depth=8, weights=backbone)
    junk = tmp_path / "junk.weights.h5"
    junk.write_text("not HDF5")
    with pytest.raises(OSError, match=f"^Could not read {str(junk)!r} as a .weights.h5 file \\("):
        keras_preact.build("preact-20", weights=str(junk), depth=8)
