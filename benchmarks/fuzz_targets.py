"""The fuzz targets of the trust suite: every decoder of untrusted bytes, one registry.

A :class:`Target` is one decoder as a peer, a node or a file reaches it: the
wire codecs of every libp2p protocol (both sides), the framing and error
replies, the gossip messages, manifests, the data path's requests and answers,
shard bytes, weight deltas, TOPLOC proofs, rollout parquet files, every EIP-712
signed message, and keystores. Set up in a scratch folder, it is a
:class:`Session`: inputs (a hypothesis strategy that mostly damages valid
encodings, see :mod:`benchmarks.hostile`, so inputs get past the first length or
magic check), the decoder, the errors it refuses with, and a check of what it
accepts (a message that round-trips, the very records that were sealed, the one
signature of the one signer, the exact step a delta encodes).
:mod:`benchmarks.trust_fuzz` runs them.
"""

from __future__ import annotations

import contextlib
import json
import socket
import struct
import threading
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Generic, TypeVar

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import trio
from eth_account import Account
from eth_account.signers.local import LocalAccount
from eth_utils import keccak, to_checksum_address
from hypothesis import strategies as st

from benchmarks.hostile import (
    MemoryStream,
    bent_signature,
    hostile,
    malleable_twin,
    mutated_bytes,
    mutated_json,
)
from swarmrl import delta, keystore, shards, toploc
from swarmrl.eip712 import pool_domain, swarm_domain
from swarmrl.p2p import wire
from swarmrl.p2p.host import ERROR_KEY, error_frame
from swarmrl.p2p.protocol import Codec, RequestResponse, Upload
from swarmrl.rollouts.records import SIGNATURE_KEY, Rollout, read_rollout_file, write_rollouts
from swarmrl.rollouts.signing import FileSignature
from swarmrl.weights import datapath
from swarmrl.weights.dialback import DIALBACK, DialbackReply, DialbackRequest
from swarmrl.weights.gossip import MAX_ADVERT_BYTES, MAX_ANNOUNCEMENT_BYTES, Advert, Holding
from swarmrl.weights.have import HAVE, HaveRequest
from swarmrl.weights.manifest import MANIFEST, ManifestReply, ManifestRequest
from swarmrl.weights.peer_records import Announcement, PeerRecord, SignatureError, manifest_hash
from swarmrl.weights.store import WeightStore, bits
from swarmrl.work import WORK_PROTOCOL
from swarmrl.work.assign import WORK, Slot, WorkOrder, WorkRequest, WorkResponse
from swarmrl.work.heartbeat import HEARTBEAT, HeartbeatRequest, HeartbeatResponse, Outcome
from swarmrl.work.join import JOIN, JoinClaim, JoinResponse, NodeReport
from swarmrl.work.states import NodeState, SubmissionStatus
from swarmrl.work.submit import SUBMIT, Receipt, SubmitHeader, SubmitResponse

T = TypeVar("T")


class UnsoundError(AssertionError):
    """A decoder accepted an input and returned something it must not."""


def expect(condition: bool, failure: str) -> None:
    if not condition:
        raise UnsoundError(failure)


@dataclass(frozen=True)
class Session(Generic[T]):
    """One target, set up: its inputs, its decoder, and what it may answer.

    `decode` returns what the decoder made of an input or raises one of `refusals`
    (a sentence). `sound` checks a returned value against the input; it raises
    UnsoundError where the decoder accepted what it must not. `examples` run first,
    every time: regressions, inputs a decoder once got wrong. `seconds` and `memory`
    are what one input may cost where a decoder's documented cap allows more than
    the runner's defaults (a key file's kdf)."""

    inputs: st.SearchStrategy[T]
    decode: Callable[[T], Any]
    refusals: tuple[type[Exception], ...]
    sound: Callable[[T, Any], None] | None = None
    examples: tuple[T, ...] = ()
    seconds: float | None = None
    memory: int | None = None


@dataclass(frozen=True)
class Target:
    name: str
    what: str  # the decoder, and who hands it bytes
    session: Callable[[Path], AbstractContextManager[Session[Any]]]


TARGETS: dict[str, Target] = {}


def target(
    name: str, what: str
) -> Callable[[Callable[[Path], Iterator[Session[Any]]]], Callable[[Path], Iterator[Session[Any]]]]:
    """Registers a target: a generator that sets it up in a scratch folder, yields its
    session and cleans up after."""

    def register(
        setup: Callable[[Path], Iterator[Session[Any]]],
    ) -> Callable[[Path], Iterator[Session[Any]]]:
        TARGETS[name] = Target(name, what, contextmanager(setup))
        return setup

    return register


# ---- what the targets share -------------------------------------------------------------

# A key a peer may send that would forge a log line if an error quoted it raw.
FORGED_KEY = "forged\nERROR a log line"


def with_key(encoded: bytes, key: str) -> bytes:
    """A JSON object's encoding with `key` added."""
    return json.dumps({**json.loads(encoded), key: []}).encode()


KEY = Account.from_key(keccak(text="swarmrl fuzz signer"))
OTHER = Account.from_key(keccak(text="swarmrl fuzz stranger"))
POOL = "0xe7f1725E7734CE288F8367e1Bb143E90bb3F0512"
SWARM = swarm_domain(31337, POOL)
POOL_DOMAIN = pool_domain(31337, POOL)
RUN = "0x" + "5a" * 32
PEER = "12D3KooWD3eckifWpRn9wQpMG9R9hX3sD158z7EqHWmweQAJU5SA"


