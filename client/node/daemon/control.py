"""The node daemon's control socket: how the terminal app and the `swarmrl node` commands
reach the daemon that holds the work.

A unix socket, readable and writable by the owner only: the daemon binds it with
mode 0600 before it listens, and the kernel lets no other user connect (no token
to leak). It lives in the data dir, or where that path is too long for a socket
address (108 bytes on Linux) in a folder of the owner's own under the temp dir,
named by a hash of the data dir, so every client finds the daemon of a data dir.

One JSON object a line each way. A client sends one :class:`Request`; the daemon
answers one :class:`Reply`, except to ``watch``, which it answers with a
:class:`Update` a line for as long as the client stays: first the daemon's whole
view and its last log lines, then each event. A watcher that cannot keep up is
dropped rather than ever slowing the node.
"""

from __future__ import annotations

import contextlib
import enum
import hashlib
import logging
import os
import queue
import socket
import socketserver
import stat
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, Protocol, TypeVar

from pydantic import Field, TypeAdapter, ValidationError

from client.node.events import Event
from client.node.screen.view import NodeView
from client.node.work.journal import JournalSummary
from swarmrl.files import write_atomically
from swarmrl.logs import one_line
from swarmrl.schema import Strict, error_location

log = logging.getLogger("swarmrl.node")

SOCKET_NAME = "control.sock"
# sockaddr_un's sun_path is 108 bytes on Linux (104 on macOS), with its NUL.
MAX_SOCKET_PATH = 100
MAX_LINE = 4 * 1024 * 1024  # a reply (the view, log lines) fits; a request is far less
LOG_LINES = 2000  # the daemon's memory of log lines, for `node logs` and attaching apps
WATCH_QUEUE = 1024  # updates a watcher may fall behind by before it is dropped
CONNECT_SECONDS = 5.0
IO_SECONDS = 30.0
POLL_SECONDS = 0.1  # how soon the server notices it is to close
# Connections the kernel holds for the server before it accepts them: clients arrive
# together (a status bar, a script's loop, an app attaching), and socketserver's 5 turned
# all but six of thirty away at once.
BACKLOG = socket.SOMAXCONN
RETRY_CONNECT_SECONDS = 0.05  # a full backlog is tried again this soon, until the limit
MAX_SNOOZE = 7 * 86400


class Command(enum.StrEnum):
    STATUS = "status"
    PAUSE = "pause"
    RESUME = "resume"
    SNOOZE = "snooze"  # pause for `seconds`, then resume by itself
    FINISH = "finish"  # the order in flight, then what waits to be sent, then leave and stop
    STOP = "stop"  # the order in flight, then stop (what waits stays in the journal)
    LOGS = "logs"
    WATCH = "watch"
    EPOCHS = "epochs"  # the epochs the node's receipts name (the app reads them on chain)


class Request(Strict):
    command: Command = Field(strict=False)  # the wire carries the value
    seconds: float | None = Field(default=None, gt=0, le=MAX_SNOOZE)
    lines: int = Field(default=100, ge=1, le=LOG_LINES)


class Status(Strict):
    """What `swarmrl node status` shows of a running node."""

    node: str
    pid: int
    version: str
    data_dir: str
    started_at: float
    working: bool
    reason: str  # the view's state line: "working", or why not
    waiting: list[str] = Field(default_factory=list)  # what the node waits for, if anything
    workers: int  # 0 until they started
    policy_step: int | None
    newest_step: int | None
    peers: int | None
    rollouts: int
    submitted: int
    intake_accepted: int
    intake_rejected: int
    validated_units: int
    journal: JournalSummary | None  # None: a daemon without one (tests' stand-ins)


class Reply(Strict):
    error: str = ""  # one sentence; empty when the command was carried out
    status: Status | None = None
    lines: list[str] = Field(default_factory=list)
    epochs: list[int] = Field(default_factory=list)


M = TypeVar("M", bound=Strict)
_VIEW = TypeAdapter(NodeView)
_EVENT = TypeAdapter(Event)


class End(enum.StrEnum):
    """Why a watch ends (its last update says)."""

    STOPPED = "stopped"  # the daemon ends
    BEHIND = "behind"  # the watcher fell too far behind and was dropped: watch again


