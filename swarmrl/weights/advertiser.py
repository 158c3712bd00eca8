"""The advertiser: what a peer tells the swarm about itself, and what it serves.

It holds this peer's side of the conversation between peers:

- its signed advert (who it is, where its data endpoint is, which shards it
  holds, which peers it knows), published on ``swarmrl/<run>/peers`` when it
  changes and every half minute, and swapped on ``/swarmrl/have/1.0.0``;
- what it learns from others' adverts, kept in the shared
  :class:`~swarmrl.weights.download.PeerBook` that downloads choose peers from, and the
  peers those adverts name, dialled up to MAX_PEERS;
- what it serves: manifests (``/swarmrl/manifest/1.0.0``) and shard bytes (its
  :class:`~swarmrl.weights.datapath.ShardServer`) of the versions it holds, and
  dial-backs for other peers (``/swarmrl/dialback/1.0.0``);
- its own reachability: the data endpoint goes into the advert only once a peer
  dialled it back (or it was started known reachable);
- the polling thread: while something is being fetched it swaps adverts with
  the connected peers, up to POLL_THREADS at once, which is how a download
  learns, shard by shard, who can serve it. Each peer has its own interval
  (:class:`PollSchedule`): POLL_INTERVAL while its advert keeps changing (a peer
  fetching the same version gets shards all the time), doubling up to
  MAX_POLL_INTERVAL while it does not (the origin, which holds the whole
  version from the start, or a peer that is done).
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from eth_account.signers.local import LocalAccount

from swarmrl.eip712 import Domain
from swarmrl.p2p import wire
from swarmrl.p2p.host import Host, RemoteError
from swarmrl.p2p.pacing import Pacer
from swarmrl.weights import dialback
from swarmrl.weights.datapath import (
    DEFAULT_MAX_CONNECTIONS,
    DEFAULT_TRANSFER_SLOTS,
    ORIGIN_MAX_CONNECTIONS,
    ORIGIN_TRANSFER_SLOTS,
    Endpoint,
    ShardServer,
)
from swarmrl.weights.download import PeerBook
from swarmrl.weights.gossip import (
    MAX_ADVERT_BYTES,
    MAX_EXCHANGED_PEERS,
    MAX_HOLDINGS,
    Advert,
    Holding,
    peers_topic,
)
from swarmrl.weights.have import HAVE, HaveRequest
from swarmrl.weights.manifest import MANIFEST, ManifestReply, ManifestRequest
from swarmrl.weights.peer_events import Event, SwarmEventKind
from swarmrl.weights.peer_records import PeerRecord, SignatureError
from swarmrl.weights.store import WeightStore, bits

log = logging.getLogger("swarmrl.p2p")

POLL_INTERVAL = 0.5
ADVERT_INTERVAL = 30.0
# A peer whose advert a swap found unchanged is polled next after twice the interval
# before, up to this (PollSchedule): never later than its periodic gossiped advert
# would tell the same news.
MAX_POLL_INTERVAL = ADVERT_INTERVAL
# How often a peer that no one has dialled back yet asks again.
DIALBACK_RETRY = 60.0
MIN_ADVERT_GAP = 2.0
MAX_PEERS = 32
# Peers polled at once. A swap waits two round trips for its answer: one peer after
# another, a round took POLL_INTERVAL plus that times every peer (seconds, with 32
# peers across continents). One thread per peer a node dials keeps its round one
# swap long (8 at once spread a delta a few percent slower in
# benchmarks/broadcast_sim.py), and the threads only wait on the host's event loop.
POLL_THREADS = MAX_PEERS


@dataclass(slots=True)
class _Polled:
    content: int | None  # hash of the advert's _content last seen; None: none yet
    interval: float
    due: float


class PollSchedule:
    """When to swap adverts next with each connected peer: POLL_INTERVAL after a swap
    that taught something new (or the first with a peer), then twice the interval
    before each time a swap teaches nothing new, up to MAX_POLL_INTERVAL; back to
    POLL_INTERVAL (and due no later than that from now) as soon as the peer's advert
    changes, whichever way it comes: a poll, its gossiped advert, or its own swap.

    Why: every downloading node polls every peer it is connected to, and every node is
    connected to the origin. At POLL_INTERVAL for all, 1,000 downloading nodes swap
    2,000 adverts a second with the origin, each a signature recovery on both sides,
    while the origin's advert does not change for the whole broadcast. A peer fetching
    the same version changes its advert with each shard it gets, so it stays near
    POLL_INTERVAL (`swapped`'s `fetching`: it is kept there while its advert shows it
    part way through a version this peer fetches, however slowly its shards come).
    When this peer starts a download, every peer starts afresh at POLL_INTERVAL
    (`restart`); the origin and peers done back off, and what they gossip (a
    download of theirs that starts or ends) brings their next poll forward.

    Only connected peers are kept (`due` forgets the others). Times are the caller's
    clock's; thread-safe: swaps end in the polling pool, adverts arrive in the host's
    worker threads.
    """

    def __init__(
        self, interval: float = POLL_INTERVAL, max_interval: float = MAX_POLL_INTERVAL
    ) -> None:
        self.interval = interval
        self.max_interval = max_interval
        self._lock = threading.Lock()
        self._peers: dict[str, _Polled] = {}

    def __contains__(self, peer: object) -> bool:
        with self._lock:
            return peer in self._peers

    def interval_of(self, peer: str) -> float | None:
        """The interval before `peer`'s next swap; None if it is not scheduled."""
        with self._lock:
            polled = self._peers.get(peer)
            return None if polled is None else polled.interval

    def due(self, connected: Iterable[str], now: float) -> list[str]:
        """The peers of `connected` to swap with at `now` (one never swapped with: at
        once), in their order; forgets every peer not in `connected`."""
        connected = list(connected)
        with self._lock:
            keep = set(connected)
            for gone in [p for p in self._peers if p not in keep]:
                del self._peers[gone]
            return [p for p in connected if p not in self._peers or self._peers[p].due <= now]

    def swapped(
        self, peer: str, advert: Advert | None, started: float, *, fetching: bool = False
    ) -> None:
        """A swap with `peer`, started at `started`, ended with its `advert` (None: it
        failed, which taught nothing new either). `fetching`: the advert shows the peer
        part way through a version this peer fetches too; it gets shards all the time
        (a 64 MiB one every ten seconds on a home uplink), each one this peer may want
        from it, so it stays at the shortest interval."""
        content = None if advert is None else _content(advert)
        with self._lock:
            polled = self._peers.get(peer)
            if polled is None:  # the first swap since it connected
                self._peers[peer] = _Polled(content, self.interval, started + self.interval)
                return
            if fetching or (content is not None and content != polled.content):
                polled.content, polled.interval = content, self.interval
            else:
                polled.interval = min(2 * polled.interval, self.max_interval)
            polled.due = started + polled.interval

    def heard(self, peer: str, advert: Advert, now: float) -> None:
        """`peer`'s advert came unasked (gossiped, or with its own swap) at `now`. A peer
        not scheduled is left so: it is due at once if connected, and gossip reaches
        this peer from the whole swarm, not only from those it is connected to."""
        content = _content(advert)
        with self._lock:
            polled = self._peers.get(peer)
            if polled is None or polled.content == content:
                return
            polled.content, polled.interval = content, self.interval
            polled.due = min(polled.due, now + self.interval)

    def forget(self, peer: str) -> None:
        """`peer` just connected: its first swap starts its schedule afresh."""
        with self._lock:
            self._peers.pop(peer, None)

    def restart(self, now: float) -> None:
        """Every peer due at `now`, at POLL_INTERVAL: a download that starts asks who
        holds a new version's shards, which a peer quiet for the last one may soon have."""
        with self._lock:
            for polled in self._peers.values():
                polled.interval, polled.due = self.interval, now


