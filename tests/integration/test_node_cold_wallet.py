"""A cold provider wallet on the session's real anvil: the node's machine signs the
node's consent into a file (no provider key there, nothing sent), the provider's
machine checks it and registers, adds and joins the node (no node key there).

Two keystore folders stand for the two machines; each test checks that neither
ever holds the other's key.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from client.node.settings import NodeSettings
from client.node.setup.doctor import run_checks
from client.node.setup.keys import (
    ConsentFile,
    NodeSetupError,
    Step,
    add_node_with_consent,
    read_consent,
    sign_consent,
)
from swarmrl import eip712, keystore
from swarmrl.chain import anvil as anvil_mod
from swarmrl.chain.deploy import write_deployment
from swarmrl.chain.tokens import TOKEN
from swarmrl.p2p.identity import load_or_create_peer_key, peer_id_of, peer_key_path
from swarmrl.times import date_time
from tests.integration.conftest import PROVIDER_A, PROVIDER_B

PASSWORD = "correct horse"
DAY = 86400
SWARMRL = Path(sys.executable).with_name("swarmrl")


def passwords(name: str, new: bool) -> str:
    return PASSWORD


@pytest.fixture
def machines(tmp_path, accounts, monkeypatch):
    """Two machines' keystores: the node's (empty), the provider's (its key only)."""
    monkeypatch.setenv("SWARMRL_LOCK_DIR", str(tmp_path / "locks"))
    node_keys, provider_keys = tmp_path / "node-machine" / "keys", tmp_path / "cold" / "keys"
    keystore.save_public(provider_keys, "provider", accounts[PROVIDER_A].key, PASSWORD)
    return node_keys, provider_keys


def stake(contracts, account, tokens: int) -> None:
    provider = contracts.as_account(account)
    provider.registry.register_provider()
    provider.stakes.stake(tokens * TOKEN, permit=True)


def sent_by(w3, address: str) -> int:
    return w3.eth.get_transaction_count(address)


def holds_only(folder: Path, names: set[str], foreign_key: bytes) -> None:
    """`folder` holds exactly the files `names`, and none of them the key `foreign_key`
    (the other machine's), in any form a file could carry it."""
    assert {p.name for p in folder.iterdir()} == names
    for path in folder.iterdir():
        text = path.read_bytes().lower()
        assert foreign_key.hex().encode() not in text
        assert foreign_key not in path.read_bytes()


def signed_on_node_machine(node_keys, provider: str, deployment, tmp_path, name="node"):
    """What the node's machine does: sign, and write the consent file."""
    done, consent = sign_consent(node_keys, name, provider, passwords, deployment, valid_for=DAY)
    path = tmp_path / f"consent-{name}.json"
    path.write_bytes(consent.to_json())
    return done, path


def test_a_node_is_added_by_a_provider_whose_key_is_on_another_machine(
    machines, tmp_path, contracts, deployment, accounts, w3
):
    node_keys, provider_keys = machines
    provider = accounts[PROVIDER_A]
    stake(contracts, provider, 100)
    block = w3.eth.block_number

    done, consent_path = signed_on_node_machine(node_keys, provider.address, deployment, tmp_path)

    assert done.steps == (Step.NODE_KEY, Step.PEER_IDENTITY, Step.CONSENT_SIGNED)
    node = keystore.unlock(node_keys, "node", PASSWORD)
    assert done.node == node.address
    assert done.peer_id == peer_id_of(load_or_create_peer_key(peer_key_path(node_keys, "node")))
    # The node's machine sent nothing and owns nothing: no gas, no tokens.
    assert w3.eth.block_number == block
    assert (sent_by(w3, node.address), contracts.eth_balance(node.address)) == (0, 0)
    assert contracts.token.balance_of(node.address) == 0
    consent = json.loads(consent_path.read_text())
    assert consent["node"] == node.address
    assert consent["provider"] == provider.address
    assert consent["chain_id"] == deployment.chain_id
    assert consent["deadline"] == pytest.approx(contracts.chain_time() + DAY, abs=5)
    assert node.key.hex() not in consent_path.read_text()

    added = add_node_with_consent(
        provider_keys, "provider", passwords, deployment, read_consent(consent_path)
    )

    assert added.steps == (Step.NODE_ADDED, Step.POOL_JOINED)
    assert (added.node, added.provider, added.peer_id) == (node.address, provider.address, None)
    assert contracts.registry.provider_of(node.address) == provider.address
    assert contracts.pool.is_joined(node.address)
    assert added.summary() == (
        f"node {node.address} with provider {provider.address}: "
        "added the node to the provider's nodes, joined the pool"
    )
    holds_only(node_keys, {"node.json", "node.peer-key"}, provider.key)
    holds_only(provider_keys, {"provider.json"}, node.key)

    # Run again with the same (now used) consent: nothing to send, nothing sent.
    before = sent_by(w3, provider.address)
    again = add_node_with_consent(
        provider_keys, "provider", passwords, deployment, read_consent(consent_path)
    )
    assert again.steps == ()
    assert again.summary().startswith("nothing to do: ")
    assert sent_by(w3, provider.address) == before


