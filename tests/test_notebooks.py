"""The notebooks run end to end (nbclient, kernel "python3") with small settings.

Each notebook gets one extra cell at the end that prints, as JSON, the numbers the
notebook computed; the test checks those, and that every figure was displayed.
"""

from __future__ import annotations

import json
import pathlib

import nbformat
import pytest
from nbclient import NotebookClient

NOTEBOOKS = pathlib.Path(__file__).resolve().parents[1] / "notebooks"


def execute(name: str, check_source: str, tmp_path) -> tuple[nbformat.NotebookNode, dict]:
    nb = nbformat.read(NOTEBOOKS / name, as_version=4)
    assert all(not c.get("outputs") for c in nb.cells if c.cell_type == "code"), (
        "commit notebooks with outputs cleared"
    )
    nb.cells.append(nbformat.v4.new_code_cell(check_source))
    # ipykernel provides the "python3" kernelspec from its package data, and jupyter_client
    # launches it with sys.executable: the kernel runs in this very environment.
    NotebookClient(nb, kernel_name="python3", timeout=600,
                   resources={"metadata": {"path": str(tmp_path)}}).execute()
    return nb, json.loads(nb.cells[-1].outputs[-1]["text"])


def shown_images(nb) -> int:
    return sum("image/png" in out.get("data", {}) for c in nb.cells if c.cell_type == "code"
               for out in c.outputs)


@pytest.fixture
def small_settings(monkeypatch, tmp_path, cifar10_data_dir):
    monkeypatch.setenv("TFDS_DATA_DIR", cifar10_data_dir)
    monkeypatch.setenv("KERAS_PREACT_WORKDIR", str(tmp_path / "work"))
    monkeypatch.setenv("KERAS_PREACT_STEPS", "20")
    monkeypatch.setenv("KERAS_PREACT_BATCH", "32")
    monkeypatch.setenv("KERAS_PREACT_VAL_EXAMPLES", "64")
    monkeypatch.setenv("TF_CPP_MIN_LOG_LEVEL", "3")
    return tmp_path


def test_quickstart(small_settings):
    check = """import json, numpy as np
from keras_preact.plotting import read_metrics
m = read_metrics(RUN_DIR)
print(json.dumps({"params": model.count_params(), "steps": m["step"].tolist(),
                  "val_accuracy": m["val_accuracy"].tolist(),
                  "test": [test_accuracy, len(labels), record.test_accuracy],
                  "label": names[label],
                  "labels": [s.decode() for s in outputs["labels"][0].numpy()],
                  "scores": outputs["scores"][0].numpy().tolist(),
                  "keras_top5": np.argsort(net.predict(preprocess_input(image[None]),
                                                       verbose=0)[0])[::-1][:5].tolist(),
                  "served_top5": outputs["classes"][0].numpy().tolist()}))"""
    nb, got = execute("quickstart.ipynb", check, small_settings)
    assert 10.3e6 < got["params"] < 10.6e6  # preact-1001, incl. BN moving statistics
    assert got["steps"] == [2.0 * k for k in range(1, 11)]  # 20 steps, logged every 2
    # ten logged epochs, each scored on the 64 held-out images
    assert len(got["val_accuracy"]) == 10
    assert all(abs(64 * a - round(64 * a)) < 1e-4 for a in got["val_accuracy"])
    accuracy, examples, recorded = got["test"]  # the published preact-20, not the short run
    assert examples == 10000 and accuracy == pytest.approx(recorded, abs=0.003)
    assert len(got["labels"]) == 5 and len(set(got["labels"])) == 5
    assert got["labels"][0] == got["label"]  # the served network classifies it right
    assert got["scores"] == sorted(got["scores"], reverse=True) and sum(got["scores"]) <= 1.0001
    assert got["served_top5"] == got["keras_top5"]  # the SavedModel serves the trained model
    assert shown_images(nb) == 2  # training curves, prediction next to the image


