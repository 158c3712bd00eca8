"""The protocol's contracts as typed Python calls: one object per (deployment, account).

Providers register, take nodes (with the node's signed consent) and stake;
nodes join the run's pool; the orchestrator records work; validators
invalidate and slash; providers claim. `Contracts` holds one handle per contract
(`token`, `registry`, `stakes`, `pool`), all sharing one `Link`: writes go through its
one `TxSender`, so every failure is a `ChainError` with one decoded sentence. Reads
need no account.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from functools import partial
from typing import Any

from eth_account.signers.local import LocalAccount
from eth_utils import filter_abi_by_type
from hexbytes import HexBytes
from web3 import Web3
from web3.contract.contract import ContractEvent
from web3.exceptions import TransactionNotFound

from swarmrl.chain.anvil import DEV_CHAIN_ID, connect
from swarmrl.chain.compute_pool import ComputePool
from swarmrl.chain.deploy import Deployment
from swarmrl.chain.errors import ChainConfigError
from swarmrl.chain.link import LOG_CHUNK_BLOCKS, ContractHandle, Link, cs
from swarmrl.chain.provider_registry import ProviderRegistry
from swarmrl.chain.stake_manager import StakeManager
from swarmrl.chain.stake_token import StakeToken
from swarmrl.chain.tx import TxSender, TxSettings, with_rpc_retries


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
        self.link = Link(w3, deployment, account, settings)
        self.w3, self.deployment, self.settings = w3, deployment, settings
        self.decoder = self.link.decoder
        self.token = StakeToken(self.link)
        self.registry = ProviderRegistry(self.link)
        self.stakes = StakeManager(self.link, self.token)
        self.pool = ComputePool(self.link, self.token)
        self.handles: dict[str, ContractHandle] = {
            h.name: h for h in (self.token, self.registry, self.stakes, self.pool)
        }

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
        return self.link.address

    @property
    def sender(self) -> TxSender:
        return self.link.require_sender()

    def eth_balance(self, account: str) -> int:
        return with_rpc_retries(lambda: self.w3.eth.get_balance(cs(account)), what="balance")

    def chain_time(self) -> int:
        """The chain's clock as the next block will read it (see tx.chain_time)."""
        return self.link.chain_time()

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
        account = cs(account)
        topics: dict[bytes, tuple[str, ContractEvent]] = {}
        for name, handle in self.handles.items():
            for item in filter_abi_by_type("event", handle.contract.abi):
                event = handle.contract.events[item["name"]]()
                topics[bytes(HexBytes(event.topic))] = (name, event)
        addresses = [h.address for h in self.handles.values()]
        found: list[ChainEvent] = []
        for log in self.link.logs({"address": addresses}, from_block, chunk):
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
        for item in filter_abi_by_type("event", self.handles[contract].contract.abi):
            if item["name"] == event:
                return {p["name"]: p["type"] for p in item["inputs"]}
        raise KeyError(f"{contract} has no event {event}")

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
        code = with_rpc_retries(partial(w3.eth.get_code, cs(address)), what="eth_getCode")
        if not code:
            hint = (
                "was the chain restarted? run `swarmrl chain up`"
                if deployment.chain_id == DEV_CHAIN_ID
                else "is the deployment file for this network?"
            )
            raise ChainConfigError(
                f"no contract at {address} on chain {deployment.chain_id}; {hint}"
            )
