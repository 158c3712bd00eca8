"""The versions a peer holds: what it can serve, what it is still fetching.

One directory per version under the store's root, named by step and manifest
hash, holding the signed announcement, the manifest, and the version's files in
``files/``: each ``<name>.partial`` while shards arrive, ``<name>`` once every
shard of the version has been checked. ``files/`` is what a node loads (a model
directory: weights, config, tokenizer), kept once: no archive beside it. A shard
is verified against the manifest in memory before it is written at its offset in
its file, and only then marked as held, so a peer serves it at once and never
serves an unchecked byte.

Resuming needs no journal: the partial files are allocated at their full size,
and on restart each shard range is re-hashed; the ranges that match the
manifest are held, the rest (zeros, a torn write) are fetched again.

The store keeps the newest ``keep`` complete versions and, with a byte budget,
drops the oldest complete ones until the rest fit; it never drops the newest
version or one being fetched. It takes no version that would leave less than
``min_free`` bytes free on its disk. An origin's version is linked in (a hard
link to the trainer's files where the filesystem allows, a copy otherwise), so
the store and the trainer each drop their own copy when they are done with it.

A step's delta (:mod:`swarmrl.weights.delta_versions`) is a version of its own, named by its
own manifest's hash, in a directory ending in ``-delta``, and carries the full
manifest it rebuilds (``Version.target``) under that one's signed announcement.
It is served like any version, never counts as the newest or towards ``keep``,
and goes when the step it rebuilds goes; a restart keeps it beside that step (the
nodes of a restarted origin are fetching it). :meth:`add_rebuilt`
builds the step from its base and its delta in a hidden folder and takes it in
only if every shard matches the step's manifest.
"""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path

from swarmrl import shards
from swarmrl.files import fsync, link_or_copy, write_atomically
from swarmrl.shards import PARTIAL_SUFFIX, BytesLike, Manifest
from swarmrl.weights import delta_versions, peer_records
from swarmrl.weights.peer_records import Announcement

log = logging.getLogger("swarmrl.p2p")

ANNOUNCEMENT_FILE = "announcement.json"
MANIFEST_FILE = "manifest.json"
FILES_DIR = "files"
DELTA_DIR_SUFFIX = "-delta"
# Hidden folders a version is made in (an origin's delta, a node's rebuilt step) before
# the store takes it in; a crash leaves them, and load() removes them.
STAGING_PREFIX = ".staging-"
DEFAULT_KEEP = 3


class StoreError(OSError):
    """The store cannot take a version (no room, unreadable directory)."""


