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
from typing import Annotated

from eth_account.signers.local import LocalAccount
from eth_utils import keccak, to_checksum_address
from pydantic import BaseModel, ConfigDict, Field, StringConstraints

from swarmrl.chain.eip712 import Domain, Member, Struct, hex_bytes, recover, sign_digest
from swarmrl.shards import Manifest

SWARM_DOMAIN_NAME = "SwarmRL Swarm"
PEER_RECORD = Struct(
    "PeerRecord",
    Member("peerId", "bytes", "peer_id", str.encode),
    Member("account", "address", "account"),
    Member("issuedAt", "uint64", "issued_at"),
)
CHECKPOINT = Struct(
    "Checkpoint",
    Member("model", "string", "model"),
    Member("step", "uint64", "step"),
    Member("manifestHash", "bytes32", "manifest_hash", hex_bytes),
)
_MAX_UINT64 = 2**64 - 1

Hex32 = Annotated[str, StringConstraints(pattern=r"^[0-9a-f]{64}$")]
HexSignature = Annotated[str, StringConstraints(pattern=r"^[0-9a-f]{130}$")]
HexAddress = Annotated[str, StringConstraints(pattern=r"^0x[0-9a-fA-F]{40}$")]


class SignatureError(ValueError):
    """A record's signature is malformed or not by the key it must be by."""


def swarm_domain(chain_id: int, pool: str) -> Domain:
    """The domain of every swarm signature of one run: its chain and ComputePool."""
    return Domain(SWARM_DOMAIN_NAME, chain_id, pool)


def _recover(digest: bytes, signature_hex: str) -> str:
    try:
        return recover(digest, bytes.fromhex(signature_hex))
    except Exception:  # eth-keys raises several types for a malformed signature
        raise SignatureError("the signature is malformed") from None


class PeerRecord(BaseModel):
    """A libp2p peer id bound to the Ethereum account that signed this record."""

    model_config = ConfigDict(frozen=True, extra="forbid", strict=True)

    peer_id: str = Field(min_length=1, max_length=128)  # base58, as libp2p prints it
    account: HexAddress
    issued_at: int = Field(ge=0, le=_MAX_UINT64)
    signature: HexSignature

    @classmethod
    def sign(cls, account: LocalAccount, peer_id: str, domain: Domain) -> PeerRecord:
        issued_at = int(time.time())
        digest = PEER_RECORD.digest(
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
        signer = _recover(PEER_RECORD.digest(domain, dict(self)), self.signature)
        if signer != to_checksum_address(self.account):
            raise SignatureError(f"record for {self.account} is signed by {signer}")
        return signer


def manifest_hash(manifest: Manifest) -> str:
    """keccak256 of the manifest's canonical JSON, hex: its name on the wire."""
    return keccak(manifest.to_json()).hex()


class Announcement(BaseModel):
    """A signed "checkpoint `step` of `model` is the manifest with this hash"."""

    model_config = ConfigDict(frozen=True, extra="forbid", strict=True)

    model: str = Field(min_length=1, max_length=256)
    step: int = Field(ge=0, le=_MAX_UINT64)
    manifest_hash: Hex32
    signer: HexAddress
    signature: HexSignature

    @classmethod
    def sign(cls, account: LocalAccount, manifest: Manifest, domain: Domain) -> Announcement:
        mhash = manifest_hash(manifest)
        digest = CHECKPOINT.digest(
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
        signer = _recover(CHECKPOINT.digest(domain, dict(self)), self.signature)
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
