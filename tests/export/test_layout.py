"""BASE/NAME/VERSION layout: versions, no overwrite, no partial version after a crash or a
SIGKILL, model loading from files and run dirs, and the `keras-preact export` command."""

from __future__ import annotations

import json
import os
import pathlib
import re
import resource
import signal
import subprocess
import sys
import textwrap
import time

import pytest

import keras_preact
from keras_preact import cli
from keras_preact.export import export_model, layout
from keras_preact.export.loading import serving_form


@pytest.fixture(scope="module")
def model():
    return keras_preact.build("preact-20", depth=8)


@pytest.fixture(scope="module")
def run_dir(model, tmp_path_factory):
    """A trainer-shaped run dir: model.keras + config.json."""
    path = tmp_path_factory.mktemp("run")
    model.save(path / "model.keras")
    (path / "config.json").write_text(json.dumps({"model": "preact-20", "dataset": "cifar10"}))
    return path


def listing(model_dir) -> list[str]:
    return sorted(os.listdir(model_dir))


def test_versions_increment_and_are_never_overwritten(model, tmp_path):
    first = export_model(model, tmp_path, name="m")
    second = export_model(model, tmp_path, name="m")
    assert (first, second) == (str(tmp_path / "m" / "1"), str(tmp_path / "m" / "2"))
    assert sorted(os.listdir(second)) == [
        "assets", "assets.extra", "fingerprint.pb", "saved_model.pb", "variables",
    ]
    before = os.stat(tmp_path / "m" / "1" / "saved_model.pb").st_mtime_ns
    with pytest.raises(FileExistsError, match="Version 1 .* already exists"):
        export_model(model, tmp_path, name="m", version=1)
    assert os.stat(tmp_path / "m" / "1" / "saved_model.pb").st_mtime_ns == before
    assert export_model(model, tmp_path, name="m", version=7).endswith(os.sep + "7")
    assert export_model(model, tmp_path, name="m").endswith(os.sep + "8")
    assert listing(tmp_path / "m") == ["1", "2", "7", "8"]  # no temporary dir left


@pytest.mark.parametrize("version", [0, -3, "2", True, layout.MAX_VERSION + 1, 10**20])
def test_bad_version_rejected(model, tmp_path, version):
    with pytest.raises(ValueError, match=f"positive integer up to {layout.MAX_VERSION}"):
        export_model(model, tmp_path, version=version)
    assert listing(tmp_path) == []


def test_versions_are_what_tf_serving_parses(model, tmp_path):
    """TF Serving reads every all-digit entry (files too) as an int64 version and skips
    larger numbers; automatic versions follow the same rule."""
    model_dir = tmp_path / "m"
    model_dir.mkdir()
    (model_dir / "1").write_text("stray file")
    (model_dir / "99999999999999999999").mkdir()  # beyond int64: never loaded
    (model_dir / "\u00b2").mkdir()  # a digit to str.isdigit(), not to int()
    (model_dir / "007").mkdir()
    assert layout.existing_versions(str(model_dir)) == [1, 7]
    assert export_model(model, tmp_path, name="m") == str(model_dir / "8")
    with pytest.raises(FileExistsError, match="Version 7 "):  # "007" is version 7
        export_model(model, tmp_path, name="m", version=7)
    with pytest.raises(FileExistsError, match="Version 1 "):
        export_model(model, tmp_path, name="m", version=1)

    last = export_model(model, tmp_path, name="m", version=layout.MAX_VERSION)
    assert last == str(model_dir / str(layout.MAX_VERSION))
    with pytest.raises(ValueError, match="No version number left"):
        export_model(model, tmp_path, name="m")


def test_cli_refuses_versions_beyond_int64(run_dir, tmp_path, capsys):
    base = tmp_path / "base"
    argv = ["export", str(run_dir), "--base", str(base), "--version", "99999999999999999999"]
    assert cli.main(argv) == 2
    assert "`version` must be a positive integer up to 9223372036854775807" in (
        capsys.readouterr().err
    )
    assert not base.exists()


