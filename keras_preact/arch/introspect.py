"""What the builder's layer names and a model's output say: where a stage or unit is
(`unit_prefix`, `stage_of`: the names weights are saved by) and what the output holds
(`output_kind`). What a network *is* comes from the model itself
(`keras_preact.arch.network.spec_of`).
"""

from __future__ import annotations

import re

import keras

from keras_preact.arch.specs import DESIGNS, ResNetSpec

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
