"""`node doctor`'s checks against the session's real anvil and real libp2p hosts.

A node is set up as a volunteer would (`init_node` with a staked provider); the
doctor then runs every check, and each test breaks one thing: the password, the
chain's address, the orchestrator's.
"""

from __future__ import annotations

import os
import re
import socket
from pathlib import Path

import pytest
from libp2p.crypto.ed25519 import create_new_key_pair

from client.node.settings import NodeSettings
from client.node.setup.doctor import Check, exit_code, render, run_checks
from client.node.setup.keys import init_node
from swarmrl import keystore
from swarmrl.chain.deploy import write_deployment
from swarmrl.chain.tokens import TOKEN
from swarmrl.eip712 import swarm_domain
from swarmrl.files import claim_data_dir
from swarmrl.p2p import wire
from swarmrl.p2p.host import Host
from swarmrl.p2p.identity import load_or_create_peer_key, peer_id_of, peer_key_path
from swarmrl.weights import dialback
from swarmrl.work import join
from tests.integration.conftest import PROVIDER_A

PASSWORD = "correct horse"
TASKS = Path(__file__).parents[1] / "data" / "intellect2_tasks.jsonl"
ORDER = (
    "backend",
    "workers",
    "disk",
    "sandbox",
    "keystore",
    "chain",
    "stake",
    "joined",
    "orchestrator",
    "tasks",
    "inbound",
)


@pytest.fixture
def volunteer(tmp_path, contracts, deployment, accounts, monkeypatch):
    """A node key set up and joined with a provider that staked enough for it."""
    monkeypatch.setenv("SWARMRL_LOCK_DIR", str(tmp_path / "locks"))
    keys = tmp_path / "keys"
    keystore.save_public(keys, "provider", accounts[PROVIDER_A].key, PASSWORD)
    provider = contracts.as_account(accounts[PROVIDER_A])
    provider.registry.register_provider()
    provider.stakes.stake(100 * TOKEN, permit=True)
    done = init_node(keys, "node", "provider", lambda name, new: PASSWORD, deployment)
    write_deployment(tmp_path / "deployment.json", deployment)
    return done


def settings_for(tmp_path: Path, **overrides: object) -> NodeSettings:
    values: dict[str, object] = {
        "data_dir": tmp_path / "data",
        "keystore_dir": tmp_path / "keys",
        "deployment": tmp_path / "deployment.json",
        "tasks": TASKS,
    }
    values.update(overrides)
    return NodeSettings(**values)


def by_name(checks: list[Check]) -> dict[str, Check]:
    assert tuple(c.name for c in checks) == ORDER
    return {c.name: c for c in checks}


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def a_peer_id() -> str:
    return peer_id_of(create_new_key_pair())


def one_sentence(detail: str) -> bool:
    return "\n" not in detail and "Traceback" not in detail and detail.count(". ") == 0


def test_a_node_that_is_set_up_and_staked_passes_the_chain_checks(tmp_path, volunteer, w3):
    checks = run_checks(settings_for(tmp_path), PASSWORD)

    found = by_name(checks)
    for name in set(ORDER) - {"orchestrator", "inbound"}:
        assert found[name].ok, found[name]
    assert found["keystore"].detail == (
        f"ok: key 'node' unlocks: node {volunteer.node}, peer {volunteer.peer_id}"
    )
    assert found["stake"].detail == (
        f"ok: provider {volunteer.provider} stakes 100 tokens for 1 node(s) (100 each)"
    )
    assert found["joined"].detail == f"ok: node {volunteer.node} is in the run's pool"
    assert found["tasks"].detail == f"ok: 6 tasks in {TASKS}"
    # No orchestrator is configured: that one check fails, with what to do.
    orchestrator = found["orchestrator"]
    assert not orchestrator.ok
    assert orchestrator.detail.startswith("set orchestrator in node.toml")
    assert exit_code(checks) == 1
    lines = render(checks).splitlines()
    assert len(lines) == len(ORDER)
    assert re.match(r"ok +chain +chain \d+ at http://", lines[ORDER.index("chain")])
    assert re.match(r"FAIL +orchestrator +set orchestrator", lines[ORDER.index("orchestrator")])


