"""Generating proven rollouts and verifying them against the validator's own tasks and
assignment, with a real (randomly initialised) model: honest records pass, and each
way a node can lie (rewrite, re-seal, verify) is rejected with its reason."""

from __future__ import annotations

import json
import math

import pytest
import torch

from swarmrl import toploc
from swarmrl.models.backend import PROOF_CHUNK, PROOF_TOPK, SamplingParams, score_tokens
from swarmrl.models.torch_backend import TorchBackend
from swarmrl.rollouts.checks import Assignment
from swarmrl.rollouts.generate import Provenance, generate_rollouts
from swarmrl.rollouts.tolerances import (
    NO_SUMS,
    TAIL_TOKENS,
    TEMPERATURE,
    TEMPERATURE_DECAY,
    TOPLOC,
    TOPLOC_TAIL,
)
from swarmrl.rollouts.verify import (
    REPEAT_PLAUSIBILITY,
    repeat_plausibility,
    verify_rollouts,
    verify_submission,
)
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
TASK_SET = {t.problem_id: t for t in TASKS}
NODE = "0x" + "12" * 20
SAMPLING = SamplingParams(max_tokens=70, temperature=1.0)
ASKED = Assignment("test", NODE, 4, 2, SAMPLING.max_tokens, 1.0, 1.0)


def score(task, text):
    """A stand-in verifier: deterministic in the text, so it can be recomputed."""
    return float(len(text) % 2 == 0)


def generate(backend, params=SAMPLING, tasks=TASKS, n=2, seed=9, target_for=lambda s: 40):
    return generate_rollouts(
        backend,
        tasks,
        n=n,
        params=params,
        provenance=Provenance(run="test", policy_step=4, node=NODE),
        seed=seed,
        score=score,
        target_for=target_for,
        batch_size=4,
    )


@pytest.fixture(scope="module")
def records(backend):
    speeds = []

    def target_for(speed):
        speeds.append(speed)
        return 40 if speed is None else 50

    out = generate(backend, target_for=target_for)
    assert speeds[:2] == [None, None]  # the first batch's two tasks: nothing measured yet
    assert speeds[2] > 0
    return out


def verdicts(backend, records, asked=ASKED, tasks=TASK_SET):
    return verify_rollouts(backend, records, tasks, asked, score)


def lie(record, **changes):
    return record.model_copy(update=changes).sealed()


def rejected_with(backend, records, index, changed, asked=ASKED):
    """The reason record ``index`` is rejected once replaced by ``changed``, verified in
    its group (the rest of the file would only cost time)."""
    group = [i for i, r in enumerate(records) if r.problem_id == records[index].problem_id]
    forged = [changed if i == index else records[i] for i in group]
    verdict = verdicts(backend, forged, asked)[group.index(index)]
    assert not verdict.accepted
    return verdict.reason


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
    for r, verdict in zip(records, verdicts(backend, records), strict=True):
        assert verdict.accepted, verdict.reason
        assert verdict.chunks_accepted == verdict.chunks == len(r.proofs)
        assert verdict.sequence_logprob < 0


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        (lambda r: {"reward": r.reward + 0.5}, "its reward is"),
        (lambda r: {"task_reward": 1 - r.task_reward}, "its task reward is"),
        (lambda r: {"length_penalty": 0.0, "reward": r.task_reward}, "length penalty"),
        (lambda r: {"target_len": r.target_len + 1}, "prompt ids"),
        (lambda r: {"logprobs": [x / 2 for x in r.logprobs]}, "logprobs are off"),
        (lambda r: {"logprobs": r.logprobs[:-1]}, "logprobs for"),
        (lambda r: {"proofs": r.proofs[:-1]}, "proofs for"),
        (lambda r: {"output_ids": [10_000, *r.output_ids[1:]]}, "cannot be replayed"),
    ],
)
def test_each_kind_of_lie_is_rejected(backend, records, change, reason):
    assert reason in rejected_with(backend, records, 0, lie(records[0], **change(records[0])))


def test_one_unreplayable_record_costs_only_itself_in_a_group_prefill(backend, records):
    """A group is prefilled together; a record whose tokens the model cannot take makes
    the validator prefill the group one by one, so its neighbours are still judged."""
    r = records[0]
    forged = lie(r, output_ids=[10_000, *r.output_ids[1:]])
    judged = verdicts(backend, [forged, *records[1:]])
    assert "cannot be replayed" in judged[0].reason
    assert all(v.accepted for v in judged[1:]), [v.reason for v in judged[1:]]
    assert all(v.chunks_accepted == v.chunks > 0 for v in judged[1:])