def _manifest_of(data: bytes, shard_size: int, step: int = 7) -> shards.Manifest:
    hashes = tuple(keccak(data[i : i + shard_size]).hex() for i in range(0, len(data), shard_size))
    return shards.Manifest(
        model="org/model",
        step=step,
        files=(shards.FileEntry(name="model.bin", size=len(data)),),
        shard_size=shard_size,
        shard_hashes=hashes,
        root=shards.merkle_root(hashes),
    )


MANIFEST_OF_3 = _manifest_of(bytes(range(256)) * 11, 1024)
ANNOUNCEMENT = Announcement.sign(KEY, MANIFEST_OF_3, SWARM)
RECORD = PeerRecord.sign(KEY, PEER, SWARM)
ADVERT = Advert(
    record=RECORD,
    addrs=[f"/ip4/127.0.0.1/tcp/4001/p2p/{PEER}"],
    data="127.0.0.1:9000",
    holdings=[Holding(manifest_hash=manifest_hash(MANIFEST_OF_3), step=7, shards="e0")],
    peers=[f"/ip4/10.0.0.2/tcp/4001/p2p/{PEER}"],
)
REPORT = NodeReport(
    backend="torch",
    device="cpu",
    cpu_cores=8,
    gpu=None,
    gpu_memory_gib=None,
    version="swarmrl 0",
    protocol=WORK_PROTOCOL,
)
CLAIM = JoinClaim(
    node=KEY.address, provider=OTHER.address, peer_id=PEER, report=REPORT, issued_at=1_700_000_000
).signed_by(KEY, SWARM)
ORDER = WorkOrder(
    run=RUN,
    node=OTHER.address,
    counter=3,
    min_step=5,
    seed=2**64 - 2,
    group_size=4,
    max_tokens=128,
    temperature=0.7,
    top_p=0.95,
    tasks=[Slot(problem_id="arith-1", budget=64), Slot(problem_id="arith-2", budget=128)],
    deadline=1_700_000_300,
).signed_by(KEY, SWARM)
RECEIPT = Receipt(
    run=RUN, node=OTHER.address, submission="ab" * 32, epoch=2, units=8, reason=""
).signed_by(KEY, SWARM)
HEADER = SubmitHeader(
    order_id="cd" * 32,
    node=KEY.address,
    step=6,
    file_sha256="ef" * 32,
    size=12_345,
    signature="0" * 130,
).signed_by(KEY, RUN, POOL_DOMAIN)
FILE_DIGEST = keccak(text="a rollout file")
FILE_SIGNATURE = FileSignature.sign(
    KEY,
    SWARM,
    FILE_DIGEST,
    run=RUN,
    step=6,
    group_size=4,
    max_tokens=128,
    temperature=0.7,
    top_p=0.95,
)

# Every request-response and upload protocol, with a valid message of each side.
PROTOCOLS: dict[str, tuple[RequestResponse[Any, Any] | Upload[Any, Any], Any, Any]] = {
    "join": (
        JOIN,
        CLAIM,
        JoinResponse(
            run=RUN,
            protocol=WORK_PROTOCOL,
            state=NodeState.ACTIVE,
            heartbeat_seconds=30.0,
            policy_step=5,
            weights=[f"/ip4/127.0.0.1/tcp/4001/p2p/{PEER}"],
        ),
    ),
    "heartbeat": (
        HEARTBEAT,
        HeartbeatRequest(policy_step=5, tokens_per_second=12.5, paused=False, leaving=False),
        HeartbeatResponse(
            state=NodeState.ACTIVE,
            policy_step=6,
            epoch=2,
            outcomes=[
                Outcome(digest="ab" * 32, status=SubmissionStatus.REJECTED, units=0, reason="no")
            ],
        ),
    ),
    "work": (WORK, WorkRequest(), WorkResponse(order=ORDER, retry_after=0.0, reason="")),
    "submit": (SUBMIT, HEADER, SubmitResponse(receipt=RECEIPT)),
    "have": (HAVE, HaveRequest(advert=ADVERT), ADVERT),
    "dialback": (
        DIALBACK,
        DialbackRequest(port=9000, nonce="12" * 32),
        DialbackReply(reached=True, endpoint="127.0.0.1:9000"),
    ),
    "manifest": (
        MANIFEST,
        ManifestRequest(manifest_hash=manifest_hash(MANIFEST_OF_3)),
        ManifestReply(ANNOUNCEMENT, MANIFEST_OF_3),
    ),
}


def _frames(valid: list[bytes]) -> st.SearchStrategy[tuple[bytes, ...]]:
    """`valid` frames with one of them hostile."""

    def damage(at: int) -> st.SearchStrategy[tuple[bytes, ...]]:
        return hostile(valid[at]).map(lambda f: (*valid[:at], f, *valid[at + 1 :]))

    return st.one_of(*(damage(at) for at in range(len(valid))))


def _codec_target(protocol: str, side: str, codec: Codec[Any], message: Any) -> None:
    def setup(workdir: Path) -> Iterator[Session[tuple[bytes, ...]]]:
        def survives_its_codec(frames: tuple[bytes, ...], decoded: Any) -> None:
            expect(codec.decode(codec.encode(decoded)) == decoded, "it does not round-trip")

        valid = codec.encode(message)
        yield Session(
            _frames(valid),
            lambda f: codec.decode(list(f)),
            (wire.WireError,),
            survives_its_codec,
            # Once refused in a sentence that quoted the key raw: two log lines.
            examples=tuple(
                (*valid[:at], with_key(f, FORGED_KEY), *valid[at + 1 :])
                for at, f in enumerate(valid)
            ),
        )

    target(f"{protocol}/{side}", f"the {side} codec of /swarmrl/{protocol}: what a peer sends")(
        setup
    )


