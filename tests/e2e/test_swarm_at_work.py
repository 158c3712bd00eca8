"""The swarm at work: anvil, the orchestrator and three nodes as real processes on
loopback, plus a node that generates with another model.

Mid-run, faults drawn from a seed (printed; SWARMRL_FAULT_SEED=<seed> replays them): a
node, the orchestrator, its trainer and anvil are each killed with SIGKILL at a random
point and started again (`simulation.faults`, the short form of the trust
suite's fault runs, `swarmrl bench trust`).

After the run: every receipt a node holds, and everything the ledger held before the
orchestrator was killed, is in the ledger exactly once (a killed node resent its journal
and was not counted twice); work on chain equals the ledger per node and epoch, anvil's
restart notwithstanding; the trainer resumed from its newest checkpoint after each kill;
no partial file was taken for a whole one, and every version a node holds is the
trainer's published policy bit for bit, most of them rebuilt from deltas; the cheater
is rejected and slashed with its own signed submission, no honest node is; a node
behind NAT (listening nowhere) still pulls weights and works. After the faults, a node's
worker is stopped (SIGSTOP, as a hung GPU looks): the node kills it, starts it again and
hands its order in by itself, and stopped with its worker hung again, it ends within
the stop's grace.

One honest node runs two workers under its one identity (a machine with two GPUs,
simulated on the CPU): its orders are split between them and its merged submissions
are accepted. It is also the soak: its daemon and workers are spared the faults, and
their resident memory, sampled every 15 s for the whole run (the run's own minutes,
faults and all; ``SWARMRL_SOAK=long``: 2 hours and a sample a minute, the swarm working
on), must not grow after warm-up.

That the held-out reward rises is the demo's end-to-end test (tests/e2e/test_demo.py):
the same swarm, recipe and cast, measured by the demo's own rule; this run only needs
steps enough to crash and recover in the middle of.
"""

from __future__ import annotations

import json
import os
import secrets
import sys
import threading
import time
from pathlib import Path

import psutil
import pytest

