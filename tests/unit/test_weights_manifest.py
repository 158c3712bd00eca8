"""``/swarmrl/manifest/1.0.0`` on the wire: a request by hash or for the newest, and a
reply of two frames, the signed announcement and the manifest's canonical bytes."""

from __future__ import annotations

import pytest
from eth_account import Account
from eth_utils import keccak

from swarmrl.eip712 import swarm_domain
from swarmrl.p2p import wire
from swarmrl.shards import MAX_MANIFEST_BYTES, FileEntry, Manifest, merkle_root
from swarmrl.weights.gossip import MAX_ANNOUNCEMENT_BYTES
from swarmrl.weights.manifest import MANIFEST, ManifestReply, ManifestRequest
from swarmrl.weights.peer_records import Announcement, manifest_hash
from tests.codecs import CodecSuite, refused

ORIGIN_KEY = keccak(text="swarmrl test origin")
DOMAIN = swarm_domain(31337, "0x5FbDB2315678afecb367f032d93F642f64180aa3")
HASHES = tuple(keccak(bytes([i])).hex() for i in range(3))
MANIFEST_OF_3 = Manifest(
    model="org/model",
    step=7,
    files=(FileEntry(name="model.bin", size=3000),),
    shard_size=1024,
    shard_hashes=HASHES,
    root=merkle_root(HASHES),
)


def announcement(manifest: Manifest) -> Announcement:
    return Announcement.sign(Account.from_key(ORIGIN_KEY), manifest, DOMAIN)


REQUEST = ManifestRequest(manifest_hash=manifest_hash(MANIFEST_OF_3))
REPLY = ManifestReply(announcement(MANIFEST_OF_3), MANIFEST_OF_3)


class TestCodecs(CodecSuite):
    SPEC = MANIFEST
    ID = "/swarmrl/manifest/1.0.0"
    EXAMPLES = (REQUEST, REPLY)


def test_the_newest_is_asked_for_without_a_hash():
    assert MANIFEST.request.decode([b"{}"]) == ManifestRequest()
    assert ManifestRequest().manifest_hash is None


def test_the_reply_is_the_announcement_then_the_manifests_canonical_bytes():
    frames = MANIFEST.response.encode(REPLY)
    assert frames == [wire.dump(REPLY.announcement), MANIFEST_OF_3.to_json()]
    assert MANIFEST.response.frames == 2


def test_a_manifest_not_in_canonical_form_is_refused():
    spaced = MANIFEST_OF_3.to_json().replace(b",", b", ")
    sentence = refused(MANIFEST.response, [wire.dump(REPLY.announcement), spaced])
    assert sentence == "manifest is not in canonical form (sorted keys, no whitespace)"


@pytest.mark.parametrize(
    ("changes", "where"),
    [
        ({"step": "7"}, "invalid Announcement: step"),
        ({"manifest_hash": "AB" * 32}, "manifest_hash"),
    ],
)
def test_a_malformed_announcement_is_refused_first(changes, where):
    document = REPLY.announcement.model_dump() | changes
    body = wire.dump_json(document)
    assert where in refused(MANIFEST.response, [body, b"not a manifest"])


def test_each_reply_frame_fits_the_limit_at_its_largest():
    # The largest manifest a peer takes, and the largest announcement, each fit a frame.
    assert MANIFEST.response_limit >= MAX_MANIFEST_BYTES
    assert MANIFEST.response_limit >= MAX_ANNOUNCEMENT_BYTES
    (body,) = MANIFEST.request.encode(REQUEST)
    assert len(body) <= MANIFEST.request_limit
