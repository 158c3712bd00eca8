"""The simulated nodes of ``swarmrl bench load``: many light libp2p hosts in one trio loop
per worker process, each an honest node speaking the work protocols, and the attackers.

One ``swarmrl.p2p.host.Host`` per node (a thread, a trio loop and gossipsub each) would
spend the machine on the clients. A light host here is py-libp2p's host with the
transport ``Host`` uses (TCP, Noise, yamux) and no pubsub; a node is a trio task on it.
Requests and answers go through the protocol specs' own codecs (``swarmrl.work``) and
``swarmrl.p2p.wire``'s framing; an upload is a header frame, body frames and the empty
frame, as ``Host.upload`` sends it. What a node signs and how it checks what the
orchestrator signs is the node's own code, run on the answers as they came off the wire
(:class:`_Answered`): ``Session.sign`` and ``Session.digest`` for a submission,
``Session.work``'s order check and ``Session.submit``'s receipt check.

What a simulated node leaves out: generation (its records are made up, three tokens
each with a dummy proof, and answer their order exactly, which is all intake checks of
them), the weight swarm (it speaks no gossipsub, so the orchestrator's mesh upkeep for
it is not in the figures), and the journal (its retries stand in for resending).

Roles, one per worker process:

- ``nodes``: each joins, sends a heartbeat every ``heartbeat_seconds``, and loops: ask
  for work (waiting what ``retry_after`` says), write the records answering the order,
  sign, upload, check the receipt; a failure is retried with the node's backoff.
- ``flood``: one joined peer sending ``flood_rate`` heartbeat requests a second.
- ``slow``: one joined peer holding as many submit uploads open as intake lets it,
  each a valid header and then a body trickled a byte at a time.
"""

from __future__ import annotations

import json
import logging
import random
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, TypeVar

import multiaddr
import trio
from eth_account import Account
from eth_account.signers.local import LocalAccount
from eth_utils import keccak
from libp2p import create_yamux_muxer_option, new_host
from libp2p.abc import IHost, INetStream
from libp2p.crypto.ed25519 import create_new_key_pair
from libp2p.crypto.keys import KeyPair
from libp2p.crypto.x25519 import create_new_key_pair as new_x25519_key_pair
from libp2p.custom_types import TProtocol
from libp2p.network.config import ConnectionConfig
from libp2p.peer.peerinfo import PeerInfo, info_from_p2p_addr
from libp2p.security.noise.transport import PROTOCOL_ID as NOISE_ID
from libp2p.security.noise.transport import Transport as NoiseTransport

from client.node.work.backoff import Backoff
from client.node.work.session import Identity, Session
from swarmrl.eip712 import pool_domain, swarm_domain
from swarmrl.p2p import wire
from swarmrl.p2p.host import ERROR_KEY, RemoteError, quiet_libp2p_logs
from swarmrl.p2p.protocol import RequestResponse, Upload
from swarmrl.rollouts.records import Rollout, write_rollouts
from swarmrl.tasks import Task, read_tasks
from swarmrl.work import WORK_PROTOCOL, assign, heartbeat, join
from swarmrl.work.assign import WORK, WorkOrder
from swarmrl.work.heartbeat import HEARTBEAT
from swarmrl.work.join import JOIN
from swarmrl.work.submit import SUBMIT, SubmitHeader, SubmitResponse

Req = TypeVar("Req")
Resp = TypeVar("Resp")
Role = Literal["nodes", "flood", "slow"]

# The policy step every record claims: the bench's orchestrator publishes step 0 for good.
STEP = 0
REPORT = join.NodeReport(
    backend="torch", device="cpu", cpu_cores=1, version="swarmrl bench", protocol=WORK_PROTOCOL
)
# Seconds an upload in flight when the run stops may still take to be answered.
GRACE = 15.0
# The refusal intake's rate limit answers with (work_server.WorkServer.admit).
TOO_MANY = "too many requests"
# The slow uploader: at most this many uploads open at once, a new one tried this often,
# and one body byte sent on each this often.
SLOW_STREAMS = 64
SLOW_TRY_SECONDS = 0.25
SLOW_TRICKLE_SECONDS = 5.0
FLOOD_IN_FLIGHT = 256
log = logging.getLogger("swarmrl.bench.load")


