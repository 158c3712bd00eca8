"""The control plane under load: N simulated nodes against a real orchestrator's intake.

    python -m benchmarks.load [--nodes 200] [--minutes 2] [--processes 2] [--rate R]
                              [--flood-heartbeats R] [--slow-uploads] [--json PATH]
                              [--profile PATH (py-spy on PATH)]
    or   swarmrl bench load ...

The orchestrator is a process of its own, so that its CPU and memory are its own: a
real libp2p ``Host`` on 127.0.0.1, a real ``Ledger`` (SQLite, WAL, synchronous=FULL) in
a fresh data dir on disk, and the real ``WorkServer`` serving join, heartbeat, work and
submit with ``OrchestratorSettings``' defaults, as the daemon composes them
(``daemon.Orchestrator._start_host``). Policy step 0 stays published the whole run (no
weights are fetched). Two things stand in for what is not measured here:

- the chain's answer to a join (:class:`Registered`): the nodes this benchmark made
  may join, no RPC is asked;
- the validator (:func:`judge_main`, a process of its own): it takes each received
  submission through the ledger's lease and verdict calls as the validator does
  (``claim``, ``holding``, ``set_outcome``), reads its file, and accepts its records.
  It leaves out prefill and rewards, the model time ``swarmrl bench swarm`` measures.

The nodes (``benchmarks.load_nodes``) run many to a process on light libp2p hosts; one
*probe* node is a real node's ``Host`` and ``Session`` in this process, whose join,
order (work request) and submit (upload to checked receipt, retries included)
latencies are the figures. The run: nodes join over a ramp, then the measured window;
with an attack asked for, the window is cut into a quiet phase and one phase per
attack, and the probe's latencies are reported per phase. Afterwards every receipt a
node got is looked up in the ledger (there exactly once, with the units it states) and
every submission the ledger holds is matched to a receipt, or to an upload that was
in flight when the run stopped.
"""

from __future__ import annotations

import argparse
import json
import logging
import multiprocessing
import os
import secrets
import shutil
import sqlite3
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from multiprocessing.connection import Connection
from multiprocessing.synchronize import Event as EventType
from pathlib import Path
from typing import Any

from benchmarks import load_nodes
from benchmarks.load_nodes import RunFacts, WorkerPlan, node_account, node_peer_key
from orchestrator.service.ledger.home import ledger_path
from orchestrator.service.work_server import ChainView

log = logging.getLogger("swarmrl.bench.load")

CHAIN_ID = 31337
POOL = "0x" + "a1" * 20
PROVIDER = "0x" + "b2" * 20
TASKS = 512
# The probe: the node whose latencies are the figures; the attackers after the nodes.
PROBE = 0
PROBE_CYCLE_SECONDS = 1.0
SWEEP_SECONDS = 1.0
# The thread swarmrl.p2p.host.Host runs its trio loop in: every connection's bytes.
EVENT_LOOP_THREAD = "swarmrl-p2p"
JUDGE_CLAIM = 64
JUDGE_POLL_SECONDS = 0.05
LOOP = "orchestrator's event loop thread"
QUIET = "quiet"
FLOOD = "heartbeat flood"
SLOW = "slow uploads"


@dataclass(frozen=True)
class Options:
    nodes: int = 200
    minutes: float = 2.0
    processes: int = 2
    rate: float | None = None  # submissions/s offered in all; None: as fast as orders allow
    flood_heartbeats: float = 0.0  # the flooding peer's heartbeat requests a second
    slow_uploads: bool = False
    sample_seconds: float = 5.0
    ramp: float | None = None  # seconds over which the nodes join; None: from --nodes
    settle: float = 10.0  # seconds after the ramp before the window opens
    max_backlog: int = 8  # OrchestratorSettings' default
    profile: Path | None = None  # py-spy's raw samples of the orchestrator, in the window
    keep: Path | None = None  # keep the run's files here (else a temporary folder)

    def ramp_seconds(self) -> float:
        return self.ramp if self.ramp is not None else max(5.0, self.nodes / 25)


# ---- the orchestrator process -------------------------------------------------------------


class Registered(ChainView):
    """The chain's answer to a join, stood in for: the nodes this benchmark registered may
    work for its provider; any other is refused with the sentence the daemon's view
    (``daemon.ProtocolChainView``) gives. How long the chain takes to answer (RPCs to a
    node of the chain) is not what this benchmark measures."""

    def __init__(self, nodes: frozenset[str], provider: str) -> None:
        self.nodes = nodes
        self.provider = provider

    def standing(self, node: str, provider: str) -> str | None:
        if provider != self.provider:
            return f"{provider} is not a registered provider"
        if node not in self.nodes:
            return f"node {node} is not registered under provider {provider}"
        return None


@dataclass(frozen=True)
class OrchestratorPlan:
    data_dir: Path
    tasks: Path
    run: str
    signer_key: bytes
    nodes: tuple[str, ...]  # checksummed addresses the chain view admits
    provider: str
    max_backlog: int


