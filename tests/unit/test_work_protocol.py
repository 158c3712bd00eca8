"""The work protocol's signed structs and models: every signature binds every field
and one deployment, the digests are the EIP-712 an independent encoder computes,
and the wire models refuse anything but exactly what they describe."""

from __future__ import annotations

import json
import re

import pytest
from eth_account.messages import _hash_eip191_message, encode_typed_data
from eth_utils import keccak
from pydantic import ValidationError

from client.node.session import Identity, Session
from swarmrl.chain.anvil import dev_accounts
from swarmrl.chain.eip712 import UNSIGNED, Submission, pool_domain, recover, swarm_domain
from swarmrl.p2p import wire
from swarmrl.rollouts.records import Rollout, write_rollouts
from swarmrl.work import assign, heartbeat, join, submit
from swarmrl.work.assign import Slot, WorkOrder
from swarmrl.work.join import JoinClaim, NodeReport
from swarmrl.work.submit import Receipt, SubmitHeader

ACCOUNTS = dev_accounts(7)
ORCHESTRATOR, PROVIDER, NODE, STRANGER = ACCOUNTS[1], ACCOUNTS[4], ACCOUNTS[5], ACCOUNTS[6]
CHAIN_ID = 31337
POOL = "0xe7f1725E7734CE288F8367e1Bb143E90bb3F0512"
OTHER_POOL = "0x5FbDB2315678afecb367f032d93F642f64180aa3"
SWARM = swarm_domain(CHAIN_ID, POOL)
RUN = "0x" + "5a" * 32
PEER = "12D3KooWD3eckifWpRn9wQpMG9R9hX3sD158z7EqHWmweQAJU5SA"

REPORT = NodeReport(
    backend="torch", device="cpu", cpu_cores=8, gpu=None, gpu_memory_gib=None, version="swarmrl 0"
)
CLAIM = JoinClaim(
    node=NODE.address,
    provider=PROVIDER.address,
    peer_id=PEER,
    report=REPORT,
    issued_at=1_700_000_000,
)
ORDER = WorkOrder(
    run=RUN,
    node=NODE.address,
    counter=3,
    min_step=5,
    seed=2**64 - 2,
    group_size=4,
    max_tokens=128,
    temperature=0.7,
    top_p=0.95,
    tasks=[Slot(problem_id="arith-1", budget=64), Slot(problem_id="arith-2", budget=128)],
    deadline=1_700_000_300,
)
RECEIPT = Receipt(run=RUN, node=NODE.address, submission="ab" * 32, epoch=2, units=8, reason="")
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
    "version": "swarmrl 1",
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


# An independent EIP-712 encoder (eth-account's), fed from the type strings: the
# structs' hand-written ABI encoding must agree with the types they declare.


def eip712_digest(domain, type_string: str, values: dict) -> bytes:
    primary, fields = re.fullmatch(r"(\w+)\((.*)\)", type_string).groups()
    members = [dict(zip(("type", "name"), f.split(" "), strict=True)) for f in fields.split(",")]
    assert [m["name"] for m in members] == list(values)
    return _hash_eip191_message(
        encode_typed_data(
            full_message={
                "types": {
                    "EIP712Domain": [
                        {"name": "name", "type": "string"},
                        {"name": "version", "type": "string"},
                        {"name": "chainId", "type": "uint256"},
                        {"name": "verifyingContract", "type": "address"},
                    ],
                    primary: members,
                },
                "primaryType": primary,
                "domain": domain.as_dict(),
                "message": values,
            }
        )
    )


def canonical(value) -> str:
    return json.dumps(value, separators=(",", ":"))


