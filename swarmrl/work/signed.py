"""EIP-712 structs of the work protocol, and the pydantic base they share.

Every struct is signed under the run's swarm domain (chain id and ComputePool),
so a signature is good for one deployment only. A struct declares its EIP-712
members once (:class:`swarmrl.chain.eip712.Struct`); :class:`Signed` turns that
into the typed digest, signs it, and recovers the signer. Numbers that are floats
in Python (temperature, top-p) are signed as integer millionths.
"""

from __future__ import annotations

from typing import Annotated, ClassVar

from eth_account.signers.local import LocalAccount
from eth_utils import to_checksum_address
from pydantic import BaseModel, ConfigDict, StringConstraints

from swarmrl.chain.eip712 import Domain, Struct, recover, sign_digest

MAX_UINT32 = 2**32 - 1
MAX_UINT64 = 2**64 - 1

Hex32 = Annotated[str, StringConstraints(pattern=r"^[0-9a-f]{64}$")]
RunId = Annotated[str, StringConstraints(pattern=r"^0x[0-9a-f]{64}$")]
HexAddress = Annotated[str, StringConstraints(pattern=r"^0x[0-9a-fA-F]{40}$")]
HexSignature = Annotated[str, StringConstraints(pattern=r"^[0-9a-f]{130}$")]
PeerId = Annotated[str, StringConstraints(pattern=r"^[1-9A-HJ-NP-Za-km-z]{1,128}$")]
UNSIGNED = "0" * 130


class Message(BaseModel):
    """A wire message: frozen, strict, and nothing beyond its fields."""

    model_config = ConfigDict(frozen=True, extra="forbid", strict=True)


class Signed(Message):
    """A message that carries its signer's EIP-712 signature over its other fields."""

    STRUCT: ClassVar[Struct]

    signature: HexSignature = UNSIGNED

    def digest(self, domain: Domain) -> bytes:
        return self.STRUCT.digest(domain, dict(self))

    def signed_by(self, account: LocalAccount, domain: Domain) -> Signed:
        """This message with `account`'s signature."""
        signature = sign_digest(account, self.digest(domain)).hex()
        return self.model_copy(update={"signature": signature})

    def signer(self, domain: Domain) -> str | None:
        """The checksummed address that signed this message; None if the signature is
        malformed."""
        try:
            return recover(self.digest(domain), bytes.fromhex(self.signature))
        except Exception:  # eth-keys raises several types for a malformed signature
            return None

    def check_signer(self, domain: Domain, expected: str, what: str) -> None:
        """ValueError unless `expected` signed this message."""
        signer = self.signer(domain)
        if signer is None or signer != to_checksum_address(expected):
            raise ValueError(f"the {what} is not signed by {to_checksum_address(expected)}")
