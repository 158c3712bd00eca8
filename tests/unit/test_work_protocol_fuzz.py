"""The work protocol's decoders on hostile input: whatever a peer sends, parsing any
request or response of join, heartbeat, work and submit ends in the message or in
one WireError sentence, never another exception."""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from swarmrl.p2p import wire
from tests.unit.test_work_protocol import VALID

MODELS = list(VALID)
FUZZ = settings(max_examples=60, deadline=None)

# Every field name of every message, so a mutation can reach past "extra field".
FIELD_NAMES = sorted(
    {name for model in MODELS for name in json.loads(wire.dump(VALID[model]))}
    | {"report", "order", "receipt", "tasks", "outcomes", "budget", "problem_id", "digest"}
)

json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**70), 2**70)
    | st.floats()  # NaN and infinities too: json.dumps writes them as NaN, Infinity
    | st.text(max_size=40)
    | st.sampled_from(["", "0x", "ab" * 32, "0x" + "ab" * 20, "12D3KooW", "torch", "open"]),
    lambda inner: (
        st.lists(inner, max_size=4)
        | st.dictionaries(st.sampled_from(FIELD_NAMES) | st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=16,
)


def parsed_or_refused(model: type, body: bytes) -> None:
    """Either a message of `model` that survives its own round trip, or a WireError.
    (That its sentence is one line is test_work_protocol's
    test_a_refusal_quotes_no_peer_text_raw.)"""
    try:
        message = wire.parse(model, body)
    except wire.WireError as refused:
        sentence = str(refused)
    else:
        assert isinstance(message, model)
        assert wire.parse(model, wire.dump(message)) == message
        return
    assert sentence


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


@pytest.mark.parametrize("model", MODELS, ids=lambda m: m.__name__)
@FUZZ
@given(body=st.binary(max_size=2048))
def test_random_bytes(model, body):
    parsed_or_refused(model, body)


@pytest.mark.parametrize("model", MODELS, ids=lambda m: m.__name__)
@FUZZ
@given(value=json_values)
def test_random_json(model, value):
    parsed_or_refused(model, json.dumps(value).encode())


@pytest.mark.parametrize("model", MODELS, ids=lambda m: m.__name__)
@FUZZ
@given(data=st.data())
def test_mutated_valid_json(model, data):
    """A valid message with one, two or three values replaced, deleted or added."""
    document = json.loads(wire.dump(VALID[model]))
    for _ in range(data.draw(st.integers(1, 3))):
        path = data.draw(st.sampled_from(paths(document)))
        action = data.draw(st.sampled_from(["replace", "delete", "add"]))
        value = data.draw(json_values)
        key = data.draw(st.sampled_from(FIELD_NAMES))
        document = mutated(document, path, action, value, key)
    parsed_or_refused(model, json.dumps(document).encode())


@pytest.mark.parametrize("model", MODELS, ids=lambda m: m.__name__)
@FUZZ
@given(data=st.data())
def test_mutated_valid_bytes(model, data):
    """A valid message's bytes with some flipped, cut out, inserted, or the end cut off."""
    body = bytearray(wire.dump(VALID[model]))
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
    parsed_or_refused(model, bytes(body))