from simulation.faults import (
    FaultPlan,
    Faults,
    Promise,
    Target,
    hang_a_worker,
    stop_with_a_hung_worker,
)
from simulation.local_swarm import (
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
from swarmrl import keystore
from tests.integration.test_rollouts_cli import swarmrl

# Enough steps for every fault to land mid-run (steps 2 to 10) and for every honest
# node, the one behind NAT included, to have work accepted after them.
STEPS = 12
FAULTS = len(Target)  # each target once, in an order and at points the seed draws
# Each node in the pool bonds the pool's slash penalty (50 SRL) of its provider's stake;
# staked so, every provider covers its nodes with room to spare.
STAKE = 1000
OUTBOUND_ONLY = "node6"
SOAK_NODE = "node4"  # two workers; never killed
HUNG_NODE = "node5"  # its worker is stopped (SIGSTOP) twice after the faults
LONG_SOAK = os.environ.get("SWARMRL_SOAK") == "long"
# The short form adds no minutes of its own: it samples while the faults run.
SOAK_MINUTES = 120 if LONG_SOAK else 0
SAMPLE_SECONDS = 60.0 if LONG_SOAK else 15.0
# Warm-up ends this long after the node's first order (the policy, the task set and a
# generation's buffers are all in by then), however often it is sampled.
WARM_UP_SECONDS = 60.0
AFTER_WARM_UP = 3  # samples at least, however late the node's first order came
# Resident memory after warm-up may exceed warm-up's highest by this share and no more:
# room for the allocators' noise, far below what a leak of a rollout or a policy per
# order would add over the run.
GROWTH = 0.15


def _ledger(data_dir: Path) -> list[dict]:
    out = swarmrl("orchestrator", "ledger", "--json", "--config", data_dir.parent / "orch.toml")
    return [json.loads(line) for line in out.stdout.splitlines()]


class Soak:
    """The resident memory of a node's daemon and its workers, summed, every
    SAMPLE_SECONDS. Warm-up is over WARM_UP_SECONDS after the node generated its first
    order (its log says so)."""

    def __init__(self, pid: int, log: Path) -> None:
        self.pid = pid
        self.log = log
        self.began = time.monotonic()
        self.samples: list[int] = []
        self.warm_up: int | None = None  # how many of the samples are warm-up
        self._first_order: float | None = None  # when the log first showed an order
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()

    def _sample(self) -> None:
        while not self._done.wait(SAMPLE_SECONDS):
            try:
                daemon = psutil.Process(self.pid)
                tree = [daemon, *daemon.children(recursive=True)]
                self.samples.append(sum(p.memory_info().rss for p in tree))
            except psutil.Error:
                return  # it ended: the checks say so
            if self.warm_up is not None:
                continue
            if self._first_order is None and " swarmrl.node generated " in self.log.read_text():
                self._first_order = time.monotonic()
            first = self._first_order
            if first is not None and time.monotonic() - first >= WARM_UP_SECONDS:
                self.warm_up = len(self.samples)

    def done(self) -> bool:
        """It ran SOAK_MINUTES, AFTER_WARM_UP samples of them after warm-up."""
        after = 0 if self.warm_up is None else len(self.samples) - self.warm_up
        return (time.monotonic() - self.began) / 60 >= SOAK_MINUTES and after >= AFTER_WARM_UP

    def stop(self) -> list[int]:
        self._done.set()
        self._thread.join()
        return self.samples


def _fault_seed() -> int:
    """$SWARMRL_FAULT_SEED replays a run's faults; else each run draws new ones."""
    return int(os.environ.get("SWARMRL_FAULT_SEED") or secrets.randbelow(2**32))


@pytest.mark.slow
def test_the_swarm_survives_crashes_verifies_and_slashes(default_model, tmp_path):
    swarm = make_swarm(tmp_path, keep_chain=True)
    try:
        _run(swarm, default_model, tmp_path)
    finally:
        swarm.stop_all()


def _run(swarm, default_model, tmp_path):
    tasks = tmp_path / "train.jsonl"
    swarmrl("tasks", "generate", "--n", 400, "--seed", 1, "--out", tasks)
    for key, provider in [*HONEST.items(), CHEATER]:
        stake_and_init_node(swarm, provider, key, stake=STAKE)

    data = tmp_path / "orchestrator"
    orch_toml = orchestrator_toml(
        swarm,
        tmp_path / "orch.toml",
        model=default_model,
        tasks=tasks,
        data_dir=data,
        # The trainer goes on past STEPS for as long as the soak lasts.
        steps=STEPS * 1000,
        gone_after=60,
        # The trainer as a two-rank FSDP2 job and two validator workers, as on a machine
        # of several GPUs (the demo keeps one of each: tests/e2e/test_demo.py).
        nproc_per_node=2,
        validator_workers=2,
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
        extra: dict[str, object] = {"listen": "none"} if key == OUTBOUND_ONLY else {}
        if key == SOAK_NODE:
            extra = {"cpu_workers": 2, "threads": 2}
        return node_toml(
            swarm, tmp_path / f"{key}.toml", key=key, tasks=tasks, orchestrator=addr, **extra
        )

    def start_node(key: str):
        swarm.start(key, [SWARMRL, "node", "run", "--config", config(key)], tmp_path / f"{key}.log")

    for key in HONEST:
        start_node(key)
    soak = Soak(swarm.processes[SOAK_NODE].pid, tmp_path / f"{SOAK_NODE}.log")
    cheater_key = CHEATER[0]
    swarm.start(
        cheater_key,
        [sys.executable, "-m", "simulation.cheater", config(cheater_key)],
        tmp_path / f"{cheater_key}.log",
    )

    # Faults at random points: each target killed with SIGKILL and started again.
    spared = [key for key in HONEST if key != SOAK_NODE]
    plan = FaultPlan.draw(_fault_seed(), count=FAULTS, steps=(2, STEPS - 2), nodes=spared)
    print(plan)  # with the failure's output: SWARMRL_FAULT_SEED replays it
    faults = Faults(
        swarm,
        data,
        orch_log,
        start_orchestrator=start_orchestrator,
        start_node=start_node,
        epoch_seconds=float(str(LEARNING_RECIPE["epoch_seconds"])),
    )
    faults.run(plan, limit=900)
    assert faults.seen.injected == {target: 1 for target in Target}
    # A worker that stops answering mid-work (a GPU or driver hang looks so): its node
    # kills it past the deadline of the request it hangs in, starts it again and hands
    # its order in, by itself.
    hang = hang_a_worker(swarm, HUNG_NODE)
    print(f"hung worker: killed {hang.killed:.0f} s, an order in {hang.submitted:.0f} s after")
    faults.wait_for_step(STEPS, 1500)
    time.sleep(5)  # the last submissions in flight land
    # Stopped while its worker hangs in a part, the node ends within the stop's grace.
    took = stop_with_a_hung_worker(swarm, HUNG_NODE, tmp_path / f"{HUNG_NODE}.toml")
    print(f"stopped with a hung worker: every process of {HUNG_NODE} ended in {took:.0f} s")
    hung_log = (tmp_path / f"{HUNG_NODE}.log").read_text()
    assert "(the node stops, and it was still generating batch" in hung_log
    for key in list(swarm.processes):
        if key not in ("orchestrator", SOAK_NODE):
            swarm.kill(key, 15)

    # The recorder closes the epochs and slashes the cheater, while the soak goes on.
    cheater_address = keystore.info(swarm.keystore_dir, cheater_key).address

    def cheater_slashed() -> bool:
        status = json.loads(
            swarmrl("orchestrator", "status", "--json", "--config", orch_toml).stdout
        )
        return any(s["node"] == cheater_address for s in status["slashes"])

    wait_for(cheater_slashed, "slash of the cheater", 240, swarm)
    wait_for(soak.done, "the soak's end", SOAK_MINUTES * 60 + 600, swarm)
    samples = soak.stop()
    print(f"soak: {SOAK_NODE}'s resident MiB by sample: {[round(s / 2**20) for s in samples]}")
    # Its daemon ran no model the whole run: torch is the workers' alone.
    assert "libtorch" not in Path(f"/proc/{swarm.processes[SOAK_NODE].pid}/maps").read_text()
    swarm.kill(SOAK_NODE, 15)

    nodes = {key: tmp_path / f"{key}.toml" for key in [*HONEST, cheater_key]}
    violations = faults.check(nodes)
    assert violations == {promise: [] for promise in Promise}, str(plan)

    assert all(faults.seen.receipts[key] for key in nodes), faults.seen.receipts

    rows = _ledger(data)

    # The soak: the daemon and its two workers ran the whole run, and after warm-up their
    # memory stayed where it was.
    assert soak.warm_up is not None
    warm, after = samples[: soak.warm_up], samples[soak.warm_up :]
    mib = [round(s / 2**20) for s in samples]
    assert max(after) <= max(warm) * (1 + GROWTH), f"resident MiB by sample: {mib}"
    soak_log = (tmp_path / f"{SOAK_NODE}.log").read_text()
    assert "2 workers: worker 0 on cpu" in soak_log

    honest_addresses = set()
    for key in HONEST:
        honest_addresses.add(keystore.info(swarm.keystore_dir, key).address)
    cheats = [r for r in rows if r["node"] == cheater_address]
    assert cheats
    assert all(r["status"] == "rejected" for r in cheats)
    assert any(r["slashable"] for r in cheats)
    honest = [r for r in rows if r["node"] in honest_addresses]
    assert not any(r["slashable"] for r in honest)
    for address in honest_addresses:  # the outbound-only node among them
        assert sum(r["units"] for r in honest if r["node"] == address) > 0, address
    for key in HONEST:  # a listening node serves shards once the orchestrator dialled it back
        log = (tmp_path / f"{key}.log").read_text()
        assert ("serving data=127.0.0.1:" in log) == (key != OUTBOUND_ONLY), key
        # Steps after the first arrive as deltas onto the step before, rebuilt bit for
        # bit (the WHOLE promise above compares every version held with the trainer's).
        assert "rebuilt from step" in log, key

    from swarmrl.chain.contracts import Contracts

    chain = Contracts.connect(swarm.deployment)
    status = json.loads(swarmrl("orchestrator", "status", "--json", "--config", orch_toml).stdout)
    assert {s["node"] for s in status["slashes"]} == {cheater_address}
    for key in HONEST:
        address = keystore.info(swarm.keystore_dir, key).address
        assert chain.stakes.stake_of(chain.registry.provider_of(address)) >= 100 * 10**18
    swarm.kill("orchestrator", 15)
