"""A worker: what holds a policy on one GPU (or tensor-parallel group of GPUs, or a
share of the CPU) and generates the part of an order its node hands it.

The node's daemon runs one worker process per GPU group (client.node.work.workers) and
speaks to each over its stdin and stdout, one JSON line each way: the worker's
:class:`Spec` first, then requests, each answered by one :class:`Reply`. The worker
keeps stdout for that alone (anything else printed goes to its log, stderr), and dies
with the daemon, whatever kills the daemon (Linux's parent-death signal).

:class:`LocalWorker` is a worker's body, and the whole of an in-process one, built
with how it loads and reloads a policy (the workers a node may be given at its
construction: client.node.work.loop.Steps).
"""

from __future__ import annotations

import logging
import os
import signal
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from swarmrl.models.backend import BackendName, Engine, Precision
from swarmrl.models.held import HeldPolicy
from swarmrl.processes import die_with_parent
from swarmrl.schema import Strict
from swarmrl.work.assign import Slot, WorkOrder

if TYPE_CHECKING:
    from swarmrl.models.backend import Backend, SamplingParams
    from swarmrl.rollouts.records import Rollout
    from swarmrl.tasks import Task

log = logging.getLogger("swarmrl.node.worker")


class Spec(Strict):
    """Who a worker process is and what it runs on."""

    index: int
    parent: int  # the daemon's pid: a worker whose parent is already gone exits at once
    backend: BackendName
    device: str  # as torch names it inside the worker (its GPUs are cuda:0...)
    cores: list[int]  # the CPU cores it is pinned to
    threads: int
    engine: dict[str, Any]  # Engine's fields


class Load(Strict):
    """Hold the policy in ``model_dir`` (of ``step``) in ``precision``."""

    model_dir: str
    step: int
    precision: Precision


class Generate(Strict):
    """Generate batches ``first`` to ``stop`` (excluded) of ``order`` into ``out``."""

    order: WorkOrder
    tasks: list[dict[str, Any]]  # the rows of those batches' tasks
    node: str
    step: int
    batch_size: int
    first: int
    stop: int
    out: str


class Request(Strict):
    load: Load | None = None
    generate: Generate | None = None
    threads: int | None = None


class Reply(Strict):
    error: str | None = None
    kind: Literal["value", "os"] | None = None  # which exception the error was
    errno: int | None = None  # an OSError's: a full disk is the node's own hold
    tokens: int = 0
    seconds: float = 0.0
    cpu_seconds: float = 0.0  # the worker's and its reward checker's, generating


@dataclass(frozen=True)
class Generation:
    """An order as a generator takes it: the order, the node's copy of the task set
    (``tasks``), the node whose records they are, the policy step they claim, and the
    batch size (``batch_size`` sequences a batch, about) they are generated in."""

    order: WorkOrder
    tasks: Mapping[str, Task]
    node: str
    step: int
    batch_size: int


# ---- the worker's body ------------------------------------------------------------------


class LocalWorker:
    """The policy a worker holds, and the records it generates with it."""

    def __init__(
        self,
        load: Callable[[Path, Precision], Backend],
        reload: Callable[[Backend, Path], None] | None = None,
    ) -> None:
        self.policy = HeldPolicy(load, reload)

    @property
    def backend(self) -> Backend | None:
        return self.policy.backend

    @property
    def step(self) -> int | None:
        return self.policy.step

    @property
    def precision(self) -> Precision | None:
        return self.policy.precision

    @property
    def count(self) -> int:
        return 1

    def hold(self, model_dir: Path, step: int, precision: Precision) -> None:
        """Holds the policy in ``model_dir`` (of ``step``) in ``precision``
        (``HeldPolicy.hold``)."""
        self.policy.hold(model_dir, step, precision)

    def records(self, generation: Generation, *, batches: range | None = None) -> list[Rollout]:
        """The records of ``generation``'s order (of its ``batches`` only, when given)."""
        assert self.backend is not None  # held before any order
        return order_rollouts(self.backend, generation, batches=batches)

    def cpu_seconds(self) -> float:
        """CPU time this process (and its reward checker) has taken so far."""
        from swarmrl.tasks.math import cpu_seconds_with_checker

        return cpu_seconds_with_checker()

    def threads(self, threads: int) -> None:
        from swarmrl.cores import take_threads

        take_threads(threads)

    def forgive(self) -> None:
        """Nothing to forgive: an in-process worker that fails, fails its node."""

    def stop(self, grace: float) -> None:
        """Nothing to end: generating in the node's own process, it ends with its order."""

    def waiting(self) -> list[str]:
        return []

    def close(self) -> None:
        self.policy.release()


