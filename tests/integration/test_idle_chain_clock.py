"""An idle local chain's clock: anvil moves its latest block's time only when it mines,
so a window that has ended by the chain's clock may not have ended by the latest block.
Claims and the node's view judge it by the block that will carry the claim, the next."""

from __future__ import annotations

import re

import pytest

from client.node.screen.onchain import read_facts
from client.node.screen.view import claimable_epochs
from swarmrl.chain import anvil as anvil_mod
from swarmrl.chain.errors import RevertedError
from swarmrl.chain.tokens import TOKEN
from swarmrl.times import date_time

from .conftest import NODE_B, PROVIDER_B
from .test_contracts import _provider_with_node, _record, _signed_epoch


def test_a_claim_goes_through_once_the_window_has_passed_on_an_idle_chain(
    contracts, accounts, w3, deployment
):
    node = accounts[NODE_B]
    provider = _provider_with_node(contracts, accounts[PROVIDER_B], node, 150 * TOKEN)
    _, _, tree = _signed_epoch(contracts, node, [10, 11])
    _record(contracts, accounts, 1, (node, 2, tree.root))
    unlocks_at = contracts.pool.work_of(1, node.address).unlocks_at
    # Inside the window: refused, saying when it opens by the chain's clock.
    when = re.escape(date_time(unlocks_at))
    with pytest.raises(RevertedError, match=rf"unlocksAt={when} \(in (9 min \d+ s|10 min)\)\)$"):
        provider.pool.claim(node.address, [1])
    assert claimable_epochs(read_facts(contracts, node.address, [1], {})) == []

    # The window passes by the chain's clock (as the wall clock would move it), and no
    # block is mined: the latest block still says the window is open.
    latest = w3.eth.get_block("latest")
    window = deployment.params.invalidation_window
    anvil_mod.increase_time(w3, window + 1, mine_block=False)
    assert w3.eth.get_block("latest") == latest
    assert latest["timestamp"] < unlocks_at <= contracts.chain_time()

    assert claimable_epochs(read_facts(contracts, node.address, [1], {})) == [1]
    assert provider.pool.claim(node.address, [1]) == 2 * deployment.params.reward_per_unit
    assert contracts.pool.work_of(1, node.address).claimed
