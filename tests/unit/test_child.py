"""The daemon's one way to run a child process, with real spawned processes: each child
is set up alike (Ctrl-C left to the daemon, its share of threads, its log file), runs
its main until its flag is set, is restarted when it dies and given up on when it fails
the same way again and again or dies too often, with one sentence saying why; a child
whose work is done is left finished."""

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

from orchestrator.service.child import (
    MAX_RESTARTS,
    SAME_FAILURES,
    Child,
    ChildFailedError,
    ChildSpec,
)
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
    """Exits with another code each run: the number of runs so far."""
    with config.out.open("a") as f:
        f.write("run\n")
    sys.exit(len(config.out.read_text().splitlines()))


def _read_the_ledger(config: Probe, stop: StopSignal) -> None:
    """Reads every submission of the ledger in the data dir ``config.out`` (damaged)."""
    # Imported here: the other children of these tests start without the ledger's imports.
    from orchestrator.service.ledger import Ledger
    from orchestrator.service.ledger.home import ledger_path

    with Ledger(ledger_path(config.out)) as ledger:
        ledger.submissions.all()


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
    with pytest.raises(ChildFailedError) as caught:
        child.check()
    runs = MAX_RESTARTS + 1
    assert str(caught.value) == (
        f"the crasher process died {runs} times, the last time: exit code {runs}"
    )
    assert (tmp_path / "crasher.out").read_text() == "run\n" * runs


def test_a_child_that_fails_the_same_way_stops_the_daemon_with_why(tmp_path, capfd):
    # A damaged ledger met by a running child (the validator, the recorder): a restart
    # cannot mend it, so after a few the daemon stops, saying why, without a traceback.
    from tests.ledger_faults import run_ledger, zero_a_page_of_submissions

    data = tmp_path / "data"
    path = run_ledger(data, submissions=40)
    zero_a_page_of_submissions(path)
    child = Child(ChildSpec("reader", _read_the_ledger, Probe(data), tmp_path, False))
    child.start()
    for _ in range(SAME_FAILURES - 1):
        child.process.join(60)
        child.check()
    child.process.join(60)
    with pytest.raises(ChildFailedError) as caught:
        child.check()
    why = (
        f"the ledger {path} is damaged (database disk image is malformed); restore it from "
        f"a backup, or keep what SQLite can still read with `sqlite3 {path} .recover`"
    )
    assert str(caught.value) == (
        f"the reader process failed the same way {SAME_FAILURES} times in a row: {why}"
    )
    assert child.restarts == SAME_FAILURES - 1
    log = (tmp_path / "logs" / "reader.log").read_text()
    assert log.count(f"the reader process stops: {why}") == SAME_FAILURES
    assert "Traceback" not in log
    assert "Traceback" not in capfd.readouterr().err  # the children's stderr too


def _exit_3(config: Probe, stop: StopSignal) -> None:
    with config.out.open("a") as f:
        f.write("run\n")
    sys.exit(3)


def test_failures_count_since_the_child_last_got_somewhere(tmp_path):
    # A trainer killed now and then (the fault runs kill it with SIGKILL), training steps
    # between the kills, is no loop. Before, a third kill stopped the orchestrator ("failed
    # the same way 3 times in a row") though the trainer had trained after each.
    child = Child(_spec(tmp_path, "worker", _exit_3))
    child.start()
    for _ in range(SAME_FAILURES - 1):
        child.process.join(60)
        child.check()
    assert (child.same_failures, child.restarts) == (SAME_FAILURES - 1, SAME_FAILURES - 1)
    child.progressed()  # what the daemon calls when the trainer takes a step
    child.process.join(60)
    child.check()  # the third failure in a row, but the first since the child got somewhere
    assert (child.same_failures, child.restarts) == (1, 1)
    child.shutdown(timeout=60)
    assert (tmp_path / "worker.out").read_text().count("run") >= SAME_FAILURES


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
