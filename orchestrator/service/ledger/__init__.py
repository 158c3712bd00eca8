"""The orchestrator's ledger: nodes, work orders, submissions, and what went on chain.

One SQLite file shared by the daemon's processes (host and intake, validator
workers, recorder) and read by `orchestrator status` and the live view. It is the
orchestrator's memory across restarts, so every write is one transaction that is
on disk when the call returns (`connection`): a submission is acknowledged only
after `ledger.submissions.record` returns, and a SIGKILL at any point leaves the
file consistent. Nodes, orders and submissions change state only as the one table
`transitions.TRANSITIONS` allows.

Each concern is a store over the one connection: `ledger.nodes`, `ledger.orders`,
`ledger.submissions` (and the validator workers' leases on them), `ledger.epochs`,
`ledger.slashes`; `schema` holds the tables
and the upgrades. Addresses are stored checksummed whatever case callers pass.
Hashes and signatures are hex strings as callers give them (digests and order ids
without 0x by convention). Times are unix seconds.
"""

from __future__ import annotations

from pathlib import Path

from orchestrator.service.ledger import schema
from orchestrator.service.ledger.connection import Connection
from orchestrator.service.ledger.epochs import Epochs
from orchestrator.service.ledger.nodes import Nodes
from orchestrator.service.ledger.orders import Orders
from orchestrator.service.ledger.slashes import Slashes
from orchestrator.service.ledger.submissions import Submissions


class Ledger:
    """The ledger file at `path`; safe to share between threads and processes."""

    def __init__(
        self, path: Path, *, run: str | None = None, check: bool = False, create: bool = True
    ) -> None:
        """`run`: the run this orchestrator issues orders in. A ledger of schema 1 kept
        its orders without their run; given it, such a ledger is upgraded (the daemon
        gives it), else refused with a sentence saying so. `check`: refuse a damaged
        file before anything is written to it (SQLite's quick_check reads every page:
        the daemon asks for it once, at start; `home.open_for_daemon`). `create=False`:
        refuse a missing file rather than start an empty one (the daemon's children and
        readers: only the daemon, having checked the data dir, may create its ledger)."""
        self._connection = Connection(
            path, prepare=lambda c: schema.prepare(c, run), check=check, create=create
        )
        self.nodes = Nodes(self._connection)
        self.orders = Orders(self._connection)
        self.submissions = Submissions(self._connection)
        self.epochs = Epochs(self._connection)
        self.slashes = Slashes(self._connection)

    def close(self) -> None:
        self._connection.close()

    def __enter__(self) -> Ledger:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
