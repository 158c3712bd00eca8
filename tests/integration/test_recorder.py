"""The chain recorder on the session's anvil: closed epochs go on chain once, a part
of many nodes per transaction, with a commitment over every signed submission;
evidence is slashed once; a crash between a transaction and its ledger write sends
nothing again.

Time is passed to `run_once` explicitly, relative to the ledger's genesis, so no
test sleeps for an epoch to pass.
"""

from __future__ import annotations

import logging
import time

import pytest
from eth_utils import keccak

from orchestrator.service import recorder as recorder_process
from orchestrator.service.child import Child, ChildSpec
from orchestrator.service.ledger import Ledger
from orchestrator.service.ledger.submissions import SubmissionRow
from orchestrator.service.recorder import Recorder, RecorderConfig, commitment_tree, paid_units
from orchestrator.service.status import ledger_rows
from swarmrl import eip712
from swarmrl.chain import anvil as anvil_mod
from swarmrl.chain.anvil import connect
from swarmrl.chain.contracts import Contracts
from swarmrl.chain.recorded_work import WorkPart
from swarmrl.chain.tokens import TOKEN
from swarmrl.chain.tx import TxSettings

from .conftest import (
    ADMIN,
    NODE_A,
    NODE_B,
    OUTSIDER,
    PROVIDER_A,
    PROVIDER_B,
    RECORDER,
    VALIDATOR,
    change_roles_after_delay,
)

EPOCH = 60.0
GRACE = 30.0
STAKE = 100 * TOKEN


def joined(contracts: Contracts, provider, node):
    """`node`, added by `provider` (who staked the minimum) and joined to the pool."""
    p = contracts.as_account(provider)
    p.registry.register_provider()
    consent, signature = p.registry.node_consent(node, provider.address)
    p.registry.add_node(node.address, consent.deadline, signature)
    p.stakes.stake(STAKE)
    p.pool.join_pool(node.address)
    return node


@pytest.fixture
def node(contracts, accounts):
    """Node A, added by provider A and joined to the pool."""
    return joined(contracts, accounts[PROVIDER_A], accounts[NODE_A])


@pytest.fixture
def ledger(tmp_path):
    with Ledger(tmp_path / "ledger.sqlite3") as opened:
        yield opened


@pytest.fixture
def recorder(ledger, contracts, accounts):
    return Recorder(
        ledger,
        contracts.as_account(accounts[RECORDER]),
        contracts.as_account(accounts[VALIDATOR]),
        epoch_seconds=EPOCH,
        validation_grace=GRACE,
    )


class Submit:
    """Signs submissions with the node's key and writes them to the ledger as intake
    does, then sets the validator's verdict."""

    def __init__(self, contracts: Contracts, ledger: Ledger, node) -> None:
        self.contracts, self.ledger, self.node = contracts, ledger, node
        self.count = 0

    def __call__(
        self,
        epoch: int,
        status: str,
        units: int = 0,
        *,
        slashable: bool = False,
    ) -> SubmissionRow:
        self.count += 1
        order_id = keccak(text=f"order-{self.count}").hex()
        sha = keccak(text=f"file-{self.count}").hex()
        rollout_digest = keccak(bytes.fromhex(order_id) + bytes.fromhex(sha))
        signed = self.contracts.pool.submission(self.node.address, self.count, rollout_digest)
        signature = self.contracts.pool.sign_submission(self.node, signed)
        row, created = self.ledger.submissions.record(
            SubmissionRow(
                digest=signed.digest(self.contracts.pool.domain()).hex(),
                node=self.node.address,
                order_id=order_id,
                epoch=epoch,
                step=self.count,
                file=f"/data/{self.count}.parquet",
                file_sha256=sha,
                rollout_digest=rollout_digest.hex(),
                signature="0x" + signature.hex(),
                received_at=self.ledger.epochs.genesis() + epoch * EPOCH + self.count,
            )
        )
        assert created
        if status != "received":
            reason = "" if status == "accepted" else "a reason"
            self.ledger.submissions.set_outcome(
                row.digest, status, units, reason, slashable, True, 0.0
            )
        return row


@pytest.fixture
def submit(contracts, ledger, node):
    return Submit(contracts, ledger, node)


def after(ledger: Ledger, epoch: int, seconds: float = 1.0) -> float:
    """`seconds` after `epoch` ended."""
    return ledger.epochs.genesis() + (epoch + 1) * EPOCH + seconds