def orchestrator_main(plan: OrchestratorPlan, ready: Connection, stop: EventType) -> None:
    """The orchestrator's control plane as the daemon composes it, until `stop`: sends
    its multiaddr through `ready` once it serves."""
    from eth_account import Account
    from eth_utils import to_checksum_address

    # The daemon's module, as its process has it loaded (torch and web3 with it: the
    # resident memory starts where the daemon's does).
    from orchestrator.service.daemon import ORIGIN_CONNECTIONS
    from orchestrator.service.ledger import Ledger
    from orchestrator.service.logs import setup_process_logging
    from orchestrator.service.settings import OrchestratorSettings
    from orchestrator.service.work_server import RunContext, WorkServer
    from swarmrl.eip712 import pool_domain, swarm_domain
    from swarmrl.p2p.host import Host
    from swarmrl.p2p.identity import load_or_create_peer_key
    from swarmrl.tasks import read_tasks
    from swarmrl.work.states import SubmissionStatus

    data_dir = plan.data_dir
    setup_process_logging(data_dir, "orchestrator", stderr=False)
    settings = OrchestratorSettings(
        data_dir=data_dir,
        model=data_dir / "model",  # never read: no trainer, no weights published
        tasks=plan.tasks,
        deployment=data_dir / "deployment.json",
        keystore_dir=data_dir / "keys",
        listen="/ip4/127.0.0.1/tcp/0",
        max_backlog=plan.max_backlog,
    )
    context = RunContext(
        run=plan.run,
        swarm_domain=swarm_domain(CHAIN_ID, POOL),
        pool_domain=pool_domain(CHAIN_ID, POOL),
        signer=Account.from_key(plan.signer_key),
    )
    ledger = Ledger(ledger_path(data_dir), run=plan.run)
    host = Host(
        load_or_create_peer_key(data_dir / "peer.key"),
        listen=settings.listen,
        max_connections=ORIGIN_CONNECTIONS,
    )
    chain = Registered(frozenset(plan.nodes), to_checksum_address(plan.provider))
    work_server = WorkServer(
        settings,
        context,
        ledger,
        {t.problem_id: t for t in read_tasks(plan.tasks)},
        chain,
        published_step=lambda: 0,
        backlog=lambda: ledger.submissions.count(SubmissionStatus.RECEIVED),
        weights_addrs=lambda: host.addrs,
    )
    work_server.serve(host, data_dir / "incoming")
    # Heartbeats to the ledger, orders expired, quiet nodes made silent: once a second,
    # as the daemon's loop does.
    swept = threading.Event()

    def sweeping() -> None:
        while not stop.wait(SWEEP_SECONDS):
            work_server.sweep(time.time())
        swept.set()

    threading.Thread(target=sweeping, name="sweep", daemon=True).start()
    loop = next(t for t in threading.enumerate() if t.name == EVENT_LOOP_THREAD)
    ready.send((host.addrs[0], loop.native_id))
    stop.wait()
    swept.wait(10)
    host.close()
    time.sleep(1.0)  # handlers the host abandoned finish in their threads
    work_server.close()  # heartbeats still in memory, to the ledger
    ledger.close()


def judge_main(ledger_file: Path, stop: EventType) -> None:
    """The validator, stood in for: claims what is received (a lease), reads its file,
    and accepts its records under the lease (``holding``, then ``set_outcome``), until
    `stop` and nothing left to judge. No prefill, no rewards: see the module's note."""
    from orchestrator.service.ledger import Ledger
    from orchestrator.service.ledger.submissions import Lease
    from swarmrl.rollouts import checks
    from swarmrl.work.states import SubmissionStatus

    ledger = Ledger(ledger_file, create=False)
    lease = Lease("bench-judge", secrets.token_hex(8))
    while True:
        claimed = ledger.submissions.claim(lease, JUDGE_CLAIM, time.time(), 60.0)
        for row in claimed:
            records, why = checks.read_submitted(Path(row.file))
            with ledger.submissions.holding(row.digest, lease) as held:
                pass  # the validator hands the accepted records to the trainer here
            if not held:
                continue
            status = SubmissionStatus.ACCEPTED if why is None else SubmissionStatus.REJECTED
            ledger.submissions.set_outcome(
                row.digest,
                status,
                len(records),
                why or "",
                False,
                False,
                time.time(),
                lease=lease,
            )
        if not claimed:
            if stop.is_set():
                break
            time.sleep(JUDGE_POLL_SECONDS)
    ledger.close()


# ---- what is measured in this process ------------------------------------------------------


def proc_cpu_seconds(pid: int, thread: int | None = None) -> float:
    """User + system CPU seconds `pid` (or its thread `thread`) used so far
    (/proc/<pid>/stat), 0 once it is gone."""
    stat = Path(f"/proc/{pid}/stat" if thread is None else f"/proc/{pid}/task/{thread}/stat")
    try:
        fields = stat.read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def proc_rss_mib(pid: int) -> float:
    """Resident memory of `pid` now (/proc/<pid>/status VmRSS), 0 once it is gone."""
    try:
        lines = Path(f"/proc/{pid}/status").read_text().splitlines()
    except OSError:
        return 0.0
    for line in lines:
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


