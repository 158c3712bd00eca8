"""The lock that keeps two processes from using one folder (or one key) at once: an
flock on a file that names its holder, so the second process is told who holds it."""

from __future__ import annotations

import fcntl
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

# Enough for a pid and a command name; a lock file is never read further.
_HOLDER_BYTES = 200


class FolderBusyError(ValueError):
    """Another process holds the lock; the message names it and its pid."""


@contextmanager
def exclusive_use(lock_file: Path, guarded: Path | str, command: str) -> Iterator[None]:
    """Holds `lock_file` for the block, on behalf of `command` (e.g. "swarmrl chain up")
    using `guarded` (a folder, or what else the message names as in use); if another
    process holds it, FolderBusyError at once, naming the command and pid it recorded.
    An flock: the kernel frees it however its holder exits, so a killed process leaves
    no stale lock, only a file the next holder reuses. The file is removed on release,
    so a command leaves the folder as it found it."""
    fd = _locked(lock_file, guarded)
    try:
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()} {command}\n".encode(), 0)
        yield
    finally:
        lock_file.unlink(missing_ok=True)  # still held: no one can take it in between
        os.close(fd)


def _locked(lock_file: Path, guarded: Path | str) -> int:
    """A descriptor of `lock_file`, exclusively flocked."""
    while True:
        fd = os.open(lock_file, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, _HOLDER_BYTES, 0).decode(errors="replace").split(maxsplit=1)
            os.close(fd)
            who = f"`{holder[1].strip()}` (pid {holder[0]})" if len(holder) == 2 else None
            raise FolderBusyError(
                f"{guarded} is in use by {who or 'another process'}; "
                "wait for it to finish or stop it"
            ) from None
        # A holder that released between our open and our flock removed the file we
        # locked; the lock that counts is on the file now at that name.
        try:
            current = os.stat(lock_file).st_ino == os.fstat(fd).st_ino
        except FileNotFoundError:
            current = False
        if current:
            return fd
        os.close(fd)
