"""The orchestrator's intake with a real ledger, real keys and a real node Session:
who may join, what work a node gets, and which submissions are acknowledged,
rejected or taken as slashing evidence, before a byte of model time is spent."""

from __future__ import annotations

import os
import re
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from benchmarks import load_nodes
from client.node.events import Event, EventKind
from client.node.settings import NodeSettings
from client.node.work.loop import Node
from client.node.work.session import Identity, Session, node_report
from orchestrator.service.ledger import Ledger
from orchestrator.service.scheduler import BUDGETS, draw_order
from orchestrator.service.settings import OrchestratorSettings
from orchestrator.service.work_server import (
    RATE_BURST,
    RateLimiter,
    RunContext,
    WorkServer,
    heartbeat_interval,
)
from swarmrl import __version__
from swarmrl.chain.anvil import dev_accounts
from swarmrl.eip712 import Submission, pool_domain, swarm_domain
from swarmrl.p2p import wire
from swarmrl.p2p.direct import DirectServer
from swarmrl.rollouts.records import Rollout, write_rollouts
from swarmrl.tasks import Task
from swarmrl.work import VERSION_REFUSAL, WORK_PROTOCOL, submit
from swarmrl.work.assign import WORK, WorkOrder
from swarmrl.work.heartbeat import HEARTBEAT
from swarmrl.work.join import JOIN, IncompatibleVersionError, JoinClaim, JoinResponse, NodeReport
from swarmrl.work.submit import SUBMIT, Receipt, SubmitHeader

ACCOUNTS = dev_accounts(8)
# The recorder key: it signs work orders and receipts.
ORCHESTRATOR = ACCOUNTS[1]
PROVIDER, NODE, OTHER, STRANGER = ACCOUNTS[4], ACCOUNTS[5], ACCOUNTS[6], ACCOUNTS[7]
PEERS = {
    NODE.address: "12D3KooWNodeFivePeerAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA",
    OTHER.address: "12D3KooWNodeSixPeerBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBB",
}
CHAIN_ID = 31337
POOL = "0xe7f1725E7734CE288F8367e1Bb143E90bb3F0512"
RUN = "0x" + "5a" * 32
SWARM, POOL_DOMAIN = swarm_domain(CHAIN_ID, POOL), pool_domain(CHAIN_ID, POOL)
REPORT = NodeReport(
    backend="torch", device="cpu", cpu_cores=4, version="swarmrl test", protocol=WORK_PROTOCOL
)
TASKS = {
    t.problem_id: t
    for t in (
        Task(
            problem_id=f"arith-{i}",
            task_type="math",
            prompt=f"What is {i} + {i}?",
            verification_info={"ground_truth": str(2 * i)},
        )
        for i in range(8)
    )
}
PUBLISHED = 3


@pytest.fixture(autouse=True)
def clean_environment(monkeypatch):
    """No SWARMRL_* of the machine running the tests reaches the settings."""
    for name in list(os.environ):
        if name.upper().startswith("SWARMRL_"):
            monkeypatch.delenv(name)


class FixedChain:
    """The chain's word on every joining node, fixed. `standing` is the one question
    intake asks the chain (the daemon answers it from the deployed contracts through
    ProtocolChainView); everything else in these tests is the real thing."""

    def __init__(self, refusal: str | None = None) -> None:
        self.refusal = refusal
        self.asked: list[tuple[str, str]] = []

    def standing(self, node: str, provider: str) -> str | None:
        self.asked.append((node, provider))
        return self.refusal


class Orchestrator:
    """Intake over a fresh ledger, with the daemon's other inputs as plain values."""

    def __init__(self, root: Path, **settings) -> None:
        self.root = root
        self.settings = OrchestratorSettings(
            data_dir=root / "data",
            model=root / "model",
            tasks=root / "tasks.jsonl",
            deployment=root / "deployment.json",
            keystore_dir=root / "keys",
            steps=10,
            group_size=2,
            prompts_per_assignment=3,
            async_level=1,
            max_tokens=128,
            target_len=16,
            temperature=0.7,
            top_p=0.95,
            precision="bf16",
            max_backlog=4,
            **settings,
        )
        self.ledger = Ledger(root / "data" / "ledger.sqlite3")
        self.chain = FixedChain()
        self.published: int | None = PUBLISHED
        self.backlog = 0
        self.now: float | None = None  # the work server's clock, stopped; None: the real one
        context = RunContext(
            run=RUN, swarm_domain=SWARM, pool_domain=POOL_DOMAIN, signer=ORCHESTRATOR
        )
        self.work_server = WorkServer(
            self.settings,
            context,
            self.ledger,
            TASKS,
            self.chain,
            published_step=lambda: self.published,
            backlog=lambda: self.backlog,
            weights_addrs=lambda: ["/ip4/127.0.0.1/tcp/4001/p2p/12D3KooWOrigin"],
            clock=lambda: time.time() if self.now is None else self.now,
        )
        self.host = DirectServer()
        self.work_server.serve(self.host, root / "spool")

    def session(self, account=NODE, peer: str | None = None) -> Session:
        identity = Identity(
            account=account,
            provider=PROVIDER.address,
            run=RUN,
            swarm_domain=SWARM,
            pool_domain=POOL_DOMAIN,
            trusted=frozenset({ORCHESTRATOR.address}),
        )
        host = self.host.caller(peer or PEERS[account.address])
        return Session(host, "12D3KooWOrigin", identity)

    def at(self, when: float) -> None:
        """Stops the work server's clock at the unix time `when`."""
        self.now = when

    def active(self, account=NODE) -> Session:
        session = self.session(account)
        session.join(REPORT)
        session.heartbeat(None, None)
        return session


@pytest.fixture
def orchestrator(tmp_path) -> Orchestrator:
    o = Orchestrator(tmp_path)
    yield o
    o.ledger.close()


def claim(account=NODE, *, peer=None, issued_at=None, signer=None, report=REPORT) -> JoinClaim:
    unsigned = JoinClaim(
        node=account.address,
        provider=PROVIDER.address,
        peer_id=peer or PEERS[account.address],
        report=report,
        issued_at=int(time.time()) if issued_at is None else issued_at,
    )
    return unsigned.signed_by(signer or account, SWARM)


# ---- join ---------------------------------------------------------------------------


