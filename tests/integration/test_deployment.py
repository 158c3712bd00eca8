"""Deployment files: any chain, any RPC URL, validated on load; artifacts."""

import json
from pathlib import Path

import pytest

from swarmrl.chain.anvil import Anvil
from swarmrl.chain.artifacts import load_artifact
from swarmrl.chain.contracts import Contracts
from swarmrl.chain.deploy import deploy, load_deployment, run_id_from_name, write_deployment
from swarmrl.chain.errors import ChainConfigError
from swarmrl.chain.tokens import TOKEN

from .conftest import ADMIN, PROVIDER_A, RECORDER, TREASURY, VALIDATOR

BASE_SEPOLIA = 84532


def test_a_deployment_file_is_all_another_chain_needs(tmp_path, accounts, deployment):
    """Base Sepolia stands in as anvil with its chain id: nothing assumes 31337."""
    with Anvil.start(chain_id=BASE_SEPOLIA) as other:
        deployed = deploy(
            other.web3(),
            accounts[ADMIN],
            rpc_url=other.rpc_url,
            run_id=run_id_from_name("sepolia-run"),
            recorders=[accounts[RECORDER].address],
            validators=[accounts[VALIDATOR].address],
            treasury=accounts[TREASURY].address,
            mint_to={accounts[PROVIDER_A].address: 500 * TOKEN},
        )
        path = tmp_path / "base-sepolia.json"
        write_deployment(path, deployed)
        assert [p.name for p in tmp_path.iterdir()] == ["base-sepolia.json"]  # no temp left

        loaded = load_deployment(path)
        assert loaded == deployed
        assert loaded.chain_id == BASE_SEPOLIA
        provider = Contracts.connect(loaded, accounts[PROVIDER_A])
        provider.registry.register_provider()
        provider.stakes.stake(200 * TOKEN)
        assert provider.stakes.stake_of(accounts[PROVIDER_A].address) == 200 * TOKEN
        assert provider.pool.domain().chain_id == BASE_SEPOLIA

        # The session's anvil serves chain 31337: connecting there is refused up front.
        with pytest.raises(ChainConfigError, match=r"serves chain 31337.*on chain 84532"):
            Contracts.connect(loaded, rpc_url=deployment.rpc_url)


def test_invalid_deployment_files_are_one_sentence(tmp_path, deployment):
    with pytest.raises(ChainConfigError, match=r"no deployment file .* `swarmrl chain up`"):
        load_deployment(tmp_path / "missing.json")
    bad_json = tmp_path / "bad.json"
    bad_json.write_text("{")
    with pytest.raises(ChainConfigError, match="cannot read deployment file"):
        load_deployment(bad_json)
    raw = json.loads(deployment.model_dump_json())
    raw["contracts"]["compute_pool"] = "0x1234"
    bad_address = tmp_path / "address.json"
    bad_address.write_text(json.dumps(raw))
    with pytest.raises(ChainConfigError, match=r"invalid at contracts\.compute_pool: .*0x1234"):
        load_deployment(bad_address)
    raw = json.loads(deployment.model_dump_json())
    raw["chain_id"] = 0
    zero_chain = tmp_path / "chain.json"
    zero_chain.write_text(json.dumps(raw))
    with pytest.raises(ChainConfigError, match="invalid at chain_id"):
        load_deployment(zero_chain)
    raw = json.loads(deployment.model_dump_json())
    raw["version"] = 1
    old_version = tmp_path / "v1.json"
    old_version.write_text(json.dumps(raw))
    with pytest.raises(ChainConfigError, match=r"is version 1, but this swarmrl reads version 2"):
        load_deployment(old_version)
    # web3 is imported here, so the recursion limit is 100000: deep nesting must
    # still be one sentence, not a crash of the C stack.
    deep = tmp_path / "deep.json"
    deep.write_text("[" * 300_000)
    with pytest.raises(ChainConfigError, match="cannot read deployment file"):
        load_deployment(deep)


def test_run_ids():
    assert run_id_from_name("0x" + "AB" * 32) == "0x" + "ab" * 32
    assert run_id_from_name("dev") != run_id_from_name("dev2")
    assert len(run_id_from_name("dev")) == 66
    # A shortened id is refused, not hashed into the id of some other run.
    with pytest.raises(ChainConfigError, match="starts with 0x but is not a 32-byte run id"):
        run_id_from_name("0x" + "ab" * 31)
    with pytest.raises(ChainConfigError, match="the run name is empty"):
        run_id_from_name("")
    with pytest.raises(ChainConfigError, match="longer than 128 characters"):
        run_id_from_name("r" * 129)


def test_a_folder_or_a_huge_file_is_not_a_deployment_file(tmp_path):
    with pytest.raises(ChainConfigError, match=r"is a folder, not a deployment file$"):
        load_deployment(tmp_path)
    with pytest.raises(ChainConfigError, match=r"is not a deployment file: it is larger than"):
        load_deployment(Path("/dev/zero"))  # endless: read only up to the cap


def test_a_missing_artifact_names_make_contracts(tmp_path):
    with pytest.raises(ChainConfigError, match="make contracts"):
        load_artifact("ComputePool", tmp_path)
    assert load_artifact("ComputePool").bytecode.startswith("0x6")
