"""The engine a run trains on, decided once (`select`, called by `plan.make_plan`): Keras'
backend (TensorFlow or JAX, as `KERAS_BACKEND` sets it) and the devices and processes it
trains over, as one backend-neutral `Replicas`.

On TensorFlow `Replicas` wraps the tf.distribute strategy (`distribute.select_strategy`). On
JAX `--strategy mirrored` is `keras.distribution.DataParallel` over the local devices, set
process-wide with `keras.distribution.set_distribution`: JAX's fit reads the distribution
when it places the variables and shards each batch, not from a scope. There, each step is
one XLA program over the global batch, so BatchNormalization's batch statistics are the
whole global batch's (synchronized BN, as if on one device). TensorFlow's MirroredStrategy
keeps each replica's own (BN over each device's share, like the paper's 2-GPU Torch runs).

On JAX `--strategy multi-worker` (and "auto" when `KERAS_DISTRIBUTION_NUM_PROCESSES` > 1)
is DataParallel over every process' devices, started from the variables
`keras.distribution.initialize` reads (`distribute.jax_cluster`): each process reads its
own shard of the input (`Replicas.input_shard`) in batches of its share of the global batch,
and each step is still one program over the global batch (BN statistics included).

Nothing here imports TensorFlow on JAX: a JAX machine without TensorFlow trains from NumPy
arrays (`data.arrays`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import os

import keras

from keras_preact import host
from keras_preact.training import distribute

# The backends `train` runs on.
BACKENDS = ("tensorflow", "jax")


def name() -> str:
    """Keras' backend: "tensorflow" or "jax" (a one-line ValueError for another)."""
    backend = keras.backend.backend()
    if backend not in BACKENDS:
        raise ValueError(f"The trainer runs on Keras' {' or '.join(BACKENDS)} backend: set "
                         f"KERAS_BACKEND to one of them. Received: KERAS_BACKEND={backend!r}")
    return backend


def is_jax() -> bool:
    return name() == "jax"


def jit_compile(asked: bool) -> bool:
    """What `model.compile(jit_compile=...)` gets: `--jit-compile` is TensorFlow's choice of
    XLA; JAX's fit always compiles its steps with XLA (uncompiled, it runs op by op)."""
    return asked or is_jax()


@dataclasses.dataclass(frozen=True)
class Replicas:
    """The devices and processes a run trains over, on either backend."""

    kind: str  # what the session record names: "MirroredStrategy", "DataParallel", ...
    num_replicas: int  # the devices the global batch is split over
    is_chief: bool  # whether this process writes the run's files
    tf_strategy: object = None  # the tf.distribute strategy (TensorFlow only)
    workers: int = 0  # processes of a multi-worker run (0: a single process)
    # (index, count): the shard of the input this process reads, in batches of 1/count of
    # the global batch, where the backend leaves that to us (JAX with several processes);
    # None: all of it, in global batches (tf.distribute shards and splits them itself).
    input_shard: tuple[int, int] | None = None

    def scope(self):
        """The context to build the model in: the tf.distribute strategy's scope; on JAX
        none (the distribution is process-wide, module doc)."""
        return self.tf_strategy.scope() if self.tf_strategy is not None else (
            contextlib.nullcontext())

    def describe(self) -> str:
        """The machine line of a session record: the host, its GPUs, the replicas."""
        gpus = gpu_count()
        return (f"{host.describe()}{f', {gpus} GPU' if gpus else ''}; {self.kind}, "
                f"replicas: {self.num_replicas}"
                f"{f', workers: {self.workers}' if self.workers else ''}")


def select(strategy: str, connect_timeout: float) -> Replicas:
    """The `Replicas` of `--strategy strategy` on this backend (call before any other
    TensorFlow or JAX work: MultiWorkerMirroredStrategy configures collectives at start-up).
    On JAX: "auto" is "multi-worker" when `KERAS_DISTRIBUTION_NUM_PROCESSES` > 1, else
    "mirrored" with several local GPUs (or TPU cores), else "one-device"; "multi-worker"
    waits at most `connect_timeout` seconds for the other processes (`start_processes`);
    "tpu" is TensorFlow's, a one-line error."""
    if strategy not in distribute.STRATEGIES:
        raise ValueError(f"Unknown strategy {strategy!r}. "
                         f"Valid strategies: {list(distribute.STRATEGIES)}.")
    if not is_jax():
        tf_strategy = distribute.select_strategy(strategy, connect_timeout)
        return Replicas(type(tf_strategy).__name__, tf_strategy.num_replicas_in_sync,
                        distribute.is_chief(tf_strategy), tf_strategy,
                        distribute.cluster_workers())
    import jax

    if strategy == "tpu":
        raise ValueError(f"--strategy {strategy} is TensorFlow's: on JAX use 'mirrored' (the "
                         f"local GPUs or TPU cores), 'multi-worker' or 'one-device'. Received: "
                         f"strategy={strategy!r}, KERAS_BACKEND=jax")
    if strategy == "multi-worker" or (strategy == "auto" and distribute.jax_processes() > 1):
        return start_processes(connect_timeout)
    devices = jax.local_devices()
    if strategy == "auto":
        accelerators = [d for d in devices if d.platform != "cpu"]
        strategy = "mirrored" if len(accelerators) > 1 else "one-device"
    if strategy == "one-device" or len(devices) == 1:
        keras.distribution.set_distribution(None)
        return Replicas("JAX one device", 1, jax.process_index() == 0)
    keras.distribution.set_distribution(keras.distribution.DataParallel(devices=devices))
    return Replicas("DataParallel", len(devices), jax.process_index() == 0)


def start_processes(connect_timeout: float) -> Replicas:
    """Joins this process to the others of a multi-process JAX run (`distribute.jax_cluster`)
    and sets DataParallel over all their devices; the `Replicas` of this process.

    What `keras.distribution.initialize` does, with the timeouts it cannot pass on:
    `jax.distributed.initialize`, then the same random seed in every process (Keras'
    `initialize_rng`: the same initial weights). The wait for the others is bounded by
    `distribute.connect_guard`, JAX's own later (it aborts); a process silent for
    `distribute.HEARTBEAT_TIMEOUT_S` ends the others. Cross-process collectives on CPU are
    Gloo's unless `JAX_CPU_COLLECTIVES_IMPLEMENTATION` says otherwise. Each process reads
    its own part of the data (Keras' `auto_shard_dataset` is for tf.data under TensorFlow).
    """
    import jax
    from keras.src.backend.jax.distribution_lib import initialize_rng

    coordinator, count, index = distribute.jax_cluster()
    if not jax.distributed.is_initialized():
        if "JAX_CPU_COLLECTIVES_IMPLEMENTATION" not in os.environ:
            jax.config.update("jax_cpu_collectives_implementation", "gloo")
        with distribute.connect_guard(connect_timeout, distribute.jax_peers()):
            jax.distributed.initialize(
                coordinator, count, index,
                initialization_timeout=int(connect_timeout + distribute.JAX_INIT_MARGIN_S),
                heartbeat_timeout_seconds=distribute.HEARTBEAT_TIMEOUT_S)
        initialize_rng()
    devices = jax.devices()
    keras.distribution.set_distribution(
        keras.distribution.DataParallel(devices=devices, auto_shard_dataset=False))
    return Replicas("DataParallel", len(devices), index == 0, workers=count,
                    input_shard=(index, count))


def gpu_count() -> int:
    """The GPUs the backend sees (TensorFlow: physical ones, `distribute.gpu_count`)."""
    if not is_jax():
        return distribute.gpu_count()
    import jax

    return sum(d.platform == "gpu" for d in jax.devices())
