"""`keras-preact export RUN_DIR|MODEL.keras|NAME [--weights TAG] --base DIR`: a TF Serving
SavedModel version; `--format onnx|litert|openvino -o PATH`: one file for that runtime
(`keras_preact.export.export_model`)."""

from __future__ import annotations

import argparse

from keras_preact import files
from keras_preact.cli import add_model_arguments, model_from_args
from keras_preact.export import EXPORT_FORMATS, runtimes


def add_parser(subparsers) -> None:
    p = subparsers.add_parser(
        "export",
        help="export a trained model as a TF Serving SavedModel (or ONNX, LiteRT, OpenVINO)",
    )
    add_model_arguments(p)
    p.add_argument(
        "--format", default="saved_model", choices=EXPORT_FORMATS,
        help="saved_model (default: a TF Serving version, --base) or one ONNX Runtime, LiteRT "
        "or OpenVINO file (-o): uint8 images in, preprocessing inside, probabilities out",
    )
    p.add_argument(
        "--base", metavar="DIR", help="saved_model: model base dir, writes DIR/NAME/VERSION/"
    )
    p.add_argument(
        "-o", "--output", metavar="PATH", help="onnx|litert|openvino: the .onnx/.tflite/.xml file"
    )
    p.add_argument(
        "--name",
        help="model name: letters, digits, '.', '_', '-' (default: a run dir's own name, "
        "e.g. mine for runs/mine; else the network's)",
    )
    p.add_argument(
        "--new-labels", action="store_true",
        help="saved_model: allow other class names than the newest version under NAME serves "
        "(refused by default: the server's latest version would change classes)",
    )
    p.add_argument(
        "--version",
        type=int,
        metavar="V",
        help="version number, 1 to 2**63-1 as TF Serving reads it (default: next free one)",
    )
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from keras_preact.cli import import_tensorflow

    if args.format == "saved_model" and (args.base is None or args.output is not None):
        raise ValueError("--format saved_model needs --base DIR (and takes no -o).")
    saved_model_only = (args.base, args.name, args.version, args.new_labels or None)
    if args.format != "saved_model" and (
            args.output is None or any(v is not None for v in saved_model_only)):
        raise ValueError(f"--format {args.format} needs -o PATH (and takes no --base, --name, "
                         "--version or --new-labels).")
    # The paths before the model is built or loaded: a bad one costs no wait.
    if args.format == "saved_model":
        files.check_directory(args.base)
    else:
        runtimes.check_target(args.output, args.format)
    import_tensorflow(args.verbose, "keras-preact export")
    from keras_preact.export import export_model

    print(export_model(model_from_args(args), args.base or args.output, args.format,
                       name=args.name, version=args.version, new_labels=args.new_labels))
    return 0
