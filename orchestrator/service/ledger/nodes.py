"""The nodes that joined, their standing, and every state they moved through."""

from __future__ import annotations

import json
import logging
import sqlite3
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from eth_utils import to_checksum_address

from orchestrator.service.ledger.connection import Connection, marks
from orchestrator.service.ledger.transitions import allowed, first, member, sources
from swarmrl.rollouts.tolerances import TemperatureSums
from swarmrl.work.states import NodeState

log = logging.getLogger(__name__)


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
    trusted: int  # submissions that passed a full prefill check since its last rejection
    abandoned: int  # orders left past their deadline
    # Its prefilled submissions' colder-sampling sums, what the validator judges the next
    # one's sampled tokens with (folded in with each verdict: `fold_temperature`).
    temperature: TemperatureSums


@dataclass(frozen=True)
class Seen:
    """A node's newest heartbeat: when, and the speed it reported (None: not measured)."""

    at: float
    speed: float | None


@dataclass(frozen=True)
class Transition:
    address: str
    from_state: NodeState | None  # None for the first join
    to_state: NodeState
    reason: str
    at: float


class Nodes:
    """The `nodes` and `transitions` tables."""

    def __init__(self, connection: Connection) -> None:
        self._connection = connection

    def join(
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
        with self._connection.write() as db:
            updated = db.execute(
                "UPDATE nodes SET provider = ?, peer_id = ?, backend = ?, hardware = ?, "
                "last_seen = ? WHERE address = ?",
                (provider, peer_id, backend, json.dumps(hardware), now, address),
            ).rowcount
            if not updated:
                state = first(NodeState.JOINED)
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
        node = self.get(address)
        assert node is not None
        return node

    def get(self, address: str) -> NodeRow | None:
        row = self._connection.row(
            "SELECT * FROM nodes WHERE address = ?", (to_checksum_address(address),)
        )
        return None if row is None else _node(row)

    def by_peer(self, peer_id: str) -> NodeRow | None:
        """The node that joined last from `peer_id`."""
        row = self._connection.row(
            "SELECT * FROM nodes WHERE peer_id = ? ORDER BY joined_at DESC LIMIT 1", (peer_id,)
        )
        return None if row is None else _node(row)

    def all(self) -> list[NodeRow]:
        rows = self._connection.rows("SELECT * FROM nodes ORDER BY joined_at, address")
        return [_node(r) for r in rows]

    def set_state(self, address: str, state: str, reason: str, now: float) -> bool:
        """Moves a node to `state` if the transition table lets it go there from the state
        it is in (read in the same transaction), keeping the transition; returns whether
        it moved. Its current state again is no move."""
        to = member(NodeState, state, "node state")
        address = to_checksum_address(address)
        with self._connection.write() as db:
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
        rows = self._connection.rows(
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

    def touch(self, seen: Mapping[str, Seen]) -> None:
        """Heartbeats, as many nodes' as the caller gathered, in one transaction: each
        node was last seen at its `at`, generating at its `speed` tokens/s if known.
        A time older than the one stored (a batch that lost a race) changes nothing."""
        with self._connection.write() as db:
            db.executemany(
                "UPDATE nodes SET last_seen = MAX(last_seen, ?), speed = COALESCE(?, speed) "
                "WHERE address = ?",
                [(s.at, s.speed, to_checksum_address(a)) for a, s in seen.items()],
            )

    def by_state(self) -> dict[NodeState, int]:
        """How many nodes are in each state (counted by SQLite, not in memory)."""
        rows = self._connection.rows("SELECT state, COUNT(*) AS n FROM nodes GROUP BY state")
        return {NodeState(r["state"]): r["n"] for r in rows}

    def speeds(self, state: NodeState) -> list[float]:
        """The speeds the nodes in `state` reported last (those that reported one)."""
        rows = self._connection.rows(
            "SELECT speed FROM nodes WHERE state = ? AND speed IS NOT NULL", (state,)
        )
        return [r["speed"] for r in rows]

    def quiet(self, since: float) -> list[tuple[str, NodeState, float]]:
        """(address, state, last seen) of the nodes not seen since `since` that quiet can
        still move (to silent or gone: the gone and the banned stay where they are)."""
        movable = sorted(set(sources(NodeState.SILENT)) | set(sources(NodeState.GONE)))
        rows = self._connection.rows(
            f"SELECT address, state, last_seen FROM nodes WHERE last_seen < ? "
            f"AND state IN ({marks(movable)}) ORDER BY address",
            (since, *movable),
        )
        return [(r["address"], NodeState(r["state"]), r["last_seen"]) for r in rows]

    def add_trust(self, address: str) -> None:
        """One more of the node's submissions passed a full prefill check."""
        with self._connection.write() as db:
            db.execute(
                "UPDATE nodes SET trusted = trusted + 1 WHERE address = ?",
                (to_checksum_address(address),),
            )

    def reset_trust(self, address: str) -> None:
        """One of the node's submissions had records rejected: its trust starts over, so
        its next submissions are all checked in full (BOINC's adaptive replication)."""
        with self._connection.write() as db:
            db.execute(
                "UPDATE nodes SET trusted = 0 WHERE address = ?", (to_checksum_address(address),)
            )


def count_abandoned(db: sqlite3.Connection, address: str) -> None:
    """One more order the node left past its deadline, inside the caller's transaction
    (the one that expires the order)."""
    db.execute(
        "UPDATE nodes SET abandoned = abandoned + 1 WHERE address = ?",
        (to_checksum_address(address),),
    )


def fold_temperature(db: sqlite3.Connection, address: str, later: TemperatureSums) -> None:
    """A submission's colder-sampling sums folded into its node's, inside the caller's
    transaction: the one that records the verdict on that submission, so a submission
    judged again after a crash is counted once, however often it was judged."""
    address = to_checksum_address(address)
    row = db.execute(
        "SELECT temperature_excess, temperature_variance, temperature_submissions "
        "FROM nodes WHERE address = ?",
        (address,),
    ).fetchone()
    if row is None or not later.submissions:
        return
    sums = _temperature(row).then(later)
    db.execute(
        "UPDATE nodes SET temperature_excess = ?, temperature_variance = ?, "
        "temperature_submissions = ? WHERE address = ?",
        (sums.excess, sums.variance, sums.submissions, address),
    )


def _temperature(r: sqlite3.Row) -> TemperatureSums:
    return TemperatureSums(
        r["temperature_excess"], r["temperature_variance"], r["temperature_submissions"]
    )


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
        temperature=_temperature(r),
    )
