"""Serving speed of a network in four runtimes: TF (the SavedModel), ONNX Runtime, OpenVINO, LiteRT.

    python benchmarks/serving_speed.py [--model preact-164 --model preact-1001] [--repeats 200]
                                       [--batches 10] [--json]

Each model is exported once per format (`keras_preact.export.export_model`); every artifact is
then run in a fresh process of its own with the same conditions: all cores as threads
(`os.cpu_count()`), float32 (OpenVINO told so: it would compute in bfloat16 on this CPU), uint8
images in, the artifact's whole path (preprocessing inside; the SavedModel's `serving_default`
also resizes and takes the top 5). Per runtime:

- batch 1: median and p99 latency of `--repeats` calls after 5 warm-up calls;
- batch 64: images/s = 64 / median time of `--batches` calls after 2 warm-up calls;
- GFLOP/s reached = forward FLOPs per image x images/s, and its fraction of the machine's
  float32 peak, measured first in its own process (best of 5 4096x4096 TF matmuls).

Forward FLOPs per image count 2 per multiply-add of the convolutions and the classifier
(BatchNorm, ReLU and additions are under 1 % of it). The model's weights are its random
initialization: speed does not depend on them. With --json the last line is a JSON list.
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

host.use_onednn()  # TensorFlow as `keras-preact` runs it (keras_preact.host)

RUNTIMES = ("tf", "onnx", "openvino", "litert")
# Runtime -> the export format it runs.
FORMAT = {"tf": "saved_model", "onnx": "onnx", "openvino": "openvino", "litert": "litert"}
BIG_BATCH = 64
PEAK_SIDE = 4096


def forward_flops(model) -> int:
    """2 x the multiply-adds of every Conv2D and Dense layer, for one image."""
    import keras

    flops = 0
    for layer in model.layers:
        if isinstance(layer, keras.layers.Conv2D):
            height, width, filters = layer.output.shape[1:]
            kernel_h, kernel_w, channels, _ = layer.kernel.shape
            flops += 2 * height * width * kernel_h * kernel_w * channels * filters
        elif isinstance(layer, keras.layers.Dense):
            flops += 2 * layer.kernel.shape[0] * layer.kernel.shape[1]
    return flops


def runner(runtime: str, path: str, threads: int):
    """`call(uint8 images) -> probabilities` for the artifact at `path`."""
    if runtime == "tf":
        import tensorflow as tf

        tf.config.threading.set_intra_op_parallelism_threads(threads)
        serving = tf.saved_model.load(path).signatures["serving_default"]
        return lambda x: serving(images=tf.constant(x))["probabilities"].numpy()
    if runtime == "onnx":
        import onnxruntime as ort

        options = ort.SessionOptions()
        options.intra_op_num_threads = threads
        session = ort.InferenceSession(path, options)
        return lambda x: session.run(["probabilities"], {"images": x})[0]
    if runtime == "openvino":
        import openvino as ov

        config = {"INFERENCE_PRECISION_HINT": "f32", "INFERENCE_NUM_THREADS": threads}
        request = ov.Core().compile_model(path, "CPU", config).create_infer_request()
        return lambda x: request.infer({"images": x})["probabilities"]
    from ai_edge_litert.interpreter import Interpreter

    run = Interpreter(path, num_threads=threads).get_signature_runner()
    return lambda x: run(images=x)["probabilities"]


def timed(fn, calls: int, warmup: int) -> list[float]:
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(calls):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return times


def measure(runtime: str, path: str, side: int, repeats: int, batches: int) -> dict:
    """The worker: latency and throughput of one artifact, in this (fresh) process."""
    import numpy as np

    threads = os.cpu_count()
    call = runner(runtime, path, threads)
    rng = np.random.default_rng(0)
    one = rng.integers(0, 256, (1, side, side, 3), dtype=np.uint8)
    many = rng.integers(0, 256, (BIG_BATCH, side, side, 3), dtype=np.uint8)
    latency = timed(lambda: call(one), repeats, warmup=5)
    batch = timed(lambda: call(many), batches, warmup=2)
    return {
        "threads": threads,
        "batch1_median_ms": statistics.median(latency) * 1e3,
        "batch1_p99_ms": float(np.percentile(latency, 99)) * 1e3,
        "batch64_images_per_s": BIG_BATCH / statistics.median(batch),
    }


def measure_peak() -> dict:
    """The worker: float32 matmul GFLOP/s of TensorFlow on all cores (best of 5)."""
    import tensorflow as tf

    a = tf.random.normal([PEAK_SIDE, PEAK_SIDE])
    matmul = tf.function(lambda: tf.reduce_sum(tf.linalg.matmul(a, a)))
    best = min(timed(lambda: matmul().numpy(), 5, warmup=1))
    return {"peak_gflops": 2 * PEAK_SIDE**3 / best / 1e9}


def in_fresh_process(*worker_args: str) -> dict:
    out = subprocess.run(
        [sys.executable, __file__, "--worker", *worker_args],
        check=True, capture_output=True, text=True,
        env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"},
    ).stdout
    return json.loads(out.strip().splitlines()[-1])


def benchmark(name: str, repeats: int, batches: int, peak: float, base: str) -> list[dict]:
    import keras_preact
    from keras_preact.export import export_model
    from keras_preact.export.runtimes import FORMATS
    from keras_preact.export.signatures import model_side

    model = keras_preact.build(name)
    side, flops = model_side(model), forward_flops(model)
    rows = []
    for runtime in RUNTIMES:
        fmt = FORMAT[runtime]
        target = os.path.join(base, name) if fmt == "saved_model" else os.path.join(
            base, f"{name}{FORMATS[fmt]}")
        start = time.perf_counter()
        path = export_model(model, target, format=fmt)
        export_s = time.perf_counter() - start
        result = in_fresh_process("measure", runtime, path, str(side), str(repeats), str(batches))
        reached_gflops = flops * result["batch64_images_per_s"] / 1e9
        rows.append({
            "model": name, "runtime": runtime, "export_s": export_s, **result,
            "gflops_per_image": flops / 1e9, "batch64_gflops": reached_gflops,
            "batch64_peak_fraction": reached_gflops / peak,
            "batch1_peak_fraction": flops / (result["batch1_median_ms"] / 1e3) / 1e9 / peak,
        })
        print(f"{name} {runtime}: done", file=sys.stderr, flush=True)
    return rows


def table(rows: list[dict], peak: float) -> str:
    lines = [
        f"float32 peak of this machine (TF matmul, {rows[0]['threads']} threads): "
        f"{peak:.0f} GFLOP/s",
        "",
        "| model (GFLOP/image) | runtime | export s | batch 1 median ms | batch 1 p99 ms "
        "| batch 64 images/s | batch 64 GFLOP/s | % of peak, batch 1 / 64 |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['model']} ({r['gflops_per_image']:.2f}) | {r['runtime']} | {r['export_s']:.1f} "
            f"| {r['batch1_median_ms']:.1f} | {r['batch1_p99_ms']:.1f} "
            f"| {r['batch64_images_per_s']:.1f} | {r['batch64_gflops']:.0f} "
            f"| {100 * r['batch1_peak_fraction']:.0f} / {100 * r['batch64_peak_fraction']:.0f} |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", action="append", help="repeatable (default: preact-164 "
                        "and preact-1001)")
    parser.add_argument("--repeats", type=int, default=200, help="batch-1 calls per runtime")
    parser.add_argument("--batches", type=int, default=10, help="batch-64 calls per runtime")
    parser.add_argument("--json", action="store_true", help="print a JSON line last")
    parser.add_argument("--worker", nargs="+", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        kind, *rest = args.worker
        if kind == "peak":
            result = measure_peak()
        else:
            runtime, path, side, repeats, batches = rest
            result = measure(runtime, path, int(side), int(repeats), int(batches))
        print(json.dumps(result))
        return

    peak = in_fresh_process("peak")["peak_gflops"]
    rows = []
    with tempfile.TemporaryDirectory() as base:
        for name in args.model or ["preact-164", "preact-1001"]:
            rows += benchmark(name, args.repeats, args.batches, peak, base)
    print(table(rows, peak))
    if args.json:
        print(json.dumps(rows))


if __name__ == "__main__":
    main()
