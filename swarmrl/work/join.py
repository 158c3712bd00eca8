"""``/swarmrl/join/1.0.0``: a node asks to take part in the run.

The request is a :class:`JoinClaim` the node signs: its address, the provider
that staked for it, its libp2p peer id and what it reports about itself. The
orchestrator accepts it only from the peer it names (libp2p's Noise handshake
authenticates peer ids), so afterwards every request from that peer is the
node's without another signature; and only when the chain says the provider
is registered, staked enough and the node joined the pool.
"""

from __future__ import annotations

from typing import Annotated

import pydantic_core
from pydantic import Field, StringConstraints

from swarmrl.chain.eip712 import Member, Signed, Struct, text_hash
from swarmrl.models.backend import BackendName
from swarmrl.p2p.protocol import Json, RequestResponse
from swarmrl.p2p.wire import protocol_id
from swarmrl.schema import MAX_UINT64, HexAddress, Multiaddr, PeerId, RunId, Strict
from swarmrl.work.states import NodeState

# How far a claim's issuedAt may be from the orchestrator's clock.
MAX_CLOCK_SKEW = 600

Short = Annotated[str, StringConstraints(max_length=128)]


class NodeReport(Strict):
    """What a node says about itself: shown to the coordinator, never trusted for
    anything but scheduling (a slow report only earns smaller assignments)."""

    backend: BackendName
    device: Short
    cpu_cores: int = Field(ge=1, le=4096)
    gpu: Short | None = None
    gpu_memory_gib: float | None = Field(default=None, ge=0, le=1 << 20)
    version: Short

    def hash(self) -> bytes:
        return text_hash(pydantic_core.to_json(self.model_dump(), by_alias=True).decode())


class JoinClaim(Signed):
    STRUCT = Struct(
        "JoinClaim",
        Member("node", "address", "node"),
        Member("provider", "address", "provider"),
        Member("peerId", "bytes32", "peer_id", text_hash),
        Member("report", "bytes32", "report", NodeReport.hash),
        Member("issuedAt", "uint64", "issued_at"),
    )

    node: HexAddress
    provider: HexAddress
    peer_id: PeerId
    report: NodeReport
    issued_at: int = Field(ge=0, le=MAX_UINT64)


class JoinResponse(Strict):
    """The node's standing in the run, and what it needs to take part."""

    run: RunId
    state: NodeState = Field(strict=False)  # strict takes only members; the wire has values
    heartbeat_seconds: float = Field(gt=0, le=3600)
    policy_step: int | None = Field(default=None, ge=0, le=MAX_UINT64)
    # How many steps behind the newest the orchestrator still takes work from: a node
    # finishes a download within it rather than dropping it for a newer step.
    async_level: int = Field(default=0, ge=0, le=MAX_UINT64)
    # Where the newest weights can be fetched: the orchestrator's own swarm peer.
    weights: list[Multiaddr] = Field(default_factory=list, max_length=8)


JOIN = RequestResponse(
    protocol_id("join"),
    Json(JoinClaim),
    Json(JoinResponse),
    request_limit=4 * 1024,
    response_limit=8 * 1024,
    deadline=20.0,
)
