"""Bounded, jittered exponential backoff for every retry the node makes.

Each failure doubles the ceiling of the next wait, up to `cap`; the wait itself is
drawn at random below that ceiling ("full jitter"), so a swarm of nodes that lost
the orchestrator at the same moment does not come back at the same moment. It is
never below `base / 2`, so no failure path can become a tight loop.
"""

from __future__ import annotations

import math
import random


class Backoff:
    """Delays for consecutive failures; `reset()` after a success."""

    def __init__(self, base: float = 1.0, cap: float = 60.0, rng: random.Random | None = None):
        if not (math.isfinite(base) and base > 0):
            raise ValueError(f"the backoff base must be a positive number of seconds, got {base}")
        if not (math.isfinite(cap) and cap >= base):
            raise ValueError(f"the backoff cap must be at least its base {base}, got {cap}")
        self.base = base
        self.cap = cap
        self._rng = rng or random.Random()
        # Beyond this many doublings the ceiling is the cap; 2**attempts would overflow.
        self._doublings_to_cap = math.ceil(math.log2(cap / base))
        self.attempts = 0

    def ceiling(self) -> float:
        """The longest the next delay can be."""
        if self.attempts >= self._doublings_to_cap:
            return self.cap
        return min(self.cap, self.base * 2.0**self.attempts)

    def next_delay(self) -> float:
        """Seconds to wait before the next try; counts one more failure."""
        delay = self._rng.uniform(self.base / 2, self.ceiling())
        self.attempts += 1
        return delay

    def reset(self) -> None:
        """Back to the shortest delays, after something worked."""
        self.attempts = 0
