"""The work server: the orchestrator's side of the work protocols. It admits nodes
(join), keeps their liveness (heartbeat), issues signed work orders (work) and takes
in their submissions (submit, the intake).

Every handler runs in one of the host's worker threads and takes nothing a peer
sent on trust. Cheap checks come first and answer at once; a submission is
written to the ledger (and its file to the data dir) before the receipt goes
out, so an acknowledged submission survives any crash, and a resend is
recognised by its digest and answered with the same receipt. What costs model
time (prefill, rewards) is the validator process's work, later.

Sized for a thousand nodes: heartbeats are gathered in memory and written by the
daemon's once-a-second sweep in one transaction (state changes are still written at
once); a submission body gets an upload slot only once its header shows an open
order's answer, one upload at a time per peer, at a minimum pace (the host's
``serve_upload``); and an order's size follows its node's speed (``scheduler``).
"""

from __future__ import annotations

import logging
import shutil
import statistics
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from eth_account.signers.local import LocalAccount
from eth_utils import to_checksum_address

from orchestrator.service.ledger import Ledger
from orchestrator.service.ledger.nodes import NodeRow, Seen
from orchestrator.service.ledger.orders import OrderRow
from orchestrator.service.ledger.submissions import OrderNotOpenError, SubmissionRow
from orchestrator.service.ledger.transitions import allowed
from orchestrator.service.scheduler import budget_for, cooldown, draw_order, prompts_for
from orchestrator.service.settings import OrchestratorSettings
from swarmrl.eip712 import Domain
from swarmrl.files import fsync
from swarmrl.p2p import wire
from swarmrl.p2p.protocol import Server
from swarmrl.rollouts import checks
from swarmrl.tasks import Task
from swarmrl.work import WORK_PROTOCOL, assign, heartbeat, join, submit
from swarmrl.work.assign import WORK, WorkOrder
from swarmrl.work.heartbeat import HEARTBEAT
from swarmrl.work.join import JOIN
from swarmrl.work.states import NodeState, OrderState, SubmissionStatus
from swarmrl.work.submit import SUBMIT

log = logging.getLogger("swarmrl.orchestrator")

# Requests per peer and second, sustained, and the burst allowed above it.
RATE_PER_SECOND = 5.0
RATE_BURST = 20.0
# Submission bodies taken at once. Each is one node's (one upload at a time per peer),
# arrives at the submit spec's pace or is cut, and is at most its body limit on disk.
UPLOAD_SLOTS = 32


class ChainView:
    """What intake asks the chain about a joining node (a Protocol in the daemon)."""

    def standing(self, node: str, provider: str) -> str | None:  # pragma: no cover
        """None if `node` may work for `provider`, else the sentence why not."""
        raise NotImplementedError


@dataclass
class _Bucket:
    tokens: float = RATE_BURST
    updated: float = field(default_factory=time.monotonic)


class RateLimiter:
    """A token bucket per peer: a flood from one peer is refused without work."""

    def __init__(self, rate: float = RATE_PER_SECOND, burst: float = RATE_BURST) -> None:
        self.rate, self.burst = rate, burst
        self._buckets: dict[str, _Bucket] = {}
        self._lock = threading.Lock()

    def allow(self, peer: str) -> bool:
        now = time.monotonic()
        with self._lock:
            if len(self._buckets) > 10_000:  # forget idle peers rather than grow forever
                self._buckets = {p: b for p, b in self._buckets.items() if now - b.updated < 60}
            bucket = self._buckets.setdefault(peer, _Bucket(self.burst, now))
            bucket.tokens = min(self.burst, bucket.tokens + (now - bucket.updated) * self.rate)
            bucket.updated = now
            if bucket.tokens < 1:
                return False
            bucket.tokens -= 1
            return True


# The states whose nodes send heartbeats: what the swarm's heartbeat rate counts.
_BEATING = (NodeState.JOINED, NodeState.ACTIVE, NodeState.SILENT)


def heartbeat_interval(settings: OrchestratorSettings, nodes: int) -> float:
    """How often each of `nodes` nodes is to beat: `heartbeat_seconds`, or longer so that
    together they send at most `heartbeat_rate` a second. At a thousand nodes every ten
    seconds, heartbeats were 100 of the 175 streams a second the orchestrator's event
    loop served (docs/benchmarks/load.md, "Control plane under load"), time taken from uploads.
    Never so long that `silent_after` missed beats reach `gone_after`."""
    wanted = max(settings.heartbeat_seconds, nodes / settings.heartbeat_rate)
    longest = max(settings.heartbeat_seconds, settings.gone_after / (settings.silent_after + 1))
    return min(wanted, longest)