@dataclass
class Sample:
    at: float  # unix time
    cpu: dict[str, float]  # CPU seconds used so far, by process
    rss: dict[str, float]  # MiB resident now, by process


class Sampler:
    """/proc of each process (and the CPU of each thread named in `threads`, by
    (pid, native thread id)) every `seconds`, in a thread."""

    def __init__(
        self, pids: dict[str, int], seconds: float, threads: dict[str, tuple[int, int]]
    ) -> None:
        self.pids = pids
        self.threads = threads
        self.seconds = seconds
        self.samples: list[Sample] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="sampler", daemon=True)

    def take(self) -> Sample:
        cpu = {name: proc_cpu_seconds(pid) for name, pid in self.pids.items()}
        cpu |= {name: proc_cpu_seconds(*ids) for name, ids in self.threads.items()}
        rss = {name: proc_rss_mib(pid) for name, pid in self.pids.items()}
        sample = Sample(time.time(), cpu, rss)
        self.samples.append(sample)
        return sample

    def _run(self) -> None:
        while True:
            self.take()
            if self._stop.wait(self.seconds):
                return

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()


@dataclass
class ProbeLog:
    """The probe's latencies (seconds) with the unix time each call began."""

    join: list[tuple[float, float]] = field(default_factory=list)
    order: list[tuple[float, float]] = field(default_factory=list)
    submit: list[tuple[float, float]] = field(default_factory=list)
    heartbeats: list[float] = field(default_factory=list)
    receipts: list[tuple[str, str, int, float]] = field(default_factory=list)
    refused: Counter[str] = field(default_factory=Counter)
    errors: Counter[str] = field(default_factory=Counter)
    retries: list[float] = field(default_factory=list)  # when a submit was tried again
    in_flight: list[str] = field(default_factory=list)


