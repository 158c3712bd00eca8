"""The weight swarm on loopback: real libp2p hosts, real TCP data paths, real files.

Each test builds its own small swarm (an origin and a few nodes in this
process; their hosts and servers run in their own threads) and checks what a
node ends up with on disk, what it refused, and whom it banned.
"""

from __future__ import annotations

import logging
import socket
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
import torch
from eth_account import Account
from libp2p.crypto.ed25519 import create_new_key_pair
from safetensors.torch import save_file

from orchestrator.run_dir import RunDir
from swarmrl.eip712 import swarm_domain
from swarmrl.p2p import wire
from swarmrl.p2p.host import Host, RemoteError
from swarmrl.p2p.pacing import Pacer
from swarmrl.weights import delta_versions
from swarmrl.weights.advertiser import MAX_POLL_INTERVAL, POLL_INTERVAL, Advertiser
from swarmrl.weights.datapath import BAD_REQUEST, MAGIC
from swarmrl.weights.dialback import DIALBACK, DialbackRequest
from swarmrl.weights.download import PeerBook
from swarmrl.weights.gossip import (
    MAX_ADVERT_BYTES,
    Advert,
    Holding,
    checkpoints_topic,
    peers_topic,
    swarm_topics,
)
from swarmrl.weights.have import HAVE, HaveRequest
from swarmrl.weights.manifest import MANIFEST, ManifestRequest
from swarmrl.weights.peer import SwarmNode
from swarmrl.weights.peer_events import SwarmEventKind
from swarmrl.weights.store import WeightStore
from tests.codecs import raw
from tests.unit.test_weights_store import make_checkpoint

SHARD = 256 * 1024
DOMAIN = swarm_domain(31337, "0x" + "44" * 20)
RUN = "test"
WAIT = 60


@pytest.fixture
def origin_key():
    return Account.create()


@pytest.fixture
def checkpoint(tmp_path):
    path = tmp_path / "model.safetensors"
    rng = np.random.default_rng(7)
    path.write_bytes(rng.integers(0, 256, 16 * SHARD + 1234, dtype=np.uint8).tobytes())
    return path


@pytest.fixture
def swarm(tmp_path, origin_key):
    """Makes nodes (origins when given a key) and closes them all after the test."""
    made = []

    def make(name, *, account=None, trusted=None, bootstrap=(), keep=3, on_event=None, **kwargs):
        # A peer with no bootstrap is the one the others dial: known reachable.
        kwargs.setdefault("reachable", not bootstrap)
        node = SwarmNode.standalone(
            store=WeightStore(tmp_path / name, keep=keep),
            domain=DOMAIN,
            run=RUN,
            trusted=trusted or [origin_key.address],
            peer_key=create_new_key_pair(),
            account=account,
            bootstrap=bootstrap,
            on_event=on_event,
            **kwargs,
        )
        made.append(node)
        return node

    yield make
    for node in made:
        node.close()


def _events():
    seen = []
    return seen, seen.append


def test_nodes_fetch_a_verified_copy_and_serve_it_on(swarm, origin_key, checkpoint):
    origin = swarm("origin", account=origin_key)
    origin.publish(checkpoint, model="demo", step=1, shard_size=SHARD)
    first = swarm("first", bootstrap=origin.addrs)
    assert first.wait_for(1, timeout=WAIT).path.read_bytes() == checkpoint.read_bytes()

    # With the origin gone, a late node gets every byte from the first node.
    origin.close()
    late = swarm("late", bootstrap=first.addrs)
    version = late.wait_for(1, timeout=WAIT)
    assert version.path.read_bytes() == checkpoint.read_bytes()
    assert first.server.bytes_served == checkpoint.stat().st_size


def test_a_node_that_listens_nowhere_still_fetches_and_offers_nothing(
    swarm, origin_key, checkpoint
):
    """Behind NAT: it dials out, gets every byte over its own connections, and its advert
    offers no address and no data path, so no peer tries to fetch from it."""
    origin = swarm("origin", account=origin_key)
    hidden = swarm("hidden", listen=None, bootstrap=origin.addrs)
    origin.publish(checkpoint, model="demo", step=1, shard_size=SHARD)
    assert hidden.wait_for(1, timeout=WAIT).path.read_bytes() == checkpoint.read_bytes()
    advert = hidden.advert()
    assert (advert.addrs, advert.data, hidden.server) == ([], None, None)
    assert advert.holdings  # it still says what it holds
    seen = origin.book.get(hidden.peer_id)
    assert seen is not None
    assert seen.endpoint is None


