"""Pausing the node's loop: the order in flight is finished, then no new one is taken
until it resumes; the loop says when it went idle and when it works again."""

from __future__ import annotations

import threading
from collections.abc import Callable

from client.node.events import Event, EventKind
from client.node.settings import NodeSettings
from client.node.work.loop import Node
from client.node.work.worker import LocalWorker


class Swarm:
    def close(self) -> None:
        pass


def run_offline(
    node: Node, one_order: Callable[[], None], workers: LocalWorker | None = None
) -> threading.Thread:
    """`node`'s loop, started in a thread with no chain, swarm or orchestrator: each of
    its orders is `one_order`, its workers `workers` (by default, one that holds no
    model)."""
    node._start_workers = lambda: workers or LocalWorker(load=None)  # type: ignore[method-assign]
    node._identity = lambda: None  # type: ignore[method-assign]
    node._start_swarm = lambda me: setattr(node, "swarm", Swarm())  # type: ignore[method-assign]
    node._resend = lambda: None  # type: ignore[method-assign]
    node._one_order = one_order  # type: ignore[method-assign]
    node.state.joined = True  # no orchestrator to join, so no heartbeat thread either
    loop = threading.Thread(target=node.run)
    loop.start()
    return loop


def test_a_paused_node_finishes_its_order_then_waits_for_resume(tmp_path):
    events: list[EventKind] = []
    idle = threading.Event()

    def hear(event: Event) -> None:
        events.append(event.kind)
        if event.kind is EventKind.PAUSED:
            idle.set()

    node = Node(NodeSettings(data_dir=tmp_path, keystore_dir=tmp_path), account=None, on_event=hear)
    orders: list[list[EventKind]] = []

    def one_order() -> None:
        orders.append(list(events))
        if len(orders) == 1:
            node.pause()  # pressed while this order is in flight
        else:
            node.stop()

    loop = run_offline(node, one_order)
    assert idle.wait(timeout=60), "the loop never went idle"
    assert len(orders) == 1
    assert node.state.paused
    node.resume()
    loop.join(timeout=60)
    assert not loop.is_alive()
    assert orders == [[EventKind.WORKERS], [EventKind.WORKERS, EventKind.PAUSED, EventKind.RESUMED]]
    assert events == [EventKind.WORKERS, EventKind.PAUSED, EventKind.RESUMED, EventKind.STOPPED]
    assert not node.state.paused


def test_workers_that_keep_failing_pause_the_loop_until_it_resumes(tmp_path):
    from client.node.work.workers import WorkersFailingError

    events: list[Event] = []
    idle = threading.Event()

    def hear(event: Event) -> None:
        events.append(event)
        if event.kind is EventKind.PAUSED:
            idle.set()

    forgiven: list[bool] = []
    node = Node(NodeSettings(data_dir=tmp_path, keystore_dir=tmp_path), account=None, on_event=hear)
    workers = LocalWorker(load=None)
    workers.forgive = lambda: forgiven.append(True)  # type: ignore[method-assign]
    calls = []

    def one_order() -> None:
        calls.append(1)
        if len(calls) == 1:
            raise WorkersFailingError("3 worker exits in a row; the last: worker 0 exited")
        node.stop()

    loop = run_offline(node, one_order, workers)
    try:
        assert idle.wait(timeout=60), "the loop never went idle"
        failing = [e for e in events if e.kind is EventKind.FAILING]
        assert [e.reason for e in failing] == ["3 worker exits in a row; the last: worker 0 exited"]
        assert node.state.paused
        assert calls == [1]  # no order taken while it failed
        node.resume()
        loop.join(timeout=60)
        assert calls == [1, 1]
        assert forgiven == [True]
    finally:
        node.stop()
        loop.join(timeout=60)