def node_account(index: int) -> LocalAccount:
    """Simulated node `index`'s Ethereum key, the same in every process that asks."""
    account: LocalAccount = Account.from_key(
        keccak(b"swarmrl bench load node" + index.to_bytes(4, "big"))
    )
    return account


def node_peer_key(index: int) -> KeyPair:
    """Simulated node `index`'s libp2p identity (ed25519)."""
    seed = keccak(b"swarmrl bench load peer" + index.to_bytes(4, "big"))
    return create_new_key_pair(seed)


@dataclass(frozen=True)
class RunFacts:
    """The run every simulated node works in, and whom it trusts."""

    run: str
    chain_id: int
    pool: str
    provider: str
    signer: str  # the orchestrator's key: signs work orders and receipts
    orchestrator: str  # its full multiaddr, /p2p/ included

    def identity(self, account: LocalAccount) -> Identity:
        return Identity(
            account=account,
            provider=self.provider,
            run=self.run,
            swarm_domain=swarm_domain(self.chain_id, self.pool),
            pool_domain=pool_domain(self.chain_id, self.pool),
            trusted=frozenset({self.signer}),
        )


@dataclass(frozen=True)
class WorkerPlan:
    role: Role
    facts: RunFacts
    tasks: Path
    indices: tuple[int, ...]
    start_at: float  # unix time the first node begins to join (the attackers: to attack)
    ramp: float  # seconds over which the nodes' joins are spread
    stop_at: float  # unix time after which nothing new begins
    spool: Path  # where the nodes write their rollout files
    out: Path  # the worker's results (JSON)
    rate: float | None = None  # submissions/s this worker offers; None: as fast as it can
    flood_rate: float = 0.0


@dataclass
class Tally:
    """What a worker's nodes saw; written to ``WorkerPlan.out`` as JSON."""

    role: str
    receipts: list[tuple[str, str, int, float]] = field(default_factory=list)  # digest, node,
    # units, unix time
    offered: list[float] = field(default_factory=list)  # first upload of each submission
    heartbeats: list[float] = field(default_factory=list)  # answered heartbeats
    joined: int = 0
    refused: Counter[str] = field(default_factory=Counter)  # final refusals, by reason
    errors: Counter[str] = field(default_factory=Counter)  # failures retried, by sentence
    no_work: Counter[str] = field(default_factory=Counter)  # "no order now", by reason
    in_flight: list[str] = field(default_factory=list)  # unsettled when the run stopped
    attack: Counter[str] = field(default_factory=Counter)  # the attackers' own counts

    def error(self, e: BaseException) -> None:
        self.errors[sentence(e)] += 1

    def to_json(self) -> dict[str, Any]:
        return {
            "role": self.role,
            "receipts": self.receipts,
            "offered": self.offered,
            "heartbeats": self.heartbeats,
            "joined": self.joined,
            "refused": dict(self.refused),
            "errors": dict(self.errors),
            "no_work": dict(self.no_work),
            "in_flight": self.in_flight,
            "attack": dict(self.attack),
        }


def sentence(e: BaseException) -> str:
    """A failure as a short, countable line: the orchestrator's own sentence if it sent one."""
    if isinstance(e, RemoteError):
        return str(e)[:100]
    if isinstance(e, trio.TooSlowError):
        return "timed out"
    return f"{type(e).__name__}: {e}"[:100]


# ---- the records ---------------------------------------------------------------------


