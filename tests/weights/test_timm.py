"""keras_preact.weights.timm: timm's ResNetV2 and the converted Keras model compute the same.

The references are timm's own modules, built locally with random weights (timm's
checkpoints cannot be downloaded offline); BN statistics and scales are randomized, negative
scales included, so that every tensor matters. Needs the `convert` extra (torch, timm).
"""

import dataclasses
import os

import numpy as np
import pytest

import keras_preact
from keras_preact import preprocessing
from keras_preact.weights import records
from keras_preact.weights import timm as timm_weights

TOLERANCE = 1e-4
# Two images at 64x64: every stage runs (the last at 2x2) in a second or two per net.
IMAGES = np.random.default_rng(0).normal(size=(2, 64, 64, 3)).astype("float32")


# The torch library declaring torchvision's missing ops must outlive the import (`timm`).
_TORCHVISION_SCHEMAS = []


@pytest.fixture(scope="module")
def timm():
    """timm, imported beside the CPU build of torch.

    PyPI's torchvision wheels (which timm imports) are CUDA builds: beside the CPU torch their
    C++ ops do not load, and torchvision 0.28 then fails at import registering fake kernels
    for two of the missing ops (its other registrations check first). Declaring those two
    schemas, without any kernel, lets it import; ResNetV2 uses no torchvision op.
    """
    torch = pytest.importorskip("torch")
    try:
        import torchvision  # noqa: F401
    except RuntimeError:  # "operator torchvision::nms does not exist"
        library = torch.library.Library("torchvision", "DEF")
        for op in ("nms", "qnms"):
            library.define(f"{op}(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")
        _TORCHVISION_SCHEMAS.append(library)
    return pytest.importorskip("timm")


def random_timm(timm, arch: str, seed: int = 0):
    """timm's `arch` in eval mode with random BN statistics and scales (negative included)
    and a random classifier bias; convs keep timm's random init."""
    import torch

    torch.manual_seed(seed)
    model = timm.create_model(arch, pretrained=False).eval()
    with torch.no_grad():
        for module in model.modules():
            if isinstance(module, torch.nn.BatchNorm2d):
                channels = module.num_features
                module.weight.uniform_(-1.5, 1.5)
                module.bias.normal_(0.0, 0.5)
                module.running_mean.normal_(0.0, 0.5)
                module.running_var.uniform_(0.5, 2.0)
                assert (module.weight < 0).any() and channels > 1
        model.head.fc.bias.normal_(0.0, 1.0)
    return model


def state_dict(model) -> dict:
    return {key: value.numpy() for key, value in model.state_dict().items()}


def timm_logits(model, images: np.ndarray) -> np.ndarray:
    import torch

    with torch.no_grad():
        return model(torch.from_numpy(images.transpose(0, 3, 1, 2))).numpy()


@pytest.mark.parametrize("arch", sorted(timm_weights.ARCHS))
def test_converted_model_computes_what_timm_computes(timm, arch):
    reference = random_timm(timm, arch)
    model = timm_weights.from_timm(state_dict(reference), arch, input_shape=(None, None, 3),
                              classifier_activation=None)
    expected = timm_logits(reference, IMAGES)
    actual = model.predict(IMAGES, verbose=0)
    assert expected.shape == actual.shape == (2, 1000)
    assert np.abs(expected).max() > 1.0  # the comparison is not between near-zeros
    print(f"{arch}: max |keras - timm| = {np.abs(actual - expected).max():.2e}")
    np.testing.assert_allclose(actual, expected, rtol=0, atol=TOLERANCE)
    # Same parameters: the registered network is timm's, tensor for tensor.
    trainable = sum(int(np.prod(w.shape)) for w in model.trainable_weights)
    assert trainable == sum(p.numel() for p in reference.parameters())


def test_include_preprocessing_takes_raw_pixels_as_timm_s_normalization_does(tensors18):
    """The one head override besides the classifier's activation: a weightless first layer
    with timm's statistics (Inception's 0.5 / 0.5), the checkpoint's tensors unchanged."""
    from keras_preact import applications

    raw = np.random.default_rng(3).integers(0, 256, (2, 64, 64, 3), dtype=np.uint8)
    baked = timm_weights.from_timm(tensors18, "resnetv2_18", input_shape=(64, 64, 3),
                                   include_preprocessing=True, classifier_activation=None)
    plain = timm_weights.from_timm(tensors18, "resnetv2_18", input_shape=(64, 64, 3),
                                   classifier_activation=None)
    expected = plain.predict(np.asarray(applications.preprocess_input(raw, "inception")),
                             verbose=0)
    np.testing.assert_allclose(baked.predict(raw, verbose=0), expected, rtol=0, atol=1e-4)
    assert baked.count_params() == plain.count_params()


