"""The work protocols between real libp2p hosts on loopback: intake serves them as the
orchestrator's daemon does (Intake.serve), a node's Session calls them, and what
test_work_server checks in process holds over the wire, refusals included, which reach
the node as the orchestrator's sentence."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from pathlib import Path

import pytest
import trio
from libp2p.crypto.ed25519 import create_new_key_pair
from libp2p.peer.id import ID

from client.node.events import Event, EventKind
from client.node.settings import NodeSettings
from client.node.work.journal import Journal
from client.node.work.loop import RETRIED, Node
from client.node.work.session import Session
from client.node.work.worker import LocalWorker
from orchestrator.service.work_server import RateLimiter
from swarmrl.p2p import wire
from swarmrl.p2p.host import Host, RemoteError
from swarmrl.work import WORK_PROTOCOL, join
from swarmrl.work.assign import WorkOrder
from swarmrl.work.join import IncompatibleVersionError
from swarmrl.work.submit import SUBMIT
from tests.unit.test_work_server import (
    NODE,
    OTHER,
    PUBLISHED,
    REPORT,
    RUN,
    SWARM,
    Orchestrator,
    damaged,
    rollouts,
    written,
)


@pytest.fixture
def served(tmp_path) -> Iterator[tuple[Orchestrator, Host, Host]]:
    """Intake served on a real host, and a node's host connected to it."""
    orchestrator = Orchestrator(tmp_path)
    try:
        with Host(create_new_key_pair()) as server, Host(create_new_key_pair()) as node:
            orchestrator.work_server.serve(server, tmp_path / "incoming")
            node.connect(server.addrs[0])
            yield orchestrator, server, node
    finally:
        orchestrator.ledger.close()


def over(host: Host, orchestrator: Orchestrator, server: Host) -> Session:
    """The node's session, over `host`, with the node's identity."""
    return Session(host, server.peer_id, orchestrator.session().me)


def test_a_node_joins_works_and_submits_over_the_wire(served, tmp_path):
    orchestrator, server, node = served
    session = over(node, orchestrator, server)
    joined = session.join(REPORT)
    assert (joined.run, joined.state, joined.policy_step) == (RUN, "joined", PUBLISHED)
    assert orchestrator.ledger.nodes.get(NODE.address).peer_id == node.peer_id  # as Noise said
    assert session.heartbeat(None, 50.0).state == "active"
    order = session.work().order  # checked by the session: this run, this node, its signer
    assert order.signer(SWARM) is not None

    path = written(rollouts(order, PUBLISHED), tmp_path / "answer.parquet")
    header = session.sign(order, PUBLISHED, path)
    receipt = session.submit(header, path).receipt  # checked by the session: digest and signer
    s = orchestrator.settings
    assert receipt.units == s.prompts_per_assignment * s.group_size
    row = orchestrator.ledger.submissions.get(receipt.submission)
    assert (row.order_id, row.signature) == (header.order_id, header.signature)
    assert session.submit(header, path).receipt == receipt  # a resend: the same receipt
    assert list((tmp_path / "incoming").iterdir()) == []  # nothing left spooled


def test_a_damaged_uploads_rejection_names_no_path_of_the_orchestrator(served, tmp_path):
    orchestrator, server, node = served
    session = over(node, orchestrator, server)
    session.join(REPORT)
    session.heartbeat(None, None)
    order = session.work().order
    path = damaged(tmp_path / "answer.parquet", rollouts(order, PUBLISHED))
    receipt = session.submit(session.sign(order, PUBLISHED, path), path).receipt
    assert receipt.units == 0
    # Spooled as incoming/upload-....part, kept under submissions/: the node sees neither.
    for reason in (receipt.reason, orchestrator.ledger.submissions.get(receipt.submission).reason):
        assert reason == "its file is not a readable rollout file (damaged, or not parquet)"


def test_refusals_reach_the_node_as_the_orchestrators_sentence(served):
    orchestrator, server, node = served
    session = over(node, orchestrator, server)
    with pytest.raises(RemoteError) as refused:
        session.work()
    assert str(refused.value) == "this peer has not joined; send a join request first"

    orchestrator.work_server.limiter = RateLimiter(rate=1e-6, burst=1)  # no refill within the test
    session.join(REPORT)
    with pytest.raises(RemoteError) as refused:
        session.heartbeat(None, None)
    assert str(refused.value) == "too many requests from this peer; slow down"


