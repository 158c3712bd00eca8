"""What the tests of the protocols share: an in-memory stream, a codec of raw bytes,
and the checks every protocol's codecs pass.

Each protocol's own test module subclasses :class:`CodecSuite` with its spec and
a valid message of each side (request or header, and response); the suite then
checks, for both sides, that the message survives its codec, that a frame over
the spec's limit is refused before its body is read, that what is not the
message (garbage, an extra field, hostile bytes from hypothesis) ends in one
WireError sentence and never another exception.
"""

from __future__ import annotations

import copy
import dataclasses
import json
from collections.abc import Callable, Sequence
from typing import Any, ClassVar

import pytest
import trio
from hypothesis import given, settings
from hypothesis import strategies as st

from swarmrl.p2p import wire
from swarmrl.p2p.protocol import Codec, RequestResponse, Upload


class MemoryStream:
    """An in-memory stream: reads hand out at most `chunk` bytes at a time, writes append."""

    def __init__(self, data: bytes = b"", chunk: int | None = None) -> None:
        self.data = bytearray(data)
        self.chunk = chunk
        self.written = bytearray()

    async def read(self, n: int | None = None) -> bytes:
        await trio.lowlevel.checkpoint()
        size = len(self.data) if n is None else n
        if self.chunk is not None:
            size = min(size, self.chunk)
        out = bytes(self.data[:size])
        del self.data[:size]
        return out

    async def write(self, data: bytes) -> None:
        await trio.lowlevel.checkpoint()
        self.written += data


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

FUZZ = settings(max_examples=60, deadline=None)
NOT_MESSAGES = [b"", b"null", b"[]", b"{", b"\xff\xfe", b'{"a":' * 10_000]
SIDES = ["asked", "answered"]

json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**70), 2**70)
    | st.floats()  # NaN and infinities too: json.dumps writes them as NaN, Infinity
    | st.text(max_size=40)
    | st.sampled_from(["", "0x", "ab" * 32, "0x" + "ab" * 20, "12D3KooW", "torch", "open"]),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=16,
)


def keys(value: Any) -> set[str]:
    """Every key of a parsed JSON document, however deep."""
    if isinstance(value, dict):
        return set(value).union(*(keys(v) for v in value.values()))
    if isinstance(value, list):
        return set().union(*(keys(v) for v in value))
    return set()


def paths(value: Any, here: tuple = ()) -> list[tuple]:
    """The path of every value inside a parsed JSON document, the root included."""
    found = [here]
    if isinstance(value, dict):
        for key, inner in value.items():
            found += paths(inner, (*here, key))
    elif isinstance(value, list):
        for i, inner in enumerate(value):
            found += paths(inner, (*here, i))
    return found


def mutated(document: Any, path: tuple, action: str, value: Any, key: str) -> Any:
    """`document` with the value at `path` replaced or deleted, or `key` added beside it."""
    if not path:
        return value
    document = copy.deepcopy(document)
    parent = document
    for step in path[:-1]:
        parent = parent[step]
    last = path[-1]
    if action == "replace":
        parent[last] = value
    elif action == "delete":
        del parent[last]
    elif isinstance(parent, dict):
        parent[key] = value
    else:
        parent.insert(last, value)
    return document


def random_bytes(data: st.DataObject, valid: bytes) -> bytes:
    return data.draw(st.binary(max_size=2048))


def random_json(data: st.DataObject, valid: bytes) -> bytes:
    return json.dumps(data.draw(json_values)).encode()


def mutated_json(data: st.DataObject, valid: bytes) -> bytes:
    """A valid frame with one, two or three values replaced, deleted or added."""
    try:
        document = json.loads(valid)
    except ValueError:  # not a JSON frame: nothing to mutate by field
        return valid
    names = sorted(keys(document)) or ["x"]
    for _ in range(data.draw(st.integers(1, 3))):
        path = data.draw(st.sampled_from(paths(document)))
        action = data.draw(st.sampled_from(["replace", "delete", "add"]))
        value = data.draw(json_values)
        key = data.draw(st.sampled_from(names) | st.text(max_size=8))
        document = mutated(document, path, action, value, key)
    return json.dumps(document).encode()


def mutated_bytes(data: st.DataObject, valid: bytes) -> bytes:
    """A valid frame's bytes with some flipped, cut out, inserted, or the end cut off."""
    body = bytearray(valid)
    for _ in range(data.draw(st.integers(1, 8))):
        at = data.draw(st.integers(0, len(body)))
        action = data.draw(st.sampled_from(["flip", "cut", "insert", "truncate"]))
        if action == "insert":
            body[at:at] = data.draw(st.binary(min_size=1, max_size=8))
        elif at == len(body):
            continue
        elif action == "flip":
            body[at] ^= 1 << data.draw(st.integers(0, 7))
        elif action == "cut":
            del body[at : at + data.draw(st.integers(1, 8))]
        else:
            del body[at:]
    return bytes(body)


MUTATIONS: dict[str, Callable[[st.DataObject, bytes], bytes]] = {
    f.__name__: f for f in (random_bytes, random_json, mutated_json, mutated_bytes)
}


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

    @pytest.mark.parametrize("mutation", MUTATIONS)
    @pytest.mark.parametrize("side", SIDES)
    @FUZZ
    @given(data=st.data())
    def test_hostile_frames_are_decoded_or_refused(self, side, mutation, data):
        """Whatever a peer sends, decoding ends in a message that survives its own round
        trip, or in one WireError sentence; never another exception."""
        codec, message, _ = self.side(side)
        frames = codec.encode(message)
        at = data.draw(st.integers(0, len(frames) - 1))
        frames[at] = MUTATIONS[mutation](data, frames[at])
        decoded_or_refused(codec, frames)


def replaced(message: Any, path: str, value: Any) -> bytes:
    """`message` as JSON, with the value at `path` (dots) replaced."""
    raw = json.loads(wire.dump(message))
    *parents, last = path.split(".")
    node = raw
    for part in parents:
        node = node[int(part)] if part.isdigit() else node[part]
    node[int(last) if last.isdigit() else last] = value
    return json.dumps(raw).encode()
