"""The model zoo: every registered name builds, runs, saves and loads; faithful structure."""

import json
import os
import subprocess
import sys
import zipfile

import keras
import numpy as np
import pytest

import keras_preact
from keras_preact import api, cli
from keras_preact.arch import graph, network, specs
from keras_preact.paper import paper_result

ALL = keras_preact.list_models()


def small_size(name: str) -> dict:
    """Overrides that give `name` few units per stage (and 64x64 ImageNet input), for speed.

    Two units in stage 1 so that both kinds of unit are built: the stage's first
    (shared pre-activation, maybe projection) and a plain identity one.
    """
    if keras_preact.get_spec(name).family == "imagenet":
        return {"units": (2, 1, 1, 1), "input_shape": (64, 64, 3)}
    return {"units": (2, 1, 1)}


def small(name: str, **overrides) -> keras.Model:
    """`name` at `small_size(name)`, with `overrides`."""
    return keras_preact.build(name, **{**small_size(name), **overrides})


def layer_input(model: keras.Model, name: str) -> list[str]:
    """Names of the layers whose outputs feed layer `name`."""
    node = model.get_layer(name)._inbound_nodes[0]
    return [t._keras_history.operation.name for t in node.input_tensors]


def test_registry_has_every_network_of_the_paper():
    for depth in (20, 32, 44, 56, 110, 164, 1001, 1202):
        assert f"resnet-{depth}" in ALL
    for depth in (20, 32, 44, 56, 110, 164, 1001):
        assert f"preact-{depth}" in ALL
    for depth in (18, 34, 50, 101, 152, 200):
        assert f"resnet-{depth}-imagenet" in ALL and f"preact-{depth}-imagenet" in ALL
    assert keras_preact.list_models("preact-1??") == ["preact-110", "preact-164"]
    assert keras_preact.get_spec("preact-200-imagenet").units == (3, 24, 36, 3)
    assert keras_preact.get_spec("preact-1001").units == (111, 111, 111)
    assert keras_preact.get_spec("preact-1001").depth == 1001


@pytest.mark.parametrize("name", ALL)
def test_forward_pass(name):
    model = small(name)
    spec = keras_preact.get_spec(name)
    x = np.random.default_rng(0).normal(size=(2, *model.input_shape[1:])).astype("float32")
    y = keras.ops.convert_to_numpy(model(x, training=False))
    assert y.shape == (2, spec.classes)
    assert np.all(np.isfinite(y))
    np.testing.assert_allclose(y.sum(axis=1), 1.0, rtol=1e-5)
    assert not np.allclose(y[0], y[1])  # the output depends on the image


# Trainable parameters as the papers state them (../shared/PAPER.md), in millions.
PAPER_MILLIONS = {
    "resnet-20": 0.27,
    "resnet-110": 1.73,
    "preact-164": 1.70,
    "resnet-1202": 19.4,
    "preact-1001": 10.33,
    "resnet-50-imagenet": 25.56,
    "preact-50-imagenet": 25.55,
    "preact-200-imagenet": 64.67,
}


def assert_counts(spec: specs.ResNetSpec, model: keras.Model) -> specs.ParamCounts:
    """`specs.param_counts(spec)` (what `keras-preact list --params` shows) is `model`'s."""
    counts = specs.param_counts(spec)
    assert counts.trainable == sum(int(np.prod(w.shape)) for w in model.trainable_weights)
    assert counts.trainable + counts.non_trainable == model.count_params()
    return counts


@pytest.mark.parametrize("name", ALL)
def test_parameter_counts_from_the_spec(name):
    """Every design's stem, units (a stage's first and its repeated ones) and head, counted
    without a model; the full-size nets below check that the count scales with depth."""
    assert_counts(keras_preact.resolve(name, **small_size(name)), small(name))


