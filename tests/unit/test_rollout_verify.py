"""Generating proven rollouts and verifying them from the records alone, with a
real (randomly initialised) model: honest records pass, each kind of lie fails."""

from __future__ import annotations

import pytest

from swarmrl.models.backend import SamplingParams
from swarmrl.models.torch_backend import TorchBackend
from swarmrl.rollouts.generate import Provenance, generate_rollouts
from swarmrl.rollouts.verify import verify_rollout
from swarmrl.tasks import Task, length_penalty

TASKS = [
    Task(
        problem_id=f"t{i}",
        task_type="math",
        prompt=f"What is {i} + {i}?",
        verification_info={"ground_truth": str(2 * i)},
    )
    for i in range(3)
]


def score(task, text):
    """A stand-in verifier: deterministic in the text, so it can be recomputed."""
    return float(len(text) % 2 == 0)


@pytest.fixture(scope="module")
def records(backend):
    speeds = []

    def target_for(speed):
        speeds.append(speed)
        return 40 if speed is None else 50

    out = generate_rollouts(
        backend,
        TASKS,
        n=2,
        params=SamplingParams(max_tokens=70, temperature=1.0),
        provenance=Provenance(run="test", policy_step=4, node="0x" + "12" * 20),
        seed=9,
        score=score,
        target_for=target_for,
        batch_size=4,
    )
    assert speeds[:2] == [None, None]  # the first batch's two tasks: nothing measured yet
    assert speeds[2] > 0
    return out


def test_records_carry_groups_targets_rewards_and_proofs(records):
    assert [(r.problem_id, r.sample) for r in records] == [
        (t.problem_id, s) for t in TASKS for s in range(2)
    ]
    assert [r.target_len for r in records] == [40, 40, 40, 40, 50, 50]
    for r in records:
        assert (r.run, r.policy_step, r.seed) == ("test", 4, 9)
        assert r.length_penalty == length_penalty(r.target_len, len(r.output_ids))
        assert r.reward == r.task_reward - r.length_penalty
        assert len(r.proofs) == -(-len(r.output_ids) // 32)
        assert r.digest == r.content_digest()
    assert records[0].output_ids != records[1].output_ids


def test_honest_records_verify(backend, records):
    for r in records:
        verdict = verify_rollout(backend, r, score)
        assert verdict.accepted, verdict.reason
        assert verdict.chunks_accepted == verdict.chunks == len(r.proofs)


def lie(record, **changes):
    return record.model_copy(update=changes).sealed()


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        (lambda r: {"reward": r.reward + 0.5}, "its reward is"),
        (lambda r: {"task_reward": 1 - r.task_reward}, "its task reward is"),
        (lambda r: {"length_penalty": 0.0, "reward": r.task_reward}, "length penalty"),
        (lambda r: {"target_len": r.target_len + 1}, "prompt ids"),
        (lambda r: {"prompt": r.prompt + " Easy."}, "prompt ids"),
        (lambda r: {"logprobs": [x / 2 for x in r.logprobs]}, "logprobs are off"),
        (lambda r: {"logprobs": r.logprobs[:-1]}, "logprobs for"),
        (lambda r: {"proofs": r.proofs[:-1]}, "proofs for"),
        (lambda r: {"max_tokens": len(r.output_ids) - 1}, "exceed"),
        (lambda r: {"output_ids": [10_000, *r.output_ids[1:]]}, "cannot be replayed"),
        (lambda r: {"verification_info": "{"}, "task data is malformed"),
    ],
)
def test_each_kind_of_lie_is_rejected(backend, records, change, reason):
    verdict = verify_rollout(backend, lie(records[0], **change(records[0])), score)
    assert not verdict.accepted
    assert reason in verdict.reason


def test_tokens_swapped_after_proving_fail(backend, records):
    r = records[0]
    # A whole chunk of other tokens: TOPLOC itself rejects it.
    swapped = [(t + 7) % 90 + 4 for t in r.output_ids[:32]] + r.output_ids[32:]
    verdict = verify_rollout(backend, lie(r, output_ids=swapped), score)
    assert not verdict.accepted
    assert "TOPLOC rejected" in verdict.reason
    # A few tokens: within TOPLOC's tolerance per chunk, but not the logprob check's.
    swapped = [(t + 7) % 90 + 4 for t in r.output_ids[:8]] + r.output_ids[8:]
    verdict = verify_rollout(backend, lie(r, output_ids=swapped), score)
    assert not verdict.accepted


def test_records_from_another_model_fail_toploc(model_dirs, records):
    other = TorchBackend(model_dirs[1], device="cpu")
    verdicts = [verify_rollout(other, r, score) for r in records]
    assert not any(v.accepted for v in verdicts)
    assert all("TOPLOC rejected" in v.reason for v in verdicts)
