"""A node's worker processes, for real: two workers on the CPU (a machine with two GPUs,
simulated) make the records one worker makes, bit for bit; a dead worker is started again
and its part done again; workers that keep dying stop the node's work; a worker dies with
its daemon, even one killed with SIGKILL; a worker stopped mid-order (SIGSTOP, as a hung
GPU looks) is killed past its deadline and its part redone, and a stop gives a hung part
up after its grace."""

from __future__ import annotations

import logging
import os
import shutil
import signal
import subprocess
import sys
import threading
import time

import pytest
import torch

from client.node.work import workers
from client.node.work.worker import Generation, LocalWorker
from client.node.work.workers import (
    NodeStoppingError,
    PolicyGoneError,
    Pool,
    WorkerPlan,
    WorkersFailingError,
)
from orchestrator.tasks.generators import demo_tasks
from swarmrl.models import load_backend
from swarmrl.models.backend import Engine
from swarmrl.times import duration
from swarmrl.work.assign import Slot, WorkOrder
from tests.model_fixtures import random_tiny_model

TASKS = {t.problem_id: t for t in demo_tasks(6, seed=3)}
ORDER = WorkOrder(
    run="0x" + "5a" * 32,
    node="0x" + "11" * 20,
    counter=1,
    min_step=0,
    seed=12345,
    group_size=2,
    max_tokens=12,
    temperature=1.0,
    top_p=1.0,
    precision="fp32",
    tasks=[Slot(problem_id=p, budget=64) for p in TASKS],
    deadline=2_000_000_000,
)
BATCH = 4  # two tasks' groups a batch: three batches to split


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    return random_tiny_model(tmp_path_factory.mktemp("model") / "m", seed=5)


def cpu_pool(tmp_path, workers=2, **options) -> Pool:
    plans = [
        WorkerPlan(i, "cpu", (), (sorted(os.sched_getaffinity(0))[0],), 1) for i in range(workers)
    ]
    (tmp_path / "outbox").mkdir(exist_ok=True)
    return Pool(
        plans,
        backend="torch",
        engine=Engine(),
        log_dir=tmp_path,
        outbox=tmp_path / "outbox",
        **options,
    )


def records(workers, model):
    workers.hold(model, 1, "fp32")
    return workers.records(Generation(ORDER, TASKS, node=ORDER.node, step=1, batch_size=BATCH))


@pytest.fixture(scope="module")
def one_worker(model):
    """The order as one worker in this process makes it (one thread, as each worker)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        worker = LocalWorker(lambda d, p: load_backend("torch", d, device="cpu", precision=p))
        return records(worker, model)
    finally:
        torch.set_num_threads(before)


def test_two_workers_make_what_one_makes_bit_for_bit(tmp_path, model, one_worker):
    pool = cpu_pool(tmp_path)
    pool.start()
    try:
        split = records(pool, model)
        # Each worker made a part: both measured a speed of their own.
        assert all(w.speed is not None for w in pool.workers)
        # What generating cost is the workers' CPU, not the idle daemon's.
        assert pool.cpu_seconds() > 0
    finally:
        pool.close()
    assert len(split) == len(TASKS) * ORDER.group_size
    assert split == one_worker
    assert not list((tmp_path / "outbox").iterdir())  # the parts' files are gone


def test_a_killed_worker_is_started_again_and_does_its_part(tmp_path, model, one_worker):
    pool = cpu_pool(tmp_path)
    pool.start()
    try:
        pool.hold(model, 1, "fp32")
        first = pool.workers[1].process
        first.kill()
        first.wait()
        assert records(pool, model) == one_worker
        assert pool.workers[1].process is not first
        assert pool.exits == 0  # an order done forgives the exit before it
    finally:
        pool.close()


def test_workers_that_keep_dying_stop_the_work_with_the_reason(tmp_path):
    # A RAM cap no process meets: every worker is killed as soon as it is watched.
    pool = cpu_pool(tmp_path, workers=1, memory_cap_bytes=1, max_exits=3)
    pool.start()

    def keep_asking():
        while True:
            pool.threads(1)

    last = r"worker 0 exited with code -9 \(over the RAM cap: "
    try:
        with pytest.raises(
            WorkersFailingError, match=rf"^3 worker exits in a row; the last: {last}"
        ):
            keep_asking()
    finally:
        pool.close()


DAEMON = """
import os, sys, time
from pathlib import Path
from client.node.work.workers import Pool, WorkerPlan
from swarmrl.models.backend import Engine
pool = Pool([WorkerPlan(0, "cpu", (), (sorted(os.sched_getaffinity(0))[0],), 1)], backend="torch",
            engine=Engine(), log_dir=Path(sys.argv[1]), outbox=Path(sys.argv[1]))
pool.start()
print(pool.workers[0].process.pid, flush=True)
time.sleep(600)
"""


def test_a_worker_dies_with_its_daemon_killed_with_sigkill(tmp_path):
    daemon = subprocess.Popen(
        [sys.executable, "-c", DAEMON, str(tmp_path)], stdout=subprocess.PIPE, text=True
    )
    try:
        worker = int(daemon.stdout.readline())
        os.kill(worker, 0)  # it runs
        daemon.send_signal(signal.SIGKILL)
        daemon.wait()
        deadline = time.monotonic() + 60
        while _alive(worker) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not _alive(worker)
    finally:
        daemon.kill()
        daemon.wait()


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ")[1][0] != "Z"  # a zombie is dead, awaiting its reaper
    except FileNotFoundError:
        return False


# ---- a worker that stops answering ------------------------------------------------------


def _records_in_thread(pool, model):
    """The order's records generated in a thread: (thread, its result or error)."""
    out: dict[str, object] = {}

    def run() -> None:
        try:
            out["records"] = records(pool, model)
        except BaseException as e:
            out["error"] = e

    thread = threading.Thread(target=run)
    thread.start()
    return thread, out


