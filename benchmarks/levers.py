"""Runs the speed levers back to back (one process each) and prints a Markdown table.

    python benchmarks/levers.py --suite preact-164      # ~20 min on 2 cores
    python benchmarks/levers.py --suite preact-1001     # ~40 min
    python benchmarks/levers.py --suite memory          # preact-1001 batch 128, recompute

Each row is `benchmarks/train_speed.py` with the listed flags; torch rows run the PyTorch
eager reference. Results also go, one JSON object per line, to `--output` (appended).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
BEST = "--stages scan --strategy one-device"
SUITES = {
    # Each lever alone against the default (plain layers, TF defaults), then on the scan.
    "preact-164": ["--model preact-164 --batch-size 64 --steps 16 " + flags for flags in (
        "", "--grappler lean", "--grappler off", "--steps-per-execution 4",
        "--strategy one-device", "--stages scan", "--stages scan --no-fused",
        "--stages scan --grappler off", "--stages scan --mixed-precision bfloat16",
        "--stages scan --steps-per-execution 4", BEST, "--framework torch")],
    "preact-1001": ["--model preact-1001 --batch-size 32 --steps 6 " + flags for flags in (
        BEST, BEST + " --recompute", "--framework torch", "")],
    "memory": ["--model preact-1001 --batch-size 128 --steps 3 " + BEST + " --recompute"],
    # The README's headline table.
    "table": [f"--model {m} --steps {n} {flags}" for m, n in (
        ("preact-164 --batch-size 64", 16), ("preact-1001 --batch-size 32", 6))
        for flags in ("", BEST, "--framework torch")],
}


def run(flags: str) -> dict:
    argv = [sys.executable, os.path.join(HERE, "train_speed.py"), "--json", *flags.split()]
    done = subprocess.run(argv, capture_output=True, text=True)
    if done.returncode:
        return {"flags": flags, "error": done.stderr.strip().splitlines()[-1:]}
    return {"flags": flags, **json.loads(done.stdout.strip().splitlines()[-1])}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--suite", choices=sorted(SUITES), required=True)
    p.add_argument("--output", default=os.path.join(HERE, "results.jsonl"))
    args = p.parse_args(argv)
    print(f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} cores; "
          f"python {platform.python_version()}")
    print("| flags | build s | first step s | images/s | peak RSS MB |")
    print("|---|---|---|---|---|")
    for flags in SUITES[args.suite]:
        r = run(flags)
        with open(args.output, "a") as f:
            f.write(json.dumps(r) + "\n")
        if "error" in r:
            print(f"| `{flags}` | error: {r['error']} | | | |", flush=True)
        else:
            print(f"| `{flags}` | {r['build_s']:.1f} | {r['first_step_s']:.1f} | "
                  f"{r['images_per_s']:.1f} | {r['peak_rss_mb']:.0f} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