@pytest.mark.parametrize("name", sorted(PAPER_MILLIONS))
def test_parameter_counts_match_the_paper(name, monkeypatch):
    # Python's default limit, whatever an imported tool (jedi: 3000) set: Keras walks the
    # graph recursively, and build() must make room for 1000+ layer nets itself.
    monkeypatch.setattr(sys, "getrecursionlimit", lambda: 1000)
    counts = assert_counts(keras_preact.get_spec(name), keras_preact.build(name))
    millions = PAPER_MILLIONS[name]
    decimals = len(str(millions).split(".")[1])  # as precise as the paper states it
    assert round(counts.trainable / 1e6, decimals) == millions


def test_identity_path_of_full_preactivation():
    """Fig. 1 (right): an Add feeds the next Add directly; projection units share BN-ReLU."""
    model = small("preact-164")
    # stage 1 unit 1 changes width (16 -> 64): its BN-ReLU feeds branch and projection.
    assert layer_input(model, "stage1_unit001_bn1") == ["stem_conv"]
    assert layer_input(model, "stage1_unit001_conv1") == ["stage1_unit001_relu1"]
    assert layer_input(model, "stage1_unit001_shortcut_conv") == ["stage1_unit001_relu1"]
    # A plain unit adds its branch to its raw input: the previous Add.
    assert layer_input(model, "stage1_unit002_add") == [
        "stage1_unit001_add", "stage1_unit002_conv3"]
    # Downsampling in the first unit of stages 2 and 3, on the 3x3 conv and the projection.
    for s in (2, 3):
        assert model.get_layer(f"stage{s}_unit001_conv2").strides == (2, 2)
        assert model.get_layer(f"stage{s}_unit001_shortcut_conv").strides == (2, 2)
        assert model.get_layer(f"stage{s}_unit001_conv1").strides == (1, 1)
    # One more BN-ReLU after the last addition, then pooling.
    assert layer_input(model, "final_bn") == ["stage3_unit001_add"]
    assert layer_input(model, "avg_pool") == ["final_relu"]
    assert model.get_layer("stage3_unit001_conv3").output.shape[1:] == (8, 8, 256)


def test_original_unit_has_relu_after_every_addition():
    model = small("resnet-110")
    adds = [layer for layer in model.layers if layer.name.endswith("_add")]
    assert len(adds) == 4
    for add in adds:
        prefix = add.name[: -len("_add")]
        assert layer_input(model, f"{prefix}_out_relu") == [add.name]
    assert layer_input(model, "stage1_unit001_add") == ["stem_relu", "stage1_unit001_bn2"]
    # Projection on the original unit is conv + BN (fb.resnet.torch shortcut type B).
    assert layer_input(model, "stage2_unit001_add") == [
        "stage2_unit001_shortcut_bn",
        "stage2_unit001_bn2",
    ]


def test_imagenet_preact_stem_and_first_unit():
    """preresnet.lua: 7x7/2 conv-BN-ReLU-maxpool; the first unit skips its pre-activation."""
    model = small("preact-50-imagenet")
    assert model.get_layer("stem_conv").strides == (2, 2)
    assert model.get_layer("stem_conv").kernel.shape == (7, 7, 3, 64)
    assert layer_input(model, "stage1_unit001_conv1") == ["stem_pool"]
    assert layer_input(model, "stage1_unit001_shortcut_conv") == ["stem_pool"]
    assert layer_input(model, "stage2_unit001_shortcut_conv") == ["stage2_unit001_relu1"]
    assert model.get_layer("stage4_unit001_conv3").output.shape[1:] == (2, 2, 2048)


def test_zeroed_residual_branch_is_an_exact_identity():
    """h_{l+1} = h_l + F(h_l): with F's last conv zeroed, a full pre-activation unit passes
    its input through unchanged (the paper's Eq. 4 with F = 0)."""
    model = small("preact-110")
    model.get_layer("stage1_unit002_conv2").kernel.assign(
        np.zeros(model.get_layer("stage1_unit002_conv2").kernel.shape, "float32")
    )
    probe = keras.Model(
        model.input,
        [
            model.get_layer("stage1_unit001_add").output,
            model.get_layer("stage1_unit002_add").output,
        ],
    )
    x = np.random.default_rng(1).normal(size=(2, 32, 32, 3)).astype("float32")
    before, after = (keras.ops.convert_to_numpy(t) for t in probe(x, training=False))
    np.testing.assert_array_equal(before, after)


