"""`keras-preact export RUN_DIR|MODEL.keras --base DIR`: a TF Serving SavedModel version."""

from __future__ import annotations

import argparse


def add_parser(subparsers) -> None:
    p = subparsers.add_parser(
        "export", help="export a run dir or .keras file as a TF Serving SavedModel"
    )
    p.add_argument("model", metavar="RUN_DIR|MODEL.keras", help="trainer run dir or .keras file")
    p.add_argument(
        "--base", required=True, metavar="DIR", help="model base dir: writes DIR/NAME/VERSION/"
    )
    p.add_argument(
        "--name",
        help="model name: letters, digits, '.', '_', '-' (default: the run's model name)",
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

    import_tensorflow(args.verbose)
    from keras_preact.export import export_saved_model

    path = export_saved_model(args.model, args.base, name=args.name, version=args.version)
    print(path)
    return 0
