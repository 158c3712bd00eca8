"""``/swarmrl/work/1.0.0``: a node asks for work and gets a signed work order.

Nodes never choose their tasks. The orchestrator draws each order from a seed
of (run, node, counter) and signs it as :class:`WorkOrder`: the tasks with the
thinking budget of each, the group size, the sampling settings, the precision to
sample in (the one the validator prefills in), the seed, the oldest policy step
it will accept and a deadline. The order's EIP-712 digest is its id; the node's
submission names it, and validation checks every record against the order, never
against what the records say of themselves.
"""

from __future__ import annotations

from typing import Annotated

import pydantic_core
from pydantic import Field, StringConstraints

from swarmrl.eip712 import Member, Signed, Struct, hex_bytes, micros, text_hash
from swarmrl.models.backend import Precision
from swarmrl.p2p.protocol import Json, RequestResponse
from swarmrl.p2p.wire import protocol_id
from swarmrl.rollouts.checks import Assignment
from swarmrl.schema import MAX_UINT32, MAX_UINT64, HexAddress, Reason, RunId, Strict

MAX_TASKS = 64
# The longest a node is told to wait before it asks again: a longer wait is asked out.
MAX_RETRY_AFTER = 3600.0

ProblemId = Annotated[str, StringConstraints(min_length=1, max_length=256)]


class WorkRequest(Strict):
    """Asks for the node's open order, or a new one."""


class Slot(Strict):
    """One task of an order and the thinking budget its prompt states."""

    problem_id: ProblemId
    budget: int = Field(ge=1, le=MAX_UINT32)


def tasks_hash(tasks: list[Slot]) -> bytes:
    """What an order signs of its tasks: the hash of its (problem id, budget) pairs in order."""
    return text_hash(pydantic_core.to_json([[s.problem_id, s.budget] for s in tasks]).decode())


class WorkOrder(Signed):
    STRUCT = Struct(
        "WorkOrder",
        Member("runId", "bytes32", "run", hex_bytes),
        Member("node", "address", "node"),
        Member("counter", "uint64", "counter"),
        Member("minStep", "uint64", "min_step"),
        Member("seed", "uint64", "seed"),
        Member("groupSize", "uint32", "group_size"),
        Member("maxTokens", "uint32", "max_tokens"),
        Member("temperatureMicros", "uint32", "temperature", lambda t: micros(t, "temperature")),
        Member("topPMicros", "uint32", "top_p", lambda p: micros(p, "top_p")),
        Member("precision", "string", "precision"),
        Member("tasks", "bytes32", "tasks", tasks_hash),
        Member("deadline", "uint64", "deadline"),
    )

    run: RunId
    node: HexAddress
    counter: int = Field(ge=0, le=MAX_UINT64)
    min_step: int = Field(ge=0, le=MAX_UINT64)
    seed: int = Field(ge=0, le=MAX_UINT64)
    group_size: int = Field(ge=1, le=MAX_UINT32)
    max_tokens: int = Field(ge=1, le=MAX_UINT32)
    temperature: float = Field(ge=0, le=100)
    top_p: float = Field(gt=0, le=1)
    # Orders a ledger kept from before precision was signed read as fp32, what every run
    # sampled in then.
    precision: Precision = "fp32"
    tasks: list[Slot] = Field(min_length=1, max_length=MAX_TASKS)
    deadline: int = Field(ge=0, le=MAX_UINT64)

    def tasks_hash(self) -> bytes:
        return tasks_hash(self.tasks)

    def assignment(self, step: int) -> Assignment:
        """What this order asks of records generated with policy `step`: what intake and
        the validator check them against."""
        return Assignment(
            run=self.run,
            node=self.node,
            step=step,
            group_size=self.group_size,
            max_tokens=self.max_tokens,
            temperature=self.temperature,
            top_p=self.top_p,
            precision=self.precision,
            seed=self.seed,
            budgets={s.problem_id: s.budget for s in self.tasks},
        )


class WorkResponse(Strict):
    """An order, or none yet (no published policy, node not active) and when to ask again."""

    order: WorkOrder | None = None
    retry_after: float = Field(default=0.0, ge=0, le=MAX_RETRY_AFTER)
    reason: Reason = ""


WORK = RequestResponse(
    protocol_id("work"),
    Json(WorkRequest),
    Json(WorkResponse),
    request_limit=1024,
    response_limit=64 * 1024,
    deadline=10.0,
)
