"""swarmrl.weights.datapath: shard bytes over loopback TCP, and what a bad peer gets."""

from __future__ import annotations

import random
import socket
import struct
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from eth_account import Account
from eth_utils import keccak

from swarmrl import shards
from swarmrl.eip712 import swarm_domain
from swarmrl.weights import datapath
from swarmrl.weights.datapath import (
    BAD_REQUEST,
    BUSY,
    NOT_HELD,
    OK,
    UNKNOWN_VERSION,
    DataPathError,
    Endpoint,
    MisbehavingPeerError,
    ShardClient,
    ShardServer,
    ShardUnavailableError,
)
from swarmrl.weights.peer_records import Announcement
from swarmrl.weights.store import Version, WeightStore

ORIGIN = Account.from_key(keccak(text="swarmrl datapath origin"))
DOMAIN = swarm_domain(31337, "0x5FbDB2315678afecb367f032d93F642f64180aa3")
SHARD = 4096
SIZE = 5 * SHARD + 321
REQUEST = struct.Struct("!4s32sI")
RESPONSE = struct.Struct("!BQ")
LOCAL = "127.0.0.1"


@pytest.fixture
def store(tmp_path: Path) -> Iterator[WeightStore]:
    s = WeightStore(tmp_path / "store")
    yield s
    for v in s.versions():
        v.close()


def add_checkpoint(tmp_path: Path, store: WeightStore, step: int) -> tuple[Version, bytes]:
    data = random.Random(step).randbytes(SIZE)
    path = tmp_path / f"step{step}.bin"
    path.write_bytes(data)
    manifest = shards.build_manifest(path, model="org/model", step=step, shard_size=SHARD)
    announcement = Announcement.sign(ORIGIN, manifest, DOMAIN)
    return store.add_origin(path, manifest, announcement), data


@pytest.fixture
def serving(tmp_path, store) -> Iterator[tuple[ShardServer, Version, bytes]]:
    version, data = add_checkpoint(tmp_path, store, 1)
    server = ShardServer(store.get, host=LOCAL)
    yield server, version, data
    server.close()


def shard_len(version: Version, index: int) -> int:
    return version.locate(index)[2]


def raw_request(mhash: str, index: int, magic: bytes = datapath.MAGIC) -> bytes:
    return REQUEST.pack(magic, bytes.fromhex(mhash), index)


def recv_all(sock: socket.socket, n: int) -> bytes:
    out = b""
    while len(out) < n:
        chunk = sock.recv(n - len(out))
        if not chunk:
            break
        out += chunk
    return out


def hung_up(sock: socket.socket) -> bool:
    """Whether the other side closed (a FIN, or a reset if it left our bytes unread)."""
    try:
        return sock.recv(1) == b""
    except ConnectionResetError:
        return True


