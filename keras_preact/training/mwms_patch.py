"""The compatibility layer that lets MultiWorkerMirroredStrategy (MWMS) train through Keras 3
`model.fit` (keras-team/keras#20585).

Two Keras internals fail under MWMS in the versions listed in `MWMS_PATCHED_KERAS`:

1. `TensorFlowTrainer._maybe_symbolic_build` builds the model from the first batch, which
   under a strategy is a PerReplica value; it reduces it with `strategy.reduce("MEAN", batch)`
   *eagerly*, which MWMS cannot do outside a `tf.function` (a collective per input tensor).
   The build only needs shapes and dtypes: we take the first local replica's batch instead.
2. `reduce_per_replica(..., "mean")` calls `strategy.reduce("MEAN", v, axis=0)` on every log;
   fit's logs are scalars, which have no axis 0. Scalars are reduced with `axis=None`.

Both patches are applied only when an MWMS strategy is created, only for those Keras versions,
and the patched functions defer to the originals for every other strategy.
"""

from __future__ import annotations

import warnings

# (lowest, highest) Keras major.minor known to need the patches. 3.15 is the installed one,
# checked by tests/training/test_distribute.py; widen after re-testing a newer Keras.
MWMS_PATCHED_KERAS = ((3, 5), (3, 15))


def _keras_version() -> tuple[int, int]:
    import keras

    major, minor = keras.__version__.split(".")[:2]
    return int(major), int(minor)


def apply_mwms_compat() -> bool:
    """Patches the two Keras internals above (idempotent). Returns whether patches are active."""
    from keras.src.backend.tensorflow import trainer as tf_trainer

    low, high = MWMS_PATCHED_KERAS
    if not low <= _keras_version() <= high:
        warnings.warn(
            f"keras_preact: no MultiWorkerMirroredStrategy compatibility patch for Keras "
            f"{_keras_version()} (patched range {low}-{high}); if fit fails, see "
            "keras-team/keras#20585.",
            stacklevel=2,
        )
        return False
    if getattr(tf_trainer, "_keras_preact_mwms_patch", False):
        return True
    multi_worker = tf_trainer._collective_all_reduce_multi_worker
    original_build = tf_trainer.TensorFlowTrainer._maybe_symbolic_build
    original_reduce = tf_trainer.reduce_per_replica

    def _maybe_symbolic_build(self, iterator=None, data_batch=None):
        strategy = self._distribute_strategy
        if strategy is None or iterator is None or not multi_worker(strategy):
            return original_build(self, iterator=iterator, data_batch=data_batch)
        import keras
        import tensorflow as tf

        for _, _, it in iterator:
            batch = next(it)
            break
        # Shapes and dtypes are all the symbolic build needs: one local replica's batch.
        data_batch = keras.tree.map_structure(
            lambda x: strategy.experimental_local_results(x)[0]
            if isinstance(x, tf.distribute.DistributedValues)
            else x,
            batch,
        )
        with strategy.scope():
            self._symbolic_build(data_batch=data_batch)

    def reduce_per_replica(values, strategy, reduction):
        if reduction not in ("auto", "mean") or not multi_worker(strategy):
            return original_reduce(values, strategy, reduction)
        import keras

        def reduce(v):
            if strategy.experimental_local_results(v)[0].shape.rank == 0:
                return strategy.reduce("MEAN", v, axis=None)
            return original_reduce(v, strategy, reduction)

        return keras.tree.map_structure(reduce, values)

    tf_trainer.TensorFlowTrainer._maybe_symbolic_build = _maybe_symbolic_build
    tf_trainer.reduce_per_replica = reduce_per_replica
    tf_trainer._keras_preact_mwms_patch = True
    return True
