"""Callbacks of a training run: step limit and NaN guard, safe backups, the metrics CSV."""

from __future__ import annotations

import json
import math
import os
import shutil
import sys
import tempfile
import time

import keras
import numpy as np

METRICS_HEADER = ("epoch", "step", "lr", "loss", "accuracy", "val_loss", "val_accuracy")


def atomic_write_text(path: str, text: str) -> None:
    """Writes `text` to `path` via a temp file in the same directory and `os.replace`."""
    fd, tmp = tempfile.mkstemp(dir=os.path.dirname(path) or ".", prefix=".tmp-")
    with os.fdopen(fd, "w") as f:
        f.write(text)
    os.chmod(tmp, 0o644)  # mkstemp creates 0600; these are ordinary, shareable run files
    os.replace(tmp, path)


def optimizer_step(model) -> int:
    """`model.optimizer.iterations` as an int (a MirroredVariable under a strategy)."""
    return int(model.optimizer.iterations.numpy())


def _finite(value) -> bool:
    return value is None or math.isfinite(float(value))


class TrainingGuard(keras.callbacks.Callback):
    """Stops fit exactly at `total_steps` optimizer iterations, and at the first non-finite
    loss (like `TerminateOnNaN`, but it remembers the step for the error message)."""

    def __init__(self, total_steps: int):
        super().__init__()
        self.total_steps = total_steps
        self.nan_step: int | None = None

    def on_train_batch_end(self, batch, logs=None):
        step = optimizer_step(self.model)
        if not _finite((logs or {}).get("loss")):
            self.nan_step = step
            self.model.stop_training = True
        if step >= self.total_steps:
            self.model.stop_training = True


class RunBackup(keras.callbacks.BackupAndRestore):
    """`BackupAndRestore` saving every `every` optimizer steps and at each epoch end, with:

    - resume by step: the restored `optimizer.iterations` picks the epoch to continue from
      (Keras' own metadata only knows whole epochs);
    - no poisoned backups: a save is skipped when the loss or any weight is not finite, so
      the last good backup survives a NaN;
    - atomic files (temp + `os.replace`), so a SIGKILL mid-save leaves the previous backup;
    - multi-worker safety: every worker restores from `backup_dir`, only the chief writes
      there; the others write to a private temp dir that is removed at the end.
    """

    def __init__(self, backup_dir: str, *, every: int, steps_per_epoch: int, total_steps: int,
                 chief: bool = True, verbose: bool = True):
        self.restore_dir = backup_dir
        write_dir = backup_dir if chief else tempfile.mkdtemp(prefix="keras_preact_backup_")
        super().__init__(write_dir, save_freq="epoch", delete_checkpoint=False)
        self.every = every
        self.steps_per_epoch = steps_per_epoch
        self.total_steps = total_steps
        self.verbose = verbose
        self.resumed_step: int | None = None
        self.saved_step: int | None = None

    def on_train_begin(self, logs=None):
        path = os.path.join(self.restore_dir, "latest.weights.h5")
        if not os.path.exists(path):
            return
        if not self.model.optimizer.built:
            self.model.optimizer.build(self.model.trainable_variables)
        self.model.load_weights(path)
        step = self.resumed_step = self.saved_step = optimizer_step(self.model)
        epochs = math.ceil(self.total_steps / self.steps_per_epoch)
        # Keras' own BackupAndRestore sets this private attribute the same way.
        self.model._initial_epoch = epochs if step >= self.total_steps else step // self.steps_per_epoch
        if self.verbose:
            print(f"keras-preact: resuming from step {step} of {self.total_steps} "
                  f"(backup {self.restore_dir})", flush=True)

    def on_train_batch_end(self, batch, logs=None):
        step = optimizer_step(self.model)
        if step % self.every == 0 and _finite((logs or {}).get("loss")):
            self._save_model()

    def on_epoch_end(self, epoch, logs=None):
        if _finite((logs or {}).get("loss")):
            self._save_model()

    def _save_model(self):
        step = optimizer_step(self.model)
        if step == self.saved_step:
            return
        if not all(np.isfinite(v.numpy()).all() for v in self.model.weights):
            return
        os.makedirs(self.backup_dir, exist_ok=True)
        tmp = os.path.join(self.backup_dir, "tmp-latest.weights.h5")
        self.model.save_weights(tmp, overwrite=True)
        os.replace(tmp, self._weights_path)
        atomic_write_text(self._training_metadata_path, json.dumps(
            {"epoch": step // self.steps_per_epoch, "step": step}))
        self.saved_step = step

    def on_train_end(self, logs=None):
        if self.backup_dir != self.restore_dir:
            shutil.rmtree(self.backup_dir, ignore_errors=True)


class Progress(keras.callbacks.Callback):
    """Progress in optimizer iterations, as they are: `step S/N` of the whole run.

    `live`: one Keras `Progbar` over the run (a terminal); otherwise one line per epoch (a log
    file). Replaces fit's own per-epoch bar, which shows the epoch's nominal length even when
    the run stops inside it (a 600-step run at batch 32 printed "1406/1406").
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

    def on_train_batch_end(self, batch, logs=None):
        if not self.live:
            return
        values = _scalars(logs)
        if self.bar is None:
            # fit's logs are already running means: stateful, so Progbar shows them as they are.
            self.bar = keras.utils.Progbar(self.total_steps, unit_name="step",
                                           stateful_metrics=[k for k, _ in values])
        self.bar.update(optimizer_step(self.model), values)

    def on_epoch_end(self, epoch, logs=None):
        step = optimizer_step(self.model)
        line = (f"epoch {epoch + 1}/{self.epochs} - step {step}/{self.total_steps} - "
                f"{time.monotonic() - self.started:.0f}s")
        line += "".join(f" - {k}: {v:.4f}" for k, v in _scalars(logs))
        if self.bar is not None and step < self.total_steps:
            line = "\n" + line  # below the live bar, which goes on on the next line
        print(line, file=self.stream, flush=True)


def _scalars(logs) -> list[tuple[str, float]]:
    return [(k, float(v)) for k, v in (logs or {}).items() if k != "learning_rate"]


class MetricsCSV(keras.callbacks.Callback):
    """Appends one row per epoch to `path` with header `METRICS_HEADER`.

    `step` is `optimizer.iterations` at the epoch end; `lr` is the rate of that epoch's last
    step (the plotting helper draws it as held through the epoch).
    """

    def __init__(self, path: str, schedule):
        super().__init__()
        self.path = path
        self.schedule = schedule

    def on_epoch_end(self, epoch, logs=None):
        logs = logs or {}
        step = optimizer_step(self.model)
        row = {"epoch": epoch, "step": step, "lr": float(self.schedule(max(step - 1, 0)))}
        row.update({k: logs.get(k) for k in METRICS_HEADER[3:]})
        new = not os.path.exists(self.path)
        with open(self.path, "a") as f:
            if new:
                f.write(",".join(METRICS_HEADER) + "\n")
            f.write(",".join(_csv_value(row[k]) for k in METRICS_HEADER) + "\n")


def _csv_value(value) -> str:
    if value is None:
        return ""  # e.g. no validation slice: the plotting helper reads it as NaN
    return str(value) if isinstance(value, int) else f"{float(value):.6g}"