# -- the task comes from the validator's task set -----------------------------------


def test_a_rewritten_ground_truth_is_rejected_though_the_node_scores_itself_right(backend, records):
    r = records[0]
    text = backend.tokenizer.decode(r.output_ids, skip_special_tokens=True)
    # The node makes its own output the answer and claims full reward; by the record's
    # own copy of the task that would even be consistent.
    forged = lie(
        r,
        verification_info=json.dumps({"ground_truth": text}, separators=(",", ":")),
        task_reward=1.0,
        reward=1.0 - r.length_penalty,
    )
    reason = rejected_with(backend, records, 0, forged)
    assert reason == "its verification info differs from the task set's t0"


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        ({"prompt": "What is 0 + 0? Easy."}, "its prompt differs from the task set's t0"),
        ({"task_type": "code"}, "its task type differs from the task set's t0"),
        ({"problem_id": "t9"}, "its problem_id is not in the task set"),
    ],
)
def test_task_fields_must_be_the_task_sets(backend, records, change, reason):
    assert rejected_with(backend, records, 0, lie(records[0], **change)) == reason


def test_a_code_tasks_tests_rewritten_by_the_node_are_rejected(backend):
    code = Task(
        problem_id="c0",
        task_type="code",
        prompt="Print the sum of two integers.",
        verification_info={"tests": [{"stdin": "1 2\n", "stdout": "3\n"}]},
    )
    (r,) = generate(backend, tasks=[code], n=1)
    # Tests that any program passes: no input, no expected output.
    forged = lie(r, verification_info='{"tests":[{"stdin":"","stdout":""}]}', task_reward=1.0)
    asked = Assignment("test", NODE, 4, 1, 70, 1.0, 1.0)
    (verdict,) = verify_rollouts(backend, [forged], {"c0": code}, asked, score)
    assert verdict.reason == "its verification info differs from the task set's c0"


@pytest.mark.parametrize("prefill", [False, True])
def test_a_code_records_claim_stands_only_where_its_tests_are_not_run(backend, prefill):
    """The validator runs code tests on a sample of submissions (``code_claims`` off);
    on the others a code record's claimed task reward stands, and a math record's never
    does."""
    code = Task(
        problem_id="c0",
        task_type="code",
        prompt="Print the sum of two integers.",
        verification_info={"tests": [{"stdin": "1 2\n", "stdout": "3\n"}]},
    )
    math_task = TASKS[0]
    asked = Assignment("test", NODE, 4, 1, 70, 1.0, 1.0)

    def claiming(task):
        (r,) = generate(backend, tasks=[task], n=1)
        claimed = 1.0 - score(
            task, backend.tokenizer.decode(r.output_ids, skip_special_tokens=True)
        )
        return lie(r, task_reward=claimed, reward=claimed - r.length_penalty)

    def judged(record, task, code_claims):
        (verdict,) = verify_submission(
            backend, [record], {task.problem_id: task}, asked, score,
            prefill=prefill, code_claims=code_claims,
        ).verdicts  # fmt: skip
        return verdict

    code_record, math_record = claiming(code), claiming(math_task)
    stands = judged(code_record, code, code_claims=True)
    assert stands.accepted, stands.reason
    assert stands.task_reward == code_record.task_reward
    run = judged(code_record, code, code_claims=False)
    assert not run.accepted
    assert run.reason.startswith("its task reward is")
    assert not run.slashable  # a test can time out here and pass there
    never = judged(math_record, math_task, code_claims=True)
    assert not never.accepted
    assert never.slashable


# -- provenance and sampling settings come from the assignment ----------------------


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        ({"node": "0x" + "34" * 20}, "its node is 0x3434"),
        ({"run": "another"}, "its run is another, not the test asked for"),
        ({"policy_step": 5}, "its policy step is 5, not the 4 asked for"),
        ({"temperature": 0.5}, "its temperature is 0.5, not the 1.0 asked for"),
        ({"top_p": 0.9}, "its top_p is 0.9, not the 1.0 asked for"),
        ({"max_tokens": 90}, "its max_tokens is 90, not the 70 asked for"),
    ],
)
def test_a_relabelled_record_is_rejected(backend, records, change, reason):
    assert rejected_with(backend, records, 1, lie(records[1], **change)).startswith(reason)


