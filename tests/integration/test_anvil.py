"""The local anvil: start, stop, dev accounts, time travel, snapshots."""

import os
import subprocess
import sys
import time

import pytest

from swarmrl.chain import anvil as anvil_mod
from swarmrl.chain.anvil import DEV_CHAIN_ID, Anvil, dev_accounts, find_anvil
from swarmrl.chain.errors import ChainConfigError

# anvil's first dev key, published by foundry: the mnemonic derivation must match it.
ANVIL_KEY_0 = "0xac0974bec39a17e36ba4a6b4d238ff944bacb478cbed5efcae784d7bf4f2ff80"


def test_dev_accounts_are_anvils(w3, accounts):
    assert accounts[0].key.hex().removeprefix("0x") == ANVIL_KEY_0[2:]
    assert w3.eth.accounts == [a.address for a in accounts]
    assert w3.eth.chain_id == DEV_CHAIN_ID


def test_binds_loopback_and_stops_without_a_zombie(tmp_path):
    node = Anvil.start(log_path=tmp_path / "anvil.log", chain_id=84532)
    assert node.rpc_url.startswith("http://127.0.0.1:")
    assert node.web3().eth.chain_id == 84532
    pid = node.pid
    node.stop()
    assert node.process.returncode is not None  # reaped
    assert not os.path.exists(f"/proc/{pid}")
    assert (tmp_path / "anvil.log").exists()


def test_two_anvils_get_different_ports():
    with Anvil.start() as a, Anvil.start() as b:
        assert a.rpc_url != b.rpc_url
        assert a.web3().eth.block_number == b.web3().eth.block_number == 0


def test_time_travel_and_snapshot_revert(w3):
    start = w3.eth.get_block("latest")
    snap = anvil_mod.snapshot(w3)
    later = anvil_mod.increase_time(w3, 7 * 24 * 3600)
    assert later >= start["timestamp"] + 7 * 24 * 3600
    anvil_mod.mine(w3, 3)
    assert w3.eth.block_number == start["number"] + 4
    anvil_mod.revert(w3, snap)
    assert w3.eth.block_number == start["number"]
    assert w3.eth.get_block("latest")["timestamp"] == start["timestamp"]


def test_binary_lookup_order(monkeypatch, tmp_path):
    fake = tmp_path / "anvil"
    fake.write_text("#!/bin/sh\n")
    fake.chmod(0o755)
    monkeypatch.setenv("SWARMRL_ANVIL", str(fake))
    assert find_anvil() == fake
    monkeypatch.setenv("SWARMRL_ANVIL", str(tmp_path / "missing"))
    with pytest.raises(ChainConfigError, match="SWARMRL_ANVIL"):
        find_anvil()
    monkeypatch.delenv("SWARMRL_ANVIL")
    monkeypatch.setattr(anvil_mod, "REPO_ANVIL", tmp_path / "nowhere")
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    with pytest.raises(ChainConfigError, match="make setup"):
        find_anvil()


def test_a_failing_anvil_is_reported(monkeypatch, tmp_path):
    fake = tmp_path / "anvil"
    fake.write_text("#!/bin/sh\necho 'error: bad flag' >&2\nexit 3\n")
    fake.chmod(0o755)
    monkeypatch.setenv("SWARMRL_ANVIL", str(fake))
    with pytest.raises(Exception, match=r"exited with code 3.*bad flag"):
        Anvil.start(log_path=tmp_path / "log")


def test_dev_accounts_are_deterministic():
    assert [a.address for a in dev_accounts(3)] == [a.address for a in dev_accounts(3)]


def test_an_attached_anvil_dies_with_a_killed_parent(tmp_path):
    script = (
        "import sys, time\n"
        "from swarmrl.chain.anvil import Anvil\n"
        "node = Anvil.start()\n"
        "print(node.pid, flush=True)\n"
        "time.sleep(60)\n"
    )
    parent = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    anvil_pid = int(parent.stdout.readline())
    parent.kill()  # no chance to run stop()
    parent.wait()
    deadline = time.monotonic() + 10
    while anvil_mod.pid_running(anvil_pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not anvil_mod.pid_running(anvil_pid)


def test_a_killed_anvil_restarts_on_its_port_from_its_last_whole_dump(tmp_path):
    # What a crash loses is what was mined after the last dump, as in a reorganisation;
    # the dump file is whole at every moment, so the restart always finds a chain.
    state = tmp_path / "chain.json"
    node = Anvil.start(log_path=tmp_path / "anvil.log")
    try:
        node.keep_state(state, 3600)  # one dump now, the next an hour away
        w3 = node.web3()
        anvil_mod.mine(w3, 2)
        node.dump_state(state)
        kept = w3.eth.get_block("latest")
        anvil_mod.mine(w3, 3)  # after the last dump: lost in the crash
        url = node.rpc_url
        node.kill()
        node.restart(state)
        assert node.rpc_url == url
        after = node.web3().eth.get_block("latest")
        assert (after["number"], after["hash"]) == (kept["number"], kept["hash"])
        assert not list(tmp_path.glob(".chain.json.*"))  # no half-written dump left
    finally:
        node.stop()
    assert node.process.returncode is not None
