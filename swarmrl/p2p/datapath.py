"""The bulk path: shard bytes over plain TCP, outside the libp2p stream stack.

py-libp2p moves about 110 MB/s on one Noise + yamux stream; plain loopback TCP
from Python moves GB/s. Shard bytes need no secrecy and no stream security:
their integrity comes from the signed manifest and the per-shard BLAKE3 hashes,
checked before anything is stored. So peers learn each other's data endpoint
over libp2p (in the signed, peer-authenticated adverts of
:mod:`swarmrl.p2p.swarm`), and then move bytes here.

One request, one answer, many per connection:

    request  = b"SRL1" || manifest hash (32 bytes) || shard index (u32, big endian)
    response = status (u8) || length (u64, big endian) || length bytes

Status 0 carries the shard; the others carry no bytes and say why not. A
probe (``b"SRLP"`` || 32-byte nonce || 0) is how a peer dials this endpoint back
(:mod:`swarmrl.p2p.dialback`): status 0 and no bytes if the server expected that
nonce. The server sends with ``os.sendfile`` from the checkpoint file (no copy through
Python), one thread per connection, each with idle and send deadlines, and a
cap on connections: an idle or slow client holds only its own thread, never
another transfer. The client reads straight into a reusable buffer.
"""

from __future__ import annotations

import contextlib
import logging
import os
import select
import socket
import struct
import threading
from collections.abc import Callable
from dataclasses import dataclass

from swarmrl.p2p.store import Version

log = logging.getLogger("swarmrl.p2p")

MAGIC = b"SRL1"
PROBE_MAGIC = b"SRLP"
NONCE_BYTES = 32
_REQUEST = struct.Struct("!4s32sI")
_RESPONSE = struct.Struct("!BQ")
OK, UNKNOWN_VERSION, NOT_HELD, BAD_REQUEST, BUSY = range(5)
STATUS_TEXT = {
    UNKNOWN_VERSION: "does not hold that checkpoint",
    NOT_HELD: "does not hold that shard yet",
    BAD_REQUEST: "could not read the request",
    BUSY: "is serving its maximum number of connections",
}
DEFAULT_MAX_CONNECTIONS = 64
IDLE_TIMEOUT = 30.0
IO_TIMEOUT = 15.0


class DataPathError(ConnectionError):
    """The transfer failed; the peer may simply be gone or slow."""


class MisbehavingPeerError(DataPathError):
    """The peer answered something no honest peer sends (wrong length, bad status)."""


class ShardUnavailableError(DataPathError):
    """The peer is honest but does not have that shard (or is busy)."""

    def __init__(self, status: int) -> None:
        super().__init__(f"the peer {STATUS_TEXT.get(status, 'refused')}")
        self.status = status


@dataclass(frozen=True)
class Endpoint:
    host: str
    port: int

    def __str__(self) -> str:
        return f"{self.host}:{self.port}"

    @classmethod
    def parse(cls, text: str) -> Endpoint:
        host, sep, port = text.rpartition(":")
        if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise ValueError(f"{text!r} is not a host:port data endpoint")
        return cls(host, int(port))


class ShardServer:
    """Serves the shards that `lookup(manifest_hash)` says this peer holds."""

    def __init__(
        self,
        lookup: Callable[[str], Version | None],
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        max_connections: int = DEFAULT_MAX_CONNECTIONS,
        idle_timeout: float = IDLE_TIMEOUT,
        io_timeout: float = IO_TIMEOUT,
    ) -> None:
        self._lookup = lookup
        self._idle_timeout = idle_timeout
        self._io_timeout = io_timeout
        self._slots = threading.BoundedSemaphore(max_connections)
        self._listener = socket.create_server((host, port), backlog=128)
        self.endpoint = Endpoint(host, self._listener.getsockname()[1])
        self.bytes_served = 0
        self.shards_served = 0
        self._closed = False
        self._conns: set[socket.socket] = set()
        self._probes: dict[bytes, threading.Event] = {}
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._accept_loop, name="swarmrl-data", daemon=True)
        self._thread.start()

    def _accept_loop(self) -> None:
        while not self._closed:
            try:
                conn, _ = self._listener.accept()
            except OSError:
                return  # closed
            if not self._slots.acquire(blocking=False):
                _send_quietly(conn, _RESPONSE.pack(BUSY, 0))
                conn.close()
                continue
            with self._lock:
                self._conns.add(conn)
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        try:
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            while not self._closed:
                conn.settimeout(self._idle_timeout)
                request = _recv_request(conn)
                if request is None:
                    return
                conn.settimeout(self._io_timeout)
                magic, mhash, index = _REQUEST.unpack(request)
                if magic == PROBE_MAGIC:
                    self._answer_probe(conn, mhash)
                    return
                if magic != MAGIC:
                    conn.sendall(_RESPONSE.pack(BAD_REQUEST, 0))
                    return
                version = self._lookup(mhash.hex())
                if version is None:
                    conn.sendall(_RESPONSE.pack(UNKNOWN_VERSION, 0))
                elif not version.holds(index):
                    conn.sendall(_RESPONSE.pack(NOT_HELD, 0))
                else:
                    self._send_shard(conn, version, index)
        except (OSError, DataPathError) as e:
            log.debug("data connection closed: %s", e)
        finally:
            with self._lock:
                self._conns.discard(conn)
            conn.close()
            self._slots.release()

    def expect_probe(self, nonce: bytes) -> threading.Event:
        """Arms this server for one probe carrying `nonce`; the event is set when it
        arrives. Only the probes armed here are answered, so a dial-back proves
        that this very server was reached."""
        if len(nonce) != NONCE_BYTES:
            raise ValueError(f"a probe nonce is {NONCE_BYTES} bytes, not {len(nonce)}")
        arrived = threading.Event()
        with self._lock:
            self._probes[nonce] = arrived
        return arrived

    def forget_probe(self, nonce: bytes) -> None:
        with self._lock:
            self._probes.pop(nonce, None)

    def _answer_probe(self, conn: socket.socket, nonce: bytes) -> None:
        with self._lock:
            arrived = self._probes.pop(nonce, None)
        if arrived is None:
            conn.sendall(_RESPONSE.pack(UNKNOWN_VERSION, 0))
            return
        arrived.set()
        conn.sendall(_RESPONSE.pack(OK, 0))

    def _send_shard(self, conn: socket.socket, version: Version, index: int) -> None:
        fd, offset, length = version.locate(index)
        if fd < 0:
            raise DataPathError("the version was closed")
        conn.sendall(_RESPONSE.pack(OK, length))
        # A socket with a timeout is non-blocking underneath, so sendfile can stop
        # short with EAGAIN: wait for room, up to the deadline, and go on.
        poller = select.poll()
        poller.register(conn, select.POLLOUT)
        sent = 0
        while sent < length:
            try:
                n = os.sendfile(conn.fileno(), fd, offset + sent, length - sent)
            except BlockingIOError:
                if not poller.poll(self._io_timeout * 1000):
                    raise DataPathError("the client stopped reading") from None
                continue
            if n == 0:
                raise DataPathError("the checkpoint file ended early")
            sent += n
        with self._lock:
            self.bytes_served += length
            self.shards_served += 1

    def close(self) -> None:
        self._closed = True
        # close() alone does not wake a thread blocked in accept() on Linux; shutdown does.
        with contextlib.suppress(OSError):
            self._listener.shutdown(socket.SHUT_RDWR)
        self._listener.close()
        with self._lock:
            conns = list(self._conns)
        for conn in conns:
            with contextlib.suppress(OSError):
                conn.shutdown(socket.SHUT_RDWR)
        self._thread.join(timeout=5)


