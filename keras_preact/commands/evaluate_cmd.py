"""`keras-preact evaluate RUN_DIR|MODEL.keras|NAME [--weights TAG] --dataset cifar10 --split test
[--json]`."""

from __future__ import annotations

import argparse
import json

from keras_preact.cli import add_model_arguments, import_tensorflow, model_from_args
from keras_preact.training.sources import DATASET_HELP, dataset_info


def add_parser(subparsers) -> None:
    p = subparsers.add_parser("evaluate", help="accuracy / error of a trained model on a split")
    add_model_arguments(p)
    p.add_argument("--dataset", default="cifar10", metavar="NAME|FOLDER",
                   help=f"{DATASET_HELP} (default %(default)s)")
    p.add_argument("--split", default=None,
                   help='TFDS split, e.g. "train[45000:]" (default: the dataset\'s labelled '
                   'held-out split: test for CIFAR, validation for imagenet2012; a folder\'s '
                   'images: all, or a slice such as "all[-60:]")')
    p.add_argument("--data-dir", default=None, help="TFDS data_dir")
    p.add_argument("--no-download", dest="download", action="store_false",
                   help="fail instead of letting TFDS download a dataset that is not prepared")
    p.add_argument("--batch-size", type=int, default=500)
    p.add_argument("--json", action="store_true",
                   help='last stdout line: {"accuracy", "error" (%%), "loss", "examples"}')
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    # A misspelt or unsuitable dataset name fails before TensorFlow starts; whether it is
    # prepared or its hosts answer is checked by `evaluate` once the model is known to fit.
    dataset_info(args.dataset, args.data_dir)
    import_tensorflow(args.verbose)
    from keras_preact import training

    result = training.evaluate(model_from_args(args), dataset=args.dataset, split=args.split,
                               data_dir=args.data_dir, download=args.download,
                               batch_size=args.batch_size)
    print(f"{args.dataset} {result.pop('split')}: error {result['error']:.2f} % "
          f"(accuracy {result['accuracy']:.4f}, loss {result['loss']:.4f}, "
          f"{result['examples']} examples)")
    if args.json:
        print(json.dumps(result))
    return 0