def test_a_leaving_heartbeat_over_the_wire_ends_the_nodes_part_at_once(served):
    orchestrator, server, node = served
    session = over(node, orchestrator, server)
    session.join(REPORT)
    session.heartbeat(None, None)
    order = session.work().order
    assert session.heartbeat(None, None, leaving=True).state == "gone"
    assert orchestrator.ledger.orders.get(order.digest(SWARM).hex()).state == "expired"
    assert session.join(REPORT).state == "joined"  # and it may come back


def test_a_node_of_another_work_protocol_hears_why_over_the_wire(served):
    orchestrator, server, node = served
    session = over(node, orchestrator, server)
    later = REPORT.model_copy(update={"protocol": WORK_PROTOCOL + 1})
    with pytest.raises(IncompatibleVersionError) as incompatible:
        session.join(later)
    assert str(incompatible.value) == join.version_refusal(later)
    assert isinstance(incompatible.value, RETRIED)  # the node loop's retries still catch it


def test_an_orchestrator_without_this_join_protocol_is_another_release(served):
    """A peer of a release whose join protocol has another id: libp2p finds no protocol in
    common, which the node hears as the release mismatch it is, not as a lost connection."""
    orchestrator, _, node = served
    older = dataclasses.replace(join.JOIN, id=wire.protocol_id("join", "0.9.0"))
    with Host(create_new_key_pair()) as old:
        old.serve(older, orchestrator.work_server.join)
        node.connect(old.addrs[0])
        with pytest.raises(IncompatibleVersionError) as incompatible:
            Session(node, old.peer_id, orchestrator.session().me).join(REPORT)
    assert str(incompatible.value) == (
        "the orchestrator does not speak /swarmrl/join/1.0.0: it runs another release of "
        "swarmrl; run the node with that release"
    )


def test_streams_held_open_by_others_take_no_upload_from_an_honest_node(served, tmp_path):
    """The attack that held intake before: a peer that has not joined opens submit
    streams and sends nothing. Each is refused at once, before a header is read, and the
    honest node's submission goes through. (A joined peer's one-upload-at-a-time and its
    pace are the host's: test_p2p_upload.)"""
    orchestrator, server, node = served
    with Host(create_new_key_pair()) as attacker:
        attacker.connect(server.addrs[0])

        async def hold_streams(count: int) -> list[bytes]:
            streams = [
                await attacker._host.new_stream(ID.from_base58(server.peer_id), [SUBMIT.id])
                for _ in range(count)
            ]
            replies = []
            for stream in streams:
                with trio.move_on_after(30):  # a hang guard only
                    replies.append(await wire.read_frame(stream, 1024))
            for stream in streams:
                await stream.close()
            return replies

        refused = b'{"error":"this peer has not joined; send a join request first"}'
        # A stream that comes while the peer's last one is still at the join gate (its
        # check runs in a worker thread, so a flood holds one thread) is refused sooner:
        # one upload at a time per peer. Which of the two each gets is the scheduler's.
        busy = b'{"error":"this peer has an upload in progress; one at a time"}'
        replies = attacker._call(hold_streams, 8)
        assert len(replies) == 8
        assert set(replies) <= {refused, busy}, replies
        assert refused in replies

        session = over(node, orchestrator, server)
        session.join(REPORT)
        session.heartbeat(None, None)
        order = session.work().order
        path = written(rollouts(order, PUBLISHED), tmp_path / "answer.parquet")
        receipt = session.submit(session.sign(order, PUBLISHED, path), path).receipt
        assert receipt.units > 0


# ---- the node's journal against intake -------------------------------------------------


class NoSwarm:
    """The node's weight swarm, not started: these nodes generate nothing."""

    def close(self) -> None:
        pass


