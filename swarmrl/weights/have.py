"""``/swarmrl/have/1.0.0``: a peer's current advert, asked for with the asker's own.

A downloading node polls the peers it is connected to this way, which is how
it learns, shard by shard, that other nodes can serve it: each peer twice a
second while its advert keeps changing, less often while it does not
(:class:`~swarmrl.weights.advertiser.PollSchedule`); both sides learn each
other's signed record, data endpoint and holdings. The advert is the one peers
also gossip (:class:`~swarmrl.weights.gossip.Advert`).
"""

from __future__ import annotations

from swarmrl.p2p.protocol import Json, RequestResponse
from swarmrl.p2p.wire import protocol_id
from swarmrl.schema import Strict
from swarmrl.weights.gossip import MAX_ADVERT_BYTES, Advert


class HaveRequest(Strict):
    """Asks a peer for its advert, telling it the asker's own."""

    advert: Advert | None = None


HAVE = RequestResponse(
    protocol_id("have"),
    Json(HaveRequest),
    Json(Advert),
    # The request carries the asker's advert, signed record included.
    request_limit=MAX_ADVERT_BYTES,
    response_limit=MAX_ADVERT_BYTES,
    deadline=10.0,
    # A peer that does not answer a poll this fast is skipped until the next round,
    # so one slow peer cannot hold up learning from the others.
    call_timeout=3.0,
)
