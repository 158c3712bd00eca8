"""The swarm's control messages: protocol ids, topics, and their bodies.

Everything here is small on purpose. Announcements and adverts ride gossipsub,
which caps message sizes and per-peer rates, so they carry hashes, bitfields
and addresses, never checkpoint bytes; a manifest travels once per peer over
the manifest protocol, and shard bytes over the data path.
"""

from __future__ import annotations

from typing import Annotated

from pydantic import Field, StringConstraints

from swarmrl.p2p.records import PeerRecord
from swarmrl.p2p.wire import protocol_id
from swarmrl.schema import Hex32, Multiaddr, Strict
from swarmrl.shards import MAX_MANIFEST_BYTES

MANIFEST_PROTOCOL = protocol_id("manifest")
HAVE_PROTOCOL = protocol_id("have")
DIALBACK_PROTOCOL = protocol_id("dialback")

# One bit per shard: 60,000 shards (3.8 TiB at 64 MiB) is 15,000 hex characters.
MAX_BITFIELD_HEX = 16_384
MAX_HOLDINGS = 8
MAX_ADDRS = 8
MAX_EXCHANGED_PEERS = 16
MAX_REQUEST_BYTES = 1024
MAX_ANNOUNCEMENT_BYTES = 2048
MAX_ADVERT_BYTES = 64 * 1024
MAX_MANIFEST_REPLY_BYTES = MAX_MANIFEST_BYTES + MAX_ANNOUNCEMENT_BYTES
MAX_DIALBACK_REQUEST_BYTES = 256
MAX_DIALBACK_REPLY_BYTES = 512

HexBits = Annotated[
    str, StringConstraints(pattern=r"^([0-9a-f]{2})*$", max_length=MAX_BITFIELD_HEX)
]


def checkpoints_topic(run: str) -> str:
    """Where the origin announces each new checkpoint of run `run`."""
    return f"swarmrl/{run}/checkpoints"


def peers_topic(run: str) -> str:
    """Where peers advertise themselves and the checkpoints they hold."""
    return f"swarmrl/{run}/peers"


class ManifestRequest(Strict):
    """Asks for one manifest by hash, or for the newest one the peer knows (None)."""

    manifest_hash: Hex32 | None = None


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


class HaveRequest(Strict):
    """Asks a peer for its advert, telling it the asker's own."""

    advert: Advert | None = None


class DialbackRequest(Strict):
    """Asks a peer to probe the asker's data port, at the address it connects from
    (:mod:`swarmrl.p2p.dialback`)."""

    port: int = Field(ge=1, le=65535)
    nonce: Hex32


class DialbackReply(Strict):
    reached: bool
    endpoint: str | None = Field(default=None, max_length=300)  # host:port dialled