class Probe:
    """One honest node as a real one runs: its own ``Host`` (trio thread, gossipsub) and
    the node's ``Session``; each cycle it joins again, beats when due, asks for work and
    hands its answer in, retrying failures with the node's backoff."""

    def __init__(self, facts: RunFacts, tasks: dict[str, Any], spool: Path, stop_at: float) -> None:
        self.facts = facts
        self.tasks = tasks
        self.spool = spool
        self.stop_at = stop_at
        self.log = ProbeLog()
        self._thread = threading.Thread(target=self._run, name="probe", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def join_thread(self, timeout: float) -> None:
        self._thread.join(timeout)

    def _timed(self, into: list[tuple[float, float]], fn: Callable[[], Any]) -> Any:
        began, start = time.time(), time.perf_counter()
        result = fn()
        into.append((began, time.perf_counter() - start))
        return result

    def _run(self) -> None:
        from client.node.work.backoff import Backoff
        from client.node.work.session import Session
        from swarmrl.p2p.host import Host

        with Host(node_peer_key(PROBE), listen=None) as host:
            while time.time() < self.stop_at:
                try:
                    host.connect(self.facts.orchestrator)
                    break
                except (ConnectionError, TimeoutError) as e:
                    self.log.errors[load_nodes.sentence(e)] += 1
                    time.sleep(1.0)
            orchestrator = self.facts.orchestrator.rsplit("/p2p/", 1)[1]
            session = Session(host, orchestrator, self.facts.identity(node_account(PROBE)))
            backoff = Backoff(base=1.0, cap=30.0)
            beat_due = 0.0
            while time.time() < self.stop_at:
                began = time.monotonic()
                try:
                    joined = self._timed(self.log.join, lambda: session.join(load_nodes.REPORT))
                    if time.monotonic() >= beat_due:
                        session.heartbeat(load_nodes.STEP, None)
                        self.log.heartbeats.append(time.time())
                        beat_due = time.monotonic() + joined.heartbeat_seconds
                    response = self._timed(self.log.order, session.work)
                except Exception as e:
                    self.log.errors[load_nodes.sentence(e)] += 1
                    time.sleep(backoff.next_delay())
                    continue
                backoff.reset()
                if response.order is None:
                    time.sleep(max(0.5, response.retry_after))
                    continue
                self._hand_in(session, response.order, backoff)
                time.sleep(max(0.0, PROBE_CYCLE_SECONDS - (time.monotonic() - began)))

    def _hand_in(self, session: Any, order: Any, backoff: Any) -> None:
        path = load_nodes.write_answer(
            order, self.tasks, self.spool / f"probe-{order.counter}.parquet"
        )
        header = session.sign(order, load_nodes.STEP, path)
        began, start = time.time(), time.perf_counter()
        try:
            while True:
                try:
                    answered = session.submit(header, path)
                except Exception as e:
                    self.log.errors[load_nodes.sentence(e)] += 1
                    if time.time() >= self.stop_at:
                        self.log.in_flight.append(session.digest(header))
                        return
                    self.log.retries.append(time.time())
                    time.sleep(backoff.next_delay())
                    continue
                backoff.reset()
                self.log.submit.append((began, time.perf_counter() - start))
                if answered.receipt is None:
                    self.log.refused[answered.refused[:100]] += 1
                else:
                    r = answered.receipt
                    self.log.receipts.append((r.submission, r.node, r.units, time.time()))
                return
        finally:
            path.unlink(missing_ok=True)


# ---- figures ----------------------------------------------------------------------------------


def percentile(values: Sequence[float], q: float) -> float | None:
    """The `q` quantile (nearest rank) of `values`; None for none."""
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


@dataclass(frozen=True)
class Phase:
    name: str
    start: float
    end: float

    def holds(self, t: float) -> bool:
        return self.start <= t < self.end

    @property
    def seconds(self) -> float:
        return self.end - self.start


@dataclass
class Latency:
    count: int
    p50: float | None
    p99: float | None

    @classmethod
    def of(cls, timed: Sequence[tuple[float, float]], phase: Phase) -> Latency:
        values = [seconds for at, seconds in timed if phase.holds(at)]
        return cls(len(values), percentile(values, 0.5), percentile(values, 0.99))


@dataclass
class PhaseFigures:
    name: str
    seconds: float
    offered_per_second: float  # submissions first uploaded
    receipts_per_second: float  # receipts with units > 0
    heartbeats_per_second: float
    join: Latency
    order: Latency
    submit: Latency
    probe_receipts: int
    probe_submit_retries: int


@dataclass
class LedgerCheck:
    receipts: int  # receipts nodes and the probe got
    ledger_rows: int
    missing: int  # receipts whose submission the ledger does not hold
    duplicate_receipts: int  # the same submission receipted twice to different callers
    units_mismatch: int  # ledger units (after the judge) not the receipt's
    orders_answered_twice: int  # orders with more than one submission
    unacknowledged: int  # ledger rows no receipt names
    unacknowledged_in_flight: int  # ... of them uploads in flight at the stop
    in_flight: int  # uploads unsettled at the stop
    rejected_at_intake: int  # receipts with units 0
    left_unjudged: int  # rows still 'received' after the judge drained

    @property
    def ok(self) -> bool:
        return (
            self.missing == self.duplicate_receipts == self.units_mismatch == 0
            and self.orders_answered_twice == 0
            and self.unacknowledged == self.unacknowledged_in_flight
            and self.left_unjudged == 0
        )


@dataclass
class Result:
    options: dict[str, Any]
    cores: int
    nodes_per_process: float
    window: tuple[float, float]
    phases: list[PhaseFigures]
    orchestrator_cpu: float  # cores busy in the window (user+sys seconds per wall second)
    orchestrator_rss: list[tuple[float, float]]  # (seconds into the window, MiB), all samples
    rss_growth_mib_per_minute: float | None  # after warm-up (the window's second half)
    cpu_by_process: dict[str, float]  # cores busy in the window, every process
    rss_by_process: dict[str, float]  # most MiB resident in the window, every process
    ledger: LedgerCheck
    attacks: dict[str, dict[str, int]]
    errors: dict[str, int]  # failures the nodes retried, by sentence
    no_work: dict[str, int]
    refused: dict[str, int]
    joined: int
    profile: dict[str, Any] | None = None


# ---- the run ---------------------------------------------------------------------------------


def _spool_root() -> Path | None:
    """The nodes' rollout files go to memory (/dev/shm) where there is one: the clients'
    disk is not what this measures; the orchestrator's data dir stays on disk."""
    shm = Path("/dev/shm")
    return shm if shm.is_dir() and os.access(shm, os.W_OK) else None


@contextmanager
def _workspace(keep: Path | None) -> Iterator[tuple[Path, Path]]:
    """(root on disk, the nodes' spool)."""
    root = Path(tempfile.mkdtemp(prefix="bench-load-")) if keep is None else keep
    root.mkdir(parents=True, exist_ok=True)
    spool = Path(tempfile.mkdtemp(prefix="bench-load-spool-", dir=_spool_root()))
    try:
        yield root, spool
    finally:
        shutil.rmtree(spool, ignore_errors=True)
        if keep is None:
            shutil.rmtree(root, ignore_errors=True)


def _split(indices: list[int], parts: int) -> list[tuple[int, ...]]:
    return [tuple(indices[i::parts]) for i in range(parts) if indices[i::parts]]


def _phases(options: Options, start: float, seconds: float) -> list[Phase]:
    names = [QUIET]
    if options.flood_heartbeats > 0:
        names.append(FLOOD)
    if options.slow_uploads:
        names.append(SLOW)
    share = seconds / len(names)
    return [Phase(n, start + i * share, start + (i + 1) * share) for i, n in enumerate(names)]


def run(options: Options) -> Result:
    """One run as `options` say; every process it starts is stopped before it returns."""
    from eth_account import Account
    from eth_utils import to_checksum_address

    from orchestrator.tasks.generators import demo_tasks
    from swarmrl.tasks import write_tasks

    ctx = multiprocessing.get_context("spawn")
    with _workspace(options.keep) as (root, spool):
        tasks_file = root / "tasks.jsonl"
        tasks = demo_tasks(TASKS, seed=1)
        write_tasks(tasks, tasks_file)
        signer = Account.create()
        run_id = "0x" + secrets.token_hex(32)
        count = options.nodes
        flood_index = count + 1 if options.flood_heartbeats > 0 else None
        slow_index = count + 2 if options.slow_uploads else None
        indices = [PROBE, *range(1, count + 1)]
        indices += [i for i in (flood_index, slow_index) if i is not None]
        admitted = tuple(node_account(i).address for i in indices)
        orch_plan = OrchestratorPlan(
            data_dir=root / "orchestrator",
            tasks=tasks_file,
            run=run_id,
            signer_key=bytes(signer.key),
            nodes=admitted,
            provider=to_checksum_address(PROVIDER),
            max_backlog=options.max_backlog,
        )
        stop_orchestrator, stop_judge = ctx.Event(), ctx.Event()
        theirs, ours = ctx.Pipe(duplex=False)
        orchestrator = ctx.Process(
            target=orchestrator_main, args=(orch_plan, ours, stop_orchestrator), name="orchestrator"
        )
        processes: list[Any] = [orchestrator]
        spy: subprocess.Popen[bytes] | None = None
        try:
            orchestrator.start()
            if not theirs.poll(120):
                raise RuntimeError("the orchestrator process did not start within 120 s")
            addr, loop_thread = theirs.recv()
            judge = ctx.Process(
                target=judge_main,
                args=(ledger_path(orch_plan.data_dir), stop_judge),
                name="judge",
            )
            judge.start()
            processes.append(judge)
            facts = RunFacts(
                run=run_id,
                chain_id=CHAIN_ID,
                pool=POOL,
                provider=to_checksum_address(PROVIDER),
                signer=signer.address,
                orchestrator=addr,
            )
            start_at = time.time() + 3.0  # the workers' imports
            window_start = start_at + options.ramp_seconds() + options.settle
            stop_at = window_start + options.minutes * 60
            phases = _phases(options, window_start, stop_at - window_start)
            plans: list[WorkerPlan] = []
            node_indices = list(range(1, count + 1))
            per_process = None if options.rate is None else options.rate / count
            for w, share in enumerate(_split(node_indices, options.processes)):
                plans.append(
                    WorkerPlan(
                        role="nodes",
                        facts=facts,
                        tasks=tasks_file,
                        indices=share,
                        start_at=start_at,
                        ramp=options.ramp_seconds(),
                        stop_at=stop_at,
                        spool=spool / f"w{w}",
                        out=root / f"worker{w}.json",
                        rate=None if per_process is None else per_process * len(share),
                    )
                )
            for phase in phases[1:]:
                index = flood_index if phase.name == FLOOD else slow_index
                assert index is not None
                plans.append(
                    WorkerPlan(
                        role="flood" if phase.name == FLOOD else "slow",
                        facts=facts,
                        tasks=tasks_file,
                        indices=(index,),
                        start_at=phase.start - 2.0,  # joined before its phase opens
                        ramp=0.0,
                        stop_at=phase.end,
                        spool=spool / phase.name.replace(" ", "-"),
                        out=root / f"{phase.name.replace(' ', '-')}.json",
                        flood_rate=options.flood_heartbeats,
                    )
                )
            workers = [
                ctx.Process(target=load_nodes.worker_main, args=(p,), name=f"{p.role}-{i}")
                for i, p in enumerate(plans)
            ]
            for worker in workers:
                worker.start()
            processes += workers
            from swarmrl.tasks import read_tasks

            probe = Probe(facts, {t.problem_id: t for t in read_tasks(tasks_file)}, spool, stop_at)
            probe.start()
            started = [("orchestrator", orchestrator), ("judge", judge)]
            started += [(w.name, w) for w in workers]
            pids = {name: p.pid for name, p in started if p.pid is not None}
            pids["bench+probe"] = os.getpid()
            loop = {LOOP: (pids["orchestrator"], loop_thread)}
            sampler = Sampler(pids, options.sample_seconds, loop)
            sampler.start()
            time.sleep(max(0.0, window_start - time.time()))
            at_start = sampler.take()
            if options.profile is not None:
                spy = start_profile(options.profile, pids["orchestrator"], stop_at - time.time())
            time.sleep(max(0.0, stop_at - time.time()))
            at_end = sampler.take()
            sampler.stop()
            probe.join_thread(load_nodes.GRACE + 60)
            for worker in workers:
                worker.join(load_nodes.GRACE + 60)
            stop_orchestrator.set()
            orchestrator.join(60)
            stop_judge.set()
            judge.join(120)
            profile = finish_profile(spy, options.profile)
            tallies = [json.loads(p.out.read_text()) for p in plans if p.out.is_file()]
            if len(tallies) != len(plans):
                raise RuntimeError("a worker process ended without its results; see above")
            check = check_ledger(ledger_path(orch_plan.data_dir), tallies, probe.log)
        finally:
            stop_orchestrator.set()
            stop_judge.set()
            if spy is not None and spy.poll() is None:
                spy.kill()
            for p in processes:
                p.join(5)
                if p.is_alive():
                    p.kill()
                    p.join(5)
        return _figures(
            options, phases, tallies, probe.log, sampler.samples, at_start, at_end, check, profile
        )


def _figures(
    options: Options,
    phases: list[Phase],
    tallies: list[dict[str, Any]],
    probe: ProbeLog,
    samples: list[Sample],
    at_start: Sample,
    at_end: Sample,
    check: LedgerCheck,
    profile: dict[str, Any] | None,
) -> Result:
    nodes = [t for t in tallies if t["role"] == "nodes"]
    figures = []
    for phase in phases:
        offered = sum(1 for t in nodes for at in t["offered"] if phase.holds(at))
        offered += sum(1 for at, _ in probe.submit if phase.holds(at))
        receipts = [r for t in nodes for r in t["receipts"]] + probe.receipts
        accepted = sum(1 for _, _, units, at in receipts if units > 0 and phase.holds(at))
        beats = sum(1 for t in nodes for at in t["heartbeats"] if phase.holds(at))
        beats += sum(1 for at in probe.heartbeats if phase.holds(at))
        figures.append(
            PhaseFigures(
                name=phase.name,
                seconds=phase.seconds,
                offered_per_second=offered / phase.seconds,
                receipts_per_second=accepted / phase.seconds,
                heartbeats_per_second=beats / phase.seconds,
                join=Latency.of(probe.join, phase),
                order=Latency.of(probe.order, phase),
                submit=Latency.of(probe.submit, phase),
                probe_receipts=sum(1 for r in probe.receipts if phase.holds(r[3]) and r[2] > 0),
                probe_submit_retries=sum(1 for at in probe.retries if phase.holds(at)),
            )
        )
    window = at_end.at - at_start.at
    cpu = {name: (at_end.cpu[name] - at_start.cpu.get(name, 0.0)) / window for name in at_end.cpu}
    rss = [(s.at - at_start.at, s.rss["orchestrator"]) for s in samples]
    in_window = [s for s in samples if at_start.at <= s.at <= at_end.at]
    attacks: dict[str, dict[str, int]] = {}
    errors: Counter[str] = Counter(probe.errors)
    no_work: Counter[str] = Counter()
    refused: Counter[str] = Counter(probe.refused)
    for t in tallies:
        if t["role"] != "nodes":
            attacks[t["role"]] = t["attack"]
            continue
        errors.update(t["errors"])
        no_work.update(t["no_work"])
        refused.update(t["refused"])
    return Result(
        options={k: str(v) if isinstance(v, Path) else v for k, v in asdict(options).items()},
        cores=len(os.sched_getaffinity(0)),
        nodes_per_process=options.nodes / max(1, min(options.processes, options.nodes)),
        window=(at_start.at, at_end.at),
        phases=figures,
        orchestrator_cpu=cpu["orchestrator"],
        orchestrator_rss=rss,
        rss_growth_mib_per_minute=growth([(t, m) for t, m in rss if t >= window / 2]),
        cpu_by_process=cpu,
        rss_by_process={
            name: max(s.rss[name] for s in in_window) for name in at_end.rss if in_window
        },
        ledger=check,
        attacks=attacks,
        errors=dict(errors.most_common(12)),
        no_work=dict(no_work.most_common(6)),
        refused=dict(refused.most_common(6)),
        joined=sum(t["joined"] for t in nodes),
        profile=profile,
    )


def growth(points: list[tuple[float, float]]) -> float | None:
    """The least-squares slope of (seconds, MiB), in MiB per minute; None below 3 points."""
    if len(points) < 3:
        return None
    n = len(points)
    mt = sum(t for t, _ in points) / n
    mm = sum(m for _, m in points) / n
    var = sum((t - mt) ** 2 for t, _ in points)
    if var == 0:
        return None
    return 60 * sum((t - mt) * (m - mm) for t, m in points) / var


def check_ledger(ledger_file: Path, tallies: list[dict[str, Any]], probe: ProbeLog) -> LedgerCheck:
    """Every receipt against the ledger's rows, read once everything has stopped."""
    receipts = [tuple(r) for t in tallies for r in t["receipts"]] + probe.receipts
    in_flight = {d for t in tallies for d in t["in_flight"]} | set(probe.in_flight)
    with sqlite3.connect(f"file:{ledger_file}?mode=ro", uri=True) as db:
        rows = db.execute("SELECT digest, order_id, status, units FROM submissions").fetchall()
    by_digest = {digest: (order, status, units) for digest, order, status, units in rows}
    per_order = Counter(order for _, order, _, _ in rows)
    receipted = Counter(r[0] for r in receipts)
    unacknowledged = set(by_digest) - set(receipted)
    return LedgerCheck(
        receipts=len(receipts),
        ledger_rows=len(rows),
        missing=sum(1 for d in receipted if d not in by_digest),
        duplicate_receipts=sum(n - 1 for n in receipted.values() if n > 1),
        units_mismatch=sum(
            1 for d, _, units, _ in receipts if d in by_digest and by_digest[d][2] != units
        ),
        orders_answered_twice=sum(1 for n in per_order.values() if n > 1),
        unacknowledged=len(unacknowledged),
        unacknowledged_in_flight=len(unacknowledged & in_flight),
        in_flight=len(in_flight),
        rejected_at_intake=sum(1 for r in receipts if r[2] == 0),
        left_unjudged=sum(1 for _, status, _ in by_digest.values() if status == "received"),
    )


# ---- the profile (py-spy) ---------------------------------------------------------------------


def start_profile(path: Path, pid: int, seconds: float) -> subprocess.Popen[bytes]:
    """py-spy sampling `pid` for `seconds` into `path` (raw: one stack and count a line)."""
    spy = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
    if not Path(spy).is_file():
        raise ValueError("--profile needs py-spy on PATH (pip install py-spy)")
    args = [
        spy, "record", "--pid", str(pid), "--format", "raw", "--rate", "50", "--gil",
        "--nonblocking", "--output", str(path), "--duration", str(max(1, int(seconds))),
    ]  # fmt: skip
    return subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def finish_profile(spy: subprocess.Popen[bytes] | None, path: Path | None) -> dict[str, Any] | None:
    if spy is None or path is None:
        return None
    try:
        spy.wait(60)
    except subprocess.TimeoutExpired:
        spy.kill()
    if not path.is_file():
        return None
    return summarize_profile(path.read_text().splitlines())


# Where a sample's CPU went, by the first frame (leaf upwards) whose file names one of these.
_AREAS = (
    ("ledger (SQLite)", ("orchestrator/service/ledger/",)),
    ("rollout file (parquet read, record checks)", ("pyarrow/", "swarmrl/rollouts/")),
    (
        "EIP-712 (sign, recover)",
        ("eth_account/", "eth_keys/", "coincurve/", "eth_utils/", "eth_abi/", "swarmrl/chain/"),
    ),
    ("Noise encryption", ("libp2p/security/", "cryptography/", "nacl/")),
    ("yamux", ("libp2p/stream_muxer/",)),
    ("libp2p streams and negotiation", ("libp2p/",)),
    ("pydantic (messages)", ("pydantic/", "pydantic_core/", "swarmrl/p2p/wire.py")),
    ("logging", ("logging/",)),
    ("trio (event loop, threads)", ("trio/", "threading.py", "outcome/")),
)
# Which request a sample served, by the first frame (root downwards) it passed through.
_HANDLERS = (
    ("submit", ("_handle_upload", "check_submission", "receive_submission", "_spool_body")),
    ("work", ("WorkServer.work", "work (orchestrator/service/work_server.py")),
    ("heartbeat", ("heartbeat (orchestrator/service/work_server.py",)),
    ("join", ("join (orchestrator/service/work_server.py",)),
    ("sweep", ("sweep (",)),
)


def summarize_profile(lines: Sequence[str], top: int = 12) -> dict[str, Any]:
    """py-spy's raw samples (``frame;frame;... count``, root first) as shares of the
    samples: by area (the leaf's library), by request served, and the top leaf frames."""
    areas: Counter[str] = Counter()
    handlers: Counter[str] = Counter()
    leaves: Counter[str] = Counter()
    total = 0
    for line in lines:
        stack, _, count_text = line.rpartition(" ")
        if not stack or not count_text.isdigit():
            continue
        count = int(count_text)
        frames = stack.split(";")
        total += count
        leaves[frames[-1]] += count
        areas[_first_match(reversed(frames), _AREAS)] += count
        handlers[_first_match(frames, _HANDLERS)] += count
    share = defaultdict(float)
    for name, n in areas.items():
        share[name] = n / max(1, total)
    return {
        "samples": total,
        "areas": {k: round(v, 3) for k, v in sorted(share.items(), key=lambda kv: -kv[1])},
        "handlers": {k: round(n / max(1, total), 3) for k, n in handlers.most_common()},
        "top": [(k, round(n / max(1, total), 3)) for k, n in leaves.most_common(top)],
    }


def _first_match(frames: Any, table: Sequence[tuple[str, Sequence[str]]]) -> str:
    for frame in frames:
        for name, needles in table:
            if any(n in frame for n in needles):
                return name
    return "other"


# ---- the report ---------------------------------------------------------------------------------


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value * 1000:.0f}"


