"""The daemon's stop flag: seen by every child that lives, and set without waiting
for any child, even one killed while it waited (where a multiprocessing Event hangs)."""

from __future__ import annotations

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