def test_join_then_heartbeat_makes_the_node_active(orchestrator):
    session = orchestrator.session()
    joined = session.join(REPORT)
    assert (joined.run, joined.state, joined.policy_step) == (RUN, "joined", PUBLISHED)
    assert joined.heartbeat_seconds == orchestrator.settings.heartbeat_seconds
    assert joined.weights == ["/ip4/127.0.0.1/tcp/4001/p2p/12D3KooWOrigin"]
    assert orchestrator.chain.asked == [(NODE.address, PROVIDER.address)]
    row = orchestrator.ledger.nodes.get(NODE.address)
    assert (row.state, row.provider, row.peer_id) == (
        "joined",
        PROVIDER.address,
        PEERS[NODE.address],
    )
    assert row.hardware == REPORT.model_dump()

    beat = session.heartbeat(2, 120.0)
    assert (beat.state, beat.policy_step, beat.outcomes) == ("active", PUBLISHED, [])
    orchestrator.work_server.sweep(time.time())  # writes the heartbeats gathered
    row = orchestrator.ledger.nodes.get(NODE.address)
    assert (row.state, row.speed) == ("active", 120.0)
    moves = [
        (t.from_state, t.to_state) for t in orchestrator.ledger.nodes.transitions(NODE.address)
    ]
    assert moves == [(None, "joined"), ("joined", "active")]


def test_a_claim_from_another_peer_than_it_names_is_refused(orchestrator):
    with pytest.raises(wire.WireError, match=r"names peer .* not the sender"):
        orchestrator.work_server.join(PEERS[OTHER.address], claim(peer=PEERS[NODE.address]))
    assert orchestrator.ledger.nodes.all() == []


def test_a_claim_signed_by_another_key_is_refused(orchestrator):
    with pytest.raises(wire.WireError, match=f"not signed by {NODE.address}"):
        orchestrator.work_server.join(PEERS[NODE.address], claim(signer=STRANGER))
    assert orchestrator.ledger.nodes.all() == []
    assert orchestrator.chain.asked == []  # refused before asking the chain


@pytest.mark.parametrize("minutes", [-11, 11])
def test_a_claim_issued_more_than_10_minutes_off_is_refused(orchestrator, minutes):
    late = claim(issued_at=int(time.time()) - minutes * 60)
    with pytest.raises(wire.WireError, match="more than 10 minutes off"):
        orchestrator.work_server.join(PEERS[NODE.address], late)
    assert orchestrator.ledger.nodes.all() == []


def test_a_claim_issued_9_minutes_ago_is_accepted(orchestrator):
    orchestrator.work_server.join(PEERS[NODE.address], claim(issued_at=int(time.time()) - 540))
    assert orchestrator.ledger.nodes.get(NODE.address).state == "joined"


def test_a_refusal_by_the_chain_is_passed_on_with_its_sentence(orchestrator):
    why = f"provider {PROVIDER.address} has staked less than the pool's minimum for 1 node(s)"
    orchestrator.chain.refusal = why
    with pytest.raises(wire.Refusal) as refused:
        orchestrator.session().join(REPORT)
    assert str(refused.value) == why
    assert orchestrator.ledger.nodes.all() == []


def test_a_banned_node_cannot_rejoin(orchestrator):
    orchestrator.active()
    orchestrator.ledger.nodes.set_state(NODE.address, "banned", "evidence", time.time())
    for peer in (PEERS[NODE.address], "12D3KooWFreshPeerAfterTheBan"):
        with pytest.raises(wire.Refusal, match="is banned"):
            orchestrator.session(peer=peer).join(REPORT)
    row = orchestrator.ledger.nodes.get(NODE.address)
    assert (row.state, row.peer_id) == ("banned", PEERS[NODE.address])


def other_protocol(sentence: str) -> NodeReport:
    """The report of a node of a later release, `sentence` its version."""
    return REPORT.model_copy(update={"protocol": WORK_PROTOCOL + 1, "version": sentence})


def test_a_claim_of_another_work_protocol_is_refused_naming_both_and_the_release(orchestrator):
    report = other_protocol("swarmrl 9.0.0 on riscv64")
    with pytest.raises(wire.Refusal) as refused:
        orchestrator.work_server.join(PEERS[NODE.address], claim(report=report))
    assert str(refused.value) == (
        f"this orchestrator speaks work protocol {WORK_PROTOCOL} and the node "
        f"{WORK_PROTOCOL + 1} (swarmrl 9.0.0 on riscv64): run the node with swarmrl "
        f"{__version__}, the release of the orchestrator"
    )
    assert str(refused.value).startswith(VERSION_REFUSAL)
    assert orchestrator.ledger.nodes.all() == []
    assert orchestrator.chain.asked == []  # refused before asking the chain


def test_the_node_knows_the_version_refusal_from_other_refusals(orchestrator):
    with pytest.raises(IncompatibleVersionError) as refused:
        orchestrator.session().join(other_protocol("swarmrl 9.0.0"))
    assert str(refused.value).startswith(f"{VERSION_REFUSAL} {WORK_PROTOCOL} and the node ")
    assert isinstance(refused.value, wire.WireError)  # what the node loop's retries catch
    orchestrator.chain.refusal = "provider has staked less than the pool's minimum"
    with pytest.raises(wire.Refusal, match="staked less"):  # any other refusal: as it came
        orchestrator.session().join(REPORT)


def test_a_reply_in_another_work_protocol_raises_incompatible_version(orchestrator):
    """An orchestrator of another release that let the node in anyway: the node stops
    there rather than misread what it says next."""
    later = DirectServer()

    def join_later(peer: str, claimed: JoinClaim) -> JoinResponse:
        joined = orchestrator.work_server.join(peer, claimed)
        return joined.model_copy(update={"protocol": WORK_PROTOCOL + 1})

    later.serve(JOIN, join_later)
    me = orchestrator.session().me
    session = Session(later.caller(PEERS[NODE.address]), "12D3KooWOrigin", me)
    with pytest.raises(IncompatibleVersionError) as incompatible:
        session.join(REPORT)
    assert str(incompatible.value) == (
        f"the orchestrator speaks work protocol {WORK_PROTOCOL + 1} and this node "
        f"{WORK_PROTOCOL} (swarmrl {__version__}): run the node with the release of the "
        "orchestrator"
    )


def test_a_node_reports_the_work_protocol_and_release_it_runs():
    report = node_report("torch", "cpu")
    assert report.protocol == WORK_PROTOCOL
    assert report.version.startswith(f"swarmrl {__version__} on ")


