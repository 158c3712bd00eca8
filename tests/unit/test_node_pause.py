"""Pausing the node's loop: the order in flight is finished, then no new one is taken
until it resumes; the loop says when it went idle and when it works again."""

from __future__ import annotations

import threading

from client.node.events import Event, EventKind
from client.node.loop import Node
from client.node.settings import NodeSettings


class Swarm:
    def close(self) -> None:
        pass


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

    node._identity = lambda: None  # type: ignore[method-assign]
    node._start_swarm = lambda me: setattr(node, "swarm", Swarm())  # type: ignore[method-assign]
    node._resend = lambda: None  # type: ignore[method-assign]
    node._one_order = one_order  # type: ignore[method-assign]
    node.state.joined = True  # no orchestrator to join, so no heartbeat thread either
    loop = threading.Thread(target=node.run)
    loop.start()
    assert idle.wait(timeout=60), "the loop never went idle"
    assert len(orders) == 1
    assert node.state.paused
    node.resume()
    loop.join(timeout=60)
    assert not loop.is_alive()
    assert orders == [[], [EventKind.PAUSED, EventKind.RESUMED]]
    assert events == [EventKind.PAUSED, EventKind.RESUMED, EventKind.STOPPED]
    assert not node.state.paused
