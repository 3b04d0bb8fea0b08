"""The directory layout TF Serving polls, `BASE/NAME/VERSION/`, written all-or-nothing.

TF Serving loads only all-digit version directories. A version is written into a hidden
temporary sibling (`.keras-preact-export.HOST.PID.XXXX`), then renamed into place in one step,
so neither a running server nor a killed exporter ever sees a half-written version.
"""

from __future__ import annotations

import os
import re
import shutil
import socket
import tempfile
from collections.abc import Callable

_TMP_PREFIX = ".keras-preact-export."
# HOST may contain dots; PID and mkdtemp's random suffix ([a-z0-9_]) do not.
_TMP_PATTERN = re.compile(r"^\.keras-preact-export\.(?P<host>.+)\.(?P<pid>\d+)\.[a-z0-9_]+$")


def sanitize_name(name: str) -> str:
    """A model name usable as one directory (and a TF Serving model name).

    Example:
    >>> sanitize_name("preact-164 / cifar10")
    'preact-164-cifar10'
    """
    cleaned = re.sub(r"[^A-Za-z0-9._-]+", "-", str(name)).strip(".-")
    if not cleaned:
        raise ValueError(f"Model name {name!r} has no usable characters. Use e.g. 'preact-164'.")
    return cleaned


def existing_versions(model_dir: str) -> list[int]:
    """The version numbers present (all-digit sub-directories), ascending."""
    if not os.path.isdir(model_dir):
        return []
    return sorted(
        int(entry)
        for entry in os.listdir(model_dir)
        if entry.isdigit() and os.path.isdir(os.path.join(model_dir, entry))
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

    Args:
        model_dir: `BASE/NAME`; created if missing.
        version: a positive integer, or None for the next free one (1 + the highest present).
        write: fills the temporary directory with the SavedModel.

    Raises:
        FileExistsError: `version` is given and already exists (it is never overwritten).
    """
    valid = isinstance(version, int) and not isinstance(version, bool) and version >= 1
    if version is not None and not valid:
        raise ValueError(f"`version` must be a positive integer. Received: {version!r}")
    os.makedirs(model_dir, exist_ok=True)
    clean_stale_temp_dirs(model_dir)

    def target_for(v: int | None) -> str:
        v = v if v is not None else max(existing_versions(model_dir), default=0) + 1
        target = os.path.join(model_dir, str(v))
        if os.path.exists(target):
            raise FileExistsError(
                f"Version {v} of this model already exists at {target}; versions are never "
                "overwritten. Omit --version/`version` to use the next free one."
            )
        return target

    target = target_for(version)  # fail before the (slow) export if the version is taken
    prefix = f"{_TMP_PREFIX}{socket.gethostname()}.{os.getpid()}."
    tmp = tempfile.mkdtemp(prefix=prefix, dir=model_dir)
    try:
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
                # A concurrent exporter took this number between the check and the rename.
                if version is not None or not os.path.exists(target):
                    raise
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
