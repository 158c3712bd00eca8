"""The weight broadcast at 1,000 nodes, simulated: how long until 90% and 99% hold step n.

A discrete-event, flow-level simulation of one checkpoint version spreading from
one origin through a swarm that fetches it with swarmrl's own policy
(:mod:`swarmrl.weights.download`), servers (:mod:`swarmrl.weights.datapath`) and holdings
discovery (:mod:`swarmrl.weights.advertiser`), against the project's goals: a
delta step (about 1% of the full size) on 90% of 1,000 nodes within 60 s, an
anchor (the full version) within 30 min.

    python -m benchmarks.broadcast_sim [--nodes 1000] [--seeds 1] [--skip-anchor]

prints one table row per (version, policy, shard size): p90 and p99 of the time
each node's download finished, p90 of its last shard's arrival, and the lower
bound no schedule can beat on the same network (`Result.lower_bound`). Rows run
in parallel on every core.

The network (:class:`Network`, every assumption a field):

- one origin holding every shard from t = 0, 10 Gbit/s up;
- node uplinks and downlinks lognormal around 50 Mbit/s, sigma 0.7 in log space
  (10th-90th percentile about 20-123 Mbit/s), up and down correlated (0.7: one
  access technology drives both); the medians are separate fields, so a
  residential asymmetry (down above up) is one argument away;
- 30% of nodes reachable (they serve what they hold), 70% outbound only (they
  fetch and serve nobody: no data endpoint in their advert);
- one round-trip time (100 ms) for every pair, paid per connection, per request
  and per refusal; a gossip delay (1 s) for adverts and announcements.

Bandwidth is fluid: each transfer is a flow through its sender's uplink and its
receiver's downlink, at max-min fair rates over those links (`max_min_rates`,
exact up to float tolerance). No core congestion, no TCP slow start or window
limit, no disk or hashing time, no churn.

The fetch policy as the code has it (:class:`Policy`, defaults read from the
modules where they are constants):

- DEFAULT_WORKERS workers per download, each taking the rarest missing shard
  (fewest eligible holders, ties in the node's own random order), endgame once
  every missing shard is in flight (at most two fetchers per shard), peers
  chosen at random with probability EXPLORE (or when no holder is measured),
  else the measured one with the best smoothed throughput / (1 + own
  in-flight), at most MAX_INFLIGHT_PER_PEER per peer;
- a server sends DEFAULT_TRANSFER_SLOTS shards at once (the origin, a known
  reachable peer, ORIGIN_TRANSFER_SLOTS); a request beyond them waits in line,
  first come first served, for up to QUEUE_WAIT, then is answered BUSY on its
  open connection. The worker is blocked on its request meanwhile, so a shard
  it got elsewhere in the meantime is still sent when its turn comes;
- a server keeps at most DEFAULT_MAX_CONNECTIONS connections (the origin
  ORIGIN_MAX_CONNECTIONS): one more takes
  the place of the one idle the longest, which the server closes, and only
  when none is idle is it answered BUSY at accept and closed; a worker keeps
  its connection to every peer it used until its run ends, and the server
  drops one idle for IDLE_TIMEOUT;
- a BUSY, or a failed request, backs the peer off for BACKOFF_SECONDS for that
  node;
- ``ShardClient`` keeps its socket after any refusal; a request that meets a
  socket the server closed (idle, evicted, or BUSY at accept) goes again once on a fresh
  connection: one round trip to learn it, then a handshake;
- the fetcher runs a download in one ``run()``: it ends when the last transfer
  in flight ends (endgame duplicates of held shards included), and the node is
  ready then;
- holdings become visible to a node in two ways: the peers it is connected to
  (the origin and MAX_PEERS - 1 reachable peers it dialled, plus reachable
  peers that dialled it) through the HAVE poll, POLL_THREADS peers at once, so
  one round takes POLL_INTERVAL plus one call (two round trips) per
  POLL_THREADS peers; everyone else only through gossiped adverts, which the
  code sends when a download starts and finishes and every ADVERT_INTERVAL,
  not per shard. A holder part way through the version is polled every round
  (the advertiser's PollSchedule backs off only from a peer with no shard of
  it left to get, such as the origin or a peer done); so its backoff costs no
  shard seen later here, and what it is for, the origin's load (2,000 swaps a
  second from 1,000 downloading nodes without it), is not in the model.

`POLICIES` also names the policy as it was "before 2026-11-27", when the
what-ifs of this simulation went into the code: a server slot was a connection
(DEFAULT_MAX_CONNECTIONS was 64), held from a worker's first request until its
run ended or the idle timeout, and refused beyond them, idle or not;
unmeasured peers went first; HAVE polls went one peer after another; a request
on a connection the server had dropped as idle failed and backed off. And it
names what-ifs against the code, one change at a time (each a `Policy` field):
each of the old ways back; slots sized to every server's uplink (one per 10
Mbit/s, which the code cannot do: a node does not know its uplink); and the
origin sized like a node's server was, 64 slots and 256 connections.

Approximations, each to keep 1,000 nodes x 227 shards within minutes:

- rates are solved at most every ``rate_quantum`` seconds (0.1 s by default; 1 s
  in the table's anchor rows, whose transfers take 10 s and more; 0 solves at
  every start and end): a new flow waits up to one quantum for its rate, and a
  finished flow's share is handed out at the next solution;
- a shard a holder just got becomes visible to all of its pollers at the same
  moment, uniform within one poll round of ``poll_interval + ceil(max_peers /
  poll_threads) * poll_call_seconds`` (the round of an outbound-only node;
  reachable nodes are polled by more peers and poll more, so theirs is slower);
- the queue wait is modelled as the code has it (BUSY after QUEUE_WAIT), but a
  request joins the line one round trip after it was sent, and its bytes start
  as soon as it gets a slot;
- the download starts a uniform share of the gossip delay plus one round trip
  (the manifest) after the announcement.

The old policy's runs are chaotic (herds formed on whichever peer was new), so a
different seed, or quantum, moves its figures by tens of percent; the code's move
by a few percent: `--seeds`.

Why simpy: workers are naturally processes (take a job, connect, request, wait
for the bytes, release), server queues are its Resources, and a flow-level
network fits it as one object that owns every flow's remaining bytes and
schedules only the next completion, tagged with a generation number so that a
completion made stale by a rate change is ignored when it fires (simpy cannot
cancel a timeout).
"""

from __future__ import annotations