def test_a_data_dir_that_is_an_orchestrators_or_a_file_fails_the_disk_check(tmp_path):
    """With one $SWARMRL_DATA_DIR a node once ran inside the orchestrator's folder,
    sharing its weight store, and the doctor said ok."""
    orchestrator_dir = tmp_path / "orchestrator"
    claim_data_dir(orchestrator_dir, "orchestrator")
    disk = by_name(run_checks(settings_for(tmp_path, data_dir=orchestrator_dir), PASSWORD))["disk"]
    assert disk == Check(
        "disk",
        False,
        f"data_dir: {orchestrator_dir} is an orchestrator's data folder; give the node a "
        "folder of its own (set data_dir in the config file (--config))",
    )
    a_file = tmp_path / "file"
    a_file.write_text("mine")
    disk = by_name(run_checks(settings_for(tmp_path, data_dir=a_file), PASSWORD))["disk"]
    assert not disk.ok
    assert disk.detail.startswith(f"data_dir: {a_file} exists and is not a folder")


def test_workers_lists_each_worker_and_what_it_runs_on(tmp_path):
    cores = sorted(os.sched_getaffinity(0))
    settings = settings_for(tmp_path, device="cpu", backend="torch", cpu_workers=2, threads=2)
    workers = by_name(run_checks(settings, PASSWORD))["workers"]
    assert workers.ok
    assert workers.detail.startswith("ok: 2 worker(s): worker 0 on cpu, 1 thread(s) on cores ")
    assert "; worker 1 on cpu, 1 thread(s) on cores" in workers.detail
    assert str(cores[-1]) in workers.detail
    # What the machine cannot run: the sentence the node would refuse to start with.
    settings = settings_for(tmp_path, device="cpu", backend="torch", gpus=[0])
    workers = by_name(run_checks(settings, PASSWORD))["workers"]
    assert workers == Check(
        "workers", False, "gpus and tensor_parallel_size need a GPU; the device is cpu"
    )


def test_all_ok_is_exit_code_zero():
    assert exit_code([Check("a", True, "ok: x"), Check("b", True, "ok: y")]) == 0
    assert exit_code([Check("a", True, "ok: x"), Check("b", False, "do y")]) == 1


def test_a_wrong_password_fails_the_keystore_and_the_chain_checks_still_run(
    tmp_path, volunteer, w3
):
    found = by_name(run_checks(settings_for(tmp_path), "battery staple"))

    keystore_check = found["keystore"]
    assert not keystore_check.ok
    assert keystore_check.detail == (
        "wrong password for key 'node'; check password_file in node.toml or $SWARMRL_PASSWORD"
    )
    # The node's address is in its keystore without the password.
    assert [found[name].ok for name in ("chain", "stake", "joined")] == [True, True, True]
    assert (
        found["orchestrator"].detail
        == "set orchestrator in node.toml to the multiaddr the orchestrator prints"
    )


def test_without_the_password_the_orchestrator_check_is_skipped(tmp_path, volunteer, w3):
    settings = settings_for(
        tmp_path, orchestrator=f"/ip4/127.0.0.1/tcp/{closed_port()}/p2p/{a_peer_id()}"
    )
    found = by_name(run_checks(settings, "battery staple"))
    assert found["orchestrator"] == Check("orchestrator", False, "skipped: needs keystore")


def test_an_unreachable_chain_fails_chain_and_skips_stake_and_joined(
    tmp_path, volunteer, deployment, w3
):
    rpc_url = f"http://127.0.0.1:{closed_port()}"
    write_deployment(
        tmp_path / "deployment.json", deployment.model_copy(update={"rpc_url": rpc_url})
    )

    found = by_name(run_checks(settings_for(tmp_path), PASSWORD))

    chain = found["chain"]
    assert not chain.ok
    assert re.fullmatch(
        rf"the RPC endpoint did not answer eth_chainId after \d+ attempts \(.*\); "
        rf"is the chain at {re.escape(rpc_url)} running\?",
        chain.detail,
    ), chain.detail
    assert found["stake"] == Check("stake", False, "skipped: needs chain")
    assert found["joined"] == Check("joined", False, "skipped: needs chain")
    assert found["keystore"].ok


