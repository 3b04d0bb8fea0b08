"""The `keras-preact` command line: one sub-command per module in `keras_preact.commands`.

Each module defines `add_parser(subparsers)`, which registers its sub-command and sets
`func(args) -> int` as the parser default. Heavy imports (TensorFlow) happen inside `func`,
so `--help` and `keras-preact list` answer at once.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import os
import signal
import sys
import warnings

from keras_preact import __version__, host
from keras_preact.training import distribute

# Order shown by --help.
COMMANDS = ("list", "train", "evaluate", "plot", "export")
# TensorFlow's C++ start-up lines (oneDNN notes, "failed call to cuInit" on CPU-only
# machines) read as failures; hidden unless --verbose or the user set the variable.
TF_LOG_LEVEL = "TF_CPP_MIN_LOG_LEVEL"
# The commands are TensorFlow's (tf.data input, SavedModel export), so Keras runs on TensorFlow
# under them, whatever this says: a KERAS_BACKEND set for one's own JAX or PyTorch code need not
# be unset first, and nothing they write depends on the backend. `train` runs on JAX too.
KERAS_BACKEND = "KERAS_BACKEND"
# The exit status of a command ended by Ctrl-C (SIGINT), as shells report it: 128 + 2.
INTERRUPTED = 130


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="keras-preact",
        description="Pre-activation ResNets (He et al., ECCV 2016) in Keras 3.",
    )
    parser.add_argument("--version", action="version", version=__version__)
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for command in COMMANDS:
        importlib.import_module(f"keras_preact.commands.{command}_cmd").add_parser(
            subparsers
        )
    for subparser in subparsers.choices.values():
        subparser.add_argument("--verbose", action="store_true",
                               help=f"show TensorFlow's own log lines too (or set {TF_LOG_LEVEL})")
    return parser


def add_model_arguments(parser: argparse.ArgumentParser) -> None:
    """The model `evaluate` and `export` work on: a run dir, a `.keras` file, or a registered
    name with published or saved weights (`model_from_args`)."""
    parser.add_argument("model", metavar="RUN_DIR|MODEL.keras|NAME",
                        help="a trainer run dir, a .keras file, or a registered name with "
                        "--weights")
    parser.add_argument("--weights", metavar="TAG|FILE",
                        help="with a registered NAME: a published tag (keras-preact list "
                        "--weights) or a .weights.h5 file")


def model_from_args(args: argparse.Namespace):
    """`args.model` as a path, or the registered network it names built with `args.weights`
    (call after `import_tensorflow`)."""
    from keras_preact.arch.specs import get_spec
    from keras_preact.weights.records import list_models

    named = args.model in list_models() and not os.path.exists(args.model)
    looks_like_path = os.path.exists(args.model) or args.model.endswith(".keras") or (
        os.sep in args.model)
    if args.weights is not None and not named and not looks_like_path:
        get_spec(args.model)  # a misspelt name: its error suggests the closest names
    if named != (args.weights is not None):
        raise ValueError(
            f"{args.model!r} is a registered name: add --weights TAG|FILE "
            "(`keras-preact list --weights` shows the published tags)." if named else
            f"--weights goes with a registered model name (a run dir or .keras file holds its "
            f"own weights). Received: {args.model!r} --weights {args.weights!r}")
    if not named:
        return args.model
    import keras_preact

    return keras_preact.build(args.model, weights=args.weights)


def import_tensorflow(verbose: bool = False, command: str = "the command line",
                      backends: tuple[str, ...] = ("tensorflow",)) -> None:
    """Imports TensorFlow; unless `verbose`, without its start-up lines on the console.

    Commands that need TensorFlow call this first. It loads with oneDNN on where TensorFlow
    would leave it off (`host.use_onednn`). TF_CPP_MIN_LOG_LEVEL=3 hides its later C++ logs;
    the lines its libraries print while loading (before absl logging is initialized, whatever
    the level) are sent to /dev/null for the duration of the import. Keras is set to run on
    the `KERAS_BACKEND` of the environment if `command` runs on it (one of `backends`), else
    on TensorFlow, with one warning. On another backend, TensorFlow is imported only when it
    is installed (its tf.data may feed that backend; a JAX machine may have none).
    """
    if "tensorflow" in sys.modules:
        return
    backend = os.environ.get(KERAS_BACKEND, "tensorflow")
    if backend not in backends:
        if "keras" not in sys.modules:
            names = " or ".join({"tensorflow": "TensorFlow", "jax": "JAX"}[b] for b in backends)
            warnings.warn(f"{KERAS_BACKEND}={backend} ignored: {command} runs on {names} "
                          f"(keras_preact.build runs on {backend} in Python).", stacklevel=2)
        backend = "tensorflow"
    os.environ[KERAS_BACKEND] = backend
    if backend != "tensorflow" and importlib.util.find_spec("tensorflow") is None:
        return
    host.use_onednn()
    if verbose:
        return
    os.environ.setdefault(TF_LOG_LEVEL, "3")
    saved = _to_devnull(2)
    try:
        import tensorflow  # noqa: F401
    finally:
        os.dup2(saved, 2)
        os.close(saved)


def _to_devnull(fd: int) -> int:
    """Points file descriptor `fd` (1 or 2: where C++ libraries write) at /dev/null, after
    flushing Python's stream on it; returns a new descriptor of what it was."""
    (sys.stdout if fd == 1 else sys.stderr).flush()
    saved, devnull = os.dup(fd), os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, fd)
    os.close(devnull)
    return saved


