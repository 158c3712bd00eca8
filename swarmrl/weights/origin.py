"""The origin: publishes a run's versions to the swarm.

Publishing a version (a file, or the files of a directory: a model directory's
weights, config and tokenizer, never its subdirectories) shards its files and
builds its manifest (BLAKE3 per shard, Merkle root; :mod:`swarmrl.shards`),
signs the manifest as EIP-712 ``Checkpoint`` under the run's swarm domain, links
the files into the store as a complete version (served from there, no copy), and
announces it on ``swarmrl/<run>/checkpoints``. Only a trusted signer may publish,
and only a step newer than every step held. With deltas on, the origin also makes
the version's delta against the newest version it holds (:mod:`swarmrl.weights.delta_versions`)
and links it from the signed manifest, so a node holding that base downloads only
what changed.
"""

from __future__ import annotations

import contextlib
import tempfile
import threading
from collections.abc import Callable
from pathlib import Path

from eth_account.signers.local import LocalAccount

from swarmrl import shards
from swarmrl.eip712 import Domain
from swarmrl.p2p import wire
from swarmrl.p2p.host import Host
from swarmrl.shards import DEFAULT_SHARD_SIZE, DeltaLink, Manifest
from swarmrl.weights import delta_versions, peer_records
from swarmrl.weights.gossip import checkpoints_topic
from swarmrl.weights.peer_records import Announcement
from swarmrl.weights.store import STAGING_PREFIX, Version, WeightStore


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

    def publish(
        self,
        path: Path,
        *,
        model: str,
        step: int,
        shard_size: int = DEFAULT_SHARD_SIZE,
        delta: bool = False,
    ) -> Version:
        """Signs and announces the version at `path` (a file, or a directory's files)
        as step `step`, and serves it; with `delta`, also its delta against the newest
        version held, when that is smaller than the version."""
        if self.account is None:
            raise ValueError("publishing needs the origin's key")
        if self.account.address not in self.trusted:
            raise ValueError(f"{self.account.address} is not a trusted checkpoint signer")
        path = Path(path)
        manifest = shards.build_manifest(path, model=model, step=step, shard_size=shard_size)
        with tempfile.TemporaryDirectory(dir=self.store.root, prefix=STAGING_PREFIX) as made:
            base = self.store.latest() if delta else None
            delta_manifest = None
            if base is not None and base.step < step:
                directory = path if path.is_dir() else path.parent
                if delta_versions.encode(
                    base.files_dir, base.manifest, directory, manifest, Path(made)
                ):
                    delta_manifest = shards.build_manifest(
                        made, model=model, step=step, shard_size=delta_versions.DELTA_SHARD_SIZE
                    )
                    link = DeltaLink(
                        base=base.manifest_hash, manifest=peer_records.manifest_hash(delta_manifest)
                    )
                    manifest = Manifest.model_validate({**manifest.model_dump(), "delta": link})
            announcement = Announcement.sign(self.account, manifest, self.domain)
            with self._steps:
                newest = self.store.newest_step()
                if step <= newest:
                    raise ValueError(f"step {step} is not newer than the published step {newest}")
                version = self.store.add_origin(path, manifest, announcement)
                if delta_manifest is not None:
                    self.store.add_origin(Path(made), delta_manifest, announcement, target=manifest)
        self.announce(version)
        self.store.prune()
        return version

    def announce(self, version: Version) -> None:
        """(Re)publishes `version`'s announcement, for peers that joined since."""
        with contextlib.suppress(Exception):  # no peers yet: they will ask on joining
            self.host.publish(self._topic, wire.dump(version.announcement))
        self._on_change()
