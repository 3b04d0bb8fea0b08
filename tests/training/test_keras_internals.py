"""The Keras internals `training.mwms_patch.apply_mwms_compat` patches and
`training.backend.start_processes` calls (no public API reaches them): this fails loudly
when an installed Keras moves or renames one, before a multi-worker run meets it."""

from keras_preact.training import distribute, mwms_patch


def test_the_internals_the_multi_worker_patch_replaces_are_there():
    from keras.src.backend.tensorflow import trainer as tf_trainer

    low, high = distribute.MWMS_PATCHED_KERAS
    assert low <= mwms_patch._keras_version() <= high, (
        "a Keras outside the patched range: re-test multi-worker training, then widen "
        "MWMS_PATCHED_KERAS")
    assert callable(tf_trainer._collective_all_reduce_multi_worker)
    assert callable(tf_trainer.TensorFlowTrainer._maybe_symbolic_build)
    assert callable(tf_trainer.reduce_per_replica)


def test_the_internal_a_multi_process_jax_start_calls_is_there():
    """`backend.start_processes` calls what `keras.distribution.initialize` calls after
    `jax.distributed.initialize`: the same random seed in every process."""
    import inspect

    from keras.src.backend.jax import distribution_lib

    assert "initialize_rng()" in inspect.getsource(distribution_lib.initialize)
    assert callable(distribution_lib.initialize_rng)
