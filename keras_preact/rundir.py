"""The run directory `keras-preact train --output RUN_DIR` writes, and reading it back.

RUN_DIR holds `CONFIG` (the recipe, written at the start), `METRICS` (one row per epoch,
`METRICS_COLUMNS`), `SESSIONS` (each trainer process that trained in it: machine, start,
seconds, steps), `LOGS` (TensorBoard), `BACKUP` (while training: the newest backup, the one
before it and their step) and, only once training finished, `MODEL`. Files are replaced
atomically (`keras_preact.files`), so a crash never leaves a half-written one.

Example:
>>> import tempfile
>>> run_dir = tempfile.mkdtemp()
>>> write_config(run_dir, {"model": "preact-20", "steps": 100})
>>> read_config(run_dir)["steps"]
100
"""

from __future__ import annotations

import json
import os

from keras_preact.files import atomic_write

CONFIG = "config.json"
METRICS = "metrics.csv"
# A JSON list, one entry per trainer process (the first start and each resume), kept current
# at every epoch end: {"machine", "backend" (Keras', e.g. "jax"), "started" (UTC, ISO 8601),
# "seconds" (in fit), "steps": [first, last]}. What a run cost, summed over sessions and
# machines (`training_time`). Entries of runs older than "backend" have none (TensorFlow's).
SESSIONS = "sessions.json"
SESSION_KEYS = {"machine", "started", "seconds", "steps"}  # what every entry has
MODEL = "model.keras"
LOGS = "logs"
BACKUP = "backup"
# In BACKUP: the newest backup and the one before it (kept in case the newest is damaged,
# e.g. by a full disk), each with the optimizer state, and the step and epoch of the newest.
BACKUP_FILE = "latest.weights.h5"
PREVIOUS_FILE = "previous.weights.h5"
# A damaged newest backup, moved here when a resume falls back to the previous one.
DAMAGED_FILE = "damaged.weights.h5"
# A backup waiting for the next step's loss to show it is good (`callbacks.RunBackup`).
PENDING_FILE = "pending.weights.h5"
BACKUP_METADATA = "training_metadata.json"
# `step` = optimizer iterations at the epoch end, `lr` = the rate of the epoch's last step;
# `val_*`: the slice held out of train (--val-examples N); `test_*`: the dataset's own held-out
# split (CIFAR test, ImageNet validation), scored when no slice is held out, for curves like the
# paper's Fig. 1 (nothing is decided from it). A row fills one pair; the other stays empty.
METRICS_COLUMNS = ("epoch", "step", "lr", "loss", "accuracy", "val_loss", "val_accuracy",
                   "test_loss", "test_accuracy")
# What Keras' fit logs the held-out split as, and the columns it fills when it is the test split.
TEST_COLUMNS = {"val_loss": "test_loss", "val_accuracy": "test_accuracy"}


def read_config(run_dir: str | os.PathLike) -> dict:
    """The `CONFIG` of `run_dir` as a dict. FileNotFoundError when there is none; a one-line
    ValueError naming the file when it is not a JSON object."""
    config_path = os.path.join(run_dir, CONFIG)
    try:
        with open(config_path) as f:
            config = json.load(f)
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        config = error
    if not isinstance(config, dict):
        raise ValueError(f"{config_path} is not a keras-preact run config ({config}).")
    return config


def model_file(path: str) -> str:
    """The `.keras` file `path` stands for: a run dir's `MODEL`, else `path` itself."""
    return os.path.join(path, MODEL) if os.path.isdir(path) else path