def _once_generating(worker) -> None:
    """Returns once `worker` has its part of the order (its request is out)."""
    deadline = time.monotonic() + 120
    while worker.busy is None or not worker.busy.what.startswith("generating"):
        assert time.monotonic() < deadline, "the worker never got its part"
        time.sleep(0.01)


def test_a_worker_stopped_mid_order_is_killed_started_again_and_its_part_redone(
    tmp_path, model, one_worker, monkeypatch, caplog
):
    # The floor of a part's deadline, lowered so that the test waits seconds, not a minute:
    # the tiny model's parts take far less at the speed each worker measured.
    monkeypatch.setattr(workers, "MIN_PART_SECONDS", 2.0)
    pool = cpu_pool(tmp_path)
    pool.start()
    try:
        assert records(pool, model) == one_worker  # each worker's speed measured
        hung = pool.workers[1].process
        thread, out = _records_in_thread(pool, model)
        _once_generating(pool.workers[1])
        hung.send_signal(signal.SIGSTOP)  # a GPU or driver hang looks the same from here
        waiting = pool.waiting()
        assert any(
            line.startswith("worker 1 generating batch") and "taken for hung after 2 s" in line
            for line in waiting
        ), waiting
        with caplog.at_level(logging.WARNING, logger="swarmrl.node"):
            thread.join(timeout=300)
        assert not thread.is_alive()
        assert out.get("records") == one_worker, out.get("error")  # redone, bit for bit
        assert hung.poll() == -signal.SIGKILL
        assert pool.workers[1].process is not hung
        assert "(no answer generating batch" in caplog.text
        assert "taken for hung); started again (1 of 100 exits)" in caplog.text
        assert pool.exits == 0  # the order was done after all
        assert pool.waiting() == []
    finally:
        pool.close()


def test_a_stop_gives_up_a_hung_part_after_the_grace_and_starts_nothing_again(
    tmp_path, model, one_worker
):
    pool = cpu_pool(tmp_path, workers=1)
    pool.start()
    try:
        pool.hold(model, 1, "fp32")
        hung = pool.workers[0].process
        thread, out = _records_in_thread(pool, model)
        _once_generating(pool.workers[0])
        hung.send_signal(signal.SIGSTOP)
        # Its speed is not measured yet: its own deadline is FIRST_PART_SECONDS away.
        assert pool.waiting()[0].endswith(f"taken for hung after {duration(900)}")
        pool.stop(1.0)
        assert pool.waiting()[0].endswith("(the node stops)")
        thread.join(timeout=120)
        assert not thread.is_alive()
        assert isinstance(out.get("error"), NodeStoppingError), out
        assert "the node stops, and it was still generating batch" in str(out["error"])
        assert hung.poll() == -signal.SIGKILL
        assert pool.workers[0].process is hung  # nothing started again
        assert pool.exits == 0
    finally:
        pool.close()


def test_a_worker_that_dies_by_a_signal_says_so_rather_than_its_logs_last_line(tmp_path):
    pool = cpu_pool(tmp_path, workers=1, max_exits=1)
    pool.start()
    try:
        worker = pool.workers[0]
        # What a progress bar leaves in the log: a line redrawn with carriage returns.
        with worker.log.open("a") as log:
            log.write("Loading:  10%|#         | 1/10\rLoading: 100%|##########| 10/10\r")
        worker.process.send_signal(signal.SIGKILL)
        worker.process.wait()
        with pytest.raises(WorkersFailingError) as failed:
            pool.threads(1)
        assert str(failed.value) == (
            "1 worker exits in a row; the last: worker 0 exited with code -9 (killed by SIGKILL)"
        )
    finally:
        pool.close()


def test_a_part_whose_policy_left_the_store_while_its_worker_hung_is_given_up(
    tmp_path, model, one_worker, monkeypatch
):
    monkeypatch.setattr(workers, "MIN_PART_SECONDS", 2.0)
    held = tmp_path / "step-1"  # the weight store's copy, which it drops for newer steps
    shutil.copytree(model, held)
    pool = cpu_pool(tmp_path, workers=1)
    pool.start()
    try:
        assert records(pool, held) == one_worker  # its speed measured
        hung = pool.workers[0].process
        thread, out = _records_in_thread(pool, held)
        _once_generating(pool.workers[0])
        hung.send_signal(signal.SIGSTOP)
        shutil.rmtree(held)  # a minute of hanging is many steps of a fast run
        thread.join(timeout=300)
        assert not thread.is_alive()
        assert isinstance(out.get("error"), PolicyGoneError), out
        assert str(out["error"]) == (
            "worker 0: the policy of step 1 left the weight store before it was loaded; "
            "the order in hand is given up"
        )
        # The node goes on with the newest policy: every worker loads it anew.
        assert records(pool, model) == one_worker
    finally:
        pool.close()
