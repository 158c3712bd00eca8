"""EIP-712: every signature of the protocol, and the Merkle commitment over submissions.

The one signing path, shared by the node (which signs) and the orchestrator
(which verifies, commits and proves). Every struct is declared once, as a
:class:`Struct`: its members in order, each with its Solidity name and type and
the Python attribute its value comes from. The type string, the ABI types and
the encoded values all come from that one table, so they cannot fall out of
step; the tests check the digests against eth-account's encoder and the
contracts' own `consentDigest` and `submissionDigest` views, so Python and
Solidity cannot drift apart silently. Messages that are structs subclass
:class:`Signed`; floats (temperature, top-p) are signed as integer millionths.

Every domain binds chain id and contract address: a signature is good for one
deployment on one chain only. The registry's and the pool's domains are the
contracts'; everything the swarm signs off chain is in the run's swarm domain.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, Self

from eth_abi import encode as abi_encode
from eth_account import Account
from eth_account.signers.local import LocalAccount
from eth_typing import Hash32
from eth_utils import keccak, to_checksum_address

from swarmrl.schema import MAX_UINT32, HexSignature, Strict

DOMAIN_TYPE = "EIP712Domain(string name,string version,uint256 chainId,address verifyingContract)"
REGISTRY_DOMAIN_NAME = "SwarmRL ProviderRegistry"
POOL_DOMAIN_NAME = "SwarmRL ComputePool"
SWARM_DOMAIN_NAME = "SwarmRL Swarm"
DOMAIN_VERSION = "1"
MICROS = 1_000_000
UNSIGNED = "0" * 130
# The order of secp256k1's group: a signature (r, s) has a twin (r, n - s).
SECP256K1_ORDER = 0xFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFEBAAEDCE6AF48A03BBFD25E8CD0364141


@dataclass(frozen=True)
class Domain:
    name: str
    chain_id: int
    verifying_contract: str
    version: str = DOMAIN_VERSION

    def separator(self) -> bytes:
        return keccak(
            abi_encode(
                ["bytes32", "bytes32", "bytes32", "uint256", "address"],
                [
                    keccak(text=DOMAIN_TYPE),
                    keccak(text=self.name),
                    keccak(text=self.version),
                    self.chain_id,
                    to_checksum_address(self.verifying_contract),
                ],
            )
        )

    def as_dict(self) -> dict[str, object]:
        return {
            "name": self.name,
            "version": self.version,
            "chainId": self.chain_id,
            "verifyingContract": to_checksum_address(self.verifying_contract),
        }


def registry_domain(chain_id: int, registry: str) -> Domain:
    return Domain(REGISTRY_DOMAIN_NAME, chain_id, registry)


def pool_domain(chain_id: int, pool: str) -> Domain:
    return Domain(POOL_DOMAIN_NAME, chain_id, pool)


def swarm_domain(chain_id: int, pool: str) -> Domain:
    """The domain of every swarm signature of one run (work orders and receipts, join
    claims, peer records, checkpoints, rollout files): its chain and ComputePool."""
    return Domain(SWARM_DOMAIN_NAME, chain_id, pool)


def typed_digest(domain: Domain, struct_hash: bytes) -> bytes:
    """keccak256("\\x19\\x01" || domainSeparator || structHash)."""
    return keccak(b"\x19\x01" + domain.separator() + struct_hash)


@dataclass(frozen=True)
class Member:
    """One member of a struct: its name and Solidity type as the type string states them,
    and the Python attribute its value comes from, through `encode` where the attribute
    is not already what the ABI takes. Addresses are checksummed, and `string` and
    `bytes` members hashed, as EIP-712 says, without an `encode`."""

    name: str
    type: str
    attribute: str
    encode: Callable[[Any], Any] | None = None


class Struct:
    """An EIP-712 struct type, declared once as its members in order."""

    def __init__(self, name: str, *members: Member) -> None:
        self.name = name
        self.members = members
        self.type_string = f"{name}({','.join(f'{m.type} {m.name}' for m in members)})"
        self.type_hash = keccak(text=self.type_string)
        # Dynamic members are encoded as the hash of their contents.
        self._abi_types = [
            "bytes32",
            *("bytes32" if m.type in ("string", "bytes") else m.type for m in members),
        ]

    def hash(self, values: Mapping[str, Any]) -> bytes:
        """hashStruct of the struct whose members' values `values` holds by attribute."""
        encoded: list[Any] = [self.type_hash]
        for m in self.members:
            value = values[m.attribute]
            if m.encode is not None:
                value = m.encode(value)
            if m.type == "address":
                value = to_checksum_address(value)
            elif m.type == "string":
                value = keccak(text=value)
            elif m.type == "bytes":
                value = keccak(value)
            encoded.append(value)
        return keccak(abi_encode(self._abi_types, encoded))

    def digest(self, domain: Domain, values: Mapping[str, Any]) -> bytes:
        """What a signer signs: the typed digest of this struct in `domain`."""
        return typed_digest(domain, self.hash(values))


