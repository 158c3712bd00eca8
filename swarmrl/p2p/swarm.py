"""A peer of the weight swarm: the origin that publishes checkpoints, and every
node that fetches them and serves them on.

A :class:`SwarmNode` joins three things: a libp2p :class:`~swarmrl.p2p.host.Host`
for control (who is who, what is new, who holds what), a
:class:`~swarmrl.p2p.store.WeightStore` for the versions on disk, and a
:class:`~swarmrl.p2p.datapath.ShardServer` for shard bytes. The control plane:

- topic ``swarmrl/<run>/checkpoints``: signed :class:`Announcement` s. A node
  accepts one only if a trusted key signed it for this run's domain and its step
  is newer than every step the node has; then it fetches the manifest (manifest
  protocol), checks it against the announced hash, and starts a download.
- topic ``swarmrl/<run>/peers``: :class:`Advert` s, sent when a peer joins,
  starts or finishes a version, and every half minute: a few per peer per
  version, far under gossipsub's per-peer rate limits.
- ``/swarmrl/have/1.0.0`` (:mod:`swarmrl.p2p.have`): a peer's current advert on
  request. A downloading node polls the peers it is connected to twice a second,
  which is how it learns, shard by shard, that other nodes can serve it.
- ``/swarmrl/manifest/1.0.0`` (:mod:`swarmrl.p2p.manifest`): a manifest with its
  announcement, by hash or the newest, which is also how a node that joins late
  learns what to fetch.
- ``/swarmrl/dialback/1.0.0`` (:mod:`swarmrl.p2p.dialback`): a peer that is not
  known to be reachable advertises its data endpoint only after another peer
  dialled it back, so a node behind NAT never sends downloaders into timeouts.

Events (:mod:`swarmrl.p2p.events`: announced, progress, banned, ready, rejected,
reachable) go to one callback, for progress bars and the TUI.
"""

from __future__ import annotations

import contextlib
import logging
import os
import tarfile
import tempfile
import threading
import time
from collections.abc import Callable, Iterable
from pathlib import Path

from eth_account.signers.local import LocalAccount
from eth_utils import to_checksum_address
from libp2p.crypto.keys import KeyPair

from swarmrl import shards
from swarmrl.chain.eip712 import Domain
from swarmrl.p2p import dialback, wire
from swarmrl.p2p.datapath import IO_TIMEOUT, Endpoint, ShardServer
from swarmrl.p2p.events import Event, SwarmEventKind
from swarmrl.p2p.fetch import DEFAULT_WORKERS, Download, PeerBook
from swarmrl.p2p.have import HAVE, HaveRequest
from swarmrl.p2p.host import DEFAULT_LISTEN, Host, RemoteError
from swarmrl.p2p.manifest import MANIFEST, ManifestReply, ManifestRequest
from swarmrl.p2p.messages import (
    MAX_ADVERT_BYTES,
    MAX_ANNOUNCEMENT_BYTES,
    MAX_EXCHANGED_PEERS,
    MAX_HOLDINGS,
    Advert,
    Holding,
    checkpoints_topic,
    peers_topic,
)
from swarmrl.p2p.records import Announcement, PeerRecord, SignatureError
from swarmrl.p2p.store import BUNDLE_SUFFIX, Version, WeightStore, bits
from swarmrl.shards import DEFAULT_SHARD_SIZE, Manifest

log = logging.getLogger("swarmrl.p2p")

POLL_INTERVAL = 0.5
ADVERT_INTERVAL = 30.0
# How often a peer that no one has dialled back yet asks again.
DIALBACK_RETRY = 60.0
MIN_ADVERT_GAP = 2.0
# Announcements already refused, remembered so that gossip repeats cost no signature
# check and no log line.
MAX_REMEMBERED_REJECTIONS = 256
MAX_PEERS = 32


