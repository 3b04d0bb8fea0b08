"""Writing files so that a crash never leaves a half-written one: temp file + `os.replace`.

`atomic_path` / `atomic_write` replace one file (run files, plots); `new_files` creates a
set of files that must not exist yet (an export and its companions), with a lock against a
second writer of the same files.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import signal
import tempfile
import threading
from collections.abc import Callable, Iterator, Sequence

# `new_files` writes NAME as PARTIAL_PREFIX + NAME beside it, and locks LOCK_PREFIX + NAME +
# LOCK_SUFFIX while it does.
PARTIAL_PREFIX = ".partial-"
LOCK_PREFIX, LOCK_SUFFIX = ".", ".lock"


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
    try:
        fd, tmp = tempfile.mkstemp(dir=directory, prefix=".tmp-", suffix=os.path.basename(path))
    except OSError as error:  # the user's path, not the hidden temp file's
        raise type(error)(error.errno, error.strerror, path) from None
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


def missing_dirs(path: str) -> list[str]:
    """`path` and those of its parents that do not exist yet, deepest first."""
    missing = []
    while path and not os.path.lexists(path):
        missing.append(path)
        path = os.path.dirname(path)
    return missing


def check_directory(directory: str) -> None:
    """OSError naming `directory` unless files can be written in it: it is a directory, or can
    be created as one (its deepest existing ancestor is a directory), and a file can be created
    there (tried: `os.access` says yes to root, even on a read-only folder). For a check before
    slow work.

    Example:
    >>> check_directory("/dev/null/out")
    Traceback (most recent call last):
    ...
    NotADirectoryError: Cannot write in /dev/null/out: /dev/null is a file, not a directory.
    """
    existing = os.path.abspath(directory)
    while not os.path.lexists(existing):
        existing = os.path.dirname(existing)
    if not os.path.isdir(existing):
        raise NotADirectoryError(f"Cannot write in {directory}: {existing} is a file, not a "
                                 "directory.")
    try:
        with tempfile.TemporaryFile(dir=existing):
            pass
    except OSError as error:
        where = "" if existing == os.path.abspath(directory) else f" (in {existing})"
        raise type(error)(f"Cannot write in {directory}: {error.strerror}{where}.") from None


def check_new(paths: Sequence[str]) -> None:
    """FileExistsError naming those of `paths` that exist: `new_files` never replaces one."""
    existing = [p for p in paths if os.path.lexists(p)]
    if existing:
        raise FileExistsError(f"Not overwriting {', '.join(existing)}: remove it or choose "
                              "another path.")


def _partial(path: str) -> str:
    directory, name = os.path.split(path)
    return os.path.join(directory, PARTIAL_PREFIX + name)


@contextlib.contextmanager
def _lock(path: str) -> Iterator[None]:
    """Holds `LOCK_PREFIX + NAME + LOCK_SUFFIX` beside `path` (a kernel `flock`: a killed
    holder releases it); FileExistsError at once if another process holds it. The file is
    removed on release; a lock on a file already removed is taken again on the new one."""
    directory, name = os.path.split(os.path.abspath(path))
    lock = os.path.join(directory, LOCK_PREFIX + name + LOCK_SUFFIX)
    while True:
        try:
            fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o666)
        except OSError as error:  # the user's path, not the hidden lock file's
            raise type(error)(error.errno, error.strerror, path) from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            if os.path.samestat(os.fstat(fd), os.stat(lock)):
                break
        except BlockingIOError:
            os.close(fd)
            raise FileExistsError(f"{path} is being written by another process (it holds "
                                  f"{lock}): wait for it, or choose another path.") from None
        except FileNotFoundError:
            pass
        os.close(fd)  # the holder removed this lock file as we opened it: take the new one
    try:
        yield
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(lock)
        os.close(fd)


@contextlib.contextmanager
def _noting_interrupts() -> Iterator[list[int]]:
    """Yields a list that gets SIGINT if Ctrl-C comes during the block, as well as the usual
    KeyboardInterrupt: a converter may swallow that one (tf2onnx has bare `except:`), and the
    interrupt must still cancel the files. Only in the main thread, where Python runs signal
    handlers, and only when SIGINT is handled (not ignored)."""
    noted: list[int] = []
    previous = signal.getsignal(signal.SIGINT)
    if threading.current_thread() is not threading.main_thread() or not callable(previous):
        yield noted
        return

    def note(signum, frame):
        noted.append(signum)
        previous(signum, frame)

    signal.signal(signal.SIGINT, note)
    try:
        yield noted
    finally:
        signal.signal(signal.SIGINT, previous)


@contextlib.contextmanager
def new_files(paths: Sequence[str]) -> Iterator[list[str]]:
    """Creates `paths` (a file and its companions, e.g. OpenVINO's `.xml` and `.bin`) all
    together or not at all, never replacing one: yields the temporary path to write each to.

    The temporaries are `PARTIAL_PREFIX + NAME` beside each file, so a writer that derives a
    companion's name from the first file's (OpenVINO's `.bin`) writes the right temporary.
    A second writer of the same files is refused at once while the block runs (`_lock`); the
    temporaries a killed writer left are removed by the next. When the block ends without
    error they are renamed into place, `paths[0]` last, so it exists only once all do (a
    SIGKILL between two renames, microseconds, can leave a companion alone); on error they are
    removed, as are the directories made for them. Missing directories are created.

    Example:
    >>> import os, tempfile
    >>> d = tempfile.mkdtemp()
    >>> with new_files([os.path.join(d, "m.xml"), os.path.join(d, "m.bin")]) as (xml, bin):
    ...     _ = open(xml, "w").write("<net/>"), open(bin, "w").write("")
    >>> sorted(os.listdir(d))
    ['m.bin', 'm.xml']
    """
    paths = [os.fspath(p) for p in paths]
    directory = os.path.dirname(os.path.abspath(paths[0]))
    check_directory(directory)
    created = missing_dirs(directory)
    os.makedirs(directory, exist_ok=True)
    temps = [_partial(p) for p in paths]
    try:
        with _lock(paths[0]):
            check_new(paths)
            for tmp in temps:  # a killed writer's
                if os.path.lexists(tmp):
                    os.unlink(tmp)
            try:
                with _noting_interrupts() as interrupts:
                    yield temps
                if interrupts:  # Ctrl-C came, though the writer's code swallowed it
                    raise KeyboardInterrupt
                # SIGINT/SIGTERM wait until all are in place (a SIGKILL cannot be held).
                blocked = signal.pthread_sigmask(signal.SIG_BLOCK,
                                                 {signal.SIGINT, signal.SIGTERM})
                try:
                    for tmp, path in reversed(list(zip(temps, paths))):
                        os.chmod(tmp, 0o666 & ~_umask())
                        os.rename(tmp, path)
                finally:
                    signal.pthread_sigmask(signal.SIG_SETMASK, blocked)
            except BaseException:
                for tmp in temps:
                    if os.path.lexists(tmp):
                        os.unlink(tmp)
                raise
    except BaseException:
        for path in created:
            try:
                os.rmdir(path)
            except OSError:  # not empty: someone else's files are in it
                break
        raise
