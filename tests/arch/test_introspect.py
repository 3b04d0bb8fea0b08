"""A network carries its spec (`keras_preact.spec_of`), built, scanned, saved and loaded; what
its output holds comes from the output itself (`keras_preact.arch.introspect.output_kind`)."""

import dataclasses

import keras
import pytest

import keras_preact
from keras_preact.arch import scan
from keras_preact.arch.introspect import output_kind

# Two units per CIFAR stage (units 2..n keep their dimensions: that is where the shortcut
# variants sit); ImageNet nets small and at 64x64.
SMALL = {"cifar": {"units": (2, 2, 2)},
         "imagenet": {"units": (1, 2, 1, 1), "input_shape": (64, 64, 3)}}


def architecture(spec) -> dict:
    """The fields that make the network (not the paper's result, if the spec has one)."""
    return {k: v for k, v in dataclasses.asdict(spec).items() if k != "paper_result"}


@pytest.mark.parametrize("name", keras_preact.list_models())
def test_every_registered_net_gives_back_its_spec(name):
    overrides = SMALL[keras_preact.get_spec(name).family]
    expected = architecture(keras_preact.resolve(name, **overrides))
    model = keras_preact.build(name, **overrides)
    assert architecture(keras_preact.spec_of(model)) == expected
    assert output_kind(model) == "probabilities"
    copy = model.__class__.from_config(model.get_config())  # what loading a .keras file does
    assert architecture(keras_preact.spec_of(copy)) == expected and copy.stages == "layers"
    assert copy.count_params() == model.count_params()
    if scan.scannable(keras_preact.spec_of(model)) and keras.backend.backend() == "tensorflow":
        fast = keras_preact.build(name, stages="scan", **overrides)
        assert scan.is_scanned(fast) and architecture(keras_preact.spec_of(fast)) == expected


@pytest.mark.parametrize("overrides, head", [
    ({"include_top": False, "pooling": "avg"}, "features"),
    ({"include_top": False, "pooling": "max"}, "features"),
    ({"include_top": False}, "features"),
    ({"classifier_activation": None, "classes": 7}, "logits"),
    ({"classifier_activation": "sigmoid", "input_shape": (None, None, 1)}, "sigmoid"),
    ({"shortcut": "constant-scaling", "shortcut_scale": 0.25, "residual_scale": 0.5},
     "probabilities"),
    ({"shortcut": "dropout", "dropout_rate": 0.3}, "probabilities"),
    ({"shortcut": "shortcut-only-gating", "gate_bias": -2.0}, "probabilities"),
    # One unit per stage: stage 1's first unit keeps its dimensions, so its 1x1 conv
    # shortcut is the variant's, not a projection.
    ({"units": (1, 1, 1), "shortcut": "conv1x1"}, "probabilities"),
])
def test_overrides_and_heads_are_read_back(overrides, head, tmp_path):
    overrides = {"units": (2, 2, 2), **overrides}
    expected = keras_preact.resolve("resnet-20", **overrides)
    path = str(tmp_path / "m.keras")
    keras_preact.build("resnet-20", **overrides).save(path)
    loaded = keras_preact.load_model(path)
    assert architecture(keras_preact.spec_of(loaded)) == architecture(expected)
    assert output_kind(loaded) == head


def test_other_models_have_no_spec():
    dense = keras.Sequential([keras.Input((4,)), keras.layers.Dense(2)])
    with pytest.raises(ValueError, match="Expected a network built by keras_preact"):
        keras_preact.spec_of(dense)
    net = keras_preact.build("preact-20", depth=8)
    wrapped = keras.Sequential([net, keras.layers.Softmax()])
    with pytest.raises(ValueError, match="Received: Sequential"):
        keras_preact.spec_of(wrapped)
    assert output_kind(wrapped) == "probabilities"
    plain = keras.Model(net.inputs, net.outputs)  # the same graph, a plain Keras model
    with pytest.raises(ValueError, match="Received: Functional"):
        keras_preact.spec_of(plain)


@pytest.mark.parametrize("name", keras_preact.list_models())
def test_the_plain_layer_order_is_known_from_the_spec(name):
    """`weights.storage.plain_layers`: where a plain file keeps each layer's weights, without
    building the plain graph at its depth (units 2..n repeat unit 2's run of layers)."""
    from keras_preact.weights.storage import plain_layers

    family = keras_preact.get_spec(name).family
    overrides = ({"units": (3, 1, 4)} if family == "cifar"
                 else {"units": (3, 1, 2, 4), "input_shape": (64, 64, 3)})
    model = keras_preact.build(name, **overrides)
    assert plain_layers(keras_preact.spec_of(model)) == [
        (layer.name, type(layer).__name__) for layer in model.layers]
