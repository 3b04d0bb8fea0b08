"""Signal propagation at initialization, per residual unit: the paper's Eq. 3-5, measured.

With identity shortcuts and nothing after the addition (full pre-activation), any deeper
unit is a shallower unit plus a sum of residuals (Eq. 4), `x_L = x_l + sum_i F(x_i)`, and the
gradient reaching a shallow unit contains the deep one unchanged (Eq. 5),
`dE/dx_l = dE/dx_L (1 + d/dx_l sum_i F)`. A scaled shortcut `lambda * x` turns that direct
term into `prod(lambda) dE/dx_L`, exponentially small in depth (the paper's Eq. 7-8).

`signal_propagation` runs one batch through a model as in the first training step (batch
statistics in BN, dropout active) and reports, per unit output `x_{l+1}`: its RMS
(`signal`), the RMS of `dE/dx_{l+1}` (`gradient`) and the `direct` share of the stage's
deepest gradient that reaches the unit, `<g_l, g_L> / <g_L, g_L>` with `g = dE/dx` and `L`
the stage's last unit (all units of a stage share its output shape). Eq. 5 predicts
`direct` ~ 1 for identity shortcuts; a shortcut scaled by `lambda` gives `lambda^(L-l)`.

What it shows at initialization (tests/test_analysis.py): full pre-activation keeps
`direct` ~ 1 and a smoothly growing signal; constant scaling (0.5) gives `direct` ~ 0.5^k
although the gradient's norm does not vanish (BN rescales the residual branch, so the
gradient still flows, but only through the weight layers). The dropout shortcut is the
paper's (Sec. 3.1, "a scale of lambda with an expectation of 0.5"): a 0/1 mask that keeps
each value with probability 1 - rate, not rescaled (`keras_preact.arch.blocks` undoes the
1/(1 - rate) of Keras' inverted dropout), so it too gives `direct` ~ (1 - rate)^k.
"""

from __future__ import annotations

import keras
import numpy as np

from keras_preact.api import load_for_inference
from keras_preact.arch import scan
from keras_preact.arch.introspect import outputs_logits, stage_of, unit_output, unit_prefix
from keras_preact.arch.network import ResNet
from keras_preact.weights.storage import in_form


def residual_units(model: keras.Model) -> list[tuple[str, str]]:
    """`(unit prefix, name of the layer giving the unit's output)` in network order.

    Units are those of the model's spec (`keras_preact.spec_of`); the output
    is the last of the unit's post-addition layers (`{prefix}_out_*`, Fig. 4 a-b) if any,
    else the addition itself (pre-activation designs).

    Example:
    >>> import keras_preact
    >>> residual_units(keras_preact.build("resnet-20"))[:1]
    [('stage1_unit001', 'stage1_unit001_out_relu')]
    """
    if scan.is_scanned(model):  # its units 2..n hide inside one loop layer per stage
        raise ValueError(f"Model {model.name!r} runs its stages as scanned loops; per-unit "
                         "analysis needs the layer graph: pass keras_preact.arch.scan.to_layered("
                         "model).")
    if not isinstance(model, ResNet):
        raise ValueError(
            f"Model {model.name!r} has no residual units: it is not a network of "
            "keras_preact.build. Build it with keras_preact.build()."
        )
    return [(unit_prefix(s, u), unit_output(model.spec, s, u))
            for s, n in enumerate(model.spec.units, start=1) for u in range(1, n + 1)]


def signal_propagation(
    model: keras.Model,
    images: np.ndarray | None = None,
    labels: np.ndarray | None = None,
    *,
    batch_size: int = 16,
    seed: int = 0,
) -> dict:
    """Forward signal and gradient per residual unit for one batch, as in a training step.

    BN uses batch statistics and dropout is active (the regime SGD sees); the model's
    variables (BN moving averages) are left as they were.

    Args:
        model: a classifier from `keras_preact.build` (softmax or logits output), or its
            `.keras` file or run dir (`keras_preact.api.load_for_inference`); a model with
            scanned stages is analysed in its layer form (`scan.to_layered`).
        images: normalized input batch; default: `batch_size` standard-normal images of the
            model's input shape (32x32 where the shape is unknown).
        labels: integer class labels; default: random labels.
        seed: seed of the default images and labels.

    Returns:
        "unit": the unit prefixes (list of str); arrays "stage" (int), "signal" (RMS of
        each unit output), "gradient" (RMS of dE/dx there, E = mean cross-entropy) and
        "direct" (see the module docstring).

    Example:
    >>> import keras_preact
    >>> stats = signal_propagation(keras_preact.build("preact-20"), batch_size=4)
    >>> stats["signal"].shape, list(stats["unit"][:2])
    ((9,), ['stage1_unit001', 'stage1_unit002'])
    """
    import tensorflow as tf  # eager tape over intermediate tensors

    model = in_form(load_for_inference(model), "layers")
    if len(model.outputs) != 1 or len(model.outputs[0].shape) != 2:
        raise ValueError(
            "`signal_propagation` needs a classifier with one (batch, classes) output. "
            f"Received outputs of shapes {[tuple(t.shape) for t in model.outputs]}."
        )
    rng = np.random.default_rng(seed)
    if images is None:
        shape = [d or 32 for d in model.inputs[0].shape[1:]]
        images = rng.standard_normal((batch_size, *shape)).astype("float32")
    if labels is None:
        labels = rng.integers(0, model.outputs[0].shape[-1], len(images))
    units = residual_units(model)
    watched = {output: None for _, output in units}
    from_logits = outputs_logits(model)

    saved = [v.numpy() for v in model.non_trainable_variables]
    with tf.GradientTape() as tape:
        outputs = _run_layers(model, tf.convert_to_tensor(images, tf.float32), watched, tape)
        loss = tf.reduce_mean(
            keras.losses.sparse_categorical_crossentropy(labels, outputs, from_logits=from_logits)
        )
    grads = tape.gradient(loss, [watched[output] for _, output in units])
    for variable, value in zip(model.non_trainable_variables, saved):
        variable.assign(value)  # training-mode BN moved its averages; put them back

    xs = [watched[output].numpy().astype("float64") for _, output in units]
    gs = [g.numpy().astype("float64") for g in grads]
    stages = np.array([stage_of(output) for _, output in units])
    direct = np.empty(len(units))
    for s in np.unique(stages):
        (idx,) = np.nonzero(stages == s)
        g_last = gs[idx[-1]]
        for i in idx:
            direct[i] = np.sum(gs[i] * g_last) / np.sum(g_last * g_last)
    return {
        "unit": [prefix for prefix, _ in units],
        "stage": stages,
        "signal": np.array([np.sqrt(np.mean(x * x)) for x in xs]),
        "gradient": np.array([np.sqrt(np.mean(g * g)) for g in gs]),
        "direct": direct,
    }


def _run_layers(model: keras.Model, x, watched: dict, tape):
    """Calls the functional model layer by layer (training mode), recording the tensors of
    the layers named in `watched` so the tape can differentiate with respect to them."""
    values = {id(model.inputs[0]): x}
    for layer in model.layers:
        if isinstance(layer, keras.layers.InputLayer):
            continue
        inputs = layer.input
        if isinstance(inputs, (list, tuple)):
            args = [values[id(t)] for t in inputs]
        else:
            args = values[id(inputs)]
        out = layer(args, training=True)
        if layer.name in watched:
            tape.watch(out)
            watched[layer.name] = out
        values[id(layer.output)] = out
    return values[id(model.outputs[0])]
