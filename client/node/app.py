"""The node's terminal app (`swarmrl node run` on a terminal).

The node works in a thread of its own while the app owns the main thread. Its
events and heartbeat state reach the app as textual messages (`post_message` is
thread-safe and never blocks the node); the chain is read, and rewards claimed,
in worker threads, so a slow or failing RPC endpoint never freezes the screen.
What is shown lives in a plain :class:`NodeView`; the widgets only render it.

Keys: p pauses and resumes (the order in flight is finished and handed in
first), c claims what is claimable, q quits once the node has stopped.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, ClassVar, Protocol

from textual import on
from textual.app import App, ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Horizontal, Vertical
from textual.message import Message
from textual.screen import ModalScreen
from textual.widgets import Footer, Input, Label, Log, ProgressBar, Static
from textual_plotext import PlotextPlot

from client.node.events import Event, EventKind, describe
from client.node.view import ChainFacts, NodeView, claimable_epochs, how_to_claim
from swarmrl.chain.tokens import format_tokens

if TYPE_CHECKING:
    from client.node.loop import NodeState

log = logging.getLogger("swarmrl.node")

CHAIN_SECONDS = 15.0
LOG_LINES = 2000
CHART_TICKS = 8


class Runner(Protocol):
    """What the app drives: a :class:`client.node.loop.Node`, or a stand-in in tests."""

    @property
    def address(self) -> str: ...

    def run(self) -> None: ...

    def stop(self) -> None: ...

    def pause(self) -> None: ...

    def resume(self) -> None: ...


class Claimer(Protocol):
    """Claims the node's rewards as its provider (client.node.onchain.ProviderClaimer)."""

    @property
    def needs_password(self) -> bool: ...

    def claim(self, epochs: list[int], password: str | None) -> int: ...


ReadChain = Callable[[], ChainFacts]


class NodeEvent(Message):
    def __init__(self, event: Event) -> None:
        super().__init__()
        self.event = event


class PeersSeen(Message):
    def __init__(self, peers: int) -> None:
        super().__init__()
        self.peers = peers


class ChainRead(Message):
    def __init__(self, facts: ChainFacts | None, error: str = "") -> None:
        super().__init__()
        self.facts = facts
        self.error = error


class ClaimDone(Message):
    def __init__(self, text: str) -> None:
        super().__init__()
        self.text = text


class NodeEnded(Message):
    pass


class PasswordScreen(ModalScreen[str | None]):
    """Asks for the provider key's password; escape cancels."""

    BINDINGS: ClassVar[list[BindingType]] = [Binding("escape", "cancel", "cancel")]
    DEFAULT_CSS = """
    PasswordScreen { align: center middle; }
    PasswordScreen > Vertical {
        width: 64; height: auto; border: thick $primary; background: $surface; padding: 1 2;
    }
    """

    def compose(self) -> ComposeResult:
        with Vertical():
            yield Label("Password of the provider's key (enter claims, escape cancels)")
            yield Input(password=True, id="password")

    @on(Input.Submitted)
    def _submitted(self, event: Input.Submitted) -> None:
        self.dismiss(event.value)

    def action_cancel(self) -> None:
        self.dismiss(None)


