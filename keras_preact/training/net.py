"""The network `train` fits: built in its form, frozen as asked, compiled with the paper's
optimizer (`build_and_compile`)."""

from __future__ import annotations

import dataclasses

from keras_preact.arch import scan
from keras_preact.arch.introspect import outputs_logits
from keras_preact.arch.network import build_from_spec
from keras_preact.arch.specs import ResNetSpec, resolve
from keras_preact.optim import SGDWithL2
from keras_preact.training import backend
from keras_preact.training.config import FREEZE, MIXED_PRECISION, TrainConfig, check_choice
from keras_preact.training.resume import resolve_stages


def build_and_compile(model: str, schedule, config: TrainConfig | None = None, *,
                      steps_per_execution: int = 1, spec: ResNetSpec | None = None, **fields):
    """The network `train` fits, compiled as `train` compiles it (call in a strategy scope):
    `config` (a `TrainConfig`, or its fields as keywords) gives the overrides, the form
    (`stages`, `recompute`), the optimizer's settings, `mixed_precision`, `jit_compile`, and
    `seed`, which (when set) fixes the initial weights (`keras.utils.set_random_seed`).
    `spec` is `model`'s with the overrides when the caller resolved it already (`train`'s
    plan), so that it is not resolved again.

    `SGDWithL2` on `schedule`, sparse cross-entropy, accuracy. `stages="scan"` runs each
    stage's identical units as one loop (`keras_preact.arch.scan`: much faster start-up and
    steps for deep full pre-activation nets), `recompute` trades compute for activation
    memory there. benchmarks/train_speed.py measures exactly this function.

    Example:
    >>> from keras_preact.optim import paper_schedule
    >>> net = build_and_compile("preact-20", paper_schedule(100, warmup_steps=0),
    ...                         overrides={"depth": 8})
    >>> type(net.optimizer).__name__
    'SGDWithL2'
    """
    import keras

    config = dataclasses.replace(config or TrainConfig(), **fields)
    spec = spec or resolve(model, **config.overrides)
    stages = resolve_stages(config.stages, spec)
    check_recompute(model, stages, config.recompute)
    if config.seed is not None:
        keras.utils.set_random_seed(config.seed)
    net = build_from_spec(spec, name=model, stages=stages,
                          dtype=MIXED_PRECISION[config.mixed_precision])
    # In mixed precision, keeping each BN + ReLU output for the backward pass is faster than
    # recomputing it, in memory that the lower precision saved; in float32 it would cost
    # memory for no measurable speed (benchmarks/README.md, "Precision").
    scan.set_options(net, recompute=config.recompute,
                     recompute_bn=not MIXED_PRECISION[config.mixed_precision])
    freeze(net, config.freeze)
    net.compile(
        optimizer=SGDWithL2(schedule, momentum=config.momentum, nesterov=config.nesterov,
                            l2=config.weight_decay),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=outputs_logits(net)),
        metrics=["accuracy"],
        jit_compile=backend.jit_compile(config.jit_compile),
        steps_per_execution=steps_per_execution,
    )
    return net


def freeze(model, what: str) -> None:
    """Keeps layers of `model` fixed (`TrainConfig.freeze`): "bn", its BatchNormalization
    layers (Keras then runs them in inference mode: their statistics stay too); "backbone",
    every layer but the classifier; "none", nothing. Plain layer graphs only (`plan._stages`)."""
    import keras

    from keras_preact.arch.graph import CLASSIFIER

    check_choice("freeze", what, FREEZE)
    for layer in model.layers:
        if what == "backbone" and layer.name != CLASSIFIER or (
                what == "bn" and isinstance(layer, keras.layers.BatchNormalization)):
            layer.trainable = False


def check_recompute(model: str, stages: str, recompute: bool) -> None:
    if recompute and stages != "scan":
        raise ValueError(f"`recompute` needs stages='scan' (full pre-activation nets). "
                         f"Received: model={model!r}, stages={stages!r}, recompute=True")