def test_the_paper_s_padding_would_compute_something_else(timm):
    """Why the timm variant is registered apart: the same tensors in a net with TensorFlow's
    SAME padding give other logits (and the paper's stem has no place for them at all)."""
    from keras_preact.arch.network import build_from_spec
    from keras_preact.arch.specs import resolve

    reference = random_timm(timm, "resnetv2_18")
    name = timm_weights.model_name("resnetv2_18")
    same = build_from_spec(resolve(name, padding="same", classifier_activation=None,
                                   input_shape=(64, 64, 3)))
    timm_weights.assign(same, state_dict(reference))
    assert np.abs(same.predict(IMAGES, verbose=0) - timm_logits(reference, IMAGES)).max() > 0.1
    paper = build_from_spec(resolve(name, stem="paper"))
    with pytest.raises(ValueError, match="'stem_bn' has no counterpart"):
        timm_weights.assign(paper, state_dict(reference))


def test_odd_image_sizes_pad_as_pytorch_does(timm):
    """Strided convs and the stem's max-pool on odd sizes (57 -> 29 -> 15 -> 8 -> 4 -> 2)."""
    reference = random_timm(timm, "resnetv2_18", seed=1)
    model = timm_weights.from_timm(state_dict(reference), "resnetv2_18",
                              input_shape=(57, 57, 3), classifier_activation=None)
    images = IMAGES[:1, :57, :57]
    np.testing.assert_allclose(model.predict(images, verbose=0), timm_logits(reference, images),
                               rtol=0, atol=TOLERANCE)