class ShardClient:
    """One connection to one peer's data endpoint, reused across requests."""

    def __init__(self, endpoint: Endpoint, *, timeout: float = IO_TIMEOUT) -> None:
        self.endpoint = endpoint
        self._timeout = timeout
        self._sock: socket.socket | None = None

    def _connect(self) -> socket.socket:
        if self._sock is None:
            try:
                sock = socket.create_connection(
                    (self.endpoint.host, self.endpoint.port), timeout=self._timeout
                )
            except OSError as e:
                raise DataPathError(f"cannot reach {self.endpoint}: {e}") from None
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            self._sock = sock
        return self._sock

    def fetch(self, manifest_hash: str, index: int, length: int, buffer: bytearray) -> memoryview:
        """Shard `index` (expected `length` bytes) read into `buffer`; unverified."""
        sock = self._connect()
        try:
            sock.sendall(_REQUEST.pack(MAGIC, bytes.fromhex(manifest_hash), index))
            status, size = _RESPONSE.unpack(_recv_exactly(sock, _RESPONSE.size))
            if status != OK:
                if size or status not in STATUS_TEXT:
                    raise MisbehavingPeerError(f"{self.endpoint} sent an invalid status {status}")
                raise ShardUnavailableError(status)
            if size != length:
                raise MisbehavingPeerError(
                    f"{self.endpoint} offered {size} bytes for a {length}-byte shard"
                )
            view = memoryview(buffer)[:length]
            got = 0
            while got < length:
                n = sock.recv_into(view[got:])
                if n == 0:
                    raise DataPathError(f"{self.endpoint} closed the connection mid-shard")
                got += n
            return view
        except ShardUnavailableError as e:
            if e.status == BUSY:
                self.close()  # the server closed it after saying so: dial afresh next time
            raise
        except (OSError, DataPathError) as e:
            self.close()
            if isinstance(e, DataPathError):
                raise
            raise DataPathError(f"transfer from {self.endpoint} failed: {e}") from None

    def close(self) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = None


def probe(endpoint: Endpoint, nonce: bytes, *, timeout: float) -> bool:
    """Dials `endpoint` and sends a probe with `nonce`: True if a data server there
    answered that it expected it."""
    try:
        with socket.create_connection((endpoint.host, endpoint.port), timeout=timeout) as sock:
            sock.settimeout(timeout)
            sock.sendall(_REQUEST.pack(PROBE_MAGIC, nonce, 0))
            status, size = _RESPONSE.unpack(_recv_exactly(sock, _RESPONSE.size))
    except (OSError, DataPathError):
        return False
    return bool(status == OK and size == 0)  # unpacked fields are Any to mypy


def _recv_exactly(sock: socket.socket, n: int) -> bytes:
    buf = bytearray(n)
    view = memoryview(buf)
    got = 0
    while got < n:
        k = sock.recv_into(view[got:])
        if k == 0:
            raise DataPathError("the connection closed in the middle of a message")
        got += k
    return bytes(buf)


def _recv_request(sock: socket.socket) -> bytes | None:
    """The next request, or None if the client closed the connection between requests."""
    first = sock.recv(_REQUEST.size)
    if not first:
        return None
    missing = _REQUEST.size - len(first)
    return first + _recv_exactly(sock, missing) if missing else first


def _send_quietly(conn: socket.socket, data: bytes) -> None:
    try:
        conn.settimeout(1)
        conn.sendall(data)
    except OSError:
        pass
