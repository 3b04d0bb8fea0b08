"""Input pipelines: the paper's CIFAR augmentation, ImageNet crops, TFDS splits (mock data)."""

import json
import pathlib
import re
import shutil

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_datasets as tfds

from keras_preact.data import augment, pipeline, sources


def _probe_image():
    # Nonzero everywhere (zeros can only come from the padding); left half 200, right 100.
    image = np.full((32, 32, 3), 100, "uint8")
    image[:, :16] = 200
    return image


def test_cifar_augmentation_pads_crops_and_flips():
    image = _probe_image()
    outs = np.stack([augment.augment_cifar(image).numpy() for _ in range(200)])
    assert outs.shape == (200, 32, 32, 3) and outs.dtype == np.uint8
    assert set(np.unique(outs)) <= {0, 100, 200}
    zero_rows = (outs == 0).all(axis=(2, 3)).sum(axis=1)
    zero_cols = (outs == 0).all(axis=(1, 3)).sum(axis=1)
    # Crops shift the content by up to 4 pixels, exposing at most 4 rows/cols of padding.
    assert zero_rows.max() == 4 and zero_cols.max() == 4
    assert (zero_rows + zero_cols > 0).mean() > 0.8  # 80/81 offsets expose some padding
    assert ((outs == 0).sum(axis=(1, 2, 3)) == 0).sum() < 20
    # Flip: in an unflipped crop the bright half is on the left.
    content = np.where(outs == 0, np.nan, outs.astype(float))
    left, right = np.nanmean(content[:, :, :12], axis=(1, 2, 3)), np.nanmean(
        content[:, :, 20:], axis=(1, 2, 3))
    flipped = (left < right).mean()
    assert 0.3 < flipped < 0.7


def test_train_and_val_splits_carve_the_end_of_train():
    assert pipeline.train_val_splits(5000) == ("train[:-5000]", "train[-5000:]")
    assert pipeline.train_val_splits(0) == ("train", None)


def test_real_cifar10_split_sizes(cifar10_data_dir):
    assert sources.check_split("cifar10", "train[:-5000]", cifar10_data_dir) == 45000
    assert sources.check_split("cifar10", "test", cifar10_data_dir) == 10000


def test_keras_under_a_strategy_scores_every_held_out_image(cifar10_data_dir):
    # As the trainer validates: fit's evaluate inside a tf.distribute strategy. With TFDS'
    # auto-cache of CIFAR on, about half of these scored fewer than 64 images
    # (benchmarks/README.md, "Input pipeline").
    import keras

    with tf.distribute.OneDeviceStrategy("/cpu:0").scope():
        net = keras.Sequential([keras.Input((32, 32, 3)), keras.layers.Flatten(),
                                keras.layers.Dense(10)])
        accuracy = keras.metrics.SparseCategoricalAccuracy()
        net.compile(loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                    metrics=[accuracy])
    scored = []
    for _ in range(12):
        ds = pipeline.eval_dataset("cifar10", "train[-64:]", 32, cifar10_data_dir)
        for _ in range(2):  # each epoch's validation reads the same dataset again
            net.evaluate(ds, verbose=0)
            scored.append(int(accuracy.count.numpy()))
    assert scored == [64] * 24


def test_a_missing_split_names_the_available_ones(cifar10_data_dir, tmp_path):
    # A data dir of its own whose cifar10 has no test split: the real one's info, minus it.
    version = "cifar10/3.0.2"
    (tmp_path / version).mkdir(parents=True)
    for name in ("features.json", "label.labels.txt"):
        shutil.copy(f"{cifar10_data_dir}/{version}/{name}", tmp_path / version)
    info = json.loads(pathlib.Path(f"{cifar10_data_dir}/{version}/dataset_info.json").read_text())
    info["splits"] = [s for s in info["splits"] if s["name"] != "test"]
    (tmp_path / version / "dataset_info.json").write_text(json.dumps(info))
    with pytest.raises(ValueError, match="no split 'test'.*Available: \\['train'\\]"):
        sources.check_split("cifar10", "test", str(tmp_path))


@pytest.mark.parametrize("split, reason", [
    ("train[:abc]", r"Unrecognized split format: 'train\[:abc\]'\. See format at https://\S+"),
    ("train[:101%]", r"When unit=%, percent slice boundaries should be in \[-100, 100\]\..*"),
    ("train[10:5]", r"it holds -5 examples"),
])
def test_a_bad_split_is_one_line_that_names_it(cifar10_data_dir, split, reason):
    """TFDS' parse errors were two lines; an empty or reversed slice was evaluated."""
    with pytest.raises(ValueError) as error:
        sources.check_split("cifar10", split, cifar10_data_dir)
    prefix = (f"Bad split {split!r} of dataset 'cifar10' (TFDS slicing, e.g. 'train[:45000]', "
              "'train[-5000:]', 'test[:10%]'): ")
    message = str(error.value)
    assert message.startswith(prefix) and "\n" not in message, message
    assert re.fullmatch(reason, message[len(prefix):]), message


