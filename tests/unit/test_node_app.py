"""The node's terminal app, driven by textual's Pilot, attached to a real daemon over its
real control socket: a stand-in runner records what the daemon asks of it, and the test
tells the daemon the node's events as a real node's listener would. The chain facts and
the claimer are injected, so neither a node nor a chain is needed."""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from pathlib import Path

import pytest
import requests
from textual.pilot import Pilot
from textual.widgets import Input, Label, Log, ProgressBar, Static

from client.node.daemon.control import Command, ControlClient
from client.node.daemon.runner import Daemon
from client.node.events import Event, EventKind
from client.node.screen.app import (
    ENDED,
    FINISH_QUESTION,
    STOP_QUESTION,
    STOPPED,
    ConfirmScreen,
    NodeApp,
    PasswordScreen,
)
from client.node.screen.view import ChainFacts, EpochWork

TOKEN = 10**18
NOW = 1_700_000_000.0
NODE = "0x" + "ab" * 20
PROVIDER = "0x" + "cd" * 20
FACTS = ChainFacts(
    provider=PROVIDER,
    stake=150 * TOKEN,
    needed=100 * TOKEN,
    unbonding=0,
    joined=True,
    now=1_000,
    epochs=(
        EpochWork(3, units=4, reward=4 * TOKEN // 10, unlocks_at=900),
        EpochWork(4, units=2, reward=2 * TOKEN // 10, unlocks_at=1_600),
    ),
)
GENERATED = [
    Event(
        EventKind.GENERATED,
        step=1,
        rollouts=8,
        tokens_per_second=250.0,
        reward=0.25,
        extra={"tokens": "500"},
    ),
    Event(
        EventKind.GENERATED,
        step=2,
        rollouts=8,
        tokens_per_second=125.5,
        reward=0.75,
        extra={"tokens": "500"},
    ),
]


class Runner:
    """What the daemon drives, recording what it was asked; the test tells the daemon
    the node's events (the daemon's serving() runs without the runner's run())."""

    address = NODE

    def __init__(self, refuse: str = "") -> None:
        self.calls: list[str] = []
        self.refuse = refuse

    def run(self) -> None:
        raise AssertionError("the tests serve the daemon without running the node")

    def stop(self) -> None:
        self.calls.append("stop")

    def finish(self) -> None:
        self.calls.append("finish")

    def pause(self) -> None:
        if self.refuse:
            raise ValueError(self.refuse)
        self.calls.append("pause")

    def resume(self) -> None:
        self.calls.append("resume")

    def waiting(self) -> list[str]:
        return []


class Served:
    """A real daemon serving its real control socket in `data_dir` until ended."""

    def __init__(
        self,
        data_dir: Path,
        runner: Runner | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.data_dir = data_dir
        self.runner = runner or Runner()
        self.daemon = Daemon(self.runner, data_dir, clock=clock)
        self._stack = ExitStack()
        self._stack.enter_context(self.daemon.serving())

    def app(self, chain: Chain | None = None, claimer: Claimer | None = None) -> NodeApp:
        return NodeApp(ControlClient(self.data_dir), NODE, chain or Chain(), claimer)

    def end(self) -> None:
        """Leaves the serving() block, as the daemon does when its node has stopped."""
        self._stack.close()


@pytest.fixture
def served(tmp_path: Path) -> Iterator[Served]:
    served = Served(tmp_path)
    try:
        yield served
    finally:
        served.end()


class Claimer:
    def __init__(self, needs_password: bool = False) -> None:
        self.needs_password = needs_password
        self.claims: list[tuple[list[int], str | None]] = []

    def claim(self, epochs: list[int], password: str | None) -> int:
        self.claims.append((epochs, password))
        return 4 * TOKEN // 10


class Chain:
    """Chain facts as the app's reader returns them, counting the reads."""

    def __init__(self, facts: ChainFacts | Exception = FACTS) -> None:
        self.facts = facts
        self.reads = 0

    def __call__(self) -> ChainFacts:
        self.reads += 1
        if isinstance(self.facts, Exception):
            raise self.facts
        return self.facts


def drive(app: NodeApp, test: Callable[[Pilot], object]) -> None:
    async def main() -> None:
        async with app.run_test(size=(120, 50)) as pilot:
            await test(pilot)  # type: ignore[misc]

    asyncio.run(main())


async def until(pilot: Pilot, condition: Callable[[], bool]) -> None:
    """Lets the app process what other threads posted until `condition` holds."""
    for _ in range(500):
        if condition():
            return
        await pilot.pause(0.01)
    raise AssertionError("the app never got there")


async def attached(pilot: Pilot, app: NodeApp) -> None:
    await until(pilot, lambda: app.attached)


async def chain_read(pilot: Pilot, app: NodeApp) -> None:
    thread = app.chain_thread
    assert thread is not None
    thread.join()
    await until(pilot, lambda: bool(app.view.chain or app.view.chain_error))


def text(app: NodeApp, widget_id: str) -> str:
    return str(app.query_one(f"#{widget_id}", Static).render())


def reason(app: NodeApp) -> str:
    """The work panel's reason line."""
    return text(app, "work").splitlines()[0]


def log_lines(app: NodeApp) -> list[str]:
    return list(app.query_one(Log).lines)


def footer(app: NodeApp) -> dict[str, str]:
    """The app's keys the footer shows, and what it says they do (not textual's palette)."""
    keys = app.query("FooterKey")
    return {k.key: k.description for k in keys if k.action != "command_palette"}


# ---- attaching ------------------------------------------------------------------------


def test_attaching_late_shows_what_the_daemon_heard_before(served):
    for event in [
        Event(EventKind.JOINED, step=1),
        Event(EventKind.ORDER, step=1, order="abc", total=8),
        *GENERATED,
        Event(EventKind.SUBMITTED, digest="d1", units=8),
        Event(EventKind.SUBMITTED, digest="d2", units=0, reason="policy step 0 is stale"),
        Event(EventKind.NO_WORK, reason="the run is full", extra={"wait": "30s"}),
    ]:
        served.daemon.hear(event)
    served.daemon.hear_state(None, 3)  # type: ignore[arg-type]
    served.daemon.hear_line("12:00:00 INFO swarmrl.node submitted digest=d1 units=8")
    app = served.app()

    async def test(pilot: Pilot) -> None:
        await attached(pilot, app)
        assert reason(app) == "no work offered: the run is full (asking again in 30s)"
        work = text(app, "work")
        assert "policy step 2" in work
        assert "rollouts    16 (2.01/s)" in work
        submissions = text(app, "submissions")
        assert "submitted 2" in submissions
        assert "intake      accepted 1  rejected 1" in submissions
        assert submissions.splitlines()[-1] == "✗ d2 intake: policy step 0 is stale"
        assert "peers     3" in text(app, "identity")
        assert "0.75" in str(app.query_one("#chart").render())
        assert log_lines(app) == ["12:00:00 INFO swarmrl.node submitted digest=d1 units=8"]
        await until(pilot, lambda: len(footer(app)) == 6)
        assert footer(app) == {
            "p": "pause/resume",
            "z": "snooze 1h",
            "f": "finish",
            "x": "stop",
            "c": "claim rewards",
            "q": "detach (the node goes on)",
        }

    drive(app, test)


def test_the_attached_view_keeps_only_the_last_rejections(served):
    app = served.app()

    async def test(pilot: Pilot) -> None:
        await attached(pilot, app)  # the view read back from the daemon's JSON
        for n in range(7):
            served.daemon.hear(Event(EventKind.SUBMITTED, digest=f"d{n}", units=0, reason="late"))
        await until(pilot, lambda: app.view.submitted == 7)
        rejected = [line for line in text(app, "submissions").splitlines() if "✗" in line]
        assert rejected == [f"✗ d{n} intake: late" for n in (6, 5, 4, 3, 2)]

    drive(app, test)


def test_events_and_log_lines_after_attaching_update_the_screen(served):
    app = served.app()
    events = [
        Event(EventKind.JOINED, step=1),
        Event(EventKind.WEIGHTS_PROGRESS, step=2, done=3, total=8),
        Event(EventKind.ORDER, step=1, order="abc", total=8),
        *GENERATED,
        Event(EventKind.SUBMITTED, digest="d1", units=8),
        Event(EventKind.SUBMITTED, digest="d2", units=0, reason="policy step 0 is stale"),
        Event(
            EventKind.OUTCOME,
            digest="d1",
            units=8,
            reason="toploc proof does not match",
            extra={"status": "rejected"},
        ),
    ]

    async def test(pilot: Pilot) -> None:
        await attached(pilot, app)
        assert reason(app) == "not joined yet: joining"
        # From another thread, as the node's loop and heartbeat tell the daemon.
        sender = threading.Thread(target=lambda: [served.daemon.hear(e) for e in events])
        sender.start()
        sender.join()
        served.daemon.hear_state(None, 5)  # type: ignore[arg-type]
        await until(pilot, lambda: app.view.submitted == 2 and app.view.invalid == 1)
        await until(pilot, lambda: "peers     5" in text(app, "identity"))
        assert reason(app) == "working"
        work = text(app, "work")
        assert "policy step 2" in work
        assert "rollouts    16 (2.01/s)" in work
        assert "tokens/s    125.5" in work
        bar = app.query_one("#download", ProgressBar)
        assert (bar.display, bar.progress, bar.total) == (True, 3, 8)
        submissions = text(app, "submissions")
        assert "intake      accepted 1  rejected 1" in submissions
        assert "validation  accepted 0 (0 units)  rejected 1" in submissions
        assert submissions.splitlines()[-2:] == [
            "✗ d1 validation: toploc proof does not match",
            "✗ d2 intake: policy step 0 is stale",
        ]
        assert app.view.reward_curve() == ([1, 2], [0.25, 0.75])
        chart = str(app.query_one("#chart").render())
        assert "0.75" in chart
        assert "policy step" in chart

        # The log lines are the daemon's: its log records, as its log file has them.
        logging.getLogger("swarmrl.node").warning("retry reason='gone'")
        served.daemon.hear_line("a line of the daemon's")
        await until(pilot, lambda: log_lines(app)[-1:] == ["a line of the daemon's"])
        assert log_lines(app)[0].endswith("WARNING swarmrl.node retry reason='gone'")
        assert len(log_lines(app)) == 2  # the app writes no line of its own for events

        served.daemon.hear(Event(EventKind.WEIGHTS_READY, step=2))
        await until(pilot, lambda: app.query_one("#download", ProgressBar).progress == 8)

    drive(app, test)


def test_without_a_daemon_the_app_says_so_and_quits_on_q(tmp_path):
    app = NodeApp(ControlClient(tmp_path), NODE, Chain())

    async def test(pilot: Pilot) -> None:
        await until(pilot, lambda: bool(app.ended))
        assert reason(app) == (
            f"no node runs for {tmp_path} (`swarmrl node run` starts one); q quits"
        )
        assert app.failure.startswith("no node runs for")
        assert app.return_code is None
        await pilot.press("q")
        await until(pilot, lambda: app.return_code == 0)

    drive(app, test)


# ---- the daemon's keys ------------------------------------------------------------------


def test_p_pauses_after_the_order_in_flight_and_p_again_resumes(served):
    app = served.app()
    runner, daemon = served.runner, served.daemon
    daemon.hear(Event(EventKind.JOINED, step=1))

    async def test(pilot: Pilot) -> None:
        await attached(pilot, app)
        assert reason(app) == "working"
        await pilot.press("p")
        await until(pilot, lambda: reason(app) == "paused by you: after the order in flight")
        assert runner.calls == ["pause"]
        daemon.hear(Event(EventKind.PAUSED))  # the loop went idle
        await until(pilot, lambda: reason(app) == "paused by you")

        await pilot.press("p")
        await until(pilot, lambda: runner.calls == ["pause", "resume"])
        daemon.hear(Event(EventKind.RESUMED))  # the loop takes work again
        await until(pilot, lambda: app.view.running == "running")
        assert reason(app) == "working"

    drive(app, test)


def test_z_snoozes_for_an_hour_and_p_ends_the_snooze(tmp_path):
    served = Served(tmp_path, clock=lambda: NOW)
    app = served.app()
    runner, daemon = served.runner, served.daemon
    daemon.hear(Event(EventKind.JOINED, step=1))

    async def test(pilot: Pilot) -> None:
        await attached(pilot, app)
        await pilot.press("z")
        # An hour from now on the daemon's clock, said as a time of day.
        then = time.strftime("%H:%M:%S", time.localtime(NOW + 3600))
        await until(pilot, lambda: reason(app).startswith("snoozed until "))
        assert reason(app) == f"snoozed until {then}: after the order in flight"
        assert runner.calls == ["pause"]

        await pilot.press("p")
        await until(pilot, lambda: runner.calls == ["pause", "resume"])
        await until(pilot, lambda: reason(app) == "working")

    try:
        drive(app, test)
    finally:
        served.end()


def test_a_refused_command_is_one_line_on_the_screen(tmp_path):
    served = Served(tmp_path, Runner(refuse="the node cannot pause now"))
    app = served.app()

    async def test(pilot: Pilot) -> None:
        await attached(pilot, app)
        await pilot.press("p")
        await until(pilot, lambda: app.view.message == "the node cannot pause now")
        assert text(app, "rewards").splitlines()[-1] == "the node cannot pause now"
        assert app.return_code is None
        served.runner.refuse = ""
        await pilot.press("p")
        await until(pilot, lambda: served.runner.calls == ["pause"])
        await until(pilot, lambda: app.view.message == "")  # the refusal is past

    try:
        drive(app, test)
    finally:
        served.end()


def test_f_asks_first_n_cancels_and_y_finishes(served):
    app = served.app()

    async def test(pilot: Pilot) -> None:
        await attached(pilot, app)
        await pilot.press("f")
        assert isinstance(app.screen, ConfirmScreen)
        assert str(app.screen.query_one("#question", Label).render()) == FINISH_QUESTION
        await pilot.press("p", "x", "q")  # the app's keys do nothing while it asks
        await pilot.press("n")
        assert not isinstance(app.screen, ConfirmScreen)
        assert app.command_thread is None  # nothing was sent
        assert served.runner.calls == []
        assert app.return_code is None

        await pilot.press("f", "y")
        await until(pilot, lambda: served.runner.calls == ["finish"])
        await until(pilot, lambda: reason(app).startswith("finishing: the order in flight"))
        assert reason(app) == (
            "finishing: the order in flight and what waits to be sent, then leaving"
        )
        assert app.return_code is None  # until the daemon ends

    drive(app, test)


def test_x_asks_first_then_stops_and_the_daemon_ending_ends_the_app(served):
    app = served.app()

    async def test(pilot: Pilot) -> None:
        await attached(pilot, app)
        await pilot.press("x")
        assert isinstance(app.screen, ConfirmScreen)
        assert str(app.screen.query_one("#question", Label).render()) == STOP_QUESTION
        await pilot.press("y")
        await until(pilot, lambda: served.runner.calls == ["stop"])
        await until(pilot, lambda: reason(app) == "stopping: finishing the order in flight")
        assert app.return_code is None
        await asyncio.to_thread(served.end)  # the order in flight is in; the daemon ends
        await until(pilot, lambda: app.return_code == 0)
        assert app.failure == ""

    drive(app, test)


# ---- detaching and endings ----------------------------------------------------------------


def test_q_detaches_and_the_daemon_keeps_working(served):
    app = served.app()

    async def test(pilot: Pilot) -> None:
        await attached(pilot, app)
        await pilot.press("q")
        await until(pilot, lambda: app.return_code == 0)

    drive(app, test)
    assert app.failure == ""
    status = ControlClient(served.data_dir).status()  # still answers
    assert status.node == NODE
    assert status.reason == "not joined yet: joining"
    assert served.runner.calls == []


def test_sigterm_detaches_as_q_does(served):
    app = served.app()
    heard = []
    before = signal.signal(signal.SIGTERM, lambda *_: heard.append("caller"))

    async def test(pilot: Pilot) -> None:
        await attached(pilot, app)
        os.kill(os.getpid(), signal.SIGTERM)
        await until(pilot, lambda: app.return_code == 0)

    try:
        drive(app, test)
        assert heard == []  # the app took it
        os.kill(os.getpid(), signal.SIGTERM)  # once the app is gone, the caller's again
        assert heard == ["caller"]
    finally:
        signal.signal(signal.SIGTERM, before)
    assert served.runner.calls == []
    assert ControlClient(served.data_dir).status().node == NODE


def test_the_daemon_ending_shows_and_the_app_waits_for_q(served):
    app = served.app()

    async def test(pilot: Pilot) -> None:
        await attached(pilot, app)
        await asyncio.to_thread(served.end)  # nobody asked: it ended of itself
        await until(pilot, lambda: reason(app) == ENDED)
        assert app.failure == "the node's daemon ended; its log says why"
        assert app.return_code is None
        await until(pilot, lambda: set(footer(app)) == {"c", "q"})
        await pilot.press("p", "x")  # no daemon to tell
        assert app.command_thread is None
        assert not isinstance(app.screen, ConfirmScreen)
        await pilot.press("q")
        await until(pilot, lambda: app.return_code == 0)

    drive(app, test)


def test_a_daemon_stopped_from_elsewhere_is_no_failure(served):
    app = served.app()

    async def test(pilot: Pilot) -> None:
        await attached(pilot, app)
        await asyncio.to_thread(ControlClient(served.data_dir).call, Command.STOP)
        await until(pilot, lambda: reason(app) == "stopping: finishing the order in flight")
        await asyncio.to_thread(served.end)
        await until(pilot, lambda: reason(app) == STOPPED)
        assert app.failure == ""
        assert app.return_code is None
        await pilot.press("q")
        await until(pilot, lambda: app.return_code == 0)

    drive(app, test)


# ---- the chain and claims -----------------------------------------------------------------


def test_it_renders_the_addresses_and_the_chain_facts(served):
    app = served.app()

    async def test(pilot: Pilot) -> None:
        await chain_read(pilot, app)
        await attached(pilot, app)  # the daemon's view keeps the facts the app read
        identity = text(app, "identity")
        assert f"node      {NODE}" in identity
        assert f"provider  {PROVIDER}" in identity
        assert "stake     150 (ok)" in identity
        rewards = text(app, "rewards")
        assert "claimable 0.4  (c claims)" in rewards
        assert "epoch 4  2 units, 0.2: pending — claimable in 10 min" in rewards

    drive(app, test)


def test_c_claims_what_is_claimable_and_shows_the_amount(served):
    chain, claimer = Chain(), Claimer()
    app = served.app(chain, claimer)

    async def test(pilot: Pilot) -> None:
        await chain_read(pilot, app)
        await pilot.press("c")
        assert app.claim_thread is not None
        app.claim_thread.join()
        await until(pilot, lambda: "claimed 0.4 for epochs 3" in text(app, "rewards"))
        assert claimer.claims == [([3], None)]
        assert log_lines(app)[-1].endswith("claimed 0.4 for epochs 3")
        await until(pilot, lambda: chain.reads == 2)  # the chain is read again at once

    drive(app, test)


def test_c_asks_for_the_password_when_it_has_none(served):
    claimer = Claimer(needs_password=True)
    app = served.app(Chain(), claimer)

    async def test(pilot: Pilot) -> None:
        await chain_read(pilot, app)
        await attached(pilot, app)
        await pilot.press("c")
        assert isinstance(app.screen, PasswordScreen)
        assert app.screen.query_one(Input).password
        # The app's keys are letters of the password here.
        await pilot.press(*"qpxfzc!", "enter")
        assert app.claim_thread is not None
        app.claim_thread.join()
        assert claimer.claims == [([3], "qpxfzc!")]
        assert app.command_thread is None
        assert app.return_code is None

        await pilot.press("c", "escape")  # cancelled: nothing is sent
        assert not isinstance(app.screen, PasswordScreen)
        assert len(claimer.claims) == 1
        assert served.runner.calls == []

    drive(app, test)


def test_c_without_a_provider_key_says_how_to_claim(served):
    app = served.app()

    async def test(pilot: Pilot) -> None:
        await chain_read(pilot, app)
        await pilot.press("c")
        assert "swarmrl wallet claim <provider key>" in app.view.message
        assert f"--node {NODE} --epoch 3`" in app.view.message

    drive(app, test)


def test_a_chain_failure_is_one_line_and_the_app_goes_on(served):
    app = served.app(Chain(requests.ConnectionError("refused, with a long story")))

    async def test(pilot: Pilot) -> None:
        await chain_read(pilot, app)
        assert app.view.chain_error == (
            "the RPC endpoint could not be reached; is the URL right and the chain running?"
        )
        await attached(pilot, app)
        assert f"chain     {app.view.chain_error}" in text(app, "identity")
        assert app.return_code is None

    drive(app, test)


def test_a_spawned_daemons_log_lines_go_only_to_its_file(tmp_path, capsys):
    from swarmrl.logs import setup_logging

    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    try:
        setup_logging(tmp_path / "node.log", stderr=False)
        logging.getLogger("swarmrl.node").warning("retry reason='gone'")
        for handler in root.handlers:
            handler.flush()
    finally:
        for handler in list(root.handlers):
            root.removeHandler(handler)
            handler.close()
        for handler in handlers:
            root.addHandler(handler)
        root.setLevel(level)
    assert capsys.readouterr().err == ""
    assert (
        (tmp_path / "node.log").read_text().endswith("WARNING swarmrl.node retry reason='gone'\n")
    )