def test_many_nodes_share_the_load(swarm, origin_key, checkpoint):
    origin = swarm("origin", account=origin_key)
    nodes = [swarm(f"n{i}", bootstrap=origin.addrs) for i in range(4)]
    origin.publish(checkpoint, model="demo", step=1, shard_size=SHARD)
    for node in nodes:
        assert node.wait_for(1, timeout=WAIT).path.read_bytes() == checkpoint.read_bytes()
    size = checkpoint.stat().st_size
    delivered = origin.server.bytes_served + sum(n.server.bytes_served for n in nodes)
    assert delivered >= 4 * size  # endgame races may fetch a few shards twice


def test_a_peer_killed_mid_transfer_is_routed_around(swarm, origin_key, checkpoint):
    origin = swarm("origin", account=origin_key)
    origin.publish(checkpoint, model="demo", step=1, shard_size=SHARD)
    seeder = swarm("seeder", bootstrap=origin.addrs)
    seeder.wait_for(1, timeout=WAIT)

    killed = threading.Event()

    def kill_seeder_once(event):
        if event.kind is SwarmEventKind.PROGRESS and not killed.is_set():
            killed.set()
            seeder.close()

    node = swarm("node", bootstrap=seeder.addrs + origin.addrs, on_event=kill_seeder_once)
    assert node.wait_for(1, timeout=WAIT).path.read_bytes() == checkpoint.read_bytes()
    assert killed.is_set()


def test_a_failed_polling_round_does_not_end_polling_and_close_ends_it(swarm, caplog):
    node = swarm("lone")
    rounds = []

    def advert_once_broken(*, force=False):
        rounds.append(force)
        if len(rounds) == 1:
            raise OSError("the network went away for a moment")

    node.advertiser.send_advert = advert_once_broken
    deadline = time.monotonic() + WAIT
    with caplog.at_level(logging.ERROR, logger="swarmrl.p2p"):
        while len(rounds) < 2:
            assert time.monotonic() < deadline, "polling stopped after a failed round"
            time.sleep(0.05)
    assert "polling peers failed" in caplog.text
    node.close()
    node.advertiser._poller.join(timeout=WAIT)
    assert not node.advertiser._poller.is_alive()


def test_a_peer_serving_corrupt_bytes_is_banned_and_nothing_corrupt_is_kept(
    swarm, origin_key, checkpoint, caplog
):
    origin = swarm("origin", account=origin_key)
    origin.publish(checkpoint, model="demo", step=1, shard_size=SHARD)
    liar = swarm("liar", bootstrap=origin.addrs)
    held = liar.wait_for(1, timeout=WAIT)
    with open(held.path, "r+b") as f:  # flips one byte in every shard it serves
        for offset in range(100, checkpoint.stat().st_size, SHARD):
            f.seek(offset)
            f.write(b"\xff" if f.read(1) != b"\xff" else b"\x00")
    origin.close()

    seen, record = _events()
    with caplog.at_level(logging.WARNING, logger="swarmrl.p2p"):
        node = swarm("node", bootstrap=liar.addrs, on_event=record)
        deadline = time.monotonic() + WAIT
        while not (banned := [e for e in seen if e.kind is SwarmEventKind.BANNED]):
            assert time.monotonic() < deadline, "the liar was never caught"
            time.sleep(0.05)
        with pytest.raises(TimeoutError):  # the liar is all it knows, and it is banned
            node.wait_for(1, timeout=1)
    assert "failed verification" in banned[0].detail
    assert node.book.is_banned(liar.peer_id)
    version = node.store.versions()[0]
    assert version.held_count == 0
    assert not version.complete
    assert "banned peer" in caplog.text

    # An honest origin appears: the node finishes from it alone.
    honest = swarm("honest", account=origin_key)
    honest.publish(checkpoint, model="demo", step=1, shard_size=SHARD)
    node.join(honest.addrs[0])
    assert node.wait_for(1, timeout=WAIT).path.read_bytes() == checkpoint.read_bytes()


def test_an_untrusted_signer_is_rejected(swarm, origin_key, checkpoint, caplog):
    impostor = Account.create()
    fake = swarm("fake", account=impostor, trusted=[impostor.address])
    fake.publish(checkpoint, model="demo", step=5, shard_size=SHARD)
    seen, record = _events()
    with caplog.at_level(logging.WARNING, logger="swarmrl.p2p"):
        node = swarm("node", bootstrap=fake.addrs, on_event=record)
    rejected = [e for e in seen if e.kind == "rejected"]
    assert rejected
    assert f"untrusted {impostor.address}" in rejected[0].detail
    assert "rejected checkpoint step 5: checkpoint step 5 is signed by untrusted" in caplog.text
    assert node.store.versions() == []


