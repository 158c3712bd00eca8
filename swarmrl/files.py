"""Where swarmrl keeps things on this machine, and how it replaces a file safely."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

# The folder that holds each daemon's own data folder (role_data_dir).
DATA_DIR_VARIABLE = "SWARMRL_DATA_DIR"
# In a daemon's data folder: which role's it is (claim_data_dir).
ROLE_FILE = ".swarmrl-role"


def data_dir(name: str, override: str) -> Path:
    """$``override``, else ``swarmrl/<name>`` under the XDG data home. Where $``override``
    is also a daemon's SWARMRL_<KEY>, that key belongs in settings_toml.LOCATION_KEYS, so
    that the variable moves its default only and a file's key wins."""
    if env := os.environ.get(override):
        return Path(env)
    return _swarmrl_home() / name


def role_data_dir(role: str) -> Path:
    """The default data_dir of the ``role`` daemon (node, orchestrator): ``<role>`` under
    $SWARMRL_DATA_DIR, else under the XDG data home's swarmrl folder. One variable moves
    every daemon's folder and never puts two of them in one."""
    base = os.environ.get(DATA_DIR_VARIABLE)
    # A relative base is the working directory's when the daemon starts.
    return (Path(base).absolute() if base else _swarmrl_home()) / role


def _swarmrl_home() -> Path:
    data_home = os.environ.get("XDG_DATA_HOME") or Path.home() / ".local" / "share"
    return Path(data_home) / "swarmrl"


def data_dir_role(folder: Path) -> str | None:
    """The role of the daemon whose data folder ``folder`` is, None if no daemon has
    claimed it (or it does not exist yet); ValueError (one sentence) if it is not a
    folder."""
    folder = Path(folder)
    _check_name(folder)
    if folder.exists() and not folder.is_dir():
        raise ValueError(f"{folder} exists and is not a folder")
    try:
        return (folder / ROLE_FILE).read_text().strip() or None
    except (FileNotFoundError, NotADirectoryError):
        return None
    except OSError as e:
        raise ValueError(f"cannot read {folder / ROLE_FILE}: {os_error_reason(e)}") from None


def check_data_dir(folder: Path, role: str) -> str | None:
    """ValueError (one sentence) unless ``folder`` can be the ``role`` daemon's data
    folder: it is a folder, or can be made, and no other role's (a node in an
    orchestrator's folder would share its weight store and logs). The role that has
    claimed it (``role``), or None."""
    folder = Path(folder)
    owner = data_dir_role(folder)
    if owner not in (None, role):
        article = "an" if owner[:1] in "aeiou" else "a"
        raise ValueError(
            f"{folder} is {article} {owner}'s data folder; give the {role} a folder of its own"
        )
    _check_can_make(folder, shown=folder, verb="create")
    return owner


def claim_data_dir(folder: Path, role: str) -> None:
    """Makes ``folder`` (with missing folders above it) and marks it as the ``role``
    daemon's data folder; ValueError (one sentence) as check_data_dir."""
    folder = Path(folder)
    if check_data_dir(folder, role) is None:
        folder.mkdir(parents=True, exist_ok=True)
        write_atomically(folder / ROLE_FILE, f"{role}\n".encode())


def _check_name(path: Path) -> None:
    """A name the file system refuses outright (too long, a loop of links) would surface
    later as an errno string: say so now."""
    try:
        os.stat(path)
    except (FileNotFoundError, NotADirectoryError):
        pass  # the callers say what is missing, in their own terms
    except OSError as e:
        raise ValueError(f"{str(path)[:120]} cannot be used: {os_error_reason(e)}") from None


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
    so a command refuses before it spends work whose result it could not save. Missing
    folders above it are made when it is written (``replacing``), so the nearest
    existing one must take new entries."""
    path = Path(path)
    _check_name(path)
    if path.is_dir():
        raise ValueError(f"{path} is a directory; give a file name to write")
    if path.exists() and not path.is_file():
        raise ValueError(f"cannot write {path}: it exists and is not a regular file")
    _check_can_make(path.parent, shown=path, verb="write")


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
    # Beside it too: a command stages a new folder next to it before putting it in place.
    _check_can_make(resolved.parent, shown=path, verb="create")
    if resolved.exists() and not _writable(resolved):
        raise ValueError(f"cannot write {path}: the folder {resolved} is not writable")


def _check_can_make(folder: Path, *, shown: Path, verb: str) -> None:
    """``folder`` exists and takes new entries, or can be made: its nearest existing
    ancestor is a folder that takes new entries. ``shown`` is the user's path."""
    folder = folder.resolve()
    ancestor = _nearest_existing(folder)
    if not ancestor.is_dir():
        raise ValueError(f"cannot {verb} {shown}: {ancestor} is not a folder")
    if not _writable(ancestor):
        raise ValueError(f"cannot write {shown}: the folder {ancestor} is not writable")