def test_the_type_strings_are_the_protocols():
    # Each struct's table of members gives its type string; a member renamed, retyped
    # or moved is another protocol, so the strings are pinned here.
    assert JoinClaim.STRUCT.type_string == (
        "JoinClaim(address node,address provider,bytes32 peerId,bytes32 report,uint64 issuedAt)"
    )
    assert WorkOrder.STRUCT.type_string == (
        "WorkOrder(bytes32 runId,address node,uint64 counter,uint64 minStep,uint64 seed,"
        "uint32 groupSize,uint32 maxTokens,uint32 temperatureMicros,uint32 topPMicros,"
        "bytes32 tasks,uint64 deadline)"
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


# The node's submission: the contract's Submission under the pool's domain.


def rollout_file(path, seed: int = ORDER.seed):
    records = [
        Rollout(
            run=RUN,
            policy_step=6,
            node=NODE.address,
            problem_id=slot.problem_id,
            task_type="math",
            prompt="What is 1 + 1?",
            verification_info='{"ground_truth":"2"}',
            seed=seed,
            sample=sample,
            temperature=ORDER.temperature,
            top_p=ORDER.top_p,
            max_tokens=ORDER.max_tokens,
            target_len=slot.budget,
            prompt_ids=[1, 2, 3],
            output_ids=[4, 5],
            logprobs=[-0.5, -0.25],
            finish_reason="eos",
            task_reward=1.0,
            length_penalty=0.0,
            reward=1.0,
            proofs=[],
        ).sealed()
        for slot in ORDER.tasks
        for sample in range(ORDER.group_size)
    ]
    write_rollouts(records, path)
    return path


def node_session(account=NODE, pool=POOL) -> Session:
    # sign and digest use no transport: no host.
    identity = Identity(
        account=account,
        provider=PROVIDER.address,
        run=RUN,
        swarm_domain=swarm_domain(CHAIN_ID, pool),
        pool_domain=pool_domain(CHAIN_ID, pool),
        trusted=frozenset({ORCHESTRATOR.address}),
    )
    return Session(None, PEER, identity)


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
        pool_domain(CHAIN_ID, POOL),
        "Submission(bytes32 runId,address node,uint64 step,bytes32 rolloutDigest)",
        {
            "runId": bytes.fromhex(RUN[2:]),
            "node": NODE.address,
            "step": 6,
            "rolloutDigest": file_digest,
        },
    )
    submission = Submission(bytes.fromhex(RUN[2:]), NODE.address, 6, file_digest)
    assert submission.digest(pool_domain(CHAIN_ID, POOL)) == contract
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


# The models: strict, closed, bounded.

VALID = {
    join.JoinClaim: CLAIM.signed_by(NODE, SWARM),
    join.JoinResponse: join.JoinResponse(
        run=RUN,
        state="joined",
        heartbeat_seconds=10.0,
        policy_step=3,
        weights=["/ip4/1.2.3.4/tcp/1"],
    ),
    heartbeat.HeartbeatRequest: heartbeat.HeartbeatRequest(policy_step=3, tokens_per_second=50.0),
    heartbeat.HeartbeatResponse: heartbeat.HeartbeatResponse(
        state="active",
        policy_step=3,
        epoch=1,
        outcomes=[heartbeat.Outcome(digest="ab" * 32, status="accepted", units=8)],
    ),
    assign.WorkRequest: assign.WorkRequest(),
    assign.WorkResponse: assign.WorkResponse(order=ORDER.signed_by(ORCHESTRATOR, SWARM)),
    submit.SubmitHeader: SubmitHeader(
        order_id="cd" * 32,
        node=NODE.address,
        step=6,
        file_sha256="ef" * 32,
        size=1000,
        signature="12" * 65,
    ),
    submit.SubmitResponse: submit.SubmitResponse(receipt=RECEIPT.signed_by(ORCHESTRATOR, SWARM)),
}


@pytest.mark.parametrize("model", VALID, ids=lambda m: m.__name__)
def test_valid_messages_round_trip(model):
    message = VALID[model]
    assert wire.parse(model, wire.dump(message)) == message


@pytest.mark.parametrize("model", VALID, ids=lambda m: m.__name__)
def test_extra_fields_are_refused(model):
    raw = json.loads(wire.dump(VALID[model]))
    raw["admin"] = True
    with pytest.raises(wire.WireError, match="admin"):
        wire.parse(model, json.dumps(raw).encode())


