"""Streamed uploads between real libp2p hosts on loopback (Host.serve_upload / Host.upload).

A real handler keeps what it receives in a store directory; the tests check what
arrives there byte for byte, what the client is told when the server refuses,
and that the spool directory is left empty whatever happens to an upload.
"""

from __future__ import annotations

import dataclasses
import errno
import hashlib
import os
import subprocess
import sys
import threading
import time
import tracemalloc
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from libp2p.crypto.ed25519 import create_new_key_pair
from libp2p.peer.id import ID

from swarmrl.p2p import wire
from swarmrl.p2p.host import Host, RemoteError
from swarmrl.p2p.protocol import MiB, Upload
from tests.codecs import Raw

PROTOCOL = wire.protocol_id("test-upload")
KiB = 1024
HEADER_LIMIT = 1024
CHUNK = 256 * KiB
HANG_GUARD = 30  # seconds; only stops a broken test from hanging, never a claim about speed
# Headers and replies as raw bytes, so a test can send any header and read any reply.
SPEC = Upload(
    PROTOCOL,
    Raw(),
    Raw(),
    header_limit=HEADER_LIMIT,
    body_limit=64 * MiB,
    response_limit=1024,
    deadline=HANG_GUARD,
    chunk_limit=CHUNK,
)


class Intake:
    """An upload handler that refuses named headers and files each body in `store`."""

    def __init__(self, store: Path, *, refuse: str | None = None, keep: bool = True) -> None:
        self.store = store
        self.refuse = refuse
        self.keep = keep
        self.fail = False
        self.checked: list[bytes] = []
        self.received: list[tuple[str, bytes]] = []
        store.mkdir(exist_ok=True)

    def check(self, peer: str, header: bytes) -> None:
        self.checked.append(header)
        if self.refuse is not None:
            raise wire.Refusal(self.refuse)

    def receive(self, peer: str, header: bytes, path: Path) -> bytes:
        if self.fail:
            raise RuntimeError("a bug in the handler")
        digest = sha256_of(path)
        self.received.append((peer, header))
        if self.keep:
            path.rename(self.store / digest)
        return f"stored {digest}".encode()


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while block := f.read(MiB):
            digest.update(block)
    return digest.hexdigest()


def random_file(path: Path, size: int) -> Path:
    path.write_bytes(os.urandom(size))
    return path


