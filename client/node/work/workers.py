"""Every GPU of the machine under one node: the daemon's worker processes.

A node runs one worker (client.node.work.worker) per GPU, or per tensor-parallel group of
GPUs, or ``cpu_workers`` on a CPU, each with its share of the cores, all under the one
daemon, key, journal and stake. An order is split among them on its batch boundaries,
in proportion to each worker's measured speed; every part draws the seeds the whole
order would, so the merged records are the ones one worker would have made, and the
node hands in one submission.

A worker that dies (a crash, the RAM cap) is started again and its part done again;
so is one that does not answer in time (a GPU or driver hang, a SIGSTOP look the same
from here): every request has a deadline, a part's derived from its size and the
worker's measured speed, and a worker past it is killed. After ``max_exits`` exits with
no order done between them (BOINC gives a task 100) the node stops taking work until
its owner resumes it. Once the node stops, what is in flight has a short grace, then
the workers are killed and nothing is started again. Workers are started from the
daemon's main thread only: the parent-death signal they ask for fires when the thread
that started them ends, not the process.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import itertools
import logging
import math
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from client.node.work.worker import (
    Generate,
    Generation,
    Load,
    Reply,
    Request,
    Spec,
    batch_slots,
    order_batches,
)
from swarmrl.files import os_error
from swarmrl.models.backend import BackendName, Engine, Precision
from swarmrl.times import duration

if TYPE_CHECKING:
    from client.node.settings import NodeSettings
    from swarmrl.rollouts.records import Rollout

log = logging.getLogger("swarmrl.node")

MAX_EXITS = 100  # BOINC aborts a task after 100 exits of its application
WATCH_SECONDS = 1.0  # how often workers' memory and deadlines are looked at
CLOSE_SECONDS = 10.0  # how long a worker has to exit after its stdin closes
# How long a worker may take to answer before it is taken for hung. Starting imports
# torch (and vLLM). Loading reads the model from disk and, with vLLM, warms its engine
# up, which for a large model from a slow disk takes many minutes the first time; after
# that, PART_SLACK times the longest load the worker measured (never under
# MIN_LOAD_SECONDS), which the first load, the slowest, bounds.
READY_SECONDS = 300.0
LOAD_SECONDS = 1800.0
MIN_LOAD_SECONDS = 60.0
THREADS_SECONDS = 60.0
# A part: PART_SLACK times its most tokens (every sequence at max_tokens) at the speed
# the worker measured on its last part, which is already more than a part takes (most
# sequences end early); the slack covers other load and a throttled GPU. Never under
# MIN_PART_SECONDS (a part's fixed costs), and FIRST_PART_SECONDS before any speed is
# measured (the first part also warms the engine up).
PART_SLACK = 4.0
MIN_PART_SECONDS = 60.0
FIRST_PART_SECONDS = 900.0
# How long the order in flight may still take once the node is told to stop: a healthy
# part near its end is handed in, a hung one does not hold the stop.
STOP_GRACE_SECONDS = 30.0


class WorkersFailingError(Exception):
    """Workers died ``max_exits`` times with no order done between: the node holds."""


class WorkerExitedError(Exception):
    """A worker process ended while it had a request."""


class PolicyGoneError(Exception):
    """The weight store dropped a policy's files before a worker loaded it (one started
    again a minute after it hung, say): that policy, and an order in hand generated
    with it, are given up; the node takes the newest policy and the next order."""


class NodeStoppingError(Exception):
    """The node stops: what it was doing (a worker's request after the grace, a wait)
    is given up."""


class Workers(Protocol):
    """What the node generates with: a pool of worker processes, or a worker in the
    node's own process (client.node.work.worker.LocalWorker)."""

    @property
    def count(self) -> int: ...

    def hold(self, model_dir: Path, step: int, precision: Precision) -> None: ...

    def records(self, generation: Generation) -> list[Rollout]: ...

    def threads(self, threads: int) -> None: ...

    def cpu_seconds(self) -> float:
        """CPU time generation has taken so far, its reward checks included."""
        ...

    def forgive(self) -> None:
        """The owner resumed the node: failures so far are forgiven."""
        ...

    def stop(self, grace: float) -> None:
        """The node stops: what is in flight has ``grace`` seconds more, then ends with
        NodeStoppingError."""
        ...

    def waiting(self) -> list[str]:
        """What the workers are doing now that the node waits for, one line each."""
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


@dataclass(frozen=True)
class Busy:
    """A request a worker has not answered yet."""

    what: str  # as the node's status says it, e.g. "generating batches 1-3 of 6"
    since: float  # time.monotonic() when it was sent
    seconds: float  # how long it may take before the worker is taken for hung


class ProcessWorker:
    """A worker process and the pipe to it; started and ended by :class:`Pool`."""

    def __init__(self, plan: WorkerPlan, backend: BackendName, engine: Engine, log: Path) -> None:
        self.plan = plan
        self.backend = backend
        self.engine = engine
        self.log = log
        self.process: subprocess.Popen[str] | None = None
        self.speed: float | None = None  # tokens/s of its last part, once it did one
        # A part before any speed is measured may take this long; doubled each time the
        # worker exits in one, so a machine slower than guessed still gets its first part
        # done (and measured) rather than being taken for hung at every try.
        self.first_part_seconds = FIRST_PART_SECONDS
        self.load_seconds: float | None = None  # its longest load, once it did one
        self.busy: Busy | None = None  # the request it has not answered yet
        self.killed_for = ""  # why the pool killed it, if it did

    def start(self) -> None:
        # Progress bars (a model's load, vLLM's prompts) would fill its log with carriage
        # returns, and a log's last line is what says why a worker died.
        env = {**os.environ, "TQDM_DISABLE": "1"}
        if self.plan.gpus:
            env["CUDA_VISIBLE_DEVICES"] = ",".join(map(str, self.plan.gpus))
        with self.log.open("a") as err:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "client.node.work.worker"],
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
        self._check(self._exchange(spec.model_dump_json(), "starting", READY_SECONDS))  # its ready

    def call(self, request: Request, what: str, seconds: float) -> Reply:
        """The worker's reply to ``request`` (``what`` it asks, for people), which must
        come within ``seconds``, else the pool kills the worker (WorkerExitedError)."""
        line = request.model_dump_json(exclude_none=True)
        return self._check(self._exchange(line, what, seconds))

    def part_seconds(self, tokens: int) -> float:
        """How long the worker may take to generate at most ``tokens`` tokens."""
        if self.speed is None:
            return self.first_part_seconds
        return max(MIN_PART_SECONDS, PART_SLACK * tokens / self.speed)

    def load(self, request: Request) -> None:
        """Has the worker hold the policy ``request`` names, within its load deadline;
        PolicyGoneError if the weight store dropped its files before it was loaded."""
        load = request.load
        assert load is not None
        if self.load_seconds is None:
            seconds = LOAD_SECONDS
        else:
            seconds = max(MIN_LOAD_SECONDS, PART_SLACK * self.load_seconds)
        began = time.monotonic()
        try:
            self.call(request, f"loading the policy of step {load.step}", seconds)
        except ValueError:
            if Path(load.model_dir).is_dir():
                raise
            raise PolicyGoneError(
                f"worker {self.plan.index}: the policy of step {load.step} left the weight "
                "store before it was loaded"
            ) from None
        self.load_seconds = max(time.monotonic() - began, self.load_seconds or 0.0)

    def _exchange(self, line: str, what: str, seconds: float) -> Reply:
        assert self.process is not None
        stdin, stdout = self.process.stdin, self.process.stdout
        assert stdin is not None
        assert stdout is not None
        self.busy = Busy(what, time.monotonic(), seconds)
        try:
            stdin.write(line + "\n")
            stdin.flush()
            answer = stdout.readline()
        except (BrokenPipeError, ValueError):  # ValueError: a pipe closed by kill()
            answer = ""
        finally:
            self.busy = None
        if not answer:
            raise WorkerExitedError(self._why_ended())
        return Reply.model_validate_json(answer)

    def _check(self, reply: Reply) -> Reply:
        if reply.error is None:
            return reply
        text = f"worker {self.plan.index}: {reply.error}"
        if reply.kind == "value":
            raise ValueError(text)
        raise os_error(text, reply.errno)  # a full disk is told apart by it (client.node.work.loop)

    def overdue(self, now: float, stop_by: float | None) -> str | None:
        """Why the worker is to be killed at ``now`` (monotonic), or None: it has not
        answered within its request's deadline, or by ``stop_by`` once the node stops."""
        busy = self.busy
        if busy is None:
            return None
        if stop_by is not None and now >= stop_by:
            return f"the node stops, and it was still {busy.what}"
        if now >= busy.since + busy.seconds:
            return (
                f"no answer {busy.what} within {duration(math.ceil(busy.seconds))}: taken for hung"
            )
        return None

    def _why_ended(self) -> str:
        assert self.process is not None
        code = self.process.wait()
        why = self.killed_for or _signalled(code) or _last_line(self.log) or "no word why"
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
            # Its loop ends: a clean exit. A dead worker's pipe may still hold the request
            # it never read, which closing tries to flush.
            with contextlib.suppress(BrokenPipeError):
                self.process.stdin.close()
        try:
            self.process.wait(CLOSE_SECONDS)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        if self.process.stdout is not None:
            self.process.stdout.close()


