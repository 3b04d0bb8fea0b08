"""Keras-Applications-style constructors, weights loading, pre/post-processing, `list` CLI."""

import inspect
import re
import sys
import textwrap
import warnings

import keras
import numpy as np
import pytest

import keras_preact
from keras_preact import api, applications, cli, labels, plotting, preprocessing
from keras_preact.arch import network, specs
from keras_preact.paper import PAPER_RESULTS

# The channels of the last feature map (Keras' `last_dim`): 64 / 256 for CIFAR basic /
# bottleneck nets, 512 / 2048 on ImageNet.
LAST_DIM = {
    **dict.fromkeys(["ResNet20", "ResNet32", "ResNet44", "ResNet56", "ResNet110", "ResNet1202",
                     "PreActResNet20", "PreActResNet32", "PreActResNet44", "PreActResNet56",
                     "PreActResNet110"], 64),
    **dict.fromkeys(["ResNet164", "ResNet1001", "PreActResNet164", "PreActResNet1001"], 256),
    **dict.fromkeys(["ResNet18", "ResNet34", "PreActResNet18", "PreActResNet34"], 512),
    **dict.fromkeys(["ResNet50", "ResNet101", "ResNet152", "ResNet200", "PreActResNet50",
                     "PreActResNet101", "PreActResNet152", "PreActResNet200"], 2048),
}
# Keras' own applications test (keras/src/applications/applications_test.py) on real models,
# for a representative subset: each family with both units (original, full pre-activation),
# basic and bottleneck blocks. Building all 27 takes minutes on 2 cores (the 1000-layer nets
# most of it); every constructor is checked on the spec it builds instead (below).
REPRESENTATIVE = ["ResNet20", "PreActResNet20", "ResNet18", "PreActResNet50"]


