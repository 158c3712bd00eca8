"""`swarmrl train local` as a user runs it: bad input refused before anything starts,
kill -9 survived, Ctrl-C stopping every process, the trainer as two processes, and the
default model learning."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from orchestrator.run_dir import RunDir
from orchestrator.trainer.metrics import read_metrics
from tests.conftest import held_out_reward
from tests.integration.test_rollouts_cli import swarmrl
from tests.model_fixtures import random_tiny_model

SWARMRL = Path(sys.executable).with_name("swarmrl")
# The learning test's run: the default recipe at lr 3e-4 with one inference worker and
# the 64-token completions the swarm's learning recipe trains with (LEARNING_RECIPE), up
# to 30 steps, about 9 s a step on one core. One worker makes the run the same every
# time on one machine (two workers' interleaving was what varied it; two runs here ended
# bit for bit alike); the default (1e-4) climbs further in 10 minutes (docs/training.md).
# 0.04 is over two and a half standard deviations of the difference of two evaluations
# of 96 tasks x 8 samples. The rise is looked for at step 15 first (one core of the VM:
# +0.062 at step 15 in both runs; +0.055 with 128-token completions), and the run is
# continued to step 30 only if it is not there yet: a policy that does not learn passes
# either look rarely (2 x 0.6%), and one that learns slowly elsewhere still gets 30 steps.
LEARNING_LOOKS, LEARNING_RISE = (15, 30), 0.04
LEARNING_RUN = ["--workers", "1", "--max-tokens", "64", "--lr", "3e-4"]
# A small recipe that still makes groups the default model disagrees within.
SMALL = ["--group-size", "8", "--prompts-per-step", "2", "--max-tokens", "64", "--workers", "1"]


@pytest.fixture(scope="module")
def train_tasks(tmp_path_factory):
    out = tmp_path_factory.mktemp("tasks") / "train.jsonl"
    swarmrl("tasks", "generate", "--n", 400, "--seed", 1, "--out", out)
    return out


def _start(model, tasks, out, *extra) -> subprocess.Popen:
    args = [SWARMRL, "train", "local", "--model", model, "--tasks", tasks, "--out", out]
    return subprocess.Popen(
        [str(a) for a in [*args, *SMALL, *extra]],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )


def _wait_for(condition, process: subprocess.Popen | None, what: str, limit: float = 300) -> None:
    """Poll until ``condition``; fail (with the process's stderr) if it exits or never comes."""
    deadline = time.monotonic() + limit
    while not condition():
        if process is not None and process.poll() is not None:
            pytest.fail(f"train local exited before {what}: {process.stderr.read()}")
        if time.monotonic() > deadline:
            if process is not None:
                process.kill()
            pytest.fail(f"no {what} within {limit} s")
        time.sleep(0.2)


def _children(pid: int) -> list[int]:
    out = subprocess.run(["pgrep", "-P", str(pid)], capture_output=True, text=True)
    return [int(x) for x in out.stdout.split()]


def _gone(pids: list[int]) -> bool:
    for pid in pids:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            continue
        if Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z":
            return False
    return True


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"--model": "missing"}, "missing does not exist"),
        ({"--tasks": "bad.jsonl"}, "line 1"),
        ({"--advantage-scale": "max"}, "Invalid value for '--advantage-scale'"),
        ({"--async-level": "-1"}, "Invalid value"),
    ],
)
def test_bad_input_is_one_sentence_and_starts_nothing(tmp_path, train_tasks, change, message):
    (tmp_path / "bad.jsonl").write_text("{not json\n")
    model = random_tiny_model(tmp_path / "model", seed=1)
    options = {"--model": model, "--tasks": train_tasks, "--out": tmp_path / "run"}
    for key, value in change.items():
        options[key] = tmp_path / value if key in ("--model", "--tasks") else value
    args = [x for pair in options.items() for x in pair]
    out = swarmrl("train", "local", *args, check=False)
    assert out.returncode in (1, 2)
    assert message in out.stderr
    if out.returncode == 1:
        assert len(out.stderr.strip().splitlines()) == 1
    assert not RunDir(tmp_path / "run").checkpoints.exists()