def test_an_older_step_is_rejected(swarm, origin_key, checkpoint, tmp_path, caplog):
    origin = swarm("origin", account=origin_key)
    origin.publish(checkpoint, model="demo", step=2, shard_size=SHARD)
    seen, record = _events()
    node = swarm("node", bootstrap=origin.addrs, on_event=record)
    node.wait_for(2, timeout=WAIT)

    # The same key signs an older step elsewhere (a replay, or a confused origin).
    stale = swarm("stale", account=origin_key)
    older = tmp_path / "older.bin"
    older.write_bytes(b"old weights" * 1000)
    stale.publish(older, model="demo", step=1, shard_size=SHARD)
    seen.clear()  # only what the node hears from here on
    with caplog.at_level(logging.WARNING, logger="swarmrl.p2p"):
        node.join(stale.addrs[0])
    assert [e.detail for e in seen if e.kind == "rejected"] == ["step 1 is not newer than step 2"]
    assert [v.step for v in node.store.versions()] == [2]
    assert "rejected checkpoint step 1" in caplog.text


def test_newer_steps_replace_older_ones_keeping_the_last_n(swarm, origin_key, tmp_path):
    origin = swarm("origin", account=origin_key, keep=5)
    node = swarm("node", bootstrap=origin.addrs, keep=2)
    for step in range(1, 5):
        path = tmp_path / f"ckpt-{step}.bin"
        path.write_bytes(bytes([step]) * (3 * SHARD))
        origin.publish(path, model="demo", step=step, shard_size=SHARD)
        assert node.wait_for(step, timeout=WAIT).path.read_bytes() == path.read_bytes()
    assert [v.step for v in node.store.versions()] == [3, 4]
    assert len(list((tmp_path / "node").glob("step-*"))) == 2


def test_a_restarted_node_resumes_from_the_shards_on_disk(swarm, origin_key, checkpoint, tmp_path):
    origin = swarm("origin", account=origin_key)
    origin.publish(checkpoint, model="demo", step=1, shard_size=SHARD)
    crashed = threading.Event()
    known = threading.Event()  # progress can come before swarm() has returned the node
    holder = {}

    def close_when_known():
        known.wait(WAIT)
        holder["node"].close()

    def crash_after_some(event):
        enough = event.kind is SwarmEventKind.PROGRESS and event.progress.held >= 6
        if enough and not crashed.is_set():
            crashed.set()
            threading.Thread(target=close_when_known).start()

    holder["node"] = swarm("node", bootstrap=origin.addrs, on_event=crash_after_some)
    known.set()
    assert crashed.wait(WAIT)
    holder["node"].close()
    served_before = origin.server.bytes_served

    again = SwarmNode.standalone(
        store=WeightStore(tmp_path / "node"),
        domain=DOMAIN,
        run=RUN,
        trusted=[origin_key.address],
        peer_key=create_new_key_pair(),
        bootstrap=origin.addrs,
    )
    try:
        assert again.wait_for(1, timeout=WAIT).path.read_bytes() == checkpoint.read_bytes()
    finally:
        again.close()
    refetched = origin.server.bytes_served - served_before
    assert refetched <= checkpoint.stat().st_size - 6 * SHARD


def test_a_model_directory_arrives_as_its_files(swarm, origin_key, tmp_path):
    model_dir = tmp_path / "policy"
    (model_dir / "trainer").mkdir(parents=True)
    (model_dir / "config.json").write_text('{"hidden": 64}')
    (model_dir / "model.safetensors").write_bytes(bytes(range(256)) * 5000)
    (model_dir / "trainer" / "trainer_state.pt").write_bytes(b"the optimizer's moments")
    origin = swarm("origin", account=origin_key)
    origin.publish(model_dir, model="policy", step=1, shard_size=SHARD)
    node = swarm("node", bootstrap=origin.addrs)
    got = node.wait_for(1, timeout=WAIT).path
    assert sorted(p.name for p in got.iterdir()) == ["config.json", "model.safetensors"]
    assert (got / "config.json").read_text() == '{"hidden": 64}'
    assert (got / "model.safetensors").read_bytes() == bytes(range(256)) * 5000


def test_an_origins_versions_are_kept_and_pruned_and_found_after_a_restart(
    swarm, origin_key, tmp_path
):
    store = tmp_path / "origin"
    origin = swarm("origin", account=origin_key, keep=2)
    for step in (1, 2, 3):
        policy = RunDir(tmp_path).step(step)
        policy.mkdir(parents=True)
        (policy / "model.safetensors").write_bytes(bytes([step]) * 3 * SHARD)
        origin.publish(policy, model="policy", step=step, shard_size=SHARD)
    kept = sorted(p.name[:15] for p in store.glob("step-*"))
    assert kept == ["step-0000000002", "step-0000000003"]
    # The trainer's own files stay where it wrote them, whatever the store drops.
    assert (RunDir(tmp_path).step(1) / "model.safetensors").is_file()
    origin.close()
    again = swarm("origin", account=origin_key, keep=2)  # the orchestrator restarted
    assert [v.step for v in again.store.versions()] == [2, 3]
    node = swarm("node", bootstrap=again.addrs)
    assert node.wait_for(3, timeout=WAIT).path.read_bytes() == bytes([3]) * 3 * SHARD