def gone(orchestrator, node=NODE) -> None:
    """The node falls silent, then is gone (the daemon's sweep, at once)."""
    orchestrator.ledger.nodes.set_state(node.address, "silent", "missed heartbeats", time.time())
    orchestrator.ledger.nodes.set_state(node.address, "gone", "silent for 300 s", time.time())


def test_heartbeats_wait_in_memory_for_the_sweep_that_writes_them_at_once(orchestrator):
    session, other = orchestrator.active(), orchestrator.active(OTHER)
    joined = {a: orchestrator.ledger.nodes.get(a).last_seen for a in (NODE.address, OTHER.address)}
    orchestrator.at(joined[NODE.address] + 30)
    session.heartbeat(None, 80.0)
    other.heartbeat(None, 90.0)
    session.heartbeat(None, None)  # no speed measured this time: the last one stands
    assert orchestrator.ledger.nodes.get(NODE.address).last_seen == joined[NODE.address]
    orchestrator.work_server.sweep(joined[NODE.address] + 31)
    rows = [orchestrator.ledger.nodes.get(a) for a in (NODE.address, OTHER.address)]
    assert [(r.last_seen, r.speed) for r in rows] == [
        (joined[NODE.address] + 30, 80.0),
        (joined[NODE.address] + 30, 90.0),
    ]


def test_heartbeats_in_memory_are_written_when_the_work_server_closes(orchestrator):
    session = orchestrator.active()
    joined = orchestrator.ledger.nodes.get(NODE.address).last_seen
    orchestrator.at(joined + 7)
    session.heartbeat(None, 42.0)
    orchestrator.work_server.close()  # the daemon's stop: nothing waits for a sweep
    with Ledger(orchestrator.root / "data" / "ledger.sqlite3") as reopened:
        row = reopened.nodes.get(NODE.address)
    assert (row.last_seen, row.speed) == (joined + 7, 42.0)


def test_the_sweep_makes_a_quiet_node_silent_then_gone_and_a_heartbeat_brings_it_back(
    orchestrator,
):
    s = orchestrator.settings
    session = orchestrator.active()
    seen = orchestrator.ledger.nodes.get(NODE.address).last_seen
    silent_after = s.silent_after * s.heartbeat_seconds
    orchestrator.work_server.sweep(seen + silent_after)  # not yet
    assert orchestrator.ledger.nodes.get(NODE.address).state == "active"
    orchestrator.work_server.sweep(seen + silent_after + 1)
    assert orchestrator.ledger.nodes.get(NODE.address).state == "silent"
    orchestrator.work_server.sweep(seen + s.gone_after + 1)
    assert orchestrator.ledger.nodes.get(NODE.address).state == "gone"
    orchestrator.at(seen + s.gone_after + 2)
    assert session.join(REPORT).state == "joined"
    assert session.heartbeat(None, None).state == "active"
    moves = [t.to_state for t in orchestrator.ledger.nodes.transitions(NODE.address)]
    assert moves == ["joined", "active", "silent", "gone", "joined", "active"]


def test_a_larger_swarm_is_told_to_beat_less_often_and_judged_by_the_longest_interval(
    tmp_path,
):
    # Half a heartbeat a second for the whole swarm: two nodes beating every 10 s ask 0.2.
    o = Orchestrator(tmp_path, heartbeat_rate=0.05)
    s = o.settings
    try:
        node = o.active(NODE)
        assert o.session(OTHER).join(REPORT).heartbeat_seconds == s.heartbeat_seconds
        o.work_server.sweep(time.time())  # two nodes beating: 2 / 0.05 = 40 s each
        assert heartbeat_interval(s, 2) == 40.0
        assert o.session(OTHER).join(REPORT).heartbeat_seconds == 40.0
        # Never so long that the missed beats reach gone_after: 300 / (3 + 1).
        assert heartbeat_interval(s, 1000) == s.gone_after / (s.silent_after + 1) == 75.0
        # NODE was told 10 s, OTHER 40 s: silence waits for 3 missed beats of the longer.
        seen = o.ledger.nodes.get(NODE.address).last_seen
        o.work_server.sweep(seen + s.silent_after * s.heartbeat_seconds + 1)
        assert o.ledger.nodes.get(NODE.address).state == "active"
        o.work_server.sweep(seen + s.silent_after * 40.0 + 1)
        assert o.ledger.nodes.get(NODE.address).state == "silent"
        assert node.heartbeat(None, None).state == "active"
    finally:
        o.ledger.close()


def test_asking_for_work_keeps_a_node_alive_without_heartbeats(orchestrator):
    """Under load a busy node's heartbeats time out; its work calls show it alive."""
    s = orchestrator.settings
    session = orchestrator.active()
    seen = orchestrator.ledger.nodes.get(NODE.address).last_seen
    later = seen + s.silent_after * s.heartbeat_seconds
    orchestrator.at(later)
    session.work()
    orchestrator.work_server.sweep(later + 1)
    row = orchestrator.ledger.nodes.get(NODE.address)
    assert (row.state, row.last_seen) == ("active", later)
    orchestrator.work_server.sweep(later + s.silent_after * s.heartbeat_seconds + 1)
    assert orchestrator.ledger.nodes.get(NODE.address).state == "silent"


def test_a_gone_node_rejoins(orchestrator):
    orchestrator.active()
    gone(orchestrator)
    assert orchestrator.session().join(REPORT).state == "joined"


def test_a_heartbeat_answers_the_state_the_ledger_holds(orchestrator):
    session = orchestrator.active()
    gone(orchestrator)
    answer = session.heartbeat(None, None)
    assert answer.state == orchestrator.ledger.nodes.get(NODE.address).state


def test_heartbeat_and_work_before_join_are_refused(orchestrator):
    session = orchestrator.session()
    with pytest.raises(wire.Refusal, match="has not joined"):
        session.heartbeat(None, None)
    with pytest.raises(wire.Refusal, match="has not joined"):
        session.work()


# ---- leaving --------------------------------------------------------------------------


