"""The examples in the public docstrings run and print what they say."""

import doctest
import importlib
import pathlib
import re

import pytest

import keras_preact
from keras_preact import cli

MODULES = ["keras_preact", "keras_preact.api", "keras_preact.arch.specs", "keras_preact.labels",
           "keras_preact.preprocessing", "keras_preact.applications", "keras_preact.arch.graph",
           "keras_preact.export", "keras_preact.arch.scan", "keras_preact.training.trainer",
           "keras_preact.training.plan", "keras_preact.data.sources",
           "keras_preact.optim", "keras_preact.files",
           "keras_preact.training.config", "keras_preact.rundir", "keras_preact.training.net",
           "keras_preact.data.catalog",
           "keras_preact.export.runtimes", "keras_preact.paper", "keras_preact.arch.network",
           "keras_preact.arch.scanned_units", "keras_preact.weights.storage",
           "keras_preact.weights.records", "keras_preact.host", "keras_preact.weights.timm",
           "keras_preact.training.distribute", "keras_preact.data.arrays"]
ROOT = pathlib.Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples(name):
    result = doctest.testmod(importlib.import_module(name), optionflags=doctest.ELLIPSIS)
    assert result.attempted > 0
    assert result.failed == 0


def test_ci_runs_the_readmes_test_command():
    readme = (ROOT / "README.md").read_text()
    (command,) = re.findall(r"python -m pytest [^\n`]*tests", readme.split("## Models")[0])
    ci = [line.split("#")[0].strip() for line in (ROOT / ".ci" / "run").read_text().splitlines()]
    assert command in ci and f"`{command}`" in readme  # the Tests section names it too
    # and installs what CI installs (the extras, and torch pinned to its CPU build)
    (install,) = re.findall(r"pip install (-e \S+ \S+) &&", readme)
    assert any(line.endswith(f"pip install -q {install}") for line in ci)


def test_readmes_models_table_is_what_list_prints(capsys):
    assert cli.main(["list", "--params", "--markdown"]) == 0
    table = capsys.readouterr().out
    readme = (ROOT / "README.md").read_text()
    # a header, a rule and a row per registered name
    assert table.count("\n") == 2 + len(keras_preact.list_models())
    assert table in readme.split("## Models")[1]


def test_the_docs_counts_of_preact_1001_are_the_builds():
    """The README and benchmarks/README.md quote the plain layer graph's size."""
    model = keras_preact.build("preact-1001")
    layers, variables = f"{len(model.layers):,} layers", f"{len(model.variables):,} variables"
    assert f"graph of {layers}" in (ROOT / "README.md").read_text()
    assert f"plain layers: {layers}, {variables}" in (ROOT / "benchmarks" / "README.md").read_text()


def test_the_readmes_parameter_counts_of_preact_1001_agree():
    """The table said 10.33M trainable, the Hardware section "10.2M" (the paper's),
    `count_params()` 10,476,922: the prose now names each count for what it is."""
    from keras_preact.arch.specs import param_counts

    counts = param_counts(keras_preact.get_spec("preact-1001"))
    readme = " ".join((ROOT / "README.md").read_text().split())
    row = f"| preact-1001 | cifar | 1001 | full-preact | identity | {counts.trainable / 1e6:.2f}M |"
    assert row in readme
    assert (f"({counts.trainable / 1e6:.2f}M trainable parameters, the paper's \"10.2M\"; "
            f"`count_params()` says {sum(counts):,} with the {counts.non_trainable:,} BN moving "
            "statistics;") in readme


def test_an_untrained_net_in_inference_mode_grows_with_depth_as_the_readme_says():
    """A newcomer's smoke test, `build("preact-1001")` in inference mode, returns NaN: the
    README says why (BN's initial moving statistics do not normalize), measured here at
    depth 110: features of 1e6 to 1e8 in inference mode (seeds 0-4), of order 1 with batch
    statistics."""
    import keras
    import numpy as np

    from keras_preact.preprocessing import preprocess_input

    keras.utils.set_random_seed(0)  # 2.7e6 then; the README gives the range of five seeds
    images = np.random.default_rng(0).integers(0, 256, (4, 32, 32, 3), dtype="uint8")
    features = keras_preact.build("preact-110", stages="scan", include_top=False, pooling="avg")
    inference = np.abs(features(preprocess_input(images), training=False).numpy()).max()
    batch_stats = np.abs(features(preprocess_input(images), training=True).numpy()).max()
    assert 1e6 < inference < 1e8 and batch_stats < 1, (inference, batch_stats)
    readme = " ".join((ROOT / "README.md").read_text().split())
    assert "preact-110's final features reach 1e6 to 1e8" in readme
