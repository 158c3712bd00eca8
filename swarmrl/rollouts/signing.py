"""Who made a rollout file, and how: the node's EIP-712 signature over it.

A node signs ``RolloutFile(bytes32 runId, address node, uint64 step, bytes32
fileDigest, uint32 groupSize, uint32 maxTokens, uint32 temperatureMicros, uint32
topPMicros)`` under the run's swarm domain (chain id and ComputePool). The file
digest commits to every record in order, so the signature covers all of them;
the other fields are what the node says it was asked for, and a validator checks
every record against them (and, in the swarm, them against the assignment).

Temperature and top-p are signed as integer millionths: EIP-712 has no floats,
and a setting on that grid survives the round trip exactly.
"""

from __future__ import annotations

from pathlib import Path
from typing import ClassVar

from eth_account.signers.local import LocalAccount
from pydantic import Field

from swarmrl.eip712 import (
    UNSIGNED,
    Domain,
    Member,
    Struct,
    hex_bytes,
    micros,
    sign_digest,
    signer_of,
)
from swarmrl.schema import MAX_UINT32, MAX_UINT64, HexAddress, HexSignature, RunId, Strict


class FileSignature(Strict):
    """A node's signed statement about one rollout file; kept in the file's metadata."""

    STRUCT: ClassVar[Struct] = Struct(
        "RolloutFile",
        Member("runId", "bytes32", "run", hex_bytes),
        Member("node", "address", "node"),
        Member("step", "uint64", "step"),
        Member("fileDigest", "bytes32", "file_digest"),
        Member("groupSize", "uint32", "group_size"),
        Member("maxTokens", "uint32", "max_tokens"),
        Member("temperatureMicros", "uint32", "temperature", lambda t: micros(t, "temperature")),
        Member("topPMicros", "uint32", "top_p", lambda p: micros(p, "top_p")),
    )

    run: RunId
    node: HexAddress
    step: int = Field(ge=0, le=MAX_UINT64)
    group_size: int = Field(ge=1, le=MAX_UINT32)
    max_tokens: int = Field(ge=1, le=MAX_UINT32)
    temperature: float = Field(ge=0.0)
    top_p: float = Field(gt=0.0, le=1.0)
    signature: HexSignature

    @classmethod
    def sign(
        cls,
        account: LocalAccount,
        domain: Domain,
        file_digest: bytes,
        *,
        run: str,
        step: int,
        group_size: int,
        max_tokens: int,
        temperature: float,
        top_p: float,
    ) -> FileSignature:
        """The node's signature over ``file_digest`` and the settings it generated with."""
        unsigned = cls(
            run=run,
            node=account.address,
            step=step,
            group_size=group_size,
            max_tokens=max_tokens,
            temperature=temperature,
            top_p=top_p,
            signature=UNSIGNED,
        )
        signature = sign_digest(account, unsigned.digest(domain, file_digest))
        return unsigned.model_copy(update={"signature": signature.hex()})

    def digest(self, domain: Domain, file_digest: bytes) -> bytes:
        """The EIP-712 digest the node signs for the file with ``file_digest``."""
        return self.STRUCT.digest(domain, {**dict(self), "file_digest": file_digest})

    def signer(self, domain: Domain, file_digest: bytes) -> str | None:
        """The checksummed address that signed this for ``file_digest``; None if the
        signature is malformed or the settings are off the signable grid."""
        try:
            digest = self.digest(domain, file_digest)
        except ValueError:
            return None
        return signer_of(digest, self.signature)


def run_domain(deployment: Path | None) -> tuple[Domain, str]:
    """The swarm domain rollout files of a deployment are signed under, and its run id;
    ``deployment`` defaults as every chain command's does."""
    from swarmrl.chain.deploy import load_deployment
    from swarmrl.eip712 import swarm_domain

    d = load_deployment(deployment)
    return swarm_domain(d.chain_id, d.contracts.compute_pool), d.run_id
