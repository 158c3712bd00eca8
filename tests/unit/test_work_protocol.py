"""The work protocols' signed structs: every signature binds every field and one
deployment, the digests are the EIP-712 an independent encoder computes, and a
node takes a work order only from the run's signer. (Each protocol's messages on
the wire are tested in its own module: test_work_join, _heartbeat, _assign, _submit.)"""

from __future__ import annotations

import pytest
from eth_utils import keccak
from pydantic import ValidationError

from swarmrl.eip712 import UNSIGNED, pool_domain, swarm_domain
from swarmrl.p2p import wire
from swarmrl.work import WORK_PROTOCOL
from swarmrl.work.assign import Slot, WorkOrder
from swarmrl.work.join import JoinClaim, NodeReport
from swarmrl.work.submit import Receipt
from tests.unit.work_examples import (
    CHAIN_ID,
    CLAIM,
    NODE,
    ORCHESTRATOR,
    ORDER,
    OTHER_POOL,
    PEER,
    POOL,
    PROVIDER,
    RECEIPT,
    REPORT,
    RUN,
    STRANGER,
    SWARM,
    canonical,
    eip712_digest,
    node_session,
)

STRUCTS = {"JoinClaim": CLAIM, "WorkOrder": ORDER, "Receipt": RECEIPT}

# One changed value per signed field; each must change what is signed.
CHANGES = {
    "JoinClaim": {
        "node": STRANGER.address,
        "provider": STRANGER.address,
        "peer_id": PEER[:-1] + "T",
        "report": REPORT.model_copy(update={"cpu_cores": 9}),
        "issued_at": CLAIM.issued_at + 1,
    },
    "WorkOrder": {
        "run": "0x" + "5b" * 32,
        "node": STRANGER.address,
        "counter": 4,
        "min_step": 6,
        "seed": 2**64 - 1,
        "group_size": 5,
        "max_tokens": 129,
        "temperature": 0.700001,
        "top_p": 0.9,
        "precision": "fp32",
        "tasks": [Slot(problem_id="arith-1", budget=64)],
        "deadline": ORDER.deadline + 1,
    },
    "Receipt": {
        "run": "0x" + "5b" * 32,
        "node": STRANGER.address,
        "submission": "ac" * 32,
        "epoch": 3,
        "units": 7,
        "reason": "policy step 1 is stale",
    },
}
REPORT_CHANGES = {
    "backend": "vllm",
    "device": "cuda:0",
    "cpu_cores": 9,
    "gpu": "H100",
    "gpu_memory_gib": 80.0,
    "workers": 8,
    "version": "swarmrl 1",
    "protocol": WORK_PROTOCOL + 1,
}


def signed(name: str):
    signer = ORCHESTRATOR if name in ("WorkOrder", "Receipt") else NODE
    return STRUCTS[name].signed_by(signer, SWARM), signer


def test_every_signed_field_is_tested():
    for name, struct in STRUCTS.items():
        assert set(CHANGES[name]) == set(type(struct).model_fields) - {"signature"}
    assert set(REPORT_CHANGES) == set(NodeReport.model_fields)


@pytest.mark.parametrize("name", STRUCTS)
def test_a_signed_struct_recovers_its_signer(name):
    message, signer = signed(name)
    assert STRUCTS[name].signature == UNSIGNED  # signing makes a copy
    assert message.signer(SWARM) == signer.address
    message.check_signer(SWARM, signer.address.lower(), "message")
    # Through the wire and back, it still verifies.
    again = wire.parse(type(message), wire.dump(message))
    assert again == message
    assert again.signer(SWARM) == signer.address


@pytest.mark.parametrize(
    ("name", "field"), [(name, field) for name, changes in CHANGES.items() for field in changes]
)
def test_any_changed_field_breaks_the_signature(name, field):
    message, signer = signed(name)
    forged = message.model_copy(update={field: CHANGES[name][field]})
    assert forged.digest(SWARM) != message.digest(SWARM)
    assert forged.signer(SWARM) != signer.address
    with pytest.raises(ValueError, match="is not signed by"):
        forged.check_signer(SWARM, signer.address, "message")


@pytest.mark.parametrize("field", REPORT_CHANGES)
def test_any_changed_report_field_breaks_the_join_claim(field):
    claim, _ = signed("JoinClaim")
    report = claim.report.model_copy(update={field: REPORT_CHANGES[field]})
    assert claim.model_copy(update={"report": report}).signer(SWARM) != NODE.address


@pytest.mark.parametrize(
    "domain",
    [
        swarm_domain(1, POOL),
        swarm_domain(CHAIN_ID, OTHER_POOL),
        pool_domain(CHAIN_ID, POOL),
    ],
    ids=["other chain", "other pool", "pool domain"],
)
@pytest.mark.parametrize("name", STRUCTS)
def test_a_signature_is_good_for_one_deployment_only(name, domain):
    message, signer = signed(name)
    assert message.signer(domain) != signer.address
    with pytest.raises(ValueError, match="is not signed by"):
        message.check_signer(domain, signer.address, "message")


