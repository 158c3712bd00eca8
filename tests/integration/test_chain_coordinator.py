"""A test network's coordinator from the command line: `chain mint` and `chain fund`
against the session's anvil, and what a stale or wrong deployment file reads like."""

from __future__ import annotations

import http.server
import json
import os
import threading
from pathlib import Path

import pytest

from swarmrl import keystore
from swarmrl.chain.anvil import Anvil
from swarmrl.chain.deploy import write_deployment
from swarmrl.chain.tokens import TOKEN

from .conftest import ADMIN, OUTSIDER, PROVIDER_A
from .test_chain_cli import one_error, run


@pytest.fixture
def env(tmp_path, accounts, deployment, w3):
    """The deployment file and two keys: the deployer (minter) and an outsider (not).
    Depends on `w3` so that the chain is reverted after each test."""
    keystore.save_public(tmp_path / "keys", "admin", accounts[ADMIN].key, "pw")
    keystore.save_public(tmp_path / "keys", "outsider", accounts[OUTSIDER].key, "pw")
    write_deployment(tmp_path / "deployment.json", deployment)
    return {
        **os.environ,
        "SWARMRL_KEYSTORE_DIR": str(tmp_path / "keys"),
        "SWARMRL_PASSWORD": "pw",
        "SWARMRL_DEPLOYMENT": str(tmp_path / "deployment.json"),
    }


def test_the_deployer_mints_and_funds_from_the_cli(env, contracts, accounts):
    receiver = accounts[PROVIDER_A].address
    before = contracts.token.balance_of(receiver)
    minted = run("mint", "--to", receiver.lower(), "--amount", "12.5", "--key", "admin", env=env)
    assert minted.returncode == 0, minted.stderr
    assert contracts.token.balance_of(receiver) == before + 12 * TOKEN + TOKEN // 2
    assert minted.stdout.startswith(f"minted 12.5 to {receiver}; it now holds ")

    # The coordinator's faucet pays the reward budget too: mint to itself, then fund.
    admin = accounts[ADMIN].address
    assert run("mint", "--to", admin, "--amount", "250", "--key", "admin", env=env).returncode == 0
    budget = contracts.pool.available_rewards()
    funded = run("fund", "--amount", "250", "--key", "admin", env=env)
    assert funded.returncode == 0, funded.stderr
    assert contracts.pool.available_rewards() == budget + 250 * TOKEN
    assert contracts.token.balance_of(admin) == 0
    assert funded.stdout.strip() == (
        f"funded the pool with 250; its reward budget is {(budget + 250 * TOKEN) // TOKEN}"
    )