def nonce(contracts: Contracts, index: int, accounts) -> int:
    return contracts.w3.eth.get_transaction_count(accounts[index].address)


def record_and_vote_by_hand(
    contracts: Contracts,
    accounts,
    epoch: int,
    units: int,
    rows: list[SubmissionRow],
    evidence: SubmissionRow,
) -> None:
    """What the recorder sends for `epoch`, sent without it (as if its ledger writes
    were lost): the work, then a slash vote with `evidence`."""
    tree = commitment_tree(rows)
    node = evidence.node
    part = record_by_hand(contracts, accounts, epoch, node, units, tree.root)
    signed = contracts.pool.submission(node, evidence.step, bytes.fromhex(evidence.rollout_digest))
    index = sorted(r.digest for r in rows).index(evidence.digest)
    signature = bytes.fromhex(evidence.signature.removeprefix("0x"))
    contracts.as_account(accounts[VALIDATOR]).pool.slash(
        part.ref(node), signed, signature, tree.proof(index)
    )


def record_by_hand(
    contracts: Contracts, accounts, epoch: int, node: str, units: int, root: bytes
) -> WorkPart:
    """Part 0 of `epoch` with `node`'s leaf alone, sent as the recorder would."""
    recorder = contracts.as_account(accounts[RECORDER])
    part = WorkPart(epoch, 0, [recorder.pool.leaf(node, units, root)])
    recorder.pool.record_work(part)
    return part


def test_an_honest_epoch_is_recorded_once_with_a_commitment_over_every_submission(
    recorder, ledger, contracts, node, submit, accounts
):
    rows = [
        submit(0, "accepted", 8),
        submit(0, "accepted", 8),
        submit(0, "accepted", 4),
        submit(0, "rejected"),  # e.g. a stale step: in the commitment, never paid
    ]
    report = recorder.run_once(after(ledger, 0))
    assert report.errors == []
    [sent] = report.sent
    assert (sent.epoch, sent.node, sent.units) == (0, node.address, 20)
    assert str(sent.tx_hash).startswith("0x")
    assert ledger.epochs.get(0, node.address) == sent

    work = contracts.pool.work_of(0, node.address)
    assert work is not None
    assert (work.units, work.provider, work.slashed) == (20, accounts[PROVIDER_A].address, False)
    assert (work.ref.part, work.ref.leaf.membership) == (sent.part, sent.membership) == (0, 1)
    commitment = work.ref.leaf.commitment
    assert commitment.hex() == sent.commitment
    # Each submission the node signed proves into the commitment on chain.
    leaves = sorted(bytes.fromhex(r.digest) for r in rows)
    tree = eip712.MerkleTree.from_digests(leaves)
    for i, leaf in enumerate(leaves):
        assert eip712.verify_proof(tree.proof(i), commitment, eip712.leaf_hash(leaf))

    sent_before = nonce(contracts, RECORDER, accounts)
    again = recorder.run_once(after(ledger, 0, 5 * EPOCH))
    assert (again.sent, again.found, again.empty, again.errors) == ([], [], [], [])
    assert nonce(contracts, RECORDER, accounts) == sent_before


def test_work_sent_before_a_crash_is_found_on_chain_and_not_sent_again(
    recorder, ledger, contracts, node, submit, accounts
):
    rows = [submit(0, "accepted", 8), submit(0, "accepted", 2)]
    # The recorder sent epoch 0 and died before writing the ledger.
    root = commitment_tree(rows).root
    record_by_hand(contracts, accounts, 0, node.address, 10, root)
    sent_before = nonce(contracts, RECORDER, accounts)

    report = recorder.run_once(after(ledger, 0))
    assert report.sent == []
    [found] = report.found
    assert (found.epoch, found.units, found.commitment, found.tx_hash) == (0, 10, root.hex(), None)
    assert (found.part, found.membership) == (0, 1)
    assert ledger.epochs.get(0, node.address) == found
    assert nonce(contracts, RECORDER, accounts) == sent_before
    assert units_on_chain(contracts, 0, node.address) == 10


