"""The node's terminal app (`swarmrl node attach`, and `swarmrl node run` on a terminal).

The app is a client of the node's daemon (client.node.daemon.runner), which holds the
work: it attaches to the daemon's control socket (client.node.daemon.control), shows
what the daemon has heard so far and then each event and log line as it comes,
and sends the keys' commands. q (or ctrl+c, or a SIGTERM) detaches: the app
exits and the node keeps working; `swarmrl node attach` shows it again.

Keys: p pauses after the order in flight, or resumes what holds the node (a
pause or a snooze); z snoozes for an hour; f finishes (the order in flight and
what waits to be sent, then the node leaves the run and stops) and x stops (the
order in flight first), each once confirmed; c claims what is claimable; q
detaches.

Nothing the app does blocks its screen: the daemon's updates are read, its
commands sent, the chain read and rewards claimed in threads, whose answers reach
the app as textual messages (`post_message` is thread-safe). What is shown lives
in a plain :class:`NodeView`; the widgets only render it.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any, ClassVar, Protocol

from textual import on
from textual.app import App, ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Horizontal, Vertical
from textual.message import Message
from textual.screen import ModalScreen
from textual.timer import Timer
from textual.widgets import Footer, Input, Label, Log, ProgressBar, Static
from textual_plotext import PlotextPlot

from client.node.daemon.control import LOG_LINES, Command, ControlError, End, Reply, Update
from client.node.events import Event, EventKind
from client.node.screen.view import ChainFacts, NodeView, claimable_epochs, how_to_claim
from swarmrl.chain.tokens import format_tokens
from swarmrl.logs import one_line

CHAIN_SECONDS = 15.0
CHART_TICKS = 8
SNOOZE_SECONDS = 3600.0  # z: BOINC's snooze, an hour

ATTACHING = "attaching to the node's daemon…"
ENDED = "the node's daemon ended; its log says why; q quits"
STOPPED = "the node's daemon stopped; q quits"
FINISH_QUESTION = (
    "Finish: hand in the order in flight and what waits, leave the run, then stop? y/n"
)
STOP_QUESTION = "Stop the node? It hands in the order in flight first; y/n"

_DAEMON_KEYS = frozenset({"pause", "snooze", "finish", "stop"})


class Control(Protocol):
    """What the app uses of the daemon's control socket: a
    :class:`client.node.daemon.control.ControlClient`."""

    def call(self, command: Command, **fields: Any) -> Reply: ...

    def watch(self) -> Iterator[Update]: ...


class Claimer(Protocol):
    """Claims the node's rewards as its provider (client.node.screen.onchain.ProviderClaimer)."""

    @property
    def needs_password(self) -> bool: ...

    def claim(self, epochs: list[int], password: str | None) -> int: ...


ReadChain = Callable[[], ChainFacts]


class Attached(Message):
    """The daemon's first update: its view of the node and its last log lines."""

    def __init__(self, view: NodeView, lines: list[str]) -> None:
        super().__init__()
        self.view = view
        self.lines = lines


class NodeEvent(Message):
    def __init__(self, event: Event) -> None:
        super().__init__()
        self.event = event


class LogLines(Message):
    def __init__(self, lines: list[str]) -> None:
        super().__init__()
        self.lines = lines


class PeersSeen(Message):
    def __init__(self, peers: int) -> None:
        super().__init__()
        self.peers = peers


class DaemonEnded(Message):
    """The watch ended: the daemon stopped or is gone (error: why it could not be read)."""

    def __init__(self, error: str = "") -> None:
        super().__init__()
        self.error = error


class CommandDone(Message):
    def __init__(self, command: Command, error: str = "") -> None:
        super().__init__()
        self.command = command
        self.error = error


class ChainRead(Message):
    def __init__(self, facts: ChainFacts | None, error: str = "") -> None:
        super().__init__()
        self.facts = facts
        self.error = error


class ClaimDone(Message):
    def __init__(self, text: str) -> None:
        super().__init__()
        self.text = text


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


