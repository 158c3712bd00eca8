"""The transaction sender against a live anvil: mined reverts, timeouts, dead RPCs."""

import pytest

from swarmrl.chain import anvil as anvil_mod
from swarmrl.chain.anvil import connect
from swarmrl.chain.contracts import Contracts
from swarmrl.chain.errors import RevertedError, RpcUnavailableError, TxTimeoutError
from swarmrl.chain.tx import TxSender, TxSettings

from .conftest import PROVIDER_A


def test_a_revert_mined_on_chain_is_replayed_and_decoded(contracts, accounts):
    sender = TxSender(contracts.w3, accounts[PROVIDER_A], contracts.decoder)
    fn = contracts.stakes.contract.functions.withdraw()
    with pytest.raises(
        RevertedError,
        match=r"^StakeManager reverted: NothingToWithdraw\(\) \(transaction 0x[0-9a-f]{64}\)$",
    ):
        sender.transact(fn, "StakeManager", gas=100_000)  # no estimate: it goes on chain
    sender.transact(
        contracts.token.contract.functions.approve(contracts.pool.address, 1), "StakeToken"
    )


def test_no_receipt_in_time_is_a_timeout(contracts, accounts, w3):
    settings = TxSettings(receipt_timeout=0.3)
    sender = TxSender(w3, accounts[PROVIDER_A], contracts.decoder, settings)
    w3.provider.make_request("evm_setAutomine", [False])
    try:
        with pytest.raises(TxTimeoutError, match=r"had no receipt after 0.3 s; it may still be"):
            sender.transact(
                contracts.token.contract.functions.approve(contracts.pool.address, 1), "StakeToken"
            )
    finally:
        w3.provider.make_request("evm_setAutomine", [True])
    anvil_mod.mine(w3)
    assert contracts.token.allowance(accounts[PROVIDER_A].address, contracts.pool.address) == 1


def test_a_dead_rpc_is_retried_then_reported(deployment, accounts):
    dead = connect("http://127.0.0.1:9")
    settings = TxSettings(rpc_retries=2, backoff=0.01)
    chain = Contracts(dead, deployment, accounts[PROVIDER_A], settings)
    with pytest.raises(RpcUnavailableError, match=r"after 3 attempts \(connection refused"):
        chain.registry.register_provider()
    with pytest.raises(RpcUnavailableError):
        Contracts.connect(deployment, rpc_url="http://127.0.0.1:9", settings=settings)


def test_a_sender_whose_nonce_the_chain_dropped_sends_again_after_a_timeout(
    contracts, accounts, w3
):
    # The chain lost the sender's newest block (a reorganisation, a local chain restarted
    # from its last dump): its next nonce is ahead of the chain's, so the node queues its
    # transaction behind the gap and never mines it. Timed out once, it reads the nonce
    # again and the next send goes through.
    settings = TxSettings(receipt_timeout=0.5)
    sender = TxSender(w3, accounts[PROVIDER_A], contracts.decoder, settings)
    approve = contracts.token.contract.functions.approve
    before = anvil_mod.snapshot(w3)
    sender.transact(approve(contracts.pool.address, 1), "StakeToken")
    anvil_mod.revert(w3, before)  # the block is gone, the sender's nonce stays ahead
    with pytest.raises(TxTimeoutError):
        sender.transact(approve(contracts.pool.address, 2), "StakeToken")
    sender.transact(approve(contracts.pool.address, 3), "StakeToken")
    # The transaction queued behind the gap is mined once the gap is filled, as a
    # reorganised transaction is: what a sender sends must be safe to land twice.
    assert contracts.token.allowance(accounts[PROVIDER_A].address, contracts.pool.address) == 2