def test_he_initialization_and_no_conv_bias():
    model = keras_preact.build("preact-164", depth=11)
    convs = [layer for layer in model.layers if isinstance(layer, keras.layers.Conv2D)]
    assert convs and not any(layer.use_bias for layer in convs)
    # N(0, sqrt(2 / (k*k*n_out))): 3x3x64 -> std 0.0589; 1x1x256 -> 0.0884.
    for name, std in [("stage3_unit001_conv2", (2 / (9 * 64)) ** 0.5),
                      ("stage3_unit001_conv3", (2 / 256) ** 0.5)]:
        kernel = keras.ops.convert_to_numpy(model.get_layer(name).kernel)
        assert abs(kernel.std() / std - 1) < 0.05
        assert abs(kernel.mean()) < 0.1 * std
    bn = model.get_layer("final_bn")
    np.testing.assert_array_equal(keras.ops.convert_to_numpy(bn.gamma), 1.0)
    np.testing.assert_array_equal(keras.ops.convert_to_numpy(bn.beta), 0.0)
    assert (bn.momentum, bn.epsilon) == (0.9, 1e-5)
    dense = model.get_layer("predictions")
    np.testing.assert_array_equal(keras.ops.convert_to_numpy(dense.bias), 0.0)
    assert np.abs(keras.ops.convert_to_numpy(dense.kernel)).max() <= 256**-0.5


@pytest.mark.parametrize("stages", specs.STAGES)
def test_every_kernel_is_drawn_independently_from_the_seed(stages):
    def kernels(seed):
        keras.utils.set_random_seed(seed)
        model = keras_preact.build("preact-20", stages=stages)
        return [keras.ops.convert_to_numpy(w) for w in model.trainable_weights
                if "kernel" in w.path]

    first = kernels(0)
    # Each conv (and, scanned, each unit's slice of a stacked kernel) has its own draw:
    # preact-20 has six 3x3x16x16 kernels (stage 1), all different.
    slices = [k.reshape(-1, 3, 3, 16, 16) for k in first if k.shape[-2:] == (16, 16)]
    values = {s.tobytes() for k in slices for s in k}
    assert len(values) == 6
    for a, b in zip(first, kernels(0)):
        np.testing.assert_array_equal(a, b)  # the seed fixes the weights...
    assert not any(np.array_equal(a, b) for a, b in zip(first, kernels(1)))  # ...and only it


@pytest.mark.parametrize(
    "name, unit, first_ops",
    [
        ("resnet-110", "original", ["conv1", "bn1", "relu1", "conv2", "bn2", "add", "out_relu"]),
        ("resnet-110-bn-after-add", "bn-after-add",
         ["conv1", "bn1", "relu1", "conv2", "add", "out_bn", "out_relu"]),
        ("resnet-110-relu-before-add", "relu-before-add",
         ["conv1", "bn1", "relu1", "conv2", "bn2", "relu2", "add"]),
        ("resnet-110-relu-only-preact", "relu-only-preact",
         ["relu1", "conv1", "bn1", "relu2", "conv2", "bn2", "add"]),
        ("preact-110", "full-preact", ["bn1", "relu1", "conv1", "bn2", "relu2", "conv2", "add"]),
    ],
)
def test_unit_designs_of_figure_4(name, unit, first_ops):
    model = small(name)
    assert keras_preact.get_spec(name).unit == unit
    prefix = "stage1_unit002_"
    ops = [layer.name[len(prefix):] for layer in model.layers if layer.name.startswith(prefix)]
    assert ops == first_ops


