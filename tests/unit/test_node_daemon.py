"""The node daemon and its control socket: a real unix socket, a real client, and a
stand-in for the work loop that records what the daemon asked of it."""

from __future__ import annotations

import json
import logging
import os
import signal
import socket
import stat
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from client.node.daemon.control import (
    MAX_SOCKET_PATH,
    WATCH_QUEUE,
    Command,
    ControlClient,
    ControlError,
    ControlServer,
    End,
    NotRunningError,
    Update,
    socket_path,
)
from client.node.daemon.runner import JUDGE_SECONDS, Daemon
from client.node.events import Event, EventKind
from client.node.machine.holds import Hold, Holds
from swarmrl.times import parse_duration

NODE = "0x" + "ab" * 20


class StandIn:
    """The work loop as the daemon drives it; it runs until stopped."""

    address = NODE

    def __init__(self) -> None:
        self.calls: list[str] = []
        self.stopped = threading.Event()
        self.waits: list[str] = []  # what it says it waits for

    def run(self) -> None:
        self.stopped.wait()

    def stop(self) -> None:
        self.calls.append("stop")
        self.stopped.set()

    def finish(self) -> None:
        self.calls.append("finish")

    def pause(self) -> None:
        self.calls.append("pause")

    def resume(self) -> None:
        self.calls.append("resume")

    def waiting(self) -> list[str]:
        return list(self.waits)


class Clock:
    def __init__(self) -> None:
        self.now = 1_000_000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def served(tmp_path):
    runner, clock = StandIn(), Clock()
    daemon = Daemon(runner, tmp_path / "node", clock=clock)
    (tmp_path / "node").mkdir()
    with daemon.serving():
        yield daemon, runner, clock, ControlClient(tmp_path / "node")


def test_the_socket_is_the_owners_alone_and_found_from_the_data_dir(served):
    daemon, _, _, client = served
    assert client.path == socket_path(daemon.data_dir) == daemon.data_dir / "control.sock"
    mode = client.path.stat().st_mode
    assert stat.S_ISSOCK(mode)
    assert stat.S_IMODE(mode) == 0o600
    assert client.running()


def test_a_data_dir_too_long_for_a_socket_address_gets_a_private_one(tmp_path):
    deep = tmp_path / ("d" * (MAX_SOCKET_PATH + 10))
    path = socket_path(deep)
    assert len(os.fsencode(path)) <= MAX_SOCKET_PATH
    assert path == socket_path(deep) != socket_path(tmp_path / ("e" * (MAX_SOCKET_PATH + 10)))
    daemon = Daemon(StandIn(), deep)
    with daemon.serving():
        assert ControlClient(deep).status().node == NODE
        assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    assert not path.exists()  # removed when the daemon ends


def test_status_carries_the_reason_line_and_counts(served):
    daemon, _, _, client = served
    assert client.status().reason == "not joined yet: joining"
    daemon.hear(Event(EventKind.JOINED, step=3))
    daemon.hear(Event(EventKind.SUBMITTED, digest="ab" * 6, units=4))
    status = client.status()
    assert (status.reason, status.working, status.newest_step) == ("working", True, 3)
    assert (status.submitted, status.intake_accepted, status.pid) == (1, 1, os.getpid())
    daemon.hear(Event(EventKind.NO_WORK, reason="the run has ended", extra={"wait": "30s"}))
    status = client.status()
    assert status.reason == "no work offered: the run has ended (asking again in 30s)"
    assert not status.working


def test_pause_and_resume_hold_the_loop_and_say_why(served):
    daemon, runner, _, client = served
    daemon.hear(Event(EventKind.JOINED))
    reply = client.call(Command.PAUSE)
    assert runner.calls == ["pause"]
    assert reply.status is not None
    assert reply.status.reason == "paused by you: after the order in flight"
    daemon.hear(Event(EventKind.PAUSED))  # the loop handed its order in
    assert client.status().reason == "paused by you"
    client.call(Command.RESUME)
    assert runner.calls == ["pause", "resume"]
    daemon.hear(Event(EventKind.RESUMED))
    assert client.status().reason == "working"