def test_idle_connections_do_not_stall_transfers(swarm, origin_key, checkpoint):
    origin = swarm("origin", account=origin_key)
    origin.publish(checkpoint, model="demo", step=1, shard_size=SHARD)
    endpoint = origin.server.endpoint
    p2p_port = int(origin.addrs[0].split("/")[4])
    idle = [socket.create_connection((endpoint.host, endpoint.port)) for _ in range(8)]
    idle += [socket.create_connection(("127.0.0.1", p2p_port)) for _ in range(4)]
    half = socket.create_connection((endpoint.host, endpoint.port))
    half.sendall(MAGIC + b"\x00" * 10)  # a request that never finishes
    try:
        node = swarm("node", bootstrap=origin.addrs)
        assert node.wait_for(1, timeout=WAIT).path.read_bytes() == checkpoint.read_bytes()
    finally:
        for s in [*idle, half]:
            s.close()


def test_garbage_on_every_protocol_is_refused_and_the_host_keeps_serving(
    swarm, origin_key, checkpoint
):
    origin = swarm("origin", account=origin_key)
    origin.publish(checkpoint, model="demo", step=1, shard_size=SHARD)
    prober = swarm("prober")
    peer = prober.host.connect(origin.addrs[0])

    for spec in (MANIFEST, HAVE):
        # The protocol's id, asked in bytes no spec would encode.
        garbled = raw(spec, response_limit=MAX_ADVERT_BYTES, call_timeout=10)
        for garbage in (b"", b"\xff\xfe not json", b'{"manifest_hash": 7}', b"[" * 1000):
            with pytest.raises(RemoteError, match=r"invalid|JSON|must be"):
                prober.host.call(garbled, peer, garbage)
        # A have request carries the asker's advert, so its limit is an advert's.
        limit = MAX_ADVERT_BYTES if spec is HAVE else 1024
        with pytest.raises(RemoteError, match=f"over the {limit}-byte limit"):
            prober.host.call(garbled, peer, b"x" * (limit + 1))
    with pytest.raises(RemoteError, match="no such checkpoint"):
        prober.host.call(MANIFEST, peer, ManifestRequest(manifest_hash="0" * 64))
    for topic in (checkpoints_topic(RUN), peers_topic(RUN)):
        prober.host.publish(topic, b"\x00garbage")
        prober.host.publish(topic, wire.dump_json({"model": "x" * 10_000}))

    with socket.create_connection((origin.server.endpoint.host, origin.server.endpoint.port)) as s:
        s.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n" + b"\x00" * 20)
        assert s.recv(1)[0] == BAD_REQUEST

    node = swarm("node", bootstrap=origin.addrs)
    assert node.wait_for(1, timeout=WAIT).path.read_bytes() == checkpoint.read_bytes()


def test_peers_know_each_other_by_signed_record(swarm, origin_key, checkpoint):
    origin = swarm("origin", account=origin_key)
    origin.publish(checkpoint, model="demo", step=1, shard_size=SHARD)
    staker = Account.create()
    node = swarm("node", account=staker, bootstrap=origin.addrs)
    node.wait_for(1, timeout=WAIT)
    # The origin learns the node's account from the node's advert (polled or gossiped).
    other = swarm("other", bootstrap=node.addrs)
    other.wait_for(1, timeout=WAIT)
    assert other.book.get(node.peer_id).account == staker.address
    assert other.book.get(origin.peer_id).account == origin_key.address


def test_a_newer_step_supersedes_a_download_in_progress(swarm, origin_key, tmp_path):
    origin = swarm("origin", account=origin_key)
    first, second = tmp_path / "one.bin", tmp_path / "two.bin"
    first.write_bytes(b"\x01" * (64 * SHARD))
    second.write_bytes(b"\x02" * (8 * SHARD))
    started = threading.Event()
    node = swarm(
        "node",
        bootstrap=origin.addrs,
        on_event=lambda e: e.kind == "progress" and e.step == 1 and started.set(),
    )
    origin.publish(first, model="demo", step=1, shard_size=SHARD)
    assert started.wait(WAIT)
    origin.publish(second, model="demo", step=2, shard_size=SHARD)
    assert node.wait_for(2, timeout=WAIT).path.read_bytes() == second.read_bytes()
    # Step 1 either finished first or is dropped once its fetchers stop; never kept
    # half-fetched.
    deadline = time.monotonic() + WAIT
    while list((tmp_path / "node").rglob("*.partial")) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not list((tmp_path / "node").rglob("*.partial"))
    assert all(version.complete for version in node.store.versions())


