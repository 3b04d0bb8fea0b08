"""Scanned stages (`build(..., stages="scan")`): the same network as the plain layer graph.

Both forms convert into each other with equal outputs, parameter counts and moving-statistic
updates; the scanned form trains, recomputes exactly, and saves/loads as `.keras` (safe mode).
"""

import keras
import numpy as np
import pytest

import keras_preact
from keras_preact.arch import scan
from keras_preact.arch.network import ResNet
from keras_preact.training import SGDWithL2

# Small nets whose stages hold 2, 1, 1 scanned units after their first unit.
NETS = {"bottleneck": ("preact-164", {"units": (3, 2, 2)}),
        "basic": ("preact-110", {"units": (3, 2, 2)}),
        "imagenet": ("preact-18-imagenet", {"units": (3, 2, 1, 1), "input_shape": (64, 64, 3)})}


def images(model, n=4, seed=0):
    return np.random.default_rng(seed).normal(size=(n, *model.input_shape[1:])).astype("float32")


def plain_with_statistics(kind: str) -> keras.Model:
    """A plain net whose BN moving statistics are not the initial 0/1 (so inference uses them)."""
    name, overrides = NETS[kind]
    keras.utils.set_random_seed(1)
    model = keras_preact.build(name, **overrides)
    rng = np.random.default_rng(2)
    for layer in model.layers:
        if isinstance(layer, keras.layers.BatchNormalization):
            layer.moving_mean.assign(rng.normal(0, 0.2, layer.moving_mean.shape))
            layer.moving_variance.assign(rng.uniform(0.5, 2.0, layer.moving_variance.shape))
            layer.gamma.assign(rng.uniform(0.5, 1.5, layer.gamma.shape))
    return model


def moving_statistics(model: keras.Model) -> np.ndarray:
    """Every BN moving mean and variance of a plain model, concatenated in layer order."""
    return np.concatenate([np.ravel(w) for layer in model.layers
                           if isinstance(layer, keras.layers.BatchNormalization)
                           for w in (layer.moving_mean, layer.moving_variance)])


@pytest.mark.parametrize("kind", sorted(NETS))
@pytest.mark.parametrize("fused", [True, False])
def test_round_trip_keeps_outputs_and_parameters(kind, fused):
    plain = plain_with_statistics(kind)
    fast = scan.to_scanned(plain, fused=fused)
    back = scan.to_layered(fast)
    x = images(plain)
    expected = keras.ops.convert_to_numpy(plain(x, training=False))
    for model in (fast, back):
        np.testing.assert_allclose(keras.ops.convert_to_numpy(model(x, training=False)),
                                   expected, atol=1e-5)
        assert model.count_params() == plain.count_params()
    assert [layer.name for layer in back.layers] == [layer.name for layer in plain.layers]
    for a, b in zip(plain.get_weights(), back.get_weights()):
        np.testing.assert_array_equal(a, b)  # the weights survive both conversions exactly
    stage1 = fast.get_layer("stage1_scan")
    assert stage1.units == 2 and stage1.fused is fused
    # Slice u of the stacked kernel is unit u + 2's kernel.
    np.testing.assert_array_equal(keras.ops.convert_to_numpy(stage1.kernels[1])[1],
                                  keras.ops.convert_to_numpy(plain.get_layer(
                                      "stage1_unit003_conv2").kernel))


def test_scanned_build_matches_plain_build():
    fast = keras_preact.build("preact-164", stages="scan", depth=29)  # 3 units per stage
    plain = keras_preact.build("preact-164", depth=29)
    assert fast.count_params() == plain.count_params()
    scanned = [layer for layer in fast.layers if isinstance(layer, scan.ScannedUnits)]
    assert [layer.units for layer in scanned] == [2, 2, 2]
    assert len(fast.layers) < len(plain.layers)
    # Same initial distribution: He fan-out normal per unit (std sqrt(2 / (3 * 3 * 64))).
    kernel = keras.ops.convert_to_numpy(fast.get_layer("stage3_scan").kernels[1])
    assert kernel.shape == (2, 3, 3, 64, 64)
    np.testing.assert_allclose(kernel.std(), np.sqrt(2 / (9 * 64)), rtol=0.03)


@pytest.mark.parametrize("fused, recompute_bn", [(True, True), (True, False), (False, True)])
def test_training_updates_moving_statistics_like_plain(fused, recompute_bn):
    plain = plain_with_statistics("bottleneck")
    fast = scan.to_scanned(plain, fused=fused, recompute_bn=recompute_bn)
    x = images(plain, n=8, seed=3)
    y_plain = keras.ops.convert_to_numpy(plain(x, training=True))
    y_fast = keras.ops.convert_to_numpy(fast(x, training=True))
    np.testing.assert_allclose(y_fast, y_plain, atol=1e-5)
    before = moving_statistics(plain_with_statistics("bottleneck"))
    after_plain, after_fast = moving_statistics(plain), moving_statistics(scan.to_layered(fast))
    assert np.abs(after_plain - before).max() > 1e-2  # the step did move them
    np.testing.assert_allclose(after_fast, after_plain, rtol=1e-5, atol=1e-6)


