"""Training speed of a keras_preact network: build time, first step, steady images/s, peak RSS.

The model is built by `keras_preact.build` and compiled as `keras-preact train` compiles it
(`SGDWithL2` on the paper's schedule, sparse cross-entropy, accuracy), then trained by one
`model.fit` call on a synthetic batch (so the input pipeline costs nothing). Steady rate =
batch / median step time after the first two executions; first step = from the `fit` call
to the end of the first step (tracing, graph optimization, the step itself). Peak RSS is
the process' high-water mark (`ru_maxrss`), so run one configuration per process.

    python benchmarks/train_speed.py --model preact-164 --batch-size 64 --steps 20
    python benchmarks/train_speed.py --model preact-1001 --batch-size 32 --steps 8 \
        --compare torch --json

`--compare torch` then runs the same architecture (same trainable parameter count,
asserted) in PyTorch eager in a subprocess and prints the ratios. By default the net is
built as `keras-preact train` builds it (`--stages auto`: scanned stages for full
pre-activation nets). Levers: `--stages layers|scan` (`--no-fused`, `--recompute`),
`--mixed-precision bfloat16`, `--steps-per-execution N`, `--grappler PRESET`,
`--jit-compile`, `--strategy one-device` (builds the optimizer and metrics before fit, so the
train step is traced once, not twice).

`--backend jax` runs the same build, compile and fit on Keras' JAX backend (default: the
`KERAS_BACKEND` environment variable, else TensorFlow), without importing TensorFlow: the
synthetic batch comes from a Python generator, and the TensorFlow-only levers (`--grappler`,
`--strategy` other than auto) are refused and the step is always jitted (XLA: Keras' own
choice on JAX). `backend_speed.py` runs both backends and PyTorch
side by side.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time

from keras_preact import host
from keras_preact.training.config import TrainConfig, add_arguments

# TensorFlow as `keras-preact` runs it: oneDNN on wherever keras_preact.host turns it on
# (TF_ENABLE_ONEDNN_OPTS=0 in the environment measures TensorFlow without it).
host.use_onednn()

# The PyTorch configurations `--torch-config` runs (torch_preact.train_steps): eager NCHW
# (PyTorch's default), channels_last memory (oneDNN's preferred layout on CPU), and
# channels_last under `torch.autocast("cpu", bfloat16)`, the counterpart of Keras' bfloat16.
TORCH_CONFIGS = ("eager", "channels-last", "channels-last-bf16")

BACKENDS = ("tensorflow", "jax")

# Grappler presets (tf.config.optimizer.set_experimental_options). "default": TF's own.
GRAPPLER = {
    "default": {},
    "off": {"disable_meta_optimizer": True},
    # Keep the passes that pay on CPU (pruning, constant folding, remapper fusions); skip
    # the ones whose cost grows with graph size but gain little for a conv net.
    "lean": {"layout_optimizer": False, "arithmetic_optimization": False,
             "dependency_optimization": False, "loop_optimization": False,
             "shape_optimization": False, "implementation_selector": False,
             "debug_stripper": False},
}


# The recipe's flags this benchmark takes (as `keras-preact train` takes them).
RECIPE_FLAGS = ("batch_size", "stages", "recompute", "mixed_precision", "jit_compile", "strategy")


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", required=True, help="registered name, e.g. preact-1001")
    p.add_argument("--depth", type=int, help="override the depth (e.g. 20 for a quick run)")
    p.add_argument("--steps", type=int, default=20, help="training steps in the fit call")
    p.add_argument("--json", action="store_true", help="one JSON object on the last line")
    p.add_argument("--compare", choices=["torch"],
                   help="also run PyTorch (--torch-config); print ratios")
    p.add_argument("--framework", choices=["keras", "torch"], default="keras",
                   help="keras, or the PyTorch reference alone (--torch-config)")
    p.add_argument("--backend", choices=BACKENDS,
                   default=os.environ.get("KERAS_BACKEND") or "tensorflow",
                   help="Keras' backend (default: $KERAS_BACKEND, else %(default)s)")
    p.add_argument("--no-fused", action="store_true", help="scan: Keras BN ops, not fused")
    p.add_argument("--bn-relu", choices=["recompute", "keep"],
                   help="scan's backward pass: recompute each BN + ReLU or keep its output "
                        "(default: the trainer's choice, keep in mixed precision)")
    p.add_argument("--steps-per-execution", type=int, default=1)
    p.add_argument("--grappler", choices=sorted(GRAPPLER), default="default")
    p.add_argument("--torch-config", choices=TORCH_CONFIGS,
                   help="the PyTorch side (default: its strongest in the same precision: "
                        "channels-last, or channels-last-bf16 with --mixed-precision bfloat16)")
    add_arguments(p, RECIPE_FLAGS, batch_size=64)
    args = p.parse_args(argv)
    if args.steps < 3 * args.steps_per_execution:
        p.error(f"--steps must be at least 3 executions ({3 * args.steps_per_execution}) to "
                f"measure a steady rate. Received: --steps {args.steps}")
    if args.backend != "tensorflow" and args.framework == "keras":
        tf_only = {"--grappler": args.grappler != "default",
                   "--strategy": args.strategy not in (None, "auto")}
        for flag in (f for f, given in tf_only.items() if given):
            p.error(f"{flag} is a TensorFlow lever. Received: --backend {args.backend}")
        # Keras' JAX trainer jits the step only with jit_compile (its "auto"); without it
        # JAX runs op by op, which nobody trains with.
        args.jit_compile = True
    try:
        args.config = TrainConfig(**{name: getattr(args, name) for name in RECIPE_FLAGS},
                                  overrides={"depth": args.depth} if args.depth else {})
    except ValueError as error:
        p.error(str(error))
    if args.torch_config is None:
        args.torch_config = ("channels-last-bf16" if args.config.mixed_precision == "bfloat16"
                             else "channels-last")
    return args


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux: kB


def summarize(build_s: float, step_times: list[float], batch_size: int, extra: dict) -> dict:
    """`step_times[i]` = seconds of execution i, each of `k = extra['steps_per_execution']`
    steps; the first execution's extra k-1 steps are charged at the steady rate."""
    k = extra.get("steps_per_execution", 1)
    steady = statistics.median(step_times[2:]) / k
    return {"build_s": round(build_s, 3),
            "first_step_s": round(step_times[0] - (k - 1) * steady, 3),
            "images_per_s": round(batch_size / steady, 2),
            "peak_rss_mb": round(peak_rss_mb(), 1), **extra}


