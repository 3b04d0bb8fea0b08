"""Keras-Applications-style constructors, weights loading, pre/post-processing, `list` CLI."""

import inspect

import numpy as np
import pytest

import keras
import keras_preact
from keras_preact import applications, cli, preprocessing


def test_every_constructor_builds_its_registered_network():
    assert len(applications.CONSTRUCTORS) == 27
    for public, constructor in applications.CONSTRUCTORS.items():
        assert getattr(applications, public) is constructor
        params = list(inspect.signature(constructor).parameters)
        assert params == ["include_top", "weights", "input_tensor", "input_shape", "pooling",
                          "classes", "classifier_activation", "name"]
    assert inspect.signature(applications.PreActResNet1001).parameters["classes"].default == 10
    assert inspect.signature(applications.PreActResNet200).parameters["classes"].default == 1000
    assert "preact-1001" in applications.PreActResNet1001.__doc__


def test_backbone_and_input_tensor():
    inputs = keras.Input((48, 48, 3))
    model = applications.PreActResNet20(include_top=False, pooling="max", input_tensor=inputs)
    assert model.input is inputs
    assert model.output.shape == (None, 64)
    assert model.get_layer("max_pool") is not None
    features = applications.ResNet18(include_top=False, input_shape=(64, 64, 3))
    assert features.output.shape == (None, 2, 2, 512)


def test_weights_file_round_trip(tmp_path):
    model = applications.PreActResNet20(classes=7, name="mine")
    path = tmp_path / "mine.weights.h5"
    model.save_weights(path)
    again = applications.PreActResNet20(classes=7, weights=str(path))
    x = np.random.default_rng(0).normal(size=(2, 32, 32, 3)).astype("float32")
    np.testing.assert_array_equal(
        keras.ops.convert_to_numpy(model(x)), keras.ops.convert_to_numpy(again(x))
    )
    assert model.name == "mine" and again.name == "preact-20"


@pytest.mark.skipif(keras.backend.backend() != "tensorflow", reason="scan needs TensorFlow")
def test_weights_saved_from_the_scanned_form_load_into_the_constructor(tmp_path):
    # What `keras-preact train` writes for full pre-activation nets is the scanned form.
    import keras_preact

    trained = keras_preact.build("preact-20", stages="scan", classes=7)
    for w in trained.weights:  # not the initial values, moving statistics included
        w.assign(np.random.default_rng(len(w.path)).uniform(0.5, 1.5, w.shape))
    path = tmp_path / "scanned.weights.h5"
    trained.save_weights(path)
    model = applications.PreActResNet20(classes=7, weights=str(path))
    assert not keras_preact.scan.is_scanned(model)
    x = np.random.default_rng(0).normal(size=(2, 32, 32, 3)).astype("float32")
    np.testing.assert_allclose(keras.ops.convert_to_numpy(model(x)),
                               keras.ops.convert_to_numpy(trained(x)), rtol=1e-5, atol=1e-6)


def test_bad_weights_are_clear_errors(tmp_path):
    with pytest.raises(ValueError, match="Unknown weights 'cifar10' for 'preact-164'.*none published yet"):
        applications.PreActResNet164(weights="cifar10")
    with pytest.raises(FileNotFoundError, match="missing.weights.h5"):
        applications.PreActResNet164(weights=str(tmp_path / "missing.weights.h5"))


def test_preprocess_input_normalizes_per_channel():
    x = np.tile(np.array(preprocessing.CIFAR_MEAN, "float32"), (1, 2, 2, 1))
    np.testing.assert_allclose(keras.ops.convert_to_numpy(applications.preprocess_input(x)), 0.0,
                               atol=1e-6)
    y = applications.preprocess_input(np.full((1, 1, 1, 3), 255, "uint8"), family="imagenet")
    expected = (255 - np.array(preprocessing.IMAGENET_MEAN)) / np.array(preprocessing.IMAGENET_STD)
    np.testing.assert_allclose(keras.ops.convert_to_numpy(y)[0, 0, 0], expected, rtol=1e-6)
    with pytest.raises(ValueError, match="Valid: \\['cifar', 'imagenet'\\]"):
        applications.preprocess_input(x, family="svhn")


def test_decode_predictions():
    preds = np.zeros((2, 100), "float32")
    preds[0, [3, 7]] = [0.6, 0.4]
    preds[1, 99] = 1.0
    decoded = applications.decode_predictions(preds, top=2)
    assert decoded[0] == [(3, "bear", pytest.approx(0.6)), (7, "beetle", pytest.approx(0.4))]
    assert decoded[1][0] == (99, "worm", 1.0)
    imagenet = applications.decode_predictions(np.eye(1000)[[1]], top=1)
    assert imagenet == [[(1, "goldfish, Carassius auratus", 1.0)]]
    with pytest.raises(ValueError, match="Received shape \\(10,\\)"):
        applications.decode_predictions(np.zeros(10))


def test_family_detection():
    assert preprocessing.family_of(keras_preact.build("preact-20", depth=8)) == "cifar"
    small_imagenet = keras_preact.build("preact-18-imagenet", units=(1, 1, 1, 1))
    assert preprocessing.family_of(small_imagenet) == "imagenet"


def test_list_command(capsys):
    assert cli.main(["list", "preact-1??"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [line.split()[0] for line in lines] == ["preact-110", "preact-164"]
    assert lines[1].split()[:5] == ["preact-164", "cifar", "164", "full-preact", "identity"]
    assert "5.46" in lines[1]
    assert cli.main(["list", "resnet-20", "--params", "--markdown"]) == 0
    table = capsys.readouterr().out.splitlines()
    assert table[0].startswith("| name | family | depth")
    assert table[2] == "| resnet-20 | cifar | 20 | original | identity | 0.27M | 8.75 (He et al. 2015) |"
    assert cli.main(["list", "nope-*"]) == 2
    assert "No model matches 'nope-*'" in capsys.readouterr().err
