"""What every message and record shares: the strict base model and the constrained types.

Whatever a peer, a node or a file hands in is parsed into a :class:`Strict` model:
frozen, strict (no coercion: "1" is not 1) and nothing beyond its fields. The types
below are the shapes of what they carry (hex digests, addresses, signatures, run
and peer ids, the bounds of Solidity's integers), defined once for the work
protocols, the weight swarm and the rollout files alike; and what is refused is
named by :func:`error_location`, which no peer's key can turn into two log lines.
"""

from __future__ import annotations

import reprlib
from typing import Annotated

from pydantic import BaseModel, ConfigDict, StringConstraints, ValidationError

MAX_UINT32 = 2**32 - 1
MAX_UINT64 = 2**64 - 1

# A 32-byte digest as 64 lowercase hex characters (no 0x).
Hex32 = Annotated[str, StringConstraints(pattern=r"^[0-9a-f]{64}$")]
# A deployment's run id: 0x and 32 bytes of lowercase hex.
RunId = Annotated[str, StringConstraints(pattern=r"^0x[0-9a-f]{64}$")]
# An Ethereum address in any case (checksummed where it is compared or signed).
HexAddress = Annotated[str, StringConstraints(pattern=r"^0x[0-9a-fA-F]{40}$")]
# A 65-byte r || s || v signature as 130 lowercase hex characters (no 0x).
HexSignature = Annotated[str, StringConstraints(pattern=r"^[0-9a-f]{130}$")]
# A libp2p peer id as libp2p prints it (base58).
PeerId = Annotated[str, StringConstraints(pattern=r"^[1-9A-HJ-NP-Za-km-z]{1,128}$")]
Multiaddr = Annotated[str, StringConstraints(min_length=1, max_length=256)]
# Why something was refused or rejected: one sentence, bounded.
Reason = Annotated[str, StringConstraints(max_length=300)]


class Strict(BaseModel):
    """A message or record: frozen, strict, and nothing beyond its fields."""

    model_config = ConfigDict(frozen=True, extra="forbid", strict=True)


def error_location(error: ValidationError, default: str) -> str:
    """Where the first problem of `error` is (dotted, or `default` for the whole input),
    fit for a one-line message: a key from untrusted input that would forge a log line
    (a newline or another control character) or flood it is quoted and cut short."""
    where = ".".join(str(part) for part in error.errors()[0]["loc"]) or default
    if len(where) > 80 or not where.isprintable():
        where = reprlib.repr(where)
    return where