def _lat(lat: Latency) -> str:
    return f"{_ms(lat.p50)} / {_ms(lat.p99)} ({lat.count})"


def report(result: Result) -> None:
    o = result.options
    rate = (
        "as fast as orders allow" if o["rate"] is None else f"{o['rate']:g} submissions/s offered"
    )
    print(
        f"\ncontrol plane under load: {o['nodes']} nodes in {o['processes']} processes "
        f"({result.nodes_per_process:.0f} per process), {rate}; {result.joined} of "
        f"{o['nodes']} joined; window {result.window[1] - result.window[0]:.0f} s; "
        f"{result.cores} cores"
    )
    print(
        "\n| phase | s | offered subs/s | receipts/s | heartbeats/s | probe join p50 / p99 ms "
        "(n) | order p50 / p99 ms (n) | submit p50 / p99 ms (n) | probe receipts | probe "
        "submit retries |"
    )
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for p in result.phases:
        print(
            f"| {p.name} | {p.seconds:.0f} | {p.offered_per_second:.1f} | "
            f"{p.receipts_per_second:.1f} | {p.heartbeats_per_second:.1f} | {_lat(p.join)} | "
            f"{_lat(p.order)} | {_lat(p.submit)} | {p.probe_receipts} | "
            f"{p.probe_submit_retries} |"
        )
    quiet = result.phases[0]
    for p in result.phases[1:]:
        ratios = [
            f"{name} {b.p99 / a.p99:.1f}x"
            for name, a, b in (
                ("join", quiet.join, p.join),
                ("order", quiet.order, p.order),
                ("submit", quiet.submit, p.submit),
            )
            if a.p99 and b.p99
        ]
        print(f"{p.name}: probe p99 against quiet: {', '.join(ratios) or 'not measured'}; "
              f"probe uploads accepted: {p.probe_receipts}")  # fmt: skip
    rss = [m for t, m in result.orchestrator_rss if t >= 0] or [0.0]
    growth = result.rss_growth_mib_per_minute
    loop = result.cpu_by_process.get(LOOP, 0.0)
    print(
        f"\norchestrator: {result.orchestrator_cpu:.2f} cores busy (user+sys per wall second; "
        f"its libp2p event loop thread {loop:.2f}); resident {rss[0]:.0f} MiB as the window "
        f"opened, {rss[-1]:.0f} at its end (max {max(rss):.0f}), "
        + ("growth not measured" if growth is None else f"{growth:+.1f} MiB/min after warm-up")
    )
    others = ", ".join(
        f"{name} {cpu:.2f}"
        for name, cpu in result.cpu_by_process.items()
        if name not in ("orchestrator", LOOP)
    )
    print(f"other processes (cores busy): {others}")
    print(
        "most resident in the window (MiB): "
        + ", ".join(f"{name} {mib:.0f}" for name, mib in result.rss_by_process.items())
    )
    c = result.ledger
    verdict = "OK" if c.ok else "FAILED"
    print(
        f"ledger check {verdict}: {c.receipts} receipts, {c.ledger_rows} submissions in the "
        f"ledger; {c.missing} receipted but missing, {c.duplicate_receipts} receipted twice, "
        f"{c.units_mismatch} with other units, {c.orders_answered_twice} orders answered "
        f"twice, {c.unacknowledged} held but never acknowledged ({c.unacknowledged_in_flight} "
        f"of them in flight at the stop; {c.in_flight} in flight), {c.rejected_at_intake} "
        f"rejected at intake, {c.left_unjudged} left unjudged"
    )
    for role, counts in result.attacks.items():
        print(f"{role}: " + ", ".join(f"{k} {v}" for k, v in sorted(counts.items())))
    if result.errors:
        print("retried failures: " + "; ".join(f"{k} ({v})" for k, v in result.errors.items()))
    if result.no_work:
        print("no order, and why: " + "; ".join(f"{k} ({v})" for k, v in result.no_work.items()))
    if result.refused:
        print("refused for good: " + "; ".join(f"{k} ({v})" for k, v in result.refused.items()))
    if result.profile:
        prof = result.profile
        print(f"\nwhere the orchestrator's CPU went ({prof['samples']} py-spy samples):")
        print("  by area: " + ", ".join(f"{k} {v:.0%}" for k, v in prof["areas"].items()))
        print("  by request: " + ", ".join(f"{k} {v:.0%}" for k, v in prof["handlers"].items()))
        for frame, share in prof["top"]:
            print(f"  {share:.1%} {frame}")
    print(
        "\nassumptions: nodes are light py-libp2p hosts (TCP, Noise, yamux, no gossipsub), "
        f"{result.nodes_per_process:.0f} to a trio loop, on this machine with the "
        "orchestrator; their records are made up (no model), written to memory; the chain's "
        "answer to a join is a fixed list (no RPC); the validator is a stand-in that reads "
        "each file and accepts it through the ledger's leases (no prefill, no rewards); "
        "policy step 0 stays published (no weights fetched); the probe is a real node's Host "
        "and Session in the bench's own process."
    )