def test_output_longer_than_max_tokens_is_rejected(backend, records):
    r = records[0]
    asked = Assignment("test", NODE, 4, 2, len(r.output_ids) - 1, 1.0, 1.0)
    forged = lie(r, max_tokens=len(r.output_ids) - 1)
    assert "exceed its max_tokens" in rejected_with(backend, records, 0, forged, asked)


# -- groups are independent samples, as many as asked --------------------------------


def copy_of(record, source):
    """``record`` made to carry ``source``'s completion, rewards and proofs."""
    fields = ("output_ids", "logprobs", "proofs", "finish_reason")
    rewards = ("task_reward", "length_penalty", "reward")
    return lie(record, **{f: getattr(source, f) for f in (*fields, *rewards)})


def test_one_completion_copied_across_a_group_is_rejected(backend, records):
    forged = [records[0], copy_of(records[1], records[0]), *records[2:]]
    result = verdicts(backend, forged)
    for verdict in result[:2]:
        assert not verdict.accepted
        assert verdict.reason.startswith("samples #0, #1 of its group are one completion")
    assert all(v.accepted for v in result[2:])  # other groups keep their verdicts


def test_a_repeat_the_sampler_would_make_is_accepted(backend):
    # Greedy decoding gives every sample of a group the same completion, with probability 1.
    greedy = SamplingParams(max_tokens=30, temperature=0)
    records = generate(backend, params=greedy, tasks=TASKS[:1], n=3)
    assert len({tuple(r.output_ids) for r in records}) == 1
    asked = Assignment("test", NODE, 4, 3, 30, 0.0, 1.0)
    result = verdicts(backend, records, asked)
    assert all(v.accepted for v in result), [v.reason for v in result]
    assert all(v.sequence_logprob == 0 for v in result)


def test_repeat_plausibility_follows_the_completions_probability():
    assert repeat_plausibility(4, 2, -0.69) == pytest.approx(1.0)  # p = 0.5, capped at 1
    assert repeat_plausibility(4, 2, -13.8) < REPEAT_PLAUSIBILITY  # p = 1e-6
    assert repeat_plausibility(8, 3, -2.3) == pytest.approx(21 * 0.1**2, rel=0.01)


def test_a_group_must_hold_the_samples_asked_for(backend, records):
    short = [records[0], *records[2:]]
    reason = verdicts(backend, short)[0].reason
    assert reason == "its group holds samples 0, where 2 (0 to 1) were asked for"
    doubled = [records[0], lie(records[1], sample=0), *records[2:]]
    assert all(not v.accepted for v in verdicts(backend, doubled)[:2])
    asked_three = Assignment("test", NODE, 4, 3, 70, 1.0, 1.0)
    assert not any(v.accepted for v in verdicts(backend, records, asked_three))


# -- the claimed sampling settings are how the tokens were sampled -------------------


def test_sampling_at_another_temperature_is_rejected(backend):
    hot = generate(backend, params=SamplingParams(max_tokens=70, temperature=1.6), tasks=TASKS[:1])
    # The node claims the temperature asked for; its logprobs are those it sampled with.
    claimed = [lie(r, temperature=1.0) for r in hot]
    assert not any(v.accepted for v in verdicts(backend, claimed))
    assert "logprobs are off" in verdicts(backend, claimed)[0].reason


def test_sampling_colder_with_the_claimed_temperatures_logprobs_is_rejected(backend):
    # Sampled at half the temperature asked for, with the logprobs the validator computes
    # at the one asked for: no record is wrong on its own, the submission's tokens are
    # too likely together.
    cold = generate(backend, params=SamplingParams(max_tokens=70, temperature=0.5), n=2)
    claimed = [
        lie(r, temperature=1.0, logprobs=backend.prefill(r.prompt_ids, r.output_ids).logprobs)
        for r in cold
    ]
    result = verdicts(backend, claimed)
    assert all(not v.accepted and not v.slashable for v in result)
    assert "sampled colder than claimed" in result[0].reason
    assert result[0].distances[TEMPERATURE.check] > TEMPERATURE.reject


def test_honest_sampling_lies_near_its_expected_logprob(backend, records):
    result = verdicts(backend, records)
    assert all(v.accepted for v in result)
    # One z for the submission, on each of its records.
    assert len({v.distances[TEMPERATURE.check] for v in result}) == 1
    assert abs(result[0].distances[TEMPERATURE.check]) < 4