for _protocol, (_spec, _asked, _answered) in PROTOCOLS.items():
    if isinstance(_spec, Upload):
        _codec_target(_protocol, "header", _spec.header, _asked)
    else:
        _codec_target(_protocol, "request", _spec.request, _asked)
    _codec_target(_protocol, "response", _spec.response, _answered)


# ---- framing and error replies ----------------------------------------------------------


@target("frame", "wire.read_frame: the length prefix and body of every libp2p message")
def _frame(workdir: Path) -> Iterator[Session[tuple[bytes, int | None, int]]]:
    claims = st.builds(
        lambda n, tail: wire.encode_varint(n) + tail,
        st.integers(0, 2**40) | st.sampled_from([2**31, 2**32, 2**35 - 1, 2**35]),
        st.binary(max_size=64),
    )
    endless = st.binary(min_size=1, max_size=8).map(lambda b: bytes(x | 0x80 for x in b))
    data = st.one_of(hostile(wire.frame(b'{"a":1}' * 20)), claims, endless)
    limits = st.sampled_from([0, 1, 255, 1024, 64 * 1024, 2**35])

    def decode(value: tuple[bytes, int | None, int]) -> tuple[bytes, int]:
        raw, chunk, limit = value
        stream = MemoryStream(raw, chunk)
        body = trio.run(wire.read_frame, stream, limit)
        return body, len(raw) - len(stream.data)

    def sound(value: tuple[bytes, int | None, int], decoded: tuple[bytes, int]) -> None:
        raw, _, limit = value
        body, consumed = decoded
        expect(len(body) <= limit, f"a {len(body)}-byte body passed a {limit}-byte limit")
        expect(consumed - len(body) <= 5, "it read past the frame")
        expect(raw[consumed - len(body) : consumed] == body, "the body is not the frame's")

    yield Session(
        st.tuples(data, st.none() | st.integers(1, 16), limits), decode, (wire.WireError,), sound
    )


@target("error-reply", "wire.parse_error: the error reply a peer sends instead of an answer")
def _error_reply(workdir: Path) -> Iterator[Session[bytes]]:
    def sound(raw: bytes, sentence: Any) -> None:
        expect(isinstance(sentence, str) and len(sentence) <= 1000, "not a bounded sentence")

    yield Session(
        hostile(error_frame("the peer does not hold that checkpoint")),
        lambda raw: wire.parse_error(raw, ERROR_KEY),
        (wire.WireError,),
        sound,
    )


def expect_round_trip(model: type[Any], message: Any) -> None:
    expect(wire.parse(model, wire.dump(message)) == message, "it does not round-trip")


# ---- gossip and manifests -----------------------------------------------------------------


@target("gossip/announcement", "a checkpoint announcement on swarmrl/<run>/checkpoints")
def _announcement(workdir: Path) -> Iterator[Session[bytes]]:
    def decode(raw: bytes) -> Announcement:
        if len(raw) > MAX_ANNOUNCEMENT_BYTES:
            raise wire.WireError("the announcement is over the limit")
        announcement = wire.parse(Announcement, raw)
        announcement.verify(SWARM, frozenset({KEY.address}))
        return announcement

    def sound(raw: bytes, announcement: Any) -> None:
        # An address is the same in any case (the signed data holds its bytes).
        signed = announcement.model_copy(
            update={"signer": to_checksum_address(announcement.signer)}
        )
        expect(signed == ANNOUNCEMENT, "an announcement nobody signed was accepted")
        expect_round_trip(Announcement, announcement)

    lowercase = ANNOUNCEMENT.model_copy(update={"signer": ANNOUNCEMENT.signer.lower()})
    yield Session(
        hostile(wire.dump(ANNOUNCEMENT)),
        decode,
        (ValueError,),
        sound,
        examples=(wire.dump(lowercase),),  # the long run's first finding: any case passes
    )


@target("gossip/advert", "a peer's advert on swarmrl/<run>/peers and /swarmrl/have")
def _advert(workdir: Path) -> Iterator[Session[bytes]]:
    def decode(raw: bytes) -> Advert:
        # What the advertiser takes from an advert: the record's account, the data
        # endpoint, the holdings' bitfields.
        if len(raw) > MAX_ADVERT_BYTES:
            raise wire.WireError("the advert is over the limit")
        advert = wire.parse(Advert, raw)
        if advert.record is not None:
            advert.record.verify(SWARM, PEER)
        if advert.data is not None:
            datapath.Endpoint.parse(advert.data)
        for h in advert.holdings:
            bits(bytes.fromhex(h.shards), len(h.shards) * 4)
        return advert

    def sound(raw: bytes, advert: Any) -> None:
        record = advert.record and advert.record.model_copy(
            update={"account": to_checksum_address(advert.record.account)}
        )
        expect(record in (None, RECORD), "a peer record nobody signed was accepted")
        expect_round_trip(Advert, advert)

    assert ADVERT.record is not None
    lowercase = ADVERT.model_copy(
        update={"record": ADVERT.record.model_copy(update={"account": KEY.address.lower()})}
    )
    yield Session(
        hostile(wire.dump(ADVERT)), decode, (ValueError,), sound, examples=(wire.dump(lowercase),)
    )


