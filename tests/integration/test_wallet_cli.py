"""`swarmrl wallet` against the session's real anvil, as a staker uses it."""

from __future__ import annotations

import http.server
import json
import os
import re
import subprocess
import sys
import threading
from datetime import UTC, datetime
from pathlib import Path

import pytest

from swarmrl.chain import anvil as anvil_mod
from swarmrl.chain.deploy import write_deployment
from swarmrl.chain.recorded_work import WorkPart
from tests.integration.conftest import NODE_A, OUTSIDER, PROVIDER_A, RECORDER, VALIDATOR
from tests.integration.test_contracts import _record

SWARMRL = Path(sys.executable).with_name("swarmrl")


@pytest.fixture
def wallet(tmp_path, deployment, accounts, w3):
    """Runs `swarmrl wallet ...` with a keystore holding the dev provider's key."""
    deployment_file = tmp_path / "deployment.json"
    write_deployment(deployment_file, deployment)
    env = {
        **os.environ,
        "SWARMRL_KEYSTORE_DIR": str(tmp_path / "keys"),
        "SWARMRL_DEPLOYMENT": str(deployment_file),
        "SWARMRL_LOCK_DIR": str(tmp_path / "locks"),
    }

    def run(*args: str, password: str = "correct horse") -> subprocess.CompletedProcess:
        return subprocess.run(
            [SWARMRL, "wallet", *args],
            env={**env, "SWARMRL_PASSWORD": password},
            capture_output=True,
            text=True,
            timeout=120,
        )

    def start(*args: str) -> subprocess.Popen:
        return subprocess.Popen(
            [SWARMRL, "wallet", *args],
            env={**env, "SWARMRL_PASSWORD": "correct horse"},
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )

    run.start = start  # type: ignore[attr-defined]
    for name, index in (("provider", PROVIDER_A), ("validator", VALIDATOR)):
        key_file = tmp_path / f"{name}.hex"
        key_file.write_text(accounts[index].key.hex())
        assert run("import", name, "--private-key-file", str(key_file)).returncode == 0
    return run


def lines(out: subprocess.CompletedProcess) -> dict[str, str]:
    assert out.returncode == 0, out.stderr
    return {line.split()[0]: " ".join(line.split()[1:]) for line in out.stdout.splitlines()}


