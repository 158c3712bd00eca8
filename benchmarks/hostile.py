"""Hostile inputs: hypothesis strategies that turn a valid encoding into what an
attacker or a broken peer might send instead, and the in-memory stream the wire
decoders read them from.

Random bytes alone rarely get past a decoder's first check (a length, a magic
number, a JSON brace), so most strategies here start from a valid encoding and
damage it: a JSON document with values replaced, deleted or added at any depth,
bytes flipped, cut out, inserted or truncated, and signatures bent into the
shapes ECDSA verifiers disagree about. The fuzz targets of
:mod:`benchmarks.trust_fuzz` and the protocols' codec tests both draw from here.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Callable
from typing import Any

import trio
from hypothesis import strategies as st

from swarmrl.eip712 import SECP256K1_ORDER


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


json_values: st.SearchStrategy[Any] = st.recursive(
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


def paths(value: Any, here: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """The path of every value inside a parsed JSON document, the root included."""
    found = [here]
    if isinstance(value, dict):
        for key, inner in value.items():
            found += paths(inner, (*here, key))
    elif isinstance(value, list):
        for i, inner in enumerate(value):
            found += paths(inner, (*here, i))
    return found


def mutated(document: Any, path: tuple[Any, ...], action: str, value: Any, key: str) -> Any:
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


def random_bytes(valid: bytes) -> st.SearchStrategy[bytes]:
    return st.binary(max_size=2048)


def random_json(valid: bytes) -> st.SearchStrategy[bytes]:
    return json_values.map(lambda v: json.dumps(v).encode())


@st.composite
def mutated_bytes(draw: st.DrawFn, valid: bytes) -> bytes:
    """A valid encoding's bytes with some flipped, cut out, inserted, or the end cut off."""
    body = bytearray(valid)
    for _ in range(draw(st.integers(1, 8))):
        at = draw(st.integers(0, len(body)))
        action = draw(st.sampled_from(["flip", "cut", "insert", "truncate"]))
        if action == "insert":
            body[at:at] = draw(st.binary(min_size=1, max_size=8))
        elif at == len(body):
            continue
        elif action == "flip":
            body[at] ^= 1 << draw(st.integers(0, 7))
        elif action == "cut":
            del body[at : at + draw(st.integers(1, 8))]
        else:
            del body[at:]
    return bytes(body)


@st.composite
def mutated_json(draw: st.DrawFn, valid: bytes) -> bytes:
    """A valid JSON encoding with one, two or three values replaced, deleted or added."""
    try:
        document = json.loads(valid)
    except ValueError:  # not JSON: nothing to mutate by field, so by byte
        return draw(mutated_bytes(valid))
    names = sorted(keys(document)) or ["x"]
    for _ in range(draw(st.integers(1, 3))):
        path = draw(st.sampled_from(paths(document)))
        action = draw(st.sampled_from(["replace", "delete", "add"]))
        value = draw(json_values)
        key = draw(st.sampled_from(names) | st.text(max_size=8))
        document = mutated(document, path, action, value, key)
    return json.dumps(document).encode()


MUTATIONS: dict[str, Callable[[bytes], st.SearchStrategy[bytes]]] = {
    f.__name__: f for f in (random_bytes, random_json, mutated_json, mutated_bytes)
}


def hostile(valid: bytes) -> st.SearchStrategy[bytes]:
    """Anything a peer might send where `valid` belongs: every mutation above."""
    return st.one_of(*(mutation(valid) for mutation in MUTATIONS.values()))


def malleable_twin(signature: bytes) -> bytes:
    """The other signature of the same key over the same digest: s -> n - s, v flipped.
    Plain ECDSA accepts both; Ethereum's contracts (EIP-2) only the one with low s."""
    r, s, v = signature[:32], int.from_bytes(signature[32:64], "big"), signature[64]
    return r + ((SECP256K1_ORDER - s) % 2**256).to_bytes(32, "big") + bytes([v ^ 1])


@st.composite
def bent_signature(draw: st.DrawFn, valid: bytes) -> bytes:
    """A 65-byte r || s || v signature in a shape verifiers disagree about: its high-s
    twin, v as 0/1 or anything else, r or s zero or at the group order, bits flipped,
    or the wrong length."""
    r, s, v = valid[:32], valid[32:64], valid[64]
    order = SECP256K1_ORDER.to_bytes(32, "big")
    choice = draw(st.sampled_from(["twin", "v", "zero-r", "zero-s", "order-s", "flip", "length"]))
    if choice == "twin":
        return malleable_twin(valid)
    if choice == "v":
        return r + s + bytes([draw(st.sampled_from([0, 1, 2, 26, 29, 35, 36, 255]))])
    if choice == "zero-r":
        return bytes(32) + s + bytes([v])
    if choice == "zero-s":
        return r + bytes(32) + bytes([v])
    if choice == "order-s":
        return r + order + bytes([v])
    if choice == "flip":
        bit = draw(st.integers(0, 65 * 8 - 1))
        out = bytearray(valid)
        out[bit // 8] ^= 1 << (bit % 8)
        return bytes(out)
    return draw(st.binary(max_size=80).filter(lambda b: len(b) != 65))