@pytest.mark.parametrize(
    "name", ["", "a/b", "../m", ".hidden", "a:b", "a b", "m\n", "modèle", None, 3]
)
def test_invalid_model_names_are_refused(model, tmp_path, name):
    with pytest.raises(ValueError, match="A model name must be letters, digits"):
        layout.check_name(name)
    if name is not None:  # None means "the default name"
        with pytest.raises(ValueError, match=re.escape(f"Received: name={name!r}")):
            export_model(model, tmp_path, name=name)
    assert listing(tmp_path) == []


def test_a_run_dir_whose_model_is_null_is_refused(run_dir, tmp_path):
    """It was exported as a model named "None"."""
    bad_run = tmp_path / "run"
    bad_run.mkdir()
    (bad_run / "model.keras").write_bytes((run_dir / "model.keras").read_bytes())
    (bad_run / "config.json").write_text('{"model": null}')
    with pytest.raises(ValueError, match='"model" entry of .*config.json must be a string'):
        export_model(bad_run, tmp_path / "base")
    assert not (tmp_path / "base").exists()


def test_crash_during_write_leaves_no_version(model, tmp_path, monkeypatch):
    def crash(*args):
        raise RuntimeError("disk full")

    monkeypatch.setattr("keras_preact.export.warmup.write_warmup", crash)
    with pytest.raises(RuntimeError, match="disk full"):
        export_model(model, tmp_path / "base", name="m")
    assert listing(tmp_path) == []  # the directories this export created are gone too
    (tmp_path / "m").mkdir()
    with pytest.raises(RuntimeError, match="disk full"):
        export_model(model, tmp_path, name="m")
    assert listing(tmp_path / "m") == []  # a model dir that was there is kept


KILLED_EXPORT = textwrap.dedent(
    """
    import sys, time
    import keras_preact
    from keras_preact.export import warmup

    def hang(version_dir, *args):  # the SavedModel is written; stop before the warm-up file
        open(sys.argv[2], "w").write(version_dir)
        time.sleep(600)

    warmup.write_warmup = hang
    from keras_preact.export import export_model
    export_model(keras_preact.build("preact-20", depth=8), sys.argv[1], name="m")
    """
)


def test_sigkill_midway_leaves_no_version_and_next_export_works(model, tmp_path):
    marker = tmp_path / "writing"
    child = subprocess.Popen(
        [sys.executable, "-c", KILLED_EXPORT, str(tmp_path / "base"), str(marker)],
        env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"},
    )
    try:
        deadline = time.monotonic() + 240
        while not marker.exists() and child.poll() is None and time.monotonic() < deadline:
            time.sleep(0.2)
        assert marker.exists(), "the exporter never reached the write"
        os.kill(child.pid, signal.SIGKILL)
        child.wait(timeout=30)
    finally:
        if child.poll() is None:
            os.kill(child.pid, signal.SIGKILL)
            child.wait()
    model_dir = tmp_path / "base" / "m"
    leftover = listing(model_dir)
    assert len(leftover) == 1 and leftover[0].startswith(".keras-preact-export.")
    assert not any(entry.isdigit() for entry in leftover)
    assert (model_dir / leftover[0] / "saved_model.pb").exists()  # it was mid-way

    assert export_model(model, tmp_path / "base", name="m") == str(model_dir / "1")
    assert listing(model_dir) == ["1"]  # the dead exporter's temporary dir is cleaned


def test_a_version_taken_by_a_concurrent_export_is_one_line(tmp_path):
    """Two exports of one --version at once: the second to finish says the version exists
    (it named the hidden temporary dir in an ENOTEMPTY error)."""
    model_dir = tmp_path / "m"

    def write(tmp_dir):  # the other export's rename lands while this one writes
        (model_dir / "3" / "variables").mkdir(parents=True)
        (pathlib.Path(tmp_dir) / "saved_model.pb").write_text("")

    with pytest.raises(FileExistsError, match=f"Version 3 of this model already exists in "
                                              f"{model_dir}; versions are never overwritten"):
        layout.publish_version(str(model_dir), 3, write)
    assert listing(model_dir) == ["3"] and listing(model_dir / "3") == ["variables"]