import argparse
import math
import os
import random
import statistics
import time
from collections.abc import Generator
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field, replace
from functools import partial
from typing import Any

import numpy as np
import numpy.typing as npt
import simpy

from swarmrl.shards import DEFAULT_SHARD_SIZE
from swarmrl.weights.datapath import (
    DEFAULT_MAX_CONNECTIONS,
    DEFAULT_TRANSFER_SLOTS,
    IDLE_TIMEOUT,
    ORIGIN_MAX_CONNECTIONS,
    ORIGIN_TRANSFER_SLOTS,
    QUEUE_WAIT,
)
from swarmrl.weights.download import (
    BACKOFF_SECONDS,
    DEFAULT_WORKERS,
    EXPLORE,
    MAX_INFLIGHT_PER_PEER,
    RATE_SMOOTHING,
)

Floats = npt.NDArray[np.float64]
Ints = npt.NDArray[np.int64]
Bools = npt.NDArray[np.bool_]

MBIT = 1e6 / 8  # bytes per second in one Mbit/s
MIB = 1024 * 1024
FULL_BYTES = 15_200_000_000  # a 7B policy in bf16
DELTA_FRACTION = 0.01
DELTA_GOAL_SECONDS = 60.0
ANCHOR_GOAL_SECONDS = 1800.0

# The advertiser's constants (swarmrl/weights/advertiser.py), copied rather than
# imported: importing it loads libp2p and eth-account, seconds this tool does not
# need. tests/unit/test_broadcast_sim.py checks that they still match.
POLL_INTERVAL = 0.5
ADVERT_INTERVAL = 30.0
MIN_ADVERT_GAP = 2.0
MAX_PEERS = 32
POLL_THREADS = MAX_PEERS
# swarmrl/weights/fetcher.py: `return download.run()`, one run until done. (The code
# ran rounds of `run(timeout=5.0)` until this simulation showed what they cost; the
# `run_timeout` field still models them.)
RUN_TIMEOUT = math.inf
# fetch.py's endgame: a missing shard is raced while fewer than two fetch it.
ENDGAME_COPIES = 2


@dataclass(frozen=True)
class Network:
    """The network the swarm runs on; every field is an assumption of the model."""

    nodes: int = 1000
    """Downloaders, the origin not counted."""
    origin_up_mbit: float = 10_000.0
    up_median_mbit: float = 50.0
    down_median_mbit: float = 50.0
    sigma: float = 0.7
    """Standard deviation of ln(rate), uplinks and downlinks alike."""
    updown_correlation: float = 0.7
    """Correlation of a node's ln(up) and ln(down)."""
    min_mbit: float = 1.0
    max_mbit: float = 10_000.0
    """Draws are clipped to this range (a lognormal tail has no physical bound)."""
    reachable_fraction: float = 0.3
    rtt: float = 0.1
    """Seconds, every pair: volunteers span continents (same continent ~30 ms,
    intercontinental 100-250 ms)."""
    gossip_delay: float = 1.0
    """Seconds for a gossipsub message to reach every subscriber (a few hops plus
    heartbeat batching): announcements and adverts."""
    poll_call_seconds: float | None = None
    """One HAVE call; None: two round trips (a new yamux stream negotiates its
    protocol before the request)."""
    rate_quantum: float = 0.1
    """Seconds between rate solutions at most; 0 solves at every start and end."""

    def poll_call(self) -> float:
        return 2 * self.rtt if self.poll_call_seconds is None else self.poll_call_seconds


@dataclass(frozen=True)
class Policy:
    """The swarm's fetch policy; the defaults are the code's."""

    workers: int = DEFAULT_WORKERS
    max_inflight_per_peer: int = MAX_INFLIGHT_PER_PEER
    explore: float = EXPLORE
    rate_smoothing: float = RATE_SMOOTHING
    backoff: float = BACKOFF_SECONDS
    max_connections: int = DEFAULT_MAX_CONNECTIONS
    """Connections a server keeps open at once; one more is answered BUSY at accept
    (unless evict_idle makes room)."""
    evict_idle: bool = True
    """At the cap, a new connection takes the place of the one idle the longest, which
    the server closes (the code). False: it is refused (before 2026-11-27)."""
    transfer_slots: int | None = DEFAULT_TRANSFER_SLOTS
    """Shard transfers a server sends at once (the code). None: the server before
    2026-11-27, whose slots were its max_connections connections, each held by a
    worker from its first request there until its run ended or the idle timeout."""
    origin_transfer_slots: int = ORIGIN_TRANSFER_SLOTS
    origin_max_connections: int = ORIGIN_MAX_CONNECTIONS
    """With transfer_slots: the origin's counts (the code gives them to a peer started
    known reachable)."""
    slot_mbit: float | None = None
    """With transfer_slots, a what-if: uplink / slot_mbit slots at every server (at
    least one), the origin's too, instead of the fixed counts (a node cannot know
    its uplink, so the code does not do this)."""
    queue_wait: float = QUEUE_WAIT
    """With transfer_slots: a request beyond them waits in line at the server, first
    come first served, for up to this long, then is answered BUSY (and backs off).
    math.inf: it waits as long as it takes; 0: BUSY at once."""
    idle_timeout: float = IDLE_TIMEOUT
    run_timeout: float = RUN_TIMEOUT
    """math.inf: one run until done (no rounds)."""
    endgame_copies: int = ENDGAME_COPIES
    poll_interval: float = POLL_INTERVAL
    advert_interval: float = ADVERT_INTERVAL
    max_peers: int = MAX_PEERS
    poll_threads: int = POLL_THREADS
    """Peers a node polls at once: a round costs one call per this many peers (1: one
    after another, before 2026-11-27)."""
    busy_leaves_dead_socket: bool = True
    """ShardClient keeps its socket after a BUSY at accept, though the server has
    closed it, so its next request there meets a closed socket (the code). False:
    it drops the socket and dials afresh next time (before 2026-11-27)."""
    reconnect_dropped: bool = True
    """A request that meets a socket the server closed (idle, or BUSY at accept) goes
    again on a fresh connection, one round trip later (the code). False: it fails
    and the peer is backed off (before 2026-11-27)."""
    unmeasured_first: bool = False
    """False: an unmeasured peer counts as rate 0, found only by EXPLORE (or when
    no holder is measured: the code). True: it always goes first (before 2026-11-27)."""
    wait_for_duplicates: bool = True
    """The download ends when its last transfer does, endgame duplicates of held
    shards included (run() joins its threads). False: it ends with the last shard."""
    gossip_each_shard: bool = False
    """Also gossip the advert after every new shard, at most one per MIN_ADVERT_GAP
    (the code gossips when a download starts and ends, and every ADVERT_INTERVAL)."""
    min_advert_gap: float = MIN_ADVERT_GAP