def test_an_orchestrator_nobody_listens_for_fails_with_one_sentence(tmp_path, volunteer, w3):
    address = f"/ip4/127.0.0.1/tcp/{closed_port()}/p2p/{a_peer_id()}"

    found = by_name(run_checks(settings_for(tmp_path, orchestrator=address), PASSWORD))

    orchestrator = found["orchestrator"]
    assert not orchestrator.ok
    assert orchestrator.detail == (
        f"nothing answered at {address}; start the orchestrator, or set orchestrator in "
        "node.toml to the address it prints"
    )
    assert one_sentence(orchestrator.detail)


def test_an_orchestrator_that_refuses_the_join_is_reachable(tmp_path, volunteer, deployment, w3):
    claims: list[tuple[str, join.JoinClaim]] = []

    def refuse(peer: str, claim: join.JoinClaim) -> join.JoinResponse:
        claims.append((peer, claim))
        raise wire.Refusal("x")

    with Host(create_new_key_pair()) as orchestrator:
        orchestrator.serve(join.JOIN, refuse)
        address = orchestrator.addrs[0]

        found = by_name(run_checks(settings_for(tmp_path, orchestrator=address), PASSWORD))

    check = found["orchestrator"]
    assert check == Check(
        "orchestrator", True, f"ok: {orchestrator.peer_id} answers; it refused the join: x"
    )
    # The doctor sent the join the node would: signed by its key, from its peer identity.
    ((peer, claim),) = claims
    node_peer = peer_id_of(load_or_create_peer_key(peer_key_path(tmp_path / "keys", "node")))
    assert peer == node_peer == claim.peer_id
    assert (claim.node, claim.provider) == (volunteer.node, volunteer.provider)
    pool = deployment.contracts.compute_pool
    assert claim.signer(swarm_domain(deployment.chain_id, pool)) == volunteer.node


def test_a_listen_port_in_use_fails_inbound_and_outbound_only_passes(tmp_path):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        listen = f"/ip4/127.0.0.1/tcp/{port}"
        found = by_name(run_checks(settings_for(tmp_path, listen=listen), PASSWORD))
    assert found["inbound"] == Check(
        "inbound",
        False,
        f"cannot listen on {listen}: another process already listens on port {port} of "
        "127.0.0.1; choose another port (0: any free one), or stop that process, or set "
        'listen = "none" to work outbound only',
    )

    found = by_name(run_checks(settings_for(tmp_path, listen="none"), PASSWORD))
    assert found["inbound"].ok
    assert found["inbound"].detail.startswith("ok: outbound only (listen = none)")


def test_inbound_asks_the_orchestrator_to_dial_the_data_port_back(tmp_path, volunteer, w3):
    with Host(create_new_key_pair()) as orchestrator:
        orchestrator.serve(dialback.DIALBACK, dialback.DialbackService(orchestrator))
        settings = settings_for(tmp_path, orchestrator=orchestrator.addrs[0])
        inbound = by_name(run_checks(settings, PASSWORD))["inbound"]
    assert inbound.ok
    assert re.fullmatch(
        r"ok: the orchestrator dialled the data port back at 127\.0\.0\.1:\d+: the node "
        r"serves shards",
        inbound.detail,
    ), inbound.detail


def test_inbound_without_a_dial_back_still_passes_and_says_no_shards(tmp_path, volunteer, w3):
    with Host(create_new_key_pair()) as orchestrator:  # it cannot dial back
        settings = settings_for(tmp_path, orchestrator=orchestrator.addrs[0])
        inbound = by_name(run_checks(settings, PASSWORD))["inbound"]
    assert inbound == Check(
        "inbound",
        True,
        "ok: the node can listen on 127.0.0.1, a free port, but the orchestrator could not "
        "dial its data port back (NAT or a firewall): it pulls, works and submits, and "
        "serves no shards",
    )