@target("manifest", "Manifest.from_json: a manifest's canonical bytes, from a peer or a store")
def _manifest(workdir: Path) -> Iterator[Session[bytes]]:
    def sound(raw: bytes, manifest: Any) -> None:
        expect(manifest.to_json() == raw, "a manifest not in its one canonical form")

    valid = MANIFEST_OF_3.to_json()
    yield Session(
        hostile(valid),
        shards.Manifest.from_json,
        (ValueError,),
        sound,
        # Once refused in a sentence that quoted the key raw: two log lines.
        examples=(with_key(valid, FORGED_KEY),),
    )


# ---- the data path and shard bytes ---------------------------------------------------------

_REQUEST = struct.Struct("!4s32sI")
_RESPONSE = struct.Struct("!BQ")


class _ScriptedPeer:
    """A data endpoint on loopback that answers each connection's first request with
    whatever `answer` holds, then closes it."""

    def __init__(self) -> None:
        self.answer = b""
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.endpoint = datapath.Endpoint("127.0.0.1", self._listener.getsockname()[1])
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self._listener.accept()
            except OSError:
                return  # closed
            with conn, contextlib.suppress(OSError):
                conn.settimeout(30)
                request = b""
                while len(request) < _REQUEST.size and (
                    chunk := conn.recv(_REQUEST.size - len(request))
                ):
                    request += chunk
                conn.sendall(self.answer)
                conn.shutdown(socket.SHUT_WR)

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self._listener.shutdown(socket.SHUT_RDWR)
        self._listener.close()
        self._thread.join(timeout=5)


@target("datapath/answer", "ShardClient.fetch: a peer's answer to a shard request, over TCP")
def _datapath_answer(workdir: Path) -> Iterator[Session[bytes]]:
    shard = bytes(range(256)) * 4
    valid = _RESPONSE.pack(datapath.OK, len(shard)) + shard
    headers = st.builds(
        _RESPONSE.pack,
        st.integers(0, 255) | st.sampled_from(sorted(datapath.STATUS_TEXT)),
        st.integers(0, 2**64 - 1) | st.sampled_from([0, len(shard) - 1, len(shard), 2**40]),
    )
    inputs = st.one_of(
        hostile(valid),
        st.builds(bytes.__add__, headers, st.binary(max_size=64) | st.just(shard)),
    )
    peer = _ScriptedPeer()
    buffer = bytearray(len(shard))

    def decode(answer: bytes) -> bytes:
        peer.answer = answer
        client = datapath.ShardClient(peer.endpoint, timeout=30)
        try:
            return bytes(client.fetch("ab" * 32, 3, len(shard), buffer))
        finally:
            client.close()

    def sound(answer: bytes, got: Any) -> None:
        expect(answer[: _RESPONSE.size] == valid[: _RESPONSE.size], "a shard under a bad header")
        expect(got == answer[_RESPONSE.size : _RESPONSE.size + len(shard)], "not the bytes sent")

    try:
        yield Session(inputs, decode, (datapath.DataPathError,), sound)
    finally:
        peer.close()


@target("datapath/request", "ShardServer: a peer's shard requests on the data path, over TCP")
def _datapath_request(workdir: Path) -> Iterator[Session[bytes]]:
    data = np.random.default_rng(1).bytes(5 * 1024 + 321)
    path = workdir / "model.bin"
    path.write_bytes(data)
    manifest = shards.build_manifest(path, model="org/model", step=3, shard_size=1024)
    store = WeightStore(workdir / "store")
    version = store.add_origin(path, manifest, Announcement.sign(KEY, manifest, SWARM))
    known = bytes.fromhex(version.manifest_hash)
    # Generous deadlines: on a loaded machine a slow answer must not pass for a wrong one.
    server = datapath.ShardServer(store.get, host="127.0.0.1", idle_timeout=30, io_timeout=30)
    count = manifest.shard_count

    def expected(raw: bytes) -> bytes:
        """What an honest server answers `raw` with, request by request."""
        out = b""
        for at in range(0, len(raw) - _REQUEST.size + 1, _REQUEST.size):
            magic, mhash, index = _REQUEST.unpack(raw[at : at + _REQUEST.size])
            if magic == datapath.PROBE_MAGIC:  # no probe is armed
                return out + _RESPONSE.pack(datapath.UNKNOWN_VERSION, 0)
            if magic != datapath.MAGIC:
                return out + _RESPONSE.pack(datapath.BAD_REQUEST, 0)
            if mhash != known:
                out += _RESPONSE.pack(datapath.UNKNOWN_VERSION, 0)
            elif index >= count:
                out += _RESPONSE.pack(datapath.NOT_HELD, 0)
            else:
                offset, length = shards.shard_range(manifest, index)
                out += _RESPONSE.pack(datapath.OK, length) + data[offset : offset + length]
        return out

    request = st.builds(
        _REQUEST.pack,
        st.sampled_from([datapath.MAGIC, datapath.PROBE_MAGIC, b"SRL2", bytes(4)]),
        st.sampled_from([known, bytes(32)]) | st.binary(min_size=32, max_size=32),
        st.integers(0, count) | st.integers(0, 2**32 - 1),
    )
    valid = _REQUEST.pack(datapath.MAGIC, known, 2)
    inputs = st.one_of(
        hostile(valid),
        st.builds(
            bytes.__add__,
            st.lists(request, min_size=1, max_size=3).map(b"".join),
            st.just(b"") | st.binary(max_size=_REQUEST.size - 1),
        ),
    )

    def decode(raw: bytes) -> tuple[bytes, bool]:
        answer, reset = b"", False
        with socket.create_connection(
            (server.endpoint.host, server.endpoint.port), timeout=30
        ) as conn:
            try:
                conn.sendall(raw)
                conn.shutdown(socket.SHUT_WR)
                while chunk := conn.recv(65536):
                    answer += chunk
            except OSError:
                # The server hung up on a request it refused while more was on the way
                # (a reset may also drop the refusal it had sent).
                reset = True
        return answer, reset

    def sound(raw: bytes, decoded: Any) -> None:
        answer, reset = decoded
        honest = expected(raw)
        expect(
            answer == honest or (reset and honest.startswith(answer)),
            f"answered {answer[:24]!r} where an honest server answers {honest[:24]!r}",
        )

    try:
        yield Session(inputs, decode, (), sound)
    finally:
        server.close()
        version.close()


