"""An orchestrator killed with SIGKILL takes every process it started with it: its
children (the trainer, the validator, the recorder) and the trainer's ranks, killed
while they start. Real processes: `swarmrl orchestrator run` with a two-rank trainer
on the CPU, on the session's anvil."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import time
from pathlib import Path

from simulation.local_swarm import alive, free_port
from tests.e2e.test_demo import _descendants
from tests.integration import test_listen_ports
from tests.integration.test_listen_ports import SWARMRL, orchestrator_config

# The keys and deployment file `orchestrator run` reads, on the session's anvil.
keys_env = test_listen_ports.keys_env

# How long the descendants have to end: they end at once; this is a hang guard.
GONE_SECONDS = 10.0


def _trainer_pid(log: Path) -> int | None:
    found = re.search(r"started the trainer process \(pid (\d+)\)", log.read_text())
    return int(found.group(1)) if found else None


def test_a_killed_orchestrator_leaves_no_process_behind(tmp_path, keys_env):
    data = tmp_path / "orchestrator"
    config = orchestrator_config(
        tmp_path,
        f"/ip4/127.0.0.1/tcp/{free_port()}",
        nproc_per_node=2,  # the trainer is torchrun's agent, with two ranks
    )
    log = data / "logs" / "orchestrator.log"
    with (tmp_path / "orchestrator.out").open("w") as out:
        daemon = subprocess.Popen(
            [SWARMRL, "orchestrator", "run", "--headless", "--config", str(config)],
            stdout=out, stderr=subprocess.STDOUT, env=keys_env,
        )  # fmt: skip
    started: set[int] = set()
    try:
        # Killed once the ranks exist: they are then starting, before their own code
        # (and their parent-death signal) runs.
        deadline = time.monotonic() + 300  # a hang guard, not a measurement
        trainer = None
        while trainer is None or len(_descendants(trainer)) < 2:
            assert daemon.poll() is None, (tmp_path / "orchestrator.out").read_text()
            assert time.monotonic() < deadline, "the trainer's ranks never started"
            time.sleep(0.1)
            trainer = _trainer_pid(log) if log.is_file() else None
        started = _descendants(daemon.pid)
        # The trainer, its two ranks, the validator, the recorder (and multiprocessing's
        # resource tracker).
        assert len(started) >= 5, started
        daemon.kill()
        daemon.wait()
        gone_by = time.monotonic() + GONE_SECONDS
        while any(alive(p) for p in started) and time.monotonic() < gone_by:
            time.sleep(0.05)
    finally:
        if daemon.poll() is None:
            started |= _descendants(daemon.pid)
            daemon.kill()
            daemon.wait()
        left = sorted(p for p in started if alive(p))
        for pid in left:  # a failed run must not leave its processes to the tests after it
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
    assert left == []
