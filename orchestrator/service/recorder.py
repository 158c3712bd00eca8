"""The chain recorder: each closed epoch goes on chain, bad work is slashed.

Per closed epoch of the ledger it sends `ComputePool.recordWork` once per part of
up to 1,024 nodes (swarmrl.chain.recorded_work): one leaf per node in the pool, with the
accepted rollouts as units and a Merkle commitment over every submission the node
signed in that epoch (rejected ones too, so that they stay slashable evidence).
Then, for each slashable submission in an epoch on chain, it votes to slash with
the node's leaf, its own signed submission and their Merkle proofs.

The chain, not the ledger, says what was sent: before every transaction the
recorder reads the chain, so a crash between a transaction and its ledger write
never sends an epoch or a slash vote twice. A chain can also drop a mined
transaction with its block (an L2's unsafe head reorganised, a local anvil
restarted from its last dump): for `settle_seconds` after recording a part or a
vote the recorder checks every round that the chain still holds it, and forgets
what it no longer holds, so the round sends it again. A chain failure is one
logged sentence and is retried on the next round; the loop itself never stops on one.
"""

from __future__ import annotations

import logging
import sqlite3
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from eth_account import Account
from hexbytes import HexBytes

from orchestrator.service.ledger import Ledger
from orchestrator.service.ledger.epochs import EpochRow
from orchestrator.service.ledger.slashes import SlashOutcome, SlashRow
from orchestrator.service.ledger.submissions import SubmissionRow
from orchestrator.service.stop import StopSignal
from swarmrl import eip712
from swarmrl.chain import recorded_work
from swarmrl.chain.compute_pool import Membership
from swarmrl.chain.contracts import Contracts
from swarmrl.chain.deploy import Deployment
from swarmrl.chain.errors import ChainError, RevertedError, rpc_failure_sentence
from swarmrl.chain.recorded_work import WorkLeaf
from swarmrl.work.states import SubmissionStatus

log = logging.getLogger(__name__)

# Reverts of `slash` that mean the chain already holds this vote or this epoch's slash.
_ALREADY_SLASHED = ("AlreadyVoted", "AlreadySlashed", "EvidenceUsed")
# How long after recording an epoch or a slash vote the recorder still checks that the
# chain holds it: longer than a chain's reorganisations reach back and than a local
# chain's restart from its dump takes.
SETTLE_SECONDS = 120.0


@dataclass
class RecorderReport:
    """What one round did. Epochs: `sent` by this round's transactions, `found` on chain
    already (sent before a crash), `empty` (nothing to record, nothing sent). Slashes
    carry their outcome ('sent', 'found', 'missed'). `dropped`: epochs and votes the
    chain held and no longer holds, forgotten to be sent again. `errors`: one sentence
    per failure, each retried next round."""

    sent: list[EpochRow] = field(default_factory=list)
    found: list[EpochRow] = field(default_factory=list)
    empty: list[EpochRow] = field(default_factory=list)
    slashes: list[SlashRow] = field(default_factory=list)
    dropped: list[EpochRow | SlashRow] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)


