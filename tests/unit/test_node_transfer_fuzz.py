"""The node export reader on whatever a file may hold: random bytes and JSON, mutated
exports, and any contents sealed under the right password.

Every outcome is the bundle, or a `TransferError` (a ValueError) of one sentence;
never another exception. A mutation the cipher does not cover is either harmless
(the same bundle comes out) or refused.
"""

from __future__ import annotations

import copy
import hashlib
import json

import pytest
from eth_account import Account
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from client.node.setup import transfer
from client.node.setup.transfer import (
    FORMAT,
    NodeBundle,
    Refusal,
    TransferError,
    open_bundle,
    parse_envelope,
    read_export,
    seal,
)
from swarmrl.eip712 import pool_domain, swarm_domain
from swarmrl.work.submit import Receipt, SubmitHeader

PASSWORD = "correct horse"
CHEAP = 2  # scrypt's least cost: the fuzz is about parsing, not the kdf
NODE = Account.from_key(b"\x01" * 32)
ORCHESTRATOR = Account.from_key(b"\x02" * 32)
RUN = "0x" + "ab" * 32
POOL = "0x" + "cd" * 20
FUZZ = settings(
    max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)


def header(step: int) -> SubmitHeader:
    body = f"rollouts {step}".encode()
    return SubmitHeader(
        order_id=hashlib.sha256(body).hexdigest(),
        node=NODE.address,
        step=step,
        file_sha256=hashlib.sha256(body).hexdigest(),
        size=len(body),
        signature="0" * 130,
    ).signed_by(NODE, RUN, pool_domain(31337, POOL))


def receipt(step: int) -> Receipt:
    digest = header(step).digest(RUN, pool_domain(31337, POOL)).hex()
    return Receipt(run=RUN, node=NODE.address, submission=digest, epoch=0, units=8).signed_by(
        ORCHESTRATOR, swarm_domain(31337, POOL)
    )


BUNDLE = NodeBundle(
    format=FORMAT,
    version=1,
    node=NODE.address,
    private_key=NODE.key.hex().removeprefix("0x"),
    peer_key="07" * 32,
    receipts=[receipt(1), receipt(2)],
    refused=[
        Refusal(order_id=header(3).order_id, digest="ee" * 32, header=header(3), reason="late")
    ],
)
BUNDLE_JSON = json.loads(BUNDLE.model_dump_json())


def sealed(document: object, node: str = NODE.address) -> bytes:
    return seal(json.dumps(document).encode(), node, PASSWORD, scrypt_n=CHEAP)


VALID = sealed(BUNDLE_JSON)
ENVELOPE = json.loads(VALID)


def outcome(raw: bytes, password: str = PASSWORD) -> NodeBundle | str:
    """The bundle, or the sentence of its TransferError; anything else raises."""
    try:
        return read_export(raw, password)
    except TransferError as e:
        sentence = str(e)
        assert sentence.strip()
        assert "\n" not in sentence
        assert len(sentence) < 400
        return sentence


json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=40),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=12), inner),
    max_leaves=20,
)


def paths(document: object, prefix: tuple = ()) -> list[tuple]:
    """Every path to a value inside `document` (dict keys and list indexes)."""
    found = [prefix]
    if isinstance(document, dict):
        for key, value in document.items():
            found += paths(value, (*prefix, key))
    elif isinstance(document, list):
        for i, value in enumerate(document):
            found += paths(value, (*prefix, i))
    return found


@st.composite
def mutated(draw: st.DrawFn, base: dict) -> dict:
    """`base` with a few values replaced, removed, or fields added."""
    document = copy.deepcopy(base)
    for _ in range(draw(st.integers(1, 3))):
        path = draw(st.sampled_from(paths(document)))
        if not path:
            continue
        *parents, last = path
        holder = document
        for part in parents:
            holder = holder[part]
        action = draw(st.sampled_from(["replace", "remove", "add"]))
        if action == "replace":
            holder[last] = draw(json_values)
        elif action == "remove":
            del holder[last]
        elif isinstance(holder, dict):
            holder[draw(st.text(max_size=12))] = draw(json_values)
        else:
            holder.append(draw(json_values))
    return document


def test_a_sealed_bundle_opens_to_itself_and_only_with_its_password():
    assert read_export(VALID, PASSWORD) == BUNDLE
    assert outcome(VALID, "battery staple") == (
        "wrong password for the node export, or the file was changed or is damaged"
    )
    assert BUNDLE.peer_id.startswith("12D3KooW")


