"""swarmrl.weights.peer_records: PeerRecord and Announcement signatures with real keys."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from eth_account import Account
from eth_utils import keccak
from pydantic import ValidationError

from swarmrl import shards
from swarmrl.eip712 import pool_domain, swarm_domain
from swarmrl.shards import Manifest
from swarmrl.weights.peer_records import Announcement, PeerRecord, SignatureError, manifest_hash

ORIGIN = Account.from_key(keccak(text="swarmrl test origin"))
NODE = Account.from_key(keccak(text="swarmrl test node"))
STRANGER = Account.from_key(keccak(text="swarmrl test stranger"))
POOL = "0x5FbDB2315678afecb367f032d93F642f64180aa3"
OTHER_POOL = "0xe7f1725E7734CE288F8367e1Bb143E90bb3F0512"
DOMAIN = swarm_domain(31337, POOL)
PEER = "12D3KooWGzMQxWqL2tX6UGXtqCuZ9LmW1cXYkpdPmrd1G9P1Lfh4"
OTHER_PEER = "12D3KooWQYhTNQdmr3ArTeUHRYzFg94BKyTkoWBDWez9kSCVe2Xo"

OTHER_DOMAINS = [
    pytest.param(swarm_domain(84532, POOL), id="other-chain"),
    pytest.param(swarm_domain(31337, OTHER_POOL), id="other-pool"),
    pytest.param(pool_domain(31337, POOL), id="compute-pool-domain"),
]


def build(tmp_path: Path, data: bytes, *, step: int = 7, name: str = "model.bin") -> Manifest:
    path = tmp_path / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    return shards.build_manifest(path, model="org/model", step=step, shard_size=1024)


@pytest.fixture
def manifest(tmp_path: Path) -> Manifest:
    return build(tmp_path, bytes(range(256)) * 13)


# ---- PeerRecord --------------------------------------------------------------------


def test_peer_record_verifies_and_names_its_account():
    record = PeerRecord.sign(NODE, PEER, DOMAIN)
    assert record.peer_id == PEER
    assert record.account == NODE.address
    assert record.issued_at > 1_600_000_000
    assert record.verify(DOMAIN, PEER) == NODE.address
    # It survives the wire: what arrives is what was signed.
    again = PeerRecord.model_validate_json(record.model_dump_json())
    assert again.verify(DOMAIN, PEER) == NODE.address


def test_peer_record_from_another_peer_is_refused():
    record = PeerRecord.sign(NODE, PEER, DOMAIN)
    with pytest.raises(SignatureError, match=f"names peer {PEER}, but came from {OTHER_PEER}"):
        record.verify(DOMAIN, OTHER_PEER)


@pytest.mark.parametrize(
    "changes",
    [
        {"peer_id": OTHER_PEER},
        {"account": STRANGER.address},
        {"issued_at": 1},
    ],
)
def test_tampered_peer_record_is_refused(changes):
    record = PeerRecord.sign(NODE, PEER, DOMAIN).model_copy(update=changes)
    with pytest.raises(SignatureError):
        record.verify(DOMAIN, record.peer_id)


def test_peer_record_claiming_another_account_names_the_real_signer():
    signed = PeerRecord.sign(NODE, PEER, DOMAIN)
    forged = signed.model_copy(update={"account": ORIGIN.address})
    with pytest.raises(SignatureError) as e:
        forged.verify(DOMAIN, PEER)
    assert str(e.value).startswith(f"record for {ORIGIN.address} is signed by 0x")
    assert NODE.address not in str(e.value)  # recovered over other fields: some other key


@pytest.mark.parametrize("domain", OTHER_DOMAINS)
def test_peer_record_is_bound_to_its_domain(domain):
    record = PeerRecord.sign(NODE, PEER, DOMAIN)
    with pytest.raises(SignatureError, match="is signed by"):
        record.verify(domain, PEER)
    assert PeerRecord.sign(NODE, PEER, domain).verify(domain, PEER) == NODE.address


@pytest.mark.parametrize(
    "signature",
    [
        "00" * 65,  # r = s = 0
        "ff" * 65,  # r and s past the curve order
        "11" * 64 + "05",  # v neither 27 nor 28 (nor 0/1)
    ],
)
def test_malformed_signatures_are_signature_errors(signature):
    record = PeerRecord.sign(NODE, PEER, DOMAIN).model_copy(update={"signature": signature})
    with pytest.raises(SignatureError, match=r"^the signature is malformed$"):
        record.verify(DOMAIN, PEER)
    ann = Announcement(
        model="m", step=1, manifest_hash="ab" * 32, signer=ORIGIN.address, signature=signature
    )
    with pytest.raises(SignatureError, match=r"^the signature is malformed$"):
        ann.verify(DOMAIN, frozenset({ORIGIN.address}))


@pytest.mark.parametrize(
    "signature",
    ["", "ab" * 64, "ab" * 66, "AB" * 65, "0x" + "ab" * 64, "zz" * 65, "ab" * 64 + "a "],
)
def test_signature_hex_shape_is_checked_on_arrival(signature):
    fields = {"peer_id": PEER, "account": NODE.address, "issued_at": 1, "signature": signature}
    with pytest.raises(ValidationError):
        PeerRecord(**fields)
    with pytest.raises(ValidationError):
        PeerRecord.model_validate_json(json.dumps(fields))


# ---- Announcement ------------------------------------------------------------------


def test_announcement_verifies_for_a_trusted_signer(manifest):
    ann = Announcement.sign(ORIGIN, manifest, DOMAIN)
    assert (ann.model, ann.step, ann.signer) == ("org/model", 7, ORIGIN.address)
    assert ann.manifest_hash == manifest_hash(manifest)
    ann.verify(DOMAIN, frozenset({ORIGIN.address}))
    ann.verify(DOMAIN, frozenset({STRANGER.address, ORIGIN.address}))
    Announcement.model_validate_json(ann.model_dump_json()).verify(
        DOMAIN, frozenset({ORIGIN.address})
    )
    ann.matches(manifest)


def test_announcement_by_an_untrusted_signer_is_refused(manifest):
    ann = Announcement.sign(STRANGER, manifest, DOMAIN)
    with pytest.raises(SignatureError) as e:
        ann.verify(DOMAIN, frozenset({ORIGIN.address}))
    assert str(e.value) == f"checkpoint step 7 is signed by untrusted {STRANGER.address}"
    with pytest.raises(SignatureError, match="untrusted"):
        ann.verify(DOMAIN, frozenset())


def test_announcement_claiming_a_trusted_signer_is_refused(manifest):
    ann = Announcement.sign(STRANGER, manifest, DOMAIN).model_copy(
        update={"signer": ORIGIN.address}
    )
    with pytest.raises(SignatureError) as e:
        ann.verify(DOMAIN, frozenset({ORIGIN.address}))
    assert str(e.value) == (
        f"checkpoint claims signer {ORIGIN.address} but {STRANGER.address} signed it"
    )


@pytest.mark.parametrize(
    "changes",
    [
        {"model": "org/other"},
        {"step": 8},
        {"step": 2**64 - 1},
        {"manifest_hash": "00" * 32},
    ],
)
def test_tampered_announcement_is_refused(manifest, changes):
    ann = Announcement.sign(ORIGIN, manifest, DOMAIN).model_copy(update=changes)
    with pytest.raises(SignatureError):
        ann.verify(DOMAIN, frozenset({ORIGIN.address}))


@pytest.mark.parametrize("domain", OTHER_DOMAINS)
def test_announcement_is_bound_to_its_domain(manifest, domain):
    ann = Announcement.sign(ORIGIN, manifest, DOMAIN)
    with pytest.raises(SignatureError):
        ann.verify(domain, frozenset({ORIGIN.address}))
    Announcement.sign(ORIGIN, manifest, domain).verify(domain, frozenset({ORIGIN.address}))


def test_announcement_matches_only_its_manifest(tmp_path, manifest):
    ann = Announcement.sign(ORIGIN, manifest, DOMAIN)
    other_bytes = build(tmp_path / "b", b"\x01" + bytes(range(256)) * 13)
    other_step = build(tmp_path / "c", bytes(range(256)) * 13, step=8)
    other_size = shards.build_manifest(
        tmp_path / "model.bin", model="org/model", step=7, shard_size=512
    )
    for other in (other_bytes, other_step, other_size):
        with pytest.raises(ValueError, match=r"^the manifest's hash is not the announced one$"):
            ann.matches(other)
    # Same hash but another step named: refused too (a forged announcement).
    with pytest.raises(ValueError, match="model or step"):
        ann.model_copy(update={"step": 8}).matches(manifest)


def test_manifest_hash_is_keccak_of_canonical_json(manifest):
    canonical = json.dumps(
        json.loads(manifest.to_json()), sort_keys=True, separators=(",", ":")
    ).encode()
    assert canonical == manifest.to_json()
    assert manifest_hash(manifest) == keccak(canonical).hex()
    assert len(manifest_hash(manifest)) == 64
    # Any field of the manifest changes the hash.
    assert manifest_hash(manifest.model_copy(update={"model": "org/other"})) != manifest_hash(
        manifest
    )
    assert Manifest.from_json(manifest.to_json()) == manifest
    assert manifest_hash(Manifest.from_json(manifest.to_json())) == manifest_hash(manifest)


def test_the_type_strings_are_the_protocols():
    # Declared once as tables of members; the strings every peer signs are pinned here.
    assert PeerRecord.STRUCT.type_string == (
        "PeerRecord(bytes peerId,address account,uint64 issuedAt)"
    )
    assert Announcement.STRUCT.type_string == (
        "Checkpoint(string model,uint64 step,bytes32 manifestHash)"
    )