@dataclass(eq=False)
class Version:
    """One version: its manifest, its files, and which shards it holds."""

    announcement: Announcement
    manifest: Manifest
    directory: Path
    held: bytearray
    complete: bool = False
    # For a delta version: the full manifest it rebuilds (the one `announcement` names).
    target: Manifest | None = None
    _fds: list[int] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def step(self) -> int:
        return self.manifest.step

    @cached_property
    def manifest_hash(self) -> str:
        """The version's name on the wire: its own manifest's hash (for a full version,
        the announced one)."""
        return peer_records.manifest_hash(self.manifest)

    @property
    def is_delta(self) -> bool:
        return self.target is not None

    @property
    def files_dir(self) -> Path:
        """The directory of the version's files: for a model, what a backend loads."""
        return self.directory / FILES_DIR

    @property
    def paths(self) -> list[Path]:
        """Each file's final path, in the manifest's order (whole once complete)."""
        return [self.files_dir / f.name for f in self.manifest.files]

    @property
    def path(self) -> Path:
        """What the version is to its user: its one file, or the directory of its files."""
        return self.paths[0] if len(self.manifest.files) == 1 else self.files_dir

    @property
    def held_count(self) -> int:
        return sum(self.held)

    def holds(self, index: int) -> bool:
        return 0 <= index < len(self.held) and bool(self.held[index])

    def bitfield(self) -> bytes:
        """Held shards, one bit each, most significant bit first."""
        out = bytearray((len(self.held) + 7) // 8)
        for i, h in enumerate(self.held):
            if h:
                out[i >> 3] |= 0x80 >> (i & 7)
        return bytes(out)

    def locate(self, index: int) -> tuple[int, int, int]:
        """Shard ``index`` as an open descriptor of its file (read-only unless fetching;
        it survives the rename from partial to final, so serving never races it), its
        offset in that file and its length; a descriptor of -1 once closed."""
        file, _ = self.manifest.locate(index)
        offset, length = shards.shard_range(self.manifest, index)
        with self._lock:
            return (self._fds[file] if self._fds else -1), offset, length

    def close(self) -> None:
        with self._lock:
            for fd in self._fds:
                os.close(fd)
            self._fds.clear()


def bits(bitfield: bytes, count: int) -> bytearray:
    """The inverse of Version.bitfield: one 0/1 byte per shard. Bits past `count` are
    ignored, a short bitfield means the rest are not held."""
    out = bytearray(count)
    for i in range(min(count, len(bitfield) * 8)):
        if bitfield[i >> 3] & (0x80 >> (i & 7)):
            out[i] = 1
    return out


def _version_dir_name(manifest: Manifest, target: Manifest | None) -> str:
    name = f"step-{manifest.step:010d}-{peer_records.manifest_hash(manifest)[:16]}"
    return name if target is None else name + DELTA_DIR_SUFFIX


def _check_names(announcement: Announcement, manifest: Manifest, target: Manifest | None) -> None:
    """ValueError unless `announcement` names `manifest`, or, for a delta, names
    `target`, whose link names `manifest`."""
    if target is None:
        announcement.matches(manifest)
        return
    announcement.matches(target)
    if target.delta is None or peer_records.manifest_hash(manifest) != target.delta.manifest:
        raise ValueError(f"the delta's manifest is not the one step {target.step} links to")
    if (manifest.model, manifest.step) != (target.model, target.step):
        raise ValueError("the delta's model or step is not its version's")


def newest_announced_step(root: Path) -> int | None:
    """The newest step the store under `root` holds an announcement of, complete or not,
    None for none: read from the announcements alone, without hashing a shard or opening
    the store (an origin's trainer asks it, at start, what the swarm has been given)."""
    steps = []
    for path in Path(root).glob(f"step-*/{ANNOUNCEMENT_FILE}"):
        try:
            steps.append(Announcement.model_validate_json(path.read_bytes()).step)
        except (OSError, ValueError):
            continue  # what load() would skip too
    return max(steps, default=None)


class WeightStore:
    """Versions on disk under `root`, safe to use from many threads."""

    def __init__(
        self,
        root: Path,
        *,
        keep: int = DEFAULT_KEEP,
        max_bytes: int | None = None,
        min_free: int = 0,
    ):
        if keep < 1:
            raise ValueError("the store must keep at least one version")
        self.root = Path(root)
        self.keep = keep
        # Both may change while the store is in use (a node's settings, applied live);
        # prune() then fits the versions held to a lowered budget.
        self.max_bytes = max_bytes
        self.min_free = min_free
        self._versions: dict[str, Version] = {}
        self._lock = threading.Lock()
        self.root.mkdir(parents=True, exist_ok=True)

    # ---- lookup ------------------------------------------------------------------

    def get(self, manifest_hash: str) -> Version | None:
        with self._lock:
            return self._versions.get(manifest_hash)

    def versions(self) -> list[Version]:
        """Every version, oldest step first."""
        with self._lock:
            return sorted(self._versions.values(), key=lambda v: v.step)

    def newest_step(self) -> int:
        """The newest step held, complete or not; -1 for an empty store."""
        return max((v.step for v in self.versions()), default=-1)

    def latest(self, *, complete: bool = True) -> Version | None:
        """The newest full version (complete, unless `complete` is False)."""
        candidates = [v for v in self.versions() if (v.complete or not complete) and not v.is_delta]
        return candidates[-1] if candidates else None

    # ---- adding versions ---------------------------------------------------------

    def add_origin(
        self,
        path: Path,
        manifest: Manifest,
        announcement: Announcement,
        *,
        target: Manifest | None = None,
    ) -> Version:
        """Registers the origin's own version (already hashed into `manifest`): the file
        at `path`, or the files of the directory at `path`, linked into the version's
        directory and served from there as complete. `target`: the full manifest, when
        this is its delta."""
        _check_names(announcement, manifest, target)
        path = Path(path)
        sources = shards.version_files(path) if path.is_dir() else [path]
        if [p.name for p in sources] != [f.name for f in manifest.files]:
            raise StoreError(f"{path} no longer holds the files its manifest was built from")
        directory = self.root / _version_dir_name(manifest, target)
        files_dir = directory / FILES_DIR
        files_dir.mkdir(parents=True, exist_ok=True)
        version = Version(
            announcement,
            manifest,
            directory,
            bytearray(b"\x01" * manifest.shard_count),
            target=target,
        )
        try:
            for source, entry in zip(sources, manifest.files, strict=True):
                name = files_dir / entry.name
                link_or_copy(source, name)
                version._fds.append(fd := os.open(name, os.O_RDONLY))
                if os.fstat(fd).st_size != entry.size:
                    raise StoreError(f"{source} changed size after its manifest was built")
            fsync(files_dir)
            self._write_meta(directory, manifest, announcement)
        except BaseException:
            version.close()
            shutil.rmtree(directory, ignore_errors=True)
            raise
        version.complete = True
        self._add(version)
        return version

    def begin(
        self, announcement: Announcement, manifest: Manifest, *, target: Manifest | None = None
    ) -> Version:
        """The version to fetch into: resumed from the shards on disk if a previous
        run left some, else fresh preallocated partial files. `target`: the full
        manifest, when `manifest` is its delta."""
        _check_names(announcement, manifest, target)
        if existing := self.get(peer_records.manifest_hash(manifest)):
            return existing
        self._make_room(manifest.size)
        directory = self.root / _version_dir_name(manifest, target)
        files_dir = directory / FILES_DIR
        files_dir.mkdir(parents=True, exist_ok=True)
        version = Version(
            announcement, manifest, directory, bytearray(manifest.shard_count), target=target
        )
        try:
            for i, entry in enumerate(manifest.files):
                final = files_dir / entry.name
                partial = files_dir / (entry.name + PARTIAL_SUFFIX)
                if final.exists() and not partial.exists():
                    # A complete file from an earlier run: adopt it if it checks out.
                    os.replace(final, partial)
                version._fds.append(fd := os.open(partial, os.O_RDWR | os.O_CREAT, 0o644))
                if os.fstat(fd).st_size != entry.size:
                    os.ftruncate(fd, 0)
                    # Reserved up front, not sparse: no surprise ENOSPC halfway, and the
                    # filesystem need not allocate blocks under every write (measured:
                    # half the CPU of writing into a sparse file, less with many writers).
                    os.posix_fallocate(fd, 0, entry.size)
                else:
                    indices = manifest.shards_of(i)
                    version.held[indices.start : indices.stop] = shards.intact_shards(
                        partial, manifest, i
                    )
            self._write_meta(directory, manifest, announcement)
        except BaseException:
            version.close()
            raise
        if held := version.held_count:
            log.info(
                "resuming step %d with %d of %d shards already on disk",
                manifest.step,
                held,
                manifest.shard_count,
            )
        self._add(version)
        return version

    def write_shard(self, version: Version, index: int, data: BytesLike) -> bool:
        """Verifies `data` as shard `index` (ValueError if it is not) and writes it.
        Returns False if the shard was already held (another peer was faster)."""
        shards.verify_shard(version.manifest, index, data, threads=1)
        file, _ = version.manifest.locate(index)
        offset, length = shards.shard_range(version.manifest, index)
        with version._lock:
            if version.held[index] or not version._fds:
                return False
            fd = version._fds[file]
            view = memoryview(data)[:length]
            written = 0
            while written < length:
                written += os.pwrite(fd, view[written:], offset + written)
            version.held[index] = 1
        return True

    def add_rebuilt(self, delta_version: Version, base: Version) -> Version:
        """Rebuilds the full version `delta_version` encodes from `base` and registers
        it as complete, once every shard of it matches its manifest. ValueError (one
        sentence) when the delta does not rebuild it; nothing is then kept."""
        target = delta_version.target
        if target is None or not delta_version.complete:
            raise ValueError("only a complete delta version rebuilds a version")
        if target.delta is None or base.manifest_hash != target.delta.base or base.is_delta:
            raise ValueError(f"step {base.step} is not the base of step {target.step}'s delta")
        self._make_room(target.size)
        with tempfile.TemporaryDirectory(dir=self.root, prefix=STAGING_PREFIX) as staging:
            delta_versions.rebuild(base.files_dir, delta_version.files_dir, target, Path(staging))
            if not delta_versions.matches(Path(staging), target):
                raise ValueError(
                    f"step {target.step} rebuilt from its delta does not match its manifest"
                )
            version = self.add_origin(Path(staging), target, delta_version.announcement)
        self.prune()
        return version

    def finish(self, version: Version) -> Path:
        """Syncs a fully held version to disk, renames its files into place and returns
        its files' directory. Every shard was verified in memory and written from that
        same buffer, so the files are not hashed again here; a restart re-hashes
        (`load`), which is where a disk that lost a write would show."""
        if version.held_count != version.manifest.shard_count:
            raise ValueError(f"step {version.step} is missing shards")
        with version._lock:
            for fd, final in zip(version._fds, version.paths, strict=True):
                os.fsync(fd)
                # Serving goes on through the open descriptor.
                os.replace(final.with_name(final.name + PARTIAL_SUFFIX), final)
            fsync(version.files_dir)
        # Older versions go before this one counts as complete: whoever waits for it
        # then finds the store as it will stay, never `keep` + 1 versions.
        self.prune(arriving=version)
        version.complete = True
        return version.files_dir

    # ---- state on disk -----------------------------------------------------------

    def load(self) -> list[Version]:
        """Re-registers the complete versions an earlier run left under the root, each
        re-hashed, so a restarted peer seeds them again, and then the deltas of those
        versions: a restarted origin's newest delta is what the nodes are fetching (one
        that dropped it left them waiting for a holder that never came). A version that
        no longer checks out, or was never finished, stays on disk unregistered: its
        intact shards are kept when it is announced again; a delta of none is deleted.
        Anything unreadable is skipped with a log line."""
        found = []
        for leftover in self.root.glob(STAGING_PREFIX + "*"):  # a crash while making one
            shutil.rmtree(leftover, ignore_errors=True)
        # What is registered already (a second load) is neither read again nor deleted.
        held = {v.directory for v in self.versions()}
        directories = [d for d in sorted(self.root.glob("step-*")) if d not in held]
        wholes = [d for d in directories if not d.name.endswith(DELTA_DIR_SUFFIX)]
        for directory in wholes:
            version = self._load_one(directory)
            if version is not None:
                found.append(version)
        for directory in [d for d in directories if d.name.endswith(DELTA_DIR_SUFFIX)]:
            version = self._load_one(directory, delta=True)
            if version is None:
                shutil.rmtree(directory, ignore_errors=True)
            else:
                found.append(version)
        return found

    def _load_one(self, directory: Path, *, delta: bool = False) -> Version | None:
        """The complete version in `directory`, registered; None when it is not one.
        A `delta` is one only beside the complete full version its announcement names
        (its manifest is its own, linked from that version's)."""
        try:
            announcement = Announcement.model_validate_json(
                (directory / ANNOUNCEMENT_FILE).read_bytes()
            )
            manifest = Manifest.from_json((directory / MANIFEST_FILE).read_bytes())
            target = None
            if delta:
                full = self.get(announcement.manifest_hash)
                if full is None or not full.complete:
                    return None
                target = full.manifest
            _check_names(announcement, manifest, target)
        except (OSError, ValueError) as e:
            log.warning("skipping %s: %s", directory, e)
            return None
        files_dir = directory / FILES_DIR
        unfinished = any(not (files_dir / f.name).exists() for f in manifest.files)
        if unfinished or self.get(peer_records.manifest_hash(manifest)):
            return None
        version = self.begin(announcement, manifest, target=target)
        if version.held_count == manifest.shard_count:
            self.finish(version)
            return version
        log.warning(
            "step %d%s in %s has %d bad shards; they will be fetched when it is announced",
            manifest.step,
            " delta" * delta,
            directory,
            manifest.shard_count - version.held_count,
        )
        self._forget(version)
        return None

    def _write_meta(self, directory: Path, manifest: Manifest, announcement: Announcement) -> None:
        write_atomically(directory / MANIFEST_FILE, manifest.to_json())
        write_atomically(directory / ANNOUNCEMENT_FILE, announcement.model_dump_json().encode())

    def _add(self, version: Version) -> None:
        with self._lock:
            self._versions[version.manifest_hash] = version

    # ---- space ---------------------------------------------------------------------

    def _bytes_used(self) -> int:
        return sum(v.manifest.size for v in self.versions())

    def _make_room(self, incoming: int) -> None:
        if self.max_bytes is not None:
            budget = self.max_bytes
            if incoming > budget:
                raise StoreError(f"a {incoming}-byte version does not fit the {budget}-byte budget")
            self._evict(lambda: self._bytes_used() + incoming > budget, spare_newest=False)
            if (used := self._bytes_used()) + incoming > budget:
                raise StoreError(
                    f"a {incoming}-byte version does not fit the {budget}-byte budget "
                    f"beside the {used} bytes still being fetched"
                )
        free = shutil.disk_usage(self.root).free
        if incoming > free - self.min_free:
            keeping = f", keeping {self.min_free} free" if self.min_free else ""
            raise StoreError(
                f"a {incoming}-byte version does not fit in {free} free bytes{keeping}"
            )

    def prune(self, arriving: Version | None = None) -> None:
        """Drops complete full versions past `keep` (oldest first), then any over
        budget; never the newest complete one. `arriving` counts as complete already.
        A delta goes with the version it rebuilds."""
        self._evict(
            lambda: sum(_full(v, arriving) for v in self.versions()) > self.keep,
            arriving=arriving,
        )
        if self.max_bytes is not None:
            budget = self.max_bytes
            self._evict(lambda: self._bytes_used() > budget, arriving=arriving)

    def _evict(
        self,
        over: Callable[[], bool],
        *,
        spare_newest: bool = True,
        arriving: Version | None = None,
    ) -> None:
        while over():
            complete = [v for v in self.versions() if _full(v, arriving)]
            if spare_newest:
                complete = complete[:-1]
            if not complete:
                return
            self.drop(complete[0])

    def _drop_orphan_deltas(self) -> None:
        held = {v.manifest_hash for v in self.versions() if not v.is_delta}
        for version in self.versions():
            if version.is_delta and version.announcement.manifest_hash not in held:
                self.drop(version)

    def _forget(self, version: Version) -> None:
        with self._lock:
            self._versions.pop(version.manifest_hash, None)
        version.close()

    def drop(self, version: Version) -> None:
        """Unregisters `version` and deletes its directory (an origin's trainer keeps its
        own link to the files), and the delta that rebuilds it, if held."""
        self._forget(version)
        shutil.rmtree(version.directory, ignore_errors=True)
        log.info("dropped step %d%s from the store", version.step, " delta" * version.is_delta)
        if not version.is_delta:
            self._drop_orphan_deltas()


def _full(version: Version, arriving: Version | None) -> bool:
    """Whether `version` counts as a complete full version (`arriving`: about to)."""
    return (version.complete or version is arriving) and not version.is_delta
