"""How one test run shares the machine among pytest-xdist's workers.

Each worker takes its own slice of the cores (its CPU affinity, which every process a
test starts inherits), so torch, rayon and the swarm's own thread shares see the
slice, not the machine: two workers on two cores run two one-core machines side by
side. Left to float, a two-thread torch process next to a busy core runs 8 to 13
times slower than alone (docs/architecture.md, "Concurrency and processes"), which is
what sharing a machine costs when no one divides it.

The default model's users are the long modules (they train, run swarms): the first
copies the model into the run's folder, and each other one is handed to the first
worker free that holds none unfinished, while the short modules that need no model fill
in around them and even out the end. Left for last instead, they ended one worker's
run minutes after the other's.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from xdist.remote import Producer
from xdist.scheduler import LoadFileScheduling
from xdist.workermanage import WorkerController

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


# Files in the run folder: the later users of the default model (written by each worker
# at collection) and the mark that the model is there (written by whoever copied it).
LATER_USERS = "default-model-users.json"
READY = "default-model.ready"


def default_model_dir(run: Path) -> Path:
    return run / "models" / "default"


def order_for_the_default_model(items: list[pytest.Item], run: Path | None = None) -> None:
    """The first module that needs the default model first, its other users last.

    pytest-xdist hands out whole modules in this order (``--dist loadfile
    --no-loadscope-reorder``), so one worker copies the model while the others run
    what needs none. Under xdist the other users' modules are also written to ``run``,
    for the controller's ``ModelAwareScheduling`` to hand them out as soon as the
    model is ready.
    """
    users = [item.path for item in items if "default_model" in item.fixturenames]
    if not users:
        return
    first = users[0]
    later = set(users) - {first}

    def rank(item: pytest.Item) -> int:
        return 0 if item.path == first else 2 if item.path in later else 1

    items.sort(key=rank)  # stable: each module keeps its own order
    if run is not None:
        scopes = sorted({item.nodeid.split("::", 1)[0] for item in items if rank(item) == 2})
        mine = run / f".{LATER_USERS}.{os.getpid()}"
        mine.write_text(json.dumps(scopes))
        mine.replace(run / LATER_USERS)  # every worker writes the same list, whole


def mark_ready(run: Path) -> None:
    (run / READY).touch()


class ModelAwareScheduling(LoadFileScheduling):
    """``--dist loadfile`` that hands out a later user of the default model as soon as
    the model is there, and a module that needs none before that.

    A worker asks for a module when it has two tests or fewer left, and gets the first
    in the queue it may run now: a later user if the model is ready and it has none
    unfinished (they are long: two in one worker's queue would leave the other with
    the short ones), else the first module that needs no model (the first user, which
    copies it, comes first in the queue). When only later users are left it gets one
    anyway: their fixture waits for the model, as it did before this scheduler.

    It picks by moving a module to the front of xdist's queue (``workqueue``,
    ``assigned_work`` and ``_assign_work_unit`` are LoadScopeScheduling's, as of
    pytest-xdist 3.8); xdist then hands it out as it always does.
    """

    @staticmethod
    def fits_xdist() -> bool:
        """Whether this pytest-xdist still schedules as this class expects (else
        ``--dist loadfile`` runs as xdist's own, with the order above only)."""
        return callable(getattr(LoadFileScheduling, "_assign_work_unit", None))

    def __init__(self, config: pytest.Config, run: Path, log: Producer | None = None) -> None:
        super().__init__(config, log)
        self.run = run
        self._later: set[str] | None = None

    def _later_users(self) -> set[str]:
        if self._later is None:  # the workers wrote it before they reported their collection
            try:
                self._later = set(json.loads((self.run / LATER_USERS).read_text()))
            except (OSError, ValueError):
                self._later = set()  # nothing to wait for: plain loadfile
        return self._later

    def _assign_work_unit(self, node: WorkerController) -> None:
        later = self._later_users()
        mine = self.assigned_work.get(node, {})
        holds_one = any(s in later and not all(done.values()) for s, done in mine.items())
        later_now = (self.run / READY).exists() and not holds_one
        scopes = list(self.workqueue)
        pick = next((s for s in scopes if (s in later) == later_now), scopes[0])
        self.workqueue.move_to_end(pick, last=False)
        super()._assign_work_unit(node)
