"""Where swarmrl keeps things on this machine, and how it replaces a file safely."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


def data_dir(name: str, override: str) -> Path:
    """$``override``, else ``swarmrl/<name>`` under the XDG data home."""
    if env := os.environ.get(override):
        return Path(env)
    data_home = os.environ.get("XDG_DATA_HOME") or Path.home() / ".local" / "share"
    return Path(data_home) / "swarmrl" / name


@contextmanager
def replacing(path: Path) -> Iterator[Path]:
    """A fresh temporary path beside ``path`` to write; it replaces ``path`` (synced to
    disk) when the block succeeds and is removed when it fails, so readers see the old
    file or the whole new one."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    try:
        yield Path(tmp)
        with open(tmp, "rb") as f:
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_atomically(path: Path, data: bytes) -> None:
    """Replace ``path`` with ``data``: readers see the old file or the whole new one."""
    with replacing(path) as tmp:
        tmp.write_bytes(data)
