"""Throughput of the CIFAR training pipeline (images/s), to check it is never the bottleneck.

    python benchmarks/input_pipeline.py [--data-dir DIR] [--batches 300]

DIR holds CIFAR-10 prepared by TFDS (default: TFDS' own data dir); this repository's tests
use `../shared/tensorflow_datasets`.

Every pass decodes the split's PNGs again (no in-memory cache: README.md here says why).
Compare with the model's training speed (fit's ms/step in the progress bar).
"""

from __future__ import annotations

import argparse
import time

from keras_preact.data import pipeline


def images_per_second(ds, batches: int, batch_size: int) -> float:
    iterator = iter(ds)
    next(iterator)  # start the pipeline's threads before timing
    start = time.perf_counter()
    for _ in range(batches):
        next(iterator)
    return batches * batch_size / (time.perf_counter() - start)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data-dir", help="TFDS data dir holding cifar10")
    parser.add_argument("--batch-size", type=int, default=128)
    parser.add_argument("--batches", type=int, default=300)
    args = parser.parse_args()
    ds = pipeline.train_dataset("cifar10", "train[:-5000]", args.batch_size, args.data_dir)
    speed = images_per_second(ds, args.batches, args.batch_size)  # each pass decodes alike
    print(f"cifar10 train pipeline, batch {args.batch_size}: {speed:,.0f} images/s")


if __name__ == "__main__":
    main()