def mute_native_output() -> None:
    """Sends what C++ code writes to stdout and stderr (file descriptors 1 and 2) to
    /dev/null, Python's own lines (sys.stdout, sys.stderr) to where they went: the lines of
    a multi-worker run's collectives and coordination services, which log through absl
    whatever TF_CPP_MIN_LOG_LEVEL says (TensorFlow's lost peer printed 7 lines before ours),
    Gloo's "[Gloo] Rank 0 is connected to 1 peer ranks" on stdout, and the stack dump of a
    JAX abort when a peer is lost, which the supervising parent tells in one line
    (`distribute.supervise`)."""
    sys.stdout = os.fdopen(_to_devnull(1), "w", buffering=1)
    sys.stderr = os.fdopen(_to_devnull(2), "w", buffering=1)


def show_warnings(command: str, verbose: bool) -> None:
    """keras_preact's own warnings as one `keras-preact CMD: warning: ...` line; other
    libraries' only with --verbose."""
    package = os.path.dirname(os.path.abspath(__file__)) + os.sep
    default = warnings.showwarning

    def show(message, category, filename, lineno, file=None, line=None):
        if os.path.abspath(filename).startswith(package):
            print(f"keras-preact {command}: warning: {message}", file=sys.stderr)
        elif verbose:
            default(message, category, filename, lineno, file, line)

    warnings.showwarning = show


def main(argv: list[str] | None = None) -> int:
    """Runs the command in `argv` (default: the program's arguments); returns its exit status:
    0, 2 for an error the user can fix (one line), `INTERRUPTED` after Ctrl-C (one line)."""
    args = build_parser().parse_args(argv)
    show_warnings(args.command, args.verbose)
    try:
        if argv is None and args.command == "train" and distribute.multi_worker():
            # So that a connect timeout exits 2, not 138, any stop signal ends both, and a
            # lost JAX peer is one line, not an abort's C++ dump.
            status = distribute.supervise(lambda number: _stopped(args, number),
                                          lambda: _peer_lost(args))
            if status is not None:
                return status
            if not args.verbose and TF_LOG_LEVEL not in os.environ:
                mute_native_output()
        return args.func(args) or 0
    except (ValueError, OSError) as e:
        # Bad input and environment failures (a path, a permission, the network) are the
        # user's to fix: one clear line, no traceback.
        print(f"keras-preact {args.command}: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:  # Ctrl-C: the command's own cleanup has run on the way here
        _stopped(args, signal.SIGINT)
        if argv is None:  # the program itself (not a caller's Python): skip TensorFlow's
            sys.stdout.flush()  # teardown, which joins its thread pools for seconds
            os._exit(INTERRUPTED)
        return INTERRUPTED


def _peer_lost(args: argparse.Namespace) -> None:
    """The one line of a worker that JAX's distributed service ended (a peer was lost)."""
    print(f"keras-preact {args.command}: error: {distribute.PEER_LOST}", file=sys.stderr,
          flush=True)


def _stopped(args: argparse.Namespace, number: int) -> None:
    """The one line of a command ended by signal `number`: "interrupted" for Ctrl-C."""
    hint = getattr(args, "on_interrupt", None)
    what = "interrupted" if number == signal.SIGINT else f"stopped by {signal.Signals(number).name}"
    print(f"keras-preact {args.command}: {what}{f'; {hint}' if hint else ''}", file=sys.stderr,
          flush=True)


if __name__ == "__main__":
    sys.exit(main())