def test_a_leaving_heartbeat_makes_the_node_gone_and_its_tasks_another_nodes_at_once(
    orchestrator,
):
    session = orchestrator.active()
    order = session.work().order
    order_id = order.digest(SWARM).hex()
    assert session.heartbeat(None, None, leaving=True).state == "gone"
    left = orchestrator.ledger.nodes.transitions(NODE.address)[-1]
    assert (left.from_state, left.to_state, left.reason) == ("active", "gone", "left")
    assert orchestrator.ledger.orders.get(order_id).state == "expired"
    with pytest.raises(wire.Refusal, match=f"node {NODE.address} is gone"):
        session.work()
    # Long before the order's deadline, with no sweep: the next node takes its tasks.
    theirs = orchestrator.active(OTHER).work().order
    assert [s.problem_id for s in theirs.tasks] == [s.problem_id for s in order.tasks]
    assert orchestrator.ledger.orders.get(order_id).state == "reassigned"


def test_a_node_that_joined_and_left_at_once_is_gone(orchestrator):
    session = orchestrator.session()
    session.join(REPORT)
    assert session.heartbeat(None, None, leaving=True).state == "gone"


def test_a_node_that_left_is_not_watched_for_silence_and_joins_again(orchestrator):
    s = orchestrator.settings
    session = orchestrator.active()
    session.heartbeat(None, 80.0, leaving=True)
    seen = orchestrator.ledger.nodes.get(NODE.address).last_seen
    orchestrator.work_server.sweep(seen + s.gone_after + 1)
    assert session.heartbeat(None, None).state == "gone"  # a heartbeat does not bring it back
    assert session.join(REPORT).state == "joined"
    assert session.heartbeat(None, None).state == "active"
    assert session.work().order.counter == 0  # it never held one
    moves = [t.to_state for t in orchestrator.ledger.nodes.transitions(NODE.address)]
    assert moves == ["joined", "active", "gone", "joined", "active"]


def test_a_banned_node_that_says_it_leaves_stays_banned(orchestrator):
    session = orchestrator.active()
    orchestrator.ledger.nodes.set_state(NODE.address, "banned", "evidence", time.time())
    with pytest.raises(wire.Refusal, match="is banned"):
        session.heartbeat(None, None, leaving=True)
    assert orchestrator.ledger.nodes.get(NODE.address).state == "banned"


# ---- work ---------------------------------------------------------------------------


def test_no_published_step_means_no_order_yet(orchestrator):
    session = orchestrator.active()
    orchestrator.published = None
    answer = session.work()
    assert answer.order is None
    assert answer.retry_after > 0
    assert "no policy" in answer.reason
    assert orchestrator.ledger.orders.open_for(NODE.address) is None


def test_a_full_backlog_means_no_order(orchestrator):
    session = orchestrator.active()
    orchestrator.backlog = orchestrator.settings.max_backlog
    answer = session.work()
    assert answer.order is None
    assert answer.retry_after > 0
    assert orchestrator.ledger.orders.open_for(NODE.address) is None
    orchestrator.backlog -= 1
    assert session.work().order is not None


@pytest.mark.parametrize("published", [10, 11])
def test_a_finished_run_gives_no_order(orchestrator, published):
    session = orchestrator.active()
    orchestrator.published = published
    answer = session.work()
    assert answer.order is None
    assert "10 steps" in answer.reason


def test_an_order_is_drawn_signed_and_recorded(orchestrator):
    session = orchestrator.active()
    order = session.work().order  # the session has checked the run, node and signer
    s = orchestrator.settings
    assert order.signer(SWARM) == ORCHESTRATOR.address
    assert (order.run, order.node, order.counter) == (RUN, NODE.address, 0)
    assert order.min_step == PUBLISHED - s.async_level
    assert (order.group_size, order.max_tokens) == (s.group_size, s.max_tokens)
    assert (order.temperature, order.top_p) == (s.temperature, s.top_p)
    # The run's precision, which its validator prefills in and checks know of.
    assert order.precision == order.assignment(PUBLISHED).precision == s.precision == "bf16"
    assert 0 < order.deadline - time.time() <= s.assignment_seconds
    # Drawn, not chosen: anyone with the task set redraws the same tasks and seed,
    # each with the base budget (the node's speed is not known yet).
    drawn = draw_order(
        sorted(TASKS.values(), key=lambda t: t.problem_id),
        run=RUN,
        node=NODE.address,
        step=PUBLISHED,
        counter=0,
        prompts=s.prompts_per_assignment,
        budget=s.target_len,
    )
    assert (order.tasks, order.seed) == (drawn.tasks, drawn.seed)
    issued = orchestrator.ledger.orders.get(order.digest(SWARM).hex())
    assert (issued.state, issued.order) == ("open", order)


def test_asking_again_before_the_deadline_gets_the_same_order(orchestrator):
    session = orchestrator.active()
    first = session.work().order
    orchestrator.published += 1
    again = session.work().order
    assert again == first
    assert orchestrator.ledger.orders.next_counter(NODE.address) == 1  # no second order was drawn


def test_an_open_order_is_sent_again_while_the_backlog_is_full(orchestrator):
    session = orchestrator.active()
    first = session.work().order
    orchestrator.backlog = orchestrator.settings.max_backlog
    assert session.work().order == first


def test_a_slow_node_gets_shorter_budgets_and_a_fast_one_the_runs(orchestrator):
    session = orchestrator.session()
    session.join(REPORT)
    session.heartbeat(None, 1e-3)
    order = session.work().order
    assert {slot.budget for slot in order.tasks} == {
        min(BUDGETS[0], orchestrator.settings.target_len)
    }
    fast = orchestrator.active(OTHER)
    fast.heartbeat(None, 1e6)
    order = fast.work().order
    assert {slot.budget for slot in order.tasks} == {orchestrator.settings.target_len}


def test_order_sizes_follow_each_nodes_speed_against_the_median_of_the_active_ones(
    orchestrator, tmp_path
):
    s = orchestrator.settings
    third = STRANGER
    sessions = {a: orchestrator.active(a) for a in (NODE, OTHER)}
    sessions[third] = orchestrator.session(third, peer="12D3KooWNodeSevenPeerCCCCCCCCCCCCCCCCCCCC")
    sessions[third].join(REPORT)
    for account, speed in ((NODE, 100.0), (OTHER, 100.0), (third, 210.0)):
        sessions[account].heartbeat(None, speed)
    # Before a sweep has seen any speed, every order is the run's size.
    first = sessions[third].work().order
    assert len(first.tasks) == s.prompts_per_assignment
    answer_with(orchestrator, sessions[third], first, tmp_path)
    orchestrator.work_server.sweep(time.time())
    sizes = {a: len(sessions[a].work().order.tasks) for a in (NODE, OTHER, third)}
    assert sizes == {
        NODE: s.prompts_per_assignment,
        OTHER: s.prompts_per_assignment,
        third: min(2 * s.prompts_per_assignment, len(TASKS)),
    }


