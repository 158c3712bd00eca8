"""The orchestrator's ledger on real SQLite files: round trips, idempotent intake,
persisted transitions, expiry, epochs, several processes, and SIGKILL mid-write."""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import pytest
from eth_utils import to_checksum_address

from orchestrator.service.ledger import Ledger
from orchestrator.service.ledger.nodes import Seen
from orchestrator.service.ledger.orders import Abandoned, OrderRow
from orchestrator.service.ledger.schema import SCHEMA_VERSION
from orchestrator.service.ledger.submissions import Lease, SubmissionRow
from orchestrator.service.ledger.transitions import TRANSITIONS
from swarmrl.chain.anvil import dev_accounts
from swarmrl.eip712 import swarm_domain
from swarmrl.rollouts.tolerances import NO_SUMS, TemperatureSums
from swarmrl.work.assign import Slot, WorkOrder

NODE = "0x" + "ab" * 20
OTHER = "0x" + "cd" * 20
NODE_CHECKSUM, OTHER_CHECKSUM = to_checksum_address(NODE), to_checksum_address(OTHER)
PROVIDER = "0x" + "12" * 20
RUN = "0x" + "5a" * 32
ORCHESTRATOR = dev_accounts(2)[1]
REPO = Path(__file__).resolve().parents[2]


def submission(n: int, *, node: str = NODE, epoch: int = 0, received_at: float = 100.0):
    return SubmissionRow(
        digest=f"{n:064x}",
        node=node,
        order_id=f"{n + 1000:064x}",
        epoch=epoch,
        step=n,
        file=f"/data/submissions/{n}.parquet",
        file_sha256=f"{n + 2000:064x}",
        rollout_digest=f"{n + 3000:064x}",
        signature="0x" + "11" * 65,
        received_at=received_at + n,
        receipt=f'{{"n": {n}}}',
    )


def order(*, node: str = NODE, deadline: int = 500, counter: int = 0) -> WorkOrder:
    return WorkOrder(
        run=RUN,
        node=node,
        counter=counter,
        min_step=3,
        seed=2**64 - 1,  # a full uint64 seed survives SQLite's signed integers
        group_size=8,
        max_tokens=128,
        temperature=1.0,
        top_p=0.95,
        tasks=[Slot(problem_id="gsm8k/17", budget=256), Slot(problem_id="mbpp/3", budget=1)],
        deadline=deadline,
        signature="22" * 65,
    )


def add_order(ledger: Ledger, n: int, **fields) -> WorkOrder:
    """Order `n` (its id is n in hex), issued at 200.0."""
    issued = order(**fields)
    ledger.orders.add(f"{n:064x}", issued, 200.0)
    return issued


@pytest.fixture
def ledger(tmp_path):
    with Ledger(tmp_path / "data" / "ledger.sqlite3") as opened:
        yield opened


def test_everything_written_reads_back_after_a_reopen(tmp_path):
    path = tmp_path / "ledger.sqlite3"
    with Ledger(path) as ledger:
        genesis = ledger.epochs.genesis()
        ledger.nodes.join(NODE, PROVIDER, "12D3peer", "torch", {"device": "cpu", "gib": 8}, 10.0)
        ledger.nodes.touch({NODE: Seen(20.0, 123.5)})
        issued = add_order(ledger, 1)
        ledger.submissions.record(submission(1))
        ledger.submissions.set_outcome(f"{1:064x}", "accepted", 8, "", False, True, 30.0)
        ledger.epochs.record(0, NODE, 8, "ff" * 32, "0x" + "aa" * 32, now=40.0)
        ledger.slashes.record(f"{1:064x}", 0, NODE, None, 50.0, outcome="found")

    with Ledger(path) as ledger:
        assert ledger.epochs.genesis() == genesis
        node = ledger.nodes.get(NODE)
        assert node is not None
        assert node.address == NODE_CHECKSUM
        assert node.hardware == {"device": "cpu", "gib": 8}
        assert (node.peer_id, node.backend, node.state) == ("12D3peer", "torch", "joined")
        assert (node.joined_at, node.last_seen, node.speed) == (10.0, 20.0, 123.5)
        assert ledger.nodes.by_peer("12D3peer") == node
        assert ledger.nodes.all() == [node]
        stored = OrderRow(f"{1:064x}", issued, 200.0, "open")
        assert ledger.orders.get(f"{1:064x}") == stored
        assert ledger.orders.open_for(NODE) == stored
        stored = ledger.submissions.get(f"{1:064x}")
        assert stored is not None
        assert (stored.status, stored.units, stored.prefilled) == ("accepted", 8, True)
        assert stored.validated_at == 30.0
        assert stored.node == NODE_CHECKSUM
        assert stored.receipt == '{"n": 1}'
        epoch = ledger.epochs.get(0, NODE)
        assert epoch is not None
        assert (epoch.units, epoch.commitment, epoch.tx_hash) == (8, "ff" * 32, "0x" + "aa" * 32)
        assert ledger.epochs.all() == [epoch]
        [slash] = ledger.slashes.all()
        assert (slash.digest, slash.epoch, slash.tx_hash) == (f"{1:064x}", 0, None)
        assert slash.outcome == "found"
        assert ledger.nodes.get("0x" + "99" * 20) is None
        assert ledger.submissions.get("00" * 32) is None


def test_recording_a_submission_answers_its_order_in_the_same_write(ledger):
    add_order(ledger, 1007)  # submission(7) answers order 1007
    assert ledger.orders.open_for(NODE).order_id == f"{1007:064x}"
    ledger.submissions.record(submission(7))
    assert ledger.orders.get(f"{1007:064x}").state == "answered"
    assert ledger.orders.open_for(NODE) is None


def test_a_resent_submission_is_recognised_and_counted_once(ledger):
    first, created = ledger.submissions.record(submission(7))
    assert created
    # A resend after a lost reply carries the same digest, maybe a later arrival time
    # and another file: the first row (and the receipt the node got) stands.
    resend = submission(7, received_at=900.0)
    again, created_again = ledger.submissions.record(resend)
    assert not created_again
    assert again == first
    assert again.received_at == 107.0
    assert [s.digest for s in ledger.submissions.all()] == [first.digest]
    ledger.submissions.set_outcome(first.digest, "accepted", 4, "", False, False, 10.0)
    # Even after validation, a resend neither resets nor duplicates it.
    after, created_after = ledger.submissions.record(resend)
    assert (created_after, after.status, after.units) == (False, "accepted", 4)
    assert len(ledger.submissions.all(node=NODE)) == 1


