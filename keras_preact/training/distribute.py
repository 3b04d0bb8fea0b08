"""Strategy selection, and the compatibility layer that lets MultiWorkerMirroredStrategy
(MWMS) train through Keras 3 `model.fit` (keras-team/keras#20585).

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

import contextlib
import ctypes
import json
import os
import re
import signal
import sys
import time
import warnings

STRATEGIES = ("auto", "one-device", "mirrored", "multi-worker", "tpu")
# (lowest, highest) Keras major.minor known to need the patches. 3.15 is the installed one,
# checked by tests/training/test_distribute.py; widen after re-testing a newer Keras.
MWMS_PATCHED_KERAS = ((3, 5), (3, 15))


def tf_config() -> dict:
    """The TF_CONFIG environment variable as a dict ({} when unset); a clear ValueError when
    it is not the JSON object tf.distribute expects."""
    text = os.environ.get("TF_CONFIG") or "{}"
    try:
        config = json.loads(text)
    except json.JSONDecodeError as error:
        config = error
    if not isinstance(config, dict) or not isinstance(config.get("cluster", {}), dict):
        raise ValueError('TF_CONFIG must be a JSON object like {"cluster": {"worker": '
                         '["host:port", ...]}, "task": {"type": "worker", "index": 0}}. '
                         f"Received: TF_CONFIG={text[:200]!r}")
    return config


def cluster_workers() -> int:
    """Number of chief + worker tasks in TF_CONFIG (0 when TF_CONFIG is unset)."""
    cluster = tf_config().get("cluster", {})
    return len(cluster.get("chief", [])) + len(cluster.get("worker", []))


def gpu_count() -> int:
    """The GPUs TensorFlow sees. Physical, not logical: listing logical devices starts the TF
    context, after which MWMS can no longer configure its collectives."""
    import tensorflow as tf

    return len(tf.config.list_physical_devices("GPU"))


# How long a worker waits for the other workers of TF_CONFIG by default (--connect-timeout).
CONNECT_TIMEOUT_S = 300.0
# What the watchdog of `connect_guard` ends a worker with, and `supervise` recognizes: a
# signal no Python or TensorFlow code handles, whose default action ends the process.
CONNECT_TIMEOUT_SIGNAL = signal.SIGUSR1
# A supervised worker ended by CONNECT_TIMEOUT_SIGNAL exits with the CLI's bad-input status.
CONNECT_TIMEOUT_EXIT = 2
PR_SET_PDEATHSIG = 1  # <linux/prctl.h>: the signal a process gets when its parent dies


@contextlib.contextmanager
def connect_guard(timeout: float):
    """Bounds MultiWorkerMirroredStrategy's wait for the other workers.

    TensorFlow waits in C++ holding the GIL: no Python handler or thread runs until every
    worker has connected. So Ctrl-C and SIGTERM get their default action (stop at once), and
    a forked watchdog ends the process with one clear line and CONNECT_TIMEOUT_SIGNAL after
    `timeout` seconds (an exit status only a parent process can turn into 2: `supervise`).
    """
    peers = [address for addresses in tf_config().get("cluster", {}).values()
             for address in addresses]
    print(f"keras-preact: waiting for the {len(peers)} workers of TF_CONFIG "
          f"({', '.join(peers)}) to connect, at most {timeout:g} s (--connect-timeout)",
          file=sys.stderr, flush=True)
    handlers = {s: signal.signal(s, signal.SIG_DFL)
                for s in (signal.SIGINT, signal.SIGTERM, CONNECT_TIMEOUT_SIGNAL)}
    parent = os.getpid()
    watchdog = os.fork()
    if watchdog == 0:  # only os-level calls here: the parent's threads are not in this copy
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and os.getppid() == parent:
            time.sleep(0.5)
        if os.getppid() == parent:
            line = (f"keras-preact train: error: not every worker of TF_CONFIG "
                    f"({', '.join(peers)}) connected within {timeout:g} s; start them all "
                    "with the same TF_CONFIG cluster, or raise --connect-timeout.\n")
            os.write(sys.stderr.fileno(), line.encode())
            os.kill(parent, CONNECT_TIMEOUT_SIGNAL)
        os._exit(0)
    try:
        yield
    finally:
        os.kill(watchdog, signal.SIGKILL)
        os.waitpid(watchdog, 0)
        for s, handler in handlers.items():
            signal.signal(s, handler)


# The signals `supervise` passes on to its worker.
PASSED_ON = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
# How long a worker has to end after a stop signal passed on before it is killed: while it
# waits for its peers, TensorFlow's coordination service takes SIGTERM as a preemption notice
# and goes on waiting.
STOP_GRACE_S = 10


def supervise(said=None) -> int | None:
    """Forks the process of a multi-worker `keras-preact train`: returns None in the child,
    which goes on to run the command, and the child's exit status in the parent, which waits.

    A worker whose peers never come can only be ended by a signal (`connect_guard`), and a
    process ended by a signal exits with 128 + its number. This parent, which has not started
    TensorFlow, turns CONNECT_TIMEOUT_SIGNAL into CONNECT_TIMEOUT_EXIT (the child has printed
    the line). The child runs in a process group of its own, so every SIGINT, SIGTERM and
    SIGHUP reaches it once, whoever sent it: sent to this pid (`kill`, `timeout`, `docker
    stop`, an IDE's stop button) or to its group (the terminal's Ctrl-C), it is passed on.
    A child that has not ended `STOP_GRACE_S` after it is killed. Sent to the child itself,
    it ends the child as it would unsupervised (but for a SIGTERM while it waits for its
    peers, which TensorFlow's coordination service takes and ignores). A child ended by
    one of them without saying so (their default action, e.g. while it waits for its peers)
    gets its one line from `said(number)`. A SIGKILL cannot be passed on: the kernel kills
    the child with its parent (Linux's PR_SET_PDEATHSIG), so `kill -9` of the pid one started
    still ends the worker. Elsewhere the command runs unsupervised (a connect timeout then
    exits 128 + SIGUSR1).
    """
    if not sys.platform.startswith("linux"):
        return None
    sys.stdout.flush()
    sys.stderr.flush()
    parent = os.getpid()
    child = os.fork()
    if child == 0:
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
        if os.getppid() != parent:  # it died before prctl took effect
            os._exit(128 + signal.SIGKILL)
        # Out of the terminal's process group: a Ctrl-C reaches it once, through the parent.
        os.setpgid(0, 0)
        return None
    stops = []  # the stop signals passed on

    def pass_on(number, _):
        stops.append(number)
        _pass_on(child, number)
        signal.alarm(STOP_GRACE_S)

    for s in PASSED_ON:
        if signal.getsignal(s) != signal.SIG_IGN:  # `nohup`: a SIGHUP stays ignored by both
            signal.signal(s, pass_on)
    signal.signal(signal.SIGALRM, lambda *_: _pass_on(child, signal.SIGKILL))
    status = os.waitpid(child, 0)[1]  # retried after a handled signal (PEP 475)
    signal.alarm(0)
    if not os.WIFSIGNALED(status):
        return os.WEXITSTATUS(status)
    number = os.WTERMSIG(status)
    if number == signal.SIGKILL and stops:  # killed for a stop signal it did not end on
        number = stops[0]
    if number == CONNECT_TIMEOUT_SIGNAL:  # the child has printed the line
        return CONNECT_TIMEOUT_EXIT
    if number in PASSED_ON and said is not None:
        said(number)
    return 128 + number


def _pass_on(child: int, number: int) -> None:
    with contextlib.suppress(ProcessLookupError):  # it has just ended
        os.kill(child, number)


def lost_worker(error: BaseException) -> str | None:
    """The worker whose loss aborted a collective op, as `error` (TensorFlow's) tells it:
    "worker 1 at host:port (Socket closed)"; None for any other error.

    Example:
    >>> lost_worker(RuntimeError("Collective ops is aborted by: Socket closed\\nAdditional "
    ...                          "GRPC error information from remote target "
    ...                          "/job:worker/replica:0/task:1 while calling ..."))
    'worker 1 (Socket closed)'
    """
    text = str(error)
    start = text.find("Collective ops is aborted by: ")
    if start < 0:
        return None
    text = text[start:].split(": ", 1)[1]
    # The cause's first line: "Socket closed", or "Error reported from /job:worker/task:1: The
    # following tasks are unhealthy (stopped sending heartbeats):".
    cause = re.sub(r"^Error reported from \S+: ", "", text.splitlines()[0]).rstrip(":")
    task = re.search(r"/job:(\w+)(?:/replica:\d+)?/task:(\d+)", text)
    if not task:
        return f"a worker of TF_CONFIG ({cause})"
    job, index = task[1], int(task[2])
    addresses = tf_config().get("cluster", {}).get(job, [])
    address = f" at {addresses[index]}" if index < len(addresses) else ""
    return f"{job} {index}{address} ({cause})"


def select_strategy(name: str = "auto", connect_timeout: float = CONNECT_TIMEOUT_S):
    """Creates the `tf.distribute` strategy for `--strategy NAME`.

    `auto`: MultiWorkerMirroredStrategy when TF_CONFIG lists several workers, else
    MirroredStrategy with more than one GPU, else OneDeviceStrategy. (Not the default
    strategy: compiled in a real strategy's scope, Keras builds the optimizer and metric
    variables before `fit` and traces the train step once instead of twice, a third off
    the first step; benchmarks/README.md.)
    `mirrored` without GPUs mirrors over the logical CPU devices, if there are several.
    Call it before any other TensorFlow work: MWMS must configure collectives at start-up.
    MWMS waits at most `connect_timeout` seconds for the other workers (`connect_guard`).

    Example:
    >>> select_strategy("one-device").num_replicas_in_sync  # doctest: +SKIP
    1
    """
    import tensorflow as tf

    if name not in STRATEGIES:
        raise ValueError(f"Unknown strategy {name!r}. Valid strategies: {list(STRATEGIES)}.")
    workers = cluster_workers()  # also checks TF_CONFIG before TensorFlow reads it
    gpus = gpu_count()
    if name == "auto":
        name = (
            "multi-worker" if workers > 1
            else "mirrored" if gpus > 1
            else "one-device"
        )
    if name == "one-device":
        return tf.distribute.OneDeviceStrategy("/gpu:0" if gpus else "/cpu:0")
    if name == "mirrored":
        devices = tf.config.list_logical_devices("GPU") or tf.config.list_logical_devices("CPU")
        return tf.distribute.MirroredStrategy([d.name for d in devices])
    if name == "multi-worker":
        apply_mwms_compat()
        with connect_guard(connect_timeout):
            return tf.distribute.MultiWorkerMirroredStrategy()
    resolver = tf.distribute.cluster_resolver.TPUClusterResolver()
    tf.config.experimental_connect_to_cluster(resolver)
    tf.tpu.experimental.initialize_tpu_system(resolver)
    return tf.distribute.TPUStrategy(resolver)


def is_chief(strategy) -> bool:
    """Whether this process writes the run's files (always true outside multi-worker)."""
    return bool(getattr(strategy.extended, "should_checkpoint", True))


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