def order_rollouts(
    backend: Backend,
    generation: Generation,
    *,
    params: SamplingParams | None = None,
    batches: range | None = None,
) -> list[Rollout]:
    """The records answering ``generation``'s order: a group for each of its tasks (from
    its ``tasks``, the node's copy of the task set) with the budget the order states,
    generated by ``backend`` holding the policy of its ``step`` with the order's sampling
    (or ``params``), proven and scored with the shared verifiers. ``batches`` (of the
    order's batches of its ``batch_size``) generates that part alone, with the seeds the
    whole order's draw."""
    from swarmrl.models.backend import SamplingParams
    from swarmrl.rollouts.generate import Provenance, generate_rollouts
    from swarmrl.tasks.rewards import task_reward

    order, tasks, batch_size = generation.order, generation.tasks, generation.batch_size
    if params is None:
        params = SamplingParams(
            max_tokens=order.max_tokens, temperature=order.temperature, top_p=order.top_p
        )
    slots = order.tasks if batches is None else batch_slots(order, batch_size, batches)
    first = 0 if batches is None else batches.start
    budgets = iter(slot.budget for slot in slots)
    return generate_rollouts(
        backend,
        [tasks[slot.problem_id] for slot in slots],
        n=order.group_size,
        params=params,
        provenance=Provenance(run=order.run, policy_step=generation.step, node=generation.node),
        seed=order.seed,
        score=task_reward,
        # Called once per task, in order: each task gets the budget its order states.
        target_for=lambda _speed: next(budgets),
        batch_size=batch_size,
        first_batch=first,
    )


def order_batches(order: WorkOrder, batch_size: int) -> int:
    """How many batches of about ``batch_size`` sequences ``order``'s groups make."""
    from swarmrl.rollouts.generate import groups_per_batch

    return -(-len(order.tasks) // groups_per_batch(order.group_size, batch_size))


def batch_slots(order: WorkOrder, batch_size: int, batches: range) -> list[Slot]:
    """The tasks of ``order``'s ``batches`` (of about ``batch_size`` sequences each)."""
    from swarmrl.rollouts.generate import groups_per_batch

    per_batch = groups_per_batch(order.group_size, batch_size)
    return order.tasks[batches.start * per_batch : batches.stop * per_batch]


# ---- the process ------------------------------------------------------------------------


def _serve(spec: Spec, requests: Any, replies: Any) -> None:
    from swarmrl.cores import take_threads
    from swarmrl.models import load_backend
    from swarmrl.rollouts.records import write_rollouts
    from swarmrl.tasks import Task

    os.sched_setaffinity(0, spec.cores)
    take_threads(spec.threads)
    engine = Engine(**spec.engine)

    def load(model_dir: Path, precision: Precision) -> Backend:
        return load_backend(
            spec.backend, model_dir, device=spec.device, precision=precision, engine=engine
        )

    worker = LocalWorker(load)

    def answer(reply: Reply) -> None:
        replies.write(reply.model_dump_json(exclude_defaults=True) + "\n")
        replies.flush()

    answer(Reply())  # ready
    for line in requests:
        request = Request.model_validate_json(line)
        try:
            if request.load is not None:
                r = request.load
                worker.hold(Path(r.model_dir), r.step, r.precision)
                answer(Reply())
            elif request.generate is not None:
                g = request.generate
                rows = {t.problem_id: t for t in map(Task.from_row, g.tasks)}
                began, cpu = time.perf_counter(), worker.cpu_seconds()
                generation = Generation(
                    g.order, rows, node=g.node, step=g.step, batch_size=g.batch_size
                )
                records = worker.records(generation, batches=range(g.first, g.stop))
                seconds = time.perf_counter() - began
                write_rollouts(records, Path(g.out))
                tokens = sum(len(r.output_ids) for r in records)
                answer(
                    Reply(tokens=tokens, seconds=seconds, cpu_seconds=worker.cpu_seconds() - cpu)
                )
            elif request.threads is not None:
                worker.threads(request.threads)
                answer(Reply())
        except ValueError as e:
            answer(Reply(error=str(e), kind="value"))
        except OSError as e:
            from swarmrl.files import os_error_sentence

            answer(Reply(error=os_error_sentence(e), kind="os", errno=e.errno))


def main() -> None:
    """``python -m client.node.work.worker``: started by client.node.work.workers, never by hand."""
    # The protocol's stdout is a copy of fd 1; fd 1 itself now goes to the log (stderr),
    # so nothing a library prints can break a reply.
    # Whatever kills the daemon kills its workers: client.node.work.workers starts them from
    # the daemon's main thread alone.
    die_with_parent()
    replies = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    spec = Spec.model_validate_json(sys.stdin.readline())
    if os.getppid() != spec.parent:  # the daemon died before the signal was asked for
        return
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a Ctrl-C is the daemon's to handle
    _serve(spec, sys.stdin, replies)


if __name__ == "__main__":
    main()
