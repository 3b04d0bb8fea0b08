"""A model's facts, read off the model: the spec `keras_preact.build` made it from, its family
and what its head outputs (`model_facts`).

The one reader of the layer names the builder writes, for a model and for the config.json of
a `.keras` file alike, so models stay plain Keras: nothing is stored on them.

Example:
>>> import keras_preact
>>> facts = model_facts(keras_preact.build("resnet-110-exclusive-gating", depth=14))
>>> facts.spec.shortcut, facts.spec.gate_bias, facts.spec.units, facts.family, facts.head
('exclusive-gating', -6.0, (2, 2, 2), 'cifar', 'probabilities')
"""

from __future__ import annotations

import collections
import dataclasses
import re

import keras

from keras_preact.blocks import DESIGNS
from keras_preact.preprocessing import FAMILY_PREPROCESSING, Preprocessing
from keras_preact.specs import CONVS_PER_UNIT, ResNetSpec

# Layer names: `stage{s}_unit{uuu}_{role}` for the layers of a unit (roles: `bn1`, `conv2`,
# `add`, `out_relu`, `shortcut_conv`, ...), `stage{s}_scan` for the loop running a scanned
# stage's units 2..n, `final_{op}` after the last stage, `stem_pool` in ImageNet stems.
UNIT_PREFIX = re.compile(r"stage(\d+)_unit(\d{3})_")
SCAN_LAYER = re.compile(r"stage(\d+)_scan")
FINAL_PREFIX = "final_"


def unit_prefix(stage: int, unit: int) -> str:
    return f"stage{stage}_unit{unit:03d}"


def scan_layer(stage: int) -> str:
    return f"stage{stage}_scan"


def stage_of(name: str) -> int | None:
    """The stage whose layer `name` is (`stage{s}_unit{uuu}_*`, `stage{s}_scan`), else None."""
    match = UNIT_PREFIX.match(name) or SCAN_LAYER.fullmatch(name)
    return int(match.group(1)) if match else None


def unit_output(spec: ResNetSpec, stage: int, unit: int) -> str:
    """The layer giving a unit's output: its last op after the addition (Fig. 4 a-b), else
    the addition itself."""
    post = DESIGNS[spec.unit]["post"]
    return f"{unit_prefix(stage, unit)}_{'out_' + post[-1] if post else 'add'}"


# What a model's output holds, by the name of the activation (or the class) of the operation
# that produces it. log_softmax gives shifted logits: softmax and cross-entropy treat them as such.
OUTPUT_KINDS = {
    "linear": "logits",
    "log_softmax": "logits",
    "logsoftmax": "logits",
    "softmax": "probabilities",
    "sigmoid": "sigmoid",
}


@dataclasses.dataclass(frozen=True)
class ModelFacts:
    """What `model_facts` reads off a model."""

    family: str  # "imagenet" for the 7x7/2 + max-pool stem (layer `stem_pool`), else "cifar"
    head: str | None  # `output_kind`; None for several outputs or no graph (it says why)
    spec: ResNetSpec | None  # the spec of keras_preact.build's net; None for other models


def model_facts(model: keras.Model) -> ModelFacts:
    """The family, head kind and spec of `model`, either form (plain or scanned stages).

    The spec is the one whose network has `model`'s layer names and the settings its layers
    hold (scales, gate bias, dropout rate, head); how the layers are wired is not compared:
    `keras_preact.scan` does that where it matters. Any model is accepted; `spec` is None
    for one `keras_preact.build` did not make.

    Example:
    >>> import keras_preact
    >>> model_facts(keras_preact.build("preact-164", depth=11, include_top=False)).spec.block
    'bottleneck'
    """
    try:
        head = output_kind(model)
    except ValueError:
        head = None
    names = {layer.name for layer in model.layers}
    spec = _read_spec(names, lambda name: model.get_layer(name).get_config(),
                      lambda: model.input_shape[1:])
    return ModelFacts(_family(names), head, spec)


