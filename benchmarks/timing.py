"""What every benchmark here measures with: medians of timed calls, one-core pinning."""

from __future__ import annotations

import os
import statistics
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any


def median_seconds(fn: Callable[[], Any], runs: int, warmup: int = 1) -> float:
    """Median wall time of `runs` calls of `fn`, after `warmup` untimed ones."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


@contextmanager
def one_core() -> Iterator[None]:
    """Pins this thread, and the threads it starts, to one core; then restores it.

    Thread pools started while pinned stay pinned, so measure all-core figures
    before one-core ones.
    """
    cpus = os.sched_getaffinity(0)
    os.sched_setaffinity(0, {min(cpus)})
    try:
        yield
    finally:
        os.sched_setaffinity(0, cpus)


def interleaved_times(fns: dict[str, Callable[[], Any]], runs: int) -> dict[str, list[float]]:
    """Wall times of each of `fns` over `runs` rounds, every one timed in turn per round.

    On a noisy machine, drift (other load, clock changes) then hits every
    contender alike instead of whichever ran during the slow stretch; and
    same-round ratios cancel most of what drift is left.
    """
    for fn in fns.values():
        fn()
    times: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(runs):
        for name, fn in fns.items():
            start = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - start)
    return times


def paired_ratio(times: dict[str, list[float]], a: str, b: str) -> float:
    """The median over rounds of a's time divided by b's time in the same round."""
    return statistics.median(x / y for x, y in zip(times[a], times[b], strict=True))