def _lag_behind(swarm, origin_key, tmp_path, window):
    """A node whose downloads are capped at 1 MiB/s gets step 1 (4 MiB: 4 s), and steps
    2 and 3 are published while it lasts. The origin, the node, the steps it finished
    in order, and each step's file."""
    origin = swarm("origin", account=origin_key)
    steps = {s: tmp_path / f"step{s}.bin" for s in (1, 2, 3)}
    for s, path in steps.items():
        path.write_bytes(bytes([s]) * ((16 if s == 1 else 2) * SHARD))
    ready, started = [], threading.Event()

    def on_event(e):
        if e.kind == SwarmEventKind.READY:
            ready.append(e.step)
        elif e.kind == SwarmEventKind.PROGRESS and e.step == 1:
            started.set()

    node = swarm("node", bootstrap=origin.addrs, on_event=on_event, download_pacer=Pacer(1024**2))
    node.window = window
    origin.publish(steps[1], model="demo", step=1, shard_size=SHARD)
    assert started.wait(WAIT)
    for s in (2, 3):
        origin.publish(steps[s], model="demo", step=s, shard_size=SHARD)
    return origin, node, ready, steps


def test_a_lagging_node_finishes_a_step_within_the_window_then_takes_the_newest(
    swarm, origin_key, tmp_path
):
    origin, node, ready, steps = _lag_behind(swarm, origin_key, tmp_path, window=2)
    assert node.wait_for(3, timeout=WAIT).path.read_bytes() == steps[3].read_bytes()
    assert node.newest_announced == 3
    # Step 1 was two steps behind, inside the window: finished, not thrown away; step 2
    # was superseded while it waited, so never fetched.
    assert ready == [1, 3]
    assert origin.server.shards_served == 16 + 2


def test_a_node_pushed_past_the_window_drops_its_download_for_the_newest(
    swarm, origin_key, tmp_path
):
    _, node, ready, steps = _lag_behind(swarm, origin_key, tmp_path, window=1)
    assert node.wait_for(3, timeout=WAIT).path.read_bytes() == steps[3].read_bytes()
    deadline = time.monotonic() + WAIT
    while list((tmp_path / "node").rglob("*.partial")) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert ready == [3]
    assert [v.step for v in node.store.versions()] == [3]
    assert not list((tmp_path / "node").rglob("*.partial"))


def test_a_node_serves_shards_only_after_a_peer_dialled_it_back(swarm, origin_key, checkpoint):
    events = []
    origin = swarm("origin", account=origin_key)
    node = swarm("node", bootstrap=origin.addrs, on_event=events.append)
    assert node.serving  # join asked the origin, which reached the data endpoint
    assert node.advert().data == str(node.server.endpoint)
    assert [e.detail for e in events if e.kind == "reachable"] == [str(node.server.endpoint)]
    origin.publish(checkpoint, model="demo", step=1, shard_size=SHARD)
    node.wait_for(1, timeout=WAIT)
    origin.close()  # the dialled-back node is the only source left
    late = swarm("late", bootstrap=node.addrs)
    assert late.wait_for(1, timeout=WAIT).path.read_bytes() == checkpoint.read_bytes()
    assert node.server.bytes_served > 0


def test_a_node_no_one_can_dial_back_offers_no_data_path(swarm, origin_key, checkpoint):
    """As behind NAT: its data server listens on 127.0.0.2 while its connections come
    from 127.0.0.1, so the origin's probe (to the address it sees) finds nothing."""
    origin = swarm("origin", account=origin_key)
    natted = swarm("natted", listen="/ip4/127.0.0.2/tcp/0", bootstrap=origin.addrs)
    assert not natted.serving
    origin.publish(checkpoint, model="demo", step=1, shard_size=SHARD)
    assert natted.wait_for(1, timeout=WAIT).path.read_bytes() == checkpoint.read_bytes()
    assert natted.advert().data is None
    seen = origin.book.get(natted.peer_id)
    assert seen is not None
    assert seen.endpoint is None
    assert natted.server.bytes_served == 0


def test_a_peer_dials_an_asker_back_at_most_once_per_gap(swarm):
    first = swarm("first")
    asker = swarm("asker", bootstrap=first.addrs)
    assert asker.serving
    # The asker names only a port: the probe goes to the address its connection
    # comes from; a second request inside the gap is refused.
    request = DialbackRequest(port=asker.server.endpoint.port, nonce="ab" * 32)
    with pytest.raises(RemoteError, match="one dial-back per"):
        asker.host.call(DIALBACK, first.peer_id, request)