def config_spec(config: dict) -> ResNetSpec | None:
    """`model_facts(model).spec` of the model a `.keras` file's config.json describes,
    without building it; None for any other config."""
    try:  # the file's config may hold anything
        layers = {entry["name"]: entry for entry in config["config"]["layers"]}
    except (KeyError, TypeError):
        return None
    return _read_spec(set(layers), lambda name: layers[name]["config"],
                      lambda: layers["images"]["config"]["batch_shape"][1:])


def family_of(model: keras.Model) -> str:
    """`model_facts(model).family`: "cifar" or "imagenet" (the datasets it fits)."""
    return model_facts(model).family


def preprocessing_of(model: keras.Model) -> Preprocessing:
    """The normalization and evaluation geometry `model` takes: its spec's
    (`pretrained.preprocessing_for`: a `-timm` net takes timm's), else its family's. The one
    answer for evaluation, SavedModel signatures and ONNX/LiteRT/OpenVINO exports.

    Example:
    >>> import keras_preact
    >>> preprocessing_of(keras_preact.build("preact-18-imagenet-timm", input_shape=(64, 64, 3)))
    Preprocessing(stats='inception', size=224, crop_pct=0.9, interpolation='bicubic')
    """
    from keras_preact.pretrained import preprocessing_for

    facts = model_facts(model)
    return (FAMILY_PREPROCESSING[facts.family] if facts.spec is None
            else preprocessing_for(facts.spec))


def _family(names: set[str]) -> str:
    return "imagenet" if "stem_pool" in names else "cifar"


def _read_spec(names: set[str], config_of, input_shape) -> ResNetSpec | None:
    """The spec of the net with layer `names`; `config_of(name)` gives a layer's config,
    `input_shape()` the input's shape without the batch axis."""
    try:
        return ResNetSpec(**_spec_fields(names, config_of, tuple(input_shape())))
    except (KeyError, TypeError, ValueError, AttributeError, IndexError):
        return None  # not a network of keras_preact.build


def _spec_fields(names: set[str], config_of, input_shape: tuple) -> dict:
    """The `ResNetSpec` fields `_read_spec` reads; KeyError & co. where a layer is missing."""
    roles = collections.defaultdict(set)  # (stage, unit) -> roles of its layers
    for name in names:
        match = UNIT_PREFIX.match(name)
        if match:
            roles[int(match.group(1)), int(match.group(2))].add(name[match.end():])
    units = {}
    for stage, unit in roles:
        units[stage] = max(units.get(stage, 0), unit)
    for stage in units:
        if scan_layer(stage) in names:  # units 2..n in one loop
            units[stage] += config_of(scan_layer(stage))["units"]
    convs = sum(f"conv{k}" in roles[1, 1] for k in (1, 2, 3))
    fields = {"family": _family(names), "input_shape": input_shape,
              "block": {n: block for block, n in CONVS_PER_UNIT.items()}[convs],
              "units": tuple(units[s] for s in range(1, len(units) + 1)),
              "unit": _design(roles[2, 1], names, convs),
              # `keras_preact.blocks`: symmetric padding adds `*_pad` layers to strided convs,
              # the timm stem has no BN-ReLU.
              "padding": "symmetric" if "stem_pool_subsample" in names else "same"}
    if fields["family"] == "imagenet" and "stem_bn" not in names:
        fields["stem"] = "conv-pool"

    first = {}  # role -> the first unit that has a layer of it
    for unit in sorted(roles):
        for role in roles[unit]:
            first.setdefault(role, unit)

    def config(role: str) -> dict:
        return config_of(f"{unit_prefix(*first[role])}_{role}")

    # Shortcut variants sit on the units that keep their dimensions: units 2..n, and the
    # first unit of stage 1 if the stem has its output channels.
    stem_kept = config_of("stem_conv")["filters"] == config(f"conv{convs}")["filters"]
    kept = {(s, u) for s, u in roles if u > 1 or (s == 1 and stem_kept)}
    if "shortcut_scale" in first:
        fields.update(shortcut="constant-scaling", shortcut_scale=config("shortcut_scale")["scale"],
                      residual_scale=config("residual_scale")["scale"]
                      if "residual_scale" in first else 1.0)
    elif "gate" in first:
        fields.update(shortcut="exclusive-gating" if "residual_gated" in first
                      else "shortcut-only-gating",
                      gate_bias=config("gate")["bias_initializer"]["config"]["value"])
    elif "shortcut_dropout" in first:
        fields.update(shortcut="dropout", dropout_rate=config("shortcut_dropout")["rate"])
    elif any("shortcut_conv" in roles[unit] for unit in kept):
        fields["shortcut"] = "conv1x1"

    if "predictions" in names:
        head = config_of("predictions")
        fields.update(classes=head["units"], classifier_activation=None
                      if head["activation"] == "linear" else head["activation"])
    else:
        fields.update(include_top=False, pooling="avg" if "avg_pool" in names
                      else "max" if "max_pool" in names else None)
    return fields


