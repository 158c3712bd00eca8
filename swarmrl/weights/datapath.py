"""The bulk path: shard bytes over plain TCP, outside the libp2p stream stack.

py-libp2p moves about 110 MB/s on one Noise + yamux stream; plain loopback TCP
from Python moves GB/s. Shard bytes need no secrecy and no stream security:
their integrity comes from the signed manifest and the per-shard BLAKE3 hashes,
checked before anything is stored. So peers learn each other's data endpoint
over libp2p (in the signed, peer-authenticated adverts of
:mod:`swarmrl.weights`), and then move bytes here.

One request, one answer, many per connection:

    request  = b"SRL1" || manifest hash (32 bytes) || shard index (u32, big endian)
    response = status (u8) || length (u64, big endian) || length bytes

Status 0 carries the shard; the others carry no bytes and say why not. A
probe (``b"SRLP"`` || 32-byte nonce || 0) is how a peer dials this endpoint back
(:mod:`swarmrl.weights.dialback`): status 0 and no bytes if the server expected that
nonce. The server sends with ``os.sendfile`` from the checkpoint file (no copy through
Python), one thread per connection, each with idle and send deadlines.

What is scarce is the uplink, so a server shares it out in transfer slots, not
connections: a shard request takes one of `transfer_slots` for as long as its
bytes take, and a request beyond them waits in line, first come first served,
for up to `queue_wait` seconds before it is answered BUSY on the still open
connection. A connection that only sits between requests costs its own thread
and nothing else; a cap on connections bounds the threads: at the cap a new
connection takes the place of the one idle the longest, which is closed, and
only when none is idle is it answered BUSY at once and hung up on. The client
keeps its connection across refusals, and when the server closed one it reused
(idle, evicted, or full at accept), it sends the request again once on a fresh
connection. It reads straight into a reusable buffer.

A server's sends go through a :class:`~swarmrl.p2p.pacing.Pacer` (the volunteer's
upload cap, shared with the node's submissions), a few hundredths of a second of
the cap at a time, so that its transfers together keep to the cap; while the pacer
is halted (the monthly quota reached) every shard request is answered BUSY.
"""

from __future__ import annotations

import contextlib
import logging
import os
import resource
import select
import socket
import struct
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from swarmrl.p2p.pacing import Pacer
from swarmrl.weights.store import Version

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
    BUSY: "is busy (no transfer slot or connection came free)",
}
# A thread each; a connection that only waits for its next request costs nothing else.
DEFAULT_MAX_CONNECTIONS = 256
# Concurrent shard transfers. benchmarks/broadcast_sim.py sized them to the uplink,
# one per 10 Mbit/s (about 5 at a volunteer's median), but a node cannot know its
# uplink: a fixed 8 spread a delta to 1,000 simulated nodes as fast (4 a little
# slower, 2 slower still), and still fills an uplink when the downloaders' links are
# the narrower ones.
DEFAULT_TRANSFER_SLOTS = 8
# A known reachable origin has a datacentre's uplink (10 Gbit/s in the simulation):
# one slot per 10 Mbit/s of it, and room for every worker of 1,000 nodes to wait in
# its line. In the simulation a 64-slot, 256-connection origin held a delta's p90 at
# 129 s, as every connection was busy or waiting; 1,000 slots and 2,048 connections
# brought it to 74 s (256 slots: 91 s).
ORIGIN_TRANSFER_SLOTS = 1000
ORIGIN_MAX_CONNECTIONS = 2048
# Descriptors kept free for the rest of the process (libp2p, SQLite, checkpoints)
# when the open-file limit bounds the connections.
FD_HEADROOM = 256
# How long a request waits for a transfer slot before BUSY: under the client's
# IO_TIMEOUT, so the client hears BUSY (and tries another holder) before it gives up.
QUEUE_WAIT = 10.0
IDLE_TIMEOUT = 30.0
# How long accepting waits for an evicted connection's thread to free its place.
EVICT_WAIT = 1.0
# A pause after accept() failed (out of file descriptors), before trying again.
ACCEPT_PAUSE = 0.1
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


