"""Export time of a network (default preact-1001, target <= 30 s) and the latency of the exported
`serving_default` at batch 1 against `model.predict` on the same input.

    python benchmarks/export_speed.py [--model preact-1001] [--repeats 20] [--json]

The SavedModel is loaded back with `tf.saved_model.load` (as TF Serving does); latencies are
medians after one warm-up call. With --json the last line is a JSON object of the figures.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time

from keras_preact import host

host.use_onednn()  # TensorFlow as `keras-preact` runs it (keras_preact.host)


def median_seconds(fn, repeats: int) -> float:
    fn()  # warm-up: tracing / graph optimization
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="preact-1001")
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--json", action="store_true", help="print a JSON line last")
    args = parser.parse_args()

    import numpy as np
    import tensorflow as tf

    import keras_preact
    from keras_preact.api import preprocessing_of
    from keras_preact.export import export_model
    from keras_preact.export.signatures import model_side
    from keras_preact.preprocessing import preprocess_input

    model = keras_preact.build(args.model)
    side = model_side(model)
    image = np.random.default_rng(0).integers(0, 256, (1, side, side, 3), dtype=np.uint8)
    with tempfile.TemporaryDirectory() as base:
        start, cpu = time.perf_counter(), time.process_time()
        version_dir = export_model(model, base)
        export_s, export_cpu_s = time.perf_counter() - start, time.process_time() - cpu
        start = time.perf_counter()
        serving = tf.saved_model.load(version_dir).signatures["serving_default"]
        load_s = time.perf_counter() - start
        images = tf.constant(image)
        serve_s = median_seconds(lambda: serving(images=images)["probabilities"].numpy(),
                                 args.repeats)
        normalized = preprocess_input(image, preprocessing_of(model).stats)
        predict_s = median_seconds(lambda: model.predict(normalized, verbose=0), args.repeats)
        served = serving(images=images)["probabilities"].numpy()
        predicted = model.predict(normalized, verbose=0)
    figures = {
        "model": args.model,
        "params": model.count_params(),
        "export_s": round(export_s, 2),
        "export_target_s": 30,
        # CPU seconds of this process: less sensitive than wall time to a busy machine.
        "export_cpu_s": round(export_cpu_s, 2),
        "load_s": round(load_s, 2),
        "serving_default_batch1_ms": round(serve_s * 1e3, 2),
        "model_predict_batch1_ms": round(predict_s * 1e3, 2),
        # An untrained 1001-layer net may overflow to NaN: equal_nan compares those too.
        "outputs_match_1e-5": bool(
            np.allclose(served, predicted, rtol=0, atol=1e-5, equal_nan=True)
        ),
    }
    print(f"{args.model}: {figures['params'] / 1e6:.2f}M parameters")
    print(f"export            {export_s:8.2f} s   (target <= 30 s; {export_cpu_s:.1f} s CPU)")
    print(f"load SavedModel   {load_s:8.2f} s")
    print(f"serving_default   {serve_s * 1e3:8.2f} ms  (batch 1, median of {args.repeats})")
    print(f"model.predict     {predict_s * 1e3:8.2f} ms  (batch 1, median of {args.repeats})")
    print(f"served == predicted (atol 1e-5): {figures['outputs_match_1e-5']}")
    if args.json:
        print(json.dumps(figures))


if __name__ == "__main__":
    main()
