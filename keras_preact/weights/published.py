"""The published weights: one `pretrained.register` call per (model name, tag), as data.

Tags trained here are made by tools/release_weights.py from the run's own files (the
reproduction recipe, every run made and the curves are in README.md, "Trained weights");
ImageNet tags are converted from timm's checkpoints (`keras_preact.weights.timm`). `keras_preact`
imports this module, so every record is registered before any lookup.
"""

from __future__ import annotations

import dataclasses

from keras_preact.preprocessing import TIMM_DEFAULT
from keras_preact.weights.records import ConvertedRecord, WeightsRecord, register

# Trained here, shipped in the package.
register(WeightsRecord(
    model="preact-20", tag="cifar10", dataset="cifar10", file="preact-20-cifar10.weights.h5",
    sha256="670ab2018583777bed18b50ee1f16bb9649d82ede83b06c692adb10a0d6e20ba",
    test_accuracy=0.9149, compare_with="resnet-20",
    command="keras-preact train preact-20 --val-examples 0 --mixed-precision bfloat16 --seed 0 "
            "--data-dir DATA_DIR --output runs/preact-20-cifar10",
    iterations=64000, precision="bfloat16", wall_time_h=9.13,
    machine="Intel(R) Xeon(R) Processor, 2 cores, 24 GB, AVX2, AVX-512, AVX512-BF16, AMX, "
            "oneDNN on; OneDeviceStrategy, replicas: 1",
    keras_preact_version="0.1.0",
    note="the paper's complete CIFAR recipe (64k iterations; lr 0.01 for 400 iterations, then "
         "0.1, 0.01, 0.001 from 0 / 32k / 48k) on all 50,000 training images, in bfloat16 "
         "mixed precision (Keras' mixed_bfloat16: float32 weights, BN statistics and loss), "
         "scanned stages, seed 0; trained in three sessions, each resumed from the run's "
         "backup",
    runs=("2026-12-03: float32, 32k iterations on train[:-5000]: 91.10 % on train[-5000:]; "
          "published, then withdrawn: it had started from tied kernels (a bug, fixed since), "
          "so its command could not reproduce it",
          "2026-12-05: float32, 24k iterations on train[:-5000], independent kernels: 90.52 % "
          "on train[-5000:]; not published",
          "2026-12-05: bfloat16, 32k iterations on train[:-5000]: 90.07 % on the test split, "
          "91.54 % on train[-5000:]; published, replaced on 2026-12-06",
          "2026-12-06: bfloat16, 64k iterations on train: 91.49 % on the test split, scored "
          "in float32 (first recorded as 91.46 %, scored in the run's mixed_bfloat16); "
          "published (this file)")))
register(WeightsRecord(
    model="resnet-20", tag="cifar10", dataset="cifar10", file="resnet-20-cifar10.weights.h5",
    sha256="465e08c1b445db2bc18e6fb0a9e529dcc2699b9332144ebd5d93a3ced98671ac",
    test_accuracy=0.9179, compare_with="resnet-20",
    command="keras-preact train resnet-20 --val-examples 0 --mixed-precision bfloat16 --seed 0 "
            "--data-dir DATA_DIR --output runs/resnet-20-cifar10",
    iterations=64000, precision="bfloat16", wall_time_h=5.99,
    machine="Intel(R) Xeon(R) Processor, 2 cores, 24 GB, AVX2, AVX-512, AVX512-BF16, AMX, "
            "oneDNN on; OneDeviceStrategy, replicas: 1",
    keras_preact_version="0.1.0",
    note="the paper's complete CIFAR recipe (64k iterations; lr 0.01 for 400 iterations, then "
         "0.1, 0.01, 0.001 from 0 / 32k / 48k) on all 50,000 training images, in bfloat16 mixed "
         "precision (Keras' mixed_bfloat16: float32 weights, BN statistics and loss), as the "
         "plain layer graph, seed 0; trained in three sessions, each resumed from the run's backup",
    runs=("2026-12-04: bfloat16, 24k iterations on train[:-5000]: 89.87 % on the test split, "
          "90.64 % on train[-5000:]; published, replaced on 2026-12-06",
          "2026-12-06: bfloat16, 64k iterations on train: 91.79 % on the test split, scored "
          "in float32 (first recorded as 91.88 %, scored in the run's mixed_bfloat16); "
          "published (this file)")))

# ImageNet weights converted from timm's ResNetV2 checkpoints (keras_preact.weights.timm), into the
# network timm computes (preact-*-imagenet-timm). Their SHA-256 is not recorded yet: they
# could not be downloaded where these records were written (see `ConvertedRecord.sha256`).
# Top-1: timm's results/results-imagenet.csv (huggingface/pytorch-image-models, last changed
# in commit 4e5207c7, 2025-10-30), ImageNet-1k val at 224, the tag's crop_pct, bicubic.
TIMM_RESULTS = ("timm results/results-imagenet.csv (huggingface/pytorch-image-models@4e5207c7), "
                "224 px")
for _depth, _tag, _top1, _crop in [(18, "ra4_e3600_r224_in1k", 73.572, 0.9),
                                   (34, "ra4_e3600_r224_in1k", 77.626, 0.9),
                                   (50, "a1h_in1k", 80.410, 0.95),
                                   (101, "a1h_in1k", 82.042, 0.95)]:
    register(ConvertedRecord(
        model=f"preact-{_depth}-imagenet-timm", tag="imagenet", dataset="imagenet2012",
        arch=f"resnetv2_{_depth}",
        url=f"https://huggingface.co/timm/resnetv2_{_depth}.{_tag}/resolve/main/model.safetensors",
        sha256=None, top1=_top1, top1_source=TIMM_RESULTS,
        preprocessing=dataclasses.replace(TIMM_DEFAULT, crop_pct=_crop, interpolation="bicubic"),
        note=f"timm's resnetv2_{_depth}.{_tag}, converted; top-1 is timm's, not measured here"))
