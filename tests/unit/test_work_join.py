"""``/swarmrl/join/1.0.0`` on the wire: the signed claim and the reply, strict, closed
and bounded (the claim's signature is test_work_protocol's)."""

from __future__ import annotations

import pytest

from swarmrl.work import WORK_PROTOCOL
from swarmrl.work.join import JOIN, JoinResponse
from tests.codecs import CodecSuite, refused, replaced
from tests.unit.work_examples import CLAIM, NODE, REPORT, RUN, SWARM

REQUEST = CLAIM.signed_by(NODE, SWARM)
RESPONSE = JoinResponse(
    run=RUN,
    protocol=WORK_PROTOCOL,
    state="joined",
    heartbeat_seconds=10.0,
    policy_step=3,
    weights=["/ip4/1.2.3.4/tcp/1"],
)


class TestCodecs(CodecSuite):
    SPEC = JOIN
    ID = "/swarmrl/join/1.0.0"
    EXAMPLES = (REQUEST, RESPONSE)


BAD = [
    # Wrong types: strict, no coercion.
    ("asked", "report", "torch"),
    ("asked", "report.cpu_cores", 8.5),
    ("asked", "report.protocol", "1"),
    ("answered", "protocol", 1.0),
    # Out of range.
    ("asked", "issued_at", -1),
    ("asked", "report.backend", "tensorflow"),
    ("asked", "report.cpu_cores", 0),
    ("asked", "report.device", "x" * 129),
    ("asked", "report.protocol", -1),
    ("answered", "protocol", 2**64),
    ("answered", "heartbeat_seconds", 0.0),
    ("answered", "weights", ["/ip4/1.2.3.4/tcp/1"] * 9),
    # Malformed identifiers.
    ("asked", "peer_id", "12D3KooW0OIl"),  # not base58
    ("asked", "peer_id", ""),
    ("asked", "node", NODE.address[:-1]),
    ("asked", "node", NODE.address[2:] + "00"),
    ("asked", "signature", "AB" * 65),
    ("asked", "signature", "ab" * 64),
    ("answered", "run", RUN[2:]),
    ("answered", "run", "0x" + "5A" * 32),
]


@pytest.mark.parametrize(("side", "path", "value"), BAD, ids=lambda v: str(v)[:40])
def test_malformed_values_are_refused_in_one_sentence(side, path, value):
    codec, message = (JOIN.request, REQUEST) if side == "asked" else (JOIN.response, RESPONSE)
    assert type(message).__name__ in refused(codec, [replaced(message, path, value)])


def test_the_limits_hold_the_largest_valid_claim_and_reply():
    claim = CLAIM.model_copy(
        update={
            "report": REPORT.model_copy(
                update={
                    "device": "d" * 128,
                    "gpu": "g" * 128,
                    "version": "v" * 128,
                    "protocol": 2**64 - 1,
                }
            ),
            "peer_id": "z" * 128,
        }
    ).signed_by(NODE, SWARM)
    (body,) = JOIN.request.encode(claim)
    assert len(body) <= JOIN.request_limit
    joined = JoinResponse(
        run=RUN,
        protocol=2**64 - 1,
        state="joined",
        heartbeat_seconds=3600.0,
        policy_step=2**64 - 1,
        weights=["/" + "w" * 255] * 8,
    )
    (body,) = JOIN.response.encode(joined)
    assert len(body) <= JOIN.response_limit