def test_evidence_is_slashed_once_with_the_nodes_own_signature(
    recorder, ledger, contracts, node, submit, accounts, deployment
):
    provider = accounts[PROVIDER_A].address
    submit(0, "accepted", 8)
    bad = submit(0, "rejected", slashable=True)  # e.g. TOPLOC beyond its tolerance
    treasury_before = contracts.token.balance_of(deployment.treasury)

    report = recorder.run_once(after(ledger, 0))
    assert report.errors == []
    assert [row.units for row in report.sent] == [8]
    [slash] = report.slashes
    assert (slash.digest, slash.epoch, slash.node, slash.outcome) == (
        bad.digest,
        0,
        node.address,
        "sent",
    )
    penalty = deployment.params.slash_penalty
    assert contracts.stakes.stake_of(provider) == STAKE - penalty
    assert contracts.token.balance_of(deployment.treasury) == treasury_before + penalty
    work = contracts.pool.work_of(0, node.address)
    assert work is not None
    assert (work.slashed, work.invalidated) == (True, True)
    assert not contracts.pool.is_joined(node.address)  # the pool ejects a slashed node
    assert [(s.digest, s.outcome) for s in ledger.slashes.all()] == [(bad.digest, "sent")]

    votes_before = nonce(contracts, VALIDATOR, accounts)
    again = recorder.run_once(after(ledger, 0, 2 * EPOCH))
    assert (again.sent, again.found, again.slashes, again.errors) == ([], [], [], [])
    assert nonce(contracts, VALIDATOR, accounts) == votes_before
    assert contracts.stakes.stake_of(provider) == STAKE - penalty


def test_an_epoch_of_evidence_only_is_recorded_with_one_unit_and_slashed(
    recorder, ledger, contracts, node, submit, accounts, deployment
):
    bad = submit(0, "rejected", slashable=True)
    submit(0, "rejected")
    report = recorder.run_once(after(ledger, 0))
    assert [row.units for row in report.sent] == [1]
    assert [(s.digest, s.outcome) for s in report.slashes] == [(bad.digest, "sent")]
    work = contracts.pool.work_of(0, node.address)
    assert work is not None
    assert work.invalidated  # the one unit never pays
    assert contracts.stakes.stake_of(accounts[PROVIDER_A].address) == (
        STAKE - deployment.params.slash_penalty
    )


def test_a_slash_sent_before_a_crash_is_found_and_not_sent_again(
    recorder, ledger, contracts, node, submit, accounts, deployment
):
    good = submit(0, "accepted", 3)
    bad = submit(0, "rejected", slashable=True)
    # The recorder sent the epoch and its slash vote, and died before writing the ledger.
    record_and_vote_by_hand(contracts, accounts, 0, 3, [good, bad], bad)
    votes_before = nonce(contracts, VALIDATOR, accounts)

    report = recorder.run_once(after(ledger, 0))
    assert [row.tx_hash for row in report.found] == [None]
    assert [(s.digest, s.outcome, s.tx_hash) for s in report.slashes] == [
        (bad.digest, "found", None)
    ]
    assert nonce(contracts, VALIDATOR, accounts) == votes_before
    assert contracts.stakes.stake_of(accounts[PROVIDER_A].address) == (
        STAKE - deployment.params.slash_penalty
    )


def test_under_a_quorum_our_vote_is_cast_once(recorder, ledger, contracts, node, submit, accounts):
    """With two validators needed, our vote slashes nothing yet: it must still be cast
    once, also when a crash lost the ledger's record of it."""
    admin = contracts.as_account(accounts[ADMIN])
    change_roles_after_delay(contracts, accounts, "VALIDATOR_ROLE", OUTSIDER)
    admin.pool.set_quorum(2)
    submit(0, "accepted", 5)
    bad = submit(0, "rejected", slashable=True)
    report = recorder.run_once(after(ledger, 0))
    assert [(s.digest, s.outcome) for s in report.slashes] == [(bad.digest, "sent")]
    assert not slashed_on_chain(contracts, 0, node.address)
    assert contracts.stakes.stake_of(accounts[PROVIDER_A].address) == STAKE

    # Epoch 1 was recorded and voted on just before a crash that lost both records.
    good = submit(1, "accepted", 2)
    bad_again = submit(1, "rejected", slashable=True)
    record_and_vote_by_hand(contracts, accounts, 1, 2, [good, bad_again], bad_again)

    votes_before = nonce(contracts, VALIDATOR, accounts)
    again = recorder.run_once(after(ledger, 1))
    assert again.errors == []
    assert [row.epoch for row in again.found] == [1]
    assert [(s.digest, s.outcome) for s in again.slashes] == [(bad_again.digest, "found")]
    assert nonce(contracts, VALIDATOR, accounts) == votes_before
    assert contracts.stakes.stake_of(accounts[PROVIDER_A].address) == STAKE


