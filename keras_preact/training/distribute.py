"""Strategy selection (`select_strategy`), multi-worker start-up on TensorFlow (TF_CONFIG) and
JAX (the `KERAS_DISTRIBUTION_*` variables), and the supervising parent of a multi-worker
`train` (`supervise`). The MWMS patch for Keras 3 fit is `training.mwms_patch`'s.
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
import typing
from collections.abc import Mapping

from keras_preact.training.mwms_patch import MWMS_PATCHED_KERAS, apply_mwms_compat

STRATEGIES = ("auto", "one-device", "mirrored", "multi-worker", "tpu")
__all__ = ["MWMS_PATCHED_KERAS", "apply_mwms_compat"]  # re-exported: README names them here


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


# The variables `keras.distribution.initialize` reads, which start a multi-process run on
# JAX: the coordinator's (process 0's) host:port, first of a comma-separated list; how many
# processes; which one this is.
JOB_ADDRESSES = "KERAS_DISTRIBUTION_JOB_ADDRESSES"
NUM_PROCESSES = "KERAS_DISTRIBUTION_NUM_PROCESSES"
PROCESS_ID = "KERAS_DISTRIBUTION_PROCESS_ID"


# What `NUM_PROCESSES` holds, for its errors.
PROCESSES_MEANING = "the processes of the run, the same on every host"


def jax_processes(environ: Mapping[str, str] = os.environ) -> int:
    """The processes of a multi-process JAX run, `NUM_PROCESSES` (1 when unset); a one-line
    ValueError when it is not an integer >= 1."""
    return _int_variable(environ, NUM_PROCESSES, 1, PROCESSES_MEANING)


def jax_cluster(environ: Mapping[str, str] = os.environ) -> tuple[str, int, int]:
    """`(coordinator host:port, processes, this process' id)` from `JOB_ADDRESSES`,
    `NUM_PROCESSES` and `PROCESS_ID`: what `jax.distributed.initialize` takes; a one-line
    ValueError naming the variable that is unset or invalid, and what it must hold.

    Example:
    >>> jax_cluster({JOB_ADDRESSES: "10.0.0.1:1234,10.0.0.2:1234", NUM_PROCESSES: "2",
    ...              PROCESS_ID: "1"})
    ('10.0.0.1:1234', 2, 1)
    """
    count = _int_variable(environ, NUM_PROCESSES, None, PROCESSES_MEANING)
    index = _int_variable(environ, PROCESS_ID, None, f"this process' number, 0 to "
                          f"{count - 1} (0: the coordinator)")
    if index >= count:
        raise ValueError(f"{PROCESS_ID} must be this process' number, 0 to {count - 1} "
                         f"({NUM_PROCESSES}={count}). Received: {PROCESS_ID}={index}")
    text = environ.get(JOB_ADDRESSES, "")
    addresses = text.split(",")
    if not all(re.fullmatch(r"[^\s:,]+:\d+", a) for a in addresses) or (
            len(addresses) not in (1, count)):
        raise ValueError(f"{JOB_ADDRESSES} must be the coordinator's host:port (process 0's), "
                         f"or all {count} processes' host:port, comma-separated, process 0's "
                         "first. Received: " + (f"{JOB_ADDRESSES}={text!r}" if JOB_ADDRESSES
                                                in environ else f"{JOB_ADDRESSES} unset"))
    return addresses[0], count, index


def _int_variable(environ: Mapping[str, str], name: str, default: int | None,
                  meaning: str) -> int:
    """Environment variable `name` as an int >= 0 (>= 1 for `NUM_PROCESSES`), `default`
    when it is unset (None: it must be set); a one-line ValueError otherwise."""
    text = environ.get(name)
    if text is None and default is not None:
        return default
    low = 1 if name == NUM_PROCESSES else 0
    if text is None or not text.strip().isdigit() or int(text) < low:
        raise ValueError(f"{name} must be an integer >= {low}: {meaning}. Received: "
                         + (f"{name} unset" if text is None else f"{name}={text!r}"))
    return int(text)


def multi_worker() -> bool:
    """Whether this process is one of several of a run: TF_CONFIG's workers on TensorFlow,
    `NUM_PROCESSES` on JAX (`KERAS_BACKEND`)."""
    if os.environ.get("KERAS_BACKEND") == "jax":
        return jax_processes() > 1
    return cluster_workers() > 1


def gpu_count() -> int:
    """The GPUs TensorFlow sees. Physical, not logical: listing logical devices starts the TF
    context, after which MWMS can no longer configure its collectives."""
    import tensorflow as tf

    return len(tf.config.list_physical_devices("GPU"))


# How long a worker waits for the other workers by default (--connect-timeout).
CONNECT_TIMEOUT_S = 300.0
# JAX's own wait for its peers (`jax.distributed.initialize`'s initialization_timeout, after
# which it aborts) ends this much later than `connect_guard`'s, which says what happened.
JAX_INIT_MARGIN_S = 60
# After this long without a heartbeat from a process, JAX's distributed service ends the
# others (SIGABRT, which `supervise` turns into `PEER_LOST`) instead of letting them wait.
HEARTBEAT_TIMEOUT_S = 30
# The line of a multi-process JAX worker that JAX's distributed service ended (SIGABRT).
PEER_LOST = ("a peer of this multi-worker run was lost (JAX's distributed service ended this "
             "process; --verbose shows its own lines); rerun the same command on every worker "
             "to resume from the last good backup")
# What `supervise` returns for it: a lost worker's status (`trainer.WorkerLost`).
PEER_LOST_EXIT = 1
# What the watchdog of `connect_guard` ends a worker with, and `supervise` recognizes: a
# signal no Python or TensorFlow code handles, whose default action ends the process.
CONNECT_TIMEOUT_SIGNAL = signal.SIGUSR1
# A supervised worker ended by CONNECT_TIMEOUT_SIGNAL exits with the CLI's bad-input status.
CONNECT_TIMEOUT_EXIT = 2
PR_SET_PDEATHSIG = 1  # <linux/prctl.h>: the signal a process gets when its parent dies


class Peers(typing.NamedTuple):
    """What `connect_guard` waits for, its words when they do not come, and the fix."""

    waited_for: str  # "the 2 workers of TF_CONFIG (host:port, host:port)"
    missing: str  # "not every worker of TF_CONFIG (...)"
    fix: str


def tf_peers() -> Peers:
    """The other workers of TF_CONFIG (MultiWorkerMirroredStrategy)."""
    peers = [address for addresses in tf_config().get("cluster", {}).values()
             for address in addresses]
    return Peers(f"the {len(peers)} workers of TF_CONFIG ({', '.join(peers)})",
                 f"not every worker of TF_CONFIG ({', '.join(peers)})",
                 "start them all with the same TF_CONFIG cluster")


def jax_peers() -> Peers:
    """The other processes of a multi-process JAX run (`jax_cluster`)."""
    coordinator, count, _ = jax_cluster()
    group = f"{NUM_PROCESSES}={count} (coordinator {coordinator})"
    return Peers(f"the {count} processes of {group}", f"not every process of {group}",
                 f"start every one with the same {JOB_ADDRESSES} and {NUM_PROCESSES} and its "
                 f"own {PROCESS_ID}")


@contextlib.contextmanager
def connect_guard(timeout: float, peers: Peers | None = None):
    """Bounds a multi-worker start's wait for the other workers, `peers` (default
    `tf_peers`; on JAX `jax_peers`).

    TensorFlow and JAX wait in C++ holding the GIL: no Python handler or thread runs until
    every worker has connected (and JAX's own timeout aborts). So Ctrl-C and SIGTERM get
    their default action (stop at once), and a forked watchdog ends the process with one
    clear line and CONNECT_TIMEOUT_SIGNAL after `timeout` seconds (an exit status only a
    parent process can turn into 2: `supervise`).
    """
    peers = peers or tf_peers()
    print(f"keras-preact: waiting for {peers.waited_for} to connect, at most {timeout:g} s "
          "(--connect-timeout)", file=sys.stderr, flush=True)
    handlers = {s: signal.signal(s, signal.SIG_DFL)
                for s in (signal.SIGINT, signal.SIGTERM, CONNECT_TIMEOUT_SIGNAL)}
    parent, stderr = os.getpid(), sys.stderr.fileno()  # not fd 2 where that is muted (cli)
    watchdog = os.fork()
    if watchdog == 0:  # only os-level calls here: the parent's threads are not in this copy
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and os.getppid() == parent:
            time.sleep(0.5)
        if os.getppid() == parent:
            os.write(stderr, (f"keras-preact train: error: {peers.missing} connected within "
                              f"{timeout:g} s; {peers.fix}, or raise --connect-timeout.\n"
                              ).encode())
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


def supervise(said=None, lost=None) -> int | None:
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
    still ends the worker. A child ended by SIGABRT, as JAX's distributed service ends a
    process whose peer was lost (a missed heartbeat, a failed barrier), gets its one line
    from `lost()` and exits PEER_LOST_EXIT. Elsewhere the command runs unsupervised (a
    connect timeout then exits 128 + SIGUSR1).
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
    if number == signal.SIGABRT and lost is not None:
        lost()
        return PEER_LOST_EXIT
    if number in PASSED_ON and said is not None:
        said(number)
    return 128 + number


def _pass_on(child: int, number: int) -> None:
    with contextlib.suppress(ProcessLookupError):  # it has just ended
        os.kill(child, number)


# How JAX's errors begin when a peer process is gone: its CPU collectives' (Gloo's) and its
# distributed service's.
JAX_PEER_ERRORS = re.compile(r"(Gloo \S+ failed|.*coordination service|.*heartbeat)",
                             re.IGNORECASE)


def lost_worker(error: BaseException) -> str | None:
    """The worker whose loss aborted a collective op, as `error` tells it: TensorFlow's
    "worker 1 at host:port (Socket closed)"; JAX's "a peer process (Connection reset by
    peer)"; None for any other error.

    Example:
    >>> lost_worker(RuntimeError("Collective ops is aborted by: Socket closed\\nAdditional "
    ...                          "GRPC error information from remote target "
    ...                          "/job:worker/replica:0/task:1 while calling ..."))
    'worker 1 (Socket closed)'
    >>> lost_worker(ValueError("UNKNOWN: Gloo all-reduce failed: [external/gloo/gloo/"
    ...                        "transport/tcp/pair.cc:538] Read error [127.0.0.1]:35745: "
    ...                        "Connection reset by peer"))
    'a peer process (Connection reset by peer)'
    """
    text = str(error)
    start = text.find("Collective ops is aborted by: ")
    if start < 0:
        first = re.sub(r"^[A-Z_]+: ", "", text.strip().split("\n", 1)[0])  # "UNKNOWN: "
        if not JAX_PEER_ERRORS.match(first):
            return None
        return f"a peer process ({first.rsplit(': ', 1)[-1]})"
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
