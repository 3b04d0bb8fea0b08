"""Build time of `keras_preact.build(name)` beside Keras' own ResNet152V2, each in a fresh process.

What a user waits for at `keras_preact.build("preact-1001")` (plain layers, 3,339 layers),
after TensorFlow's import and a first small build (both excluded):

    python benchmarks/build_speed.py --model preact-1001 --repeats 3

Prints one row per build (wall and CPU seconds, layers, ms per layer, load average) and the
medians; `--reference none` skips Keras' ResNet152V2 (`keras.applications`, weights=None).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time


def measure(model: str) -> dict:
    """Builds `model` once in this process; "ResNet152V2" is Keras' application."""
    from keras_preact import host

    host.use_onednn()
    import keras

    import keras_preact

    keras_preact.build("preact-20", depth=8)  # imports and first-use costs, not measured
    wall, cpu = time.perf_counter(), time.process_time()
    if model == "ResNet152V2":
        net = keras.applications.ResNet152V2(weights=None)
    else:
        net = keras_preact.build(model)
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    with open("/proc/loadavg") as f:
        load = f.read().split()[0]
    return {"model": model, "wall_s": wall, "cpu_s": cpu, "layers": len(net.layers),
            "weights": len(net.weights), "loadavg": load}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="preact-1001")
    parser.add_argument("--reference", default="ResNet152V2", choices=["ResNet152V2", "none"])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--one", help=argparse.SUPPRESS)  # internal: measure in this process
    args = parser.parse_args()
    if args.one:
        print(json.dumps(measure(args.one)))
        return
    models = [args.model] + ([args.reference] if args.reference != "none" else [])
    rows = {m: [] for m in models}
    for _ in range(args.repeats):  # interleaved, so both see the same load
        for m in models:
            out = subprocess.run([sys.executable, __file__, "--one", m], capture_output=True,
                                 text=True, check=True).stdout
            row = json.loads(out.splitlines()[-1])
            rows[m].append(row)
            print(f"{m:14s} wall {row['wall_s']:6.2f} s  cpu {row['cpu_s']:6.2f} s  "
                  f"{row['layers']} layers  {1e3 * row['wall_s'] / row['layers']:.2f} ms/layer  "
                  f"load {row['loadavg']}", flush=True)
    for m, r in rows.items():
        print(f"median {m}: wall {statistics.median(x['wall_s'] for x in r):.2f} s, "
              f"cpu {statistics.median(x['cpu_s'] for x in r):.2f} s")


if __name__ == "__main__":
    main()
