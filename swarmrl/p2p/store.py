"""The checkpoints a peer holds: what it can serve, what it is still fetching.

One directory per version under the store's root, named by step and manifest
hash, holding the signed announcement, the manifest, and the checkpoint file:
``<file_name>.partial`` while shards arrive, ``<file_name>`` once every shard
and the whole file have been checked. A shard is verified against the manifest
in memory before it is written at its offset, and only then marked as held,
so a peer serves it at once and never serves an unchecked byte.

Resuming needs no journal: the partial file is allocated at its full size,
and on restart each shard range is re-hashed; the ranges that match the
manifest are held, the rest (zeros, a torn write) are fetched again.

The store keeps the newest ``keep`` complete versions and, with a byte budget,
drops the oldest complete ones until the rest fit; it never drops the newest
version or one being fetched. An origin's version is registered in place
(the trainer's file, not a copy) and is never deleted by the store.
"""

from __future__ import annotations

import logging
import os
import shutil
import tarfile
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from swarmrl import shards
from swarmrl.files import write_atomically
from swarmrl.p2p.records import Announcement
from swarmrl.shards import BytesLike, Manifest

log = logging.getLogger("swarmrl.p2p")

ANNOUNCEMENT_FILE = "announcement.json"
MANIFEST_FILE = "manifest.json"
PARTIAL_SUFFIX = ".partial"
DEFAULT_KEEP = 3
# A directory checkpoint travels as one uncompressed tar with this suffix and is
# unpacked next to it once verified.
BUNDLE_SUFFIX = ".tar"


class StoreError(OSError):
    """The store cannot take a version (no room, unreadable directory)."""


@dataclass(eq=False)
class Version:
    """One checkpoint version: its manifest, its file, and which shards it holds."""

    announcement: Announcement
    manifest: Manifest
    directory: Path
    path: Path
    held: bytearray
    owned: bool = True  # False for an origin's file, which the store never deletes
    complete: bool = False
    _fd: int = -1
    _lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def step(self) -> int:
        return self.manifest.step

    @property
    def manifest_hash(self) -> str:
        return self.announcement.manifest_hash

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

    def fd(self) -> int:
        """An open descriptor of the file (read-only unless fetching); it survives the
        rename from partial to final, so serving never races it."""
        return self._fd

    def shard_range(self, index: int) -> tuple[int, int]:
        return shards.shard_range(self.manifest, index)

    @property
    def unpacked(self) -> Path | None:
        """The directory a bundle was unpacked into, if this version is one."""
        if self.manifest.file_name.endswith(BUNDLE_SUFFIX) and self.complete:
            return self.directory / self.manifest.file_name.removesuffix(BUNDLE_SUFFIX)
        return None

    def close(self) -> None:
        with self._lock:
            if self._fd >= 0:
                os.close(self._fd)
                self._fd = -1


def bits(bitfield: bytes, count: int) -> bytearray:
    """The inverse of Version.bitfield: one 0/1 byte per shard. Bits past `count` are
    ignored, a short bitfield means the rest are not held."""
    out = bytearray(count)
    for i in range(min(count, len(bitfield) * 8)):
        if bitfield[i >> 3] & (0x80 >> (i & 7)):
            out[i] = 1
    return out


