"""One libp2p host per process, in its own trio thread, behind a thread-safe bridge.

py-libp2p runs only under trio, while the rest of swarmrl is threads, asyncio
and torch. So the host lives in a daemon thread that runs ``trio.run``, and
every way in and out is a method of :class:`Host` that hops threads:
``publish``, ``connect``, ``request`` and ``peers`` run on the trio thread
through ``trio.from_thread.run``; the request handlers and topic handlers that
the application registers run in worker threads (``trio.to_thread``), so a slow
handler never stalls the event loop that carries every other stream.

The host speaks TCP with Noise and yamux only (py-libp2p would otherwise also
offer secio and plaintext, which nothing here may accept), gossipsub with
strictly signed messages on an allow-list of topics, and request/response
protocols: one request frame in, response frames out, each bounded in size
and time (see :mod:`swarmrl.p2p.wire`).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence
from contextlib import AsyncExitStack, suppress
from dataclasses import dataclass
from typing import Any

import multiaddr
import trio
from libp2p import create_yamux_muxer_option, new_host
from libp2p.crypto.keys import KeyPair
from libp2p.crypto.x25519 import create_new_key_pair as new_x25519_key_pair
from libp2p.custom_types import TProtocol
from libp2p.network.config import ConnectionConfig
from libp2p.network.stream.net_stream import INetStream
from libp2p.peer.id import ID
from libp2p.peer.peerinfo import info_from_p2p_addr
from libp2p.pubsub.gossipsub import GossipSub
from libp2p.pubsub.pubsub import Pubsub
from libp2p.security.noise.transport import PROTOCOL_ID as NOISE_ID
from libp2p.security.noise.transport import Transport as NoiseTransport
from libp2p.tools.anyio_service import background_trio_service

from swarmrl.p2p import wire

log = logging.getLogger("swarmrl.p2p")

GOSSIPSUB_ID = TProtocol("/meshsub/1.1.0")
DEFAULT_LISTEN = "/ip4/127.0.0.1/tcp/0"
# A request handler runs in a worker thread; this many at once per host.
MAX_CONCURRENT_HANDLERS = 16
ERROR_KEY = "error"

Handler = Callable[[str, bytes], Sequence[bytes]]
TopicHandler = Callable[[str, bytes], None]


class RemoteError(RuntimeError):
    """The remote peer answered a request with an error sentence."""


@dataclass(frozen=True)
class _Protocol:
    handler: Handler
    request_limit: int
    timeout: float


class Host:
    """A started libp2p host; every method may be called from any thread."""

    def __init__(
        self,
        key_pair: KeyPair,
        *,
        listen: str = DEFAULT_LISTEN,
        topics: Sequence[str] = (),
        start_timeout: float = 30.0,
    ) -> None:
        self._key_pair = key_pair
        self._listen = multiaddr.Multiaddr(listen)
        self._topics = frozenset(topics)
        self._ready = threading.Event()
        self._failure: BaseException | None = None
        self._token: trio.lowlevel.TrioToken | None = None
        self._stop: trio.Event | None = None
        self._thread = threading.Thread(target=self._main, name="swarmrl-p2p", daemon=True)
        self._thread.start()
        if not self._ready.wait(start_timeout):
            raise TimeoutError(f"the libp2p host did not start within {start_timeout:.0f} s")
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
                max_connections=256, min_connections=0, low_watermark=0, high_watermark=192
            ),
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
            await stack.enter_async_context(self._host.run(listen_addrs=[self._listen]))
            await stack.enter_async_context(background_trio_service(self._pubsub))
            await stack.enter_async_context(background_trio_service(self._gossip))
            self._nursery = await stack.enter_async_context(trio.open_nursery())
            self._ready.set()
            await self._stop.wait()
            self._nursery.cancel_scope.cancel()

    async def _handle_stream(self, stream: INetStream, spec: _Protocol, name: str) -> None:
        peer = str(stream.muxed_conn.peer_id)
        try:
            with trio.fail_after(spec.timeout):
                request = await wire.read_frame(stream, spec.request_limit)
                frames = await trio.to_thread.run_sync(
                    spec.handler,
                    peer,
                    request,
                    limiter=self._handler_limit,
                    abandon_on_cancel=True,
                )
                for body in frames:
                    await wire.write_frame(stream, body)
        except wire.WireError as e:
            log.warning("rejected a %s request from %s: %s", name, peer, e)
            await _try_write_error(stream, str(e))
        except wire.Refusal as e:
            await _try_write_error(stream, str(e))
        except trio.TooSlowError:
            log.warning("a %s request from %s took over %.0f s; dropped", name, peer, spec.timeout)
        except Exception as e:  # a stream reset or a handler bug costs this stream only
            log.info("a %s request from %s failed: %r", name, peer, e)
            await _try_write_error(stream, "the request failed on the serving peer")
        finally:
            await _close_quietly(stream)

    async def _topic_loop(self, topic: str, handler: TopicHandler) -> None:
        subscription = await self._pubsub.subscribe(topic)
        own = self._host.get_id().to_bytes()
        while True:
            message = await subscription.get()
            if message.from_id == own:
                continue
            peer = ID(message.from_id).to_base58()
            try:
                await trio.to_thread.run_sync(
                    handler,
                    peer,
                    bytes(message.data),
                    limiter=self._handler_limit,
                    abandon_on_cancel=True,
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

    # ---- the bridge ------------------------------------------------------------

    def _call(self, fn: Callable[..., Any], *args: Any) -> Any:
        if self._stop is None or self._stop.is_set():
            raise RuntimeError("the libp2p host is closed")
        try:
            return trio.from_thread.run(fn, *args, trio_token=self._token)
        except (trio.Cancelled, trio.RunFinishedError):
            # The host shut down while the call was in flight; Cancelled is a
            # BaseException and would otherwise kill the calling thread.
            raise RuntimeError("the libp2p host is closed") from None

    @property
    def peer_id(self) -> str:
        return self._host.get_id().to_base58()

    @property
    def addrs(self) -> list[str]:
        """Full multiaddrs to dial this host, each ending in /p2p/<peer id>."""
        suffix = f"/p2p/{self.peer_id}"
        return [a if a.endswith(suffix) else a + suffix for a in map(str, self._host.get_addrs())]

    def connect(self, addr: str, timeout: float = 10.0) -> str:
        """Dials a full multiaddr (with /p2p/); returns the peer id."""
        try:
            info = info_from_p2p_addr(multiaddr.Multiaddr(addr))
        except Exception as e:
            raise ValueError(f"{addr!r} is not a multiaddr with a /p2p/ peer id ({e})") from None

        async def dial() -> None:
            with trio.fail_after(timeout):
                await self._host.connect(info)

        try:
            self._call(dial)
        except trio.TooSlowError:
            raise TimeoutError(f"could not reach {addr} within {timeout:.0f} s") from None
        except Exception as e:
            raise ConnectionError(f"could not connect to {addr}: {e}") from None
        return info.peer_id.to_base58()

    def peers(self) -> list[str]:
        """Peers with an open connection now."""
        return [p.to_base58() for p in self._host.get_connected_peers()]

    def handle(
        self, protocol: str, handler: Handler, *, request_limit: int, timeout: float = 10.0
    ) -> None:
        """Serves `protocol`: `handler(peer, request)` runs in a worker thread and
        returns the response frames; a WireError it raises goes back as an error."""
        spec = _Protocol(handler, request_limit, timeout)

        async def on_stream(stream: INetStream) -> None:
            await self._handle_stream(stream, spec, protocol)

        self._call(_sync_async, self._host.set_stream_handler, TProtocol(protocol), on_stream)

    def request(
        self,
        peer_id: str,
        protocol: str,
        body: bytes,
        *,
        response_limit: int,
        frames: int = 1,
        timeout: float = 10.0,
    ) -> list[bytes]:
        """Sends one request frame and reads `frames` response frames."""

        async def run() -> list[bytes]:
            with trio.fail_after(timeout):
                return await self._request(peer_id, protocol, body, response_limit, frames)

        try:
            return self._call(run)
        except trio.TooSlowError:
            raise TimeoutError(
                f"{peer_id} did not answer {protocol} within {timeout:.0f} s"
            ) from None
        except (wire.WireError, RemoteError):
            raise
        except Exception as e:
            raise ConnectionError(f"{protocol} request to {peer_id} failed: {e}") from None

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


async def _sync_async(fn: Callable[..., Any], *args: Any) -> Any:
    return fn(*args)


def error_frame(message: str) -> bytes:
    return wire.dump_json({ERROR_KEY: message})


def _raise_if_error(body: bytes) -> None:
    if body.startswith(b'{"' + ERROR_KEY.encode() + b'"'):
        try:
            message = wire.parse_error(body, ERROR_KEY)
        except wire.WireError:
            return
        raise RemoteError(message)


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