def _nearest_existing(path: Path) -> Path:
    """``path`` if it exists, else its nearest ancestor that does."""
    while not path.exists() and path != path.parent:
        path = path.parent
    return path


def _make_parents(path: Path) -> list[Path]:
    """Makes the missing folders above ``path``; those it made, the deepest first."""
    made = []
    folder = path.parent
    while not folder.exists() and folder != folder.parent:
        made.append(folder)
        folder = folder.parent
    for folder in reversed(made):
        folder.mkdir(exist_ok=True)
    return made


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

    Missing folders above ``path`` are made first, and removed again if the block fails
    (output paths such as ~/.local/share/swarmrl/orchestrator/tasks.jsonl on a fresh
    home). An OSError about the temporary file is raised again in terms of ``path``: the
    temporary name means nothing to the user."""
    path = Path(path)
    made: list[Path] = []
    try:
        made = _make_parents(path)
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    except OSError as e:
        _remove_empty(made)
        raise os_error(f"cannot write {path}: {os_error_reason(e)}", e.errno) from None
    os.close(fd)
    try:
        yield Path(tmp)
        with open(tmp, "rb") as f:
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except OSError as e:
        Path(tmp).unlink(missing_ok=True)
        _remove_empty(made)
        if e.filename not in (None, tmp) and e.filename2 != tmp:
            raise  # about another file the block touched: its name is the user's
        raise os_error(f"cannot write {path}: {os_error_reason(e)}", e.errno) from None
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        _remove_empty(made)
        raise


def _remove_empty(folders: list[Path]) -> None:
    """Removes ``folders`` (the deepest first) that are still empty: a failed write
    leaves the tree as it found it."""
    for folder in folders:
        try:
            folder.rmdir()
        except OSError:
            return  # not empty (someone else wrote there) or gone: leave the rest


def read_bounded(path: Path, limit: int, what: str) -> bytes:
    """The bytes of the input file `path`, at most `limit` of them; ValueError in one
    sentence if it cannot be read or is larger (then it is not `what`): a device or a
    huge file given by mistake is refused, never read whole."""
    check_input_file(path)
    try:
        with Path(path).open("rb") as f:
            raw = f.read(limit + 1)
    except OSError as e:
        raise ValueError(f"cannot read {path}: {os_error_reason(e)}") from None
    if len(raw) > limit:
        raise ValueError(f"{path} is too large to be {what}")
    return raw


def os_error(sentence: str, errno: int | None) -> OSError:
    """An OSError that says ``sentence`` (no errno number in its text) and carries
    ``errno``: an error told again in the user's terms stays the kind it was (a full
    disk, a missing file) for the callers that tell them apart."""
    error = OSError(sentence)
    error.errno = errno
    return error


def os_error_reason(error: OSError) -> str:
    """The cause of an OSError in words ("permission denied"), without errno or files."""
    if not error.strerror:
        return str(error)
    return error.strerror[0].lower() + error.strerror[1:]


def os_error_sentence(error: OSError) -> str:
    """An OSError as the user reads it: the file and the cause, no errno number."""
    if error.strerror and error.filename is not None:
        return f"{error.filename}: {os_error_reason(error)}"
    return os_error_reason(error)


def fsync(path: Path) -> None:
    """Syncs the file or folder at ``path`` to disk (a folder: the names in it)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def link_or_copy(source: Path, target: Path) -> None:
    """`target` becomes `source`'s file: a second name for the same bytes where the
    filesystem allows (no copy, and each side deletes its own name), else a copy."""
    target.unlink(missing_ok=True)
    try:
        os.link(source, target)
    except OSError:
        with replacing(target) as tmp:
            shutil.copyfile(source, tmp)


def write_atomically(path: Path, data: bytes, *, keep_previous: bool = False) -> None:
    """Replace ``path`` with ``data``: readers see the old file or the whole new one.
    ``keep_previous``: the file replaced stays beside it (:func:`previous_copy`), for a
    state file whose loss costs more than its last change (a disk that tears a write)."""
    path = Path(path)
    if keep_previous and path.is_file():
        with replacing(previous_copy(path)) as tmp:
            shutil.copyfile(path, tmp)
    with replacing(path) as tmp:
        tmp.write_bytes(data)


def previous_copy(path: Path) -> Path:
    """Where ``write_atomically(path, keep_previous=True)`` keeps the file it replaced."""
    return path.with_name(path.name + ".prev")
