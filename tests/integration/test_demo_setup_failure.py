"""`swarmrl demo` whose anvil dies while the providers stake: one sentence naming what
failed and anvil's log, exit 1, no traceback, and every process it started stopped.
Real processes: the demo's own anvil, killed with SIGKILL after the first provider
staked; the demo stops at its staking, before any model is loaded."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import time
from dataclasses import asdict

from orchestrator.pretrain import RECIPE_FILE, Recipe
from simulation.demo.loop import LoopConfig, _cache_before
from simulation.local_swarm import alive
from swarmrl.chain.anvil import is_anvil_pid
from tests.e2e.test_demo import SWARMRL, _descendants


def test_anvil_killed_while_the_providers_stake_ends_the_demo_in_one_sentence(tmp_path):
    # What the staking needs of the default model and the initial policy's evaluation:
    # the model's recipe, as `swarmrl model init` writes it, and the evaluation cached by
    # an earlier demo. No weights: the demo fails before it would load them.
    model = tmp_path / "models" / "default"
    model.mkdir(parents=True)
    (model / RECIPE_FILE).write_text(json.dumps(asdict(Recipe()), indent=2) + "\n")
    out = tmp_path / "demo"
    out.mkdir()
    _cache_before(out, model, LoopConfig(out=out), 0.1)
    env = {**os.environ, "SWARMRL_MODELS_DIR": str(model.parent)}
    said, errors = tmp_path / "demo.out", tmp_path / "demo.err"
    with said.open("w") as stdout, errors.open("w") as stderr:
        demo = subprocess.Popen(
            [SWARMRL, "demo", "--out", out], stdout=stdout, stderr=stderr, cwd=tmp_path, env=env
        )
    started: set[int] = set()
    try:
        deadline = time.monotonic() + 300  # a hang guard, not a measurement
        while "provider4 staked" not in said.read_text():
            assert demo.poll() is None, said.read_text() + errors.read_text()
            assert time.monotonic() < deadline, said.read_text()
            time.sleep(0.05)
        started = _descendants(demo.pid)
        (anvil,) = [pid for pid in started if is_anvil_pid(pid)]
        os.kill(anvil, signal.SIGKILL)
        demo.wait(timeout=300)
    finally:
        if demo.poll() is None:
            started |= _descendants(demo.pid)
            demo.kill()
            demo.wait()
        left = [pid for pid in started if alive(pid)]
        for pid in left:  # a failed run must not leave its processes to the tests after it
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
    assert left == []
    assert demo.returncode == 1
    log = out / "run" / "chain" / "anvil.log"
    (sentence,) = errors.read_text().splitlines()
    # Provider 5's first command, or whatever of the staking ran when anvil died.
    assert sentence.startswith("error: anvil exited with code -9 "), sentence
    assert sentence.endswith(f"; its log is {log}"), sentence
    assert log.is_file()
    assert "Traceback" not in errors.read_text() + said.read_text()
