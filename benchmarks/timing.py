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
