"""The weight swarm: the origin that publishes checkpoints, and every node that
fetches them and serves them on; one of the two protocols over :mod:`swarmrl.p2p`
(the other is the work, :mod:`swarmrl.work`).

What peers sign and say: ``peer_records`` (EIP-712 PeerRecord and Announcement),
``gossip`` (topics, adverts and their bounds), ``peer_events`` (what a peer tells the
people watching). What they ask each other: ``manifest``, ``have``, ``dialback`` (a spec
each). Where the bytes go: ``store`` (versions on disk: verified shards, resume, keep-N,
budget), ``datapath`` (shard bytes over plain TCP), ``download`` (the peer book and the
multi-peer download of one version), ``delta_versions`` (a version as its difference
from the one before, over the codec :mod:`swarmrl.delta`). ``cli`` is
`swarmrl weights serve|pull`.

A :class:`~.peer.SwarmNode` wires three parts to one libp2p
:class:`~swarmrl.p2p.host.Host` (control: who is who, what is new, who holds what)
and one :class:`~swarmrl.weights.store.WeightStore` (the versions on disk):

- ``origin``     :class:`~.origin.Origin`: signs a checkpoint's manifest and announces it
                 on ``swarmrl/<run>/checkpoints``.
- ``fetcher``    :class:`~.fetcher.Fetcher`: accepts an announcement only if a trusted key
                 signed it for this run's domain and its step is newer than every
                 step held; then it fetches the manifest (``/swarmrl/manifest/1.0.0``,
                 :mod:`swarmrl.weights.manifest`, also how a node that joins late
                 learns what to fetch), checks it against the announced hash and
                 downloads the version from every peer that holds it.
- ``advertiser`` :class:`~.advertiser.Advertiser`: this peer's signed advert on
                 ``swarmrl/<run>/peers`` (sent when a peer joins, starts or finishes
                 a version, and every half minute: a few per peer per version, far
                 under gossipsub's per-peer rate limits) and on request
                 (``/swarmrl/have/1.0.0``, :mod:`swarmrl.weights.have`; a downloading
                 node polls the peers it is connected to twice a second, several at
                 once, which is how it learns, shard by shard, that other nodes can
                 serve it); the manifests and shard bytes
                 (:class:`~swarmrl.weights.datapath.ShardServer`) of what it holds; and
                 dial-back (``/swarmrl/dialback/1.0.0``,
                 :mod:`swarmrl.weights.dialback`): a peer that is not known to be
                 reachable advertises its data endpoint only after another peer
                 dialled it back, so a node behind NAT never sends downloaders into
                 timeouts.

The host is the process's one network endpoint: a process that also speaks the
work protocols (a node, the orchestrator) starts it once and hands it to
``SwarmNode(host, ...)`` and to its work session or intake;
:meth:`SwarmNode.standalone` gives a peer a host of its own (``swarmrl weights``,
the demo's swarm scene, the broadcast benchmark).

Events (:mod:`swarmrl.weights.peer_events`: announced, progress, banned, ready, rejected,
reachable) go to one callback, for progress bars and the TUI.

The package itself imports nothing: `swarmrl weights` and everything that only names
these modules start without loading libp2p (`from swarmrl.weights.peer import SwarmNode`).
"""