def node_submissions(backend, temperature, count):
    """``count`` submissions of one node sampled at ``temperature`` (one task, two samples
    each, a seed of their own) with the logprobs the validator computes at the 1.0 asked
    for, judged in turn with the sums the earlier ones left: (own z, verdicts) each."""
    sums, judged = NO_SUMS, []
    for seed in range(count):
        params = SamplingParams(max_tokens=70, temperature=temperature)
        sampled = generate(backend, params=params, tasks=TASKS[:1], seed=seed)
        claimed = [
            lie(r, temperature=1.0, logprobs=backend.prefill(r.prompt_ids, r.output_ids).logprobs)
            for r in sampled
        ]
        result = verify_submission(backend, claimed, TASK_SET, ASKED, score, prior=sums)
        sums = sums.then(result.temperature)
        judged.append((result.temperature.z, result.verdicts))
    return judged


def test_sampling_colder_is_rejected_once_a_nodes_submissions_add_up(backend):
    judged = node_submissions(backend, temperature=0.7, count=4)
    # No submission is past the threshold on its own tokens...
    assert all(0 < z < TEMPERATURE.reject for z, _ in judged)
    assert all(v.accepted for _, verdicts in judged[:2] for v in verdicts)
    # ...but the third is, with the two before it; the sums run on past a rejection.
    for z, verdicts in judged[2:]:
        assert all(not v.accepted and not v.slashable for v in verdicts)
        assert verdicts[0].distances[TEMPERATURE.check] > TEMPERATURE.reject > z
    reason = judged[2][1][0].reason
    z = judged[2][1][0].distances[TEMPERATURE.check]
    assert reason == (
        f"its node's tokens are {z:.3g} standard deviations likelier than sampling at "
        "temperature 1 draws, over its 3 prefilled submissions (the latest weighing most), "
        "so they were sampled colder than claimed"
    )


def test_an_honest_nodes_sums_stay_near_zero_over_its_submissions(backend):
    judged = node_submissions(backend, temperature=1.0, count=4)
    assert all(v.accepted for _, verdicts in judged for v in verdicts)
    assert all(abs(v.distances[TEMPERATURE.check]) < 3 for _, vs in judged for v in vs)


def test_a_nodes_first_submission_is_judged_on_its_own_tokens(backend, records):
    alone = verdicts(backend, records)
    first = verify_submission(backend, records, TASK_SET, ASKED, score)
    assert [v.distances for v in first.verdicts] == [v.distances for v in alone]
    assert first.temperature.z == alone[0].distances[TEMPERATURE.check]
    assert first.temperature.submissions == 1
    # Folded onto earlier sums, the earlier ones weigh TEMPERATURE_DECAY less per submission.
    later = first.temperature.then(first.temperature)
    assert later.excess == pytest.approx((1 + TEMPERATURE_DECAY) * first.temperature.excess)
    assert later.variance == pytest.approx((1 + TEMPERATURE_DECAY**2) * first.temperature.variance)


def test_the_expected_logprob_of_a_draw_is_computed_from_the_whole_distribution():
    probs = torch.tensor([[0.5, 0.25, 0.25]])
    logp = [math.log(0.5), math.log(0.25)]
    mean = 0.5 * logp[0] + 0.5 * logp[1]
    variance = 0.5 * logp[0] ** 2 + 0.5 * logp[1] ** 2 - mean**2
    scores = score_tokens(probs.log(), [1], temperature=1.0, top_p=1.0)
    assert scores.expected == pytest.approx([mean])
    assert scores.variance == pytest.approx([variance])
    # Top-p 0.5 keeps the first token alone: it is drawn for certain.
    scores = score_tokens(probs.log(), [0], temperature=1.0, top_p=0.5)
    assert (scores.expected, scores.variance) == (pytest.approx([logp[0]]), [0.0])
    # Greedy: the argmax, for certain.
    scores = score_tokens(probs.log(), [2], temperature=0.0, top_p=1.0)
    assert (scores.expected, scores.variance) == (pytest.approx([logp[0]]), [0.0])


def test_tokens_outside_the_claimed_nucleus_are_rejected(backend, records):
    # Sampled from the whole distribution, but claimed with top-p 0.3: the logprobs
    # (taken before the nucleus) still match, the tokens do not.
    asked = Assignment("test", NODE, 4, 2, 70, 1.0, 0.3)
    claimed = [lie(r, top_p=0.3) for r in records[:2]]
    result = verdicts(backend, claimed, asked)
    assert not result[0].accepted
    assert "outside the top-p 0.3 nucleus" in result[0].reason
    nucleus = SamplingParams(max_tokens=70, temperature=1.0, top_p=0.3)
    honest = generate(backend, params=nucleus, tasks=TASKS[:1])
    assert all(v.accepted for v in verdicts(backend, honest, asked))


