"""`keras-preact evaluate RUN_DIR|MODEL.keras|NAME [--weights TAG] [--dataset NAME|FOLDER]
[--split SPLIT] [--json]`."""

from __future__ import annotations

import argparse
import json

from keras_preact.cli import add_model_arguments, import_tensorflow, model_from_args
from keras_preact.data.sources import DATASET_HELP, DEFAULT_EVAL_DATASET, eval_source, resolve


def add_parser(subparsers) -> None:
    p = subparsers.add_parser("evaluate", help="accuracy / error of a trained model on a split")
    add_model_arguments(p)
    p.add_argument("--dataset", default=None, metavar="NAME|FOLDER",
                   help=f"{DATASET_HELP} (default: a run dir's own dataset, and on a folder "
                   f"the images the run held out; else {DEFAULT_EVAL_DATASET})")
    p.add_argument("--split", default=None,
                   help='TFDS split, e.g. "train[45000:]" (default: the dataset\'s labelled '
                   'held-out split: test for CIFAR, validation for imagenet2012; a folder\'s '
                   'images: all, or a slice such as "all[-60:]")')
    p.add_argument("--data-dir", default=None,
                   help="TFDS data_dir (default: a run dir's own, else TFDS's)")
    p.add_argument("--no-download", dest="download", action="store_false",
                   help="fail instead of letting TFDS download a dataset that is not prepared")
    p.add_argument("--batch-size", type=int, default=500,
                   help="images per evaluation batch; the result does not depend on it "
                   "(default %(default)s)")
    p.add_argument("--json", action="store_true",
                   help='last stdout line: {"accuracy", "error" (%%), "loss", "examples"}')
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    # A misspelt or unsuitable dataset name fails before TensorFlow starts; whether it is
    # prepared or its hosts answer is checked by `evaluate` once the model is known to fit.
    # Resolved once: `evaluate` takes the source (a folder is listed here only).
    dataset, data_dir, split = eval_source(args.model, args.dataset, args.data_dir, args.split)
    source = resolve(dataset, data_dir)
    import_tensorflow(args.verbose, "keras-preact evaluate")
    from keras_preact import training

    result = training.evaluate(model_from_args(args), dataset=source, split=split,
                               data_dir=data_dir, download=args.download,
                               batch_size=args.batch_size)
    print(f"{result.pop('dataset')} {result.pop('split')}: error {result['error']:.2f} % "
          f"(accuracy {result['accuracy']:.4f}, loss {result['loss']:.4f}, "
          f"{result['examples']} examples)")
    if args.json:
        print(json.dumps(result))
    return 0
