"""swarmrl.p2p.protocol: the typed specs and how a peer serves them, without a network
(the host's side, over real libp2p streams, is test_p2p_upload's and test_swarm's)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from swarmrl.p2p import wire
from swarmrl.p2p.protocol import Json, RequestResponse, Served, ServedUpload, Upload
from swarmrl.schema import Strict
from tests.codecs import Raw


class Ask(Strict):
    n: int


class Answer(Strict):
    doubled: int


SPEC = RequestResponse(
    wire.protocol_id("test-double"),
    Json(Ask),
    Json(Answer),
    request_limit=64,
    response_limit=64,
    deadline=5.0,
)
UPLOAD = Upload(
    wire.protocol_id("test-upload"),
    Json(Ask),
    Json(Answer),
    header_limit=64,
    body_limit=1024,
    response_limit=64,
    deadline=5.0,
)


class Gate:
    """An admit gate that refuses every peer after `allowed` requests, and counts."""

    def __init__(self, allowed: int) -> None:
        self.allowed = allowed
        self.asked: list[str] = []

    def __call__(self, peer: str) -> None:
        self.asked.append(peer)
        if len(self.asked) > self.allowed:
            raise wire.Refusal("too many requests from this peer; slow down")


def double(peer: str, request: Ask) -> Answer:
    return Answer(doubled=2 * request.n)


def test_a_served_request_is_decoded_handled_and_encoded():
    seen: list[tuple[str, Ask]] = []

    def handler(peer: str, request: Ask) -> Answer:
        seen.append((peer, request))
        return double(peer, request)

    frames = Served(SPEC, handler).answer("peer-a", b'{"n":21}')
    assert frames == [b'{"doubled":42}']
    assert seen == [("peer-a", Ask(n=21))]
    assert SPEC.response.decode(frames) == Answer(doubled=42)


def test_a_malformed_request_never_reaches_the_handler():
    def handler(peer: str, request: Ask) -> Answer:
        raise AssertionError("the handler saw a malformed request")

    with pytest.raises(wire.WireError, match=r"^invalid Ask: n: "):
        Served(SPEC, handler).answer("peer-a", b'{"n":"21"}')


def test_the_admit_gate_refuses_before_anything_is_decoded():
    gate = Gate(allowed=2)
    served = Served(SPEC, double, gate)
    for _ in range(2):
        served.admit_peer("flood")
        with pytest.raises(wire.WireError):
            served.answer("flood", b"not json")
    for _ in range(2):  # refused by the gate: nothing of the request is read
        with pytest.raises(wire.Refusal, match="too many requests"):
            served.admit_peer("flood")
    assert gate.asked == ["flood"] * 4


class Files:
    """An upload handler that accepts even numbers and answers the body's size."""

    def __init__(self) -> None:
        self.checked: list[Ask] = []

    def check(self, peer: str, header: Ask) -> None:
        self.checked.append(header)
        if header.n % 2:
            raise wire.Refusal(f"{header.n} is odd")

    def receive(self, peer: str, header: Ask, path: Path) -> Answer:
        return Answer(doubled=2 * path.stat().st_size)


def test_a_served_upload_is_admitted_decoded_and_checked_from_its_header(tmp_path):
    files, gate = Files(), Gate(allowed=3)
    served = ServedUpload(UPLOAD, files, gate)
    served.admit_peer("peer-a")
    header, answered = served.check("peer-a", b'{"n":2}')
    assert (header, answered) == (Ask(n=2), None)
    body = tmp_path / "body"
    body.write_bytes(b"x" * 10)
    assert served.receive("peer-a", header, body) == [b'{"doubled":20}']
    served.admit_peer("peer-a")
    with pytest.raises(wire.Refusal, match="3 is odd"):
        served.check("peer-a", b'{"n":3}')
    served.admit_peer("peer-a")
    with pytest.raises(wire.WireError, match="invalid Ask"):
        served.check("peer-a", b'{"n":2,"m":1}')
    with pytest.raises(wire.Refusal, match="too many requests"):
        served.admit_peer("peer-a")
    assert files.checked == [Ask(n=2), Ask(n=3)]


class Known(Files):
    """Answers a header it has seen the body of from the header alone."""

    def check(self, peer: str, header: Ask) -> Answer | None:
        self.checked.append(header)
        return Answer(doubled=2 * header.n) if header.n == 21 else None


def test_a_handler_may_answer_an_upload_from_its_header_alone():
    served = ServedUpload(UPLOAD, Known())
    assert served.check("peer-a", b'{"n":21}') == (Ask(n=21), [b'{"doubled":42}'])
    assert served.check("peer-a", b'{"n":4}') == (Ask(n=4), None)  # the body is wanted


@pytest.mark.parametrize("field", ["request_limit", "response_limit"])
def test_a_spec_refuses_limits_below_one(field):
    with pytest.raises(ValueError, match=rf"^{field} must be at least 1, got 0$"):
        dataclasses.replace(SPEC, **{field: 0})


@pytest.mark.parametrize("field", ["header_limit", "body_limit", "response_limit", "chunk_limit"])
def test_an_upload_refuses_limits_below_one(field):
    with pytest.raises(ValueError, match=rf"^{field} must be at least 1, got 0$"):
        dataclasses.replace(UPLOAD, **{field: 0})


class TwoFrames(Raw):
    frames = 2


def test_requests_headers_and_upload_replies_travel_as_one_frame():
    with pytest.raises(ValueError, match="a request travels as one frame, not 2"):
        dataclasses.replace(SPEC, request=TwoFrames())
    with pytest.raises(ValueError, match="a header travels as one frame, not 2"):
        dataclasses.replace(UPLOAD, header=TwoFrames())
    with pytest.raises(ValueError, match="a response travels as one frame, not 2"):
        dataclasses.replace(UPLOAD, response=TwoFrames())
    assert dataclasses.replace(SPEC, response=TwoFrames()).response.frames == 2


def test_a_caller_waits_the_deadline_unless_the_spec_says_otherwise():
    assert SPEC.wait == SPEC.deadline
    assert dataclasses.replace(SPEC, call_timeout=1.5).wait == 1.5
