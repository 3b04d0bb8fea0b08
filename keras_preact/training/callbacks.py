"""Callbacks of a training run: step limit and NaN guard, safe backups, the metrics CSV, the
sessions log and the progress lines."""

from __future__ import annotations

import contextlib
import json
import math
import os
import sys
import time

import keras
import numpy as np

from keras_preact.files import atomic_path, atomic_write
from keras_preact.rundir import (
    BACKUP_FILE,
    BACKUP_METADATA,
    DAMAGED_FILE,
    METRICS_COLUMNS,
    PENDING_FILE,
    PREVIOUS_FILE,
    read_sessions,
    write_sessions,
)


def optimizer_step(model) -> int:
    """`model.optimizer.iterations` as an int (a MirroredVariable under a strategy)."""
    return int(model.optimizer.iterations.numpy())


def _finite(value) -> bool:
    return value is None or math.isfinite(float(value))


# A loss this many times the chance level, ln(classes) (the cross-entropy of uniform guesses,
# about where an initialized net starts), has diverged: on average the true class gets less
# than classes**-10 of the probability, far worse than guessing. Healthy runs stay within a
# few times chance level, even in their first steps.
SANE_LOSS_FACTOR = 10


def sane_loss(loss, classes: int) -> bool:
    """Whether a cross-entropy `loss` (None: not reported) is one to back up: finite and at
    most `SANE_LOSS_FACTOR` times chance level.

    Example:
    >>> sane_loss(2.3, 10), sane_loss(3e9, 10), sane_loss(float("nan"), 10)
    (True, False, False)
    """
    return loss is None or float(loss) <= SANE_LOSS_FACTOR * math.log(classes)


class TrainingGuard(keras.callbacks.Callback):
    """Stops fit exactly at `total_steps` optimizer iterations, and at the first non-finite
    loss (like `TerminateOnNaN`, but it remembers the step for the error message). `step`:
    the optimizer step of the last batch fit finished, which stays readable when the
    model's state is not (on JAX, after a collective failed for a lost peer)."""

    def __init__(self, total_steps: int):
        super().__init__()
        self.total_steps = total_steps
        self.nan_step: int | None = None
        self.step: int | None = None

    def on_train_begin(self, logs=None):
        self.step = optimizer_step(self.model)

    def on_train_batch_end(self, batch, logs=None):
        step = self.step = optimizer_step(self.model)
        if not _finite((logs or {}).get("loss")):
            self.nan_step = step
            self.model.stop_training = True
        if step >= self.total_steps:
            self.model.stop_training = True


def restore_backup(model, backup_dir: str, log=print) -> int | None:
    """Loads the newest readable backup in `backup_dir` into `model` (weights and optimizer
    state); returns its step, or None when there is no backup.

    A damaged newest file (truncated by a crash or a full disk) falls back to the previous
    one, saying so; when no file is readable a ValueError names them and what to do.
    """
    paths = [os.path.join(backup_dir, f) for f in (BACKUP_FILE, PREVIOUS_FILE)]
    paths = [p for p in paths if os.path.exists(p)]
    if not paths:
        return None
    if not model.optimizer.built:
        model.optimizer.build(model.trainable_variables)
    errors = []
    for path in paths:
        try:
            model.load_weights(path)
        except Exception as error:  # h5py and Keras raise many kinds for a damaged file
            errors.append(f"{path}: {type(error).__name__}: {str(error).splitlines()[0]}")
            continue
        if errors:
            # Out of the rotation, or the next backup would keep it as the previous one.
            damaged = os.path.join(backup_dir, DAMAGED_FILE)
            with contextlib.suppress(FileNotFoundError):  # another worker moved it
                os.replace(paths[0], damaged)
            log(f"keras-preact: warning: {errors[0]}; resuming from {path} instead (the "
                f"damaged file is now {damaged})")
        return optimizer_step(model)
    raise ValueError(f"No readable backup in {backup_dir} ({'; '.join(errors)}). Delete "
                     f"{backup_dir} to start over, or choose another --output.")


