"""`keras-preact train MODEL --output RUN_DIR ...`: the paper's recipe (see `training.train`)."""

from __future__ import annotations

import argparse
import hashlib
import json
import sys

from keras_preact.cli import import_tensorflow


def add_parser(subparsers) -> None:
    p = subparsers.add_parser(
        "train",
        help="train a network with the paper's recipe (resumes an interrupted RUN_DIR)",
        description="Train MODEL with SGD + the paper's schedule on model.fit. Rerun the same "
        "command after an interruption to resume from RUN_DIR/backup.",
    )
    p.add_argument("model", help='registered name, e.g. "preact-110" (see `keras-preact list`)')
    p.add_argument("--output", required=True, metavar="RUN_DIR", help="run directory")
    p.add_argument("--dataset", default="cifar10", help="cifar10 | cifar100 | imagenet2012")
    p.add_argument("--data-dir", default=None, help="TFDS data_dir")
    p.add_argument("--no-download", dest="download", action="store_false",
                   help="fail instead of letting TFDS download a dataset that is not prepared")
    p.add_argument("--batch-size", type=int, default=128, help="global batch (default 128)")
    p.add_argument("--steps", type=int, default=64000, help="total iterations (default 64000)")
    p.add_argument("--steps-per-epoch", type=int, default=None,
                   help="iterations per epoch (default: training examples // batch size)")
    p.add_argument("--lr", type=float, default=0.1, help="base learning rate (default 0.1)")
    p.add_argument("--warmup-steps", type=int, default=None,
                   help="iterations at lr 0.01 first (default on CIFAR: the paper's 400 of "
                   "64000, scaled with --steps, e.g. 1 for --steps 100; 0 on ImageNet)")
    p.add_argument("--nesterov", action="store_true", help="Nesterov momentum")
    p.add_argument("--weight-decay", type=float, default=1e-4, help="gradient += wd * w")
    p.add_argument("--val-examples", type=int, default=5000,
                   help="validation slice carved from the end of train (0: none)")
    p.add_argument("--strategy", default="auto",
                   choices=("auto", "one-device", "mirrored", "multi-worker", "tpu"))
    p.add_argument("--mixed-precision", default="off", choices=("off", "bfloat16", "float16"))
    p.add_argument("--jit-compile", action="store_true", help="compile steps with XLA")
    p.add_argument("--stages", default="auto", choices=("auto", "layers", "scan"),
                   help="scan: run each stage's identical units as one loop (full pre-activation "
                   "nets; preact-1001: first step 20x sooner, 40%% of the memory; "
                   "benchmarks/README.md). auto (default): scan where it applies, else layers")
    p.add_argument("--recompute", action="store_true",
                   help="scanned stages: recompute whole units in the backward pass "
                   "(about 3/4 of the default's memory, 1.2x the time)")
    p.add_argument("--backup-every", type=int, default=1000,
                   help="back up every N iterations, and at each epoch end (default 1000)")
    p.add_argument("--override", action="append", default=[], metavar="FIELD=VALUE",
                   help='build() override, JSON value, e.g. --override depth=8 '
                   '--override unit=\\"original\\" (repeatable)')
    p.add_argument("--seed", type=int, default=None, help="shuffle seed")
    p.add_argument("--connect-timeout", type=float, default=None, metavar="SECONDS",
                   help="multi-worker: how long to wait for the other workers of TF_CONFIG "
                   "(default: 5 minutes)")
    p.set_defaults(func=run)


def parse_overrides(items: list[str]) -> dict:
    """`["depth=8", "unit=original"]` -> `{"depth": 8, "unit": "original"}` (JSON values,
    bare strings allowed; lists become tuples, as spec fields expect)."""
    overrides = {}
    for item in items:
        field, sep, text = item.partition("=")
        if not sep or not field:
            raise ValueError(f"--override expects FIELD=VALUE. Received: {item!r}")
        try:
            value = json.loads(text)
        except json.JSONDecodeError:
            value = text
        overrides[field] = tuple(value) if isinstance(value, list) else value
    return overrides


def run(args: argparse.Namespace) -> int:
    import_tensorflow(args.verbose)
    from keras_preact import training

    try:
        model = training.train(
            args.model, output=args.output, dataset=args.dataset, data_dir=args.data_dir,
            download=args.download,
            steps=args.steps, batch_size=args.batch_size, lr=args.lr,
            warmup_steps=args.warmup_steps, nesterov=args.nesterov,
            weight_decay=args.weight_decay, val_examples=args.val_examples,
            steps_per_epoch=args.steps_per_epoch, strategy=args.strategy,
            mixed_precision=args.mixed_precision, jit_compile=args.jit_compile,
            stages=args.stages, recompute=args.recompute,
            backup_every=args.backup_every, overrides=parse_overrides(args.override),
            seed=args.seed, verbose=1 if sys.stdout.isatty() else 2,
            connect_timeout=args.connect_timeout,
        )
    except training.TrainingDiverged as e:
        print(f"keras-preact train: error: {e}", file=sys.stderr)
        return 1
    # Printed by every worker: equal digests show that all workers hold the same weights.
    print(f"keras-preact: finished at step {int(model.optimizer.iterations.numpy())}; "
          f"trainable weights sha256 {weights_digest(model)}; "
          f"model in {args.output}/model.keras")
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
