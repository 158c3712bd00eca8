"""ComputePool, one run's pool: nodes join under their provider's stake, the
orchestrator records work by epoch and part, validators invalidate and slash, providers
claim. The value types say what the chain holds of a node's work."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from enum import IntEnum
from typing import Any, ClassVar

from eth_account.signers.local import LocalAccount
from eth_utils import to_checksum_address
from hexbytes import HexBytes
from web3.logs import DISCARD
from web3.types import TxReceipt

from swarmrl import eip712
from swarmrl.chain.errors import ChainError
from swarmrl.chain.link import AccessControlled, Link, cs, topic
from swarmrl.chain.recorded_work import LeafRef, WorkLeaf, WorkPart
from swarmrl.chain.stake_token import StakeToken


class Settlement(IntEnum):
    """What became of a leaf (ComputePool.Settlement)."""

    OPEN = 0
    CLAIMED = 1
    INVALIDATED = 2
    RELEASED = 3  # never payable (its membership was not live, or was slashed): reward returned


@dataclass(frozen=True)
class PartRecord:
    """One recorded part of an epoch, with the terms it was recorded under
    (recorded_at 0: no such part)."""

    root: bytes
    units: int
    nodes: int
    recorded_at: int
    unlocks_at: int  # end of the invalidation window: slashable before, claimable from then
    reward_per_unit: int


@dataclass(frozen=True)
class Membership:
    """A node's stay in the pool with one provider (left_at 0 while it stays; else the
    first second whose parts it does not back: the second after its leave if a part was
    recorded earlier in that second, since the leave came after that part)."""

    provider: str | None
    joined_at: int
    left_at: int
    slashed: bool
    penalty: int  # the pool's penalty at the join: what it bonds and a slash takes

    @property
    def live(self) -> bool:
        return self.provider is not None and self.left_at == 0

    def backs(self, record: PartRecord) -> bool:
        """Whether it was live when `record` was recorded: only then is the leaf paid or slashed."""
        at = record.recorded_at
        return (
            self.provider is not None
            and self.joined_at <= at
            and (self.left_at == 0 or self.left_at > at)
        )


@dataclass(frozen=True)
class WorkRecord:
    """One node's work in one epoch as the chain holds it: its leaf with proof, the
    terms of its part, its membership and what became of it."""

    ref: LeafRef
    record: PartRecord
    membership: Membership
    settlement: Settlement

    @property
    def units(self) -> int:
        return self.ref.leaf.units

    @property
    def reward(self) -> int:
        return self.ref.leaf.units * self.record.reward_per_unit

    @property
    def unlocks_at(self) -> int:
        return self.record.unlocks_at

    @property
    def provider(self) -> str | None:
        """Who claims the reward and is slashed for it (None: nobody, never payable)."""
        return self.membership.provider if self.membership.backs(self.record) else None

    @property
    def claimed(self) -> bool:
        return self.settlement is Settlement.CLAIMED

    @property
    def invalidated(self) -> bool:
        """Never to be paid: invalidated, slashed, or released as never payable."""
        return self.settlement in (Settlement.INVALIDATED, Settlement.RELEASED) or (
            self.membership.slashed and not self.claimed
        )

    @property
    def slashed(self) -> bool:
        return self.membership.slashed


class ComputePool(AccessControlled):
    """The run's pool; funding it spends `token`."""

    name: ClassVar[str] = "ComputePool"

    def __init__(self, link: Link, token: StakeToken) -> None:
        super().__init__(link)
        self.token = token

    def domain(self) -> eip712.Domain:
        """The pool's EIP-712 domain: chain id and address of this deployment."""
        return eip712.pool_domain(self.link.deployment.chain_id, self.address)

    def schedule_role_change(self, role: str, account: str, *, grant: bool = True) -> TxReceipt:
        """Run by the pool's admin: schedules granting (or, `grant=False`, revoking) the
        pool's `role` ("RECORDER_ROLE" or "VALIDATOR_ROLE") for `account`, which anyone
        applies with `apply_role_change` once the pool's SLASH_CHANGE_DELAY has passed
        (`pending_role_change` says when). A revoked validator's pending votes stop
        counting; the recorders and validators of the deployment act at once."""
        role_id = self.role_id(role)
        fn = self.contract.functions.scheduleRoleChange(role_id, cs(account), grant)
        return self._send(fn)

    def apply_role_change(self, role: str, account: str) -> TxReceipt:
        """Applies the pool's scheduled change of `role` for `account`, once it is due."""
        role_id = self.role_id(role)
        return self._send(self.contract.functions.applyRoleChange(role_id, cs(account)))

    def pending_role_change(self, role: str, account: str) -> tuple[bool, int]:
        """The scheduled change of the pool's `role` for `account`: whether it grants
        (else revokes) and when it is due (0: none is scheduled)."""
        role_id = self.role_id(role)
        fn = self.contract.functions.pendingRoleChange(role_id, cs(account))
        grant, due = self._call(fn)
        return bool(grant), int(due)

    def change_delay(self) -> int:
        """The pool's SLASH_CHANGE_DELAY: how long a scheduled role change, a new
        window or reward per unit, a lower quorum or a higher penalty waits."""
        return self._read(int, self.contract.functions.SLASH_CHANGE_DELAY())

    def set_quorum(self, quorum: int) -> TxReceipt:
        """A higher quorum applies at once, a lower one only after the pool's
        SLASH_CHANGE_DELAY (as do role changes of recorders and validators, and a new
        window or reward per unit)."""
        return self._send(self.contract.functions.setQuorum(quorum))

    def eject(self, node: str) -> TxReceipt:
        return self._send(self.contract.functions.eject(cs(node)))

    def join_pool(self, node: str) -> TxReceipt:
        return self._send(self.contract.functions.joinPool(cs(node)))

    def leave_pool(self, node: str) -> TxReceipt:
        return self._send(self.contract.functions.leavePool(cs(node)))

    def is_joined(self, node: str) -> bool:
        return self._read(bool, self.contract.functions.isJoined(cs(node)))

    def fund(self, amount: int) -> TxReceipt:
        """Adds `amount` of the caller's tokens to the reward budget (approves first)."""
        self.token.ensure_allowance(self.address, amount)
        return self._send(self.contract.functions.fund(amount))

    def available_rewards(self) -> int:
        return self._read(int, self.contract.functions.availableRewards())

    def reserved_rewards(self) -> int:
        return self._read(int, self.contract.functions.reservedRewards())

    def submission(self, node: str, step: int, rollout_digest: bytes) -> eip712.Submission:
        """The Submission a node signs for one rollout file of this run."""
        return eip712.Submission(
            run_id=self.link.deployment.run_id_bytes,
            node=cs(node),
            step=step,
            rollout_digest=rollout_digest,
        )

    def sign_submission(self, node: LocalAccount, submission: eip712.Submission) -> bytes:
        """Run by the node: its signature over `submission` in this pool's domain."""
        return eip712.sign_submission(node, submission, self.domain())

    def membership_of(self, node: str) -> tuple[int, Membership]:
        """`node`'s latest membership and its number (0 and an empty one if it never joined)."""
        index, fields = self._call(self.contract.functions.membershipOf(cs(node)))
        return int(index), _membership(fields)

    def memberships_of(
        self, nodes: Sequence[str], *, chunk: int = 500
    ) -> dict[str, tuple[int, Membership]]:
        """Each node's latest membership and its number, `chunk` nodes per call (one
        call each would be a thousand round trips before an epoch is recorded)."""
        found: dict[str, tuple[int, Membership]] = {}
        for i in range(0, len(nodes), chunk):
            batch = [cs(n) for n in nodes[i : i + chunk]]
            fn = self.contract.functions.membershipsOf(batch)
            indexes, memberships = self._call(fn)
            for node, index, fields in zip(batch, indexes, memberships, strict=True):
                found[node] = (int(index), _membership(fields))
        return found

    def membership_at(self, node: str, index: int) -> Membership:
        """`node`'s membership number `index` (1 is its first)."""
        return _membership(self._call(self.contract.functions.membershipAt(cs(node), index)))

    def bond_of(self, provider: str) -> int:
        """What this pool bonds of `provider`'s stake."""
        return self._read(int, self.contract.functions.bondOf(cs(provider)))

    def leaf(self, node: str, units: int, commitment: bytes) -> WorkLeaf:
        """`node`'s leaf under its live membership; ChainError if it is not in the pool
        (work recorded for it would never be paid)."""
        index, membership = self.membership_of(node)
        if not membership.live:
            raise ChainError(f"node {cs(node)} is not in the pool; its work cannot be recorded")
        return WorkLeaf(node=node, membership=index, units=units, commitment=commitment)

    def record_work(self, part: WorkPart) -> TxReceipt:
        """Run by the recorder: part `part.part` of `part.epoch`, one transaction."""
        leaves = [leaf.as_tuple() for leaf in part.leaves]
        fn = self.contract.functions.recordWork(part.epoch, part.part, leaves)
        return self._send(fn)

    def record_of(self, epoch: int, part: int) -> PartRecord:
        """Part `part` of `epoch` as recorded (recorded_at 0 if it is not)."""
        fields = self._call(self.contract.functions.recordOf(epoch, part))
        root, units, nodes, recorded_at, unlocks_at, per_unit = fields
        return PartRecord(bytes(root), units, nodes, recorded_at, unlocks_at, per_unit)

    def settlement_of(self, epoch: int, part: int, node: str) -> Settlement:
        fn = self.contract.functions.settlementOf(epoch, part, cs(node))
        return Settlement(self._read(int, fn))

    def invalidate(self, ref: LeafRef) -> TxReceipt:
        return self._send(self.contract.functions.invalidate(ref.as_tuple()))

    def slash(
        self,
        ref: LeafRef,
        submission: eip712.Submission,
        signature: bytes,
        proof: Sequence[bytes],
    ) -> TxReceipt:
        """A validator's slash vote on `ref`'s membership, with the node's signed
        submission and its proof against the leaf's commitment as evidence."""
        fn = self.contract.functions.slash(
            ref.as_tuple(), submission.as_tuple(), signature, list(proof)
        )
        return self._send(fn)

    def release(self, ref: LeafRef) -> TxReceipt:
        """Returns to the budget the reward of a leaf that can never be paid."""
        return self._send(self.contract.functions.release(ref.as_tuple()))

    def claim_refs(self, refs: Sequence[LeafRef]) -> int:
        """Run by the provider: claims `refs` in one transaction; returns the amount paid."""
        fn = self.contract.functions.claim([ref.as_tuple() for ref in refs])
        receipt = self._send(fn)
        events = self.contract.events.RewardClaimed().process_receipt(receipt, errors=DISCARD)
        return sum(int(e["args"]["amount"]) for e in events)

    def claim(self, node: str, epochs: Sequence[int]) -> int:
        """Run by the provider: claims `node`'s rewards of `epochs`; returns the amount paid.

        An epoch settled already, or another provider's to claim, is refused in one
        sentence before anything is sent: the pool's revert would only name the leaf.
        """
        refs = []
        for epoch in epochs:
            work = self.work_of(epoch, node)
            if work is None:
                raise ChainError(f"no work of node {cs(node)} is recorded in epoch {epoch}")
            if work.settlement is not Settlement.OPEN:
                raise ChainError(
                    f"epoch {epoch} of node {cs(node)} is already {work.settlement.name.lower()}"
                )
            if work.provider is not None and work.provider != self.link.address:
                raise ChainError(
                    f"{self.link.address} cannot claim epoch {epoch} of node {cs(node)}: it was "
                    f"recorded under provider {work.provider}, whose key claims it"
                )
            refs.append(work.ref)
        return self.claim_refs(refs)

    def work_of(self, epoch: int, node: str) -> WorkRecord | None:
        """`node`'s work in `epoch` as the chain holds it, rebuilt from the pool's logs
        (None if none is recorded)."""
        parts = self.recorded_parts(epoch, node)
        if not parts:
            return None
        return self.work_at(parts[0].ref(node))

    def work_at(self, ref: LeafRef) -> WorkRecord:
        """The leaf `ref` names as the chain holds it now, without searching the logs: a
        recorded part never changes, so a ref found once serves every later read."""
        node = ref.leaf.node
        return WorkRecord(
            ref=ref,
            record=self.record_of(ref.epoch, ref.part),
            membership=self.membership_at(node, ref.leaf.membership),
            settlement=self.settlement_of(ref.epoch, ref.part, node),
        )

    def recorded_parts(self, epoch: int, node: str | None = None) -> list[WorkPart]:
        """The parts of `epoch` on chain (those with a leaf of `node`, if given), by
        part number, each rebuilt from its WorkRecorded logs."""
        event = self.contract.events.WorkRecorded()
        epoch_topic = HexBytes(epoch.to_bytes(32, "big"))
        numbers: set[int] | None = None
        if node is not None:
            mine = self.link.logs(
                {"address": self.address, "topics": [event.topic, epoch_topic, topic(node)]}
            )
            numbers = {int(event.process_log(log)["args"]["part"]) for log in mine}
        logs = self.link.logs({"address": self.address, "topics": [event.topic, epoch_topic]})
        leaves: dict[int, list[WorkLeaf]] = {}
        for log in logs:
            args = event.process_log(log)["args"]
            part = int(args["part"])
            if numbers is None or part in numbers:
                leaves.setdefault(part, []).append(
                    WorkLeaf(
                        node=args["node"],
                        membership=int(args["membership"]),
                        units=int(args["units"]),
                        commitment=bytes(args["commitment"]),
                    )
                )
        return [WorkPart(epoch, part, leaves[part]) for part in sorted(leaves)]

    def submission_digest(self, submission: eip712.Submission) -> bytes:
        """The pool's own EIP-712 digest (a cross-check of eip712.Submission.digest)."""
        return bytes(self._call(self.contract.functions.submissionDigest(submission.as_tuple())))

    def recorded_epochs(self, node: str) -> list[int]:
        """Every epoch the pool recorded work of `node` in (its WorkRecorded events), in
        order; claimed, invalidated or not."""
        event = self.contract.events.WorkRecorded()
        logs = self.link.logs({"address": self.address, "topics": [event.topic, None, topic(node)]})
        return sorted({int(event.process_log(log)["args"]["epoch"]) for log in logs})


def _membership(fields: Sequence[Any]) -> Membership:
    provider, joined_at, left_at, slashed, penalty = fields
    return Membership(
        provider=None if int(provider, 16) == 0 else to_checksum_address(provider),
        joined_at=joined_at,
        left_at=left_at,
        slashed=slashed,
        penalty=penalty,
    )
