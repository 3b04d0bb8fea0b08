"""Weights files read without Keras' loader (`keras_preact.weights.storage`): where Keras keeps
each layer's weights, a network's file layout read off the network itself, and one pass over
a `.keras` archive per load."""

from __future__ import annotations

import zipfile

import h5py
import keras
import numpy as np
import pytest

import keras_preact
from keras_preact import api
from keras_preact.arch import scan
from keras_preact.weights import storage

NETS = [("preact-164", {"depth": 29}), ("preact-20", {"units": (3, 1, 4)}),
        ("preact-18-imagenet-timm", {"units": (3, 1, 2, 4), "input_shape": (64, 64, 3)})]


def test_keras_names_weight_groups_as_group_name_says(tmp_path):
    """`storage.group_name` is Keras' internal `to_snake_case` (no public API names the
    groups): this fails loudly should Keras move it or name the groups otherwise."""
    path = str(tmp_path / "m.weights.h5")
    keras.Sequential([keras.Input((4,)), keras.layers.BatchNormalization(),
                      keras.layers.Dense(3), keras.layers.Dense(2)]).save_weights(path)
    with h5py.File(path, "r") as f:
        groups = set(f["layers"])
    bn, dense = storage.group_name("BatchNormalization"), storage.group_name("Dense")
    assert (bn, dense) == ("batch_normalization", "dense")
    assert {bn, dense, f"{dense}_1"} <= groups, groups
    assert storage.group_name("ScannedUnits") == "scanned_units"  # what `file_form` looks for


@pytest.mark.parametrize("name, overrides", NETS)
def test_a_scanned_network_knows_the_layout_of_its_plain_files(name, overrides):
    """A plain file goes into a scanned net through a layout read off the scanned net (no
    plain template): its layers with weights, in the plain graph's order."""
    plain = keras_preact.build(name, **overrides)
    scanned = keras_preact.build(name, stages="scan", **overrides)
    weighted = {layer.name for layer in plain.layers if layer.weights}
    assert [entry for entry in storage._model_layout(scanned, "layers")
            if entry[0] in weighted] == [(layer.name, type(layer).__name__)
                                         for layer in plain.layers if layer.weights]


@pytest.mark.parametrize("form", ["layers", "scan"])
def test_the_stored_layout_is_that_of_the_network_at_its_depth(form):
    name, overrides = NETS[1]
    model = keras_preact.build(name, stages=form, **overrides)
    assert list(storage.stored_layout(keras_preact.spec_of(model), form)) == [
        storage.StoredLayer(layer.name, type(layer).__name__,
                            tuple(tuple(w.shape) for w in layer.weights))
        for layer in model.layers]


def test_a_classifier_of_another_class_count_keeps_its_weights(tmp_path):
    """`load_weights(..., keep=...)`: every other layer from the file, in either form."""
    path = str(tmp_path / "m.weights.h5")
    source = keras_preact.build("preact-20", depth=8)
    source.save_weights(path)
    for stages in ("layers", "scan"):
        model = keras_preact.build("preact-20", depth=8, classes=3, stages=stages)
        head = model.get_layer("predictions").get_weights()
        storage.load_weights(model, path, keep="predictions")
        plain = scan.to_layered(model) if stages == "scan" else model
        for layer in source.layers:
            got = plain.get_layer(layer.name).get_weights()
            want = head if layer.name == "predictions" else layer.get_weights()
            assert all(np.array_equal(a, b) for a, b in zip(got, want)), (stages, layer.name)


@pytest.mark.parametrize("kind", ["plain", "network"])
def test_a_load_opens_the_keras_archive_once(kind, tmp_path, monkeypatch):
    path = str(tmp_path / "m.keras")
    model = keras_preact.build("preact-20", depth=14)  # 2 units a stage: a scanned form
    for variable in model.weights:  # weights no fresh network has
        variable.assign(np.random.default_rng(1).normal(size=variable.shape) * 0.1 + 1)
    if kind == "plain":
        storage.save_plain(model, path)
    else:
        model.save(path)
    opened = []
    init = zipfile.ZipFile.__init__

    def counted(self, file, *args, **kwargs):
        opened.append(file)
        init(self, file, *args, **kwargs)

    monkeypatch.setattr(zipfile.ZipFile, "__init__", counted)
    loaded = api.load_for_inference(path)
    assert scan.is_scanned(loaded) and opened == [path], opened
    x = np.random.default_rng(0).normal(size=(2, 32, 32, 3)).astype("float32")
    np.testing.assert_allclose(keras.ops.convert_to_numpy(loaded(x, training=False)),
                               keras.ops.convert_to_numpy(model(x, training=False)), atol=1e-5)