def test_workers_that_keep_failing_hold_the_node_until_it_is_resumed(served):
    daemon, runner, _, client = served
    why = "3 worker exits in a row; the last: worker 1 exited with code -9 (out of memory)"
    daemon.hear(Event(EventKind.FAILING, reason=why))
    assert runner.calls == ["pause"]
    daemon.hear(Event(EventKind.PAUSED))
    assert client.status().reason == f"workers keep failing: {why}"
    daemon.tick()  # no condition of the machine lifts it
    assert runner.calls == ["pause"]
    client.call(Command.RESUME)
    assert runner.calls == ["pause", "resume"]
    assert daemon.view.held == ""


def test_a_snooze_ends_by_itself_and_a_pause_outlasts_it(served):
    daemon, runner, clock, client = served
    reply = client.call(Command.SNOOZE, seconds=60.0)
    assert reply.status is not None
    assert reply.status.reason.startswith("snoozed until ")
    assert runner.calls == ["pause"]
    clock.now += 59
    daemon.tick()
    assert runner.calls == ["pause"]
    clock.now += 1
    daemon.tick()  # its time is over: the node works again
    assert runner.calls == ["pause", "resume"]
    assert daemon.view.held == ""

    client.call(Command.SNOOZE, seconds=60.0)
    client.call(Command.PAUSE)
    clock.now += 61
    daemon.tick()
    assert runner.calls[-1] == "pause"  # still held: paused by you
    assert daemon.view.held == "paused by you"
    client.call(Command.RESUME)  # ends both
    assert runner.calls[-1] == "resume"
    assert daemon.view.held == ""


def test_finish_and_stop_reach_the_loop_and_show(served):
    _daemon, runner, _, client = served
    reply = client.call(Command.FINISH)
    assert runner.calls == ["finish"]
    assert reply.status is not None
    assert reply.status.reason.startswith("finishing: ")
    client.call(Command.STOP)
    assert runner.calls == ["finish", "stop"]


def test_a_bad_request_gets_one_sentence_and_the_daemon_goes_on(served):
    _, _, _, client = served
    for line in (b"not json\n", b'{"command": "format-disk"}\n', b"{}"):
        with socket.socket(socket.AF_UNIX) as s:
            s.connect(str(client.path))
            s.sendall(line)
            s.shutdown(socket.SHUT_WR)
            answer = s.makefile("rb").readline()
        assert b'"error":"the control message is' in answer, answer
    with pytest.raises(ControlError, match="snooze needs a duration"):
        client.call(Command.SNOOZE)
    assert client.status().node == NODE


def test_watching_starts_with_the_view_and_the_log_then_follows(served):
    daemon, _, _, client = served
    daemon.hear(Event(EventKind.JOINED, step=1))
    logging.getLogger("swarmrl.node").warning("before the watch")
    updates = client.watch()
    first = next(updates)
    view = first.node_view()
    assert view is not None
    assert view.joined
    assert view.newest == 1
    assert first.lines[-1].endswith("WARNING swarmrl.node before the watch")
    daemon.hear(Event(EventKind.WEIGHTS_ANNOUNCED, step=2))
    event = next(updates).node_event()
    assert event == Event(EventKind.WEIGHTS_ANNOUNCED, step=2)
    logging.getLogger("swarmrl.node").warning("after it")
    assert next(updates).lines[0].endswith("WARNING swarmrl.node after it")
    assert client.call(Command.LOGS, lines=1).lines[0].endswith("after it")
    updates.close()


def test_a_watcher_that_falls_behind_is_dropped_and_the_daemon_never_waits(served):
    daemon, _, _, client = served
    with socket.socket(socket.AF_UNIX) as s:
        s.connect(str(client.path))
        s.sendall(b'{"command": "watch"}\n')  # and never reads
        for i in range(WATCH_QUEUE * 8):
            daemon.hear(Event(EventKind.WEIGHTS_ANNOUNCED, step=i))  # returns at once
        assert daemon._watchers == set()
        # What it reads at last says why it ended: to watch again.
        ends = [json.loads(line).get("end") for line in s.makefile("rb")]
        assert ends[-1] == "behind"
    assert client.status().newest_step == WATCH_QUEUE * 8 - 1