def answer_with(orchestrator: Orchestrator, session: Session, order: WorkOrder, tmp_path: Path):
    """The node hands in an honest answer to `order`."""
    path = written(rollouts(order, PUBLISHED), tmp_path / f"answer-{order.counter}.parquet")
    assert session.submit(session.sign(order, PUBLISHED, path), path).receipt.units > 0


def test_nodes_get_their_own_orders(orchestrator):
    mine, theirs = orchestrator.active(NODE).work().order, orchestrator.active(OTHER).work().order
    assert (mine.node, theirs.node) == (NODE.address, OTHER.address)
    assert mine.seed != theirs.seed


# ---- submit -------------------------------------------------------------------------


def rollouts(order: WorkOrder, step: int) -> list[Rollout]:
    """Honest records answering `order`, generated at policy step `step` (the load
    benchmark's nodes send the same)."""
    return load_nodes.answer(order, TASKS, step)


def written(records: list[Rollout], path: Path) -> Path:
    write_rollouts(records, path)
    return path


@pytest.fixture
def ordered(orchestrator, tmp_path):
    """An active node with an open order and an honest answer to it, not yet sent."""
    session = orchestrator.active()
    order = session.work().order
    path = written(rollouts(order, PUBLISHED), tmp_path / "answer.parquet")
    return session, order, path


def test_a_valid_submission_gets_a_signed_receipt_for_its_records(orchestrator, ordered):
    session, order, path = ordered
    header = session.sign(order, PUBLISHED, path)
    receipt = session.submit(header, path).receipt  # checks the run, digest and signer
    records = orchestrator.settings.prompts_per_assignment * orchestrator.settings.group_size
    assert receipt.signer(SWARM) == ORCHESTRATOR.address
    assert (receipt.node, receipt.units, receipt.reason) == (NODE.address, records, "")
    assert receipt.epoch == orchestrator.ledger.epochs.at(
        time.time(), orchestrator.settings.epoch_seconds
    )

    # One digest, whoever computes it: the node, intake, and the contract's Submission.
    contract = Submission(bytes.fromhex(RUN[2:]), NODE.address, PUBLISHED, header.rollout_digest())
    assert receipt.submission == session.digest(header)
    assert receipt.submission == orchestrator.work_server._digest(header).hex()
    assert receipt.submission == contract.digest(POOL_DOMAIN).hex()

    row = orchestrator.ledger.submissions.get(receipt.submission)
    assert (row.node, row.order_id, row.step, row.status) == (
        NODE.address,
        header.order_id,
        PUBLISHED,
        "received",  # the validator's to judge; units are counted once it accepts
    )
    assert (row.signature, row.slashable) == (header.signature, False)
    assert submit.file_sha256(Path(row.file)) == header.file_sha256
    assert Receipt.model_validate_json(row.receipt) == receipt
    assert orchestrator.ledger.orders.get(header.order_id).state == "answered"
    assert orchestrator.ledger.nodes.get(NODE.address).state == "active"


def test_a_resend_gets_the_identical_receipt_and_counts_once(orchestrator, ordered):
    session, order, path = ordered
    header = session.sign(order, PUBLISHED, path)
    first = session.submit(header, path).receipt
    orchestrator.published += 1  # a resend is recognised whatever happened since
    again = session.submit(header, path).receipt
    assert again == first
    assert [s.digest for s in orchestrator.ledger.submissions.all()] == [first.submission]
    assert len(list((orchestrator.settings.data_dir / "submissions").iterdir())) == 1


def test_of_two_answers_to_one_order_past_its_checks_the_second_is_refused_and_not_kept(
    orchestrator, ordered, tmp_path
):
    """Both headers found the order open; the transaction that records the first closes
    it for the second (intake holds no lock across the two)."""
    session, order, path = ordered
    other = written(rollouts(order, PUBLISHED - 1), tmp_path / "older.parquet")
    headers = [session.sign(order, PUBLISHED, path), session.sign(order, PUBLISHED - 1, other)]
    peer = PEERS[NODE.address]
    work_server = orchestrator.work_server
    assert [work_server.check_submission(peer, h) for h in headers] == [None, None]
    spooled = []
    for header, source in zip(headers, (path, other), strict=True):
        copy = tmp_path / f"spooled-{len(spooled)}"
        copy.write_bytes(source.read_bytes())
        spooled.append(work_server.receive_submission(peer, header, copy))
    first, second = spooled
    assert first.receipt is not None
    assert first.receipt.units > 0
    assert second.receipt is None
    assert second.refused == f"work order {headers[1].order_id[:12]} is already answered"
    kept = sorted(p.name for p in (orchestrator.settings.data_dir / "submissions").iterdir())
    assert kept == [f"{first.receipt.submission}.parquet"]
    assert [s.digest for s in orchestrator.ledger.submissions.all()] == [first.receipt.submission]


def test_a_file_other_than_the_signed_one_is_refused_and_not_recorded(
    orchestrator, ordered, tmp_path
):
    session, order, path = ordered
    header = session.sign(order, PUBLISHED, path)
    other = rollouts(order, PUBLISHED)[::-1]
    answer = session.submit(header, written(other, tmp_path / "other.parquet"))
    # Refused for good: the node's copy is what it is, and sent again it is the same.
    assert answer.receipt is None
    assert "sha256" in answer.refused
    assert orchestrator.ledger.submissions.all() == []
    assert orchestrator.ledger.orders.get(header.order_id).state == "open"
    assert list((orchestrator.settings.data_dir / "submissions").iterdir()) == []


def refused_header(orchestrator, header: SubmitHeader, match: str, peer=PEERS[NODE.address]):
    """Refused from the header for now: an error reply, which the node retries."""
    with pytest.raises(wire.WireError, match=match):
        orchestrator.work_server.check_submission(peer, header)
    assert orchestrator.ledger.submissions.all() == []


def refused_for_good(orchestrator, header: SubmitHeader, match: str, peer=PEERS[NODE.address]):
    """Refused from the header with the final answer, which the node settles."""
    answer = orchestrator.work_server.check_submission(peer, header)
    assert answer is not None
    assert answer.receipt is None
    assert re.search(match, answer.refused), answer.refused
    assert orchestrator.ledger.submissions.all() == []