def _quick_timeouts(ledger, deployment, w3, accounts) -> Recorder:
    """A recorder whose transactions time out after a second: one sent behind a nonce the
    chain dropped is never mined."""
    settings = TxSettings(receipt_timeout=1.0)
    return Recorder(
        ledger,
        Contracts(w3, deployment, accounts[RECORDER], settings),
        Contracts(w3, deployment, accounts[VALIDATOR], settings),
        epoch_seconds=EPOCH,
        validation_grace=GRACE,
    )


def test_an_epoch_and_its_slash_the_chain_dropped_are_sent_again(
    ledger, contracts, node, submit, accounts, deployment, w3
):
    # The blocks that held the record and the slash vote are dropped (a reorganisation,
    # a local chain restarted from its last dump): the ledger says recorded, the chain
    # holds nothing. Before, the epoch was never recorded again.
    recorder = _quick_timeouts(ledger, deployment, w3, accounts)
    submit(0, "accepted", 8)
    bad = submit(0, "rejected", slashable=True)
    before = anvil_mod.snapshot(w3)
    first = recorder.run_once(after(ledger, 0))
    assert ([r.units for r in first.sent], [s.outcome for s in first.slashes]) == ([8], ["sent"])
    anvil_mod.revert(w3, before)
    assert contracts.pool.work_of(0, node.address) is None

    # Found dropped; sent at once, behind the nonce the chain lost: it times out once and
    # the sender reads its nonce again.
    dropped = recorder.run_once(after(ledger, 0, 10))
    assert [(r.epoch, r.node) for r in dropped.dropped] == [(0, node.address)]
    assert (dropped.sent, len(dropped.errors)) == ([], 1)
    assert (ledger.epochs.get(0, node.address), ledger.slashes.all()) == (None, [])
    recorded = recorder.run_once(after(ledger, 0, 20))
    assert [r.units for r in recorded.sent] == [8]
    assert (recorded.slashes, len(recorded.errors)) == ([], 1)  # the validator's turn
    voted = recorder.run_once(after(ledger, 0, 30))
    assert [(s.digest, s.outcome) for s in voted.slashes] == [(bad.digest, "sent")]
    assert voted.errors == []

    assert (
        units_on_chain(contracts, 0, node.address),
        slashed_on_chain(contracts, 0, node.address),
    ) == (8, True)
    penalty = deployment.params.slash_penalty
    assert contracts.stakes.stake_of(accounts[PROVIDER_A].address) == STAKE - penalty  # once
    assert recorder.run_once(after(ledger, 0, 40)).dropped == []


def test_a_slash_vote_the_chain_dropped_is_cast_again(
    ledger, contracts, node, submit, accounts, deployment, w3
):
    recorder = _quick_timeouts(ledger, deployment, w3, accounts)
    submit(0, "accepted", 5)
    bad = submit(0, "received")  # still being validated when the epoch is recorded
    assert recorder.run_once(after(ledger, 0)).sent == []  # within the grace
    closed = after(ledger, 0, GRACE + 1)
    assert [r.units for r in recorder.run_once(closed).sent] == [5]
    ledger.submissions.set_outcome(bad.digest, "rejected", 0, "a reason", True, True, 0.0)
    before = anvil_mod.snapshot(w3)
    assert [s.outcome for s in recorder.run_once(closed + 5).slashes] == ["sent"]
    anvil_mod.revert(w3, before)  # the vote's block is gone, the record's is not

    dropped = recorder.run_once(closed + 10)
    assert [(s.digest, s.outcome) for s in dropped.dropped] == [(bad.digest, "sent")]
    assert len(dropped.errors) == 1  # voted again behind the dropped nonce: timed out
    voted = recorder.run_once(closed + 20)
    assert [(s.digest, s.outcome) for s in voted.slashes] == [(bad.digest, "sent")]
    assert slashed_on_chain(contracts, 0, node.address)


def test_an_epoch_of_rejections_without_evidence_sends_nothing(
    recorder, ledger, contracts, node, submit, accounts
):
    submit(0, "rejected")
    submit(0, "rejected")
    sent_before = nonce(contracts, RECORDER, accounts)
    report = recorder.run_once(after(ledger, 0))
    assert report.sent == []
    [empty] = report.empty
    assert (empty.epoch, empty.units, empty.tx_hash) == (0, 0, None)
    assert contracts.pool.work_of(0, node.address) is None
    assert nonce(contracts, RECORDER, accounts) == sent_before
    # Marked, so it is not looked at again.
    assert recorder.run_once(after(ledger, 0, 10 * EPOCH)).empty == []
    assert ledger.epochs.unrecorded(100) == []