def test_stake_unstake_withdraw_story(wallet, w3, deployment):
    assert lines(wallet("balance", "provider"))["tokens"] == "1000"

    staked = wallet("stake", "provider", "150")
    assert staked.returncode == 0, staked.stderr
    assert staked.stdout.strip() == "staked 150; now 150 staked"

    assert wallet("unstake", "provider", "50").returncode == 0
    released = w3.eth.get_block("latest")["timestamp"] + deployment.params.unbonding_period
    when = datetime.fromtimestamp(released, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
    early = wallet("withdraw", "provider")
    assert early.returncode == 1
    # The chain's clock is the next block's, which follows the wall clock since the unstake.
    assert re.fullmatch(
        re.escape(
            f"error: nothing to withdraw yet: 50 of your 50 unbonding becomes withdrawable at "
            f"{when} "
        )
        + r"\(in (1 h|59 min \d+ s), by the chain's clock\)",
        early.stderr.strip(),
    ), early.stderr
    anvil_mod.increase_time(w3, deployment.params.unbonding_period - 90)
    anvil_mod.mine(w3)
    # Anvil's clock also moves with the wall clock between blocks: seconds vary.
    later = wallet("withdraw", "provider").stderr
    assert re.search(r"\(in (1 min )?\d+ s, by the chain's clock\)\n$", later), later

    anvil_mod.increase_time(w3, deployment.params.unbonding_period + 1)
    anvil_mod.mine(w3)
    assert wallet("withdraw", "provider").stdout.strip() == "withdrew 50"
    balance = lines(wallet("balance", "provider"))
    assert balance["tokens"] == "900"
    assert balance["staked"] == "100"

    events = wallet("history", "provider").stdout
    assert "StakeManager.Staked(" in events
    assert "StakeManager.Withdrawn(" in events
    # Times as dates, not unix times.
    assert re.search(r"UnbondRequested\(.*releaseTime=\d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC\)", events)

    nothing = wallet("withdraw", "provider")
    assert nothing.stderr.strip() == (
        "error: nothing to withdraw: no stake is unbonding (see `wallet unstake`)"
    )


def test_history_names_roles(wallet):
    events = wallet("history", "validator")
    assert events.returncode == 0, events.stderr
    granted = [line for line in events.stdout.splitlines() if ".RoleGranted(" in line]
    assert any("role=VALIDATOR_ROLE, account=" in line for line in granted), events.stdout
    assert "b'" not in events.stdout


def test_failures_are_one_sentence_and_change_nothing(wallet):
    too_much = wallet("stake", "provider", "5000")
    assert too_much.returncode == 1
    assert too_much.stderr.strip() == "error: insufficient balance: 1000 tokens, 5000 needed"

    wrong = wallet("stake", "provider", "10", password="guess")
    assert wrong.returncode == 1
    assert wrong.stderr.strip() == "error: wrong password for key 'provider'"

    bad_amount = wallet("stake", "provider", "0")
    assert bad_amount.returncode == 1
    assert "positive amount" in bad_amount.stderr
    for text in ("1_000", "1e3", "\uff11\uff10", "+5", "1 0"):
        refused = wallet("stake", "provider", text)
        assert refused.returncode == 1
        assert refused.stderr.strip() == (
            f"error: {text!r} is not an amount of tokens: write a plain decimal such as 12 or 0.5"
        )

    down = wallet("balance", "provider", "--rpc-url", "http://127.0.0.1:9")
    assert down.returncode == 1
    assert down.stderr.startswith("error: the RPC endpoint did not answer")
    assert len(down.stderr.strip().splitlines()) == 1
    for url in ("127.0.0.1:8545", "ftp://host", "http://[::1"):
        bad_url = wallet("stake", "provider", "1", "--rpc-url", url)
        assert bad_url.returncode == 1
        assert bad_url.stderr.strip() == (
            f"error: {url!r} is not an RPC URL: write it as http://HOST:PORT or https://HOST/..."
        )
    # An HTTP server that is no RPC endpoint: web3's own message would name its docs.
    handler = http.server.BaseHTTPRequestHandler  # answers every POST with 501
    with http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler) as not_rpc:
        threading.Thread(target=not_rpc.serve_forever, daemon=True).start()
        url = f"http://127.0.0.1:{not_rpc.server_port}"
        refused = wallet("balance", "provider", "--rpc-url", url)
        not_rpc.shutdown()
    assert refused.returncode == 1
    assert refused.stderr.strip() == (
        "error: the RPC endpoint answered HTTP 501; is the URL right?"
    )
    assert lines(wallet("balance", "provider"))["staked"] == "0"


def test_unstake_says_what_holds_the_stake_back(wallet, contracts, accounts, w3, deployment):
    """Stake behind a node and bonded by its membership stays; the wallet says so before any gas."""
    assert wallet("stake", "provider", "150").returncode == 0
    provider, node = accounts[PROVIDER_A], accounts[NODE_A]
    p = contracts.as_account(provider)
    consent, signature = p.registry.node_consent(node, provider.address)
    p.registry.add_node(node.address, consent.deadline, signature)
    p.pool.join_pool(node.address)
    _record(contracts, accounts, 1, (node, 1, bytes(32)))
    assert lines(wallet("balance", "provider"))["bonded"].startswith("50 ")

    bonded = (
        "50 is bonded by your nodes in the pools, joined or with work still in its "
        "invalidation window"
    )
    held = wallet("unstake", "provider", "100")
    assert held.returncode == 1
    assert held.stderr.strip() == (
        "error: only 50 of your 150 staked can be unbonded now (100 backs your 1 registered "
        f"node(s); {bonded})"
    )
    # Out of the pool, the node's membership stays bonded while its work can be slashed.
    p.pool.leave_pool(node.address)
    p.registry.remove_node(node.address)
    held = wallet("unstake", "provider", "150")
    assert held.stderr.strip() == (
        f"error: only 100 of your 150 staked can be unbonded now ({bonded})"
    )
    assert lines(wallet("balance", "provider"))["staked"] == "150"  # nothing was sent

    anvil_mod.increase_time(w3, deployment.params.invalidation_window)
    anvil_mod.mine(w3)
    assert wallet("unstake", "provider", "150").returncode == 0