def build_model_and_data(args):
    """The model as `keras-preact train` builds and compiles it for `args`, and a repeated
    synthetic batch; returns `(model, data, build seconds)`. On TensorFlow the batch is a
    repeated `tf.data.Dataset` under the trainer's strategy; on another backend, an endless
    generator of the same NumPy batch (no TensorFlow imported)."""
    import contextlib

    import numpy as np

    import keras_preact
    from keras_preact.arch import scan
    from keras_preact.training import distribute, paper_schedule
    from keras_preact.training.net import build_and_compile
    from keras_preact.training.resume import resolve_stages

    spec = keras_preact.resolve(args.model, **args.config.overrides)
    args.stages = resolve_stages(args.stages, spec)  # reported as resolved
    if args.backend == "tensorflow":
        import tensorflow as tf

        tf.config.optimizer.set_experimental_options(GRAPPLER[args.grappler])
        scope = distribute.select_strategy(args.strategy).scope()
    else:
        scope = contextlib.nullcontext()
    with scope:
        start = time.perf_counter()
        # Exactly what `keras-preact train` fits (compiling traces nothing in Keras 3).
        model = build_and_compile(args.model, paper_schedule(), args.config,
                                  steps_per_execution=args.steps_per_execution)
        build_s = time.perf_counter() - start
        scan.set_options(model, fused=not args.no_fused)
        if args.bn_relu:
            scan.set_options(model, recompute_bn=args.bn_relu == "recompute")
    rng = np.random.default_rng(0)
    x = rng.normal(size=(args.batch_size, *spec.input_shape)).astype("float32")
    y = rng.integers(0, spec.classes, size=(args.batch_size,)).astype("int64")
    if args.backend == "tensorflow":
        return model, tf.data.Dataset.from_tensors((x, y)).repeat(), build_s

    def batches():
        while True:
            yield x, y

    return model, batches(), build_s


def backend_version(backend: str) -> str:
    import importlib

    return importlib.import_module(backend).__version__


