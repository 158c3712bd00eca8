"""The fetcher: follows a run's checkpoint announcements and fetches what is new.

An announcement on ``swarmrl/<run>/checkpoints`` (or a bootstrap peer's newest
manifest) is taken only if a trusted key signed it for this run's domain and its
step is newer than every step the store holds; refusals are logged, sent as
events and remembered. Then the fetcher gets the manifest (manifest protocol),
checks it against the announced hash, and runs a
:class:`~swarmrl.p2p.fetch.Download` in a thread of its own until every shard is
held and verified. One download at a time, so a slow link is not split between
steps: a newer announcement waits while the download in progress is within
``window`` steps of it (the steps the orchestrator still takes work from, so a
node slower than one step still finishes a download and works with it), and
the newest step waiting is fetched next; a download that falls further behind
is stopped and dropped for the newest. The store keeps the newest N versions;
:meth:`Fetcher.wait_for` is how the rest of the process waits for one.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from swarmrl.chain.eip712 import Domain
from swarmrl.p2p import wire
from swarmrl.p2p.datapath import IO_TIMEOUT
from swarmrl.p2p.events import Event, SwarmEventKind
from swarmrl.p2p.fetch import Download, PeerBook
from swarmrl.p2p.host import Host, RemoteError
from swarmrl.p2p.manifest import MANIFEST, ManifestRequest
from swarmrl.p2p.messages import MAX_ANNOUNCEMENT_BYTES, checkpoints_topic
from swarmrl.p2p.records import Announcement, SignatureError
from swarmrl.p2p.store import Version, WeightStore
from swarmrl.shards import Manifest

log = logging.getLogger("swarmrl.p2p")

# Announcements already refused, remembered so that gossip repeats cost no signature
# check and no log line.
MAX_REMEMBERED_REJECTIONS = 256


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
        max_rate: float | None = None,
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
        self.max_rate = max_rate  # bytes per second a download may average, None: no cap
        self._on_event = on_event
        self._on_change = on_change  # what this peer holds changed
        self._downloads: dict[str, Download] = {}
        # The newest step announced while a download went on, fetched after it.
        self._waiting: tuple[Announcement, str] | None = None
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
        self._on_event(Event(SwarmEventKind.ANNOUNCED, announcement.step, announcement.model))
        if not self._finish_first(announcement, peer):
            return
        if manifest is None:
            # Outside the lock: a slow peer delays this announcement, nothing else.
            manifest = self._find_manifest(announcement, peer)
            if manifest is None:
                return
        with self._lock:
            # Another thread may have taken this or a newer step meanwhile, or begun
            # one this step must wait for or stop.
            if not self._still_wanted(announcement, first_look=False):
                return
            if not self._finish_first(announcement, peer):
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
                max_rate=self.max_rate,
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

    def _still_wanted(self, announcement: Announcement, *, first_look: bool) -> bool:
        """Whether to fetch this checkpoint: not closed, not held, not refused before,
        signed by a trusted key (checked on the first look only), and newer than every
        step here or waiting. Refusals are logged and remembered."""
        mhash = announcement.manifest_hash
        with self._lock:
            # Closed: the host may outlive this swarm (the process closes it after).
            if self._closed.is_set() or self.store.get(mhash) or mhash in self._rejected:
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
            if self._waiting is not None:
                newest = max(newest, self._waiting[0].step)
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

    # ---- downloading -----------------------------------------------------------------

    def _download(self, download: Download) -> None:
        version = download.version
        self._on_change()
        try:
            finished = self._fetch_until_done(download)
        finally:
            with self._lock:
                self._downloads.pop(version.manifest_hash, None)
        if finished:
            self._complete(version)
        elif not self._closed.is_set():
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
        log.info("step %d is complete at %s", version.step, path)
        self._on_change()
        with self._ready:
            self._ready.notify_all()
        self._on_event(Event(SwarmEventKind.READY, version.step, path=path))

    def _fetch_until_done(self, download: Download) -> bool:
        """True once every shard is held; False if the swarm closed or the download was
        stopped for a newer step."""
        while not download.run(timeout=5.0):
            if self._closed.is_set() or download.stopped:
                return False
        return True