@pytest.mark.parametrize("signature", [UNSIGNED, "ff" * 65, "00" * 64 + "1b"])
@pytest.mark.parametrize("name", STRUCTS)
def test_a_malformed_signature_has_no_signer(name, signature):
    message = STRUCTS[name].model_copy(update={"signature": signature})
    assert message.signer(SWARM) is None
    with pytest.raises(ValueError, match="is not signed by"):
        message.check_signer(SWARM, NODE.address, "message")


def test_another_key_signs_as_itself_not_as_the_node():
    claim = CLAIM.signed_by(STRANGER, SWARM)
    assert claim.signer(SWARM) == STRANGER.address
    with pytest.raises(ValueError, match=f"not signed by {NODE.address}"):
        claim.check_signer(SWARM, claim.node, "join claim")


def test_the_type_strings_are_the_protocols():
    # Each struct's table of members gives its type string; a member renamed, retyped
    # or moved is another protocol, so the strings are pinned here.
    assert JoinClaim.STRUCT.type_string == (
        "JoinClaim(address node,address provider,bytes32 peerId,bytes32 report,uint64 issuedAt)"
    )
    assert WorkOrder.STRUCT.type_string == (
        "WorkOrder(bytes32 runId,address node,uint64 counter,uint64 minStep,uint64 seed,"
        "uint32 groupSize,uint32 maxTokens,uint32 temperatureMicros,uint32 topPMicros,"
        "string precision,bytes32 tasks,uint64 deadline)"
    )
    assert Receipt.STRUCT.type_string == (
        "Receipt(bytes32 runId,address node,bytes32 submission,uint64 epoch,uint32 units,"
        "bytes32 reason)"
    )


def test_join_claim_digest_is_eip712():
    values = {
        "node": NODE.address,
        "provider": PROVIDER.address,
        "peerId": keccak(text=PEER),
        "report": keccak(text=canonical(REPORT.model_dump())),
        "issuedAt": CLAIM.issued_at,
    }
    assert CLAIM.digest(SWARM) == eip712_digest(SWARM, JoinClaim.STRUCT.type_string, values)


def test_work_order_digest_is_eip712():
    values = {
        "runId": bytes.fromhex(RUN[2:]),
        "node": NODE.address,
        "counter": 3,
        "minStep": 5,
        "seed": 2**64 - 2,
        "groupSize": 4,
        "maxTokens": 128,
        "temperatureMicros": 700_000,
        "topPMicros": 950_000,
        "precision": "bf16",
        "tasks": keccak(text=canonical([["arith-1", 64], ["arith-2", 128]])),
        "deadline": ORDER.deadline,
    }
    assert ORDER.digest(SWARM) == eip712_digest(SWARM, WorkOrder.STRUCT.type_string, values)


@pytest.mark.parametrize("reason", ["", "policy step 1 is stale"])
def test_receipt_digest_is_eip712(reason):
    receipt = RECEIPT.model_copy(update={"reason": reason})
    values = {
        "runId": bytes.fromhex(RUN[2:]),
        "node": NODE.address,
        "submission": bytes.fromhex("ab" * 32),
        "epoch": 2,
        "units": 8,
        # An acceptance states no reason: zero bytes, not the hash of "".
        "reason": keccak(text=reason) if reason else bytes(32),
    }
    assert receipt.digest(SWARM) == eip712_digest(SWARM, Receipt.STRUCT.type_string, values)


def test_tasks_hash_changes_with_any_budget_or_the_order_of_tasks():
    base = ORDER.tasks_hash()
    slots = ORDER.tasks
    budget = [slots[0], slots[1].model_copy(update={"budget": 256})]
    problem = [slots[0], slots[1].model_copy(update={"problem_id": "arith-3"})]
    for tasks in (budget, problem, list(reversed(slots)), slots[:1]):
        changed = ORDER.model_copy(update={"tasks": tasks})
        assert changed.tasks_hash() != base
        assert changed.digest(SWARM) != ORDER.digest(SWARM)
    assert ORDER.model_copy(update={"tasks": list(slots)}).tasks_hash() == base


def test_off_grid_temperature_cannot_be_signed():
    """Floats are signed as millionths; one between them has no exact signed value."""
    order = ORDER.model_copy(update={"temperature": 0.1234567})
    with pytest.raises(ValueError, match=r"multiple of 0\.000001"):
        order.signed_by(ORCHESTRATOR, SWARM)
    assert order.signer(SWARM) is None


def test_check_order_accepts_only_the_runs_signer_for_this_node():
    session = node_session()
    session.check_order(ORDER.signed_by(ORCHESTRATOR, SWARM))
    for order, why in [
        (ORDER.signed_by(STRANGER, SWARM), "signed by"),
        (ORDER.signed_by(ORCHESTRATOR, swarm_domain(1, POOL)), "signed by"),
        (
            ORDER.model_copy(update={"node": STRANGER.address}).signed_by(ORCHESTRATOR, SWARM),
            "another",
        ),
        (
            ORDER.model_copy(update={"run": "0x" + "5b" * 32}).signed_by(ORCHESTRATOR, SWARM),
            "another",
        ),
    ]:
        with pytest.raises(wire.WireError, match=why):
            session.check_order(order)


def test_messages_are_frozen():
    with pytest.raises(ValidationError):
        ORDER.counter = 9
