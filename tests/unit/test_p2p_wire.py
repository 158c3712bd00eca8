"""swarmrl.p2p.wire: varint frames with limits, strict parsing, protocol ids."""

from __future__ import annotations

import json

import pytest
import trio
from hypothesis import given, settings
from hypothesis import strategies as st

from benchmarks.hostile import MemoryStream
from swarmrl.p2p import wire
from swarmrl.p2p.wire import WireError
from swarmrl.weights import gossip
from swarmrl.weights.gossip import Advert, Holding
from swarmrl.weights.have import HAVE
from swarmrl.weights.manifest import MANIFEST, ManifestRequest
from swarmrl.weights.peer_records import Announcement, PeerRecord

HASH = "ab" * 32
ADDRESS = "0x" + "12" * 20
SIGNATURE = "cd" * 65


def read_frame(data: bytes, limit: int, chunk: int | None = None) -> bytes:
    return trio.run(wire.read_frame, MemoryStream(data, chunk), limit)


def one_sentence(e: pytest.ExceptionInfo[BaseException]) -> str:
    msg = str(e.value)
    assert msg
    assert "\n" not in msg
    assert "Traceback" not in msg
    return msg


# ---- varints and frames ------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "encoded"),
    [
        (0, "00"),
        (1, "01"),
        (127, "7f"),
        (128, "8001"),
        (300, "ac02"),
        (16383, "ff7f"),
        (16384, "808001"),
        (2**21, "80808001"),
        (2**35 - 1, "ffffffff7f"),
    ],
)
def test_varint_matches_unsigned_leb128(value, encoded):
    assert wire.encode_varint(value).hex() == encoded


def test_negative_varint_is_refused():
    with pytest.raises(ValueError, match="negative"):
        wire.encode_varint(-1)


