"""The `keras-preact` command line: one sub-command per module in `keras_preact.commands`.

Each module defines `add_parser(subparsers)`, which registers its sub-command and sets
`func(args) -> int` as the parser default. Heavy imports (TensorFlow) happen inside `func`,
so `keras-preact --help` answers at once.
"""

from __future__ import annotations

import argparse
import importlib
import sys

from keras_preact import __version__

# Order shown by --help.
COMMANDS = ("list", "train", "evaluate", "plot", "export")


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
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args) or 0
    except (ValueError, FileNotFoundError, FileExistsError) as e:
        # Bad input is the user's to fix: one clear line, no traceback.
        print(f"keras-preact {args.command}: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