def test_cifar100_pipeline_batches_are_normalized():
    with tfds.testing.mock_data(num_examples=16):
        images, labels = next(iter(pipeline.train_dataset("cifar100", "train", 8)))
    assert images.shape == (8, 32, 32, 3) and images.dtype == tf.float32
    assert labels.shape == (8,)
    # (0 - 125.3) / 63.0 and (255 - 113.9) / 66.7 bound the normalized CIFAR values.
    assert float(tf.reduce_min(images)) >= -1.99 - 1e-3
    assert float(tf.reduce_max(images)) <= 2.12 + 1e-3
    assert float(tf.reduce_min(images)) < -1.5  # zero padding shows up as the lowest value


def test_imagenet_train_crops_and_eval_geometry():
    with tfds.testing.mock_data(num_examples=4):
        train_images, _ = next(iter(pipeline.train_dataset("imagenet2012", "train", 2,
                                                           image_size=64)))
        eval_images, eval_labels = next(iter(pipeline.eval_dataset("imagenet2012",
                                                                    "validation", 2)))
    assert train_images.shape == (2, 64, 64, 3)
    assert eval_images.shape == (2, 224, 224, 3) and eval_labels.shape == (2,)


def test_imagenet_scale_aspect_augmentation_keeps_size_and_range():
    image = tf.cast(tf.random.uniform((300, 400, 3), 0, 256, tf.int32), tf.uint8)
    outs = [augment.augment_imagenet(image, 96) for _ in range(5)]
    assert all(o.shape == (96, 96, 3) and o.dtype == tf.uint8 for o in outs)
    assert len({o.numpy().tobytes() for o in outs}) == 5  # random crops differ


def test_unknown_dataset_is_rejected():
    with pytest.raises(ValueError, match="Unknown dataset 'no_such_set'.*cifar10.*TFDS.*folder"):
        sources.dataset_info("no_such_set")


def test_a_failed_download_removes_only_what_it_created(monkeypatch, tmp_path):
    """TFDS fails after the host probe passed: its NAME/VERSION, downloads/NAME and
    extraction dirs go; what the data dir held before stays."""
    (tmp_path / "downloads" / "other").mkdir(parents=True)
    (tmp_path / "downloads" / "other" / "kept.tmp").write_text("a download of another dataset")
    (tmp_path / "mnist" / "1.0.0").mkdir(parents=True)  # another version, already there

    def fail(self, *args, **kwargs):
        (tmp_path / "mnist" / "3.0.1").mkdir()
        (tmp_path / "downloads" / "mnist").mkdir()
        (tmp_path / "downloads" / "mnist" / "t10k.gz.tmp.1").write_text("partial")
        (tmp_path / "downloads" / "extracted").mkdir()
        raise OSError("Connection reset by peer\nmore TFDS lines")

    monkeypatch.setattr(sources, "_probe", lambda urls, name: None)
    monkeypatch.setattr(tfds.core.DatasetBuilder, "download_and_prepare", fail)
    with pytest.raises(sources.DownloadFailed, match=r"^Could not download dataset 'mnist' "
                       r"\(OSError: Connection reset by peer\)\. Without network"):
        sources.check_split("mnist", "train", str(tmp_path), download=True)
    assert sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*")) == [
        "downloads", "downloads/other", "downloads/other/kept.tmp", "mnist", "mnist/1.0.0"]


def test_the_download_probe_asks_each_http_host_once_and_stops_at_an_unreachable_one(
        monkeypatch):
    import io
    import urllib.error
    import urllib.request

    asked = []

    def urlopen(request, timeout):
        asked.append((request.get_method(), request.full_url, timeout))
        if "b.example" in request.full_url:
            raise urllib.error.URLError(OSError("[Errno 101] Network is unreachable"))
        if "a.example" in request.full_url:  # an HTTP error is an answer: the host is there
            raise urllib.error.HTTPError(request.full_url, 405, "Method Not Allowed", {}, None)
        return io.BytesIO()

    monkeypatch.setattr(urllib.request, "urlopen", urlopen)
    urls = ["ftp://0.example/w.gz", "https://a.example/x.gz", "https://a.example/y.gz",
            "http://b.example/z.tgz", "https://c.example/v.zip"]
    with pytest.raises(sources.DownloadFailed, match=r"\(b\.example unreachable: \[Errno 101\] "):
        sources._probe(urls, "mnist")
    assert asked == [("HEAD", "https://a.example/x.gz", sources.PROBE_TIMEOUT_S),
                     ("HEAD", "http://b.example/z.tgz", sources.PROBE_TIMEOUT_S)]
