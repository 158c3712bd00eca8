"""`swarmrl node run`: join, pull weights, take orders, generate, prove, submit.

The loop, once started::

    join -> (heartbeat every few seconds, in its own thread)
    resend what the journal holds unacknowledged
    repeat: newest weights (hot-reloaded between orders) -> ask for an order
            -> generate its groups with proofs -> sign -> journal -> submit
            -> keep the receipt

Every failure (orchestrator gone, network gone, a refusal) ends in a bounded,
jittered backoff and a retry from the top, never a tight loop; a write that fails
for want of room holds the node instead (DISK_FULL), until the disk has room. A
worker that hangs is the pool's to end (client.node.work.workers); whatever was
signed waits in the journal until a receipt for it is kept, so a restart or a
SIGKILL loses nothing and a resend is never counted twice (the orchestrator
knows it by digest). A submission the orchestrator refuses for good (its order
expired or went to another node while the orchestrator was down) is settled
with the reason instead, and the node works on.
"""

from __future__ import annotations

import errno
import json
import logging
import os
import statistics
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from client.node.events import Event, EventKind, Listener
from client.node.machine.limits import Limits
from client.node.settings import OUTBOUND_ONLY, ROLE, NodeSettings, load_tasks
from client.node.work.backoff import Backoff
from client.node.work.journal import Entry, Journal
from client.node.work.session import Identity, Session, node_report
from client.node.work.worker import Generation
from client.node.work.workers import (
    STOP_GRACE_SECONDS,
    NodeStoppingError,
    PolicyGoneError,
    WorkersFailingError,
)
from swarmrl.files import claim_data_dir
from swarmrl.locks import exclusive_use
from swarmrl.logs import one_line
from swarmrl.models import choose_backend, resolve_device
from swarmrl.p2p import wire
from swarmrl.p2p.host import Host, RemoteError
from swarmrl.weights.peer_events import Event as SwarmEvent
from swarmrl.weights.peer_events import SwarmEventKind
from swarmrl.work.assign import WorkOrder, WorkResponse
from swarmrl.work.heartbeat import MAX_OUTCOMES, Outcome
from swarmrl.work.states import SubmissionStatus

if TYPE_CHECKING:  # imported where used: a node starts before torch and web3 load
    from eth_account.signers.local import LocalAccount

    from client.node.work.workers import Workers
    from swarmrl.models.backend import Precision
    from swarmrl.rollouts.records import Rollout
    from swarmrl.weights.peer import SwarmNode
    from swarmrl.weights.store import Version
    from swarmrl.work.submit import Receipt, SubmitHeader

log = logging.getLogger("swarmrl.node")

IDLE_SECONDS = 1.0  # a paused loop looks again this often, and at once when told
WEIGHTS_POLL_SECONDS = 1.0  # how soon a wait for weights notices a stop
# What a write that found no room fails with: the disk, or the user's quota on it.
NO_ROOM = frozenset({errno.ENOSPC, errno.EDQUOT})
# Failures the loop waits out and retries; anything else is a bug or bad settings.
RETRIED = (ConnectionError, TimeoutError, RemoteError, wire.WireError, OSError)


def holding_data_dir(data_dir: Path, command: str) -> AbstractContextManager[None]:
    """The node's data dir for this process alone (FolderBusyError naming the holder):
    the daemon holds it while it runs, a command that reads or writes its journal
    while it does not."""
    return exclusive_use(data_dir / ".lock", data_dir, command)


@contextmanager
def sole_runner(settings: NodeSettings, command: str = "swarmrl node run") -> Iterator[None]:
    """Holds the node's data dir and its key for this process alone, or FolderBusyError
    naming the process that has them: two processes on one journal would resend each
    other's work, and two on one key would take turns being the node the orchestrator
    knows (each join replacing the other's)."""
    data_dir, keys = Path(settings.data_dir), Path(settings.keystore_dir)
    with settings.about("data_dir"):
        claim_data_dir(data_dir, ROLE)
    if not keys.is_dir():
        from swarmrl import keystore

        # The key's lock lives beside it: without the folder, say what unlocking would.
        keystore.info(keys, settings.key)
    with (
        holding_data_dir(data_dir, command),
        exclusive_use(keys / f"{settings.key}.lock", f"key {settings.key!r} in {keys}", command),
    ):
        yield