def wait_until(condition: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + HANG_GUARD
    while not condition():
        assert time.monotonic() < deadline, f"hang guard: still waiting for {what}"
        time.sleep(0.05)


def spooled(spool: Path) -> list[Path]:
    return sorted(spool.iterdir())


@pytest.fixture
def hosts() -> Iterator[tuple[Host, Host]]:
    """A serving host and a client host connected to it."""
    server = Host(create_new_key_pair())
    try:
        client = Host(create_new_key_pair())
        try:
            client.connect(server.addrs[0])
            yield server, client
        finally:
            client.close()
    finally:
        server.close()


@pytest.fixture
def serve(hosts, tmp_path) -> Callable[..., Path]:
    """Registers an upload protocol on the server; returns its spool directory."""
    server, _ = hosts

    def register(handler: Intake, max_uploads: int = 8, **limits: object) -> Path:
        spec = dataclasses.replace(SPEC, **limits)
        server.serve_upload(spec, handler, spool_dir=tmp_path / "spool", max_uploads=max_uploads)
        return tmp_path / "spool"

    return register


def upload(client: Host, server: Host, path: Path, header: bytes = b"header", **kw) -> bytes:
    """Uploads `path` as the client's side of SPEC (with `kw` changed) sees it."""
    return client.upload(dataclasses.replace(SPEC, **kw), server.peer_id, header, path)


class Fifo:
    """A named pipe as the file to upload: the test decides when its bytes come and
    when it ends, so an upload can be held in the middle of its body."""

    def __init__(self, path: Path) -> None:
        os.mkfifo(path)
        self.path = path
        self.fd: int | None = None

    def open(self) -> None:
        """Opens the writing end once the uploader has opened the reading end."""
        deadline = time.monotonic() + HANG_GUARD
        while self.fd is None:
            try:
                self.fd = os.open(self.path, os.O_WRONLY | os.O_NONBLOCK)
            except OSError as e:
                if e.errno != errno.ENXIO:  # ENXIO: no reader yet
                    raise
                assert time.monotonic() < deadline, "hang guard: the uploader never opened it"
                time.sleep(0.05)
        os.set_blocking(self.fd, True)

    def write(self, data: bytes) -> None:
        assert self.fd is not None
        view = memoryview(data)
        while view:
            view = view[os.write(self.fd, view) :]

    def close(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None


class Background:
    """Runs one upload in a thread and keeps its reply or its exception."""

    def __init__(self, run: Callable[[], bytes]) -> None:
        self.reply: bytes | None = None
        self.error: BaseException | None = None
        self._thread = threading.Thread(target=self._main, args=(run,), daemon=True)
        self._thread.start()

    def _main(self, run: Callable[[], bytes]) -> None:
        try:
            self.reply = run()
        except BaseException as e:
            self.error = e

    def join(self) -> None:
        self._thread.join(HANG_GUARD)
        assert not self._thread.is_alive(), "hang guard: the upload never ended"


# ---- what arrives --------------------------------------------------------------------


def test_a_multi_megabyte_file_arrives_byte_identical(hosts, serve, tmp_path):
    server, client = hosts
    intake = Intake(tmp_path / "store")
    spool = serve(intake)
    source = random_file(tmp_path / "rollouts.bin", 6 * MiB + 123)

    reply = upload(client, server, source, header=b'{"order": 7}')

    digest = sha256_of(source)
    assert reply == f"stored {digest}".encode()
    assert (intake.store / digest).read_bytes() == source.read_bytes()
    assert intake.checked == [b'{"order": 7}']
    assert intake.received == [(client.peer_id, b'{"order": 7}')]
    assert spooled(spool) == []


@pytest.mark.parametrize("size", [0, 1, CHUNK, CHUNK + 1])
def test_bodies_at_chunk_edges_arrive_whole(hosts, serve, tmp_path, size):
    server, client = hosts
    intake = Intake(tmp_path / "store")
    serve(intake)
    source = random_file(tmp_path / "body.bin", size)
    assert upload(client, server, source) == f"stored {sha256_of(source)}".encode()
    assert (intake.store / sha256_of(source)).read_bytes() == source.read_bytes()


def test_a_body_the_handler_does_not_keep_is_deleted(hosts, serve, tmp_path):
    server, client = hosts
    intake = Intake(tmp_path / "store", keep=False)
    spool = serve(intake)
    upload(client, server, random_file(tmp_path / "body.bin", 3 * CHUNK))
    assert len(intake.received) == 1
    assert spooled(spool) == []
    assert list(intake.store.iterdir()) == []


# ---- limits and refusals ---------------------------------------------------------------


def test_a_body_at_the_limit_is_taken_and_one_byte_more_is_refused(hosts, serve, tmp_path):
    server, client = hosts
    intake = Intake(tmp_path / "store")
    limit = MiB + 5
    spool = serve(intake, body_limit=limit)
    upload(client, server, random_file(tmp_path / "exact.bin", limit))
    assert len(intake.received) == 1

    with pytest.raises(RemoteError) as e:
        upload(client, server, random_file(tmp_path / "over.bin", 3 * MiB))
    assert str(e.value) == f"the upload is over the {limit}-byte limit"
    assert len(intake.received) == 1
    wait_until(lambda: spooled(spool) == [], "the refused body's spool file to go")


def test_a_chunk_over_the_chunk_limit_is_refused(hosts, serve, tmp_path):
    server, client = hosts
    intake = Intake(tmp_path / "store")
    spool = serve(intake, chunk_limit=64 * KiB)
    with pytest.raises(RemoteError) as e:
        upload(client, server, random_file(tmp_path / "body.bin", MiB), chunk_limit=64 * KiB + 1)
    assert str(e.value) == f"a {64 * KiB + 1}-byte upload chunk is over the {64 * KiB}-byte limit"
    assert intake.received == []
    wait_until(lambda: spooled(spool) == [], "the refused body's spool file to go")


def test_an_oversized_header_is_refused_before_the_handler_sees_it(hosts, serve, tmp_path):
    server, client = hosts
    intake = Intake(tmp_path / "store")
    spool = serve(intake)
    with pytest.raises(RemoteError) as e:
        upload(client, server, random_file(tmp_path / "body.bin", MiB), header=b"h" * 1025)
    assert str(e.value) == "a 1025-byte frame is over the 1024-byte limit"
    assert intake.checked == []
    assert spooled(spool) == []


@pytest.mark.parametrize("error", [wire.Refusal, wire.WireError])
def test_a_refusal_from_the_header_reaches_the_client_mid_body(
    hosts, serve, tmp_path, monkeypatch, error
):
    server, client = hosts
    intake = Intake(tmp_path / "store")
    sentence = "there is no open assignment for this node"

    def refuse(peer: str, header: bytes) -> None:
        intake.checked.append(header)
        raise error(sentence)

    monkeypatch.setattr(intake, "check", refuse)
    spool = serve(intake)
    # Far bigger than the stream's window: the client is still sending when the
    # refusal comes, and must report it rather than the write that then fails.
    with pytest.raises(RemoteError) as e:
        upload(client, server, random_file(tmp_path / "body.bin", 8 * MiB))
    assert str(e.value) == sentence
    assert intake.checked == [b"header"]
    assert intake.received == []
    assert spooled(spool) == []  # the spool file is made only after check() accepts


def test_an_answer_from_the_header_ends_the_upload_mid_body(hosts, serve, tmp_path, monkeypatch):
    server, client = hosts
    intake = Intake(tmp_path / "store")

    def answer(peer: str, header: bytes) -> bytes | None:
        intake.checked.append(header)
        return b"known already" if header == b"seen" else None

    monkeypatch.setattr(intake, "check", answer)
    spool = serve(intake)
    # Far bigger than the stream's window: the client is still sending when the answer
    # comes, and must return it rather than wait to send a body nobody reads.
    assert upload(client, server, random_file(tmp_path / "body.bin", 8 * MiB), b"seen") == (
        b"known already"
    )
    assert intake.checked == [b"seen"]
    assert intake.received == []
    assert spooled(spool) == []  # the body was never taken


def test_uploads_past_the_slot_limit_are_refused_not_queued(hosts, serve, tmp_path):
    server, client = hosts
    intake = Intake(tmp_path / "store")
    spool = serve(intake, max_uploads=1)
    fifo = Fifo(tmp_path / "held.fifo")
    first = Background(lambda: upload(client, server, fifo.path))
    fifo.open()
    fifo.write(b"a" * CHUNK)
    wait_until(lambda: len(spooled(spool)) == 1, "the first upload to start spooling")

    with Host(create_new_key_pair()) as other:  # another peer: the first one's is in use
        other.connect(server.addrs[0])
        with pytest.raises(RemoteError, match="busy with other uploads"):
            upload(other, server, random_file(tmp_path / "second.bin", 100))

    fifo.write(b"b" * 10)
    fifo.close()  # ends the first body; it completes normally
    first.join()
    assert first.error is None
    assert (intake.store / sha256_of_bytes(b"a" * CHUNK + b"b" * 10)).exists()
    assert spooled(spool) == []


def test_a_peer_has_one_upload_at_a_time_and_others_are_served_meanwhile(hosts, serve, tmp_path):
    server, client = hosts
    intake = Intake(tmp_path / "store")
    serve(intake)
    fifo = Fifo(tmp_path / "held.fifo")
    first = Background(lambda: upload(client, server, fifo.path))
    fifo.open()
    fifo.write(b"a" * CHUNK)
    wait_until(lambda: len(intake.checked) == 1, "the first upload's header to be checked")

    with pytest.raises(RemoteError, match=r"^this peer has an upload in progress; one at a time$"):
        upload(client, server, random_file(tmp_path / "second.bin", 100))
    with Host(create_new_key_pair()) as other:
        other.connect(server.addrs[0])
        source = random_file(tmp_path / "other.bin", 100)
        assert upload(other, server, source) == f"stored {sha256_of(source)}".encode()

    fifo.close()
    first.join()
    assert first.error is None  # and once it is through, the peer may upload again
    source = random_file(tmp_path / "third.bin", 100)
    assert upload(client, server, source) == f"stored {sha256_of(source)}".encode()


def test_a_body_that_trickles_below_the_pace_is_cut_and_frees_its_slot(hosts, serve, tmp_path):
    server, client = hosts
    intake = Intake(tmp_path / "store")
    # One slot, a second's grace, then 64 KiB/s: a whole chunk sent and then nothing is
    # due within 1 + 4 s; the trickler is cut then, not at the 30 s deadline.
    spool = serve(intake, max_uploads=1, grace=1, min_rate=64 * KiB)
    fifo = Fifo(tmp_path / "trickle.fifo")
    trickler = Background(lambda: upload(client, server, fifo.path))
    fifo.open()
    fifo.write(b"a" * CHUNK)
    wait_until(lambda: len(spooled(spool)) == 1, "the trickle to start spooling")
    wait_until(lambda: spooled(spool) == [], "the server to cut the trickle")
    fifo.close()
    trickler.join()
    assert isinstance(trickler.error, RemoteError)
    assert str(trickler.error) == "the upload came slower than 64 KiB/s; cut off"
    assert intake.received == []
    source = random_file(tmp_path / "next.bin", 100)  # the one slot is free again
    assert upload(client, server, source) == f"stored {sha256_of(source)}".encode()


def test_a_stream_that_sends_no_header_is_cut_after_the_grace(hosts, serve, tmp_path):
    server, client = hosts
    intake = Intake(tmp_path / "store")
    serve(intake, grace=1)

    async def silent() -> bytes:
        # The client's side of the stream, holding it open without a byte.
        stream = await client._host.new_stream(ID.from_base58(server.peer_id), [PROTOCOL])
        try:
            return await wire.read_frame(stream, 1024)
        finally:
            await stream.close()

    reply = client._call(silent)
    assert reply == b'{"error":"no upload header within 1 s"}'
    assert intake.checked == []


def test_a_refused_peer_is_answered_before_its_header_is_read(hosts, tmp_path):
    server, client = hosts
    intake = Intake(tmp_path / "store")
    asked: list[str] = []

    def admit(peer: str) -> None:
        asked.append(peer)
        raise wire.Refusal("this peer has not joined")

    server.serve_upload(SPEC, intake, spool_dir=tmp_path / "spool", admit=admit)

    async def headerless() -> bytes:
        stream = await client._host.new_stream(ID.from_base58(server.peer_id), [PROTOCOL])
        try:
            return await wire.read_frame(stream, 1024)  # nothing sent: the refusal comes anyway
        finally:
            await stream.close()

    assert client._call(headerless) == b'{"error":"this peer has not joined"}'
    assert asked == [client.peer_id]
    assert intake.checked == []


def sha256_of_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


# ---- uploads that go wrong half way ------------------------------------------------------

CLIENT_SCRIPT = """
import sys
from pathlib import Path
from libp2p.crypto.ed25519 import create_new_key_pair
from libp2p.peer.id import ID
from swarmrl.p2p.host import Host
from swarmrl.p2p.protocol import Upload
from tests.codecs import Raw

spec = Upload(sys.argv[2], Raw(), Raw(), header_limit=1024, body_limit=2**30, response_limit=1024,
              deadline=60, chunk_limit=65536)
host = Host(create_new_key_pair())
server = host.connect(sys.argv[1])
host.upload(spec, server, b"header", Path(sys.argv[3]))
"""
ROOT = Path(__file__).resolve().parents[2]


def test_a_client_killed_mid_body_leaves_no_spool_file(hosts, serve, tmp_path):
    server, client = hosts
    intake = Intake(tmp_path / "store")
    spool = serve(intake)
    fifo = Fifo(tmp_path / "body.fifo")
    proc = subprocess.Popen(
        [sys.executable, "-c", CLIENT_SCRIPT, server.addrs[0], PROTOCOL, str(fifo.path)], cwd=ROOT
    )
    try:
        fifo.open()
        fifo.write(os.urandom(CHUNK))
        wait_until(
            lambda: any(p.stat().st_size > 0 for p in spooled(spool)), "body bytes in the spool"
        )
    finally:
        proc.kill()
        proc.wait(HANG_GUARD)
        fifo.close()

    wait_until(lambda: spooled(spool) == [], "the dead client's spool file to go")
    assert intake.received == []
    # The host serves the next upload as if nothing happened.
    source = random_file(tmp_path / "next.bin", 2 * CHUNK)
    assert upload(client, server, source) == f"stored {sha256_of(source)}".encode()


def test_a_stalled_upload_is_dropped_at_the_timeout(hosts, serve, tmp_path):
    server, client = hosts
    intake = Intake(tmp_path / "store")
    spool = serve(intake, deadline=2)
    fifo = Fifo(tmp_path / "body.fifo")
    stalled = Background(lambda: upload(client, server, fifo.path))
    fifo.open()
    fifo.write(os.urandom(CHUNK))
    wait_until(lambda: len(spooled(spool)) == 1, "the upload to start spooling")
    wait_until(lambda: spooled(spool) == [], "the server to drop the stalled upload")
    fifo.close()  # lets the client's blocked read of its file return
    stalled.join()
    assert isinstance(stalled.error, RemoteError)
    assert str(stalled.error) == "the upload took over 2 s"
    assert intake.received == []


def test_a_handler_bug_costs_only_that_upload(hosts, serve, tmp_path):
    server, client = hosts
    intake = Intake(tmp_path / "store")
    spool = serve(intake)
    intake.fail = True
    with pytest.raises(RemoteError) as e:
        upload(client, server, random_file(tmp_path / "one.bin", 3 * CHUNK))
    assert str(e.value) == "the upload failed on the serving peer"
    assert spooled(spool) == []

    intake.fail = False
    source = random_file(tmp_path / "two.bin", 3 * CHUNK)
    assert upload(client, server, source) == f"stored {sha256_of(source)}".encode()
    assert spooled(spool) == []


def test_a_server_that_never_answers_costs_the_client_its_timeout(hosts, serve, tmp_path):
    server, client = hosts
    intake = Intake(tmp_path / "store")
    release = threading.Event()
    original_receive = intake.receive

    def stuck(peer: str, header: bytes, path: Path) -> bytes:
        release.wait(HANG_GUARD)
        return original_receive(peer, header, path)

    intake.receive = stuck  # type: ignore[method-assign]
    spool = serve(intake)
    try:
        with pytest.raises(TimeoutError) as e:
            upload(client, server, random_file(tmp_path / "body.bin", CHUNK), deadline=1)
        assert str(e.value) == f"{server.peer_id} did not take the {PROTOCOL} upload within 1 s"
    finally:
        release.set()
    # The late receive still files the body and cleans up after itself.
    wait_until(lambda: len(intake.received) == 1 and spooled(spool) == [], "the late receive")


def test_limits_below_one_are_refused_at_registration(hosts, tmp_path):
    server, _ = hosts
    with pytest.raises(ValueError, match=r"^body_limit must be at least 1, got 0$"):
        dataclasses.replace(SPEC, body_limit=0)
    with pytest.raises(ValueError, match=r"^chunk_limit must be at least 1, got 0$"):
        dataclasses.replace(SPEC, chunk_limit=0)
    with pytest.raises(ValueError, match=r"^max_uploads must be at least 1, got 0$"):
        server.serve_upload(
            SPEC, Intake(tmp_path / "store"), spool_dir=tmp_path / "spool", max_uploads=0
        )
    assert not (tmp_path / "spool").exists()


def test_a_missing_file_fails_before_anything_is_sent(hosts, serve, tmp_path):
    server, client = hosts
    intake = Intake(tmp_path / "store")
    serve(intake)
    missing = tmp_path / "missing.bin"
    with pytest.raises(OSError, match=r"^cannot read ") as e:
        upload(client, server, missing)
    assert str(e.value) == f"cannot read {missing}: No such file or directory"
    assert intake.checked == []


# ---- memory ------------------------------------------------------------------------------


def test_a_large_upload_is_never_held_in_memory(hosts, serve, tmp_path):
    server, client = hosts
    intake = Intake(tmp_path / "store", keep=False)
    serve(intake)
    size = 40 * MiB
    source = random_file(tmp_path / "big.bin", size)
    upload(client, server, random_file(tmp_path / "warmup.bin", 2 * CHUNK))

    tracemalloc.start()
    try:
        upload(client, server, source)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert len(intake.received) == 2
    # Both hosts live in this process, so the peak counts the sender's side too: its
    # chunks and the two stream windows (py-libp2p's yamux grows one to 16 MiB at
    # most), a bound that does not grow with the file.
    used = f"{peak / MiB:.1f} MiB for a {size // MiB} MiB file"
    assert peak < size // 2, f"the upload peaked at {used}"


def test_a_host_takes_no_more_connections_than_its_limit():
    """The limit reaches py-libp2p's resource manager, whose own default (256 inbound)
    held an orchestrator to 255 nodes whatever its ConnectionConfig said."""
    with Host(create_new_key_pair(), max_connections=2) as server:
        clients = [Host(create_new_key_pair()) for _ in range(4)]
        try:
            reached = 0
            for client in clients:
                try:
                    client.connect(server.addrs[0], timeout=5)
                    reached += 1
                except ConnectionError:
                    pass
            assert 1 <= reached <= 2
            assert len(server.peers()) <= 2
        finally:
            for client in clients:
                client.close()
