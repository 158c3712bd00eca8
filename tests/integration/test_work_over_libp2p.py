"""The work protocols between real libp2p hosts on loopback: intake serves them as the
orchestrator's daemon does (Intake.serve), a node's Session calls them, and what
test_work_server checks in process holds over the wire, refusals included, which reach
the node as the orchestrator's sentence."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from libp2p.crypto.ed25519 import create_new_key_pair

from client.node.session import Session
from orchestrator.service.work_server import RateLimiter
from swarmrl.p2p.host import Host, RemoteError
from tests.unit.test_work_server import (
    NODE,
    PUBLISHED,
    REPORT,
    RUN,
    SWARM,
    Orchestrator,
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
    receipt = session.submit(header, path)  # checked by the session: digest and signer
    s = orchestrator.settings
    assert receipt.units == s.prompts_per_assignment * s.group_size
    row = orchestrator.ledger.submissions.get(receipt.submission)
    assert (row.order_id, row.signature) == (header.order_id, header.signature)
    assert session.submit(header, path) == receipt  # a resend: the same receipt
    assert list((tmp_path / "incoming").iterdir()) == []  # nothing left spooled


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
