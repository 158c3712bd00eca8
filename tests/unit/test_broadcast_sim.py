"""The broadcast simulation: its network model, its copy of the fetch policy, its invariants."""

import ast
import math
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from benchmarks import broadcast_sim as bs
from benchmarks.broadcast_sim import MBIT, MIB, Network, Policy, max_min_rates, p90, p99, simulate

ROOT = Path(__file__).resolve().parents[2]
# Fixed links (sigma 0), short round trips: small runs whose every number is predictable.
FLAT = Network(nodes=20, sigma=0.0, rtt=0.01, gossip_delay=0.05)


def water_fill(src, dst, up, down):
    """Max-min fairness by progressive filling, the textbook way: the oracle."""
    links = [("u", int(s)) for s in src], [("d", int(d)) for d in dst]
    cap = {("u", i): float(c) for i, c in enumerate(up)}
    cap |= {("d", i): float(c) for i, c in enumerate(down)}
    rate = [0.0] * len(src)
    frozen = [False] * len(src)
    while not all(frozen):
        level = math.inf
        for link, c in cap.items():
            users = [f for f in range(len(src)) if link in (links[0][f], links[1][f])]
            free = [f for f in users if not frozen[f]]
            if free:
                used = sum(rate[f] for f in users if frozen[f])
                level = min(level, (c - used) / len(free))
        for f in range(len(src)):
            if not frozen[f]:
                rate[f] = level
        for link, c in cap.items():
            users = [f for f in range(len(src)) if link in (links[0][f], links[1][f])]
            if users and sum(rate[f] for f in users) >= c * (1 - 1e-9):
                for f in users:
                    frozen[f] = True
    return np.array(rate)


def test_max_min_rates_match_progressive_filling():
    rng = np.random.default_rng(7)
    for _ in range(30):
        n, flows = 6, int(rng.integers(1, 14))
        src = rng.integers(0, n, flows)
        dst = (src + rng.integers(1, n, flows)) % n  # never to itself
        up, down = rng.uniform(1, 100, n), rng.uniform(1, 100, n)
        got = max_min_rates(src, dst, up, down)
        assert got == pytest.approx(water_fill(src, dst, up, down), rel=1e-6)
        # Feasible on every link, always.
        assert np.all(np.bincount(src, got, n) <= up * (1 + 1e-9))
        assert np.all(np.bincount(dst, got, n) <= down * (1 + 1e-9))


def test_percentiles_are_order_statistics():
    times = np.arange(1.0, 11.0)
    assert p90(times) == 9.0
    assert p99(times) == 10.0
    assert p90([*range(9), math.inf]) == 8.0
    assert p99([*range(9), math.inf]) == math.inf


def test_every_node_gets_every_shard_and_bytes_add_up():
    res = simulate(6 * MIB, FLAT, shard_size=MIB, seed=3)
    assert res.shards == 6
    assert np.all(np.isfinite(res.ready))
    assert np.all(res.all_held <= res.ready)
    # Everything anyone uploaded was a shard someone fetched: one copy per node and
    # shard, plus the endgame's duplicates.
    uploaded = res.served_bytes.sum() + res.origin_bytes
    assert res.fetches == FLAT.nodes * res.shards + res.duplicates
    assert uploaded == pytest.approx(res.fetches * MIB)


def test_a_lone_downloader_takes_size_over_the_slower_link_plus_round_trips():
    net = Network(
        nodes=1,
        sigma=0.0,
        down_median_mbit=80,
        origin_up_mbit=30,
        rtt=0.02,
        gossip_delay=0.0,
        rate_quantum=0.0,
    )
    size = 5 * MIB + 12345  # a short last shard
    rate = min(net.origin_up_mbit, net.down_median_mbit) * MBIT
    # One worker, one round: the announcement's round trip (the manifest), a TCP
    # handshake, then per shard a request round trip and its bytes at the link rate.
    one = simulate(size, net, Policy(workers=1, run_timeout=math.inf), shard_size=MIB)
    expected = 2 * net.rtt + one.shards * net.rtt + size / rate
    assert one.ready[0] == pytest.approx(expected, rel=1e-9)
    # Two workers in flight (MAX_INFLIGHT_PER_PEER) share the link, and one's request
    # overlaps the other's bytes: never faster than the link, never slower than
    # every request on the critical path.
    two = simulate(size, net, Policy(run_timeout=math.inf), shard_size=MIB)
    assert 2 * net.rtt + size / rate - 1e-9 <= two.ready[0] <= expected + 1e-9
    # Rates solved at most every quantum: each transfer may wait up to one for its rate.
    quantum = 0.05
    lone = Policy(workers=1, run_timeout=math.inf)
    coarse = simulate(size, replace(net, rate_quantum=quantum), lone, shard_size=MIB)
    assert expected - 1e-9 <= coarse.ready[0] <= expected + one.shards * quantum + 1e-9


