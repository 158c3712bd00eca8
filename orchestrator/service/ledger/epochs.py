"""Epochs: counted from the ledger's genesis, and each node's epoch as the recorder
left it on chain."""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Sequence
from dataclasses import dataclass

from eth_utils import to_checksum_address

from orchestrator.service.ledger.connection import Connection


@dataclass(frozen=True)
class EpochRow:
    """One node's epoch as the recorder left it.

    units > 0: the work is on chain, a leaf of part `part` under the node's
    membership `membership`; tx_hash is None when the recorder found it there (sent
    before a crash) instead of sending it. units == 0: nothing to record (no
    accepted work, no evidence, or the node was not in the pool), nothing was sent.
    """

    epoch: int
    node: str
    units: int
    commitment: str
    tx_hash: str | None
    recorded_at: float
    part: int | None = None
    membership: int = 0


class Epochs:
    """The `epochs` table, and the genesis in `meta` they count from."""

    def __init__(self, connection: Connection) -> None:
        self._connection = connection

    def genesis(self) -> float:
        """When this ledger was created: epoch 0 starts here, for as long as the file lives."""
        row = self._connection.row("SELECT value FROM meta WHERE key = 'genesis'")
        assert row is not None  # written with the schema
        return float(row["value"])

    def at(self, now: float, epoch_seconds: float) -> int:
        """The epoch `now` falls in (0 for a clock behind genesis)."""
        if epoch_seconds <= 0:
            raise ValueError(f"epoch_seconds must be positive, got {epoch_seconds}")
        return max(0, int((now - self.genesis()) // epoch_seconds))

    def unrecorded(self, before_epoch: int) -> list[tuple[int, str]]:
        """(epoch, node) pairs before `before_epoch` with submissions and no epoch row.

        Only epochs from the ledger's mark on are looked at, and the mark moves up to
        the oldest epoch still waiting (never past the one before `before_epoch`, which
        a submission acknowledged at its very end may still join): the recorder asks
        every few seconds, and a run of days holds millions of submissions below it."""
        since = self._recorded_below()
        rows = self._connection.rows(
            "SELECT DISTINCT s.epoch, s.node FROM submissions s "
            "LEFT JOIN epochs e ON e.epoch = s.epoch AND e.node = s.node "
            "WHERE s.epoch >= ? AND s.epoch < ? AND e.epoch IS NULL ORDER BY s.epoch, s.node",
            (since, before_epoch),
        )
        pairs = [(int(r["epoch"]), r["node"]) for r in rows]
        mark = min([before_epoch - 1] + [epoch for epoch, _ in pairs])
        if mark > since:
            with self._connection.write() as db:
                db.execute(
                    "INSERT INTO meta (key, value) VALUES ('recorded_below', ?) "
                    "ON CONFLICT (key) DO UPDATE SET value = excluded.value",
                    (str(mark),),
                )
        return pairs

    def _recorded_below(self) -> int:
        """Every epoch below this one is recorded whole (0: none is known to be)."""
        row = self._connection.row("SELECT value FROM meta WHERE key = 'recorded_below'")
        return 0 if row is None else int(row["value"])

    def record(
        self,
        epoch: int,
        node: str,
        units: int,
        commitment_hex: str,
        tx_hash: str | None,
        *,
        part: int | None = None,
        membership: int = 0,
        now: float | None = None,
    ) -> None:
        """Marks (epoch, node) recorded; the first record stands (a repeat is ignored)."""
        self.record_many(
            [EpochRow(epoch, node, units, commitment_hex, tx_hash, 0.0, part, membership)],
            now=now,
        )

    def record_many(self, rows: Sequence[EpochRow], *, now: float | None = None) -> None:
        """Marks each row's (epoch, node) recorded at `now`, in one transaction (a part's
        nodes are on chain together); the first record of each stands."""
        at = time.time() if now is None else now
        with self._connection.write() as db:
            db.executemany(
                "INSERT INTO epochs (epoch, node, units, commitment, tx_hash, recorded_at, "
                "part, membership) VALUES (?, ?, ?, ?, ?, ?, ?, ?) "
                "ON CONFLICT (epoch, node) DO NOTHING",
                [
                    (
                        r.epoch,
                        to_checksum_address(r.node),
                        r.units,
                        r.commitment,
                        r.tx_hash,
                        at,
                        r.part,
                        r.membership,
                    )
                    for r in rows
                ],
            )

    def part(self, epoch: int, part: int) -> list[EpochRow]:
        """The rows of part `part` of `epoch`: its leaves as the recorder sent or found them."""
        rows = self._connection.rows(
            "SELECT * FROM epochs WHERE epoch = ? AND part = ? AND units > 0 ORDER BY node",
            (epoch, part),
        )
        return [_epoch(r) for r in rows]

    def on_chain_since(self, since: float) -> list[EpochRow]:
        """Rows with work on chain (units > 0) recorded at or after `since`."""
        rows = self._connection.rows(
            "SELECT * FROM epochs WHERE units > 0 AND recorded_at >= ? ORDER BY epoch, node",
            (since,),
        )
        return [_epoch(r) for r in rows]

    def dropped(self, epoch: int, part: int) -> None:
        """Forgets part `part` of `epoch` and its nodes' slash records of that epoch, in
        one transaction: the chain dropped the block that recorded it (a
        reorganisation), and with it any slash of it, which needs the record; the
        recorder sends both again."""
        with self._connection.write() as db:
            db.execute(
                "DELETE FROM slashes WHERE epoch = ? AND node IN "
                "(SELECT node FROM epochs WHERE epoch = ? AND part = ?)",
                (epoch, epoch, part),
            )
            db.execute("DELETE FROM epochs WHERE epoch = ? AND part = ?", (epoch, part))
            # Its nodes wait again: `unrecorded` must look at the epoch again.
            db.execute(
                "UPDATE meta SET value = ? WHERE key = 'recorded_below' AND CAST(value AS "
                "INTEGER) > ?",
                (str(epoch), epoch),
            )

    def get(self, epoch: int, node: str) -> EpochRow | None:
        row = self._connection.row(
            "SELECT * FROM epochs WHERE epoch = ? AND node = ?", (epoch, to_checksum_address(node))
        )
        return None if row is None else _epoch(row)

    def all(self) -> list[EpochRow]:
        return [
            _epoch(r) for r in self._connection.rows("SELECT * FROM epochs ORDER BY epoch, node")
        ]


def _epoch(r: sqlite3.Row) -> EpochRow:
    return EpochRow(
        epoch=r["epoch"],
        node=r["node"],
        units=r["units"],
        commitment=r["commitment"],
        tx_hash=r["tx_hash"],
        recorded_at=r["recorded_at"],
        part=r["part"],
        membership=r["membership"],
    )