def test_shortcut_variants_of_table_1():
    scaled = small("resnet-110-constant-scaling")
    assert scaled.get_layer("stage1_unit002_shortcut_scale").scale == 0.5
    assert scaled.get_layer("stage1_unit002_residual_scale").scale == 0.5
    gated = small("resnet-110-exclusive-gating")
    bias = keras.ops.convert_to_numpy(gated.get_layer("stage1_unit002_gate").bias)
    np.testing.assert_array_equal(bias, -6.0)
    assert layer_input(gated, "stage1_unit002_add") == [
        "stage1_unit002_shortcut_gated",
        "stage1_unit002_residual_gated",
    ]
    only = small("resnet-110-shortcut-only-gating", gate_bias=-6.0)
    assert layer_input(only, "stage1_unit002_add") == [
        "stage1_unit002_shortcut_gated",
        "stage1_unit002_bn2",
    ]
    conv = small("resnet-110-conv1x1")
    assert conv.get_layer("stage1_unit002_shortcut_conv").kernel.shape == (1, 1, 16, 16)
    drop = small("resnet-110-dropout", dropout_rate=0.3)
    assert drop.get_layer("stage1_unit002_shortcut_dropout").rate == 0.3
    # A mask with expectation 1 - rate (Sec. 3.1), not Keras' inverted dropout.
    assert drop.get_layer("stage1_unit002_shortcut_keep_scale").scale == pytest.approx(0.7)
    single = keras_preact.get_spec("preact-110-single")
    assert single.units == (36, 36, 36) and single.depth == 110


def test_overrides_keep_depth_and_change_block():
    spec = keras_preact.resolve("resnet-110", block="single")
    assert spec.units == (36, 36, 36)
    assert keras_preact.resolve("preact-164", depth=1001).units == (111, 111, 111)
    assert paper_result("preact-110", classes=100) == ""
    assert paper_result("preact-110", include_top=False) == "6.37 (Table 2, 3)"


# Fig. 4's unit designs with the identity shortcut, and Table 1's shortcuts on the original unit.
ABLATIONS = [(unit, "identity") for unit in specs.UNITS] + [
    ("original", shortcut) for shortcut in specs.SHORTCUTS[1:]
]


@pytest.mark.parametrize("unit, shortcut", ABLATIONS)
def test_each_ablation_trains_one_step(unit, shortcut):
    model = small("preact-20", unit=unit, shortcut=shortcut)
    model.compile(optimizer=keras.optimizers.SGD(0.1), loss="sparse_categorical_crossentropy")
    rng = np.random.default_rng(2)
    x, y = rng.normal(size=(8, 32, 32, 3)).astype("float32"), rng.integers(0, 10, 8)
    before = [keras.ops.convert_to_numpy(w) for w in model.trainable_weights]
    history = model.fit(x, y, batch_size=8, epochs=1, verbose=0)
    assert np.isfinite(history.history["loss"][0])
    after = [keras.ops.convert_to_numpy(w) for w in model.trainable_weights]
    changed = [not np.array_equal(a, b) for a, b in zip(before, after)]
    assert all(changed), f"{changed.count(False)} weights did not train"