class Recorder:
    """Records the ledger's closed epochs with `recorder` (RECORDER_ROLE) and slashes
    with `validator` (VALIDATOR_ROLE); both act on the same deployment."""

    def __init__(
        self,
        ledger: Ledger,
        recorder: Contracts,
        validator: Contracts,
        *,
        epoch_seconds: float,
        validation_grace: float,
        settle_seconds: float = SETTLE_SECONDS,
    ) -> None:
        if epoch_seconds <= 0:
            raise ValueError(f"epoch_seconds must be positive, got {epoch_seconds}")
        if validation_grace < 0:
            raise ValueError(f"validation_grace must not be negative, got {validation_grace}")
        self.ledger = ledger
        self.recorder = recorder
        self.validator = validator
        self.epoch_seconds = epoch_seconds
        self.validation_grace = validation_grace
        self.settle_seconds = settle_seconds
        self._started: float | None = None  # the time of the first round
        # What failed last round and why: a failure that lasts (a chain that does not
        # answer, a budget the pool has not been funded for) is logged when it starts and
        # when it ends, not on every round in between.
        self._failing: dict[str, str] = {}

    def run_once(self, now: float) -> RecorderReport:
        """One round at time `now`: what the chain dropped of the recent records is
        forgotten, then every closed epoch not yet recorded goes on chain, then every
        slashable submission of an epoch on chain not yet slashed."""
        report = RecorderReport()
        if self._started is None:
            self._started = now
        self._guarded(report, "checking the recent records", self._recheck, now)
        current = self.ledger.epochs.at(now, self.epoch_seconds)
        waiting: dict[int, list[str]] = {}
        for epoch, node in self.ledger.epochs.unrecorded(current):
            waiting.setdefault(epoch, []).append(node)
        for epoch, nodes in waiting.items():
            submissions = self.ledger.submissions.all(epoch=epoch)
            if not self._closed(epoch, submissions, now):
                continue
            what = f"recording epoch {epoch}"
            self._guarded(report, what, self._record, epoch, nodes, now)
        settled: set[tuple[int, str]] = set()
        for evidence in self.ledger.slashes.candidates():
            # The pool slashes a membership once: one evidence per (epoch, node) and
            # round; a later epoch of a slashed membership is found slashed on chain.
            if (evidence.epoch, evidence.node) in settled:
                continue
            settled.add((evidence.epoch, evidence.node))
            what = f"slashing node {evidence.node} for epoch {evidence.epoch}"
            self._guarded(report, what, self._slash, evidence, now)
        return report

    def epoch_end(self, epoch: int) -> float:
        return self.ledger.epochs.genesis() + (epoch + 1) * self.epoch_seconds

    def _closed(self, epoch: int, submissions: list[SubmissionRow], now: float) -> bool:
        """Ended, and validated or past the grace time (a validator that falls behind
        must not hold up payment forever; what it has not accepted is not paid). The
        grace runs from the epoch's end or from this recorder's first round, whichever
        came later: a restarted orchestrator's validator gets it again for what waited
        while the orchestrator was down. Before, such an epoch went on chain at the
        restart, without the work the validator accepted moments later: acknowledged,
        accepted, and never paid. What still waits after the grace is late
        (`Submissions.close`): judged as ever, not paid."""
        end = self.epoch_end(epoch)
        if now < end:
            return False
        validating = any(s.status is SubmissionStatus.RECEIVED for s in submissions)
        started = now if self._started is None else self._started
        return not validating or now >= max(end, started) + self.validation_grace

    def _guarded(
        self, report: RecorderReport, what: str, action: Callable[..., None], *args: object
    ) -> None:
        try:
            action(report, *args)
        except Exception as e:
            sentence = chain_failure_sentence(e)
            if sentence is None:
                raise
            if self._failing.get(what) != sentence:
                log.warning("recorder: %s failed, retrying every round: %s", what, sentence)
            self._failing[what] = sentence
            report.errors.append(f"{what}: {sentence}")
            return
        if self._failing.pop(what, None) is not None:
            log.info("recorder: %s succeeded after retries", what)

    def _recheck(self, report: RecorderReport, now: float) -> None:
        """Forgets the parts and our slash votes recorded in the last `settle_seconds`
        that the chain no longer holds (their block was dropped): this round sends them
        again. A part's slashes go with it: the chain cannot hold one without the other."""
        since = now - self.settle_seconds
        parts: dict[tuple[int, int], list[EpochRow]] = {}
        for row in self.ledger.epochs.on_chain_since(since):
            if row.part is not None:
                parts.setdefault((row.epoch, row.part), []).append(row)
        for (epoch, part), rows in parts.items():
            if self.recorder.pool.record_of(epoch, part).recorded_at:
                continue
            log.warning(
                "recorder: the chain no longer holds part %d of epoch %d (%d nodes, recorded "
                "in %s); recording them again",
                part,
                epoch,
                len(rows),
                rows[0].tx_hash or "an earlier run",
            )
            self.ledger.epochs.dropped(epoch, part)
            report.dropped.extend(rows)
        for vote in self.ledger.slashes.sent_since(since):
            assert vote.tx_hash is not None  # sent_since returns our votes, with their hashes
            if self.validator.mined(vote.tx_hash):
                continue
            log.warning(
                "recorder: the chain no longer holds our vote to slash node %s for epoch %d "
                "(%s); voting again",
                vote.node,
                vote.epoch,
                vote.tx_hash,
            )
            self.ledger.slashes.dropped(vote.digest)
            report.dropped.append(vote)

    def _record(
        self,
        report: RecorderReport,
        epoch: int,
        nodes: list[str],
        now: float,
    ) -> None:
        """Records the waiting `nodes` of closed `epoch`: what the chain holds already
        (parts sent before a crash) is taken from it; the rest goes in new parts, paying
        what was accepted when the ledger closed the epoch."""
        submissions = self.ledger.submissions.close(epoch)
        by_node: dict[str, list[SubmissionRow]] = {}
        for s in submissions:
            by_node.setdefault(s.node, []).append(s)
        # Parts are numbered from 0: without a part 0 nothing of the epoch is on chain,
        # and the pool's logs since its deployment need not be read.
        sent_before = self.recorder.pool.record_of(epoch, 0).recorded_at != 0
        on_chain = {
            leaf.node: (part, leaf)
            for part in (self.recorder.pool.recorded_parts(epoch) if sent_before else [])
            for leaf in part.leaves
        }
        waiting = [node for node in nodes if node not in on_chain]
        memberships = self.recorder.pool.memberships_of(waiting)
        found, empty, leaves = [], [], []
        for node in nodes:
            tree = commitment_tree(by_node[node])
            if node in on_chain:
                part, leaf = on_chain[node]
                if leaf.commitment != tree.root:
                    log.warning(
                        "recorder: the chain holds epoch %d of node %s with another "
                        "commitment than the ledger's; its submissions cannot be slashed",
                        epoch,
                        node,
                    )
                found.append(_row(part.epoch, part.part, leaf, None))
                continue
            units = paid_units(by_node[node])
            mine = _leaf_of(epoch, node, units, tree.root, memberships[node]) if units else None
            if mine is not None:
                leaves.append(mine)
                continue
            empty.append(EpochRow(epoch, node, 0, tree.root.hex(), None, now))
        self.ledger.epochs.record_many(found + empty, now=now)
        report.found += [_recorded(self.ledger, r.epoch, r.node) for r in found]
        report.empty += [_recorded(self.ledger, r.epoch, r.node) for r in empty]
        if found:
            log.info("recorder: %d nodes of epoch %d were already on chain", len(found), epoch)
        first = 1 + max((part.part for part, _ in on_chain.values()), default=-1)
        for part in recorded_work.parts_of(epoch, leaves, first=first):
            receipt = self.recorder.pool.record_work(part)
            tx_hash = _tx_hash(receipt["transactionHash"])
            rows = [_row(epoch, part.part, leaf, tx_hash) for leaf in part.leaves]
            self.ledger.epochs.record_many(rows, now=now)
            report.sent += [_recorded(self.ledger, r.epoch, r.node) for r in rows]
            log.info(
                "recorder: epoch %d part %d: %d nodes, %d units in %s",
                epoch,
                part.part,
                len(part.leaves),
                part.units,
                tx_hash,
            )

    def _slash(self, report: RecorderReport, evidence: SubmissionRow, now: float) -> None:
        epoch, node = evidence.epoch, evidence.node
        submission = self.validator.pool.submission(
            node, evidence.step, _bytes(evidence.rollout_digest)
        )
        if submission.digest(self.validator.pool.domain()) != _bytes(evidence.digest):
            # Cannot happen for rows intake wrote; the pool would refuse such evidence.
            log.error("recorder: submission %s does not match its digest", evidence.digest)
            self._settle(report, evidence, None, SlashOutcome.MISSED, now)
            return
        submissions = self.ledger.submissions.all(node=node, epoch=epoch)
        tree = commitment_tree(submissions)
        row = self.ledger.epochs.get(epoch, node)
        if row is None or row.part is None:
            # Recorded one node at a time by the pool before parts (a schema 5 ledger):
            # this pool holds no leaf of it to prove.
            log.error(
                "recorder: cannot slash node %s for epoch %d: no part records it", node, epoch
            )
            self._settle(report, evidence, None, SlashOutcome.MISSED, now)
            return
        leaves = [_leaf(r) for r in self.ledger.epochs.part(epoch, row.part)]
        part = recorded_work.WorkPart(epoch, row.part, leaves)
        ref = part.ref(node)
        record = self.validator.pool.record_of(epoch, row.part)
        if self.validator.pool.membership_at(node, ref.leaf.membership).slashed:
            self._settle(report, evidence, None, SlashOutcome.FOUND, now)
            return
        problem = None
        if record.root != part.root:
            problem = "the part on chain is not the ledger's"
        elif ref.leaf.commitment != tree.root:
            problem = "the commitment on chain is not over the ledger's submissions"
        elif self.validator.chain_time() >= record.unlocks_at:
            problem = "its invalidation window has closed"
        if problem is not None:
            log.error("recorder: cannot slash node %s for epoch %d: %s", node, epoch, problem)
            self._settle(report, evidence, None, SlashOutcome.MISSED, now)
            return
        index = sorted(_bytes(s.digest) for s in submissions).index(_bytes(evidence.digest))
        try:
            receipt = self.validator.pool.slash(
                ref, submission, _bytes(evidence.signature), tree.proof(index)
            )
        except RevertedError as e:
            if e.error not in _ALREADY_SLASHED:
                raise
            self._settle(report, evidence, None, SlashOutcome.FOUND, now)
            return
        tx_hash = _tx_hash(receipt["transactionHash"])
        self._settle(report, evidence, tx_hash, SlashOutcome.SENT, now)
        log.info("recorder: voted to slash node %s for epoch %d in %s", node, epoch, tx_hash)

    def _settle(
        self,
        report: RecorderReport,
        evidence: SubmissionRow,
        tx_hash: str | None,
        outcome: SlashOutcome,
        now: float,
    ) -> None:
        self.ledger.slashes.record(
            evidence.digest, evidence.epoch, evidence.node, tx_hash, now, outcome=outcome
        )
        report.slashes.append(
            SlashRow(evidence.digest, evidence.epoch, evidence.node, tx_hash, outcome, now)
        )


