"""Request-response protocols as typed specs, one per protocol (rust-libp2p's
request-response ``Codec`` is the model).

A :class:`RequestResponse` is everything both sides of a protocol agree on: its
id, how a request and a response travel (a :class:`Codec` each), the largest
request and response frames, and the deadline. A peer serves it with
``Host.serve(spec, handler)``, where the handler takes the decoded request and
returns the response, and asks with ``Host.call(spec, peer, request)``; the host
takes the framing, the limits, the deadline and the error replies from the spec,
so no call site repeats them. An :class:`Upload` is the same for a request too
big for one frame: a header, then a body streamed from a file and spooled into
one, then one response (or, where the header alone settles it, the response at
once and no body).

What a peer sends is decoded on the serving side in a worker thread, after the
serving peer has admitted the sender (a rate limit refuses a flood before any
of it is parsed); what a peer answers is decoded in the caller's thread. Either
way a decoder refuses anything but its message with one WireError sentence.
:class:`Served` and :class:`ServedUpload` are that serving side without the
network, which the host runs in its worker threads; :class:`Caller` and
:class:`Server` are what the node's session and the orchestrator's intake need
of a host.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, Generic, Protocol, TypeVar

from pydantic import BaseModel

from swarmrl.p2p import wire
from swarmrl.sizes import KiB, MiB

T = TypeVar("T")
M = TypeVar("M", bound=BaseModel)
Req = TypeVar("Req")
Resp = TypeVar("Resp")
H = TypeVar("H")
H_contra = TypeVar("H_contra", contravariant=True)
Resp_co = TypeVar("Resp_co", covariant=True)

# Refuses a peer before anything it sent is read: raises wire.Refusal, or returns. A
# request-response protocol's runs on the host's event loop, so it must be quick (a
# rate limit); an upload's runs in a worker thread and may read a database.
Admit = Callable[[str], None]


class Codec(ABC, Generic[T]):
    """How one message travels: as `frames` frames, each read and written whole."""

    frames: ClassVar[int] = 1

    @abstractmethod
    def encode(self, message: T) -> list[bytes]:
        """The message's frames, `frames` of them."""

    @abstractmethod
    def decode(self, frames: Sequence[bytes]) -> T:
        """The message in `frames` (untrusted bytes, `frames` of them), or WireError."""


@dataclass(frozen=True)
class Json(Codec[M]):
    """A message as one frame of compact JSON, parsed strictly (see :mod:`wire`)."""

    model: type[M]

    def encode(self, message: M) -> list[bytes]:
        return [wire.dump(message)]

    def decode(self, frames: Sequence[bytes]) -> M:
        (body,) = frames
        return wire.parse(self.model, body)


def _positive(**values: float) -> None:
    for key, value in values.items():
        if value < 1:
            raise ValueError(f"{key} must be at least 1, got {value}")


def _one_frame(**codecs: Codec[Any]) -> None:
    for key, codec in codecs.items():
        if codec.frames != 1:
            raise ValueError(f"a {key} travels as one frame, not {codec.frames}")


@dataclass(frozen=True)
class RequestResponse(Generic[Req, Resp]):
    """One request frame in, `response.frames` frames out."""

    id: str  # /swarmrl/<name>/<version>, see wire.protocol_id
    request: Codec[Req]
    response: Codec[Resp]
    request_limit: int  # bytes of the request frame
    response_limit: int  # bytes of each response frame
    # Seconds the serving side gives one exchange (reading the request, handling
    # it, writing the response), and what a caller waits unless `call_timeout`.
    deadline: float
    # What a caller waits where that is not the deadline: shorter for a poll that
    # skips a slow peer, longer where the serving side's own work is itself timed.
    call_timeout: float | None = None

    def __post_init__(self) -> None:
        _positive(request_limit=self.request_limit, response_limit=self.response_limit)
        _one_frame(request=self.request)

    @property
    def wait(self) -> float:
        """How long a caller waits for the whole answer."""
        return self.deadline if self.call_timeout is None else self.call_timeout