@pytest.mark.parametrize("name", ["resnet-110-exclusive-gating", "preact-20", "resnet-18-imagenet"])
def test_keras_file_round_trip(name, tmp_path):
    model = small(name)
    path = tmp_path / "model.keras"
    model.save(path)
    loaded = keras.saving.load_model(path)  # safe_mode stays on: pure Keras layers only
    x = np.random.default_rng(3).normal(size=(2, *model.input_shape[1:])).astype("float32")
    np.testing.assert_array_equal(
        keras.ops.convert_to_numpy(model(x, training=False)),
        keras.ops.convert_to_numpy(loaded(x, training=False)),
    )
    assert [layer.name for layer in loaded.layers] == [layer.name for layer in model.layers]


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"name": "preact-1010"}, "Did you mean ['preact-110', 'preact-1001'"),
        ({"name": "preact-110", "unit": "preact"}, "Valid units: ['original'"),
        ({"name": "preact-110", "shortcut": "gating"}, "Valid shortcuts: ['identity'"),
        ({"name": "preact-110", "depth": 111},
         "depth 6n+2 (n >= 1), e.g. [8, 20, 110]. Received: depth=111"),
        ({"name": "preact-164", "depth": 165}, "depth 9n+2"),
        ({"name": "preact-50-imagenet", "depth": 60}, "Valid depths: [50, 101, 152, 200]"),
        ({"name": "preact-110", "widht": 2}, "Unknown override(s) ['widht']"),
        ({"name": "preact-110", "units": (1, 1)}, "Received: units=(1, 1)"),
        ({"name": "preact-110", "pooling": "mean"}, "Valid poolings: [None, 'avg', 'max']"),
        ({"name": "preact-110", "input_shape": (32, 32)}, "Received: input_shape=(32, 32)"),
        ({"name": "preact-110", "depth": 20, "units": (3, 3, 3)}, "not both"),
        # Every field's type is checked where the spec is made (the reliability issue).
        ({"name": "preact-20", "classes": True}, "`classes` must be a positive integer. "
         "Received: classes=True"),
        ({"name": "preact-20", "classes": 2.0}, "Received: classes=2.0"),
        ({"name": "preact-20", "include_top": "no"}, "`include_top` must be True or False. "
         "Received: include_top='no'"),
        ({"name": "preact-20", "input_shape": (0, 0, 3)}, "Received: input_shape=(0, 0, 3)"),
        ({"name": "preact-20", "input_shape": (32, 32, 0)}, "Received: input_shape=(32, 32, 0)"),
        ({"name": "preact-20", "input_shape": "abc"}, "Received: input_shape='abc'"),
        ({"name": "preact-20", "input_shape": (32.0, 32, 3)},
         "Received: input_shape=(32.0, 32, 3)"),
        ({"name": "preact-20", "units": 5}, "Received: units=5"),
        ({"name": "preact-20", "units": (1, True, 1)}, "Received: units=(1, True, 1)"),
        ({"name": "preact-20", "dropout_rate": "a"}, "`dropout_rate` must be a number in [0, 1). "
         "Received: dropout_rate='a'"),
        ({"name": "preact-20", "dropout_rate": 1.0}, "Received: dropout_rate=1.0"),
        ({"name": "preact-20", "gate_bias": None}, "`gate_bias` must be a finite number. "
         "Received: gate_bias=None"),
        ({"name": "preact-20", "shortcut_scale": float("nan")}, "Received: shortcut_scale=nan"),
        ({"name": "preact-20", "residual_scale": "0.5"}, "Received: residual_scale='0.5'"),
        ({"name": "preact-20", "classifier_activation": "sofmax"},
         "`classifier_activation` must be None or the name of a Keras activation, e.g. "
         "'softmax'. Received: classifier_activation='sofmax'"),
        ({"name": "preact-20", "classifier_activation": 3}, "Received: classifier_activation=3"),
        ({"name": "preact-20", "unit": ["full-preact"]}, "Valid units: ['original'"),
    ],
)
def test_bad_input_is_a_clear_error(kwargs, message):
    with pytest.raises(ValueError) as info:
        keras_preact.build(**kwargs)
    assert message in str(info.value)


