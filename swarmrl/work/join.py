"""``/swarmrl/join/1.0.0``: a node asks to take part in the run.

The request is a :class:`JoinClaim` the node signs: its address, the provider
that staked for it, its libp2p peer id and what it reports about itself. The
orchestrator accepts it only from the peer it names (libp2p's Noise handshake
authenticates peer ids), so afterwards every request from that peer is the
node's without another signature; and only when the chain says the provider
is registered, staked enough and the node joined the pool.

The report names the node's work protocol (:data:`swarmrl.work.WORK_PROTOCOL`) and
the reply the orchestrator's. A claim of another is refused with
:func:`version_refusal`'s sentence, and a node that gets that refusal, a reply of
another protocol, or no join protocol at all at the orchestrator raises
:class:`IncompatibleVersionError`: a release apart, retrying cannot help.
"""

from __future__ import annotations

from typing import Annotated

import pydantic_core
from pydantic import Field, StringConstraints

from swarmrl import __version__
from swarmrl.eip712 import Member, Signed, Struct, text_hash
from swarmrl.models.backend import BackendName
from swarmrl.p2p.protocol import Json, RequestResponse
from swarmrl.p2p.wire import WireError, protocol_id
from swarmrl.schema import MAX_UINT64, HexAddress, Multiaddr, PeerId, RunId, Strict
from swarmrl.work import VERSION_REFUSAL, WORK_PROTOCOL
from swarmrl.work.states import NodeState

# How far a claim's issuedAt may be from the orchestrator's clock.
MAX_CLOCK_SKEW = 600

Short = Annotated[str, StringConstraints(max_length=128)]


class NodeReport(Strict):
    """What a node says about itself: shown to the coordinator, never trusted for
    anything but scheduling and its protocol (a slow report only earns smaller
    assignments; a false protocol only gets it refused, or misread)."""

    backend: BackendName
    device: Short
    cpu_cores: int = Field(ge=1, le=4096)
    gpu: Short | None = None
    gpu_memory_gib: float | None = Field(default=None, ge=0, le=1 << 20)
    workers: int = Field(default=1, ge=1, le=4096)  # one per GPU group: its orders are split
    version: Short  # the release, for people: "swarmrl 0.1.0 on x86_64"
    protocol: int = Field(ge=0, le=MAX_UINT64)  # its WORK_PROTOCOL, which must be the run's

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
    protocol: int = Field(ge=0, le=MAX_UINT64)  # the orchestrator's WORK_PROTOCOL
    state: NodeState = Field(strict=False)  # strict takes only members; the wire has values
    heartbeat_seconds: float = Field(gt=0, le=3600)
    policy_step: int | None = Field(default=None, ge=0, le=MAX_UINT64)
    # How many steps behind the newest the orchestrator still takes work from: a node
    # finishes a download within it rather than dropping it for a newer step.
    async_level: int = Field(default=0, ge=0, le=MAX_UINT64)
    # Where the newest weights can be fetched: the orchestrator's own swarm peer.
    weights: list[Multiaddr] = Field(default_factory=list, max_length=8)


class IncompatibleVersionError(WireError):
    """The orchestrator speaks another work protocol than this node: they run different
    releases of swarmrl, and only installing the run's release helps. A WireError, so a
    caller that retries what a peer sent amiss still catches it; one that can tell the
    person running the node what to do catches this first."""


def version_refusal(report: NodeReport) -> str:
    """The orchestrator's refusal of a claim whose report speaks another work protocol:
    one sentence that starts with VERSION_REFUSAL, which is how the node knows it."""
    return (
        f"{VERSION_REFUSAL} {WORK_PROTOCOL} and the node {report.protocol} "
        f"({report.version}): run the node with swarmrl {__version__}, the release of the "
        "orchestrator"
    )


JOIN = RequestResponse(
    protocol_id("join"),
    Json(JoinClaim),
    Json(JoinResponse),
    request_limit=4 * 1024,
    response_limit=8 * 1024,
    deadline=20.0,
)
