"""How the daemon tells a child process to stop.

A ``multiprocessing.Event`` would do until a child dies while waiting on it: its
``set`` then waits for that waiter to wake, forever (SIGTERM to the process
group kills the children first). A pipe cannot hang that way: the parent writes
one message, and a child sees it as long as it lives. The daemon holds the pipe's
only writing end, so a child also sees the flag once the daemon is gone, however
it went (the pipe reads as closed): no child outlives its daemon.
"""

from __future__ import annotations

import contextlib
from multiprocessing.context import BaseContext
from typing import Any, Protocol


class StopSignal(Protocol):
    """What a child's ``main`` is given: a StopFlag there, any Event in a test."""

    def is_set(self) -> bool: ...

    def wait(self, timeout: float | None = None) -> bool: ...


class StopFlag:
    """Set once by the parent; ``is_set`` and ``wait`` in the child, like an Event's."""

    def __init__(self, context: BaseContext) -> None:
        self._reader, self._writer = context.Pipe(duplex=False)

    def set(self) -> None:
        with contextlib.suppress(OSError):  # every reader is gone: nobody left to stop
            self._writer.send_bytes(b"stop")

    def is_set(self) -> bool:
        return self._reader.poll()

    def wait(self, timeout: float | None = None) -> bool:
        return self._reader.poll(timeout)

    def __getstate__(self) -> dict[str, Any]:
        return {"_reader": self._reader}  # a child only reads
