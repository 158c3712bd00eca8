"""The node's terminal app, driven by textual's Pilot: a stand-in node emits real events,
the chain facts and the claimer are injected, so neither a node nor a chain is needed."""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import threading
from collections.abc import Callable

import requests
from textual.pilot import Pilot
from textual.widgets import Input, Log, ProgressBar, Static

from client.node.app import NodeApp, PasswordScreen
from client.node.events import Event, EventKind
from client.node.view import ChainFacts, EpochWork

TOKEN = 10**18
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


class StandIn:
    """A node that works until told to stop, then until the test lets its last
    submission finish."""

    address = NODE

    def __init__(self, failure: Exception | None = None) -> None:
        self.calls: list[str] = []
        self.stopping = threading.Event()
        self.finish = threading.Event()
        self.failure = failure

    def run(self) -> None:
        if self.failure is not None:
            raise self.failure
        self.stopping.wait()
        self.finish.wait()

    def stop(self) -> None:
        self.calls.append("stop")
        self.stopping.set()

    def pause(self) -> None:
        self.calls.append("pause")

    def resume(self) -> None:
        self.calls.append("resume")


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


def drive(app: NodeApp, test: Callable[[Pilot], object], runner: StandIn | None = None) -> None:
    async def main() -> None:
        try:
            async with app.run_test(size=(120, 50)) as pilot:
                await test(pilot)  # type: ignore[misc]
        finally:
            if runner is not None:
                runner.stopping.set()
                runner.finish.set()

    asyncio.run(main())


async def until(pilot: Pilot, condition: Callable[[], bool]) -> None:
    """Lets the app process what other threads posted until `condition` holds."""
    for _ in range(500):
        if condition():
            return
        await pilot.pause(0.01)
    raise AssertionError("the app never got there")


async def chain_read(pilot: Pilot, app: NodeApp) -> None:
    thread = app.chain_thread
    assert thread is not None
    thread.join()
    await until(pilot, lambda: bool(app.view.chain or app.view.chain_error))


def text(app: NodeApp, widget_id: str) -> str:
    return str(app.query_one(f"#{widget_id}", Static).render())


def test_it_renders_the_addresses_and_the_chain_facts():
    runner = StandIn()
    app = NodeApp(runner, Chain())

    async def test(pilot: Pilot) -> None:
        await chain_read(pilot, app)
        identity = text(app, "identity")
        assert f"node      {NODE}" in identity
        assert f"provider  {PROVIDER}" in identity
        assert "stake     150 (ok)" in identity
        rewards = text(app, "rewards")
        assert "claimable 0.4  (c claims)" in rewards
        assert "epoch 4  2 units, 0.2: pending — claimable in 10 min" in rewards

    drive(app, test, runner)