def test_messages_are_frozen():
    with pytest.raises(ValidationError):
        ORDER.counter = 9


def replaced(model, path: str, value):
    """The valid message of `model` as JSON, with the value at `path` (dots) replaced."""
    raw = json.loads(wire.dump(VALID[model]))
    *parents, last = path.split(".")
    node = raw
    for part in parents:
        node = node[int(part)] if part.isdigit() else node[part]
    node[int(last) if last.isdigit() else last] = value
    return json.dumps(raw).encode()


BAD = [
    # Wrong types: strict, no coercion.
    (assign.WorkResponse, "order.counter", "3"),
    (assign.WorkResponse, "order.counter", 3.0),
    (assign.WorkResponse, "order.counter", True),
    (assign.WorkResponse, "order.temperature", "0.7"),
    (assign.WorkResponse, "order.tasks", {"arith-1": 64}),
    (assign.WorkResponse, "order.tasks.0.budget", "64"),
    (heartbeat.HeartbeatRequest, "paused", 1),
    (heartbeat.HeartbeatRequest, "policy_step", "3"),
    (join.JoinClaim, "report", "torch"),
    (join.JoinClaim, "report.cpu_cores", 8.5),
    (submit.SubmitResponse, "receipt.units", "8"),
    (submit.SubmitHeader, "step", None),
    # Out of range.
    (assign.WorkResponse, "order.counter", -1),
    (assign.WorkResponse, "order.seed", 2**64),
    (assign.WorkResponse, "order.group_size", 0),
    (assign.WorkResponse, "order.max_tokens", 2**32),
    (assign.WorkResponse, "order.temperature", 100.5),
    (assign.WorkResponse, "order.top_p", 0.0),
    (assign.WorkResponse, "order.top_p", 1.5),
    (assign.WorkResponse, "order.tasks", []),
    (assign.WorkResponse, "order.tasks", [{"problem_id": f"t{i}", "budget": 1} for i in range(65)]),
    (assign.WorkResponse, "order.tasks.0.budget", 0),
    (assign.WorkResponse, "order.tasks.0.problem_id", ""),
    (assign.WorkResponse, "order.tasks.0.problem_id", "x" * 257),
    (assign.WorkResponse, "retry_after", 3601.0),
    (assign.WorkResponse, "reason", "x" * 301),
    (heartbeat.HeartbeatRequest, "tokens_per_second", -1.0),
    (heartbeat.HeartbeatRequest, "tokens_per_second", 1e10),
    (heartbeat.HeartbeatResponse, "state", "trusted"),
    (heartbeat.HeartbeatResponse, "outcomes.0.status", "paid"),
    (heartbeat.HeartbeatResponse, "outcomes.0.units", -1),
    (
        heartbeat.HeartbeatResponse,
        "outcomes",
        [{"digest": "ab" * 32, "status": "accepted", "units": 1}] * 33,
    ),
    (join.JoinClaim, "issued_at", -1),
    (join.JoinClaim, "report.backend", "tensorflow"),
    (join.JoinClaim, "report.cpu_cores", 0),
    (join.JoinClaim, "report.device", "x" * 129),
    (join.JoinResponse, "heartbeat_seconds", 0.0),
    (join.JoinResponse, "weights", ["/ip4/1.2.3.4/tcp/1"] * 9),
    (submit.SubmitHeader, "size", 0),
    (submit.SubmitHeader, "size", submit.BODY_LIMIT + 1),
    (submit.SubmitResponse, "receipt.units", 2**32),
    (submit.SubmitResponse, "receipt.epoch", 2**64),
    # Malformed identifiers.
    (join.JoinClaim, "peer_id", "12D3KooW0OIl"),  # not base58
    (join.JoinClaim, "peer_id", ""),
    (join.JoinClaim, "node", NODE.address[:-1]),
    (join.JoinClaim, "node", NODE.address[2:] + "00"),
    (join.JoinClaim, "signature", "AB" * 65),
    (join.JoinClaim, "signature", "ab" * 64),
    (join.JoinResponse, "run", RUN[2:]),
    (join.JoinResponse, "run", "0x" + "5A" * 32),
    (submit.SubmitHeader, "order_id", "0x" + "cd" * 31),
    (submit.SubmitHeader, "file_sha256", "EF" * 32),
    (submit.SubmitResponse, "receipt.submission", "ab" * 31),
]


