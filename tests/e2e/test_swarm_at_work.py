"""The swarm at work: anvil, the orchestrator and three nodes as real processes on
loopback, plus a node that generates with another model.

After the run: every receipt a node holds is in the ledger exactly once; work on chain
equals the ledger per node and epoch; the cheater is rejected and slashed with its own
signed submission, no honest node is; the orchestrator killed with SIGKILL and restarted
lost nothing it acknowledged; a node killed and restarted resent its journal and was not
counted twice; a node behind NAT (listening nowhere) still pulls weights and works.

That the held-out reward rises is the demo's end-to-end test (tests/e2e/test_demo.py):
the same swarm, recipe and cast, measured by the demo's own rule; this run only needs
steps enough to crash and recover in the middle of.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import pytest

from orchestrator.local_swarm import (
    CHEATER,
    HONEST,
    LEARNING_RECIPE,
    SWARMRL,
    make_swarm,
    node_toml,
    orchestrator_addr,
    orchestrator_toml,
    stake_and_init_node,
    wait_for,
)
from orchestrator.trainer import checkpoint as ckpt
from swarmrl import keystore
from tests.integration.test_rollouts_cli import swarmrl

# Enough steps for both crashes to land mid-run (a third of the way) and for every
# honest node, the one behind NAT included, to have work accepted after them.
STEPS = 12
OUTBOUND_ONLY = "node6"


def _trainer_step(data_dir: Path) -> int:
    return ckpt.latest_step(data_dir / "run") or 0


def _ledger(data_dir: Path) -> list[dict]:
    out = swarmrl("orchestrator", "ledger", "--json", "--config", data_dir.parent / "orch.toml")
    return [json.loads(line) for line in out.stdout.splitlines()]


def _receipts(node_dir: Path) -> list[dict]:
    from client.node.journal import Journal

    return Journal(node_dir / "journal").receipts()


@pytest.mark.slow
def test_the_swarm_survives_crashes_verifies_and_slashes(default_model, tmp_path):
    swarm = make_swarm(tmp_path)
    try:
        _run(swarm, default_model, tmp_path)
    finally:
        swarm.stop_all()


def _run(swarm, default_model, tmp_path):
    tasks = tmp_path / "train.jsonl"
    swarmrl("tasks", "generate", "--n", 400, "--seed", 1, "--out", tasks)
    for key, provider in [*HONEST.items(), CHEATER]:
        stake_and_init_node(swarm, provider, key)

    data = tmp_path / "orchestrator"
    orch_toml = orchestrator_toml(
        swarm,
        tmp_path / "orch.toml",
        model=default_model,
        tasks=tasks,
        data_dir=data,
        steps=STEPS,
        gone_after=60,
        **LEARNING_RECIPE,
    )
    orch_log = tmp_path / "orchestrator.log"

    def start_orchestrator():
        swarm.start(
            "orchestrator", [SWARMRL, "orchestrator", "run", "--config", orch_toml], orch_log
        )

    start_orchestrator()
    addr = wait_for(lambda: orchestrator_addr(orch_log), "orchestrator address", 180, swarm)

    def config(key: str) -> Path:
        # One node listens nowhere, as behind NAT: it still pulls and works.
        outbound = {"listen": "none"} if key == OUTBOUND_ONLY else {}
        return node_toml(
            swarm, tmp_path / f"{key}.toml", key=key, tasks=tasks, orchestrator=addr, **outbound
        )

    def start_node(key: str):
        swarm.start(key, [SWARMRL, "node", "run", "--config", config(key)], tmp_path / f"{key}.log")

    for key in HONEST:
        start_node(key)
    cheater_key = CHEATER[0]
    swarm.start(
        cheater_key,
        [sys.executable, "-m", "client.node.cheater", config(cheater_key)],
        tmp_path / f"{cheater_key}.log",
    )

    # Kill -9 the orchestrator mid-run, and a node; both come back and lose nothing.
    wait_for(lambda: _trainer_step(data) >= STEPS // 3, "a third of the steps", 900, swarm)
    acknowledged = {r["digest"] for r in _ledger(data)}
    swarm.kill("orchestrator")
    start_orchestrator()
    swarm.kill("node4")
    start_node("node4")
    wait_for(lambda: _trainer_step(data) >= STEPS, f"{STEPS} steps", 1500, swarm)
    time.sleep(5)  # the last submissions in flight land
    for key in list(swarm.processes):
        if key != "orchestrator":
            swarm.kill(key, 15)

    rows = _ledger(data)
    by_digest = {r["digest"]: r for r in rows}
    assert acknowledged <= set(by_digest), "an acknowledged submission was lost in the crash"
    assert len(rows) == len(by_digest)
    for key in [*HONEST, cheater_key]:
        receipts = _receipts(tmp_path / key)
        assert receipts, key
        for receipt in receipts:
            assert receipt["submission"] in by_digest, (key, receipt)

    honest_addresses = set()
    for key in HONEST:
        honest_addresses.add(keystore.info(swarm.keystore_dir, key).address)
    cheater_address = keystore.info(swarm.keystore_dir, cheater_key).address
    cheats = [r for r in rows if r["node"] == cheater_address]
    assert cheats
    assert all(r["status"] == "rejected" for r in cheats)
    assert any(r["slashable"] for r in cheats)
    honest = [r for r in rows if r["node"] in honest_addresses]
    assert not any(r["slashable"] for r in honest)
    for address in honest_addresses:  # the outbound-only node among them
        assert sum(r["units"] for r in honest if r["node"] == address) > 0, address
    for key in HONEST:  # a listening node serves shards once the orchestrator dialled it back
        serving = "serving data=127.0.0.1:" in (tmp_path / f"{key}.log").read_text()
        assert serving == (key != OUTBOUND_ONLY), key

    # The recorder closes the epochs and slashes the cheater.
    from swarmrl.chain.contracts import Contracts

    chain = Contracts.connect(swarm.deployment)

    def cheater_slashed() -> bool:
        status = json.loads(
            swarmrl("orchestrator", "status", "--json", "--config", orch_toml).stdout
        )
        return any(s["node"] == cheater_address for s in status["slashes"])

    wait_for(cheater_slashed, "the cheater's slash", 240, swarm)
    status = json.loads(swarmrl("orchestrator", "status", "--json", "--config", orch_toml).stdout)
    assert {s["node"] for s in status["slashes"]} == {cheater_address}
    for key in HONEST:
        address = keystore.info(swarm.keystore_dir, key).address
        assert chain.stake_of(chain.provider_of(address)) >= 100 * 10**18
    # Work on chain equals the ledger, per node and epoch.
    for record in status["epochs_recorded"]:
        if record["tx"] is None or record["node"] == cheater_address:
            continue
        units = sum(
            r["units"]
            for r in rows
            if r["node"] == record["node"] and r["epoch"] == record["epoch"]
        )
        assert chain.work_of(record["epoch"], record["node"]).units == units

    swarm.kill("orchestrator", 15)
