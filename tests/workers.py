"""How one test run shares the machine among pytest-xdist's workers.

Each worker takes its own slice of the cores (its CPU affinity, which every process a
test starts inherits), so torch, rayon and the swarm's own thread shares see the
slice, not the machine: two workers on two cores run two one-core machines side by
side. Left to float, a two-thread torch process next to a busy core runs 8 to 13
times slower than alone (ARCHITECTURE.md, "Concurrency and processes"), which is
what sharing a machine costs when no one divides it.

The default model takes minutes to build and most tests need none: the first module
that needs it runs first and builds it while the other workers run the modules that
need none, and the rest of its users come last, when it is ready.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

MOST_WORKERS = 4  # past four, a worker's slice is worth more than another worker


def auto_num_workers() -> int:
    """``-n auto``: a worker per core, up to MOST_WORKERS."""
    return max(1, min(len(os.sched_getaffinity(0)), MOST_WORKERS))


def take_my_share_of_the_cores() -> None:
    """Pin this worker (and what it starts) to its slice of the cores this run has."""
    name = os.environ.get("PYTEST_XDIST_WORKER")
    if name is None:  # not under xdist: the whole machine
        return
    index, count = int(name.removeprefix("gw")), int(os.environ["PYTEST_XDIST_WORKER_COUNT"])
    cores = sorted(os.sched_getaffinity(0))
    if count >= len(cores):
        mine = {cores[index % len(cores)]}
    else:
        mine = set(cores[index * len(cores) // count : (index + 1) * len(cores) // count])
    os.sched_setaffinity(0, mine)


def run_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder every worker of this run shares (each has its own temporary folder below it)."""
    base = tmp_path_factory.getbasetemp()
    return base.parent if "PYTEST_XDIST_WORKER" in os.environ else base


def order_for_the_default_model(items: list[pytest.Item]) -> None:
    """The first module that needs the default model first, its other users last.

    pytest-xdist hands out whole modules in this order (``--dist loadfile
    --no-loadscope-reorder``), so one worker builds the model while the others run
    what needs none.
    """
    users = [item.path for item in items if "default_model" in item.fixturenames]
    if not users:
        return
    first = users[0]
    later = set(users) - {first}

    def rank(item: pytest.Item) -> int:
        return 0 if item.path == first else 2 if item.path in later else 1

    items.sort(key=rank)  # stable: each module keeps its own order
