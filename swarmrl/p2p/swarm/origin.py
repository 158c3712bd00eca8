"""The origin: publishes a run's checkpoints to the swarm.

Publishing a checkpoint (a file, or a directory sent as one deterministic tar
bundle) shards it and builds its manifest (BLAKE3 per shard, Merkle root;
:mod:`swarmrl.shards`), signs the manifest as EIP-712 ``Checkpoint`` under the
run's swarm domain, adds it to the store as complete (served in place), and
announces it on ``swarmrl/<run>/checkpoints``. Only a trusted signer may publish,
and only a step newer than every step held.

A bundle is built in a hidden folder of the store's root, then kept in its version's
directory like any fetched file: pruned with it, and found again by a restarted
store. A publish killed while it built one leaves the folder, swept at the next start.
"""

from __future__ import annotations

import contextlib
import shutil
import tarfile
import tempfile
import threading
from collections.abc import Callable
from pathlib import Path

from eth_account.signers.local import LocalAccount

from swarmrl import shards
from swarmrl.chain.eip712 import Domain
from swarmrl.p2p import wire
from swarmrl.p2p.host import Host
from swarmrl.p2p.messages import checkpoints_topic
from swarmrl.p2p.records import Announcement
from swarmrl.p2p.store import BUNDLE_SUFFIX, Version, WeightStore
from swarmrl.shards import DEFAULT_SHARD_SIZE

BUNDLING = ".bundling-"  # the hidden folders bundles are built in


class Origin:
    """Signs, stores and announces checkpoints with `account` (None: a peer that
    cannot publish)."""

    def __init__(
        self,
        host: Host,
        store: WeightStore,
        *,
        domain: Domain,
        run: str,
        account: LocalAccount | None,
        trusted: frozenset[str],
        steps: threading.RLock,
        on_change: Callable[[], None],
    ) -> None:
        self.host = host
        self.store = store
        self.domain = domain
        self.account = account
        self.trusted = trusted
        self._topic = checkpoints_topic(run)
        self._steps = steps  # held around every decision to take a step (the fetcher's too)
        self._on_change = on_change  # what this peer holds changed
        for leftover in store.root.glob(f"{BUNDLING}*"):  # a publish killed mid-bundle
            shutil.rmtree(leftover, ignore_errors=True)

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
        building = None
        if path.is_dir():
            building = Path(tempfile.mkdtemp(prefix=BUNDLING, dir=self.store.root))
            path = _bundle(path, building)
        try:
            manifest = shards.build_manifest(path, model=model, step=step, shard_size=shard_size)
            announcement = Announcement.sign(self.account, manifest, self.domain)
            with self._steps:
                newest = self.store.newest_step()
                if step <= newest:
                    raise ValueError(f"step {step} is not newer than the published step {newest}")
                # A bundle is the store's own: moved into the version's directory.
                owned = building is not None
                version = self.store.add_origin(path, manifest, announcement, owned=owned)
        finally:
            if building is not None:
                shutil.rmtree(building, ignore_errors=True)
        self.announce(version)
        self.store.prune()
        return version

    def announce(self, version: Version) -> None:
        """(Re)publishes `version`'s announcement, for peers that joined since."""
        with contextlib.suppress(Exception):  # no peers yet: they will ask on joining
            self.host.publish(self._topic, wire.dump(version.announcement))
        self._on_change()


def _bundle(directory: Path, workdir: Path) -> Path:
    """`directory` as one deterministic uncompressed tar in `workdir`: sorted names, no
    owners or times, so the same files always give the same bytes and so the same
    manifest."""
    bundle = workdir / f"{directory.name}{BUNDLE_SUFFIX}"
    with tarfile.open(bundle, "w", format=tarfile.PAX_FORMAT) as tar:
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
    return bundle
