"""The node daemon: the one process that holds the node's work, and what it answers on
its control socket (client.node.daemon.control).

The work loop (client.node.work.loop.Node) runs in the daemon's main thread; the
terminal app and the `swarmrl node` commands are clients that come and go
without touching it. The daemon keeps its own :class:`NodeView` of the node's
events, so a client that attaches late sees what one attached from the start
would, and its last log lines; it owns the holds (pause, snooze) and turns them
into the node's pause and resume, so the reason shown is the daemon's, whoever
asks.
"""

from __future__ import annotations

import logging
import os
import queue
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager, suppress
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from client.node.daemon.control import (
    LOG_LINES,
    Command,
    ControlServer,
    End,
    Reply,
    Request,
    Status,
    Update,
    forget_config,
    note_config,
    socket_path,
)
from client.node.events import Event, EventKind
from client.node.machine.holds import Hold, Holds
from client.node.screen.onchain import work_epochs
from client.node.screen.view import NodeView
from swarmrl.logs import FORMAT, UtcFormatter, one_line

if TYPE_CHECKING:
    from client.node.daemon.reload import SettingsFile
    from client.node.settings import NodeSettings
    from client.node.work.journal import Journal
    from client.node.work.loop import NodeState

log = logging.getLogger("swarmrl.node")

TICK_SECONDS = 1.0  # how soon a snooze ends after its time
JUDGE_SECONDS = 5.0  # how often the machine's conditions are looked at


class Runner(Protocol):
    """What the daemon drives: a :class:`client.node.work.loop.Node`, or a stand-in in tests."""

    @property
    def address(self) -> str: ...

    def run(self) -> None: ...

    def stop(self) -> None: ...

    def finish(self) -> None: ...

    def pause(self) -> None: ...

    def resume(self) -> None: ...

    def waiting(self) -> list[str]:
        """What it waits for now, one line each (its workers' requests in flight)."""
        ...

    def apply(self, settings: NodeSettings) -> None:
        """Takes settings changed while it runs (client.node.daemon.reload: the live keys)."""
        ...


class Judge(Protocol):
    """Something of the machine that holds the node while it lasts
    (client.node.machine.conditions.Conditions: when to run)."""

    @property
    def owns(self) -> frozenset[Hold]:
        """The holds it sets, and clears when they no longer hold."""
        ...

    def holds(self, now: datetime) -> dict[Hold, str]:
        """The holds in force at the local time `now`, each with its detail."""
        ...

    def apply(self, settings: NodeSettings) -> None:
        """Judges by `settings` from now on."""
        ...


