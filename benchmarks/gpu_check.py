"""GPU check (issue 39, item 5): keras_preact's trainer on JAX in bfloat16 against PyTorch.

Run by `gpu_check.sh` (which makes Keras and keras_preact importable first) on a machine with
one GPU, `jax[cuda]`, PyTorch and NumPy, and neither TensorFlow nor a network. For each net
(preact-164 at batch 128, preact-1001 at batch 64) it trains a few hundred steps:

- **keras_preact**: `keras_preact.training.train(net, dataset=(images, labels), ...,
  mixed_precision="bfloat16")` on Keras' JAX backend, on synthetic uint8 CIFAR-shaped
  images, as a user would call it. The trainer takes no callbacks, so this driver wraps
  `keras.Model.fit` for the duration of the call to add one timing callback (the trainer's
  own callbacks and arguments are untouched): *first step* = from the trainer's `fit` call
  to the end of its first step (tracing and XLA compilation included), *images/s* = batch /
  median step time after the first two (`train_speed.summarize`), *train s* = the whole
  `train` call (plan, data pipeline, build, fit, saving). Steps are timed as Keras' fit loop
  hands them to callbacks, which read each step's logs: every step has finished on the GPU.
- **PyTorch**: the same net (`torch_preact.py`, same trainable parameter count, checked)
  in `channels_last` under `torch.autocast("cuda", bfloat16)`, on one synthetic batch on
  the GPU, each step synchronized.

Peak GPU memory: JAX's allocator's `peak_bytes_in_use` for the device, PyTorch's
`max_memory_allocated`. Each (net, framework) runs in its own process, all within
`--budget-s` (default 450 s, so that the whole check ends within 8 minutes). `--dry-run` runs
the same code on host CPU devices (`JAX_PLATFORMS=cpu`, PyTorch on the CPU), at depth 20,
batch 8 and 6 steps; memory is then the process' peak RSS.

    benchmarks/gpu_check.sh              # on the GPU machine
    benchmarks/gpu_check.sh --dry-run    # anywhere: the same code on host CPU devices
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import subprocess
import sys
import tempfile
import time

from train_speed import peak_rss_mb, summarize

HERE = os.path.dirname(os.path.abspath(__file__))
# (model, batch size, steps): "a few hundred steps" of each within the 8 minutes.
NETS = (("preact-164", 128, 300), ("preact-1001", 64, 200))
DRY_RUN = {"depth": 20, "batch_size": 8, "steps": 6}
TORCH_CONFIG = "channels-last-bf16"
TRAIN = "keras_preact.training.train"  # how a failure inside the trainer is reported
# Distinct synthetic images the trainer's dataset holds (it cycles through them).
EXAMPLES = 2048


@contextlib.contextmanager
def fit_timer():
    """While open, every `keras.Model.fit` call also runs a callback that records when each
    training step ends; yields the list of `[fit start, step 1 end, step 2 end, ...]` lists,
    one per fit call."""
    import keras

    class StepEnds(keras.callbacks.Callback):
        def __init__(self, ends):
            super().__init__()
            self.ends = ends

        def on_train_batch_end(self, batch, logs=None):
            self.ends.append(time.perf_counter())

    calls, fit = [], keras.Model.fit

    def timed_fit(self, *args, callbacks=None, **kwargs):
        calls.append([time.perf_counter()])
        return fit(self, *args, callbacks=[*(callbacks or []), StepEnds(calls[-1])], **kwargs)

    keras.Model.fit = timed_fit
    try:
        yield calls
    finally:
        keras.Model.fit = fit


def synthetic_cifar(n: int, classes: int = 10, seed: int = 0):
    import numpy as np

    rng = np.random.default_rng(seed)
    return (rng.integers(0, 256, size=(n, 32, 32, 3), dtype=np.uint8),
            rng.integers(0, classes, size=(n,)).astype("int64"))


def jax_peak_mb() -> float | None:
    import jax

    device = jax.local_devices()[0]
    if device.platform != "gpu":
        return None
    peak = (device.memory_stats() or {}).get("peak_bytes_in_use")
    return None if peak is None else round(peak / 2**20, 1)


def peak_memory(gpu_mb: float | None) -> dict:
    """The device's peak where it reports one, else the process' peak RSS (host devices)."""
    if gpu_mb is None:
        return {"peak_memory_mb": peak_rss_mb(), "memory": "RSS"}
    return {"peak_memory_mb": gpu_mb, "memory": "GPU"}


def run_keras(args) -> dict:
    os.environ.setdefault("KERAS_BACKEND", "jax")
    import jax
    import keras
    import numpy as np

    import keras_preact
    from keras_preact.training import train

    device = jax.local_devices()[0]
    if device.platform != "gpu" and not args.dry_run:
        raise SystemExit(f"JAX sees no GPU (its first device: {device}); --dry-run runs on "
                         "host CPU devices.")
    overrides = {"depth": args.depth} if args.depth else {}
    spec = keras_preact.resolve(args.model, **overrides)
    images, labels = synthetic_cifar(max(EXAMPLES, 2 * args.batch_size), spec.classes)
    with tempfile.TemporaryDirectory() as run_dir, fit_timer() as calls:
        start = time.perf_counter()
        try:
            model = train(args.model, output=os.path.join(run_dir, "run"),
                          dataset=(images, labels),
                          class_names=[str(c) for c in range(spec.classes)],
                          steps=args.steps, batch_size=args.batch_size,
                          mixed_precision="bfloat16", val_examples=0, overrides=overrides,
                          verbose=2)
        except Exception as error:  # one line that says where it failed (the table's)
            raise RuntimeError(f"{TRAIN}: {type(error).__name__}: {error}") from error
        train_s = time.perf_counter() - start
    ends = max(calls, key=len, default=[])  # the training fit (not an evaluation's)
    if len(ends) < 4:
        raise RuntimeError(f"The trainer ran {len(ends) - 1} timed steps, not {args.steps}: "
                           "it did not train through keras.Model.fit.")
    times = [b - a for a, b in zip(ends, ends[1:])]
    params = sum(int(np.prod(w.shape)) for w in model.trainable_weights)
    stages = "scan" if any(type(layer).__name__ == "ScannedUnits" for layer in model.layers) \
        else "layers"
    return summarize(0.0, times, args.batch_size, {
        "framework": "keras_preact", "backend": keras.backend.backend(), "stages": stages,
        "device": device.device_kind, "steps": len(times), "train_s": round(train_s, 1),
        **peak_memory(jax_peak_mb()), "trainable_params": params,
        "tensorflow_imported": sys.modules.get("tensorflow") is not None,  # none on the GPU machine
        "versions": {"jax": jax.__version__, "keras": keras.__version__,
                     "keras_preact": keras_preact.__version__}})


def run_torch(args) -> dict:
    os.environ["KERAS_BACKEND"] = "torch"  # keras_preact only gives the spec
    import torch
    from torch_preact import train_steps

    import keras_preact

    device = "cpu" if args.dry_run else "cuda"
    if device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("PyTorch sees no GPU; --dry-run runs on the CPU.")
    spec = keras_preact.resolve(args.model, **({"depth": args.depth} if args.depth else {}))
    build_s, times, params = train_steps(spec, args.batch_size, args.steps, TORCH_CONFIG,
                                         device=device)
    peak = round(torch.cuda.max_memory_allocated() / 2**20, 1) if device == "cuda" else None
    return summarize(build_s, times, args.batch_size, {
        "framework": "pytorch", "torch_config": TORCH_CONFIG, "steps": len(times),
        "device": torch.cuda.get_device_name() if device == "cuda" else "cpu",
        **peak_memory(peak), "trainable_params": params,
        "versions": {"torch": torch.__version__}})


def child(args, framework: str, model: str, batch: int, steps: int, timeout: float) -> dict:
    argv = [sys.executable, os.path.abspath(__file__), "--one", framework, "--model", model,
            "--batch-size", str(batch), "--steps", str(steps)]
    if args.depth:
        argv += ["--depth", str(args.depth)]
    if args.dry_run:
        argv.append("--dry-run")
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    if args.dry_run:
        env["JAX_PLATFORMS"] = "cpu"
    base = {"framework": framework, "model": model, "batch_size": batch, "depth": args.depth}
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=max(timeout, 1),
                              env=env)
    except subprocess.TimeoutExpired:
        return {**base, "error": f"stopped after {timeout:.0f} s (--budget-s)"}
    if done.returncode:
        lines = done.stderr.strip().splitlines()
        return {**base, "error": lines[-1] if lines else f"exit {done.returncode}"}
    return {**base, **json.loads(done.stdout.strip().splitlines()[-1])}


def table(results: list[dict]) -> list[str]:
    lines = ["| model, batch | framework | steps | first step s | images/s | peak memory MB "
             "| train s |", "|---|---|---|---|---|---|---|"]
    for r in results:
        who = (f"PyTorch ({TORCH_CONFIG})" if r["framework"] in ("torch", "pytorch") else
               f"keras_preact train ({r['backend']}, {r['stages']})" if "backend" in r else
               "keras_preact train")
        depth = f" (depth {r['depth']})" if r.get("depth") else ""
        head = f"| {r['model']}{depth}, {r['batch_size']} | {who} |"
        if "error" in r:
            lines.append(f"{head} error: {r['error']} | | | | |")
        else:
            lines.append(f"{head} {r['steps']} | {r['first_step_s']:.2f} | "
                         f"{r['images_per_s']:.1f} | {r['peak_memory_mb']:.0f} "
                         f"({r['memory']}) | "
                         f"{r.get('train_s', '')} |")
    return lines


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--dry-run", action="store_true",
                   help="host CPU devices, depth 20, batch 8, 6 steps: checks the script")
    p.add_argument("--budget-s", type=float, default=450,
                   help="all runs together stop within this (default %(default)s)")
    p.add_argument("--steps", type=int, help="steps of each run (default: each net's)")
    p.add_argument("--depth", type=int, help="override each net's depth")
    p.add_argument("--one", choices=["keras", "torch"], help=argparse.SUPPRESS)
    p.add_argument("--model", help=argparse.SUPPRESS)
    p.add_argument("--batch-size", type=int, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.dry_run:
        args.depth = args.depth or DRY_RUN["depth"]
    if args.one == "keras" and args.dry_run:
        # As on the GPU machine, which has no TensorFlow: else the trainer would find it here
        # and write TensorBoard logs with it.
        sys.modules["tensorflow"] = sys.modules["tensorflow_datasets"] = None
    if args.one:  # one (net, framework) in this process
        result = (run_keras if args.one == "keras" else run_torch)(args)
        print(json.dumps(result))
        return 0
    started = time.monotonic()
    runs = []
    for model, batch, steps in NETS:
        if args.dry_run:
            batch, steps = DRY_RUN["batch_size"], DRY_RUN["steps"]
        runs += [("keras", model, batch, args.steps or steps),
                 ("torch", model, batch, args.steps or steps)]
    # PyTorch's preact-1001 before keras_preact's: the slowest compile runs last.
    runs[2], runs[3] = runs[3], runs[2]
    results = []
    for framework, model, batch, steps in runs:
        left = args.budget_s - (time.monotonic() - started)
        results.append(child(args, framework, model, batch, steps, left))
        print(f"# {json.dumps(results[-1])}", flush=True)
    order = {name: i for i, (name, _, _) in enumerate(NETS)}
    results.sort(key=lambda r: (order[r["model"]], not r["framework"].startswith("keras")))
    seen = [r for r in results if "error" not in r]
    devices = sorted({r["device"] for r in seen})
    print(f"\ndevice: {', '.join(devices) or 'unknown'}"
          f"{' (dry run: host CPU, depth ' + str(args.depth) + ')' if args.dry_run else ''}")
    versions = {}
    for r in seen:
        versions.update(r["versions"])
    print("versions: " + ", ".join(f"{k} {v}" for k, v in versions.items()))
    for r in seen:  # the same architecture on both sides
        twin = [s for s in seen if s["model"] == r["model"]]
        if len({s["trainable_params"] for s in twin}) > 1:
            print(f"WARNING: {r['model']}: trainable parameters differ between frameworks: "
                  f"{[s['trainable_params'] for s in twin]}")
            break
    print("\n".join(table(results)))
    print(f"total {time.monotonic() - started:.0f} s")
    return 0 if len(seen) == len(results) else 1


if __name__ == "__main__":
    sys.exit(main())