def test_a_header_for_another_nodes_order_is_refused(orchestrator, ordered):
    session, _, path = ordered
    their_order = orchestrator.active(OTHER).work().order
    header = session.sign(their_order, PUBLISHED, path)
    refused_for_good(orchestrator, header, "answers no work order of this node")


def test_a_header_for_an_unknown_order_is_refused(orchestrator, ordered):
    session, order, path = ordered
    header = session.sign(order.model_copy(update={"counter": 7}), PUBLISHED, path)
    refused_for_good(orchestrator, header, "answers no work order of this node")


def test_a_header_naming_another_node_than_the_sender_is_refused(orchestrator, ordered):
    _, order, path = ordered
    orchestrator.active(OTHER)
    # The other node signs a header for this node's order and sends it as itself,
    # or this node's peer sends a header the other node signed.
    header = orchestrator.session(OTHER).sign(order, PUBLISHED, path)
    refused_for_good(orchestrator, header, "answers no work order", peer=PEERS[OTHER.address])
    refused_header(orchestrator, header, "names node .* not the sender")


def test_a_header_for_an_unpublished_step_is_refused(orchestrator, ordered):
    session, order, path = ordered
    header = session.sign(order, PUBLISHED + 1, path)
    refused_header(orchestrator, header, f"policy step {PUBLISHED + 1} was never published")


def other_v(header: SubmitHeader) -> str:
    """The recovery byte the signature does not have (27 and 28 are 1b and 1c)."""
    return "1b" if header.signature.endswith("1c") else "1c"


@pytest.mark.parametrize(
    "forge",
    [
        lambda h: h.model_copy(update={"signature": "ab" * 65}),
        lambda h: h.model_copy(update={"signature": h.signature[:-2] + other_v(h)}),
        lambda h: h.model_copy(update={"file_sha256": "ee" * 32}),
        lambda h: h.model_copy(update={"step": h.step - 1}),
    ],
    ids=["garbage", "other v", "other file", "other step"],
)
def test_a_header_with_a_bad_signature_is_refused(orchestrator, ordered, forge):
    session, order, path = ordered
    header = forge(session.sign(order, PUBLISHED, path))
    refused_for_good(orchestrator, header, "not signed by its node")


@pytest.mark.parametrize(
    "domain",
    [pool_domain(1, POOL), pool_domain(CHAIN_ID, "0x" + "77" * 20), SWARM],
    ids=["other chain", "other pool", "swarm domain"],
)
def test_a_submission_signed_for_another_deployment_is_refused(orchestrator, ordered, domain):
    session, order, path = ordered
    elsewhere = Session(
        session.host, session.peer, Identity(**{**session.me.__dict__, "pool_domain": domain})
    )
    refused_for_good(orchestrator, elsewhere.sign(order, PUBLISHED, path), "not signed by its node")


def test_a_stale_step_is_rejected_but_not_slashable(orchestrator, ordered, tmp_path):
    session, order, _ = ordered
    step = order.min_step  # within the order, but the trainer moves on before it arrives
    path = written(rollouts(order, step), tmp_path / "stale.parquet")
    orchestrator.published = step + orchestrator.settings.async_level + 1
    receipt = session.submit(session.sign(order, step, path), path).receipt
    assert receipt.units == 0
    assert "stale" in receipt.reason
    assert receipt.signer(SWARM) == ORCHESTRATOR.address
    row = orchestrator.ledger.submissions.get(receipt.submission)
    assert (row.status, row.slashable) == ("rejected", False)
    assert orchestrator.ledger.nodes.get(NODE.address).state == "active"


def test_a_step_before_the_orders_minimum_is_rejected_but_not_slashable(
    orchestrator, ordered, tmp_path
):
    session, order, _ = ordered
    step = order.min_step - 1
    path = written(rollouts(order, step), tmp_path / "old.parquet")
    receipt = session.submit(session.sign(order, step, path), path).receipt
    assert (receipt.units, orchestrator.ledger.submissions.get(receipt.submission).slashable) == (
        0,
        False,
    )


def damaged(path: Path, records: list[Rollout]) -> Path:
    """A rollout file whose last bytes (parquet's footer) are zeroed, as a bad disk leaves it."""
    data = written(records, path).read_bytes()
    path.write_bytes(data[:-64] + bytes(64))
    return path


@pytest.mark.parametrize("kind", ["garbage", "damaged"])
def test_an_unreadable_file_is_rejected_but_not_slashable(orchestrator, ordered, tmp_path, kind):
    session, order, _ = ordered
    path = tmp_path / f"{kind}.parquet"
    if kind == "garbage":
        path.write_bytes(b"PAR1 not really PAR1")
    else:
        damaged(path, rollouts(order, PUBLISHED))
    receipt = session.submit(session.sign(order, PUBLISHED, path), path).receipt
    assert receipt.units == 0
    # Of the file as the node sent it; never the path intake spooled it to.
    assert receipt.reason == "its file is not a readable rollout file (damaged, or not parquet)"
    assert not orchestrator.ledger.submissions.get(receipt.submission).slashable


def unasked_task(records, order):
    asked = {slot.problem_id for slot in order.tasks}
    spare = next(p for p in TASKS if p not in asked)
    first = records[0].problem_id
    return [
        r.model_copy(update={"problem_id": spare}).sealed() if r.problem_id == first else r
        for r in records
    ]


def changed(index: int, **fields):
    return lambda records, order: [
        r.model_copy(update=fields).sealed() if i == index else r for i, r in enumerate(records)
    ]


LIES = {
    "a task not in the order": (unasked_task, "does not answer its order"),
    "a missing sample": (lambda records, order: records[:-1], "1 samples missing"),
    "an extra sample": (
        lambda records, order: [*records, records[-1].model_copy(update={"sample": 9}).sealed()],
        "1 not asked for",
    ),
    "a sample twice": (lambda records, order: [*records, records[0]], "one sample twice"),
    "a wrong seed": (changed(1, seed=12345), "seed is 12345"),
    "a wrong budget": (changed(2, target_len=99), "budget is 99"),
    "a wrong temperature": (changed(0, temperature=1.0), "temperature is 1.0"),
    "a wrong max_tokens": (changed(3, max_tokens=64), "max_tokens is 64"),
    "another node's records": (
        changed(0, node=OTHER.address),
        f"node is {OTHER.address}",
    ),
    "another run": (changed(0, run="0x" + "5b" * 32), "run is 0x5b"),
    "a step other than signed": (changed(4, policy_step=PUBLISHED - 1), "policy step is 2"),
}