def percentile_time(times: npt.ArrayLike, q: float) -> float:
    """The time by which a fraction `q` of the nodes are done: the ceil(q*n)-th
    smallest of `times` (inf if that many never finished)."""
    ordered = np.sort(np.asarray(times, dtype=np.float64))
    if not ordered.size:
        raise ValueError("no times")
    k = max(1, math.ceil(q * ordered.size - 1e-9))
    return float(ordered[k - 1])


def p90(times: npt.ArrayLike) -> float:
    return percentile_time(times, 0.9)


def p99(times: npt.ArrayLike) -> float:
    return percentile_time(times, 0.99)


@dataclass(frozen=True)
class Result:
    """One simulated version broadcast. Times are seconds after the announcement;
    per-node arrays are indexed by downloader (the origin is not in them)."""

    size_bytes: int
    shard_size: int
    shards: int
    ready: Floats
    """When each node's download finished (its round ended): what a trainer waits for."""
    all_held: Floats
    """When each node had verified its last shard."""
    up: Floats
    down: Floats
    """Bytes per second."""
    reachable: Bools
    served_bytes: Floats
    """Bytes each node uploaded."""
    origin_bytes: float
    fetches: int
    duplicates: int
    """Transfers that arrived after the shard was already held (endgame races)."""
    endgame_jobs: int
    busy: int
    dead_connections: int
    evicted: int
    """Idle connections a server at its cap closed to make room for a new one."""
    rounds: int
    peer_rates: Floats
    """Each node's (row 0: the origin's, unused) smoothed rate of each server, NaN
    where never measured: pass as `prior_rates` to simulate a later step."""
    origin_up: float
    wall_seconds: float

    def p90(self) -> float:
        return p90(self.ready)

    def p99(self) -> float:
        return p99(self.ready)

    def own_link_floor(self) -> Floats:
        """Each node's time if it had its downlink to itself from t = 0."""
        return self.size_bytes / self.down

    def lower_bound(self, q: float) -> float:
        """No schedule gets a fraction `q` of the nodes done sooner: each of them
        needs its own downlink's time, and together they need q * nodes copies
        through the origin's and the reachable nodes' uplinks."""
        supply = self.origin_up + float(self.up[self.reachable].sum())
        copies = q * self.ready.size * self.size_bytes / supply
        return max(percentile_time(self.own_link_floor(), q), copies)


def max_min_rates(
    src: Ints,
    dst: Ints,
    up: Floats,
    down: Floats,
    *,
    max_iter: int = 100,
    tol: float = 1e-9,
) -> Floats:
    """Max-min fair rates of flows src[i] -> dst[i] over uplinks `up` and downlinks
    `down` (bytes/s, indexed by node).

    Each flow crosses two links, so the allocation is a fixpoint of two water
    levels: an uplink's level is where its flows, each also capped by its
    downlink's level, fill the uplink, and the other way round. Alternating the
    two from "uplinks alone" makes the uplink levels rise and the downlink levels
    fall monotonically onto the max-min fair point. After `max_iter` rounds, or
    once no level moves by more than `tol` (relative), every flow takes the lower
    of its two levels, scaled down to what its fuller link allows, so the answer
    is feasible even if not converged. (Any fixpoint is the max-min fair point:
    every flow then has a full link on which no flow is faster.)"""
    if not src.size:
        return np.zeros(0)
    n = up.size
    level_down = np.full(n, np.inf)
    level_up = _levels(up, src, level_down[dst])
    for _ in range(max_iter):
        new_down = _levels(down, dst, level_up[src])
        new_up = _levels(up, src, new_down[dst])
        done = _close(new_up, level_up, tol) and _close(new_down, level_down, tol)
        level_up, level_down = new_up, new_down
        if done:
            break
    rate = np.minimum(level_up[src], level_down[dst])
    load_u = np.bincount(src, weights=rate, minlength=n)
    load_d = np.bincount(dst, weights=rate, minlength=n)
    with np.errstate(divide="ignore", invalid="ignore"):
        scale_u = np.where(load_u > up, up / load_u, 1.0)
        scale_d = np.where(load_d > down, down / load_d, 1.0)
    out: Floats = rate * np.minimum(scale_u[src], scale_d[dst])
    return out


def _levels(cap: Floats, link: Ints, limit: Floats) -> Floats:
    """Per link, the water level x with sum over its flows of min(limit, x) = cap
    (inf where the flows' own limits leave it unfilled)."""
    order = np.lexsort((limit, link))
    lk, lim = link[order], limit[order]
    starts = np.flatnonzero(np.r_[True, lk[1:] != lk[:-1]])
    sizes = np.diff(np.r_[starts, lk.size])
    group = np.repeat(np.arange(starts.size), sizes)
    k = np.arange(lk.size) - starts[group]
    # Flows sorted by limit within a link: with the k lowest below the level, the
    # level is what they leave shared by the rest; the first k where that is no
    # more than the k-th limit is the answer. Unlimited flows sort last and add
    # nothing before them (zeroed so that no inf enters the running sums).
    finite = np.where(np.isfinite(lim), lim, 0.0)
    total = np.cumsum(finite)
    before = total - finite - (total[starts] - finite[starts])[group]
    with np.errstate(invalid="ignore"):
        x = (cap[lk] - before) / (sizes[group] - k)
    fits = x <= lim * (1 + 1e-12)
    first = np.minimum.reduceat(np.where(fits, k, lk.size), starts)
    levels = np.full(cap.size, np.inf)
    found = first < sizes
    levels[lk[starts[found]]] = x[starts[found] + first[found]]
    return levels


def _close(a: Floats, b: Floats, tol: float) -> bool:
    if not np.array_equal(np.isfinite(a), np.isfinite(b)):
        return False
    finite = np.isfinite(a)
    return bool(np.all(np.abs(a[finite] - b[finite]) <= tol * np.maximum(np.abs(b[finite]), 1.0)))


# ---- the network: flows ------------------------------------------------------------------