def test_a_safetensors_file_converts_like_its_dict(timm, tmp_path):
    from safetensors.numpy import save_file

    tensors = state_dict(random_timm(timm, "resnetv2_18", seed=2))
    path = os.path.join(tmp_path, "model.safetensors")
    save_file(tensors, path)
    from_file = timm_weights.from_timm(path, "resnetv2_18")
    from_dict = timm_weights.from_timm(tensors, "resnetv2_18")
    for a, b in zip(from_file.weights, from_dict.weights):
        np.testing.assert_array_equal(a.numpy(), b.numpy())
    with open(path, "r+b") as f:  # a download cut short
        f.truncate(os.path.getsize(path) // 2)
    with pytest.raises(ValueError, match="Could not read .*model.safetensors"):
        timm_weights.from_timm(path, "resnetv2_18")


@pytest.fixture(scope="module")
def tensors18(timm):
    return state_dict(random_timm(timm, "resnetv2_18"))


@pytest.mark.parametrize("change, message", [
    (lambda t: t.pop("stages.1.blocks.0.downsample.conv.weight"),
     r"^The checkpoint lacks tensor 'stages.1.blocks.0.downsample.conv.weight' \(for layer "
     r"'stage2_unit001_shortcut_conv'\)\.$"),
    (lambda t: t.update({"head.fc.weight": np.zeros((10, 512, 1, 1), "float32")}),
     r"^Tensor 'head.fc.weight' has shape \(10, 512, 1, 1\); layer 'predictions' needs "
     r"\(1000, 512, 1, 1\)\.$"),
    (lambda t: t.update({"stem.norm.weight": np.ones(64, "float32")}),
     r"^The checkpoint has 1 tensor\(s\) this network does not use, e.g. 'stem.norm.weight'"),
])
def test_a_checkpoint_that_does_not_fit_is_a_one_line_error(tensors18, change, message):
    tensors = dict(tensors18)
    change(tensors)
    with pytest.raises(ValueError, match=message) as error:
        timm_weights.from_timm(tensors, "resnetv2_18")
    assert "\n" not in str(error.value)


def test_a_deeper_checkpoint_for_a_shallower_arch_is_refused(tensors18):
    with pytest.raises(ValueError, match="lacks tensor 'stages.0.blocks.2.norm1.weight'"):
        timm_weights.from_timm(tensors18, "resnetv2_34")


def test_bad_arguments_are_refused():
    with pytest.raises(ValueError, match=r"Unknown timm architecture 'resnetv2_152'\. Valid"):
        timm_weights.from_timm({}, "resnetv2_152")
    with pytest.raises(ValueError, match=r"Received: \['stem'\]"):
        timm_weights.from_timm({}, "resnetv2_18", stem="paper")
    with pytest.raises(ValueError, match="Received: a list"):
        timm_weights.from_timm([], "resnetv2_18")


# --- The `imagenet` tags: download (file:// URLs here), verify, convert once, cache.

@pytest.fixture
def source18(timm, tmp_path):
    """A random resnetv2_18 written as timm's model.safetensors, and the model."""
    from safetensors.numpy import save_file

    reference = random_timm(timm, "resnetv2_18", seed=3)
    path = tmp_path / "model.safetensors"
    save_file(state_dict(reference), str(path))
    return path, reference


@pytest.fixture
def tag18(monkeypatch, tmp_path, source18):
    """Registers preact-18-imagenet-timm's `imagenet` record with `source18` as its URL and
    hash, into a private Keras cache; `tag18(**changes)` changes the record."""
    monkeypatch.setenv("KERAS_HOME", str(tmp_path / "keras_home"))
    key = ("preact-18-imagenet-timm", "imagenet")
    path = source18[0]

    def register(**changes):
        record = dataclasses.replace(records._RECORDS[key], url=f"file://{path}",
                                     sha256=records.sha256_of(path))
        monkeypatch.setitem(records._RECORDS, key, dataclasses.replace(record, **changes))
        return tmp_path / "keras_home" / records.CACHE_SUBDIR

    return register


def test_the_tag_downloads_converts_once_and_computes_what_timm_computes(tag18, source18):
    cache = tag18()
    path, reference = source18
    model = keras_preact.build("preact-18-imagenet-timm", weights="imagenet",
                               input_shape=(64, 64, 3), classifier_activation=None)
    np.testing.assert_allclose(model.predict(IMAGES, verbose=0), timm_logits(reference, IMAGES),
                               rtol=0, atol=TOLERANCE)
    record = records.released("preact-18-imagenet-timm")["imagenet"]
    assert sorted(os.listdir(cache)) == sorted([record.file, record.file + ".sha256",
                                                record.source_file])
    converted = cache / record.file
    assert (cache / (record.file + ".sha256")).read_text() == (
        f"{records.sha256_of(converted)}  {record.file}\n"
        f"{records.sha256_of(path)}  {record.source_file}\n")
    os.remove(path)  # the cached conversion is used: no download
    assert records.weights_file(*record_key(record)) == str(converted)
    with open(converted, "r+b") as f:  # damaged in the cache: converted again from the source
        f.truncate(1000)
    assert records.sha256_of(records.weights_file(*record_key(record))) != (
        records.sha256_of(cache / record.source_file))
    np.testing.assert_allclose(
        keras_preact.build("preact-18-imagenet-timm", weights="imagenet",
                           input_shape=(64, 64, 3), classifier_activation=None
                           ).predict(IMAGES, verbose=0),
        timm_logits(reference, IMAGES), rtol=0, atol=TOLERANCE)


def record_key(record) -> tuple[str, str]:
    return record.model, record.tag


def test_a_source_without_its_hash_is_refused_and_nothing_stays_cached(tag18):
    cache = tag18(sha256="0" * 64)
    with pytest.raises(ValueError, match=r"does not have the published SHA-256 0{64} of weights "
                                         r"'imagenet' of 'preact-18-imagenet-timm'; nothing"):
        keras_preact.build("preact-18-imagenet-timm", weights="imagenet")
    assert os.listdir(cache) == []


def test_a_truncated_source_fails_its_hash_or_its_reading(tag18, source18):
    path, _ = source18
    cache = tag18()  # the hash of the whole file
    with open(path, "r+b") as f:
        f.truncate(os.path.getsize(path) // 2)
    with pytest.raises(ValueError, match="does not have the published SHA-256"):
        keras_preact.build("preact-18-imagenet-timm", weights="imagenet")
    tag18(sha256=None)  # a hash not known yet: the file cannot be read, and is not kept
    with pytest.raises(ValueError, match=r"Could not read .*\.safetensors' as a float "
                                         "safetensors checkpoint"):
        keras_preact.build("preact-18-imagenet-timm", weights="imagenet")
    assert os.listdir(cache) == []


def test_a_source_whose_hash_is_not_known_yet_is_reported(tag18, source18):
    tag18(sha256=None)
    with pytest.warns(UserWarning, match="no published SHA-256 in keras_preact yet, so it was "
                                         f"not verified; .* {records.sha256_of(source18[0])}"):
        records.weights_file("preact-18-imagenet-timm", "imagenet")


def test_offline_the_error_names_the_url_and_where_to_put_the_file(tag18, tmp_path):
    cache = tag18(url=f"file://{tmp_path}/absent.safetensors")
    with pytest.raises(ConnectionError) as error:
        records.weights_file("preact-18-imagenet-timm", "imagenet")
    message = str(error.value)
    assert "\n" not in message
    assert message.startswith("Could not download weights 'imagenet' of "
                              f"'preact-18-imagenet-timm' from file://{tmp_path}/absent")
    assert message.endswith("Offline, download it elsewhere and put it at "
                            f"{cache}/preact-18-imagenet-timm-imagenet.safetensors.")


def test_the_records_fit_the_converter_and_the_source():
    converted = [r for r in records.all_records() if isinstance(r, records.ConvertedRecord)]
    assert sorted(r.arch for r in converted) == sorted(timm_weights.ARCHS)
    for r in converted:
        assert timm_weights.model_name(r.arch) == r.model and r.tag == "imagenet"
        assert r.url.startswith(f"https://huggingface.co/timm/{r.arch}.")
        assert r.url.endswith("/resolve/main/model.safetensors")
        # No hash is invented: each is None until someone downloads the file and records it.
        assert r.sha256 is None or len(r.sha256) == 64
        assert preprocessing.STATS[r.preprocessing.stats] == ((127.5,) * 3, (127.5,) * 3)
        # A record changes the geometry only: what include_preprocessing bakes in holds.
        default = preprocessing.default_preprocessing(keras_preact.get_spec(r.model))
        assert r.preprocessing.stats == default.stats


# --- Preprocessing follows the network: a -timm net takes its source's everywhere.

@pytest.mark.parametrize("name, expected", [
    ("preact-18-imagenet-timm", ("inception", 0.9, "bicubic")),
    ("preact-101-imagenet-timm", ("inception", 0.95, "bicubic")),
    ("preact-50-imagenet", ("imagenet", 224 / 256, "bilinear")),
    ("preact-20", ("cifar", None, "bilinear")),
])
def test_a_net_takes_the_preprocessing_of_its_weights(name, expected):
    """Read off the built model (as evaluate and export do), whatever its head and size."""
    from keras_preact.api import preprocessing_of

    spec = keras_preact.get_spec(name)
    overrides = {"units": (1,) * len(spec.units)} if spec.family == "cifar" else {}
    model = keras_preact.build(name, include_top=False, input_shape=(48, 48, 3), **overrides)
    got = preprocessing_of(model)
    assert (got.stats, got.crop_pct, got.interpolation) == expected
    if name.endswith("-timm"):
        assert got == records.released(name)["imagenet"].preprocessing


def test_evaluate_uses_the_timm_geometry_and_statistics(tmp_path):
    """`evaluate` of a -timm net on a folder of odd-sized images: the loss of the model on
    the images as timm evaluates them (shorter side to 64 / 0.9, bicubic, centre crop,
    mean = std = 127.5), not as fb.resnet.torch does."""
    import keras
    import PIL.Image

    from keras_preact import training

    rng = np.random.default_rng(1)
    images = [rng.integers(0, 256, shape, dtype=np.uint8) for shape in
              ((90, 71, 3), (64, 100, 3), (80, 80, 3), (77, 65, 3))]
    for i, image in enumerate(images):
        os.makedirs(tmp_path / f"class{i % 2}", exist_ok=True)
        PIL.Image.fromarray(image).save(tmp_path / f"class{i % 2}" / f"{i}.png")
    model = keras_preact.build("preact-18-imagenet-timm", input_shape=(64, 64, 3), classes=2)
    result = training.evaluate(model, dataset=str(tmp_path), batch_size=4)

    def loss(way):  # mean cross-entropy of the model on the images prepared `way`
        batch = np.stack([preprocessing.resize_for_eval(x, way, 64) for x in images])
        probs = model(preprocessing.preprocess_input(batch, way.stats), training=False)
        labels = np.arange(len(images)) % 2
        return float(np.mean(keras.losses.sparse_categorical_crossentropy(labels, probs)))

    timm = preprocessing.Preprocessing("inception", size=224, crop_pct=0.9,
                                       interpolation="bicubic")
    assert result["examples"] == 4
    assert result["loss"] == pytest.approx(loss(timm), abs=1e-5)
    assert abs(result["loss"] - loss(preprocessing.FAMILY_PREPROCESSING["imagenet"])) > 1e-3


def test_the_constructor_builds_the_network_the_tag_was_trained_as(tag18, source18):
    """`PreActResNet18(weights="imagenet")` is preact-18-imagenet-timm with timm's weights:
    it classifies an image as timm's model does."""
    from keras_preact import applications

    tag18()
    _, reference = source18
    image = np.random.default_rng(2).integers(0, 256, (1, 64, 64, 3), dtype=np.uint8)
    x = np.asarray(applications.preprocess_input(image, "inception"))
    model = applications.PreActResNet18(weights="imagenet", input_shape=(64, 64, 3),
                                        classifier_activation=None)
    assert model.name == "preact-18-imagenet-timm"
    got, expected = model.predict(x, verbose=0), timm_logits(reference, x)
    np.testing.assert_allclose(got, expected, rtol=0, atol=TOLERANCE)
    assert got.argmax() == expected.argmax()
    # Without the tag, the paper's network; a tag of neither is refused as before.
    assert applications.PreActResNet18(input_shape=(64, 64, 3)).name == "preact-18-imagenet"
    with pytest.raises(ValueError, match="Unknown weights 'cifar10' for 'preact-18-imagenet'"):
        applications.PreActResNet18(weights="cifar10")
    assert 'PreActResNet18(weights="imagenet")' in applications.PreActResNet18.__doc__
