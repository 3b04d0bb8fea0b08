"""Wall time of `keras-preact` commands that should answer at once: `--help`, each
sub-command's `--help`, `list`, `list --params`, `list --weights`; median of fresh processes.

    python benchmarks/cli_startup.py [--repeats 5]

Prints a Markdown table; `import tensorflow` alone is measured as the reference.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time

from keras_preact.cli import COMMANDS

CASES = [["--help"], ["list"], ["list", "--params"], ["list", "--weights"],
         *[[c, "--help"] for c in COMMANDS]]


def seconds(argv: list[str], repeats: int) -> float:
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        subprocess.run(argv, capture_output=True)
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    print("| command | median wall time |\n|---|---|")
    for case in CASES:
        argv = [sys.executable, "-m", "keras_preact.cli", *case]
        print(f"| `keras-preact {' '.join(case)}` | {seconds(argv, args.repeats):.2f} s |")
    reference = seconds([sys.executable, "-c", "import tensorflow"], args.repeats)
    print(f"| `python -c 'import tensorflow'` (reference) | {reference:.2f} s |")


if __name__ == "__main__":
    main()
