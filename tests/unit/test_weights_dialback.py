"""``/swarmrl/dialback/1.0.0`` on the wire: a port and a nonce in, what was reached out
(the probing itself is test_swarm's and test_node_doctor's, over real sockets)."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from benchmarks.hostile import json_values
from swarmrl.weights.dialback import DIALBACK, PROBE_TIMEOUT, DialbackReply, DialbackRequest
from tests.codecs import CodecSuite, decoded_or_refused, refused

REQUEST = DialbackRequest(port=4001, nonce="ab" * 32)
REPLY = DialbackReply(reached=True, endpoint="127.0.0.1:4001")


class TestCodecs(CodecSuite):
    SPEC = DIALBACK
    ID = "/swarmrl/dialback/1.0.0"
    EXAMPLES = (REQUEST, REPLY)


@pytest.mark.parametrize(
    ("side", "body", "where"),
    [
        ("asked", {"port": 0, "nonce": "ab" * 32}, "port"),
        ("asked", {"port": 65536, "nonce": "ab" * 32}, "port"),
        ("asked", {"port": "4001", "nonce": "ab" * 32}, "port"),
        ("asked", {"port": 4001, "nonce": "ab" * 31}, "nonce"),
        ("answered", {"reached": 1}, "reached"),
        ("answered", {"reached": True, "endpoint": "h" * 301}, "endpoint"),
    ],
)
def test_malformed_values_are_refused_in_one_sentence(side, body, where):
    codec = DIALBACK.request if side == "asked" else DIALBACK.response
    assert where in refused(codec, [json.dumps(body).encode()])


def test_the_limits_hold_the_largest_valid_request_and_reply():
    (body,) = DIALBACK.request.encode(DialbackRequest(port=65535, nonce="ff" * 32))
    assert len(body) <= DIALBACK.request_limit
    (body,) = DIALBACK.response.encode(DialbackReply(reached=True, endpoint="h" * 300))
    assert len(body) <= DIALBACK.response_limit


def test_the_asker_waits_for_the_probes_to_finish():
    """The serving side may probe for up to its deadline; the asker waits longer."""
    assert DIALBACK.deadline >= PROBE_TIMEOUT
    assert DIALBACK.wait > DIALBACK.deadline


@settings(max_examples=150)
@given(value=st.dictionaries(st.sampled_from(["port", "nonce", "reached", "endpoint"]), json_values,
                             max_size=4))  # fmt: skip
def test_decoding_structured_fuzz(value):
    for codec in (DIALBACK.request, DIALBACK.response):
        decoded_or_refused(codec, [json.dumps(value).encode()])
