"""EIP-712 digests and signatures, and the work-commitment Merkle tree.

The digests are checked against eth-account's independent EIP-712 encoder
here, and against the contracts' own views in test_contracts.py.
"""

import pytest
from eth_account import Account
from eth_account.messages import _hash_eip191_message, encode_typed_data
from eth_utils import keccak
from hypothesis import given, settings
from hypothesis import strategies as st

from swarmrl import eip712

REGISTRY = "0x5FbDB2315678afecb367f032d93F642f64180aa3"
POOL = "0xe7f1725E7734CE288F8367e1Bb143E90bb3F0512"


def _eth_account_digest(domain, primary, types, message):
    full = {
        "types": {
            "EIP712Domain": [
                {"name": "name", "type": "string"},
                {"name": "version", "type": "string"},
                {"name": "chainId", "type": "uint256"},
                {"name": "verifyingContract", "type": "address"},
            ],
            primary: types,
        },
        "primaryType": primary,
        "domain": domain.as_dict(),
        "message": message,
    }
    return _hash_eip191_message(encode_typed_data(full_message=full))


def test_consent_digest_matches_eth_account(accounts):
    consent = eip712.NodeConsent(accounts[4].address, accounts[5].address, 3, 1_900_000_000)
    domain = eip712.registry_domain(84532, REGISTRY)
    expected = _eth_account_digest(
        domain,
        "NodeConsent",
        [
            {"name": "provider", "type": "address"},
            {"name": "node", "type": "address"},
            {"name": "nonce", "type": "uint256"},
            {"name": "deadline", "type": "uint256"},
        ],
        {"provider": consent.provider, "node": consent.node, "nonce": 3, "deadline": 1_900_000_000},
    )
    assert consent.digest(domain) == expected


def test_submission_digest_matches_eth_account_and_binds_the_domain(accounts):
    node = accounts[5]
    sub = eip712.Submission(keccak(text="run"), node.address, 7, keccak(text="rollouts"))
    domain = eip712.pool_domain(31337, POOL)
    expected = _eth_account_digest(
        domain,
        "Submission",
        [
            {"name": "runId", "type": "bytes32"},
            {"name": "node", "type": "address"},
            {"name": "step", "type": "uint64"},
            {"name": "rolloutDigest", "type": "bytes32"},
        ],
        {"runId": sub.run_id, "node": node.address, "step": 7, "rolloutDigest": sub.rollout_digest},
    )
    assert sub.digest(domain) == expected
    assert sub.digest(eip712.pool_domain(84532, POOL)) != expected
    assert sub.digest(eip712.pool_domain(31337, REGISTRY)) != expected

    signature = eip712.sign_submission(node, sub, domain)
    assert len(signature) == 65
    assert eip712.recover(sub.digest(domain), signature) == node.address
    with pytest.raises(ValueError, match="node's own key"):
        eip712.sign_submission(accounts[6], sub, domain)


def test_submission_rejects_malformed_fields(accounts):
    with pytest.raises(ValueError, match="32 bytes"):
        eip712.Submission(b"short", accounts[0].address, 0, bytes(32))
    with pytest.raises(ValueError, match="uint64"):
        eip712.Submission(bytes(32), accounts[0].address, 2**64, bytes(32))


def test_permit_digest_matches_eth_account(accounts):
    permit = eip712.Permit(accounts[4].address, POOL, 10**18, 0, 2_000_000_000)
    domain = eip712.Domain("SwarmRL Stake", 31337, REGISTRY)
    expected = _eth_account_digest(
        domain,
        "Permit",
        [
            {"name": "owner", "type": "address"},
            {"name": "spender", "type": "address"},
            {"name": "value", "type": "uint256"},
            {"name": "nonce", "type": "uint256"},
            {"name": "deadline", "type": "uint256"},
        ],
        {
            "owner": permit.owner,
            "spender": POOL,
            "value": 10**18,
            "nonce": 0,
            "deadline": 2_000_000_000,
        },
    )
    assert permit.digest(domain) == expected


def test_a_struct_encodes_every_kind_of_member_as_eth_account_does(accounts):
    # One table gives the type string and the encoding: string and bytes members are
    # hashed, addresses checksummed whatever case they come in, encoders applied first.
    struct = eip712.Struct(
        "Every",
        eip712.Member("who", "address", "who"),
        eip712.Member("count", "uint64", "count"),
        eip712.Member("label", "string", "label"),
        eip712.Member("blob", "bytes", "blob", str.encode),
        eip712.Member("root", "bytes32", "root", eip712.hex_bytes),
        eip712.Member("name", "bytes32", "name", eip712.text_hash),
    )
    assert struct.type_string == (
        "Every(address who,uint64 count,string label,bytes blob,bytes32 root,bytes32 name)"
    )
    values = {
        "who": accounts[4].address.lower(),
        "count": 2**64 - 1,
        "label": "höhe",
        "blob": "12D3Koo",
        "root": "0x" + "ab" * 32,
        "name": "gsm8k/17",
        "ignored": "what the struct does not name is not signed",
    }
    domain = eip712.pool_domain(31337, POOL)
    expected = _eth_account_digest(
        domain,
        "Every",
        [
            {"name": "who", "type": "address"},
            {"name": "count", "type": "uint64"},
            {"name": "label", "type": "string"},
            {"name": "blob", "type": "bytes"},
            {"name": "root", "type": "bytes32"},
            {"name": "name", "type": "bytes32"},
        ],
        {
            "who": accounts[4].address,
            "count": 2**64 - 1,
            "label": "höhe",
            "blob": b"12D3Koo",
            "root": bytes.fromhex("ab" * 32),
            "name": keccak(text="gsm8k/17"),
        },
    )
    assert struct.digest(domain, values) == expected


digests = st.lists(st.binary(min_size=32, max_size=32), min_size=1, max_size=40)


@settings(max_examples=60, deadline=None)
@given(digests, st.data())
def test_every_leaf_proves_and_a_changed_leaf_does_not(leaves, data):
    tree = eip712.MerkleTree.from_digests(leaves)
    for i, digest in enumerate(leaves):
        leaf = eip712.leaf_hash(digest)
        assert eip712.verify_proof(tree.proof(i), tree.root, leaf)
    i = data.draw(st.integers(0, len(leaves) - 1))
    other = data.draw(st.binary(min_size=32, max_size=32).filter(lambda b: b not in leaves))
    assert not eip712.verify_proof(tree.proof(i), tree.root, eip712.leaf_hash(other))


def test_merkle_shapes():
    a, b, c = (keccak(text=x) for x in "abc")
    assert eip712.MerkleTree([a]).root == a
    assert eip712.MerkleTree([a]).proof(0) == []
    assert eip712.MerkleTree([a, b]).root == eip712.MerkleTree([b, a]).root  # sorted pairs
    three = eip712.MerkleTree([a, b, c])
    assert three.root == eip712.hash_pair(eip712.hash_pair(a, b), c)
    assert three.proof(2) == [eip712.hash_pair(a, b)]
    assert eip712.leaf_hash(a) == keccak(a)  # abi.encode(bytes32) is the word itself
    with pytest.raises(ValueError, match="at least one"):
        eip712.MerkleTree([])
    with pytest.raises(IndexError):
        three.proof(3)


def test_signature_is_what_eth_account_sign_typed_data_gives(accounts):
    node = accounts[5]
    sub = eip712.Submission(bytes(32), node.address, 1, bytes(32))
    domain = eip712.pool_domain(31337, POOL)
    signed = Account.unsafe_sign_hash(sub.digest(domain), node.key)
    assert eip712.sign_submission(node, sub, domain) == bytes(signed.signature)