def text_hash(text: str) -> bytes:
    """The 32 bytes a string stands for in a bytes32 member (keccak of its UTF-8)."""
    return keccak(text=text)


def hex_bytes(value: str) -> bytes:
    """Hex (with or without 0x) as the bytes of a bytesN member."""
    return bytes.fromhex(value.removeprefix("0x"))


def micros(value: float, name: str) -> int:
    """``value`` in integer millionths, as a float (temperature, top-p) is signed: EIP-712
    has no floats, and a value on that grid survives the round trip exactly. ValueError
    unless it lies on the grid."""
    scaled = round(value * MICROS)
    if not 0 <= scaled <= MAX_UINT32 or scaled / MICROS != value:
        raise ValueError(f"{name} {value} must be a multiple of 0.000001 below 4294")
    return scaled


class Signed(Strict):
    """A message that is an EIP-712 struct (`STRUCT`, over its fields) and carries its
    signer's signature."""

    STRUCT: ClassVar[Struct]

    signature: HexSignature = UNSIGNED

    def digest(self, domain: Domain) -> bytes:
        return self.STRUCT.digest(domain, dict(self))

    def signed_by(self, account: LocalAccount, domain: Domain) -> Self:
        """This message with `account`'s signature."""
        signature = sign_digest(account, self.digest(domain)).hex()
        return self.model_copy(update={"signature": signature})

    def signer(self, domain: Domain) -> str | None:
        """The checksummed address that signed this message; None if the signature is
        malformed or a value has no signed form (a float off the grid)."""
        try:
            digest = self.digest(domain)
        except ValueError:
            return None
        return signer_of(digest, self.signature)

    def check_signer(self, domain: Domain, expected: str, what: str) -> None:
        """ValueError unless `expected` signed this message."""
        signer = self.signer(domain)
        if signer is None or signer != to_checksum_address(expected):
            raise ValueError(f"the {what} is not signed by {to_checksum_address(expected)}")


@dataclass(frozen=True)
class NodeConsent:
    """A node's consent to be run by `provider`; `nonce` is the registry's consentNonce."""

    STRUCT: ClassVar[Struct] = Struct(
        "NodeConsent",
        Member("provider", "address", "provider"),
        Member("node", "address", "node"),
        Member("nonce", "uint256", "nonce"),
        Member("deadline", "uint256", "deadline"),
    )

    provider: str
    node: str
    nonce: int
    deadline: int

    def digest(self, domain: Domain) -> bytes:
        return self.STRUCT.digest(domain, vars(self))


@dataclass(frozen=True)
class Submission:
    """What a node signs for one rollout file: run, node, policy step, file digest."""

    STRUCT: ClassVar[Struct] = Struct(
        "Submission",
        Member("runId", "bytes32", "run_id"),
        Member("node", "address", "node"),
        Member("step", "uint64", "step"),
        Member("rolloutDigest", "bytes32", "rollout_digest"),
    )

    run_id: bytes
    node: str
    step: int
    rollout_digest: bytes

    def __post_init__(self) -> None:
        if len(self.run_id) != 32 or len(self.rollout_digest) != 32:
            raise ValueError("run_id and rollout_digest must be 32 bytes each")
        if not 0 <= self.step < 2**64:
            raise ValueError(f"step {self.step} does not fit in uint64")

    def digest(self, domain: Domain) -> bytes:
        return self.STRUCT.digest(domain, vars(self))

    def as_tuple(self) -> tuple[bytes, str, int, bytes]:
        """The ABI tuple IComputePool.Submission, for contract calls."""
        return (self.run_id, to_checksum_address(self.node), self.step, self.rollout_digest)


def sign_digest(account: LocalAccount, digest: bytes) -> bytes:
    """A 65-byte r || s || v signature (v = 27 or 28), as OpenZeppelin's ECDSA expects."""
    return bytes(account.unsafe_sign_hash(Hash32(digest)).signature)


def recover(digest: bytes, signature: bytes) -> str:
    """The address that signed `digest`."""
    # Account's methods are combomethods, which erase their annotations (a str here).
    signer: str = Account._recover_hash(Hash32(digest), signature=signature)
    return signer


