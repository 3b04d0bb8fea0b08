"""The directory layout TF Serving polls, `BASE/NAME/VERSION/`, written all-or-nothing.

TF Serving reads every all-digit entry within int64 as a version. A version is written into a
hidden temporary sibling (`.keras-preact-export.HOST.PID.XXXX`), then renamed into place in one
step, so neither a running server nor a killed exporter ever sees a half-written version.
"""

from __future__ import annotations

import os
import re
import shutil
import socket
import tempfile
from collections.abc import Callable, Sequence

from keras_preact.files import missing_dirs

_TMP_PREFIX = ".keras-preact-export."
# HOST may contain dots; PID and mkdtemp's random suffix ([a-z0-9_]) do not.
_TMP_PATTERN = re.compile(r"^\.keras-preact-export\.(?P<host>.+)\.(?P<pid>\d+)\.[a-z0-9_]+$")
_NAME_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")
_VERSION_PATTERN = re.compile(r"[0-9]+")  # ASCII only: str.isdigit() also takes '²'
# TF Serving versions are int64: a larger directory number is never loaded.
MAX_VERSION = 2**63 - 1
# In each version keras_preact writes: its class names, one a line, in index order. TF Serving
# ignores the file; the next export under the same name compares its own labels with it.
LABELS_FILE = os.path.join("assets.extra", "keras_preact_labels.txt")


def check_name(name: str) -> str:
    """Returns `name` if it can be a TF Serving model name and one directory; else ValueError.

    TF Serving's REST API reads the name up to the first '/' or ':' (`/v1/models/NAME:predict`)
    and the name is also the directory under the base path: letters, digits, '.', '_' and '-',
    starting with a letter or digit (not a hidden or relative directory), are accepted.

    Example:
    >>> check_name("preact-164_cifar10.v2")
    'preact-164_cifar10.v2'
    """
    if not isinstance(name, str) or not _NAME_PATTERN.fullmatch(name):
        raise ValueError(
            "A model name must be letters, digits, '.', '_' or '-', starting with a letter or "
            f"digit (TF Serving's model name and its directory). Received: name={name!r}"
        )
    return name


def check_version(version: int | None) -> None:
    """ValueError unless `version` is None (automatic) or an integer TF Serving can load.

    Example:
    >>> check_version(2**63)
    Traceback (most recent call last):
    ...
    ValueError: `version` must be a positive integer up to 9223372036854775807 (...
    """
    valid = isinstance(version, int) and not isinstance(version, bool)
    if version is not None and not (valid and 1 <= version <= MAX_VERSION):
        raise ValueError(
            f"`version` must be a positive integer up to {MAX_VERSION} (TF Serving's versions "
            f"are int64). Received: version={version!r}"
        )


def existing_versions(model_dir: str) -> list[int]:
    """The version numbers TF Serving sees in `model_dir`, ascending: every all-digit entry
    within int64 (TF Serving lists files too, and skips numbers beyond int64)."""
    if not os.path.isdir(model_dir):
        return []
    numbers = (int(entry) for entry in os.listdir(model_dir) if _VERSION_PATTERN.fullmatch(entry))
    return sorted(n for n in numbers if n <= MAX_VERSION)


def write_labels(version_dir: str, labels: Sequence[str]) -> None:
    """Writes `labels` into `version_dir`'s LABELS_FILE."""
    path = os.path.join(version_dir, LABELS_FILE)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        f.write("".join(f"{label}\n" for label in labels))


def newest_labels(model_dir: str) -> tuple[int, list[str]] | None:
    """`(version, labels)` of the newest version in `model_dir` that keras_preact wrote labels
    into; None if there is none (no version yet, or only versions written otherwise)."""
    for version in reversed(existing_versions(model_dir)):
        try:
            with open(os.path.join(model_dir, str(version), LABELS_FILE), encoding="utf-8") as f:
                return version, f.read().splitlines()
        except OSError:
            continue
    return None


