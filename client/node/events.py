"""What a running node tells the people watching it: typed events, never free strings.

The headless logger and the terminal app consume the same events: an
:class:`EventKind` and the fields that kind fills in.
"""

from __future__ import annotations

import enum
import logging
from collections.abc import Callable
from dataclasses import dataclass, field

log = logging.getLogger("swarmrl.node")


class EventKind(enum.Enum):
    WORKERS = "workers"  # the worker processes started: total, and what each runs on
    JOINED = "joined"
    WEIGHTS_ANNOUNCED = "weights_announced"  # a newer policy step is out: how far behind
    WEIGHTS_PROGRESS = "weights_progress"
    WEIGHTS_READY = "weights_ready"
    SERVING = "serving"  # a peer dialled the data endpoint back: shards are offered
    NO_WORK = "no_work"  # no order for now; the reason says why, extra["wait"] for how long
    ORDER = "order"
    GENERATED = "generated"
    SUBMITTED = "submitted"
    RESENT = "resent"
    REFUSED = "refused"  # the orchestrator refused a submission for good; it is settled
    OUTCOME = "outcome"
    RETRY = "retry"
    FAILING = "failing"  # workers keep dying: no work until the owner resumes the node
    NO_ROOM = "no_room"  # a write failed for want of room: no work until the disk has room
    PAUSED = "paused"  # the order in flight is handed in; no new work is taken
    RESUMED = "resumed"
    HELD = "held"  # why the node is to take no new work changed; reason "": nothing holds it
    STOPPING = "stopping"  # the order in flight, then stop; what waits stays journaled
    FINISHING = "finishing"  # the order in flight and what waits to be sent, then leave
    LEFT = "left"  # the orchestrator was told the node leaves: no order of it will expire
    STOPPED = "stopped"


@dataclass(frozen=True)
class Event:
    kind: EventKind
    step: int | None = None
    order: str | None = None  # an order id, shortened for people
    digest: str | None = None
    units: int | None = None
    rollouts: int | None = None
    tokens_per_second: float | None = None
    reward: float | None = None
    done: int | None = None
    total: int | None = None
    reason: str = ""
    extra: dict[str, str] = field(default_factory=dict)


Listener = Callable[[Event], None]


def describe(event: Event) -> str:
    """An event as people read it: the kind, then key=value pairs (the log line's text)."""
    parts = [event.kind.value]
    for name in ("step", "order", "digest", "units", "rollouts", "done", "total"):
        value = getattr(event, name)
        if value is not None:
            parts.append(f"{name}={value}")
    if event.tokens_per_second is not None:
        parts.append(f"tokens_per_second={event.tokens_per_second:.1f}")
    if event.reward is not None:
        parts.append(f"reward={event.reward:.3f}")
    parts.extend(f"{k}={v}" for k, v in event.extra.items())
    if event.reason:
        parts.append(f"reason={event.reason!r}")
    return " ".join(parts)


def log_event(event: Event) -> None:
    """The node's log line for an event."""
    level = (
        logging.WARNING
        if event.kind in (EventKind.RETRY, EventKind.REFUSED, EventKind.FAILING, EventKind.NO_ROOM)
        else logging.INFO
    )
    log.log(level, describe(event))