def test_load_model_round_trip_and_errors(tmp_path):
    model = keras_preact.build("resnet-164", depth=11)
    path = tmp_path / "m.keras"
    model.save(path)
    loaded = keras_preact.load_model(str(path), compile=False)
    assert [w.name for w in loaded.weights] == [w.name for w in model.weights]
    assert keras_preact.spec_of(loaded) == keras_preact.spec_of(model)
    x = np.random.default_rng(0).normal(size=(2, 32, 32, 3)).astype("float32")
    np.testing.assert_array_equal(loaded.predict(x, verbose=0), model.predict(x, verbose=0))
    with pytest.raises(FileNotFoundError, match="No .keras file at"):
        keras_preact.load_model(str(tmp_path / "missing.keras"))
    (tmp_path / "bad.keras").write_text("not a zip")
    with pytest.raises(ValueError, match="is not a .keras model file"):
        keras_preact.load_model(str(tmp_path / "bad.keras"))


def test_a_string_override_where_a_number_is_expected_is_a_cli_error(tmp_path, capsys):
    argv = ["train", "preact-20", "--output", str(tmp_path / "run"),
            "--override", 'dropout_rate="a"']
    assert cli.main(argv) == 2
    assert "`dropout_rate` must be a number in [0, 1). Received: dropout_rate='a'" in (
        capsys.readouterr().err)
    assert not (tmp_path / "run").exists()


def test_valid_specs_are_normalized():
    spec = keras_preact.resolve("preact-20", input_shape=[np.int64(40), None, 1],
                                units=[np.int32(1), 2, 3], dropout_rate=np.float32(0.25))
    assert spec.input_shape == (40, None, 1) and type(spec.input_shape[0]) is int
    assert spec.units == (1, 2, 3) and type(spec.units[0]) is int
    assert spec.dropout_rate == 0.25 and type(spec.dropout_rate) is float


def write_keras_file(path, config) -> str:
    """A `.keras` zip holding only `config.json`: what load_model reads before Keras does."""
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr("config.json", json.dumps(config))
    return str(path)


def test_load_model_bounds_the_layers_a_file_asks_for(tmp_path):
    """A small file must not make load_model raise Python's recursion limit to its liking
    (100k chained layers: 0.9 MB, 247 s and 2.5 GB before failing)."""
    limit = sys.getrecursionlimit()
    layer = {"class_name": "ReLU", "config": {}}
    flat = write_keras_file(tmp_path / "flat.keras",
                            {"class_name": "Functional", "config": {"layers": [layer] * 100_000}})
    with pytest.raises(ValueError) as info:
        keras_preact.load_model(flat)
    assert str(info.value) == (
        f"{flat!r} asks for a graph of 100000 layers; load_model builds at most "
        f"max_layers={keras_preact.MAX_LAYERS} (pass a larger max_layers for a trusted file).")
    # Layers of nested models count too.
    inner = {"class_name": "Functional", "config": {"layers": [layer] * keras_preact.MAX_LAYERS}}
    nested = write_keras_file(tmp_path / "nested.keras",
                              {"class_name": "Functional", "config": {"layers": [inner]}})
    with pytest.raises(ValueError, match=f"{keras_preact.MAX_LAYERS + 1} layers"):
        keras_preact.load_model(nested)
    assert api._count_layers(  # malformed nested configs count as no layers
        {"config": {"layers": [{"config": {"layers": 5}}, {"config": "x"}, 7]}}, "odd.keras") == 3
    assert sys.getrecursionlimit() == limit
    # The size of config.json is bounded too, before it is read (a small zip can inflate to
    # much more): preact-20's is 72 kB, about 1 kB per layer.
    net = keras_preact.build("preact-20")
    real = tmp_path / "real.keras"  # the plain graph, as a run dir keeps it
    keras.Model(net.inputs, net.outputs, name=net.name).save(real)
    too_big = (r"real.keras' holds a config.json of \d+ bytes; "
               r"load_model reads at most 20480 for max_layers=10")
    with pytest.raises(ValueError, match=too_big):
        keras_preact.load_model(str(real), max_layers=10)
    assert keras_preact.load_model(str(real), max_layers=80).name == "preact-20"
    # A network's own file holds its spec: it asks for the layers that spec bounds.
    own = tmp_path / "own.keras"
    net.save(own)
    with pytest.raises(ValueError, match=r"own.keras' asks for a graph of 160 layers"):
        keras_preact.load_model(str(own), max_layers=80)