def test_watching_ends_when_the_daemon_does(tmp_path):
    runner = StandIn()
    daemon = Daemon(runner, tmp_path)
    ended = threading.Event()
    lines: list[Update] = []

    def watch() -> None:
        lines.extend(ControlClient(tmp_path).watch())
        ended.set()

    with daemon.serving():
        watcher = threading.Thread(target=watch)
        watcher.start()
        while not daemon._watchers:
            threading.Event().wait(0.01)
    assert ended.wait(30)
    assert len(lines) == 2  # the view; then the end, saying why
    assert lines[-1].end is End.STOPPED


def test_no_daemon_is_one_sentence(tmp_path):
    with pytest.raises(NotRunningError, match=f"no node runs for {tmp_path}"):
        ControlClient(tmp_path).status()


def test_a_dead_daemons_socket_is_replaced_and_a_live_one_refused(tmp_path):
    path = socket_path(tmp_path)
    left = socket.socket(socket.AF_UNIX)
    left.bind(str(path))
    left.close()  # a socket file nobody listens at: its daemon died
    daemon = Daemon(StandIn(), tmp_path)
    with daemon.serving():
        assert ControlClient(tmp_path).running()
        with pytest.raises(ControlError, match="a node already listens"):
            ControlServer(path, daemon)


def test_holds_give_the_first_reason():
    holds = Holds()
    assert not holds
    assert holds.reason() == ""
    holds.set(Hold.SNOOZED, until=100.0)
    assert holds.reason().startswith("snoozed until ")
    holds.set(Hold.PAUSED)
    assert holds.reason() == "paused by you"
    assert not holds.expire(99.0)
    assert holds.expire(100.0)
    assert holds.reason() == "paused by you"


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("90s", 90), ("30m", 1800), ("5min", 300), ("1h", 3600), ("2h30m", 9000), ("1d", 86400),
     ("15", 900)],
)  # fmt: skip
def test_durations_as_people_type_them(text, seconds):
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["", "x", "1h x", "-1h", "1.5h", "h"])
def test_a_duration_that_is_not_one_is_one_sentence(text):
    with pytest.raises(ValueError, match="is not a duration such as 90s, 30m, 1h or 2h30m"):
        parse_duration(text)