def test_the_node_machine_passes_what_node_run_needs_without_the_provider_key(
    machines, tmp_path, contracts, deployment, accounts, w3
):
    node_keys, provider_keys = machines
    stake(contracts, accounts[PROVIDER_A], 100)
    done, consent_path = signed_on_node_machine(
        node_keys, accounts[PROVIDER_A].address, deployment, tmp_path
    )
    add_node_with_consent(
        provider_keys, "provider", passwords, deployment, read_consent(consent_path)
    )
    write_deployment(tmp_path / "deployment.json", deployment)
    settings = NodeSettings(
        data_dir=tmp_path / "node-machine" / "data",
        keystore_dir=node_keys,
        deployment=tmp_path / "deployment.json",
    )
    assert settings.provider_key is None

    found = {check.name: check for check in run_checks(settings, PASSWORD)}

    assert found["keystore"].detail == (
        f"ok: key 'node' unlocks: node {done.node}, peer {done.peer_id}"
    )
    assert found["stake"].ok, found["stake"]
    assert found["joined"].detail == f"ok: node {done.node} is in the run's pool"


def test_one_provider_adds_two_nodes_from_two_machines(
    machines, tmp_path, contracts, deployment, accounts, w3
):
    _, provider_keys = machines
    provider = accounts[PROVIDER_A].address
    stake(contracts, accounts[PROVIDER_A], 200)
    nodes = []
    for machine in ("first", "second"):
        done, path = signed_on_node_machine(
            tmp_path / machine / "keys", provider, deployment, tmp_path, name=machine
        )
        add_node_with_consent(provider_keys, "provider", passwords, deployment, read_consent(path))
        nodes.append(done.node)

    assert sorted(contracts.registry.nodes_of(provider)) == sorted(nodes)
    assert all(contracts.pool.is_joined(node) for node in nodes)
    assert len(set(nodes)) == 2


def test_the_second_node_needs_stake_for_two_and_nothing_is_sent(
    machines, tmp_path, contracts, deployment, accounts, w3
):
    _, provider_keys = machines
    provider = accounts[PROVIDER_A].address
    stake(contracts, accounts[PROVIDER_A], 150)
    _, first = signed_on_node_machine(tmp_path / "a" / "keys", provider, deployment, tmp_path, "a")
    add_node_with_consent(provider_keys, "provider", passwords, deployment, read_consent(first))
    _, second = signed_on_node_machine(tmp_path / "b" / "keys", provider, deployment, tmp_path, "b")
    before = sent_by(w3, provider)

    with pytest.raises(NodeSetupError) as refused:
        add_node_with_consent(
            provider_keys, "provider", passwords, deployment, read_consent(second)
        )

    assert str(refused.value) == (
        f"provider 'provider' ({provider}) has 150 tokens staked, but 2 node(s) need 200 "
        "(100 each); stake 50 more with `swarmrl wallet stake provider 50`"
    )
    assert sent_by(w3, provider) == before


def test_a_consent_for_another_provider_is_refused(
    machines, tmp_path, contracts, deployment, accounts, w3
):
    node_keys, provider_keys = machines
    stake(contracts, accounts[PROVIDER_A], 100)
    other, mine = accounts[PROVIDER_B].address, accounts[PROVIDER_A].address
    _, path = signed_on_node_machine(node_keys, other, deployment, tmp_path)
    before = sent_by(w3, mine)

    with pytest.raises(NodeSetupError) as refused:
        add_node_with_consent(provider_keys, "provider", passwords, deployment, read_consent(path))

    assert str(refused.value) == (
        f"the consent is for provider {other}, but key 'provider' is {mine}; sign one for it "
        f"on the node's machine with `swarmrl node init --provider-address {mine} "
        "--consent-out FILE`"
    )
    assert sent_by(w3, mine) == before