@pytest.mark.parametrize("lie", LIES)
def test_records_that_do_not_answer_the_order_are_evidence(orchestrator, ordered, tmp_path, lie):
    session, order, _ = ordered
    forge, reason = LIES[lie]
    path = written(forge(rollouts(order, PUBLISHED), order), tmp_path / "lie.parquet")
    receipt = session.submit(session.sign(order, PUBLISHED, path), path).receipt
    assert receipt.units == 0
    assert reason in receipt.reason
    row = orchestrator.ledger.submissions.get(receipt.submission)
    assert (row.status, row.slashable, row.reason) == ("rejected", True, receipt.reason)
    # The node's own signature over the Submission is kept: the evidence for the chain.
    assert row.signature == session.sign(order, PUBLISHED, path).signature
    assert orchestrator.ledger.nodes.get(NODE.address).state == "banned"
    with pytest.raises(wire.Refusal, match="banned"):
        session.work()


def test_an_answered_order_cannot_be_answered_again(orchestrator, ordered, tmp_path):
    session, order, path = ordered
    assert session.submit(session.sign(order, PUBLISHED, path), path).receipt.units > 0
    orchestrator.published += 1
    again = session.sign(order, PUBLISHED + 1, path)  # the same records, signed as newer
    answer = orchestrator.work_server.check_submission(PEERS[NODE.address], again)
    assert answer.refused == f"work order {again.order_id[:12]} is already answered"
    assert len(orchestrator.ledger.submissions.all()) == 1


def test_outcomes_reach_the_node_with_its_heartbeat(orchestrator, ordered):
    session, order, path = ordered
    receipt = session.submit(session.sign(order, PUBLISHED, path), path).receipt
    orchestrator.ledger.submissions.set_outcome(
        receipt.submission, "accepted", receipt.units, "", False, True, time.time()
    )
    (outcome,) = session.heartbeat(PUBLISHED, None).outcomes
    assert (outcome.digest, outcome.status, outcome.units) == (
        receipt.submission,
        "accepted",
        receipt.units,
    )


# ---- rate limits --------------------------------------------------------------------


def test_a_burst_past_the_limit_is_refused_per_peer():
    limiter = RateLimiter(rate=1e-6, burst=RATE_BURST)  # no refill within the test
    assert all(limiter.allow("flood") for _ in range(int(RATE_BURST)))
    assert not limiter.allow("flood")
    assert not limiter.allow("flood")
    assert limiter.allow("calm")


def test_tokens_refill_with_time():
    rate = 50.0
    limiter = RateLimiter(rate=rate, burst=1)
    assert limiter.allow("peer")
    # Refused as soon as two calls come within 1/rate of each other.
    assert any(not limiter.allow("peer") for _ in range(10_000))
    time.sleep(2 / rate)
    assert limiter.allow("peer")


def test_intake_refuses_a_flood_from_one_peer_before_reading_it(orchestrator):
    orchestrator.work_server.limiter = RateLimiter(rate=1e-6, burst=3)
    peer = PEERS[NODE.address]
    for _ in range(3):
        with pytest.raises(wire.WireError):
            orchestrator.host.answer(HEARTBEAT, peer, b"not json")
    for spec in (JOIN, WORK):
        with pytest.raises(wire.Refusal, match="too many requests"):
            orchestrator.host.answer(spec, peer, wire.dump(claim()))
    submissions, _ = orchestrator.host.uploads[SUBMIT.id]
    with pytest.raises(wire.Refusal, match="too many requests"):
        submissions.admit_peer(peer)
    # Another peer is not held back by this one.
    orchestrator.host.answer(JOIN, PEERS[OTHER.address], wire.dump(claim(OTHER)))
    assert [n.address for n in orchestrator.ledger.nodes.all()] == [OTHER.address]


# ---- expiry -------------------------------------------------------------------------


def test_an_expired_order_goes_to_another_node_and_cannot_be_answered(
    orchestrator, ordered, tmp_path
):
    session, order, path = ordered
    order_id = order.digest(SWARM).hex()
    orchestrator.ledger.orders.expire(order.deadline + 1)
    assert orchestrator.ledger.nodes.get(NODE.address).abandoned == 1
    # Not to the node that dropped it: its next order is a fresh draw.
    own = session.work().order
    assert own.counter == 1
    assert orchestrator.ledger.orders.get(order_id).state == "expired"

    theirs = orchestrator.active(OTHER).work().order
    assert [s.problem_id for s in theirs.tasks] == [s.problem_id for s in order.tasks]
    assert theirs.seed != order.seed  # the new order's own seed, drawn as always
    assert orchestrator.ledger.orders.get(order_id).state == "reassigned"
    answer = orchestrator.work_server.check_submission(
        PEERS[NODE.address], session.sign(order, PUBLISHED, path)
    )
    assert answer.refused == f"work order {order_id[:12]} is already reassigned"
    # Taken over once: left now are the two later orders, each for the other node.
    orchestrator.ledger.orders.expire(theirs.deadline + 1)
    assert orchestrator.ledger.orders.orphaned(excluding=NODE.address).order.node == OTHER.address
    left = orchestrator.ledger.orders.orphaned(excluding=OTHER.address)
    assert left.order_id == own.digest(SWARM).hex()


def test_an_expired_order_whose_tasks_left_the_task_set_is_dropped(orchestrator):
    order = orchestrator.active(NODE).work().order
    orchestrator.ledger.orders.expire(order.deadline + 1)
    orchestrator.work_server.tasks.pop(order.tasks[0].problem_id)  # a restart with another file
    theirs = orchestrator.active(OTHER).work().order
    drawn = draw_order(
        orchestrator.work_server.task_list,
        run=RUN,
        node=OTHER.address,
        step=PUBLISHED,
        counter=0,
        prompts=orchestrator.settings.prompts_per_assignment,
        budget=orchestrator.settings.target_len,
    )
    assert theirs.tasks == drawn.tasks
    assert orchestrator.ledger.orders.get(order.digest(SWARM).hex()).state == "dropped"


