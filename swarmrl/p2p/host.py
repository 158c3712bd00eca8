"""One libp2p host per process, in its own trio thread, behind a thread-safe bridge.

py-libp2p runs only under trio, while the rest of swarmrl is threads, asyncio
and torch. So the host lives in a daemon thread that runs ``trio.run``, and
every way in and out is a method of :class:`Host` that hops threads:
``publish``, ``connect``, ``call``, ``upload`` and ``peers`` run on the trio
thread through ``trio.from_thread.run``; the request handlers and topic handlers
that the application registers run in worker threads (``trio.to_thread``), so a
slow handler never stalls the event loop that carries every other stream.

The host speaks TCP with Noise and yamux only (py-libp2p would otherwise also
offer secio and plaintext, which nothing here may accept), gossipsub with
strictly signed messages on an allow-list of topics, and request/response
protocols, each a typed spec (:mod:`swarmrl.p2p.protocol`): one request frame
in, response frames out, each bounded in size and time (``serve`` / ``call``).

Uploads (``serve_upload`` / ``upload``) carry bodies too big for one frame:
a header frame, body frames of bounded size, and an empty frame that ends the
body. The serving side may refuse from the header before reading any of the
body, spools the body chunk by chunk into a file (never into memory), and
checks each chunk's length against the body limit before reading the chunk.
A host given an upload pacer (:mod:`swarmrl.p2p.pacing`: a node's upload cap,
shared with the weights it serves) sends its upload bodies through it, first in
line.
"""

from __future__ import annotations

import logging
import os
import tempfile
import threading
from collections.abc import Awaitable, Callable, Sequence
from contextlib import AsyncExitStack, suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, Protocol, TypeVar, TypeVarTuple, runtime_checkable

import multiaddr
import trio
from libp2p import create_yamux_muxer_option, new_host
from libp2p.abc import INetStream
from libp2p.crypto.keys import KeyPair
from libp2p.crypto.x25519 import create_new_key_pair as new_x25519_key_pair
from libp2p.custom_types import TProtocol
from libp2p.network.config import ConnectionConfig
from libp2p.network.exceptions import SwarmDialAllFailedError
from libp2p.peer.id import ID
from libp2p.peer.peerinfo import info_from_p2p_addr
from libp2p.pubsub.gossipsub import GossipSub
from libp2p.pubsub.pubsub import Pubsub
from libp2p.rcmgr import ResourceLimits, ResourceManager, new_resource_manager
from libp2p.rcmgr.connection_limits import ConnectionLimits
from libp2p.security.noise.transport import PROTOCOL_ID as NOISE_ID
from libp2p.security.noise.transport import Transport as NoiseTransport
from libp2p.tools.anyio_service import background_trio_service

from swarmrl.p2p import ports, wire
from swarmrl.p2p.pacing import Pacer
from swarmrl.p2p.protocol import (
    Admit,
    RequestResponse,
    Served,
    ServedUpload,
    Upload,
    UploadHandler,
)

log = logging.getLogger("swarmrl.p2p")

GOSSIPSUB_ID = TProtocol("/meshsub/1.1.0")
DEFAULT_LISTEN = "/ip4/127.0.0.1/tcp/0"
# Open connections a host keeps unless told otherwise: a node's few dozen peers and
# room to spare (see Host).
MAX_CONNECTIONS = 256
# A request handler runs in a worker thread; this many at once per host.
MAX_CONCURRENT_HANDLERS = 16
ERROR_KEY = "error"
# Spooled upload bodies are named so, in the spool directory of their protocol.
SPOOL_PREFIX = "upload-"
SPOOL_SUFFIX = ".part"

TopicHandler = Callable[[str, bytes], None]
T = TypeVar("T")
Ts = TypeVarTuple("Ts")
Req = TypeVar("Req")
Resp = TypeVar("Resp")
H = TypeVar("H")


@runtime_checkable
class _Addressed(Protocol):
    """A connection that tells the remote end's (host, port)."""

    def get_remote_address(self) -> tuple[str, int] | None: ...


class RemoteError(RuntimeError):
    """The remote peer answered a request with an error sentence."""


class _LocalReadError(Exception):
    """The local file of an upload could not be read; the message is the reason."""