def test_cleanup_spares_live_and_foreign_temp_dirs(tmp_path):
    live = tmp_path / f".keras-preact-export.{layout.socket.gethostname()}.{os.getpid()}.abc_1"
    foreign = tmp_path / ".keras-preact-export.other-host.1.abc"
    user = tmp_path / ".keras-preact-export-notes"
    for path in (live, foreign, user):
        path.mkdir()
    assert layout.clean_stale_temp_dirs(str(tmp_path)) == []
    assert listing(tmp_path) == sorted(p.name for p in (live, foreign, user))


def test_exports_from_keras_file_and_run_dir(model, run_dir, tmp_path):
    from_file = export_model(run_dir / "model.keras", tmp_path / "a")
    assert from_file == str(tmp_path / "a" / model.name / "1")
    from_run = export_model(run_dir, tmp_path / "b", labels=[f"c{i}" for i in range(10)])
    assert from_run == str(tmp_path / "b" / run_dir.name / "1")  # the run's own name

    import numpy as np
    import tensorflow as tf

    out = tf.saved_model.load(from_run).signatures["serving_default"](
        images=tf.zeros((1, 32, 32, 3), tf.uint8)
    )
    expected = model(keras_preact.preprocessing.preprocess_input(np.zeros((1, 32, 32, 3))))
    np.testing.assert_allclose(out["probabilities"], expected, atol=1e-5)
    top = np.argsort(-expected.numpy()[0], kind="stable")[0]
    assert out["labels"].numpy()[0, 0].decode() == f"c{top}"


@pytest.mark.parametrize(
    "make, error, message",
    [
        (lambda p: p / "nowhere", FileNotFoundError,
         "No model at .*nowhere: expected a .keras file or a run dir."),
        (lambda p: (p / "empty").mkdir() or p / "empty", FileNotFoundError,
         "empty is not a run dir"),
        (lambda p: (p / "x.txt").write_text("x") and p / "x.txt", ValueError,
         r"x.txt' is not a .keras model file \(BadZipFile"),
        (lambda p: 42, ValueError, "Received: 42"),
    ],
)
def test_unknown_paths_are_named(tmp_path, make, error, message):
    with pytest.raises(error, match=message):
        export_model(make(tmp_path), tmp_path / "base")


def test_bad_config_and_labels(model, run_dir, tmp_path):
    bad_run = tmp_path / "run"
    bad_run.mkdir()
    (bad_run / "model.keras").write_bytes((run_dir / "model.keras").read_bytes())
    (bad_run / "config.json").write_text('{"dataset": "cifar10"}')
    with pytest.raises(ValueError, match='"model" entry'):
        export_model(bad_run, tmp_path)
    with pytest.raises(ValueError, match="10 strings, one per class. Received 3"):
        export_model(model, tmp_path, labels=["a", "b", "c"])


def test_cli_export_and_errors(run_dir, tmp_path, capsys):
    base = tmp_path / "base"
    assert cli.main(["export", str(run_dir), "--base", str(base), "--version", "3"]) == 0
    assert capsys.readouterr().out.strip() == str(base / run_dir.name / "3")
    assert os.path.exists(base / run_dir.name / "3" / "assets.extra" / "tf_serving_warmup_requests")

    assert cli.main(["export", str(run_dir), "--base", str(base), "--version", "3"]) == 2
    assert "keras-preact export: error: Version 3" in capsys.readouterr().err
    assert cli.main(["export", str(tmp_path / "missing"), "--base", str(base)]) == 2
    assert "missing" in capsys.readouterr().err
    assert listing(base / run_dir.name) == ["3"]


