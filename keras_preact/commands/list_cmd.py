"""`keras-preact list [PATTERN]`: the registered networks with their paper results."""

from __future__ import annotations

import argparse
import math


def add_parser(subparsers) -> None:
    p = subparsers.add_parser("list", help="list registered models (fnmatch pattern)")
    p.add_argument("pattern", nargs="?", default="*", help='e.g. "preact-*"')
    p.add_argument(
        "--params", action="store_true", help="also build each model to count parameters"
    )
    p.add_argument(
        "--markdown", action="store_true", help="print a Markdown table (the README's)"
    )
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    import keras_preact

    names = keras_preact.list_models(args.pattern)
    if not names:
        raise ValueError(
            f"No model matches {args.pattern!r}. Try `keras-preact list` for all names."
        )
    header = ["name", "family", "depth", "unit", "shortcut"]
    header += ["params"] * args.params + ["paper error (%)"]
    rows = []
    for name in names:
        spec = keras_preact.get_spec(name)
        row = [name, spec.family, str(spec.depth), spec.unit, spec.shortcut]
        if args.params:
            weights = keras_preact.build(name).trainable_weights
            row.append(f"{sum(math.prod(w.shape) for w in weights) / 1e6:.2f}M")
        rows.append(row + [spec.paper_result or "-"])
    if args.markdown:
        print("| " + " | ".join(header) + " |")
        print("|" + "---|" * len(header))
        for row in rows:
            print("| " + " | ".join(row) + " |")
    else:
        widths = [max(len(r[i]) for r in rows) for i in range(len(header))]
        for row in rows:
            print("  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip())
    return 0