def test_claimable_lists_the_epochs_and_claim_without_epoch_takes_them_all(
    wallet, contracts, accounts, w3, deployment
):
    """docs/staking.md's claim commands on an idle local chain: the window ends by the chain's
    clock with no block mined, and the claim goes through, in one transaction. Work
    recorded after the node left is listed as never paid, and claimed by nothing."""
    assert wallet("stake", "provider", "150").returncode == 0
    provider, node = accounts[PROVIDER_A], accounts[NODE_A]
    p = contracts.as_account(provider)
    consent, signature = p.registry.node_consent(node, provider.address)
    p.registry.add_node(node.address, consent.deadline, signature)
    p.pool.join_pool(node.address)
    _record(contracts, accounts, 3, (node, 2, bytes(32)))
    _record(contracts, accounts, 4, (node, 1, bytes(32)))
    stale = contracts.pool.leaf(node.address, 1, bytes(32))
    anvil_mod.increase_time(w3, 1)  # a leave in the records' second would not back them
    p.pool.leave_pool(node.address)
    contracts.as_account(accounts[RECORDER]).pool.record_work(WorkPart(5, 0, [stale]))
    unit = deployment.params.reward_per_unit / 10**18
    never_paid = "never paid: recorded when the node was not in the pool"

    listed = wallet("claimable", "provider")
    assert listed.returncode == 0, listed.stderr
    rows = listed.stdout.splitlines()
    assert [r.split("  ")[:3] for r in rows[:2]] == [
        [f"node {node.address}", "epoch 3", f"{2 * unit:g}"],
        [f"node {node.address}", "epoch 4", f"{unit:g}"],
    ]
    assert all(re.search(r"pending — claimable in (10 min|9 min \d+ s)$", r) for r in rows[:2])
    assert rows[2] == f"node {node.address}  epoch 5  {unit:g}  {never_paid}"
    assert rows[3].startswith("claimable now: 0 ")
    early = wallet("claim", "provider", "--node", node.address)
    assert early.returncode == 1
    assert re.fullmatch(
        r"error: nothing to claim yet: epoch 3 becomes claimable at \d{4}-\d\d-\d\d "
        r"\d\d:\d\d:\d\d UTC \(in (10 min|9 min \d+ s), by the chain's clock\)\n",
        early.stderr,
    ), early.stderr

    latest = w3.eth.block_number
    anvil_mod.increase_time(w3, deployment.params.invalidation_window + 1, mine_block=False)
    assert w3.eth.block_number == latest  # idle: no block carries the new time yet
    listed = wallet("claimable", "provider", "--node", node.address).stdout.splitlines()
    assert [r.rsplit("  ", 1)[1] for r in listed[:3]] == ["claimable", "claimable", never_paid]
    assert listed[3].startswith(f"claimable now: {3 * unit:g} ")

    block = w3.eth.block_number
    claimed = wallet("claim", "provider", "--node", node.address)
    assert claimed.returncode == 0, claimed.stderr
    assert claimed.stdout.strip() == f"claimed {3 * unit:g} for epochs 3, 4"
    assert w3.eth.block_number == block + 1  # both epochs in one transaction
    left = wallet("claimable", "provider").stdout.splitlines()
    assert left[0] == f"node {node.address}  epoch 5  {unit:g}  {never_paid}"
    assert left[1].startswith("claimable now: 0 ")
    nothing = wallet("claim", "provider", "--node", node.address)
    assert nothing.stderr.strip() == (
        f"error: nothing to claim: the unclaimed work of node {node.address} is never to be "
        "paid (see `wallet claimable`)"
    )
    # History in tokens and dates, not wei and unix times.
    history = wallet("history", "provider").stdout
    assert "StakeManager.Staked(provider=" in history
    assert "amount=150 tokens)" in history
    assert f"ComputePool.RewardClaimed(epoch=3, node={node.address}, " in history
    assert f"amount={2 * unit:g} tokens)" in history


