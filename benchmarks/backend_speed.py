"""Training speed on this CPU on Keras' TensorFlow and JAX backends and in PyTorch, side by side.

Issue 39, item 4: which backend a user of this CPU should train on. Each row is one
`train_speed.py` process (`levers.run`: its own first step and peak RSS, nothing else
loaded: the JAX rows import no TensorFlow, the PyTorch rows neither), the net built and
compiled as the trainer builds it (`build_and_compile`), fitted on a synthetic batch:

- TensorFlow and JAX, each with the plain layer graph (`--stages layers`) and with scanned
  stages (`--stages scan`, the trainer's default for these nets), in float32 and in
  `--mixed-precision bfloat16`; JAX always jits the step (Keras' own choice there);
- PyTorch eager, `channels_last`, in float32 and under `torch.autocast` bfloat16
  (`torch_preact.py`, the same trainable parameter count).

    python benchmarks/backend_speed.py                 # the README's table, ~45-60 min, 2 cores
    python benchmarks/backend_speed.py --forms scan    # without the plain-graph rows
    python benchmarks/backend_speed.py --quick         # depth 20, batch 4, 3 steps (tests)

Prints a Markdown table (the CPU named above it, `host.describe()`) and, for each net and
precision, which configuration was fastest; a row that cannot run says why (e.g. scanned
stages on a backend that lacks them). Results also go, one JSON object per line, to
`--output` (appended).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys

from levers import run
from train_speed import BACKENDS

from keras_preact import host

HERE = os.path.dirname(os.path.abspath(__file__))
FORMS = ("layers", "scan")
PRECISIONS = ("off", "bfloat16")
# (model, batch size, steps, depth override): the two nets, and the quick check
# (depth 20: two units a stage, so the scanned stages do scan).
NETS = (("preact-164", 64, 16, None), ("preact-1001", 32, 6, None))
QUICK = (("preact-164", 4, 3, 20),)
TORCH_CONFIG = {"off": "channels-last", "bfloat16": "channels-last-bf16"}


def configurations(nets=NETS, forms=FORMS, precisions=PRECISIONS):
    """(net label, framework label, form, precision, train_speed flags) of every row, in the
    order they run: per net and precision, TensorFlow's and JAX's forms, then PyTorch."""
    for model, batch, steps, depth in nets:
        net = f"{model}{f' (depth {depth})' if depth else ''}, {batch}"
        base = (f"--model {model} --batch-size {batch} --steps {steps}"
                + (f" --depth {depth}" if depth else ""))
        for precision in precisions:
            for backend in BACKENDS:
                for form in forms:
                    yield (net, backend, form, precision, f"{base} --backend {backend} "
                           f"--stages {form} --mixed-precision {precision}")
            yield (net, "pytorch", "channels_last", precision,
                   f"{base} --framework torch --torch-config {TORCH_CONFIG[precision]}")


def row(net: str, framework: str, form: str, precision: str, result: dict) -> str:
    cells = [net, framework, form, "bfloat16" if precision == "bfloat16" else "float32"]
    if "error" in result:
        why = " ".join(result["error"]) or "failed"
        return "| " + " | ".join(cells) + f" | error: {why} | | | |"
    return "| " + " | ".join(cells) + (
        f" | {result['build_s']:.2f} | {result['first_step_s']:.2f} | "
        f"{result['images_per_s']:.1f} | {result['peak_rss_mb']:.0f} |")


def fastest(rows: list[tuple]) -> list[str]:
    """One line per (net, precision): the configuration with the most images/s and the one
    with the quickest first step."""
    lines, groups = [], {}
    for net, framework, form, precision, result in rows:
        if "error" not in result:
            groups.setdefault((net, precision), []).append((framework, form, result))
    for (net, precision), group in groups.items():
        speed = max(group, key=lambda g: g[2]["images_per_s"])
        start = min(group, key=lambda g: g[2]["first_step_s"])
        lines.append(f"- {net}, {'bfloat16' if precision == 'bfloat16' else 'float32'}: most "
                     f"images/s {speed[0]} {speed[1]} ({speed[2]['images_per_s']:.1f}); "
                     f"quickest first step {start[0]} {start[1]} "
                     f"({start[2]['first_step_s']:.1f} s)")
    return lines


def versions(results: list[dict]) -> str:
    seen = {"python": platform.python_version()}
    for r in results:
        seen.update(r.get("versions", {}))
    seen.pop("threads", None)
    return ", ".join(f"{k} {v}" for k, v in seen.items())


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--quick", action="store_true",
                   help="one tiny net (preact-164 at depth 20, batch 4, 3 steps): a check")
    p.add_argument("--nets", nargs="+", choices=[n[0] for n in NETS],
                   help="only these of the issue's nets")
    p.add_argument("--forms", nargs="+", choices=FORMS, default=list(FORMS))
    p.add_argument("--precisions", nargs="+", choices=PRECISIONS, default=list(PRECISIONS))
    p.add_argument("--timeout-s", type=float, default=900,
                   help="stop a row's process after this long (default %(default)s)")
    p.add_argument("--output", default=os.path.join(HERE, "results.jsonl"))
    args = p.parse_args(argv)
    nets = QUICK if args.quick else [n for n in NETS if not args.nets or n[0] in args.nets]
    print(f"machine: {host.describe()}", flush=True)
    print("| model, batch | framework | form | precision | build s | first step s | images/s "
          "| peak RSS MB |")
    print("|---|---|---|---|---|---|---|---|", flush=True)
    rows = []
    for net, framework, form, precision, flags in configurations(nets, args.forms,
                                                                 args.precisions):
        result = run(flags, timeout=args.timeout_s)
        with open(args.output, "a") as f:
            f.write(json.dumps({"suite": "backend_speed", **result}) + "\n")
        rows.append((net, framework, form, precision, result))
        print(row(net, framework, form, precision, result), flush=True)
    print(f"\nversions: {versions([r[-1] for r in rows])}")
    print("\n".join(["fastest:", *fastest(rows)]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