def recipe(path: str) -> tuple[str, dict] | None:
    """`(model name, overrides)` of the network the run trained whose `MODEL` is `path`: what
    a plain `model.keras` written before it named its network inside holds; None for a file
    that is no run's model or a run config without them.

    Example:
    >>> import tempfile
    >>> run_dir = tempfile.mkdtemp()
    >>> write_config(run_dir, {"model": "preact-20", "overrides": {"depth": 8}})
    >>> recipe(os.path.join(run_dir, MODEL)), recipe(os.path.join(run_dir, "other.keras"))
    (('preact-20', {'depth': 8}), None)
    """
    if os.path.basename(path) != MODEL:
        return None
    run = recorded(os.path.dirname(os.path.abspath(path)))
    name, overrides = run.get("model"), run.get("overrides", {})
    return (name, overrides) if isinstance(name, str) and isinstance(overrides, dict) else None


def recorded(source: object) -> dict:
    """The `CONFIG` of the run that made `source` (its run dir, or a file in it such as its
    model.keras); {} for anything else (a model, a file elsewhere, an unreadable config).

    Example:
    >>> import tempfile
    >>> run_dir = tempfile.mkdtemp()
    >>> write_config(run_dir, {"dataset": "cifar10"})
    >>> open(os.path.join(run_dir, MODEL), "w").close()
    >>> recorded(run_dir), recorded(os.path.join(run_dir, MODEL)), recorded(3)
    ({'dataset': 'cifar10'}, {'dataset': 'cifar10'}, {})
    """
    if not (isinstance(source, (str, os.PathLike)) and os.path.exists(source)):
        return {}  # a registered name is no run's, even in a run dir's working directory
    run_dir = source if os.path.isdir(source) else os.path.dirname(os.path.abspath(source))
    try:
        return read_config(run_dir)
    except (OSError, ValueError):
        return {}


def write_config(run_dir: str | os.PathLike, config: dict) -> None:
    """Writes `config` as `run_dir/CONFIG`, atomically."""
    text = json.dumps(config, indent=2, default=list) + "\n"
    atomic_write(os.path.join(run_dir, CONFIG), lambda f: f.write(text))


def read_sessions(run_dir: str | os.PathLike) -> list[dict]:
    """The `SESSIONS` of `run_dir`: [] when none has been written; a one-line ValueError
    naming the file when it is not a list of `SESSION_KEYS` entries."""
    path = os.path.join(run_dir, SESSIONS)
    try:
        with open(path) as f:
            sessions = json.load(f)
    except FileNotFoundError:
        return []
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        sessions = error
    if not isinstance(sessions, list):
        raise ValueError(f"{path} is not a keras-preact sessions file ({sessions}).")
    odd = next((s for s in sessions if not (isinstance(s, dict) and SESSION_KEYS <= set(s))),
               None)
    if odd is not None:  # a list of another shape: somebody else's file
        raise ValueError(f"{path} is not a keras-preact sessions file (an entry without "
                         f"{', '.join(sorted(SESSION_KEYS))}: {str(odd)[:80]}).")
    return sessions


def write_sessions(run_dir: str | os.PathLike, sessions: list[dict]) -> None:
    """Writes `sessions` as `run_dir/SESSIONS`, atomically."""
    text = json.dumps(sessions, indent=1) + "\n"
    atomic_write(os.path.join(run_dir, SESSIONS), lambda f: f.write(text))


def training_time(run_dir: str | os.PathLike) -> tuple[float, list[str]]:
    """Hours in fit over all of `run_dir`'s sessions, and the machines they ran on (each
    once, in order).

    Example:
    >>> import tempfile
    >>> run_dir = tempfile.mkdtemp()
    >>> write_sessions(run_dir, [
    ...     {"machine": "A", "started": "2026-12-04T16:15:00", "seconds": 5400, "steps": [0, 900]},
    ...     {"machine": "B", "started": "2026-12-05T09:00:00", "seconds": 1800, "steps": [0, 300]}])
    >>> training_time(run_dir)
    (2.0, ['A', 'B'])
    """
    sessions = read_sessions(run_dir)
    hours = sum(s["seconds"] for s in sessions) / 3600
    return hours, list(dict.fromkeys(s["machine"] for s in sessions))
