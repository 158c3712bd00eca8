"""Slashable submissions the recorder dealt with, and those still to deal with."""

from __future__ import annotations

import sqlite3
from dataclasses import dataclass
from enum import StrEnum

from eth_utils import to_checksum_address

from orchestrator.service.ledger import submissions
from orchestrator.service.ledger.connection import Connection
from orchestrator.service.ledger.transitions import member


class SlashOutcome(StrEnum):
    """How a slashable submission was dealt with."""

    SENT = "sent"  # our vote's transaction
    FOUND = "found"  # already slashed or voted on chain
    MISSED = "missed"  # it can no longer be slashed


@dataclass(frozen=True)
class SlashRow:
    """A slashable submission dealt with, and how."""

    digest: str
    epoch: int
    node: str
    tx_hash: str | None
    outcome: SlashOutcome
    at: float


class Slashes:
    """The `slashes` table."""

    def __init__(self, connection: Connection) -> None:
        self._connection = connection

    def record(
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
        outcome = member(SlashOutcome, outcome, "slash outcome")
        with self._connection.write() as db:
            db.execute(
                "INSERT INTO slashes (digest, epoch, node, tx_hash, outcome, at) "
                "VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT (digest) DO NOTHING",
                (digest, epoch, to_checksum_address(node), tx_hash, outcome, now),
            )

    def all(self) -> list[SlashRow]:
        rows = self._connection.rows("SELECT * FROM slashes ORDER BY at, digest")
        return [_slash(r) for r in rows]

    def sent_since(self, since: float) -> list[SlashRow]:
        """Our votes (outcome 'sent', with their transaction) recorded at or after `since`."""
        rows = self._connection.rows(
            "SELECT * FROM slashes WHERE outcome = ? AND tx_hash IS NOT NULL AND at >= ? "
            "ORDER BY at, digest",
            (SlashOutcome.SENT, since),
        )
        return [_slash(r) for r in rows]

    def dropped(self, digest: str) -> None:
        """Forgets the slash record of `digest`: the chain dropped the block that held our
        vote (a reorganisation); the recorder votes again."""
        with self._connection.write() as db:
            db.execute("DELETE FROM slashes WHERE digest = ?", (digest,))

    def candidates(self) -> list[submissions.SubmissionRow]:
        """Slashable submissions whose (epoch, node) is on chain (recorded with units)
        and has no slash record yet, by epoch, node and digest. The pool slashes an
        epoch once, so one slash record settles every other evidence of that epoch."""
        rows = self._connection.rows(
            "SELECT s.* FROM submissions s "
            "JOIN epochs e ON e.epoch = s.epoch AND e.node = s.node AND e.units > 0 "
            "WHERE s.slashable = 1 AND NOT EXISTS "
            "(SELECT 1 FROM slashes x WHERE x.epoch = s.epoch AND x.node = s.node) "
            "ORDER BY s.epoch, s.node, s.digest"
        )
        return [submissions.from_row(r) for r in rows]


def _slash(r: sqlite3.Row) -> SlashRow:
    return SlashRow(
        r["digest"], r["epoch"], r["node"], r["tx_hash"], SlashOutcome(r["outcome"]), r["at"]
    )
