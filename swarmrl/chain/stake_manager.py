"""StakeManager: providers stake (approving the token, or with an ERC-2612 permit),
unbond and withdraw; the pools bond part of the stake and slash it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from eth_typing import Hash32
from eth_utils import to_checksum_address
from web3.logs import DISCARD
from web3.types import TxReceipt

from swarmrl import eip712
from swarmrl.chain.link import AccessControlled, Link, cs
from swarmrl.chain.stake_token import StakeToken


@dataclass(frozen=True)
class Unbonding:
    total: int
    withdrawable: int


class StakeManager(AccessControlled):
    """Providers' stake; staking spends `token`."""

    name: ClassVar[str] = "StakeManager"

    def __init__(self, link: Link, token: StakeToken) -> None:
        super().__init__(link)
        self.token = token

    def stake(self, amount: int, *, permit: bool = False, ttl: int = 3600) -> TxReceipt:
        """Stakes `amount`: approve + stake, or one transaction with an ERC-2612 permit."""
        manager = self.address
        if not permit:
            self.token.ensure_allowance(manager, amount)
            return self._send(self.contract.functions.stake(amount))
        owner = self.link.require_sender().account
        deadline = self.link.chain_time() + ttl
        token = self.token.contract.functions
        message = eip712.Permit(
            owner=owner.address,
            spender=manager,
            value=amount,
            nonce=self.link.call(self.token.name, token.nonces(owner.address)),
            deadline=deadline,
        )
        domain = eip712.Domain(
            name=self.link.call(self.token.name, token.name()),
            chain_id=self.link.deployment.chain_id,
            verifying_contract=self.token.address,
        )
        signed = owner.unsafe_sign_hash(Hash32(message.digest(domain)))
        fn = self.contract.functions.stakeWithPermit(
            amount, deadline, signed.v, signed.r.to_bytes(32, "big"), signed.s.to_bytes(32, "big")
        )
        return self._send(fn)

    def request_unbond(self, amount: int) -> TxReceipt:
        return self._send(self.contract.functions.requestUnbond(amount))

    def withdraw(self) -> int:
        """Withdraws every released unbonding entry; returns the amount paid out."""
        receipt = self._send(self.contract.functions.withdraw())
        events = self.contract.events.Withdrawn().process_receipt(receipt, errors=DISCARD)
        return sum(int(e["args"]["amount"]) for e in events)

    def stake_of(self, provider: str) -> int:
        return self._read(int, self.contract.functions.stakeOf(cs(provider)))

    def unbonding_of(self, provider: str) -> Unbonding:
        total, withdrawable = self._call(self.contract.functions.unbondingOf(cs(provider)))
        return Unbonding(total=total, withdrawable=withdrawable)

    def bonded_of(self, provider: str) -> int:
        """Active stake the pools bond: a penalty per joined node, and per node that left
        while work recorded before its leave could still be slashed."""
        return self._read(int, self.contract.functions.bondedOf(cs(provider)))

    def min_stake_per_node(self) -> int:
        return self._read(int, self.contract.functions.minStakePerNode())

    def total_staked(self) -> int:
        return self._read(int, self.contract.functions.totalStaked())

    def treasury(self) -> str:
        return to_checksum_address(self._call(self.contract.functions.treasury()))
