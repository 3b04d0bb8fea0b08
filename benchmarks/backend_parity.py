"""Backend parity (issue 39's goal): one recipe, two engines.

Trains `--model` (default preact-20) for `--steps` steps with `keras-preact train` on Keras'
TensorFlow backend and on its JAX backend, with the same flags and each of `--seeds`, then
scores every run with `keras-preact evaluate` (on TensorFlow, so both are scored by the same
code) on the CIFAR-10 test split. Prints one row per run, then each backend's mean and
spread: a backend is within noise of the other when the means differ by less than the seeds'
spread. Every run made is printed; none is chosen.

    PYTHONPATH=. python benchmarks/backend_parity.py --data-dir ../shared/tensorflow_datasets

Each run is a fresh process; on 2 CPU cores a TensorFlow run takes ~5 min, a JAX one several
times longer (benchmarks/README.md, "TensorFlow, JAX and PyTorch side by side").
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

from keras_preact import host

BACKENDS = ("tensorflow", "jax")


def cli(argv: list[str], backend: str) -> str:
    """Runs `keras-preact ARGV` on `backend`; its stdout (its stderr on failure, one line)."""
    env = {**os.environ, "KERAS_BACKEND": backend}
    done = subprocess.run([sys.executable, "-m", "keras_preact.cli", *argv], env=env,
                          capture_output=True, text=True)
    if done.returncode:
        lines = done.stderr.strip().splitlines() or [f"exit {done.returncode}"]
        raise SystemExit(f"keras-preact {' '.join(argv)} on {backend}: {lines[-1]}")
    return done.stdout


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", default="preact-20")
    p.add_argument("--steps", type=int, default=400)
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--backends", nargs="+", choices=BACKENDS, default=list(BACKENDS),
                   help="only these (JAX trains several times slower on a CPU)")
    p.add_argument("--data-dir", default=None, help="TFDS data_dir holding cifar10")
    p.add_argument("--train-flag", action="append", default=[], metavar="FLAG",
                   help="another `keras-preact train` flag for every run, e.g. "
                   "--train-flag=--mixed-precision=bfloat16")
    args = p.parse_args(argv)
    data = ["--data-dir", args.data_dir] if args.data_dir else []
    print(f"machine: {host.describe()}", flush=True)
    print("| backend | seed | test accuracy % | train s |\n|---|---|---|---|", flush=True)
    scores = {backend: [] for backend in args.backends}
    with tempfile.TemporaryDirectory() as runs:
        for seed in args.seeds:
            for backend in args.backends:
                run_dir = os.path.join(runs, f"{backend}-{seed}")
                start = time.perf_counter()
                cli(["train", args.model, "--steps", str(args.steps), "--seed", str(seed),
                     "--val-examples", "0", "--output", run_dir, *data, *args.train_flag],
                    backend)
                train_s = time.perf_counter() - start
                result = json.loads(cli(["evaluate", run_dir, "--json"], "tensorflow")
                                    .strip().splitlines()[-1])
                scores[backend].append(100 * result["accuracy"])
                print(f"| {backend} | {seed} | {scores[backend][-1]:.2f} | {train_s:.0f} |",
                      flush=True)
    print()
    for backend, accuracies in scores.items():
        spread = statistics.stdev(accuracies) if len(accuracies) > 1 else float("nan")
        print(f"{backend}: mean {statistics.mean(accuracies):.2f} %, "
              f"standard deviation {spread:.2f} over seeds {args.seeds}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