class ConfirmScreen(ModalScreen[bool]):
    """A yes/no question: y answers yes, n or escape no."""

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("y", "answer(True)", "yes"),
        Binding("n", "answer(False)", "no"),
        Binding("escape", "answer(False)", "no", show=False),
    ]
    DEFAULT_CSS = """
    ConfirmScreen { align: center middle; }
    ConfirmScreen > Vertical {
        width: 64; height: auto; border: thick $primary; background: $surface; padding: 1 2;
    }
    """

    def __init__(self, question: str) -> None:
        super().__init__()
        self.question = question

    def compose(self) -> ComposeResult:
        with Vertical():
            yield Label(self.question, id="question")

    def action_answer(self, yes: bool) -> None:
        self.dismiss(yes)


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
        Binding("z", "snooze", "snooze 1h"),
        Binding("f", "finish", "finish"),
        Binding("x", "stop", "stop"),
        Binding("c", "claim", "claim rewards"),
        Binding("q", "detach", "detach (the node goes on)"),
        Binding("ctrl+c", "detach", "detach", show=False, priority=True),
    ]

    def __init__(
        self,
        control: Control,
        node_address: str,
        read_chain: ReadChain,
        claimer: Claimer | None = None,
        *,
        chain_seconds: float = CHAIN_SECONDS,
    ) -> None:
        super().__init__()
        self.control = control
        self.read_chain = read_chain
        self.claimer = claimer
        self.chain_seconds = chain_seconds
        self.view = NodeView(node=node_address)
        self.attached = False
        # "", or the line that replaces the reason once the daemon is gone.
        self.ended = ""
        # Why the daemon ended when nobody asked it to (the CLI says it once the
        # screen is back); "" when it did not, or was stopped.
        self.failure = ""
        self.leaving = False  # the user asked the daemon to stop or finish from here
        self._refused = ""  # the daemon's last refusal, shown until a command succeeds
        self.watch_thread = threading.Thread(target=self._watch, name="swarmrl-watch", daemon=True)
        self.chain_thread: threading.Thread | None = None
        self.claim_thread: threading.Thread | None = None
        self.command_thread: threading.Thread | None = None
        self._chain_timer: Timer | None = None
        self._detached = threading.Event()
        self._sigterm_before: Any = signal.SIG_DFL

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
        # A SIGTERM (a service manager, `kill`) detaches as q does; the app's loop is
        # where it can. Off the main thread there are no signals.
        self._sigterm_before = signal.getsignal(signal.SIGTERM)  # given back on unmount
        with contextlib.suppress(RuntimeError, NotImplementedError):
            asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, self._detach)
        self.watch_thread.start()
        self.refresh_chain()
        self._chain_timer = self.set_interval(self.chain_seconds, self.refresh_chain)

    def on_unmount(self) -> None:
        self._detached.set()  # the watch thread stops reading at the daemon's next update
        with contextlib.suppress(RuntimeError, NotImplementedError):
            asyncio.get_running_loop().remove_signal_handler(signal.SIGTERM)
            signal.signal(signal.SIGTERM, self._sigterm_before or signal.SIG_DFL)

    def _show(self) -> None:
        if not self.is_running:  # shutting down: what still arrives has no widget left
            return
        view = self.view
        work = view.work_lines()
        work[0] = self.ended or (work[0] if self.attached else ATTACHING)
        self.query_one("#identity", Static).update("\n".join(view.identity_lines()))
        self.query_one("#rewards", Static).update("\n".join(view.reward_lines()))
        self.query_one("#work", Static).update("\n".join(work))
        self.query_one("#submissions", Static).update("\n".join(view.submission_lines()))
        bar = self.query_one("#download", ProgressBar)
        if view.download is not None:
            bar.display = True
            bar.update(total=view.download.total, progress=view.download.done)
        self.refresh_bindings()  # the footer shows what the keys do now

    def _plot(self) -> None:
        if not self.is_running:
            return
        chart = self.query_one(PlotextPlot)
        steps, means = self.view.reward_curve()
        chart.plt.clear_data()
        chart.plt.plot(steps, means, marker="braille")
        # Steps are whole numbers; plotext would tick 2.25, 2.5, ...
        ticks: list[float] = list(steps[:: max(1, len(steps) // CHART_TICKS)])
        chart.plt.xticks(ticks)
        chart.refresh()

    def _write_log(self, lines: list[str]) -> None:
        if self.is_running:
            self.query_one(Log).write_lines(lines)

    # ---- what arrives ------------------------------------------------------------------

    @on(Attached)
    def _attached(self, message: Attached) -> None:
        # The daemon's view is the node's; the chain, and the answers to keys, are ours.
        view, mine = message.view, self.view
        view.chain, view.chain_error, view.message = mine.chain, mine.chain_error, mine.message
        self.view = view
        self.attached = True
        self._write_log(message.lines)
        self._plot()
        self._show()

    @on(NodeEvent)
    def _event(self, message: NodeEvent) -> None:
        self.view.apply(message.event)
        if message.event.kind is EventKind.GENERATED:
            self._plot()
        self._show()

    @on(LogLines)
    def _lines(self, message: LogLines) -> None:
        self._write_log(message.lines)

    @on(PeersSeen)
    def _peers(self, message: PeersSeen) -> None:
        self.view.peers = message.peers
        self._show()

    @on(DaemonEnded)
    def _ended(self, message: DaemonEnded) -> None:
        if self.leaving:  # what the user asked for here: nothing more to show
            self.exit()
            return
        if message.error:
            self.ended = self.failure = message.error
            self.ended += "; q quits"
        elif self.view.stopping or self.view.stopped:  # stopped from elsewhere
            self.ended = STOPPED
        else:
            self.ended = ENDED
            self.failure = "the node's daemon ended; its log says why"
        if self._chain_timer is not None:  # the node's epochs came from the daemon
            self._chain_timer.stop()
        self._show()

    @on(CommandDone)
    def _command_done(self, message: CommandDone) -> None:
        if message.error:
            if message.command in (Command.STOP, Command.FINISH):
                self.leaving = False  # it was not told: its ending is news again
            self.view.message = self._refused = message.error
        elif self.view.message == self._refused:  # a refusal before is past
            self.view.message = self._refused = ""
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
        self._write_log([f"{time.strftime('%H:%M:%S')} {message.text}"])
        self._show()
        self.refresh_chain()

    # ---- keys --------------------------------------------------------------------------

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        """The daemon's keys while there is a daemon to tell; pause and snooze not while
        it stops."""
        if action not in _DAEMON_KEYS:
            return True
        if self.ended:
            return False
        return not (action in ("pause", "snooze") and self.view.stopping)

    def action_pause(self) -> None:
        self._command(Command.RESUME if self.view.held else Command.PAUSE)

    def action_snooze(self) -> None:
        self._command(Command.SNOOZE, seconds=SNOOZE_SECONDS)

    def action_finish(self) -> None:
        self._confirm(FINISH_QUESTION, Command.FINISH)

    def action_stop(self) -> None:
        self._confirm(STOP_QUESTION, Command.STOP)

    def _confirm(self, question: str, command: Command) -> None:
        def answered(yes: bool | None) -> None:
            if yes:
                # Before the command: the daemon may end before its reply is read.
                self.leaving = True
                self._command(command)

        self.push_screen(ConfirmScreen(question), answered)

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
                return ClaimDone(f"claim failed: {_sentence(e)}")
            return ClaimDone(f"claimed {format_tokens(amount)} for epochs {listed}")

        self.claim_thread = self._in_thread("swarmrl-claim", claim)

    async def action_detach(self) -> None:
        self._detach()

    def _detach(self) -> None:
        """Leaves the node to its daemon (q, ctrl+c, SIGTERM): only the app ends."""
        self.exit()

    # ---- threads -----------------------------------------------------------------------

    def _command(self, command: Command, **fields: Any) -> None:
        """Sends `command` to the daemon in a thread; a refusal is shown. What it did is
        shown when the daemon tells its watchers."""

        def send() -> Message:
            try:
                self.control.call(command, **fields)
            except ControlError as e:
                return CommandDone(command, str(e))
            return CommandDone(command)

        self.command_thread = self._in_thread(f"swarmrl-{command}", send)

    def _watch(self) -> None:
        """Follows the daemon until it ends or the app is gone (the watch thread). A
        daemon that dropped this app for falling behind says so: the app attaches again,
        and the new first update brings the view up to date."""
        error = ""
        try:
            while self._follow():
                pass
        except Exception as e:  # no daemon to attach to, or what it sent is not an update
            error = _sentence(e)
        if not self._detached.is_set():
            self.post_message(DaemonEnded(error))

    def _follow(self) -> bool:
        """One watch, until it ends; whether to watch again."""
        updates = self.control.watch()
        try:
            for update in updates:
                if self._detached.is_set():
                    return False
                if update.end is not None:
                    return update.end == End.BEHIND
                self._heard(update)
        finally:
            close = getattr(updates, "close", None)
            if close is not None:
                close()
        return False

    def _heard(self, update: Update) -> None:
        view = update.node_view()
        if view is not None:
            self.post_message(Attached(view, update.lines))
            return
        event = update.node_event()
        if event is not None:
            self.post_message(NodeEvent(event))
        if update.lines:
            self.post_message(LogLines(update.lines))
        if update.peers is not None:
            self.post_message(PeersSeen(update.peers))

    def refresh_chain(self) -> None:
        """Reads the chain in a thread, unless the last read is still going."""
        if self.chain_thread is not None and self.chain_thread.is_alive():
            return

        def read() -> Message:
            try:
                return ChainRead(self.read_chain())
            except Exception as e:
                return ChainRead(None, _sentence(e))

        self.chain_thread = self._in_thread("swarmrl-chain", read)

    def _in_thread(self, name: str, work: Callable[[], Message]) -> threading.Thread:
        thread = threading.Thread(target=lambda: self.post_message(work()), name=name, daemon=True)
        thread.start()
        return thread


def _sentence(e: Exception) -> str:
    """An exception as one line: RPC failures named without web3's URLs and dumps."""
    from swarmrl.chain.errors import rpc_failure_sentence

    return one_line(e, rpc_failure_sentence(e))