def check_same_labels(model_dir: str, labels: Sequence[str], new_labels: bool = False) -> None:
    """ValueError unless the newest labelled version in `model_dir` has exactly `labels`, or
    `new_labels` allows other ones: a server that loads the latest version would otherwise
    answer the old model's URL with another model's classes.

    Example:
    >>> import tempfile
    >>> model_dir = tempfile.mkdtemp()
    >>> write_labels(os.path.join(model_dir, "1"), ["cat", "dog"])
    >>> check_same_labels(model_dir, ["cat", "frog", "ship"])
    Traceback (most recent call last):
    ...
    ValueError: ... version 1 serves 2 classes (cat, dog); this model has 3 (cat, frog, ship)...
    """
    served = newest_labels(model_dir)
    if new_labels or served is None or list(labels) == served[1]:
        return
    version, old = served

    def listed(names):
        return ", ".join(names[:5]) + (", ..." if len(names) > 5 else "")

    raise ValueError(
        f"{model_dir}: version {version} serves {len(old)} classes ({listed(old)}); this model "
        f"has {len(labels)} ({listed(list(labels))}). Export it under another --name, or pass "
        "--new-labels (`new_labels=True`) to make it the next version of this one."
    )


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # exists, owned by someone else
        return True
    return True


def clean_stale_temp_dirs(model_dir: str) -> list[str]:
    """Removes temporary dirs of exports killed on this host (their PID is gone). Returns them.

    Only names of this module's own pattern are touched; another host's or a live exporter's
    temporary dir is left alone.
    """
    removed = []
    host = socket.gethostname()
    for entry in os.listdir(model_dir) if os.path.isdir(model_dir) else ():
        match = _TMP_PATTERN.match(entry)
        path = os.path.join(model_dir, entry)
        if (
            match
            and match["host"] == host
            and not _alive(int(match["pid"]))
            and os.path.isdir(path)
            and not os.path.islink(path)
        ):
            shutil.rmtree(path, ignore_errors=True)
            removed.append(path)
    return removed


def publish_version(
    model_dir: str, version: int | None, write: Callable[[str], None]
) -> str:
    """Runs `write(tmp_dir)`, then renames `tmp_dir` to `model_dir/VERSION`. Returns that path.

    If anything fails, the temporary directory and the directories this call created are
    removed: nothing is left half-written.

    Args:
        model_dir: `BASE/NAME`; created if missing.
        version: an integer in [1, MAX_VERSION], or None for the next free one (1 + the
            highest present, see `existing_versions`).
        write: fills the temporary directory with the SavedModel.

    Raises:
        FileExistsError: `version` is given and already exists (it is never overwritten).
    """
    check_version(version)

    def target_for(v: int | None) -> str:
        present = existing_versions(model_dir)
        if v is None:
            v = max(present, default=0) + 1
            if v > MAX_VERSION:
                raise ValueError(
                    f"No version number left in {model_dir}: version {MAX_VERSION} (the int64 "
                    "maximum) exists. Give a free `version`/--version explicitly."
                )
        target = os.path.join(model_dir, str(v))
        if v in present:
            raise FileExistsError(
                f"Version {v} of this model already exists in {model_dir}; versions are never "
                "overwritten. Omit --version/`version` to use the next free one."
            )
        return target

    created = missing_dirs(model_dir)
    target = target_for(version)  # fail before the (slow) export if the version is taken
    tmp = None
    try:
        os.makedirs(model_dir, exist_ok=True)
        clean_stale_temp_dirs(model_dir)
        tmp = tempfile.mkdtemp(prefix=f"{_TMP_PREFIX}{socket.gethostname()}.{os.getpid()}.",
                               dir=model_dir)
        write(tmp)
        # mkdtemp makes 0700; a server running as another user must be able to read it.
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o777 & ~umask)
        while True:
            target = target_for(version)
            try:
                os.rename(tmp, target)
                return target
            except OSError:
                # A concurrent exporter took this number between the check and the rename:
                # take the next one, or, for a `version` given, say that it exists.
                if not os.path.lexists(target):
                    raise
                if version is not None:
                    target_for(version)
    except BaseException:
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)
        for path in created:
            try:
                os.rmdir(path)
            except OSError:  # not empty: another exporter is using it
                break
        raise