class Daemon:
    def __init__(
        self,
        runner: Runner,
        data_dir: Path,
        *,
        journal: Journal | None = None,
        settings_file: SettingsFile | None = None,
        judges: Sequence[Judge] = (),
        clock: Callable[[], float] = time.time,
    ) -> None:
        from swarmrl import __version__

        self.runner = runner
        self.data_dir = Path(data_dir)
        self.journal = journal
        self.settings_file = settings_file
        self.judges = judges
        self.clock = clock
        self._judged_at: float | None = None
        self.version = __version__
        self.started_at = clock()
        self.view = NodeView(node=runner.address)
        self.lines: deque[str] = deque(maxlen=LOG_LINES)
        self.holds = Holds()
        # Events arrive from the loop's threads, commands from the socket's: one lock
        # keeps the view, the holds and the watchers consistent.
        self._lock = threading.RLock()
        self._watchers: set[queue.Queue[Update | None]] = set()
        self._ended = threading.Event()

    # ---- what the node tells -------------------------------------------------------

    def hear(self, event: Event) -> None:
        with self._lock:
            self.view.apply(event)
            self._send(Update.of_event(event))
            if event.kind is EventKind.FAILING:  # held until the owner resumes
                self.holds.set(Hold.FAILING, detail=event.reason)
                self._apply()
            elif event.kind is EventKind.NO_ROOM:  # held until the limits see room again
                self.holds.set(Hold.DISK_FULL, detail=event.reason)
                self._apply()

    def hear_state(self, state: NodeState, peers: int) -> None:
        with self._lock:
            self.view.peers = peers
            self._send(Update(peers=peers))

    def hear_line(self, line: str) -> None:
        with self._lock:
            self.lines.append(line)
            self._send(Update(lines=[line]))

    def _send(self, update: Update) -> None:
        for updates in list(self._watchers):
            try:
                updates.put_nowait(update)
            except queue.Full:
                # Too slow to follow: dropped (it attaches again), never waited for.
                self._watchers.discard(updates)
                _close(updates, End.BEHIND)

    # ---- the control socket's commands ----------------------------------------------

    def command(self, request: Request) -> Reply:
        c = request.command
        if c is Command.STATUS:
            return Reply(status=self.status())
        if c is Command.LOGS:
            with self._lock:
                return Reply(lines=list(self.lines)[-request.lines :])
        if c is Command.EPOCHS:
            receipts = self.journal.receipts() if self.journal is not None else []
            return Reply(epochs=sorted(work_epochs(receipts)))
        if c is Command.PAUSE:
            self.hold(Hold.PAUSED)
        elif c is Command.SNOOZE:
            if request.seconds is None:
                return Reply(error="snooze needs a duration")
            self.hold(Hold.SNOOZED, self.clock() + request.seconds)
        elif c is Command.RESUME:
            self.release(Hold.PAUSED, Hold.SNOOZED, Hold.FAILING)
        elif c is Command.FINISH:
            self.finish()
        elif c is Command.STOP:
            self.stop()
        else:  # WATCH is the server's, never a command
            return Reply(error=f"{c} is not a command")
        return Reply(status=self.status())

    def watch(self, updates: queue.Queue[Update | None]) -> Callable[[], None]:
        with self._lock:
            updates.put_nowait(Update.of_view(self.view, list(self.lines)))
            if self._ended.is_set():
                _close(updates, End.STOPPED)
            else:
                self._watchers.add(updates)

        def stop() -> None:
            with self._lock:
                self._watchers.discard(updates)

        return stop

    def status(self) -> Status:
        journal = None if self.journal is None else self.journal.summary()
        with self._lock:
            v = self.view
            return Status(
                node=v.node,
                pid=os.getpid(),
                version=self.version,
                data_dir=str(self.data_dir),
                started_at=self.started_at,
                working=v.working,
                reason=v.state_line(),
                waiting=self.runner.waiting(),
                workers=v.workers,
                policy_step=v.step,
                newest_step=v.newest,
                peers=v.peers,
                rollouts=v.rollouts,
                submitted=v.submitted,
                intake_accepted=v.intake_accepted,
                intake_rejected=v.intake_rejected,
                validated_units=v.validated_units,
                journal=journal,
            )

    # ---- holds and endings ------------------------------------------------------------

    def hold(self, hold: Hold, until: float | None = None) -> None:
        with self._lock:
            self.holds.set(hold, until)
            self._apply()

    def release(self, *holds: Hold) -> None:
        with self._lock:
            self.holds.clear(*holds)
            self._apply()

    def _apply(self) -> None:
        """The node paused while anything holds it; the reason told when it changes."""
        if self.holds:
            self.runner.pause()
        else:
            self.runner.resume()
        reason = self.holds.reason()
        if reason != self.view.held:  # the view took the last reason told
            self.hear(Event(EventKind.HELD, reason=reason))

    def tick(self) -> None:
        """Once a second: node.toml read again if it changed; holds whose time is over
        end; every few seconds the machine judged again."""
        if self.settings_file is not None and (new := self.settings_file.changed()):
            self.runner.apply(new)
            for judge in self.judges:
                judge.apply(new)
            self._judged_at = None  # new rules: judged now
        now = self.clock()
        judged = self._judged_at is None or now - self._judged_at >= JUDGE_SECONDS
        found: list[tuple[Judge, dict[Hold, str]]] = []
        if judged:
            self._judged_at = now
            local = datetime.fromtimestamp(now).astimezone()
            found = [(judge, judge.holds(local)) for judge in self.judges]
        with self._lock:
            changed = self.holds.expire(now)
            for judge, held in found:
                for hold in judge.owns:
                    if hold in held:
                        changed |= self.holds.set(hold, detail=held[hold])
                    elif hold in self.holds:
                        self.holds.clear(hold)
                        changed = True
            if changed:
                self._apply()

    def stop(self) -> None:
        self._end(self.runner.stop, EventKind.STOPPING)

    def finish(self) -> None:
        self._end(self.runner.finish, EventKind.FINISHING)

    def _end(self, tell: Callable[[], None], kind: EventKind) -> None:
        tell()
        with self._lock:
            if self.view.stopping != kind.value and not self.view.stopped:
                self.hear(Event(kind))

    # ---- running --------------------------------------------------------------------

    @contextmanager
    def serving(self) -> Iterator[None]:
        """The control socket, the holds' clock and the log lines, for the block."""
        server = ControlServer(socket_path(self.data_dir), self)
        config = None if self.settings_file is None else self.settings_file.path
        if config is not None:
            note_config(config, self.data_dir)
        handler = _Lines(self.hear_line)
        logging.getLogger().addHandler(handler)
        ticker = threading.Thread(target=self._tick, name="swarmrl-holds", daemon=True)
        ticker.start()
        try:
            yield
        finally:
            self._ended.set()
            logging.getLogger().removeHandler(handler)
            with self._lock:
                for updates in self._watchers:
                    _close(updates, End.STOPPED)
                self._watchers.clear()
            server.close()
            ticker.join()
            if config is not None:
                forget_config(config, self.data_dir)

    def _tick(self) -> None:
        while not self._ended.wait(TICK_SECONDS):
            self.tick()

    def run(self) -> None:
        """Serves the socket while the node works, until it stops. What ended it is
        logged before the socket closes, so an attached app shows it."""
        with self.serving():
            try:
                self.runner.run()
            except Exception as e:
                log.error("the node stopped: %s", one_line(e))
                raise


def _close(updates: queue.Queue[Update | None], end: End) -> None:
    """Ends a watcher's stream with why: its queue takes the end even when full (the
    oldest updates make room)."""
    for last in (Update(end=end), None):
        while True:
            try:
                updates.put_nowait(last)
                break
            except queue.Full:
                with suppress(queue.Empty):
                    updates.get_nowait()


class _Lines(logging.Handler):
    """The daemon's log lines as its log file has them, for `node logs` and the app."""

    def __init__(self, hear: Callable[[str], None]) -> None:
        super().__init__(logging.INFO)
        self.setFormatter(UtcFormatter(FORMAT))
        self._hear = hear

    def emit(self, record: logging.LogRecord) -> None:
        try:
            self._hear(self.format(record))
        except Exception:
            self.handleError(record)
