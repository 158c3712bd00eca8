"""`node init`'s chain part on the session's real anvil: keys, consent, register, join."""

from __future__ import annotations

import pytest

from client.node.setup.keys import NodeSetupError, Step, init_node, passwords_from
from swarmrl import keystore
from swarmrl.chain.tokens import TOKEN
from swarmrl.p2p.identity import load_or_create_peer_key, peer_id_of, peer_key_path
from tests.integration.conftest import NODE_A, PROVIDER_A, PROVIDER_B

PASSWORD = "correct horse"


@pytest.fixture
def keys(tmp_path, accounts, monkeypatch):
    """A keystore holding the dev provider's key as 'provider'."""
    monkeypatch.setenv("SWARMRL_LOCK_DIR", str(tmp_path / "locks"))
    directory = tmp_path / "keys"
    keystore.save_public(directory, "provider", accounts[PROVIDER_A].key, PASSWORD)
    return directory


class Passwords:
    """Hands out each key's password (PASSWORD unless given) and remembers who asked."""

    def __init__(self, **by_key: str) -> None:
        self.by_key = by_key
        self.asked: list[tuple[str, bool]] = []

    def __call__(self, name: str, new: bool) -> str:
        self.asked.append((name, new))
        return self.by_key.get(name, PASSWORD)


def stake(contracts, account, tokens: int) -> None:
    provider = contracts.as_account(account)
    provider.registry.register_provider()
    provider.stakes.stake(tokens * TOKEN, permit=True)


def sent_by(w3, address: str) -> int:
    return w3.eth.get_transaction_count(address)


def test_a_fresh_node_is_registered_and_joined_and_a_second_run_does_nothing(
    keys, tmp_path, contracts, deployment, accounts, w3
):
    stake(contracts, accounts[PROVIDER_A], 100)
    password_file = tmp_path / "password"
    password_file.write_text(PASSWORD + "\n")

    done = init_node(keys, "node", "provider", passwords_from(password_file), deployment)

    provider = accounts[PROVIDER_A].address
    assert done.steps == (Step.NODE_KEY, Step.PEER_IDENTITY, Step.NODE_ADDED, Step.POOL_JOINED)
    assert done.provider == provider
    assert done.node == keystore.unlock(keys, "node", PASSWORD).address
    assert done.peer_id == peer_id_of(load_or_create_peer_key(peer_key_path(keys, "node")))
    assert contracts.registry.provider_of(done.node) == provider
    assert contracts.pool.is_joined(done.node)
    assert contracts.registry.consent_nonce(done.node) == 1
    assert "added the node" in done.summary()

    before = sent_by(w3, provider)
    # No password is read when nothing needs a key: this file does not exist.
    again = init_node(keys, "node", "provider", passwords_from(tmp_path / "none"), deployment)
    assert again.steps == ()
    assert (again.node, again.peer_id, again.provider) == (done.node, done.peer_id, provider)
    assert again.summary().startswith("nothing to do: ")
    assert sent_by(w3, provider) == before


def test_a_provider_without_enough_stake_gets_one_sentence_and_nothing_changes(
    keys, contracts, deployment, accounts, w3
):
    stake(contracts, accounts[PROVIDER_A], 60)
    provider = accounts[PROVIDER_A].address
    before, block = sent_by(w3, provider), w3.eth.block_number
    passwords = Passwords()

    with pytest.raises(NodeSetupError) as refused:
        init_node(keys, "node", "provider", passwords, deployment)

    assert str(refused.value) == (
        f"provider 'provider' ({provider}) has 60 tokens staked, but 1 node(s) need 100 "
        "(100 each); stake 40 more with `swarmrl wallet stake provider 40`"
    )
    assert (sent_by(w3, provider), w3.eth.block_number) == (before, block)
    assert passwords.asked == []  # refused before any key was made or unlocked
    assert not (keys / "node.json").exists()
    assert not peer_key_path(keys, "node").exists()


