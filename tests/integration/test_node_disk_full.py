"""A node whose disk fills up, on a real full file system (a small tmpfs): the write that
found no room holds the node itself ("disk full"), not a network back-off; the node
neither rejoins nor generates the same order again into a disk that takes none of it,
and it works again once the disk has room."""

from __future__ import annotations

import os
import subprocess
import threading

import pytest
from eth_account import Account

from client.node.daemon.runner import Daemon
from client.node.events import Event, EventKind
from client.node.settings import NodeSettings
from client.node.work.loop import Node
from swarmrl.files import write_atomically
from swarmrl.sizes import MiB
from tests.unit.test_node_pause import run_offline


@pytest.fixture
def small_disk(tmp_path):
    """A file system of 4 MiB of its own (mounted for the test, as root)."""
    disk = tmp_path / "disk"
    disk.mkdir()
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(disk)],
        capture_output=True,
        text=True,
    )
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.strip()}")
    try:
        yield disk
    finally:
        subprocess.run(["umount", "-l", str(disk)], check=True)


class Clock:
    def __init__(self) -> None:
        self.now = 1_000_000.0

    def __call__(self) -> float:
        return self.now


def test_a_write_that_finds_no_room_holds_the_node_until_the_disk_has_room(small_disk, tmp_path):
    settings = NodeSettings(data_dir=small_disk / "node", keystore_dir=tmp_path)
    events: list[Event] = []
    idle = threading.Event()
    node = Node(settings, Account.create(), on_event=lambda e: (events.append(e), hear(e)))
    clock = Clock()
    daemon = Daemon(node, settings.data_dir, judges=[node.limits], clock=clock)

    def hear(event: Event) -> None:
        daemon.hear(event)
        if event.kind is EventKind.PAUSED:
            idle.set()

    orders: list[int] = []

    def one_order() -> None:
        orders.append(1)
        if len(orders) == 1:
            # What the node writes of an order (its rollouts, their copy in the journal),
            # larger than the disk holds.
            write_atomically(node.outbox / "order.parquet", os.urandom(8 * MiB))
        else:
            node.stop()

    loop = run_offline(node, one_order)
    try:
        assert idle.wait(timeout=60), "the loop never went idle"
        kinds = [e.kind for e in events]
        assert EventKind.RETRY not in kinds  # not the orchestrator's fault
        assert node.state.joined  # nor a reason to join again
        assert orders == [1]  # nor to generate the same order again
        reason = daemon.status().reason
        assert reason.startswith("disk full: ")
        assert "order.parquet: no space left on device; held until " in reason
        assert not list(node.outbox.iterdir())  # the failed write left nothing behind

        subprocess.run(["mount", "-o", "remount,size=2g", str(small_disk)], check=True)
        clock.now += 10
        daemon.tick()  # the limits see the room: the daemon lets the node go
        loop.join(timeout=60)
        assert not loop.is_alive()
        assert orders == [1, 1]
    finally:
        node.stop()
        loop.join(timeout=60)
