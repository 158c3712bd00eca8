"""Finding the processes a command left behind, by the mark in their environment
(which survives a new session or a double fork, unlike a process group)."""

from __future__ import annotations

import contextlib
import os
import signal
from pathlib import Path

MARK_VARIABLE = "SWARMRL_CONTRACT_MARK"


def marked(mark: str) -> dict[int, str]:
    """Live processes of this user whose environment carries ``mark``: pid -> command."""
    needle = f"{MARK_VARIABLE}={mark}".encode()
    found = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if needle not in (entry / "environ").read_bytes().split(b"\0"):
                continue
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
            if state == "Z":  # exited, waiting for its parent to reap it
                continue
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:  # gone meanwhile, or not ours to read
            continue
        found[int(entry.name)] = " ".join(a.decode(errors="replace") for a in argv if a)[:200]
    return found


def kill(pids: list[int]) -> None:
    """End processes this harness's commands started (found by their mark)."""
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