def test_fit_step_trains_both_forms_alike():
    plain = plain_with_statistics("bottleneck")
    fast = scan.to_scanned(plain)
    x, y = images(plain, n=8, seed=4), np.arange(8) % 10
    losses = []
    for model in (plain, fast):
        model.compile(optimizer=SGDWithL2(0.01), loss="sparse_categorical_crossentropy")
        losses.append(model.train_on_batch(x, y))
    np.testing.assert_allclose(losses[1], losses[0], rtol=1e-5)
    trained = scan.to_layered(fast)
    changed = 0
    for before, a, b in zip(plain_with_statistics("bottleneck").get_weights(),
                            plain.get_weights(), trained.get_weights()):
        np.testing.assert_allclose(b, a, atol=1e-4)
        changed += not np.allclose(a, before)
    assert changed == len(plain.get_weights())  # every weight (and statistic) moved


def gradients(model, x, y) -> dict:
    """`{weight path: gradient}` of the cross-entropy of one training-mode batch."""
    import tensorflow as tf

    @tf.function
    def gradient(x):
        with tf.GradientTape() as tape:
            loss = keras.losses.sparse_categorical_crossentropy(y, model(x, training=True))
        return tape.gradient(loss, model.trainable_weights)

    return {w.path: np.asarray(g, "float32")
            for w, g in zip(model.trainable_weights, gradient(x))}


def relative_error(a, b):
    return np.linalg.norm(a - b) / np.linalg.norm(b)


@pytest.mark.parametrize("kind", ["basic", "bottleneck"])
def test_scanned_gradients_equal_the_plain_graph(kind):
    # The scan's backward pass recomputes BN + ReLU (and whole units with recompute=True)
    # or, with recompute_bn=False, calls the ReLU and fused BN gradient ops on what it kept,
    # and runs the conv gradient ops itself: every gradient must still be autodiff's.
    plain = plain_with_statistics(kind)
    x, y = images(plain, n=4, seed=5), np.arange(4) % 10
    models = (plain, scan.to_scanned(plain), scan.to_scanned(plain, recompute=True),
              scan.to_scanned(plain, recompute_bn=False),
              scan.to_scanned(plain, recompute=True, recompute_bn=False))
    grads = [gradients(model, x, y) for model in models]
    # The plain gradients in the scanned layout: load them as weights, convert, read back.
    for w in plain.trainable_weights:
        w.assign(grads[0][w.path])
    reference = {w.path: w.numpy() for w in scan.to_scanned(plain).trainable_weights}
    # Relative errors, not elementwise ones: at batch 4 these small nets amplify float32
    # round-off (oneDNN's reduction order differs run to run) to ~1e-3 in single BN
    # offsets for the plain graph itself; a wrong gradient term is off by O(1).
    for scanned in grads[1:]:
        assert sorted(scanned) == sorted(reference)
        errors = {name: relative_error(g, reference[name]) for name, g in scanned.items()}
        assert max(errors.values()) < 5e-2, max(errors.items(), key=lambda item: item[1])
        everything = [np.concatenate([d[name].ravel() for name in sorted(reference)])
                      for d in (scanned, reference)]
        assert relative_error(*everything) < 1e-2


def test_kept_bn_relu_outputs_give_the_recomputed_gradients_in_bfloat16():
    """The trainer's bfloat16 path (recompute_bn=False) against the float32 one's backward
    pass, both in bfloat16: the same ops on the same values, to bfloat16 round-off."""
    keras.config.set_dtype_policy("mixed_bfloat16")
    try:
        keras.utils.set_random_seed(1)
        kept = keras_preact.build("preact-164", stages="scan", units=(3, 2, 2))
    finally:
        keras.config.set_dtype_policy("float32")
    recomputed = type(kept).from_config(kept.get_config())  # the spec and form
    recomputed.set_weights(kept.get_weights())
    scan.set_options(kept, recompute_bn=False)
    x, y = images(kept, n=8, seed=6), np.arange(8) % 10
    a, b = gradients(kept, x, y), gradients(recomputed, x, y)
    assert sorted(a) == sorted(b)
    errors = {name: relative_error(a[name], b[name]) for name in b}
    assert max(errors.values()) < 5e-2, max(errors.items(), key=lambda item: item[1])