def answer(order: WorkOrder, tasks: dict[str, Task], step: int = STEP) -> list[Rollout]:
    """Records answering `order` exactly, as intake checks them: each task's group, each
    record as asked (run, node, step, seed, sampling, budget); three made-up tokens and a
    dummy 258-byte proof each, as no model generated them."""
    records = []
    for slot in order.tasks:
        task = tasks[slot.problem_id]
        row = task.row()
        for sample in range(order.group_size):
            records.append(
                Rollout(
                    run=order.run,
                    policy_step=step,
                    node=order.node,
                    problem_id=slot.problem_id,
                    task_type=task.task_type,
                    prompt=task.prompt,
                    verification_info=row["verification_info"],
                    seed=order.seed,
                    sample=sample,
                    temperature=order.temperature,
                    top_p=order.top_p,
                    max_tokens=order.max_tokens,
                    target_len=slot.budget,
                    prompt_ids=[1, 2, 3],
                    output_ids=[4, 5, 6 + sample % 1000],
                    logprobs=[-0.5, -0.25, -1.0],
                    finish_reason="eos",
                    task_reward=1.0,
                    length_penalty=0.0,
                    reward=1.0,
                    proofs=[b"\x01" * 258],
                ).sealed()
            )
    return records


def write_answer(order: WorkOrder, tasks: dict[str, Task], path: Path) -> Path:
    write_rollouts(answer(order, tasks), path)
    return path


class _Answered:
    """A stand-in for the node's host that answers with what already came off the wire,
    so that the node's own Session checks that answer (`Session.work`, `Session.submit`)."""

    def __init__(self, peer_id: str, answer: object = None) -> None:
        self._peer_id = peer_id
        self._answer = answer

    @property
    def peer_id(self) -> str:
        return self._peer_id

    def call(self, spec: RequestResponse[Req, Resp], peer_id: str, request: Req) -> Resp:
        return self._answer  # type: ignore[return-value]

    def upload(self, spec: Upload[Any, Resp], peer_id: str, header: Any, path: Path) -> Resp:
        return self._answer  # type: ignore[return-value]


def checked_order(session: Session, response: assign.WorkResponse) -> assign.WorkResponse:
    """`response` as the node's Session takes it: an order for another run or node, or
    one not signed by the run's recorder, raises WireError."""
    return Session(_Answered(session.host.peer_id, response), session.peer, session.me).work()


def checked_receipt(
    session: Session, header: SubmitHeader, response: SubmitResponse
) -> SubmitResponse:
    """`response` as the node's Session takes it: a receipt for another submission, or
    not signed by the run's recorder, raises WireError."""
    host = _Answered(session.host.peer_id, response)
    return Session(host, session.peer, session.me).submit(header, Path())


# ---- the light host ----------------------------------------------------------------------


def light_host(key_pair: KeyPair) -> IHost:
    """A py-libp2p host as ``Host`` builds one (TCP, Noise, yamux), without pubsub and
    listening nowhere (a node behind NAT): it only dials the orchestrator."""
    noise = NoiseTransport(key_pair, noise_privkey=new_x25519_key_pair().private_key)
    return new_host(
        key_pair=key_pair,
        sec_opt={NOISE_ID: noise},
        muxer_opt=create_yamux_muxer_option(),
        connection_config=ConnectionConfig(
            max_connections=4, min_connections=0, low_watermark=0, high_watermark=4
        ),
    )


class Peer:
    """One light host's way to the orchestrator: a connection (dialled again when the
    orchestrator dropped it) and a stream per request, as ``Host.call`` and
    ``Host.upload`` make them."""

    def __init__(self, host: IHost, orchestrator: str) -> None:
        self.host = host
        self.info: PeerInfo = info_from_p2p_addr(multiaddr.Multiaddr(orchestrator))
        self.peer_id = host.get_id().to_base58()
        self.orchestrator = self.info.peer_id.to_base58()

    async def connect(self) -> None:
        network = self.host.get_network()
        if network.get_connections(self.info.peer_id):
            return
        if hasattr(network, "unblock_peer"):  # as Host.connect: "try now"
            network.unblock_peer(self.info.peer_id)
        with trio.fail_after(10):
            await self.host.connect(self.info)

    async def _stream(self, protocol: str) -> INetStream:
        await self.connect()
        return await self.host.new_stream(self.info.peer_id, [TProtocol(protocol)])

    async def call(self, spec: RequestResponse[Req, Resp], request: Req) -> Resp:
        """`request` sent, its answer decoded; an error reply raises RemoteError."""
        (body,) = spec.request.encode(request)
        with trio.fail_after(spec.wait):
            stream = await self._stream(spec.id)
            try:
                await wire.write_frame(stream, body)
                frames = [await wire.read_frame(stream, spec.response_limit)]
                raise_if_error(frames[0])
                for _ in range(spec.response.frames - 1):
                    frames.append(await wire.read_frame(stream, spec.response_limit))
            finally:
                await close_quietly(stream)
        return spec.response.decode(frames)

    async def upload(self, spec: Upload[Any, Resp], header: Any, body: bytes) -> Resp:
        """`header`, then `body` in chunks, then the empty frame; the answer decoded. The
        answer is read while the body goes out: one given from the header alone (a
        resend's receipt, a refusal) ends the upload."""
        (head,) = spec.header.encode(header)
        with trio.fail_after(spec.deadline):
            stream = await self._stream(spec.id)
            try:
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(_send_body, stream, head, body, spec.chunk_limit)
                    reply = await wire.read_frame(stream, spec.response_limit)
                    # Not cancelled mid-write (that would break the connection's other
                    # streams): a sender the peer stopped reading ends after the grace.
                    nursery.cancel_scope.deadline = trio.current_time() + 10
            finally:
                await close_quietly(stream)
        raise_if_error(reply)
        return spec.response.decode([reply])