@target("shard", "shards.verify_shard: shard bytes a peer sent, checked before they are kept")
def _shard(workdir: Path) -> Iterator[Session[tuple[int, bytes]]]:
    data = np.random.default_rng(2).bytes(3 * 1024 + 100)
    path = workdir / "model.bin"
    path.write_bytes(data)
    manifest = shards.build_manifest(path, model="org/model", step=1, shard_size=1024)
    count = manifest.shard_count

    def shard(index: int) -> bytes:
        offset, length = shards.shard_range(manifest, index)
        return data[offset : offset + length]

    def damaged(index: int) -> st.SearchStrategy[tuple[int, bytes]]:
        claimed = st.integers(-2, count + 2) | st.just(index)
        return st.tuples(claimed, hostile(shard(index)) | st.just(shard(index)))

    def decode(value: tuple[int, bytes]) -> None:
        index, body = value
        shards.verify_shard(manifest, index, body, threads=1)

    def sound(value: tuple[int, bytes], _: Any) -> None:
        index, body = value
        expect(0 <= index < count and body == shard(index), "a shard that is not the manifest's")

    yield Session(st.integers(0, count - 1).flatmap(damaged), decode, (ValueError,), sound)


# ---- weight deltas ------------------------------------------------------------------------

DELTA_PREAMBLE = 20  # a delta's magic, format version and header length
PREVIOUS_STEP = b"the previous step"  # what the output holds before a delta is applied


@dataclass(frozen=True)
class SmallDelta:
    """A small model's step as a delta over its base, in `folder`, and the delta's two
    readers run on other bytes in its place. The delta targets and
    tests/unit/test_delta_fuzz.py both fuzz through these."""

    folder: Path
    base: Path
    target: bytes  # the step the delta rebuilds
    valid: bytes  # the delta

    @property
    def header_end(self) -> int:
        # The header's length: the u64 after the 8-byte magic and the u32 version.
        return DELTA_PREAMBLE + int.from_bytes(self.valid[12:DELTA_PREAMBLE], "little")

    def apply(self, data: bytes) -> bytes:
        """Applies `data` as the delta over an output holding PREVIOUS_STEP: the bytes
        rebuilt, or apply's refusal, raised again once checked to have left the output
        as it was. Either way no temporary file may stay behind."""
        fuzzed = self.folder / "fuzzed.delta"
        fuzzed.write_bytes(data)
        out = self.folder / "out.safetensors"
        out.write_bytes(PREVIOUS_STEP)
        before = sorted(self.folder.iterdir())
        refusal: ValueError | OSError | None = None
        try:
            delta.apply(self.base, fuzzed, out, threads=1)
        except (ValueError, OSError) as e:
            refusal = e
        expect(sorted(self.folder.iterdir()) == before, "apply left a temporary file behind")
        if refusal is not None:
            expect(out.read_bytes() == PREVIOUS_STEP, "a refused delta changed the output")
            raise refusal
        return out.read_bytes()

    def inspect(self, data: bytes) -> delta.DeltaInfo:
        fuzzed = self.folder / "fuzzed.delta"
        fuzzed.write_bytes(data)
        return delta.inspect(fuzzed)


def small_delta(folder: Path) -> SmallDelta:
    """A small model in bf16 and fp32, a step of it and the delta between them, in
    `folder`: both encodings and a few records, small enough that applying a damaged
    copy takes a millisecond."""
    # Imported here, not with the module: torch takes seconds to import, and only the
    # delta targets need it, to write the two safetensors files.
    import torch
    from safetensors.torch import save_file

    noise = torch.Generator().manual_seed(0)
    base = {
        "embed": torch.randn(64, 32, generator=noise).to(torch.bfloat16),
        "proj": torch.randn(32, 32, generator=noise),
        "norm": torch.ones(32, dtype=torch.bfloat16),
    }
    target = dict(base)
    target["embed"] = base["embed"].clone()
    target["embed"][3, :4] += 1  # a few elements: sparse
    target["proj"] = base["proj"] + 0.1 * torch.randn(32, 32, generator=noise)  # all: xor
    save_file(base, folder / "base.safetensors")
    save_file(target, folder / "target.safetensors")
    step = folder / "step.delta"
    delta.encode(folder / "base.safetensors", folder / "target.safetensors", step)
    valid = step.read_bytes()
    step.unlink()
    return SmallDelta(
        folder, folder / "base.safetensors", (folder / "target.safetensors").read_bytes(), valid
    )