def generated(workers: Workers, generation: Generation) -> list[Rollout]:
    """The records answering an order: what the node's workers generate for it."""
    return workers.records(generation)


def signed(session: Session, order: WorkOrder, step: int, path: Path) -> tuple[SubmitHeader, Path]:
    """The signed header of the submission in ``path`` (answering ``order`` with the
    policy of ``step``), and the file it signs."""
    return session.sign(order, step, path), path


@dataclass(frozen=True)
class Steps:
    """How the node answers the orders it takes, given at its construction: what
    generates (``workers``, in the node's own process; None: a pool of worker processes
    as the settings plan them on this machine), the records it hands in for an order
    (``records``, given the workers and the order as they generate it), the signed
    header it sends them with and the file it sends (``sign``), and whether it answers
    at all (``answers``: False takes each order and holds it to its deadline, never
    loading a policy). The defaults are the node's own work."""

    workers: Workers | None = None
    records: Callable[[Workers, Generation], list[Rollout]] = generated
    sign: Callable[[Session, WorkOrder, int, Path], tuple[SubmitHeader, Path]] = signed
    answers: bool = True


@dataclass
class NodeState:
    """What the node knows now; read by the heartbeat, metrics and the status file."""

    step: int | None = None
    speed: float | None = None
    joined: bool = False
    paused: bool = False
    submitted: int = 0
    accepted_units: int = 0
    rejected: int = 0
    last_rejection: str = ""