@pytest.mark.slow
def test_kill_9_then_a_restart_continues_from_the_last_whole_step_and_ctrl_c_stops_it(
    default_model, train_tasks, tmp_path
):
    """kill -9 of the trainer leaves its workers to notice by themselves; the run started
    again continues from the last whole step, and Ctrl-C then stops the trainer and every
    worker after the step in hand (one run for both: each start costs a model's load)."""
    out = tmp_path / "run"
    first = _start(default_model, train_tasks, out, "--steps", "50")
    _wait_for(lambda: (RunDir(out).latest() or 0) >= 2, first, "step 2")
    workers = _children(first.pid)
    assert workers
    os.kill(first.pid, signal.SIGKILL)  # the trainer alone: its workers must notice
    first.wait()
    _wait_for(lambda: _gone(workers), None, "the orphaned workers' exit", limit=60)
    killed_at = RunDir(out).latest()
    assert killed_at is not None

    again = _start(default_model, train_tasks, out, "--steps", "50")
    _wait_for(lambda: (RunDir(out).latest() or 0) > killed_at, again, f"step {killed_at + 1}")
    workers = _children(again.pid)
    assert workers
    os.killpg(again.pid, signal.SIGINT)  # what a terminal sends the whole group
    stdout, stderr = again.communicate(timeout=120)
    assert again.returncode == 0, stderr
    assert f"continuing {out} from step {killed_at}" in stderr
    assert "(interrupted); run again to continue" in stderr
    assert "Traceback" not in stderr
    _wait_for(lambda: _gone(workers), None, "the workers' exit", limit=60)
    stopped = RunDir(out).latest()
    assert stopped is not None
    assert stopped > killed_at
    assert stdout.strip() == str(RunDir(out).step(stopped))
    assert RunDir(out).steps() == list(range(stopped + 1))
    metrics = RunDir(out).metrics
    steps = [json.loads(line)["step"] for line in metrics.read_text().splitlines()]
    assert steps == list(range(1, stopped + 1))  # each step once, none lost, none twice
    assert RunDir(out).metrics_plot.stat().st_size > 0
    assert not list(RunDir(out).checkpoints.glob(".*"))


@pytest.mark.slow
def test_two_trainer_processes_stop_on_ctrl_c_and_one_continues(
    default_model, train_tasks, tmp_path
):
    """`--nproc-per-node 2`: the trainer is a torchrun job of two ranks beside the
    workers, reporting each step as one process does; Ctrl-C stops it after the step
    in hand, and the same run continues on one process from there."""
    out = tmp_path / "run"
    job = _start(default_model, train_tasks, out, "--steps", "50", "--nproc-per-node", "2")
    _wait_for(lambda: (RunDir(out).latest() or 0) >= 2, job, "step 2")
    os.killpg(job.pid, signal.SIGINT)  # the ranks too: the parent alone decides
    _, stderr = job.communicate(timeout=120)
    assert job.returncode == 0, stderr
    assert "threads: trainer 2 process(es)" in stderr
    stopped = RunDir(out).latest()
    assert f"stopped at step {stopped} (interrupted); run again to continue" in stderr
    assert "Traceback" not in stderr
    lines = [line.split()[1] for line in stderr.splitlines() if line.startswith("step ")]
    assert lines[:-1] == [f"{step}/50" for step in range(1, stopped + 1)]
    rows = read_metrics(RunDir(out).metrics)
    assert [row["step"] for row in rows] == list(range(1, stopped + 1))
    # The workers' stats, read by rank 0. Not of every step: one trained on batches
    # already spooled comes after no new tokens (a clean-clone run's last step did).
    assert any(row["tokens_per_second"] > 0 for row in rows)

    again = swarmrl("train", "local", "--model", default_model, "--tasks", train_tasks,
                    "--out", out, *SMALL, "--steps", stopped + 1)  # fmt: skip
    assert f"continuing {out} from step {stopped}" in again.stderr
    assert again.stdout.strip() == str(RunDir(out).step(stopped + 1))
    rows = read_metrics(RunDir(out).metrics)
    assert [row["step"] for row in rows] == list(range(1, stopped + 2))


@pytest.mark.slow
def test_the_default_model_learns(
    default_model, default_model_held_out, held_out, train_tasks, tmp_path
):
    """A short run of docs/training.md's: held-out reward measured with `swarmrl eval` (fixed
    seed, T=1) before and after must rise; the full 10-minute figure is in docs/training.md.
    The run stops at the first look that shows the rise, as the demo's does."""
    before = default_model_held_out
    seen = []
    for steps in LEARNING_LOOKS:  # the same run, continued: `train local` resumes it
        run = swarmrl("train", "local", "--model", default_model, "--tasks", train_tasks,
                      "--out", tmp_path / "run", "--steps", steps, *LEARNING_RUN)  # fmt: skip
        assert run.stdout.strip() == str(RunDir(tmp_path / "run").step(steps))
        seen.append((steps, held_out_reward(run.stdout.strip(), held_out)))
        if seen[-1][1] >= before + LEARNING_RISE:
            break
    assert seen[-1][1] >= before + LEARNING_RISE, (before, seen)
