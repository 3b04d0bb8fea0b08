"""`keras-preact plot RUN_DIR [RUN_DIR ...] -o curves.png`: overlay training curves."""

from __future__ import annotations

import argparse

from keras_preact.rundir import METRICS


def add_parser(subparsers) -> None:
    p = subparsers.add_parser(
        "plot",
        help=f"plot runs' {METRICS}: train loss (dashed), test or validation error (solid), lr",
        description="Overlays the training curves of runs written by `keras-preact train`, "
        "in the style of the paper's Fig. 1/6: training loss dashed, test error (validation error "
        "for a run that held a slice of train out) solid, one "
        "colour per run, learning rate below; x axis = iterations.",
    )
    p.add_argument("run_dirs", nargs="+", metavar="RUN_DIR", help=f"directory with {METRICS}")
    p.add_argument("-o", "--output", default="curves.png",
                   help="image to write; format from the extension (default: curves.png)")
    p.add_argument("--labels", nargs="+", metavar="LABEL",
                   help="legend label per run (default: directory names)")
    p.add_argument("--title", help="figure title")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from keras_preact.plotting import plot_runs

    plot_runs(args.run_dirs, args.output, labels=args.labels, title=args.title)
    print(args.output)
    return 0
