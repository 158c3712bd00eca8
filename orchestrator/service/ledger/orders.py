"""Work orders, kept signed as their node got them, and each node's order counter.

An order is stored as the signed JSON its node received, beside the few columns it
is looked up by (node, counter, deadline), which are taken from it.
"""

from __future__ import annotations

import sqlite3
from dataclasses import dataclass

from eth_utils import to_checksum_address

from orchestrator.service.ledger.connection import Connection, marks
from orchestrator.service.ledger.nodes import count_abandoned
from orchestrator.service.ledger.transitions import first, member, sources
from swarmrl.work.assign import WorkOrder
from swarmrl.work.states import OrderState

# An order left past its deadline unanswered, whatever became of its tasks since.
ABANDONED = (OrderState.EXPIRED, OrderState.REASSIGNED, OrderState.DROPPED)


@dataclass(frozen=True)
class OrderRow:
    """A work order as its node got it, signed, and what became of it."""

    order_id: str  # the order's EIP-712 digest in the swarm domain, hex
    order: WorkOrder
    issued_at: float
    state: OrderState


@dataclass(frozen=True)
class Abandoned:
    """The orders a node left unanswered past their deadlines since it last answered one."""

    count: int
    last_deadline: int  # the latest one's; 0 when there is none


class Orders:
    """The `orders` and `counters` tables."""

    def __init__(self, connection: Connection) -> None:
        self._connection = connection

    def add(
        self, order_id: str, order: WorkOrder, issued_at: float, *, takes_over: str | None = None
    ) -> None:
        """Stores a new, open order; with `takes_over`, that expired order's tasks are
        now this one's, and it becomes 'reassigned' in the same transaction."""
        with self._connection.write() as db:
            if takes_over is not None and not move(db, takes_over, OrderState.REASSIGNED):
                raise ValueError(f"work order {takes_over[:12]} is not expired")
            insert(db, order_id, order, issued_at, first(OrderState.OPEN))

    def get(self, order_id: str) -> OrderRow | None:
        row = self._connection.row("SELECT * FROM orders WHERE order_id = ?", (order_id,))
        return None if row is None else _order(row)

    def open_for(self, node: str) -> OrderRow | None:
        """The node's open order (the latest, should there be several)."""
        row = self._connection.row(
            "SELECT * FROM orders WHERE node = ? AND state = ? ORDER BY counter DESC LIMIT 1",
            (to_checksum_address(node), OrderState.OPEN),
        )
        return None if row is None else _order(row)

    def orphaned(self, *, excluding: str) -> OrderRow | None:
        """The oldest expired order of a node other than `excluding` whose tasks no one
        has taken over yet."""
        row = self._connection.row(
            "SELECT * FROM orders WHERE state = ? AND node != ? "
            "ORDER BY deadline, order_id LIMIT 1",
            (OrderState.EXPIRED, to_checksum_address(excluding)),
        )
        return None if row is None else _order(row)

    def abandoned(self, node: str) -> Abandoned:
        """The node's orders left past their deadlines since the newest one it answered
        (all of them if it answered none): what the scheduler holds it back by. Read
        from the orders themselves, so it is the same after a restart."""
        address = to_checksum_address(node)
        row = self._connection.row(
            "SELECT COUNT(*) AS count, COALESCE(MAX(deadline), 0) AS last FROM orders "
            f"WHERE node = ? AND state IN ({marks(ABANDONED)}) AND counter > COALESCE("
            "(SELECT MAX(counter) FROM orders WHERE node = ? AND state = ?), -1)",
            (address, *ABANDONED, address, OrderState.ANSWERED),
        )
        assert row is not None  # an aggregate always has its row
        return Abandoned(int(row["count"]), int(row["last"]))

    def latest_sizes(self) -> dict[str, tuple[int, int]]:
        """Each node's newest order's size: (prompts, thinking budget), read from the
        signed orders by SQLite: one index seek per node (orders_by_counter), not a scan
        of every order the run issued, since the live view asks every second (CROSS JOIN
        keeps the nodes outermost whatever SQLite guesses of the tables' sizes)."""
        rows = self._connection.rows(
            "SELECT o.node, json_array_length(o.signed, '$.tasks') AS prompts, "
            "json_extract(o.signed, '$.tasks[0].budget') AS budget FROM nodes n CROSS "
            "JOIN orders o ON o.node = n.address AND o.counter = "
            "(SELECT MAX(counter) FROM orders WHERE node = n.address)"
        )
        return {r["node"]: (r["prompts"], r["budget"] or 0) for r in rows}

    def next_counter(self, node: str) -> int:
        """Reserves the node's next assignment counter: 0, 1, 2 ...; never handed out
        twice, even if the assignment it was reserved for is never stored."""
        with self._connection.write() as db:
            row = db.execute(
                "INSERT INTO counters (node, next) VALUES (?, 1) "
                "ON CONFLICT (node) DO UPDATE SET next = next + 1 RETURNING next",
                (to_checksum_address(node),),
            ).fetchone()
        return int(row["next"]) - 1

    def expire(self, now: float) -> list[OrderRow]:
        """Open orders past their deadline become 'expired'; each costs its node one
        abandoned order in the same transaction. Returns them (as expired)."""
        return self._expire("deadline < ?", (now,))

    def expire_for(self, node: str) -> list[OrderRow]:
        """The node's open orders become 'expired' whatever their deadlines, as `expire`
        does past them: it left, and no answer will come. Returns them (as expired)."""
        return self._expire("node = ?", (to_checksum_address(node),))

    def _expire(self, where: str, args: tuple[object, ...]) -> list[OrderRow]:
        with self._connection.write() as db:
            before = sources(OrderState.EXPIRED)
            rows = db.execute(
                f"UPDATE orders SET state = ? WHERE state IN ({marks(before)}) AND {where} "
                "RETURNING *",
                (OrderState.EXPIRED, *before, *args),
            ).fetchall()
            expired = sorted(
                (_order(r) for r in rows), key=lambda o: (o.order.deadline, o.order_id)
            )
            for o in expired:
                count_abandoned(db, o.order.node)
        return expired

    def set_state(self, order_id: str, state: str) -> bool:
        """Moves an order to `state` if the transition table allows it from the state it
        is in; returns whether it moved."""
        to = member(OrderState, state, "order state")
        with self._connection.write() as db:
            if move(db, order_id, to):
                return True
            known = db.execute("SELECT 1 FROM orders WHERE order_id = ?", (order_id,)).fetchone()
        if known is None:
            raise ValueError(f"no work order {order_id} in the ledger")
        return False


def move(db: sqlite3.Connection, order_id: str, to: OrderState) -> bool:
    """Moves an order to `to` if the table allows it from the state it is in, inside the
    caller's transaction; returns whether it moved."""
    before = sources(to)
    return bool(
        db.execute(
            f"UPDATE orders SET state = ? WHERE order_id = ? AND state IN ({marks(before)})",
            (to, order_id, *before),
        ).rowcount
    )


def insert(
    db: sqlite3.Connection, order_id: str, order: WorkOrder, issued_at: float, state: str
) -> None:
    """The signed order, and the columns it is looked up by, taken from it, inside the
    caller's transaction."""
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


def _order(r: sqlite3.Row) -> OrderRow:
    return OrderRow(
        order_id=r["order_id"],
        order=WorkOrder.model_validate_json(r["signed"]),
        issued_at=r["issued_at"],
        state=OrderState(r["state"]),
    )