def output_side(model: keras.Model, side: int) -> int:
    """Same-padded stride-2 layers: CIFAR nets downsample twice, ImageNet nets 5 times."""
    downsamplings = {"cifar": 2, "imagenet": 5}[network.family_of(model)]
    return -(-side // 2**downsamplings)


def test_every_constructor_builds_its_registered_network():
    assert len(applications.CONSTRUCTORS) == 27
    assert set(LAST_DIM) == set(applications.CONSTRUCTORS)
    for public, constructor in applications.CONSTRUCTORS.items():
        assert getattr(applications, public) is constructor
        params = list(inspect.signature(constructor).parameters)
        assert params == ["include_top", "weights", "input_tensor", "input_shape", "pooling",
                          "classes", "classifier_activation", "name", "include_preprocessing"]
    assert inspect.signature(applications.PreActResNet1001).parameters["classes"].default == 10
    assert inspect.signature(applications.PreActResNet200).parameters["classes"].default == 1000
    assert "preact-1001" in applications.PreActResNet1001.__doc__


def documented_network(function) -> str:
    """The registered name a constructor's docstring says it builds."""
    return re.search(r"Builds registered network `([^`]+)`", function.__doc__).group(1)


@pytest.mark.parametrize("public", [*applications.CONSTRUCTORS, "application"])
def test_the_docstring_documents_every_argument(public):
    function = getattr(applications, public)
    doc = inspect.getdoc(function)
    args = doc[doc.index("\nArgs:\n"):doc.index("\nReturns:\n")]
    documented = re.findall(r"^    (\w+): ", args, flags=re.M)
    assert documented == list(inspect.signature(function).parameters)
    assert ".weights.h5" in args and "keras-preact list --weights" in args
    if public == "application":
        return
    name = documented_network(function)
    spec = keras_preact.get_spec(name)
    assert applications.CONSTRUCTORS[public] is function
    assert f"Paper error (%): {PAPER_RESULTS.get(name, 'not reported')}." in doc
    assert f"Default: {spec.classes}." in args and f"Default: {name!r}." in args
    assert f"print(features.output.shape)  # (None, {LAST_DIM[public]})" in doc


def test_the_docstring_example_runs_and_prints_what_it_says(capsys):
    doc = inspect.getdoc(applications.ResNet20)
    example = doc[doc.index("Example"):doc.index("\nArgs:")].splitlines()[2:]
    code = textwrap.dedent("\n".join(example))
    exec(code, {})
    said = [line.split("# ")[1] for line in code.splitlines() if line.startswith("print(")]
    assert capsys.readouterr().out.splitlines() == said == ["(None, 100)", "(None, 64)"]


def test_backbone_and_input_tensor():
    inputs = keras.Input((48, 48, 3))
    model = applications.PreActResNet20(include_top=False, pooling="max", input_tensor=inputs)
    assert model.input is inputs
    assert model.output.shape == (None, 64)
    assert model.layers[-1].name == "max_pool"
    features = applications.ResNet18(include_top=False, input_shape=(64, 64, 3))
    assert features.output.shape == (None, 2, 2, 512)


def test_an_input_tensor_that_is_not_a_keras_tensor_is_a_one_line_error():
    """An array used to reach keras.Model, whose error printed the whole array."""
    with pytest.raises(ValueError) as error:
        applications.PreActResNet20(input_tensor=np.zeros((1, 32, 32, 3), "float32"))
    assert str(error.value) == ("`input_tensor` must be a Keras tensor, e.g. "
                                "`keras.Input((32, 32, 3))`. Received: a numpy.ndarray of "
                                "shape (1, 32, 32, 3)")


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
    assert not keras_preact.arch.scan.is_scanned(model)
    x = np.random.default_rng(0).normal(size=(2, 32, 32, 3)).astype("float32")
    np.testing.assert_allclose(keras.ops.convert_to_numpy(model(x)),
                               keras.ops.convert_to_numpy(trained(x)), rtol=1e-5, atol=1e-6)


def test_bad_weights_are_clear_errors(tmp_path):
    with pytest.raises(ValueError,
                       match="Unknown weights 'cifar10' for 'preact-164'.*none published yet"):
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
    with pytest.raises(ValueError, match="Valid: \\['cifar', 'imagenet', 'inception'\\]"):
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
    assert network.family_of(keras_preact.build("preact-20", depth=8)) == "cifar"
    small_imagenet = keras_preact.build("preact-18-imagenet", units=(1, 1, 1, 1))
    assert network.family_of(small_imagenet) == "imagenet"
    other = keras.Sequential([keras.Input((32, 32, 3)), keras.layers.Flatten()], name="other")
    with pytest.raises(ValueError, match=r"^Cannot tell which preprocessing model 'other' "
                                         r"takes: .* Received: Sequential$"):
        network.family_of(other)  # never a CIFAR guess


def test_list_command(capsys):
    assert cli.main(["list", "preact-1??"]) == 0
    header, rule, *lines = capsys.readouterr().out.splitlines()
    assert header.split() == ["name", "family", "depth", "unit", "shortcut", "paper", "error",
                              "(%)"]
    assert set(rule.replace("  ", "")) == {"-"}  # one dashed run under each column name
    assert [line.split()[0] for line in lines] == ["preact-110", "preact-164"]
    assert lines[1].split()[:5] == ["preact-164", "cifar", "164", "full-preact", "identity"]
    assert "5.46" in lines[1]
    assert lines[1].index("164   ") == header.index("depth")  # columns line up under the names
    assert cli.main(["list", "resnet-20", "--params", "--markdown"]) == 0
    table = capsys.readouterr().out.splitlines()
    assert table[0].startswith("| name | family | depth")
    assert table[2] == (
        "| resnet-20 | cifar | 20 | original | identity | 0.27M | 8.75 (He et al. 2015) |"
    )
    assert cli.main(["list", "nope-*"]) == 2
    assert "No model matches 'nope-*'" in capsys.readouterr().err


def test_preprocess_input_warns_of_images_scaled_to_0_1():
    images = np.random.default_rng(0).random((2, 8, 8, 3), dtype="float32")
    with pytest.warns(UserWarning, match=r"takes pixels in \[0, 255\] and received values in "
                                         r"\[0, 1\].*multiply by 255 first"):
        applications.preprocess_input(images)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # 0-255 images, and black-and-white masks, pass quietly
        applications.preprocess_input(images * 255)
        applications.preprocess_input(np.round(images))


# One network of each statistics: CIFAR's, fb.resnet.torch's ImageNet ones, timm's inception.
STATS_NETS = {"preact-20": "cifar", "resnet-18-imagenet": "imagenet",
              "preact-18-imagenet-timm": "inception"}


@pytest.mark.parametrize("name", STATS_NETS)
def test_include_preprocessing_takes_raw_pixels_and_computes_the_same_numbers(name, tmp_path):
    shape = (48, 48, 3)
    plain = keras_preact.build(name, input_shape=shape)
    raw = keras_preact.build(name, input_shape=shape, include_preprocessing=True)
    raw.set_weights(plain.get_weights())  # the layer adds no weights
    assert raw.count_params() == plain.count_params()
    layer = raw.get_layer("preprocessing")
    assert isinstance(layer, keras.layers.Rescaling) and not layer.weights
    images = np.random.default_rng(1).integers(0, 256, (2, *shape), dtype="uint8")
    expected = plain(applications.preprocess_input(images, STATS_NETS[name]), training=False)
    np.testing.assert_array_equal(raw(images, training=False), expected)
    assert api.preprocessing_of(raw).in_model and not api.preprocessing_of(plain).in_model
    path = str(tmp_path / "raw.keras")
    raw.save(path)
    again = keras_preact.load_model(path)
    assert keras_preact.spec_of(again).include_preprocessing
    np.testing.assert_array_equal(again(images, training=False), expected)


def test_integer_images_into_a_network_taking_normalized_ones_are_a_one_line_error():
    model = keras_preact.build("preact-20", depth=8)
    images = np.zeros((2, 32, 32, 3), "uint8")
    message = (r"'preact-20' takes images normalized by `keras_preact.applications."
               r"preprocess_input`.*Received: uint8 images of shape \(2, 32, 32, 3\); pass "
               r"preprocess_input\(images\) or build the model with include_preprocessing=True")
    for call in (model, lambda x: model.predict(x, verbose=0)):
        with pytest.raises(ValueError, match=message):
            call(images)
    assert model(images.astype("float32")).shape == (2, 10)


@pytest.mark.parametrize("kwargs, message", [
    ({"include_preprocessing": "yes"}, "Received: include_preprocessing='yes'"),
    ({"include_preprocessing": True, "input_shape": (32, 32, 1)},
     "`include_preprocessing` normalizes RGB images with per-channel statistics: `input_shape` "
     "must have 3 channels"),
])
def test_bad_include_preprocessing_is_a_clear_error(kwargs, message):
    with pytest.raises(ValueError) as info:
        applications.PreActResNet20(**kwargs)
    assert message in str(info.value)


def test_a_network_file_older_than_include_preprocessing_loads():
    """`.keras` files written before the field existed lack it in their config."""
    config = keras_preact.build("preact-20", depth=8).get_config()
    del config["include_preprocessing"]
    assert not network.spec_in(config).include_preprocessing


@pytest.fixture
def built_specs(monkeypatch):
    """Replaces the builder of the one build path (`api.build_network`): records (spec,
    name, input_tensor) of each constructor call."""
    calls = []

    def record(spec, name="resnet", input_tensor=None, stages="layers", dtype=None):
        calls.append((spec, name, input_tensor))
        return "model"

    monkeypatch.setattr(api, "build_from_spec", record)
    return calls


@pytest.mark.parametrize("public", list(applications.CONSTRUCTORS))
def test_every_constructor_follows_the_applications_contract(public, built_specs):
    constructor = applications.CONSTRUCTORS[public]
    # Any channel count without weights (grayscale, RGBA, multispectral), any size.
    constructor(weights=None, include_top=False, input_shape=(None, None, 1))
    constructor(include_top=False, input_shape=(123, 123, 4), pooling="max")
    tensor = keras.Input((50, 60, 2))
    constructor(include_top=False, input_tensor=tensor, pooling="avg")
    constructor(classes=3, classifier_activation=None, name="mine")
    constructor()
    (gray, name, _), (rgba, _, _), (tensor_spec, _, passed), (small, mine, _), (default, _, _) = (
        built_specs)
    assert gray.input_shape == (None, None, 1) and not gray.include_top and gray.pooling is None
    assert gray.widths[-1] * specs.EXPANSION[gray.block] == LAST_DIM[public]
    assert rgba.input_shape == (123, 123, 4) and rgba.pooling == "max"
    assert tensor_spec.input_shape == (50, 60, 2) and tensor_spec.pooling == "avg"
    assert passed is tensor
    assert (small.classes, small.classifier_activation, mine) == (3, None, "mine")
    assert default.include_top and default.classifier_activation == "softmax"
    assert default.input_shape == ((32, 32, 3) if default.family == "cifar" else (224, 224, 3))
    assert keras_preact.get_spec(name).units == gray.units  # named after its registered net
    # Weights were trained on RGB images: their stem conv takes 3 channels.
    with pytest.raises(ValueError, match=r"3 channels.*Received: input_shape=\(None, None, 1\)"):
        constructor(weights="cifar10", include_top=False, input_shape=(None, None, 1))
    with pytest.raises(ValueError, match="Received: input_shape=\\(32, 32, 3\\) and an "
                                         "input_tensor of shape \\(None, 50, 60, 2\\)"):
        constructor(input_shape=(32, 32, 3), input_tensor=tensor)
    constructor(input_shape=(None, None, 2), input_tensor=tensor)  # None matches any size
    assert len(built_specs) == 6 and built_specs[-1][0].input_shape == (50, 60, 2)


@pytest.mark.parametrize("kwargs, message", [
    ({"classes": True}, "Received: classes=True"),
    ({"include_top": "no"}, "Received: include_top='no'"),
    ({"input_shape": (0, 0, 3)}, "Received: input_shape=(0, 0, 3)"),
    ({"pooling": "mean"}, "Valid poolings: [None, 'avg', 'max']"),
    ({"classifier_activation": "sofmax"}, "Received: classifier_activation='sofmax'"),
])
def test_bad_constructor_arguments_are_clear_errors(kwargs, message, built_specs):
    with pytest.raises(ValueError) as info:
        applications.PreActResNet20(**kwargs)
    assert message in str(info.value)
    assert not built_specs


@pytest.mark.parametrize("public", REPRESENTATIVE)
def test_notop_variable_input_channels(public):
    constructor, last_dim = applications.CONSTRUCTORS[public], LAST_DIM[public]
    model = constructor(weights=None, include_top=False, input_shape=(None, None, 1))
    assert list(model.outputs[0].shape) == [None, None, None, last_dim]
    assert model.get_layer("stem_conv").kernel.shape[2] == 1
    y = model(np.zeros((1, 40, 40, 1), "float32"))
    assert y.shape == (1, output_side(model, 40), output_side(model, 40), last_dim)


@pytest.mark.parametrize("public", REPRESENTATIVE)
def test_notop_custom_input_tensor_shape_and_pooling(public):
    constructor, last_dim = applications.CONSTRUCTORS[public], LAST_DIM[public]
    # Keras' test: a 4-channel input turned into 3 channels by a layer of the user's own.
    inputs = keras.Input((246, 246, 4), name="custom_input")
    tensor = keras.layers.Conv2D(3, 2, strides=2)(inputs)
    model = constructor(weights=None, include_top=False, input_tensor=tensor)
    side = output_side(model, 123)
    assert list(model.outputs[0].shape) == [None, side, side, last_dim]
    assert len(model.inputs) == 1 and model.inputs[0] is inputs
    # And 4 channels (RGBA), pooled.
    pooled = constructor(weights=None, include_top=False, pooling="max",
                         input_shape=(None, None, 4))
    assert list(pooled.outputs[0].shape) == [None, last_dim]
    assert pooled.layers[-1].name == "max_pool"
    assert pooled.get_layer("stem_conv").kernel.shape[2] == 4


@pytest.mark.parametrize("public", REPRESENTATIVE)
def test_classifier_and_serialization_round_trips(public, tmp_path):
    constructor = applications.CONSTRUCTORS[public]
    model = constructor(weights=None, input_shape=(40, 40, 3), classes=5)
    assert model.layers[-1].activation.__name__ == "softmax"
    assert model.output.shape == (None, 5)
    x = np.random.default_rng(0).uniform(0, 255, (2, 40, 40, 3)).astype("float32")
    expected = keras.ops.convert_to_numpy(model(x))
    np.testing.assert_allclose(expected.sum(axis=1), 1.0, rtol=1e-5)
    model.save(tmp_path / "m.keras")
    rebuilt = {  # to_json holds get_config's config
        "to_json": keras.models.model_from_json(model.to_json()),
        ".keras": keras_preact.load_model(str(tmp_path / "m.keras")),
    }
    for how, other in rebuilt.items():
        assert [layer.name for layer in other.layers] == [layer.name for layer in model.layers], how
        other.set_weights(model.get_weights())
        np.testing.assert_allclose(keras.ops.convert_to_numpy(other(x)), expected, atol=1e-6,
                                   err_msg=how)
    logits = constructor(weights=None, include_top=True, classifier_activation=None,
                         input_shape=(40, 40, 3))
    assert logits.layers[-1].activation.__name__ == "linear"


def test_weights_need_rgb_input(tmp_path):
    path = tmp_path / "rgb.weights.h5"
    applications.PreActResNet20().save_weights(path)
    with pytest.raises(ValueError) as info:
        applications.PreActResNet20(weights=str(path), input_shape=(32, 32, 1))
    assert str(info.value) == (
        "Weights are for RGB images: with `weights`, `input_shape` must have 3 channels (the "
        "stem conv was trained on 3). Use weights=None for other channel counts. Received: "
        "input_shape=(32, 32, 1)")


def test_preprocess_input_refuses_other_channel_counts():
    for channels in (1, 4):
        with pytest.raises(ValueError) as info:
            applications.preprocess_input(np.zeros((1, 8, 8, channels), "uint8"))
        assert str(info.value) == (
            "`preprocess_input` normalizes RGB images with per-channel statistics: the last "
            f"axis must have 3 channels. Received: x.shape=(1, 8, 8, {channels})")


@pytest.mark.parametrize("top", [-1, 0, True, 2.5, "3"])
def test_decode_predictions_refuses_a_bad_top(top):
    with pytest.raises(ValueError) as info:
        applications.decode_predictions(np.eye(10)[[3]], top=top)
    assert str(info.value) == f"`top` must be a positive integer. Received: top={top!r}"


def test_imagenet_names_ship_with_the_package(monkeypatch):
    from tensorflow_datasets.datasets.siscore import labels as tfds_labels

    shipped = labels.imagenet_names()
    assert shipped == tuple(tfds_labels.IMAGENET_LABELS_LIST)
    assert len(shipped) == len(set(shipped)) == 1000
    # Read from the package's own file, not from another dataset's internal module.
    monkeypatch.setitem(sys.modules, "tensorflow_datasets.datasets.siscore.labels", None)
    monkeypatch.setitem(sys.modules, "tensorflow_datasets", None)
    assert labels.imagenet_names() == shipped
    assert labels.IMAGENET_FILE.endswith("keras_preact/imagenet_classes.txt")


def test_a_string_is_not_a_list_of_labels(tmp_path):
    from keras_preact import export

    model = keras_preact.build("preact-20", depth=8)
    with pytest.raises(ValueError) as info:
        export.export_model(model, str(tmp_path), labels="abcdefghij")
    assert str(info.value) == ("`labels` must be a list or tuple of names, one per item. "
                               "Received: labels='abcdefghij'")
    assert not list(tmp_path.iterdir())
    assert labels.check_names(np.array(["a", "b"]), 2) == ("a", "b")
    with pytest.raises(ValueError, match="must be 2 strings, one per class. Received 3 items"):
        labels.check_names(["a", "b", "c"], 2)
    with pytest.raises(ValueError, match="Received: labels='ab'"):
        plotting.plot_runs(["run1", "run2"], labels="ab")
    with pytest.raises(ValueError, match="Received: labels='ab'"):
        plotting.plot_prediction(np.zeros((8, 8, 3), "uint8"), "ab", [0.7, 0.2])
