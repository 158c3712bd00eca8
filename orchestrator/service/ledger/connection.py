"""The ledger file and its one transaction discipline.

Several processes (the daemon's host and intake, the validator, the recorder, the
status readers) open the same file, so each opens it as WAL with synchronous=FULL:
readers never wait for the writer, and a write is on disk when its transaction
returns. Every write of every store is one `write()` transaction, taken with
BEGIN IMMEDIATE, so a read-then-write never fails half way on another process's
lock, and a SIGKILL at any point leaves the file consistent. No store commits on
its own or opens a connection of its own.
"""

from __future__ import annotations

import sqlite3
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from swarmrl.files import os_error_sentence

BUSY_TIMEOUT_MS = 30_000  # other processes' transactions are short; wait rather than fail
MAX_SQLITE_INT = 2**63 - 1


class Connection:
    """One SQLite connection to the ledger at `path`, shared by a process's threads."""

    def __init__(self, path: Path, *, prepare: Callable[[Connection], None]) -> None:
        """`prepare` creates or upgrades the schema once the pragmas are set; what it
        raises is reported like a failure to open."""
        self.path = Path(path)
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise ValueError(f"cannot create the ledger's folder: {os_error_sentence(e)}") from None
        self._lock = threading.RLock()
        try:
            self._db = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
        except sqlite3.Error as e:
            raise ValueError(f"cannot open the ledger {self.path}: {e}") from None
        self._db.row_factory = sqlite3.Row
        try:
            self._db.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}")
            self._enter_wal()
            self._db.execute("PRAGMA synchronous = FULL")
            self._db.execute("PRAGMA foreign_keys = ON")
            prepare(self)
        except sqlite3.DatabaseError as e:
            self._db.close()
            if "not a database" in str(e) or "malformed" in str(e):
                raise ValueError(
                    f"{self.path} is not a swarmrl ledger: it is not a readable SQLite database"
                ) from None
            raise ValueError(f"cannot open the ledger {self.path}: {e}") from None
        except ValueError:
            self._db.close()
            raise

    def _enter_wal(self) -> None:
        # Switching a new file to WAL answers "database is locked" at once, without
        # the busy handler, while another process is switching it too; wait here.
        deadline = time.monotonic() + BUSY_TIMEOUT_MS / 1000
        while True:
            try:
                self._db.execute("PRAGMA journal_mode = WAL")
                return
            except sqlite3.OperationalError as e:
                if "locked" not in str(e) or time.monotonic() > deadline:
                    raise
            time.sleep(0.01)

    @contextmanager
    def write(self) -> Iterator[sqlite3.Connection]:
        """One write transaction, committed (and on disk) when the block ends, rolled
        back if it raises; IMMEDIATE takes the write lock up front."""
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                yield self._db
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
            self._db.execute("COMMIT")

    def rows(self, sql: str, params: Sequence[Any] = ()) -> list[sqlite3.Row]:
        with self._lock:
            return self._db.execute(sql, params).fetchall()

    def row(self, sql: str, params: Sequence[Any] = ()) -> sqlite3.Row | None:
        with self._lock:
            row: sqlite3.Row | None = self._db.execute(sql, params).fetchone()
            return row

    def close(self) -> None:
        with self._lock:
            self._db.close()


def marks(values: Sequence[object]) -> str:
    """The `?` placeholders for `values` in an IN (...) clause."""
    return ", ".join("?" * len(values))