class Update(Strict):
    """One line of a watch: the whole view (first), an event, the peer count, or why the
    watch ends (last)."""

    view: dict[str, Any] | None = None
    lines: list[str] = Field(default_factory=list)
    event: dict[str, Any] | None = None
    peers: int | None = None
    end: End | None = Field(default=None, strict=False)

    @classmethod
    def of_view(cls, view: NodeView, lines: list[str]) -> Update:
        return cls(view=_VIEW.dump_python(view, mode="json"), lines=lines)

    @classmethod
    def of_event(cls, event: Event) -> Update:
        return cls(event=_EVENT.dump_python(event, mode="json"))

    def node_view(self) -> NodeView | None:
        return None if self.view is None else _VIEW.validate_python(self.view)

    def node_event(self) -> Event | None:
        return None if self.event is None else _EVENT.validate_python(self.event)


class ControlError(ValueError):
    """The daemon refused a command, or could not be reached; the message says which."""


class NotRunningError(ControlError):
    """No daemon answers at the data dir's socket."""


def socket_path(data_dir: Path) -> Path:
    """Where the daemon of `data_dir` listens: in the data dir when the path fits a
    socket address, else in the owner's private folder under the temp dir."""
    data_dir = Path(data_dir).absolute()
    inside = data_dir / SOCKET_NAME
    if len(os.fsencode(inside)) <= MAX_SOCKET_PATH:
        return inside
    return _owners_folder() / f"{_name_of(data_dir)}.sock"


def note_config(config: Path, data_dir: Path) -> None:
    """Notes, in the owner's private folder, that the daemon started with `config` keeps
    `data_dir`: `node status` and the other commands then reach it while the file does
    not load (an edit half done, a file cut short)."""
    note = _config_note(config)
    _private_folder(note.parent)
    write_atomically(note, os.fsencode(Path(data_dir).absolute()))


def forget_config(config: Path, data_dir: Path) -> None:
    """Removes the note of `config` if it still names `data_dir` (another daemon may have
    been started with the same file since)."""
    if noted_data_dir(config) == Path(data_dir).absolute():
        _config_note(config).unlink(missing_ok=True)


def noted_data_dir(config: Path) -> Path | None:
    """The data dir the daemon started with `config` noted (note_config), if any."""
    try:
        return Path(os.fsdecode(_config_note(config).read_bytes()))
    except OSError:
        return None


def _config_note(config: Path) -> Path:
    return _owners_folder() / f"{_name_of(Path(config).absolute())}.config"


def _owners_folder() -> Path:
    return Path(tempfile.gettempdir()) / f"swarmrl-{os.getuid()}"


def _name_of(path: Path) -> str:
    return hashlib.sha256(os.fsencode(path)).hexdigest()[:24]


def _private_folder(folder: Path) -> None:
    """Makes `folder` (0700) or checks that the one there is the owner's and no one
    else's: a socket in another user's folder could be swapped for theirs."""
    folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    info = folder.lstat()
    if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.getuid():
        raise ControlError(f"{folder} is not a folder of this user; remove it or set TMPDIR")
    if info.st_mode & 0o077:
        os.chmod(folder, 0o700)


# ---- the daemon's side -------------------------------------------------------------


class Handler(Protocol):
    """What the server calls: the daemon (client.node.daemon.Daemon)."""

    def command(self, request: Request) -> Reply: ...

    def watch(self, updates: queue.Queue[Update | None]) -> Callable[[], None]:
        """Starts feeding `updates` (the view first, an end last, then None); returns
        what stops it."""
        ...


class ControlServer:
    """Serves the control socket in threads of its own until closed."""

    def __init__(self, path: Path, handler: Handler) -> None:
        self.path = path
        _private_folder(path.parent)
        if path.exists() or path.is_symlink():
            # The caller holds the data dir's lock, so no other daemon can be
            # listening: what is there was left by one that died.
            if _answers(path):
                raise ControlError(f"a node already listens at {path}")
            path.unlink()
        server = _Server(str(path), _Connection, bind_and_activate=False)
        server.handler = handler
        try:
            server.server_bind()
            os.chmod(path, 0o600)  # before anyone can connect: listen() comes after
            server.server_activate()
        except BaseException:
            server.server_close()
            raise
        self._server = server
        self._thread = threading.Thread(
            target=server.serve_forever,
            kwargs={"poll_interval": POLL_SECONDS},
            name="swarmrl-control",
            daemon=True,
        )
        self._thread.start()

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join()
        self.path.unlink(missing_ok=True)


class _Server(socketserver.ThreadingUnixStreamServer):
    daemon_threads = True
    request_queue_size = BACKLOG
    handler: Handler


