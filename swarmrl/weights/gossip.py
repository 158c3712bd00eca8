"""The swarm's gossip: its topics and what peers say on them.

Everything here is small on purpose. Announcements and adverts ride gossipsub,
which caps message sizes and per-peer rates, so they carry hashes, bitfields
and addresses, never checkpoint bytes; a manifest travels once per peer over
the manifest protocol (:mod:`swarmrl.weights.manifest`), an advert also on request
(:mod:`swarmrl.weights.have`), and shard bytes over the data path.
"""

from __future__ import annotations

from typing import Annotated

from pydantic import Field, StringConstraints

from swarmrl.schema import Hex32, Multiaddr, Strict
from swarmrl.weights.peer_records import PeerRecord

# One bit per shard: 60,000 shards (3.8 TiB at 64 MiB) is 15,000 hex characters.
MAX_BITFIELD_HEX = 16_384
MAX_HOLDINGS = 8
MAX_ADDRS = 8
MAX_EXCHANGED_PEERS = 16
MAX_ANNOUNCEMENT_BYTES = 2048
MAX_ADVERT_BYTES = 64 * 1024

HexBits = Annotated[
    str, StringConstraints(pattern=r"^([0-9a-f]{2})*$", max_length=MAX_BITFIELD_HEX)
]


def checkpoints_topic(run: str) -> str:
    """Where the origin announces each new checkpoint of run `run`."""
    return f"swarmrl/{run}/checkpoints"


def peers_topic(run: str) -> str:
    """Where peers advertise themselves and the checkpoints they hold."""
    return f"swarmrl/{run}/peers"


def swarm_topics(run: str) -> list[str]:
    """Every topic of run `run`'s weight swarm: a host that carries the swarm is
    started with these (its allow-list)."""
    return [checkpoints_topic(run), peers_topic(run)]


class Holding(Strict):
    manifest_hash: Hex32
    step: int = Field(ge=0)
    shards: HexBits  # Version.bitfield, hex


class Advert(Strict):
    """Who a peer is, where it serves shard bytes, which shards it holds, and which
    other peers it knows (peer exchange: how nodes that joined through one
    bootstrap peer find each other)."""

    record: PeerRecord | None = None  # absent for a peer without an Ethereum key
    addrs: list[Multiaddr] = Field(default_factory=list, max_length=MAX_ADDRS)
    # host:port of the data path; None for a peer that accepts no connections.
    data: str | None = Field(default=None, min_length=3, max_length=300)
    holdings: list[Holding] = Field(default_factory=list, max_length=MAX_HOLDINGS)
    peers: list[Multiaddr] = Field(default_factory=list, max_length=MAX_EXCHANGED_PEERS)