def test_a_node_on_a_shared_host_leaves_the_host_to_its_owner(
    swarm, origin_key, checkpoint, tmp_path
):
    """A node's process starts one host for its work session and its weight swarm:
    closing the swarm leaves that host up for its owner, and the closed swarm takes no
    checkpoint it hears of afterwards."""
    origin = swarm("origin", account=origin_key)
    origin.publish(checkpoint, model="demo", step=1, shard_size=SHARD)
    host = Host(create_new_key_pair(), topics=swarm_topics(RUN))
    try:
        node = SwarmNode(
            host,
            store=WeightStore(tmp_path / "shared"),
            domain=DOMAIN,
            run=RUN,
            trusted=[origin_key.address],
        )
        assert node.peer_id == host.peer_id
        node.close()
        peer = host.connect(origin.addrs[0])  # the host still dials and answers
        assert peer == origin.peer_id
        with pytest.raises(RemoteError, match="no such checkpoint"):
            origin.host.call(MANIFEST, host.peer_id, ManifestRequest())
        node.fetcher.catch_up(peer)  # offered step 1 after closing: not taken
        assert node.store.versions() == []
    finally:
        host.close()


def test_a_host_started_without_the_swarm_topics_is_refused(tmp_path, origin_key):
    with Host(create_new_key_pair()) as host, pytest.raises(ValueError, match="topic"):
        SwarmNode(
            host,
            store=WeightStore(tmp_path / "node"),
            domain=DOMAIN,
            run=RUN,
            trusted=[origin_key.address],
        )


def test_a_call_in_flight_when_its_host_closes_fails_as_closed():
    """A host closed while a call waits inside a nursery (as py-libp2p's dials do) cancels
    it as a group with Cancelled inside; the calling thread gets the one RuntimeError the
    swarm's pollers handle, not a BaseExceptionGroup that kills them."""
    import trio

    host = Host(create_new_key_pair())
    entered = threading.Event()
    failure: list[BaseException] = []

    async def two_waits() -> None:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(trio.sleep_forever)
            nursery.start_soon(trio.sleep_forever)
            entered.set()

    def caller() -> None:
        try:
            host._call(two_waits)
        except BaseException as e:  # what reaches the thread is the point
            failure.append(e)

    thread = threading.Thread(target=caller)
    thread.start()
    assert entered.wait(timeout=30)
    host.close()
    thread.join(timeout=30)
    assert not thread.is_alive()
    assert [type(e) for e in failure] == [RuntimeError]
    assert str(failure[0]) == "the libp2p host is closed"


def _policy_steps(tmp_path, count):
    """`count` steps of a bf16 policy directory, each a small move of every weight from
    the one before (1e-4 of itself: about 1.5% of the bf16 values change)."""
    generator = torch.Generator().manual_seed(0)
    weights = {"embed": torch.randn(512, 256), "proj": torch.randn(256, 256)}
    out = []
    for step in range(1, count + 1):
        directory = tmp_path / f"policy-{step}"
        directory.mkdir()
        save_file(
            {k: v.to(torch.bfloat16) for k, v in weights.items()}, directory / "w.safetensors"
        )
        (directory / "config.json").write_text('{"hidden": 256}')
        out.append(directory)
        weights = {
            k: v * (1 + 1e-4 * torch.randn(v.shape, generator=generator))
            for k, v in weights.items()
        }
    return out


def _same_files(version, directory):
    return {p.name: p.read_bytes() for p in version.files_dir.iterdir()} == {
        p.name: p.read_bytes() for p in directory.iterdir()
    }


def test_a_node_holding_the_step_before_fetches_only_the_delta_and_rebuilds_it_bit_for_bit(
    swarm, origin_key, tmp_path
):
    policies = _policy_steps(tmp_path, 3)
    full = sum(p.stat().st_size for p in policies[0].iterdir())
    origin = swarm("origin", account=origin_key)
    node = swarm("node", bootstrap=origin.addrs)
    origin.publish(policies[0], model="p", step=1, shard_size=SHARD, delta=True)
    assert _same_files(node.wait_for(1, timeout=WAIT), policies[0])
    for step in (2, 3):
        served = origin.server.bytes_served
        origin.publish(policies[step - 1], model="p", step=step, shard_size=SHARD, delta=True)
        assert _same_files(node.wait_for(step, timeout=WAIT), policies[step - 1])
        # Only the delta travelled: under a tenth of the policy.
        assert origin.server.bytes_served - served < full / 10
    assert sorted((v.step, v.is_delta) for v in node.store.versions()) == [
        (1, False),
        (2, False),
        (2, True),
        (3, False),
        (3, True),
    ]
    # A node that joins late gets the newest step bit for bit, from whoever holds it:
    # whole, or as a delta onto a step it took first (gossipsub hands a newcomer the
    # last seconds' announcements, in any order), never a delta onto a base it lacks.
    late = swarm("late", bootstrap=node.addrs)
    assert _same_files(late.wait_for(3, timeout=WAIT), policies[2])
    held = {(v.step, v.is_delta) for v in late.store.versions()}
    assert (3, False) in held
    assert all((step - 1, False) in held for step, is_delta in held if is_delta)