def commitment_tree(submissions: list[SubmissionRow]) -> eip712.MerkleTree:
    """The Merkle tree over the submissions' digests in digest order: the epoch's
    commitment is its root, and a slash proves one leaf of it."""
    return eip712.MerkleTree.from_digests(sorted(_bytes(s.digest) for s in submissions))


def paid_units(submissions: list[SubmissionRow]) -> int:
    """What a node's submissions of a closed epoch pay: the rollouts accepted when the
    epoch closed (a late verdict pays nothing). The pool takes no leaf without units;
    one lets evidence be committed, and the slash invalidates the leaf, so it never
    pays."""
    judged = [s for s in submissions if not s.late]
    units = sum(s.units for s in judged if s.status is SubmissionStatus.ACCEPTED)
    if units == 0 and any(s.slashable for s in judged):
        return 1
    return units


def _leaf_of(
    epoch: int, node: str, units: int, commitment: bytes, latest: tuple[int, Membership]
) -> WorkLeaf | None:
    """`node`'s leaf under its latest membership if that is live, else None: a leaf of
    no live membership would never be paid nor slashed."""
    index, membership = latest
    if not membership.live:
        log.warning(
            "recorder: node %s left the pool before epoch %d was recorded; its %d units "
            "are not recorded",
            node,
            epoch,
            units,
        )
        return None
    return WorkLeaf(node=node, membership=index, units=units, commitment=commitment)