def eventually(check: Callable[[], bool], seconds: float = 5.0) -> bool:
    """Polls `check` for at most `seconds` (a bounded wait on another thread's work)."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if check():
            return True
        time.sleep(0.01)
    return check()


# ---- serving shards --------------------------------------------------------------------


def test_client_fetches_every_shard_byte_exact_over_one_connection(serving):
    server, version, data = serving
    client = ShardClient(server.endpoint, timeout=5)
    buffer = bytearray(SHARD)
    local_ends = set()
    try:
        for index in [5, 0, 3, 1, 4, 2, 5]:
            view = client.fetch(version.manifest_hash, index, shard_len(version, index), buffer)
            assert bytes(view) == data[index * SHARD : (index + 1) * SHARD]
            assert client._sock is not None
            local_ends.add(client._sock.getsockname())
    finally:
        client.close()
    assert len(local_ends) == 1  # one persistent connection for every request
    # The server counts a shard once sendfile returns, which may be after the client read it.
    assert eventually(lambda: server.shards_served == 7)
    assert server.bytes_served == SIZE + shard_len(version, 5)


def test_missing_version_or_shard_is_not_available(tmp_path, store, serving):
    server, version, data = serving
    # A version still being fetched serves only what it holds.
    partial_data = random.Random(3).randbytes(SIZE)
    partial_path = tmp_path / "step3.bin"
    partial_path.write_bytes(partial_data)
    manifest = shards.build_manifest(partial_path, model="org/model", step=3, shard_size=SHARD)
    fetching = store.begin(Announcement.sign(ORIGIN, manifest, DOMAIN), manifest)
    store.write_shard(fetching, 2, partial_data[2 * SHARD : 3 * SHARD])

    client = ShardClient(server.endpoint, timeout=5)
    buffer = bytearray(SHARD)
    try:
        with pytest.raises(ShardUnavailableError) as e:
            client.fetch("ab" * 32, 0, SHARD, buffer)
        assert e.value.status == UNKNOWN_VERSION
        assert str(e.value) == "the peer does not hold that checkpoint"
        with pytest.raises(ShardUnavailableError) as e:
            client.fetch(fetching.manifest_hash, 0, SHARD, buffer)
        assert e.value.status == NOT_HELD
        with pytest.raises(ShardUnavailableError) as e:
            client.fetch(version.manifest_hash, 6, SHARD, buffer)  # past the last shard
        assert e.value.status == NOT_HELD
        # Refusals keep the connection: the same client goes on fetching.
        view = client.fetch(fetching.manifest_hash, 2, SHARD, buffer)
        assert bytes(view) == partial_data[2 * SHARD : 3 * SHARD]
        view = client.fetch(version.manifest_hash, 0, SHARD, buffer)
        assert bytes(view) == data[:SHARD]
    finally:
        client.close()


def test_garbage_gets_bad_request_and_the_server_keeps_serving(serving):
    server, version, data = serving
    with socket.create_connection((LOCAL, server.endpoint.port), timeout=5) as bad:
        bad.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n" + b"\xff" * 20)
        assert RESPONSE.unpack(recv_all(bad, RESPONSE.size)) == (BAD_REQUEST, 0)
        assert hung_up(bad)
    with socket.create_connection((LOCAL, server.endpoint.port), timeout=5) as bad:
        bad.sendall(raw_request(version.manifest_hash, 0, magic=b"SRL2"))
        assert RESPONSE.unpack(recv_all(bad, RESPONSE.size)) == (BAD_REQUEST, 0)
        assert hung_up(bad)
    with socket.create_connection((LOCAL, server.endpoint.port), timeout=5) as short:
        short.sendall(b"SRL1\x00")  # half a request, then gone

    client = ShardClient(server.endpoint, timeout=5)
    try:
        view = client.fetch(version.manifest_hash, 1, SHARD, bytearray(SHARD))
        assert bytes(view) == data[SHARD : 2 * SHARD]
    finally:
        client.close()


def test_a_raw_request_gets_the_documented_response(serving):
    server, version, data = serving
    with socket.create_connection((LOCAL, server.endpoint.port), timeout=5) as sock:
        sock.sendall(raw_request(version.manifest_hash, 5) + raw_request("00" * 32, 0))
        status, size = RESPONSE.unpack(recv_all(sock, RESPONSE.size))
        assert (status, size) == (OK, SIZE - 5 * SHARD)
        assert recv_all(sock, size) == data[5 * SHARD :]
        assert RESPONSE.unpack(recv_all(sock, RESPONSE.size)) == (UNKNOWN_VERSION, 0)


def test_an_idle_connection_does_not_block_another_client(serving):
    server, version, data = serving
    with socket.create_connection((LOCAL, server.endpoint.port), timeout=5):
        client = ShardClient(server.endpoint, timeout=5)
        try:
            view = client.fetch(version.manifest_hash, 0, SHARD, bytearray(SHARD))
            assert bytes(view) == data[:SHARD]
        finally:
            client.close()


class Gate:
    """A version whose shard `index` is sent only once `open` is set: a transfer that
    holds its slot for as long as a test wants. It records the order shards are sent in."""

    def __init__(self, version: Version, index: int) -> None:
        self.version = version
        self.index = index
        self.entered = threading.Event()
        self.open = threading.Event()
        self.sent: list[int] = []

    def lookup(self, manifest_hash: str) -> Gate | None:
        return self if manifest_hash == self.version.manifest_hash else None

    def holds(self, index: int) -> bool:
        return self.version.holds(index)

    def locate(self, index: int) -> tuple[int, int, int]:
        self.sent.append(index)
        if index == self.index:
            self.entered.set()
            assert self.open.wait(10)
        return self.version.locate(index)


class Fetching:
    """A fetch in a thread of its own, on a client of its own."""

    def __init__(self, endpoint: Endpoint, version: Version, index: int) -> None:
        self.client = ShardClient(endpoint, timeout=10)
        self.result: bytes | BaseException | None = None
        self.thread = threading.Thread(
            target=self._run, args=(version.manifest_hash, index, shard_len(version, index))
        )
        self.thread.start()

    def _run(self, mhash: str, index: int, length: int) -> None:
        try:
            self.result = bytes(self.client.fetch(mhash, index, length, bytearray(length)))
        except BaseException as e:
            self.result = e

    def join(self) -> bytes | BaseException | None:
        self.thread.join(timeout=10)
        self.client.close()
        return self.result


def test_requests_beyond_the_transfer_slots_wait_in_line_first_come_first_served(tmp_path, store):
    version, data = add_checkpoint(tmp_path, store, 1)
    gate = Gate(version, 0)
    server = ShardServer(gate.lookup, host=LOCAL, transfer_slots=1, queue_wait=60)
    try:
        first = Fetching(server.endpoint, version, 0)
        assert gate.entered.wait(5)  # the one slot is taken
        second = Fetching(server.endpoint, version, 1)
        assert eventually(lambda: len(server._transfers._waiting) == 1)
        third = Fetching(server.endpoint, version, 2)
        assert eventually(lambda: len(server._transfers._waiting) == 2)
        gate.open.set()
        assert first.join() == data[:SHARD]
        assert second.join() == data[SHARD : 2 * SHARD]
        assert third.join() == data[2 * SHARD : 3 * SHARD]
        assert gate.sent == [0, 1, 2]  # in the order they came, none refused
    finally:
        gate.open.set()
        server.close()


def test_a_request_that_waits_out_the_line_gets_busy_and_keeps_its_connection(tmp_path, store):
    version, data = add_checkpoint(tmp_path, store, 1)
    gate = Gate(version, 0)
    server = ShardServer(gate.lookup, host=LOCAL, transfer_slots=1, queue_wait=0)
    client = ShardClient(server.endpoint, timeout=5)
    try:
        first = Fetching(server.endpoint, version, 0)
        assert gate.entered.wait(5)
        with pytest.raises(ShardUnavailableError) as e:
            client.fetch(version.manifest_hash, 1, SHARD, bytearray(SHARD))
        assert e.value.status == BUSY
        assert client._sock is not None
        local_end = client._sock.getsockname()
        # Refusals that need no slot are answered at once, slots all taken or not.
        with pytest.raises(ShardUnavailableError) as e:
            client.fetch("ab" * 32, 0, SHARD, bytearray(SHARD))
        assert e.value.status == UNKNOWN_VERSION
        gate.open.set()
        assert first.join() == data[:SHARD]
        # The slot is free again: the same client, on the same connection, gets it.
        view = client.fetch(version.manifest_hash, 1, SHARD, bytearray(SHARD))
        assert bytes(view) == data[SHARD : 2 * SHARD]
        assert client._sock.getsockname() == local_end
    finally:
        gate.open.set()
        client.close()
        server.close()


def test_a_kept_connection_the_server_closed_is_replaced_unasked(serving):
    server, version, data = serving
    client = ShardClient(server.endpoint, timeout=5)
    try:
        client.fetch(version.manifest_hash, 0, SHARD, bytearray(SHARD))
        assert client._sock is not None
        local_end = client._sock.getsockname()
        with server._lock:
            (conn,) = server._conns
        conn.shutdown(socket.SHUT_RDWR)  # as the idle timeout does, without the wait
        assert eventually(lambda: not server._conns)
        view = client.fetch(version.manifest_hash, 1, SHARD, bytearray(SHARD))
        assert bytes(view) == data[SHARD : 2 * SHARD]
        assert client._sock.getsockname() != local_end
    finally:
        client.close()


def test_an_idle_connection_is_dropped_after_the_idle_timeout(store):
    server = ShardServer(store.get, host=LOCAL, idle_timeout=0.2)
    try:
        with socket.create_connection((LOCAL, server.endpoint.port), timeout=5) as idle:
            assert hung_up(idle)  # the server hung up on its own
    finally:
        server.close()


def test_close_stops_the_server(serving):
    server, version, _ = serving
    client = ShardClient(server.endpoint, timeout=5)
    client.fetch(version.manifest_hash, 0, SHARD, bytearray(SHARD))
    server.close()
    assert not server._thread.is_alive()  # the accept loop ended, not left blocked
    with pytest.raises(DataPathError):
        client.fetch(version.manifest_hash, 1, SHARD, bytearray(SHARD))
    with pytest.raises(DataPathError, match="cannot reach"):
        ShardClient(server.endpoint, timeout=5).fetch(
            version.manifest_hash, 1, SHARD, bytearray(SHARD)
        )


# ---- a peer that lies ------------------------------------------------------------------


class FakePeer:
    """A one-connection server that answers every request with `reply`, then hangs up."""

    def __init__(self, reply: bytes) -> None:
        self.reply = reply
        self.requests: list[bytes] = []
        self.listener = socket.create_server((LOCAL, 0))
        self.listener.settimeout(5)
        self.endpoint = Endpoint(LOCAL, self.listener.getsockname()[1])
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        try:
            conn, _ = self.listener.accept()
        except OSError:
            return
        with conn:
            conn.settimeout(5)
            self.requests.append(recv_all(conn, REQUEST.size))
            conn.sendall(self.reply)

    def close(self) -> None:
        self.thread.join(timeout=5)
        self.listener.close()


@pytest.mark.parametrize(
    ("reply", "message"),
    [
        (RESPONSE.pack(OK, SHARD + 1) + bytes(SHARD + 1), f"offered {SHARD + 1} bytes"),
        (RESPONSE.pack(OK, SHARD - 1) + bytes(SHARD - 1), f"offered {SHARD - 1} bytes"),
        (RESPONSE.pack(OK, 2**63), "offered"),
        (RESPONSE.pack(9, 0), "invalid status 9"),
        (RESPONSE.pack(NOT_HELD, 10) + bytes(10), "invalid status"),
    ],
    ids=["long", "short", "huge", "unknown-status", "refusal-with-bytes"],
)
def test_a_lying_peer_is_peer_misbehaved(reply, message):
    peer = FakePeer(reply)
    client = ShardClient(peer.endpoint, timeout=5)
    try:
        with pytest.raises(MisbehavingPeerError, match=message):
            client.fetch("cd" * 32, 7, SHARD, bytearray(SHARD))
        assert client._sock is None  # the connection is not reused after a lie
    finally:
        client.close()
        peer.close()
    assert peer.requests == [raw_request("cd" * 32, 7)]


@pytest.mark.parametrize(
    "reply",
    [b"", RESPONSE.pack(OK, SHARD)[:5], RESPONSE.pack(OK, SHARD) + bytes(100)],
    ids=["nothing", "half-header", "half-shard"],
)
def test_a_peer_that_hangs_up_is_a_plain_data_path_error(reply):
    peer = FakePeer(reply)
    client = ShardClient(peer.endpoint, timeout=5)
    try:
        with pytest.raises(DataPathError) as e:
            client.fetch("cd" * 32, 0, SHARD, bytearray(SHARD))
        assert not isinstance(e.value, (MisbehavingPeerError, ShardUnavailableError))
        assert client._sock is None
    finally:
        client.close()
        peer.close()


def test_an_unreachable_peer_is_a_data_path_error():
    with socket.create_server((LOCAL, 0)) as s:
        port = s.getsockname()[1]
    client = ShardClient(Endpoint(LOCAL, port), timeout=5)
    with pytest.raises(DataPathError, match=f"cannot reach {LOCAL}:{port}"):
        client.fetch("cd" * 32, 0, SHARD, bytearray(SHARD))


# ---- endpoints ---------------------------------------------------------------------------


def test_endpoint_parse_and_print():
    assert Endpoint.parse("127.0.0.1:9000") == Endpoint("127.0.0.1", 9000)
    assert str(Endpoint.parse("127.0.0.1:9000")) == "127.0.0.1:9000"
    assert Endpoint.parse("node.example:1") == Endpoint("node.example", 1)
    assert Endpoint.parse("::1:65535") == Endpoint("::1", 65535)  # the last colon splits


@pytest.mark.parametrize(
    "text",
    ["", "127.0.0.1", "127.0.0.1:", ":9000", "h:0", "h:65536", "h:-1", "h:+80", "h:8o", "h: 80"],
)
def test_endpoint_parse_errors(text):
    with pytest.raises(ValueError, match="is not a host:port data endpoint") as e:
        Endpoint.parse(text)
    assert str(e.value) == f"{text!r} is not a host:port data endpoint"


def test_a_probe_is_answered_only_for_an_armed_nonce_and_only_once(serving):
    server, _, _ = serving
    nonce = bytes(range(32))
    assert not datapath.probe(server.endpoint, nonce, timeout=5)  # not armed: refused
    arrived = server.expect_probe(nonce)
    assert not arrived.is_set()
    assert datapath.probe(server.endpoint, nonce, timeout=5)
    assert arrived.is_set()
    assert not datapath.probe(server.endpoint, nonce, timeout=5)  # used up


def test_a_forgotten_probe_is_refused(serving):
    server, _, _ = serving
    nonce = b"\x07" * 32
    arrived = server.expect_probe(nonce)
    server.forget_probe(nonce)
    assert not datapath.probe(server.endpoint, nonce, timeout=5)
    assert not arrived.is_set()


def test_probing_a_closed_port_is_false_not_an_error(serving):
    server, _, _ = serving
    endpoint = server.endpoint
    server.close()
    assert not datapath.probe(endpoint, b"\x01" * 32, timeout=2)


def test_a_probe_nonce_has_one_length(serving):
    server, _, _ = serving
    with pytest.raises(ValueError, match="32 bytes"):
        server.expect_probe(b"short")


def test_at_the_connection_cap_a_new_client_takes_the_place_of_the_longest_idle(tmp_path, store):
    version, data = add_checkpoint(tmp_path, store, 1)
    server = ShardServer(store.get, host=LOCAL, max_connections=2)
    try:
        older = socket.create_connection((LOCAL, server.endpoint.port), timeout=5)
        assert eventually(lambda: len(server._idle) == 1)
        newer = socket.create_connection((LOCAL, server.endpoint.port), timeout=5)
        assert eventually(lambda: len(server._idle) == 2)
        client = ShardClient(server.endpoint, timeout=5)
        view = client.fetch(version.manifest_hash, 0, SHARD, bytearray(SHARD))
        assert bytes(view) == data[:SHARD]
        assert older.recv(1) == b""  # the one idle the longest was closed
        newer.settimeout(0.2)
        with pytest.raises(TimeoutError):
            newer.recv(1)  # the other is still open
        client.close()
        older.close()
        newer.close()
    finally:
        server.close()


def test_at_the_connection_cap_with_none_idle_the_server_answers_busy(tmp_path, store):
    version, data = add_checkpoint(tmp_path, store, 1)
    gate = Gate(version, 0)
    server = ShardServer(gate.lookup, host=LOCAL, max_connections=1)
    client = ShardClient(server.endpoint, timeout=5)
    try:
        first = Fetching(server.endpoint, version, 0)
        assert gate.entered.wait(5)  # its connection is busy with a transfer
        with pytest.raises(ShardUnavailableError) as e:
            client.fetch(version.manifest_hash, 1, SHARD, bytearray(SHARD))
        assert e.value.status == BUSY
        assert str(e.value) == "the peer is busy (no transfer slot or connection came free)"
        gate.open.set()
        assert first.join() == data[:SHARD]

        # The server hung up after BUSY; the same client's next request meets the
        # closed socket and goes again on a fresh connection, unasked (once the
        # server has seen the first client hang up and freed its place).
        def fetched() -> bool:
            try:
                view = client.fetch(version.manifest_hash, 1, SHARD, bytearray(SHARD))
            except ShardUnavailableError:
                return False
            return bytes(view) == data[SHARD : 2 * SHARD]

        assert eventually(fetched)
    finally:
        gate.open.set()
        client.close()
        server.close()
