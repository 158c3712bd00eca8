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


def _check_name(path: Path) -> None:
    """A name the file system refuses outright (too long, a loop of links) would surface
    later as an errno string: say so now."""
    try:
        os.stat(path)
    except (FileNotFoundError, NotADirectoryError):
        pass  # the callers say what is missing, in their own terms
    except OSError as e:
        raise ValueError(f"{str(path)[:120]} cannot be used: {_reason(e)}") from None


def check_input_file(path: Path) -> None:
    """Raise ValueError (one sentence) unless ``path`` names a file this process may read:
    a directory or a missing file would otherwise read as empty, or as an errno string."""
    path = Path(path)
    _check_name(path)
    if not path.exists():
        raise ValueError(f"{path} does not exist")
    if path.is_dir():
        raise ValueError(f"{path} is a directory; give a file")
    # A device such as /dev/zero never ends; a pipe does, so `<(command)` still works.
    if not (path.is_file() or path.is_fifo()):
        raise ValueError(f"{path} is not a regular file")
    if not os.access(path, os.R_OK):
        raise ValueError(f"{path} is not readable")


def check_output_path(path: Path) -> None:
    """Raise ValueError (one sentence) unless ``path`` can be written as an output file,
    so a command refuses before it spends work whose result it could not save."""
    path = Path(path)
    _check_name(path)
    if path.is_dir():
        raise ValueError(f"{path} is a directory; give a file name to write")
    if path.exists() and not path.is_file():
        raise ValueError(f"cannot write {path}: it exists and is not a regular file")
    parent = path.parent
    if not parent.exists():
        raise ValueError(f"cannot write {path}: the folder {parent} does not exist")
    if not parent.is_dir():
        raise ValueError(f"cannot write {path}: {parent} is not a folder")
    if not _writable(parent):
        raise ValueError(f"cannot write {path}: the folder {parent} is not writable")


def check_output_dir(path: Path) -> None:
    """Raise ValueError (one sentence) unless a command can create or fill the folder
    ``path``: missing folders above it are created, so the nearest existing one must
    take new entries."""
    path = Path(path)
    _check_name(path)
    # As mkdir(parents=True) will see it: "missing/.." is a folder once "missing" is made.
    resolved = path.resolve()
    if resolved.exists() and not resolved.is_dir():
        raise ValueError(f"{path} exists and is not a folder")
    ancestor = resolved.parent
    while not ancestor.exists():
        ancestor = ancestor.parent
    if not ancestor.is_dir():
        raise ValueError(f"cannot create {path}: {ancestor} is not a folder")
    for folder in (ancestor, resolved) if resolved.exists() else (ancestor,):
        if not _writable(folder):
            raise ValueError(f"cannot write {path}: the folder {folder} is not writable")


def _writable(folder: Path) -> bool:
    """Whether a new file can be made in ``folder``; os.access misses read-only mounts,
    ACLs and root's rights, so a file is made and removed to be sure."""
    if not os.access(folder, os.W_OK | os.X_OK):
        return False
    try:
        fd, probe = tempfile.mkstemp(prefix=".swarmrl-probe.", dir=folder)
    except OSError:
        return False
    os.close(fd)
    os.unlink(probe)
    return True


@contextmanager
def replacing(path: Path) -> Iterator[Path]:
    """A fresh temporary path beside ``path`` to write; it replaces ``path`` (synced to
    disk) when the block succeeds and is removed when it fails, so readers see the old
    file or the whole new one.

    An OSError about the temporary file is raised again in terms of ``path``: the
    temporary name means nothing to the user."""
    path = Path(path)
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    except OSError as e:
        raise OSError(f"cannot write {path}: {_reason(e)}") from None
    os.close(fd)
    try:
        yield Path(tmp)
        with open(tmp, "rb") as f:
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except OSError as e:
        Path(tmp).unlink(missing_ok=True)
        if e.filename not in (None, tmp) and e.filename2 != tmp:
            raise  # about another file the block touched: its name is the user's
        raise OSError(f"cannot write {path}: {_reason(e)}") from None
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _reason(error: OSError) -> str:
    """The cause of ``error`` in words, without the file names it carries."""
    if error.errno is not None and error.strerror:
        return error.strerror[0].lower() + error.strerror[1:]
    return "the file system refused it"


def write_atomically(path: Path, data: bytes) -> None:
    """Replace ``path`` with ``data``: readers see the old file or the whole new one."""
    with replacing(path) as tmp:
        tmp.write_bytes(data)