def _row(epoch: int, part: int, leaf: WorkLeaf, tx_hash: str | None) -> EpochRow:
    """The ledger's row of a leaf on chain (recorded_at is the ledger's write)."""
    return EpochRow(
        epoch, leaf.node, leaf.units, leaf.commitment.hex(), tx_hash, 0.0, part, leaf.membership
    )


def _leaf(row: EpochRow) -> WorkLeaf:
    """The leaf a ledger row recorded."""
    return WorkLeaf(row.node, row.membership, row.units, _bytes(row.commitment))


def chain_failure_sentence(error: BaseException) -> str | None:
    """A failure worth retrying next round, in one sentence; None for anything else."""
    if isinstance(error, ChainError):
        return str(error)
    if isinstance(error, sqlite3.OperationalError):
        return f"the ledger is busy or unwritable ({error})"
    return rpc_failure_sentence(error)


@dataclass(frozen=True)
class RecorderConfig:
    """The recorder process's arguments. They pickle: keys are raw private keys (the
    daemon unlocks the keystores)."""

    ledger_path: Path
    deployment: Deployment
    recorder_key: bytes
    validator_key: bytes
    epoch_seconds: float
    validation_grace: float
    poll_seconds: float = 5.0


def main(config: RecorderConfig, stop: StopSignal) -> None:
    """The child's body (see ``child``): a round every `poll_seconds` until `stop` is
    set. An unreachable chain at start is retried like any other chain failure."""
    ledger = Ledger(config.ledger_path, create=False)
    recorder: Recorder | None = None
    try:
        while not stop.is_set():
            try:
                if recorder is None:
                    chain = Contracts.connect(
                        config.deployment, Account.from_key(config.recorder_key)
                    )
                    validator = chain.as_account(Account.from_key(config.validator_key))
                    recorder = Recorder(
                        ledger,
                        chain,
                        validator,
                        epoch_seconds=config.epoch_seconds,
                        validation_grace=config.validation_grace,
                    )
                recorder.run_once(time.time())
            except Exception as e:
                sentence = chain_failure_sentence(e)
                if sentence is None:
                    raise
                log.warning("recorder: %s; retrying in %g s", sentence, config.poll_seconds)
            stop.wait(config.poll_seconds)
    finally:
        ledger.close()


def _recorded(ledger: Ledger, epoch: int, node: str) -> EpochRow:
    row = ledger.epochs.get(epoch, node)
    assert row is not None  # just written
    return row


def _bytes(hex_text: str) -> bytes:
    """Hex with or without 0x, as the ledger may hold either."""
    return bytes(HexBytes(hex_text))


def _tx_hash(value: bytes) -> str:
    return "0x" + bytes(value).hex()
