"""Every GPU of the machine under one node: the daemon's worker processes.

A node runs one worker (client.node.worker) per GPU, or per tensor-parallel group of
GPUs, or ``cpu_workers`` on a CPU, each with its share of the cores, all under the one
daemon, key, journal and stake. An order is split among them on its batch boundaries,
in proportion to each worker's measured speed; every part draws the seeds the whole
order would, so the merged records are the ones one worker would have made, and the
node hands in one submission.

A worker that dies (a crash, the RAM cap) is started again and its part done again;
after ``max_exits`` exits with no order done between them (BOINC gives a task 100) the
node stops taking work until its owner resumes it. Workers are started from the
daemon's main thread only: the parent-death signal they ask for fires when the thread
that started them ends, not the process.
"""

from __future__ import annotations

import functools
import hashlib
import itertools
import logging
import os
import subprocess
import sys
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from client.node.worker import Generate, Load, Reply, Request, Spec, batch_slots, order_batches
from swarmrl.models.backend import BackendName, Engine, Precision
from swarmrl.work.assign import WorkOrder

if TYPE_CHECKING:
    from client.node.settings import NodeSettings
    from swarmrl.rollouts.records import Rollout
    from swarmrl.tasks import Task

log = logging.getLogger("swarmrl.node")

MAX_EXITS = 100  # BOINC aborts a task after 100 exits of its application
WATCH_SECONDS = 1.0  # how often workers' resident memory is looked at
CLOSE_SECONDS = 10.0  # how long a worker has to exit after its stdin closes


class WorkersFailingError(Exception):
    """Workers died ``max_exits`` times with no order done between: the node holds."""


class WorkerExitedError(Exception):
    """A worker process ended while it had a request."""


class Workers(Protocol):
    """What the node generates with: a pool of worker processes, or a worker in the
    node's own process (client.node.worker.LocalWorker)."""

    @property
    def count(self) -> int: ...

    def hold(self, model_dir: Path, step: int, precision: Precision) -> None: ...

    def records(
        self, order: WorkOrder, tasks: Mapping[str, Task], *, node: str, step: int, batch_size: int
    ) -> list[Rollout]: ...

    def threads(self, threads: int) -> None: ...

    def cpu_seconds(self) -> float:
        """CPU time generation has taken so far, its reward checks included."""
        ...

    def forgive(self) -> None:
        """The owner resumed the node: failures so far are forgiven."""
        ...

    def close(self) -> None: ...


# ---- the plan: which worker gets which GPUs and cores ------------------------------------


@dataclass(frozen=True)
class WorkerPlan:
    index: int
    device: str  # as torch names it inside the worker
    gpus: tuple[int, ...]  # the machine's CUDA indices it sees (CUDA_VISIBLE_DEVICES)
    cores: tuple[int, ...]
    threads: int