def _signalled(code: int) -> str:
    """A signal's death in words ("" for an exit): a kill from outside the pool (the
    kernel's OOM killer, a person) leaves no last words in the log."""
    if code >= 0:
        return ""
    try:
        return f"killed by {signal.Signals(-code).name}"
    except ValueError:
        return f"killed by signal {-code}"


def _last_line(path: Path) -> str:
    try:
        with path.open("rb") as f:
            f.seek(max(0, f.seek(0, os.SEEK_END) - 4096))
            text = f.read().decode(errors="replace")
    except OSError:
        return ""
    # A carriage return redraws a line in place (a progress bar): only its last drawing.
    lines = [line for line in re.split(r"[\r\n]", text) if line.strip()]
    return lines[-1].strip()[:300] if lines else ""


# ---- the pool ---------------------------------------------------------------------------


class Pool:
    """The node's worker processes: each holds the node's policy, an order is split
    among them, a dead (or hung) one is started again."""

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
        self._stop_by: float | None = None  # once the node stops: when what runs ends
        self._closed = threading.Event()
        self._watch = threading.Thread(
            target=self._watch_workers, name="swarmrl-workers", daemon=True
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
        self._all(lambda w: w.load(request))
        self._held = request

    def threads(self, threads: int) -> None:
        each = max(1, threads // self.count)
        self._all(
            lambda w: w.call(
                Request(threads=min(each, len(w.plan.cores))), "setting threads", THREADS_SECONDS
            )
        )

    def records(self, generation: Generation) -> list[Rollout]:
        from swarmrl.rollouts.records import read_rollouts

        order, batch_size = generation.order, generation.batch_size
        batches = order_batches(order, batch_size)
        parts = split_batches(batches, self._shares())
        digest = hashlib.sha256(order.model_dump_json().encode()).hexdigest()[:16]

        def part(worker: ProcessWorker, run: range) -> list[Rollout]:
            slots = batch_slots(order, batch_size, run)
            out = self.outbox / f"{digest}.worker-{worker.plan.index}.parquet"
            request = Generate(
                order=order,
                tasks=[generation.tasks[s.problem_id].row() for s in slots],
                node=generation.node,
                step=generation.step,
                batch_size=batch_size,
                first=run.start,
                stop=run.stop,
                out=str(out),
            )
            tokens = len(slots) * order.group_size * order.max_tokens  # the most it can take
            seconds = worker.part_seconds(tokens)
            try:
                reply = worker.call(Request(generate=request), _generating(run, batches), seconds)
            except WorkerExitedError:
                if worker.speed is None:  # slower than guessed, or hung: more time next try
                    worker.first_part_seconds *= 2
                raise
            worker.speed = max(reply.tokens / max(reply.seconds, 1e-9), 1e-3)
            self._cpu_seconds += reply.cpu_seconds
            try:
                return read_rollouts(out)
            finally:
                out.unlink(missing_ok=True)

        jobs = [(w, run) for w, run in zip(self.workers, parts, strict=True) if len(run)]
        results = self._concurrently(
            [(w, functools.partial(part, w, run)) for w, run in jobs], parts=True
        )
        self.exits = 0
        return [record for records in results for record in records]

    def _shares(self) -> list[float]:
        """Each worker's speed for splitting an order: a worker not measured yet counts
        as the others' mean (all alike when none is measured)."""
        known = [w.speed for w in self.workers if w.speed is not None]
        guess = sum(known) / len(known) if known else 1.0
        return [guess if w.speed is None else w.speed for w in self.workers]

    def cpu_seconds(self) -> float:
        return self._cpu_seconds

    def forgive(self) -> None:
        self.exits = 0

    def stop(self, grace: float) -> None:
        if self._stop_by is None:
            self._stop_by = time.monotonic() + grace

    def waiting(self) -> list[str]:
        now, lines = time.monotonic(), []
        for worker in self.workers:
            busy = worker.busy
            if busy is None:
                continue
            so_far = f"worker {worker.plan.index} {busy.what}: {duration(int(now - busy.since))}"
            if self._stop_by is not None:
                left = duration(max(0, math.ceil(self._stop_by - now)))
                lines.append(f"{so_far} so far, given up in {left} (the node stops)")
            else:
                hung = duration(math.ceil(busy.seconds))
                lines.append(f"{so_far} so far, taken for hung after {hung}")
        return lines

    def close(self) -> None:
        self._closed.set()
        for worker in self.workers:
            worker.close()

    # ---- running requests, and starting dead workers again ----------------------------

    def _all(self, call: Callable[[ProcessWorker], object]) -> None:
        self._concurrently([(w, functools.partial(call, w)) for w in self.workers])

    def _concurrently(
        self, jobs: Sequence[tuple[ProcessWorker, Callable[[], Any]]], *, parts: bool = False
    ) -> list[Any]:
        """Each job's result, run on its worker all at once; a worker that died is started
        again (from this thread: see the module's docstring) and its job run again.
        ``parts``: the jobs are parts of an order, which need the policy held."""
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
                self._run(worker, functools.partial(self._restart, worker, parts=parts))
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

    def _restart(self, worker: ProcessWorker, *, parts: bool) -> None:
        """Starts ``worker`` again, holding the pool's policy. The weight store may have
        dropped that policy's files while the worker was down (a hung one is noticed a
        minute or more after it hung): then a part of an order (``parts``) cannot be done
        again with it and PolicyGoneError gives the order up; any other request goes on,
        and the next hold loads every worker anew."""
        worker.start()
        held = self._held
        if held is None:
            return
        try:
            worker.load(held)
        except PolicyGoneError as e:
            self._held = None
            if parts:
                raise PolicyGoneError(f"{e}; the order in hand is given up") from None

    def _exited(self, worker: ProcessWorker, why: str) -> None:
        """Counts an exit, unless the node stops: then nothing is started again."""
        if self._stop_by is not None:
            raise NodeStoppingError(why)
        self.exits += 1
        if self.exits >= self.max_exits:
            raise WorkersFailingError(f"{self.exits} worker exits in a row; the last: {why}")
        log.warning("%s; started again (%d of %d exits)", why, self.exits, self.max_exits)

    def _watch_workers(self) -> None:
        """Kills a worker that is past its request's deadline (or the stop's grace), or
        over the RAM cap: its request then ends, and the pool starts it again."""
        while not self._closed.wait(WATCH_SECONDS):
            now = time.monotonic()
            for worker in self.workers:
                if (late := worker.overdue(now, self._stop_by)) is not None:
                    worker.kill(late)
                elif self.memory_cap is not None:
                    rss = worker.resident_bytes()
                    if rss is not None and rss > self.memory_cap:
                        cap = self.memory_cap / 2**30
                        worker.kill(f"over the RAM cap: {rss / 2**30:.2f} GiB of {cap:.2f}")


def _generating(run: range, batches: int) -> str:
    """A part as people read it: batches counted from 1."""
    if len(run) == 1:
        return f"generating batch {run.start + 1} of {batches}"
    return f"generating batches {run.start + 1}-{run.stop} of {batches}"


def describe(plan: WorkerPlan) -> str:
    where = f"GPU {','.join(map(str, plan.gpus))}" if plan.gpus else plan.device
    return f"worker {plan.index} on {where}, {plan.threads} thread(s) on cores {_span(plan.cores)}"


def _span(cores: Sequence[int]) -> str:
    return f"{cores[0]}-{cores[-1]}" if len(cores) > 1 else str(cores[0])