def test_open_and_unvalidated_epochs_wait_until_the_grace_time(
    recorder, ledger, contracts, node, submit
):
    submit(0, "accepted", 6)
    waiting = submit(0, "received")  # the validator has not got to it yet
    submit(1, "accepted", 4)

    # Epoch 1 is still open; epoch 0 has ended but is still being validated.
    for now in (after(ledger, 0, -EPOCH / 2), after(ledger, 0), after(ledger, 0, GRACE - 1)):
        report = recorder.run_once(now)
        assert (report.sent, report.empty, report.found) == ([], [], [])
    assert contracts.pool.work_of(0, node.address) is None

    # Past the grace time it goes on chain with what was accepted by then; the
    # unvalidated submission is still in the commitment.
    report = recorder.run_once(after(ledger, 0, GRACE))
    assert [(row.epoch, row.units) for row in report.sent] == [(0, 6)]
    work = contracts.pool.work_of(0, node.address)
    assert work is not None
    assert work.units == 6
    assert work.ref.leaf.commitment == commitment_tree(ledger.submissions.all(epoch=0)).root
    assert waiting.digest in {s.digest for s in ledger.submissions.all(epoch=0)}
    assert contracts.pool.work_of(1, node.address) is None

    # Epoch 1, fully validated, goes as soon as it has ended.
    report = recorder.run_once(after(ledger, 1))
    assert [(row.epoch, row.units) for row in report.sent] == [(1, 4)]


def test_a_restarted_recorder_gives_the_validator_its_grace_again(
    recorder, ledger, contracts, node, submit
):
    # The orchestrator was down past epoch 0's grace; its validator starts again with the
    # recorder and has not got to what arrived before the crash.
    submit(0, "accepted", 6)
    waiting = submit(0, "received")
    restarted = after(ledger, 0, 3 * GRACE)
    assert recorder.run_once(restarted).sent == []
    assert recorder.run_once(restarted + GRACE - 1).sent == []
    ledger.submissions.set_outcome(waiting.digest, "accepted", 2, "", False, True, 0.0)
    report = recorder.run_once(restarted + GRACE - 0.5)  # validated: no need to wait
    assert [(row.epoch, row.units) for row in report.sent] == [(0, 8)]
    assert units_on_chain(contracts, 0, node.address) == 8


def test_a_verdict_after_its_epoch_closed_stands_and_is_not_paid(
    recorder, ledger, contracts, node, submit, tmp_path
):
    # Past the grace the epoch goes on chain with what was accepted; the validator then
    # accepts the submission it had not got to. Its verdict stands, the chain's units
    # and the ledger's stay equal.
    submit(0, "accepted", 6)
    waiting = submit(0, "received")
    assert recorder.run_once(after(ledger, 0, -1)).sent == []  # epoch 0 still open
    report = recorder.run_once(after(ledger, 0, GRACE))
    assert [(r.epoch, r.units) for r in report.sent] == [(0, 6)]
    assert ledger.submissions.set_outcome(waiting.digest, "accepted", 2, "", False, True, 0.0)
    late = ledger.submissions.get(waiting.digest)
    assert late is not None
    assert (late.status, late.units, late.late) == ("accepted", 2, True)
    assert paid_units(ledger.submissions.all(epoch=0, node=node.address)) == 6
    assert units_on_chain(contracts, 0, node.address) == 6
    # `orchestrator ledger` says which verdict came late.
    rows = {row["digest"]: row["late"] for row in ledger_rows(tmp_path)}
    assert rows == {s.digest: s.digest == waiting.digest for s in ledger.submissions.all()}

    # A recorder that closed epoch 1 and died before sending it: what the validator
    # accepted meanwhile is late all the same, so the next recorder sends what the
    # first would have.
    submit(1, "accepted", 4)
    waiting = submit(1, "received")
    ledger.submissions.close(1)
    ledger.submissions.set_outcome(waiting.digest, "accepted", 3, "", False, True, 0.0)
    report = recorder.run_once(after(ledger, 1))  # nothing waits for a verdict now
    assert [(r.epoch, r.units) for r in report.sent] == [(1, 4)]
    assert units_on_chain(contracts, 1, node.address) == 4