class _Fluid:
    """Every transfer in flight as a flow with remaining bytes, at max-min fair rates.

    Slots are fixed (one per worker), so the arrays never grow. Only the next
    completion is scheduled; a rate change bumps the generation, which makes the
    completion scheduled before it a no-op when it fires."""

    def __init__(
        self, env: simpy.Environment, up: Floats, down: Floats, slots: int, quantum: float
    ) -> None:
        self.env = env
        self.up, self.down = up, down
        self.quantum = quantum
        self.src = np.zeros(slots, dtype=np.int64)
        self.dst = np.zeros(slots, dtype=np.int64)
        self.remaining = np.zeros(slots)
        self.rate = np.zeros(slots)
        self.active = np.zeros(slots, dtype=bool)
        self.events: list[simpy.Event | None] = [None] * slots
        self._at = 0.0  # when `remaining` was last brought up to date
        self._solved_at = -math.inf
        self._solve_pending = False
        self._generation = 0
        self.solves = 0

    def transfer(self, slot: int, src: int, dst: int, nbytes: float) -> simpy.Event:
        """An event that fires when `nbytes` have gone from `src` to `dst`."""
        self._advance()
        self.src[slot], self.dst[slot] = src, dst
        self.remaining[slot] = nbytes
        self.rate[slot] = 0.0  # until the next solution
        self.active[slot] = True
        done = self.env.event()
        self.events[slot] = done
        self._want_solve()
        return done

    def _advance(self) -> None:
        dt = self.env.now - self._at
        if dt > 0:
            # Idle slots have rate 0: one pass over all of them is cheaper than masking.
            self.remaining -= self.rate * dt
            self._at = self.env.now

    def _want_solve(self) -> None:
        if self._solve_pending:
            return
        self._solve_pending = True
        # A zero delay still runs after everything else due now, so flows that start
        # at the same moment share one solution.
        delay = max(0.0, self._solved_at + self.quantum - self.env.now)
        self.env.timeout(delay).callbacks.append(self._solve)

    def _solve(self, _: simpy.Event) -> None:
        self._solve_pending = False
        self._advance()
        self._solved_at = self.env.now
        self.solves += 1
        flows = np.flatnonzero(self.active)
        self.rate[flows] = max_min_rates(self.src[flows], self.dst[flows], self.up, self.down)
        self._schedule_next()

    def _schedule_next(self) -> None:
        self._generation += 1
        moving = np.flatnonzero(self.active & (self.rate > 0))
        if not moving.size:
            return
        wait = float(np.min(self.remaining[moving] / self.rate[moving]))
        self.env.timeout(max(wait, 0.0)).callbacks.append(partial(self._due, self._generation))

    def _due(self, generation: int, _: simpy.Event) -> None:
        if generation != self._generation:
            return
        self._advance()
        flows = np.flatnonzero(self.active)
        # Within a nanosecond of done counts as done: float error in remaining - rate*dt.
        finished = flows[self.remaining[flows] <= self.rate[flows] * 1e-9 + 1e-6]
        for slot in finished.tolist():
            self.active[slot] = False
            self.rate[slot] = 0.0
            event = self.events[slot]
            self.events[slot] = None
            assert event is not None
            event.succeed()
        self._schedule_next()
        if finished.size:
            self._want_solve()


# ---- the swarm ---------------------------------------------------------------------------


@dataclass(eq=False)  # identity: a server's list holds distinct connections
class _Conn:
    """A worker's connection to one server (one of its max_connections while open)."""

    server: int
    last_used: float
    active: bool = True
    dead: bool = False  # the server closed it; the client has not noticed yet


@dataclass
class _Node:
    """One downloader: its Download (in-flight map, tiebreak) and PeerBook (per server)."""

    idx: int
    srv: int  # its own server index, -1 if outbound only
    rng: random.Random
    rank: Ints
    held: Bools  # a row of the simulation's holdings
    conn: Bools  # which servers it polls
    p_rate: Floats
    p_inflight: Ints
    p_retry: Floats
    inflight: dict[int, set[int]] = field(default_factory=dict)
    held_count: int = 0
    deadline: float = 0.0
    alive: int = 0
    rounds: int = 0
    wake: simpy.Event | None = None
    next_round: simpy.Event | None = None
    all_held: float = math.inf
    ready: float = math.inf


