"""The JAX backend's loop of `ScannedUnits` (`keras_preact.arch.scanned_units`).

One `jax.lax.scan` over the stacked weights runs the stage's units, so XLA compiles one unit
whatever the depth. A unit is the plain layer graph's ops (`keras.ops` conv, Keras'
BatchNormalization arithmetic, ReLU, add), hence the same outputs and gradients as the
plain graph on JAX. In training the unit runs under `jax.checkpoint`, whose policy mirrors
the TensorFlow loop's options (`saved_names`): by default the backward pass keeps each
BN-ReLU-conv's input and recomputes BN + ReLU; `recompute_bn=False` also keeps each ReLU's
output; `recompute=True` keeps only the unit's input and recomputes the whole unit.

JAX is imported here only: keras_preact imports this module on the JAX backend alone.
"""

from __future__ import annotations

import jax
from keras import ops

from keras_preact.arch.blocks import batch_norm

# The tensors of a unit the backward pass may keep (`jax.ad_checkpoint.checkpoint_name`).
BN_INPUT, RELU_OUTPUT = "bn_input", "relu_output"


def saved_names(recompute: bool, recompute_bn: bool) -> tuple[str, ...]:
    """What the backward pass keeps of each unit besides its input (the loop's carry)."""
    if recompute:
        return ()
    return (BN_INPUT,) if recompute_bn else (BN_INPUT, RELU_OUTPUT)


def unit(x, params: list, convs: int, training: bool, epsilon: float, dtype: str):
    """One unit `x + F(x)` of `convs` BN-ReLU-convs. `params` per conv: gamma, beta, kernel
    in training (batch statistics), gamma, beta, moving mean, moving variance, kernel in
    inference. Returns the output and, in training, each BN's batch mean and variance."""
    y, stats = x, []
    per_conv = len(params) // convs
    for k in range(convs):
        *bn, kernel = params[per_conv * k: per_conv * (k + 1)]
        if k:  # the first BN's input is the unit's: the scan keeps it anyway
            y = jax.ad_checkpoint.checkpoint_name(y, BN_INPUT)
        if training:
            y, mean, variance = batch_norm(y, *bn, None, None, epsilon=epsilon, dtype=dtype)
            stats += [mean, variance]
        else:
            y, _, _ = batch_norm(y, *bn, epsilon=epsilon, dtype=dtype)
        a = jax.ad_checkpoint.checkpoint_name(ops.relu(y), RELU_OUTPUT)
        y = ops.conv(a, kernel, strides=1, padding="same")
    return ops.add(x, y), stats


def scan_units(x, params: list, *, convs: int, training: bool, epsilon: float, dtype: str,
               saved: tuple[str, ...]):
    """Runs `unit` once per slice of the stacked `params` (each `(units, ...)`), the output
    of each unit feeding the next; in training under `jax.checkpoint` keeping only the
    `saved` names. Returns the last output and the batch statistics (in training: for each
    BN, mean and variance stacked as `(units, channels)`; else empty)."""

    def step(x, p):
        return unit(x, p, convs, training, epsilon, dtype)

    if training:
        # prevent_cse=False: the scan already keeps XLA from merging the recomputation with
        # the forward pass (jax.checkpoint's documentation).
        step = jax.checkpoint(step, prevent_cse=False,
                              policy=jax.checkpoint_policies.save_only_these_names(*saved))
    x, stats = jax.lax.scan(step, x, params)
    return x, stats