class JournaledNode:
    """A node's loop over the wire with its journal in `data_dir`, joined already, with no
    chain to read and no weights to fetch: it runs until it asks for an order (the first
    thing it does once the journal is handed in) or until it would retry."""

    def __init__(self, data_dir: Path, session: Session) -> None:
        self.events: list[Event] = []
        self.orders: list[WorkOrder] = []
        settings = NodeSettings(data_dir=data_dir, keystore_dir=data_dir / "keys")
        self.node = Node(settings, NODE, on_event=self.hear)
        self.node.session = session
        self.node.state.joined = True  # joined by the test; no heartbeat thread either
        self.node._identity = lambda: None  # type: ignore[method-assign]
        self.node._start_swarm = lambda me: setattr(self.node, "swarm", NoSwarm())  # type: ignore[method-assign]
        self.node._one_order = self.ask  # type: ignore[method-assign]
        # Its one worker holds nothing: these nodes generate nothing.
        self.node._start_workers = lambda: LocalWorker(load=None)  # type: ignore[method-assign]

    def hear(self, event: Event) -> None:
        if event.kind is EventKind.WORKERS:
            return
        self.events.append(event)
        if event.kind is EventKind.RETRY:
            self.node.stop()

    def ask(self) -> None:
        assert self.node.session is not None
        self.orders.append(self.node.session.work().order)
        self.node.stop()

    def run(self) -> list[EventKind]:
        self.node.run()
        return [e.kind for e in self.events]


def journaled(node: Node, session: Session, order: WorkOrder, path: Path) -> str:
    """Signs an answer to `order` and journals it, as the node does before sending it;
    the send itself never came back (the orchestrator was killed). Returns its digest."""
    header = session.sign(order, PUBLISHED, path)
    digest = session.digest(header)
    node.journal.add(order.digest(SWARM).hex(), digest, header.model_dump(), path)
    return digest


def test_a_resend_refused_for_good_is_settled_and_the_node_works_on(served, tmp_path):
    orchestrator, server, host = served
    session = over(host, orchestrator, server)
    session.join(REPORT)
    session.heartbeat(None, None)
    order = session.work().order
    order_id = order.digest(SWARM).hex()
    node = JournaledNode(tmp_path / "node", session)
    digest = journaled(
        node.node, session, order, written(rollouts(order, PUBLISHED), tmp_path / "a")
    )
    # While the orchestrator was down the order expired, and another node took its tasks.
    orchestrator.ledger.orders.expire(order.deadline + 1)
    orchestrator.active(OTHER).work()

    assert node.run() == [EventKind.REFUSED, EventKind.STOPPED]
    reason = f"work order {order_id[:12]} is already reassigned"
    assert (node.events[0].digest, node.events[0].reason) == (digest[:12], reason)
    # Settled with its reason, kept as the node's record, and nothing recorded for it.
    journal = node.node.journal
    assert journal.pending() == []
    [refused] = journal.refusals()
    assert (refused.digest, refused.order_id, refused.reason) == (digest, order_id, reason)
    assert orchestrator.ledger.submissions.all() == []
    # The node went on to ask for work, and got a new order of its own.
    [new] = node.orders
    assert (new.counter, new.node) == (1, NODE.address)

    # A restart: the refusal is still the entry's settlement, so nothing is resent.
    assert Journal(tmp_path / "node" / "journal").refusals() == [refused]
    again = JournaledNode(tmp_path / "node", session)
    assert again.run() == [EventKind.STOPPED]
    assert again.node.journal.settled(digest)
    assert again.orders == [new]  # the open order, handed out again


def test_a_resend_that_fails_for_now_stays_journaled_and_is_sent_later(served, tmp_path):
    orchestrator, server, host = served
    session = over(host, orchestrator, server)
    session.join(REPORT)
    session.heartbeat(None, None)
    order = session.work().order
    node = JournaledNode(tmp_path / "node", session)
    digest = journaled(
        node.node, session, order, written(rollouts(order, PUBLISHED), tmp_path / "a")
    )
    orchestrator.work_server.limiter = RateLimiter(rate=1e-6, burst=0)  # refuses everything

    with pytest.raises(RemoteError, match="too many requests") as busy:
        node.node._resend()
    assert isinstance(busy.value, RETRIED)  # the loop waits it out and tries again
    assert [entry.digest for entry in node.node.journal.pending()] == [digest]
    assert node.node.journal.refusals() == []

    orchestrator.work_server.limiter = RateLimiter()
    assert node.run() == [EventKind.RESENT, EventKind.STOPPED]
    assert node.node.journal.pending() == []
    [receipt] = node.node.journal.receipts()
    assert receipt["submission"] == digest
    assert receipt["units"] == node.events[0].units > 0
