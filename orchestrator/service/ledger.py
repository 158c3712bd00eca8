"""The orchestrator's ledger: nodes, work orders, submissions, and what went on chain.

One SQLite file shared by the daemon's processes (host and intake, validator,
recorder). It is the orchestrator's memory across restarts, so every write is
one transaction that is on disk when the call returns (WAL with
synchronous=FULL): a submission is acknowledged only after `record_submission`
returns, and a SIGKILL at any point leaves the file consistent. Submissions are
keyed by their EIP-712 digest, which makes a resend recognisable. A work order is
kept as its node got it, signed, beside the few columns it is looked up by. Nodes,
orders and submissions change state only as the one table `TRANSITIONS` allows.

Addresses are stored checksummed whatever case callers pass. Hashes and
signatures are hex strings as callers give them (digests and order ids without
0x by convention). Times are unix seconds.
"""

from __future__ import annotations

import json
import logging
import sqlite3
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import Any, TypeVar

from eth_utils import to_checksum_address

from swarmrl.chain.errors import os_error_sentence
from swarmrl.work.assign import Slot, WorkOrder
from swarmrl.work.states import NodeState, OrderState, SubmissionStatus

log = logging.getLogger(__name__)
_State = TypeVar("_State", bound=StrEnum)

SCHEMA_VERSION = 2
BUSY_TIMEOUT_MS = 30_000  # other processes' transactions are short; wait rather than fail


class SlashOutcome(StrEnum):
    """How a slashable submission was dealt with."""

    SENT = "sent"  # our vote's transaction
    FOUND = "found"  # already slashed or voted on chain
    MISSED = "missed"  # it can no longer be slashed


# Every state change the ledger makes: for each state (None: not in the ledger yet),
# the states it may move to. A move the table does not allow is no move, so callers
# say where an event takes a node, an order or a submission (a heartbeat: active),
# and the table says from where (a banned node stays banned; a gone one joins again).
TRANSITIONS: dict[type[StrEnum], dict[StrEnum | None, frozenset[StrEnum]]] = {
    NodeState: {
        None: frozenset({NodeState.JOINED}),
        NodeState.JOINED: frozenset({NodeState.ACTIVE, NodeState.SILENT, NodeState.BANNED}),
        NodeState.ACTIVE: frozenset({NodeState.SILENT, NodeState.BANNED}),
        NodeState.SILENT: frozenset(
            {NodeState.ACTIVE, NodeState.JOINED, NodeState.GONE, NodeState.BANNED}
        ),
        NodeState.GONE: frozenset({NodeState.JOINED, NodeState.BANNED}),
        NodeState.BANNED: frozenset(),
    },
    OrderState: {
        None: frozenset({OrderState.OPEN}),
        OrderState.OPEN: frozenset({OrderState.ANSWERED, OrderState.EXPIRED}),
        OrderState.EXPIRED: frozenset({OrderState.REASSIGNED, OrderState.DROPPED}),
        OrderState.ANSWERED: frozenset(),
        OrderState.REASSIGNED: frozenset(),
        OrderState.DROPPED: frozenset(),
    },
    SubmissionStatus: {
        # Intake rejects some at once; the others wait for the validator.
        None: frozenset({SubmissionStatus.RECEIVED, SubmissionStatus.REJECTED}),
        SubmissionStatus.RECEIVED: frozenset(
            {SubmissionStatus.ACCEPTED, SubmissionStatus.REJECTED}
        ),
        SubmissionStatus.ACCEPTED: frozenset(),
        SubmissionStatus.REJECTED: frozenset(),
    },
}
MAX_SQLITE_INT = 2**63 - 1

