"""`keras-preact list [PATTERN]`: the registered networks with their paper results."""

from __future__ import annotations

import argparse


def add_parser(subparsers) -> None:
    p = subparsers.add_parser("list", help="list registered models (fnmatch pattern)")
    p.add_argument("pattern", nargs="?", default="*", help='e.g. "preact-*"')
    p.add_argument(
        "--params", action="store_true", help="also count each model's trainable parameters"
    )
    p.add_argument(
        "--markdown", action="store_true", help="print a Markdown table (the README's)"
    )
    p.add_argument(
        "--weights", action="store_true",
        help="list the published weights (tags for weights=...) with their accuracy instead",
    )
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    import keras_preact

    names = keras_preact.list_models(args.pattern)
    if not names:
        raise ValueError(
            f"No model matches {args.pattern!r}. Try `keras-preact list` for all names."
        )
    if args.weights:
        header, rows = _weights_table(names, args.pattern)
    else:
        header, rows = _models_table(names, args.params)
    _print_table(header, rows, args.markdown)
    return 0


def _models_table(names: list[str], params: bool) -> tuple[list[str], list[list[str]]]:
    import keras_preact
    from keras_preact.arch.specs import param_counts
    from keras_preact.paper import PAPER_RESULTS

    header = ["name", "family", "depth", "unit", "shortcut"]
    # Trainable: the count papers quote (`count_params()` adds BN's moving statistics).
    header += ["trainable params"] * params + ["paper error (%)"]
    rows = []
    for name in names:
        spec = keras_preact.get_spec(name)
        row = [name, spec.family, str(spec.depth), spec.unit, spec.shortcut]
        if params:  # counted from the spec: no model is built
            row.append(f"{param_counts(spec).trainable / 1e6:.2f}M")
        rows.append(row + [PAPER_RESULTS.get(name, "-")])
    return header, rows


def _weights_table(names: list[str], pattern: str) -> tuple[list[str], list[list[str]]]:
    from keras_preact.weights import records

    header = ["name", "weights", "test accuracy (error)", "paper error (%)", "iterations",
              "precision", "file"]
    records = records.all_records()
    rows = [_weights_row(r) for r in records if r.model in names]
    if not rows:
        published = ", ".join(f"{r.model} ({r.tag})" for r in records) or "none yet"
        raise ValueError(f"No published weights for models matching {pattern!r}. "
                         f"Published: {published}.")
    return header, rows


def _weights_row(r) -> list[str]:
    from keras_preact.paper import PAPER_RESULTS
    from keras_preact.weights.records import ConvertedRecord

    if isinstance(r, ConvertedRecord):  # the source's own figure: not measured here
        return [r.model, r.tag, f"{r.top1:.2f} % ({100 - r.top1:.2f} %), source's, ImageNet val",
                "-", "-", "float32", r.url]
    return [r.model, r.tag,
            f"{100 * r.test_accuracy:.2f} % ({100 - 100 * r.test_accuracy:.2f} %)",
            f"{r.compare_with}: {PAPER_RESULTS[r.compare_with]}", str(r.iterations),
            r.precision, r.url or r.file]


def _print_table(header: list[str], rows: list[list[str]], markdown: bool) -> None:
    if markdown:
        print("| " + " | ".join(header) + " |")
        print("|" + "---|" * len(header))
        for row in rows:
            print("| " + " | ".join(row) + " |")
    else:  # as `pip list` prints: the column names, a rule, the rows
        widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
        for row in [header, ["-" * w for w in widths], *rows]:
            print("  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip())

