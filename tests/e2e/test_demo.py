"""`swarmrl demo` end to end, as `make demo` runs it: the whole loop in a short
configuration, Ctrl-C in the middle of it, and the single scenes.

The demo is also where the swarm's learning is measured end to end (the swarm's own
e2e test, tests/e2e/test_swarm_at_work.py, crashes and recovers it instead). Both runs
start from one caller's folder with the default relative --out, as a newcomer does; the
second finds the initial policy's evaluation the first cached there."""

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from simulation.local_swarm import alive, processes

SWARMRL = Path(sys.executable).with_name("swarmrl")


def _env(default_model: Path) -> dict[str, str]:
    # The session's default model stands in for the one `make demo` caches on first run.
    return {**os.environ, "SWARMRL_MODELS_DIR": str(default_model.parent)}


@pytest.fixture(scope="module")
def caller(tmp_path_factory) -> Path:
    """The folder a newcomer runs `make demo` from (the clone's root)."""
    return tmp_path_factory.mktemp("caller")


@pytest.mark.slow
def test_the_demo_trains_slashes_the_cheater_and_pays_the_honest(default_model, caller):
    # The orchestrator's trainer as a two-rank FSDP2 job, set as a coordinator with two
    # GPUs would set it: the swarm must learn as it does with one trainer process, by the
    # same rule (`make demo` runs one; so does the make-demo test below).
    env = {**_env(default_model), "SWARMRL_NPROC_PER_NODE": "2"}
    run = subprocess.run(
        # Twice the evaluation's standard error, checked every 10 steps up to 40: a demo
        # run here rose 0.030 by step 10.
        [SWARMRL, "demo", "--max-steps", "40", "--rise", "0.025"],
        capture_output=True,
        text=True,
        timeout=1500,
        cwd=caller,
        env=env,
    )
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    out = caller / "demo"  # the default --out, beside the caller
    assert sorted(p.name for p in caller.iterdir()) == ["demo"]
    report = json.loads((out / "report.json").read_text())
    assert report["rose"], report["held_out"]
    assert report["held_out_after"] >= report["held_out_before"] + report["rise"]
    assert report["processes_left"] == []
    assert report["slash_tx"] is not None
    honest = [n for n in report["nodes"] if n["honest"]]
    (cheater,) = [n for n in report["nodes"] if not n["honest"]]
    assert len(honest) == 3
    assert cheater["accepted"] == 0
    assert cheater["rejected"] >= 1
    assert cheater["stake_after"] < cheater["stake_before"]
    assert cheater["claimed"] == 0
    assert cheater["claim_refused"]
    for node in honest:
        assert node["stake_after"] == node["stake_before"], node  # no honest node slashed
        assert node["accepted"] > 0, node
        assert node["claimed"] > 0, node
    assert (out / "reward.png").read_bytes().startswith(b"\x89PNG")
    logs = out / "run" / "orchestrator" / "logs"
    assert "starting 2 trainer process(es) here" in (logs / "trainer.log").read_text()
    assert "step 1 " in (logs / "trainer.log").read_text()  # rank 0 trained and wrote
    assert (logs / "trainer-rank1.log").is_file()
    assert "slashing transaction: 0x" in run.stdout
    assert "every process exited" in run.stdout


def _descendants(pid: int) -> set[int]:
    children: dict[int, list[int]] = {}
    for proc in processes():
        children.setdefault(proc.parent, []).append(proc.pid)
    found, todo = set(), [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.add(child)
            todo.append(child)
    return found


@pytest.mark.slow
def test_the_demo_started_as_make_demo_starts_it_runs_its_swarm_and_ctrl_c_stops_it(
    default_model, caller, tmp_path
):
    """`make demo`'s command as it is (`swarmrl demo`, its output in the relative folder
    `demo`), from the caller's own folder: on a fresh clone it ended before the
    orchestrator's address, whose config named demo/run/demo/run/train.jsonl (every test
    gave an absolute --out). Then Ctrl-C stops every process it started."""
    log = tmp_path / "demo.out"
    started: set[int] = set()
    with log.open("w") as f:
        demo = subprocess.Popen(
            [SWARMRL, "demo"], stdout=f, stderr=subprocess.STDOUT, cwd=caller,
            env=_env(default_model),
        )  # fmt: skip
    try:
        deadline = time.monotonic() + 600
        while "a cheater (it generates with a cheaper model) started" not in log.read_text():
            assert demo.poll() is None, log.read_text()
            assert time.monotonic() < deadline, log.read_text()
            time.sleep(1)
        assert "[swarm] orchestrator listening on /ip4/127.0.0.1/tcp/" in log.read_text()
        run = caller / "demo" / "run"  # where the caller meant: beside them
        assert (run / "orchestrator" / "logs" / "orchestrator.log").is_file()
        assert sorted(p.name for p in caller.iterdir()) == ["demo"]
        assert not (run / "demo").exists()
        started = _descendants(demo.pid)
        assert len(started) >= 6  # anvil, orchestrator, four nodes (and their helpers)
        demo.send_signal(signal.SIGINT)
        demo.wait(timeout=120)
    finally:
        if demo.poll() is None:
            started |= _descendants(demo.pid)
            demo.kill()
        left = [pid for pid in started if alive(pid)]
        for pid in left:  # a failed run must not leave its swarm to the tests after it
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
    assert left == [], log.read_text()[-2000:]


@pytest.mark.slow
def test_each_scene_runs_on_its_own(default_model):
    scenes = ["toploc", "chain", "shards", "swarm", "rollouts"]
    args = [a for s in scenes for a in ("--scene", s)]
    out = subprocess.run(
        [SWARMRL, "demo", *args], capture_output=True, text=True, timeout=600,
        env=_env(default_model),
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert "32/32 chunks accepted" in out.stdout
    assert "16/16 chunks before accepted, 16/16 after rejected" in out.stdout
    assert "refused (shard 2 does not match its expected hash)" in out.stdout
    assert "whole-file check passed, identical=True" in out.stdout
    assert "50 SRL to the treasury, 0 to the validator" in out.stdout
    assert "honest provider claimed 0.3 SRL" in out.stdout
    assert "withdrew 50 after the 7-day period" in out.stdout
    assert "4 nodes hold a verified copy" in out.stdout
    assert "identical=True; the origin sent" in out.stdout
    assert "(node0 banned=True), then gets a verified copy from node1" in out.stdout
    assert "back from a restart: identical=True" in out.stdout
    assert (
        "impostor announced step 2 with its own key: rejected checkpoint step 2 is signed by"
        in (out.stdout)
    )
    assert "one prefill pass each: 48/48 accepted" in out.stdout
    assert (
        "a node that rewrites a task's answer: rejected (its verification info differs from "
        "the task set's"
    ) in out.stdout
    assert (
        "a node that copies one completion across its group: rejected (samples #0, #1, #2, #3 "
        "of its group are one completion, which the claimed sampling repeats with probability"
    ) in out.stdout
    assert "a node that generated with a cheaper model: rejected (TOPLOC rejected" in out.stdout
    for verdict in ("a correct program passes", "a wrong one fails", "an endless loop fails"):
        assert verdict in out.stdout
    assert "one that phones home fails" in out.stdout


def test_an_unknown_scene_is_one_sentence_and_exit_1():
    out = subprocess.run([SWARMRL, "demo", "--scene", "moon"], capture_output=True, text=True)
    assert out.returncode == 1
    assert "no demo scene 'moon'; the scenes are toploc, chain, shards, swarm, rollouts" in (
        out.stderr
    )