@dataclass(frozen=True)
class Served(Generic[Req, Resp]):
    """A request-response protocol as this peer serves it."""

    spec: RequestResponse[Req, Resp]
    handler: Callable[[str, Req], Resp]
    admit: Admit | None = None

    def admit_peer(self, peer: str) -> None:
        """Refuses `peer` (wire.Refusal) before its request is read, if `admit` says. The
        host asks on its event loop, so a flood is refused without a thread's hop: an
        `admit` here must be quick and never block (a rate limit)."""
        if self.admit is not None:
            self.admit(peer)

    def answer(self, peer: str, body: bytes) -> list[bytes]:
        """The response frames to one request frame from `peer` (admitted already):
        decoded, handled, encoded. A WireError or Refusal raised on the way is the error
        reply."""
        request = self.spec.request.decode([body])
        return self.spec.response.encode(self.handler(peer, request))


@dataclass(frozen=True)
class Upload(Generic[H, Resp]):
    """A header frame, body frames of at most `chunk_limit` bytes up to `body_limit`
    in all, an empty frame that ends the body; then one response frame."""

    id: str
    header: Codec[H]
    response: Codec[Resp]
    header_limit: int
    body_limit: int
    response_limit: int
    # Seconds the whole upload may take, on both sides: header, body and response.
    deadline: float
    # The largest body frame the serving side reads, and the size the sender cuts.
    chunk_limit: int = MiB
    # The serving side waits `grace` seconds for the header, and for the body's bytes no
    # longer than `min_rate` bytes a second after that: a peer that trickles holds its
    # upload slot for seconds, not for the whole deadline.
    grace: float = 10.0
    min_rate: int = 64 * KiB

    def due(self, received: int) -> float:
        """Seconds after the upload began by which its first `received` body bytes
        must have arrived."""
        return self.grace + received / self.min_rate

    def __post_init__(self) -> None:
        _positive(
            header_limit=self.header_limit,
            body_limit=self.body_limit,
            response_limit=self.response_limit,
            chunk_limit=self.chunk_limit,
            grace=self.grace,
            min_rate=self.min_rate,
        )
        _one_frame(header=self.header, response=self.response)


class UploadHandler(Protocol[H_contra, Resp_co]):
    """Serves one upload protocol. Both calls run in worker threads, like request
    handlers; a WireError or Refusal they raise goes back as the error reply, any
    other exception costs that upload only (the peer hears that it failed)."""

    def check(self, peer: str, header: H_contra) -> Resp_co | None:
        """Judges the upload from its header alone, before any body byte is read:
        refuses it by raising WireError or Refusal, answers it at once by returning
        the response (the body is then never read), or accepts it by returning None."""

    def receive(self, peer: str, header: H_contra, path: Path) -> Resp_co:
        """Takes the complete body, spooled to `path` (flushed and fsynced), and
        returns the response. To keep the body, move `path` away (a rename
        within the spool directory's file system); whatever is left at `path`
        is deleted once this returns or raises."""


@dataclass(frozen=True)
class ServedUpload(Generic[H, Resp]):
    """An upload protocol as this peer serves it."""

    spec: Upload[H, Resp]
    handler: UploadHandler[H, Resp]
    admit: Admit | None = None

    def admit_peer(self, peer: str) -> None:
        """Refuses `peer` (wire.Refusal) before its header is even read, if `admit` says."""
        if self.admit is not None:
            self.admit(peer)

    def check(self, peer: str, body: bytes) -> tuple[H, list[bytes] | None]:
        """The header frame from `peer` (admitted already), decoded and accepted by the
        handler; with it the response frame if the handler answered from the header alone."""
        header = self.spec.header.decode([body])
        answer = self.handler.check(peer, header)
        return header, None if answer is None else self.spec.response.encode(answer)

    def receive(self, peer: str, header: H, path: Path) -> list[bytes]:
        """The response frame to the body spooled at `path`."""
        return self.spec.response.encode(self.handler.receive(peer, header, path))


class Caller(Protocol):
    """What asks other peers: a Host, or whatever stands in for one."""

    @property
    def peer_id(self) -> str: ...

    def call(self, spec: RequestResponse[Req, Resp], peer_id: str, request: Req) -> Resp: ...

    def upload(self, spec: Upload[H, Resp], peer_id: str, header: H, path: Path) -> Resp: ...


class Server(Protocol):
    """What serves other peers: a Host, or whatever stands in for one."""

    def serve(
        self,
        spec: RequestResponse[Req, Resp],
        handler: Callable[[str, Req], Resp],
        *,
        admit: Admit | None = None,
    ) -> None: ...

    def serve_upload(
        self,
        spec: Upload[H, Resp],
        handler: UploadHandler[H, Resp],
        *,
        spool_dir: Path,
        admit: Admit | None = None,
        max_uploads: int = 8,
    ) -> None: ...
