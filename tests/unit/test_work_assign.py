"""``/swarmrl/work/1.0.0`` on the wire: the request and the signed work order in its
reply, strict, closed and bounded (the order's signature is test_work_protocol's)."""

from __future__ import annotations

import pytest

from swarmrl.work.assign import MAX_TASKS, WORK, Slot, WorkRequest, WorkResponse
from tests.codecs import CodecSuite, refused, replaced
from tests.unit.work_examples import ORCHESTRATOR, ORDER, SWARM

REQUEST = WorkRequest()
RESPONSE = WorkResponse(order=ORDER.signed_by(ORCHESTRATOR, SWARM))


class TestCodecs(CodecSuite):
    SPEC = WORK
    ID = "/swarmrl/work/1.0.0"
    EXAMPLES = (REQUEST, RESPONSE)


BAD = [
    # Wrong types: strict, no coercion.
    ("order.counter", "3"),
    ("order.counter", 3.0),
    ("order.counter", True),
    ("order.temperature", "0.7"),
    ("order.precision", 16),
    ("order.tasks", {"arith-1": 64}),
    ("order.tasks.0.budget", "64"),
    # Out of range.
    ("order.counter", -1),
    ("order.seed", 2**64),
    ("order.group_size", 0),
    ("order.max_tokens", 2**32),
    ("order.temperature", 100.5),
    ("order.top_p", 0.0),
    ("order.top_p", 1.5),
    ("order.precision", "fp16"),
    ("order.precision", "BF16"),
    ("order.tasks", []),
    ("order.tasks", [{"problem_id": f"t{i}", "budget": 1} for i in range(65)]),
    ("order.tasks.0.budget", 0),
    ("order.tasks.0.problem_id", ""),
    ("order.tasks.0.problem_id", "x" * 257),
    ("retry_after", 3601.0),
    ("reason", "x" * 301),
]


@pytest.mark.parametrize(("path", "value"), BAD, ids=lambda v: str(v)[:40])
def test_malformed_values_are_refused_in_one_sentence(path, value):
    assert "WorkResponse" in refused(WORK.response, [replaced(RESPONSE, path, value)])


def test_the_limits_hold_the_largest_valid_order():
    (body,) = WORK.request.encode(REQUEST)
    assert len(body) <= WORK.request_limit
    order = ORDER.model_copy(
        update={"tasks": [Slot(problem_id="p" * 256, budget=2**32 - 1)] * MAX_TASKS}
    ).signed_by(ORCHESTRATOR, SWARM)
    response = WorkResponse(order=order, retry_after=3600.0, reason="r" * 300)
    (body,) = WORK.response.encode(response)
    assert len(body) <= WORK.response_limit