# A work order is kept signed, as its node got it (JSON); node, counter and deadline,
# taken from it, are what it is looked up by.
_ORDERS = """
CREATE TABLE orders (
    order_id TEXT PRIMARY KEY, node TEXT NOT NULL, counter INTEGER NOT NULL,
    deadline INTEGER NOT NULL, issued_at REAL NOT NULL, state TEXT NOT NULL,
    signed TEXT NOT NULL
);
CREATE INDEX orders_by_state ON orders (state, deadline);
CREATE INDEX orders_by_node ON orders (node, state);
"""
_SCHEMA = f"""
CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE nodes (
    address TEXT PRIMARY KEY, provider TEXT NOT NULL, peer_id TEXT NOT NULL,
    backend TEXT NOT NULL, hardware TEXT NOT NULL, state TEXT NOT NULL,
    joined_at REAL NOT NULL, last_seen REAL NOT NULL, speed REAL,
    trusted INTEGER NOT NULL DEFAULT 0, abandoned INTEGER NOT NULL DEFAULT 0
);
CREATE INDEX nodes_by_peer ON nodes (peer_id);
CREATE TABLE transitions (
    id INTEGER PRIMARY KEY, address TEXT NOT NULL, from_state TEXT, to_state TEXT NOT NULL,
    reason TEXT NOT NULL, at REAL NOT NULL
);
CREATE INDEX transitions_by_node ON transitions (address, id);
CREATE TABLE counters (node TEXT PRIMARY KEY, next INTEGER NOT NULL);
{_ORDERS}CREATE TABLE submissions (
    digest TEXT PRIMARY KEY, node TEXT NOT NULL, order_id TEXT NOT NULL,
    epoch INTEGER NOT NULL, step INTEGER NOT NULL, file TEXT NOT NULL,
    file_sha256 TEXT NOT NULL, rollout_digest TEXT NOT NULL, signature TEXT NOT NULL,
    received_at REAL NOT NULL, units INTEGER NOT NULL, status TEXT NOT NULL,
    reason TEXT NOT NULL, slashable INTEGER NOT NULL, prefilled INTEGER NOT NULL,
    receipt TEXT NOT NULL, validated_at REAL
);
CREATE INDEX submissions_by_epoch ON submissions (epoch, node);
CREATE INDEX submissions_by_status ON submissions (status, received_at);
CREATE TABLE epochs (
    epoch INTEGER NOT NULL, node TEXT NOT NULL, units INTEGER NOT NULL,
    commitment TEXT NOT NULL, tx_hash TEXT, recorded_at REAL NOT NULL,
    PRIMARY KEY (epoch, node)
);
CREATE TABLE slashes (
    digest TEXT PRIMARY KEY, epoch INTEGER NOT NULL, node TEXT NOT NULL,
    tx_hash TEXT, outcome TEXT NOT NULL, at REAL NOT NULL
);
CREATE INDEX slashes_by_epoch ON slashes (epoch, node);
"""


@dataclass(frozen=True)
class NodeRow:
    address: str
    provider: str
    peer_id: str
    backend: str
    hardware: dict[str, Any]
    state: NodeState
    joined_at: float
    last_seen: float
    speed: float | None  # measured tokens per second, None until reported
    trusted: int  # submissions that passed a full prefill check
    abandoned: int  # orders left past their deadline


@dataclass(frozen=True)
class Transition:
    address: str
    from_state: NodeState | None  # None for the first join
    to_state: NodeState
    reason: str
    at: float


@dataclass(frozen=True)
class OrderRow:
    """A work order as its node got it, signed, and what became of it."""

    order_id: str  # the order's EIP-712 digest in the swarm domain, hex
    order: WorkOrder
    issued_at: float
    state: OrderState


@dataclass(frozen=True)
class SubmissionRow:
    digest: str
    node: str
    order_id: str
    epoch: int
    step: int
    file: str
    file_sha256: str
    rollout_digest: str
    signature: str
    received_at: float
    units: int = 0  # accepted rollouts; 0 until accepted
    status: SubmissionStatus = SubmissionStatus.RECEIVED
    reason: str = ""
    slashable: bool = False
    prefilled: bool = False
    receipt: str = ""  # the receipt (JSON) the node was given
    validated_at: float | None = None


@dataclass(frozen=True)
class EpochRow:
    """One node's epoch as the recorder left it.

    units > 0: the work is on chain; tx_hash is None when the recorder found it
    there (sent before a crash) instead of sending it. units == 0: nothing to
    record (no accepted work, no evidence), nothing was sent.
    """

    epoch: int
    node: str
    units: int
    commitment: str
    tx_hash: str | None
    recorded_at: float