class NodeApp(App[None]):
    TITLE = "swarmrl node"
    CSS = """
    .panel { border: round $primary; padding: 0 1; height: auto; width: 1fr; }
    #top, #middle { height: auto; }
    #chart { border: round $primary; height: 100%; min-height: 12; width: 1fr; }
    #download { display: none; }
    #log { border: round $primary; height: 1fr; min-height: 5; }
    """
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("p", "pause", "pause/resume"),
        Binding("c", "claim", "claim rewards"),
        Binding("q", "quit", "quit"),
        Binding("ctrl+c", "quit", "quit", show=False, priority=True),
    ]

    def __init__(
        self,
        runner: Runner,
        read_chain: ReadChain,
        claimer: Claimer | None = None,
        *,
        chain_seconds: float = CHAIN_SECONDS,
    ) -> None:
        super().__init__()
        self.runner = runner
        self.read_chain = read_chain
        self.claimer = claimer
        self.chain_seconds = chain_seconds
        self.view = NodeView(node=runner.address)
        self.failure: BaseException | None = None  # what ended the node, re-raised by the CLI
        self.node_thread = threading.Thread(target=self._run_node, name="swarmrl-node", daemon=True)
        self.chain_thread: threading.Thread | None = None
        self.claim_thread: threading.Thread | None = None
        self._sigterm_before: Any = signal.SIG_DFL

    # ---- listeners the node calls, from its own threads --------------------------------

    def hear(self, event: Event) -> None:
        self.post_message(NodeEvent(event))

    def hear_state(self, state: NodeState, peers: int) -> None:
        self.post_message(PeersSeen(peers))

    # ---- layout ------------------------------------------------------------------------

    def compose(self) -> ComposeResult:
        with Horizontal(id="top"):
            yield Static(id="identity", classes="panel")
            yield Static(id="rewards", classes="panel")
        with Horizontal(id="middle"):
            with Vertical(id="progress", classes="panel"):
                yield Static(id="work")
                yield ProgressBar(id="download", show_eta=False)
                yield Static(id="submissions")
            yield PlotextPlot(id="chart")
        yield Log(id="log", max_lines=LOG_LINES)
        yield Footer()

    def on_mount(self) -> None:
        titles = {
            "identity": "node",
            "rewards": "rewards",
            "progress": "work",
            "chart": "task reward of its rollouts",
            "log": "log",
        }
        for widget_id, title in titles.items():
            self.query_one(f"#{widget_id}").border_title = title
        plt = self.query_one(PlotextPlot).plt
        plt.xlabel("policy step")
        self._show()
        # A SIGTERM (a service manager, `kill`) stops the node as q does, and shows it;
        # the app's loop is where it can. Off the main thread there are no signals.
        self._sigterm_before = signal.getsignal(signal.SIGTERM)  # given back on unmount
        with contextlib.suppress(RuntimeError, NotImplementedError):
            asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, self._quit)
        self.node_thread.start()
        self.refresh_chain()
        self.set_interval(self.chain_seconds, self.refresh_chain)

    def on_unmount(self) -> None:
        # While the node hands in its last submission, SIGTERM is the caller's again.
        with contextlib.suppress(RuntimeError, NotImplementedError):
            asyncio.get_running_loop().remove_signal_handler(signal.SIGTERM)
            signal.signal(signal.SIGTERM, self._sigterm_before or signal.SIG_DFL)

    def _show(self) -> None:
        view = self.view
        self.query_one("#identity", Static).update("\n".join(view.identity_lines()))
        self.query_one("#rewards", Static).update("\n".join(view.reward_lines()))
        self.query_one("#work", Static).update("\n".join(view.work_lines()))
        self.query_one("#submissions", Static).update("\n".join(view.submission_lines()))
        bar = self.query_one("#download", ProgressBar)
        if view.download is not None:
            bar.display = True
            bar.update(total=view.download.total, progress=view.download.done)

    def _plot(self) -> None:
        chart = self.query_one(PlotextPlot)
        steps, means = self.view.reward_curve()
        chart.plt.clear_data()
        chart.plt.plot(steps, means, marker="braille")
        # Steps are whole numbers; plotext would tick 2.25, 2.5, ...
        ticks: list[float] = list(steps[:: max(1, len(steps) // CHART_TICKS)])
        chart.plt.xticks(ticks)
        chart.refresh()

    # ---- what arrives ------------------------------------------------------------------

    @on(NodeEvent)
    def _event(self, message: NodeEvent) -> None:
        event = message.event
        self.view.apply(event)
        self.query_one(Log).write_line(f"{time.strftime('%H:%M:%S')} {describe(event)}")
        if event.kind is EventKind.GENERATED:
            self._plot()
        self._show()

    @on(PeersSeen)
    def _peers(self, message: PeersSeen) -> None:
        self.view.peers = message.peers
        self._show()

    @on(ChainRead)
    def _chain_read(self, message: ChainRead) -> None:
        if message.facts is not None:
            self.view.chain = message.facts
        self.view.chain_error = message.error
        self._show()

    @on(ClaimDone)
    def _claimed(self, message: ClaimDone) -> None:
        self.view.message = message.text
        self.query_one(Log).write_line(f"{time.strftime('%H:%M:%S')} {message.text}")
        self._show()
        self.refresh_chain()

    @on(NodeEnded)
    def _ended(self, _: NodeEnded) -> None:
        self.exit()

    # ---- keys --------------------------------------------------------------------------

    def action_pause(self) -> None:
        if self.view.stopping:
            return
        if self.view.running == "running":
            self.runner.pause()
            self.view.running = "pausing"
        else:
            self.runner.resume()
            self.view.running = "running"
        self._show()

    def action_claim(self) -> None:
        claimer = self.claimer
        epochs = claimable_epochs(self.view.chain) if self.view.chain else []
        if self.claim_thread is not None and self.claim_thread.is_alive():
            self.view.message = "a claim is being sent already"
        elif claimer is None:
            self.view.message = how_to_claim(self.view.node, epochs)
        elif not epochs:
            self.view.message = "nothing is claimable yet"
        elif claimer.needs_password:

            def answered(password: str | None) -> None:
                if password is not None:  # None: the dialog was cancelled
                    self._claim(claimer, epochs, password)

            self.push_screen(PasswordScreen(), answered)
        else:
            self._claim(claimer, epochs, None)
        self._show()

    def _claim(self, claimer: Claimer, epochs: list[int], password: str | None) -> None:
        listed = ", ".join(map(str, epochs))
        self.view.message = f"claiming epochs {listed}…"
        self._show()

        def claim() -> Message:
            try:
                amount = claimer.claim(epochs, password)
            except Exception as e:
                log.warning("claim failed: %s", _sentence(e))
                return ClaimDone(f"claim failed: {_sentence(e)}")
            return ClaimDone(f"claimed {format_tokens(amount)} for epochs {listed}")

        self.claim_thread = self._in_thread("swarmrl-claim", claim)

    async def action_quit(self) -> None:
        self._quit()

    def _quit(self) -> None:
        """Stops the node, then the app once the node's thread has ended (q, SIGTERM)."""
        if not self.view.stopping:
            self.view.stopping = True
            self.runner.stop()
            self._show()
        if not self.node_thread.is_alive():
            self.exit()

    # ---- threads -----------------------------------------------------------------------

    def refresh_chain(self) -> None:
        """Reads the chain in a thread, unless the last read is still going."""
        if self.chain_thread is not None and self.chain_thread.is_alive():
            return

        def read() -> Message:
            try:
                return ChainRead(self.read_chain())
            except Exception as e:
                log.warning("reading the chain failed: %s", _sentence(e))
                return ChainRead(None, _sentence(e))

        self.chain_thread = self._in_thread("swarmrl-chain", read)

    def _in_thread(self, name: str, work: Callable[[], Message]) -> threading.Thread:
        thread = threading.Thread(target=lambda: self.post_message(work()), name=name, daemon=True)
        thread.start()
        return thread

    def _run_node(self) -> None:
        try:
            self.runner.run()
        except BaseException as e:  # handed to the CLI, which reports it once the screen is back
            self.failure = e
        finally:
            self.post_message(NodeEnded())


def _sentence(e: Exception) -> str:
    """An exception as one line: RPC failures named without web3's URLs and dumps."""
    from swarmrl.chain.errors import rpc_failure_sentence

    text = rpc_failure_sentence(e) or str(e) or type(e).__name__
    return text.splitlines()[0][:300]


def run_until_stopped(app: NodeApp) -> None:
    """Runs the app; however it ends, the node is stopped and waited for (its submission
    in flight handed in or journaled), and what ended the node is raised."""
    try:
        app.run()
    finally:
        if app.node_thread.is_alive():
            app.runner.stop()
            app.node_thread.join()
    if app.failure is not None:
        raise app.failure
