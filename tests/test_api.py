"""`keras_preact.feature_extractor`: per-stage feature maps for detection and segmentation."""

import keras
import numpy as np
import pytest

import keras_preact
from keras_preact.arch import scan


def shapes(model: keras.Model) -> dict:
    return {key: tuple(t.shape) for key, t in model.output.items()}


def test_imagenet_stages_at_224():
    features = keras_preact.feature_extractor("preact-50-imagenet")
    assert shapes(features) == {
        "stage1": (None, 56, 56, 256),
        "stage2": (None, 28, 28, 512),
        "stage3": (None, 14, 14, 1024),
        "stage4": (None, 7, 7, 2048),
    }
    # The last stage is taken after the final BN-ReLU of a pre-activation net, the others
    # at their last addition (what the next stage receives); no head is built.
    producers = {key: t._keras_history.operation.name for key, t in features.output.items()}
    assert producers == {"stage1": "stage1_unit003_add", "stage2": "stage2_unit004_add",
                         "stage3": "stage3_unit006_add", "stage4": "final_relu"}
    assert "avg_pool" not in {layer.name for layer in features.layers}


@pytest.mark.parametrize("name, last", [("resnet-110", "stage3_unit003_out_relu"),
                                        ("preact-164", "final_relu"),
                                        ("resnet-110-relu-only-preact", "final_relu")])
def test_cifar_stages(name, last):
    features = keras_preact.feature_extractor(name, units=(1, 1, 3), input_shape=(None, None, 3))
    spec = keras_preact.get_spec(name)
    widths = [w * (4 if spec.block == "bottleneck" else 1) for w in (16, 32, 64)]
    assert shapes(features) == {f"stage{s}": (None, None, None, w)
                                for s, w in enumerate(widths, start=1)}
    assert features.output["stage3"]._keras_history.operation.name == last
    out = features(np.zeros((2, 32, 32, 3), "float32"))
    assert {key: tuple(v.shape) for key, v in out.items()} == {
        "stage1": (2, 32, 32, widths[0]), "stage2": (2, 16, 16, widths[1]),
        "stage3": (2, 8, 8, widths[2])}


def test_a_trained_model_shares_its_weights():
    model = keras_preact.build("preact-20", depth=8, classes=7)
    features = keras_preact.feature_extractor(model)
    assert features.get_layer("stage1_unit001_conv1") is model.get_layer("stage1_unit001_conv1")
    assert {id(w) for w in features.weights} <= {id(w) for w in model.weights}
    x = np.random.default_rng(0).normal(size=(2, 32, 32, 3)).astype("float32")
    before = keras.ops.convert_to_numpy(features(x)["stage3"])
    # Training the model changes the features: same variables, not copies.
    gamma = model.get_layer("final_bn").gamma
    gamma.assign(2.0 * keras.ops.convert_to_numpy(gamma))
    after = keras.ops.convert_to_numpy(features(x)["stage3"])
    probe = keras.Model(model.input, model.get_layer("final_relu").output)
    np.testing.assert_array_equal(after, keras.ops.convert_to_numpy(probe(x)))
    assert not np.array_equal(before, after)


@pytest.mark.skipif(keras.backend.backend() != "tensorflow", reason="scan needs TensorFlow")
def test_scanned_stages_work_as_they_are():
    """A stage's scanned loop (`stage{s}_scan`, units 2..n) ends the stage: its output is
    the stage's, so a scanned model needs no conversion (and keeps its fast graph)."""
    fast = keras_preact.build("preact-164", stages="scan", units=(2, 3, 2))
    for w in fast.weights:  # not the initial values, moving statistics included
        w.assign(np.random.default_rng(len(w.path)).uniform(0.5, 1.5, w.shape))
    features = keras_preact.feature_extractor(fast)
    assert scan.is_scanned(features)
    assert features.output["stage2"]._keras_history.operation.name == "stage2_scan"
    plain = keras_preact.feature_extractor(scan.to_layered(fast))
    x = np.random.default_rng(1).normal(size=(2, 32, 32, 3)).astype("float32")
    got, expected = features(x), plain(x)
    assert sorted(got) == ["stage1", "stage2", "stage3"]
    for key in got:
        np.testing.assert_allclose(keras.ops.convert_to_numpy(got[key]),
                                   keras.ops.convert_to_numpy(expected[key]), rtol=1e-4, atol=1e-4)


def test_saves_and_loads(tmp_path):
    features = keras_preact.feature_extractor("resnet-20", depth=8)
    path = tmp_path / "features.keras"
    features.save(path)
    loaded = keras_preact.load_model(str(path))
    x = np.random.default_rng(2).normal(size=(1, 32, 32, 3)).astype("float32")
    for key, value in features(x).items():
        np.testing.assert_array_equal(keras.ops.convert_to_numpy(value),
                                      keras.ops.convert_to_numpy(loaded(x)[key]))


def test_bad_input_is_a_clear_error():
    with pytest.raises(ValueError, match="Did you mean"):
        keras_preact.feature_extractor("preact-2O")
    model = keras_preact.build("preact-20", depth=8)
    with pytest.raises(ValueError, match=r"Overrides apply to a model name. Received a model "
                                         r"\('preact-20'\) and overrides \['depth'\]"):
        keras_preact.feature_extractor(model, depth=14)
    plain = keras.Sequential([keras.Input((8, 8, 3)), keras.layers.Conv2D(4, 3, name="conv")])
    with pytest.raises(ValueError, match="no stage1_\\* layers"):
        keras_preact.feature_extractor(plain)
