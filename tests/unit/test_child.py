"""The daemon's one way to run a child process, with real spawned processes: each child
is set up alike (Ctrl-C left to the daemon, its share of threads, its log file), runs
its main until its flag is set, is restarted when it dies and given up on when it dies
too often; a child whose work is done is left finished."""

from __future__ import annotations

import json
import logging
import os
import signal
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from orchestrator.service.child import MAX_RESTARTS, Child, ChildSpec
from orchestrator.service.stop import StopSignal


@dataclass(frozen=True)
class Probe:
    out: Path  # what the child saw, written by its main


def _report(config: Probe, stop: StopSignal) -> None:
    import torch

    seen = {
        "torch_threads": torch.get_num_threads(),
        "rayon_threads": os.environ.get("RAYON_NUM_THREADS"),
        "sigint_ignored": signal.getsignal(signal.SIGINT) == signal.SIG_IGN,
    }
    logging.getLogger("probe").info("the probe runs")
    config.out.write_text(json.dumps(seen))
    while not stop.wait(60):
        pass


def _count_then_exit(config: Probe, stop: StopSignal) -> None:
    with config.out.open("a") as f:
        f.write("run\n")
    sys.exit(3)


def _count_then_return(config: Probe, stop: StopSignal) -> None:
    with config.out.open("a") as f:
        f.write("run\n")


def _ignore_the_flag(config: Probe, stop: StopSignal) -> None:
    config.out.write_text("started")
    while True:
        time.sleep(60)


def _spec(tmp_path: Path, name: str, main: object, **fields: object) -> ChildSpec[Probe]:
    return ChildSpec(
        name,
        main,
        Probe(tmp_path / f"{name}.out"),
        data_dir=tmp_path,
        log_to_stderr=False,
        **fields,
    )


def _wait_for(path: Path) -> None:
    give_up = time.monotonic() + 120  # a hang guard, not a measurement
    while not path.exists() and time.monotonic() < give_up:
        time.sleep(0.05)
    assert path.exists()


def test_a_child_is_set_up_then_runs_its_main_until_its_flag_is_set(tmp_path):
    child = Child(_spec(tmp_path, "probe", _report, threads=2))
    child.start()
    _wait_for(tmp_path / "probe.out")
    child.shutdown(timeout=60)
    assert child.process.exitcode == 0
    seen = json.loads((tmp_path / "probe.out").read_text())
    assert seen == {"torch_threads": 2, "rayon_threads": "2", "sigint_ignored": True}
    log = (tmp_path / "logs" / "probe.log").read_text()
    assert "the probe process: 2 thread(s) for torch and rayon" in log
    assert "the probe runs" in log


def test_a_child_that_dies_is_restarted_until_it_died_too_often(tmp_path):
    child = Child(_spec(tmp_path, "crasher", _count_then_exit))
    child.start()
    for _ in range(MAX_RESTARTS):
        child.process.join(60)
        child.check()
    child.process.join(60)
    with pytest.raises(RuntimeError) as caught:
        child.check()
    assert str(caught.value) == f"the crasher process died {MAX_RESTARTS + 1} times (code 3)"
    assert (tmp_path / "crasher.out").read_text() == "run\n" * (MAX_RESTARTS + 1)


def test_a_child_whose_work_is_done_is_left_finished(tmp_path):
    done = Child(_spec(tmp_path, "done", _count_then_return, finishes=True))
    serving = Child(_spec(tmp_path, "serving", _count_then_return))
    for child in (done, serving):
        child.start()
        child.process.join(60)
        child.check()
    assert (done.finished, done.restarts) == (True, 0)
    # A child that is not done after its main returned is restarted like a crash.
    assert (serving.finished, serving.restarts) == (False, 1)
    serving.shutdown(timeout=60)
    done.check()  # nothing more happens to a finished child
    assert (tmp_path / "done.out").read_text() == "run\n"
    assert (tmp_path / "serving.out").read_text() == "run\nrun\n"


def test_a_child_that_ignores_its_flag_is_killed(tmp_path):
    child = Child(_spec(tmp_path, "stubborn", _ignore_the_flag))
    child.start()
    _wait_for(tmp_path / "stubborn.out")
    child.shutdown(timeout=1)
    assert child.process.exitcode == -signal.SIGKILL