def test_a_socket_path_is_absolute(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert socket_path(Path("node")) == tmp_path / "node" / "control.sock"


class Judge:
    """The machine as a test sets it: which of its holds are in force."""

    owns = frozenset({Hold.ON_BATTERY, Hold.PROGRAM})

    def __init__(self) -> None:
        self.now: dict[Hold, str] = {}
        self.looks = 0

    def holds(self, now) -> dict[Hold, str]:
        assert now.tzinfo is not None
        self.looks += 1
        return dict(self.now)

    def apply(self, settings) -> None: ...


def test_the_machines_conditions_hold_the_node_and_release_it(tmp_path):
    runner, clock, judge = StandIn(), Clock(), Judge()
    daemon = Daemon(runner, tmp_path, judges=[judge], clock=clock)
    daemon.tick()
    assert (runner.calls, daemon.view.held) == ([], "")
    judge.now = {Hold.PROGRAM: "steam runs"}
    clock.now += 1
    daemon.tick()  # not looked at again within JUDGE_SECONDS
    assert judge.looks == 1
    clock.now += JUDGE_SECONDS
    daemon.tick()
    assert runner.calls == ["pause"]
    assert daemon.view.held == "a program that pauses work runs: steam runs"
    judge.now = {Hold.PROGRAM: "steam runs", Hold.ON_BATTERY: "work resumes on mains power"}
    clock.now += JUDGE_SECONDS
    daemon.tick()
    assert daemon.view.held == "on battery: work resumes on mains power"  # the first hold
    daemon.hold(Hold.PAUSED)
    judge.now = {}
    clock.now += JUDGE_SECONDS
    daemon.tick()
    assert daemon.view.held == "paused by you"  # the machine lets go; the volunteer does not
    daemon.release(Hold.PAUSED)
    assert runner.calls[-1] == "resume"
    assert daemon.view.held == ""


def test_what_ends_the_node_reaches_an_attached_app_before_the_end(tmp_path):
    started = threading.Event()

    class Failing(StandIn):
        def run(self) -> None:
            started.wait()
            raise ValueError("node 0xab has no provider on chain; run `swarmrl node init`")

    daemon = Daemon(Failing(), tmp_path)
    raised: list[BaseException] = []

    def run() -> None:
        try:
            daemon.run()
        except ValueError as e:
            raised.append(e)

    ran = threading.Thread(target=run)
    ran.start()
    while not ControlClient(tmp_path).running():
        threading.Event().wait(0.01)
    watch = ControlClient(tmp_path).watch()
    updates = [next(watch)]
    started.set()
    updates.extend(watch)
    ran.join()
    assert len(raised) == 1  # and the daemon's caller still hears it
    lines = [line for u in updates for line in u.lines]
    assert lines[-1].endswith(
        "ERROR swarmrl.node the node stopped: node 0xab has no provider on chain; "
        "run `swarmrl node init`"
    )
    assert updates[-1].end is End.STOPPED


def test_a_command_that_fails_without_words_is_named_and_the_server_goes_on(tmp_path):
    class Failing:
        def command(self, request):
            raise ValueError()

        def watch(self, updates):
            return lambda: None

    server = ControlServer(socket_path(tmp_path), Failing())
    try:
        with pytest.raises(ControlError, match=r"^ValueError$"):
            ControlClient(tmp_path).call(Command.STATUS)
        with pytest.raises(ControlError, match=r"^ValueError$"):
            ControlClient(tmp_path).call(Command.PAUSE)
    finally:
        server.close()


SERVE = """
import sys, threading
from pathlib import Path
from client.node.daemon.runner import Daemon
from tests.unit.test_node_daemon import StandIn
with Daemon(StandIn(), Path(sys.argv[1])).serving():
    print("serving", flush=True)
    threading.Event().wait()
"""


def test_clients_that_arrive_together_are_all_answered(tmp_path):
    """Thirty `node status` at once, while the daemon is too busy to accept (stopped with
    SIGSTOP here): they wait in the socket's backlog, and each gets its answer."""
    daemon = subprocess.Popen(
        [sys.executable, "-c", SERVE, str(tmp_path)],
        stdout=subprocess.PIPE,
        text=True,
        cwd=Path(__file__).parents[2],
    )
    try:
        assert daemon.stdout.readline() == "serving\n"
        daemon.send_signal(signal.SIGSTOP)
        answers: list[object] = []

        def ask() -> None:
            try:
                answers.append(ControlClient(tmp_path).status().node)
            except ControlError as e:
                answers.append(e)

        clients = [threading.Thread(target=ask) for _ in range(30)]
        for client in clients:
            client.start()
        # Not a timed assertion: it only lets the clients arrive while nothing accepts.
        time.sleep(1.0)
        daemon.send_signal(signal.SIGCONT)
        for client in clients:
            client.join(timeout=120)
        assert answers == [NODE] * 30
    finally:
        daemon.kill()
        daemon.wait()


def test_a_message_that_is_no_request_is_told_what_it_is(served):
    _, _, _, client = served
    for line, sentence in (
        (b"not json\n", "the control message is not JSON"),
        (b"[1, 2]\n", "the control message is not a JSON object"),
        (b'{"command": "format-disk"}\n', "the control message is not valid at command"),
    ):
        with socket.socket(socket.AF_UNIX) as s:
            s.connect(str(client.path))
            s.sendall(line)
            answer = json.loads(s.makefile("rb").readline())
        assert answer["error"] == sentence


def test_status_says_what_the_node_waits_for(served):
    _, runner, _, client = served
    assert client.status().waiting == []
    runner.waits = [
        "worker 1 generating batch 2 of 3: 4 min 10 s so far, taken for hung after 5 min"
    ]
    assert client.status().waiting == runner.waits