def test_identity_mappings(small_settings, monkeypatch):
    monkeypatch.setenv("KERAS_PREACT_SIGNAL_DEPTH", "20")
    monkeypatch.setenv("KERAS_PREACT_SIGNAL_BATCH", "4")
    monkeypatch.setenv("KERAS_PREACT_TRAIN_DEPTH", "8")
    check = """import json
from keras_preact.plotting import read_metrics
print(json.dumps({"units": {k: v["direct"].tolist() for k, v in units.items()},
                  "shortcuts": {k: v["direct"].tolist() for k, v in shortcuts.items()},
                  "runs": {k: read_metrics(d)["step"].tolist() for k, d in run_dirs.items()}}))"""
    nb, got = execute("identity_mappings.ipynb", check, small_settings)
    assert sorted(got["units"]) == sorted(
        ["original", "bn-after-add", "relu-before-add", "relu-only-preact", "full-preact"])
    assert len(got["shortcuts"]) == 7
    assert all(len(d) == 9 for d in got["units"].values())  # depth 20: 3 units per stage
    assert min(got["units"]["full-preact"]) > 0.8
    assert got["shortcuts"]["constant-scaling"][1] < 0.75  # 0.5 expected, 2 units from the end
    assert got["runs"] == {"original": [2.0 * k for k in range(1, 11)],
                           "pre-activation": [2.0 * k for k in range(1, 11)]}
    assert shown_images(nb) == 3  # two signal-propagation figures, the training curves


def test_fine_tune(small_settings, monkeypatch):
    monkeypatch.setenv("KERAS_PREACT_PER_CLASS", "100")  # 300 training images, 60 test images
    monkeypatch.setenv("KERAS_PREACT_STEPS", "60")
    check = """import json
from keras_preact import rundir
config = rundir.read_config(RUN_DIR)
test_labels = [s.decode() for s in serve(images=tf.constant(np.stack([
    np.array(PIL.Image.open(os.path.join(TEST_DIR, c, f"{i:04d}.png")))
    for c in CLASSES for i in range(20)])))["labels"][:, 0].numpy()]
print(json.dumps({"class_names": config["class_names"], "weights": config["weights"],
                  "steps": int(tuned.optimizer.iterations), "evaluated": result,
                  "label": outputs["labels"][0][0].numpy().decode(), "true": true_class,
                  "served": test_labels}))"""
    nb, got = execute("fine_tune.ipynb", check, small_settings)
    assert got["class_names"] == ["cat", "frog", "ship"] and got["weights"] == "cifar10"
    assert got["steps"] == 60 and got["evaluated"]["examples"] == 60
    assert got["evaluated"]["accuracy"] > 0.7, got["evaluated"]  # chance: 1/3
    # The served model answers with the folder names, and mostly the right one.
    assert set(got["served"]) <= {"cat", "frog", "ship"}
    truth = [c for c in ("cat", "frog", "ship") for _ in range(20)]
    assert sum(s == t for s, t in zip(got["served"], truth)) >= 0.7 * len(truth)
    assert got["true"] == "ship" and got["label"] in got["class_names"]
    assert shown_images(nb) == 1  # the served prediction next to the image


def test_the_notebook_extra_installs_what_the_readme_calls():
    """`pip install -e ".[notebooks]"` then `jupyter lab` / `jupyter nbconvert` worked only
    where Jupyter happened to be installed: each subcommand the README runs comes from a
    distribution the extra requires."""
    import importlib.metadata
    import re

    readme = (NOTEBOOKS.parent / "README.md").read_text()
    section = readme.split("## Notebooks")[1].split("\n## ")[0]
    assert 'pip install -e ".[notebooks]"' in section
    provides = {"lab": "jupyterlab", "nbconvert": "nbconvert"}  # jupyter's subcommands
    called = set(re.findall(r"\bjupyter (\w+)", section))
    assert called == set(provides)
    extra = {re.match(r"[\w-]+", r)[0] for r in importlib.metadata.requires("keras-preact")
             if 'extra == "notebooks"' in r}
    assert {provides[c] for c in called} | {"ipykernel"} <= extra


def test_a_data_dir_that_does_not_exist_is_one_line_not_a_download(small_settings,
                                                                   monkeypatch):
    """The README's relative TFDS_DATA_DIR, read by a kernel running in notebooks/, started
    a 207 s download into the clone; now the first data cell names the path and stops."""
    from nbclient.exceptions import CellExecutionError

    monkeypatch.setenv("TFDS_DATA_DIR", "../shared/tensorflow_datasets")
    with pytest.raises(CellExecutionError) as error:
        execute("fine_tune.ipynb", "", small_settings)
    assert ("The data dir '../shared/tensorflow_datasets' does not exist (from "
            f"{small_settings}: pass an absolute path)") in str(error.value)
    assert sorted(p.name for p in small_settings.iterdir()) == []  # nothing downloaded