def test_outbound_only_nodes_never_serve():
    res = simulate(8 * MIB, Network(nodes=30, rtt=0.01), shard_size=MIB, seed=1)
    assert res.reachable.sum() == 9
    assert np.all(res.served_bytes[~res.reachable] == 0)
    assert res.served_bytes[res.reachable].sum() > 0


def test_deterministic_for_a_seed():
    a = simulate(4 * MIB, Network(nodes=15), shard_size=MIB, seed=5)
    b = simulate(4 * MIB, Network(nodes=15), shard_size=MIB, seed=5)
    c = simulate(4 * MIB, Network(nodes=15), shard_size=MIB, seed=6)
    assert np.array_equal(a.ready, b.ready)
    assert np.array_equal(a.peer_rates, b.peer_rates, equal_nan=True)
    assert not np.array_equal(a.ready, c.ready)


def test_the_swarm_beats_the_origin_alone_when_its_uplink_is_shared():
    # A thin origin: alone it must send every node every byte.
    net = Network(
        nodes=20,
        sigma=0.0,
        origin_up_mbit=100,
        up_median_mbit=50,
        down_median_mbit=100,
        rtt=0.01,
        gossip_delay=0.05,
    )
    size = 16 * MIB
    alone = simulate(size, replace(net, reachable_fraction=0.0), shard_size=MIB)
    swarm = simulate(size, replace(net, reachable_fraction=1.0), shard_size=MIB)
    assert alone.p90() >= net.nodes * 0.9 * size / (net.origin_up_mbit * MBIT)
    assert swarm.p90() < 0.6 * alone.p90()
    assert swarm.origin_bytes < alone.origin_bytes


def test_every_policy_finishes_and_never_beats_the_bound():
    net = Network(nodes=20, rtt=0.01, gossip_delay=0.05)
    runs = {
        "code": simulate(8 * MIB, net, shard_size=MIB, seed=4),
        "before": simulate(8 * MIB, net, bs.POLICIES[bs.BEFORE], shard_size=MIB, seed=4),
        # A line as long as it takes, and a download that ends with its last shard.
        "endless line": simulate(
            8 * MIB,
            net,
            Policy(queue_wait=math.inf, wait_for_duplicates=False),
            shard_size=MIB,
            seed=4,
        ),
        # No line: BUSY whenever the transfer slots are taken.
        "no line": simulate(
            8 * MIB, net, Policy(transfer_slots=1, queue_wait=0.0), shard_size=MIB, seed=4
        ),
    }
    for res in runs.values():
        assert np.all(np.isfinite(res.ready))
        assert res.p90() >= res.lower_bound(0.9)
        assert res.p99() >= res.lower_bound(0.99)
    # Queued for as long as it takes, nobody is refused (the connection cap is far off).
    assert runs["endless line"].busy == 0
    assert np.array_equal(runs["endless line"].ready, runs["endless line"].all_held)
    assert runs["no line"].busy > 0


def test_a_request_beyond_the_slots_waits_out_the_queue_wait_then_is_busy():
    # One transfer slot everywhere, one worker per node, and a queue wait far shorter
    # than a shard's time (1 MiB at 10 Mbit/s is most of a second).
    net = Network(nodes=3, sigma=0.0, up_median_mbit=10, down_median_mbit=10, rtt=0.01)
    lone = Policy(workers=1, transfer_slots=1, origin_transfer_slots=1, queue_wait=0.05)
    res = simulate(3 * MIB, net, lone, shard_size=MIB, seed=0)
    assert np.all(np.isfinite(res.ready))
    assert res.busy > 0
    patient = replace(lone, queue_wait=math.inf)
    assert simulate(3 * MIB, net, patient, shard_size=MIB, seed=0).busy == 0