def plan_workers(
    settings: NodeSettings,
    *,
    device: str,
    backend: BackendName,
    gpu_count: int,
    cores: Sequence[int],
) -> list[WorkerPlan]:
    """The workers ``settings`` ask for on a machine of ``gpu_count`` GPUs and these
    ``cores``, ``device`` resolved (cuda, cuda:N, mps, cpu); one sentence naming the
    setting when the machine cannot run them."""
    tp = settings.tensor_parallel_size
    if tp > 1 and backend != "vllm":
        raise ValueError(
            f"tensor_parallel_size {tp} needs the vllm backend; torch runs a worker on one GPU"
        )
    if device.startswith("cuda"):
        if ":" in device:
            if settings.gpus:
                raise ValueError(f"device {device} names one GPU; gpus names others: set one")
            gpus = [int(device.split(":")[1])]
        else:
            gpus = settings.gpus or list(range(gpu_count))
        if not gpus or (missing := [g for g in gpus if g >= gpu_count]):
            have = f"GPUs 0-{gpu_count - 1}" if gpu_count else "no GPU"
            wanted = f"GPU {missing[0]}" if gpus else "a GPU"
            raise ValueError(f"the node is set to work on {wanted}, and torch sees {have}")
        if len(gpus) % tp:
            raise ValueError(
                f"tensor_parallel_size {tp} does not divide the node's {len(gpus)} GPUs"
            )
        groups = [tuple(gpus[i : i + tp]) for i in range(0, len(gpus), tp)]
    else:
        if settings.gpus or tp > 1:
            raise ValueError(f"gpus and tensor_parallel_size need a GPU; the device is {device}")
        groups = [() for _ in range(settings.cpu_workers)]
    shares = share_cores(cores, len(groups))
    total = settings.threads or len(cores)
    return [
        WorkerPlan(
            index=i,
            device="cuda" if group else device,
            gpus=group,
            cores=share,
            threads=max(1, min(len(share), total // len(groups))),
        )
        for i, (group, share) in enumerate(zip(groups, shares, strict=True))
    ]


def plan_here(settings: NodeSettings, *, device: str, backend: BackendName) -> list[WorkerPlan]:
    """``plan_workers`` on this machine: the GPUs torch sees and this process's cores."""
    gpu_count = 0
    if device.startswith("cuda"):
        import torch

        gpu_count = torch.cuda.device_count()
    return plan_workers(
        settings,
        device=device,
        backend=backend,
        gpu_count=gpu_count,
        cores=sorted(os.sched_getaffinity(0)),
    )


def engine(settings: NodeSettings) -> Engine:
    """The engine settings of each worker."""
    return Engine(
        tensor_parallel_size=settings.tensor_parallel_size,
        gpu_memory_fraction=settings.gpu_memory_fraction,
        max_model_len=settings.max_model_len,
    )


def share_cores(cores: Sequence[int], workers: int) -> list[tuple[int, ...]]:
    """``cores`` in ``workers`` contiguous slices as even as they go; with fewer cores than
    workers, slices share cores (a GPU worker needs a core to feed it, not a core alone)."""
    cores = sorted(cores)
    if workers <= len(cores):
        bounds = [round(i * len(cores) / workers) for i in range(workers + 1)]
        return [tuple(cores[a:b]) for a, b in itertools.pairwise(bounds)]
    return [(cores[i % len(cores)],) for i in range(workers)]


def split_batches(batches: int, speeds: Sequence[float]) -> list[range]:
    """Batch indices ``0 .. batches`` in one contiguous run per worker, as long as its
    share of the speeds (largest remainders get the leftover batches)."""
    total = sum(speeds)
    exact = [batches * s / total for s in speeds]
    counts = [int(e) for e in exact]
    for i in sorted(range(len(speeds)), key=lambda i: counts[i] - exact[i])[
        : batches - sum(counts)
    ]:
        counts[i] += 1
    runs, start = [], 0
    for count in counts:
        runs.append(range(start, start + count))
        start += count
    return runs


# ---- one worker process -----------------------------------------------------------------


class ProcessWorker:
    """A worker process and the pipe to it; started and ended by :class:`Pool`."""

    def __init__(self, plan: WorkerPlan, backend: BackendName, engine: Engine, log: Path) -> None:
        self.plan = plan
        self.backend = backend
        self.engine = engine
        self.log = log
        self.process: subprocess.Popen[str] | None = None
        self.speed = 1.0  # tokens/s of its last part; equal shares until measured
        self.killed_for = ""  # why the pool killed it, if it did

    def start(self) -> None:
        env = dict(os.environ)
        if self.plan.gpus:
            env["CUDA_VISIBLE_DEVICES"] = ",".join(map(str, self.plan.gpus))
        with self.log.open("a") as err:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "client.node.worker"],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=err,
                text=True,
                env=env,
            )
        self.killed_for = ""
        spec = Spec(
            index=self.plan.index,
            parent=os.getpid(),
            backend=self.backend,
            device=self.plan.device,
            cores=list(self.plan.cores),
            threads=self.plan.threads,
            engine=asdict(self.engine),
        )
        self._check(self._exchange(spec.model_dump_json()))  # its ready

    def call(self, request: Request) -> Reply:
        return self._check(self._exchange(request.model_dump_json(exclude_none=True)))

    def _exchange(self, line: str) -> Reply:
        assert self.process is not None
        stdin, stdout = self.process.stdin, self.process.stdout
        assert stdin is not None
        assert stdout is not None
        try:
            stdin.write(line + "\n")
            stdin.flush()
            answer = stdout.readline()
        except (BrokenPipeError, ValueError):  # ValueError: a pipe closed by kill()
            answer = ""
        if not answer:
            raise WorkerExitedError(self._why_ended())
        return Reply.model_validate_json(answer)

    def _check(self, reply: Reply) -> Reply:
        if reply.error is None:
            return reply
        text = f"worker {self.plan.index}: {reply.error}"
        raise ValueError(text) if reply.kind == "value" else OSError(text)

    def _why_ended(self) -> str:
        assert self.process is not None
        code = self.process.wait()
        why = self.killed_for or _last_line(self.log) or "no word why"
        return f"worker {self.plan.index} exited with code {code} ({why})"

    def resident_bytes(self) -> int | None:
        if self.process is None or self.process.poll() is not None:
            return None
        try:
            status = Path(f"/proc/{self.process.pid}/status").read_text()
        except OSError:
            return None
        for line in status.splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
        return None

    def kill(self, why: str) -> None:
        if self.process is not None and self.process.poll() is None:
            self.killed_for = why
            self.process.kill()

    def close(self) -> None:
        if self.process is None:
            return
        if self.process.stdin is not None:
            self.process.stdin.close()  # its loop ends: a clean exit
        try:
            self.process.wait(CLOSE_SECONDS)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        if self.process.stdout is not None:
            self.process.stdout.close()


