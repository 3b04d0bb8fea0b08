"""`keras-preact list [PATTERN]`: the registered networks with their paper results."""

from __future__ import annotations

import argparse


def add_parser(subparsers) -> None:
    p = subparsers.add_parser("list", help="list registered models (fnmatch pattern)")
    p.add_argument("pattern", nargs="?", default="*", help='e.g. "preact-*"')
    p.add_argument(
        "--params", action="store_true", help="also build each model to count parameters"
    )
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    import keras_preact as zoo

    names = zoo.list_models(args.pattern)
    if not names:
        raise ValueError(
            f"No model matches {args.pattern!r}. Try `keras-preact list` for all names."
        )
    for name in names:
        spec = zoo.get_spec(name)
        row = [name.ljust(40), spec.family.ljust(9), f"depth {spec.depth}".ljust(11)]
        if args.params:
            row.append(f"{zoo.build(name).count_params() / 1e6:7.2f}M")
        row.append(spec.paper_result)
        print("  ".join(row).rstrip())
    return 0