def canonical_signature(signature: bytes) -> bool:
    """Whether the contracts' ECDSA (OpenZeppelin's, EIP-2) takes `signature`: 65 bytes
    r || s || v, v 27 or 28, s in the lower half of the group order. Plain ECDSA also
    recovers the signer from the twin (n - s, the other v) and from v as 0 or 1, so a
    signature the contracts refuse could otherwise pass here: a node could hand in
    work under a signature that no slash would ever take as evidence."""
    return (
        len(signature) == 65
        and signature[64] in (27, 28)
        and int.from_bytes(signature[32:64], "big") <= SECP256K1_ORDER // 2
    )


def signer_of(digest: bytes, signature: str) -> str | None:
    """The checksummed address that signed `digest`, the signature as hex (as messages
    carry it); None if it is malformed or not in the one form the contracts take."""
    try:
        raw = bytes.fromhex(signature)
    except ValueError:
        return None
    if not canonical_signature(raw):
        return None
    try:
        return recover(digest, raw)
    except Exception:  # eth-keys raises several types for a malformed signature
        return None


def sign_consent(account: LocalAccount, consent: NodeConsent, domain: Domain) -> bytes:
    if to_checksum_address(consent.node) != account.address:
        raise ValueError("a consent must be signed by the node's own key")
    return sign_digest(account, consent.digest(domain))


def sign_submission(account: LocalAccount, submission: Submission, domain: Domain) -> bytes:
    if to_checksum_address(submission.node) != account.address:
        raise ValueError("a submission must be signed by the node's own key")
    return sign_digest(account, submission.digest(domain))


# The work commitment: OpenZeppelin MerkleProof semantics (keccak256, each pair
# sorted before hashing, so a proof is just the list of siblings).


def leaf_hash(digest: bytes) -> bytes:
    """A commitment leaf: keccak256(abi.encode(digest)) for a submission's EIP-712 digest."""
    return keccak(abi_encode(["bytes32"], [digest]))


def hash_pair(a: bytes, b: bytes) -> bytes:
    return keccak(a + b if a < b else b + a)


def process_proof(proof: Sequence[bytes], leaf: bytes) -> bytes:
    node = leaf
    for sibling in proof:
        node = hash_pair(node, sibling)
    return node


def verify_proof(proof: Sequence[bytes], root: bytes, leaf: bytes) -> bool:
    """MerkleProof.verify: whether `leaf` is in the tree whose root is `root`."""
    return process_proof(proof, leaf) == root


class MerkleTree:
    """A tree over leaf hashes; an odd node at the end of a level moves up unpaired."""

    def __init__(self, leaves: Sequence[bytes]) -> None:
        if not leaves:
            raise ValueError("a Merkle tree needs at least one leaf")
        if any(len(leaf) != 32 for leaf in leaves):
            raise ValueError("Merkle leaves must be 32-byte hashes")
        levels = [list(leaves)]
        while len(levels[-1]) > 1:
            below = levels[-1]
            above = [hash_pair(below[i], below[i + 1]) for i in range(0, len(below) - 1, 2)]
            if len(below) % 2:
                above.append(below[-1])
            levels.append(above)
        self.levels = levels

    @classmethod
    def from_digests(cls, digests: Sequence[bytes]) -> MerkleTree:
        """The commitment over submissions' EIP-712 digests, in the given order."""
        return cls([leaf_hash(d) for d in digests])

    @property
    def leaves(self) -> list[bytes]:
        return self.levels[0]

    @property
    def root(self) -> bytes:
        return self.levels[-1][0]

    def proof(self, index: int) -> list[bytes]:
        if not 0 <= index < len(self.leaves):
            raise IndexError(f"leaf {index} out of range 0..{len(self.leaves) - 1}")
        proof = []
        for level in self.levels[:-1]:
            sibling = index ^ 1
            if sibling < len(level):
                proof.append(level[sibling])
            index //= 2
        return proof


@dataclass(frozen=True)
class Permit:
    """An ERC-2612 permit; its domain is the token's (name from `name()`, version "1")."""

    STRUCT: ClassVar[Struct] = Struct(
        "Permit",
        Member("owner", "address", "owner"),
        Member("spender", "address", "spender"),
        Member("value", "uint256", "value"),
        Member("nonce", "uint256", "nonce"),
        Member("deadline", "uint256", "deadline"),
    )

    owner: str
    spender: str
    value: int
    nonce: int
    deadline: int

    def digest(self, domain: Domain) -> bytes:
        return self.STRUCT.digest(domain, vars(self))
