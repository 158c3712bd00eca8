"""The daemon's stop flag: seen by every child that lives, also once the daemon is gone,
and set without waiting for any child, even one killed while it waited (where a
multiprocessing Event hangs)."""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import signal
import threading

from orchestrator.service.stop import StopFlag


def _wait_then_report(flag: StopFlag, seen: object) -> None:
    if flag.wait(60):
        seen.set()


def test_a_child_sees_the_flag():
    ctx = multiprocessing.get_context("spawn")
    flag, seen = StopFlag(ctx), ctx.Event()
    child = ctx.Process(target=_wait_then_report, args=(flag, seen))
    child.start()
    assert not flag.is_set()
    flag.set()
    child.join(60)
    assert child.exitcode == 0
    assert seen.is_set()
    assert flag.is_set()


def test_setting_does_not_wait_for_a_child_killed_while_waiting():
    ctx = multiprocessing.get_context("spawn")
    flag, seen = StopFlag(ctx), ctx.Event()
    child = ctx.Process(target=_wait_then_report, args=(flag, seen))
    child.start()
    os.kill(child.pid, signal.SIGKILL)
    child.join(60)
    setter = threading.Thread(target=flag.set, daemon=True)
    setter.start()
    setter.join(30)  # a hang guard, not a timing claim: an Event's set() never returns here
    assert not setter.is_alive()
    assert not seen.is_set()


def _daemon(seen: object, started: object) -> None:
    """A parent that starts a child waiting on its flag, and never sets it."""
    ctx = multiprocessing.get_context("spawn")
    flag = StopFlag(ctx)
    child = ctx.Process(target=_wait_then_report, args=(flag, seen))
    child.start()
    started.put(child.pid)
    child.join()


def test_a_child_sees_the_flag_once_its_parent_is_gone():
    ctx = multiprocessing.get_context("spawn")
    seen, started = ctx.Event(), ctx.Queue()
    daemon = ctx.Process(target=_daemon, args=(seen, started))
    daemon.start()
    child = started.get(timeout=60)
    os.kill(daemon.pid, signal.SIGKILL)  # no chance to set anything
    daemon.join(60)
    # A hang guard, not a timing claim: the child waits up to 60 s for the flag.
    assert seen.wait(60)
    with contextlib.suppress(ProcessLookupError):  # it exits once it has reported
        os.kill(child, signal.SIGKILL)