class _Swarm:
    def __init__(
        self,
        network: Network,
        policy: Policy,
        size_bytes: int,
        shard_size: int,
        seed: int,
        prior_rates: Floats | None,
    ) -> None:
        if size_bytes < 1 or shard_size < 1:
            raise ValueError("size and shard size must be positive")
        if network.nodes < 1:
            raise ValueError("at least one node")
        self.net, self.pol = network, policy
        self.size = size_bytes
        self.shard_size = shard_size
        self.n_shards = -(-size_bytes // shard_size)
        self.env = simpy.Environment()
        seeds = np.random.SeedSequence(seed)
        draw_seed, node_seed, event_seed = seeds.spawn(3)
        rng = np.random.default_rng(draw_seed)
        self.events_rng = np.random.default_rng(event_seed)
        n = network.nodes
        total = n + 1  # index 0 is the origin

        # Links.
        z_up, z_other = rng.standard_normal((2, n))
        rho = network.updown_correlation
        z_down = rho * z_up + math.sqrt(max(0.0, 1 - rho * rho)) * z_other
        lo, hi = network.min_mbit, network.max_mbit
        self.up = np.empty(total)
        self.down = np.empty(total)
        self.up[0] = network.origin_up_mbit * MBIT
        self.down[0] = network.origin_up_mbit * MBIT  # the origin downloads nothing
        self.up[1:] = np.clip(network.up_median_mbit * np.exp(network.sigma * z_up), lo, hi) * MBIT
        self.down[1:] = (
            np.clip(network.down_median_mbit * np.exp(network.sigma * z_down), lo, hi) * MBIT
        )

        # Who serves: the origin and a fixed share of the nodes, at random.
        self.reachable = np.zeros(total, dtype=bool)
        self.reachable[0] = True
        count = round(network.reachable_fraction * n)
        self.reachable[1 + rng.permutation(n)[:count]] = True
        self.servers = np.flatnonzero(self.reachable)  # server index -> node index
        n_srv = self.servers.size
        self.node_srv = np.full(total, -1, dtype=np.int64)
        self.node_srv[self.servers] = np.arange(n_srv)

        # Who polls whom: everyone is connected to the origin (its bootstrap peer) and
        # dials MAX_PEERS - 1 reachable peers; a reachable peer polls those that
        # dialled it too, since it polls every open connection.
        self.conn = np.zeros((total, n_srv), dtype=bool)
        self.conn[:, 0] = True
        others = np.arange(1, n_srv)
        for j in range(1, total):
            mine = others[others != self.node_srv[j]]
            k = min(policy.max_peers - 1, mine.size)
            picked = rng.choice(mine, size=k, replace=False) if k else mine[:0]
            self.conn[j, picked] = True
            if self.node_srv[j] >= 0:
                self.conn[self.servers[picked], self.node_srv[j]] = True
        self.conn[0, :] = False
        self.pollers = [np.flatnonzero(self.conn[:, r]) for r in range(n_srv)]
        calls = math.ceil(policy.max_peers / policy.poll_threads)
        self.poll_round = policy.poll_interval + calls * network.poll_call()

        # Holdings: real, and as seen through polls and through gossip.
        self.held = np.zeros((total, self.n_shards), dtype=bool)
        self.held[0] = True
        # 0/1 as float32: the job picker counts holders with matrix-vector products.
        self.vis_poll = np.zeros((n_srv, self.n_shards), dtype=np.float32)
        self.vis_gossip = np.zeros((n_srv, self.n_shards), dtype=np.float32)
        self.vis_poll[0] = self.vis_gossip[0] = 1.0
        self.idle = np.zeros(total, dtype=np.int64)
        self.finished = np.zeros(total, dtype=bool)
        self.finished[0] = True

        rates = np.full((total, n_srv), np.nan)
        if prior_rates is not None:
            if prior_rates.shape != rates.shape:
                raise ValueError(f"prior rates of shape {prior_rates.shape}, need {rates.shape}")
            rates[:] = prior_rates
        self.rates = rates

        node_seeds = node_seed.generate_state(total)
        self.nodes: list[_Node] = []
        for j in range(total):
            node_rng = random.Random(int(node_seeds[j]))
            order = list(range(self.n_shards))
            node_rng.shuffle(order)
            rank = np.empty(self.n_shards, dtype=np.int64)
            rank[order] = np.arange(self.n_shards)
            self.nodes.append(
                _Node(
                    idx=j,
                    srv=int(self.node_srv[j]),
                    rng=node_rng,
                    rank=rank,
                    held=self.held[j],
                    conn=self.conn[j],
                    p_rate=self.rates[j],
                    p_inflight=np.zeros(n_srv, dtype=np.int64),
                    p_retry=np.zeros(n_srv),
                )
            )
        self.server_conns: list[list[_Conn]] = [[] for _ in range(n_srv)]
        if policy.slot_mbit is not None:
            uplinks = self.up[self.servers] / MBIT
            self.slots = np.maximum(1, uplinks // policy.slot_mbit).astype(np.int64)
        else:
            self.slots = np.full(n_srv, policy.transfer_slots or 0, dtype=np.int64)
            self.slots[0] = policy.origin_transfer_slots
        self.gossip_due = np.zeros(n_srv, dtype=bool)
        self.last_gossip = np.full(n_srv, -math.inf)
        # Each server's line for its transfer slots (simpy's Resource serves in order).
        self.slot_queues = (
            [simpy.Resource(self.env, int(c)) for c in self.slots]
            if policy.transfer_slots is not None
            else []
        )
        self.fluid = _Fluid(
            self.env, self.up, self.down, total * policy.workers, network.rate_quantum
        )
        self.served = np.zeros(total)
        self.left = n
        self.all_done = self.env.event()
        self.fetches = self.duplicates = self.endgame_jobs = 0
        self.busy = self.dead_connections = self.evicted = 0

    # ---- running ---------------------------------------------------------------------

    def run(self, horizon: float) -> None:
        env, net = self.env, self.net
        starts = self.events_rng.uniform(0, net.gossip_delay, self.net.nodes) + net.rtt
        for j in range(1, self.net.nodes + 1):
            env.timeout(float(starts[j - 1])).callbacks.append(partial(self._begin, j))
        for r in range(1, self.servers.size):
            phase = float(self.events_rng.uniform(0, self.pol.advert_interval))
            env.process(self._advertise(r, phase))
        env.run(until=self.all_done | env.timeout(horizon))

    def _begin(self, j: int, _: simpy.Event) -> None:
        node = self.nodes[j]
        self._start_round(node)
        for w in range(self.pol.workers):
            self.env.process(self._worker(node, w))

    def _start_round(self, node: _Node) -> None:
        node.rounds += 1
        node.deadline = self.env.now + self.pol.run_timeout
        node.alive = self.pol.workers
        node.next_round = self.env.event()
        if math.isfinite(self.pol.run_timeout):
            self.env.timeout(self.pol.run_timeout).callbacks.append(lambda _: self._wake(node))

    def _wake(self, node: _Node) -> None:
        if node.wake is not None and not node.wake.triggered:
            node.wake.succeed()

    def _wait(self, node: _Node) -> simpy.Event:
        if node.wake is None or node.wake.triggered:
            node.wake = self.env.event()
        return node.wake

    def _worker(self, node: _Node, w: int) -> Generator[simpy.Event, Any, None]:
        env = self.env
        slot = node.idx * self.pol.workers + w
        while True:
            conns: dict[int, _Conn] = {}
            # One run(): jobs until the download is done or the round's deadline.
            while node.held_count < self.n_shards and env.now < node.deadline:
                job = self._next_job(node, env.now)
                if job is None:
                    self.idle[node.idx] += 1
                    yield self._wait(node)
                    self.idle[node.idx] -= 1
                    continue
                shard, r = job
                node.p_inflight[r] += 1
                node.inflight.setdefault(shard, set()).add(r)
                yield from self._fetch(node, slot, conns, shard, r)
                node.p_inflight[r] -= 1
                fetching = node.inflight[shard]
                fetching.discard(r)
                if not fetching:
                    del node.inflight[shard]
                self._wake(node)
            # The thread ends: its clients close, freeing their servers' slots.
            for conn in conns.values():
                self._close(conn)
            node.alive -= 1
            this_round = node.next_round
            assert this_round is not None
            if node.alive == 0:
                if node.held_count == self.n_shards:
                    if not math.isfinite(node.ready):
                        self._ready(node)
                    this_round.succeed(False)
                    return
                self._start_round(node)
                this_round.succeed(True)
                continue
            if not (yield this_round):
                return

    def _fetch(
        self, node: _Node, slot: int, conns: dict[int, _Conn], shard: int, r: int
    ) -> Generator[simpy.Event, Any, None]:
        env, pol, rtt = self.env, self.pol, self.net.rtt
        started = env.now
        conn = conns.get(r)
        if conn is not None and not conn.dead and env.now - conn.last_used >= pol.idle_timeout:
            conn.dead = True  # the server dropped it as idle (and freed its slot then)
            self._close(conn)
        if conn is not None and conn.dead:
            # The request meets a closed socket: a round trip to learn it, then either
            # a reconnect at once or an error, a backoff and a reconnect next time.
            yield env.timeout(rtt)
            del conns[r]
            conn = None
            self.dead_connections += 1
            if not pol.reconnect_dropped:
                self._back_off(node, r)
                return
        if conn is None:
            yield env.timeout(rtt)  # TCP handshake
            conn = self._open(r, env.now)
            if conn is None:
                yield env.timeout(rtt)  # the request goes out, BUSY comes back
                self.busy += 1
                self._back_off(node, r)
                if pol.busy_leaves_dead_socket:
                    conns[r] = _Conn(r, env.now, active=False, dead=True)
                return
            conns[r] = conn
        conn.active = True
        yield env.timeout(rtt)  # the request, and the first byte (or BUSY) back
        if pol.transfer_slots is None:  # the connection is the slot
            yield from self._transfer(node, slot, shard, r, started)
        else:
            yield from self._queued_transfer(node, slot, shard, r, started)
        conn.active = False
        conn.last_used = env.now

    def _queued_transfer(
        self, node: _Node, slot: int, shard: int, r: int, started: float
    ) -> Generator[simpy.Event, Any, None]:
        """The transfer once server `r` has a slot for it, or BUSY after queue_wait.
        The worker is blocked on its request meanwhile, so a shard that arrived from
        elsewhere in the meantime still comes (a duplicate)."""
        queue = self.slot_queues[r]
        turn = queue.request()
        if math.isinf(self.pol.queue_wait):
            yield turn
        elif not turn.triggered:
            yield turn | self.env.timeout(self.pol.queue_wait)
            if not turn.triggered:  # the wait ran out first
                turn.cancel()
                self.busy += 1
                self._back_off(node, r)
                return
        yield from self._transfer(node, slot, shard, r, started)
        queue.release(turn)

    def _transfer(
        self, node: _Node, slot: int, shard: int, r: int, started: float
    ) -> Generator[simpy.Event, Any, None]:
        """The shard's bytes, then what the worker does with them."""
        env, pol = self.env, self.pol
        nbytes = self._shard_bytes(shard)
        sender = int(self.servers[r])
        yield self.fluid.transfer(slot, sender, node.idx, nbytes)
        self.fetches += 1
        self.served[sender] += nbytes
        sample = nbytes / max(env.now - started, 1e-6)
        old = node.p_rate[r]
        a = pol.rate_smoothing
        node.p_rate[r] = sample if math.isnan(old) else a * sample + (1 - a) * old
        if node.held[shard]:
            self.duplicates += 1
            return
        node.held[shard] = True
        node.held_count += 1
        if node.srv >= 0:
            delay = float(self.events_rng.uniform(0, self.poll_round))
            env.timeout(delay).callbacks.append(partial(self._polled, node.srv, shard))
            if pol.gossip_each_shard:
                self._gossip_soon(node.srv)
        if node.held_count == self.n_shards:
            node.all_held = env.now
            self._wake(node)  # idle workers: the run is over
            if not pol.wait_for_duplicates:
                self._ready(node)

    def _shard_bytes(self, shard: int) -> int:
        return min(self.shard_size, self.size - shard * self.shard_size)

    def _back_off(self, node: _Node, r: int) -> None:
        node.p_retry[r] = self.env.now + self.pol.backoff
        self.env.timeout(self.pol.backoff).callbacks.append(lambda _: self._wake(node))

    def _open(self, r: int, now: float) -> _Conn | None:
        """A slot at server `r`, or None (BUSY): idle connections past the server's
        idle timeout have been dropped by then."""
        conns = self.server_conns[r]
        timeout = self.pol.idle_timeout
        stale = [c for c in conns if not c.active and now - c.last_used >= timeout]
        for c in stale:
            c.dead = True
            conns.remove(c)
        cap = self.pol.max_connections
        if r == 0 and self.pol.transfer_slots is not None:
            cap = self.pol.origin_max_connections
        if len(conns) >= cap:
            idle = [c for c in conns if not c.active] if self.pol.evict_idle else []
            if not idle:
                return None
            evicted = min(idle, key=lambda c: c.last_used)
            evicted.dead = True  # its worker learns on its next request there
            conns.remove(evicted)
            self.evicted += 1
        conn = _Conn(r, now)
        conns.append(conn)
        return conn

    def _close(self, conn: _Conn) -> None:
        conns = self.server_conns[conn.server]
        if conn in conns:
            conns.remove(conn)

    def _ready(self, node: _Node) -> None:
        node.ready = self.env.now
        self.finished[node.idx] = True
        if node.srv >= 0:
            self._gossip_soon(node.srv)  # the fetcher's changed() once finished
        self.left -= 1
        if self.left == 0:
            self.all_done.succeed()

    # ---- who can see what --------------------------------------------------------------

    def _polled(self, r: int, shard: int, _: simpy.Event) -> None:
        """Holder `r`'s new shard reaches the peers polling it."""
        self.vis_poll[r, shard] = 1.0
        pollers = self.pollers[r]
        waiting = pollers[(self.idle[pollers] > 0) & ~self.held[pollers, shard]]
        for j in waiting.tolist():
            self._wake(self.nodes[j])

    def _gossip_soon(self, r: int) -> None:
        """An advert as soon as MIN_ADVERT_GAP allows (send_advert(force=True))."""
        if self.gossip_due[r]:
            return
        self.gossip_due[r] = True
        delay = max(0.0, self.last_gossip[r] + self.pol.min_advert_gap - self.env.now)
        self.env.timeout(delay).callbacks.append(partial(self._publish, r))

    def _publish(self, r: int, _: simpy.Event | None = None) -> None:
        self.gossip_due[r] = False
        self.last_gossip[r] = self.env.now
        snapshot = self.held[int(self.servers[r])].copy()
        self.env.timeout(self.net.gossip_delay).callbacks.append(
            partial(self._gossiped, r, snapshot)
        )

    def _advertise(self, r: int, phase: float) -> Generator[simpy.Event, Any, None]:
        """Server `r`'s periodic advert, gossiped to everyone."""
        yield self.env.timeout(phase)
        node = int(self.servers[r])
        while self.left:
            if (self.held[node] & (self.vis_gossip[r] < 0.5)).any():
                self._publish(r)
            yield self.env.timeout(self.pol.advert_interval)

    def _gossiped(self, r: int, holdings: Bools, _: simpy.Event) -> None:
        new = holdings & (self.vis_gossip[r] < 0.5)
        if not new.any():
            return
        self.vis_gossip[r, new] = 1.0
        # Whoever polls r has its advert too: the poll view is never behind gossip.
        self.vis_poll[r, new] = 1.0
        idle = np.flatnonzero(self.idle > 0)
        if idle.size:
            wanting = idle[(~self.held[np.ix_(idle, np.flatnonzero(new))]).any(axis=1)]
            for j in wanting.tolist():
                self._wake(self.nodes[j])

    # ---- Download._next_job ------------------------------------------------------------

    def _next_job(self, node: _Node, now: float) -> tuple[int, int] | None:
        """The shard and server fetch.py's _next_job picks, or None (wait)."""
        pol = self.pol
        if node.held_count == self.n_shards:
            return None
        eligible = (node.p_retry <= now) & (node.p_inflight < pol.max_inflight_per_peer)
        if node.srv >= 0:
            eligible[node.srv] = False
        if not eligible.any():
            return None
        # Holders per shard among eligible peers: those it polls as polled, the rest
        # as last gossiped. Two matrix-vector products instead of a gather.
        polled = eligible & node.conn
        counts = polled.astype(np.float32) @ self.vis_poll
        counts += (eligible & ~polled).astype(np.float32) @ self.vis_gossip
        missing = ~node.held
        fresh = missing.copy()
        for shard, fetching in node.inflight.items():
            fresh[shard] = False
            for r in fetching:
                # A peer already fetching this shard for this node is not a holder for it.
                if eligible[r] and self._sees(node, r, shard):
                    counts[shard] -= 1
        if fresh.any():
            pool = fresh
        else:
            # Endgame: every missing shard is in flight; race the ones with few fetchers.
            pool = np.zeros(self.n_shards, dtype=bool)
            for shard, fetching in node.inflight.items():
                pool[shard] = missing[shard] and len(fetching) < pol.endgame_copies
        candidate = pool & (counts > 0.5)
        if not candidate.any():
            return None
        # Rarest first; among equals the node's own shuffled order.
        key = np.where(
            candidate, counts.astype(np.int64) * self.n_shards + node.rank, np.iinfo(np.int64).max
        )
        shard = int(np.argmin(key))
        if not fresh.any():
            self.endgame_jobs += 1
        column = np.where(node.conn, self.vis_poll[:, shard], self.vis_gossip[:, shard]) > 0.5
        column &= eligible
        for r in node.inflight.get(shard, ()):
            column[r] = False
        return shard, self._pick_peer(node, np.flatnonzero(column))

    def _sees(self, node: _Node, r: int, shard: int) -> bool:
        vis = self.vis_poll if node.conn[r] else self.vis_gossip
        return bool(vis[r, shard] > 0.5)

    def _pick_peer(self, node: _Node, holders: Ints) -> int:
        rates = node.p_rate[holders]
        unknown = np.isnan(rates)
        if self.pol.unmeasured_first:
            if unknown.any():
                unmeasured = holders[unknown]
                return int(unmeasured[node.rng.randrange(unmeasured.size)])
        elif unknown.all():
            return int(holders[node.rng.randrange(holders.size)])
        else:
            rates = np.where(unknown, 0.0, rates)
        if node.rng.random() < self.pol.explore:
            return int(holders[node.rng.randrange(holders.size)])
        return int(holders[int(np.argmax(rates / (1 + node.p_inflight[holders])))])

    # ---- the answer --------------------------------------------------------------------

    def result(self, wall: float) -> Result:
        nodes = self.nodes[1:]
        return Result(
            size_bytes=self.size,
            shard_size=self.shard_size,
            shards=self.n_shards,
            ready=np.array([n.ready for n in nodes]),
            all_held=np.array([n.all_held for n in nodes]),
            up=self.up[1:].copy(),
            down=self.down[1:].copy(),
            reachable=self.reachable[1:].copy(),
            served_bytes=self.served[1:].copy(),
            origin_bytes=float(self.served[0]),
            fetches=self.fetches,
            duplicates=self.duplicates,
            endgame_jobs=self.endgame_jobs,
            busy=self.busy,
            dead_connections=self.dead_connections,
            evicted=self.evicted,
            rounds=sum(n.rounds for n in nodes),
            peer_rates=self.rates.copy(),
            origin_up=float(self.up[0]),
            wall_seconds=wall,
        )


def simulate(
    size_bytes: int,
    network: Network | None = None,
    policy: Policy | None = None,
    *,
    shard_size: int = DEFAULT_SHARD_SIZE,
    seed: int = 0,
    prior_rates: Floats | None = None,
    horizon: float = 24 * 3600.0,
) -> Result:
    """Broadcasts one version of `size_bytes` in `shard_size` shards from the origin
    to `network.nodes` nodes; nodes not done by `horizon` seconds have time inf.
    `prior_rates` (a Result's peer_rates, same network and seed) is the PeerBook a
    previous step left. Deterministic for a seed."""
    started = time.perf_counter()
    swarm = _Swarm(
        network or Network(), policy or Policy(), size_bytes, shard_size, seed, prior_rates
    )
    swarm.run(horizon)
    return swarm.result(time.perf_counter() - started)


# ---- the report --------------------------------------------------------------------------

# What the code does; what it did before 2026-11-27, when this simulation's what-ifs
# went into it; and what-ifs against the code, one change at a time.
BEFORE = "before 2026-11-27"
POLICIES = {
    "code": Policy(),
    BEFORE: Policy(
        transfer_slots=None,
        max_connections=64,
        evict_idle=False,
        unmeasured_first=True,
        poll_threads=1,
        busy_leaves_dead_socket=False,
        reconnect_dropped=False,
    ),
    "code, but connection slots": Policy(transfer_slots=None, max_connections=64),
    "code, but no eviction at the connection cap": Policy(evict_idle=False),
    "code, but unmeasured peers first": Policy(unmeasured_first=True),
    "code, but sequential polls": Policy(poll_threads=1),
    "code + slots per 10 Mbit/s of uplink": Policy(slot_mbit=10.0),
    "code, but a 64-slot, 256-connection origin": Policy(
        origin_transfer_slots=64, origin_max_connections=256
    ),
}


@dataclass(frozen=True)
class _Row:
    version: str
    size: int
    shard_mib: int
    policy: str
    quantum: float
    warm: bool = False  # seeded with the PeerBook of the same row run cold


def _run_row(row: _Row, nodes: int, seed: int, horizon: float, prior: Floats | None) -> Result:
    net = Network(nodes=nodes, rate_quantum=row.quantum)
    return simulate(
        row.size,
        net,
        POLICIES[row.policy],
        shard_size=row.shard_mib * MIB,
        seed=seed,
        prior_rates=prior,
        horizon=horizon,
    )


def _fmt(seconds: float) -> str:
    if not math.isfinite(seconds):
        return "> horizon"
    return f"{seconds:.0f} s" if seconds < 600 else f"{seconds / 60:.0f} min"


def _spread(values: list[float]) -> str:
    if len(values) == 1:
        return _fmt(values[0])
    ordered = sorted(values)
    mid = ordered[len(ordered) // 2]
    return f"{_fmt(mid)} ({_fmt(ordered[0])} - {_fmt(ordered[-1])})"


def _table_row(row: _Row, runs: list[Result]) -> str:
    first = runs[0]
    policy = row.policy + (", warm PeerBook" if row.warm else "")
    cells = [
        f"{row.version}, {row.size / 1e9:g} GB",
        policy,
        str(row.shard_mib),
        str(first.shards),
        "**" + _spread([r.p90() for r in runs]) + "**",
        _spread([r.p99() for r in runs]),
        _spread([p90(r.all_held) for r in runs]),
        f"{_fmt(first.lower_bound(0.9))} / {_fmt(first.lower_bound(0.99))}",
        f"{statistics.median(r.origin_bytes / r.size_bytes for r in runs):.0f}",
        f"{statistics.median(r.busy for r in runs):.0f}",
        f"{sum(r.wall_seconds for r in runs):.0f}",
    ]
    return "| " + " | ".join(cells) + " |"


def main(argv: list[str] | None = None) -> dict[_Row, list[Result]]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--seeds", type=int, default=1, help="runs per row (seeds 0..n-1)")
    parser.add_argument("--full-bytes", type=int, default=FULL_BYTES)
    parser.add_argument("--delta-fraction", type=float, default=DELTA_FRACTION)
    parser.add_argument("--delta-shard-mib", type=int, nargs="+", default=[64, 16, 4, 1])
    parser.add_argument(
        "--quantum",
        type=float,
        default=Network.rate_quantum,
        help="rate solutions at most this often, delta rows (s)",
    )
    # Anchor transfers last 10 s and more (64 MiB at >= 50 Mbit/s): a second's wait for a
    # rate is within a few percent, and it keeps the run to minutes.
    parser.add_argument("--anchor-quantum", type=float, default=1.0)
    parser.add_argument("--horizon-hours", type=float, default=24.0)
    parser.add_argument("--skip-anchor", action="store_true")
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    args = parser.parse_args(argv)

    delta = round(args.full_bytes * args.delta_fraction)
    rows: list[_Row] = []
    if not args.skip_anchor:
        rows += [
            _Row("anchor", args.full_bytes, 64, p, args.anchor_quantum) for p in ("code", BEFORE)
        ]
    rows += [_Row("delta", delta, mib, "code", args.quantum) for mib in args.delta_shard_mib]
    probe = 4 if 4 in args.delta_shard_mib else args.delta_shard_mib[-1]
    rows.append(_Row("delta", delta, probe, "code", args.quantum, warm=True))
    rows += [_Row("delta", delta, mib, BEFORE, args.quantum) for mib in args.delta_shard_mib]
    # One change at a time, to see what each is worth.
    singles = [name for name in POLICIES if name not in ("code", BEFORE)]
    rows += [_Row("delta", delta, probe, name, args.quantum) for name in singles]

    net = Network(nodes=args.nodes)
    print(
        f"Broadcast of one version to {net.nodes} nodes: origin {net.origin_up_mbit / 1000:g} "
        f"Gbit/s up; node links lognormal, median {net.down_median_mbit:g} down / "
        f"{net.up_median_mbit:g} up Mbit/s, sigma {net.sigma}, correlation "
        f"{net.updown_correlation}; {net.reachable_fraction:.0%} reachable; RTT "
        f"{net.rtt * 1000:g} ms; {args.seeds} seed(s) per row"
        + (" (median, min - max)" if args.seeds > 1 else "")
        + "."
    )
    print()
    print(
        "| version | policy | shard MiB | shards | p90 ready | p99 ready | p90 last shard | "
        "floor p90 / p99 | origin sent (copies) | BUSY | wall s |"
    )
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    horizon = args.horizon_hours * 3600
    seeds = range(args.seeds)
    results: dict[_Row, list[Result]] = {}
    cold = [row for row in rows if not row.warm]
    with ProcessPoolExecutor(max_workers=max(1, args.jobs)) as pool:
        futures = {
            (row, seed): pool.submit(_run_row, row, args.nodes, seed, horizon, None)
            for row in cold
            for seed in seeds
        }
        for row in rows:
            if row.warm:
                base = replace(row, warm=False)
                priors = [futures[base, seed].result().peer_rates for seed in seeds]
                for seed, prior in zip(seeds, priors, strict=True):
                    futures[row, seed] = pool.submit(
                        _run_row, row, args.nodes, seed, horizon, prior
                    )
        for row in rows:
            results[row] = [futures[row, seed].result() for seed in seeds]
            print(_table_row(row, results[row]), flush=True)
    print()
    for version, goal in (("anchor", ANCHOR_GOAL_SECONDS), ("delta", DELTA_GOAL_SECONDS)):
        for policy in ("code", BEFORE):
            mine = [
                (row, runs)
                for row, runs in results.items()
                if (row.version, row.policy, row.warm) == (version, policy, False)
            ]
            if not mine:
                continue
            row, runs = min(mine, key=lambda m: statistics.median(r.p90() for r in m[1]))
            best = statistics.median(r.p90() for r in runs)
            print(
                f"{version}: 90% of nodes within {_fmt(goal)}? {policy}: best p90 {_fmt(best)} "
                f"({row.shard_mib} MiB shards): {'met' if best <= goal else 'NOT met'}; "
                f"no schedule beats {_fmt(runs[0].lower_bound(0.9))} on this network."
            )
    return results


if __name__ == "__main__":
    main()
