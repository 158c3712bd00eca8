"""Submissions, keyed by their EIP-712 digest (which makes a resend recognisable), and
the validator's verdict on each.

A submission is acknowledged only after `Submissions.record` returns: by then it is
on disk, and its order is answered in the same transaction.

Validator workers share the received submissions through leases (`Lease`): a worker
claims a submission for a while (`claim`), renews its leases while it lives (`renew`),
and hands its accepted records to the trainer (`holding`) and writes its verdict
(`set_outcome`) only while its lease holds; the verdict ends the lease. A lease of a
dead worker expires, and the worker's next process releases it at once
(`release_earlier`), so every submission is judged, and gets one verdict.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from eth_utils import to_checksum_address

from orchestrator.service.ledger import nodes, orders
from orchestrator.service.ledger.connection import MAX_SQLITE_INT, Connection, marks
from orchestrator.service.ledger.transitions import first, member, sources
from swarmrl.rollouts.tolerances import NO_SUMS, TemperatureSums
from swarmrl.work.states import OrderState, SubmissionStatus


class OrderNotOpenError(ValueError):
    """The order a submission answers is not open (any more); ``str(e)`` says so."""


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
    # Still waiting for its verdict when the recorder closed its epoch (`close`): the
    # verdict stands, and what the epoch pays does not count it.
    late: bool = False


@dataclass(frozen=True)
class Lease:
    """Who holds a submission while judging it: a validator worker (its id, the same
    across the worker's restarts) and one process of it (a token new at each start)."""

    worker: str
    token: str


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


class Submissions:
    """The `submissions` table."""

    def __init__(self, connection: Connection) -> None:
        self._connection = connection

    def record(self, s: SubmissionRow) -> tuple[SubmissionRow, bool]:
        """Stores `s` unless its digest is known, and marks its order answered in the same
        transaction (a crash between the two would hand the order out again); returns
        the stored row and whether it is new. A resend changes nothing and returns the
        first row (and its receipt). An order answers once: `OrderNotOpenError` if it is no
        longer open (another submission answered it first), and nothing is stored. (An
        order the ledger does not hold binds nothing: intake records no such submission,
        having found its order open.)"""
        status = first(member(SubmissionStatus, s.status, "submission status"))
        for name, value in (("epoch", s.epoch), ("step", s.step), ("units", s.units)):
            if not 0 <= value <= MAX_SQLITE_INT:
                raise ValueError(f"submission {name} {value} is out of range")
        with self._connection.write() as db:
            row = db.execute("SELECT * FROM submissions WHERE digest = ?", (s.digest,)).fetchone()
            if row is not None:
                return from_row(row), False
            db.execute(
                f"INSERT INTO submissions VALUES ({', '.join('?' * 18)})",
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
                    int(s.late),
                ),
            )
            if (
                not orders.move(db, s.order_id, OrderState.ANSWERED)
                and db.execute("SELECT 1 FROM orders WHERE order_id = ?", (s.order_id,)).fetchone()
            ):
                raise OrderNotOpenError(f"work order {s.order_id[:12]} is already answered")
            stored = db.execute(
                "SELECT * FROM submissions WHERE digest = ?", (s.digest,)
            ).fetchone()
        return from_row(stored), True

    def get(self, digest: str) -> SubmissionRow | None:
        row = self._connection.row("SELECT * FROM submissions WHERE digest = ?", (digest,))
        return None if row is None else from_row(row)

    def all(
        self, *, node: str | None = None, epoch: int | None = None, status: str | None = None
    ) -> list[SubmissionRow]:
        """Submissions matching every filter given, in the order they arrived."""
        where: list[str] = []
        params: list[object] = []
        if node is not None:
            where.append("node = ?")
            params.append(to_checksum_address(node))
        if epoch is not None:
            where.append("epoch = ?")
            params.append(epoch)
        if status is not None:
            where.append("status = ?")
            params.append(member(SubmissionStatus, status, "submission status"))
        clause = f"WHERE {' AND '.join(where)} " if where else ""
        rows = self._connection.rows(
            f"SELECT * FROM submissions {clause}ORDER BY received_at, digest", params
        )
        return [from_row(r) for r in rows]

    def close(self, epoch: int) -> list[SubmissionRow]:
        """Closes `epoch` for payment and returns its submissions: in one write
        transaction, the ones still waiting for a verdict are marked late. The recorder
        records what this returns; a verdict written after it (a validator past its
        grace) moves a late submission all the same, and the epoch on chain does not pay
        it, so the chain's units and the ledger's stay equal whichever write came first."""
        with self._connection.write() as db:
            db.execute(
                "UPDATE submissions SET late = 1 WHERE epoch = ? AND status = ?",
                (epoch, SubmissionStatus.RECEIVED),
            )
            rows = db.execute(
                "SELECT * FROM submissions WHERE epoch = ? ORDER BY received_at, digest",
                (epoch,),
            ).fetchall()
        return [from_row(r) for r in rows]

    def latest(self, node: str, limit: int) -> list[SubmissionRow]:
        """The node's last `limit` submissions, oldest first (reads only those)."""
        rows = self._connection.rows(
            "SELECT * FROM (SELECT * FROM submissions WHERE node = ? "
            "ORDER BY received_at DESC, digest DESC LIMIT ?) ORDER BY received_at, digest",
            (to_checksum_address(node), limit),
        )
        return [from_row(r) for r in rows]

    def claim(self, lease: Lease, limit: int, now: float, seconds: float) -> list[SubmissionRow]:
        """Up to `limit` submissions still 'received' that no live lease holds, oldest
        first, now leased to `lease` until `now + seconds`. In one write transaction, so
        two workers claiming at once never claim the same one; an expired lease (its
        worker died or stalled) is taken over."""
        with self._connection.write() as db:
            rows = db.execute(
                "SELECT s.* FROM submissions s LEFT JOIN leases l ON l.digest = s.digest "
                "WHERE s.status = ? AND (l.expires IS NULL OR l.expires <= ?) "
                "ORDER BY s.received_at, s.digest LIMIT ?",
                (SubmissionStatus.RECEIVED, now, limit),
            ).fetchall()
            db.executemany(
                "INSERT OR REPLACE INTO leases (digest, worker, token, expires) "
                "VALUES (?, ?, ?, ?)",
                [(r["digest"], lease.worker, lease.token, now + seconds) for r in rows],
            )
        return [from_row(r) for r in rows]

    def renew(self, lease: Lease, now: float, seconds: float) -> int:
        """Every lease `lease` still holds, extended to `now + seconds`; returns how many
        it holds (one taken over after it expired is not its own any more)."""
        with self._connection.write() as db:
            renewed: int = db.execute(
                "UPDATE leases SET expires = ? WHERE worker = ? AND token = ?",
                (now + seconds, lease.worker, lease.token),
            ).rowcount
        return renewed

    def release_earlier(self, lease: Lease) -> int:
        """The leases of `lease`'s worker taken by an earlier process of it (one that died:
        a worker's processes run one at a time), released at once rather than at their
        expiry; returns how many."""
        with self._connection.write() as db:
            released: int = db.execute(
                "DELETE FROM leases WHERE worker = ? AND token != ?", (lease.worker, lease.token)
            ).rowcount
        return released

    @contextmanager
    def holding(self, digest: str, lease: Lease) -> Iterator[bool]:
        """Whether `lease` still holds the submission `digest` (no verdict yet, nobody
        took it over), inside a write transaction kept for the block: no worker can claim
        it meanwhile, so what the block does while it holds (hand the submission's
        records to the trainer) one worker alone does."""
        with self._connection.write() as db:
            yield _held(db, digest, lease)

    def set_outcome(
        self,
        digest: str,
        status: str,
        units: int,
        reason: str,
        slashable: bool,
        prefilled: bool,
        now: float,
        temperature: TemperatureSums = NO_SUMS,
        lease: Lease | None = None,
    ) -> bool:
        """The validator's verdict on a submission, if the transition table lets it move
        to `status` from the status it has (a verdict stands) and, given `lease`, while
        that lease holds it (a worker that lost its lease leaves the verdict to the one
        that took it over); returns whether it moved. With the verdict, in its
        transaction, the submission's colder-sampling sums (`temperature`) join its
        node's, and its lease ends: only a verdict that moves counts them."""
        to = member(SubmissionStatus, status, "submission status")
        if not 0 <= units <= MAX_SQLITE_INT:
            raise ValueError(f"submission units {units} is out of range")
        before = sources(to)
        with self._connection.write() as db:
            changed = 0
            if lease is None or _held(db, digest, lease):
                changed = db.execute(
                    "UPDATE submissions SET status = ?, units = ?, reason = ?, slashable = ?, "
                    "prefilled = ?, validated_at = ? "
                    f"WHERE digest = ? AND status IN ({marks(before)})",
                    (to, units, reason, int(slashable), int(prefilled), now, digest, *before),
                ).rowcount
            known = db.execute(
                "SELECT node FROM submissions WHERE digest = ?", (digest,)
            ).fetchone()
            if changed:
                nodes.fold_temperature(db, known["node"], temperature)
                db.execute("DELETE FROM leases WHERE digest = ?", (digest,))
        if known is None:
            raise ValueError(f"no submission {digest} in the ledger")
        return bool(changed)

    def count(self, status: str) -> int:
        """Submissions with `status`: an index range, cheap enough for every work request."""
        status = member(SubmissionStatus, status, "submission status")
        row = self._connection.row(
            "SELECT COUNT(*) AS n FROM submissions WHERE status = ?", (status,)
        )
        assert row is not None  # COUNT always answers
        count: int = row["n"]
        return count

    def tally(self) -> Tally:
        """Submissions and units by status, per node, and rejections by reason: what the
        metrics and `orchestrator status` show, read from the tallies the schema's
        triggers keep (a row per node and status), and the rejected rows' reasons."""
        rows = self._connection.rows
        per_node = {
            (r["node"], r["status"]): (r["n"], r["units"])
            for r in rows("SELECT node, status, n, units FROM tallies WHERE n > 0")
        }
        by_status: dict[str, tuple[int, int]] = {}
        for (_, status), (n, units) in per_node.items():
            count, total = by_status.get(status, (0, 0))
            by_status[status] = (count + n, total + units)
        reasons = {
            r["reason"]: r["n"]
            for r in rows(
                "SELECT reason, COUNT(*) AS n FROM submissions WHERE status = ? "
                "GROUP BY reason ORDER BY n DESC LIMIT 64",
                (SubmissionStatus.REJECTED,),
            )
        }
        return Tally(by_status, per_node, reasons)


def _held(db: sqlite3.Connection, digest: str, lease: Lease) -> bool:
    """Whether `lease` holds the submission `digest`, still received, inside the caller's
    transaction. Its own lease past its expiry still holds until another worker claims
    the submission: the claim replaces it."""
    row = db.execute(
        "SELECT 1 FROM leases l JOIN submissions s ON s.digest = l.digest "
        "WHERE l.digest = ? AND l.worker = ? AND l.token = ? AND s.status = ?",
        (digest, lease.worker, lease.token, SubmissionStatus.RECEIVED),
    ).fetchone()
    return row is not None


def from_row(r: sqlite3.Row) -> SubmissionRow:
    """A `submissions` row (or a query's `s.*`) as a SubmissionRow."""
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
        late=bool(r["late"]),
    )