@pytest.mark.parametrize("config", [[1, 2], "model", {"config": [1]}, {"config": {"layers": 3}}])
def test_load_model_refuses_a_config_of_the_wrong_shape(config, tmp_path):
    path = write_keras_file(tmp_path / "odd.keras", config)
    with pytest.raises(ValueError, match=r"is not a .keras model file \(config.json"):
        keras_preact.load_model(path)


def test_load_model_refuses_deeply_nested_json(tmp_path):
    path = tmp_path / "nested.keras"
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr("config.json", "[" * 100_000)
    with pytest.raises(ValueError, match="is not a .keras model file"):
        keras_preact.load_model(str(path))


def test_max_layers_bounds_every_registered_network():
    # resnet-1202, the largest registered net, has 4208 layers (len(model.layers)); the
    # bound is layer_bound's 8 layers per weighted layer, which the tightest unit reaches.
    assert keras_preact.MAX_LAYERS == max(
        graph.layer_bound(keras_preact.get_spec(n)) for n in ALL) == 8 * 1202
    # One-conv units with a gated shortcut reach the bound, up to the stem and head's slack.
    tightest = keras_preact.resolve("resnet-20", units=(6, 6, 6), block="single",
                                    shortcut="exclusive-gating")
    assert 0 <= graph.layer_bound(tightest) - len(network.build_from_spec(tightest).layers) <= 16
    for unit in specs.UNITS:
        spec = keras_preact.resolve("resnet-20", units=(2, 1, 1), block="single", unit=unit,
                                    shortcut="exclusive-gating")
        assert len(network.build_from_spec(spec).layers) <= graph.layer_bound(spec)


@pytest.mark.parametrize("backend", ["torch", "jax"])
def test_builders_run_on_other_keras_backends(backend, tmp_path):
    """The builders use only `keras.*`: the same net, with the same weights, gives the same
    outputs on another backend (CI installs JAX: the `jax` extra; PyTorch is not installed)."""
    pytest.importorskip(backend)
    model = keras_preact.build("resnet-110-exclusive-gating", units=(2, 1, 1))
    images = np.random.default_rng(0).uniform(-1, 1, (2, 32, 32, 3)).astype("float32")
    model.save_weights(tmp_path / "net.weights.h5")
    np.save(tmp_path / "images.npy", images)
    code = (
        "import keras, keras_preact, numpy as np, sys\n"
        f"assert keras.backend.backend() == {backend!r}\n"
        "m = keras_preact.build('resnet-110-exclusive-gating', units=(2, 1, 1))\n"
        "m.load_weights(sys.argv[1] + '/net.weights.h5')\n"
        "out = m(np.load(sys.argv[1] + '/images.npy'), training=False)\n"
        "np.save(sys.argv[1] + '/out.npy', keras.ops.convert_to_numpy(out))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code, str(tmp_path)],
        env={**os.environ, "KERAS_BACKEND": backend},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    other = np.load(tmp_path / "out.npy")
    assert other.shape == (2, 10)
    np.testing.assert_allclose(other, model(images, training=False).numpy(), atol=2e-5)


def test_mixed_precision_keeps_the_classifier_in_float32():
    previous = keras.config.dtype_policy()
    keras.config.set_dtype_policy("mixed_bfloat16")
    try:
        model = keras_preact.build("preact-20", depth=8)
    finally:
        keras.config.set_dtype_policy(previous)
    assert model.get_layer("stage1_unit001_conv1").compute_dtype == "bfloat16"
    assert model.get_layer("stage1_unit001_bn1").gamma.dtype == "float32"
    y = model(np.ones((2, 32, 32, 3), "float32"))
    assert y.dtype == "float32"
    np.testing.assert_allclose(keras.ops.convert_to_numpy(y).sum(axis=1), 1.0, rtol=1e-6)
