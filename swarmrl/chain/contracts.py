"""The protocol's contracts as typed Python calls: one object per (deployment, account).

Providers register, take nodes (with the node's signed consent) and stake;
nodes join the run's pool; the orchestrator records work; validators
invalidate and slash; providers claim. Writes go through a `TxSender`, so every
failure is a `ChainError` with one decoded sentence. Reads need no account.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from enum import IntEnum
from functools import partial
from typing import Any, TypeVar

from eth_account.signers.local import LocalAccount
from eth_typing import ChecksumAddress, Hash32
from eth_utils import filter_abi_by_type, to_checksum_address
from hexbytes import HexBytes
from web3 import Web3
from web3.contract import Contract
from web3.contract.contract import ContractEvent, ContractFunction
from web3.exceptions import TransactionNotFound
from web3.logs import DISCARD
from web3.types import FilterParams, LogReceipt, TxReceipt

from swarmrl import eip712
from swarmrl.chain.anvil import DEV_CHAIN_ID, connect
from swarmrl.chain.artifacts import load_artifact
from swarmrl.chain.deploy import Deployment, decoder
from swarmrl.chain.errors import ChainConfigError, ChainError
from swarmrl.chain.recorded_work import LeafRef, WorkLeaf, WorkPart
from swarmrl.chain.revert import revert_data_of
from swarmrl.chain.tx import TxSender, TxSettings, chain_time, with_rpc_retries

LOG_CHUNK_BLOCKS = 10_000  # public RPCs cap eth_getLogs ranges

T = TypeVar("T")


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


@dataclass(frozen=True)
class Unbonding:
    total: int
    withdrawable: int


@dataclass(frozen=True)
class ChainEvent:
    block: int
    log_index: int
    tx_hash: str
    contract: str
    name: str
    args: dict[str, Any]


class Contracts:
    """Bound contracts of one deployment; writes act as `account` if one is given."""

    def __init__(
        self,
        w3: Web3,
        deployment: Deployment,
        account: LocalAccount | None = None,
        settings: TxSettings | None = None,
    ) -> None:
        self.w3 = w3
        self.deployment = deployment
        self.account = account
        self.settings = settings
        self.decoder = decoder()
        self.contracts: dict[str, Contract] = {
            name: w3.eth.contract(address=_cs(addr), abi=load_artifact(name).abi)
            for name, addr in deployment.contracts.by_name().items()
        }
        self.token = self.contracts["StakeToken"]
        self.registry = self.contracts["ProviderRegistry"]
        self.stake_manager = self.contracts["StakeManager"]
        self.pool = self.contracts["ComputePool"]
        self._sender = TxSender(w3, account, self.decoder, settings) if account else None

    @classmethod
    def connect(
        cls,
        deployment: Deployment,
        account: LocalAccount | None = None,
        *,
        rpc_url: str | None = None,
        settings: TxSettings | None = None,
    ) -> Contracts:
        """Connects to `rpc_url` (default: the deployment's) and checks the chain id."""
        w3 = connect(rpc_url or deployment.rpc_url)
        s = settings or TxSettings()
        chain_id = with_rpc_retries(
            lambda: w3.eth.chain_id, what="eth_chainId", retries=s.rpc_retries, backoff=s.backoff
        )
        if chain_id != deployment.chain_id:
            raise ChainConfigError(
                f"the RPC endpoint serves chain {chain_id}, "
                f"but the deployment is on chain {deployment.chain_id}"
            )
        require_contracts(w3, deployment)
        return cls(w3, deployment, account, settings)

    def as_account(self, account: LocalAccount) -> Contracts:
        """The same deployment and connection, acting as another account."""
        return Contracts(self.w3, self.deployment, account, self.settings)

    @property
    def address(self) -> str:
        return self._require_sender().address

    @property
    def sender(self) -> TxSender:
        return self._require_sender()

    def _require_sender(self) -> TxSender:
        if self._sender is None:
            raise ChainError("this operation needs an account to sign with")
        return self._sender

    def _send(self, contract: str, fn: ContractFunction) -> TxReceipt:
        return self._require_sender().transact(fn, contract)

    def _call(self, contract: str, fn: ContractFunction) -> Any:
        """`fn`'s result, decoded by its ABI (so of whatever type that says)."""
        if self._sender is not None:
            return self._sender.call(fn, contract)
        try:
            return self._retried(fn.call, "eth_call")
        except Exception as e:
            data = revert_data_of(e)
            if data is None:
                raise
            raise self.decoder.decode(data, contract, now=self.chain_time) from None

    def _retried(self, call: Callable[[], T], what: str) -> T:
        """`call`, with transient RPC failures retried as this object's settings say."""
        s = self.settings or TxSettings()
        return with_rpc_retries(call, what=what, retries=s.rpc_retries, backoff=s.backoff)

    def _read(self, kind: type[T], contract: str, fn: ContractFunction) -> T:
        """`fn`'s result, which its ABI says is a `kind` (uint: int, bool: bool,
        address: str)."""
        value = self._call(contract, fn)
        if not isinstance(value, kind):
            raise ChainError(
                f"{contract}.{fn.fn_name} returned {type(value).__name__}, not {kind.__name__}"
            )
        return value

    # Domains: chain id and contract address of this deployment.

    def registry_domain(self) -> eip712.Domain:
        return eip712.registry_domain(self.deployment.chain_id, self.registry.address)

    def pool_domain(self) -> eip712.Domain:
        return eip712.pool_domain(self.deployment.chain_id, self.pool.address)

    # Administration (DEFAULT_ADMIN_ROLE on the contract in question).

    def grant_role(self, contract: str, role: str, account: str) -> TxReceipt:
        """Grants `role` (its constant's name, e.g. "MINTER_ROLE") on `contract`. The
        pool's RECORDER_ROLE and VALIDATOR_ROLE change only after its delay (the
        contract reverts RoleChangeDelayed): see `schedule_role_change`."""
        c = self.contracts[contract]
        role_id = self._call(contract, c.functions[role]())
        return self._send(contract, c.functions.grantRole(role_id, _cs(account)))

    def revoke_role(self, contract: str, role: str, account: str) -> TxReceipt:
        """Revokes `role` on `contract`. The pool's RECORDER_ROLE and VALIDATOR_ROLE
        change only after its delay: see `schedule_role_change`."""
        c = self.contracts[contract]
        role_id = self._call(contract, c.functions[role]())
        return self._send(contract, c.functions.revokeRole(role_id, _cs(account)))

    def has_role(self, contract: str, role: str, account: str) -> bool:
        c = self.contracts[contract]
        role_id = self._call(contract, c.functions[role]())
        return self._read(bool, contract, c.functions.hasRole(role_id, _cs(account)))

    def schedule_role_change(self, role: str, account: str, *, grant: bool = True) -> TxReceipt:
        """Run by the pool's admin: schedules granting (or, `grant=False`, revoking) the
        pool's `role` ("RECORDER_ROLE" or "VALIDATOR_ROLE") for `account`, which anyone
        applies with `apply_role_change` once the pool's SLASH_CHANGE_DELAY has passed
        (`pending_role_change` says when). A revoked validator's pending votes stop
        counting; the recorders and validators of the deployment act at once."""
        role_id = self._call("ComputePool", self.pool.functions[role]())
        fn = self.pool.functions.scheduleRoleChange(role_id, _cs(account), grant)
        return self._send("ComputePool", fn)

    def apply_role_change(self, role: str, account: str) -> TxReceipt:
        """Applies the pool's scheduled change of `role` for `account`, once it is due."""
        role_id = self._call("ComputePool", self.pool.functions[role]())
        return self._send("ComputePool", self.pool.functions.applyRoleChange(role_id, _cs(account)))

    def pending_role_change(self, role: str, account: str) -> tuple[bool, int]:
        """The scheduled change of the pool's `role` for `account`: whether it grants
        (else revokes) and when it is due (0: none is scheduled)."""
        role_id = self._call("ComputePool", self.pool.functions[role]())
        fn = self.pool.functions.pendingRoleChange(role_id, _cs(account))
        grant, due = self._call("ComputePool", fn)
        return bool(grant), int(due)

    def change_delay(self) -> int:
        """The pool's SLASH_CHANGE_DELAY: how long a scheduled role change, a new
        window or reward per unit, a lower quorum or a higher penalty waits."""
        return self._read(int, "ComputePool", self.pool.functions.SLASH_CHANGE_DELAY())

    def set_quorum(self, quorum: int) -> TxReceipt:
        """A higher quorum applies at once, a lower one only after the pool's
        SLASH_CHANGE_DELAY (as do role changes of recorders and validators, and a new
        window or reward per unit)."""
        return self._send("ComputePool", self.pool.functions.setQuorum(quorum))

    def eject(self, node: str) -> TxReceipt:
        return self._send("ComputePool", self.pool.functions.eject(_cs(node)))

    # Tokens.

    def token_balance(self, account: str) -> int:
        return self._read(int, "StakeToken", self.token.functions.balanceOf(_cs(account)))

    def eth_balance(self, account: str) -> int:
        return with_rpc_retries(lambda: self.w3.eth.get_balance(_cs(account)), what="balance")

    def allowance(self, owner: str, spender: str) -> int:
        return self._read(
            int, "StakeToken", self.token.functions.allowance(_cs(owner), _cs(spender))
        )

    def approve(self, spender: str, amount: int) -> TxReceipt:
        return self._send("StakeToken", self.token.functions.approve(_cs(spender), amount))

    def transfer(self, to: str, amount: int) -> TxReceipt:
        return self._send("StakeToken", self.token.functions.transfer(_cs(to), amount))

    def mint(self, to: str, amount: int) -> TxReceipt:
        """Mints tokens (needs MINTER_ROLE on the token)."""
        return self._send("StakeToken", self.token.functions.mint(_cs(to), amount))

    def _ensure_allowance(self, spender: str, amount: int) -> None:
        if self.allowance(self.address, spender) < amount:
            self.approve(spender, amount)

    # Provider registry.

    def register_provider(self) -> TxReceipt:
        return self._send("ProviderRegistry", self.registry.functions.registerProvider())

    def is_provider(self, account: str) -> bool:
        return self._read(
            bool, "ProviderRegistry", self.registry.functions.isProvider(_cs(account))
        )

    def provider_of(self, node: str) -> str | None:
        provider = self._call("ProviderRegistry", self.registry.functions.providerOf(_cs(node)))
        return None if int(provider, 16) == 0 else to_checksum_address(provider)

    def nodes_of(self, provider: str) -> list[str]:
        nodes = self._call("ProviderRegistry", self.registry.functions.nodesOf(_cs(provider)))
        return [to_checksum_address(n) for n in nodes]

    def consent_nonce(self, node: str) -> int:
        return self._read(int, "ProviderRegistry", self.registry.functions.consentNonce(_cs(node)))

    def node_consent(
        self, node: LocalAccount, provider: str, *, deadline: int | None = None, ttl: int = 3600
    ) -> tuple[eip712.NodeConsent, bytes]:
        """Run by the node: its consent to `provider`, signed with the current nonce."""
        if deadline is None:
            deadline = self.chain_time() + ttl
        consent = eip712.NodeConsent(
            provider=_cs(provider),
            node=node.address,
            nonce=self.consent_nonce(node.address),
            deadline=deadline,
        )
        return consent, eip712.sign_consent(node, consent, self.registry_domain())

    def add_node(self, node: str, deadline: int, signature: bytes) -> TxReceipt:
        """Run by the provider, with the node's consent signature."""
        fn = self.registry.functions.addNode(_cs(node), deadline, signature)
        return self._send("ProviderRegistry", fn)

    def remove_node(self, node: str) -> TxReceipt:
        return self._send("ProviderRegistry", self.registry.functions.removeNode(_cs(node)))

    def revoke_consent(self) -> TxReceipt:
        """Run by a node: voids every consent it signed that no provider has used yet."""
        return self._send("ProviderRegistry", self.registry.functions.revokeConsent())

    # Stake.

    def stake(self, amount: int, *, permit: bool = False, ttl: int = 3600) -> TxReceipt:
        """Stakes `amount`: approve + stake, or one transaction with an ERC-2612 permit."""
        manager = self.stake_manager.address
        if not permit:
            self._ensure_allowance(manager, amount)
            return self._send("StakeManager", self.stake_manager.functions.stake(amount))
        owner = self._require_sender().account
        deadline = self.chain_time() + ttl
        message = eip712.Permit(
            owner=owner.address,
            spender=manager,
            value=amount,
            nonce=self._call("StakeToken", self.token.functions.nonces(owner.address)),
            deadline=deadline,
        )
        domain = eip712.Domain(
            name=self._call("StakeToken", self.token.functions.name()),
            chain_id=self.deployment.chain_id,
            verifying_contract=self.token.address,
        )
        signed = owner.unsafe_sign_hash(Hash32(message.digest(domain)))
        fn = self.stake_manager.functions.stakeWithPermit(
            amount, deadline, signed.v, signed.r.to_bytes(32, "big"), signed.s.to_bytes(32, "big")
        )
        return self._send("StakeManager", fn)

    def request_unbond(self, amount: int) -> TxReceipt:
        return self._send("StakeManager", self.stake_manager.functions.requestUnbond(amount))

    def withdraw(self) -> int:
        """Withdraws every released unbonding entry; returns the amount paid out."""
        receipt = self._send("StakeManager", self.stake_manager.functions.withdraw())
        events = self.stake_manager.events.Withdrawn().process_receipt(receipt, errors=DISCARD)
        return sum(int(e["args"]["amount"]) for e in events)

    def stake_of(self, provider: str) -> int:
        return self._read(int, "StakeManager", self.stake_manager.functions.stakeOf(_cs(provider)))

    def unbonding_of(self, provider: str) -> Unbonding:
        total, withdrawable = self._call(
            "StakeManager", self.stake_manager.functions.unbondingOf(_cs(provider))
        )
        return Unbonding(total=total, withdrawable=withdrawable)

    def bonded_of(self, provider: str) -> int:
        """Active stake the pools bond: a penalty per joined node, and per node that left
        while work recorded before its leave could still be slashed."""
        return self._read(int, "StakeManager", self.stake_manager.functions.bondedOf(_cs(provider)))

    def min_stake_per_node(self) -> int:
        return self._read(int, "StakeManager", self.stake_manager.functions.minStakePerNode())

    def total_staked(self) -> int:
        return self._read(int, "StakeManager", self.stake_manager.functions.totalStaked())

    def treasury(self) -> str:
        return to_checksum_address(
            self._call("StakeManager", self.stake_manager.functions.treasury())
        )

    # Compute pool.

    def join_pool(self, node: str) -> TxReceipt:
        return self._send("ComputePool", self.pool.functions.joinPool(_cs(node)))

    def leave_pool(self, node: str) -> TxReceipt:
        return self._send("ComputePool", self.pool.functions.leavePool(_cs(node)))

    def is_joined(self, node: str) -> bool:
        return self._read(bool, "ComputePool", self.pool.functions.isJoined(_cs(node)))

    def fund(self, amount: int) -> TxReceipt:
        """Adds `amount` of the caller's tokens to the reward budget (approves first)."""
        self._ensure_allowance(self.pool.address, amount)
        return self._send("ComputePool", self.pool.functions.fund(amount))

    def available_rewards(self) -> int:
        return self._read(int, "ComputePool", self.pool.functions.availableRewards())

    def reserved_rewards(self) -> int:
        return self._read(int, "ComputePool", self.pool.functions.reservedRewards())

    def submission(self, node: str, step: int, rollout_digest: bytes) -> eip712.Submission:
        """The Submission a node signs for one rollout file of this run."""
        return eip712.Submission(
            run_id=self.deployment.run_id_bytes,
            node=_cs(node),
            step=step,
            rollout_digest=rollout_digest,
        )

    def sign_submission(self, node: LocalAccount, submission: eip712.Submission) -> bytes:
        """Run by the node: its signature over `submission` in this pool's domain."""
        return eip712.sign_submission(node, submission, self.pool_domain())

    def membership_of(self, node: str) -> tuple[int, Membership]:
        """`node`'s latest membership and its number (0 and an empty one if it never joined)."""
        index, fields = self._call("ComputePool", self.pool.functions.membershipOf(_cs(node)))
        return int(index), _membership(fields)

    def memberships_of(
        self, nodes: Sequence[str], *, chunk: int = 500
    ) -> dict[str, tuple[int, Membership]]:
        """Each node's latest membership and its number, `chunk` nodes per call (one
        call each would be a thousand round trips before an epoch is recorded)."""
        found: dict[str, tuple[int, Membership]] = {}
        for i in range(0, len(nodes), chunk):
            batch = [_cs(n) for n in nodes[i : i + chunk]]
            fn = self.pool.functions.membershipsOf(batch)
            indexes, memberships = self._call("ComputePool", fn)
            for node, index, fields in zip(batch, indexes, memberships, strict=True):
                found[node] = (int(index), _membership(fields))
        return found

    def membership_at(self, node: str, index: int) -> Membership:
        """`node`'s membership number `index` (1 is its first)."""
        return _membership(
            self._call("ComputePool", self.pool.functions.membershipAt(_cs(node), index))
        )

    def bond_of(self, provider: str) -> int:
        """What this pool bonds of `provider`'s stake."""
        return self._read(int, "ComputePool", self.pool.functions.bondOf(_cs(provider)))

    def leaf(self, node: str, units: int, commitment: bytes) -> WorkLeaf:
        """`node`'s leaf under its live membership; ChainError if it is not in the pool
        (work recorded for it would never be paid)."""
        index, membership = self.membership_of(node)
        if not membership.live:
            raise ChainError(f"node {_cs(node)} is not in the pool; its work cannot be recorded")
        return WorkLeaf(node=node, membership=index, units=units, commitment=commitment)

    def record_work(self, part: WorkPart) -> TxReceipt:
        """Run by the recorder: part `part.part` of `part.epoch`, one transaction."""
        leaves = [leaf.as_tuple() for leaf in part.leaves]
        fn = self.pool.functions.recordWork(part.epoch, part.part, leaves)
        return self._send("ComputePool", fn)

    def record_of(self, epoch: int, part: int) -> PartRecord:
        """Part `part` of `epoch` as recorded (recorded_at 0 if it is not)."""
        fields = self._call("ComputePool", self.pool.functions.recordOf(epoch, part))
        root, units, nodes, recorded_at, unlocks_at, per_unit = fields
        return PartRecord(bytes(root), units, nodes, recorded_at, unlocks_at, per_unit)

    def settlement_of(self, epoch: int, part: int, node: str) -> Settlement:
        fn = self.pool.functions.settlementOf(epoch, part, _cs(node))
        return Settlement(self._read(int, "ComputePool", fn))

    def invalidate(self, ref: LeafRef) -> TxReceipt:
        return self._send("ComputePool", self.pool.functions.invalidate(ref.as_tuple()))

    def slash(
        self,
        ref: LeafRef,
        submission: eip712.Submission,
        signature: bytes,
        proof: Sequence[bytes],
    ) -> TxReceipt:
        """A validator's slash vote on `ref`'s membership, with the node's signed
        submission and its proof against the leaf's commitment as evidence."""
        fn = self.pool.functions.slash(
            ref.as_tuple(), submission.as_tuple(), signature, list(proof)
        )
        return self._send("ComputePool", fn)

    def release(self, ref: LeafRef) -> TxReceipt:
        """Returns to the budget the reward of a leaf that can never be paid."""
        return self._send("ComputePool", self.pool.functions.release(ref.as_tuple()))

    def claim_refs(self, refs: Sequence[LeafRef]) -> int:
        """Run by the provider: claims `refs` in one transaction; returns the amount paid."""
        fn = self.pool.functions.claim([ref.as_tuple() for ref in refs])
        receipt = self._send("ComputePool", fn)
        events = self.pool.events.RewardClaimed().process_receipt(receipt, errors=DISCARD)
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
                raise ChainError(f"no work of node {_cs(node)} is recorded in epoch {epoch}")
            if work.settlement is not Settlement.OPEN:
                raise ChainError(
                    f"epoch {epoch} of node {_cs(node)} is already {work.settlement.name.lower()}"
                )
            if work.provider is not None and work.provider != self.address:
                raise ChainError(
                    f"{self.address} cannot claim epoch {epoch} of node {_cs(node)}: it was "
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
        event = self.pool.events.WorkRecorded()
        epoch_topic = HexBytes(epoch.to_bytes(32, "big"))
        numbers: set[int] | None = None
        if node is not None:
            mine = self._logs(
                {"address": self.pool.address, "topics": [event.topic, epoch_topic, _topic(node)]}
            )
            numbers = {int(event.process_log(log)["args"]["part"]) for log in mine}
        logs = self._logs({"address": self.pool.address, "topics": [event.topic, epoch_topic]})
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
        return bytes(
            self._call("ComputePool", self.pool.functions.submissionDigest(submission.as_tuple()))
        )

    def consent_digest(self, consent: eip712.NodeConsent) -> bytes:
        fn = self.registry.functions.consentDigest(
            _cs(consent.provider), _cs(consent.node), consent.nonce, consent.deadline
        )
        return bytes(self._call("ProviderRegistry", fn))

    # Chain state and history.

    def chain_time(self) -> int:
        """The chain's clock as the next block will read it (see tx.chain_time)."""
        return chain_time(self.w3)

    def mined(self, tx_hash: str) -> bool:
        """Whether the chain holds transaction `tx_hash` mined: one that was can be
        dropped with its block (a reorganisation, a local chain restarted from a dump)."""
        try:
            with_rpc_retries(
                lambda: self.w3.eth.get_transaction_receipt(HexBytes(tx_hash)),
                what="eth_getTransactionReceipt",
            )
        except TransactionNotFound:
            return False
        return True

    def history(
        self, account: str, *, from_block: int | None = None, chunk: int = LOG_CHUNK_BLOCKS
    ) -> list[ChainEvent]:
        """Every protocol event naming `account` in any address argument, oldest first
        (from the deploy block, or `from_block`)."""
        account = _cs(account)
        topics: dict[bytes, tuple[str, ContractEvent]] = {}
        for name, contract in self.contracts.items():
            for item in filter_abi_by_type("event", contract.abi):
                event = contract.events[item["name"]]()
                topics[bytes(HexBytes(event.topic))] = (name, event)
        addresses = [c.address for c in self.contracts.values()]
        found: list[ChainEvent] = []
        for log in self._logs({"address": addresses}, from_block, chunk):
            if not log["topics"] or bytes(log["topics"][0]) not in topics:
                continue
            contract_name, event = topics[bytes(log["topics"][0])]
            decoded = event.process_log(log)
            args = dict(decoded["args"])
            if not any(isinstance(v, str) and v == account for v in args.values()):
                continue
            found.append(
                ChainEvent(
                    block=log["blockNumber"],
                    log_index=log["logIndex"],
                    tx_hash="0x" + bytes(log["transactionHash"]).hex(),
                    contract=contract_name,
                    name=decoded["event"],
                    args=args,
                )
            )
        return sorted(found, key=lambda e: (e.block, e.log_index))

    def event_types(self, contract: str, event: str) -> dict[str, str]:
        """The ABI type of each argument of `contract`'s `event`, by name."""
        for item in filter_abi_by_type("event", self.contracts[contract].abi):
            if item["name"] == event:
                return {p["name"]: p["type"] for p in item["inputs"]}
        raise KeyError(f"{contract} has no event {event}")

    def recorded_epochs(self, node: str) -> list[int]:
        """Every epoch the pool recorded work of `node` in (its WorkRecorded events), in
        order; claimed, invalidated or not."""
        event = self.pool.events.WorkRecorded()
        logs = self._logs(
            {"address": self.pool.address, "topics": [event.topic, None, _topic(node)]}
        )
        return sorted({int(event.process_log(log)["args"]["epoch"]) for log in logs})

    def nodes_ever_of(self, provider: str) -> list[str]:
        """Every node `provider` ever added (its NodeAdded events), in order, removed or not:
        a removed node's recorded work is still the provider's to claim."""
        event = self.registry.events.NodeAdded()
        logs = self._logs(
            {"address": self.registry.address, "topics": [event.topic, _topic(provider)]}
        )
        nodes = [to_checksum_address(event.process_log(log)["args"]["node"]) for log in logs]
        return list(dict.fromkeys(nodes))

    def _logs(
        self, query: FilterParams, from_block: int | None = None, chunk: int = LOG_CHUNK_BLOCKS
    ) -> list[LogReceipt]:
        """The logs matching `query` from the deploy block (or `from_block`) to the latest,
        fetched `chunk` blocks at a time, since public RPCs limit eth_getLogs ranges."""
        start = self.deployment.deploy_block if from_block is None else from_block
        end = self._retried(lambda: self.w3.eth.block_number, "eth_blockNumber")
        logs: list[LogReceipt] = []
        for lo in range(start, end + 1, chunk):
            hi = min(end, lo + chunk - 1)
            window: FilterParams = {**query, "fromBlock": lo, "toBlock": hi}
            logs += self._retried(partial(self.w3.eth.get_logs, window), "eth_getLogs")
        return logs

    def wait_until(self, timestamp: int, *, poll: float = 1.0) -> None:
        """Blocks until the chain's time reaches `timestamp` (real chains only move forward)."""
        while self.chain_time() < timestamp:
            time.sleep(poll)


def require_contracts(w3: Web3, deployment: Deployment) -> None:
    """ChainConfigError unless every contract of `deployment` has code on `w3`'s chain.

    Without it, a chain restarted since the file was written (anvil keeps no state)
    would answer every call with empty bytes, which web3 reports as an undecodable
    result; one sentence here says what happened instead.
    """
    for address in deployment.contracts.by_name().values():
        code = with_rpc_retries(partial(w3.eth.get_code, _cs(address)), what="eth_getCode")
        if not code:
            hint = (
                "was the chain restarted? run `swarmrl chain up`"
                if deployment.chain_id == DEV_CHAIN_ID
                else "is the deployment file for this network?"
            )
            raise ChainConfigError(
                f"no contract at {address} on chain {deployment.chain_id}; {hint}"
            )


def _membership(fields: Sequence[Any]) -> Membership:
    provider, joined_at, left_at, slashed, penalty = fields
    return Membership(
        provider=None if int(provider, 16) == 0 else to_checksum_address(provider),
        joined_at=joined_at,
        left_at=left_at,
        slashed=slashed,
        penalty=penalty,
    )


def _cs(address: str) -> ChecksumAddress:
    return to_checksum_address(address)


def _topic(address: str) -> HexBytes:
    """An indexed address argument as a log topic: left-padded to 32 bytes."""
    return HexBytes(bytes(12) + bytes(HexBytes(_cs(address))))
