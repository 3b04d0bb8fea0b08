"""The examples in the public docstrings run and print what they say."""

import doctest
import importlib
import pathlib
import re

import pytest

import keras_preact
from keras_preact import cli

MODULES = ["keras_preact", "keras_preact.api", "keras_preact.specs", "keras_preact.labels",
           "keras_preact.preprocessing", "keras_preact.applications", "keras_preact.builder",
           "keras_preact.export", "keras_preact.scan", "keras_preact.training.trainer",
           "keras_preact.optim", "keras_preact.files",
           "keras_preact.training.config", "keras_preact.rundir", "keras_preact.training.net",
           "keras_preact.datasets",
           "keras_preact.export.runtimes", "keras_preact.paper", "keras_preact.network",
           "keras_preact.scanned_units", "keras_preact.scan.convert", "keras_preact.weights",
           "keras_preact.pretrained", "keras_preact.host", "keras_preact.convert"]
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