class SwarmNode:
    """One peer; start it, publish or wait for checkpoints, close it."""

    def __init__(
        self,
        *,
        store: WeightStore,
        domain: Domain,
        run: str,
        trusted: Iterable[str],
        peer_key: KeyPair,
        account: LocalAccount | None = None,
        listen: str | None = DEFAULT_LISTEN,
        reachable: bool = False,
        bootstrap: Iterable[str] = (),
        workers: int = DEFAULT_WORKERS,
        on_event: Callable[[Event], None] | None = None,
    ) -> None:
        self.store = store
        self.domain = domain
        self.trusted = frozenset(to_checksum_address(a) for a in trusted)
        self.account = account
        self.workers = workers
        self.book = PeerBook()
        self._on_event = on_event or (lambda event: None)
        self._topic_checkpoints = checkpoints_topic(run)
        self._topic_peers = peers_topic(run)
        self._downloads: dict[str, Download] = {}
        self._threads: list[threading.Thread] = []
        self._ready = threading.Condition()
        self._closed = threading.Event()
        self._last_advert = -MIN_ADVERT_GAP
        self._advert_due = False
        self._rejected: dict[str, None] = {}  # manifest hashes, oldest first
        self._lock = threading.RLock()  # _consider holds it around _still_wanted
        self._data: Endpoint | None = None  # the data endpoint advertised, once reachable
        self._last_dialback = -DIALBACK_RETRY

        self.host = Host(
            peer_key, listen=listen, topics=[self._topic_checkpoints, self._topic_peers]
        )
        try:
            # Outbound only (listen None): nobody could dial the data path, so none is
            # offered; the node fetches from peers and serves nothing.
            self.server = (
                None if listen is None else ShardServer(self.store.get, host=_listen_host(listen))
            )
            # `reachable`: the listen address is known to be reachable (an origin
            # others bootstrap from); anyone else waits for a dial-back.
            # A server on every interface cannot name its own address: it learns it
            # from a dial-back too.
            if reachable and self.server is not None and not _unspecified(self.server.endpoint):
                self._data = self.server.endpoint
            self.record = (
                PeerRecord.sign(account, self.host.peer_id, domain) if account is not None else None
            )
            self.host.serve(MANIFEST, self._serve_manifest)
            self.host.serve(HAVE, self._serve_have)
            self.host.serve(dialback.DIALBACK, dialback.DialbackService(self.host))
            self.host.subscribe(self._topic_checkpoints, self._on_announcement)
            self.host.subscribe(self._topic_peers, self._on_advert)
            for version in self.store.load():
                log.info("seeding step %d from %s", version.step, version.path)
            for addr in bootstrap:
                self.join(addr)
        except BaseException:
            self.close()
            raise
        self._poller = threading.Thread(target=self._poll_loop, name="swarmrl-poll", daemon=True)
        self._poller.start()

    # ---- identity --------------------------------------------------------------------

    @property
    def peer_id(self) -> str:
        return self.host.peer_id

    @property
    def addrs(self) -> list[str]:
        return self.host.addrs

    def advert(self) -> Advert:
        holdings = [
            Holding(manifest_hash=v.manifest_hash, step=v.step, shards=v.bitfield().hex())
            for v in self.store.versions()[-MAX_HOLDINGS:]
            if v.held_count
        ]
        known = [p.addrs[0] for p in self.book.all() if p.addrs and p.banned is None]
        return Advert(
            record=self.record,
            addrs=self.addrs,
            data=None if self._data is None else str(self._data),
            holdings=holdings,
            peers=known[-MAX_EXCHANGED_PEERS:],
        )

    # ---- joining and learning ------------------------------------------------------

    def join(self, addr: str) -> None:
        """Connects to a bootstrap peer, learns its advert and its newest checkpoint."""
        peer = self.host.connect(addr)
        self._poll_peer(peer)
        self._dial_back(peer)
        try:
            reply = self.host.call(MANIFEST, peer, ManifestRequest())
        except (RemoteError, wire.WireError, ConnectionError, TimeoutError) as e:
            log.info("bootstrap peer %s has no checkpoint yet: %s", peer, e)
            return
        self._consider(reply.announcement, peer, reply.manifest)
        self._send_advert(force=True)

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
            if peer == self.peer_id or peer in connected or self.book.is_banned(peer):
                continue
            with contextlib.suppress(ValueError, ConnectionError, TimeoutError, RuntimeError):
                connected.add(self.host.connect(addr, timeout=5))
                self._poll_peer(peer)

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
        self._send_advert(force=True)

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

    def _poll_loop(self) -> None:
        while not self._closed.wait(POLL_INTERVAL):
            try:
                self._poll_once()
            except Exception:
                # close() does not wait for this thread: a round cut short by the
                # host going away is expected; anything else must not end polling.
                if self._closed.is_set():
                    return
                log.exception("polling peers failed; trying again in %s s", POLL_INTERVAL)

    def _poll_once(self) -> None:
        if any(not d.done for d in list(self._downloads.values())):
            for peer in self.host.peers():
                if not self.book.is_banned(peer):
                    self._poll_peer(peer)
        if self._data is None and time.monotonic() - self._last_dialback >= DIALBACK_RETRY:
            self._retry_dial_back()
        self._send_advert()

    def _send_advert(self, *, force: bool = False) -> None:
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
            self.host.publish(self._topic_peers, wire.dump(self.advert()))

    def _on_advert(self, peer: str, data: bytes) -> None:
        if len(data) > MAX_ADVERT_BYTES:
            raise wire.WireError(f"an advert of {len(data)} bytes is over the limit")
        advert = wire.parse(Advert, data)
        try:
            self._learn(peer, advert)
        except (SignatureError, ValueError) as e:
            raise wire.WireError(f"bad advert: {e}") from None
        self._dial_new([a for a in advert.addrs if a.endswith(f"/p2p/{peer}")][:1])

    # ---- checkpoints ------------------------------------------------------------------

    def _newest_step(self) -> int:
        steps = [v.step for v in self.store.versions()]
        return max(steps, default=-1)

    def _reject(self, announcement: Announcement, reason: str, *, remember: bool = True) -> None:
        """Refuses a checkpoint: a log line, an event, and (unless the cause may pass,
        `remember=False`) no second look at the same announcement."""
        if remember:
            self._rejected[announcement.manifest_hash] = None
        if len(self._rejected) > MAX_REMEMBERED_REJECTIONS:
            del self._rejected[next(iter(self._rejected))]
        log.warning("rejected checkpoint step %d: %s", announcement.step, reason)
        self._on_event(Event(SwarmEventKind.REJECTED, announcement.step, reason))

    def _on_announcement(self, peer: str, data: bytes) -> None:
        if len(data) > MAX_ANNOUNCEMENT_BYTES:
            raise wire.WireError(f"an announcement of {len(data)} bytes is over the limit")
        self._consider(wire.parse(Announcement, data), peer)

    def _consider(
        self, announcement: Announcement, peer: str, manifest: Manifest | None = None
    ) -> None:
        if not self._still_wanted(announcement, first_look=True):
            return
        self._on_event(Event(SwarmEventKind.ANNOUNCED, announcement.step, announcement.model))
        if manifest is None:
            # Outside the lock: a slow peer delays this announcement, nothing else.
            manifest = self._find_manifest(announcement, peer)
            if manifest is None:
                return
        with self._lock:
            # Another thread may have taken this or a newer step meanwhile.
            if not self._still_wanted(announcement, first_look=False):
                return
            try:
                announcement.matches(manifest)
                version = self.store.begin(announcement, manifest)
            except (ValueError, OSError) as e:
                self._reject(announcement, str(e))
                return
            download = Download(
                self.store,
                version,
                self.book,
                workers=self.workers,
                on_progress=lambda p: self._on_event(
                    Event(SwarmEventKind.PROGRESS, p.step, progress=p)
                ),
                on_ban=lambda peer_id, why: self._on_event(
                    Event(SwarmEventKind.BANNED, version.step, why)
                ),
            )
            # Only the newest checkpoint is worth fetching: older downloads stop and
            # are dropped (their threads see the newer step).
            for older in self._downloads.values():
                older.stop()
            self._downloads[version.manifest_hash] = download
            thread = threading.Thread(
                target=self._download, args=(download,), name="swarmrl-download", daemon=True
            )
            self._threads = [t for t in self._threads if t.is_alive()] + [thread]
        thread.start()

    def _still_wanted(self, announcement: Announcement, *, first_look: bool) -> bool:
        """Whether to fetch this checkpoint: not held, not refused before, signed by a
        trusted key (checked on the first look only), and newer than every step here.
        Refusals are logged and remembered."""
        mhash = announcement.manifest_hash
        with self._lock:
            if self.store.get(mhash) or mhash in self._rejected:
                return False
            if first_look:
                try:
                    announcement.verify(self.domain, self.trusted)
                except SignatureError as e:
                    self._reject(announcement, str(e))
                    return False
            newest = self._newest_step()
            if announcement.step <= newest:
                self._reject(
                    announcement, f"step {announcement.step} is not newer than step {newest}"
                )
                return False
        return True

    def _find_manifest(self, announcement: Announcement, first: str) -> Manifest | None:
        peers = [first] + [p for p in self.host.peers() if p != first]
        for peer in peers:
            try:
                request = ManifestRequest(manifest_hash=announcement.manifest_hash)
                manifest = self.host.call(MANIFEST, peer, request).manifest
                announcement.matches(manifest)
                return manifest
            except (RemoteError, wire.WireError, ValueError, ConnectionError, TimeoutError) as e:
                log.info(
                    "peer %s could not give the manifest of step %d: %s", peer, announcement.step, e
                )
        self._reject(announcement, "no peer could give its manifest", remember=False)
        return None

    def _download(self, download: Download) -> None:
        version = download.version
        self._send_advert(force=True)
        try:
            finished = self._fetch_until_done(download)
        finally:
            with self._lock:
                self._downloads.pop(version.manifest_hash, None)
        if not finished:
            return
        try:
            path = self.store.finish(version)
        except (ValueError, OSError) as e:
            self._reject(version.announcement, str(e))
            return
        log.info("step %d is complete at %s", version.step, path)
        self._send_advert(force=True)
        with self._ready:
            self._ready.notify_all()
        self._on_event(Event(SwarmEventKind.READY, version.step, path=version.unpacked or path))

    def _fetch_until_done(self, download: Download) -> bool:
        """True once every shard is held; False if the node closed or a newer step
        superseded this one (which is then dropped from the store)."""
        version = download.version
        while not download.run(timeout=5.0):
            if self._closed.is_set():
                return False
            if self._newest_step() > version.step:
                self.store.drop(version)
                return False
        return True

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

    # ---- the origin ----------------------------------------------------------------------

    def publish(
        self, path: Path, *, model: str, step: int, shard_size: int = DEFAULT_SHARD_SIZE
    ) -> Version:
        """Signs and announces the checkpoint at `path` (a file, or a directory sent as
        one tar bundle) as step `step`, and serves it."""
        if self.account is None:
            raise ValueError("publishing needs the origin's key")
        if self.account.address not in self.trusted:
            raise ValueError(f"{self.account.address} is not a trusted checkpoint signer")
        path = Path(path)
        owned = False
        if path.is_dir():
            path = _bundle(path, self.store.root)
            owned = True
        manifest = shards.build_manifest(path, model=model, step=step, shard_size=shard_size)
        announcement = Announcement.sign(self.account, manifest, self.domain)
        with self._lock:
            newest = self._newest_step()
            if step <= newest:
                raise ValueError(f"step {step} is not newer than the published step {newest}")
            version = self.store.add_origin(path, manifest, announcement, owned=owned)
        self.announce(version)
        self.store.prune()
        return version

    def announce(self, version: Version) -> None:
        """(Re)publishes `version`'s announcement, for peers that joined since."""
        with contextlib.suppress(Exception):  # no peers yet: they will ask on joining
            self.host.publish(self._topic_checkpoints, wire.dump(version.announcement))
        self._send_advert(force=True)

    # ---- waiting -----------------------------------------------------------------------

    def wait_for(self, step: int | None = None, timeout: float | None = None) -> Version:
        """The newest complete version, once one at `step` or later (any, if None) is
        complete; TimeoutError after `timeout` seconds."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._ready:
            while True:
                version = self.store.latest()
                if version is not None and (step is None or version.step >= step):
                    return version
                remaining = None if deadline is None else deadline - time.monotonic()
                if remaining is not None and remaining <= 0:
                    raise TimeoutError("no complete checkpoint arrived in time")
                self._ready.wait(0.5 if remaining is None else min(remaining, 0.5))

    def close(self) -> None:
        """Stops fetching (a shard in flight finishes or times out first), serving and
        the host; then the files are closed. Idempotent."""
        self._closed.set()
        for download in list(self._downloads.values()):
            download.stop()
        for thread in self._threads:
            thread.join(timeout=IO_TIMEOUT)
        if getattr(self, "server", None) is not None:
            self.server.close()
        self.host.close()
        for version in self.store.versions():
            version.close()

    def __enter__(self) -> SwarmNode:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _unspecified(endpoint: Endpoint) -> bool:
    return endpoint.host in ("0.0.0.0", "::")


def _listen_host(listen: str) -> str:
    parts = listen.split("/")
    if len(parts) < 3 or parts[1] not in ("ip4", "ip6"):
        raise ValueError(f"{listen!r} is not an /ip4/ or /ip6/ listen multiaddr")
    return parts[2]


def _bundle(directory: Path, workdir: Path) -> Path:
    """`directory` as one deterministic uncompressed tar: sorted names, no owners or
    times, so the same files always give the same bytes and so the same manifest."""
    fd, tmp = tempfile.mkstemp(dir=workdir, suffix=BUNDLE_SUFFIX)
    os.close(fd)
    with tarfile.open(tmp, "w", format=tarfile.PAX_FORMAT) as tar:
        for path in sorted(directory.rglob("*")):
            if not (path.is_file() or path.is_dir()) or path.is_symlink():
                continue
            info = tar.gettarinfo(path, arcname=str(path.relative_to(directory)))
            info.uid = info.gid = 0
            info.uname = info.gname = ""
            info.mtime = 0
            if path.is_dir():
                tar.addfile(info)
            else:
                with open(path, "rb") as f:
                    tar.addfile(info, f)
    final = workdir / f"{directory.name}{BUNDLE_SUFFIX}"
    os.replace(tmp, final)
    return final
