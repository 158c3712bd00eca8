"""Sending transactions from a local key: nonces, gas, fees, receipts, retries, reverts.

One `TxSender` per account and process. It keeps the nonce itself (seeded
from the pending nonce, so several transactions can be in flight) and
resynchronises it whenever the node says it is wrong. Processes sharing a key
take `account_lock` around a whole sequence of sends and the checks before
them, so they neither collide on nonces nor send what the other's sends have
made revert. Transient RPC failures
(connection refused, timeouts, 429/5xx) are retried with exponential backoff;
a revert is never retried: it is decoded into one sentence and raised.
"""

from __future__ import annotations

import fcntl
import os
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any, TypeVar, cast

import requests
from eth_account.signers.local import LocalAccount
from eth_account.types import TransactionDictType
from eth_typing import ChecksumAddress
from hexbytes import HexBytes
from web3 import Web3
from web3.contract.contract import ContractConstructor, ContractFunction
from web3.exceptions import (
    BlockNotFound,
    ContractLogicError,
    TimeExhausted,
    TransactionNotFound,
    Web3RPCError,
)
from web3.types import BlockIdentifier, Nonce, TxParams, TxReceipt, Wei

from swarmrl.chain.errors import (
    ChainError,
    NonceError,
    RevertedError,
    RpcUnavailableError,
    TxTimeoutError,
)
from swarmrl.chain.revert import RevertDecoder, revert_data_of
from swarmrl.files import data_dir

__all__ = [
    "ChainError",
    "NonceError",
    "RevertedError",
    "RpcUnavailableError",
    "TxSender",
    "TxSettings",
    "TxTimeoutError",
    "account_lock",
    "with_rpc_retries",
]

T = TypeVar("T")

_TRANSIENT_HTTP = {408, 425, 429, 500, 502, 503, 504}
_NONCE_MESSAGES = ("nonce too low", "nonce too high", "invalid nonce", "replacement transaction")


@dataclass(frozen=True)
class TxSettings:
    gas_margin: float = 1.25  # estimates move with state between estimate and inclusion
    receipt_timeout: float = 120.0
    poll_interval: float = 0.05
    rpc_retries: int = 5
    backoff: float = 0.25  # seconds; doubles on every retry
    nonce_retries: int = 3


def _is_transient(exc: BaseException) -> bool:
    if isinstance(exc, requests.HTTPError):
        status = exc.response.status_code if exc.response is not None else None
        return status in _TRANSIENT_HTTP
    return isinstance(
        exc,
        requests.ConnectionError | requests.Timeout | ConnectionError | TimeoutError,
    )


def with_rpc_retries(
    call: Callable[[], T], *, what: str, retries: int = 5, backoff: float = 0.25
) -> T:
    """Runs `call`, retrying transient RPC failures; then RpcUnavailableError."""
    for attempt in range(retries + 1):
        try:
            return call()
        except Exception as e:
            if not _is_transient(e):
                raise
            if attempt == retries:
                reason = type(e).__name__
                if isinstance(e, requests.ConnectionError):
                    reason = "connection refused or reset"
                elif isinstance(e, requests.Timeout | TimeoutError):
                    reason = "timed out"
                raise RpcUnavailableError(
                    f"the RPC endpoint did not answer {what} "
                    f"after {retries + 1} attempts ({reason})"
                ) from None
            time.sleep(backoff * 2**attempt)
    raise AssertionError("unreachable")


def chain_time(w3: Web3) -> int:
    """The chain's clock as the next block will read it, the block a transaction sent
    now lands in: the pending block's timestamp (an idle anvil mines no block, so its
    latest one can stand long behind its clock), else the latest block's where the
    node keeps no pending block."""
    try:
        block = with_rpc_retries(lambda: w3.eth.get_block("pending"), what="the pending block")
    except (BlockNotFound, Web3RPCError):
        block = with_rpc_retries(lambda: w3.eth.get_block("latest"), what="the latest block")
    return int(block["timestamp"])


def lock_dir() -> Path:
    """$SWARMRL_LOCK_DIR, else the locks folder under the XDG data home."""
    return data_dir("locks", "SWARMRL_LOCK_DIR")


