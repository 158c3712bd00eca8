"""How messages travel on libp2p streams: versioned protocol ids, varint-length
frames with hard size limits and deadlines, and JSON bodies parsed strictly.

A frame is an unsigned LEB128 length followed by that many bytes, the framing
libp2p's own protocols use. A reader states the largest frame it accepts and
gets a WireError (one sentence) for anything else: an over-long or truncated
length, a frame past the limit, a stream that ends early, a deadline that
passes, or a body that is not the expected message. A malformed frame from a
peer costs that stream, never the host.
"""

from __future__ import annotations

import reprlib
from typing import Any, Protocol, TypeVar

import pydantic_core
from pydantic import BaseModel, ValidationError

from swarmrl.schema import error_location

PROTOCOL_PREFIX = "/swarmrl"
# A varint of at most 5 bytes carries up to 2**35 - 1: more than any limit here.
_MAX_VARINT_BYTES = 5

M = TypeVar("M", bound=BaseModel)


class WireError(ValueError):
    """A peer sent something this side cannot accept; the message is one sentence."""


class Refusal(Exception):  # noqa: N818 (a refusal is an answer, not an error)
    """A well-formed request this peer cannot answer (it lacks what was asked for);
    sent back as an error reply like a WireError, but not logged as misbehaviour."""


class Stream(Protocol):
    """The part of a libp2p stream the framing uses."""

    async def read(self, n: int | None = None) -> bytes: ...

    async def write(self, data: bytes) -> None: ...


def protocol_id(name: str, version: str = "1.0.0") -> str:
    """`/swarmrl/<name>/<version>`: a new incompatible version is a new id, so old
    and new peers negotiate instead of misreading each other."""
    return f"{PROTOCOL_PREFIX}/{name}/{version}"


def encode_varint(value: int) -> bytes:
    if value < 0:
        raise ValueError("a varint cannot be negative")
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def frame(body: bytes) -> bytes:
    """`body` with its length prefix."""
    return encode_varint(len(body)) + body


async def read_exactly(stream: Stream, n: int) -> bytes:
    """`n` bytes; the caller has checked `n` against its limit and bounds the time."""
    chunks = []
    while n:
        chunk = await stream.read(n)
        if not chunk:
            raise WireError("the stream ended in the middle of a frame")
        chunks.append(chunk)
        n -= len(chunk)
    return b"".join(chunks)


async def read_length(stream: Stream) -> int:
    """The length prefix of the next frame, with nothing of its body read, so a
    reader can refuse a frame by its size (or by a running total) first."""
    length = 0
    for i in range(_MAX_VARINT_BYTES):
        byte = (await read_exactly(stream, 1))[0]
        length |= (byte & 0x7F) << (7 * i)
        if not byte & 0x80:
            return length
    raise WireError("the frame length is not a valid varint")


async def read_frame(stream: Stream, limit: int) -> bytes:
    """One frame's body, at most `limit` bytes. The caller bounds the time."""
    length = await read_length(stream)
    if length > limit:
        raise WireError(f"a {length}-byte frame is over the {limit}-byte limit")
    return await read_exactly(stream, length)


async def write_frame(stream: Stream, body: bytes) -> None:
    await stream.write(frame(body))


def dump(message: BaseModel) -> bytes:
    """A message as compact JSON."""
    return message.model_dump_json().encode()


def parse(model: type[M], body: bytes) -> M:
    """Untrusted bytes as a `model`, or WireError naming what is wrong."""
    try:
        # pydantic-core caps nesting depth itself (json.loads would rely on the
        # interpreter's recursion limit, which web3 raises far past the C stack).
        raw: Any = pydantic_core.from_json(body)
    except ValueError:
        raise WireError(f"a {model.__name__} must be JSON, got {reprlib.repr(body)}") from None
    try:
        return model.model_validate(raw)
    except ValidationError as e:
        where = error_location(e, "the message")
        raise WireError(f"invalid {model.__name__}: {where}: {e.errors()[0]['msg']}") from None


def dump_json(value: Any) -> bytes:
    """Plain data as compact JSON."""
    return pydantic_core.to_json(value)


def parse_error(body: bytes, key: str) -> str:
    """The sentence of an error reply `{key: sentence}`, at most 1,000 characters."""
    try:
        raw = pydantic_core.from_json(body)
    except ValueError:
        raise WireError("the error reply is not JSON") from None
    sentence = raw.get(key) if isinstance(raw, dict) and set(raw) == {key} else None
    if not isinstance(sentence, str):
        raise WireError("the error reply is malformed")
    return sentence[:1000]