def test_a_run_dir_exports_under_its_own_name_and_never_takes_over_another(run_dir,
                                                                            tmp_path, capsys):
    """Issue 42: a fine-tune's run dir exported beside the published network it started from
    silently became that network's next version (and TF Serving's `latest`)."""
    base = tmp_path / "base"
    published = export_model(keras_preact.build("preact-20", depth=8), base, name="preact-20")
    with open(os.path.join(published, layout.LABELS_FILE)) as f:
        assert f.read().splitlines()[:2] == ["airplane", "automobile"]  # CIFAR-10's, in order
    mine = tmp_path / "mine"  # a fine-tune on a folder: its run recorded the folder's names
    mine.mkdir()
    (mine / "model.keras").write_bytes((run_dir / "model.keras").read_bytes())
    names = [f"c{i}" for i in range(10)]
    (mine / "config.json").write_text(json.dumps({"model": "preact-20", "dataset": "folder",
                                                  "class_names": names}))
    assert export_model(mine, base) == str(base / "mine" / "1")
    # under the published name, other classes are refused in one line, nothing written
    assert cli.main(["export", str(mine), "--base", str(base), "--name", "preact-20"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--new-labels" in err
    assert f"{base / 'preact-20'}: version 1 serves 10 classes (airplane, automobile, bird, " in err
    assert listing(base / "preact-20") == ["1"]
    with pytest.raises(ValueError, match=r"this model has 10 \(c0, c1, c2, c3, c4, \.\.\.\)"):
        export_model(mine, base, name="preact-20")
    # the same classes are a new version as before; other ones when asked for
    cifar = list(keras_preact.labels.class_names(10))
    assert export_model(mine, base, name="preact-20", labels=cifar).endswith(os.sep + "2")
    assert export_model(mine, base, name="preact-20", new_labels=True).endswith(os.sep + "3")
    assert layout.newest_labels(str(base / "preact-20")) == (3, names)


def test_versions_without_recorded_labels_are_not_compared(model, tmp_path):
    (tmp_path / "m" / "4").mkdir(parents=True)  # e.g. written by another tool
    assert layout.newest_labels(str(tmp_path / "m")) is None
    assert export_model(model, tmp_path, name="m", labels=list("abcdefghij")).endswith("5")


def test_a_run_dir_name_tf_serving_cannot_take_names_the_flag(run_dir, tmp_path):
    odd = tmp_path / "my run"
    odd.mkdir()
    for name in ("model.keras", "config.json"):
        (odd / name).write_bytes((run_dir / name).read_bytes())
    with pytest.raises(ValueError, match="'my run' cannot be a TF Serving model name .* --name"):
        export_model(odd, tmp_path / "base")
    assert export_model(odd, tmp_path / "base", name="mine").endswith(os.sep + "1")


def test_cli_names_a_base_that_is_not_a_directory(run_dir, tmp_path, capsys):
    base = tmp_path / "file"
    base.write_text("x")
    assert cli.main(["export", str(run_dir), "--base", str(base)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("keras-preact export: error: ") and err.count("\n") == 1
    assert f"{base} is a file, not a directory" in err
    assert listing(tmp_path) == ["file"]


def test_cli_reports_a_full_disk_in_one_line_and_leaves_nothing(run_dir, tmp_path):
    """A write that fails in TensorFlow's file system (here EFBIG under a 64 KiB file size
    limit, as ENOSPC would on a full disk) is one line naming the path, exit 2, no traces."""
    limit = 64 * 1024

    def limit_file_size():  # Python ignores SIGXFSZ: an oversized write fails with EFBIG
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    base = tmp_path / "base"
    result = subprocess.run(
        [sys.executable, "-m", "keras_preact.cli", "export", str(run_dir), "--base", str(base)],
        capture_output=True, text=True, timeout=300, preexec_fn=limit_file_size,
    )
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert lines[-1].startswith(f"keras-preact export: error: Cannot write the export in {base}")
    assert lines[-1].endswith("File too large")
    assert "Traceback" not in result.stderr
    assert not base.exists()


def test_full_preactivation_nets_are_served_with_scanned_stages(tmp_path):
    """serving_form: the loop form's SavedModel answers like the plain layer graph."""
    import numpy as np
    import tensorflow as tf

    from keras_preact import preprocessing
    from keras_preact.arch import scan

    plain = keras_preact.build("preact-20")  # 3 units per stage: 2 of them in each loop
    served_model = serving_form(plain)
    assert scan.is_scanned(served_model) and served_model.count_params() == plain.count_params()
    assert serving_form(served_model) is served_model
    original = keras_preact.build("resnet-20")
    assert serving_form(original) is original  # post-activation: exported as it is
    version = export_model(plain, str(tmp_path))
    images = np.random.default_rng(0).integers(0, 256, (3, 32, 32, 3), dtype=np.uint8)
    outputs = tf.saved_model.load(version).signatures["serving_default"](images=images)
    expected = plain(preprocessing.preprocess_input(images), training=False)
    np.testing.assert_allclose(outputs["probabilities"].numpy(), np.asarray(expected), atol=1e-5)
