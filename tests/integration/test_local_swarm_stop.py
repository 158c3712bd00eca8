"""Stopping a local swarm waits for every process of each group it started, not only
the one it started: an orchestrator's trainer, validator and recorder finish after
it. Real processes: a leader whose child is slow to stop, or will not."""

from __future__ import annotations

import signal
import sys
import time
from pathlib import Path

import pytest

from simulation import local_swarm
from simulation.local_swarm import Swarm, alive
from swarmrl.chain.anvil import Anvil

# A child that takes `delay` seconds to finish after SIGTERM (none: it ignores SIGTERM),
# then writes "done"; it says "ready" once its handler is in place.
CHILD = """
import pathlib, signal, sys, time
out, delay = pathlib.Path(sys.argv[1]), sys.argv[2]
def finish(*_):
    time.sleep(float(delay))
    out.with_suffix(".done").write_text("done")
    sys.exit(0)
signal.signal(signal.SIGTERM, signal.SIG_IGN if delay == "none" else finish)
out.with_suffix(".ready").write_text(str(__import__("os").getpid()))
while True:
    time.sleep(1)
"""
# A leader that starts that child in its own process group and ends at once on SIGTERM
# (or by itself with "exit"), as a daemon whose children outlive it.
LEADER = """
import subprocess, sys, time
subprocess.Popen([sys.executable, "-c", sys.argv[1], *sys.argv[2:4]])
if sys.argv[4] == "exit":
    sys.exit(3)
while True:
    time.sleep(1)
"""


@pytest.fixture
def swarm(tmp_path):
    """A swarm of plain processes and its anvil: no deployment or keys, which take
    seconds to make and which no process here uses."""
    no_file = tmp_path / "unused"
    swarm = Swarm(tmp_path, Anvil.start(), None, no_file, no_file, no_file)  # type: ignore[arg-type]
    yield swarm
    swarm.stop_all()


def _start(swarm: Swarm, name: str, delay: str, leader: str = "stay") -> Path:
    out = swarm.root / name
    swarm.start(name, [sys.executable, "-c", LEADER, CHILD, out, delay, leader], out)
    ready = out.with_suffix(".ready")
    deadline = time.monotonic() + 60
    while not ready.exists():
        assert time.monotonic() < deadline, "the child never got ready"
        time.sleep(0.05)
    return out


def test_stop_all_waits_for_the_children_that_finish_after_their_leader(swarm):
    slow = _start(swarm, "orchestrator", "2")
    quick = _start(swarm, "node4", "0")
    assert swarm.stop_all() == []
    # Both children finished their work, and nothing of either group is left.
    assert slow.with_suffix(".done").exists()
    assert quick.with_suffix(".done").exists()
    assert swarm.still_running() == []


def test_a_child_that_ignores_sigterm_is_killed_at_the_bound_and_named(swarm, monkeypatch):
    monkeypatch.setattr(local_swarm, "STOP_SECONDS", 2.0)
    stubborn = _start(swarm, "orchestrator", "none")
    polite = _start(swarm, "node4", "0")
    child = int(stubborn.with_suffix(".ready").read_text())
    assert swarm.stop_all() == ["orchestrator"]
    assert not alive(child)
    assert not stubborn.with_suffix(".done").exists()  # killed, not finished
    assert polite.with_suffix(".done").exists()
    assert swarm.still_running() == []


def test_children_left_by_a_leader_that_ended_are_stopped_too(swarm):
    orphaned = _start(swarm, "orchestrator", "0", leader="exit")
    swarm.processes["orchestrator"].wait(timeout=60)
    assert swarm.still_running() == ["orchestrator"]  # its child lives on in its group
    assert swarm.stop_all() == []
    assert orphaned.with_suffix(".done").exists()
    assert swarm.still_running() == []


def test_kill_waits_for_the_whole_group(swarm, monkeypatch):
    slow = _start(swarm, "orchestrator", "2")
    swarm.kill("orchestrator", signal.SIGTERM)
    assert slow.with_suffix(".done").exists()
    assert swarm.still_running() == []
    monkeypatch.setattr(local_swarm, "STOP_SECONDS", 2.0)
    stubborn = _start(swarm, "node4", "none")
    child = int(stubborn.with_suffix(".ready").read_text())
    with pytest.raises(RuntimeError, match="node4 did not stop within 2 s of signal 15"):
        swarm.kill("node4", signal.SIGTERM)
    assert not alive(child)
    assert "node4" not in swarm.processes