class _Connection(socketserver.StreamRequestHandler):
    server: _Server
    # A client that sends no request, or reads no updates, frees its thread after this.
    timeout = IO_SECONDS

    def handle(self) -> None:
        try:
            line = self.rfile.readline(MAX_LINE + 1)
        except OSError:
            return
        try:
            request = _parse(Request, line)
        except ControlError as e:
            self._send(Reply(error=str(e)))
            return
        if request.command is Command.WATCH:
            self._watch()
            return
        try:
            reply = self.server.handler.command(request)
        except Exception as e:  # a command that fails says why; the daemon goes on
            log.exception("control command %s failed", request.command)
            reply = Reply(error=one_line(e))
        self._send(reply)

    def _watch(self) -> None:
        updates: queue.Queue[Update | None] = queue.Queue(WATCH_QUEUE)
        stop = self.server.handler.watch(updates)
        try:
            while (update := updates.get()) is not None:
                self._send(update)
        except OSError:
            pass  # the watcher went away
        finally:
            stop()

    def _send(self, message: Reply | Update) -> None:
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            self.wfile.write(message.model_dump_json().encode() + b"\n")
            self.wfile.flush()


def _dial(path: Path) -> socket.socket:
    """A connection to the socket at `path`, within CONNECT_SECONDS. A connect with a
    timeout on a unix socket whose backlog is full fails at once (EAGAIN) rather than
    waiting, so that is tried again until the limit: the daemon accepts soon."""
    deadline = time.monotonic() + CONNECT_SECONDS
    while True:
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.settimeout(CONNECT_SECONDS)
        try:
            s.connect(str(path))
            return s
        except BlockingIOError:
            s.close()
            if time.monotonic() >= deadline:
                raise
            time.sleep(RETRY_CONNECT_SECONDS)
        except BaseException:
            s.close()
            raise


def _answers(path: Path) -> bool:
    try:
        _dial(path).close()
    except OSError:
        return False
    return True


def _parse(model: type[M], line: bytes) -> M:
    if len(line) > MAX_LINE or not line.endswith(b"\n"):
        raise ControlError("the control message is cut short or too long")
    try:
        return model.model_validate_json(line)
    except ValidationError as e:
        first = e.errors()[0]
        if not first["loc"]:  # the whole message: not JSON, or not an object
            what = "JSON" if first["type"] == "json_invalid" else "a JSON object"
            raise ControlError(f"the control message is not {what}") from None
        where = error_location(e, "the message")
        raise ControlError(f"the control message is not valid at {where}") from None


# ---- a client's side -----------------------------------------------------------------


class ControlClient:
    """Talks to the daemon of one data dir; each call is a connection of its own."""

    def __init__(self, data_dir: Path, *, timeout: float = 60.0) -> None:
        self.data_dir = Path(data_dir)
        self.path = socket_path(self.data_dir)
        self.timeout = timeout

    def _connect(self) -> socket.socket:
        try:
            s = _dial(self.path)
        except (FileNotFoundError, ConnectionRefusedError):
            raise NotRunningError(
                f"no node runs for {self.data_dir} (`swarmrl node run` starts one)"
            ) from None
        except OSError as e:
            raise ControlError(f"cannot reach the node at {self.path}: {e.strerror}") from None
        s.settimeout(self.timeout)
        return s

    def call(self, command: Command, **fields: Any) -> Reply:
        """The daemon's reply to `command`; ControlError with its sentence if it refused."""
        request = Request(command=command, **fields)
        with self._connect() as s, s.makefile("rwb") as f:
            f.write(request.model_dump_json().encode() + b"\n")
            f.flush()
            try:
                reply = _parse(Reply, f.readline(MAX_LINE + 1))
            except (ControlError, OSError):
                raise ControlError("the node ended the connection without an answer") from None
        if reply.error:
            raise ControlError(reply.error)
        return reply

    def status(self) -> Status:
        status = self.call(Command.STATUS).status
        if status is None:
            raise ControlError("the node answered status without one")
        return status

    def epochs(self) -> list[int]:
        """The epochs the node's receipts name (the app reads the node's work on chain)."""
        return self.call(Command.EPOCHS).epochs

    def watch(self) -> Iterator[Update]:
        """The daemon's updates until it stops (the iterator then ends) or the caller
        stops reading and closes the iterator."""
        s = self._connect()
        s.settimeout(None)  # updates come when something happens
        with s, s.makefile("rwb") as f:
            f.write(Request(command=Command.WATCH).model_dump_json().encode() + b"\n")
            f.flush()
            while True:
                try:
                    line = f.readline(MAX_LINE + 1)
                except OSError:
                    return
                if not line:
                    return
                yield _parse(Update, line)

    def running(self) -> bool:
        """Whether a daemon answers for the data dir."""
        return _answers(self.path)
