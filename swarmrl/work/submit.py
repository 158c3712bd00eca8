"""``/swarmrl/submit/1.0.0``: a node hands in the rollouts of one work order.

The request is an upload (see ``Host.upload``): a :class:`SubmitHeader`, then the
rollout file in bounded chunks. The header carries the node's signature over
the contract's ``Submission(runId, node, step, rolloutDigest)`` in the pool's
domain, with ``rolloutDigest = keccak(orderId || sha256(file))``: the very
evidence ``ComputePool.slash`` takes, so a bad submission is slashable without
anything else the node must cooperate with. The orchestrator writes it to its
ledger before answering with a :class:`Receipt` it signs; a resend of the same
submission gets the same receipt. A submission that no resend could ever get
taken (its order expired or went to another node while the node was away) is
answered with the refusal instead of a receipt: the node settles it and works on.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Self

from eth_account.signers.local import LocalAccount
from eth_utils import keccak, to_checksum_address
from pydantic import Field, model_validator

from swarmrl.eip712 import (
    Domain,
    Member,
    Signed,
    Struct,
    Submission,
    hex_bytes,
    sign_submission,
    signer_of,
    text_hash,
)
from swarmrl.p2p.protocol import Json, Upload
from swarmrl.p2p.wire import protocol_id
from swarmrl.schema import (
    MAX_UINT32,
    MAX_UINT64,
    Hex32,
    HexAddress,
    HexSignature,
    Reason,
    RunId,
    Strict,
)

BODY_LIMIT = 64 * 1024 * 1024
_READ = 1 << 20


class SubmitHeader(Strict):
    order_id: Hex32
    node: HexAddress
    step: int = Field(ge=0, le=MAX_UINT64)
    file_sha256: Hex32
    size: int = Field(ge=1, le=BODY_LIMIT)
    signature: HexSignature  # over the pool-domain Submission

    def rollout_digest(self) -> bytes:
        return rollout_digest(self.order_id, self.file_sha256)

    def submission(self, run: str) -> Submission:
        """The contract's Submission this header stands for in run `run` (0x + 64 hex):
        what the node signs, what the ledger keys it by, what a slash proves."""
        return Submission(
            run_id=hex_bytes(run),
            node=to_checksum_address(self.node),
            step=self.step,
            rollout_digest=self.rollout_digest(),
        )

    def digest(self, run: str, pool: Domain) -> bytes:
        """The submission's EIP-712 digest in the pool's domain: its one name."""
        return self.submission(run).digest(pool)

    def signed_by(self, account: LocalAccount, run: str, pool: Domain) -> Self:
        """This header with the node's signature over its submission."""
        signature = sign_submission(account, self.submission(run), pool).hex()
        return self.model_copy(update={"signature": signature})

    def signer(self, run: str, pool: Domain) -> str | None:
        """The checksummed address that signed the submission; None if malformed."""
        return signer_of(self.digest(run, pool), self.signature)


def rollout_digest(order_id: str, file_sha256: str) -> bytes:
    """What the signed Submission commits to: the order answered and the file's bytes."""
    return keccak(bytes.fromhex(order_id) + bytes.fromhex(file_sha256))


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(_READ):
            digest.update(chunk)
    return digest.hexdigest()


class Receipt(Signed):
    """The orchestrator's signed acknowledgement of one submission: accepted at intake
    with ``units`` work units, or rejected (units 0) for ``reason``."""

    STRUCT = Struct(
        "Receipt",
        Member("runId", "bytes32", "run", hex_bytes),
        Member("node", "address", "node"),
        Member("submission", "bytes32", "submission", hex_bytes),
        Member("epoch", "uint64", "epoch"),
        Member("units", "uint32", "units"),
        # An acceptance states no reason: zero bytes, not the hash of "".
        Member("reason", "bytes32", "reason", lambda r: text_hash(r) if r else bytes(32)),
    )

    run: RunId
    node: HexAddress
    submission: Hex32
    epoch: int = Field(ge=0, le=MAX_UINT64)
    units: int = Field(ge=0, le=MAX_UINT32)
    reason: Reason = ""


class SubmitResponse(Strict):
    """The orchestrator's answer to a submission: its signed receipt, or why it refuses
    the submission for good.

    A refusal here is final: the same submission sent again gets the same answer (its
    order is over, its signature or file is not the one it signs), so the node settles
    it instead of resending it. Whatever may pass on a later try (a busy or restarting
    orchestrator, a node it does not know yet, a lost connection) is an error reply
    instead, and the node sends the submission again later. This is the one place the
    two are told apart: the orchestrator chooses the answer, the node follows it.
    """

    receipt: Receipt | None = None
    refused: Reason = ""

    @model_validator(mode="after")
    def _receipt_or_refusal(self) -> Self:
        if (self.receipt is None) == (not self.refused):
            raise ValueError("a submit response holds a receipt or a refusal, not both or neither")
        return self

    @classmethod
    def refusal(cls, reason: str) -> SubmitResponse:
        """The final refusal for `reason` (cut to a Reason's length)."""
        return cls(refused=reason[:300])


SUBMIT = Upload(
    protocol_id("submit"),
    Json(SubmitHeader),
    Json(SubmitResponse),
    header_limit=2 * 1024,
    body_limit=BODY_LIMIT,
    response_limit=4 * 1024,
    deadline=300.0,
)
