"""The node's transfer count for its monthly quota: the bytes that its weight
downloads, the weights it serves and its submissions moved in this calendar month
(UTC).

Counting (:meth:`Traffic.add`) takes a lock and no I/O: the pacers call it from
every thread that moves bytes, the host's trio thread among them. The count lives
in the data folder (TRAFFIC_FILE), so that a restart goes on with the month's
bytes: written whole by :meth:`Traffic.save` at most every SAVE_SECONDS (the
daemon's tick calls it) and by :meth:`Traffic.close`. A process killed outright
loses at most the last SAVE_SECONDS of its count.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

from swarmrl.files import previous_copy, write_atomically
from swarmrl.sizes import GiB

log = logging.getLogger("swarmrl.node")

TRAFFIC_FILE = "traffic.json"
SAVE_SECONDS = 5.0


class Traffic:
    """Bytes moved this month, kept at `path`; `quota`: bytes a month (None: none).
    `clock` gives the unix time that :meth:`add` counts in."""

    def __init__(
        self, path: Path, *, quota: int | None = None, clock: Callable[[], float] = time.time
    ) -> None:
        self.path = Path(path)
        self.quota = quota  # may change while the node runs (its settings, applied live)
        self._clock = clock
        self._lock = threading.Lock()  # the count
        self._writing = threading.Lock()  # the file: the tick's saves and the close
        self._month, self._bytes = _read(self.path, _month_of(clock()))
        self._saved = (self._month, self._bytes)
        self._saved_at = clock()
        self._failing = False  # the last save failed, and said so

    def add(self, n: int) -> None:
        """Counts `n` bytes moved now."""
        month = _month_of(self._clock())
        with self._lock:
            if month != self._month:
                self._month, self._bytes = month, 0
            self._bytes += n

    def moved(self, now: float) -> int:
        """Bytes moved in the month of the unix time `now`."""
        with self._lock:
            return self._bytes if self._month == _month_of(now) else 0

    def over(self, now: float) -> str | None:
        """Why the quota holds the node at the unix time `now`, or None if it does not:
        "12.1 of 12 GiB moved this month; resets 2026-12-01 00:00 UTC"."""
        quota, moved = self.quota, self.moved(now)
        if quota is None or moved < quota:
            return None
        return (
            f"{moved / GiB:.1f} of {quota / GiB:g} GiB moved this month; "
            f"resets {_next_month(now):%Y-%m-%d %H:%M} UTC"
        )

    def save(self, now: float) -> None:
        """Writes the count if it changed and SAVE_SECONDS passed since the last write."""
        if now - self._saved_at >= SAVE_SECONDS:
            self._write(now)

    def close(self) -> None:
        """Writes the count if it changed."""
        self._write(self._clock())

    def _write(self, now: float) -> None:
        with self._writing:
            with self._lock:
                count = (self._month, self._bytes)
            if count == self._saved:
                return
            self._saved_at = now
            month, moved = count
            try:
                count_json = json.dumps({"month": month, "bytes": moved}).encode()
                write_atomically(self.path, count_json, keep_previous=True)
            except OSError as e:
                # Counting goes on in memory; the next save tries again (a disk frees up).
                if not self._failing:
                    log.warning("could not keep the month's transfer count: %s", e)
                self._failing = True
                return
            self._saved, self._failing = count, False


def _month_of(now: float) -> str:
    return datetime.fromtimestamp(now, UTC).strftime("%Y-%m")


def _next_month(now: float) -> datetime:
    day = datetime.fromtimestamp(now, UTC)
    if day.month == 12:
        return datetime(day.year + 1, 1, 1, tzinfo=UTC)
    return datetime(day.year, day.month + 1, 1, tzinfo=UTC)


def _read(path: Path, month: str) -> tuple[str, int]:
    """The month and count kept at `path` (or, if that does not read, in the copy it
    replaced); this `month` and 0 if it holds another month's, none, or none that reads
    (said in the log: a count begins again)."""
    try:
        kept_month, moved = _read_count(path)
    except FileNotFoundError:
        return month, 0
    except (OSError, ValueError, TypeError, KeyError) as e:
        try:
            kept_month, moved = _read_count(previous_copy(path))
            log.warning("the transfer count in %s does not read (%s); the copy before it "
                        "does", path, e)  # fmt: skip
        except (OSError, ValueError, TypeError, KeyError):
            log.warning("the transfer count in %s does not read (%s); counting from 0", path, e)
            return month, 0
    return (month, moved) if kept_month == month else (month, 0)


def _read_count(path: Path) -> tuple[str, int]:
    kept = json.loads(path.read_bytes())
    kept_month, moved = kept["month"], kept["bytes"]
    if not isinstance(kept_month, str) or not isinstance(moved, int) or moved < 0:
        raise ValueError("not a month and a count of bytes")
    return kept_month, moved
