"""Runs the speed levers back to back (one process each) and prints a Markdown table.

    python benchmarks/levers.py --suite preact-164      # ~20 min on 2 cores
    python benchmarks/levers.py --suite preact-1001     # ~40 min
    python benchmarks/levers.py --suite memory          # preact-1001 batch 128
    python benchmarks/levers.py --suite table           # the README's table, ~11 min
    python benchmarks/levers.py --suite precision       # float32/bfloat16 vs PyTorch's best

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

from train_speed import TORCH_CONFIGS

from keras_preact import host

HERE = os.path.dirname(os.path.abspath(__file__))
# The trainer's default for full pre-activation nets is the scan (`--stages auto`); the
# plain layer graph is the baseline the levers are measured against.
PLAIN, SCAN = "--stages layers", "--stages scan"
SUITES = {
    # Each lever alone: on the plain graph, then on the scan.
    "preact-164": ["--model preact-164 --batch-size 64 --steps 16 " + flags for flags in (
        PLAIN, f"{PLAIN} --grappler lean", f"{PLAIN} --grappler off",
        f"{PLAIN} --steps-per-execution 4", f"{SCAN} --no-fused", f"{SCAN} --grappler off",
        f"{SCAN} --mixed-precision bfloat16", f"{SCAN} --steps-per-execution 4",
        f"{SCAN} --recompute", SCAN, "--framework torch")],
    "preact-1001": ["--model preact-1001 --batch-size 32 --steps 6 " + flags for flags in (
        SCAN, f"{SCAN} --recompute", f"{SCAN} --mixed-precision bfloat16",
        "--framework torch", PLAIN)],
    "memory": [f"--model preact-1001 --batch-size 128 --steps 3 {flags}"
               for flags in (SCAN, f"{SCAN} --recompute")],
    # The README's headline table: plain graph, the trainer's default, PyTorch.
    "table": [f"--model {m} --steps {n} {flags}" for m, n in (
        ("preact-164 --batch-size 64", 16), ("preact-1001 --batch-size 32", 6))
        for flags in (PLAIN, "", "--framework torch")],
    # The trainer's default in float32 and bfloat16 against each PyTorch configuration.
    "precision": [f"--model {m} --steps {n} {flags}" for m, n in (
        ("preact-164 --batch-size 64", 16), ("preact-1001 --batch-size 32", 6))
        for flags in ("", "--mixed-precision bfloat16", *(
            f"--framework torch --torch-config {c}" for c in TORCH_CONFIGS))],
}


def run(flags: str, timeout: float | None = None) -> dict:
    """One `train_speed.py --json` process with `flags`: its result, or `{"flags", "error"}`
    (the last line of its stderr, or that it ran past `timeout` seconds and was stopped)."""
    argv = [sys.executable, os.path.join(HERE, "train_speed.py"), "--json", *flags.split()]
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"flags": flags, "error": [f"stopped after {timeout:.0f} s"]}
    if done.returncode:
        return {"flags": flags, "error": done.stderr.strip().splitlines()[-1:]}
    return {"flags": flags, **json.loads(done.stdout.strip().splitlines()[-1])}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--suite", choices=sorted(SUITES), required=True)
    p.add_argument("--output", default=os.path.join(HERE, "results.jsonl"))
    args = p.parse_args(argv)
    print(f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} cores, "
          f"oneDNN {'off' if host.onednn_off() else 'on'}; python {platform.python_version()}")
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
