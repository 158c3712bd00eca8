"""``/swarmrl/heartbeat/1.0.0``: a joined node says it is alive and learns the news.

The node reports the policy step it holds and its measured speed (which sizes
its next assignments); the orchestrator answers with the node's state, the
newest policy step, the current epoch, and the outcomes of the node's recent
submissions once validated (a receipt accepts at intake; prefill may still
reject later, and this is how the node hears it).

A node that stops says so with a last heartbeat, ``leaving``: the orchestrator
counts it gone at once (no order, no wait for its silence) and expires its open
order, so its tasks go to the next node that asks for work instead of waiting
for the deadline. The answer carries the node's new state; to take part again
it joins again.
"""

from __future__ import annotations

from pydantic import Field

from swarmrl.p2p.protocol import Json, RequestResponse
from swarmrl.p2p.wire import protocol_id
from swarmrl.schema import MAX_UINT64, Hex32, Reason, Strict
from swarmrl.work.states import NodeState, SubmissionStatus

MAX_OUTCOMES = 32


class HeartbeatRequest(Strict):
    policy_step: int | None = Field(default=None, ge=0, le=MAX_UINT64)
    tokens_per_second: float | None = Field(default=None, ge=0, le=1e9)
    paused: bool = False
    leaving: bool = False


class Outcome(Strict):
    """How validation ended for one submission."""

    digest: Hex32
    status: SubmissionStatus = Field(strict=False)  # strict takes only members, not values
    units: int = Field(ge=0)
    reason: Reason = ""


class HeartbeatResponse(Strict):
    state: NodeState = Field(strict=False)
    policy_step: int | None = Field(default=None, ge=0, le=MAX_UINT64)
    epoch: int = Field(ge=0, le=MAX_UINT64)
    outcomes: list[Outcome] = Field(default_factory=list, max_length=MAX_OUTCOMES)


HEARTBEAT = RequestResponse(
    protocol_id("heartbeat"),
    Json(HeartbeatRequest),
    Json(HeartbeatResponse),
    request_limit=1024,
    response_limit=32 * 1024,
    deadline=10.0,
)