def reframed(header: bytes, rest: bytes) -> bytes:
    """A delta of `header` with a preamble that states its length truly, so a damaged
    header is read as JSON rather than refused by its length."""
    return delta.MAGIC + struct.pack("<IQ", delta.FORMAT_VERSION, len(header)) + header + rest


@st.composite
def damaged_delta_header(draw: st.DrawFn, case: SmallDelta) -> bytes:
    header = draw(mutated_json(case.valid[DELTA_PREAMBLE : case.header_end]))
    return reframed(header, case.valid[case.header_end :])


@st.composite
def damaged_delta_payloads(draw: st.DrawFn, case: SmallDelta) -> bytes:
    return case.valid[: case.header_end] + draw(mutated_bytes(case.valid[case.header_end :]))


def random_delta() -> st.SearchStrategy[bytes]:
    """Random bytes, bare or behind a delta's true preamble."""
    return st.builds(
        lambda body, framed: reframed(body, b"") if framed else body,
        st.binary(max_size=600),
        st.booleans(),
    )


def damaged_deltas(case: SmallDelta) -> st.SearchStrategy[bytes]:
    """The delta intact, damaged by byte, by header field or in its payloads, or random."""
    return st.one_of(
        st.just(case.valid),
        mutated_bytes(case.valid),
        damaged_delta_header(case),
        damaged_delta_payloads(case),
        random_delta(),
    )


@target("delta/apply", "delta.apply: a weight delta a peer sent, applied onto the base")
def _delta_apply(workdir: Path) -> Iterator[Session[bytes]]:
    case = small_delta(workdir)

    def sound(data: bytes, rebuilt: Any) -> None:
        expect(rebuilt == case.target, "a delta rebuilt a file that is not its target")

    yield Session(damaged_deltas(case), case.apply, (ValueError, OSError), sound)


@target("delta/inspect", "delta.inspect: a weight delta a peer sent, read without its base")
def _delta_inspect(workdir: Path) -> Iterator[Session[bytes]]:
    case = small_delta(workdir)

    def sound(data: bytes, info: Any) -> None:
        expect(info.delta_size == len(data), "a delta read with the wrong size")

    yield Session(damaged_deltas(case), case.inspect, (ValueError,), sound)


# ---- TOPLOC proofs ------------------------------------------------------------------------


@target("toploc/proofs", "toploc.verify_proofs: a rollout's proofs, checked by a validator")
def _toploc(workdir: Path) -> Iterator[Session[list[bytes | None]]]:
    chunk, topk = 32, 128
    floats = np.random.default_rng(3).standard_normal((2 * chunk, 256)).astype(np.float32)
    acts = (floats.view(np.uint32) >> 16).astype(np.uint16)  # bf16 bits, truncated
    valid = toploc.build_proofs(acts, chunk, topk, threads=1)
    proof = st.one_of(
        st.none(), st.sampled_from(valid), *(hostile(p) for p in valid), st.binary(max_size=300)
    )
    inputs = st.one_of(
        st.tuples(proof, proof).map(list), st.lists(proof, max_size=4), st.just(list(valid))
    )

    def sound(proofs: list[bytes | None], verdicts: Any) -> None:
        expect(
            len(proofs) == len(valid), f"{len(proofs)} proofs were taken for {len(valid)} chunks"
        )
        for p, honest, verdict in zip(proofs, valid, verdicts, strict=True):
            if p == honest:
                expect(verdict.accepted, "an honest proof was rejected")
            elif p is None or len(p) != toploc.proof_size(topk):
                expect(
                    not verdict.accepted and verdict.exp_mismatches == topk,
                    "a missing or misshapen proof was not rejected outright",
                )

    yield Session(
        inputs,
        lambda proofs: toploc.verify_proofs(acts, proofs, chunk, topk, threads=1),
        (ValueError,),
        sound,
    )


# ---- rollout files ------------------------------------------------------------------------


def sealed_record(sample: int = 0, **changes: Any) -> Rollout:
    """A sound rollout record, sealed with its digest; `changes` replace fields."""
    fields = {
        "run": "fuzz",
        "policy_step": 7,
        "node": "0x" + "cd" * 20,
        "problem_id": "arith-0-3",
        "task_type": "math",
        "prompt": "What is 3 + 4?",
        "verification_info": '{"ground_truth":"7"}',
        "seed": 2**63 + 1,
        "sample": sample,
        "temperature": 0.7,
        "top_p": 0.9,
        "max_tokens": 16,
        "target_len": 8,
        "prompt_ids": [1, 2, 3, 4],
        "output_ids": [5, 6, 7],
        "logprobs": [-0.5, -0.25, -2.0],
        "finish_reason": "eos",
        "task_reward": 1.0,
        "length_penalty": 0.0015,
        "reward": 0.9985,
        "proofs": [bytes(range(256)) + b"\x01\x02"],
    }
    return Rollout(**{**fields, **changes}).sealed()


SEALED = [sealed_record(0), sealed_record(1, output_ids=[9], logprobs=[-0.1], proofs=[])]