@dataclass(frozen=True)
class _Spooled:
    """An upload protocol served here, with the spool its bodies go to."""

    served: ServedUpload[Any, Any]
    spool_dir: Path
    # Bounds the memory (chunk buffers) and spool disk (body_limit each) that
    # bodies in flight can hold at once; more are refused, not queued.
    slots: trio.Semaphore
    # The peers with an upload of this protocol in flight (trio thread only).
    uploading: set[str] = field(default_factory=set)


class Host:
    """A started libp2p host; every method may be called from any thread."""

    def __init__(
        self,
        key_pair: KeyPair,
        *,
        listen: str | None = DEFAULT_LISTEN,
        topics: Sequence[str] = (),
        start_timeout: float = 30.0,
        max_connections: int = MAX_CONNECTIONS,
        upload_pacer: Pacer | None = None,
    ) -> None:
        """`max_connections`: open connections this host keeps, in and out; past three
        quarters of it libp2p closes the least useful ones (a node keeps a few dozen
        peers; the orchestrator, whom every node dials, is given room for all of them).
        `upload_pacer`: what the bodies of this host's uploads go through (None: no cap)."""
        if listen is not None:
            ports.check_free(listen)  # before libp2p, which would share the port or go on without
        self._key_pair = key_pair
        # The multiaddr asked for; a data server beside this host binds the same IP.
        self.listen = listen
        # None: listen nowhere, as a node behind NAT; it still dials out, and peers
        # reach it over the connections it opened.
        self._listen = [] if listen is None else [multiaddr.Multiaddr(listen)]
        self._topics = frozenset(topics)
        self._max_connections = max_connections
        self._upload_pacer = upload_pacer
        self._ready = threading.Event()
        self._failure: BaseException | None = None
        self._token: trio.lowlevel.TrioToken | None = None
        self._stop: trio.Event | None = None
        self._thread = threading.Thread(target=self._main, name="swarmrl-p2p", daemon=True)
        self._thread.start()
        if not self._ready.wait(start_timeout):
            raise TimeoutError(f"the libp2p host did not start within {start_timeout:.0f} s")
        if isinstance(self._failure, ports.ListenError):
            raise self._failure
        if self._failure is not None:
            raise OSError(f"the libp2p host could not listen on {listen}: {self._failure}")

    # ---- the trio side -------------------------------------------------------

    def _main(self) -> None:
        try:
            trio.run(self._serve)
        except BaseException as e:  # reported to the starting thread, or logged
            if not self._ready.is_set():
                self._failure = e
                self._ready.set()
            elif self._stop is not None and self._stop.is_set():
                # py-libp2p's services can trip over their own cancellation on the
                # way down; once closing was asked for, that is not news.
                log.debug("the libp2p host raised while closing: %r", e)
            else:
                log.exception("the libp2p host stopped with an error")

    async def _serve(self) -> None:
        sec = {
            NOISE_ID: NoiseTransport(
                self._key_pair, noise_privkey=new_x25519_key_pair().private_key
            )
        }
        self._host = new_host(
            key_pair=self._key_pair,
            sec_opt=sec,
            muxer_opt=create_yamux_muxer_option(),
            # The swarm chooses its peers itself (bootstrap, peer exchange); left to
            # its defaults, libp2p would keep dialling every address it has heard of.
            connection_config=ConnectionConfig(
                max_connections=self._max_connections,
                min_connections=0,
                low_watermark=0,
                high_watermark=self._max_connections * 3 // 4,
            ),
            resource_manager=_resource_manager(self._max_connections),
        )
        self._gossip = GossipSub(
            protocols=[GOSSIPSUB_ID],
            degree=6,
            degree_low=4,
            degree_high=12,
            heartbeat_initial_delay=0.1,
            heartbeat_interval=1,
            # Eclipse protection wants mesh peers on several IPs; a swarm on one
            # machine (the demo, the tests) has one. Trust comes from signatures.
            eclipse_protection_enabled=False,
        )
        self._pubsub = Pubsub(
            self._host, self._gossip, strict_signing=True, allowed_topics=self._topics or None
        )
        self._stop = trio.Event()
        self._token = trio.lowlevel.current_trio_token()
        self._handler_limit = trio.CapacityLimiter(MAX_CONCURRENT_HANDLERS)
        async with AsyncExitStack() as stack:
            await stack.enter_async_context(self._host.run(listen_addrs=self._listen))
            await stack.enter_async_context(background_trio_service(self._pubsub))
            await stack.enter_async_context(background_trio_service(self._gossip))
            self._nursery = await stack.enter_async_context(trio.open_nursery())
            # Read once here: the listeners are fixed from now on, and asked later
            # from another thread they may already be closed (a bad file descriptor).
            suffix = f"/p2p/{self.peer_id}"
            self._addrs = [
                a if a.endswith(suffix) else a + suffix for a in map(str, self._host.get_addrs())
            ]
            self._check_listening()
            self._ready.set()
            await self._stop.wait()
            self._nursery.cancel_scope.cancel()

    def _check_listening(self) -> None:
        """A host asked to listen listens, and alone on its port: py-libp2p goes on
        listening nowhere when its bind fails, and shares the port with any process of
        the same user (SO_REUSEPORT); see swarmrl.p2p.ports."""
        if not self._listen:
            return
        listen = str(self._listen[0])
        if not self._addrs:
            ports.check_free(listen)  # the reason, if the port is still refused
            raise ports.ListenError(f"cannot listen on {listen}")
        for addr in self._addrs:
            port = int(multiaddr.Multiaddr(addr).value_for_protocol("tcp"))
            ports.check_sole_listener(listen, port)

    async def _handle_stream(self, stream: INetStream, served: Served[Any, Any]) -> None:
        peer = str(stream.muxed_conn.peer_id)
        spec, name = served.spec, served.spec.id
        try:
            with trio.fail_after(spec.deadline):
                served.admit_peer(peer)  # here, not in a worker: a flood costs no thread
                request = await wire.read_frame(stream, spec.request_limit)
                frames = await self._in_worker(
                    served.answer,
                    peer,
                    request,
                )
                for body in frames:
                    await wire.write_frame(stream, body)
        except wire.WireError as e:
            log.warning("rejected a %s request from %s: %s", name, peer, e)
            await _try_write_error(stream, str(e))
        except wire.Refusal as e:
            await _try_write_error(stream, str(e))
        except trio.TooSlowError:
            log.warning("a %s request from %s took over %.0f s; dropped", name, peer, spec.deadline)
        except Exception as e:  # a stream reset or a handler bug costs this stream only
            log.info("a %s request from %s failed: %r", name, peer, e)
            await _try_write_error(stream, "the request failed on the serving peer")
        finally:
            await _close_quietly(stream)

    async def _handle_upload(self, stream: INetStream, spooling: _Spooled) -> None:
        peer = str(stream.muxed_conn.peer_id)
        served, spec = spooling.served, spooling.served.spec
        name = spec.id
        began = trio.current_time()
        spooled: Path | None = None
        slot = False
        # Set by the worker that runs receive: from then on that worker, not this
        # side, deletes the spooled file, so an abandoned receive never finds it gone.
        claimed = threading.Event()
        if peer in spooling.uploading:
            # One at a time per peer: a peer's parallel streams would each hold a slot.
            await _try_write_error(stream, "this peer has an upload in progress; one at a time")
            await _close_quietly(stream)
            return
        spooling.uploading.add(peer)
        try:
            with trio.fail_after(spec.deadline):
                await self._in_worker(served.admit_peer, peer)
                head = await _paced(wire.read_frame(stream, spec.header_limit), began, spec, 0)
                header, frames = await self._in_worker(served.check, peer, head)
                if frames is None:  # not answered from the header alone: take the body
                    # A slot only now: what holds one is a body the handler wants.
                    try:
                        spooling.slots.acquire_nowait()
                    except trio.WouldBlock:
                        log.info("refused a %s upload from %s: all upload slots are busy",
                                 name, peer)  # fmt: skip
                        raise wire.Refusal("the serving peer is busy with other uploads") from None
                    slot = True
                    spooled = _new_spool_file(spooling.spool_dir)
                    await _spool_body(stream, spec, spooled, began)
                    frames = await self._in_worker(
                        _receive_then_clean,
                        served,
                        peer,
                        header,
                        spooled,
                        claimed,
                    )
                for body in frames:
                    await wire.write_frame(stream, body)
        except wire.WireError as e:
            log.warning("rejected a %s upload from %s: %s", name, peer, e)
            await _try_write_error(stream, str(e))
        except wire.Refusal as e:
            await _try_write_error(stream, str(e))
        except trio.TooSlowError:
            log.warning("a %s upload from %s took over %.0f s; dropped", name, peer, spec.deadline)
            await _try_write_error(stream, f"the upload took over {spec.deadline:.0f} s")
        except Exception as e:  # a stream reset or a handler bug costs this stream only
            log.info("a %s upload from %s failed: %r", name, peer, e)
            await _try_write_error(stream, "the upload failed on the serving peer")
        finally:
            if spooled is not None and not claimed.is_set():
                spooled.unlink(missing_ok=True)
            if slot:
                spooling.slots.release()
            spooling.uploading.discard(peer)
            await _close_quietly(stream)

    async def _in_worker(self, fn: Callable[[*Ts], T], *args: *Ts) -> T:
        """`fn(*args)` in a worker thread, at most MAX_CONCURRENT_HANDLERS at once; a
        cancelled caller abandons it (the thread finishes on its own)."""
        # The trio stubs of trio-typing (which libp2p depends on) shadow trio's own
        # annotations, and predate abandon_on_cancel (trio 0.23).
        return await trio.to_thread.run_sync(  # type: ignore[call-arg]
            fn, *args, limiter=self._handler_limit, abandon_on_cancel=True
        )

    async def _topic_loop(self, topic: str, handler: TopicHandler) -> None:
        subscription = await self._pubsub.subscribe(topic)
        own = self._host.get_id().to_bytes()
        while True:
            message = await subscription.get()
            if message.from_id == own:
                continue
            peer = ID(message.from_id).to_base58()
            try:
                await self._in_worker(
                    handler,
                    peer,
                    bytes(message.data),
                )
            except wire.WireError as e:
                log.warning("ignored a message on %s from %s: %s", topic, peer, e)
            except Exception:
                log.exception("the handler of topic %s failed", topic)

    async def _request(
        self, peer_id: str, protocol: str, body: bytes, response_limit: int, frames: int
    ) -> list[bytes]:
        stream = await self._host.new_stream(ID.from_base58(peer_id), [TProtocol(protocol)])
        try:
            await wire.write_frame(stream, body)
            replies = [await wire.read_frame(stream, response_limit)]
            _raise_if_error(replies[0])
            for _ in range(frames - 1):
                replies.append(await wire.read_frame(stream, response_limit))
            return replies
        finally:
            await _close_quietly(stream)

    async def _upload(
        self, peer_id: str, protocol: str, header: bytes, body: IO[bytes], chunk: int, limit: int
    ) -> bytes:
        stream = await self._host.new_stream(ID.from_base58(peer_id), [TProtocol(protocol)])
        try:
            sender = _Sender(stream, header, body, chunk, self._upload_pacer)
            async with trio.open_nursery() as nursery:
                nursery.start_soon(sender.run, nursery.cancel_scope)
                # The reply is read while the body is still going out: a peer that
                # refuses or answers from the header alone stops reading, and its
                # reply must reach the caller rather than the broken pipe that follows.
                reply = await _read_reply(stream, limit)
                if isinstance(reply, Exception):
                    nursery.cancel_scope.cancel()  # the stream is broken already
                else:
                    # An answer or a refusal: the sender may still be inside a write
                    # (cancelling it there breaks the connection for every stream on
                    # it: a refused upload used to fail another one in flight on the
                    # same connection); a body the peer no longer reads stops after
                    # the grace.
                    nursery.cancel_scope.deadline = trio.current_time() + _SENDER_GRACE
            if sender.read_failure is not None:
                raise _LocalReadError(sender.read_failure.strerror or str(sender.read_failure))
            if isinstance(reply, Exception):
                raise reply
            _raise_if_error(reply)
            return reply
        finally:
            await _close_quietly(stream)

    # ---- the bridge ------------------------------------------------------------

    def _call(self, fn: Callable[[*Ts], Awaitable[T]], *args: *Ts) -> T:
        if self._stop is None or self._stop.is_set():
            raise RuntimeError("the libp2p host is closed")
        try:
            return trio.from_thread.run(fn, *args, trio_token=self._token)
        except (trio.Cancelled, trio.RunFinishedError):
            # The host shut down while the call was in flight; Cancelled is a
            # BaseException and would otherwise kill the calling thread.
            raise RuntimeError("the libp2p host is closed") from None
        except BaseExceptionGroup as group:
            # The same shutdown, met inside one of py-libp2p's nurseries (a dial, say),
            # arrives as a group holding Cancelled beside whatever else failed.
            if group.subgroup(trio.Cancelled) is None:
                raise
            raise RuntimeError("the libp2p host is closed") from None

    @property
    def peer_id(self) -> str:
        return self._host.get_id().to_base58()

    @property
    def addrs(self) -> list[str]:
        """Full multiaddrs to dial this host, each ending in /p2p/<peer id>."""
        return list(self._addrs)

    def connect(self, addr: str, timeout: float = 10.0) -> str:
        """Dials a full multiaddr (with /p2p/); returns the peer id."""
        try:
            info = info_from_p2p_addr(multiaddr.Multiaddr(addr))
        except Exception as e:
            raise ValueError(f"{addr!r} is not a multiaddr with a /p2p/ peer id ({e})") from None

        peer = info.peer_id.to_base58()

        async def dial() -> None:
            # An explicit connect means "try now": py-libp2p would refuse a peer whose
            # addresses all failed in the last minute, which keeps a node away from an
            # orchestrator that restarted seconds ago. Callers bound their own retries.
            network = self._host.get_network()
            if hasattr(network, "unblock_peer"):
                network.unblock_peer(info.peer_id)
            with trio.fail_after(timeout):
                await self._host.connect(info)

        try:
            self._call(dial)
        except trio.TooSlowError:
            raise TimeoutError(f"could not reach {addr} within {timeout:.0f} s") from None
        except Exception as e:
            raise ConnectionError(f"could not connect to {addr}: {_failure(e, peer)}") from None
        return peer

    def peers(self) -> list[str]:
        """Peers with an open connection now."""
        return [p.to_base58() for p in self._host.get_connected_peers()]

    def remote_hosts(self, peer_id: str) -> set[str]:
        """The IP addresses `peer_id`'s open connections come from (empty when none)."""

        def hosts() -> set[str]:
            found: set[str] = set()
            for conn in self._host.get_network().get_connections(ID.from_base58(peer_id)):
                muxed = conn.muxed_conn
                # libp2p's muxer interface does not declare it; the muxers (yamux) have it.
                remote = muxed.get_remote_address() if isinstance(muxed, _Addressed) else None
                if remote is not None:
                    found.add(remote[0])
            return found

        return self._call(_sync_async, hosts)

    def serve(
        self,
        spec: RequestResponse[Req, Resp],
        handler: Callable[[str, Req], Resp],
        *,
        admit: Admit | None = None,
    ) -> None:
        """Serves `spec`: `handler(peer, request)` runs in a worker thread on the
        decoded request and returns the response; a WireError or Refusal it raises
        (or the decoder does) goes back as the error reply. `admit(peer)`, if
        given, runs first, on the event loop (so it must be quick), and may refuse the
        peer before its request is read."""
        served = Served(spec, handler, admit)

        async def on_stream(stream: INetStream) -> None:
            await self._handle_stream(stream, served)

        self._call(_sync_async, self._host.set_stream_handler, TProtocol(spec.id), on_stream)

    def serve_upload(
        self,
        spec: Upload[H, Resp],
        handler: UploadHandler[H, Resp],
        *,
        spool_dir: Path,
        admit: Admit | None = None,
        max_uploads: int = 8,
    ) -> None:
        """Serves uploads of `spec` (see :class:`~swarmrl.p2p.protocol.UploadHandler`):
        each body spooled into a new file in `spool_dir`, the whole upload, receive
        included, within the spec's deadline, and at the spec's pace (``Upload.due``).
        `admit(peer)`, if given, runs before the header is read. A peer has one upload
        in flight at a time, and at most `max_uploads` bodies are taken at once (a
        slot is held only by a body the handler wants); more are refused with an
        error reply, not queued."""
        if max_uploads < 1:
            raise ValueError(f"max_uploads must be at least 1, got {max_uploads}")
        spool_dir.mkdir(parents=True, exist_ok=True)
        spooling = _Spooled(
            ServedUpload(spec, handler, admit), spool_dir, trio.Semaphore(max_uploads)
        )

        async def on_stream(stream: INetStream) -> None:
            await self._handle_upload(stream, spooling)

        self._call(_sync_async, self._host.set_stream_handler, TProtocol(spec.id), on_stream)

    def upload(self, spec: Upload[H, Resp], peer_id: str, header: H, path: Path) -> Resp:
        """Sends `header`, then the file at `path` in frames of the spec's chunk size
        read from disk one at a time, then the empty frame; returns the response.
        A reply sent before the body was through (the peer judged the header alone)
        ends the upload there; an error reply raises RemoteError with the peer's
        sentence."""
        (head,) = spec.header.encode(header)
        try:
            body = path.open("rb")
        except OSError as e:
            raise OSError(f"cannot read {path}: {e.strerror or e}") from None

        async def run() -> bytes:
            with trio.fail_after(spec.deadline):
                return await self._upload(
                    peer_id, spec.id, head, body, spec.chunk_limit, spec.response_limit
                )

        try:
            with body:
                reply = self._call(run)
        except trio.TooSlowError:
            raise TimeoutError(
                f"{peer_id} did not take the {spec.id} upload within {spec.deadline:.0f} s"
            ) from None
        except (wire.WireError, RemoteError):
            raise
        except _LocalReadError as e:
            raise OSError(f"cannot read {path}: {e}") from None
        except Exception as e:
            raise ConnectionError(
                f"{spec.id} upload to {peer_id} failed: {_failure(e, peer_id)}"
            ) from None
        return spec.response.decode([reply])

    def call(self, spec: RequestResponse[Req, Resp], peer_id: str, request: Req) -> Resp:
        """Sends `request` and returns the response, decoded in this thread (a big
        one never stalls the host's event loop)."""
        (body,) = spec.request.encode(request)
        wait = spec.wait

        async def run() -> list[bytes]:
            with trio.fail_after(wait):
                return await self._request(
                    peer_id, spec.id, body, spec.response_limit, spec.response.frames
                )

        try:
            frames = self._call(run)
        except trio.TooSlowError:
            raise TimeoutError(f"{peer_id} did not answer {spec.id} within {wait:.0f} s") from None
        except (wire.WireError, RemoteError):
            raise
        except Exception as e:
            raise ConnectionError(
                f"{spec.id} request to {peer_id} failed: {_failure(e, peer_id)}"
            ) from None
        return spec.response.decode(frames)

    def subscribe(self, topic: str, handler: TopicHandler) -> None:
        """Calls `handler(peer, data)` in a worker thread for each message that
        another peer publishes on `topic`; one message at a time per topic."""
        if topic not in self._topics:
            raise ValueError(f"topic {topic!r} is not one this host was started with")

        async def start() -> None:
            self._nursery.start_soon(self._topic_loop, topic, handler)

        self._call(start)

    def publish(self, topic: str, data: bytes) -> None:
        self._call(self._pubsub.publish, topic, data)

    def close(self) -> None:
        """Stops the host; streams in flight are cancelled. Idempotent."""
        if self._stop is not None and not self._stop.is_set() and self._thread.is_alive():
            with suppress(trio.RunFinishedError):
                trio.from_thread.run_sync(self._stop.set, trio_token=self._token)
        self._thread.join(timeout=10)

    def __enter__(self) -> Host:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _failure(error: Exception, peer_id: str) -> str:
    """py-libp2p's reason for a failed dial or stream, short: the caller names the peer
    already, and the dial's own words name it again and say only that it failed."""
    if isinstance(error, SwarmDialAllFailedError):
        return "no connection could be opened"
    return str(error).replace(peer_id, "the peer") or type(error).__name__


