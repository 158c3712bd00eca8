"""What peers sign for each other: who a peer is, and which checkpoint is the newest.

Both are EIP-712 structs under one domain per run (chain id and the run's
ComputePool contract), so a signature is good for one deployment only and can
be checked with the same code and tools as every other signature of the
protocol:

- ``PeerRecord(bytes peerId, address account, uint64 issuedAt)``: an Ethereum
  key vouches for a libp2p peer id. The swarm then knows which node (and so
  which stake) stands behind a peer; the newest record of an account wins.
- ``Checkpoint(string model, uint64 step, bytes32 manifestHash)``: the
  orchestrator vouches for a shard manifest. ``manifestHash`` is keccak256 of
  the manifest's canonical JSON, so the signature covers every shard hash and
  the Merkle root; nodes accept only steps newer than the one they hold, which
  is what stops an old, validly signed checkpoint from being replayed.
"""

from __future__ import annotations

import time
from typing import ClassVar

from eth_account.signers.local import LocalAccount
from eth_utils import keccak, to_checksum_address
from pydantic import Field

from swarmrl.eip712 import Domain, Member, Struct, hex_bytes, sign_digest, signer_of
from swarmrl.schema import MAX_UINT64, Hex32, HexAddress, HexSignature, Strict
from swarmrl.shards import Manifest


class SignatureError(ValueError):
    """A record's signature is malformed or not by the key it must be by."""


def _signer(digest: bytes, signature: str) -> str:
    if (signer := signer_of(digest, signature)) is None:
        raise SignatureError("the signature is malformed")
    return signer


class PeerRecord(Strict):
    """A libp2p peer id bound to the Ethereum account that signed this record."""

    STRUCT: ClassVar[Struct] = Struct(
        "PeerRecord",
        Member("peerId", "bytes", "peer_id", str.encode),
        Member("account", "address", "account"),
        Member("issuedAt", "uint64", "issued_at"),
    )

    peer_id: str = Field(min_length=1, max_length=128)  # base58, as libp2p prints it
    account: HexAddress
    issued_at: int = Field(ge=0, le=MAX_UINT64)
    signature: HexSignature

    @classmethod
    def sign(cls, account: LocalAccount, peer_id: str, domain: Domain) -> PeerRecord:
        issued_at = int(time.time())
        digest = cls.STRUCT.digest(
            domain, {"peer_id": peer_id, "account": account.address, "issued_at": issued_at}
        )
        return cls(
            peer_id=peer_id,
            account=account.address,
            issued_at=issued_at,
            signature=sign_digest(account, digest).hex(),
        )

    def verify(self, domain: Domain, peer_id: str) -> str:
        """The checksummed account, if this record is signed by it and names `peer_id`
        (the peer it arrived from); SignatureError otherwise."""
        if self.peer_id != peer_id:
            raise SignatureError(f"record names peer {self.peer_id}, but came from {peer_id}")
        signer = _signer(self.STRUCT.digest(domain, dict(self)), self.signature)
        if signer != to_checksum_address(self.account):
            raise SignatureError(f"record for {self.account} is signed by {signer}")
        return signer


def manifest_hash(manifest: Manifest) -> str:
    """keccak256 of the manifest's canonical JSON, hex: its name on the wire."""
    return keccak(manifest.to_json()).hex()


class Announcement(Strict):
    """A signed "checkpoint `step` of `model` is the manifest with this hash"."""

    STRUCT: ClassVar[Struct] = Struct(
        "Checkpoint",
        Member("model", "string", "model"),
        Member("step", "uint64", "step"),
        Member("manifestHash", "bytes32", "manifest_hash", hex_bytes),
    )

    model: str = Field(min_length=1, max_length=256)
    step: int = Field(ge=0, le=MAX_UINT64)
    manifest_hash: Hex32
    signer: HexAddress
    signature: HexSignature

    @classmethod
    def sign(cls, account: LocalAccount, manifest: Manifest, domain: Domain) -> Announcement:
        mhash = manifest_hash(manifest)
        digest = cls.STRUCT.digest(
            domain, {"model": manifest.model, "step": manifest.step, "manifest_hash": mhash}
        )
        return cls(
            model=manifest.model,
            step=manifest.step,
            manifest_hash=mhash,
            signer=account.address,
            signature=sign_digest(account, digest).hex(),
        )

    def verify(self, domain: Domain, trusted: frozenset[str]) -> None:
        """SignatureError unless signed by one of the `trusted` (checksummed) accounts."""
        signer = _signer(self.STRUCT.digest(domain, dict(self)), self.signature)
        if signer != to_checksum_address(self.signer):
            raise SignatureError(f"checkpoint claims signer {self.signer} but {signer} signed it")
        if signer not in trusted:
            raise SignatureError(f"checkpoint step {self.step} is signed by untrusted {signer}")

    def matches(self, manifest: Manifest) -> None:
        """ValueError unless `manifest` is the one this announcement names."""
        if manifest_hash(manifest) != self.manifest_hash:
            raise ValueError("the manifest's hash is not the announced one")
        if (manifest.model, manifest.step) != (self.model, self.step):
            raise ValueError("the manifest's model or step is not the announced one")