@dataclass(frozen=True)
class RunContext:
    """Who this orchestrator is in which run."""

    run: str  # the deployment's run id, 0x + 64 hex: what every record names
    swarm_domain: Domain
    pool_domain: Domain
    signer: LocalAccount  # signs work orders and receipts


class WorkServer:
    """The four protocol handlers, over one ledger."""

    def __init__(
        self,
        settings: OrchestratorSettings,
        context: RunContext,
        ledger: Ledger,
        tasks: Mapping[str, Task],
        chain: ChainView,
        *,
        published_step: Callable[[], int | None],
        backlog: Callable[[], int],
        weights_addrs: Callable[[], list[str]],
        clock: Callable[[], float] = time.time,
    ) -> None:
        """``clock``: unix seconds now (orders' deadlines, nodes' cooldowns, receipts'
        epochs); tests move it."""
        self.settings = settings
        self.context = context
        self.ledger = ledger
        self.tasks = dict(tasks)
        self.task_list = sorted(self.tasks.values(), key=lambda t: t.problem_id)
        self.chain = chain
        self.published_step = published_step
        self.backlog = backlog
        self.weights_addrs = weights_addrs
        self.clock = clock
        self.limiter = RateLimiter()
        self.submissions_dir = Path(settings.data_dir) / "submissions"
        self.submissions_dir.mkdir(parents=True, exist_ok=True)
        self._node_locks: dict[str, threading.Lock] = {}  # one per node that asked for work
        self._node_locks_lock = threading.Lock()
        self._orphan_lock = threading.Lock()
        # Heartbeats since the last sweep, by node: a thousand nodes' every few seconds
        # would otherwise be as many ledger transactions.
        self._seen: dict[str, Seen] = {}
        self._seen_lock = threading.Lock()
        # The active nodes' median speed, as of the last sweep: what order sizes are
        # measured against (None until a node reports one).
        self._median_speed: float | None = None
        # The heartbeat interval a joining node is told, as of the last sweep, and the
        # longest told so far: silence is judged by that one, so a node told a long
        # interval when the swarm was larger is not counted silent when it shrinks.
        self._interval = settings.heartbeat_seconds
        self._longest_interval = settings.heartbeat_seconds

    def serve(self, host: Server, spool_dir: Path) -> None:
        """Serves the four protocols on `host`, every request admitted by the rate limit
        first; submitted files are spooled into `spool_dir`."""
        host.serve(JOIN, self.join, admit=self.admit)
        host.serve(HEARTBEAT, self.heartbeat, admit=self.admit)
        host.serve(WORK, self.work, admit=self.admit)
        host.serve_upload(
            SUBMIT,
            _Submissions(self),
            spool_dir=spool_dir,
            admit=self.admit_upload,
            max_uploads=UPLOAD_SLOTS,
        )

    # ---- helpers -----------------------------------------------------------------

    def admit(self, peer: str) -> None:
        """Refuses a peer that sends too much, before a byte of its request is parsed
        (the admit gate of every protocol intake serves)."""
        if not self.limiter.allow(peer):
            raise wire.Refusal("too many requests from this peer; slow down")

    def admit_upload(self, peer: str) -> None:
        """The admit gate of submit: the rate limit, then only a joined node's peer, before
        a byte of its header is read. (The host gives a peer one upload at a time, and a
        body slot only once `check_submission` wants the body: an open order's answer.)"""
        self.admit(peer)
        self._node(peer)

    def _node(self, peer: str) -> NodeRow:
        node = self.ledger.nodes.by_peer(peer)
        if node is None:
            raise wire.Refusal("this peer has not joined; send a join request first")
        if node.state is NodeState.BANNED:
            raise wire.Refusal(f"node {node.address} is banned from this run")
        return node

    # ---- join ----------------------------------------------------------------------

    def join(self, peer: str, claim: join.JoinClaim) -> join.JoinResponse:
        # First: a node of another release may sign or mean the rest differently, and
        # what it needs to hear is which release to run.
        if claim.report.protocol != WORK_PROTOCOL:
            log.info("refused a join from peer %s of work protocol %d (%s)",
                     peer, claim.report.protocol, claim.report.version)  # fmt: skip
            raise wire.Refusal(join.version_refusal(claim.report))
        if claim.peer_id != peer:
            raise wire.WireError(f"the join claim names peer {claim.peer_id}, not the sender")
        try:
            claim.check_signer(self.context.swarm_domain, claim.node, "join claim")
        except ValueError as e:
            raise wire.WireError(str(e)) from None
        now = self.clock()
        if abs(now - claim.issued_at) > join.MAX_CLOCK_SKEW:
            raise wire.WireError(
                "the join claim's time is more than 10 minutes off; check the clock"
            )
        node_address = to_checksum_address(claim.node)
        known = self.ledger.nodes.get(node_address)
        if known is not None and known.state is NodeState.BANNED:
            raise wire.Refusal(f"node {node_address} is banned from this run")
        if why := self.chain.standing(node_address, to_checksum_address(claim.provider)):
            raise wire.Refusal(why)
        self.ledger.nodes.join(
            node_address,
            to_checksum_address(claim.provider),
            peer,
            claim.report.backend,
            claim.report.model_dump(),
            now,
        )
        if known is not None and allowed(known.state, NodeState.JOINED):  # silent or gone
            self.ledger.nodes.set_state(node_address, NodeState.JOINED, "joined again", now)
        state = self.ledger.nodes.get(node_address)
        assert state is not None  # just written
        r = claim.report
        log.info("node %s joined from peer %s (%s, %d worker%s, %s)", node_address, peer,
                 r.device, r.workers, "s" if r.workers > 1 else "", r.version)  # fmt: skip
        interval = self._interval
        self._longest_interval = max(self._longest_interval, interval)
        return join.JoinResponse(
            run=self.context.run,
            protocol=WORK_PROTOCOL,
            state=state.state,
            heartbeat_seconds=interval,
            policy_step=self.published_step(),
            async_level=self.settings.async_level,
            weights=self.weights_addrs()[:8],
        )

    # ---- heartbeat -------------------------------------------------------------------

    def heartbeat(
        self, peer: str, request: heartbeat.HeartbeatRequest
    ) -> heartbeat.HeartbeatResponse:
        node = self._node(peer)
        now = self.clock()
        if request.leaving:
            state = self._leave(node, now)
        else:
            self._alive(node.address, now, request.tokens_per_second)
            state = node.state
            if allowed(state, NodeState.ACTIVE) and self.ledger.nodes.set_state(
                node.address, NodeState.ACTIVE, "heartbeat", now
            ):
                state = NodeState.ACTIVE
        recent = self.ledger.submissions.latest(node.address, heartbeat.MAX_OUTCOMES)
        return heartbeat.HeartbeatResponse(
            state=state,
            policy_step=self.published_step(),
            epoch=self.ledger.epochs.at(now, self.settings.epoch_seconds),
            outcomes=[
                heartbeat.Outcome(
                    digest=s.digest, status=s.status, units=s.units, reason=s.reason[:300]
                )
                for s in recent
            ],
        )

    def _leave(self, node: NodeRow, now: float) -> NodeState:
        """A node that says it leaves is gone at once: it gets no order, and its silence is
        no longer watched. What it still holds expires now, so the next node that asks for
        work takes the tasks over instead of waiting out the deadline. Its state after."""
        state = node.state
        if self.ledger.nodes.set_state(node.address, NodeState.GONE, "left", now):
            state = NodeState.GONE
        for expired in self.ledger.orders.expire_for(node.address):
            log.info("order %s of %s expired: its node left", expired.order_id[:12], node.address)
        return state

    def _alive(self, address: str, now: float, speed: float | None = None) -> None:
        """`address` was heard from at `now`: kept in memory, written with the others'
        by the next sweep. Work requests and submissions count as much as heartbeats:
        under load a busy node's heartbeats are what times out, and its work shows it
        alive anyway."""
        with self._seen_lock:
            earlier = self._seen.get(address)
            if speed is None and earlier is not None:
                speed = earlier.speed
            self._seen[address] = Seen(now, speed)

    def sweep(self, now: float) -> None:
        """The daemon's once-a-second round: the heartbeats gathered since the last one
        written to the ledger in one transaction, the active nodes' median speed taken
        (order sizes follow it), orders past their deadline expired,
        and nodes quiet too long made silent, then gone (the transition table says from
        which states: a banned node stays banned)."""
        self.flush()
        speeds = self.ledger.nodes.speeds(NodeState.ACTIVE)
        self._median_speed = statistics.median(speeds) if speeds else None
        counts = self.ledger.nodes.by_state()
        beating = sum(counts.get(state, 0) for state in _BEATING)
        self._interval = heartbeat_interval(self.settings, beating)
        for expired in self.ledger.orders.expire(now):
            log.info("order %s of %s expired unanswered", expired.order_id[:12], expired.order.node)
        s = self.settings
        silent_after = s.silent_after * self._longest_interval
        for address, state, last_seen in self.ledger.nodes.quiet(
            now - min(silent_after, s.gone_after)
        ):
            with self._seen_lock:  # a heartbeat that came after the flush above
                if address in self._seen:
                    continue
            quiet = now - last_seen
            if quiet > silent_after and allowed(state, NodeState.SILENT):
                self.ledger.nodes.set_state(address, NodeState.SILENT, "missed heartbeats", now)
            elif quiet > s.gone_after and allowed(state, NodeState.GONE):
                self.ledger.nodes.set_state(
                    address, NodeState.GONE, f"silent for {quiet:.0f} s", now
                )

    def flush(self) -> None:
        """Writes the heartbeats gathered in memory to the ledger, in one transaction. A
        heartbeat is not acknowledged work: what a crash loses of them is at most one
        sweep's worth (a second), far inside the silence a node is allowed."""
        with self._seen_lock:
            seen, self._seen = self._seen, {}
        if seen:
            self.ledger.nodes.touch(seen)

    def close(self) -> None:
        """Writes what is still in memory; the ledger stays open (its owner closes it)."""
        self.flush()

    # ---- work ------------------------------------------------------------------------

    def work(self, peer: str, request: assign.WorkRequest) -> assign.WorkResponse:
        node = self._node(peer)
        if node.state not in (NodeState.ACTIVE, NodeState.JOINED):
            raise wire.Refusal(f"node {node.address} is {node.state}; send a heartbeat first")
        self._alive(node.address, self.clock())
        with self._lock_of(node.address):  # one order at a time per node, nodes side by side
            now = self.clock()
            # An open order first: a node whose reply was lost gets it again, whatever
            # else has changed, rather than have it expire against its standing.
            issued = self.ledger.orders.open_for(node.address)
            if issued is not None and issued.order.deadline > now:
                return assign.WorkResponse(order=issued.order)
            if held_back := self._held_back(node, now):
                return held_back
            step = self.published_step()
            if step is None:
                return _no_work(2.0, "no policy is published yet")
            if step >= self.settings.steps:
                return _no_work(60.0, f"the run has trained all its {self.settings.steps} steps")
            # Each validator worker drains its own share of the backlog.
            if self.backlog() >= self.settings.max_backlog * self.settings.validator_workers:
                return _no_work(2.0, "the validator and trainer are catching up")
            order = self._new_order(node, step, now)
        return assign.WorkResponse(order=order)

    def _lock_of(self, address: str) -> threading.Lock:
        with self._node_locks_lock:
            return self._node_locks.setdefault(address, threading.Lock())

    def _held_back(self, node: NodeRow, now: float) -> assign.WorkResponse | None:
        """No work, and why, for a node in its cooldown for abandoning orders (see
        ``scheduler.cooldown``); None for any other."""
        s = self.settings
        abandoned = self.ledger.orders.abandoned(node.address)
        wait = cooldown(abandoned.count, limit=s.abandon_limit, first=s.abandon_cooldown)
        left = abandoned.last_deadline + wait - now
        if wait == 0 or left <= 0:
            return None
        log.info("node %s gets no work for %.0f s: it abandoned its last %d orders",
                 node.address, left, abandoned.count)  # fmt: skip
        return _no_work(
            min(left, assign.MAX_RETRY_AFTER),
            f"node {node.address} left its last {abandoned.count} work orders unanswered past "
            f"their deadlines, so it gets no new work for {left:.0f} s; answering the next "
            "one it gets starts the count over",
        )

    def _new_order(self, node: NodeRow, step: int, now: float) -> WorkOrder:
        s = self.settings
        counter = self.ledger.orders.next_counter(node.address)
        with self._seen_lock:  # the newest speed, before the sweep writes it
            seen = self._seen.get(node.address)
        speed = node.speed if seen is None or seen.speed is None else seen.speed
        prompts = prompts_for(speed, self._median_speed, base=s.prompts_per_assignment)
        budget = budget_for(
            speed,
            base=s.target_len,
            max_tokens=s.max_tokens,
            sequences=prompts * s.group_size,
            seconds=s.assignment_seconds,
        )
        # Tasks a node left unanswered go to another node first. Looked at without a
        # lock (there rarely are any), then again under one, so that of two nodes only
        # one takes them over.
        if self.ledger.orders.orphaned(excluding=node.address) is None:
            return self._issue(node, step, now, counter, prompts, budget, None)
        with self._orphan_lock:
            orphan = self.ledger.orders.orphaned(excluding=node.address)
            if orphan is not None and any(
                t.problem_id not in self.tasks for t in orphan.order.tasks
            ):
                log.info("expired order %s names tasks no longer in the task set; dropped",
                         orphan.order_id[:12])  # fmt: skip
                self.ledger.orders.set_state(orphan.order_id, OrderState.DROPPED)
                orphan = None
            return self._issue(node, step, now, counter, prompts, budget, orphan)

    def _issue(
        self,
        node: NodeRow,
        step: int,
        now: float,
        counter: int,
        prompts: int,
        budget: int,
        orphan: OrderRow | None,
    ) -> WorkOrder:
        """The node's order `counter`, drawn (or `orphan`'s tasks), signed and stored."""
        s = self.settings
        drawn = draw_order(
            self.task_list,
            run=self.context.run,
            node=node.address,
            step=step,
            counter=counter,
            prompts=prompts,
            budget=budget,
            taken_over=None if orphan is None else [t.problem_id for t in orphan.order.tasks],
        )
        order = WorkOrder(
            run=self.context.run,
            node=node.address,
            counter=counter,
            min_step=max(0, step - s.async_level),
            seed=drawn.seed,
            group_size=s.group_size,
            max_tokens=s.max_tokens,
            temperature=s.temperature,
            top_p=s.top_p,
            precision=s.precision,
            tasks=drawn.tasks,
            deadline=int(now + s.assignment_seconds),
        ).signed_by(self.context.signer, self.context.swarm_domain)
        self.ledger.orders.add(
            order.digest(self.context.swarm_domain).hex(),
            order,
            now,
            takes_over=None if orphan is None else orphan.order_id,
        )
        if orphan is not None:
            log.info("%s takes over the tasks of %s's expired order %s", node.address,
                     orphan.order.node, orphan.order_id[:12])  # fmt: skip
        return order

    # ---- submit ------------------------------------------------------------------------

    def check_submission(
        self, peer: str, header: submit.SubmitHeader
    ) -> submit.SubmitResponse | None:
        """Judges a submission from its header alone, before a byte of the file is read:
        None takes the file; a resend gets its receipt at once; what no resend could
        change (the order is over or not the node's, the signature is not its node's)
        gets the final refusal, so the node settles it; what may pass on a later try
        is an error reply, and the node sends it again."""
        node = self._node(peer)
        if to_checksum_address(header.node) != node.address:
            raise wire.WireError(f"the submission names node {header.node}, not the sender")
        if (stored := self.ledger.submissions.get(self._digest(header).hex())) is not None:
            return _receipt_reply(stored)
        issued = self.ledger.orders.get(header.order_id)
        if issued is None or to_checksum_address(issued.order.node) != node.address:
            return _refuse(node, header, "the submission answers no work order of this node")
        if issued.state is not OrderState.OPEN:
            return _refuse(
                node, header, f"work order {header.order_id[:12]} is already {issued.state}"
            )
        if why := checks.step_published(header.step, self.published_step()):
            raise wire.WireError(why)  # the orchestrator may yet publish it
        if header.signer(self.context.run, self.context.pool_domain) != node.address:
            return _refuse(node, header, "the submission is not signed by its node")
        return None

    def _digest(self, header: submit.SubmitHeader) -> bytes:
        return header.digest(self.context.run, self.context.pool_domain)

    def receive_submission(
        self, peer: str, header: submit.SubmitHeader, path: Path
    ) -> submit.SubmitResponse:
        node = self._node(peer)
        self._alive(node.address, self.clock())
        digest = self._digest(header).hex()
        if (stored := self.ledger.submissions.get(digest)) is not None:
            return _receipt_reply(stored)
        if submit.file_sha256(path) != header.file_sha256:
            # The bytes sent are the node's own copy: sent again, they are the same.
            return _refuse(node, header, "the file's sha256 is not the one the submission signs")
        issued = self.ledger.orders.get(header.order_id)
        assert issued is not None  # checked from the header
        units, reason, slashable = self._answers(issued.order, header, path)
        # One answer per order: of two submissions racing for it, the second is refused,
        # by the transaction that records the first (no lock: intake's handlers record
        # side by side, each waiting only for the ledger's writer).
        try:
            row = self._record(node, header, digest, path, units, reason, slashable)
        except OrderNotOpenError as e:
            return _refuse(node, header, str(e))
        outcome = f"{units} units" if units else f"rejected: {reason}"
        log.info("submission %s from %s: %s", digest[:12], node.address, outcome)
        return _receipt_reply(row)

    def _record(
        self,
        node: NodeRow,
        header: submit.SubmitHeader,
        digest: str,
        path: Path,
        units: int,
        reason: str,
        slashable: bool,
    ) -> SubmissionRow:
        """The file kept and the submission in the ledger, before any receipt leaves;
        `OrderNotOpenError` (and the file gone again) if another submission answered the
        order first."""
        now = self.clock()
        epoch = self.ledger.epochs.at(now, self.settings.epoch_seconds)
        # On disk before the row that names it. A resend of the same submission racing
        # this one moves the same bytes (its sha256 is in the digest) onto the same name.
        kept = self.submissions_dir / f"{digest}.parquet"
        shutil.move(path, kept)
        fsync(self.submissions_dir)
        receipt = submit.Receipt(
            run=self.context.run,
            node=node.address,
            submission=digest,
            epoch=epoch,
            units=units,
            reason=reason,
        ).signed_by(self.context.signer, self.context.swarm_domain)
        row = SubmissionRow(
            digest=digest,
            node=node.address,
            order_id=header.order_id,
            epoch=epoch,
            step=header.step,
            file=str(kept),
            file_sha256=header.file_sha256,
            rollout_digest=header.rollout_digest().hex(),
            signature=header.signature,
            received_at=now,
            units=0,
            status=SubmissionStatus.RECEIVED if units else SubmissionStatus.REJECTED,
            reason=reason,
            slashable=slashable,
            prefilled=False,
            receipt=receipt.model_dump_json(),
            validated_at=None if units else now,
        )
        try:
            stored, _ = self.ledger.submissions.record(row)
        except OrderNotOpenError:
            kept.unlink(missing_ok=True)  # no row names it: this digest lost the race
            raise
        if slashable:
            self.ledger.nodes.set_state(node.address, NodeState.BANNED, f"evidence: {reason}", now)
        return stored

    def _answers(
        self, order: WorkOrder, header: submit.SubmitHeader, path: Path
    ) -> tuple[int, str, bool]:
        """(units, reason, slashable): the rollouts it holds if the file answers its order
        exactly; else 0 and why, evidence only where no honest node could get it wrong."""
        records, why = checks.read_submitted(path)
        if why is not None:
            return 0, why, False
        newest = self.published_step() or 0
        if why := checks.step_fresh(header.step, newest, self.settings.async_level):
            return 0, why, False
        if why := checks.answers(records, order.assignment(header.step)):
            return 0, why, True
        return len(records), "", False


@dataclass(frozen=True)
class _Submissions:
    """The submit protocol's upload handler (see ``Host.serve_upload``)."""

    work_server: WorkServer

    def check(self, peer: str, header: submit.SubmitHeader) -> submit.SubmitResponse | None:
        return self.work_server.check_submission(peer, header)

    def receive(self, peer: str, header: submit.SubmitHeader, path: Path) -> submit.SubmitResponse:
        return self.work_server.receive_submission(peer, header, path)


def _receipt_reply(row: SubmissionRow) -> submit.SubmitResponse:
    """The receipt given when the submission was acknowledged, the same on every resend."""
    return submit.SubmitResponse(receipt=submit.Receipt.model_validate_json(row.receipt))


def _refuse(node: NodeRow, header: submit.SubmitHeader, reason: str) -> submit.SubmitResponse:
    """The final refusal of a submission (see ``SubmitResponse``): nothing is recorded."""
    order = header.order_id[:12]
    log.info("refused a submission of %s for order %s for good: %s", node.address, order, reason)
    return submit.SubmitResponse.refusal(reason)


def _no_work(retry_after: float, reason: str) -> assign.WorkResponse:
    return assign.WorkResponse(order=None, retry_after=retry_after, reason=reason)
