"""Writing files so that a crash never leaves a half-written one: temp file + `os.replace`."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def atomic_write(path: str, write: Callable, binary: bool = False) -> str:
    """Calls `write(f)` on a temp file beside `path`, then renames it to `path` (atomic on
    POSIX). The file gets the permissions a plain `open` would give (0666 minus the umask),
    not mkstemp's private 0600. Returns `path`.

    Example:
    >>> import os, tempfile
    >>> p = os.path.join(tempfile.mkdtemp(), "a.txt")
    >>> open(atomic_write(p, lambda f: f.write("hi"))).read()
    'hi'
    """
    directory = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=".tmp-", suffix=os.path.basename(path))
    try:
        with os.fdopen(fd, "wb" if binary else "w") as f:
            write(f)
        os.chmod(tmp, 0o666 & ~_umask())
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise
    return path