# ---- abandoned orders -----------------------------------------------------------------


def abandon(orchestrator: Orchestrator, session: Session) -> WorkOrder:
    """The node takes an order and leaves it: the daemon's sweep expires it past its
    deadline, and the clock stands just past it."""
    order = session.work().order
    assert order is not None, "the node was refused work"
    orchestrator.ledger.orders.expire(order.deadline + 1)
    orchestrator.at(order.deadline + 1)
    return order


def answer(orchestrator: Orchestrator, session: Session, tmp_path: Path) -> None:
    """The node takes an order and hands in an honest answer."""
    order = session.work().order
    assert order is not None, "the node was refused work"
    path = written(rollouts(order, PUBLISHED), tmp_path / f"answer-{order.counter}.parquet")
    assert session.submit(session.sign(order, PUBLISHED, path), path).receipt.units > 0


def held_back(session: Session, abandoned: int, seconds: int) -> None:
    """The node is refused work for `seconds` more, for `abandoned` orders in a row."""
    response = session.work()
    assert response.order is None
    assert response.reason == (
        f"node {NODE.address} left its last {abandoned} work orders unanswered past their "
        f"deadlines, so it gets no new work for {seconds} s; answering the next one it gets "
        "starts the count over"
    )
    assert response.retry_after == pytest.approx(seconds, abs=1e-3)


def test_a_node_that_abandons_its_orders_gets_no_work_for_a_cooldown_that_grows(orchestrator):
    s = orchestrator.settings
    session, other = orchestrator.active(), orchestrator.active(OTHER)
    left = [abandon(orchestrator, session) for _ in range(s.abandon_limit)]
    last = left[-1]
    held_back(session, s.abandon_limit, int(s.abandon_cooldown) - 1)
    # Its orders' tasks go to the nodes that work meanwhile, the oldest first.
    theirs = other.work().order
    assert [t.problem_id for t in theirs.tasks] == [t.problem_id for t in left[0].tasks]
    orchestrator.at(last.deadline + s.abandon_cooldown - 1)
    held_back(session, s.abandon_limit, 1)
    orchestrator.at(last.deadline + s.abandon_cooldown)
    last = abandon(orchestrator, session)  # one order after the cooldown, left again
    held_back(session, s.abandon_limit + 1, 2 * int(s.abandon_cooldown) - 1)
    orchestrator.at(last.deadline + 2 * s.abandon_cooldown)
    assert session.work().order is not None


def test_a_cooldown_past_the_longest_wait_a_reply_states_is_asked_out(tmp_path):
    orchestrator = Orchestrator(tmp_path, abandon_limit=2, abandon_cooldown=3000.0)
    try:
        session = orchestrator.active()
        for _ in range(3):
            last = abandon(orchestrator, session)
            orchestrator.at(last.deadline + 3000.0)
        orchestrator.at(last.deadline + 1)
        response = session.work()
        assert (response.order, response.retry_after) == (None, 3600.0)
        assert "no new work for 5999 s" in response.reason
    finally:
        orchestrator.ledger.close()


def test_an_answered_order_starts_the_count_over(orchestrator, tmp_path):
    s = orchestrator.settings
    session = orchestrator.active()
    for _ in range(2):  # an honest node loses an order, once and again later
        for _ in range(s.abandon_limit - 1):
            abandon(orchestrator, session)
        answer(orchestrator, session, tmp_path)
    for _ in range(s.abandon_limit):
        abandon(orchestrator, session)
    held_back(session, s.abandon_limit, int(s.abandon_cooldown) - 1)


def test_a_cooldown_holds_after_the_orchestrator_restarts(orchestrator, tmp_path):
    s = orchestrator.settings
    session = orchestrator.active()
    for _ in range(s.abandon_limit):
        last = abandon(orchestrator, session)
    orchestrator.ledger.close()
    restarted = Orchestrator(tmp_path)
    try:
        restarted.at(last.deadline + 1)
        held_back(restarted.session(), s.abandon_limit, int(s.abandon_cooldown) - 1)
    finally:
        restarted.ledger.close()


def test_a_node_held_back_says_why_once_per_reason_and_waits_as_told(orchestrator, tmp_path):
    events: list[Event] = []
    node = Node(
        NodeSettings(data_dir=tmp_path / "node", keystore_dir=tmp_path / "keys"),
        account=NODE,
        on_event=events.append,
    )
    node.session = orchestrator.active()
    # No weight swarm: the weights it would load before asking are not under test.
    node.swarm = SimpleNamespace()
    node._weights = lambda at_least, precision: tmp_path
    node.stop()  # every wait returns at once: what it would wait is in the event
    orchestrator.published = None
    node._one_order()
    node._one_order()
    orchestrator.published = PUBLISHED
    for _ in range(orchestrator.settings.abandon_limit):
        abandon(orchestrator, node.session)
    node._one_order()
    assert [(e.kind, e.extra["wait"]) for e in events] == [
        (EventKind.NO_WORK, "2s"),
        (EventKind.NO_WORK, f"{orchestrator.settings.abandon_cooldown - 1:.0f}s"),
    ]
    assert events[0].reason == "no policy is published yet"
    assert events[1].reason.startswith(f"node {NODE.address} left its last 3 work orders")


def test_a_finishing_node_sends_what_waits_then_leaves_and_stops(orchestrator, tmp_path):
    """`swarmrl node finish`: the loop hands in what its journal holds, tells the
    orchestrator it leaves, and ends; the orchestrator has the node gone, not silent."""
    events: list[EventKind] = []
    node = Node(
        NodeSettings(data_dir=tmp_path / "node", keystore_dir=tmp_path / "keys"),
        account=NODE,
        on_event=lambda event: events.append(event.kind),
    )
    session = orchestrator.active()
    sent: list[str] = []
    node._identity = lambda: None  # type: ignore[method-assign]
    node._start_swarm = lambda me: None  # type: ignore[method-assign]
    node._resend = lambda: sent.append("resent")  # type: ignore[method-assign]
    node.session = session
    node.state.joined = True
    node.pause()  # a paused node drains all the same
    node.finish()
    node.run()
    assert sent == ["resent"]
    assert events[-2:] == [EventKind.LEFT, EventKind.STOPPED]
    left = orchestrator.ledger.nodes.transitions(NODE.address)[-1]
    assert (left.to_state, left.reason) == ("gone", "left")
