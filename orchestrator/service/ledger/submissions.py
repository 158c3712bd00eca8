"""Submissions, keyed by their EIP-712 digest (which makes a resend recognisable), and
the validator's verdict on each.

A submission is acknowledged only after `Submissions.record` returns: by then it is
on disk, and its order is answered in the same transaction.
"""

from __future__ import annotations

import sqlite3
from dataclasses import dataclass

from eth_utils import to_checksum_address

from orchestrator.service.ledger import nodes, orders
from orchestrator.service.ledger.connection import MAX_SQLITE_INT, Connection, marks
from orchestrator.service.ledger.transitions import first, member, sources
from swarmrl.rollouts.tolerances import NO_SUMS, TemperatureSums
from swarmrl.work.states import OrderState, SubmissionStatus


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
        first row (and its receipt)."""
        status = first(member(SubmissionStatus, s.status, "submission status"))
        for name, value in (("epoch", s.epoch), ("step", s.step), ("units", s.units)):
            if not 0 <= value <= MAX_SQLITE_INT:
                raise ValueError(f"submission {name} {value} is out of range")
        with self._connection.write() as db:
            row = db.execute("SELECT * FROM submissions WHERE digest = ?", (s.digest,)).fetchone()
            if row is not None:
                return from_row(row), False
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
            orders.move(db, s.order_id, OrderState.ANSWERED)
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

    def latest(self, node: str, limit: int) -> list[SubmissionRow]:
        """The node's last `limit` submissions, oldest first (reads only those)."""
        rows = self._connection.rows(
            "SELECT * FROM (SELECT * FROM submissions WHERE node = ? "
            "ORDER BY received_at DESC, digest DESC LIMIT ?) ORDER BY received_at, digest",
            (to_checksum_address(node), limit),
        )
        return [from_row(r) for r in rows]

    def pending(self, limit: int) -> list[SubmissionRow]:
        """Up to `limit` submissions still 'received' (waiting for the validator), oldest
        first."""
        rows = self._connection.rows(
            "SELECT * FROM submissions WHERE status = ? ORDER BY received_at, digest LIMIT ?",
            (SubmissionStatus.RECEIVED, limit),
        )
        return [from_row(r) for r in rows]

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
    ) -> bool:
        """The validator's verdict on a submission, if the transition table lets it move
        to `status` from the status it has (a verdict stands); returns whether it did.
        With the verdict, in its transaction, the submission's colder-sampling sums
        (`temperature`) join its node's: only a verdict that moves counts them."""
        to = member(SubmissionStatus, status, "submission status")
        if not 0 <= units <= MAX_SQLITE_INT:
            raise ValueError(f"submission units {units} is out of range")
        before = sources(to)
        with self._connection.write() as db:
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
        if known is None:
            raise ValueError(f"no submission {digest} in the ledger")
        return bool(changed)

    def count(self, status: str) -> int:
        """Submissions with `status`: an index range, cheap enough for every work request
        (`tally` scans the whole table)."""
        status = member(SubmissionStatus, status, "submission status")
        row = self._connection.row(
            "SELECT COUNT(*) AS n FROM submissions WHERE status = ?", (status,)
        )
        assert row is not None  # COUNT always answers
        count: int = row["n"]
        return count

    def tally(self) -> Tally:
        """Submissions and units by status, per node, and rejections by reason: what the
        metrics and `orchestrator status` show, counted by SQLite, not in memory."""
        rows = self._connection.rows
        by_status = {
            r["status"]: (r["n"], r["units"])
            for r in rows(
                "SELECT status, COUNT(*) AS n, COALESCE(SUM(units), 0) AS units "
                "FROM submissions GROUP BY status"
            )
        }
        per_node = {
            (r["node"], r["status"]): (r["n"], r["units"])
            for r in rows(
                "SELECT node, status, COUNT(*) AS n, COALESCE(SUM(units), 0) AS units "
                "FROM submissions GROUP BY node, status"
            )
        }
        reasons = {
            r["reason"]: r["n"]
            for r in rows(
                "SELECT reason, COUNT(*) AS n FROM submissions WHERE status = ? "
                "GROUP BY reason ORDER BY n DESC LIMIT 64",
                (SubmissionStatus.REJECTED,),
            )
        }
        return Tally(by_status, per_node, reasons)


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
    )