def test_keras_file_round_trip_in_safe_mode(tmp_path):
    fast = scan.to_scanned(plain_with_statistics("bottleneck"), recompute=True)
    path = str(tmp_path / "fast.keras")
    fast.save(path)
    loaded = keras.saving.load_model(path, safe_mode=True)
    layer = loaded.get_layer("stage2_scan")
    assert isinstance(layer, scan.ScannedUnits)
    assert (layer.units, layer.convs, layer.recompute) == (1, [(32, 1), (32, 3), (128, 1)], True)
    x = images(fast)
    np.testing.assert_array_equal(keras.ops.convert_to_numpy(loaded(x, training=False)),
                                  keras.ops.convert_to_numpy(fast(x, training=False)))


def test_errors_name_what_was_received():
    with pytest.raises(ValueError, match="unit='original'"):
        keras_preact.build("resnet-164", stages="scan", depth=20)
    with pytest.raises(ValueError, match="Unknown stages 'fast'"):
        keras_preact.build("preact-164", stages="fast", depth=20)
    with pytest.raises(ValueError, match="not two forms of one full pre-activation network"
                                         ".*stage1_unit002_shortcut_conv"):
        scan.to_scanned(keras_preact.build("preact-164", depth=20, shortcut="conv1x1"))
    fast = keras_preact.build("preact-164", stages="scan", depth=20)
    with pytest.raises(ValueError, match="Received two scanned models"):
        scan.copy_weights(fast, fast)
    with pytest.raises(ValueError, match=r"Layers that differ: \['stage1_unit003"):
        scan.copy_weights(fast, keras_preact.build("preact-164", depth=29))
    with pytest.raises(ValueError, match="not a network built by keras_preact"):
        scan.to_scanned(keras.Sequential([keras.Input((4,)), keras.layers.Dense(2)]))


def layer_entry(config: dict, name: str) -> dict:
    return next(e for e in config["config"]["layers"] if e["name"] == name)


@pytest.mark.parametrize("kind", sorted(NETS))
def test_plain_file_loads_directly_into_the_scanned_form(kind, tmp_path):
    from keras_preact.api import load_for_inference

    plain = plain_with_statistics(kind)
    path = str(tmp_path / "plain.keras")
    plain.save(path)
    fast = load_for_inference(path)
    loaded = keras.saving.load_model(path)
    assert scan.is_scanned(fast) and fast.name == plain.name
    assert not scan.is_scanned(keras_preact.load_model(path))  # the public loader: the file as is
    x = images(plain)
    np.testing.assert_allclose(keras.ops.convert_to_numpy(fast(x, training=False)),
                               keras.ops.convert_to_numpy(loaded(x, training=False)), atol=1e-5)
    for a, b in zip(scan.to_layered(fast).get_weights(), loaded.get_weights()):
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("overrides", [{"include_top": False, "pooling": "avg"},
                                       {"include_top": False},
                                       {"classifier_activation": None, "classes": 7}])
def test_headless_and_logit_files_load_scanned(overrides, tmp_path):
    from keras_preact.api import load_for_inference

    plain = keras_preact.build("preact-164", depth=20, **overrides)
    path = str(tmp_path / "plain.keras")
    plain.save(path)
    fast = load_for_inference(path)
    assert scan.is_scanned(fast) and fast.output_shape == plain.output_shape
    x = images(plain)
    np.testing.assert_allclose(keras.ops.convert_to_numpy(fast(x, training=False)),
                               keras.ops.convert_to_numpy(plain(x, training=False)), atol=1e-5)


def test_files_of_other_nets_load_as_they_are(tmp_path):
    """A plain `.keras` file declares no network, unless it is a run dir's model.keras that
    holds, layer for layer, the network the run's config.json names."""
    from keras_preact import rundir
    from keras_preact.api import load_for_inference

    plain = keras_preact.build("preact-164", depth=29)  # 3 units per stage
    run = {"model": "preact-164", "overrides": {"depth": 29}}
    extra = keras.Model(plain.input, keras.layers.Dense(3, name="extra")(plain.output))
    files = {"plain": keras.Model(plain.inputs, plain.outputs, name=plain.name), "extra": extra,
             "other": keras.Model(plain.inputs, plain.outputs, name=plain.name)}
    for name, model in files.items():
        (tmp_path / name).mkdir()
        model.save(str(tmp_path / name / rundir.MODEL))
        if name != "plain":  # a run dir; "other" says it trained another network
            rundir.write_config(tmp_path / name, run if name == "extra" else
                                {"model": "preact-164", "overrides": {"depth": 20}})
    for name in files:
        path = str(tmp_path / name / rundir.MODEL)
        model = load_for_inference(path)
        assert not scan.is_scanned(model) and not isinstance(model, ResNet), name
        x = images(model)  # what Keras builds of the file
        np.testing.assert_array_equal(keras.ops.convert_to_numpy(model(x, training=False)),
                                      keras.ops.convert_to_numpy(
                                          keras.saving.load_model(path)(x, training=False)))
    rundir.write_config(tmp_path / "plain", run)  # now it is a run dir of its network
    loaded = load_for_inference(str(tmp_path / "plain"))
    assert scan.is_scanned(loaded) and keras_preact.spec_of(loaded) == keras_preact.spec_of(plain)
    scan.to_scanned(plain).save(str(tmp_path / "scanned.keras"))
    assert scan.is_scanned(load_for_inference(str(tmp_path / "scanned.keras")))