def run_keras(args) -> dict:
    os.environ["KERAS_BACKEND"] = args.backend  # before Keras is imported
    import keras
    import numpy as np

    model, data, build_s = build_model_and_data(args)
    if keras.backend.backend() != args.backend:
        raise RuntimeError(f"Keras was imported on {keras.backend.backend()!r} before "
                           f"--backend {args.backend} could take effect.")

    class Timer(keras.callbacks.Callback):
        def __init__(self):
            super().__init__()
            self.ends = []

        def on_train_batch_end(self, batch, logs=None):
            self.ends.append(time.perf_counter())

    timer = Timer()
    start = time.perf_counter()
    model.fit(data, steps_per_epoch=args.steps, epochs=1, callbacks=[timer], verbose=0,
              shuffle=False)
    ends = [start] + timer.ends
    times = [b - a for a, b in zip(ends, ends[1:])]
    params = sum(int(np.prod(w.shape)) for w in model.trainable_weights)
    return summarize(build_s, times, args.batch_size, {
        "framework": "keras", "backend": args.backend, "trainable_params": params,
        "steps_per_execution": args.steps_per_execution, "versions": {
            args.backend: backend_version(args.backend), "keras": keras.__version__},
        "tensorflow_imported": "tensorflow" in sys.modules})


def run_torch(args) -> dict:
    # keras_preact (for the spec) then loads Keras on torch: no TensorFlow in this process.
    os.environ["KERAS_BACKEND"] = "torch"
    import torch
    from torch_preact import train_steps

    import keras_preact

    spec = keras_preact.resolve(args.model, **({"depth": args.depth} if args.depth else {}))
    build_s, times, params = train_steps(spec, args.batch_size, args.steps, args.torch_config)
    return summarize(build_s, times, args.batch_size, {
        "framework": "torch", "torch_config": args.torch_config, "trainable_params": params,
        "versions": {"torch": torch.__version__, "threads": torch.get_num_threads()}})


def torch_subprocess(args) -> dict:
    """Runs the torch side in its own process (own peak RSS, no TF in memory)."""
    argv = [sys.executable, os.path.abspath(__file__), "--framework", "torch", "--json",
            "--model", args.model, "--batch-size", str(args.batch_size), "--steps",
            str(args.steps)] + (["--depth", str(args.depth)] if args.depth else []) + (
            ["--torch-config", args.torch_config])
    out = subprocess.run(argv, check=True, capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def main(argv=None) -> int:
    args = parse_args(argv)
    # Torch first, from a still small process: a child's ru_maxrss starts at its parent's
    # resident size at fork (Linux keeps it across exec).
    reference = torch_subprocess(args) if args.compare == "torch" else None
    result = run_torch(args) if args.framework == "torch" else run_keras(args)
    result["model"], result["batch_size"] = args.model, args.batch_size
    if args.framework == "keras":
        result["options"] = {k: getattr(args, k) for k in (
            *RECIPE_FLAGS[1:], "no_fused", "bn_relu", "steps_per_execution", "grappler")}
        if args.backend == "tensorflow":
            result["onednn"] = not host.onednn_off()
    if reference:
        if reference["trainable_params"] != result["trainable_params"]:
            raise AssertionError(f"Not the same architecture: keras has "
                                 f"{result['trainable_params']} trainable parameters, torch "
                                 f"{reference['trainable_params']}.")
        result["torch"] = reference
        # > 1 means keras is better: faster start, more images/s, less memory.
        result["ratios_keras_vs_torch"] = {
            "first_step_speedup": round(reference["first_step_s"] / result["first_step_s"], 3),
            "images_per_s": round(result["images_per_s"] / reference["images_per_s"], 3),
            "memory_saving": round(reference["peak_rss_mb"] / result["peak_rss_mb"], 3)}
    if not args.json:
        rows = [result] + ([result["torch"]] if "torch" in result else [])
        for r in rows:
            who = (f"torch {r['torch_config']}" if r["framework"] == "torch" else
                   f"keras (oneDNN {'on' if r['onednn'] else 'off'})" if "onednn" in r else
                   f"keras ({r['backend']})")
            print(f"{who:>24} {args.model} batch {args.batch_size}: build "
                  f"{r['build_s']:.2f} s, first step {r['first_step_s']:.2f} s, "
                  f"{r['images_per_s']:.2f} images/s, peak RSS {r['peak_rss_mb']:.0f} MB")
        if "ratios_keras_vs_torch" in result:
            print("keras vs torch (>1: keras better):", result["ratios_keras_vs_torch"])
    else:
        print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
