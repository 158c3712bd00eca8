"""Fingerprints of folders, to tell what a command changed."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

# Files larger than this are compared by size and modification time only: the
# sparse "huge" inputs, model weights.
_HASHED_BYTES = 1 << 20


def snapshot(root: Path) -> dict[str, str]:
    """Every path under ``root`` (relative) -> what it is and holds."""
    found: dict[str, str] = {}
    root = Path(root)
    if not root.exists():
        return found
    for folder, dirs, files in os.walk(root):
        for name in dirs:
            path = Path(folder, name)
            found[str(path.relative_to(root))] = "link" if path.is_symlink() else "folder"
        for name in files:
            path = Path(folder, name)
            found[str(path.relative_to(root))] = _fingerprint(path)
    return found


def _fingerprint(path: Path) -> str:
    st = path.lstat()
    if path.is_symlink():
        return f"link to {os.readlink(path)}"
    if st.st_size > _HASHED_BYTES:
        return f"{st.st_size} bytes, mtime {st.st_mtime_ns}"
    try:
        digest = hashlib.blake2b(path.read_bytes(), digest_size=16).hexdigest()
    except OSError as e:
        digest = f"unreadable ({e.strerror})"
    return f"{st.st_size} bytes, {digest}, mode {st.st_mode:o}"


def differences(root: Path, before: dict[str, str], after: dict[str, str]) -> list[str]:
    """What changed under ``root``, one short line per path."""
    lines = []
    for path in sorted(before.keys() | after.keys()):
        if path not in after:
            lines.append(f"removed {Path(root, path)}")
        elif path not in before:
            lines.append(f"created {Path(root, path)}")
        elif before[path] != after[path]:
            lines.append(f"changed {Path(root, path)}")
    return lines


def changes(roots: list[Path], before: dict[str, dict[str, str]]) -> list[str]:
    """What changed under each of ``roots`` since ``before`` (snapshots by root)."""
    return [line for r in roots for line in differences(r, before[str(r)], snapshot(r))]
