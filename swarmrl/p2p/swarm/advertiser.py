"""The advertiser: what a peer tells the swarm about itself, and what it serves.

It holds this peer's side of the conversation between peers:

- its signed advert (who it is, where its data endpoint is, which shards it
  holds, which peers it knows), published on ``swarmrl/<run>/peers`` when it
  changes and every half minute, and swapped on ``/swarmrl/have/1.0.0``;
- what it learns from others' adverts, kept in the shared
  :class:`~swarmrl.p2p.fetch.PeerBook` that downloads choose peers from, and the
  peers those adverts name, dialled up to MAX_PEERS;
- what it serves: manifests (``/swarmrl/manifest/1.0.0``) and shard bytes (its
  :class:`~swarmrl.p2p.datapath.ShardServer`) of the versions it holds, and
  dial-backs for other peers (``/swarmrl/dialback/1.0.0``);
- its own reachability: the data endpoint goes into the advert only once a peer
  dialled it back (or it was started known reachable);
- the polling thread: while something is being fetched it swaps adverts with
  every connected peer twice a second, up to POLL_THREADS peers at once, which
  is how a download learns, shard by shard, who can serve it.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

from eth_account.signers.local import LocalAccount

from swarmrl.chain.eip712 import Domain
from swarmrl.p2p import dialback, wire
from swarmrl.p2p.datapath import (
    DEFAULT_MAX_CONNECTIONS,
    DEFAULT_TRANSFER_SLOTS,
    ORIGIN_MAX_CONNECTIONS,
    ORIGIN_TRANSFER_SLOTS,
    Endpoint,
    ShardServer,
)
from swarmrl.p2p.events import Event, SwarmEventKind
from swarmrl.p2p.fetch import PeerBook
from swarmrl.p2p.have import HAVE, HaveRequest
from swarmrl.p2p.host import Host, RemoteError
from swarmrl.p2p.manifest import MANIFEST, ManifestReply, ManifestRequest
from swarmrl.p2p.messages import (
    MAX_ADVERT_BYTES,
    MAX_EXCHANGED_PEERS,
    MAX_HOLDINGS,
    Advert,
    Holding,
    peers_topic,
)
from swarmrl.p2p.records import PeerRecord, SignatureError
from swarmrl.p2p.store import WeightStore, bits

log = logging.getLogger("swarmrl.p2p")

POLL_INTERVAL = 0.5
ADVERT_INTERVAL = 30.0
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


class Advertiser:
    """This peer's advert, what it learns from others', and what it serves."""

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
    ) -> None:
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
        `fetching()`, an advert swap with every connected peer each POLL_INTERVAL."""
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
        """What this peer holds or offers changed: tell the swarm soon."""
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
        self._poll_peer(peer)
        self._dial_back(peer)

    def _poll_peer(self, peer: str) -> None:
        """Swaps adverts with `peer`, and dials the peers it knows that this one does not."""
        try:
            advert = self.host.call(HAVE, peer, HaveRequest(advert=self.advert()))
            self._learn(peer, advert)
        except (RemoteError, wire.WireError, SignatureError, ValueError) as e:
            log.warning("peer %s sent a bad advert: %s", peer, e)
            return
        except (ConnectionError, TimeoutError, RuntimeError) as e:
            log.debug("could not poll %s: %s", peer, e)
            return
        self._dial_new(advert.peers)

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
        if fetching:
            # host.call may come from any thread: each swap waits on the host's event
            # loop, so the swaps of a round overlap and it lasts as long as the slowest.
            swaps = [
                (peer, polls.submit(self._poll_peer, peer))
                for peer in self.host.peers()
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
        return self.advert()


def _unspecified(endpoint: Endpoint) -> bool:
    return endpoint.host in ("0.0.0.0", "::")


def _listen_host(listen: str) -> str:
    parts = listen.split("/")
    if len(parts) < 3 or parts[1] not in ("ip4", "ip6"):
        raise ValueError(f"{listen!r} is not an /ip4/ or /ip6/ listen multiaddr")
    return parts[2]