def test_events_update_the_screen():
    runner = StandIn()
    app = NodeApp(runner, Chain())
    events = [
        Event(EventKind.JOINED, step=1),
        Event(EventKind.WEIGHTS_PROGRESS, step=2, done=3, total=8),
        Event(EventKind.ORDER, step=1, order="abc", total=8),
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
        # From another thread, as the node's loop and heartbeat send them.
        sender = threading.Thread(target=lambda: [app.hear(e) for e in events])
        sender.start()
        sender.join()
        await until(pilot, lambda: app.view.submitted == 2 and app.view.invalid == 1)
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
        assert any("submitted digest=d1 units=8" in line for line in app.query_one(Log).lines)

        app.hear(Event(EventKind.WEIGHTS_READY, step=2))
        await until(pilot, lambda: app.query_one("#download", ProgressBar).progress == 8)

    drive(app, test, runner)


def test_p_pauses_after_the_order_in_flight_and_resumes():
    runner = StandIn()
    app = NodeApp(runner, Chain())

    async def test(pilot: Pilot) -> None:
        await pilot.press("p")
        assert runner.calls == ["pause"]
        assert text(app, "work").startswith("pausing after the order in flight")
        app.hear(Event(EventKind.PAUSED))  # the loop went idle
        await until(pilot, lambda: text(app, "work").startswith("paused"))
        await pilot.press("p")
        assert runner.calls == ["pause", "resume"]
        assert not text(app, "work").startswith("paus")

    drive(app, test, runner)


def test_c_claims_what_is_claimable_and_shows_the_amount():
    runner, chain, claimer = StandIn(), Chain(), Claimer()
    app = NodeApp(runner, chain, claimer)

    async def test(pilot: Pilot) -> None:
        await chain_read(pilot, app)
        await pilot.press("c")
        assert app.claim_thread is not None
        app.claim_thread.join()
        await until(pilot, lambda: "claimed 0.4 for epochs 3" in text(app, "rewards"))
        assert claimer.claims == [([3], None)]
        await until(pilot, lambda: chain.reads == 2)  # the chain is read again at once

    drive(app, test, runner)


def test_c_asks_for_the_password_when_it_has_none():
    runner, claimer = StandIn(), Claimer(needs_password=True)
    app = NodeApp(runner, Chain(), claimer)

    async def test(pilot: Pilot) -> None:
        await chain_read(pilot, app)
        await pilot.press("c")
        assert isinstance(app.screen, PasswordScreen)
        assert app.screen.query_one(Input).password
        await pilot.press(*"qpc!", "enter")  # the app's keys are letters of the password here
        assert app.claim_thread is not None
        app.claim_thread.join()
        assert claimer.claims == [([3], "qpc!")]
        assert runner.calls == []

        await pilot.press("c", "escape")  # cancelled: nothing is sent
        assert not isinstance(app.screen, PasswordScreen)
        assert len(claimer.claims) == 1

    drive(app, test, runner)


def test_c_without_a_provider_key_says_how_to_claim():
    runner = StandIn()
    app = NodeApp(runner, Chain())

    async def test(pilot: Pilot) -> None:
        await chain_read(pilot, app)
        await pilot.press("c")
        assert "swarmrl wallet claim <provider key>" in app.view.message
        assert f"--node {NODE} --epoch 3`" in app.view.message

    drive(app, test, runner)


def test_a_chain_failure_is_one_line_and_the_app_goes_on():
    runner = StandIn()
    app = NodeApp(runner, Chain(requests.ConnectionError("refused, with a long story")))

    async def test(pilot: Pilot) -> None:
        await chain_read(pilot, app)
        assert app.view.chain_error == (
            "the RPC endpoint could not be reached; is the URL right and the chain running?"
        )
        assert f"chain     {app.view.chain_error}" in text(app, "identity")
        assert app.return_code is None

    drive(app, test, runner)


def test_q_stops_the_node_and_exits_once_its_thread_is_done():
    runner = StandIn()
    app = NodeApp(runner, Chain())

    async def test(pilot: Pilot) -> None:
        await pilot.press("q")
        assert runner.calls == ["stop"]
        assert text(app, "work").startswith("stopping: finishing the submission in flight")
        await pilot.press("p")  # no pausing a node that is stopping
        assert runner.calls == ["stop"]
        assert app.return_code is None
        assert app.node_thread.is_alive()
        runner.finish.set()  # the submission in flight is handed in
        app.node_thread.join()
        await until(pilot, lambda: app.return_code == 0)
        assert app.failure is None

    drive(app, test, runner)


def test_sigterm_stops_the_node_as_q_does_and_shows_it():
    runner = StandIn()
    app = NodeApp(runner, Chain())
    heard = []
    before = signal.signal(signal.SIGTERM, lambda *_: heard.append("caller"))

    async def test(pilot: Pilot) -> None:
        os.kill(os.getpid(), signal.SIGTERM)
        await until(pilot, lambda: runner.calls == ["stop"])
        await pilot.pause()
        assert text(app, "work").startswith("stopping: finishing the submission in flight")
        runner.finish.set()
        app.node_thread.join()
        await until(pilot, lambda: app.return_code == 0)

    try:
        drive(app, test, runner)
        assert heard == []  # the app took it
        os.kill(os.getpid(), signal.SIGTERM)  # once the app is gone, the caller's again
        assert heard == ["caller"]
    finally:
        signal.signal(signal.SIGTERM, before)


def test_a_node_that_fails_ends_the_app_with_its_error():
    failure = ValueError("node 0x… has no provider on chain")
    app = NodeApp(StandIn(failure), Chain())

    async def test(pilot: Pilot) -> None:
        await until(pilot, lambda: app.return_code is not None)
        assert app.failure is failure

    drive(app, test)


def test_while_the_app_owns_the_screen_log_lines_go_only_to_the_file(tmp_path, capsys):
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