def test_sampled_tokens_claimed_as_greedy_are_rejected(backend, records):
    # At temperature 0 the logprobs are those at temperature 1, so only the argmax
    # check can tell.
    asked = Assignment("test", NODE, 4, 2, 70, 0.0, 1.0)
    claimed = [lie(r, temperature=0.0) for r in records[:2]]
    reason = verdicts(backend, claimed, asked)[0].reason
    assert "nats below the argmax" in reason


def test_a_finish_reason_must_agree_with_the_tokens(backend, records):
    r = next(r for r in records if r.finish_reason == "length")
    reason = rejected_with(backend, records, records.index(r), lie(r, finish_reason="eos"))
    assert reason == "its finish reason is eos, but its tokens say length"
    # Cut short without an end-of-sequence token: not how generation ends.
    cut = lie(r, output_ids=r.output_ids[:32], logprobs=r.logprobs[:32], proofs=r.proofs[:1])
    reason = rejected_with(backend, records, records.index(r), cut)
    assert reason == "its output stops at 32 of 70 tokens with no end-of-sequence"


def test_tokens_swapped_after_proving_fail(backend, records):
    r = records[0]
    # A whole chunk of other tokens: TOPLOC itself rejects it.
    swapped = [(t + 7) % 90 + 4 for t in r.output_ids[:32]] + r.output_ids[32:]
    assert "TOPLOC rejected" in rejected_with(backend, records, 0, lie(r, output_ids=swapped))
    # A few tokens: within TOPLOC's tolerance per chunk, but not the logprob check's.
    swapped = [(t + 7) % 90 + 4 for t in r.output_ids[:8]] + r.output_ids[8:]
    rejected_with(backend, records, 0, lie(r, output_ids=swapped))


def test_records_from_another_model_fail_toploc(model_dirs, records):
    other = TorchBackend(model_dirs[1], device="cpu")
    result = verdicts(other, records)
    assert not any(v.accepted for v in result)
    assert all("TOPLOC rejected" in v.reason for v in result)


def test_a_short_last_chunk_past_toplocs_bounds_is_rejected_but_not_evidence(backend, records):
    """A last chunk of a few tokens scatters too far for honest nodes to stake on it."""
    i, r = next((i, r) for i, r in enumerate(records) if 0 < len(r.output_ids) % 32 < TAIL_TOKENS)
    hidden = backend.prefill(r.prompt_ids, r.output_ids, temperature=r.temperature).hidden
    # States no honest run produced: a third larger, so many exponents differ, not all.
    forged = toploc.build_proofs(hidden.float() * 1.3, PROOF_CHUNK, PROOF_TOPK)

    def verdict_with(proofs, **changes):
        changed = lie(r, proofs=proofs, **changes)
        return verdicts(backend, [*records[:i], changed, *records[i + 1 :]])[i]

    tail = verdict_with([*r.proofs[:-1], forged[-1]])
    assert (tail.accepted, tail.slashable) == (False, False)
    assert 1 < tail.distances[TOPLOC_TAIL.check] < math.inf
    assert tail.distances[TOPLOC.check] <= TOPLOC.reject
    tokens = len(r.output_ids) % PROOF_CHUNK
    assert tail.reason.startswith(f"its last TOPLOC chunk ({tokens} tokens) lies at")
    # A rejection never hides evidence: the forged tail with log-probabilities nats off.
    both = verdict_with([*r.proofs[:-1], forged[-1]], logprobs=[x - 3 for x in r.logprobs])
    assert both.slashable
    assert both.reason.startswith("its logprobs are off by 3")
    # The same states in a full chunk are evidence, and so is a last chunk that
    # matches nothing: a proof that does not parse is no rounding.
    head = verdict_with([forged[0], *r.proofs[1:]])
    assert head.slashable
    assert head.reason == f"TOPLOC rejected 1 of {len(r.proofs)} chunks"
    broken = verdict_with([*r.proofs[:-1], b"not a proof"])
    assert broken.slashable
    assert TOPLOC_TAIL.check not in broken.distances
    assert broken.distances[TOPLOC.check] == math.inf