def _picker(nodes=4, shards=4):
    """A swarm of reachable nodes, before anything ran, to drive the job picker by hand."""
    net = Network(nodes=nodes, reachable_fraction=1.0)
    return bs._Swarm(net, Policy(), shards * MIB, MIB, 0, None)


def test_rarest_first_with_the_nodes_own_tiebreak():
    sw = _picker()
    node = sw.nodes[1]
    holders = {2: [0, 1], 3: [0]}  # node index -> shards it holds (besides the origin)
    for j, held in holders.items():
        sw.vis_poll[sw.node_srv[j], held] = 1.0
    # Holders per shard: origin + 2 + 3 for shard 0, origin + 2 for 1, the origin alone
    # for 2 and 3: one of those, whichever comes first in this node's own order.
    shard, peer = sw._next_job(node, 0.0)
    assert shard == min((2, 3), key=lambda s: node.rank[s])
    assert peer == 0
    # A backed-off origin is no holder: shards 2 and 3 have none left, so shard 1 is
    # now rarest, served by node 2.
    node.p_retry[0] = 10.0
    assert sw._next_job(node, 0.0) == (1, sw.node_srv[2])


def test_endgame_races_an_in_flight_shard_from_another_holder():
    sw = _picker()
    node = sw.nodes[1]
    node.held[:3] = True
    node.held_count = 3
    node.inflight = {3: {0}}  # shard 3 is coming from the origin
    node.p_inflight[0] = 1
    assert sw._next_job(node, 0.0) is None  # nobody else holds it
    sw.vis_poll[sw.node_srv[4], 3] = 1.0
    assert sw._next_job(node, 0.0) == (3, sw.node_srv[4])
    assert sw.endgame_jobs == 1
    node.inflight[3].add(int(sw.node_srv[4]))
    assert sw._next_job(node, 0.0) is None  # two fetchers already


def test_endgame_and_busy_happen_in_a_run():
    # Two connections per server, none given up for a newcomer: most first requests
    # are refused at accept.
    net = Network(nodes=20, rtt=0.01)
    capped = Policy(max_connections=2, origin_max_connections=2, evict_idle=False)
    res = simulate(6 * MIB, net, capped, shard_size=MIB, seed=2)
    assert np.all(np.isfinite(res.ready))
    assert res.busy > 0
    assert res.evicted == 0
    assert res.dead_connections > 0  # the socket kept after BUSY meets it closed next time
    assert res.endgame_jobs > 0
    dropped = replace(capped, busy_leaves_dead_socket=False)
    assert simulate(6 * MIB, net, dropped, shard_size=MIB, seed=2).dead_connections == 0
    # Before 2026-11-27 such a request failed and backed off instead of reconnecting.
    failing = replace(capped, reconnect_dropped=False)
    assert np.all(np.isfinite(simulate(6 * MIB, net, failing, shard_size=MIB, seed=2).ready))
    # The code's servers close their longest-idle connection for a newcomer instead.
    two = Policy(max_connections=2, origin_max_connections=2)
    evicting = simulate(6 * MIB, net, two, shard_size=MIB, seed=2)
    assert np.all(np.isfinite(evicting.ready))
    assert evicting.evicted > 0
    assert evicting.busy < res.busy


def test_the_copied_constants_still_match_the_code():
    source = (ROOT / "swarmrl/weights/advertiser.py").read_text()
    values = {}
    for node in ast.parse(source).body:
        if isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Name):
            if isinstance(node.value, ast.Constant):
                values[node.targets[0].id] = ast.literal_eval(node.value)
            elif isinstance(node.value, ast.Name):  # one constant named after another
                values[node.targets[0].id] = values[node.value.id]
    assert values["POLL_INTERVAL"] == bs.POLL_INTERVAL
    assert values["ADVERT_INTERVAL"] == bs.ADVERT_INTERVAL
    assert values["MAX_PEERS"] == bs.MAX_PEERS
    assert values["POLL_THREADS"] == bs.POLL_THREADS
    fetcher = (ROOT / "swarmrl/weights/fetcher.py").read_text()
    assert "return download.run()" in fetcher
    assert math.inf == bs.RUN_TIMEOUT
    fetch = (ROOT / "swarmrl/weights/download.py").read_text()
    assert "len(self._inflight[i]) < 2" in fetch
    assert bs.ENDGAME_COPIES == 2