def arrow_values(column: Any) -> st.SearchStrategy[Any]:
    """Any value of an arrow column's type (a pyarrow Field), nulls included."""
    kind = column.type
    if pa.types.is_list(kind):
        return st.none() | st.lists(arrow_values(pa.field("item", kind.value_type)), max_size=6)
    if pa.types.is_string(kind):
        return st.none() | st.text(max_size=80) | st.sampled_from(["", "math", "eos", "0x"])
    if pa.types.is_fixed_size_binary(kind):
        return st.none() | st.binary(min_size=kind.byte_width, max_size=kind.byte_width)
    if pa.types.is_binary(kind):
        return st.none() | st.binary(max_size=300)
    if pa.types.is_unsigned_integer(kind):
        return st.none() | st.integers(0, 2**64 - 1)
    if pa.types.is_integer(kind):
        return st.none() | st.integers(-(2**63), 2**63 - 1)
    if pa.types.is_floating(kind):
        return st.none() | st.floats(allow_nan=True, allow_infinity=True)
    raise TypeError(f"no values for arrow column type {kind}")


def _parquet(rows: list[dict[str, Any]], schema: Any) -> bytes:
    sink = pa.BufferOutputStream()
    pq.write_table(pa.Table.from_pylist(rows, schema=schema), sink)
    return bytes(sink.getvalue().to_pybytes())


@target("rollouts/parquet", "read_rollout_file: a node's rollout file, at intake and validation")
def _rollouts(workdir: Path) -> Iterator[Session[bytes]]:
    path = workdir / "rollouts.parquet"
    write_rollouts(SEALED, path, FILE_SIGNATURE)
    valid = path.read_bytes()
    schema = pq.read_schema(path)
    rows = [r.model_dump() for r in SEALED]

    @st.composite
    def one_field_changed(draw: st.DrawFn) -> bytes:
        column = draw(st.sampled_from(list(schema)))
        changed = [dict(r) for r in rows]
        changed[draw(st.integers(0, len(rows) - 1))][column.name] = draw(arrow_values(column))
        return _parquet(changed, schema)

    random_rows = st.lists(
        st.fixed_dictionaries({c.name: arrow_values(c) for c in schema}), min_size=1, max_size=3
    ).map(lambda r: _parquet(r, schema))

    def signed(block: bytes) -> bytes:
        return _parquet(rows, schema.with_metadata({**schema.metadata, SIGNATURE_KEY: block}))

    def with_column(name: str) -> bytes:
        """The records with one more column, named `name`."""
        return _parquet(
            [{**r, name: None} for r in rows], schema.append(pa.field(name, pa.string()))
        )

    block = schema.metadata[SIGNATURE_KEY]
    signature_block = st.one_of(
        st.binary(max_size=600), st.text(max_size=300).map(str.encode), hostile(block)
    ).map(signed)
    extra_column = (st.text(max_size=40) | st.just(FORGED_KEY)).filter(
        lambda name: name not in schema.names
    )
    inputs = st.one_of(
        st.binary(max_size=4096),
        st.binary(max_size=4096).map(lambda b: b"PAR1" + b + b"PAR1"),
        st.integers(0, len(valid) - 1).map(lambda keep: valid[:keep]),
        mutated_bytes(valid),
        random_rows,
        one_field_changed(),
        signature_block,
        extra_column.map(with_column),
    )

    def decode(raw: bytes) -> Any:
        path.write_bytes(raw)
        return read_rollout_file(path)

    def sound(raw: bytes, read: Any) -> None:
        expect(read.rollouts == SEALED, "records nobody sealed were read")

    # Once refused in sentences that quoted a column's or a key's name raw.
    regressions = (with_column(FORGED_KEY), signed(with_key(block, FORGED_KEY)))
    yield Session(inputs, decode, (ValueError,), sound, examples=regressions)


# ---- EIP-712 signed messages ------------------------------------------------------------


@dataclass(frozen=True)
class SignedKind:
    """A signed message as its receiver checks it."""

    model: type[Any]
    message: Any
    digest: Callable[[Any], bytes]
    signer: Callable[[Any], str | None]  # the recovered signer, None if malformed


SIGNED: dict[str, SignedKind] = {
    "join-claim": SignedKind(
        JoinClaim, CLAIM, lambda m: m.digest(SWARM), lambda m: m.signer(SWARM)
    ),
    "work-order": SignedKind(
        WorkOrder, ORDER, lambda m: m.digest(SWARM), lambda m: m.signer(SWARM)
    ),
    "receipt": SignedKind(Receipt, RECEIPT, lambda m: m.digest(SWARM), lambda m: m.signer(SWARM)),
    "submission": SignedKind(
        SubmitHeader,
        HEADER,
        lambda m: m.digest(RUN, POOL_DOMAIN),
        lambda m: m.signer(RUN, POOL_DOMAIN),
    ),
    "rollout-file": SignedKind(
        FileSignature,
        FILE_SIGNATURE,
        lambda m: m.digest(SWARM, FILE_DIGEST),
        lambda m: m.signer(SWARM, FILE_DIGEST),
    ),
    "peer-record": SignedKind(
        PeerRecord,
        RECORD,
        lambda m: PeerRecord.STRUCT.digest(SWARM, dict(m)),
        lambda m: m.verify(SWARM, m.peer_id),
    ),
    "checkpoint": SignedKind(
        Announcement,
        ANNOUNCEMENT,
        lambda m: Announcement.STRUCT.digest(SWARM, dict(m)),
        lambda m: m.verify(SWARM, frozenset({KEY.address})) or m.signer,
    ),
}


def with_signature(message: Any, signature: bytes) -> bytes:
    """`message` as JSON with its signature field replaced."""
    document = json.loads(wire.dump(message))
    document["signature"] = signature.hex()
    return json.dumps(document).encode()


