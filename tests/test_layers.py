"""The package's modules depend one way, from the bottom: helpers <- arch <- the paper's
facts and class names <- data <- weights <- the zoo's API <- training <- export <- cli. Every
import is read, at module level and inside functions alike."""

import ast
import graphlib
import pathlib

import pytest

import keras_preact

PACKAGE = pathlib.Path(keras_preact.__file__).parent
# Layers from the bottom; a module is in the layer one of whose prefixes it has (a new
# module must be placed here).
LAYERS = [("helpers", ("keras_preact.files", "keras_preact.host", "keras_preact.preprocessing",
                       "keras_preact.rundir")),
          ("arch", ("keras_preact.arch",)),
          ("facts", ("keras_preact.paper", "keras_preact.labels", "keras_preact.optim")),
          ("data", ("keras_preact.data",)),
          ("weights", ("keras_preact.weights",)),
          ("zoo", ("keras_preact.api", "keras_preact.applications", "keras_preact.analysis",
                   "keras_preact.plotting")),
          ("training", ("keras_preact.training",)),
          ("export", ("keras_preact.export",)),
          ("cli", ("keras_preact.cli", "keras_preact.commands"))]
MAX_LINES = 400


def layer(module: str) -> int:
    if module == "keras_preact":  # the package's lazy API: the zoo's
        return layer("keras_preact.api")
    for rank, (_, prefixes) in enumerate(LAYERS):
        if any(module == p or module.startswith(p + ".") for p in prefixes):
            return rank
    raise AssertionError(f"{module} is in no layer of tests/test_layers.py: place it")


def modules() -> dict[str, pathlib.Path]:
    paths = {}
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        paths[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return paths


def imports() -> dict[str, set[str]]:
    """`{module: the package modules it imports anywhere in its code}`. A package's
    `__init__`, which Python runs before any of its modules, is not counted as their
    dependency."""
    paths = modules()
    graph = {}
    for name, path in paths.items():
        imported = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                imported |= {alias.name for alias in node.names if alias.name in paths}
            elif isinstance(node, ast.ImportFrom) and node.module in paths:
                imported |= {f"{node.module}.{alias.name}" if f"{node.module}.{alias.name}"
                              in paths else node.module for alias in node.names}
        graph[name] = {m for m in imported if not name.startswith(m + ".")} - {name}
    return graph


def test_no_import_points_up_a_layer():
    graph = imports()
    assert graph["keras_preact.export.runtimes"] >= {"keras_preact.files"}  # the reader reads
    upward = sorted(f"{module} -> {target}" for module, targets in graph.items()
                    for target in targets if layer(target) > layer(module))
    assert upward == []


def test_module_imports_have_no_cycle():
    graphlib.TopologicalSorter(imports()).prepare()  # CycleError names the cycle


def test_the_builder_does_not_depend_on_model_surgery():
    graph = imports()
    seen, todo = set(), ["keras_preact.arch.graph"]
    while todo:
        for module in graph[todo.pop()] - seen:
            seen.add(module)
            todo.append(module)
    assert "keras_preact.arch.scanned_units" in seen
    assert not {m for m in seen if m.startswith("keras_preact.arch.scan")
                and m != "keras_preact.arch.scanned_units"}


@pytest.mark.parametrize("module", sorted(modules()))
def test_modules_stay_small(module):
    lines = len(modules()[module].read_text().splitlines())
    assert lines <= MAX_LINES, f"{module} has {lines} lines"