def main(argv: Sequence[str] = ()) -> None:
    """The benchmark with `argv`'s options (none: the defaults, as `swarmrl bench all`
    runs it)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=200)
    parser.add_argument("--minutes", type=float, default=2.0)
    parser.add_argument("--processes", type=int, default=2)
    parser.add_argument("--rate", type=float, default=None)
    parser.add_argument("--flood-heartbeats", type=float, default=0.0)
    parser.add_argument("--slow-uploads", action="store_true")
    parser.add_argument("--sample-seconds", type=float, default=5.0)
    parser.add_argument("--max-backlog", type=int, default=8)
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--profile", type=Path, default=None)
    args = parser.parse_args(argv)
    options = Options(
        nodes=args.nodes,
        minutes=args.minutes,
        processes=args.processes,
        rate=args.rate,
        flood_heartbeats=args.flood_heartbeats,
        slow_uploads=args.slow_uploads,
        sample_seconds=args.sample_seconds,
        max_backlog=args.max_backlog,
        profile=args.profile,
    )
    print(
        f"{options.nodes} nodes join over {options.ramp_seconds():.0f} s, then "
        f"{options.minutes:g} min measured"
    )
    result = run(options)
    report(result)
    if args.json is not None:
        args.json.write_text(json.dumps(asdict(result), indent=1, default=str))


if __name__ == "__main__":
    main(sys.argv[1:])