@pytest.mark.parametrize(
    "length", [0, 1, 2, 127, 128, 129, 255, 256, 16383, 16384, 65536, 2**21 - 1, 2**21]
)
def test_frame_round_trips(length):
    body = bytes((i * 7 + 3) % 256 for i in range(min(length, 4096))) * (length // 4096 + 1)
    body = body[:length]

    async def main() -> tuple[bytes, bytes]:
        stream = MemoryStream()
        await wire.write_frame(stream, body)
        written = bytes(stream.written)
        # Small reads exercise the reassembly of both the length and the body.
        reader = MemoryStream(written, chunk=3 if length < 70000 else 65536)
        return written, await wire.read_frame(reader, limit=2**21)

    written, got = trio.run(main)
    assert written == wire.encode_varint(length) + body
    assert got == body


def test_frames_back_to_back_are_read_one_at_a_time():
    bodies = [b"", b"a", b"x" * 200, b"tail"]

    async def main() -> tuple[list[bytes], bytes]:
        stream = MemoryStream(b"".join(wire.frame(b) for b in bodies) + b"rest")
        out = [await wire.read_frame(stream, limit=1000) for _ in bodies]
        return out, bytes(stream.data)

    got, rest = trio.run(main)
    assert got == bodies
    assert rest == b"rest"  # nothing past the last frame was consumed


def test_frame_at_the_limit_is_accepted():
    assert read_frame(wire.frame(b"z" * 100), limit=100) == b"z" * 100
    assert read_frame(wire.frame(b""), limit=0) == b""


def test_frame_over_the_limit_is_refused_before_its_body_is_read():
    stream = MemoryStream(wire.frame(b"z" * 101))
    with pytest.raises(WireError) as e:
        trio.run(wire.read_frame, stream, 100)
    assert one_sentence(e) == "a 101-byte frame is over the 100-byte limit"
    assert len(stream.data) == 101  # the body was never read into memory


def test_huge_declared_length_is_refused_without_reading():
    stream = MemoryStream(bytes.fromhex("ffffffff7f"))  # 2**35 - 1, with no body at all
    with pytest.raises(WireError, match="over the 1024-byte limit"):
        trio.run(wire.read_frame, stream, 1024)


@pytest.mark.parametrize(
    ("data", "chunk"),
    [
        (b"", None),  # no length at all
        (b"\x80", None),  # the length stops after a continuation byte
        (b"\xff\xff", 1),
        (b"\x05abc", None),  # the body stops short
        (b"\x05abcd", 1),
        (wire.frame(b"q" * 300)[:-1], 7),
    ],
)
def test_truncated_streams_raise(data, chunk):
    with pytest.raises(WireError) as e:
        read_frame(data, limit=1000, chunk=chunk)
    assert one_sentence(e) == "the stream ended in the middle of a frame"


@pytest.mark.parametrize(
    "data",
    [
        b"\x80\x80\x80\x80\x80\x01",  # six bytes
        b"\xff\xff\xff\xff\xff\x00",
        b"\x81\x81\x81\x81\x81",  # five continuation bytes, then nothing
    ],
)
def test_over_long_varints_raise(data):
    with pytest.raises(WireError) as e:
        read_frame(data + b"body", limit=2**40)
    assert one_sentence(e) == "the frame length is not a valid varint"


@settings(max_examples=400)
@given(data=st.binary(max_size=64), limit=st.integers(0, 64), chunk=st.integers(1, 8))
def test_read_frame_fuzz_only_wire_error_or_a_bounded_body(data, limit, chunk):
    try:
        body = read_frame(data, limit, chunk)
    except WireError:
        return
    assert len(body) <= limit
    header = next(i for i, b in enumerate(data) if not b & 0x80) + 1
    assert header <= 5
    assert body == data[header : header + len(body)]


@settings(max_examples=200)
@given(body=st.binary(max_size=300), tail=st.binary(max_size=8))
def test_any_body_round_trips_whatever_follows(body, tail):
    assert read_frame(wire.frame(body) + tail, limit=300, chunk=5) == body


# ---- parse -------------------------------------------------------------------------


def announcement_dict(**changes: object) -> dict[str, object]:
    base: dict[str, object] = {
        "model": "org/model",
        "step": 3,
        "manifest_hash": HASH,
        "signer": ADDRESS,
        "signature": SIGNATURE,
    }
    base.update(changes)
    return base


def advert_dict(**changes: object) -> dict[str, object]:
    record = {"peer_id": "12D3KooWpeer", "account": ADDRESS, "issued_at": 5, "signature": SIGNATURE}
    base: dict[str, object] = {
        "record": record,
        "addrs": ["/ip4/127.0.0.1/tcp/4001"],
        "data": "127.0.0.1:9000",
        "holdings": [{"manifest_hash": HASH, "step": 3, "shards": "ff80"}],
    }
    base.update(changes)
    return base


def as_json(value: object) -> bytes:
    return json.dumps(value).encode()


def test_parse_reads_what_dump_writes():
    announcement = wire.parse(Announcement, as_json(announcement_dict()))
    assert announcement.step == 3
    assert wire.parse(Announcement, wire.dump(announcement)) == announcement

    advert = wire.parse(Advert, as_json(advert_dict()))
    assert advert.record == PeerRecord(
        peer_id="12D3KooWpeer", account=ADDRESS, issued_at=5, signature=SIGNATURE
    )
    assert advert.holdings == [Holding(manifest_hash=HASH, step=3, shards="ff80")]
    assert wire.parse(Advert, wire.dump(advert)) == advert
    assert wire.parse(Advert, b'{"data":"h:1"}') == Advert(data="h:1")
    assert wire.parse(ManifestRequest, b"{}").manifest_hash is None


@pytest.mark.parametrize(
    "body",
    [
        b"",
        b"\x00\x01\x02",
        b"\xff\xfe{}",
        b"not json",
        b"{",
        b'{"model": "a"',
        b"{}{}",
        b'{"step": 1,}',
        b'"\\ud800"',  # a lone surrogate
        b"[" * 100_000,
        b"{" * 100_000,
        b'{"a":' * 100_000,
        b'{"model": ' + b"[" * 100_000 + b"]" * 100_000 + b"}",
    ],
)
def test_parse_refuses_non_json(body):
    with pytest.raises(WireError) as e:
        wire.parse(Announcement, body)
    assert one_sentence(e).startswith("a Announcement must be JSON, got ")
    assert len(str(e.value)) < 200  # the peer's bytes are abbreviated, not echoed


@pytest.mark.parametrize(
    ("body", "where"),
    [
        (b"null", "the message"),
        (b"[]", "the message"),
        (b"17", "the message"),
        (b'"text"', "the message"),
        (as_json(announcement_dict(step="3")), "step"),
        (as_json(announcement_dict(step=3.0)), "step"),
        (as_json(announcement_dict(step=True)), "step"),
        (as_json(announcement_dict(step=-1)), "step"),
        (as_json(announcement_dict(step=2**64)), "step"),
        (b'{"step": 1e999999}', "model"),
        (as_json(announcement_dict(model="")), "model"),
        (as_json(announcement_dict(model=["org/model"])), "model"),
        (as_json(announcement_dict(manifest_hash="AB" * 32)), "manifest_hash"),
        (as_json(announcement_dict(manifest_hash=HASH + "00")), "manifest_hash"),
        (as_json(announcement_dict(signer="0x12")), "signer"),
        (as_json(announcement_dict(signature=SIGNATURE[:-2])), "signature"),
        (as_json(announcement_dict(extra=1)), "extra"),
        (as_json({k: v for k, v in announcement_dict().items() if k != "signer"}), "signer"),
    ],
)
def test_parse_names_what_is_wrong(body, where):
    with pytest.raises(WireError) as e:
        wire.parse(Announcement, body)
    assert one_sentence(e).startswith(f"invalid Announcement: {where}: ")


@pytest.mark.parametrize(
    ("changes", "where"),
    [
        ({"data": "h:"}, "data"),
        ({"data": 5}, "data"),
        ({"addrs": ["/ip4/1.2.3.4/tcp/1"] * 9}, "addrs"),
        ({"addrs": [""]}, "addrs.0"),
        ({"holdings": [{"manifest_hash": HASH, "step": 1, "shards": "f"}]}, "holdings.0.shards"),
        ({"holdings": [{"manifest_hash": HASH, "step": 1, "shards": "FF"}]}, "holdings.0.shards"),
        ({"holdings": [{"manifest_hash": HASH, "step": 1, "shards": "ff", "x": 1}]}, "holdings.0"),
        ({"holdings": [{"manifest_hash": HASH, "step": 1, "shards": ""}] * 9}, "holdings"),
        ({"record": {"peer_id": "p"}}, "record"),
        ({"record": "12D3KooW"}, "record"),
        ({"peers": ["/ip4/1.2.3.4/tcp/1"] * (gossip.MAX_EXCHANGED_PEERS + 1)}, "peers"),
        ({"peers": ["x" * 257]}, "peers.0"),
    ],
)
def test_parse_advert_names_the_nested_field(changes, where):
    with pytest.raises(WireError) as e:
        wire.parse(Advert, as_json(advert_dict(**changes)))
    assert one_sentence(e).startswith(f"invalid Advert: {where}")


def test_parse_bitfield_limit():
    huge = "ab" * (gossip.MAX_BITFIELD_HEX // 2 + 1)
    holdings = [{"manifest_hash": HASH, "step": 1, "shards": huge}]
    with pytest.raises(WireError, match=r"holdings\.0\.shards"):
        wire.parse(Advert, as_json(advert_dict(holdings=holdings)))


json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**70), 2**70)
    | st.floats(allow_nan=False)
    | st.text(max_size=20)
    | st.sampled_from([HASH, ADDRESS, SIGNATURE, "127.0.0.1:1"]),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=12), inner),
    max_leaves=8,
)
advert_keys = st.sampled_from(["record", "addrs", "data", "holdings", "peers", "shards"])
announcement_keys = st.sampled_from([*announcement_dict(), "extra"])