async def _send_body(stream: INetStream, head: bytes, body: bytes, chunk: int) -> None:
    try:
        await wire.write_frame(stream, head)
        for i in range(0, len(body), chunk):
            await wire.write_frame(stream, body[i : i + chunk])
        await wire.write_frame(stream, b"")
    except Exception:
        pass  # the reply, read alongside, says why


def raise_if_error(body: bytes) -> None:
    """RemoteError with the peer's sentence if `body` is an error reply."""
    if body.startswith(b'{"' + ERROR_KEY.encode() + b'"'):
        try:
            message = wire.parse_error(body, ERROR_KEY)
        except wire.WireError:
            return
        raise RemoteError(message)


async def close_quietly(stream: INetStream) -> None:
    try:
        with trio.move_on_after(2):
            await stream.close()
    except Exception:
        pass


# Failures a node retries: client/node/work/loop.py's RETRIED, which over this transport (no
# bridge turning py-libp2p's own errors into ConnectionError) is any exception.
RETRIED = (Exception,)


# ---- an honest node ------------------------------------------------------------------------


class Pacer:
    """The worker's share of ``--rate``: each submission takes the next slot of a fixed
    schedule; a slot nobody was ready for is not saved up."""

    def __init__(self, rate: float) -> None:
        self.interval = 1.0 / rate
        self.next = time.monotonic()

    async def wait(self) -> None:
        now = time.monotonic()
        slot = max(self.next, now)
        self.next = slot + self.interval
        await trio.sleep(slot - now)