@pytest.mark.parametrize(
    ("field", "value"),
    [("deadline", 1), ("nonce", 1), ("node", "other"), ("signature", "twin")],
)
def test_a_changed_consent_is_refused_as_not_the_nodes(
    field, value, machines, tmp_path, contracts, deployment, accounts, w3
):
    node_keys, provider_keys = machines
    provider = accounts[PROVIDER_A]
    stake(contracts, provider, 100)
    done, path = signed_on_node_machine(node_keys, provider.address, deployment, tmp_path)
    document = json.loads(path.read_text())
    named = done.node
    if field == "node":
        named = accounts[PROVIDER_B].address  # a node that never signed it
        document["node"] = named
    elif field == "signature":
        # The same signature in the twin form (n - s) that plain ECDSA takes and the
        # contracts refuse.
        raw = bytes.fromhex(document["signature"])
        s = eip712.SECP256K1_ORDER - int.from_bytes(raw[32:64], "big")
        twin = raw[:32] + s.to_bytes(32, "big") + bytes([55 - raw[64]])
        document["signature"] = twin.hex()
    else:
        document[field] += value
    path.write_text(json.dumps(document))
    before = sent_by(w3, provider.address)

    with pytest.raises(NodeSetupError) as refused:
        add_node_with_consent(provider_keys, "provider", passwords, deployment, read_consent(path))

    assert str(refused.value) == (
        f"the consent is not signed by node {named}: it was changed after signing, or is "
        "damaged; sign a new one on the node's machine"
    )
    assert sent_by(w3, provider.address) == before
    assert contracts.registry.provider_of(done.node) is None


def test_an_expired_consent_is_refused(machines, tmp_path, contracts, deployment, accounts, w3):
    node_keys, provider_keys = machines
    provider = accounts[PROVIDER_A].address
    stake(contracts, accounts[PROVIDER_A], 100)
    _, consent = sign_consent(node_keys, "node", provider, passwords, deployment, valid_for=60)
    anvil_mod.increase_time(w3, 120)
    before = sent_by(w3, provider)

    with pytest.raises(NodeSetupError) as refused:
        add_node_with_consent(provider_keys, "provider", passwords, deployment, consent)

    assert str(refused.value) == (
        f"the consent expired at {date_time(consent.deadline)} (by the chain's clock); "
        "sign a new one on the node's machine"
    )
    assert sent_by(w3, provider) == before


def test_a_used_consent_cannot_add_the_node_again(
    machines, tmp_path, contracts, deployment, accounts, w3
):
    node_keys, provider_keys = machines
    provider = accounts[PROVIDER_A]
    stake(contracts, provider, 100)
    _, consent = sign_consent(
        node_keys, "node", provider.address, passwords, deployment, valid_for=DAY
    )
    add_node_with_consent(provider_keys, "provider", passwords, deployment, consent)
    # Given up by its provider, the node is added again only with a new consent.
    contracts.as_account(provider).registry.remove_node(consent.node)
    before = sent_by(w3, provider.address)

    with pytest.raises(NodeSetupError) as refused:
        add_node_with_consent(provider_keys, "provider", passwords, deployment, consent)

    assert str(refused.value) == (
        "the consent was used or revoked already (it names the node's consent nonce 0, which "
        "is now 1); sign a new one on the node's machine"
    )
    assert sent_by(w3, provider.address) == before


def test_a_consent_from_another_deployment_is_refused(
    machines, tmp_path, contracts, deployment, accounts, w3
):
    node_keys, provider_keys = machines
    stake(contracts, accounts[PROVIDER_A], 100)
    _, consent = sign_consent(
        node_keys, "node", accounts[PROVIDER_A].address, passwords, deployment, valid_for=DAY
    )
    elsewhere = consent.model_copy(update={"chain_id": 84532})
    registry = deployment.contracts.provider_registry

    with pytest.raises(NodeSetupError) as refused:
        add_node_with_consent(provider_keys, "provider", passwords, deployment, elsewhere)

    assert str(refused.value) == (
        f"the consent is for the registry {consent.registry} on chain 84532, not this "
        f"deployment's ({registry} on chain {deployment.chain_id}); sign it on the node's "
        "machine with the same deployment file"
    )


def test_a_node_taken_by_another_provider_signs_no_consent(
    machines, tmp_path, contracts, deployment, accounts, w3
):
    node_keys, _ = machines
    stake(contracts, accounts[PROVIDER_A], 100)
    done, path = signed_on_node_machine(
        node_keys, accounts[PROVIDER_A].address, deployment, tmp_path
    )
    add_node_with_consent(
        tmp_path / "cold" / "keys", "provider", passwords, deployment, read_consent(path)
    )
    other = accounts[PROVIDER_B].address

    with pytest.raises(NodeSetupError) as refused:
        sign_consent(node_keys, "node", other, passwords, deployment, valid_for=DAY)

    assert str(refused.value) == (
        f"node {done.node} is registered to provider {accounts[PROVIDER_A].address}, not to "
        f"{other}; that provider must remove it first, or give this node a new key"
    )