def test_an_unreachable_chain_is_one_sentence_and_retried_next_round(
    ledger, contracts, node, submit, accounts, deployment, caplog
):
    submit(0, "accepted", 2)
    dead = Contracts(
        connect("http://127.0.0.1:9"),
        deployment,
        accounts[RECORDER],
        TxSettings(rpc_retries=0),
    )
    failing = Recorder(
        ledger,
        dead,
        dead.as_account(accounts[VALIDATOR]),
        epoch_seconds=EPOCH,
        validation_grace=GRACE,
    )
    expected = [
        "recording epoch 0: the RPC endpoint did not answer eth_call after 1 attempts "
        "(connection refused or reset)"
    ]
    with caplog.at_level(logging.INFO, logger="orchestrator.service.recorder"):
        for _ in range(3):
            assert failing.run_once(after(ledger, 0)).errors == expected
    assert ledger.epochs.get(0, node.address) is None
    # Every round reports the failure; the log says it once, not once a round.
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1, [r.getMessage() for r in warnings]

    working = Recorder(
        ledger,
        contracts.as_account(accounts[RECORDER]),
        contracts.as_account(accounts[VALIDATOR]),
        epoch_seconds=EPOCH,
        validation_grace=GRACE,
    )
    assert [row.units for row in working.run_once(after(ledger, 0)).sent] == [2]


def test_the_recorder_process_records_and_stops_on_its_flag(
    tmp_path, contracts, node, accounts, deployment
):
    """Started as the daemon starts it: a spawned child, so its config must pickle."""
    path = tmp_path / "ledger.sqlite3"
    with Ledger(path) as ledger:
        Submit(contracts, ledger, node)(0, "accepted", 3)
    config = RecorderConfig(
        ledger_path=path,
        deployment=deployment,
        recorder_key=accounts[RECORDER].key,
        validator_key=accounts[VALIDATOR].key,
        epoch_seconds=1.0,
        validation_grace=0.0,
        poll_seconds=0.2,
    )
    child = Child(
        ChildSpec("recorder", recorder_process.main, config, data_dir=tmp_path, log_to_stderr=False)
    )
    child.start()
    try:
        with Ledger(path) as ledger:
            give_up = time.monotonic() + 120  # a hang guard, not a measurement
            while ledger.epochs.get(0, node.address) is None and time.monotonic() < give_up:
                assert child.process.is_alive()
                time.sleep(0.2)
            assert ledger.epochs.get(0, node.address) is not None
    finally:
        child.shutdown(timeout=60)
    assert child.process.exitcode == 0
    assert units_on_chain(contracts, 0, node.address) == 3
    log = (tmp_path / "logs" / "recorder.log").read_text()
    assert "recorder: epoch 0 part 0: 1 nodes, 3 units in 0x" in log


def test_an_epoch_of_many_nodes_is_one_transaction_and_a_node_that_left_is_not_in_it(
    recorder, ledger, contracts, node, submit, accounts
):
    other = joined(contracts, accounts[PROVIDER_B], accounts[NODE_B])
    gone = joined(contracts, accounts[OUTSIDER], accounts[OUTSIDER + 1])
    submit(0, "accepted", 5)
    Submit(contracts, ledger, other)(0, "accepted", 7)
    Submit(contracts, ledger, gone)(0, "accepted", 3)
    contracts.as_account(gone).pool.leave_pool(gone.address)  # before the epoch is recorded
    sent_before = nonce(contracts, RECORDER, accounts)

    report = recorder.run_once(after(ledger, 0))
    assert report.errors == []
    assert sorted((r.node, r.units, r.part) for r in report.sent) == sorted(
        [(node.address, 5, 0), (other.address, 7, 0)]
    )
    assert len({r.tx_hash for r in report.sent}) == 1
    assert nonce(contracts, RECORDER, accounts) == sent_before + 1
    assert [(r.node, r.units) for r in report.empty] == [(gone.address, 0)]
    [part] = contracts.pool.recorded_parts(0)
    assert contracts.pool.record_of(0, 0).root == part.root
    assert [leaf.node for leaf in part.leaves] == sorted(
        [node.address, other.address], key=lambda a: int(a, 16)
    )


def units_on_chain(contracts: Contracts, epoch: int, node: str) -> int:
    work = contracts.pool.work_of(epoch, node)
    return 0 if work is None else work.units


def slashed_on_chain(contracts: Contracts, epoch: int, node: str) -> bool:
    work = contracts.pool.work_of(epoch, node)
    return work is not None and work.slashed