@FUZZ
@given(raw=st.binary(max_size=600))
def test_any_bytes_are_a_bundle_or_one_sentence(raw):
    assert isinstance(outcome(raw), str)


@FUZZ
@given(document=json_values)
def test_any_json_is_a_bundle_or_one_sentence(document):
    assert isinstance(outcome(json.dumps(document).encode()), str)


@FUZZ
@given(document=mutated(ENVELOPE))
def test_a_mutated_file_is_its_bundle_or_one_sentence(document):
    found = outcome(json.dumps(document).encode())
    # The cipher covers every field: a file that still opens is the one written.
    assert isinstance(found, str) or (document == ENVELOPE and found == BUNDLE)


@FUZZ
@given(document=mutated(BUNDLE_JSON))
def test_any_mutated_contents_sealed_right_are_a_bundle_or_one_sentence(document):
    found = outcome(sealed(document))
    if not isinstance(found, str):
        # What opens is a bundle whose every part is the node's own.
        assert found.node == NODE.address
        assert all(r.node == NODE.address for r in found.receipts)


@FUZZ
@given(document=json_values)
def test_any_json_contents_sealed_right_are_one_sentence(document):
    assert isinstance(outcome(sealed(document)), str)


@FUZZ
@given(index=st.integers(0, len(ENVELOPE["ciphertext"]) - 1), char=st.sampled_from("AB+/"))
def test_a_changed_ciphertext_is_refused(index, char):
    text = ENVELOPE["ciphertext"]
    if text[index] == char:
        return
    document = {**ENVELOPE, "ciphertext": text[:index] + char + text[index + 1 :]}
    assert isinstance(outcome(json.dumps(document).encode()), str)


def test_contents_naming_another_node_than_the_file_are_refused():
    other = Account.from_key(b"\x03" * 32).address
    assert outcome(sealed(BUNDLE_JSON, node=other)) == (
        "the node export is damaged: it names two different nodes"
    )


def test_another_nodes_key_or_receipt_is_refused():
    other = Account.from_key(b"\x03" * 32)
    wrong_key = {**BUNDLE_JSON, "private_key": other.key.hex().removeprefix("0x")}
    assert outcome(sealed(wrong_key)) == (
        "the node export holds no node this swarmrl reads (its contents: its private key "
        "is not the node's)"
    )
    stranger = receipt(4).model_copy(update={"node": other.address}).model_dump()
    wrong_receipt = {**BUNDLE_JSON, "receipts": [*BUNDLE_JSON["receipts"], stranger]}
    assert outcome(sealed(wrong_receipt)) == (
        "the node export holds no node this swarmrl reads (its contents: it holds a receipt "
        "of another node)"
    )


def test_the_size_limits_hold_before_any_work(monkeypatch):
    monkeypatch.setattr(transfer, "MAX_FILE_BYTES", len(VALID) - 1)
    assert outcome(VALID) == "the file is too large to be a node export"
    monkeypatch.undo()
    monkeypatch.setattr(transfer, "MAX_PLAIN_BYTES", 100)
    assert outcome(VALID) == "the node export holds more than swarmrl reads"


def test_a_compression_bomb_is_cut_off(monkeypatch):
    monkeypatch.setattr(transfer, "MAX_PLAIN_BYTES", 10_000)
    bomb = seal(b" " * 10_000_000, NODE.address, PASSWORD, scrypt_n=CHEAP)
    assert len(bomb) < 40_000
    assert outcome(bomb) == "the node export holds more than swarmrl reads"


def test_deep_nesting_is_one_sentence():
    assert isinstance(outcome(b"[" * 100_000 + b"]" * 100_000), str)
    assert isinstance(outcome(sealed({"a": 1})[:-2] + b"[" * 10_000), str)


@pytest.mark.parametrize("n", [1, 3, 2**19, 2**40])
def test_a_scrypt_cost_out_of_bounds_is_refused_before_the_kdf(n):
    envelope = parse_envelope(VALID)
    document = {**ENVELOPE, "kdf": {**ENVELOPE["kdf"], "n": n}}
    with pytest.raises(TransferError, match=r"^the file is not a node export .*\(kdf"):
        parse_envelope(json.dumps(document).encode())
    assert open_bundle(envelope, PASSWORD) == BUNDLE
