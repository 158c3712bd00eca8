"""What every contract handle shares: one deployment on one connection, with the one
optional `TxSender` that signs for the account (so acting as another account builds one
sender, not one per contract), and the handle each contract module builds on.

Writes go through the sender, so every failure is a `ChainError` with one decoded
sentence. Reads need no account.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from typing import Any, ClassVar, TypeVar

from eth_account.signers.local import LocalAccount
from eth_typing import ChecksumAddress
from eth_utils import to_checksum_address
from hexbytes import HexBytes
from web3 import Web3
from web3.contract import Contract
from web3.contract.contract import ContractFunction
from web3.types import FilterParams, LogReceipt, TxReceipt

from swarmrl.chain.artifacts import load_artifact
from swarmrl.chain.deploy import Deployment, decoder
from swarmrl.chain.errors import ChainError
from swarmrl.chain.revert import RevertDecoder, revert_data_of
from swarmrl.chain.tx import TxSender, TxSettings, chain_time, with_rpc_retries

LOG_CHUNK_BLOCKS = 10_000  # public RPCs cap eth_getLogs ranges

T = TypeVar("T")


@dataclass(eq=False)  # a connection, not a value: equal only to itself
class Link:
    """One deployment on one connection; writes act as `account` if one is given."""

    w3: Web3
    deployment: Deployment
    account: LocalAccount | None = None
    settings: TxSettings | None = None
    decoder: RevertDecoder = field(init=False)
    _sender: TxSender | None = field(init=False)

    def __post_init__(self) -> None:
        self.decoder = decoder()
        account = self.account
        self._sender = TxSender(self.w3, account, self.decoder, self.settings) if account else None

    @property
    def address(self) -> str:
        """The account's address (ChainError without one)."""
        return self.require_sender().address

    def require_sender(self) -> TxSender:
        if self._sender is None:
            raise ChainError("this operation needs an account to sign with")
        return self._sender

    def send(self, contract: str, fn: ContractFunction) -> TxReceipt:
        return self.require_sender().transact(fn, contract)

    def call(self, contract: str, fn: ContractFunction) -> Any:
        """`fn`'s result, decoded by its ABI (so of whatever type that says)."""
        if self._sender is not None:
            return self._sender.call(fn, contract)
        try:
            return self.retried(fn.call, "eth_call")
        except Exception as e:
            data = revert_data_of(e)
            if data is None:
                raise
            raise self.decoder.decode(data, contract, now=self.chain_time) from None

    def retried(self, call: Callable[[], T], what: str) -> T:
        """`call`, with transient RPC failures retried as this object's settings say."""
        s = self.settings or TxSettings()
        return with_rpc_retries(call, what=what, retries=s.rpc_retries, backoff=s.backoff)

    def read(self, kind: type[T], contract: str, fn: ContractFunction) -> T:
        """`fn`'s result, which its ABI says is a `kind` (uint: int, bool: bool,
        address: str)."""
        value = self.call(contract, fn)
        if not isinstance(value, kind):
            raise ChainError(
                f"{contract}.{fn.fn_name} returned {type(value).__name__}, not {kind.__name__}"
            )
        return value

    def chain_time(self) -> int:
        """The chain's clock as the next block will read it (see tx.chain_time)."""
        return chain_time(self.w3)

    def logs(
        self, query: FilterParams, from_block: int | None = None, chunk: int = LOG_CHUNK_BLOCKS
    ) -> list[LogReceipt]:
        """The logs matching `query` from the deploy block (or `from_block`) to the latest,
        fetched `chunk` blocks at a time, since public RPCs limit eth_getLogs ranges."""
        start = self.deployment.deploy_block if from_block is None else from_block
        end = self.retried(lambda: self.w3.eth.block_number, "eth_blockNumber")
        logs: list[LogReceipt] = []
        for lo in range(start, end + 1, chunk):
            hi = min(end, lo + chunk - 1)
            window: FilterParams = {**query, "fromBlock": lo, "toBlock": hi}
            logs += self.retried(partial(self.w3.eth.get_logs, window), "eth_getLogs")
        return logs


class ContractHandle:
    """One contract of the deployment (`name`, as the deployment file and the ABIs name
    it), bound to a link: `contract` is its web3 contract."""

    name: ClassVar[str]

    def __init__(self, link: Link) -> None:
        self.link = link
        address = link.deployment.contracts.by_name()[self.name]
        self.contract: Contract = link.w3.eth.contract(
            address=cs(address), abi=load_artifact(self.name).abi
        )

    @property
    def address(self) -> ChecksumAddress:
        """The contract's address."""
        return self.contract.address

    def _send(self, fn: ContractFunction) -> TxReceipt:
        return self.link.send(self.name, fn)

    def _call(self, fn: ContractFunction) -> Any:
        return self.link.call(self.name, fn)

    def _read(self, kind: type[T], fn: ContractFunction) -> T:
        return self.link.read(kind, self.name, fn)


class AccessControlled(ContractHandle):
    """A contract with OpenZeppelin's AccessControl; administration needs its
    DEFAULT_ADMIN_ROLE."""

    def role_id(self, role: str) -> bytes:
        """The id of `role`, named by its constant (e.g. "MINTER_ROLE"), as the contract
        computes it."""
        return bytes(self._call(self.contract.functions[role]()))

    def grant_role(self, role: str, account: str) -> TxReceipt:
        """Grants `role` (its constant's name, e.g. "MINTER_ROLE") on this contract. The
        pool's RECORDER_ROLE and VALIDATOR_ROLE change only after its delay (the
        contract reverts RoleChangeDelayed): see `ComputePool.schedule_role_change`."""
        role_id = self.role_id(role)
        return self._send(self.contract.functions.grantRole(role_id, cs(account)))

    def revoke_role(self, role: str, account: str) -> TxReceipt:
        """Revokes `role` on this contract. The pool's RECORDER_ROLE and VALIDATOR_ROLE
        change only after its delay: see `ComputePool.schedule_role_change`."""
        role_id = self.role_id(role)
        return self._send(self.contract.functions.revokeRole(role_id, cs(account)))

    def has_role(self, role: str, account: str) -> bool:
        role_id = self.role_id(role)
        return self._read(bool, self.contract.functions.hasRole(role_id, cs(account)))


def cs(address: str) -> ChecksumAddress:
    return to_checksum_address(address)


def topic(address: str) -> HexBytes:
    """An indexed address argument as a log topic: left-padded to 32 bytes."""
    return HexBytes(bytes(12) + bytes(HexBytes(cs(address))))