@dataclass(frozen=True)
class SlashRow:
    """A slashable submission dealt with, and how."""

    digest: str
    epoch: int
    node: str
    tx_hash: str | None
    outcome: SlashOutcome
    at: float


class Ledger:
    """The ledger file at `path`; safe to share between threads and processes."""

    def __init__(self, path: Path, *, run: str | None = None) -> None:
        """`run`: the run this orchestrator issues orders in. A ledger of schema 1 kept
        its orders without their run; given it, such a ledger is upgraded (the daemon
        gives it), else refused with a sentence saying so."""
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
            self._create_schema(run)
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

    def _create_schema(self, run: str | None) -> None:
        # Under BEGIN IMMEDIATE, so processes opening a new file at once create it once,
        # and an upgrade is all done or not at all.
        with self._write() as db:
            version = db.execute("PRAGMA user_version").fetchone()[0]
            if version == SCHEMA_VERSION:
                return
            if version > SCHEMA_VERSION:
                raise ValueError(
                    f"{self.path} was written by a newer swarmrl (ledger schema {version}, "
                    f"this version reads {SCHEMA_VERSION}); upgrade swarmrl"
                )
            if version == 0:
                _execute(db, _SCHEMA)
                db.execute(
                    "INSERT INTO meta (key, value) VALUES ('genesis', ?)", (repr(time.time()),)
                )
            elif run is None:
                raise ValueError(
                    f"{self.path} was written by an older swarmrl (ledger schema {version}); "
                    "`swarmrl orchestrator run` upgrades it"
                )
            else:
                orders = self._upgrade_from_1(db, run)
                log.info("ledger %s upgraded from schema 1 (%d work orders)", self.path, orders)
            db.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")

    def _upgrade_from_1(self, db: sqlite3.Connection, run: str) -> int:
        """Schema 1 kept each work order's fields in columns of their own, and not its
        run: each becomes the signed order it was issued as. Returns how many."""
        rows = db.execute("SELECT * FROM assignments").fetchall()
        _execute(db, _ORDERS)
        for r in rows:
            try:
                order = WorkOrder(
                    run=run,
                    node=r["node"],
                    counter=r["counter"],
                    min_step=r["min_step"],
                    seed=int(r["seed"]),
                    group_size=r["group_size"],
                    max_tokens=r["max_tokens"],
                    temperature=float(r["temperature"]),
                    top_p=float(r["top_p"]),
                    tasks=[Slot(problem_id=p, budget=b) for p, b in json.loads(r["tasks"])],
                    deadline=int(r["deadline"]),
                    signature=r["signature"],
                )
            except (ValueError, TypeError):  # pydantic's ValidationError is a ValueError
                raise ValueError(
                    f"cannot upgrade {self.path}: its work order {r['order_id'][:12]} is damaged"
                ) from None
            _insert_order(db, r["order_id"], order, r["issued_at"], r["state"])
        db.execute("DROP TABLE assignments")
        return len(rows)

    def close(self) -> None:
        with self._lock:
            self._db.close()

    def __enter__(self) -> Ledger:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @contextmanager
    def _write(self) -> Iterator[sqlite3.Connection]:
        """One write transaction; IMMEDIATE takes the write lock up front, so a
        read-then-write never fails half way on another process's lock."""
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                yield self._db
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
            self._db.execute("COMMIT")

    def _rows(self, sql: str, params: Sequence[Any] = ()) -> list[sqlite3.Row]:
        with self._lock:
            return self._db.execute(sql, params).fetchall()

    def _row(self, sql: str, params: Sequence[Any] = ()) -> sqlite3.Row | None:
        with self._lock:
            return self._db.execute(sql, params).fetchone()

    # Meta.

    def genesis(self) -> float:
        """When this ledger was created: epoch 0 starts here, for as long as the file lives."""
        row = self._row("SELECT value FROM meta WHERE key = 'genesis'")
        assert row is not None  # written with the schema
        return float(row["value"])

    # Nodes.

    def upsert_node(
        self,
        address: str,
        provider: str,
        peer_id: str,
        backend: str,
        hardware: dict[str, Any],
        now: float,
    ) -> NodeRow:
        """A join: a new node starts 'joined'; a known one keeps its state and standing
        (a banned node stays banned) with what it reports now."""
        address, provider = to_checksum_address(address), to_checksum_address(provider)
        with self._write() as db:
            updated = db.execute(
                "UPDATE nodes SET provider = ?, peer_id = ?, backend = ?, hardware = ?, "
                "last_seen = ? WHERE address = ?",
                (provider, peer_id, backend, json.dumps(hardware), now, address),
            ).rowcount
            if not updated:
                state = _first(NodeState.JOINED)
                db.execute(
                    "INSERT INTO nodes (address, provider, peer_id, backend, hardware, state, "
                    "joined_at, last_seen) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                    (address, provider, peer_id, backend, json.dumps(hardware), state, now, now),
                )
                db.execute(
                    "INSERT INTO transitions (address, from_state, to_state, reason, at) "
                    "VALUES (?, NULL, ?, 'joined the swarm', ?)",
                    (address, state, now),
                )
        if not updated:
            log.info("node %s joined (provider %s, peer %s)", address, provider, peer_id)
        node = self.node(address)
        assert node is not None
        return node

    def node(self, address: str) -> NodeRow | None:
        row = self._row("SELECT * FROM nodes WHERE address = ?", (to_checksum_address(address),))
        return None if row is None else _node(row)

    def node_by_peer(self, peer_id: str) -> NodeRow | None:
        """The node that joined last from `peer_id`."""
        row = self._row(
            "SELECT * FROM nodes WHERE peer_id = ? ORDER BY joined_at DESC LIMIT 1", (peer_id,)
        )
        return None if row is None else _node(row)

    def nodes(self) -> list[NodeRow]:
        return [_node(r) for r in self._rows("SELECT * FROM nodes ORDER BY joined_at, address")]

    def set_state(self, address: str, state: str, reason: str, now: float) -> bool:
        """Moves a node to `state` if the transition table lets it go there from the state
        it is in (read in the same transaction), keeping the transition; returns whether
        it moved. Its current state again is no move."""
        to = _member(NodeState, state, "node state")
        address = to_checksum_address(address)
        with self._write() as db:
            row = db.execute("SELECT state FROM nodes WHERE address = ?", (address,)).fetchone()
            if row is None:
                raise ValueError(f"no node {address} in the ledger")
            before = NodeState(row["state"])
            if not allowed(before, to):
                return False
            db.execute("UPDATE nodes SET state = ? WHERE address = ?", (to, address))
            db.execute(
                "INSERT INTO transitions (address, from_state, to_state, reason, at) "
                "VALUES (?, ?, ?, ?, ?)",
                (address, before, to, reason, now),
            )
        log.info("node %s: %s -> %s (%s)", address, before, to, reason)
        return True

    def transitions(self, address: str) -> list[Transition]:
        rows = self._rows(
            "SELECT * FROM transitions WHERE address = ? ORDER BY id",
            (to_checksum_address(address),),
        )
        return [
            Transition(
                r["address"],
                None if r["from_state"] is None else NodeState(r["from_state"]),
                NodeState(r["to_state"]),
                r["reason"],
                r["at"],
            )
            for r in rows
        ]

    def touch(self, address: str, now: float, speed: float | None) -> None:
        """A heartbeat: the node was seen at `now`, generating at `speed` tokens/s if known."""
        with self._write() as db:
            db.execute(
                "UPDATE nodes SET last_seen = ?, speed = COALESCE(?, speed) WHERE address = ?",
                (now, speed, to_checksum_address(address)),
            )

    # Work orders.

    def add_order(
        self, order_id: str, order: WorkOrder, issued_at: float, *, takes_over: str | None = None
    ) -> None:
        """Stores a new, open order; with `takes_over`, that expired order's tasks are
        now this one's, and it becomes 'reassigned' in the same transaction."""
        with self._write() as db:
            if takes_over is not None and not _move_order(db, takes_over, OrderState.REASSIGNED):
                raise ValueError(f"work order {takes_over[:12]} is not expired")
            _insert_order(db, order_id, order, issued_at, _first(OrderState.OPEN))

    def order(self, order_id: str) -> OrderRow | None:
        row = self._row("SELECT * FROM orders WHERE order_id = ?", (order_id,))
        return None if row is None else _order(row)

    def open_order(self, node: str) -> OrderRow | None:
        """The node's open order (the latest, should there be several)."""
        row = self._row(
            "SELECT * FROM orders WHERE node = ? AND state = ? ORDER BY counter DESC LIMIT 1",
            (to_checksum_address(node), OrderState.OPEN),
        )
        return None if row is None else _order(row)

    def orphaned(self, *, excluding: str) -> OrderRow | None:
        """The oldest expired order of a node other than `excluding` whose tasks no one
        has taken over yet."""
        row = self._row(
            "SELECT * FROM orders WHERE state = ? AND node != ? "
            "ORDER BY deadline, order_id LIMIT 1",
            (OrderState.EXPIRED, to_checksum_address(excluding)),
        )
        return None if row is None else _order(row)

    def next_counter(self, node: str) -> int:
        """Reserves the node's next assignment counter: 0, 1, 2 ...; never handed out
        twice, even if the assignment it was reserved for is never stored."""
        with self._write() as db:
            row = db.execute(
                "INSERT INTO counters (node, next) VALUES (?, 1) "
                "ON CONFLICT (node) DO UPDATE SET next = next + 1 RETURNING next",
                (to_checksum_address(node),),
            ).fetchone()
        return int(row["next"]) - 1

    def expire_orders(self, now: float) -> list[OrderRow]:
        """Open orders past their deadline become 'expired'; each costs its node one
        abandoned order. Returns them (as expired)."""
        with self._write() as db:
            sources = _sources(OrderState.EXPIRED)
            rows = db.execute(
                f"UPDATE orders SET state = ? WHERE state IN ({_marks(sources)}) AND deadline < ? "
                "RETURNING *",
                (OrderState.EXPIRED, *sources, now),
            ).fetchall()
            expired = sorted(
                (_order(r) for r in rows), key=lambda o: (o.order.deadline, o.order_id)
            )
            for o in expired:
                db.execute(
                    "UPDATE nodes SET abandoned = abandoned + 1 WHERE address = ?",
                    (to_checksum_address(o.order.node),),
                )
        return expired

    def set_order_state(self, order_id: str, state: str) -> bool:
        """Moves an order to `state` if the transition table allows it from the state it
        is in; returns whether it moved."""
        to = _member(OrderState, state, "order state")
        with self._write() as db:
            if _move_order(db, order_id, to):
                return True
            known = db.execute("SELECT 1 FROM orders WHERE order_id = ?", (order_id,)).fetchone()
        if known is None:
            raise ValueError(f"no work order {order_id} in the ledger")
        return False

    # Submissions.

    def record_submission(self, s: SubmissionRow) -> tuple[SubmissionRow, bool]:
        """Stores `s` unless its digest is known, and marks its order answered in the same
        transaction (a crash between the two would hand the order out again); returns
        the stored row and whether it is new. A resend changes nothing and returns the
        first row (and its receipt)."""
        status = _first(_member(SubmissionStatus, s.status, "submission status"))
        for name, value in (("epoch", s.epoch), ("step", s.step), ("units", s.units)):
            if not 0 <= value <= MAX_SQLITE_INT:
                raise ValueError(f"submission {name} {value} is out of range")
        with self._write() as db:
            row = db.execute("SELECT * FROM submissions WHERE digest = ?", (s.digest,)).fetchone()
            if row is not None:
                return _submission(row), False
            db.execute(
                f"INSERT INTO submissions VALUES ({', '.join('?' * 17)})",
                (
                    s.digest,
                    to_checksum_address(s.node),
                    s.order_id,
                    s.epoch,
                    s.step,
                    s.file,
                    s.file_sha256,
                    s.rollout_digest,
                    s.signature,
                    s.received_at,
                    s.units,
                    status,
                    s.reason,
                    int(s.slashable),
                    int(s.prefilled),
                    s.receipt,
                    s.validated_at,
                ),
            )
            _move_order(db, s.order_id, OrderState.ANSWERED)
            stored = db.execute(
                "SELECT * FROM submissions WHERE digest = ?", (s.digest,)
            ).fetchone()
        return _submission(stored), True

    def submission(self, digest: str) -> SubmissionRow | None:
        row = self._row("SELECT * FROM submissions WHERE digest = ?", (digest,))
        return None if row is None else _submission(row)

    def submissions(
        self, *, node: str | None = None, epoch: int | None = None, status: str | None = None
    ) -> list[SubmissionRow]:
        """Submissions matching every filter given, in the order they arrived."""
        where, params = [], []
        if node is not None:
            where.append("node = ?")
            params.append(to_checksum_address(node))
        if epoch is not None:
            where.append("epoch = ?")
            params.append(epoch)
        if status is not None:
            where.append("status = ?")
            params.append(_member(SubmissionStatus, status, "submission status"))
        clause = f"WHERE {' AND '.join(where)} " if where else ""
        rows = self._rows(f"SELECT * FROM submissions {clause}ORDER BY received_at, digest", params)
        return [_submission(r) for r in rows]

    def latest_submissions(self, node: str, limit: int) -> list[SubmissionRow]:
        """The node's last `limit` submissions, oldest first (reads only those)."""
        rows = self._rows(
            "SELECT * FROM (SELECT * FROM submissions WHERE node = ? "
            "ORDER BY received_at DESC, digest DESC LIMIT ?) ORDER BY received_at, digest",
            (to_checksum_address(node), limit),
        )
        return [_submission(r) for r in rows]

    def pending_validation(self, limit: int) -> list[SubmissionRow]:
        """Up to `limit` submissions still 'received', oldest first."""
        rows = self._rows(
            "SELECT * FROM submissions WHERE status = ? ORDER BY received_at, digest LIMIT ?",
            (SubmissionStatus.RECEIVED, limit),
        )
        return [_submission(r) for r in rows]

    def set_outcome(
        self,
        digest: str,
        status: str,
        units: int,
        reason: str,
        slashable: bool,
        prefilled: bool,
        now: float,
    ) -> bool:
        """The validator's verdict on a submission, if the transition table lets it move
        to `status` from the status it has (a verdict stands); returns whether it did."""
        to = _member(SubmissionStatus, status, "submission status")
        if not 0 <= units <= MAX_SQLITE_INT:
            raise ValueError(f"submission units {units} is out of range")
        sources = _sources(to)
        with self._write() as db:
            changed = db.execute(
                "UPDATE submissions SET status = ?, units = ?, reason = ?, slashable = ?, "
                "prefilled = ?, validated_at = ? "
                f"WHERE digest = ? AND status IN ({_marks(sources)})",
                (to, units, reason, int(slashable), int(prefilled), now, digest, *sources),
            ).rowcount
            known = db.execute("SELECT 1 FROM submissions WHERE digest = ?", (digest,)).fetchone()
        if known is None:
            raise ValueError(f"no submission {digest} in the ledger")
        return bool(changed)

    def add_trust(self, address: str) -> None:
        """One more of the node's submissions passed a full prefill check."""
        with self._write() as db:
            db.execute(
                "UPDATE nodes SET trusted = trusted + 1 WHERE address = ?",
                (to_checksum_address(address),),
            )

    # Epochs and slashes on chain.

    def epoch_of(self, now: float, epoch_seconds: float) -> int:
        """The epoch `now` falls in (0 for a clock behind genesis)."""
        if epoch_seconds <= 0:
            raise ValueError(f"epoch_seconds must be positive, got {epoch_seconds}")
        return max(0, int((now - self.genesis()) // epoch_seconds))

    def unrecorded_epochs(self, before_epoch: int) -> list[tuple[int, str]]:
        """(epoch, node) pairs before `before_epoch` with submissions and no epoch row."""
        rows = self._rows(
            "SELECT DISTINCT s.epoch, s.node FROM submissions s "
            "LEFT JOIN epochs e ON e.epoch = s.epoch AND e.node = s.node "
            "WHERE s.epoch < ? AND e.epoch IS NULL ORDER BY s.epoch, s.node",
            (before_epoch,),
        )
        return [(int(r["epoch"]), r["node"]) for r in rows]

    def record_epoch(
        self,
        epoch: int,
        node: str,
        units: int,
        commitment_hex: str,
        tx_hash: str | None,
        *,
        now: float | None = None,
    ) -> None:
        """Marks (epoch, node) recorded; the first record stands (a repeat is ignored)."""
        with self._write() as db:
            db.execute(
                "INSERT INTO epochs (epoch, node, units, commitment, tx_hash, recorded_at) "
                "VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT (epoch, node) DO NOTHING",
                (
                    epoch,
                    to_checksum_address(node),
                    units,
                    commitment_hex,
                    tx_hash,
                    time.time() if now is None else now,
                ),
            )

    def recorded(self, epoch: int, node: str) -> EpochRow | None:
        row = self._row(
            "SELECT * FROM epochs WHERE epoch = ? AND node = ?", (epoch, to_checksum_address(node))
        )
        return None if row is None else _epoch(row)

    def recorded_epochs(self) -> list[EpochRow]:
        return [_epoch(r) for r in self._rows("SELECT * FROM epochs ORDER BY epoch, node")]

    def record_slash(
        self,
        digest: str,
        epoch: int,
        node: str,
        tx_hash: str | None,
        now: float,
        *,
        outcome: str = SlashOutcome.SENT,
    ) -> None:
        """Marks the slashable submission `digest` dealt with; the first record stands."""
        outcome = _member(SlashOutcome, outcome, "slash outcome")
        with self._write() as db:
            db.execute(
                "INSERT INTO slashes (digest, epoch, node, tx_hash, outcome, at) "
                "VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT (digest) DO NOTHING",
                (digest, epoch, to_checksum_address(node), tx_hash, outcome, now),
            )

    def slashes(self) -> list[SlashRow]:
        rows = self._rows("SELECT * FROM slashes ORDER BY at, digest")
        return [
            SlashRow(
                r["digest"],
                r["epoch"],
                r["node"],
                r["tx_hash"],
                SlashOutcome(r["outcome"]),
                r["at"],
            )
            for r in rows
        ]

    def count_with(self, status: str) -> int:
        """Submissions with `status`: an index range, cheap enough for every work request
        (`tally` scans the whole table)."""
        status = _member(SubmissionStatus, status, "submission status")
        (row,) = self._rows("SELECT COUNT(*) AS n FROM submissions WHERE status = ?", (status,))
        return row["n"]

    def tally(self) -> Tally:
        """Submissions and units by status, per node, and rejections by reason: what the
        metrics and `orchestrator status` show, counted by SQLite, not in memory."""
        by_status = {
            r["status"]: (r["n"], r["units"])
            for r in self._rows(
                "SELECT status, COUNT(*) AS n, COALESCE(SUM(units), 0) AS units "
                "FROM submissions GROUP BY status"
            )
        }
        per_node = {
            (r["node"], r["status"]): (r["n"], r["units"])
            for r in self._rows(
                "SELECT node, status, COUNT(*) AS n, COALESCE(SUM(units), 0) AS units "
                "FROM submissions GROUP BY node, status"
            )
        }
        reasons = {
            r["reason"]: r["n"]
            for r in self._rows(
                "SELECT reason, COUNT(*) AS n FROM submissions WHERE status = ? "
                "GROUP BY reason ORDER BY n DESC LIMIT 64",
                (SubmissionStatus.REJECTED,),
            )
        }
        return Tally(by_status, per_node, reasons)

    def slash_candidates(self) -> list[SubmissionRow]:
        """Slashable submissions whose (epoch, node) is on chain (recorded with units)
        and has no slash record yet, by epoch, node and digest. The pool slashes an
        epoch once, so one slash record settles every other evidence of that epoch."""
        rows = self._rows(
            "SELECT s.* FROM submissions s "
            "JOIN epochs e ON e.epoch = s.epoch AND e.node = s.node AND e.units > 0 "
            "WHERE s.slashable = 1 AND NOT EXISTS "
            "(SELECT 1 FROM slashes x WHERE x.epoch = s.epoch AND x.node = s.node) "
            "ORDER BY s.epoch, s.node, s.digest"
        )
        return [_submission(r) for r in rows]


@dataclass(frozen=True)
class Tally:
    """(count, units) by status and by (node, status); rejection reasons with counts."""

    by_status: dict[str, tuple[int, int]]
    per_node: dict[tuple[str, str], tuple[int, int]]
    reasons: dict[str, int]

    def count(self, status: str) -> int:
        return self.by_status.get(status, (0, 0))[0]

    def units(self) -> int:
        return sum(units for _, units in self.by_status.values())


def _member(states: type[_State], value: str, what: str) -> _State:
    """`value` as a member of `states`; ValueError naming them unless it is one."""
    try:
        return states(value)
    except ValueError:
        raise ValueError(f"{what} must be one of {', '.join(states)}, got {value!r}") from None


def allowed(before: StrEnum | None, after: StrEnum) -> bool:
    """Whether the transition table lets a state move from `before` to `after`."""
    return after in TRANSITIONS[type(after)][before]


def _first(state: _State) -> _State:
    """`state`, which something new in the ledger must start in."""
    if not allowed(None, state):
        raise ValueError(f"nothing enters the ledger {state}")
    return state


def _sources(after: StrEnum) -> list[str]:
    """The states the table lets move to `after`."""
    moves = TRANSITIONS[type(after)]
    return [str(before) for before, then in moves.items() if before is not None and after in then]


def _marks(values: Sequence[object]) -> str:
    return ", ".join("?" * len(values))


def _move_order(db: sqlite3.Connection, order_id: str, to: OrderState) -> bool:
    """Moves an order to `to` if the table allows it from the state it is in."""
    sources = _sources(to)
    return bool(
        db.execute(
            f"UPDATE orders SET state = ? WHERE order_id = ? AND state IN ({_marks(sources)})",
            (to, order_id, *sources),
        ).rowcount
    )


def _execute(db: sqlite3.Connection, script: str) -> None:
    """Each statement of `script`, inside the caller's transaction (executescript would
    commit it)."""
    for statement in script.split(";"):
        if statement.strip():
            db.execute(statement)


def _node(r: sqlite3.Row) -> NodeRow:
    return NodeRow(
        address=r["address"],
        provider=r["provider"],
        peer_id=r["peer_id"],
        backend=r["backend"],
        hardware=json.loads(r["hardware"]),
        state=NodeState(r["state"]),
        joined_at=r["joined_at"],
        last_seen=r["last_seen"],
        speed=r["speed"],
        trusted=r["trusted"],
        abandoned=r["abandoned"],
    )


def _order(r: sqlite3.Row) -> OrderRow:
    return OrderRow(
        order_id=r["order_id"],
        order=WorkOrder.model_validate_json(r["signed"]),
        issued_at=r["issued_at"],
        state=OrderState(r["state"]),
    )


def _insert_order(
    db: sqlite3.Connection, order_id: str, order: WorkOrder, issued_at: float, state: str
) -> None:
    """The signed order, and the columns it is looked up by, taken from it."""
    db.execute(
        "INSERT INTO orders (order_id, node, counter, deadline, issued_at, state, signed) "
        "VALUES (?, ?, ?, ?, ?, ?, ?)",
        (
            order_id,
            to_checksum_address(order.node),
            order.counter,
            order.deadline,
            issued_at,
            state,
            order.model_dump_json(),
        ),
    )


def _submission(r: sqlite3.Row) -> SubmissionRow:
    return SubmissionRow(
        digest=r["digest"],
        node=r["node"],
        order_id=r["order_id"],
        epoch=r["epoch"],
        step=r["step"],
        file=r["file"],
        file_sha256=r["file_sha256"],
        rollout_digest=r["rollout_digest"],
        signature=r["signature"],
        received_at=r["received_at"],
        units=r["units"],
        status=SubmissionStatus(r["status"]),
        reason=r["reason"],
        slashable=bool(r["slashable"]),
        prefilled=bool(r["prefilled"]),
        receipt=r["receipt"],
        validated_at=r["validated_at"],
    )


def _epoch(r: sqlite3.Row) -> EpochRow:
    return EpochRow(
        epoch=r["epoch"],
        node=r["node"],
        units=r["units"],
        commitment=r["commitment"],
        tx_hash=r["tx_hash"],
        recorded_at=r["recorded_at"],
    )
