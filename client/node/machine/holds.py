"""Why the node takes no new work: the holds the volunteer and the machine's conditions
put on it, and the one reason the screen and `node status` show for them.

The node works while nothing holds it. Each hold is set and cleared on its own (a
snooze ends by itself, a pause only when resumed, a condition when it no longer
holds), and the reason shown is the first hold in the order below, with what it
says of itself (which program runs, how busy the machine is).
"""

from __future__ import annotations

import enum
import time
from dataclasses import dataclass


class Hold(enum.Enum):
    PAUSED = "paused by you"
    FAILING = "workers keep failing"
    SNOOZED = "snoozed"
    SCHEDULE = "outside the schedule"
    USER_ACTIVE = "user active"
    ON_BATTERY = "on battery"
    BUSY = "the machine is busy"
    PROGRAM = "a program that pauses work runs"
    DISK_FULL = "disk full"
    QUOTA = "transfer quota reached"


@dataclass(frozen=True)
class _Held:
    until: float | None  # unix time it ends by itself; None: until cleared
    detail: str


class Holds:
    def __init__(self) -> None:
        self._held: dict[Hold, _Held] = {}

    def __bool__(self) -> bool:
        return bool(self._held)

    def __contains__(self, hold: Hold) -> bool:
        return hold in self._held

    def set(self, hold: Hold, until: float | None = None, detail: str = "") -> bool:
        """Holds the node, until the unix time `until` (None: until cleared); `detail`
        is said after the hold's name. Whether anything changed."""
        held = _Held(until, detail)
        if self._held.get(hold) == held:
            return False
        self._held[hold] = held
        return True

    def clear(self, *holds: Hold) -> None:
        for hold in holds:
            self._held.pop(hold, None)

    def expire(self, now: float) -> bool:
        """Drops the holds whose time is over; whether any was."""
        over = [h for h, held in self._held.items() if held.until is not None and held.until <= now]
        self.clear(*over)
        return bool(over)

    def reason(self) -> str:
        """The first hold as people read it ("" when nothing holds the node)."""
        for hold in Hold:
            held = self._held.get(hold)
            if held is None:
                continue
            text = hold.value
            if held.until is not None:
                # A time of day, not a countdown: the line is sent when the holds change.
                text += f" until {time.strftime('%H:%M:%S', time.localtime(held.until))}"
            return f"{text}: {held.detail}" if held.detail else text
        return ""