def test_a_delta_that_does_not_rebuild_its_step_is_refused_and_the_step_fetched_whole(
    swarm, origin_key, tmp_path, monkeypatch, caplog
):
    policies = _policy_steps(tmp_path, 2)
    origin = swarm("origin", account=origin_key)
    node = swarm("node", bootstrap=origin.addrs)
    origin.publish(policies[0], model="p", step=1, shard_size=SHARD, delta=True)
    held = node.wait_for(1, timeout=WAIT)

    def rebuild_one_bit_off(base_dir, delta_dir, target, out):
        real_rebuild(base_dir, delta_dir, target, out)
        weights = out / "w.safetensors"
        data = bytearray(weights.read_bytes())
        data[-1] ^= 1
        weights.unlink()  # a link to no one else's bytes
        weights.write_bytes(data)

    real_rebuild = delta_versions.rebuild
    monkeypatch.setattr(delta_versions, "rebuild", rebuild_one_bit_off)
    with caplog.at_level(logging.WARNING, logger="swarmrl.p2p"):
        origin.publish(policies[1], model="p", step=2, shard_size=SHARD, delta=True)
        assert _same_files(node.wait_for(2, timeout=WAIT), policies[1])
    said = [r.getMessage() for r in caplog.records if "delta did not rebuild" in r.getMessage()]
    assert said == [
        "step 2's delta did not rebuild it: step 2 rebuilt from its delta does not match its "
        "manifest; fetching it whole"
    ]
    assert _same_files(held, policies[0])  # the weights it held meanwhile are untouched
    assert sorted((v.step, v.is_delta) for v in node.store.versions()) == [(1, False), (2, False)]


def test_a_lagging_node_catches_up_by_a_chain_of_deltas_within_the_window(
    swarm, origin_key, tmp_path, caplog
):
    policies = _policy_steps(tmp_path, 4)
    full = sum(p.stat().st_size for p in policies[0].iterdir())
    origin = swarm("origin", account=origin_key)
    ready = []
    node = swarm(
        "node",
        bootstrap=origin.addrs,
        on_event=lambda e: e.kind == SwarmEventKind.READY and ready.append(e.step),
    )
    node.window = 2
    origin.publish(policies[0], model="p", step=1, shard_size=SHARD, delta=True)
    node.wait_for(1, timeout=WAIT)

    # The node is slow to take step 2 in: steps 3 and 4 are announced meanwhile.
    rebuilding, go_on = threading.Event(), threading.Event()
    real_add_rebuilt = node.store.add_rebuilt

    def slow_add_rebuilt(delta, base):
        rebuilding.set()
        go_on.wait(WAIT)
        return real_add_rebuilt(delta, base)

    node.store.add_rebuilt = slow_add_rebuilt
    served = origin.server.bytes_served
    origin.publish(policies[1], model="p", step=2, shard_size=SHARD, delta=True)
    assert rebuilding.wait(WAIT)
    with caplog.at_level(logging.INFO, logger="swarmrl.p2p"):
        for step in (3, 4):
            origin.publish(policies[step - 1], model="p", step=step, shard_size=SHARD, delta=True)
        deadline = time.monotonic() + WAIT
        while node.newest_announced < 4 and time.monotonic() < deadline:
            time.sleep(0.05)
        go_on.set()
        assert _same_files(node.wait_for(4, timeout=WAIT), policies[3])
    # Step 4 waited, two behind step 2, and came as step 3's delta then its own:
    # three deltas in all, a fraction of one whole step.
    assert ready == [1, 2, 3, 4]
    assert "step 4 announced; fetching step 3's delta first, 2 behind" in caplog.messages
    assert origin.server.bytes_served - served < full / 3


