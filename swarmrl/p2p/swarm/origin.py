"""The origin: publishes a run's versions to the swarm.

Publishing a version (a file, or the files of a directory: a model directory's
weights, config and tokenizer, never its subdirectories) shards its files and
builds its manifest (BLAKE3 per shard, Merkle root; :mod:`swarmrl.shards`),
signs the manifest as EIP-712 ``Checkpoint`` under the run's swarm domain, links
the files into the store as a complete version (served from there, no copy), and
announces it on ``swarmrl/<run>/checkpoints``. Only a trusted signer may publish,
and only a step newer than every step held.
"""

from __future__ import annotations

import contextlib
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
from swarmrl.p2p.store import Version, WeightStore
from swarmrl.shards import DEFAULT_SHARD_SIZE


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
        self, path: Path, *, model: str, step: int, shard_size: int = DEFAULT_SHARD_SIZE
    ) -> Version:
        """Signs and announces the version at `path` (a file, or a directory's files)
        as step `step`, and serves it."""
        if self.account is None:
            raise ValueError("publishing needs the origin's key")
        if self.account.address not in self.trusted:
            raise ValueError(f"{self.account.address} is not a trusted checkpoint signer")
        manifest = shards.build_manifest(path, model=model, step=step, shard_size=shard_size)
        announcement = Announcement.sign(self.account, manifest, self.domain)
        with self._steps:
            newest = self.store.newest_step()
            if step <= newest:
                raise ValueError(f"step {step} is not newer than the published step {newest}")
            version = self.store.add_origin(Path(path), manifest, announcement)
        self.announce(version)
        self.store.prune()
        return version

    def announce(self, version: Version) -> None:
        """(Re)publishes `version`'s announcement, for peers that joined since."""
        with contextlib.suppress(Exception):  # no peers yet: they will ask on joining
            self.host.publish(self._topic, wire.dump(version.announcement))
        self._on_change()
