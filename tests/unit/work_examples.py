"""Valid messages of the work protocols, and the keys and deployment they are signed in,
shared by the tests of each protocol and of the signed structs."""

from __future__ import annotations

import json
import re

from eth_account.messages import _hash_eip191_message, encode_typed_data

from client.node.work.session import Identity, Session
from swarmrl.chain.anvil import dev_accounts
from swarmrl.eip712 import pool_domain, swarm_domain
from swarmrl.rollouts.records import Rollout, write_rollouts
from swarmrl.work import WORK_PROTOCOL
from swarmrl.work.assign import Slot, WorkOrder
from swarmrl.work.join import JoinClaim, NodeReport
from swarmrl.work.submit import Receipt

ACCOUNTS = dev_accounts(7)
ORCHESTRATOR, PROVIDER, NODE, STRANGER = ACCOUNTS[1], ACCOUNTS[4], ACCOUNTS[5], ACCOUNTS[6]
CHAIN_ID = 31337
POOL = "0xe7f1725E7734CE288F8367e1Bb143E90bb3F0512"
OTHER_POOL = "0x5FbDB2315678afecb367f032d93F642f64180aa3"
SWARM = swarm_domain(CHAIN_ID, POOL)
RUN = "0x" + "5a" * 32
PEER = "12D3KooWD3eckifWpRn9wQpMG9R9hX3sD158z7EqHWmweQAJU5SA"

REPORT = NodeReport(
    backend="torch",
    device="cpu",
    cpu_cores=8,
    gpu=None,
    gpu_memory_gib=None,
    version="swarmrl 0",
    protocol=WORK_PROTOCOL,
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
    precision="bf16",
    tasks=[Slot(problem_id="arith-1", budget=64), Slot(problem_id="arith-2", budget=128)],
    deadline=1_700_000_300,
)
RECEIPT = Receipt(run=RUN, node=NODE.address, submission="ab" * 32, epoch=2, units=8, reason="")


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


def rollout_file(path, seed: int = ORDER.seed):
    """Records answering ORDER, written to `path`."""
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
    # sign, digest and check_order use no transport: no host.
    identity = Identity(
        account=account,
        provider=PROVIDER.address,
        run=RUN,
        swarm_domain=swarm_domain(CHAIN_ID, pool),
        pool_domain=pool_domain(CHAIN_ID, pool),
        trusted=frozenset({ORCHESTRATOR.address}),
    )
    return Session(None, PEER, identity)