def _resource_manager(max_connections: int) -> ResourceManager:
    """py-libp2p's resource manager with its connection limits at `max_connections`:
    the one `new_host` makes by default admits 256 established inbound connections
    whatever ConnectionConfig says, and refused every node past the 255th that dialled
    an orchestrator (``swarmrl bench load --nodes 1000``)."""
    return new_resource_manager(
        limits=ResourceLimits(max_connections=max_connections, max_streams=16 * max_connections),
        connection_limits=ConnectionLimits(
            # Nodes that start together dial together: let a tenth wait in handshakes.
            max_pending_inbound=max(64, max_connections // 10),
            max_pending_outbound=64,
            max_established_inbound=max_connections,
            max_established_outbound=max_connections,
            max_established_per_peer=8,
            max_established_total=max_connections,
        ),
    )


async def _sync_async(fn: Callable[[*Ts], T], *args: *Ts) -> T:
    return fn(*args)


def error_frame(message: str) -> bytes:
    return wire.dump_json({ERROR_KEY: message})


def _error_message(body: bytes) -> str | None:
    """The sentence of an error reply; None for any other frame."""
    if not body.startswith(b'{"' + ERROR_KEY.encode() + b'"'):
        return None
    try:
        return wire.parse_error(body, ERROR_KEY)
    except wire.WireError:
        return None


def _raise_if_error(body: bytes) -> None:
    message = _error_message(body)
    if message is not None:
        raise RemoteError(message)


async def _read_reply(stream: INetStream, limit: int) -> bytes | Exception:
    """The reply frame, or why none came; cancellation still propagates."""
    try:
        return await wire.read_frame(stream, limit)
    except Exception as e:
        return e


def _new_spool_file(spool_dir: Path) -> Path:
    fd, name = tempfile.mkstemp(prefix=SPOOL_PREFIX, suffix=SPOOL_SUFFIX, dir=spool_dir)
    os.close(fd)
    return Path(name)


async def _paced(read: Awaitable[T], began: float, spec: Upload[Any, Any], received: int) -> T:
    """`read`, cut with a WireError unless it ends by the time the spec's pace allows for
    `received` body bytes (the header: `received` 0) in an upload that began at `began`."""
    with trio.move_on_at(began + spec.due(received)) as scope:
        return await read
    assert scope.cancelled_caught  # the only way here: the read did not end in time
    if received == 0:
        raise wire.WireError(f"no upload header within {spec.grace:.0f} s")
    raise wire.WireError(f"the upload came slower than {spec.min_rate / 1024:.0f} KiB/s; cut off")


async def _spool_body(stream: INetStream, spec: Upload[Any, Any], path: Path, began: float) -> None:
    """Appends body frames to `path` until the empty frame, refusing each frame by
    its length prefix (chunk limit, then running total) before reading it, and the
    upload as soon as its bytes come slower than the spec's pace."""
    total = 0
    async with await trio.open_file(path, "wb") as out:
        while length := await _paced(wire.read_length(stream), began, spec, total):
            if length > spec.chunk_limit:
                raise wire.WireError(
                    f"a {length}-byte upload chunk is over the {spec.chunk_limit}-byte limit"
                )
            if total + length > spec.body_limit:
                raise wire.WireError(f"the upload is over the {spec.body_limit}-byte limit")
            await out.write(
                await _paced(wire.read_exactly(stream, length), began, spec, total + length)
            )
            total += length
        await out.flush()
        await trio.to_thread.run_sync(os.fsync, out.fileno())


def _receive_then_clean(
    served: ServedUpload[H, Any], peer: str, header: H, path: Path, claimed: threading.Event
) -> list[bytes]:
    claimed.set()
    try:
        return served.receive(peer, header, path)
    finally:
        path.unlink(missing_ok=True)


# Seconds an upload's sender has to finish its writes once the peer has answered.
_SENDER_GRACE = 10.0


class _Sender:
    """Writes an upload's frames; a failed write ends it quietly (the reply, read
    alongside, says why), a failed read of the local file cancels the upload."""

    def __init__(
        self, stream: INetStream, header: bytes, body: IO[bytes], chunk: int, pacer: Pacer | None
    ) -> None:
        self._stream = stream
        self._header = header
        self._body = trio.wrap_file(body)
        self._chunk = chunk
        self._pacer = pacer
        self.read_failure: OSError | None = None

    async def run(self, upload: trio.CancelScope) -> None:
        try:
            await wire.write_frame(self._stream, self._header)
            while True:
                chunk = self._chunk if self._pacer is None else self._pacer.chunk(self._chunk)
                try:
                    data = await self._body.read(chunk)
                except OSError as e:
                    self.read_failure = e
                    upload.cancel()
                    return
                await wire.write_frame(self._stream, data)
                if not data:
                    return
                if self._pacer is not None:
                    # First: the receiver cuts off an upload slower than its minimum rate.
                    await self._pacer.pace_trio(len(data), first=True)
        except Exception as e:
            log.debug("an upload stopped sending: %r", e)


async def _try_write_error(stream: INetStream, message: str) -> None:
    try:
        with trio.move_on_after(2):
            await wire.write_frame(stream, error_frame(message))
    except Exception:
        pass  # the peer is gone or misbehaving; nothing more to tell it


async def _close_quietly(stream: INetStream) -> None:
    try:
        with trio.move_on_after(2):
            await stream.close()
    except Exception:
        pass


def quiet_libp2p_logs() -> None:
    """py-libp2p logs every failed dial and rate-limit decision at warning level or
    above; for a person watching a node only swarmrl's own lines say what matters."""
    for name in ("libp2p", "multiaddr", "async_service"):
        logging.getLogger(name).setLevel(logging.CRITICAL)
