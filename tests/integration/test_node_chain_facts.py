"""The terminal app's chain facts and its claim against the session's real anvil: a
staked provider's node with recorded work, read and claimed as the app does."""

from __future__ import annotations

from client.node.screen.onchain import ChainReader, ProviderClaimer, work_epochs
from client.node.screen.view import claimable_epochs, epoch_status, stake_status
from swarmrl import keystore
from swarmrl.chain import anvil as anvil_mod
from swarmrl.chain.deploy import write_deployment
from swarmrl.chain.tokens import TOKEN
from swarmrl.times import duration
from tests.integration.conftest import NODE_A, PROVIDER_A
from tests.integration.test_contracts import _record

PASSWORD = "correct horse"


def test_the_app_reads_the_node_s_standing_and_claims_as_its_provider(
    contracts, accounts, w3, deployment, tmp_path, monkeypatch
):
    monkeypatch.setenv("SWARMRL_LOCK_DIR", str(tmp_path / "locks"))
    monkeypatch.delenv("SWARMRL_PASSWORD", raising=False)
    provider, node = accounts[PROVIDER_A], accounts[NODE_A]
    p = contracts.as_account(provider)
    p.registry.register_provider()
    consent, signature = p.registry.node_consent(node, provider.address)
    p.registry.add_node(node.address, consent.deadline, signature)
    p.stakes.stake(150 * TOKEN)
    p.pool.join_pool(node.address)
    _record(contracts, accounts, 1, (node, 3, bytes(32)))
    recorded_at = w3.eth.get_block("latest")["timestamp"]
    write_deployment(tmp_path / "deployment.json", deployment)
    # Epoch 2 holds only a refused submission: no work of the node's to look up there.
    receipts = [{"epoch": 1, "units": 3}, {"epoch": 3, "units": 2}, {"epoch": 2, "units": 0}]
    read = ChainReader(
        tmp_path / "deployment.json", node.address, lambda: sorted(work_epochs(receipts))
    )

    facts = read()
    assert facts.provider == provider.address
    assert (facts.stake, facts.needed, facts.joined) == (150 * TOKEN, 100 * TOKEN, True)
    assert stake_status(facts) == "ok"
    window = deployment.params.invalidation_window
    # The window runs from the record's block; the app counts down to its end from the
    # chain's clock, which has moved on by however long the calls above took.
    assert facts.epochs[0].unlocks_at == recorded_at + window
    assert recorded_at <= facts.now < facts.epochs[0].unlocks_at
    assert [(w.epoch, epoch_status(w, facts.now)) for w in facts.epochs] == [
        (1, f"pending — claimable in {duration(recorded_at + window - facts.now)}"),
        (3, "awaiting record"),
    ]
    assert facts.epochs[0].reward == 3 * deployment.params.reward_per_unit

    anvil_mod.increase_time(w3, window + 1)
    anvil_mod.mine(w3)
    facts = read()
    assert claimable_epochs(facts) == [1]

    keystore.save_public(tmp_path / "keys", "provider", provider.key, PASSWORD)
    claimer = ProviderClaimer(
        tmp_path / "deployment.json", tmp_path / "keys", "provider", None, node.address
    )
    assert claimer.needs_password
    assert claimer.claim([1], PASSWORD) == 3 * deployment.params.reward_per_unit
    assert not claimer.needs_password  # the key stays unlocked for the next claim
    facts = read()
    assert epoch_status(facts.epochs[0], facts.now) == "claimed"