class Worker:
    """One worker process's nodes (or attacker), and what they saw."""

    def __init__(self, plan: WorkerPlan) -> None:
        self.plan = plan
        self.tally = Tally(plan.role)
        self.tasks = {t.problem_id: t for t in read_tasks(plan.tasks)}
        self.pacer = None if plan.rate is None else Pacer(plan.rate)
        plan.spool.mkdir(parents=True, exist_ok=True)

    def stopped(self) -> bool:
        return time.time() >= self.plan.stop_at

    async def sleep(self, seconds: float) -> None:
        """Sleeps `seconds`, or until the stop, whichever comes first."""
        await trio.sleep(max(0.0, min(seconds, self.plan.stop_at - time.time())))

    async def run(self) -> None:
        plan = self.plan
        await trio.sleep(max(0.0, plan.start_at - time.time()))
        async with trio.open_nursery() as nursery:
            for i, index in enumerate(plan.indices):
                delay = plan.ramp * i / max(1, len(plan.indices))
                nursery.start_soon(self._node, index, delay)

    async def _node(self, index: int, delay: float) -> None:
        await trio.sleep(delay)
        account = node_account(index)
        host = light_host(node_peer_key(index))
        async with host.run(listen_addrs=[]):
            peer = Peer(host, self.plan.facts.orchestrator)
            session = Session(
                _Answered(peer.peer_id), peer.orchestrator, self.plan.facts.identity(account)
            )
            await self._act(peer, session, Backoff(base=1.0, cap=30.0))

    async def _act(self, peer: Peer, session: Session, backoff: Backoff) -> None:
        joined = await self._join(peer, session, backoff)
        if joined is None:
            return
        role = self.plan.role
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._heartbeats, peer, joined.heartbeat_seconds)
            if role == "nodes":
                await self._work(peer, session, backoff)
            elif role == "flood":
                await self._flood(peer)
            else:
                await self._slow(peer, session, backoff)
            nursery.cancel_scope.cancel()

    async def _join(
        self, peer: Peer, session: Session, backoff: Backoff
    ) -> join.JoinResponse | None:
        while not self.stopped():
            me = session.me
            # The claim as Session.join builds and signs it (EIP-712, the swarm domain).
            claim = join.JoinClaim(
                node=me.account.address,
                provider=me.provider,
                peer_id=peer.peer_id,
                report=REPORT,
                issued_at=int(time.time()),
            ).signed_by(me.account, me.swarm_domain)
            try:
                joined = await peer.call(JOIN, claim)
            except RETRIED as e:
                self.tally.error(e)
                await self.sleep(backoff.next_delay())
                continue
            backoff.reset()
            self.tally.joined += 1
            return joined
        return None

    async def _heartbeats(self, peer: Peer, seconds: float) -> None:
        request = heartbeat.HeartbeatRequest(policy_step=STEP, tokens_per_second=None)
        first = True
        while not self.stopped():
            try:
                await peer.call(HEARTBEAT, request)
                self.tally.heartbeats.append(time.time())
            except RETRIED as e:
                self.tally.error(e)
            # The first right after joining (the node becomes active), then on the beat,
            # spread so that a swarm that joined together does not beat together.
            await self.sleep(seconds * (random.uniform(0.5, 1.0) if first else 1.0))
            first = False

    async def _work(self, peer: Peer, session: Session, backoff: Backoff) -> None:
        while not self.stopped():
            if self.pacer is not None:
                await self.pacer.wait()
                if self.stopped():
                    return
            try:
                response = checked_order(session, await peer.call(WORK, assign.WorkRequest()))
            except RETRIED as e:
                self.tally.error(e)
                await self.sleep(backoff.next_delay())
                continue
            backoff.reset()
            if response.order is None:
                self.tally.no_work[response.reason[:80]] += 1
                await self.sleep(max(0.5, response.retry_after))
                continue
            await self._hand_in(peer, session, response.order, backoff)

    async def _hand_in(
        self, peer: Peer, session: Session, order: WorkOrder, backoff: Backoff
    ) -> None:
        """Writes, signs and uploads the answer to `order` until it is settled (a receipt
        or a refusal for good) or the run has stopped (then it is in flight)."""
        path = self.plan.spool / f"{peer.peer_id}-{order.counter}.parquet"
        write_answer(order, self.tasks, path)
        header = session.sign(order, STEP, path)
        body = path.read_bytes()
        path.unlink()
        digest = session.digest(header)
        self.tally.offered.append(time.time())
        settled = False
        with trio.move_on_at(trio.current_time() + self.plan.stop_at + GRACE - time.time()):
            while True:
                try:
                    answered = checked_receipt(
                        session, header, await peer.upload(SUBMIT, header, body)
                    )
                except RETRIED as e:
                    self.tally.error(e)
                    if self.stopped():
                        break  # no new try once stopped: it is in flight
                    await trio.sleep(backoff.next_delay())
                    continue
                backoff.reset()
                settled = True
                if answered.receipt is None:
                    self.tally.refused[answered.refused[:100]] += 1
                else:
                    r = answered.receipt
                    self.tally.receipts.append((r.submission, r.node, r.units, time.time()))
                break
        if not settled:
            self.tally.in_flight.append(digest)

    # ---- the attackers ---------------------------------------------------------------

    async def _flood(self, peer: Peer) -> None:
        """Heartbeat requests at `flood_rate` a second, each on its own stream, whatever
        the answers; at most FLOOD_IN_FLIGHT unanswered at once (more are counted as
        skipped, not queued, to hold the rate)."""
        request = heartbeat.HeartbeatRequest(policy_step=STEP)
        interval = 1.0 / self.plan.flood_rate
        counts = self.tally.attack
        in_flight = 0

        async def one() -> None:
            nonlocal in_flight
            in_flight += 1
            try:
                await peer.call(HEARTBEAT, request)
                counts["answered"] += 1
            except RemoteError as e:
                counts["refused: too many requests" if TOO_MANY in str(e) else "refused"] += 1
            except Exception as e:
                counts[f"failed: {sentence(e)[:60]}"] += 1
            finally:
                in_flight -= 1

        async with trio.open_nursery() as nursery:
            due = trio.current_time()
            while not self.stopped():
                if in_flight < FLOOD_IN_FLIGHT:
                    counts["sent"] += 1
                    nursery.start_soon(one)
                else:
                    counts["skipped"] += 1
                due += interval
                await trio.sleep_until(due)
            nursery.cancel_scope.cancel()

    async def _slow(self, peer: Peer, session: Session, backoff: Backoff) -> None:
        """Holds as many submit uploads open as intake takes: a valid header answering its
        open order (so intake takes the body), then one body byte every
        SLOW_TRICKLE_SECONDS, never finishing."""
        order = None
        while order is None and not self.stopped():
            try:
                response = checked_order(session, await peer.call(WORK, assign.WorkRequest()))
            except RETRIED as e:
                self.tally.error(e)
                await self.sleep(backoff.next_delay())
                continue
            order = response.order
            if order is None:
                await self.sleep(max(0.5, response.retry_after))
        if order is None:
            return
        path = write_answer(order, self.tasks, self.plan.spool / f"{peer.peer_id}-slow.parquet")
        header = session.sign(order, STEP, path)
        size = path.stat().st_size
        path.unlink()
        counts = self.tally.attack
        open_now = 0

        async def hold() -> None:
            nonlocal open_now
            open_now += 1
            counts["opened"] += 1
            counts["most open at once"] = max(counts["most open at once"], open_now)
            try:
                await self._trickle(peer, header, size)
            finally:
                open_now -= 1

        async with trio.open_nursery() as nursery:
            while not self.stopped():
                if open_now < SLOW_STREAMS:
                    nursery.start_soon(hold)
                await self.sleep(SLOW_TRY_SECONDS)
            nursery.cancel_scope.cancel()

    async def _trickle(self, peer: Peer, header: SubmitHeader, size: int) -> None:
        counts = self.tally.attack
        (head,) = SUBMIT.header.encode(header)
        try:
            stream = await peer._stream(SUBMIT.id)
        except Exception as e:
            counts[f"could not open: {sentence(e)[:60]}"] += 1
            return
        try:
            await wire.write_frame(stream, head)
            await stream.write(wire.encode_varint(size))
            async with trio.open_nursery() as nursery:

                async def trickle() -> None:
                    await trio.sleep(1.0)
                    counts["taken by intake (body trickling)"] += 1
                    for _ in range(size - 1):  # never the last byte
                        await stream.write(b"\x00")
                        await trio.sleep(SLOW_TRICKLE_SECONDS)

                nursery.start_soon(trickle)
                try:
                    reply = await wire.read_frame(stream, SUBMIT.response_limit)
                    raise_if_error(reply)
                    counts["answered"] += 1
                except RemoteError as e:
                    counts[f"refused: {str(e)[:60]}"] += 1
                except Exception as e:
                    counts[f"ended: {sentence(e)[:60]}"] += 1
                nursery.cancel_scope.cancel()
        except Exception as e:
            counts[f"ended: {sentence(e)[:60]}"] += 1
        finally:
            await close_quietly(stream)


def worker_main(plan: WorkerPlan) -> None:
    """A worker process: runs its nodes until the plan's stop, then writes its tally."""
    logging.basicConfig(level=logging.WARNING)
    quiet_libp2p_logs()
    worker = Worker(plan)
    try:
        trio.run(worker.run)
    finally:
        plan.out.write_text(json.dumps(worker.tally.to_json()))
