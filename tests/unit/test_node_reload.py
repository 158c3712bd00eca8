"""node.toml edited while the daemon runs: live keys applied once the file stands still,
others named as waiting for a restart; a broken, cut-short or emptied file is one
warning and no change, and a file caught half-written is never read in its half."""

from __future__ import annotations

import itertools
import logging
import os
import threading
import time

import pytest

from client.node.daemon.reload import SettingsFile
from client.node.daemon.runner import Daemon
from client.node.settings import NodeSettings
from swarmrl.settings_toml import load_settings, write_settings

PEER = "/ip4/127.0.0.1/tcp/4001/p2p/12D3KooWD3eckifWpRn9wQpMG9R9hX3sD158z7EqHWmweQAJU5SA"


@pytest.fixture(autouse=True)
def clean_environment(monkeypatch, tmp_path):
    for name in list(os.environ):
        if name.upper().startswith("SWARMRL_"):
            monkeypatch.delenv(name)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))


def _write(path, **values):
    base = {"data_dir": path.parent / "node", "keystore_dir": path.parent / "keys"}
    write_settings(path, {**base, "orchestrator": PEER, **values})
    # Each edit a second later than the last: one within the clock's grain still counts.
    info = os.stat(path)
    os.utime(path, ns=(info.st_atime_ns, info.st_mtime_ns + 1_000_000_000 * next(EDITS)))


EDITS = itertools.count(1)


def test_a_live_key_is_applied_and_nothing_happens_without_an_edit(tmp_path, caplog):
    path = tmp_path / "node.toml"
    _write(path, threads=2)
    watched = SettingsFile(path, load_settings(NodeSettings, path))
    assert watched.changed() is None
    _write(path, threads=3)
    assert watched.changed() is None  # seen; read once it stands still a look
    with caplog.at_level(logging.INFO, logger="swarmrl.node"):
        new = watched.changed()
    assert new is not None
    assert new.threads == 3
    assert f"{path} changed threads: applied" in caplog.text
    assert watched.changed() is None


def test_a_key_that_needs_a_restart_waits_and_is_named(tmp_path, caplog):
    path = tmp_path / "node.toml"
    _write(path)
    running = load_settings(NodeSettings, path)
    watched = SettingsFile(path, running)
    _write(path, max_batch=7, threads=4)
    with caplog.at_level(logging.INFO, logger="swarmrl.node"):
        watched.changed()
        new = watched.changed()
    assert new is not None
    assert (new.max_batch, new.threads) == (running.max_batch, 4)
    assert "changed max_batch: that takes effect at the next start" in caplog.text


def test_a_file_that_no_longer_loads_changes_nothing(tmp_path, caplog):
    path = tmp_path / "node.toml"
    _write(path, threads=2)
    watched = SettingsFile(path, load_settings(NodeSettings, path))
    path.write_text("threads = 'many'\n")
    with caplog.at_level(logging.WARNING, logger="swarmrl.node"):
        assert watched.changed() is None
        assert watched.changed() is None
    assert "changed but does not load, so nothing changes" in caplog.text
    assert watched.current.threads == 2


class Runner:
    address = "0x" + "ab" * 20

    def __init__(self) -> None:
        self.applied: list[NodeSettings] = []
        self.stopped = threading.Event()

    def run(self) -> None:
        self.stopped.wait()

    def stop(self) -> None:
        self.stopped.set()

    def finish(self) -> None: ...

    def pause(self) -> None: ...

    def resume(self) -> None: ...

    def waiting(self) -> list[str]:
        return []

    def apply(self, settings: NodeSettings) -> None:
        self.applied.append(settings)


def test_the_daemon_hands_the_node_what_changed(tmp_path):
    path = tmp_path / "node.toml"
    _write(path, threads=1)
    runner = Runner()
    daemon = Daemon(
        runner, tmp_path, settings_file=SettingsFile(path, load_settings(NodeSettings, path))
    )
    daemon.tick()
    assert runner.applied == []
    _write(path, threads=5)
    daemon.tick()
    daemon.tick()  # the file stood still from one look to the next: read
    assert [s.threads for s in runner.applied] == [5]


