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

Nothing here imports TensorFlow on JAX: a JAX machine without TensorFlow trains from NumPy
arrays (`data.arrays`).
"""

from __future__ import annotations

import contextlib
import dataclasses

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
    On JAX: "auto" is "mirrored" with several local GPUs (or TPU cores), else "one-device";
    "tpu" and "multi-worker" are TensorFlow's, one-line errors."""
    if strategy not in distribute.STRATEGIES:
        raise ValueError(f"Unknown strategy {strategy!r}. "
                         f"Valid strategies: {list(distribute.STRATEGIES)}.")
    if not is_jax():
        tf_strategy = distribute.select_strategy(strategy, connect_timeout)
        return Replicas(type(tf_strategy).__name__, tf_strategy.num_replicas_in_sync,
                        distribute.is_chief(tf_strategy), tf_strategy,
                        distribute.cluster_workers())
    import jax

    if strategy in ("tpu", "multi-worker"):
        raise ValueError(f"--strategy {strategy} is TensorFlow's: on JAX use 'mirrored' (the "
                         f"local GPUs or TPU cores) or 'one-device'. Received: "
                         f"strategy={strategy!r}, KERAS_BACKEND=jax")
    devices = jax.local_devices()
    if strategy == "auto":
        accelerators = [d for d in devices if d.platform != "cpu"]
        strategy = "mirrored" if len(accelerators) > 1 else "one-device"
    if strategy == "one-device" or len(devices) == 1:
        keras.distribution.set_distribution(None)
        return Replicas("JAX one device", 1, jax.process_index() == 0)
    keras.distribution.set_distribution(keras.distribution.DataParallel(devices=devices))
    return Replicas("DataParallel", len(devices), jax.process_index() == 0)


def gpu_count() -> int:
    """The GPUs the backend sees (TensorFlow: physical ones, `distribute.gpu_count`)."""
    if not is_jax():
        return distribute.gpu_count()
    import jax

    return sum(d.platform == "gpu" for d in jax.devices())
