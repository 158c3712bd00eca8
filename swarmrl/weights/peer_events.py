"""What a swarm peer tells the people watching it: a kind and the fields that kind fills in.

Kept apart from :mod:`swarmrl.weights` so that what consumes the events (progress
bars, the node's own events) reads them without loading libp2p.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from swarmrl.weights.download import Progress


class SwarmEventKind(StrEnum):
    ANNOUNCED = "announced"  # a trusted checkpoint was announced; detail: its model
    PROGRESS = "progress"  # shards of a version arrived; progress: how far
    READY = "ready"  # a version is complete and checked; path: where it is
    BANNED = "banned"  # a peer served bad shards; detail: why
    REJECTED = "rejected"  # an announcement was refused; detail: why
    REACHABLE = "reachable"  # a peer dialled this one back; detail: the data endpoint


@dataclass(frozen=True)
class Event:
    """Something a person watching the node wants to see."""

    kind: SwarmEventKind
    step: int | None = None
    detail: str = ""
    progress: Progress | None = None
    path: Path | None = None
