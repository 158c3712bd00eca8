"""The named checks intake, the validator and the trainer's feed share: each passes an
honest record and names what is wrong with a bad one in its one sentence."""

from __future__ import annotations

import pytest

from swarmrl.rollouts import checks
from swarmrl.rollouts.checks import Assignment
from swarmrl.tasks import Task
from tests.unit.test_rollout_records import record

NODE = "0x" + "ab" * 20
TASK = Task(
    problem_id="arith-0-1",
    task_type="math",
    prompt="What is 2 + 2?",
    verification_info={"ground_truth": "4"},
)
ASKED = Assignment(
    run="demo",
    node=NODE.upper().replace("0X", "0x"),  # addresses compare whatever their case
    step=3,
    group_size=2,
    max_tokens=64,
    temperature=1.0,
    top_p=1.0,
    seed=2**63 + 5,
    budgets={"arith-0-1": 32, "arith-0-2": 32},
)
EOS = frozenset({5})


def test_an_honest_record_passes_every_check():
    r = record()
    assert checks.provenance(r, ASKED) is None
    assert checks.known_task(r, {TASK.problem_id: TASK}) is None
    assert checks.same_task(r, TASK) is None
    assert checks.prompt(r, [1, 2, 3]) is None
    for check in (
        checks.within_max_tokens,
        checks.logprobs_per_token,
        checks.proofs_per_chunk,
        checks.logprobs_bounded,
    ):
        assert check(r) is None
    assert checks.vocabulary(r, 6) is None
    assert checks.finish(r, EOS) is None


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        ({"run": "other"}, "its run is other, not the demo asked for"),
        ({"node": "0x" + "cd" * 20}, f"its node is {'0x' + 'cd' * 20}, not the {ASKED.node}"),
        ({"policy_step": 4}, "its policy step is 4, not the 3 asked for"),
        ({"seed": 1}, f"its seed is 1, not the {2**63 + 5} asked for"),
        ({"max_tokens": 63}, "its max_tokens is 63, not the 64 asked for"),
        ({"temperature": 0.5}, "its temperature is 0.5, not the 1.0 asked for"),
        ({"top_p": 0.9}, "its top_p is 0.9, not the 1.0 asked for"),
        ({"target_len": 16}, "its budget is 16, not the 32 asked for"),
    ],
)
def test_provenance_names_the_first_value_not_asked_for(change, reason):
    assert checks.provenance(record(**change), ASKED).startswith(reason)


def test_what_an_assignment_does_not_know_is_not_checked():
    # A file checked by hand: no order, so no seed and no budgets to hold it to.
    by_hand = Assignment("demo", NODE, 3, 2, 64, 1.0, 1.0)
    assert checks.provenance(record(seed=1, target_len=16), by_hand) is None


def test_a_submission_answers_its_order_exactly():
    honest = [record(problem_id=p, sample=i) for p in ("arith-0-1", "arith-0-2") for i in range(2)]
    assert checks.answers(honest, ASKED) is None
    assert checks.answers([*honest, honest[0]], ASKED) == "it holds one sample twice"
    assert checks.answers([*honest[:3], record(problem_id="x", sample=0)], ASKED) == (
        "it does not answer its order: 1 samples missing, 1 not asked for"
    )
    relabelled = [*honest[:3], record(problem_id="arith-0-2", sample=1, temperature=0.5)]
    assert checks.answers(relabelled, ASKED) == "its temperature is 0.5, not the 1.0 asked for"


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        ({"task_type": "code"}, "its task type differs from the task set's arith-0-1"),
        ({"prompt": "What is 2 + 3?"}, "its prompt differs from the task set's arith-0-1"),
        (
            {"verification_info": '{"ground_truth":"5"}'},
            "its verification info differs from the task set's arith-0-1",
        ),
    ],
)
def test_a_records_copy_of_its_task_must_be_the_task_sets(change, reason):
    assert checks.same_task(record(**change), TASK) == reason


def test_the_record_checks_say_what_is_wrong():
    assert checks.known_task(record(problem_id="x"), {"arith-0-1": TASK}) == (
        "its problem_id is not in the task set"
    )
    assert checks.prompt(record(), [1, 2]) == (
        "its prompt ids are not the task's prompt with its budget"
    )
    long = record(max_tokens=1, finish_reason="length")
    assert checks.within_max_tokens(long) == "2 output tokens exceed its max_tokens 1"
    assert checks.logprobs_per_token(record(logprobs=[-1.0])) == "1 logprobs for 2 output tokens"
    assert checks.proofs_per_chunk(record(proofs=[])) == "0 proofs for 1 chunks of output"
    assert checks.logprobs_bounded(record(logprobs=[-1.0, 0.5])) == (
        "its log-probabilities are not all finite and at most 0"
    )
    assert checks.vocabulary(record(), 5) == "its token ids fall outside the model's vocabulary"


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        ({"output_ids": [5, 4]}, "its output goes on past an end-of-sequence token"),
        ({"finish_reason": "length"}, "its finish reason is length, but its tokens say eos"),
        ({"output_ids": [4, 4]}, "its output stops at 2 of 64 tokens with no end-of-sequence"),
        (
            {"output_ids": [4, 4], "max_tokens": 2},
            "its finish reason is eos, but its tokens say length",
        ),
    ],
)
def test_the_finish_reason_must_be_what_the_tokens_say(change, reason):
    assert checks.finish(record(**change), EOS) == reason


def test_a_group_is_its_samples_given_one_prompt():
    assert checks.group([record(sample=0), record(sample=1)], 2) is None
    assert checks.group([record(sample=0), record(sample=0)], 2) == (
        "its group holds samples 0, 0, where 2 (0 to 1) were asked for"
    )
    assert checks.group([record(sample=0), record(sample=1, prompt_ids=[1, 2])], 2) == (
        "its group's samples were not given one prompt"
    )


def test_a_policy_step_must_be_published_and_fresh():
    assert checks.step_published(3, 3) is None
    assert checks.step_published(4, 3) == "policy step 4 was never published"
    assert checks.step_published(0, None) == "policy step 0 was never published"
    assert checks.step_fresh(1, 3, 2) is None
    assert checks.step_fresh(0, 3, 2) == "policy step 0 is stale (newest 3)"