def _version_dir_name(announcement: Announcement) -> str:
    return f"step-{announcement.step:010d}-{announcement.manifest_hash[:16]}"


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

    def __init__(self, root: Path, *, keep: int = DEFAULT_KEEP, max_bytes: int | None = None):
        if keep < 1:
            raise ValueError("the store must keep at least one version")
        self.root = Path(root)
        self.keep = keep
        self.max_bytes = max_bytes
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
        candidates = [v for v in self.versions() if v.complete or not complete]
        return candidates[-1] if candidates else None

    # ---- adding versions ---------------------------------------------------------

    def add_origin(
        self, path: Path, manifest: Manifest, announcement: Announcement, *, owned: bool = False
    ) -> Version:
        """Registers the origin's own checkpoint file (already hashed into `manifest`)
        as complete, served in place, never deleted: the trainer's file. An `owned` file
        (a bundle built for the store) is moved into the version's directory instead,
        deleted with it when pruned and found again by `load` after a restart."""
        announcement.matches(manifest)
        fd = os.open(path, os.O_RDONLY)
        if os.fstat(fd).st_size != manifest.file_size:
            os.close(fd)
            raise StoreError(f"{path} changed size after its manifest was built")
        directory = self.root / _version_dir_name(announcement)
        directory.mkdir(parents=True, exist_ok=True)
        self._write_meta(directory, manifest, announcement)
        if owned:  # the open descriptor follows the file
            kept = directory / manifest.file_name
            os.replace(path, kept)
            path = kept
        version = Version(
            announcement,
            manifest,
            directory,
            Path(path),
            bytearray(b"\x01" * manifest.shard_count),
            owned=owned,
            complete=True,
            _fd=fd,
        )
        self._add(version)
        return version

    def begin(self, announcement: Announcement, manifest: Manifest) -> Version:
        """The version to fetch into: resumed from the shards on disk if a previous
        run left some, else a fresh preallocated partial file."""
        announcement.matches(manifest)
        if existing := self.get(announcement.manifest_hash):
            return existing
        self._make_room(manifest.file_size)
        directory = self.root / _version_dir_name(announcement)
        directory.mkdir(parents=True, exist_ok=True)
        final = directory / manifest.file_name
        partial = directory / (manifest.file_name + PARTIAL_SUFFIX)
        if final.exists() and not partial.exists():
            # A complete file from an earlier run: adopt it if it checks out.
            os.replace(final, partial)
        fd = os.open(partial, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            if os.fstat(fd).st_size != manifest.file_size:
                os.ftruncate(fd, 0)
                # Reserved up front, not sparse: no surprise ENOSPC halfway, and the
                # filesystem need not allocate blocks under every write (measured:
                # half the CPU of writing into a sparse file, less with many writers).
                os.posix_fallocate(fd, 0, manifest.file_size)
                held = bytearray(manifest.shard_count)
            else:
                held = shards.intact_shards(partial, manifest)
            self._write_meta(directory, manifest, announcement)
        except BaseException:
            os.close(fd)
            raise
        version = Version(announcement, manifest, directory, partial, held, _fd=fd)
        if held.count(1):
            log.info(
                "resuming step %d with %d of %d shards already on disk",
                manifest.step,
                held.count(1),
                manifest.shard_count,
            )
        self._add(version)
        return version

    def write_shard(self, version: Version, index: int, data: BytesLike) -> bool:
        """Verifies `data` as shard `index` (ValueError if it is not) and writes it.
        Returns False if the shard was already held (another peer was faster)."""
        shards.verify_shard(version.manifest, index, data, threads=1)
        offset, length = version.shard_range(index)
        with version._lock:
            if version.held[index] or version._fd < 0:
                return False
            view = memoryview(data)[:length]
            written = 0
            while written < length:
                written += os.pwrite(version._fd, view[written:], offset + written)
            version.held[index] = 1
        return True

    def finish(self, version: Version) -> Path:
        """Syncs a fully held version to disk and renames it into place (a bundle is
        unpacked first). Every shard was verified in memory and written from that same
        buffer, so the file is not hashed again here; a restart re-hashes (`load`),
        which is where a disk that lost a write would show. A bundle that cannot be
        unpacked safely raises BundleError and the version is dropped."""
        if version.held_count != version.manifest.shard_count:
            raise ValueError(f"step {version.step} is missing shards")
        with version._lock:
            os.fsync(version._fd)
            final = version.directory / version.manifest.file_name
            os.replace(version.path, final)  # serving goes on through the open descriptor
            version.path = final
        if version.manifest.file_name.endswith(BUNDLE_SUFFIX):
            try:
                _unpack(final, version.directory / final.name.removesuffix(BUNDLE_SUFFIX))
            except BundleError:
                self.drop(version)
                raise
        # Older versions go before this one counts as complete: whoever waits for it
        # then finds the store as it will stay, never `keep` + 1 versions.
        self.prune(arriving=version)
        version.complete = True
        return final

    # ---- state on disk -----------------------------------------------------------

    def load(self) -> list[Version]:
        """Re-registers the complete versions an earlier run left under the root, each
        re-hashed, so a restarted peer seeds them again. A version that no longer checks
        out, or was never finished, stays on disk unregistered: its intact shards are
        kept when it is announced again. Anything unreadable is skipped with a log line."""
        found = []
        for directory in sorted(self.root.glob("step-*")):
            try:
                announcement = Announcement.model_validate_json(
                    (directory / ANNOUNCEMENT_FILE).read_bytes()
                )
                manifest = Manifest.from_json((directory / MANIFEST_FILE).read_bytes())
                announcement.matches(manifest)
            except (OSError, ValueError) as e:
                log.warning("skipping %s: %s", directory, e)
                continue
            if not (directory / manifest.file_name).exists() or self.get(
                announcement.manifest_hash
            ):
                continue
            version = self.begin(announcement, manifest)
            if version.held_count == manifest.shard_count:
                self.finish(version)
                found.append(version)
            else:
                log.warning(
                    "step %d in %s has %d bad shards; they will be fetched when it is announced",
                    manifest.step,
                    directory,
                    manifest.shard_count - version.held_count,
                )
                self._forget(version)
        return found

    def _write_meta(self, directory: Path, manifest: Manifest, announcement: Announcement) -> None:
        write_atomically(directory / MANIFEST_FILE, manifest.to_json())
        write_atomically(directory / ANNOUNCEMENT_FILE, announcement.model_dump_json().encode())

    def _add(self, version: Version) -> None:
        with self._lock:
            self._versions[version.manifest_hash] = version

    # ---- space ---------------------------------------------------------------------

    def _bytes_used(self) -> int:
        return sum(v.manifest.file_size for v in self.versions() if v.owned)

    def _make_room(self, incoming: int) -> None:
        if self.max_bytes is not None:
            budget = self.max_bytes
            if incoming > budget:
                raise StoreError(
                    f"a {incoming}-byte checkpoint does not fit the {budget}-byte budget"
                )
            self._evict(lambda: self._bytes_used() + incoming > budget, spare_newest=False)
            if (used := self._bytes_used()) + incoming > budget:
                raise StoreError(
                    f"a {incoming}-byte checkpoint does not fit the {budget}-byte budget "
                    f"beside the {used} bytes still being fetched"
                )
        free = shutil.disk_usage(self.root).free
        if incoming > free:
            raise StoreError(f"a {incoming}-byte checkpoint does not fit in {free} free bytes")

    def prune(self, arriving: Version | None = None) -> None:
        """Drops complete versions past `keep` (oldest first), then any over budget;
        never the newest complete one. `arriving` counts as complete already."""
        self._evict(
            lambda: sum(v.complete or v is arriving for v in self.versions()) > self.keep,
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
            complete = [v for v in self.versions() if v.complete or v is arriving]
            if spare_newest:
                complete = complete[:-1]
            if not complete:
                return
            self.drop(complete[0])

    def _forget(self, version: Version) -> None:
        with self._lock:
            self._versions.pop(version.manifest_hash, None)
        version.close()

    def drop(self, version: Version) -> None:
        """Unregisters `version` and deletes its files (unless they are an origin's)."""
        self._forget(version)
        if version.owned:
            shutil.rmtree(version.directory, ignore_errors=True)
        log.info("dropped step %d from the store", version.step)


class BundleError(ValueError):
    """A directory bundle that cannot be unpacked safely."""


def _unpack(bundle: Path, target: Path) -> None:
    """Extracts a verified bundle; the 'data' filter refuses links out of the target,
    absolute paths and device files, whoever built the tar."""
    tmp = target.with_name(f".{target.name}.unpacking")
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        with tarfile.open(bundle) as tar:
            tar.extractall(tmp, filter="data")
    except (tarfile.TarError, OSError) as e:
        shutil.rmtree(tmp, ignore_errors=True)
        raise BundleError(f"{bundle.name} cannot be unpacked safely: {e}") from None
    shutil.rmtree(target, ignore_errors=True)
    os.replace(tmp, target)
