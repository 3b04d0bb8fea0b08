"""A model's facts come back from the model itself (`keras_preact.introspect`), and the modules
depend on each other one way."""

import ast
import dataclasses
import graphlib
import json
import pathlib

import keras
import pytest

import keras_preact
from keras_preact import scan
from keras_preact.introspect import ModelFacts, config_spec, model_facts

# Two units per CIFAR stage (units 2..n keep their dimensions: that is where the shortcut
# variants sit); ImageNet nets small and at 64x64.
SMALL = {"cifar": {"units": (2, 2, 2)},
         "imagenet": {"units": (1, 2, 1, 1), "input_shape": (64, 64, 3)}}


def architecture(spec) -> dict:
    """The fields that make the network (not the paper's result, if the spec has one)."""
    return {k: v for k, v in dataclasses.asdict(spec).items() if k != "paper_result"}


@pytest.mark.parametrize("name", keras_preact.list_models())
def test_every_registered_net_gives_back_its_spec(name):
    overrides = SMALL[keras_preact.get_spec(name).family]
    expected = architecture(keras_preact.resolve(name, **overrides))
    model = keras_preact.build(name, **overrides)
    facts = model_facts(model)
    assert architecture(facts.spec) == expected
    assert (facts.family, facts.head) == (expected["family"], "probabilities")
    assert architecture(config_spec(json.loads(model.to_json()))) == expected
    if scan.scannable(facts.spec) and keras.backend.backend() == "tensorflow":
        fast = keras_preact.build(name, stages="scan", **overrides)
        assert scan.is_scanned(fast) and architecture(model_facts(fast).spec) == expected


@pytest.mark.parametrize("overrides, head", [
    ({"include_top": False, "pooling": "avg"}, "features"),
    ({"include_top": False, "pooling": "max"}, "features"),
    ({"include_top": False}, "features"),
    ({"classifier_activation": None, "classes": 7}, "logits"),
    ({"classifier_activation": "sigmoid", "input_shape": (None, None, 1)}, "sigmoid"),
    ({"shortcut": "constant-scaling", "shortcut_scale": 0.25, "residual_scale": 0.5},
     "probabilities"),
    ({"shortcut": "dropout", "dropout_rate": 0.3}, "probabilities"),
    ({"shortcut": "shortcut-only-gating", "gate_bias": -2.0}, "probabilities"),
    # One unit per stage: stage 1's first unit keeps its dimensions, so its 1x1 conv
    # shortcut is the variant's, not a projection.
    ({"units": (1, 1, 1), "shortcut": "conv1x1"}, "probabilities"),
])
def test_overrides_and_heads_are_read_back(overrides, head):
    overrides = {"units": (2, 2, 2), **overrides}
    expected = keras_preact.resolve("resnet-20", **overrides)
    facts = model_facts(keras_preact.build("resnet-20", **overrides))
    assert architecture(facts.spec) == architecture(expected)
    assert facts.head == head


def test_other_models_have_no_spec():
    dense = keras.Sequential([keras.Input((4,)), keras.layers.Dense(2)])
    assert model_facts(dense) == ModelFacts(family="cifar", head="logits", spec=None)
    net = keras_preact.build("preact-20", depth=8)
    wrapped = keras.Sequential([net, keras.layers.Softmax()])
    assert (model_facts(wrapped).spec, model_facts(wrapped).head) == (None, "probabilities")
    features = keras_preact.feature_extractor(net)  # three outputs: no head kind to tell
    assert model_facts(features).head is None
    assert config_spec({"config": "anything"}) is None
    assert config_spec({"config": {"layers": [{"name": "stem_conv", "config": {}}]}}) is None


# --- One-way dependencies between the package's modules (module-level imports).

PACKAGE = pathlib.Path(keras_preact.__file__).parent


def module_graph() -> dict[str, set[str]]:
    """`{module: the package modules it imports at module level}`. A package's `__init__`,
    which Python runs before any of its modules, is not counted as their dependency."""
    paths = {}
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        paths[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    graph = {}
    for name, path in paths.items():
        imported = set()
        for node in ast.parse(path.read_text()).body:
            if isinstance(node, ast.Import):
                imported |= {alias.name for alias in node.names if alias.name in paths}
            elif isinstance(node, ast.ImportFrom) and node.module in paths:
                imported |= {f"{node.module}.{alias.name}" if f"{node.module}.{alias.name}"
                             in paths else node.module for alias in node.names}
        graph[name] = imported - {name}
    return graph


def test_module_imports_have_no_cycle():
    graph = module_graph()
    assert graph["keras_preact.scan.convert"] >= {"keras_preact.builder"}
    graphlib.TopologicalSorter(graph).prepare()  # CycleError names the cycle


def test_the_builder_does_not_depend_on_model_surgery():
    graph = module_graph()
    seen, todo = set(), ["keras_preact.builder"]
    while todo:
        for module in graph[todo.pop()] - seen:
            seen.add(module)
            todo.append(module)
    assert "keras_preact.scanned_units" in seen
    assert not {m for m in seen if m.startswith("keras_preact.scan.") or m == "keras_preact.scan"}
