"""Where each state in the ledger may go: the one table every state change obeys.

Callers say where an event takes a node, an order or a submission (a heartbeat:
active), and the table says from where (a banned node stays banned; a gone one
joins again). The stores ask it inside the transaction that makes the change, so a
race between processes cannot move a state the table does not allow.
"""

from __future__ import annotations

from enum import StrEnum
from typing import TypeVar

from swarmrl.work.states import NodeState, OrderState, SubmissionStatus

_State = TypeVar("_State", bound=StrEnum)

# For each state (None: not in the ledger yet), the states it may move to. A move the
# table does not allow is no move.
TRANSITIONS: dict[type[StrEnum], dict[StrEnum | None, frozenset[StrEnum]]] = {
    NodeState: {
        None: frozenset({NodeState.JOINED}),
        # Gone from any state that beats: a node that says it leaves is gone at once.
        NodeState.JOINED: frozenset(
            {NodeState.ACTIVE, NodeState.SILENT, NodeState.GONE, NodeState.BANNED}
        ),
        NodeState.ACTIVE: frozenset({NodeState.SILENT, NodeState.GONE, NodeState.BANNED}),
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


def allowed(before: StrEnum | None, after: StrEnum) -> bool:
    """Whether the transition table lets a state move from `before` to `after`."""
    return after in TRANSITIONS[type(after)][before]


def first(state: _State) -> _State:
    """`state`, which something new in the ledger must start in."""
    if not allowed(None, state):
        raise ValueError(f"nothing enters the ledger {state}")
    return state


def sources(after: StrEnum) -> list[str]:
    """The states the table lets move to `after`: an update's `state IN (...)`."""
    moves = TRANSITIONS[type(after)]
    return [str(before) for before, then in moves.items() if before is not None and after in then]


def member(values: type[_State], value: str, what: str) -> _State:
    """`value` as a member of `values`; ValueError naming them unless it is one."""
    try:
        return values(value)
    except ValueError:
        raise ValueError(f"{what} must be one of {', '.join(values)}, got {value!r}") from None