class Node:
    def __init__(
        self,
        settings: NodeSettings,
        account: LocalAccount,
        *,
        on_event: Listener | None = None,
        on_state: Callable[[NodeState, int], None] | None = None,
        tasks: dict[str, Any] | None = None,
        steps: Steps | None = None,
    ) -> None:
        self.settings = settings
        self.account = account
        self.steps = steps or Steps()
        self._tasks = tasks  # load_tasks(settings); read at the first order if not given
        self.on_event = on_event or (lambda event: None)
        # Hears the node's state and its peer count after every heartbeat (metrics).
        self.on_state = on_state or (lambda state, peers: None)
        self.data_dir = Path(settings.data_dir)
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self.journal = Journal(self.data_dir / "journal")
        # Rate caps, the transfer quota and the weight store's budget: the swarm and
        # host take its pacers, the daemon its holds and changed settings.
        self.limits = Limits(settings)
        self.outbox = self.data_dir / "outbox"
        self.outbox.mkdir(exist_ok=True)
        self.state = NodeState()
        self.stopping = threading.Event()
        self.finishing = threading.Event()
        self._wake = threading.Event()  # cuts a wait short: a stop, a pause, a resume
        self._threads: int | None = None  # the torch threads taken, once taken
        self.backoff = Backoff(base=1.0, cap=30.0)
        # What generates: started when the loop starts (client.node.work.workers), unless
        # the node was given its workers.
        self.workers: Workers | None = self.steps.workers
        self.backend_step: int | None = None  # the policy step the workers hold
        self.backend_precision: Precision | None = None  # what they compute in
        # The process's one libp2p host: the weight swarm and the work session share it.
        self.host: Host | None = None
        self.swarm: SwarmNode | None = None
        self.session: Session | None = None
        self.heartbeat_seconds = 10.0  # until the orchestrator says otherwise
        # Outcomes already counted; heartbeats repeat the last few, so a short memory does.
        self._outcomes_seen: dict[tuple[str, str], None] = {}
        self._idle = False  # paused, with the order that was in flight handed in
        self._awaiting = ""  # the weights the loop waits for, said for `node status`
        self._no_work = ""  # why the orchestrator last had no order, said once per reason

    @property
    def address(self) -> str:
        return self.account.address

    # ---- setup ------------------------------------------------------------------

    def _identity(self) -> Identity:
        from swarmrl.chain.contracts import Contracts
        from swarmrl.chain.deploy import load_deployment
        from swarmrl.eip712 import pool_domain, swarm_domain

        d = load_deployment(self.settings.deployment)
        provider = Contracts.connect(d).registry.provider_of(self.account.address)
        if provider is None:
            raise ValueError(
                f"node {self.account.address} has no provider on chain; run `swarmrl node init`"
            )
        pool = d.contracts.compute_pool
        self.deployment = d
        return Identity(
            account=self.account,
            provider=provider,
            run=d.run_id,
            swarm_domain=swarm_domain(d.chain_id, pool),
            pool_domain=pool_domain(d.chain_id, pool),
            trusted=frozenset(d.recorders),
        )

    def _start_swarm(self, me: Identity) -> None:
        """Starts the process's host, and on it the weight swarm and the work session."""
        from swarmrl.p2p.identity import load_or_create_peer_key, peer_key_path
        from swarmrl.weights.gossip import swarm_topics
        from swarmrl.weights.peer import SwarmNode

        s = self.settings
        listen = None if s.listen == OUTBOUND_ONLY else s.listen
        peer_key = load_or_create_peer_key(peer_key_path(Path(s.keystore_dir), s.key))
        self.host = Host(
            peer_key,
            listen=listen,
            topics=swarm_topics(me.run),
            upload_pacer=self.limits.uploads,
        )
        try:
            self.swarm = SwarmNode(
                self.host,
                store=self.limits.weight_store(self.data_dir / "weights"),
                domain=me.swarm_domain,
                run=me.run,
                trusted=me.trusted,
                account=self.account,
                download_pacer=self.limits.downloads,
                upload_pacer=self.limits.uploads,
                on_event=self._on_swarm_event,
            )
        except BaseException:
            self.host.close()
            raise
        assert s.orchestrator is not None
        self.orchestrator_peer = s.orchestrator.rsplit("/p2p/", 1)[1]
        self.session = Session(self.host, self.orchestrator_peer, me)

    def _on_swarm_event(self, event: SwarmEvent) -> None:
        if event.kind is SwarmEventKind.ANNOUNCED:
            self.on_event(Event(EventKind.WEIGHTS_ANNOUNCED, step=event.step))
        elif event.kind is SwarmEventKind.PROGRESS and event.progress is not None:
            p = event.progress
            self.on_event(
                Event(EventKind.WEIGHTS_PROGRESS, step=event.step, done=p.held, total=p.total)
            )
        elif event.kind is SwarmEventKind.READY:
            self.on_event(Event(EventKind.WEIGHTS_READY, step=event.step))
        elif event.kind is SwarmEventKind.REACHABLE:
            self.on_event(Event(EventKind.SERVING, extra={"data": event.detail}))

    def _connect_and_join(self) -> None:
        assert self.session is not None
        assert self.host is not None
        assert self.swarm is not None
        assert self.settings.orchestrator is not None
        if self.orchestrator_peer not in self.host.peers():
            self.swarm.join(self.settings.orchestrator)
        for addr in self.settings.bootstrap:
            try:
                self.swarm.join(addr)
            except (ConnectionError, TimeoutError) as e:
                log.info("bootstrap peer %s unreachable: %s", addr, e)
        device = resolve_device(self.settings.device)
        backend = choose_backend(self.settings.backend, self.settings.device)
        workers = self.workers.count if self.workers is not None else 1
        response = self.session.join(node_report(backend, device, workers))
        self.state.joined = True
        self.heartbeat_seconds = response.heartbeat_seconds
        # A download the orchestrator would still take work from is finished, not dropped.
        self.swarm.window = response.async_level
        self.on_event(
            Event(EventKind.JOINED, step=response.policy_step, extra={"state": response.state})
        )

    # ---- the loop -----------------------------------------------------------------

    def run(self) -> None:
        try:
            self.workers = self._start_workers()
        except NodeStoppingError:  # told to stop while the workers started
            self.on_event(Event(EventKind.STOPPED))
            return
        self.on_event(Event(EventKind.WORKERS, total=self.workers.count))
        try:
            me = self._identity()
            self._start_swarm(me)
        except BaseException:
            self.workers.close()
            raise
        beat = threading.Thread(target=self._heartbeats, name="swarmrl-heartbeat", daemon=True)
        try:
            while not self.stopping.is_set():
                try:
                    # Paused, the node neither joins nor sends: it holds the machine's
                    # network too. A finish drains even so.
                    self._take_threads()
                    if not self.finishing.is_set() and self._paused():
                        self._sleep(IDLE_SECONDS)
                        continue
                    if not self.state.joined:
                        self._connect_and_join()
                        if not beat.is_alive():
                            beat.start()
                    self._resend()
                    if self.finishing.is_set():
                        self._leave()
                        break
                    self._one_order()
                    self.backoff.reset()
                except RETRIED as e:
                    if isinstance(e, OSError) and e.errno in NO_ROOM:
                        self._out_of_room(e)
                        continue
                    delay = self.backoff.next_delay()
                    reason = _waiting_reason(e, self.state.joined)
                    if not _local(e):
                        # Dialling and joining again is cheap and idempotent; after a
                        # failure the orchestrator may have restarted or forgotten the
                        # connection.
                        self.state.joined = False
                    self.on_event(
                        Event(EventKind.RETRY, reason=reason, extra={"wait": f"{delay:.1f}s"})
                    )
                    self._sleep(delay)
                except WorkersFailingError as e:
                    # Restarting them again would only burn the machine: the owner looks.
                    self.state.paused = True
                    self.on_event(Event(EventKind.FAILING, reason=one_line(e)))
                except NodeStoppingError as e:  # what was in flight is given up
                    log.warning("stopped: %s", one_line(e))
                except PolicyGoneError as e:  # its order expires; the next is at hand
                    log.warning("%s", one_line(e))
        finally:
            self.stopping.set()
            self.workers.close()
            self.on_event(Event(EventKind.STOPPED))
            if self.swarm is not None:
                self.swarm.close()
            if self.host is not None:
                self.host.close()
            self.limits.close()

    def apply(self, settings: NodeSettings) -> None:
        """Settings changed while the node runs (the live keys of client.node.daemon.reload);
        the loop takes them up before its next order."""
        self.settings = settings
        self._wake.set()

    def _take_threads(self) -> None:
        """The threads the settings give, set from the loop's own thread (torch's thread
        count is the calling thread's to set), and shared among the workers."""
        threads = thread_count(self.settings)
        if threads != self._threads:
            from swarmrl.cores import take_threads

            take_threads(threads)
            if self._threads is not None and self.workers is not None:
                self.workers.threads(threads)
            self._threads = threads

    def _sleep(self, seconds: float) -> None:
        """Waits `seconds`, or less if told to stop, pause, resume or finish meanwhile."""
        if not self.stopping.is_set():
            self._wake.wait(seconds)
        self._wake.clear()

    def stop(self) -> None:
        """Ends the loop once the order in flight is handed in (or journaled), or given
        up after STOP_GRACE_SECONDS (a hung worker does not hold the stop)."""
        self.stopping.set()
        if self.workers is not None:
            self.workers.stop(STOP_GRACE_SECONDS)
        self._wake.set()

    def waiting(self) -> list[str]:
        """What the node waits for now, one line each (`node status`): its workers'
        requests in flight, or weights it waits to arrive."""
        lines = self.workers.waiting() if self.workers is not None else []
        return lines + ([self._awaiting] if self._awaiting else [])

    def finish(self) -> None:
        """Drains: the order in flight is handed in, then what the journal holds, then
        the orchestrator is told the node leaves, and the loop ends. Until everything is
        sent the loop keeps trying (a stop ends it sooner; the journal keeps the rest)."""
        self.finishing.set()
        self._wake.set()

    def _leave(self) -> None:
        assert self.session is not None
        self.stopping.set()  # the heartbeat thread beats no more after the leave
        self.session.heartbeat(self.state.step, self.state.speed, paused=True, leaving=True)
        self.state.joined = False
        self.on_event(Event(EventKind.LEFT))

    def pause(self) -> None:
        """Takes no new order; the one in flight is still generated and handed in."""
        self.state.paused = True
        self._wake.set()

    def resume(self) -> None:
        self.state.paused = False
        if self.workers is not None:
            self.workers.forgive()
        self._wake.set()

    def _paused(self) -> bool:
        """Whether to stay idle; the loop says once when it goes idle and once when it
        takes work again (only the loop knows when the order in flight is done)."""
        paused = self.state.paused
        if paused != self._idle:
            self._idle = paused
            self.on_event(Event(EventKind.PAUSED if paused else EventKind.RESUMED))
        return paused

    def _heartbeats(self) -> None:
        while not self.stopping.wait(self.heartbeat_seconds):
            if self.session is None or self.host is None:
                continue
            try:
                response = self.session.heartbeat(
                    self.state.step, self.state.speed, self.state.paused
                )
            except RETRIED as e:
                log.info("heartbeat failed: %s", one_line(e))
                continue
            for outcome in response.outcomes:
                self._note_outcome(outcome)
            self.on_state(self.state, len(self.host.peers()))

    def _note_outcome(self, outcome: Outcome) -> None:
        key = (outcome.digest, outcome.status)
        if key in self._outcomes_seen or outcome.status is SubmissionStatus.RECEIVED:
            return
        self._outcomes_seen[key] = None
        if len(self._outcomes_seen) > 8 * MAX_OUTCOMES:
            del self._outcomes_seen[next(iter(self._outcomes_seen))]
        if outcome.status is SubmissionStatus.ACCEPTED:
            self.state.accepted_units += outcome.units
        else:
            self.state.rejected += 1
            self.state.last_rejection = outcome.reason
        self.on_event(
            Event(
                EventKind.OUTCOME,
                digest=outcome.digest[:12],
                units=outcome.units,
                reason=outcome.reason,
                extra={"status": outcome.status},
            )
        )

    def _resend(self) -> None:
        for entry in self.journal.pending():
            receipt = self._hand_in(entry)
            if receipt is not None:
                self.on_event(
                    Event(EventKind.RESENT, digest=entry.digest[:12], units=receipt.units)
                )

    def _hand_in(self, entry: Entry, header: SubmitHeader | None = None) -> Receipt | None:
        """Sends a journaled submission and settles its entry with the answer: its receipt
        (returned), or the orchestrator's refusal for good (kept with its reason; None).
        A failure that a later try may get past raises, and the entry waits to be resent.
        ``header``: the entry's signed header as the node made it (else read from the
        entry, as the journal stored it)."""
        assert self.session is not None
        from swarmrl.work.submit import SubmitHeader

        if header is None:
            header = SubmitHeader.model_validate(entry.header)
        answer = self.session.submit(header, entry.file)
        if answer.receipt is None:
            self.journal.refuse(entry, answer.refused)
            self.on_event(Event(EventKind.REFUSED, digest=entry.digest[:12], reason=answer.refused))
            return None
        self.journal.settle(entry.digest, answer.receipt.model_dump())
        return answer.receipt

    def _weights(self, at_least: int, precision: Precision) -> Path:
        """The newest complete weights, at least step ``at_least``, loaded into the backend
        in ``precision``."""
        version = self._wait_for_weights(at_least)
        model_dir = version.files_dir
        if not (model_dir / "config.json").is_file():
            raise OSError(f"the version of step {version.step} is not a model directory")
        self._hold(model_dir, version.step, precision)
        return model_dir

    def _wait_for_weights(self, at_least: int) -> Version:
        """The newest complete version, once one of step ``at_least`` or later is;
        TimeoutError after weights_timeout, NodeStoppingError once the node stops."""
        assert self.swarm is not None
        timeout = self.settings.weights_timeout
        deadline = time.monotonic() + timeout
        self._awaiting = f"the policy of step {at_least} or later, from the swarm"
        try:
            while True:
                if self.stopping.is_set():
                    raise NodeStoppingError(f"stopped waiting for {self._awaiting}")
                left = deadline - time.monotonic()
                try:
                    return self.swarm.wait_for(
                        step=at_least, timeout=max(0.0, min(left, WEIGHTS_POLL_SECONDS))
                    )
                except TimeoutError:
                    if left <= WEIGHTS_POLL_SECONDS:
                        raise
        finally:
            self._awaiting = ""

    def _out_of_room(self, error: OSError) -> None:
        """A write of the node's failed for want of room: the node holds itself (the
        daemon's DISK_FULL) until the disk has room, rather than waiting on the network
        and generating the same order again into a disk that takes none of it."""
        detail = self.limits.out_of_room(one_line(error))
        self.state.paused = True
        self.on_event(Event(EventKind.NO_ROOM, reason=detail))

    def _hold(self, model_dir: Path, step: int, precision: Precision) -> None:
        """The workers hold the policy in ``model_dir`` (of ``step``) in ``precision``."""
        assert self.workers is not None  # started before anything is held
        self.workers.hold(model_dir, step, precision)
        self.backend_step, self.backend_precision = step, precision
        self.state.step = step

    def _device_precision(self) -> Precision:
        return "bf16" if resolve_device(self.settings.device).startswith("cuda") else "fp32"

    def _start_workers(self) -> Workers:
        """The workers the node was given, or a worker process per GPU group (or per
        cpu_workers), as the settings plan them on this machine; one sentence when the
        machine cannot run them."""
        from client.node.work.workers import Pool, engine, plan_here

        if self.steps.workers is not None:
            return self.steps.workers

        backend = choose_backend(self.settings.backend, self.settings.device)
        plans = plan_here(
            self.settings, device=resolve_device(self.settings.device), backend=backend
        )
        cap = self.settings.worker_memory_gib
        pool = Pool(
            plans,
            backend=backend,
            engine=engine(self.settings),
            log_dir=self.data_dir,
            outbox=self.outbox,
            memory_cap_bytes=None if cap is None else int(cap * 2**30),
            max_exits=self.settings.worker_exits,
        )
        self.workers = pool  # a stop while they start ends their start too
        if self.stopping.is_set():
            pool.stop(STOP_GRACE_SECONDS)
        try:
            pool.start()
        except BaseException:
            pool.close()
            raise
        return pool

    def _one_order(self) -> None:
        if not self.steps.answers:
            self._hold_order()
            return
        assert self.session is not None
        assert self.swarm is not None
        # Loaded before an order is taken (its deadline runs while it is worked on), in the
        # last order's precision; before the first, in the one runs declare for nodes on
        # this device (bf16 on a GPU), so a node reloads only where its run says otherwise.
        self._weights(0, self.backend_precision or self._device_precision())
        response = self.session.work()
        if response.order is None:
            self._wait_for_work(response)
            return
        self._no_work = ""
        order = response.order
        if self.backend_step is None or self.backend_step < order.min_step:
            self._weights(order.min_step, order.precision)
        else:
            # Hot reload between orders: a newer complete version replaces the policy.
            latest = self.swarm.store.latest()
            if latest is not None and latest.step > (self.backend_step or -1):
                self._weights(latest.step, order.precision)
            elif self.backend_precision != order.precision:
                self._weights(self.backend_step, order.precision)
        order_id = order.digest(self.session.me.swarm_domain).hex()
        self.on_event(
            Event(
                EventKind.ORDER,
                step=self.backend_step,
                order=order_id[:12],
                total=len(order.tasks) * order.group_size,
            )
        )
        path, cost = self._generate(order, order_id)
        header, path = self.steps.sign(self.session, order, self.backend_step or 0, path)
        digest = self.session.digest(header)
        if self.journal.settled(digest):
            # The same order, redrawn and regenerated bit for bit, was settled before:
            # nothing new to hand in.
            path.unlink(missing_ok=True)
            return
        entry = self.journal.add(order_id, digest, header.model_dump(), path)
        path.unlink(missing_ok=True)  # the journal holds its own copy
        sent = time.perf_counter()
        receipt = self._hand_in(entry, header)
        if receipt is None:
            return
        self._note_cost(
            {**cost, "digest": digest, "units": receipt.units},
            submit_seconds=time.perf_counter() - sent,
        )
        self.state.submitted += 1
        self.on_event(
            Event(
                EventKind.SUBMITTED, digest=digest[:12], units=receipt.units, reason=receipt.reason
            )
        )

    def _wait_for_work(self, response: WorkResponse) -> None:
        """No order now: says why (once while the reason stays the same), then waits as
        long as the orchestrator asks, never less than half a second."""
        wait = max(0.5, response.retry_after)
        if response.reason != self._no_work:
            self._no_work = response.reason
            self.on_event(
                Event(EventKind.NO_WORK, reason=response.reason, extra={"wait": f"{wait:.0f}s"})
            )
        self._sleep(wait)

    def _hold_order(self) -> None:
        """Takes an order, answering none: holds it to its deadline, then asks for the
        next."""
        assert self.session is not None
        response = self.session.work()
        if response.order is None:
            self._wait_for_work(response)
            return
        self.stopping.wait(max(0.5, response.order.deadline - time.time() + 1))

    def _generate(self, order: WorkOrder, order_id: str) -> tuple[Path, dict[str, float]]:
        """The order's rollouts in a file of the outbox, and what making them cost."""
        from swarmrl.rollouts.records import write_rollouts

        assert self.workers is not None  # started before any order
        # The workers' CPU, math-verify's that scores their rewards included.
        began, cpu = time.perf_counter(), self.workers.cpu_seconds()
        generation = Generation(
            order,
            self.tasks,
            node=self.account.address,
            step=self.backend_step or 0,
            batch_size=self.settings.max_batch,
        )
        records = self.steps.records(self.workers, generation)
        seconds = time.perf_counter() - began
        cost = {
            "rollouts": len(records),
            "generate_cpu_seconds": self.workers.cpu_seconds() - cpu,
            "generate_seconds": seconds,
        }
        tokens = sum(len(r.output_ids) for r in records)
        self.state.speed = tokens / max(seconds, 1e-9)
        path = self.outbox / f"{order_id}.parquet"
        write_rollouts(records, path)
        self.on_event(
            Event(
                EventKind.GENERATED,
                extra={"tokens": str(tokens)},
                rollouts=len(records),
                tokens_per_second=self.state.speed,
                reward=statistics.fmean(r.task_reward for r in records),
                step=self.backend_step,
            )
        )
        return path, cost

    def _note_cost(self, cost: dict[str, Any], submit_seconds: float) -> None:
        """One line per submission in ``costs.jsonl``: what generating and handing in cost
        (``swarmrl bench swarm`` reads it)."""
        line = {**cost, "submit_seconds": submit_seconds}
        with (self.data_dir / "costs.jsonl").open("a") as f:
            f.write(json.dumps(line) + "\n")

    @property
    def tasks(self) -> dict[str, Any]:
        if self._tasks is None:
            self._tasks = load_tasks(self.settings)
        return self._tasks


def _waiting_reason(e: BaseException, joined: bool) -> str:
    """The reason line while a failure is waited out: what kind of trouble, then its
    sentence."""
    from swarmrl.work.join import IncompatibleVersionError

    if isinstance(e, IncompatibleVersionError):
        return f"incompatible version: {one_line(e)}"
    if isinstance(e, RemoteError):
        return f"{'refused' if joined else 'not joined'}: {one_line(e)}"
    if _local(e):
        return f"failed on this machine: {one_line(e)}"
    if isinstance(e, ConnectionError | TimeoutError):
        return f"orchestrator unreachable: {one_line(e)}"
    return one_line(e)


def _local(e: BaseException) -> bool:
    """Whether a failure is this machine's (a file it could not write or read, a worker's
    error), not the network's: the host raises every network failure as ConnectionError
    or TimeoutError."""
    return isinstance(e, OSError) and not isinstance(e, ConnectionError | TimeoutError)


def thread_count(settings: NodeSettings) -> int:
    return settings.threads or len(os.sched_getaffinity(0))
