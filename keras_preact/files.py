"""Writing files so that a crash never leaves a half-written one: temp file + `os.replace`."""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Callable, Iterator


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


@contextlib.contextmanager
def atomic_path(path: str) -> Iterator[str]:
    """Yields a temp path beside `path` to write to (it keeps `path`'s ending, which Keras'
    savers check); renames it to `path` when the block ends without error (atomic on POSIX),
    else deletes it. The file gets the permissions a plain `open` would give (0666 minus the
    umask), not mkstemp's private 0600.

    Example:
    >>> import os, tempfile
    >>> p = os.path.join(tempfile.mkdtemp(), "a.txt")
    >>> with atomic_path(p) as tmp:
    ...     _ = open(tmp, "w").write("hi")
    >>> open(p).read(), os.listdir(os.path.dirname(p))
    ('hi', ['a.txt'])
    """
    directory = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=".tmp-", suffix=os.path.basename(path))
    os.close(fd)
    try:
        yield tmp
        os.chmod(tmp, 0o666 & ~_umask())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def atomic_write(path: str, write: Callable, binary: bool = False) -> str:
    """Calls `write(f)` on a file opened at an `atomic_path` of `path`. Returns `path`.

    Example:
    >>> import os, tempfile
    >>> p = os.path.join(tempfile.mkdtemp(), "a.txt")
    >>> open(atomic_write(p, lambda f: f.write("hi"))).read()
    'hi'
    """
    with atomic_path(path) as tmp, open(tmp, "wb" if binary else "w") as f:
        write(f)
    return path
