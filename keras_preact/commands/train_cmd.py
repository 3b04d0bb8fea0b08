"""`keras-preact train MODEL --output RUN_DIR ...`: the paper's recipe (`training.train`), a
flag per field of `training.TrainConfig`."""

from __future__ import annotations

import argparse
import hashlib
import os
import sys

from keras_preact import rundir
from keras_preact.cli import import_tensorflow
from keras_preact.data import sources
from keras_preact.training.config import TrainConfig, add_arguments
from keras_preact.training.distribute import CONNECT_TIMEOUT_S


def add_parser(subparsers) -> None:
    p = subparsers.add_parser(
        "train",
        help="train a network with the paper's recipe (resumes an interrupted RUN_DIR)",
        description="Train MODEL with SGD + the paper's schedule on model.fit. Rerun the same "
        "command after an interruption to resume from RUN_DIR/backup.",
    )
    p.add_argument("model", help='registered name, e.g. "preact-110" (see `keras-preact list`)')
    p.add_argument("--output", required=True, metavar="RUN_DIR", help="run directory")
    add_arguments(p)  # the recipe: a flag per TrainConfig field
    p.add_argument("--no-download", dest="download", action="store_false",
                   help="fail instead of letting TFDS download a dataset that is not prepared")
    p.add_argument("--connect-timeout", type=float, default=None, metavar="SECONDS",
                   help="multi-worker: how long to wait for the other workers (of TF_CONFIG; "
                   f"on JAX of KERAS_DISTRIBUTION_NUM_PROCESSES) (default: {CONNECT_TIMEOUT_S:g})")
    p.set_defaults(func=run, on_interrupt="rerun the same command to resume")


def run(args: argparse.Namespace) -> int:
    # The recipe is checked before TensorFlow starts: bad flags fail at once.
    config = TrainConfig.from_args(args)
    # A misspelt or unsuitable dataset name fails before TensorFlow starts; whether it is
    # prepared or its hosts answer is checked by `train` after the model and flags, so a
    # wrong model name is named first, offline too. Resolved once: `train` takes the source
    # (a folder is listed here only).
    source = sources.resolve(config.dataset, config.data_dir)
    import_tensorflow(args.verbose, "keras-preact train", backends=("tensorflow", "jax"))
    from keras_preact import training

    try:
        model = training.train(args.model, config, output=args.output, download=args.download,
                               verbose=1 if sys.stdout.isatty() else 2,
                               connect_timeout=args.connect_timeout, dataset=source)
    except training.TrainingStopped as e:  # a divergence, a lost worker: what to do next
        print(f"keras-preact train: error: {e}", file=sys.stderr, flush=True)
        if isinstance(e, training.WorkerLost) and os.environ.get("KERAS_BACKEND") == "jax":
            # JAX's exit would wait for the lost peer at its shutdown barrier, then abort.
            sys.stdout.flush()
            os._exit(1)
        return 1
    # Printed by every worker: equal digests show that all workers hold the same weights.
    print(f"keras-preact: finished at step {int(model.optimizer.iterations.numpy())}; "
          f"trainable weights sha256 {weights_digest(model)}; "
          f"model in {os.path.join(args.output, rundir.MODEL)}")
    return 0


def weights_digest(model) -> str:
    """First 16 hex digits of the SHA-256 of the trainable weights' bytes, in layer order.

    BN moving statistics are left out: like the paper's 2-GPU Torch runs (BN over each GPU's
    64 images), each replica keeps its own; the chief's are the ones saved.
    """
    digest = hashlib.sha256()
    for variable in model.trainable_weights:
        digest.update(variable.numpy().tobytes())
    return digest.hexdigest()[:16]
