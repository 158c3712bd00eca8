"""``/swarmrl/submit/1.0.0``: the header names and signs the contract's Submission, the
one place a Submission is built from a header; the header and the receipt's reply
on the wire are strict, closed and bounded (the body's streaming is
test_p2p_upload's, the receipt's signature test_work_protocol's)."""

from __future__ import annotations

import pytest
from eth_utils import keccak

from swarmrl.eip712 import UNSIGNED, Submission, pool_domain, recover
from swarmrl.work import submit
from swarmrl.work.submit import BODY_LIMIT, SUBMIT, SubmitHeader, SubmitResponse
from tests.codecs import CodecSuite, refused, replaced
from tests.unit.work_examples import (
    CHAIN_ID,
    NODE,
    ORCHESTRATOR,
    ORDER,
    OTHER_POOL,
    POOL,
    RECEIPT,
    RUN,
    STRANGER,
    SWARM,
    eip712_digest,
    node_session,
    rollout_file,
)

HEADER = SubmitHeader(
    order_id="cd" * 32,
    node=NODE.address,
    step=6,
    file_sha256="ef" * 32,
    size=1000,
    signature="12" * 65,
)
RESPONSE = SubmitResponse(receipt=RECEIPT.signed_by(ORCHESTRATOR, SWARM))
POOL_DOMAIN = pool_domain(CHAIN_ID, POOL)


class TestCodecs(CodecSuite):
    SPEC = SUBMIT
    ID = "/swarmrl/submit/1.0.0"
    EXAMPLES = (HEADER, RESPONSE)


# ---- the signed Submission -------------------------------------------------------------


def test_the_submission_header_signs_the_contracts_submission(tmp_path):
    path = rollout_file(tmp_path / "rollouts.parquet")
    session = node_session()
    header = session.sign(ORDER, 6, path)
    order_id = ORDER.digest(SWARM)
    assert header.order_id == order_id.hex()
    assert header.node == NODE.address
    assert header.size == path.stat().st_size
    assert header.file_sha256 == submit.file_sha256(path)
    file_digest = keccak(order_id + bytes.fromhex(header.file_sha256))
    assert header.rollout_digest() == file_digest

    # What ComputePool.slash checks: the Submission struct under the pool's domain.
    contract = eip712_digest(
        POOL_DOMAIN,
        "Submission(bytes32 runId,address node,uint64 step,bytes32 rolloutDigest)",
        {
            "runId": bytes.fromhex(RUN[2:]),
            "node": NODE.address,
            "step": 6,
            "rolloutDigest": file_digest,
        },
    )
    submission = Submission(bytes.fromhex(RUN[2:]), NODE.address, 6, file_digest)
    assert submission.digest(POOL_DOMAIN) == contract
    assert header.submission(RUN) == submission
    assert session.digest(header) == contract.hex()
    assert recover(contract, bytes.fromhex(header.signature)) == NODE.address
    # Signed for another pool, it is not evidence here.
    elsewhere = node_session(pool=OTHER_POOL).sign(ORDER, 6, path)
    assert recover(contract, bytes.fromhex(elsewhere.signature)) != NODE.address


def test_the_submission_digest_binds_order_file_and_step(tmp_path):
    session = node_session()
    path = rollout_file(tmp_path / "a.parquet")
    header = session.sign(ORDER, 6, path)
    other_file = session.sign(ORDER, 6, rollout_file(tmp_path / "b.parquet", seed=1))
    other_step = session.sign(ORDER, 7, path)
    other_order = session.sign(ORDER.model_copy(update={"counter": 4}), 6, path)
    digests = {session.digest(h) for h in (header, other_file, other_step, other_order)}
    assert len(digests) == 4


def test_the_signer_is_recovered_from_the_submission_of_one_run_and_pool():
    header = HEADER.model_copy(update={"node": NODE.address.lower()}).signed_by(
        NODE, RUN, POOL_DOMAIN
    )
    assert header.signer(RUN, POOL_DOMAIN) == NODE.address
    assert header.submission(RUN).node == NODE.address  # checksummed, as signed
    assert header.signer("0x" + "5b" * 32, POOL_DOMAIN) not in (None, NODE.address)
    assert header.signer(RUN, pool_domain(CHAIN_ID, OTHER_POOL)) not in (None, NODE.address)
    for changed in ({"step": 7}, {"file_sha256": "ee" * 32}, {"order_id": "ce" * 32}):
        forged = header.model_copy(update=changed)
        assert forged.signer(RUN, POOL_DOMAIN) != NODE.address
    assert header.model_copy(update={"signature": UNSIGNED}).signer(RUN, POOL_DOMAIN) is None


def test_a_node_signs_only_its_own_submission():
    with pytest.raises(ValueError, match="the node's own key"):
        HEADER.signed_by(STRANGER, RUN, POOL_DOMAIN)


# ---- on the wire -------------------------------------------------------------------------

BAD = [
    # Wrong types: strict, no coercion.
    ("answered", "receipt.units", "8"),
    ("asked", "step", None),
    # Out of range.
    ("asked", "size", 0),
    ("asked", "size", BODY_LIMIT + 1),
    ("answered", "receipt.units", 2**32),
    ("answered", "receipt.epoch", 2**64),
    # Malformed identifiers.
    ("asked", "order_id", "0x" + "cd" * 31),
    ("asked", "file_sha256", "EF" * 32),
    ("answered", "receipt.submission", "ab" * 31),
]


@pytest.mark.parametrize(("side", "path", "value"), BAD, ids=lambda v: str(v)[:40])
def test_malformed_values_are_refused_in_one_sentence(side, path, value):
    codec, message = (SUBMIT.header, HEADER) if side == "asked" else (SUBMIT.response, RESPONSE)
    assert type(message).__name__ in refused(codec, [replaced(message, path, value)])


def test_a_response_holds_a_receipt_or_a_refusal_for_good():
    refusal = SubmitResponse.refusal("work order cdcdcdcdcdcd is already expired " * 20)
    assert (refusal.receipt, len(refusal.refused)) == (None, 300)
    assert SUBMIT.response.decode(SUBMIT.response.encode(refusal)) == refusal
    (body,) = SUBMIT.response.encode(RESPONSE)
    for both_or_neither in (body[:-1] + b',"refused":"expired"}', b"{}", b'{"refused":""}'):
        assert "receipt or a refusal" in refused(SUBMIT.response, [both_or_neither])


def test_the_limits_hold_the_largest_valid_header_and_receipt():
    header = HEADER.model_copy(update={"step": 2**64 - 1, "size": 2**26})
    (body,) = SUBMIT.header.encode(header)
    assert len(body) <= SUBMIT.header_limit
    receipt = RECEIPT.model_copy(
        update={"epoch": 2**64 - 1, "units": 2**32 - 1, "reason": "r" * 300}
    ).signed_by(ORCHESTRATOR, SWARM)
    (body,) = SUBMIT.response.encode(SubmitResponse(receipt=receipt))
    assert len(body) <= SUBMIT.response_limit
    assert SUBMIT.body_limit == BODY_LIMIT  # the header's size field is bounded by the body's