class _HungUpError(DataPathError):
    """The server closed the connection before it answered the request."""


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
        transfer_slots: int = DEFAULT_TRANSFER_SLOTS,
        queue_wait: float = QUEUE_WAIT,
        idle_timeout: float = IDLE_TIMEOUT,
        io_timeout: float = IO_TIMEOUT,
        pacer: Pacer | None = None,
    ) -> None:
        """`pacer`: what every byte sent goes through (None: one with no cap)."""
        self._lookup = lookup
        self._pacer = Pacer() if pacer is None else pacer
        self._idle_timeout = idle_timeout
        self._io_timeout = io_timeout
        self._queue_wait = queue_wait
        connections = _fit_to_fd_limit(max_connections)
        self._connections = threading.BoundedSemaphore(connections)
        self._transfers = _Line(transfer_slots)
        # A backlog as deep as the cap: an origin meets a thousand nodes' workers at
        # once, and a dropped SYN costs its client a second or more of retransmit.
        self._listener = socket.create_server((host, port), backlog=max(128, connections))
        self.endpoint = Endpoint(host, self._listener.getsockname()[1])
        self.bytes_served = 0
        self.shards_served = 0
        self._closed = False
        self._conns: set[socket.socket] = set()
        self._idle: dict[socket.socket, float] = {}  # between requests, since when
        self._probes: dict[bytes, threading.Event] = {}
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._accept_loop, name="swarmrl-data", daemon=True)
        self._thread.start()

    def _accept_loop(self) -> None:
        while not self._closed:
            try:
                conn, _ = self._listener.accept()
            except OSError as e:
                if self._closed:
                    return
                # Out of file descriptors, or a connection reset before it was taken:
                # the listener itself is fine, so pause rather than spin, and go on.
                log.warning("could not accept a data connection: %s", e)
                time.sleep(ACCEPT_PAUSE)
                continue
            if not self._connections.acquire(blocking=False) and not self._make_room():
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
                with self._lock:
                    self._idle[conn] = time.monotonic()
                request = _recv_message(conn, _REQUEST.size)
                with self._lock:
                    evicted = self._idle.pop(conn, None) is None
                if request is None or evicted:
                    return  # evicted as a request came: the client asks again elsewhere
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
                elif self._pacer.halted:
                    conn.sendall(_RESPONSE.pack(BUSY, 0))  # the client asks another holder
                elif not self._transfers.acquire(self._queue_wait):
                    conn.sendall(_RESPONSE.pack(BUSY, 0))  # the connection stays open
                else:
                    try:
                        self._send_shard(conn, version, index)
                    finally:
                        self._transfers.release()
        except (OSError, DataPathError) as e:
            log.debug("data connection closed: %s", e)
        finally:
            with self._lock:
                self._conns.discard(conn)
                self._idle.pop(conn, None)
            conn.close()
            self._connections.release()

    def _make_room(self) -> bool:
        """At the connection cap: closes the connection idle the longest and takes its
        place; False if none is idle. A worker keeps a connection to every peer it used,
        so at a server many download from (the origin) idle ones would otherwise hold
        the cap against new askers; the evicted client reconnects when it asks again."""
        with self._lock:
            if not self._idle:
                return False
            oldest = min(self._idle, key=self._idle.__getitem__)
            del self._idle[oldest]
        with contextlib.suppress(OSError):
            oldest.shutdown(socket.SHUT_RDWR)  # wakes its thread, which frees its place
        return self._connections.acquire(timeout=EVICT_WAIT)

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
                n = os.sendfile(conn.fileno(), fd, offset + sent, self._pacer.chunk(length - sent))
            except BlockingIOError:
                if not poller.poll(self._io_timeout * 1000):
                    raise DataPathError("the client stopped reading") from None
                continue
            if n == 0:
                raise DataPathError("the checkpoint file ended early")
            sent += n
            self._pacer.pace(n, stopped=lambda: self._closed)
        with self._lock:
            self.bytes_served += length
            self.shards_served += 1

    def close(self) -> None:
        self._closed = True
        self._pacer.wake()  # a transfer waiting its turn ends
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


class _Line:
    """Transfer slots handed out first come, first served (a Semaphore wakes waiters
    in no particular order, so a request could be passed over until it gives up)."""

    def __init__(self, slots: int) -> None:
        if slots < 1:
            raise ValueError(f"a server needs at least one transfer slot, not {slots}")
        self._free = slots
        self._waiting: deque[threading.Event] = deque()
        self._lock = threading.Lock()

    def acquire(self, timeout: float) -> bool:
        """Takes a slot, waiting in line for up to `timeout` seconds; False if none came."""
        with self._lock:
            if self._free and not self._waiting:
                self._free -= 1
                return True
            turn = threading.Event()
            self._waiting.append(turn)
        if turn.wait(timeout):
            return True
        with self._lock:
            if turn.is_set():  # handed a slot as the wait ran out: it is ours
                return True
            self._waiting.remove(turn)
            return False

    def release(self) -> None:
        with self._lock:
            if self._waiting:
                self._waiting.popleft().set()  # the slot passes straight to the next in line
            else:
                self._free += 1


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
        reused = self._sock is not None
        try:
            return self._fetch(manifest_hash, index, length, buffer)
        except _HungUpError:
            if not reused:
                raise
            # A connection kept from before may have been closed by the server since
            # (idle too long, or BUSY at accept) without our noticing. A request for
            # bytes changes nothing there, so it goes again, once, on a fresh connection.
            return self._fetch(manifest_hash, index, length, buffer)

    def _fetch(self, manifest_hash: str, index: int, length: int, buffer: bytearray) -> memoryview:
        sock = self._connect()
        try:
            try:
                sock.sendall(_REQUEST.pack(MAGIC, bytes.fromhex(manifest_hash), index))
                header = _recv_message(sock, _RESPONSE.size)
            except (BrokenPipeError, ConnectionResetError):
                header = None
            if header is None:
                raise _HungUpError(f"{self.endpoint} closed the connection before answering")
            status, size = _RESPONSE.unpack(header)
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
        except ShardUnavailableError:
            raise  # a refusal leaves the connection as it was, ready for the next request
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


def _recv_message(sock: socket.socket, n: int) -> bytes | None:
    """The next `n`-byte message, or None if the other side closed the connection
    before its first byte (between messages, which is no error)."""
    first = sock.recv(n)
    if not first:
        return None
    missing = n - len(first)
    return first + _recv_exactly(sock, missing) if missing else first


def _fit_to_fd_limit(connections: int) -> int:
    """How many of `connections` this process can hold open: it raises its soft
    open-file limit as far as the hard limit allows (a soft limit of 1,024 is common,
    below an origin's cap) and keeps FD_HEADROOM descriptors for everything else."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = connections + FD_HEADROOM
    if soft != resource.RLIM_INFINITY and soft < wanted:
        raised = wanted if hard == resource.RLIM_INFINITY else min(wanted, hard)
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (raised, hard))
            soft = raised
    if soft == resource.RLIM_INFINITY or soft >= wanted:
        return connections
    fit = max(1, soft - FD_HEADROOM)
    log.warning(
        "serving at most %d data connections, not %d: the open-file limit is %d",
        fit,
        connections,
        soft,
    )
    return fit


def _send_quietly(conn: socket.socket, data: bytes) -> None:
    try:
        conn.settimeout(1)
        conn.sendall(data)
    except OSError:
        pass