@pytest.mark.parametrize(
    ("content", "where"),
    [
        (b"", "its top level"),
        (b"{}", "format"),
        (b'{"format": "swarmrl node consent", "version": 1}', "chain_id"),
        (b"x" * 5000, None),
    ],
)
def test_a_file_that_is_no_consent_is_one_sentence(tmp_path, content, where):
    path = tmp_path / "consent.json"
    path.write_bytes(content)
    with pytest.raises(ValueError, match=r"consent") as refused:
        read_consent(path)
    if where is None:
        assert str(refused.value) == f"{path} is too large to be a node's consent"
    else:
        assert str(refused.value) == (
            f"{path} is not a node's consent as `swarmrl node init --consent-out` writes it "
            f"(the first problem is at {where})"
        )


def test_the_two_commands_on_two_machines(tmp_path, deployment, contracts, accounts, w3):
    """`node init --provider-address ... --consent-out`, then `wallet add-node`, each as a
    process with its own keystore folder."""
    stake(contracts, accounts[PROVIDER_A], 100)
    deployment_file = tmp_path / "deployment.json"
    write_deployment(deployment_file, deployment)
    provider = accounts[PROVIDER_A]
    (tmp_path / "provider.hex").write_text(provider.key.hex())

    def swarmrl(machine: str, *args: str) -> subprocess.CompletedProcess[str]:
        env = {
            **os.environ,
            "SWARMRL_KEYSTORE_DIR": str(tmp_path / machine / "keys"),
            "SWARMRL_DEPLOYMENT": str(deployment_file),
            "SWARMRL_LOCK_DIR": str(tmp_path / machine / "locks"),
            "SWARMRL_PASSWORD": PASSWORD,
        }
        return subprocess.run(
            [SWARMRL, *args], env=env, cwd=tmp_path, capture_output=True, text=True, timeout=120
        )

    imported = swarmrl("cold", "wallet", "import", "provider", "--private-key-file", "provider.hex")
    assert imported.returncode == 0, imported.stderr

    both = swarmrl(
        "node", "node", "init", "--provider", "p", "--provider-address", provider.address
    )
    assert both.returncode == 2
    assert "give one: --provider KEY" in both.stderr
    alone = swarmrl("node", "node", "init", "--provider-address", provider.address)
    assert alone.returncode == 2
    assert "together" in alone.stderr
    lifetime = swarmrl("node", "node", "init", "--provider", "p", "--consent-valid-for", "7d")
    assert lifetime.returncode == 2
    assert "--consent-valid-for only with them" in lifetime.stderr

    signed = swarmrl(
        "node", "node", "init", "--provider-address", provider.address,
        "--consent-out", "consent.json", "--config-out", "node.toml",
    )  # fmt: skip
    assert signed.returncode == 0, signed.stderr
    node = keystore.info(tmp_path / "node" / "keys", "node").address
    assert f"node {node} (peer " in signed.stdout
    assert "signed its consent for the provider" in signed.stdout
    assert "swarmrl wallet add-node KEY consent.json" in signed.stdout
    # The node's config names no provider key: `node run` needs none.
    assert "provider_key" not in tomllib.loads((tmp_path / "node.toml").read_text())
    assert contracts.registry.provider_of(node) is None

    added = swarmrl("cold", "wallet", "add-node", "provider", "consent.json")
    assert added.returncode == 0, added.stderr
    assert added.stdout.strip() == (
        f"node {node} with provider {provider.address}: "
        "added the node to the provider's nodes, joined the pool"
    )
    assert contracts.pool.is_joined(node)
    assert sorted(p.name for p in (tmp_path / "node" / "keys").iterdir()) == [
        "node.json",
        "node.peer-key",
    ]
    assert sorted(p.name for p in (tmp_path / "cold" / "keys").iterdir()) == ["provider.json"]

    not_consent = swarmrl("cold", "wallet", "add-node", "provider", "provider.hex")
    assert not_consent.returncode == 1
    assert not_consent.stderr == (
        "error: provider.hex is not a node's consent as `swarmrl node init --consent-out` "
        "writes it (the first problem is at its top level)\n"
    )


def test_consent_file_round_trips():
    consent = ConsentFile(
        format="swarmrl node consent",
        version=1,
        chain_id=31337,
        registry="0x" + "11" * 20,
        provider="0x" + "22" * 20,
        node="0x" + "33" * 20,
        nonce=0,
        deadline=1,
        signature="00" * 65,
    )
    assert ConsentFile.model_validate_json(consent.to_json()) == consent
