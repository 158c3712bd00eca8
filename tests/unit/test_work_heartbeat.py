"""``/swarmrl/heartbeat/1.0.0`` on the wire: strict, closed and bounded."""

from __future__ import annotations

import pytest

from swarmrl.work.heartbeat import HEARTBEAT, HeartbeatRequest, HeartbeatResponse, Outcome
from tests.codecs import CodecSuite, refused, replaced

REQUEST = HeartbeatRequest(policy_step=3, tokens_per_second=50.0)
RESPONSE = HeartbeatResponse(
    state="active",
    policy_step=3,
    epoch=1,
    outcomes=[Outcome(digest="ab" * 32, status="accepted", units=8)],
)


class TestCodecs(CodecSuite):
    SPEC = HEARTBEAT
    ID = "/swarmrl/heartbeat/1.0.0"
    EXAMPLES = (REQUEST, RESPONSE)


BAD = [
    # Wrong types: strict, no coercion.
    ("asked", "paused", 1),
    ("asked", "policy_step", "3"),
    # Out of range.
    ("asked", "tokens_per_second", -1.0),
    ("asked", "tokens_per_second", 1e10),
    ("answered", "state", "trusted"),
    ("answered", "outcomes.0.status", "paid"),
    ("answered", "outcomes.0.units", -1),
    ("answered", "outcomes", [{"digest": "ab" * 32, "status": "accepted", "units": 1}] * 33),
]


@pytest.mark.parametrize(("side", "path", "value"), BAD, ids=lambda v: str(v)[:40])
def test_malformed_values_are_refused_in_one_sentence(side, path, value):
    codec, message = (
        (HEARTBEAT.request, REQUEST) if side == "asked" else (HEARTBEAT.response, RESPONSE)
    )
    assert type(message).__name__ in refused(codec, [replaced(message, path, value)])


def test_the_limits_hold_the_largest_valid_heartbeat_and_reply():
    beat = HeartbeatRequest(policy_step=2**64 - 1, tokens_per_second=1e9, paused=True)
    (body,) = HEARTBEAT.request.encode(beat)
    assert len(body) <= HEARTBEAT.request_limit
    outcome = Outcome(digest="ab" * 32, status="rejected", units=2**32, reason="r" * 300)
    reply = HeartbeatResponse(
        state="silent", policy_step=2**64 - 1, epoch=2**64 - 1, outcomes=[outcome] * 32
    )
    (body,) = HEARTBEAT.response.encode(reply)
    assert len(body) <= HEARTBEAT.response_limit
