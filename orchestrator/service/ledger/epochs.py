"""Epochs: counted from the ledger's genesis, and each node's epoch as the recorder
left it on chain."""

from __future__ import annotations

import sqlite3
import time
from dataclasses import dataclass

from eth_utils import to_checksum_address

from orchestrator.service.ledger.connection import Connection


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
        """(epoch, node) pairs before `before_epoch` with submissions and no epoch row."""
        rows = self._connection.rows(
            "SELECT DISTINCT s.epoch, s.node FROM submissions s "
            "LEFT JOIN epochs e ON e.epoch = s.epoch AND e.node = s.node "
            "WHERE s.epoch < ? AND e.epoch IS NULL ORDER BY s.epoch, s.node",
            (before_epoch,),
        )
        return [(int(r["epoch"]), r["node"]) for r in rows]

    def record(
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
        with self._connection.write() as db:
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

    def on_chain_since(self, since: float) -> list[EpochRow]:
        """Rows with work on chain (units > 0) recorded at or after `since`."""
        rows = self._connection.rows(
            "SELECT * FROM epochs WHERE units > 0 AND recorded_at >= ? ORDER BY epoch, node",
            (since,),
        )
        return [_epoch(r) for r in rows]

    def dropped(self, epoch: int, node: str) -> None:
        """Forgets (epoch, node) and its slash records, in one transaction: the chain
        dropped the block that recorded it (a reorganisation), and with it any slash of
        it, which needs the record; the recorder sends both again."""
        node = to_checksum_address(node)
        with self._connection.write() as db:
            db.execute("DELETE FROM slashes WHERE epoch = ? AND node = ?", (epoch, node))
            db.execute("DELETE FROM epochs WHERE epoch = ? AND node = ?", (epoch, node))

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
    )
