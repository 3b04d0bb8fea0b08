"""Maintainers: turn a finished `keras-preact train` run into published weights.

    python tools/release_weights.py RUN_DIR --tag cifar10 --data-dir DIR \
        --compare-with resnet-20 --command "keras-preact train ..." [--note "..."]

Writes `keras_preact/weights/released/<model>-<tag>.weights.h5` in the plain layer form (the form of
RUN_DIR/model.keras, whatever form the run trained in), measures that file's accuracy on the
dataset's official test split (and on the run's validation slice, if it held one out) with
`keras_preact.training.evaluate`, as `keras-preact evaluate NAME --weights TAG` does: the file
in `build(NAME, weights=FILE)`, which computes in `pretrained.SCORED_IN` whatever precision the
run trained in (its model.keras keeps the run's dtype policy, e.g. mixed_bfloat16), and
prints the
`register(...)` call to paste into keras_preact/published.py. The
figures come from the run's own files (config.json; sessions.json for the wall time, summed
over every session, the machines and the date) and this evaluation, never typed by hand. Its
`runs` are the tag's earlier runs (from the record it replaces, if any) and this one.
"""

from __future__ import annotations

import argparse
import datetime
import os

import keras_preact
from keras_preact import cli, rundir
from keras_preact.weights import records

cli.import_tensorflow()  # as `keras-preact` loads it: oneDNN on, no start-up log lines
from keras_preact.data import pipeline, sources  # noqa: E402  (imports TensorFlow)
from keras_preact.training import evaluate  # noqa: E402


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("run_dir")
    p.add_argument("--tag", required=True)
    p.add_argument("--data-dir", help="TFDS data dir holding the run's dataset")
    p.add_argument("--command", required=True, help="the exact train command that made the run")
    p.add_argument("--compare-with", required=True,
                   help="the registered name whose paper figure the tag stands against")
    p.add_argument("--note", default="")
    args = p.parse_args()

    config = rundir.read_config(args.run_dir)
    hours, machines = rundir.training_time(args.run_dir)
    if not machines:
        raise SystemExit(f"{args.run_dir} has no {rundir.SESSIONS}: it was trained before "
                         "keras-preact recorded its sessions, so its time and machine are unknown.")
    # RUN_DIR/model.keras is the plain layer graph whatever form trained
    # (weights.storage.save_plain).
    model = keras_preact.load_model(args.run_dir, compile=False)
    file = f"{config['model']}-{args.tag}.weights.h5"
    path = os.path.join(records.PACKAGE_DIR, file)
    os.makedirs(records.PACKAGE_DIR, exist_ok=True)
    model.save_weights(path)
    # Scored as a user gets it, not in the run's dtype policy that model.keras carries.
    model = keras_preact.build(config["model"], weights=path, **config["overrides"])
    assert model.dtype_policy.name == records.SCORED_IN, model.dtype_policy.name
    test_split = sources.dataset_info(config["dataset"]).eval_split
    train_split, val_split = pipeline.train_val_splits(config["val_examples"])
    accuracy = {split: round(evaluate(model, dataset=config["dataset"], split=split,
                                      data_dir=args.data_dir, download=False)["accuracy"], 4)
                for split in (test_split, val_split) if split}
    precision = "float32" if config["mixed_precision"] == "off" else config["mixed_precision"]
    last = rundir.read_sessions(args.run_dir)[-1]
    ended = (datetime.datetime.fromisoformat(last["started"])
             + datetime.timedelta(seconds=last["seconds"])).date().isoformat()
    steps = config["steps"]
    iterations = f"{steps // 1000}k" if steps % 1000 == 0 else str(steps)
    reached = (f"{100 * accuracy[test_split]:.2f} % on the {test_split} split, scored in "
               f"{records.SCORED_IN}") + (
        f", {100 * accuracy[val_split]:.2f} % on {val_split}" if val_split else "")
    earlier = getattr(records.released(config["model"]).get(args.tag), "runs", ())
    runs = tuple(r.replace("published (this file)", f"published, replaced on {ended}")
                 for r in earlier) + (
        f"{ended}: {precision}, {iterations} iterations on {train_split}: "
        f"{reached}; published (this file)",)
    record = records.WeightsRecord(
        model=config["model"], tag=args.tag, dataset=config["dataset"], file=file,
        sha256=records.sha256_of(path), test_accuracy=accuracy[test_split],
        compare_with=args.compare_with, val_accuracy=accuracy.get(val_split),
        val_split=val_split, command=args.command,
        iterations=config["steps"], precision=precision, wall_time_h=round(hours, 2),
        machine="; ".join(machines), keras_preact_version=config["versions"]["keras_preact"],
        note=args.note, runs=runs)
    print(f"register({record!r})")


if __name__ == "__main__":
    main()