def _design(roles: set[str], names: set[str], convs: int) -> str:
    """The Fig. 4 design whose unit has the BN/ReLU layers of `roles` (a unit with
    pre-activation: not ImageNet's first) and whose net ends with the `final_*` layers of
    `names`: a pre-activation design repeats its `pre` ops there."""
    ops = collections.Counter(role.rstrip("0123456789") for role in roles
                              if role[-1].isdigit() or role.startswith("out_"))
    final = tuple(op for op in ("bn", "relu") if FINAL_PREFIX + op in names)
    for unit, design in DESIGNS.items():
        branch = design["pre"] + ("conv",) + (design["mid"] + ("conv",)) * (convs - 1)
        expected = branch + design["end"] + tuple("out_" + op for op in design["post"])
        if final == design["pre"] and ops == collections.Counter(expected):
            return unit
    raise ValueError(f"No unit design has the layers {sorted(roles)}.")


def _output_operation(model: keras.Model):
    """The layer or op producing `model`'s one output (a Sequential's last layer)."""
    if isinstance(model, keras.Sequential) and model.layers:
        return model.layers[-1]
    outputs = getattr(model, "outputs", None)
    if not outputs:
        raise ValueError(
            "Cannot tell what a model without a functional graph outputs (subclassed or "
            f"unbuilt). Received: {type(model).__name__} {model.name!r}."
        )
    if len(outputs) != 1:
        raise ValueError(
            f"Expected a model with one output. Received {len(outputs)} outputs: "
            f"{[tuple(t.shape) for t in outputs]}."
        )
    return outputs[0]._keras_history.operation


def output_kind(model: keras.Model) -> str:
    """What `model`'s one output holds: "logits", "probabilities" (softmax), "sigmoid"
    (independent per-class probabilities) or "features" (anything else, e.g. the pooled
    features of `include_top=False`).

    Decided by the layer or op that produces the output (its activation, a Softmax layer or
    op; nested models are followed): the one rule for losses, evaluation, analysis and export.
    Raises ValueError for a model with several outputs or without a functional graph.

    Example:
    >>> import keras, keras_preact
    >>> logits = keras_preact.build("preact-20", depth=8, classifier_activation=None)
    >>> output_kind(logits), output_kind(keras.Sequential([logits, keras.layers.Softmax()]))
    ('logits', 'probabilities')
    """
    operation = _output_operation(model)
    if isinstance(operation, keras.Model):
        return output_kind(operation)
    activation = getattr(operation, "activation", None)
    name = getattr(activation, "__name__", None) or type(operation).__name__.lower()
    return OUTPUT_KINDS.get(name, "features")


def outputs_logits(model: keras.Model) -> bool:
    """Whether a softmax classifier outputs logits (True) or probabilities (False): what a
    categorical cross-entropy needs to know. Any other output (`output_kind`) is refused."""
    kind = output_kind(model)
    if kind not in ("logits", "probabilities"):
        raise ValueError(
            "A categorical cross-entropy needs a classifier that outputs logits or softmax "
            f"probabilities. Received: a model whose output is {kind} ({model.name!r})."
        )
    return kind == "logits"