@pytest.mark.parametrize("epoch", ["-1", str(2**64)])
def test_claim_refuses_an_epoch_out_of_range_before_anything(wallet, epoch):
    out = wallet("claim", "provider", "--node", "0x" + "11" * 20, "--epoch", "1", "--epoch", epoch)
    assert out.returncode == 2
    assert "--epoch" in out.stderr
    assert "Traceback" not in out.stderr


def test_claim_refuses_a_node_that_is_not_an_address(wallet):
    out = wallet("claim", "provider", "--node", "node1", "--epoch", "1")
    assert out.returncode == 1
    assert out.stderr.strip() == "error: --node 'node1' is not an address (0x and 40 hex digits)"


def test_a_deployment_whose_address_holds_no_contract_is_one_sentence(
    wallet, tmp_path, deployment, accounts
):
    broken = json.loads((tmp_path / "deployment.json").read_text())
    contracts = broken["contracts"]
    name = next(iter(contracts))
    contracts[name] = accounts[OUTSIDER].address  # an account, not a contract
    path = tmp_path / "broken.json"
    path.write_text(json.dumps(broken))
    for command in (("balance", "provider"), ("stake", "provider", "1")):
        out = wallet(*command, "--deployment", str(path))
        assert out.returncode == 1
        assert out.stderr == (
            f"error: no contract at {accounts[OUTSIDER].address} on chain "
            f"{deployment.chain_id}; was the chain restarted? run `swarmrl chain up`\n"
        )
    assert lines(wallet("balance", "provider"))["staked"] == "0"


def test_concurrent_stakes_from_one_key_both_land_without_a_revert(wallet, w3):
    """Each command holds the key's send lock from its checks to its last receipt.

    Blocks are mined every 2 s instead of at once, as on a real chain, so that the
    second command's checks and sends fall while the first one's are still pending.
    """
    first_block = w3.eth.block_number + 1
    w3.provider.make_request("evm_setAutomine", [False])
    w3.provider.make_request("evm_setIntervalMining", [2])
    try:
        runs = [wallet.start("stake", "provider", amount) for amount in ("30", "12.5")]
        results = [(run.wait(timeout=120), *run.communicate()) for run in runs]
    finally:
        w3.provider.make_request("evm_setIntervalMining", [0])
        w3.provider.make_request("evm_setAutomine", [True])
    for code, _, stderr in results:
        assert code == 0, stderr
    assert lines(wallet("balance", "provider"))["staked"] == "42.5"
    sent = [
        tx
        for number in range(first_block, w3.eth.block_number + 1)
        for tx in w3.eth.get_block(number)["transactions"]
    ]
    assert len(sent) == 3  # one registration and two stakes
    assert all(w3.eth.get_transaction_receipt(tx)["status"] == 1 for tx in sent)


@pytest.mark.parametrize("below", ["", "sub"])
def test_new_and_import_into_a_keystore_folder_that_is_a_file_is_one_sentence(tmp_path, below):
    (tmp_path / "file").write_text("not a folder")
    folder = tmp_path / "file" / below if below else tmp_path / "file"
    (tmp_path / "key.hex").write_text("11" * 32)
    env = {**os.environ, "SWARMRL_PASSWORD": "pw"}
    where = f"under {tmp_path / 'file'}, which is a file" if below else "a file, not a folder"
    for command in (["new", "a"], ["import", "a", "--private-key-file", str(tmp_path / "key.hex")]):
        out = subprocess.run(
            [SWARMRL, "wallet", *command, "--keystore-dir", str(folder)],
            env=env, capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        assert out.returncode == 1
        assert out.stderr == f"error: the keystore folder {folder} is {where}\n"
    assert (tmp_path / "file").read_text() == "not a folder"


def test_stake_reads_the_deployment_file_before_it_unlocks_the_key(wallet, tmp_path):
    damaged = tmp_path / "damaged.json"
    damaged.write_text("{ not json")
    # A wrong password too: only a deployment read first can make this the refusal.
    out = wallet("stake", "provider", "1", "--deployment", str(damaged), password="guess")
    assert out.returncode == 1
    assert out.stderr == f"error: cannot read deployment file {damaged}: it is not valid JSON\n"
