"""`node init`'s steps as a library (client/node/setup/node_init.py), without typer."""

from __future__ import annotations

import tomllib

import pytest

from client.node.setup.keys import Step, read_consent
from client.node.setup.node_init import set_up_node, write_node_config
from swarmrl import keystore
from swarmrl.chain.deploy import write_deployment
from tests.integration.conftest import PROVIDER_A, PROVIDER_B
from tests.integration.test_node_setup import PASSWORD, keys, stake  # noqa: F401  (fixture)


@pytest.fixture
def files(tmp_path, deployment):
    """The deployment file and a password file, as the command is given them."""
    (tmp_path / "password").write_text(PASSWORD + "\n")
    write_deployment(tmp_path / "deployment.json", deployment)
    return tmp_path / "deployment.json", tmp_path / "password"


def test_set_up_node_joins_the_pool_and_the_config_names_its_files(
    keys,  # noqa: F811
    files,
    tmp_path,
    contracts,
    accounts,
    w3,
):
    deployment_file, password_file = files
    stake(contracts, accounts[PROVIDER_A], 100)
    config = tmp_path / "node.toml"

    done = set_up_node(
        key="node",
        provider="provider",
        keystore_dir=keys,
        password_file=password_file,
        deployment=deployment_file,
        config_out=config,
    )

    assert done.setup.steps[-1] is Step.POOL_JOINED
    assert contracts.pool.is_joined(done.setup.node)
    assert done.lines() == [done.setup.summary()]
    assert not config.exists()  # the config is the second step's
    wrote = write_node_config(
        config,
        keystore_dir=keys,
        password_file=password_file,
        deployment=deployment_file,
        metrics_port=9470,
    )
    assert wrote.startswith(f"wrote {config}; ")
    assert wrote.endswith(f"then: swarmrl node run --config {config}")
    written = tomllib.loads(config.read_text())
    assert written["key"] == "node"
    assert written["metrics_port"] == 9470
    assert written["deployment"] == str(deployment_file)


def test_set_up_node_signs_a_consent_for_a_provider_elsewhere_and_sends_nothing(
    keys,  # noqa: F811
    files,
    tmp_path,
    accounts,
    w3,
):
    deployment_file, password_file = files
    provider = accounts[PROVIDER_B].address
    before = w3.eth.get_transaction_count(provider)
    consent_out = tmp_path / "consent.json"

    done = set_up_node(
        provider_address=provider,
        consent_out=consent_out,
        valid_for=3600,
        keystore_dir=keys,
        password_file=password_file,
        deployment=deployment_file,
    )

    consent = read_consent(consent_out)
    assert consent.deadline == done.consent_deadline
    assert consent.node == done.setup.node == keystore.unlock(keys, "node", PASSWORD).address
    assert consent.provider.lower() == provider.lower()
    assert Step.CONSENT_SIGNED in done.setup.steps
    assert len(done.lines()) == 2
    assert done.lines()[1].startswith(f"wrote {consent_out} (usable until ")
    assert w3.eth.get_transaction_count(provider) == before


def test_set_up_node_refuses_a_data_folder_that_is_a_file_before_any_key(keys, files, tmp_path):  # noqa: F811
    deployment_file, password_file = files
    taken = tmp_path / "taken"
    taken.write_text("")
    with pytest.raises(ValueError, match="taken"):
        set_up_node(
            provider="provider",
            keystore_dir=keys,
            password_file=password_file,
            deployment=deployment_file,
            data_dir=taken / "data",
        )
    assert [p.stem for p in keys.iterdir()] == ["provider"]  # no node key was made