def test_submissions_filter_by_node_epoch_and_status(ledger):
    ledger.submissions.record(submission(1, epoch=0))
    ledger.submissions.record(submission(2, epoch=1))
    ledger.submissions.record(submission(3, epoch=1, node=OTHER))
    ledger.submissions.set_outcome(f"{2:064x}", "rejected", 0, "stale step", False, False, 5.0)
    assert [s.step for s in ledger.submissions.all(epoch=1)] == [2, 3]
    assert [s.step for s in ledger.submissions.all(node=NODE)] == [1, 2]
    assert [s.step for s in ledger.submissions.all(status="received")] == [1, 3]
    assert [s.step for s in ledger.submissions.all(node=NODE, epoch=1, status="rejected")] == [2]
    assert [s.step for s in ledger.submissions.claim(Lease("v", "a"), 1, 6.0, 60.0)] == [1]
    assert [s.step for s in ledger.submissions.claim(Lease("w", "b"), 10, 6.0, 60.0)] == [3]
    with pytest.raises(ValueError, match="submission status must be one of"):
        ledger.submissions.all(status="maybe")


def test_the_latest_submissions_of_a_node(ledger):
    for n in range(6):
        ledger.submissions.record(submission(n, node=NODE if n % 3 else OTHER))
    assert [s.step for s in ledger.submissions.latest(NODE, 3)] == [2, 4, 5]
    assert [s.step for s in ledger.submissions.latest(OTHER, 10)] == [0, 3]


def test_the_tally_counts_what_the_rows_hold(ledger):
    for n in range(5):
        ledger.submissions.record(submission(n, node=NODE if n < 3 else OTHER))
    ledger.submissions.set_outcome(f"{0:064x}", "accepted", 16, "", False, True, 5.0)
    ledger.submissions.set_outcome(
        f"{1:064x}", "accepted", 12, "1 of 16 rejected: x", False, False, 5.0
    )
    ledger.submissions.set_outcome(f"{3:064x}", "rejected", 0, "stale step", False, False, 5.0)
    ledger.submissions.set_outcome(f"{4:064x}", "rejected", 0, "stale step", False, False, 5.0)
    tally = ledger.submissions.tally()
    assert tally.by_status == {"accepted": (2, 28), "received": (1, 0), "rejected": (2, 0)}
    assert tally.per_node[(NODE_CHECKSUM, "accepted")] == (2, 28)
    assert tally.per_node[(OTHER_CHECKSUM, "rejected")] == (2, 0)
    assert tally.reasons == {"stale step": 2}
    assert (tally.count("received"), tally.count("banned"), tally.units()) == (1, 0, 28)
    counts = [ledger.submissions.count(status) for status in ("received", "accepted", "rejected")]
    assert counts == [1, 2, 2]
    with pytest.raises(ValueError, match="submission status must be one of"):
        ledger.submissions.count("banned")


