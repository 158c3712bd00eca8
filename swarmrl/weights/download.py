"""Fetching one checkpoint version from many peers at once.

Which peers hold what comes from their adverts (the :class:`PeerBook`). Each of
a few worker threads repeatedly takes a job, a missing shard and a peer that
holds it, fetches the bytes over the data path, and hands them to the store,
which verifies them before writing. Choices:

- Shards go rarest first (fewest holders), ties broken at random per node, so
  that peers fetch different shards from the origin and trade them among
  themselves: the swarm carries the load, not the origin.
- Peers are chosen by observed throughput (an exponential average per peer)
  divided by the requests already in flight to them. A small share of jobs
  goes to a random holder, which is how a peer not yet measured, or one that
  got faster, is found; unmeasured peers are picked otherwise only while no
  holder is measured. (Trying every new holder first would send every worker
  of every node to each peer the moment it advertises a shard.)
- A peer that sends bytes that fail verification is banned for good (its
  account too, when its advert bound one). A peer that fails or times out is
  backed off for a while; its shard goes back to the queue.
- Endgame: when every missing shard is already in flight, idle workers fetch
  the same shards from other peers, so one slow peer cannot hold up the end.
- A rate cap (the volunteer's, for a link they also use) is kept on average: each
  shard received goes through a :class:`~swarmrl.p2p.pacing.Pacer`, and a worker
  that got ahead of its rate waits before its next shard. The pacer may be shared
  (a node's downloads, one after another) and its rate changed at any time.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from swarmrl.p2p.pacing import Pacer
from swarmrl.shards import shard_range
from swarmrl.weights.datapath import (
    BUSY,
    DataPathError,
    Endpoint,
    MisbehavingPeerError,
    ShardClient,
    ShardUnavailableError,
)
from swarmrl.weights.store import Version, WeightStore

log = logging.getLogger("swarmrl.p2p")

EXPLORE = 0.1
RATE_SMOOTHING = 0.3
MAX_INFLIGHT_PER_PEER = 2
BACKOFF_SECONDS = 2.0
DEFAULT_WORKERS = 4


@dataclass
class PeerState:
    """What this peer knows of another: where it serves, what it holds, how it did."""

    peer_id: str
    endpoint: Endpoint | None = None
    account: str | None = None
    addrs: list[str] = field(default_factory=list)
    holdings: dict[str, bytearray] = field(default_factory=dict)
    rate: float | None = None  # bytes per second, smoothed
    inflight: int = 0
    retry_at: float = 0.0
    banned: str | None = None


class PeerBook:
    """Every peer's state, shared by the node's threads."""

    def __init__(self) -> None:
        self._peers: dict[str, PeerState] = {}
        self._banned_accounts: set[str] = set()
        self.lock = threading.Condition()

    def update(
        self,
        peer_id: str,
        *,
        endpoint: Endpoint | None,
        account: str | None,
        addrs: list[str],
        holdings: dict[str, bytearray],
    ) -> None:
        with self.lock:
            state = self._peers.setdefault(peer_id, PeerState(peer_id))
            state.endpoint = endpoint
            state.account = account
            state.addrs = addrs
            state.holdings = holdings
            if account is not None and account in self._banned_accounts and not state.banned:
                state.banned = "its account is banned"
            self.lock.notify_all()

    def get(self, peer_id: str) -> PeerState | None:
        with self.lock:
            return self._peers.get(peer_id)

    def all(self) -> list[PeerState]:
        with self.lock:
            return list(self._peers.values())

    def ban(self, peer_id: str, reason: str) -> None:
        with self.lock:
            state = self._peers.setdefault(peer_id, PeerState(peer_id))
            state.banned = reason
            if state.account:
                self._banned_accounts.add(state.account)
        log.warning("banned peer %s: %s", peer_id, reason)

    def is_banned(self, peer_id: str) -> bool:
        with self.lock:
            state = self._peers.get(peer_id)
            return state is not None and state.banned is not None


@dataclass(frozen=True)
class Progress:
    step: int
    held: int
    total: int
    bytes_done: int
    seconds: float


class Download:
    """Fetches `version` into `store` with `workers` threads, every shard through
    `pacer` (None: one with no cap); `run` blocks until done."""

    def __init__(
        self,
        store: WeightStore,
        version: Version,
        book: PeerBook,
        *,
        workers: int = DEFAULT_WORKERS,
        pacer: Pacer | None = None,
        on_progress: Callable[[Progress], None] | None = None,
        on_ban: Callable[[str, str], None] | None = None,
        rng: random.Random | None = None,
    ) -> None:
        self.store = store
        self.version = version
        self.book = book
        self.workers = workers
        self.pacer = Pacer() if pacer is None else pacer
        self._on_progress = on_progress
        self._on_ban = on_ban
        self._rng = rng or random.Random()
        # Rarest first, ties in an order of this node's own.
        self._tiebreak = list(range(version.manifest.shard_count))
        self._rng.shuffle(self._tiebreak)
        self._inflight: dict[int, set[str]] = {}
        self._stopped = False
        self._started = time.monotonic()
        self._bytes = 0

    @property
    def done(self) -> bool:
        return self.version.held_count == self.version.manifest.shard_count

    @property
    def stopped(self) -> bool:
        return self._stopped

    def stop(self) -> None:
        with self.book.lock:
            self._stopped = True
            self.book.lock.notify_all()
        self.pacer.wake()  # a worker waiting for the rate ends

    def run(self, timeout: float | None = None) -> bool:
        """Fetches until every shard is held (True) or `timeout`/stop (False)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        threads = [
            threading.Thread(target=self._work, args=(deadline,), daemon=True, name=f"fetch-{i}")
            for i in range(self.workers)
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        return self.done

    # ---- choosing work ---------------------------------------------------------------

    def _holders(self, index: int, now: float) -> list[PeerState]:
        mhash = self.version.manifest_hash
        return [
            p
            for p in self.book.all()
            if p.banned is None
            and p.endpoint is not None
            and p.retry_at <= now
            and p.inflight < MAX_INFLIGHT_PER_PEER
            and (bits := p.holdings.get(mhash)) is not None
            and index < len(bits)
            and bits[index]
        ]

    def _pick_peer(self, holders: list[PeerState]) -> PeerState:
        measured = [p for p in holders if p.rate is not None]
        if not measured or self._rng.random() < EXPLORE:
            return self._rng.choice(holders)
        return max(measured, key=lambda p: (p.rate or 0.0) / (1 + p.inflight))

    def _next_job(self, deadline: float | None) -> tuple[int, PeerState] | None:
        with self.book.lock:
            while True:
                if self._stopped or self.done:
                    return None
                now = time.monotonic()
                if deadline is not None and now >= deadline:
                    return None
                missing = [i for i in self._tiebreak if not self.version.held[i]]
                fresh = [i for i in missing if i not in self._inflight]
                # Endgame: every missing shard is in flight, so race the slow ones.
                pool = fresh or [i for i in missing if len(self._inflight[i]) < 2]
                candidates = []
                for index in pool:
                    holders = [
                        p
                        for p in self._holders(index, now)
                        if p.peer_id not in self._inflight.get(index, ())
                    ]
                    if holders:
                        candidates.append((len(holders), index, holders))
                if candidates:
                    # min() keeps the first of equals: the node's own shuffled order.
                    _, index, holders = min(candidates, key=lambda c: c[0])
                    peer = self._pick_peer(holders)
                    peer.inflight += 1
                    self._inflight.setdefault(index, set()).add(peer.peer_id)
                    return index, peer
                self.book.lock.wait(0.25)

    def _release(self, index: int, peer: PeerState) -> None:
        with self.book.lock:
            peer.inflight -= 1
            holders = self._inflight.get(index)
            if holders is not None:
                holders.discard(peer.peer_id)
                if not holders:
                    del self._inflight[index]
            self.book.lock.notify_all()

    # ---- doing work ------------------------------------------------------------------

    def _work(self, deadline: float | None) -> None:
        buffer = bytearray(self.version.manifest.shard_size)
        clients: dict[str, ShardClient] = {}
        try:
            while (job := self._next_job(deadline)) is not None:
                index, peer = job
                try:
                    self._fetch(index, peer, buffer, clients)
                finally:
                    self._release(index, peer)
        finally:
            for client in clients.values():
                client.close()

    def _fetch(
        self, index: int, peer: PeerState, buffer: bytearray, clients: dict[str, ShardClient]
    ) -> None:
        endpoint = peer.endpoint
        assert endpoint is not None  # _holders only offers peers with one
        client = clients.get(peer.peer_id)
        if client is None or client.endpoint != endpoint:
            client = clients[peer.peer_id] = ShardClient(endpoint)
        mhash = self.version.manifest_hash
        started = time.monotonic()
        data: memoryview | None = None
        try:
            length = shard_range(self.version.manifest, index)[1]
            data = client.fetch(mhash, index, length, buffer)
            stored = self.store.write_shard(self.version, index, data)
        except ShardUnavailableError as e:
            with self.book.lock:
                if e.status == BUSY:
                    peer.retry_at = time.monotonic() + BACKOFF_SECONDS
                # Otherwise its advert is stale: forget that bit until the next one.
                elif (bits := peer.holdings.get(mhash)) is not None and index < len(bits):
                    bits[index] = 0
            return
        except (ValueError, MisbehavingPeerError) as e:
            reason = f"shard {index} of step {self.version.step} failed verification: {e}"
            self.book.ban(peer.peer_id, reason)
            client.close()
            if self._on_ban:
                self._on_ban(peer.peer_id, reason)
            if data is not None:  # its bytes came all the same
                self._pace(len(data))
            return
        except DataPathError as e:
            log.info("fetching shard %d from %s failed: %s", index, peer.peer_id, e)
            with self.book.lock:
                peer.retry_at = time.monotonic() + BACKOFF_SECONDS
            return
        seconds = max(time.monotonic() - started, 1e-6)
        with self.book.lock:
            sample = len(data) / seconds
            peer.rate = (
                sample
                if peer.rate is None
                else (RATE_SMOOTHING * sample + (1 - RATE_SMOOTHING) * peer.rate)
            )
            if stored:
                self._bytes += len(data)
            progress = Progress(
                self.version.step,
                self.version.held_count,
                self.version.manifest.shard_count,
                self._bytes,
                time.monotonic() - self._started,
            )
        if stored and self._on_progress:
            self._on_progress(progress)
        self._pace(len(data))

    def _pace(self, received: int) -> None:
        """Waits until the pacer's rate allows the `received` bytes (duplicates of the
        endgame included), or until the download is stopped."""
        self.pacer.pace(received, stopped=lambda: self._stopped)
