"""The ledger file and its one transaction discipline.

Several processes (the daemon's host and intake, the validator workers, the recorder, the
status readers) open the same file, so each opens it as WAL with synchronous=FULL:
readers never wait for the writer, and a write is on disk when its transaction
returns. Within a process, writes go through one connection, one at a time, and each
read through a connection of its own (a small pool), beside them. Every write of every
store is one `write()` transaction, taken with BEGIN IMMEDIATE, so a read-then-write
never fails half way on another process's lock, and a SIGKILL at any point leaves the
file consistent. No store commits on its own or opens a connection of its own.

A damaged file (a disk fault, a page overwritten) is `LedgerDamagedError` wherever
it shows: at open when the caller asks for an integrity check, else at the first
query that reads a damaged page. Nothing can repair it in place, so a process that
meets it stops with that one sentence instead of a traceback.
"""

from __future__ import annotations

import queue
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from swarmrl.files import os_error_sentence

BUSY_TIMEOUT_MS = 30_000  # other processes' transactions are short; wait rather than fail
# Read connections a process keeps open for reuse: about its handler threads.
MAX_READERS = 16
MAX_SQLITE_INT = 2**63 - 1
# SQLite's primary result codes for a file that is damaged or no database at all.
_SQLITE_CORRUPT, _SQLITE_NOTADB = 11, 26


class LedgerDamagedError(ValueError):
    """The ledger file is damaged; ``str(e)`` says which file, what SQLite found and
    what to do, in one sentence."""

    def __init__(self, path: Path, found: str) -> None:
        super().__init__(
            f"the ledger {path} is damaged ({found}); restore it from a backup, or keep "
            f"what SQLite can still read with `sqlite3 {path} .recover`"
        )


def is_damage(error: sqlite3.Error) -> bool:
    """Whether SQLite's ``error`` says the file is damaged (not busy, not full, not a
    mistake in a query)."""
    return _code(error) in (_SQLITE_CORRUPT, _SQLITE_NOTADB)


def _code(error: sqlite3.Error) -> int | None:
    """SQLite's primary result code of ``error`` (its extended code's low byte)."""
    code = getattr(error, "sqlite_errorcode", None)
    return None if code is None else code & 0xFF


class Connection:
    """One SQLite connection to the ledger at `path`, shared by a process's threads."""

    def __init__(
        self,
        path: Path,
        *,
        prepare: Callable[[Connection], None],
        check: bool = False,
        create: bool = True,
    ) -> None:
        """`prepare` creates or upgrades the schema once the pragmas are set; what it
        raises is reported like a failure to open. `check`: run SQLite's quick_check
        first (it reads every page, so only the daemon asks for it, once, at start),
        so a damaged file is refused before anything is written to it. `create=False`:
        a missing file is an error, not a new ledger."""
        self.path = Path(path)
        if not create and not self.path.is_file():
            raise ValueError(f"the ledger {self.path} is gone; only the daemon creates one")
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise ValueError(f"cannot create the ledger's folder: {os_error_sentence(e)}") from None
        self._lock = threading.RLock()  # the writer's (the one connection that writes)
        self._readers: queue.LifoQueue[sqlite3.Connection] = queue.LifoQueue(MAX_READERS)
        self._closed = False
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
            if check:
                self._quick_check()
            prepare(self)
        except sqlite3.DatabaseError as e:
            self._db.close()
            if _code(e) == _SQLITE_NOTADB:
                raise ValueError(
                    f"{self.path} is not a swarmrl ledger: it is not a readable SQLite database"
                ) from None
            if is_damage(e):
                raise LedgerDamagedError(self.path, str(e)) from None
            raise ValueError(f"cannot open the ledger {self.path}: {e}") from None
        except ValueError:
            self._db.close()
            raise

    def _quick_check(self) -> None:
        """LedgerDamagedError naming the first problem SQLite's quick_check finds."""
        found = self._db.execute("PRAGMA quick_check(1)").fetchone()[0]
        if found != "ok":
            # One line: without the "*** in database main ***" heading SQLite puts above.
            lines = [line for line in found.splitlines() if not line.startswith("***")]
            raise LedgerDamagedError(self.path, f"SQLite's quick_check: {' '.join(lines)}")

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
        with self._lock, self._damage_named():
            self._db.execute("BEGIN IMMEDIATE")
            try:
                yield self._db
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
            self._db.execute("COMMIT")

    def rows(self, sql: str, params: Sequence[Any] = ()) -> list[sqlite3.Row]:
        with self._reader() as db, self._damage_named():
            return db.execute(sql, params).fetchall()

    def row(self, sql: str, params: Sequence[Any] = ()) -> sqlite3.Row | None:
        with self._reader() as db, self._damage_named():
            row: sqlite3.Row | None = db.execute(sql, params).fetchone()
            return row

    @contextmanager
    def _reader(self) -> Iterator[sqlite3.Connection]:
        """A connection of its own for one read: under WAL a reader sees the last commit
        and waits for nobody, so a process's threads read side by side and never queue
        behind its writer (intake's handlers waited 6 ms a read for the one connection
        at a few hundred nodes; `swarmrl bench load`). Kept for reuse, at most
        MAX_READERS, made as they are first needed."""
        try:
            db = self._readers.get_nowait()
        except queue.Empty:
            db = self._open_reader()
        try:
            yield db
        finally:
            if self._closed:
                db.close()
            else:
                try:
                    self._readers.put_nowait(db)
                except queue.Full:
                    db.close()

    def _open_reader(self) -> sqlite3.Connection:
        with self._damage_named():
            db = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
            db.row_factory = sqlite3.Row
            db.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}")
            db.execute("PRAGMA query_only = ON")
        return db

    @contextmanager
    def _damage_named(self) -> Iterator[None]:
        """SQLite's word for a damaged page, raised again as the sentence that names the
        file and what to do."""
        try:
            yield
        except sqlite3.DatabaseError as e:
            if not is_damage(e):
                raise
            raise LedgerDamagedError(self.path, str(e)) from None

    def close(self) -> None:
        with self._lock:
            self._closed = True
            self._db.close()
            while True:
                try:
                    self._readers.get_nowait().close()
                except queue.Empty:
                    return


def marks(values: Sequence[object]) -> str:
    """The `?` placeholders for `values` in an IN (...) clause."""
    return ", ".join("?" * len(values))