@contextmanager
def account_lock(
    chain_id: int,
    address: str,
    *,
    directory: Path | None = None,
    on_wait: Callable[[], None] | None = None,
) -> Iterator[None]:
    """Holds the machine-wide send lock of `address` on chain `chain_id` for the block;
    `on_wait` runs once if another process holds it and this one has to wait.

    An flock, so the kernel releases it when its holder exits, however it exits.
    """
    directory = directory or lock_dir()
    path = directory / f"{chain_id}-{address.lower()}.lock"
    if directory.exists() and not directory.is_dir():
        raise ChainError(f"cannot take the send lock of {address}: {directory} is not a folder")
    try:
        directory.mkdir(parents=True, exist_ok=True, mode=0o700)
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    except OSError as e:
        raise ChainError(
            f"cannot take the send lock of {address} at {path}: {e.strerror}"
        ) from None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            if on_wait is not None:
                on_wait()
            fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def _rpc_message(exc: Web3RPCError) -> str:
    response = getattr(exc, "rpc_response", None) or {}
    error = response.get("error") if isinstance(response, dict) else None
    if isinstance(error, dict) and error.get("message"):
        return str(error["message"])
    return str(getattr(exc, "user_message", None) or exc)


class TxSender:
    """Signs and sends transactions for one account, decoding reverts via `decoder`."""

    def __init__(
        self,
        w3: Web3,
        account: LocalAccount,
        decoder: RevertDecoder,
        settings: TxSettings | None = None,
    ) -> None:
        self.w3 = w3
        self.account = account
        self.decoder = decoder
        self.settings = settings or TxSettings()
        self._lock = threading.Lock()
        self._nonce: int | None = None
        self._chain_id: int | None = None

    @property
    def address(self) -> ChecksumAddress:
        return self.account.address

    def _retry(self, call: Callable[[], T], what: str) -> T:
        s = self.settings
        return with_rpc_retries(call, what=what, retries=s.rpc_retries, backoff=s.backoff)

    def chain_id(self) -> int:
        if self._chain_id is None:
            self._chain_id = self._retry(lambda: self.w3.eth.chain_id, "eth_chainId")
        return self._chain_id

    def resync_nonce(self) -> int:
        """Forgets the local nonce and reads the pending one from the node."""
        self._nonce = self._retry(
            lambda: self.w3.eth.get_transaction_count(self.address, "pending"),
            "eth_getTransactionCount",
        )
        return self._nonce

    def call(
        self, fn: ContractFunction, contract: str, *, block: BlockIdentifier = "latest"
    ) -> Any:
        """An eth_call from this account, reverts decoded; the result as `fn`'s ABI decodes
        it."""
        try:
            return self._retry(
                lambda: fn.call({"from": self.address}, block_identifier=block), "eth_call"
            )
        except (ContractLogicError, Web3RPCError) as e:
            raise self._reverted(e, contract) from None

    def fees(self) -> TxParams:
        """EIP-1559 fees: twice the latest base fee plus the node's suggested tip."""
        block = self._retry(lambda: self.w3.eth.get_block("latest"), "eth_getBlockByNumber")
        base = block.get("baseFeePerGas")
        if base is None:  # a pre-London chain: legacy pricing
            return {"gasPrice": self._retry(lambda: self.w3.eth.gas_price, "eth_gasPrice")}
        try:
            tip = self._retry(lambda: self.w3.eth.max_priority_fee, "eth_maxPriorityFeePerGas")
        except Web3RPCError:
            tip = Wei(10**9)
        return {
            "maxFeePerGas": Wei(2 * int(base) + int(tip)),
            "maxPriorityFeePerGas": Wei(int(tip)),
        }

    def transact(
        self,
        fn: ContractFunction | ContractConstructor,
        contract: str,
        *,
        value: int = 0,
        gas: int | None = None,
    ) -> TxReceipt:
        """Estimates, signs, sends and waits for `fn`; returns the successful receipt.

        Raises RevertedError (decoded) if it would revert or did revert,
        TxTimeoutError if no receipt arrives in time, RpcUnavailableError if
        the node stops answering. A given `gas` skips the estimate (and its
        early revert check).
        """
        params: TxParams = {"from": self.address, "value": Wei(value)}
        if gas is None:
            # Against the pending block, which the transaction lands in (geth's default;
            # anvil's is the latest block, whose clock stands still on an idle chain).
            try:
                estimate = self._retry(
                    lambda: fn.estimate_gas(params, block_identifier="pending"), "eth_estimateGas"
                )
            except (ContractLogicError, Web3RPCError) as e:
                raise self._reverted(e, contract) from None
            gas = int(estimate * self.settings.gas_margin)
        params["gas"] = gas
        params["chainId"] = self.chain_id()
        params.update(self.fees())

        tx_hash = self._send(fn, params)
        try:
            receipt = self.wait(tx_hash)
        except TxTimeoutError:
            # A chain that dropped its newest blocks (a reorganisation, a local chain
            # restarted from a dump) holds a lower nonce than ours: the node keeps our
            # transaction queued behind the gap, never to be mined, and every later one
            # behind it. The node's count is read again before the next send.
            with self._lock:
                self._nonce = None
            raise
        if receipt["status"] != 1:
            raise self._mined_revert(params, receipt, fn, contract)
        return receipt

    def _send(self, fn: ContractFunction | ContractConstructor, params: TxParams) -> HexBytes:
        with self._lock:
            for _ in range(self.settings.nonce_retries + 1):
                if self._nonce is None:
                    self.resync_nonce()
                assert self._nonce is not None
                tx = fn.build_transaction({**params, "nonce": Nonce(self._nonce)})
                # eth-account annotates the transaction it signs as a plain dict, web3 builds
                # a TxParams TypedDict (the same mapping), which mypy never takes as a dict.
                signed = self.account.sign_transaction(cast(TransactionDictType, tx))
                try:
                    tx_hash = self._retry(
                        partial(self.w3.eth.send_raw_transaction, signed.raw_transaction),
                        "eth_sendRawTransaction",
                    )
                except RpcUnavailableError:
                    self._nonce = None  # unknown whether it went through
                    raise
                except Web3RPCError as e:
                    message = _rpc_message(e)
                    if "already known" in message.lower() or self._known(signed.hash):
                        self._nonce += 1  # a retried send that had reached the node
                        return HexBytes(signed.hash)
                    if any(m in message.lower() for m in _NONCE_MESSAGES):
                        self._nonce = None
                        continue
                    raise ChainError(f"the node rejected the transaction: {message}") from None
                self._nonce += 1
                return HexBytes(tx_hash)
        raise NonceError(
            f"the node rejected the nonce of {self.address} "
            f"{self.settings.nonce_retries + 1} times; is another process using this key?"
        )

    def _known(self, tx_hash: bytes) -> bool:
        try:
            self.w3.eth.get_transaction(HexBytes(tx_hash))
            return True
        except (TransactionNotFound, Web3RPCError):
            return False

    def wait(self, tx_hash: HexBytes) -> TxReceipt:
        """The receipt of `tx_hash`, polling until the configured timeout."""
        s = self.settings
        try:
            return self._retry(
                lambda: self.w3.eth.wait_for_transaction_receipt(
                    tx_hash, timeout=s.receipt_timeout, poll_latency=s.poll_interval
                ),
                "eth_getTransactionReceipt",
            )
        except TimeExhausted:
            raise TxTimeoutError(
                f"transaction 0x{bytes(tx_hash).hex()} had no receipt after "
                f"{s.receipt_timeout:g} s; it may still be mined"
            ) from None

    def _reverted(self, exc: Exception, contract: str) -> ChainError:
        data = revert_data_of(exc)
        if data is not None:
            return self.decoder.decode(data, contract, now=lambda: chain_time(self.w3))
        if isinstance(exc, Web3RPCError):
            return ChainError(f"{contract}: the node rejected the call: {_rpc_message(exc)}")
        message = getattr(exc, "message", None) or str(exc)
        return RevertedError(f"{contract} reverted: {message}", contract=contract)

    def _mined_revert(
        self,
        params: TxParams,
        receipt: TxReceipt,
        fn: ContractFunction | ContractConstructor,
        contract: str,
    ) -> ChainError:
        """Replays a transaction that reverted on chain to learn why (a function call; a
        constructor cannot be replayed by eth_call)."""
        tx_hash = "0x" + bytes(receipt["transactionHash"]).hex()
        if isinstance(fn, ContractFunction):
            try:
                fn.call(
                    {"from": params["from"], "value": params["value"], "gas": params["gas"]},
                    block_identifier=receipt["blockNumber"] - 1,
                )
            except (ContractLogicError, Web3RPCError) as e:
                error = self._reverted(e, contract)
                error.args = (f"{error} (transaction {tx_hash})",)
                return error
            except Exception:
                pass
        return RevertedError(
            f"{contract} reverted in transaction {tx_hash} (gas used {receipt['gasUsed']})",
            contract=contract,
        )