def test_a_key_without_the_minter_role_is_refused_before_any_transaction(env, contracts, accounts):
    outsider = accounts[OUTSIDER].address
    before = contracts.w3.eth.get_transaction_count(outsider)
    # No password: the refusal must come before the key is even unlocked.
    env = {k: v for k, v in env.items() if k != "SWARMRL_PASSWORD"}
    done = run("mint", "--to", outsider, "--amount", "1", "--key", "outsider", env=env)
    assert one_error(done) == (
        f"error: key 'outsider' ({outsider}) does not hold the minter role on the stake token "
        f"{contracts.token.address}; mint with the deployer's key"
    )
    held = contracts.token.balance_of(outsider)
    too_much = run("fund", "--amount", str(held // TOKEN + 1), "--key", "outsider", env=env)
    assert one_error(too_much) == (
        f"error: key 'outsider' ({outsider}) holds {held // TOKEN} tokens, "
        f"less than the {held // TOKEN + 1} to fund"
    )
    assert contracts.w3.eth.get_transaction_count(outsider) == before


@pytest.mark.parametrize(
    ("amount", "sentence"),
    [
        ("1_000", "'1_000' is not an amount of tokens: write a plain decimal such as 12 or 0.5"),
        ("1e3", "'1e3' is not an amount of tokens: write a plain decimal such as 12 or 0.5"),
        ("\uff11\uff10", "'\uff11\uff10' is not an amount of tokens: write a plain decimal "
         "such as 12 or 0.5"),
        ("-5", "'-5' is not an amount of tokens: write a plain decimal such as 12 or 0.5"),
        (" 5", "' 5' is not an amount of tokens: write a plain decimal such as 12 or 0.5"),
        ("0.000", "'0.000' must be a positive amount of tokens"),
        ("0.0000000000000000001", "'0.0000000000000000001' has more than the token's 18 "
         "decimals"),
        ("9" * 70, f"'{'9' * 70}' is more tokens than can exist"),
    ],
)  # fmt: skip
def test_amounts_are_plain_decimals(env, accounts, amount, sentence):
    to = accounts[OUTSIDER].address
    minted = run("mint", "--to", to, "--amount", amount, "--key", "admin", env=env)
    assert one_error(minted) == f"error: {sentence}"
    funded = run("fund", "--amount", amount, "--key", "admin", env=env)
    assert one_error(funded) == f"error: {sentence}"


def test_a_deployment_on_a_restarted_chain_is_one_sentence(tmp_path, env, deployment):
    """A fresh anvil on the deployment's chain id stands for the local chain restarted:
    same chain, no contracts."""
    with Anvil.start() as restarted:
        write_deployment(
            tmp_path / "restarted.json",
            deployment.model_copy(update={"rpc_url": restarted.rpc_url}),
        )
        env = {**env, "SWARMRL_DEPLOYMENT": str(tmp_path / "restarted.json")}
        done = run("fund", "--amount", "1", "--key", "admin", env=env)
    assert one_error(done) == (
        f"error: no contract at {deployment.contracts.stake_token} on chain 31337; "
        "was the chain restarted? run `swarmrl chain up`"
    )


class _NotAnRpcServer(http.server.BaseHTTPRequestHandler):
    def do_POST(self) -> None:
        self.send_response(404)
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


def test_an_endpoint_that_is_not_an_rpc_server_is_one_sentence(tmp_path, env, deployment):
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _NotAnRpcServer)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}"
        write_deployment(tmp_path / "web.json", deployment.model_copy(update={"rpc_url": url}))
        env = {**env, "SWARMRL_DEPLOYMENT": str(tmp_path / "web.json")}
        done = run("fund", "--amount", "1", "--key", "admin", env=env)
    finally:
        server.shutdown()
    assert one_error(done) == "error: the RPC endpoint answered HTTP 404; is the URL right?"


@pytest.mark.parametrize(
    ("content", "problem"),
    [
        (b"{", "cannot read deployment file {path}: it is not valid JSON"),
        (b"[1, 2]", "deployment file {path} is invalid: it is not a JSON object"),
        (b"\xff\xfe", "cannot read deployment file {path}: it is not valid JSON"),
        (b" " * (1 << 20) + b"{}", "{path} is not a deployment file: it is larger than 1 MiB"),
    ],
)
def test_a_damaged_deployment_file_is_one_sentence(tmp_path, env, content, problem):
    path = Path(tmp_path / "damaged.json")
    path.write_bytes(content)
    env = {**env, "SWARMRL_DEPLOYMENT": str(path)}
    done = run("fund", "--amount", "1", "--key", "admin", env=env)
    assert one_error(done) == "error: " + problem.format(path=path)


@pytest.mark.parametrize(
    ("edit", "where", "problem"),
    [
        (lambda d: d.pop("rpc_url"), "rpc_url", "the field is missing"),
        (lambda d: d.update(extra=1), "extra", "no such field belongs in a deployment file"),
        (lambda d: d.update(contracts=[]), "contracts", "it should be a JSON object"),
        (
            lambda d: d["contracts"].update(compute_pool="0x" + "z" * 5000),
            "contracts.compute_pool",
            f"'0x{'z' * 77}... is not an Ethereum address",  # cut short, not 5000 characters
        ),
    ],
)
def test_an_invalid_deployment_file_names_the_field_in_words(
    tmp_path, env, deployment, edit, where, problem
):
    raw = json.loads(deployment.model_dump_json())
    edit(raw)
    path = tmp_path / "invalid.json"
    path.write_text(json.dumps(raw))
    done = run(
        "fund", "--amount", "1", "--key", "admin", env={**env, "SWARMRL_DEPLOYMENT": str(path)}
    )
    assert one_error(done) == f"error: deployment file {path} is invalid at {where}: {problem}"
