"""A cap on the average rate of bytes moved, shared by every thread (and trio task)
that moves them: a volunteer's cap on a link the machine also uses.

A :class:`Pacer` is a token bucket counted in bytes. Whoever moved bytes says so
(:meth:`Pacer.pace`; from trio, which must not block, :meth:`Pacer.pace_trio`) and
waits until the cap has paid for them, so everything moved through one pacer, by
all its users together, averages at most its rate: give or take one chunk per user
and BURST_SECONDS of credit saved while it sat idle. Paying after moving keeps the
count exact (a send may move less than it was asked to) and lets the first bytes go
at once.

Two lanes: bytes paced ``first`` are paid before any in the other lane, whenever
these were asked for. A node's own submissions go first: the orchestrator cuts off
an upload slower than its minimum rate, while a peer that its weight server keeps
waiting fetches from another holder.

The rate changes at any time and waiting users go by the new one; a rate of 0 stops
everything until it is raised. Every byte paced is also told to `on_bytes` (the
node's monthly count), capped or not.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

import trio

# Credit a pacer saves while idle: enough to absorb the gaps between one user's sends,
# too little to let a burst through after a quiet minute.
BURST_SECONDS = 0.2
# How much a user moves between two waits: its turns are this fine, and with a weight
# server's eight transfers that share a cap, none of its clients waits near the 15 s
# after which it gives up.
CHUNK_SECONDS = 0.05
MIN_CHUNK = 16 * 1024
MAX_CHUNK = 4 * 1024 * 1024
# How often a trio task that waits its turn looks again: a raised rate reaches it in
# this time (a thread is woken at once instead).
RECHECK_SECONDS = 0.25


@dataclass(frozen=True)
class _Ticket:
    """Bytes to be paid: their lane, and where they end in it."""

    first: bool
    end: int


class Pacer:
    """Keeps the bytes paced through it to an average of `rate` bytes a second (None:
    no cap, 0: none move); `on_bytes` hears every byte paced."""

    def __init__(
        self,
        rate: float | None = None,
        *,
        on_bytes: Callable[[int], None] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._rate = _checked(rate)
        self._on_bytes = on_bytes
        self._clock = clock
        self._cond = threading.Condition()
        self._at = clock()  # when _paid was last brought up to date
        self._paid = 0.0  # bytes the cap has paid for since the start
        self._first = 0  # bytes paced in the first lane since the start
        self._rest = 0  # ... and in the other lane
        # The end of the other lane's bytes seen paid: the first lane waits behind these.
        self._rest_paid = 0

    @property
    def rate(self) -> float | None:
        return self._rate

    @rate.setter
    def rate(self, rate: float | None) -> None:
        rate = _checked(rate)
        with self._cond:
            if rate == self._rate:
                return
            self._advance()  # what the old rate paid until now stays paid
            self._rate = rate
            self._cond.notify_all()

    @property
    def halted(self) -> bool:
        """Whether nothing may move (a rate of 0)."""
        return self._rate == 0

    def chunk(self, most: int) -> int:
        """How many of `most` bytes to move before the next wait: all of them without a
        cap, else about CHUNK_SECONDS of the rate, so the pacer's users take fine turns."""
        rate = self._rate
        if rate is None:
            return most
        return min(most, max(MIN_CHUNK, min(MAX_CHUNK, int(rate * CHUNK_SECONDS))))

    def pace(
        self, n: int, *, first: bool = False, stopped: Callable[[], bool] | None = None
    ) -> None:
        """Counts `n` bytes just moved and waits until the cap has paid for them, or
        until `stopped()` is true when :meth:`wake` is called."""
        ticket = self._reserve(n, first)
        with self._cond:
            while (wait := self._delay(ticket)) > 0 and not (stopped is not None and stopped()):
                self._cond.wait(None if math.isinf(wait) else wait)

    async def pace_trio(self, n: int, *, first: bool = False) -> None:
        """:meth:`pace` for a trio task: it sleeps instead of blocking the event loop,
        and a cancel scope ends the wait."""
        ticket = self._reserve(n, first)
        while True:
            with self._cond:
                wait = self._delay(ticket)
            if wait <= 0:
                return
            await trio.sleep(min(wait, RECHECK_SECONDS))

    def wake(self) -> None:
        """Wakes every waiting thread to look at its `stopped` again (its user closes)."""
        with self._cond:
            self._cond.notify_all()

    def _reserve(self, n: int, first: bool) -> _Ticket:
        with self._cond:
            self._advance()
            if first:
                self._first += n
                ticket = _Ticket(True, self._first)
            else:
                self._rest += n
                ticket = _Ticket(False, self._rest)
        if self._on_bytes is not None and n:
            self._on_bytes(n)  # outside the lock: the listener may take locks of its own
        return ticket

    def _delay(self, ticket: _Ticket) -> float:
        """Seconds until `ticket`'s bytes are paid at the present rate (0: they are).
        With the lock held."""
        self._advance()
        # The first lane waits only behind the other lane's bytes already paid; the other
        # lane behind every byte of the first, even one paced after it.
        behind = self._rest_paid if ticket.first else self._first
        owed = ticket.end + behind - self._paid
        # Under a byte owed is paid: rounding leaves such crumbs, and a clock can pass
        # too small a wait unchanged.
        if owed < 1 or self._rate is None:
            if not ticket.first:
                self._rest_paid = max(self._rest_paid, ticket.end)
            return 0.0
        return math.inf if self._rate == 0 else owed / self._rate

    def _advance(self) -> None:
        """Brings the bytes paid up to now. With the lock held."""
        now = self._clock()
        paced = self._first + self._rest
        if self._rate is None:
            self._paid = max(self._paid, paced)
        else:
            earned = self._paid + (now - self._at) * self._rate
            self._paid = max(self._paid, min(earned, paced + BURST_SECONDS * self._rate))
        self._at = now


def _checked(rate: float | None) -> float | None:
    if rate is not None and not rate >= 0:  # NaN too
        raise ValueError(f"a rate is 0 or more bytes a second, not {rate}")
    return rate