def test_the_loop_takes_new_torch_threads_from_its_own_thread(tmp_path):
    import torch

    from client.node.work.loop import Node

    before = torch.get_num_threads()
    node = Node(NodeSettings(data_dir=tmp_path / "node", keystore_dir=tmp_path), account=None)
    try:
        node.apply(node.settings.model_copy(update={"threads": 1}))
        node._take_threads()
        assert torch.get_num_threads() == 1
        node.apply(node.settings.model_copy(update={"threads": 2}))
        node._take_threads()
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(before)


def _damage(path, text):
    """Writes `text` over the file as a cut-short or emptied edit leaves it."""
    path.write_text(text)
    info = os.stat(path)
    os.utime(path, ns=(info.st_atime_ns, info.st_mtime_ns + 1_000_000_000 * next(EDITS)))


def test_a_file_cut_short_or_emptied_changes_nothing_and_names_what_it_lacks(tmp_path, caplog):
    path = tmp_path / "node.toml"
    _write(path, threads=2, schedule=["mon 18:00-19:00"], max_other_load=50)
    watched = SettingsFile(path, load_settings(NodeSettings, path))
    text = path.read_text()
    cut = text[: text.index("schedule")]
    for damaged, lacking in (
        (cut, "max_other_load, schedule"),
        ("", "data_dir, keystore_dir, max_other_load, orchestrator, schedule, threads"),
    ):
        _damage(path, damaged)
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="swarmrl.node"):
            assert watched.changed() is None
            assert watched.changed() is None
        assert f"{path} changed but no longer sets {lacking} (cut short?)" in caplog.text
    assert (watched.current.schedule, watched.current.max_other_load) == (["mon 18:00-19:00"], 50)
    # Written whole again, with a key set to its default: that applies.
    _write(path, threads=2, schedule=[], max_other_load=50)
    watched.changed()
    assert watched.changed().schedule == []


def test_a_file_half_written_is_never_read_in_its_half(tmp_path):
    path = tmp_path / "node.toml"
    _write(path, threads=2)
    watched = SettingsFile(path, load_settings(NodeSettings, path))
    whole = path.read_text().replace("threads = 2", "threads = 12")
    _damage(path, whole[: whole.index("threads = 1") + len("threads = 1")])  # "= 1" of "= 12"
    assert watched.changed() is None  # it moved since the last look: not read yet
    _damage(path, whole)
    assert watched.changed() is None  # still moving
    new = watched.changed()  # it stood still
    assert new is not None
    assert new.threads == 12


class Clock:
    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def test_a_node_held_outside_its_schedule_stays_held_when_the_file_is_cut_there(tmp_path):
    from client.node.machine.conditions import Conditions
    from tests.unit.test_node_conditions import FakeMachine

    clock = Clock(1_700_000_000.0)
    # A window an hour or more ahead of the daemon's clock: the node is outside it.
    later = time.localtime(clock.now + 7200)
    window = f"daily {later.tm_hour:02d}:00-{(later.tm_hour + 1) % 24:02d}:00"
    path = tmp_path / "node.toml"
    _write(path, schedule=[window], max_other_load=50)
    running = load_settings(NodeSettings, path)
    runner = Runner()
    daemon = Daemon(
        runner,
        tmp_path,
        settings_file=SettingsFile(path, running),
        judges=[Conditions(running, FakeMachine(), gpu=False)],
        clock=clock,
    )
    daemon.tick()
    assert daemon.view.held.startswith("outside the schedule")
    text = path.read_text()
    _damage(path, text[: text.index("schedule")])
    for _ in range(3):
        clock.now += 10
        daemon.tick()
    assert runner.applied == []
    assert daemon.view.held.startswith("outside the schedule")
