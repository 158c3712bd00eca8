"""The fetcher: follows a run's checkpoint announcements and fetches what is new.

An announcement on ``swarmrl/<run>/checkpoints`` (or a bootstrap peer's newest
manifest) is taken only if a trusted key signed it for this run's domain and its
step is newer than every step the store holds; refusals are logged, sent as
events and remembered. Then the fetcher gets the manifest (manifest protocol),
checks it against the announced hash, and runs a
:class:`~swarmrl.weights.download.Download` in a thread of its own until every shard is
held and verified. One download at a time, so a slow link is not split between
steps: a newer announcement waits while the download in progress is within
``window`` steps of it (the steps the orchestrator still takes work from, so a
node slower than one step still finishes a download and works with it), and
the newest step waiting is fetched next; a download that falls further behind
is stopped and dropped for the newest. The store keeps the newest N versions;
:meth:`Fetcher.wait_for` is how the rest of the process waits for one.

A step whose signed manifest links a delta (:mod:`swarmrl.weights.delta_versions`) onto a
version held whole is fetched as that delta and rebuilt; if the rebuild fails,
the step is fetched whole. A node a few steps behind, within the window, takes
the steps in between as deltas too (each announcement it checked is remembered
for that), since a chain of deltas is a few percent of one whole step.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from swarmrl.eip712 import Domain
from swarmrl.p2p import wire
from swarmrl.p2p.host import Host, RemoteError
from swarmrl.p2p.pacing import Pacer
from swarmrl.shards import Manifest
from swarmrl.weights import peer_records
from swarmrl.weights.datapath import IO_TIMEOUT
from swarmrl.weights.download import Download, PeerBook
from swarmrl.weights.gossip import MAX_ANNOUNCEMENT_BYTES, checkpoints_topic
from swarmrl.weights.manifest import MANIFEST, ManifestRequest
from swarmrl.weights.peer_events import Event, SwarmEventKind
from swarmrl.weights.peer_records import Announcement, SignatureError
from swarmrl.weights.store import Version, WeightStore

log = logging.getLogger("swarmrl.p2p")

# Announcements already refused, remembered so that gossip repeats cost no signature
# check and no log line.
MAX_REMEMBERED_REJECTIONS = 256
# Far more steps than any async window.
MAX_REMEMBERED_STEPS = 64


class Fetcher:
    """Which checkpoints to fetch, the downloads of them, and waiting for one."""

    def __init__(
        self,
        host: Host,
        store: WeightStore,
        book: PeerBook,
        *,
        domain: Domain,
        run: str,
        trusted: frozenset[str],
        workers: int,
        pacer: Pacer,
        steps: threading.RLock,
        on_event: Callable[[Event], None],
        on_change: Callable[[], None],
    ) -> None:
        self.host = host
        self.store = store
        self.book = book
        self.domain = domain
        self.trusted = trusted
        self.workers = workers
        self.pacer = pacer  # every download's, so a changed rate reaches the one running
        self._on_event = on_event
        self._on_change = on_change  # what this peer holds changed
        self._downloads: dict[str, Download] = {}
        # The newest step announced while a download went on, fetched after it.
        self._waiting: tuple[Announcement, str] | None = None
        # Checked announcements by step, for a chain of deltas to a newer step.
        self._announced: dict[int, tuple[Announcement, str]] = {}
        self.window = 0  # steps a download may fall behind the newest and go on
        self.newest_announced = -1  # the newest step a trusted key announced
        self._threads: list[threading.Thread] = []
        self._ready = threading.Condition()
        self._closed = threading.Event()
        self._rejected: dict[str, None] = {}  # manifest hashes, oldest first
        # Held around every decision to take a step (shared with the origin), and
        # around the downloads; _consider holds it around _still_wanted.
        self._lock = steps
        host.subscribe(checkpoints_topic(run), self._on_announcement)

    def fetching(self) -> bool:
        """Whether a download is still missing shards."""
        return any(not d.done for d in list(self._downloads.values()))

    def catch_up(self, peer: str) -> None:
        """Asks `peer` for its newest checkpoint and fetches it if it is wanted."""
        try:
            reply = self.host.call(MANIFEST, peer, ManifestRequest())
        except (RemoteError, wire.WireError, ConnectionError, TimeoutError) as e:
            log.info("bootstrap peer %s has no checkpoint yet: %s", peer, e)
            return
        self._consider(reply.announcement, peer, reply.manifest)
        self._on_change()

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
        """Stops every download (a shard in flight finishes or times out first) and
        takes no new one."""
        with self._lock:
            self._closed.set()
            downloads, threads = list(self._downloads.values()), list(self._threads)
        for download in downloads:
            download.stop()
        for thread in threads:
            thread.join(timeout=IO_TIMEOUT)

    # ---- deciding --------------------------------------------------------------------

    def _on_announcement(self, peer: str, data: bytes) -> None:
        if len(data) > MAX_ANNOUNCEMENT_BYTES:
            raise wire.WireError(f"an announcement of {len(data)} bytes is over the limit")
        self._consider(wire.parse(Announcement, data), peer)

    def _reject(self, announcement: Announcement, reason: str, *, remember: bool = True) -> None:
        """Refuses a checkpoint: a log line, an event, and (unless the cause may pass,
        `remember=False`) no second look at the same announcement."""
        if remember:
            self._rejected[announcement.manifest_hash] = None
        if len(self._rejected) > MAX_REMEMBERED_REJECTIONS:
            del self._rejected[next(iter(self._rejected))]
        log.warning("rejected checkpoint step %d: %s", announcement.step, reason)
        self._on_event(Event(SwarmEventKind.REJECTED, announcement.step, reason))

    def _consider(
        self, announcement: Announcement, peer: str, manifest: Manifest | None = None
    ) -> None:
        if not self._still_wanted(announcement, first_look=True):
            return
        self._remember(announcement, peer)
        self._on_event(Event(SwarmEventKind.ANNOUNCED, announcement.step, announcement.model))
        if not self._finish_first(announcement, peer):
            return
        # Outside the lock: a slow peer delays this announcement, nothing else.
        if manifest is None:
            manifest = self._ask_for(announcement.manifest_hash, peer, announcement.step)
            if manifest is None:
                self._reject(announcement, "no peer could give its manifest", remember=False)
                return
        delta = self._find_delta(manifest, peer)
        if delta is None and self._chain_first(announcement, peer, manifest):
            return
        with self._lock:
            # Another thread may have taken this or a newer step meanwhile, or begun
            # one this step must wait for or stop.
            if not self._still_wanted(announcement, first_look=False):
                return
            if not self._finish_first(announcement, peer):
                return
            self._start(announcement, manifest, delta)

    def _remember(self, announcement: Announcement, peer: str) -> None:
        """Keeps a checked announcement for :meth:`_chain_first` (the newest few)."""
        with self._lock:
            self._announced[announcement.step] = (announcement, peer)
            while len(self._announced) > MAX_REMEMBERED_STEPS:
                del self._announced[min(self._announced)]

    def _chain_first(self, announcement: Announcement, peer: str, manifest: Manifest) -> bool:
        """Whether the step after the newest held is fetched first, as its delta, on
        the way to `announcement`'s step (which then waits, and may come as its delta
        in turn): for a node a few steps behind, within the window, a chain of deltas
        is a few percent of a whole step."""
        held = self.store.latest()
        if held is None or manifest.delta is None:
            return False
        behind = announcement.step - held.step
        with self._lock:
            between = self._announced.get(held.step + 1)
        if not 2 <= behind <= self.window + 1 or between is None:
            return False
        first, first_peer = between
        first_manifest = self._ask_for(first.manifest_hash, first_peer, first.step)
        if first_manifest is None or first_manifest.delta is None:
            return False
        first_delta = self._find_delta(first_manifest, first_peer)
        # Every delta of the chain about as large as the first: cheaper than the step?
        if first_delta is None or first_delta.size * behind >= manifest.size:
            return False
        log.info(
            "step %d announced; fetching step %d's delta first, %d behind",
            announcement.step,
            first.step,
            behind,
        )
        with self._lock:
            if self._waiting is None or self._waiting[0].step < announcement.step:
                self._waiting = (announcement, peer)
            # `first` was checked when it was announced; it must still be wanted.
            if self._still_wanted(first, first_look=False, chained=True) and self._finish_first(
                first, first_peer
            ):
                self._start(first, first_manifest, first_delta)
        return True

    def _start(
        self, announcement: Announcement, manifest: Manifest, delta: Manifest | None
    ) -> None:
        """Begins the download of `manifest` (the announced version), or of its delta
        `delta` onto the base it names. Called with the lock held."""
        if self._closed.is_set():
            return
        try:
            announcement.matches(manifest)
            if delta is None:
                version = self.store.begin(announcement, manifest)
            else:
                version = self.store.begin(announcement, delta, target=manifest)
        except (ValueError, OSError) as e:
            self._reject(announcement, str(e))
            return
        download = Download(
            self.store,
            version,
            self.book,
            workers=self.workers,
            pacer=self.pacer,
            on_progress=lambda p: self._on_event(
                Event(SwarmEventKind.PROGRESS, p.step, progress=p)
            ),
            on_ban=lambda peer_id, why: self._on_event(
                Event(SwarmEventKind.BANNED, version.step, why)
            ),
        )
        self._downloads[version.manifest_hash] = download
        thread = threading.Thread(
            target=self._download, args=(download,), name="swarmrl-download", daemon=True
        )
        self._threads = [t for t in self._threads if t.is_alive()] + [thread]
        thread.start()  # under the lock: close() may join it as soon as it is listed

    def _finish_first(self, announcement: Announcement, peer: str) -> bool:
        """Whether to start fetching `announcement` now. Not while a download within
        `window` steps of it goes on: it then waits, and the newest one waiting is
        fetched once that download ends. A download further behind is stopped (its
        thread drops it) for this one."""
        with self._lock:
            for running in self._downloads.values():
                if running.stopped:
                    continue
                behind = announcement.step - running.version.step
                if behind <= self.window:
                    if self._waiting is None or self._waiting[0].step < announcement.step:
                        self._waiting = (announcement, peer)
                        log.info(
                            "step %d announced; finishing step %d first (%d behind, within "
                            "the window of %d)",
                            announcement.step,
                            running.version.step,
                            behind,
                            self.window,
                        )
                    return False
                log.info(
                    "step %d announced; stopping step %d, %d steps behind (past the window of %d)",
                    announcement.step,
                    running.version.step,
                    behind,
                    self.window,
                )
                running.stop()
            if self._waiting is not None and self._waiting[0].step <= announcement.step:
                self._waiting = None
        return True

    def _still_wanted(
        self, announcement: Announcement, *, first_look: bool, chained: bool = False
    ) -> bool:
        """Whether to fetch this checkpoint: not closed, not held, not refused before,
        signed by a trusted key (checked on the first look only), and newer than every
        step here or waiting (`chained`: than every step here). Refusals are logged and
        remembered."""
        mhash = announcement.manifest_hash
        with self._lock:
            # Closed: the host may outlive this swarm (the process closes it after).
            if self._closed.is_set() or mhash in self._rejected:
                return False
            # Held, or being fetched whole or as its delta.
            if any(v.announcement.manifest_hash == mhash for v in self.store.versions()):
                return False
            if self._waiting is not None and self._waiting[0].manifest_hash == mhash:
                return False  # gossip repeating the step that waits its turn
            if first_look:
                try:
                    announcement.verify(self.domain, self.trusted)
                except SignatureError as e:
                    self._reject(announcement, str(e))
                    return False
                self.newest_announced = max(self.newest_announced, announcement.step)
            newest = self.store.newest_step()
            if self._waiting is not None and not chained:
                newest = max(newest, self._waiting[0].step)
            if announcement.step <= newest:
                self._reject(
                    announcement, f"step {announcement.step} is not newer than step {newest}"
                )
                return False
        return True

    def _ask_for(self, mhash: str, first: str, step: int) -> Manifest | None:
        """The manifest whose hash is `mhash`, from `first` or any other peer; None if
        none gives it. (The caller checks what else it must be.)"""
        peers = [first] + [p for p in self.host.peers() if p != first]
        for peer in peers:
            try:
                manifest = self.host.call(MANIFEST, peer, ManifestRequest(manifest_hash=mhash))
                if peer_records.manifest_hash(manifest.manifest) != mhash:
                    raise ValueError("it is not the manifest asked for")
                return manifest.manifest
            except (RemoteError, wire.WireError, ValueError, ConnectionError, TimeoutError) as e:
                log.info("peer %s could not give a manifest of step %d: %s", peer, step, e)
        return None

    def _find_delta(self, manifest: Manifest, peer: str) -> Manifest | None:
        """The manifest of `manifest`'s delta, when this peer holds the delta's base
        whole; None to fetch the version whole."""
        link = manifest.delta
        base = None if link is None else self.store.get(link.base)
        if link is None or base is None or not base.complete or base.is_delta:
            return None
        delta = self._ask_for(link.manifest, peer, manifest.step)
        if delta is None:
            log.info("no peer gave step %d's delta; fetching the step whole", manifest.step)
        return delta

    # ---- downloading -----------------------------------------------------------------

    def _download(self, download: Download) -> None:
        version = download.version
        self._on_change()
        try:
            finished = self._fetch_until_done(download)
            if finished:
                # Still listed while a delta is applied: a newer step waits for this one.
                self._complete(version)
        finally:
            with self._lock:
                self._downloads.pop(version.manifest_hash, None)
        if not finished and not self._closed.is_set():
            self.store.drop(version)  # stopped for a newer step, past the window
            self._on_change()
        with self._lock:
            waiting, self._waiting = self._waiting, None
        if waiting is not None:
            self._consider(*waiting)

    def _complete(self, version: Version) -> None:
        try:
            path = self.store.finish(version)
        except (ValueError, OSError) as e:
            self._reject(version.announcement, str(e))
            return
        if version.target is not None:
            rebuilt = self._rebuild(version, version.target)
            if rebuilt is None:
                return
            version, path = rebuilt, rebuilt.files_dir
        log.info("step %d is complete at %s", version.step, path)
        self._on_change()
        with self._ready:
            self._ready.notify_all()
        self._on_event(Event(SwarmEventKind.READY, version.step, path=path))

    def _rebuild(self, delta: Version, target: Manifest) -> Version | None:
        """The version `delta` rebuilds from its base; None when it does not (the base
        is gone, the delta is corrupt, the result differs from the signed manifest): the
        step is then fetched whole, and the versions held are untouched."""
        assert target.delta is not None  # a delta version's target links to it
        base = self.store.get(target.delta.base)
        try:
            if base is None:
                raise ValueError("its base was dropped while it downloaded")
            rebuilt = self.store.add_rebuilt(delta, base)
        except (ValueError, OSError) as e:
            log.warning("step %d's delta did not rebuild it: %s; fetching it whole", delta.step, e)
            self.store.drop(delta)
            with self._lock:
                self._start(delta.announcement, target, None)
            return None
        log.info(
            "step %d rebuilt from step %d and a %d-byte delta",
            target.step,
            base.step,
            delta.manifest.size,
        )
        return rebuilt

    def _fetch_until_done(self, download: Download) -> bool:
        """True once every shard is held; False if the swarm closed or the download was
        stopped for a newer step."""
        # One run until the last shard: close() and a newer step stop it. (Rounds
        # with a timeout would close every connection and wait out the slowest
        # transfer each time; the broadcast simulation measured what that costs.)
        return download.run()