def test_threads_share_one_ledger(ledger):
    counters: list[int] = []

    def work(first: int) -> None:
        for n in range(first, first + 40):
            ledger.submissions.record(submission(n))
            counters.append(ledger.orders.next_counter(NODE))

    threads = [threading.Thread(target=work, args=(first,)) for first in (0, 40, 80, 120)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(counters) == list(range(160))
    assert sorted(s.step for s in ledger.submissions.all()) == list(range(160))


def test_state_transitions_are_persisted_in_order(tmp_path):
    path = tmp_path / "ledger.sqlite3"
    with Ledger(path) as ledger:
        ledger.nodes.join(NODE, PROVIDER, "peer", "torch", {}, 1.0)
        ledger.nodes.set_state(NODE, "active", "first heartbeat", 2.0)
        ledger.nodes.set_state(NODE, "active", "another heartbeat", 3.0)  # no transition
        ledger.nodes.set_state(NODE, "silent", "missed 3 heartbeats", 4.0)
        ledger.nodes.set_state(NODE, "banned", "slashed", 5.0)
        # A banned node that joins again keeps its state.
        ledger.nodes.join(NODE, PROVIDER, "peer2", "vllm", {}, 6.0)
        with pytest.raises(ValueError, match="node state must be one of"):
            ledger.nodes.set_state(NODE, "asleep", "", 7.0)
        with pytest.raises(ValueError, match="no node"):
            ledger.nodes.set_state(OTHER, "active", "", 7.0)
    with Ledger(path) as ledger:
        moves = [(t.from_state, t.to_state, t.reason, t.at) for t in ledger.nodes.transitions(NODE)]
        assert moves == [
            (None, "joined", "joined the swarm", 1.0),
            ("joined", "active", "first heartbeat", 2.0),
            ("active", "silent", "missed 3 heartbeats", 4.0),
            ("silent", "banned", "slashed", 5.0),
        ]
        node = ledger.nodes.get(NODE)
        assert node is not None
        assert (node.state, node.peer_id, node.backend) == ("banned", "peer2", "vllm")
        assert node.joined_at == 1.0


def test_states_move_only_as_the_transition_table_allows(ledger):
    for states, moves in TRANSITIONS.items():
        assert set(moves) == {None, *states}  # every state says where it may go
    ledger.nodes.join(NODE, PROVIDER, "peer", "torch", {}, 1.0)
    assert ledger.nodes.set_state(NODE, "silent", "missed heartbeats", 3.0)
    assert ledger.nodes.set_state(NODE, "gone", "silent for long", 4.0)
    assert not ledger.nodes.set_state(NODE, "active", "heartbeat", 5.0)  # a gone node joins again
    assert ledger.nodes.set_state(NODE, "joined", "joined again", 6.0)
    assert ledger.nodes.set_state(NODE, "banned", "evidence", 7.0)
    for state in ("joined", "active", "silent", "gone"):
        assert not ledger.nodes.set_state(NODE, state, "", 8.0)  # banned for good
    moves = [t.to_state for t in ledger.nodes.transitions(NODE)]
    assert moves == ["joined", "silent", "gone", "joined", "banned"]

    add_order(ledger, 1007, deadline=100)
    ledger.submissions.record(submission(7))  # answers order 1007
    assert ledger.orders.expire(200.0) == []  # an answered order does not expire
    assert not ledger.orders.set_state(f"{1007:064x}", "open")
    add_order(ledger, 2, deadline=100)
    [expired] = ledger.orders.expire(200.0)
    ledger.orders.add(f"{3:064x}", order(counter=1), 300.0, takes_over=expired.order_id)
    with pytest.raises(ValueError, match="is not expired"):  # taken over once
        ledger.orders.add(f"{4:064x}", order(counter=2), 300.0, takes_over=expired.order_id)
    assert [ledger.orders.get(f"{n:064x}").state for n in (1007, 2, 3)] == [
        "answered",
        "reassigned",
        "open",
    ]

    assert ledger.submissions.set_outcome(f"{7:064x}", "accepted", 8, "", False, True, 9.0)
    assert not ledger.submissions.set_outcome(f"{7:064x}", "rejected", 0, "again", True, True, 10.0)
    assert (
        ledger.submissions.get(f"{7:064x}").status,
        ledger.submissions.get(f"{7:064x}").units,
    ) == (
        "accepted",
        8,
    )  # a verdict stands
    with pytest.raises(ValueError, match="nothing enters the ledger accepted"):
        ledger.submissions.record(SubmissionRow(**{**submission(8).__dict__, "status": "accepted"}))


def test_expired_orders_cost_their_node_standing(ledger):
    ledger.nodes.join(NODE, PROVIDER, "peer", "torch", {}, 1.0)
    ledger.nodes.join(OTHER, PROVIDER, "peer-b", "torch", {}, 1.0)
    add_order(ledger, 1, deadline=100)
    add_order(ledger, 2, node=OTHER, deadline=300)
    add_order(ledger, 3, deadline=50, counter=1)
    add_order(ledger, 4, node=OTHER, deadline=90, counter=1)
    ledger.orders.set_state(f"{4:064x}", "answered")

    expired = ledger.orders.expire(200.0)
    assert [(a.order_id, a.state) for a in expired] == [
        (f"{3:064x}", "expired"),
        (f"{1:064x}", "expired"),
    ]
    assert ledger.nodes.get(NODE).abandoned == 2
    assert ledger.nodes.get(OTHER).abandoned == 0  # its one late order was answered
    assert ledger.orders.open_for(NODE) is None
    assert ledger.orders.open_for(OTHER).order_id == f"{2:064x}"
    assert ledger.orders.expire(200.0) == []  # expiring twice costs nothing more
    assert ledger.nodes.get(NODE).abandoned == 2
    with pytest.raises(ValueError, match="no work order"):
        ledger.orders.set_state("00" * 32, "answered")


def test_a_node_that_left_has_its_open_orders_expired_whatever_their_deadlines(ledger):
    ledger.nodes.join(NODE, PROVIDER, "peer", "torch", {}, 1.0)
    ledger.nodes.join(OTHER, PROVIDER, "peer-b", "torch", {}, 1.0)
    add_order(ledger, 1, deadline=10**9)
    add_order(ledger, 2, deadline=10**9, counter=1)
    ledger.orders.set_state(f"{2:064x}", "answered")
    add_order(ledger, 3, node=OTHER, deadline=10**9)

    [expired] = ledger.orders.expire_for(NODE)
    assert (expired.order_id, expired.state) == (f"{1:064x}", "expired")
    assert ledger.nodes.get(NODE).abandoned == 1
    assert ledger.orders.get(f"{2:064x}").state == "answered"  # answered stays answered
    assert ledger.orders.open_for(OTHER).order_id == f"{3:064x}"  # another node's stays open
    assert ledger.orders.orphaned(excluding=OTHER).order_id == f"{1:064x}"
    assert ledger.orders.expire_for(NODE) == []


def test_abandoned_orders_count_since_the_newest_answered_one_and_survive_a_reopen(tmp_path):
    path = tmp_path / "ledger.sqlite3"
    with Ledger(path) as ledger:
        assert ledger.orders.abandoned(NODE) == Abandoned(0, 0)
        ledger.nodes.join(NODE, PROVIDER, "peer", "torch", {}, 1.0)
        for n, deadline in enumerate((100, 200, 300)):
            add_order(ledger, n, deadline=deadline, counter=n)
        ledger.orders.set_state(f"{1:064x}", "answered")
        ledger.orders.expire(1_000.0)
        # Order 0 was left before the answered one: only order 2 counts.
        assert ledger.orders.abandoned(NODE) == Abandoned(1, 300)
        add_order(ledger, 3, deadline=400, counter=3)
        ledger.orders.expire(1_000.0)
        add_order(ledger, 4, node=OTHER, deadline=500, counter=0)  # another node's
        ledger.orders.expire(1_000.0)
        add_order(ledger, 5, deadline=600, counter=4)  # taking order 3's tasks over
        ledger.orders.add(f"{6:064x}", order(node=OTHER, counter=1), 1.0, takes_over=f"{3:064x}")
        assert ledger.orders.abandoned(NODE) == Abandoned(2, 400)  # order 5 is still open
    with Ledger(path) as ledger:
        assert ledger.orders.abandoned(NODE_CHECKSUM) == Abandoned(2, 400)
        assert ledger.orders.abandoned(OTHER) == Abandoned(1, 500)
        ledger.orders.set_state(f"{5:064x}", "answered")
        assert ledger.orders.abandoned(NODE) == Abandoned(0, 0)


def test_counters_are_per_node_and_survive_a_restart(tmp_path):
    path = tmp_path / "ledger.sqlite3"
    with Ledger(path) as ledger:
        assert [ledger.orders.next_counter(NODE) for _ in range(3)] == [0, 1, 2]
        assert ledger.orders.next_counter(OTHER) == 0
    with Ledger(path) as ledger:
        assert ledger.orders.next_counter(NODE_CHECKSUM) == 3


def test_trust_and_outcomes(ledger):
    ledger.nodes.join(NODE, PROVIDER, "peer", "torch", {}, 1.0)
    ledger.nodes.add_trust(NODE)
    ledger.nodes.add_trust(NODE.upper().replace("0X", "0x"))
    assert ledger.nodes.get(NODE).trusted == 2
    with pytest.raises(ValueError, match="no submission"):
        ledger.submissions.set_outcome("00" * 32, "accepted", 1, "", False, False, 1.0)


def test_epochs_count_from_genesis_and_unrecorded_ones_are_listed(ledger):
    genesis = ledger.epochs.genesis()
    assert ledger.epochs.at(genesis, 60) == 0
    assert ledger.epochs.at(genesis + 59.9, 60) == 0
    assert ledger.epochs.at(genesis + 60, 60) == 1
    assert ledger.epochs.at(genesis + 3 * 3600 + 1, 3600) == 3
    assert ledger.epochs.at(genesis - 5, 60) == 0  # a clock a little behind
    with pytest.raises(ValueError, match="epoch_seconds must be positive"):
        ledger.epochs.at(genesis, 0)

    ledger.submissions.record(submission(1, epoch=0))
    ledger.submissions.record(submission(2, epoch=0))
    ledger.submissions.record(submission(3, epoch=0, node=OTHER))
    ledger.submissions.record(submission(4, epoch=2))
    assert ledger.epochs.unrecorded(2) == [(0, NODE_CHECKSUM), (0, OTHER_CHECKSUM)]
    assert ledger.epochs.unrecorded(3) == [
        (0, NODE_CHECKSUM),
        (0, OTHER_CHECKSUM),
        (2, NODE_CHECKSUM),
    ]
    ledger.epochs.record(0, NODE, 0, "00" * 32, None)
    ledger.epochs.record(0, NODE, 5, "11" * 32, "0x12")  # the first record stands
    assert ledger.epochs.unrecorded(3) == [(0, OTHER_CHECKSUM), (2, NODE_CHECKSUM)]
    assert ledger.epochs.get(0, NODE).units == 0


def test_unrecorded_looks_only_from_the_oldest_epoch_still_waiting(ledger):
    for n, epoch in ((1, 0), (2, 3), (3, 5)):
        ledger.submissions.record(submission(n, epoch=epoch))
    ledger.epochs.record(0, NODE, 1, "aa" * 32, "0x01")
    assert ledger.epochs.unrecorded(9) == [(3, NODE_CHECKSUM), (5, NODE_CHECKSUM)]
    # Epochs 0 to 2 are whole now: a row written below them (which intake never writes)
    # is not looked at again.
    ledger.submissions.record(submission(4, epoch=1))
    assert ledger.epochs.unrecorded(9) == [(3, NODE_CHECKSUM), (5, NODE_CHECKSUM)]
    ledger.epochs.record(3, NODE, 1, "bb" * 32, "0x02", part=0, membership=1)
    ledger.epochs.record(5, NODE, 1, "cc" * 32, "0x03", part=0, membership=1)
    assert ledger.epochs.unrecorded(9) == []
    # The mark stops one epoch short of the current one's: a submission acknowledged at
    # the very end of epoch 8 and written after it ended is still found.
    ledger.submissions.record(submission(5, epoch=8))
    assert ledger.epochs.unrecorded(10) == [(8, NODE_CHECKSUM)]
    # A part the chain dropped waits again, however far the mark had moved.
    ledger.epochs.record(8, NODE, 1, "dd" * 32, "0x04", part=0, membership=1)
    assert ledger.epochs.unrecorded(10) == []
    ledger.epochs.dropped(3, 0)
    assert ledger.epochs.unrecorded(10) == [(3, NODE_CHECKSUM)]


def test_slash_candidates_are_evidence_in_epochs_on_chain(ledger):
    for n, epoch in ((1, 0), (2, 0), (3, 1), (4, 2)):
        ledger.submissions.record(submission(n, epoch=epoch))
    for n in (1, 2, 3, 4):
        ledger.submissions.set_outcome(f"{n:064x}", "rejected", 0, "toploc", True, True, 10.0)
    ledger.epochs.record(0, NODE, 1, "aa" * 32, "0x01")
    ledger.epochs.record(1, NODE, 0, "bb" * 32, None)  # nothing on chain: no evidence
    assert [s.step for s in ledger.slashes.candidates()] == [1, 2]
    ledger.slashes.record(f"{1:064x}", 0, NODE, "0x02", 20.0)
    # The pool slashes an epoch once: one slash settles the epoch's other evidence.
    assert ledger.slashes.candidates() == []
    with pytest.raises(ValueError, match="slash outcome must be one of"):
        ledger.slashes.record(f"{2:064x}", 0, NODE, None, 20.0, outcome="maybe")


def test_the_file_is_wal_with_full_sync_and_a_schema_version(tmp_path):
    path = tmp_path / "ledger.sqlite3"
    Ledger(path).close()
    Ledger(path).close()  # opening again creates nothing twice
    db = sqlite3.connect(path)
    assert db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    assert db.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
    db.close()


def test_a_file_that_is_not_a_ledger_is_one_sentence(tmp_path):
    junk = tmp_path / "ledger.sqlite3"
    junk.write_bytes(b"this is not sqlite at all" * 100)
    with pytest.raises(ValueError, match="is not a swarmrl ledger") as caught:
        Ledger(junk)
    assert str(caught.value) == (
        f"{junk} is not a swarmrl ledger: it is not a readable SQLite database"
    )
    newer = tmp_path / "newer.sqlite3"
    db = sqlite3.connect(newer)
    db.execute("PRAGMA user_version = 99")
    db.close()
    with pytest.raises(ValueError, match="newer swarmrl") as caught:
        Ledger(newer)
    assert str(caught.value) == (
        f"{newer} was written by a newer swarmrl (ledger schema 99, "
        f"this version reads {SCHEMA_VERSION}); upgrade swarmrl"
    )


# Schema 1, the ledger before work orders were kept signed: each order's fields had
# columns of their own, and its run was not kept.
SCHEMA_1 = """
CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE nodes (
    address TEXT PRIMARY KEY, provider TEXT NOT NULL, peer_id TEXT NOT NULL,
    backend TEXT NOT NULL, hardware TEXT NOT NULL, state TEXT NOT NULL,
    joined_at REAL NOT NULL, last_seen REAL NOT NULL, speed REAL,
    trusted INTEGER NOT NULL DEFAULT 0, abandoned INTEGER NOT NULL DEFAULT 0
);
CREATE INDEX nodes_by_peer ON nodes (peer_id);
CREATE TABLE transitions (
    id INTEGER PRIMARY KEY, address TEXT NOT NULL, from_state TEXT, to_state TEXT NOT NULL,
    reason TEXT NOT NULL, at REAL NOT NULL
);
CREATE INDEX transitions_by_node ON transitions (address, id);
CREATE TABLE counters (node TEXT PRIMARY KEY, next INTEGER NOT NULL);
CREATE TABLE assignments (
    order_id TEXT PRIMARY KEY, node TEXT NOT NULL, counter INTEGER NOT NULL,
    min_step INTEGER NOT NULL, seed TEXT NOT NULL, group_size INTEGER NOT NULL,
    max_tokens INTEGER NOT NULL, temperature REAL NOT NULL, top_p REAL NOT NULL,
    tasks TEXT NOT NULL, deadline REAL NOT NULL, issued_at REAL NOT NULL,
    signature TEXT NOT NULL, state TEXT NOT NULL
);
CREATE INDEX assignments_by_state ON assignments (state, deadline);
CREATE INDEX assignments_by_node ON assignments (node, state);
CREATE TABLE submissions (
    digest TEXT PRIMARY KEY, node TEXT NOT NULL, order_id TEXT NOT NULL,
    epoch INTEGER NOT NULL, step INTEGER NOT NULL, file TEXT NOT NULL,
    file_sha256 TEXT NOT NULL, rollout_digest TEXT NOT NULL, signature TEXT NOT NULL,
    received_at REAL NOT NULL, units INTEGER NOT NULL, status TEXT NOT NULL,
    reason TEXT NOT NULL, slashable INTEGER NOT NULL, prefilled INTEGER NOT NULL,
    receipt TEXT NOT NULL, validated_at REAL
);
CREATE INDEX submissions_by_epoch ON submissions (epoch, node);
CREATE INDEX submissions_by_status ON submissions (status, received_at);
CREATE TABLE epochs (
    epoch INTEGER NOT NULL, node TEXT NOT NULL, units INTEGER NOT NULL,
    commitment TEXT NOT NULL, tx_hash TEXT, recorded_at REAL NOT NULL,
    PRIMARY KEY (epoch, node)
);
CREATE TABLE slashes (
    digest TEXT PRIMARY KEY, epoch INTEGER NOT NULL, node TEXT NOT NULL,
    tx_hash TEXT, outcome TEXT NOT NULL, at REAL NOT NULL
);
CREATE INDEX slashes_by_epoch ON slashes (epoch, node);
"""


def test_a_ledger_of_schema_1_is_upgraded_to_the_signed_orders_it_issued(tmp_path):
    path = tmp_path / "ledger.sqlite3"
    domain = swarm_domain(31337, "0x" + "ee" * 20)
    signed = order(node=NODE_CHECKSUM).signed_by(ORCHESTRATOR, domain)
    order_id = signed.digest(domain).hex()
    db = sqlite3.connect(path)
    db.executescript(SCHEMA_1)
    db.execute("INSERT INTO meta VALUES ('genesis', '12.5')")
    db.execute(
        "INSERT INTO assignments VALUES (?, ?, 0, 3, ?, 8, 128, 1.0, 0.95, ?, 500.0, 200.0, ?, "
        "'open')",
        (
            order_id,
            NODE_CHECKSUM,
            str(2**64 - 1),
            '[["gsm8k/17", 256], ["mbpp/3", 1]]',
            signed.signature,
        ),
    )
    db.execute(
        "INSERT INTO submissions VALUES (?, ?, ?, 0, 1, 'f', ?, ?, '', 100.0, 0, 'received', "
        "'', 0, 0, '{}', NULL)",
        (f"{1:064x}", NODE_CHECKSUM, order_id, "00" * 32, "00" * 32),
    )
    db.execute("PRAGMA user_version = 1")
    db.commit()
    db.close()
    # Only who knows the run its orders were issued in can upgrade it.
    with pytest.raises(ValueError, match="older swarmrl") as caught:
        Ledger(path)
    assert str(caught.value) == (
        f"{path} was written by an older swarmrl (ledger schema 1); "
        "`swarmrl orchestrator run` upgrades it"
    )

    with Ledger(path, run=RUN) as ledger:
        stored = ledger.orders.get(order_id)
        # The very order the node got: same digest, the orchestrator's signature good.
        assert stored == OrderRow(order_id, signed, 200.0, "open")
        assert stored.order.digest(domain).hex() == order_id
        assert stored.order.signer(domain) == ORCHESTRATOR.address
        assert ledger.orders.open_for(NODE) == stored
        assert ledger.epochs.genesis() == 12.5
        assert [s.digest for s in ledger.submissions.all()] == [f"{1:064x}"]
    with Ledger(path) as ledger:  # upgraded once; from now on it opens as any other
        assert [o.order_id for o in ledger.orders.expire(501.0)] == [order_id]
    db = sqlite3.connect(path)
    assert db.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
    tables = {r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    assert "assignments" not in tables
    assert "leases" in tables
    db.close()


def test_a_ledger_of_schema_2_is_upgraded_to_colder_sampling_sums_per_node(tmp_path):
    path = tmp_path / "ledger.sqlite3"
    with Ledger(path) as ledger:
        ledger.nodes.join(NODE, PROVIDER, "peer", "torch", {}, 1.0)
        ledger.nodes.add_trust(NODE)
    # Schema 2 is schema 4 without the nodes' sums and the leases.
    db = sqlite3.connect(path)
    as_schema_4(db)
    for column in ("excess", "variance", "submissions"):
        db.execute(f"ALTER TABLE nodes DROP COLUMN temperature_{column}")
    db.execute("DROP TABLE leases")
    db.execute("PRAGMA user_version = 2")
    db.commit()
    db.close()
    with Ledger(path) as ledger:  # no run needed: its orders are already signed ones
        node = ledger.nodes.get(NODE)
        assert (node.trusted, node.temperature) == (1, NO_SUMS)
    db = sqlite3.connect(path)
    assert db.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
    db.close()


def test_a_ledger_of_schema_3_is_upgraded_to_leases_and_its_waiting_submissions_claimed(
    tmp_path,
):
    path = tmp_path / "ledger.sqlite3"
    with Ledger(path) as ledger:
        ledger.submissions.record(submission(1))
    # Schema 3 is schema 4 without the leases.
    db = sqlite3.connect(path)
    as_schema_4(db)
    db.execute("DROP TABLE leases")
    db.execute("PRAGMA user_version = 3")
    db.commit()
    db.close()
    with Ledger(path) as ledger:
        claimed = ledger.submissions.claim(Lease("validator", "a"), 4, 10.0, 60.0)
        assert [s.digest for s in claimed] == [f"{1:064x}"]
    db = sqlite3.connect(path)
    assert db.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
    db.close()


def as_schema_6(db: sqlite3.Connection) -> None:
    """Takes away what schema 7 added to a ledger: each submission's late mark."""
    db.execute("ALTER TABLE submissions DROP COLUMN late")
    db.execute("PRAGMA user_version = 6")
    db.commit()


def test_a_ledger_of_schema_6_has_no_late_submissions_until_an_epoch_closes(tmp_path):
    path = tmp_path / "ledger.sqlite3"
    with Ledger(path) as ledger:
        for n in (1, 2):
            ledger.submissions.record(submission(n))
        ledger.submissions.set_outcome(f"{1:064x}", "accepted", 8, "", False, True, 20.0)
    db = sqlite3.connect(path)
    as_schema_6(db)
    db.close()
    with Ledger(path) as ledger:
        assert [s.late for s in ledger.submissions.all()] == [False, False]
        closed = ledger.submissions.close(submission(2).epoch)
        assert [(s.status, s.late) for s in closed] == [("accepted", False), ("received", True)]
    db = sqlite3.connect(path)
    assert db.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
    db.close()


def as_schema_5(db: sqlite3.Connection) -> None:
    """Takes away what schemas 6 and 7 added to a ledger: each epoch row's part and
    membership, the orders' index by counter, the submissions' late marks."""
    as_schema_6(db)
    db.execute("DROP INDEX epochs_by_part")
    db.execute("DROP INDEX orders_by_counter")
    for column in ("part", "membership"):
        db.execute(f"ALTER TABLE epochs DROP COLUMN {column}")
    db.execute("PRAGMA user_version = 5")
    db.commit()


def test_a_ledger_of_schema_5_keeps_its_epochs_with_no_part(tmp_path):
    path = tmp_path / "ledger.sqlite3"
    with Ledger(path) as ledger:
        ledger.epochs.record(0, NODE, 8, "ff" * 32, "0x" + "aa" * 32, now=40.0)
    db = sqlite3.connect(path)
    as_schema_5(db)
    db.close()
    with Ledger(path) as ledger:
        [old] = ledger.epochs.all()
        assert (old.units, old.part, old.membership) == (8, None, 0)
        ledger.epochs.record(1, NODE, 3, "ee" * 32, "0x" + "bb" * 32, part=0, membership=2)
        assert [(r.epoch, r.membership) for r in ledger.epochs.part(1, 0)] == [(1, 2)]
        assert ledger.epochs.part(0, 0) == []
    db = sqlite3.connect(path)
    assert db.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
    db.close()


def as_schema_4(db: sqlite3.Connection) -> None:
    """Takes away what schemas 5 to 7 added to a ledger: the tallies, their triggers,
    the submissions' index by node, the epochs' parts, the late marks."""
    as_schema_5(db)
    for trigger in ("tally_new", "tally_verdict"):
        db.execute(f"DROP TRIGGER {trigger}")
    db.execute("DROP TABLE tallies")
    db.execute("DROP INDEX submissions_by_node")
    db.execute("PRAGMA user_version = 4")
    db.commit()


def test_a_ledger_of_schema_4_gets_tallies_counted_from_its_submissions(tmp_path):
    path = tmp_path / "ledger.sqlite3"
    with Ledger(path) as ledger:
        for n in (1, 2, 3):
            ledger.submissions.record(submission(n))
        ledger.submissions.set_outcome(f"{1:064x}", "accepted", 8, "", False, True, 20.0)
        before = ledger.submissions.tally()
    db = sqlite3.connect(path)
    as_schema_4(db)
    db.close()
    with Ledger(path) as ledger:
        assert ledger.submissions.tally() == before
        assert (before.count("received"), before.units()) == (2, 8)
        ledger.submissions.record(submission(4))  # and from now on the triggers keep them
        assert ledger.submissions.tally().count("received") == 3
    db = sqlite3.connect(path)
    assert db.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
    db.close()


def test_the_tallies_are_the_counts_of_the_rows_after_any_verdicts(tmp_path):
    with Ledger(tmp_path / "ledger.sqlite3") as ledger:
        for n in range(1, 7):
            ledger.submissions.record(submission(n, node=NODE if n % 2 else OTHER))
        ledger.submissions.set_outcome(f"{1:064x}", "accepted", 8, "", False, True, 20.0)
        ledger.submissions.set_outcome(f"{2:064x}", "rejected", 0, "bad", True, True, 20.0)
        ledger.submissions.set_outcome(f"{3:064x}", "accepted", 5, "", False, False, 20.0)
        ledger.submissions.set_outcome(f"{3:064x}", "rejected", 0, "again", False, False, 21.0)
        tally = ledger.submissions.tally()
        counted: dict[tuple[str, str], tuple[int, int]] = {}
        for row in ledger.submissions.all():
            n, units = counted.get((row.node, row.status), (0, 0))
            counted[(row.node, row.status)] = (n + 1, units + row.units)
        assert {k: v for k, v in tally.per_node.items() if v[0]} == counted
        assert tally.units() == sum(r.units for r in ledger.submissions.all())


def test_a_verdict_adds_its_colder_sampling_sums_to_its_node_once(tmp_path):
    path = tmp_path / "ledger.sqlite3"
    first, second = TemperatureSums(3.0, 4.0, 1), TemperatureSums(-1.0, 2.0, 1)
    with Ledger(path) as ledger:
        ledger.nodes.join(NODE, PROVIDER, "peer", "torch", {}, 1.0)
        ledger.nodes.join(OTHER, PROVIDER, "peer-b", "torch", {}, 1.0)
        for n in (1, 2, 3):
            ledger.submissions.record(submission(n))
        assert ledger.submissions.set_outcome(
            f"{1:064x}", "accepted", 4, "", False, True, 5.0, first
        )
        # The same verdict again (a validator judging it twice) moves nothing, adds nothing.
        assert not ledger.submissions.set_outcome(
            f"{1:064x}", "rejected", 0, "again", False, True, 6.0, first
        )
        assert ledger.nodes.get(NODE).temperature == first
        # A submission with nothing drawn at random leaves the sums as they were.
        ledger.submissions.set_outcome(f"{2:064x}", "accepted", 4, "", False, True, 7.0)
        assert ledger.nodes.get(NODE).temperature == first
    with Ledger(path) as ledger:  # on disk, not in memory
        assert ledger.nodes.get(NODE).temperature == first
        ledger.submissions.set_outcome(f"{3:064x}", "rejected", 0, "r", False, True, 8.0, second)
        assert ledger.nodes.get(NODE).temperature == first.then(second)
        assert ledger.nodes.get(OTHER).temperature == NO_SUMS


WORKER_A, WORKER_B = Lease("validator-0", "a1"), Lease("validator-1", "b1")


def digests(rows: list[SubmissionRow]) -> list[str]:
    return [r.digest for r in rows]


def test_a_claim_leases_the_oldest_waiting_submissions_to_one_worker(ledger):
    for n in (3, 1, 2, 4):
        ledger.submissions.record(submission(n))
    ledger.submissions.set_outcome(f"{4:064x}", "rejected", 0, "r", False, False, 5.0)
    # Oldest first, up to the limit; another worker gets the rest, never the same one.
    assert digests(ledger.submissions.claim(WORKER_A, 2, 10.0, 60.0)) == [
        f"{1:064x}",
        f"{2:064x}",
    ]
    assert digests(ledger.submissions.claim(WORKER_B, 5, 10.0, 60.0)) == [f"{3:064x}"]
    # What is leased or judged is nobody's to claim until a lease expires.
    assert ledger.submissions.claim(WORKER_B, 5, 69.0, 60.0) == []
    assert ledger.submissions.claim(WORKER_A, 5, 69.0, 60.0) == []


def test_a_lease_renewed_holds_and_one_expired_is_taken_over(ledger):
    for n in (1, 2):
        ledger.submissions.record(submission(n))
    ledger.submissions.claim(WORKER_A, 2, 10.0, 60.0)
    assert ledger.submissions.renew(WORKER_A, 50.0, 60.0) == 2  # now until 110
    assert ledger.submissions.claim(WORKER_B, 5, 100.0, 60.0) == []
    # Expired (its worker died or stalled): another worker takes it over, and the first
    # renews only what it still holds.
    assert digests(ledger.submissions.claim(WORKER_B, 1, 110.0, 60.0)) == [f"{1:064x}"]
    assert ledger.submissions.renew(WORKER_A, 111.0, 60.0) == 1
    assert ledger.submissions.renew(Lease("validator-0", "a2"), 111.0, 60.0) == 0


def test_a_restarted_worker_releases_its_earlier_processes_leases_at_once(ledger):
    for n in (1, 2, 3):
        ledger.submissions.record(submission(n))
    ledger.submissions.claim(WORKER_A, 2, 10.0, 60.0)
    ledger.submissions.claim(WORKER_B, 1, 10.0, 60.0)
    restarted = Lease(WORKER_A.worker, "a2")  # the same worker, a new process
    assert ledger.submissions.release_earlier(restarted) == 2
    assert ledger.submissions.release_earlier(restarted) == 0
    # Free long before their expiry; the other worker's lease stands.
    assert digests(ledger.submissions.claim(restarted, 5, 11.0, 60.0)) == [
        f"{1:064x}",
        f"{2:064x}",
    ]
    with ledger.submissions.holding(f"{3:064x}", WORKER_B) as held:
        assert held


def test_a_worker_that_lost_its_lease_writes_no_verdict_and_counts_nothing(ledger):
    ledger.nodes.join(NODE, PROVIDER, "peer", "torch", {}, 1.0)
    ledger.submissions.record(submission(1))
    digest, sums = f"{1:064x}", TemperatureSums(3.0, 4.0, 1)
    ledger.submissions.claim(WORKER_A, 1, 10.0, 60.0)
    ledger.submissions.claim(WORKER_B, 1, 70.0, 60.0)  # A stalled past its lease
    # A finishes first: it hands the trainer nothing and its verdict is refused.
    with ledger.submissions.holding(digest, WORKER_A) as held:
        assert not held
    assert not ledger.submissions.set_outcome(
        digest, "accepted", 4, "", False, True, 75.0, sums, lease=WORKER_A
    )
    assert ledger.submissions.get(digest).status == "received"
    assert ledger.nodes.get(NODE).temperature == NO_SUMS
    # B, which holds it, gives the one verdict; its sums count once, its lease ends.
    with ledger.submissions.holding(digest, WORKER_B) as held:
        assert held
    assert ledger.submissions.set_outcome(
        digest, "rejected", 0, "r", False, True, 80.0, sums, lease=WORKER_B
    )
    assert not ledger.submissions.set_outcome(
        digest, "accepted", 4, "", False, True, 81.0, sums, lease=WORKER_B
    )
    row = ledger.submissions.get(digest)
    assert (row.status, row.validated_at) == ("rejected", 80.0)
    assert ledger.nodes.get(NODE).temperature == sums
    assert ledger.submissions.renew(WORKER_B, 82.0, 60.0) == 0
    with ledger.submissions.holding(digest, WORKER_B) as held:
        assert not held


CLAIMER = textwrap.dedent(
    """
    import sys, time
    from pathlib import Path
    from orchestrator.service.ledger import Ledger
    from orchestrator.service.ledger.submissions import Lease

    ledger = Ledger(Path(sys.argv[1]))
    lease = Lease(sys.argv[2], "t")
    while claimed := ledger.submissions.claim(lease, 1, time.time(), 600.0):
        print(claimed[0].digest, flush=True)
    """
)


def test_workers_claiming_at_once_from_processes_of_their_own_never_share_one(tmp_path):
    path = tmp_path / "ledger.sqlite3"
    with Ledger(path) as ledger:
        for n in range(200):
            ledger.submissions.record(submission(n))
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    workers = [
        subprocess.Popen(
            [sys.executable, "-c", CLAIMER, str(path), f"validator-{i}"],
            stdout=subprocess.PIPE,
            text=True,
            env=env,
        )
        for i in range(2)
    ]
    claims = []
    for worker in workers:
        out, _ = worker.communicate(timeout=120)
        assert worker.returncode == 0
        claims.append(out.split())
    assert sorted(claims[0] + claims[1]) == [f"{n:064x}" for n in range(200)]


def test_out_of_range_numbers_are_refused_before_writing(ledger):
    bogus = submission(1)
    bogus = SubmissionRow(**{**bogus.__dict__, "step": 2**64 - 1})
    with pytest.raises(ValueError, match="submission step 18446744073709551615 is out of range"):
        ledger.submissions.record(bogus)
    assert ledger.submissions.all() == []


WRITER = textwrap.dedent(
    """
    import sys
    from orchestrator.service.ledger import Ledger
    from orchestrator.service.ledger.submissions import Lease, SubmissionRow

    ledger = Ledger(sys.argv[1])
    first, count = int(sys.argv[2]), int(sys.argv[3])
    for n in range(first, first + count):
        row = SubmissionRow(
            digest=f"{n:064x}", node="0x" + "ab" * 20, order_id="00" * 32, epoch=0, step=n,
            file="f", file_sha256="00" * 32, rollout_digest="00" * 32, signature="0x",
            received_at=float(n),
        )
        ledger.submissions.record(row)
        print(row.digest, flush=True)  # only after the commit returned
    """
)


def test_a_writer_killed_mid_stream_loses_nothing_it_committed(tmp_path):
    path = tmp_path / "ledger.sqlite3"
    Ledger(path).close()
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    child = subprocess.Popen(
        [sys.executable, "-c", WRITER, str(path), "0", "1000000"],
        stdout=subprocess.PIPE,
        text=True,
        env=env,
    )
    committed = []
    assert child.stdout is not None
    while len(committed) < 200:
        line = child.stdout.readline()
        assert line, "the writer stopped before committing 200 submissions"
        committed.append(line.strip())
    child.send_signal(signal.SIGKILL)
    child.wait(timeout=30)
    child.stdout.close()

    check = sqlite3.connect(path)
    assert check.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    check.close()
    with Ledger(path) as ledger:
        stored = [s.digest for s in ledger.submissions.all()]
    assert len(stored) == len(set(stored))
    assert set(committed) <= set(stored)
    # The child may have committed a few more before the kill; nothing beyond a
    # contiguous run from the start, and nothing half written.
    assert stored == [f"{n:064x}" for n in range(len(stored))]


def test_several_processes_share_one_ledger(tmp_path):
    path = tmp_path / "ledger.sqlite3"
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    # Both start on a missing file: creating the schema must happen once.
    writers = [
        subprocess.Popen(
            [sys.executable, "-c", WRITER, str(path), str(first), "150"],
            stdout=subprocess.DEVNULL,
            env=env,
        )
        for first in (0, 150)
    ]
    for writer in writers:
        assert writer.wait(timeout=120) == 0
    with Ledger(path) as ledger:
        assert sorted(s.step for s in ledger.submissions.all()) == list(range(300))


OPENERS = textwrap.dedent(
    """
    import multiprocessing, sys
    from pathlib import Path
    from orchestrator.service.ledger import Ledger

    def open_once(path):
        try:
            Ledger(Path(path)).close()
        except ValueError as e:
            return str(e)

    if __name__ == "__main__":
        folder = Path(sys.argv[1])
        with multiprocessing.get_context("fork").Pool(4) as pool:
            for n in range(40):
                for failure in pool.map(open_once, [folder / f"{n}.sqlite3"] * 4):
                    if failure:
                        print(failure)
    """
)


def test_processes_opening_a_new_ledger_at_once_all_open_it(tmp_path):
    # Switching a new file to WAL is refused at once ("database is locked") while
    # another process switches it; before the ledger waited, about one open in
    # twenty failed this way.
    script = tmp_path / "openers.py"
    script.write_text(OPENERS)
    done = subprocess.run(
        [sys.executable, str(script), str(tmp_path)],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout == ""


def test_the_quiet_nodes_are_those_quiet_can_still_move(ledger):
    for address, seen in ((NODE, 10.0), (OTHER, 10.0)):
        ledger.nodes.join(address, PROVIDER, f"peer-{address}", "torch", {}, seen)
    ledger.nodes.touch({OTHER: Seen(50.0, None)})
    assert [q[0] for q in ledger.nodes.quiet(40.0)] == [NODE_CHECKSUM]
    ledger.nodes.set_state(NODE, "banned", "evidence", 20.0)  # quiet, but stays banned
    assert ledger.nodes.quiet(40.0) == []


def test_a_read_goes_on_beside_a_write_in_flight_and_sees_the_last_commit(ledger):
    ledger.nodes.join(NODE, PROVIDER, "peer-a", "torch", {}, 10.0)
    entered, release = threading.Event(), threading.Event()

    def write() -> None:
        with ledger._connection.write() as db:
            db.execute("UPDATE nodes SET state = 'active' WHERE address = ?", (NODE_CHECKSUM,))
            entered.set()
            release.wait(30)  # a hang guard only

    writer = threading.Thread(target=write)
    writer.start()
    try:
        assert entered.wait(30)
        read: list[str] = []
        reader = threading.Thread(target=lambda: read.append(ledger.nodes.get(NODE).state))
        reader.start()
        reader.join(30)  # a hang guard only: it used to wait for the writer's lock
        assert read == ["joined"]  # done while the write is still open, without it
        assert not release.is_set()
    finally:
        release.set()
        writer.join()
    assert ledger.nodes.get(NODE).state == "active"