def _last_line(path: Path) -> str:
    try:
        with path.open("rb") as f:
            f.seek(max(0, f.seek(0, os.SEEK_END) - 4096))
            lines = f.read().decode(errors="replace").strip().splitlines()
    except OSError:
        return ""
    return lines[-1][:300] if lines else ""


# ---- the pool ---------------------------------------------------------------------------


class Pool:
    """The node's worker processes: each holds the node's policy, an order is split
    among them, a dead one is started again."""

    def __init__(
        self,
        plans: Sequence[WorkerPlan],
        *,
        backend: BackendName,
        engine: Engine,
        log_dir: Path,
        outbox: Path,
        memory_cap_bytes: int | None = None,
        max_exits: int = MAX_EXITS,
    ) -> None:
        self.workers = [
            ProcessWorker(plan, backend, engine, log_dir / f"worker-{plan.index}.log")
            for plan in plans
        ]
        self.outbox = outbox
        self.memory_cap = memory_cap_bytes
        self.max_exits = max_exits
        self.exits = 0  # since the last order done or forgiven
        self._cpu_seconds = 0.0  # what the workers said their parts took
        self._held: Request | None = None  # the policy every worker holds, as asked
        self._closed = threading.Event()
        self._watch = threading.Thread(
            target=self._watch_memory, name="swarmrl-workers", daemon=True
        )

    @property
    def count(self) -> int:
        return len(self.workers)

    def start(self) -> None:
        for worker in self.workers:
            self._run(worker, worker.start)
        self._watch.start()
        log.info("%d worker%s: %s", self.count, "s" if self.count > 1 else "",
                 "; ".join(describe(w.plan) for w in self.workers))  # fmt: skip

    def hold(self, model_dir: Path, step: int, precision: Precision) -> None:
        request = Request(load=Load(model_dir=str(model_dir), step=step, precision=precision))
        if request == self._held:
            return
        self._all(lambda w: w.call(request))
        self._held = request

    def threads(self, threads: int) -> None:
        each = max(1, threads // self.count)
        self._all(lambda w: w.call(Request(threads=min(each, len(w.plan.cores)))))

    def records(
        self, order: WorkOrder, tasks: Mapping[str, Task], *, node: str, step: int, batch_size: int
    ) -> list[Rollout]:
        from swarmrl.rollouts.records import read_rollouts

        parts = split_batches(order_batches(order, batch_size), [w.speed for w in self.workers])
        digest = hashlib.sha256(order.model_dump_json().encode()).hexdigest()[:16]

        def part(worker: ProcessWorker, run: range) -> list[Rollout]:
            slots = batch_slots(order, batch_size, run)
            out = self.outbox / f"{digest}.worker-{worker.plan.index}.parquet"
            request = Generate(
                order=order.model_dump_json(),
                tasks=[tasks[s.problem_id].row() for s in slots],
                node=node,
                step=step,
                batch_size=batch_size,
                first=run.start,
                stop=run.stop,
                out=str(out),
            )
            reply = worker.call(Request(generate=request))
            worker.speed = max(reply.tokens / max(reply.seconds, 1e-9), 1e-3)
            self._cpu_seconds += reply.cpu_seconds
            try:
                return read_rollouts(out)
            finally:
                out.unlink(missing_ok=True)

        jobs = [(w, run) for w, run in zip(self.workers, parts, strict=True) if len(run)]
        results = self._concurrently([(w, functools.partial(part, w, run)) for w, run in jobs])
        self.exits = 0
        return [record for records in results for record in records]

    def cpu_seconds(self) -> float:
        return self._cpu_seconds

    def forgive(self) -> None:
        self.exits = 0

    def close(self) -> None:
        self._closed.set()
        for worker in self.workers:
            worker.close()

    # ---- running requests, and starting dead workers again ----------------------------

    def _all(self, call: Callable[[ProcessWorker], object]) -> None:
        self._concurrently([(w, functools.partial(call, w)) for w in self.workers])

    def _concurrently(self, jobs: Sequence[tuple[ProcessWorker, Callable[[], Any]]]) -> list[Any]:
        """Each job's result, run on its worker all at once; a worker that died is started
        again (from this thread: see the module's docstring) and its job run again."""
        results: dict[int, Any] = {}
        errors: dict[int, BaseException] = {}

        def run(i: int, job: Callable[[], Any]) -> None:
            try:
                results[i] = job()
            except BaseException as e:
                errors[i] = e

        pending = list(enumerate(jobs))
        while pending:
            errors.clear()
            threads = [threading.Thread(target=run, args=(i, job)) for i, (_, job) in pending]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            if failed := [e for e in errors.values() if not isinstance(e, WorkerExitedError)]:
                raise failed[0]
            for i, e in errors.items():
                worker = jobs[i][0]
                self._exited(worker, str(e))
                self._run(worker, functools.partial(self._restart, worker))
            pending = [(i, jobs[i]) for i in list(errors)]
        return [results[i] for i in range(len(jobs))]

    def _run(self, worker: ProcessWorker, start: Callable[[], None]) -> None:
        """Starts ``worker`` (``start``), counting each time it dies doing so."""
        while True:
            try:
                start()
                return
            except WorkerExitedError as e:
                self._exited(worker, str(e))

    def _restart(self, worker: ProcessWorker) -> None:
        worker.start()
        if self._held is not None:
            worker.call(self._held)

    def _exited(self, worker: ProcessWorker, why: str) -> None:
        self.exits += 1
        if self.exits >= self.max_exits:
            raise WorkersFailingError(f"{self.exits} worker exits in a row; the last: {why}")
        log.warning("%s; started again (%d of %d exits)", why, self.exits, self.max_exits)

    def _watch_memory(self) -> None:
        while not self._closed.wait(WATCH_SECONDS):
            if self.memory_cap is None:
                continue
            for worker in self.workers:
                rss = worker.resident_bytes()
                if rss is not None and rss > self.memory_cap:
                    worker.kill(
                        f"over the RAM cap: {rss / 2**30:.2f} GiB of {self.memory_cap / 2**30:.2f}"
                    )


def describe(plan: WorkerPlan) -> str:
    where = f"GPU {','.join(map(str, plan.gpus))}" if plan.gpus else plan.device
    return f"worker {plan.index} on {where}, {plan.threads} thread(s) on cores {_span(plan.cores)}"


def _span(cores: Sequence[int]) -> str:
    return f"{cores[0]}-{cores[-1]}" if len(cores) > 1 else str(cores[0])