def _signed_target(name: str, kind: SignedKind) -> None:
    original_digest = kind.digest(kind.message)
    original = bytes.fromhex(kind.message.signature)

    def setup(workdir: Path) -> Iterator[Session[bytes]]:
        def decode(raw: bytes) -> Any:
            message = wire.parse(kind.model, raw)
            signer = kind.signer(message)
            if signer is None or to_checksum_address(signer) != KEY.address:
                raise SignatureError(f"the {name} is not signed by the expected key")
            return message

        def sound(raw: bytes, message: Any) -> None:
            expect(
                kind.digest(message) == original_digest and message.signature == original.hex(),
                "a signature was taken as the signer's for another message or in another "
                "form (one the contracts refuse, or a second one for the same message)",
            )

        yield Session(
            st.one_of(
                hostile(wire.dump(kind.message)),
                bent_signature(original).map(lambda s: with_signature(kind.message, s)),
            ),
            decode,
            (ValueError,),
            sound,
            # Once accepted as the signer's: the high-s twin, and v as 0/1.
            examples=(
                with_signature(kind.message, malleable_twin(original)),
                with_signature(kind.message, original[:64] + bytes([original[64] - 27])),
            ),
        )

    target(f"signature/{name}", f"{kind.model.__name__}: its EIP-712 signature, recovered")(setup)


for _name, _kind in SIGNED.items():
    _signed_target(_name, _kind)


# ---- keystores ----------------------------------------------------------------------------

KEYSTORE_KEY = bytes.fromhex("4c0883a69102937d6231471b5dbb6204fe5129617082792ae468d01a3f362318")
KEYSTORE_PASSWORD = "pw"
# Cheap bases: eth-account's layout with the smallest costs, so that mutations that
# keep a keystore valid unlock in microseconds.
KEYSTORE_BASES: list[dict[str, Any]] = [
    Account.encrypt(KEYSTORE_KEY, KEYSTORE_PASSWORD, kdf="scrypt", iterations=2),
    Account.encrypt(KEYSTORE_KEY, KEYSTORE_PASSWORD, kdf="pbkdf2", iterations=1),
]

_keystore_scalars = (
    st.none()
    | st.booleans()
    | st.integers()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=80)
    | st.text("0123456789abcdefx", max_size=80)
)
keystore_json: st.SearchStrategy[Any] = st.recursive(
    _keystore_scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=12), inner),
    max_leaves=12,
)


def field_paths(document: dict[str, Any], prefix: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    """The path of every field, nested ones included."""
    found = []
    for key, value in document.items():
        found.append((*prefix, key))
        if isinstance(value, dict):
            found.extend(field_paths(value, (*prefix, key)))
    return found


def mutate_keystore(
    document: dict[str, Any], path: tuple[str, ...], action: str, value: Any
) -> None:
    """Sets, deletes, renames (upper case) or shadows (an upper-case copy) one field."""
    section: Any = document
    for key in path[:-1]:
        section = section.get(key)
        if not isinstance(section, dict):
            return  # an earlier mutation replaced this section
    last = path[-1]
    if last not in section:
        return
    if action == "delete":
        del section[last]
    elif action == "rename":
        section[last.upper()] = section.pop(last)
    elif action == "copy-upper":
        section[last.upper()] = value
    else:
        section[last] = value


keystore_mutations = st.tuples(
    st.sampled_from(sorted({p for base in KEYSTORE_BASES for p in field_paths(base)})),
    st.sampled_from(["set", "delete", "rename", "copy-upper"]),
    keystore_json
    | st.integers(min_value=0, max_value=2**64)
    | st.sampled_from([0, 1, 2, 2**10, 2**18, 2**21, 2**22, 2**64, -1, True, "", "0x"]),
)


@st.composite
def mutated_keystore(draw: st.DrawFn) -> bytes:
    document = json.loads(json.dumps(draw(st.sampled_from(KEYSTORE_BASES))))
    for path, action, value in draw(st.lists(keystore_mutations, min_size=1, max_size=3)):
        mutate_keystore(document, path, action, value)
    return json.dumps(document).encode()


@target("keystore", "keystore.info and unlock: a key file a user imports or finds damaged")
def _keystore(workdir: Path) -> Iterator[Session[bytes]]:
    valid = json.dumps(KEYSTORE_BASES[0]).encode()
    address = Account.from_key(KEYSTORE_KEY).address

    def decode(raw: bytes) -> LocalAccount:
        (workdir / "fuzzed.json").write_bytes(raw)
        recorded = keystore.info(workdir, "fuzzed")
        account = keystore.unlock(workdir, "fuzzed", KEYSTORE_PASSWORD)
        expect(recorded.address == account.address, "info and unlock disagree on the address")
        return account

    def sound(raw: bytes, account: Any) -> None:
        expect(account.address == address, "a key that is not the keystore's was unlocked")

    inputs = st.one_of(
        keystore_json.map(lambda d: json.dumps(d).encode()),
        mutated_keystore(),
        st.builds(
            lambda cut, tail: valid[:cut] + tail, st.integers(0, 600), st.binary(max_size=600)
        ),
    )
    # A key file may ask for up to twice the standard scrypt cost and 256 MiB before it
    # is refused (keystore.MAX_SCRYPT_WORK, MAX_SCRYPT_BLOCKS): a second or two on an
    # idle core, many more on a busy one.
    yield Session(
        inputs,
        decode,
        (keystore.KeystoreError,),
        sound,
        seconds=60.0,
        memory=keystore.MAX_SCRYPT_BLOCKS * 128 + 64 * 2**20,
    )
