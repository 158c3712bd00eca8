"""The node's rate caps measured on loopback: the weight server's sends under one cap
shared by all its connections and by the host's uploads (a node's submissions, which
go first), and a download whose cap is raised while it runs.

Every claim is a ratio with slack, never a tight time. A capped transfer of about
1.5 s averages at most HIGH times its cap: the pacer lets BURST_SECONDS of saved
credit and one chunk per user past the cap, about 1.2 times over such a span. It
averages at least LOW times its cap (a cap is not a stall, even on a busy machine),
and without the cap loopback is many times faster.
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from eth_account import Account
from eth_utils import keccak
from libp2p.crypto.ed25519 import create_new_key_pair

from swarmrl import shards
from swarmrl.eip712 import swarm_domain
from swarmrl.p2p.host import Host
from swarmrl.p2p.pacing import Pacer
from swarmrl.weights.datapath import BUSY, Endpoint, ShardClient, ShardServer, ShardUnavailableError
from swarmrl.weights.download import Download, PeerBook, Progress
from swarmrl.weights.peer_records import Announcement
from swarmrl.weights.store import Version, WeightStore
from tests.integration.test_p2p_upload import SPEC, Intake

ORIGIN = Account.from_key(keccak(text="swarmrl rate caps origin"))
DOMAIN = swarm_domain(31337, "0x5FbDB2315678afecb367f032d93F642f64180aa3")
MiB = 1024 * 1024
SHARD = 64 * 1024
SIZE = 6 * MiB
CAP = 4 * MiB  # bytes a second: SIZE in 1.5 s
HIGH, LOW = 1.3, 0.4
HANG_GUARD = 30.0  # seconds; only stops a broken test from hanging


@pytest.fixture
def origin(tmp_path: Path) -> Iterator[tuple[WeightStore, Version]]:
    """A store holding one SIZE-byte checkpoint in SHARD-byte shards."""
    path = tmp_path / "step1.bin"
    path.write_bytes(random.Random(1).randbytes(SIZE))
    manifest = shards.build_manifest(path, model="org/model", step=1, shard_size=SHARD)
    store = WeightStore(tmp_path / "origin")
    version = store.add_origin(path, manifest, Announcement.sign(ORIGIN, manifest, DOMAIN))
    yield store, version
    version.close()


@contextmanager
def serving(store: WeightStore, pacer: Pacer | None) -> Iterator[ShardServer]:
    server = ShardServer(store.get, host="127.0.0.1", pacer=pacer)
    try:
        yield server
    finally:
        server.close()


def fetch(
    endpoint: Endpoint, version: Version, indexes: range, stop: threading.Event | None = None
) -> int:
    """Fetches the shards at `indexes` over one connection, or until `stop`; the bytes
    received."""
    client = ShardClient(endpoint)
    buffer = bytearray(SHARD)
    received = 0
    try:
        for index in indexes:
            if stop is not None and stop.is_set():
                break
            length = version.locate(index)[2]
            received += len(client.fetch(version.manifest_hash, index, length, buffer))
    finally:
        client.close()
    return received


def timed_fetch(endpoint: Endpoint, version: Version) -> float:
    """The rate, in bytes a second, of fetching every shard over one connection."""
    start = time.monotonic()
    received = fetch(endpoint, version, range(version.manifest.shard_count))
    return received / (time.monotonic() - start)


def test_the_weight_server_keeps_to_its_upload_cap_and_is_far_faster_without(origin):
    store, version = origin
    with serving(store, Pacer(CAP)) as server:
        capped = timed_fetch(server.endpoint, version)
    with serving(store, None) as server:
        free = timed_fetch(server.endpoint, version)
    assert LOW * CAP <= capped <= HIGH * CAP
    assert free > 5 * CAP


def test_two_connections_share_one_cap(origin):
    store, version = origin
    count = version.manifest.shard_count
    rates: list[float] = []

    def client(indexes: range) -> None:
        start = time.monotonic()
        received = fetch(server.endpoint, version, indexes)
        rates.append(received / (time.monotonic() - start))

    with serving(store, Pacer(CAP)) as server:
        start = time.monotonic()
        threads = [
            threading.Thread(target=client, args=(range(half, count, 2),)) for half in (0, 1)
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join(HANG_GUARD)
        together = SIZE / (time.monotonic() - start)
    # One cap for both, not one each (that would be twice the cap), and shared: each
    # connection got about half.
    assert together <= HIGH * CAP
    assert len(rates) == 2
    assert all(LOW / 2 * CAP <= rate <= HIGH / 2 * CAP for rate in rates)


def test_a_submission_shares_the_cap_with_the_weight_server_and_goes_first(origin, tmp_path):
    """Four peers pull shards through the cap while the node uploads: shared equally the
    upload would get a fifth of the cap; going first it gets nearly all of it."""
    store, version = origin
    pacer = Pacer(CAP)
    body = tmp_path / "rollouts.bin"
    body.write_bytes(random.Random(2).randbytes(2 * MiB))
    receiver = Host(create_new_key_pair())
    node = Host(create_new_key_pair(), upload_pacer=pacer)
    stop = threading.Event()
    try:
        receiver.serve_upload(SPEC, Intake(tmp_path / "kept"), spool_dir=tmp_path / "spool")
        node.connect(receiver.addrs[0])
        with serving(store, pacer) as server:

            def peer() -> None:
                while not stop.is_set():
                    fetch(server.endpoint, version, range(version.manifest.shard_count), stop)

            peers = [threading.Thread(target=peer, daemon=True) for _ in range(4)]
            start = time.monotonic()
            for p in peers:
                p.start()
            time.sleep(0.5)  # the peers have the cap to themselves
            sent = time.monotonic()
            node.upload(SPEC, receiver.peer_id, b"header", body)
            upload = body.stat().st_size / (time.monotonic() - sent)
            stop.set()
            for p in peers:
                p.join(HANG_GUARD)
            served = server.bytes_served
            together = (served + body.stat().st_size) / (time.monotonic() - start)
    finally:
        stop.set()
        node.close()
        receiver.close()
    assert 0.5 * CAP <= upload <= HIGH * CAP
    # Under one cap, not one each (twice the cap at least). Five users over a second:
    # their chunks past the cap and the saved credit weigh more than over 1.5 s.
    assert together <= 1.5 * CAP


def test_a_download_cap_raised_while_it_runs_speeds_it_up(origin, tmp_path):
    store, version = origin
    slow, fast = 2 * MiB, 64 * MiB
    pacer = Pacer(slow)
    held: list[tuple[float, int]] = []  # (seconds, bytes) after each shard
    mine = WeightStore(tmp_path / "node")
    with serving(store, None) as server:
        fetching = mine.begin(version.announcement, version.manifest)
        book = PeerBook()
        count = version.manifest.shard_count
        book.update(
            "origin",
            endpoint=server.endpoint,
            account=None,
            addrs=[],
            holdings={version.manifest_hash: bytearray([1] * count)},
        )

        def progress(p: Progress) -> None:
            held.append((p.seconds, p.bytes_done))

        download = Download(mine, fetching, book, pacer=pacer, on_progress=progress)
        thread = threading.Thread(target=download.run, args=(HANG_GUARD,))
        thread.start()
        time.sleep(1.2)
        raised = held[-1]
        pacer.rate = fast
        thread.join(HANG_GUARD)
        fetching.close()
    assert download.done
    # The steady rate before (past the first shards, which come before any wait) and
    # the rate after, measured on the download's own clock.
    early = next(h for h in held if h[0] >= 0.4)
    before = (raised[1] - early[1]) / (raised[0] - early[0])
    after = (held[-1][1] - raised[1]) / (held[-1][0] - raised[0])
    assert LOW * slow <= before <= HIGH * slow
    assert after > 4 * before


def test_a_halted_server_answers_busy_until_it_has_a_rate_again(origin):
    store, version = origin
    pacer = Pacer(0)
    with serving(store, pacer) as server:
        client = ShardClient(server.endpoint)
        try:
            with pytest.raises(ShardUnavailableError) as refused:
                client.fetch(version.manifest_hash, 0, SHARD, bytearray(SHARD))
            assert refused.value.status == BUSY
            pacer.rate = None
            assert len(client.fetch(version.manifest_hash, 0, SHARD, bytearray(SHARD))) == SHARD
        finally:
            client.close()
