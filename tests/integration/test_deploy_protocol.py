"""`chain deploy` as a library (swarmrl/chain/deploy_protocol.py), on the session's anvil."""

from __future__ import annotations

import errno

import pytest

from swarmrl import keystore
from swarmrl.chain.anvil import connect
from swarmrl.chain.deploy import BURN_TREASURY, load_deployment, run_id_from_name
from swarmrl.chain.deploy_protocol import DeploymentNotWrittenError, deploy_protocol
from swarmrl.chain.errors import ChainConfigError
from swarmrl.chain.tokens import TOKEN
from tests.integration.conftest import ADMIN, VALIDATOR


@pytest.fixture
def deployer(tmp_path, accounts, monkeypatch):
    """The admin's key in a keystore folder, its password in the environment."""
    monkeypatch.setenv("SWARMRL_PASSWORD", "pw")
    keystore.save_public(tmp_path / "keys", "deployer", accounts[ADMIN].key, "pw")
    return tmp_path / "keys"


def test_deploy_protocol_writes_the_deployment_and_refuses_to_overwrite_it(
    tmp_path, anvil, w3, accounts, deployer
):
    out = tmp_path / "deployment.json"
    done = deploy_protocol(
        rpc_url=anvil.rpc_url,
        key="deployer",
        out=out,
        run="r1",
        validators=[accounts[VALIDATOR].address],
        min_stake=70,
        keystore_dir=deployer,
    )
    assert done.chain_id == w3.eth.chain_id
    assert done.path == out
    assert load_deployment(out) == done.deployment
    assert done.deployment.run_id == run_id_from_name("r1")
    assert done.deployment.treasury == BURN_TREASURY
    assert done.deployment.params.min_stake_per_node == 70 * TOKEN
    assert connect(anvil.rpc_url).eth.get_code(done.deployment.contracts.compute_pool)
    assert done.summary() == [
        f"deployed on chain {done.chain_id}: pool {done.deployment.contracts.compute_pool}",
        f"deployment: {out}",
    ]

    with pytest.raises(ChainConfigError, match="exists; pass --force to overwrite it"):
        deploy_protocol(
            rpc_url=anvil.rpc_url,
            key="deployer",
            out=out,
            validators=[accounts[VALIDATOR].address],
            keystore_dir=deployer,
        )


def test_deploy_protocol_checks_before_the_key_and_the_chain(tmp_path):
    """No key and nothing answering on the URL: the refusal came before either."""
    out = tmp_path / "deployment.json"
    with pytest.raises(ValueError, match="--quorum 2 needs at least 2 distinct --validator"):
        deploy_protocol(
            rpc_url="http://127.0.0.1:9",
            key="nobody",
            out=out,
            validators=["0x" + "ab" * 20, "0x" + "AB" * 20],
            quorum=2,
            keystore_dir=tmp_path / "keys",
        )
    with pytest.raises(ValueError, match="--min-stake 1" + "0" * 60 + " is above 10\\^59 tokens"):
        deploy_protocol(rpc_url="http://127.0.0.1:9", key="nobody", out=out, min_stake=10**60)
    assert not out.exists()


def test_an_unwritten_deployment_file_keeps_the_deployment(
    tmp_path, anvil, w3, accounts, deployer, monkeypatch
):
    def full(path, deployment):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr("swarmrl.chain.deploy.write_deployment", full)
    out = tmp_path / "deployment.json"
    with pytest.raises(DeploymentNotWrittenError, match="the protocol is deployed but") as e:
        deploy_protocol(
            rpc_url=anvil.rpc_url,
            key="deployer",
            out=out,
            validators=[accounts[VALIDATOR].address],
            keystore_dir=deployer,
        )
    assert w3.eth.get_code(e.value.deployment.contracts.compute_pool)
    assert not out.exists()