class RunBackup(keras.callbacks.Callback):
    """Backs the run up (weights and optimizer state) every `every` optimizer steps and at
    each epoch end, for `restore_backup` to resume from:

    - no poisoned backups: a backup is good when its weights are finite and its loss is
      `sane_loss`. Its loss is that of the next step, which fit computes with the saved
      weights (the loss reported with them was computed before their last update): so a
      backup is first written as `PENDING_FILE` and becomes the newest one only once the
      next step's loss is sane. The last good backup survives a divergence;
    - atomic files (`keras_preact.files`), the previous backup kept beside the newest;
    - multi-worker: every worker saves, each into a `backup_dir` of its own (the chief's in
      the run dir, the others' in their temp dirs): on JAX every process of a run must
      take part in each save.
    """

    def __init__(self, backup_dir: str, *, every: int, steps_per_epoch: int,
                 saved_step: int | None = None):
        super().__init__()
        self.backup_dir = backup_dir
        self.every = every
        self.steps_per_epoch = steps_per_epoch
        self.saved_step = saved_step  # of the newest good backup
        self.pending_step = None  # of the backup waiting for its loss
        self.mean_loss = 0.0  # fit's running mean over the epoch, up to the last batch

    def on_train_batch_end(self, batch, logs=None):
        mean = (logs or {}).get("loss")
        if self.pending_step is not None:
            # This batch's loss, from the running means fit reports (float64: exact enough
            # until a huge loss, after which the epoch's later batches read as not sane).
            loss = None if mean is None else (batch + 1) * float(mean) - batch * self.mean_loss
            self._confirm(sane_loss(loss, self.model.output_shape[-1]))
        self.mean_loss = 0.0 if mean is None else float(mean)
        if optimizer_step(self.model) % self.every == 0:
            self._save()

    def on_epoch_end(self, epoch, logs=None):
        self._save()
        self.mean_loss = 0.0

    def _save(self):
        step = optimizer_step(self.model)
        if step in (self.saved_step, self.pending_step):
            return
        if not all(np.isfinite(v.numpy()).all() for v in self.model.weights):
            return
        self.pending_step = step
        os.makedirs(self.backup_dir, exist_ok=True)
        with atomic_path(os.path.join(self.backup_dir, PENDING_FILE)) as tmp:
            self.model.save_weights(tmp, overwrite=True)

    def _confirm(self, good: bool):
        """The pending backup becomes the newest (`good`) or is dropped."""
        step, self.pending_step = self.pending_step, None
        if not good:
            return
        self.saved_step = step
        latest = os.path.join(self.backup_dir, BACKUP_FILE)
        if os.path.exists(latest):
            os.replace(latest, os.path.join(self.backup_dir, PREVIOUS_FILE))
        os.replace(os.path.join(self.backup_dir, PENDING_FILE), latest)
        metadata = json.dumps({"epoch": step // self.steps_per_epoch, "step": step})
        atomic_write(os.path.join(self.backup_dir, BACKUP_METADATA), lambda f: f.write(metadata))


class SessionLog(keras.callbacks.Callback):
    """Adds this process' entry to RUN_DIR's `rundir.SESSIONS` when fit starts and keeps its
    seconds and last step current at each epoch end and when fit stops on an error (`record`;
    a kill -9 loses at most the epoch it was in, whose steps the resume repeats anyway),
    with the Keras `backend` it trains on (a run may resume on another)."""

    def __init__(self, run_dir: str, machine: str, backend: str):
        super().__init__()
        self.run_dir = run_dir
        self.machine = machine
        self.backend = backend
        self.entry = None

    def on_train_begin(self, logs=None):
        self.started = time.monotonic()
        step = optimizer_step(self.model)
        before = read_sessions(self.run_dir)  # `record` needs both, once entry is set
        self.entry = {"machine": self.machine, "backend": self.backend,
                      "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                      "seconds": 0.0, "steps": [step, step]}
        self.sessions = [*before, self.entry]
        write_sessions(self.run_dir, self.sessions)

    def on_epoch_end(self, epoch, logs=None):
        self.record()

    def record(self, step: int | None = None):
        """Brings this process' entry up to date, at `step` (default: the model's); also
        called when fit ends otherwise (an exception, Ctrl-C, a lost worker), which Keras
        tells no callback."""
        if self.entry is None:  # fit did not start
            return
        self.entry["seconds"] = round(time.monotonic() - self.started, 1)
        self.entry["steps"][1] = optimizer_step(self.model) if step is None else step
        write_sessions(self.run_dir, self.sessions)


# A log's progress lines come at most this often (the first and the last always): a
# fine-tune of 3 steps an epoch printed 334 lines in 3 minutes; the paper's 7-minute epochs
# still get one each.
LINE_EVERY_S = 30


class Progress(keras.callbacks.Callback):
    """Progress in optimizer iterations, as they are: `step S/N` of the whole run.

    `live`: one Keras `Progbar` over the run (a terminal); otherwise a line at an epoch's end
    (a log file), at most every `LINE_EVERY_S` seconds, with the seconds since this process
    started training and, until the last step, the time left at the pace since the previous
    line (which a paused or shared machine skews for one line only); the first line's pace
    leaves out the first step, which builds and traces the graph. Replaces
    fit's own per-epoch bar, which shows the epoch's nominal length even when the run stops
    inside it (a 600-step run at batch 32 printed "1406/1406").
    """

    def __init__(self, total_steps: int, epochs: int, live: bool, stream=None):
        super().__init__()
        self.total_steps = total_steps
        self.epochs = epochs
        self.live = live
        self.stream = stream or sys.stdout
        self.bar = None

    def on_train_begin(self, logs=None):
        self.started = time.monotonic()
        self.pace_from = None  # (time, step) the next estimate counts from
        self.printed = None  # when the last line was printed

    def on_train_batch_end(self, batch, logs=None):
        if self.pace_from is None:  # the first step is done: the pace counts from here
            self.pace_from = time.monotonic(), optimizer_step(self.model)
        if not self.live:
            return
        values = _scalars(logs)
        if self.bar is None:
            # fit's logs are already running means: stateful, so Progbar shows them as they are.
            self.bar = keras.utils.Progbar(self.total_steps, unit_name="step",
                                           stateful_metrics=[k for k, _ in values])
        self.bar.update(optimizer_step(self.model), values)

    def on_epoch_end(self, epoch, logs=None):
        step, now = optimizer_step(self.model), time.monotonic()
        last = step >= self.total_steps
        if self.printed is not None and not last and now - self.printed < LINE_EVERY_S:
            return
        line = (f"epoch {epoch + 1}/{self.epochs} - step {step}/{self.total_steps} - "
                f"{now - self.started:.0f}s")
        since, first_step = self.pace_from or (now, step)
        if first_step < step and not last:
            pace = (now - since) / (step - first_step)
            line += f" - left: {_duration(pace * (self.total_steps - step))}"
        self.printed, self.pace_from = now, (now, step)
        line += "".join(f" - {k}: {v:.4f}" for k, v in _scalars(logs))
        if self.bar is not None and not last:
            line = "\n" + line  # below the live bar, which goes on on the next line
        print(line, file=self.stream, flush=True)


def _duration(seconds: float) -> str:
    """`45s`, `12m`, `3.4h`: what a person reads off a log line."""
    if seconds < 90:
        return f"{seconds:.0f}s"
    return f"{seconds / 60:.0f}m" if seconds < 90 * 60 else f"{seconds / 3600:.1f}h"


def _scalars(logs) -> list[tuple[str, float]]:
    return [(k, float(v)) for k, v in (logs or {}).items() if k != "learning_rate"]


class RenameLogs(keras.callbacks.Callback):
    """Renames epoch log keys in place (`{"val_loss": "test_loss"}`), for the callbacks after
    it: fit calls each one with the same logs dict."""

    def __init__(self, names: dict[str, str]):
        super().__init__()
        self.names = names

    def on_epoch_end(self, epoch, logs=None):
        for old, new in self.names.items():
            if logs is not None and old in logs:
                logs[new] = logs.pop(old)


class MetricsCSV(keras.callbacks.CSVLogger):
    """Keras' `CSVLogger` appending one row per epoch to `path`, in `METRICS_COLUMNS` order,
    with `step` (`optimizer.iterations` at the epoch end) and `lr` (the rate of the epoch's
    last step: the plotting helper draws it as held through the epoch) added."""

    def __init__(self, path: str, schedule):
        super().__init__(path, append=True)
        self.schedule = schedule

    def on_train_begin(self, logs=None):
        super().on_train_begin(logs)
        self.keys = list(METRICS_COLUMNS[1:])  # our order (CSVLogger sorts the log keys)

    def on_epoch_end(self, epoch, logs=None):
        step = optimizer_step(self.model)
        row = {**(logs or {}), "step": step, "lr": self.schedule(max(step - 1, 0))}
        super().on_epoch_end(epoch, {k: _csv_value(row.get(k)) for k in self.keys})


def _csv_value(value) -> str:
    if value is None:
        return ""  # e.g. no validation slice: the plotting helper reads it as NaN
    return str(value) if isinstance(value, int) else f"{float(value):.6g}"
