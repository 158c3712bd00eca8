"""Claims that cannot go through, against the session's real anvil: a key that is not
the node's provider, and an epoch claimed already. Each is one sentence and exit code
1 before anything is sent, from the wallet and from the node's app alike."""

from __future__ import annotations

import pytest

from client.node.screen.onchain import ProviderClaimer
from swarmrl.chain import anvil as anvil_mod
from swarmrl.chain.errors import ChainError
from swarmrl.chain.tokens import TOKEN
from tests.integration import test_wallet_cli
from tests.integration.conftest import NODE_A, PROVIDER_A, VALIDATOR
from tests.integration.test_contracts import _provider_with_node, _record

wallet = test_wallet_cli.wallet  # its fixture: the dev provider's and validator's keys


@pytest.fixture
def node(contracts, accounts, w3, deployment):
    """The dev provider's node, with epochs 3 (2 units) and 4 (1 unit) claimable."""
    node = accounts[NODE_A]
    _provider_with_node(contracts, accounts[PROVIDER_A], node, 150 * TOKEN)
    _record(contracts, accounts, 3, (node, 2, bytes(32)))
    _record(contracts, accounts, 4, (node, 1, bytes(32)))
    anvil_mod.increase_time(w3, deployment.params.invalidation_window + 1)
    return node.address


def test_a_claim_with_a_key_that_is_not_the_provider_s_names_the_provider(
    wallet, node, accounts, w3
):
    """The validator's key holds no membership of the node: the work is still there,
    the provider's to claim, and the wallet says so rather than that it is gone."""
    key, provider = accounts[VALIDATOR].address, accounts[PROVIDER_A].address
    sentence = (
        f"nothing to claim with key validator ({key}): the unclaimed work of node {node} "
        f"was recorded under provider {provider}, whose key claims its 0.3 tokens"
    )
    block = w3.eth.block_number

    every = wallet("claim", "validator", "--node", node)
    assert (every.returncode, every.stdout, every.stderr) == (1, "", f"error: {sentence}\n")
    one = wallet("claim", "validator", "--node", node, "--epoch", "3")
    assert (one.returncode, one.stdout) == (1, "")
    assert one.stderr == (
        f"error: {key} cannot claim epoch 3 of node {node}: it was recorded under provider "
        f"{provider}, whose key claims it\n"
    )
    listed = wallet("claimable", "validator", "--node", node)
    assert (listed.returncode, listed.stdout, listed.stderr) == (0, f"{sentence}\n", "")
    assert w3.eth.block_number == block  # nothing was sent


def test_a_second_claim_of_an_epoch_says_it_is_claimed_already(
    wallet, node, w3, tmp_path, monkeypatch
):
    first = wallet("claim", "provider", "--node", node, "--epoch", "3")
    assert (first.returncode, first.stdout) == (0, "claimed 0.2 for epochs 3\n"), first.stderr
    block = w3.eth.block_number

    again = wallet("claim", "provider", "--node", node, "--epoch", "3", "--epoch", "4")
    assert (again.returncode, again.stdout) == (1, "")
    assert again.stderr == f"error: epoch 3 of node {node} is already claimed\n"
    # The node's app claims through the same check, with the wallet's keystore.
    monkeypatch.setenv("SWARMRL_LOCK_DIR", str(tmp_path / "locks"))
    claimer = ProviderClaimer(
        tmp_path / "deployment.json", tmp_path / "keys", "provider", None, node
    )
    with pytest.raises(ChainError) as refused:
        claimer.claim([3], "correct horse")
    assert str(refused.value) == f"epoch 3 of node {node} is already claimed"
    assert w3.eth.block_number == block  # nothing was sent