def test_a_plain_file_keras_preact_wrote_names_its_network_anywhere(tmp_path):
    """`weights.storage.save_plain` (a run dir's model.keras) keeps the network's spec in the file:
    a copy outside any run dir still loads as that network, with its own preprocessing (an
    ImageNet net's, not CIFAR's, which a file naming no network gets), while Keras alone
    loads the plain graph."""
    from keras_preact import api
    from keras_preact.api import load_for_inference
    from keras_preact.preprocessing import FAMILY_PREPROCESSING
    from keras_preact.weights import storage

    net = keras_preact.build("preact-18-imagenet-timm", input_shape=(64, 64, 3))
    path = str(tmp_path / "copied.keras")
    storage.save_plain(net, path)
    assert not isinstance(keras.saving.load_model(path), ResNet)
    loaded = load_for_inference(path)
    assert keras_preact.spec_of(loaded) == keras_preact.spec_of(net)
    assert api.preprocessing_of(loaded) == api.preprocessing_of(net)
    assert api.preprocessing_of(loaded) != FAMILY_PREPROCESSING["cifar"]
    x = images(net)
    np.testing.assert_allclose(keras.ops.convert_to_numpy(loaded(x, training=False)),
                               keras.ops.convert_to_numpy(net(x, training=False)), atol=1e-5)


def test_evaluate_and_export_load_plain_files_scanned(tmp_path):
    from keras_preact.api import load_for_inference
    from keras_preact.export.loading import load_for_export

    path = str(tmp_path / "plain.keras")
    keras_preact.build("preact-164", depth=20).save(path)
    assert scan.is_scanned(load_for_inference(path))
    model, name = load_for_export(path)
    assert scan.is_scanned(model) and name == "preact-164"


@pytest.mark.parametrize("module", ["keras_preact.scan", "keras_preact.scanned_units"])
def test_files_saved_before_a_move_of_scanned_units_still_load(tmp_path, module):
    """Scanned `.keras` files written when `ScannedUnits` lived in an older module name that
    module; Keras finds the layer by its registered name `keras_preact>ScannedUnits`. (Those
    files hold a plain functional graph, as `keras.Model` of the same layers saves.)"""
    import zipfile

    fast = scan.to_scanned(plain_with_statistics("basic"))
    new, old = str(tmp_path / "new.keras"), str(tmp_path / "old.keras")
    keras.Model(fast.inputs, fast.outputs, name=fast.name).save(new)
    with zipfile.ZipFile(new) as source, zipfile.ZipFile(old, "w") as target:
        for item in source.infolist():
            data = source.read(item.filename)
            if item.filename == "config.json":
                assert b'"keras_preact>ScannedUnits"' in data
                data = data.replace(b'"module": "keras_preact.arch.scanned_units"',
                                    f'"module": "{module}"'.encode())
            target.writestr(item, data)
    loaded = keras.saving.load_model(old, safe_mode=True)
    assert isinstance(loaded.get_layer("stage1_scan"), scan.ScannedUnits)
    x = images(fast)
    np.testing.assert_array_equal(keras.ops.convert_to_numpy(loaded(x, training=False)),
                                  keras.ops.convert_to_numpy(fast(x, training=False)))


def test_one_loader_for_models_files_and_run_dirs(tmp_path):
    from keras_preact.api import load_for_inference

    model = keras_preact.build("preact-20", depth=14)
    assert load_for_inference(model) is model
    model.save(str(tmp_path / "model.keras"))
    for path in (tmp_path, str(tmp_path), str(tmp_path / "model.keras")):  # a run dir or its file
        assert scan.is_scanned(load_for_inference(path))
    with pytest.raises(ValueError, match="Expected a keras.Model, a .keras file or a run dir. "
                                         "Received: 42"):
        load_for_inference(42)
    with pytest.raises(FileNotFoundError, match="No .keras file at"):
        load_for_inference(str(tmp_path / "missing"))