def parse_or_wire_error(model: type, body: bytes) -> None:
    try:
        parsed = wire.parse(model, body)
    except WireError as e:
        message = str(e)
    else:
        assert isinstance(parsed, model)
        assert wire.parse(model, wire.dump(parsed)) == parsed
        return
    assert message
    assert "\n" not in message


@settings(max_examples=300)
@given(body=st.binary(max_size=200))
def test_parse_fuzz_raw_bytes(body):
    parse_or_wire_error(Advert, body)
    parse_or_wire_error(Announcement, body)


@settings(max_examples=150)
@given(value=st.dictionaries(advert_keys, json_values, max_size=5))
def test_parse_advert_fuzz_structured(value):
    parse_or_wire_error(Advert, as_json(value))


@settings(max_examples=150)
@given(value=st.dictionaries(announcement_keys, json_values, max_size=6))
def test_parse_announcement_fuzz_structured(value):
    parse_or_wire_error(Announcement, as_json(value))


@settings(max_examples=300)
@given(position=st.integers(0, 10_000), byte=st.integers(0, 255), cut=st.booleans())
def test_parse_fuzz_mutated_valid_messages(position, byte, cut):
    for model, valid in ((Advert, advert_dict()), (Announcement, announcement_dict())):
        body = bytearray(as_json(valid))
        i = position % len(body)
        if cut:
            del body[i:]
        else:
            body[i] = byte
        parse_or_wire_error(model, bytes(body))


# ---- error replies and protocol ids ---------------------------------------------------


def test_parse_error_reads_the_sentence():
    assert wire.parse_error(wire.dump_json({"error": "no such checkpoint"}), "error") == (
        "no such checkpoint"
    )
    assert wire.parse_error(wire.dump_json({"error": "x" * 5000}), "error") == "x" * 1000


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (b"{", "the error reply is not JSON"),
        (b"[" * 100_000, "the error reply is not JSON"),
        (b'["error"]', "the error reply is malformed"),
        (b'{"error": 1}', "the error reply is malformed"),
        (b'{"error": "a", "more": "b"}', "the error reply is malformed"),
        (b'{"other": "a"}', "the error reply is malformed"),
    ],
)
def test_parse_error_refuses_malformed_replies(body, message):
    with pytest.raises(WireError) as e:
        wire.parse_error(body, "error")
    assert one_sentence(e) == message


def test_protocol_ids_are_versioned_under_one_prefix():
    assert wire.protocol_id("manifest") == "/swarmrl/manifest/1.0.0"
    assert wire.protocol_id("have", "2.1.0") == "/swarmrl/have/2.1.0"
    assert MANIFEST.id == "/swarmrl/manifest/1.0.0"
    assert HAVE.id == "/swarmrl/have/1.0.0"
    assert MANIFEST.id != HAVE.id
    assert gossip.checkpoints_topic("r1") == "swarmrl/r1/checkpoints"
    assert gossip.peers_topic("r1") == "swarmrl/r1/peers"


def test_dump_is_compact_json():
    body = wire.dump(ManifestRequest(manifest_hash=HASH))
    assert body == b'{"manifest_hash":"' + HASH.encode() + b'"}'
    assert wire.dump_json({"a": [1, 2]}) == b'{"a":[1,2]}'