@pytest.mark.parametrize(("model", "path", "value"), BAD, ids=lambda v: str(v)[:40])
def test_malformed_values_are_refused_in_one_sentence(model, path, value):
    with pytest.raises(wire.WireError, match=r"\A[^\n]+\Z") as refused:
        wire.parse(model, replaced(model, path, value))
    assert model.__name__ in str(refused.value)


@pytest.mark.parametrize("model", VALID, ids=lambda m: m.__name__)
@pytest.mark.parametrize("body", [b"", b"null", b"[]", b"{", b"\xff\xfe", b'{"a":' * 10_000])
def test_what_is_not_a_message_is_refused(model, body):
    with pytest.raises(wire.WireError):
        wire.parse(model, body)


def test_request_limits_hold_a_full_valid_request():
    """Each protocol's size limit admits its largest sane request."""
    claim = CLAIM.model_copy(
        update={
            "report": REPORT.model_copy(
                update={"device": "d" * 128, "gpu": "g" * 128, "version": "v" * 128}
            ),
            "peer_id": "z" * 128,
        }
    ).signed_by(NODE, SWARM)
    assert len(wire.dump(claim)) <= join.REQUEST_LIMIT
    beat = heartbeat.HeartbeatRequest(policy_step=2**64 - 1, tokens_per_second=1e9, paused=True)
    assert len(wire.dump(beat)) <= heartbeat.REQUEST_LIMIT
    header = VALID[submit.SubmitHeader].model_copy(update={"step": 2**64 - 1, "size": 2**26})
    assert len(wire.dump(header)) <= submit.HEADER_LIMIT
    order = ORDER.model_copy(
        update={"tasks": [Slot(problem_id="p" * 256, budget=2**32 - 1)] * assign.MAX_TASKS}
    ).signed_by(ORCHESTRATOR, SWARM)
    response = assign.WorkResponse(order=order, retry_after=3600.0, reason="r" * 300)
    assert len(wire.dump(response)) <= assign.RESPONSE_LIMIT


def test_response_limits_hold_a_full_valid_response():
    outcome = heartbeat.Outcome(digest="ab" * 32, status="rejected", units=2**32, reason="r" * 300)
    beat = heartbeat.HeartbeatResponse(
        state="silent", policy_step=2**64 - 1, epoch=2**64 - 1, outcomes=[outcome] * 32
    )
    assert len(wire.dump(beat)) <= heartbeat.RESPONSE_LIMIT
    joined = join.JoinResponse(
        run=RUN,
        state="joined",
        heartbeat_seconds=3600.0,
        policy_step=2**64 - 1,
        weights=["/" + "w" * 255] * 8,
    )
    assert len(wire.dump(joined)) <= join.RESPONSE_LIMIT
    receipt = RECEIPT.model_copy(
        update={"epoch": 2**64 - 1, "units": 2**32 - 1, "reason": "r" * 300}
    ).signed_by(ORCHESTRATOR, SWARM)
    assert len(wire.dump(submit.SubmitResponse(receipt=receipt))) <= submit.RESPONSE_LIMIT


@pytest.mark.parametrize("name", ["\n", "a\r\nERROR forged log line", "k" * 5000])
def test_a_refusal_quotes_no_peer_text_raw(name):
    with pytest.raises(wire.WireError) as refused:
        wire.parse(assign.WorkRequest, json.dumps({name: 1}).encode())
    sentence = str(refused.value)
    assert sentence.isprintable()
    assert len(sentence) <= 200
