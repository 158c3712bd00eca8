"""SwarmNode: one peer of the weight swarm, its origin, fetcher and advertiser wired
to one host and one store."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable
from pathlib import Path

from eth_account.signers.local import LocalAccount
from eth_utils import to_checksum_address
from libp2p.crypto.keys import KeyPair

from swarmrl.eip712 import Domain
from swarmrl.p2p.host import DEFAULT_LISTEN, Host
from swarmrl.p2p.pacing import Pacer
from swarmrl.shards import DEFAULT_SHARD_SIZE
from swarmrl.weights.advertiser import Advertiser
from swarmrl.weights.datapath import ShardServer
from swarmrl.weights.download import DEFAULT_WORKERS, PeerBook
from swarmrl.weights.fetcher import Fetcher
from swarmrl.weights.gossip import Advert, swarm_topics
from swarmrl.weights.origin import Origin
from swarmrl.weights.peer_events import Event
from swarmrl.weights.store import Version, WeightStore

log = logging.getLogger("swarmrl.p2p")


class SwarmNode:
    """One peer on `host` (started with :func:`~swarmrl.weights.gossip.swarm_topics`):
    publish or wait for checkpoints, then close it. The host stays its owner's, who
    may serve other protocols on it and closes it after this peer; :meth:`standalone`
    makes a peer with a host of its own.

    Its downloads go through `download_pacer` and the shards it serves through
    `upload_pacer` (:mod:`swarmrl.p2p.pacing`; a node shares the latter with its own
    uploads and both with its transfer count); None: a pacer of its own, with no cap.
    Either pacer's rate may be changed while the peer runs (:attr:`download_pacer`,
    :attr:`upload_pacer`)."""

    def __init__(
        self,
        host: Host,
        *,
        store: WeightStore,
        domain: Domain,
        run: str,
        trusted: Iterable[str],
        account: LocalAccount | None = None,
        reachable: bool = False,
        bootstrap: Iterable[str] = (),
        workers: int = DEFAULT_WORKERS,
        download_pacer: Pacer | None = None,
        upload_pacer: Pacer | None = None,
        on_event: Callable[[Event], None] | None = None,
    ) -> None:
        self.host = host
        self.store = store
        self.download_pacer = Pacer() if download_pacer is None else download_pacer
        self.upload_pacer = Pacer() if upload_pacer is None else upload_pacer
        self.book = PeerBook()  # filled by the advertiser, read by the fetcher's downloads
        self._own_host: Host | None = None
        on_event = on_event or (lambda event: None)
        trusted = frozenset(to_checksum_address(a) for a in trusted)
        # One decision at a time on the next step the store takes (published or fetched).
        steps = threading.RLock()
        self.advertiser = Advertiser(
            host,
            store,
            self.book,
            domain=domain,
            run=run,
            account=account,
            reachable=reachable,
            on_event=on_event,
            pacer=self.upload_pacer,
        )
        try:
            self.fetcher = Fetcher(
                host,
                store,
                self.book,
                domain=domain,
                run=run,
                trusted=trusted,
                workers=workers,
                pacer=self.download_pacer,
                steps=steps,
                on_event=on_event,
                on_change=self.advertiser.changed,
            )
            self.origin = Origin(
                host,
                store,
                domain=domain,
                run=run,
                account=account,
                trusted=trusted,
                steps=steps,
                on_change=self.advertiser.changed,
            )
            for version in store.load():
                delta = "'s delta" if version.is_delta else ""
                log.info("seeding step %d%s from %s", version.step, delta, version.path)
            for addr in bootstrap:
                self.join(addr)
        except BaseException:
            self.close()
            raise
        self.advertiser.start(fetching=self.fetcher.fetching)

    @classmethod
    def standalone(
        cls,
        *,
        peer_key: KeyPair,
        listen: str | None = DEFAULT_LISTEN,
        store: WeightStore,
        domain: Domain,
        run: str,
        trusted: Iterable[str],
        account: LocalAccount | None = None,
        reachable: bool = False,
        bootstrap: Iterable[str] = (),
        workers: int = DEFAULT_WORKERS,
        download_pacer: Pacer | None = None,
        upload_pacer: Pacer | None = None,
        on_event: Callable[[Event], None] | None = None,
    ) -> SwarmNode:
        """A peer on a host of its own (listening on `listen`; None: outbound only),
        closed with it: for a process whose only traffic is the weight swarm."""
        host = Host(peer_key, listen=listen, topics=swarm_topics(run))
        try:
            node = cls(
                host,
                store=store,
                domain=domain,
                run=run,
                trusted=trusted,
                account=account,
                reachable=reachable,
                bootstrap=bootstrap,
                workers=workers,
                download_pacer=download_pacer,
                upload_pacer=upload_pacer,
                on_event=on_event,
            )
        except BaseException:
            host.close()
            raise
        node._own_host = host
        return node

    # ---- who this peer is ------------------------------------------------------------

    @property
    def peer_id(self) -> str:
        return self.host.peer_id

    @property
    def addrs(self) -> list[str]:
        return self.host.addrs

    @property
    def server(self) -> ShardServer | None:
        """The data path serving this peer's shards; None for an outbound-only peer."""
        return self.advertiser.server

    @property
    def serving(self) -> bool:
        """Whether this peer offers its shards: it is reachable, or was dialled back."""
        return self.advertiser.serving

    def advert(self) -> Advert:
        return self.advertiser.advert()

    # ---- what it does ----------------------------------------------------------------

    @property
    def window(self) -> int:
        """Steps a download may fall behind the newest announced and still be finished:
        the orchestrator's async level, for a node (0: only the newest is fetched)."""
        return self.fetcher.window

    @window.setter
    def window(self, steps: int) -> None:
        self.fetcher.window = steps

    @property
    def newest_announced(self) -> int:
        """The newest step a trusted key announced (-1: none yet), fetched or not."""
        return self.fetcher.newest_announced

    def join(self, addr: str) -> None:
        """Connects to a bootstrap peer, learns its advert and its newest checkpoint."""
        peer = self.host.connect(addr)
        self.advertiser.meet(peer)
        self.fetcher.catch_up(peer)

    def publish(
        self,
        path: Path,
        *,
        model: str,
        step: int,
        shard_size: int = DEFAULT_SHARD_SIZE,
        delta: bool = False,
    ) -> Version:
        """Signs and announces the checkpoint at `path` (a file, or a directory's files)
        as step `step`, and serves it; with `delta`, also as its delta against the
        newest version held (:meth:`Origin.publish`)."""
        return self.origin.publish(path, model=model, step=step, shard_size=shard_size, delta=delta)

    def announce(self, version: Version) -> None:
        """(Re)publishes `version`'s announcement, for peers that joined since."""
        self.origin.announce(version)

    def wait_for(self, step: int | None = None, timeout: float | None = None) -> Version:
        """The newest complete version, once one at `step` or later (any, if None) is
        complete; TimeoutError after `timeout` seconds."""
        return self.fetcher.wait_for(step, timeout)

    def close(self) -> None:
        """Stops polling, serving shards and fetching (a shard in flight finishes or
        times out first), then the host if it is this peer's own; then the files are
        closed. Idempotent."""
        self.advertiser.close()
        if hasattr(self, "fetcher"):  # absent if the constructor failed before it
            self.fetcher.close()
        if self._own_host is not None:
            self._own_host.close()
        for version in self.store.versions():
            version.close()

    def __enter__(self) -> SwarmNode:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