def _content(advert: Advert) -> int:
    """What a downloader learns from `advert`: where the peer is and serves, what it
    holds, whom it knows (its record is signed once per peer and not compared).
    Hashed: a reachable peer connected to a hundred others keeps an int for each, not
    an advert of up to MAX_ADVERT_BYTES; a collision would only time one poll wrong
    (what the advert says is learnt all the same)."""
    holdings = tuple((h.manifest_hash, h.step, h.shards) for h in advert.holdings)
    return hash((advert.data, tuple(advert.addrs), holdings, tuple(advert.peers)))


class Advertiser:
    """This peer's advert, what it learns from others', and what it serves; and, while
    it fetches, the polls of its peers' adverts on a :class:`PollSchedule`."""

    def __init__(
        self,
        host: Host,
        store: WeightStore,
        book: PeerBook,
        *,
        domain: Domain,
        run: str,
        account: LocalAccount | None,
        reachable: bool,
        on_event: Callable[[Event], None],
        pacer: Pacer | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """`pacer`: what the shard bytes served go through (None: no cap); `clock`: the
        seconds the poll schedule counts in."""
        self.host = host
        self.store = store
        self.book = book
        self.domain = domain
        self._topic = peers_topic(run)
        self._on_event = on_event
        self._closed = threading.Event()
        self._lock = threading.Lock()  # the advert's schedule
        self._last_advert = -MIN_ADVERT_GAP
        self._advert_due = False
        self._data: Endpoint | None = None  # the data endpoint advertised, once reachable
        self._last_dialback = -DIALBACK_RETRY
        self._poller: threading.Thread | None = None
        self._polls: ThreadPoolExecutor | None = None
        self._clock = clock
        self.schedule = PollSchedule()
        # Outbound only (no listen address): nobody could dial the data path, so none
        # is offered; the peer fetches from others and serves nothing.
        listen = host.listen
        # A peer started known reachable is an origin, whose uplink is a datacentre's.
        slots, conns = (
            (ORIGIN_TRANSFER_SLOTS, ORIGIN_MAX_CONNECTIONS)
            if reachable
            else (DEFAULT_TRANSFER_SLOTS, DEFAULT_MAX_CONNECTIONS)
        )
        self.server = (
            None
            if listen is None
            else ShardServer(
                store.get,
                host=_listen_host(listen),
                transfer_slots=slots,
                max_connections=conns,
                pacer=pacer,
            )
        )
        # `reachable`: the listen address is known to be reachable (an origin others
        # bootstrap from); anyone else waits for a dial-back. A server on every
        # interface cannot name its own address: it learns it from a dial-back too.
        if reachable and self.server is not None and not _unspecified(self.server.endpoint):
            self._data = self.server.endpoint
        self.record = (
            PeerRecord.sign(account, host.peer_id, domain) if account is not None else None
        )
        host.serve(MANIFEST, self._serve_manifest)
        host.serve(HAVE, self._serve_have)
        host.serve(dialback.DIALBACK, dialback.DialbackService(host))
        host.subscribe(self._topic, self._on_advert)

    def start(self, fetching: Callable[[], bool]) -> None:
        """Starts polling: adverts on schedule, dial-backs retried, and, while
        `fetching()`, advert swaps with the connected peers that the schedule has due,
        checked every POLL_INTERVAL."""
        self._polls = ThreadPoolExecutor(POLL_THREADS, thread_name_prefix="swarmrl-poll")
        self._poller = threading.Thread(
            target=self._poll_loop, args=(fetching, self._polls), name="swarmrl-poll", daemon=True
        )
        self._poller.start()

    def close(self) -> None:
        """Stops polling (without waiting for a round in flight) and serving shards."""
        self._closed.set()
        if self._polls is not None:
            self._polls.shutdown(wait=False, cancel_futures=True)
        if self.server is not None:
            self.server.close()

    # ---- the advert ------------------------------------------------------------------

    def advert(self) -> Advert:
        holdings = [
            Holding(manifest_hash=v.manifest_hash, step=v.step, shards=v.bitfield().hex())
            for v in self.store.versions()[-MAX_HOLDINGS:]
            if v.held_count
        ]
        known = [p.addrs[0] for p in self.book.all() if p.addrs and p.banned is None]
        return Advert(
            record=self.record,
            addrs=self.host.addrs,
            data=None if self._data is None else str(self._data),
            holdings=holdings,
            peers=known[-MAX_EXCHANGED_PEERS:],
        )

    def changed(self) -> None:
        """What this peer holds or offers changed: tell the swarm soon. The fetcher
        says so when a download starts, too: every peer is polled afresh then."""
        self.schedule.restart(self._clock())
        self.send_advert(force=True)

    def send_advert(self, *, force: bool = False) -> None:
        """Publishes this peer's advert: every ADVERT_INTERVAL, and soon after a change
        (`force`), but never twice within MIN_ADVERT_GAP. A hub relays every peer's
        adverts, so this gap is what keeps it under gossipsub's per-peer rate limit."""
        now = time.monotonic()
        with self._lock:
            self._advert_due = self._advert_due or force
            since = now - self._last_advert
            if since < MIN_ADVERT_GAP or not (self._advert_due or since >= ADVERT_INTERVAL):
                return
            self._last_advert, self._advert_due = now, False
        with contextlib.suppress(Exception):  # no mesh peers yet: the next one will do
            self.host.publish(self._topic, wire.dump(self.advert()))

    # ---- meeting and learning --------------------------------------------------------

    def meet(self, peer: str) -> None:
        """Swaps adverts with a peer just connected to, and asks it for a dial-back."""
        self.schedule.forget(peer)
        self._poll_peer(peer)
        self._dial_back(peer)

    def _poll_peer(self, peer: str) -> None:
        """Swaps adverts with `peer`, and dials the peers it knows that this one does not."""
        started = self._clock()
        learnt: Advert | None = None
        try:
            advert = self.host.call(HAVE, peer, HaveRequest(advert=self.advert()))
            self._learn(peer, advert)
            learnt = advert
        except (RemoteError, wire.WireError, SignatureError, ValueError) as e:
            log.warning("peer %s sent a bad advert: %s", peer, e)
        except (ConnectionError, TimeoutError, RuntimeError) as e:
            log.debug("could not poll %s: %s", peer, e)
        finally:
            fetching = learnt is not None and self._mid_download(learnt)
            self.schedule.swapped(peer, learnt, started, fetching=fetching)
        if learnt is not None:
            self._dial_new(learnt.peers)

    def _mid_download(self, advert: Advert) -> bool:
        """Whether `advert` (learnt already, so well formed) shows its peer part way
        through a version that this peer is fetching too."""
        for h in advert.holdings:
            version = self.store.get(h.manifest_hash)
            if version is None or version.complete:
                continue
            if not all(bits(bytes.fromhex(h.shards), version.manifest.shard_count)):
                return True
        return False

    def _dial_new(self, addrs: list[str]) -> None:
        connected = set(self.host.peers())
        for addr in addrs:
            if len(connected) >= MAX_PEERS:
                return
            peer = addr.rpartition("/p2p/")[2]
            if peer == self.host.peer_id or peer in connected or self.book.is_banned(peer):
                continue
            with contextlib.suppress(ValueError, ConnectionError, TimeoutError, RuntimeError):
                connected.add(self.host.connect(addr, timeout=5))
                self.schedule.forget(peer)
                self._poll_peer(peer)

    def _learn(self, peer: str, advert: Advert) -> None:
        account = advert.record.verify(self.domain, peer) if advert.record else None
        endpoint = None if advert.data is None else Endpoint.parse(advert.data)
        holdings = {}
        for h in advert.holdings:
            version = self.store.get(h.manifest_hash)
            count = version.manifest.shard_count if version else len(h.shards) * 4
            holdings[h.manifest_hash] = bits(bytes.fromhex(h.shards), count)
        own = f"/p2p/{peer}"
        addrs = [a for a in advert.addrs if a.endswith(own)]
        self.book.update(peer, endpoint=endpoint, account=account, addrs=addrs, holdings=holdings)

    def _on_advert(self, peer: str, data: bytes) -> None:
        if len(data) > MAX_ADVERT_BYTES:
            raise wire.WireError(f"an advert of {len(data)} bytes is over the limit")
        advert = wire.parse(Advert, data)
        try:
            self._learn(peer, advert)
        except (SignatureError, ValueError) as e:
            raise wire.WireError(f"bad advert: {e}") from None
        self.schedule.heard(peer, advert, self._clock())
        self._dial_new([a for a in advert.addrs if a.endswith(f"/p2p/{peer}")][:1])

    # ---- reachability ----------------------------------------------------------------

    @property
    def serving(self) -> bool:
        """Whether this peer offers its shards: it is reachable, or was dialled back."""
        return self._data is not None

    def _dial_back(self, peer: str) -> None:
        """Asks `peer` to dial this peer's data endpoint; on success, offers shards."""
        if self.server is None or self._data is not None:
            return
        self._last_dialback = time.monotonic()
        reached = dialback.ask(self.host, self.server, peer)
        if reached is None:
            log.info("peer %s could not dial back %s; not serving shards yet", peer,
                     self.server.endpoint)  # fmt: skip
            return
        # A server on every interface advertises the address the peer reached.
        own = self.server.endpoint
        self._data = reached if _unspecified(own) else own
        log.info("peer %s dialled back %s: serving shards", peer, self._data)
        self._on_event(Event(SwarmEventKind.REACHABLE, detail=str(self._data)))
        self.changed()

    def _retry_dial_back(self) -> None:
        """Asks one connected peer (a different one each time) in a thread of its own:
        a probe that times out behind NAT must not stall the polling of downloads."""
        peers = self.host.peers() if self.server is not None else []
        if not peers:
            return
        self._last_dialback = time.monotonic()
        peer = peers[int(self._last_dialback / DIALBACK_RETRY) % len(peers)]
        threading.Thread(
            target=self._dial_back, args=(peer,), name="swarmrl-dialback", daemon=True
        ).start()

    # ---- polling ---------------------------------------------------------------------

    def _poll_loop(self, fetching: Callable[[], bool], polls: ThreadPoolExecutor) -> None:
        while not self._closed.wait(POLL_INTERVAL):
            try:
                self._poll_once(fetching(), polls)
            except Exception:
                # close() does not wait for this thread: a round cut short by the
                # host going away is expected; anything else must not end polling.
                if self._closed.is_set():
                    return
                log.exception("polling peers failed; trying again in %s s", POLL_INTERVAL)

    def _poll_once(self, fetching: bool, polls: ThreadPoolExecutor) -> None:
        # Every tick, fetching or not: the schedule forgets peers no longer connected.
        due = self.schedule.due(self.host.peers(), self._clock())
        if fetching:
            # Only the peers due: at POLL_INTERVAL for every peer, 1,000 downloading
            # nodes would swap 2,000 adverts a second with the origin, whose advert does
            # not change during a broadcast (PollSchedule); gossip pushes changes.
            # host.call may come from any thread: each swap waits on the host's event
            # loop, so the swaps of a round overlap and it lasts as long as the slowest.
            swaps = [
                (peer, polls.submit(self._poll_peer, peer))
                for peer in due
                if not self.book.is_banned(peer)
            ]
            for peer, poll in swaps:
                if (error := poll.exception()) is not None:  # one peer's must not end the round
                    log.error("polling %s failed", peer, exc_info=error)
        if self._data is None and time.monotonic() - self._last_dialback >= DIALBACK_RETRY:
            self._retry_dial_back()
        self.send_advert()

    # ---- serving ---------------------------------------------------------------------

    def _serve_manifest(self, peer: str, request: ManifestRequest) -> ManifestReply:
        if request.manifest_hash is None:
            version = self.store.latest(complete=False)
        else:
            version = self.store.get(request.manifest_hash)
        if version is None:
            raise wire.Refusal("this peer holds no such checkpoint")
        return ManifestReply(version.announcement, version.manifest)

    def _serve_have(self, peer: str, request: HaveRequest) -> Advert:
        if request.advert is not None:
            try:
                self._learn(peer, request.advert)
            except (SignatureError, ValueError) as e:
                raise wire.WireError(f"bad advert: {e}") from None
            self.schedule.heard(peer, request.advert, self._clock())
        return self.advert()


def _unspecified(endpoint: Endpoint) -> bool:
    return endpoint.host in ("0.0.0.0", "::")


def _listen_host(listen: str) -> str:
    parts = listen.split("/")
    if len(parts) < 3 or parts[1] not in ("ip4", "ip6"):
        raise ValueError(f"{listen!r} is not an /ip4/ or /ip6/ listen multiaddr")
    return parts[2]
