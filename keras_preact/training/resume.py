"""A run dir's continuity: the lock a trainer holds on it (`run_lock`), the recipe a rerun
resumes with (`resume_config`) and the form it trains in (`resolve_stages`). The directory's
names are `keras_preact.rundir`'s.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os

from keras_preact import rundir
from keras_preact.arch import scan
from keras_preact.training.config import (
    DIVERGED_MAY_CHANGE,
    RESUME_KEYS,
    STAGES,
    absolute_paths,
    check_choice,
)

# What to do about a run file in --output that is damaged or not ours: it is never replaced.
NOT_OURS = "Move it away to start over, or choose another --output."


# What every config.json a trainer writes holds: a file in --output without them is a user's.
RUN_CONFIG_KEYS = ("model", "steps")


def saved_config(output: str) -> dict:
    """The config.json of an earlier run in `output`, or {}; a one-line ValueError when it
    is damaged or not a run's (a user's own config.json in --output would be replaced)."""
    path = os.path.join(output, rundir.CONFIG)
    if not os.path.exists(path):
        return {}
    try:
        config = rundir.read_config(output)
    except ValueError as error:
        raise ValueError(f"{error} {NOT_OURS}") from None
    missing = [key for key in RUN_CONFIG_KEYS if key not in config]
    if missing:
        raise ValueError(f"{path} is not a keras-preact run config (no {', '.join(missing)}). "
                         f"{NOT_OURS}")
    return config


def check_sessions(output: str) -> None:
    """A one-line ValueError, before anything is written, when `output`'s sessions file is
    damaged or somebody else's (the trainer would append to it at the start of fit)."""
    try:
        rundir.read_sessions(output)
    except ValueError as error:
        raise ValueError(f"{error} {NOT_OURS}") from None


def resolve_stages(stages: str, spec, output: str | None = None) -> str:
    """The form `train` builds: `"auto"` is the form of an earlier run in `output` (so it
    resumes), else "scan" for the nets it runs (a much faster start and less memory;
    benchmarks/README.md; on TensorFlow and JAX alike), else "layers"."""
    check_choice("stages", stages, STAGES)
    if stages == "auto":
        stages = (output and saved_config(output).get("stages")) or (
            "scan" if scan.scannable(spec) else "layers")
    if stages == "scan":
        scan.check_scannable(spec)
    return stages


def resumable_config(output: str) -> dict:
    """The config.json of the run a train in `output` would resume, or {}: only a run with a
    backup has something to resume (a start that failed before its first backup is simply
    replaced)."""
    if not os.path.exists(os.path.join(output, rundir.BACKUP, rundir.BACKUP_FILE)):
        return {}
    return saved_config(output)


def resume_config(output: str, config: dict) -> dict:
    """The config a run in `output` continues with: `config`, checked against the run it
    resumes. Only a run with a backup has something to resume (a start that failed before
    its first backup is simply replaced); it resumes with the same recipe (`RESUME_KEYS`),
    except that a diverged run may change `DIVERGED_MAY_CHANGE`, recorded under "changes"."""
    before = resumable_config(output)
    if not before:
        return config
    # A run recorded before paths were made absolute compares as this directory resolves it.
    earlier, now = absolute_paths(before), absolute_paths(config)
    changed = {k: (before.get(k), config[k]) for k in RESUME_KEYS
               if json.loads(json.dumps(earlier.get(k))) != json.loads(json.dumps(now[k]))}
    allowed = DIVERGED_MAY_CHANGE if "diverged_at_step" in before else ()
    refused = {k: v for k, v in changed.items() if k not in allowed}
    if refused:
        hint = (f" After a divergence only {', '.join(DIVERGED_MAY_CHANGE)} may change."
                if allowed else "")
        raise ValueError(
            f"{output!r} holds a run with other settings; use another --output or the same "
            f"flags to resume.{hint} Received (before -> now): "
            + ", ".join(f"{k}: {a!r} -> {b!r}" for k, (a, b) in refused.items())
        )
    changes = list(before.get("changes", []))
    if changed:
        changes.append({"at_step": before["diverged_at_step"],
                        **{k: list(v) for k, v in changed.items()}})
    return {**config, "changes": changes} if changes else config


@contextlib.contextmanager
def run_lock(output: str):
    """Holds an exclusive lock on run dir `output` (created if needed) while training.

    A second trainer on a live run dir is refused at once. The lock is the kernel's
    (`flock` on the directory), so a killed trainer never leaves it stuck.
    """
    os.makedirs(output, exist_ok=True)
    fd = os.open(output, os.O_RDONLY)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise FileExistsError(f"Another trainer is running in {output!r}; wait for it, or "
                                  "choose another --output.") from None
        yield
    finally:
        os.close(fd)  # releases the lock
