"""Where a training step's time goes: a TensorFlow profiler trace, summed per op type.

Builds and compiles the model with `train_speed.py`'s function (the trainer's path), warms up,
then traces `--steps` steps with `tf.profiler.experimental` and prints, per TensorFlow
executor thread, the time spent in each op type (e.g. `Conv2DBackpropFilter`), and on the
Python thread the large events (tracing, execution). `--first` traces the first `fit` call
instead (tracing, graph optimization, first step).

    python benchmarks/op_profile.py --model preact-164 --batch-size 64
    python benchmarks/op_profile.py --model preact-164 --batch-size 64 --first
"""

from __future__ import annotations

import argparse
import collections
import glob
import re
import sys
import tempfile
import time

from train_speed import build_model_and_data
from train_speed import parse_args as speed_args

# The Python thread's events that delimit the phases of a step call.
PHASES = re.compile(r"^(multi_step_on_iterator|tf\.function-graph_building|"
                    r"EagerLocalExecute: __inference|KernelAndDeviceFunc::Run)")


def op_type(event_name: str) -> str:
    """`.../while/Conv2D_2:_MklNativeConv2D` -> `Conv2D:_MklNativeConv2D`."""
    return re.sub(r"_\d+(?=:)|_\d+$", "", event_name.split("/")[-1])


def summarize(logdir: str, steps: int, top: int) -> None:
    from tensorflow.tsl.profiler.protobuf import xplane_pb2

    space = xplane_pb2.XSpace()
    with open(sorted(glob.glob(f"{logdir}/plugins/profile/*/*.xplane.pb"))[-1], "rb") as f:
        space.ParseFromString(f.read())
    for plane in space.planes:
        names = plane.event_metadata
        for line in plane.lines:
            if line.name == "python":
                print("python thread (start, duration): step call, tracing, from the call "
                      "to the kernels, the kernels")
                for ev in sorted(line.events, key=lambda e: e.offset_ps):
                    name = names[ev.metadata_id].name
                    if ev.duration_ps > 40e9 and PHASES.search(name):
                        print(f"  {ev.offset_ps / 1e9:8.0f} ms {ev.duration_ps / 1e9:8.0f} ms  "
                              f"{name[:90]}")
            elif line.name.startswith("tf_Compute"):
                per_type = collections.Counter()
                for ev in line.events:
                    name = names[ev.metadata_id].name
                    if name != "ExecutorState::Process":
                        per_type[op_type(name)] += ev.duration_ps / 1e9 / steps
                print(f"{line.name}: {sum(per_type.values()):.0f} ms per step in ops")
                for name, ms in per_type.most_common(top):
                    print(f"  {ms:8.1f} ms  {name[:90]}")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--first", action="store_true", help="trace the first fit call instead")
    p.add_argument("--top", type=int, default=15, help="op types shown per thread")
    args, rest = p.parse_known_args(argv)
    steps = 1 if args.first else 3
    speed = speed_args([*rest, "--steps", "3"])  # the same model options as train_speed.py

    import tensorflow as tf

    model, data, _ = build_model_and_data(speed)
    if not args.first:
        model.fit(data, steps_per_epoch=2, epochs=1, verbose=0)
    logdir = tempfile.mkdtemp(prefix="op_profile_")
    tf.profiler.experimental.start(logdir)
    start = time.perf_counter()
    model.fit(data, steps_per_epoch=steps, epochs=1, verbose=0)
    wall = time.perf_counter() - start
    tf.profiler.experimental.stop()
    print(f"{speed.model}, batch {speed.batch_size}: {steps} step(s) traced, "
          f"{wall * 1000:.0f} ms wall (profiler on)")
    summarize(logdir, steps, args.top)
    return 0


if __name__ == "__main__":
    sys.exit(main())