class _Polled:
    """A bare host on loopback that answers HAVE with the advert the test sets, noting
    the poller's clock at each swap; and a poller: an Advertiser on a host of its own
    whose polling rounds the test drives on a clock it sets."""

    def __init__(self, tmp_path):
        self.now = 0.0
        self.swaps: list[float] = []
        self.peer = Host(create_new_key_pair(), topics=swarm_topics(RUN))
        self.peer.serve(HAVE, self._have)
        self.advert = self.advert_holding("ff")
        self.host = Host(create_new_key_pair(), topics=swarm_topics(RUN))
        self.poller = Advertiser(
            self.host,
            WeightStore(tmp_path / "poller"),
            PeerBook(),
            domain=DOMAIN,
            run=RUN,
            account=None,
            reachable=True,  # nobody to ask for a dial-back
            on_event=lambda event: None,
            clock=lambda: self.now,
        )
        self.pool = ThreadPoolExecutor(4)

    def advert_holding(self, shards):
        return Advert(
            addrs=self.peer.addrs,
            holdings=[Holding(manifest_hash="ab" * 32, step=1, shards=shards)],
        )

    def _have(self, peer, request):
        self.swaps.append(self.now)
        return self.advert

    def meet(self):
        self.poller.meet(self.host.connect(self.peer.addrs[0]))

    def tick_until(self, until):
        """Polling rounds every POLL_INTERVAL up to `until`, while fetching; the times
        of the swaps they made."""
        first = len(self.swaps)
        while self.now + POLL_INTERVAL <= until:
            self.now += POLL_INTERVAL
            self.poller._poll_once(True, self.pool)
        return self.swaps[first:]

    def close(self):
        self.pool.shutdown()
        self.poller.close()
        self.host.close()
        self.peer.close()


@pytest.fixture
def polled(tmp_path):
    made = _Polled(tmp_path)
    yield made
    made.close()


def test_a_peer_whose_advert_stays_the_same_is_polled_ever_less_often(polled):
    """The origin's case: its advert does not change while nodes fetch from it."""
    polled.meet()
    assert polled.swaps == [0.0]
    assert polled.tick_until(100) == [0.5, 1.5, 3.5, 7.5, 15.5, 31.5, 61.5, 91.5]
    assert polled.poller.schedule.interval_of(polled.peer.peer_id) == MAX_POLL_INTERVAL
    # What it holds changes: the next poll finds it, and the one after comes 0.5 s later.
    polled.advert = polled.advert_holding("ffc0")
    assert polled.tick_until(128) == [121.5, 122, 123, 125]
    seen = polled.poller.book.get(polled.peer.peer_id)
    assert seen is not None
    assert sum(seen.holdings["ab" * 32]) == 10


def test_a_peer_part_way_through_the_version_being_fetched_is_polled_every_round(polled, tmp_path):
    """A slow uplink's peer: its shards come seconds apart, each one this node may fetch
    from it, so its unchanged advert between two shards is no reason to back off."""
    ck = make_checkpoint(tmp_path, 1)
    version = polled.poller.store.begin(ck.announcement, ck.manifest)  # fetching it too
    assert ck.count == 4

    def holding(shards):
        return Advert(
            addrs=polled.peer.addrs,
            holdings=[Holding(manifest_hash=version.manifest_hash, step=1, shards=shards)],
        )

    polled.advert = holding("c0")  # two of its four shards
    polled.meet()
    assert polled.tick_until(5) == [0.5 * k for k in range(1, 11)]
    # It has every shard now: nothing more to get from it, so it backs off.
    polled.advert = holding("f0")
    assert polled.tick_until(20) == [5.5, 6.0, 7.0, 9.0, 13.0]


def test_a_change_the_peer_pushes_brings_its_next_poll_forward(polled):
    polled.meet()
    assert polled.tick_until(20)[-1] == 15.5  # next due at 31.5
    # Its gossiped advert (what the host hands the peers topic's handler) changed.
    polled.advert = polled.advert_holding("fc")
    polled.poller._on_advert(polled.peer.peer_id, wire.dump(polled.advert))
    assert polled.tick_until(24) == [20.5, 21.5, 23.5]
    # Its own swap, on the wire, carries another change.
    polled.advert = polled.advert_holding("fe")
    polled.peer.call(HAVE, polled.host.peer_id, HaveRequest(advert=polled.advert))
    assert polled.tick_until(30) == [24.5, 25.5, 27.5]


def test_a_disconnected_peers_schedule_is_forgotten(polled):
    polled.meet()
    polled.tick_until(2)
    peer = polled.peer.peer_id
    assert peer in polled.poller.schedule
    polled.peer.close()
    deadline = time.monotonic() + WAIT
    while peer in polled.host.peers():
        assert time.monotonic() < deadline, "the connection never closed"
        time.sleep(0.05)
    polled.poller._poll_once(False, polled.pool)  # not fetching: forgotten all the same
    assert peer not in polled.poller.schedule