def test_stake_must_cover_one_more_node(keys, contracts, deployment, accounts, w3):
    stake(contracts, accounts[PROVIDER_A], 150)
    init_node(keys, "node1", "provider", Passwords(), deployment)
    provider = accounts[PROVIDER_A].address
    before = sent_by(w3, provider)

    with pytest.raises(NodeSetupError, match=r"2 node\(s\) need 200 .* stake 50 more"):
        init_node(keys, "node2", "provider", Passwords(), deployment)
    assert sent_by(w3, provider) == before


def test_an_unregistered_provider_with_no_stake_is_told_to_stake(keys, deployment, accounts, w3):
    provider = accounts[PROVIDER_A].address
    before = sent_by(w3, provider)
    with pytest.raises(NodeSetupError, match=r"has 0 tokens staked.*wallet stake provider 100`$"):
        init_node(keys, "node", "provider", Passwords(), deployment)
    assert sent_by(w3, provider) == before


def test_a_node_registered_and_not_joined_only_joins(keys, contracts, deployment, accounts, w3):
    stake(contracts, accounts[PROVIDER_A], 100)
    node = accounts[NODE_A]
    keystore.save_public(keys, "node", node.key, PASSWORD)
    provider = contracts.as_account(accounts[PROVIDER_A])
    consent, signature = provider.registry.node_consent(node, provider.address)
    provider.registry.add_node(node.address, consent.deadline, signature)
    passwords = Passwords()

    done = init_node(keys, "node", "provider", passwords, deployment)

    assert done.steps == (Step.PEER_IDENTITY, Step.POOL_JOINED)
    assert contracts.pool.is_joined(node.address)
    assert passwords.asked == [("provider", False)]  # no consent to sign, so no node key


def test_a_wrong_provider_password_sends_nothing_and_a_rerun_finishes(
    keys, contracts, deployment, accounts, w3
):
    stake(contracts, accounts[PROVIDER_A], 100)
    provider = accounts[PROVIDER_A].address
    before = sent_by(w3, provider)

    with pytest.raises(keystore.KeystoreError, match="wrong password for key 'provider'"):
        init_node(keys, "node", "provider", Passwords(provider="battery staple"), deployment)
    assert sent_by(w3, provider) == before

    # The keys the failed run made are kept; the rerun unlocks the node's to sign consent.
    passwords = Passwords()
    done = init_node(keys, "node", "provider", passwords, deployment)
    assert done.steps == (Step.NODE_ADDED, Step.POOL_JOINED)
    assert passwords.asked == [("provider", False), ("node", False)]
    assert contracts.pool.is_joined(done.node)


def test_a_node_taken_by_another_provider_is_refused(keys, contracts, deployment, accounts, w3):
    stake(contracts, accounts[PROVIDER_A], 100)
    node = accounts[NODE_A]
    keystore.save_public(keys, "node", node.key, PASSWORD)
    other = contracts.as_account(accounts[PROVIDER_B])
    other.registry.register_provider()
    consent, signature = other.registry.node_consent(node, other.address)
    other.registry.add_node(node.address, consent.deadline, signature)
    before = sent_by(w3, accounts[PROVIDER_A].address)

    with pytest.raises(NodeSetupError) as refused:
        init_node(keys, "node", "provider", Passwords(), deployment)

    assert str(refused.value) == (
        f"node {node.address} is registered to provider {other.address}, not to "
        f"{accounts[PROVIDER_A].address}; that provider must remove it first, "
        "or give this node a new key"
    )
    assert sent_by(w3, accounts[PROVIDER_A].address) == before


def test_the_provider_key_cannot_be_the_node_key(keys, deployment, w3):
    with pytest.raises(NodeSetupError, match="is the provider's key"):
        init_node(keys, "provider", "provider", Passwords(), deployment)


def test_a_missing_provider_key_is_one_sentence(keys, deployment, w3):
    with pytest.raises(keystore.KeystoreError, match="no key named 'nobody'"):
        init_node(keys, "node", "nobody", Passwords(), deployment)
    assert not (keys / "node.json").exists()


def test_an_unreachable_chain_is_one_sentence(keys, deployment, w3):
    with pytest.raises(NodeSetupError, match=r"^the RPC endpoint did not answer .* attempts"):
        init_node(keys, "node", "provider", Passwords(), deployment, rpc_url="http://127.0.0.1:9")
    assert not (keys / "node.json").exists()
