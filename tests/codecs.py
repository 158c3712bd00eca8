"""What the tests of the protocols share: a codec of raw bytes, and the checks every
protocol's codecs pass.

Each protocol's own test module subclasses :class:`CodecSuite` with its spec and
a valid message of each side (request or header, and response); the suite then
checks, for both sides, that the message survives its codec, that a frame over
the spec's limit is refused before its body is read, that what is not the
message (garbage, an extra field, a key that would forge a log line) ends in one
WireError sentence and never another exception. Hostile bytes from hypothesis
are the trust suite's fuzz targets (benchmarks/fuzz_targets.py, one per side of
every protocol), run in short form by tests/unit/test_trust_fuzz.py.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Sequence
from typing import Any, ClassVar

import pytest
import trio

from benchmarks.hostile import MemoryStream
from swarmrl.p2p import wire
from swarmrl.p2p.protocol import Codec, RequestResponse, Upload


class Raw(Codec[bytes]):
    """Bytes as they are: how a test sends what no spec would encode (garbage, a frame
    past the limit) to a real serving peer, and reads what it answers."""

    def encode(self, message: bytes) -> list[bytes]:
        return [message]

    def decode(self, frames: Sequence[bytes]) -> bytes:
        (body,) = frames
        return body


def raw(spec: RequestResponse[Any, Any], **changes: Any) -> RequestResponse[bytes, bytes]:
    """`spec` (its id, limits and deadline) asked in raw bytes, answered in one raw frame."""
    return dataclasses.replace(spec, request=Raw(), response=Raw(), **changes)


# ---- the suite ---------------------------------------------------------------------

NOT_MESSAGES = [b"", b"null", b"[]", b"{", b"\xff\xfe", b'{"a":' * 10_000]
SIDES = ["asked", "answered"]


def refused(codec: Codec[Any], frames: list[bytes]) -> str:
    """The one sentence `codec` refuses `frames` with."""
    with pytest.raises(wire.WireError) as e:
        codec.decode(frames)
    sentence = str(e.value)
    assert sentence
    assert "\n" not in sentence
    return sentence


def decoded_or_refused(codec: Codec[Any], frames: list[bytes]) -> None:
    """Either a message that survives its own round trip, or one WireError sentence."""
    try:
        decoded = codec.decode(frames)
    except wire.WireError as e:
        sentence = str(e)
    else:
        assert codec.decode(codec.encode(decoded)) == decoded
        return
    assert sentence
    assert "\n" not in sentence


def read_frame(data: bytes, limit: int) -> bytes:
    return trio.run(wire.read_frame, MemoryStream(data), limit)


class CodecSuite:
    """The checks of one protocol's codecs; subclass with SPEC, ID and EXAMPLES."""

    SPEC: ClassVar[RequestResponse[Any, Any] | Upload[Any, Any]]
    ID: ClassVar[str]  # the protocol id, pinned: another id is another protocol
    EXAMPLES: ClassVar[tuple[Any, Any]]  # a valid request (or header) and response

    def side(self, side: str) -> tuple[Codec[Any], Any, int]:
        """The codec, a valid message and the frame limit of one side."""
        spec = self.SPEC
        if side == "answered":
            return spec.response, self.EXAMPLES[1], spec.response_limit
        if isinstance(spec, Upload):
            return spec.header, self.EXAMPLES[0], spec.header_limit
        return spec.request, self.EXAMPLES[0], spec.request_limit

    def test_the_id_is_the_protocols(self):
        assert self.SPEC.id == self.ID
        assert self.ID.startswith(wire.PROTOCOL_PREFIX + "/")

    @pytest.mark.parametrize("side", SIDES)
    def test_a_valid_message_round_trips_within_the_limit(self, side):
        codec, message, limit = self.side(side)
        frames = codec.encode(message)
        assert len(frames) == codec.frames
        assert all(len(f) <= limit for f in frames)
        assert codec.decode(frames) == message

    @pytest.mark.parametrize("side", SIDES)
    def test_a_frame_over_the_limit_is_refused_before_it_is_read(self, side):
        _, _, limit = self.side(side)
        assert read_frame(wire.frame(b"x" * limit), limit) == b"x" * limit
        stream = MemoryStream(wire.frame(b"x" * (limit + 1)))
        with pytest.raises(wire.WireError) as e:
            trio.run(wire.read_frame, stream, limit)
        assert str(e.value) == f"a {limit + 1}-byte frame is over the {limit}-byte limit"
        assert len(stream.data) == limit + 1  # the body was never read into memory

    @pytest.mark.parametrize("side", SIDES)
    def test_extra_fields_are_refused(self, side):
        codec, message, _ = self.side(side)
        frames = codec.encode(message)
        document = json.loads(frames[0])
        document["admin"] = True
        assert "admin" in refused(codec, [json.dumps(document).encode(), *frames[1:]])

    @pytest.mark.parametrize("body", NOT_MESSAGES, ids=lambda b: repr(b[:8]))
    @pytest.mark.parametrize("side", SIDES)
    def test_what_is_not_a_message_is_refused(self, side, body):
        codec, message, _ = self.side(side)
        refused(codec, [body, *codec.encode(message)[1:]])

    @pytest.mark.parametrize("name", ["\n", "a\r\nERROR forged log line", "k" * 5000])
    @pytest.mark.parametrize("side", SIDES)
    def test_a_refusal_quotes_no_peer_text_raw(self, side, name):
        codec, message, _ = self.side(side)
        sentence = refused(codec, [json.dumps({name: 1}).encode(), *codec.encode(message)[1:]])
        assert sentence.isprintable()
        assert len(sentence) <= 200


def replaced(message: Any, path: str, value: Any) -> bytes:
    """`message` as JSON, with the value at `path` (dots) replaced."""
    raw = json.loads(wire.dump(message))
    *parents, last = path.split(".")
    node = raw
    for part in parents:
        node = node[int(part)] if part.isdigit() else node[part]
    node[int(last) if last.isdigit() else last] = value
    return json.dumps(raw).encode()
