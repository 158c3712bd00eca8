"""A validator's check of a node's rollouts, trusting nothing the node wrote.

What each record is checked against comes from the validator: the task from its
own task set (looked up by ``problem_id``), and the run, node, policy step, group
size and sampling settings from an ``Assignment`` (in the swarm, what the node
was assigned; by hand, what the node signed). Per record (the checks that need
no model run are :mod:`swarmrl.rollouts.checks`, shared with intake and the
trainer):

- its provenance and sampling settings are the assignment's;
- its copy of the task is the task set's, and its prompt ids are that task's
  prompt with the budget it states;
- its output fits the sampling limits and its finish reason agrees with its
  tokens (end-of-sequence last, or max_tokens reached);
- one prefill pass recomputes the hidden states (per group: the shared prompt
  once, the outputs together), and every TOPLOC chunk must be accepted; the
  claimed log-probabilities must be the model's under the claimed temperature,
  and every token one that the claimed sampling could draw (the argmax at
  temperature 0, inside the nucleus under top-p), each within the tolerances of
  :mod:`swarmrl.rollouts.tolerances`, which also say which distance is evidence;
- the rewards are recomputed with the validator's verifiers and its task.

Per submission, when the caller names an older policy step (``older``: the newest one
its node could not have claimed): the prefilled records still accepted are prefilled
again with that step, and their claimed log-probabilities must not lean toward its
(the ``staleness`` tolerance), so a node cannot generate with a policy too old to
claim and claim the current one.

Per group (the records of one task): exactly the samples asked for, one prompt,
and no completion repeated unless its recomputed probability makes the repeat
plausible: a node cannot pass one lucky completion off as several samples.

Per submission (the records verified together): its sampled tokens, together with
those of the node's earlier prefilled submissions (``prior``, kept by whoever judges
the node's submissions; none for a file judged on its own), are not likelier than the
claimed sampling draws (the ``temperature`` tolerance), so a node cannot sample colder
than asked and report the log-probabilities the claimed temperature gives them.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace

from swarmrl import toploc
from swarmrl.models.backend import PROOF_CHUNK, PROOF_TOPK, Backend, Prefill
from swarmrl.rollouts import checks
from swarmrl.rollouts.checks import Assignment
from swarmrl.rollouts.generate import PromptIds, prompt_ids
from swarmrl.rollouts.records import Rollout
from swarmrl.rollouts.tolerances import (
    ARGMAX,
    LOGPROBS,
    NO_SUMS,
    NUCLEUS,
    STALENESS,
    TEMPERATURE,
    TOPLOC,
    TOPLOC_TAIL,
    Outcome,
    TemperatureSums,
    Tolerance,
    staleness_fit,
    toploc_distances,
)
from swarmrl.tasks import Task, length_penalty
from swarmrl.tasks.rewards import CODE_TYPES

REWARD_TOLERANCE = 1e-9
# A repeat within a group is rejected when an honest sampler would produce it with
# less than this probability. Honest groups are then wrongly rejected at most about
# this often, and a rejection costs the node that group's reward, never stake.
REPEAT_PLAUSIBILITY = 1e-4


@dataclass(frozen=True)
class Verdict:
    """The outcome for one record; ``reason`` says why it was rejected.

    ``sequence_logprob`` is the validator's log-probability, under the claimed
    sampling, of the record's completion (None when the check stopped earlier).
    ``slashable`` marks a rejection that honest nondeterminism cannot produce
    (a failed proof, a distance past a check's evidence threshold, a deterministic
    reward claimed falsely, output that does not answer what was asked): evidence
    worth a stake, where every other rejection costs the node only the reward.
    ``distances`` are what the prefill measured, per check of
    :mod:`swarmrl.rollouts.tolerances` that ran (how the trust benchmark sees honest
    variation); the ``temperature`` check's is its node's, this submission included.
    """

    accepted: bool
    reason: str = ""
    chunks: int = 0
    chunks_accepted: int = 0
    task_reward: float | None = None
    sequence_logprob: float | None = None
    slashable: bool = False
    distances: Mapping[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class Judged:
    """A submission's verdicts, one per record in order, and what it adds to its node's
    colder-sampling sums (``temperature``: empty when no record drawn at random was
    prefilled)."""

    verdicts: list[Verdict]
    temperature: TemperatureSums


def _evidence(reason: str, chunks: int = 0, passed: int = 0) -> Verdict:
    return Verdict(False, reason, chunks, passed, slashable=True)


def verify_rollout(
    backend: Backend,
    rollout: Rollout,
    task: Task,
    asked: Assignment,
    score: Callable[[Task, str], float],
    *,
    prefill: bool = True,
) -> Verdict:
    """Check one record against the validator's ``task`` and what was ``asked``; never
    raises for a bad record, only rejects it. Without ``prefill`` the model is not run:
    TOPLOC, log-probabilities and sampleability go unchecked (the swarm prefills a
    sample of submissions); everything else, rewards included, is still checked."""
    expected = prompt_ids(backend.tokenizer, task.prompt, rollout.target_len)
    if early := _unprefilled_verdict(backend, rollout, task, asked, expected):
        return early
    if not prefill:
        return _rewards_verdict(backend, rollout, task, score, chunks=0, passed=0, logprob=None)
    return _prefilled_verdict(backend, rollout, task, score, _prefill_one(backend, rollout))


def _unprefilled_verdict(
    backend: Backend, rollout: Rollout, task: Task, asked: Assignment, expected: list[int]
) -> Verdict | None:
    """The checks that need no model run (`expected`: the task's prompt ids with the
    record's budget): a rejection, or None when all pass."""
    error = (
        checks.provenance(rollout, asked)
        or checks.same_task(rollout, task)
        or checks.prompt(rollout, expected)
        or checks.within_max_tokens(rollout)
        or checks.logprobs_per_token(rollout)
        or checks.proofs_per_chunk(rollout)
        or checks.finish(rollout, backend.eos_ids)
    )
    return None if error is None else _evidence(error)


def _prefill_one(backend: Backend, rollout: Rollout) -> Prefill | ValueError:
    try:
        return backend.prefill(
            rollout.prompt_ids,
            rollout.output_ids,
            temperature=rollout.temperature,
            top_p=rollout.top_p,
        )
    except ValueError as e:
        return e


def _prefill_group(backend: Backend, members: Sequence[Rollout]) -> list[Prefill | ValueError]:
    """Prefills of records that share a prompt and sampling settings, computed together;
    should one record's tokens be unreplayable, each is prefilled alone, so only that
    one fails."""
    first = members[0]
    try:
        return list(
            backend.prefill_group(
                first.prompt_ids,
                [r.output_ids for r in members],
                temperature=first.temperature,
                top_p=first.top_p,
            )
        )
    except ValueError:
        return [_prefill_one(backend, r) for r in members]


def _prefilled_verdict(
    backend: Backend,
    rollout: Rollout,
    task: Task,
    score: Callable[[Task, str], float],
    prefill: Prefill | ValueError,
    *,
    code_claims: bool = False,
) -> Verdict:
    """The verdict on a record that passed the unprefilled checks, given its prefill."""
    if isinstance(prefill, ValueError):
        return Verdict(False, f"its tokens cannot be replayed ({prefill})")
    n = len(rollout.output_ids)
    chunks = math.ceil(n / PROOF_CHUNK)
    results = toploc.verify_proofs(prefill.hidden, rollout.proofs, PROOF_CHUNK, PROOF_TOPK)
    passed = sum(r.accepted for r in results)
    gaps = [abs(a - b) for a, b in zip(prefill.logprobs, rollout.logprobs, strict=True)]
    outside = max(prefill.scores.outside)
    distances = {**toploc_distances(results, n), LOGPROBS.check: sum(gaps) / n}
    if rollout.temperature == 0:
        distances[ARGMAX.check] = outside
    elif rollout.top_p < 1:
        distances[NUCLEUS.check] = outside
    failed = [
        (t, distances[t.check], outcome)
        for t in (TOPLOC, TOPLOC_TAIL, LOGPROBS, ARGMAX, NUCLEUS)
        if t.check in distances and (outcome := t.judge(distances[t.check])) is not Outcome.PASS
    ]
    if failed:
        # Evidence first: a record past one check's rejection threshold and another's
        # evidence threshold is evidence (max keeps the first of equals).
        tolerance, distance, outcome = max(failed, key=lambda f: f[2] is Outcome.EVIDENCE)
        judged = results[:-1] if TOPLOC_TAIL.check in distances else results
        return Verdict(
            False,
            _beyond(
                tolerance, distance, rollout, prefill, sum(not r.accepted for r in judged), chunks
            ),
            chunks,
            passed,
            slashable=outcome is Outcome.EVIDENCE,
            distances=distances,
        )
    verdict = _rewards_verdict(
        backend,
        rollout,
        task,
        score,
        chunks,
        passed,
        prefill.scores.sequence_logprob,
        code_claims=code_claims,
    )
    return replace(verdict, distances=distances)


def _beyond(
    tolerance: Tolerance, distance: float, rollout: Rollout, prefill: Prefill, bad: int, chunks: int
) -> str:
    """Why a record is past a tolerance, in one sentence."""
    if tolerance is TOPLOC and bad:
        return f"TOPLOC rejected {bad} of {chunks} chunks"
    if tolerance is TOPLOC:
        return (
            f"its worst TOPLOC chunk lies at {distance:.2f} of TOPLOC's bounds, past the "
            f"{tolerance.reject:g} no honest node came near"
        )
    if tolerance is TOPLOC_TAIL:
        return (
            f"its last TOPLOC chunk ({len(rollout.output_ids) % PROOF_CHUNK} tokens) lies "
            f"at {distance:.2f} of TOPLOC's bounds, past them"
        )
    if tolerance is LOGPROBS:
        return f"its logprobs are off by {distance:.3g} on average"
    worst = prefill.scores.outside.index(max(prefill.scores.outside))
    if tolerance is ARGMAX:
        return (
            f"its token at {worst} is {distance:.3g} nats below the argmax, "
            "so it was not sampled greedily as claimed"
        )
    return (
        f"its token at {worst} lies outside the top-p {rollout.top_p:g} nucleus "
        f"({distance:.0%} into the tail), so it was not sampled as claimed"
    )


def _rewards_verdict(
    backend: Backend,
    rollout: Rollout,
    task: Task,
    score: Callable[[Task, str], float],
    chunks: int,
    passed: int,
    logprob: float | None,
    *,
    code_claims: bool = False,
) -> Verdict:
    if code_claims and task.task_type in CODE_TYPES:
        task_reward = rollout.task_reward  # its claim stands: no decode, no test run
    else:
        text = backend.tokenizer.decode(rollout.output_ids, skip_special_tokens=True)
        try:
            task_reward = score(task, text)
        except ValueError as e:
            return Verdict(False, f"its task cannot be scored ({e})", chunks, passed)
    penalty = length_penalty(rollout.target_len, len(rollout.output_ids))
    for name, claimed, actual in (
        ("task reward", rollout.task_reward, task_reward),
        ("length penalty", rollout.length_penalty, penalty),
        ("reward", rollout.reward, task_reward - penalty),
    ):
        if not abs(claimed - actual) <= REWARD_TOLERANCE:
            # A code test can time out here and pass there; every other verifier is
            # a pure function of the text.
            return Verdict(
                False,
                f"its {name} is {claimed:g}, recomputed {actual:g}",
                chunks,
                passed,
                slashable=task.task_type not in CODE_TYPES,
            )
    return Verdict(True, "", chunks, passed, task_reward, logprob)


def repeat_plausibility(group_size: int, copies: int, sequence_logprob: float) -> float:
    """An upper bound on the chance that an honest sampler, having drawn a completion of
    probability p once, draws it again at least ``copies - 1`` times in the other
    ``group_size - 1`` samples: C(n-1, k-1) * p^(k-1)."""
    log_bound = math.log(math.comb(group_size - 1, copies - 1)) + (copies - 1) * sequence_logprob
    return math.exp(min(log_bound, 0.0))


def _group_error(
    group: Sequence[int], rollouts: Sequence[Rollout], verdicts: Sequence[Verdict], n: int
) -> Verdict | None:
    """The verdict on a group that fails its checks: evidence when the group is not
    what was asked for, a plain rejection for an implausible repeat (which an honest
    sampler makes, rarely)."""
    if error := checks.group([rollouts[i] for i in group], n):
        return _evidence(error)
    first: dict[tuple[int, ...], int] = {}
    copies: dict[tuple[int, ...], list[int]] = {}
    for i in group:
        output = tuple(rollouts[i].output_ids)
        first.setdefault(output, i)
        copies.setdefault(output, []).append(rollouts[i].sample)
    for output, repeated in copies.items():
        logprob = verdicts[first[output]].sequence_logprob
        if len(repeated) < 2 or logprob is None:
            continue
        chance = repeat_plausibility(n, len(repeated), logprob)
        if chance < REPEAT_PLAUSIBILITY:
            shown = ", ".join(f"#{s}" for s in sorted(repeated))
            return Verdict(
                False,
                f"samples {shown} of its group are one completion, which the claimed "
                f"sampling repeats with probability {chance:.2g}",
            )
    return None


@dataclass(frozen=True)
class OlderStep:
    """The older policy step a submission's staleness is judged against, and ``load``,
    which gives its backend. ``load`` is called at most once per submission, after
    every prefill with the claimed step's backend is done, so it may hand back that
    same backend with the older step's weights loaded in place."""

    step: int
    load: Callable[[], Backend]


def _stale_verdicts(
    older: OlderStep,
    rollouts: Sequence[Rollout],
    verdicts: list[Verdict | None],
    prefilled: Mapping[int, Prefill],
) -> None:
    """Judges the staleness of the prefilled records still accepted, together: each gets
    the submission's ``staleness`` distance, and past the tolerance is rejected (never
    evidence). Nothing is loaded when no record is left to judge."""
    judged = [i for i, p in prefilled.items() if (v := verdicts[i]) is not None and v.accepted]
    if not judged:
        return
    backend = older.load()
    groups: dict[tuple[tuple[int, ...], float, float], list[int]] = {}
    for i in judged:
        r = rollouts[i]
        groups.setdefault((tuple(r.prompt_ids), r.temperature, r.top_p), []).append(i)
    claimed: list[float] = []
    current: list[float] = []
    then: list[float] = []
    for members in groups.values():
        again = _prefill_group(backend, [rollouts[i] for i in members])
        for i, result in zip(members, again, strict=True):
            if isinstance(result, Prefill):
                claimed += rollouts[i].logprobs
                current += prefilled[i].logprobs
                then += result.logprobs
    fit = staleness_fit(claimed, current, then)
    stale = STALENESS.judge(fit.z) is not Outcome.PASS
    for i in judged:
        verdict = verdicts[i]
        assert verdict is not None  # judged holds only records with a verdict
        verdict = replace(verdict, distances={**verdict.distances, STALENESS.check: fit.z})
        if stale:
            verdict = replace(
                verdict,
                accepted=False,
                reason=(
                    f"its submission's log-probabilities lie {fit.slope:.2f} of the way from "
                    f"step {rollouts[i].policy_step}'s to step {older.step}'s, {fit.z:.3g} "
                    "standard errors past half-way, so it was generated with an older policy "
                    "than it claims"
                ),
            )
        verdicts[i] = verdict


def verify_rollouts(
    backend: Backend,
    rollouts: Sequence[Rollout],
    tasks: Mapping[str, Task],
    asked: Assignment,
    score: Callable[[Task, str], float],
    *,
    prefill: bool = True,
    older: OlderStep | None = None,
) -> list[Verdict]:
    """One verdict per record of a submission judged on its own (no earlier submission
    of its node is known): :func:`verify_submission`'s verdicts."""
    judged = verify_submission(backend, rollouts, tasks, asked, score, prefill=prefill, older=older)
    return judged.verdicts


def verify_submission(
    backend: Backend,
    rollouts: Sequence[Rollout],
    tasks: Mapping[str, Task],
    asked: Assignment,
    score: Callable[[Task, str], float],
    *,
    prefill: bool = True,
    older: OlderStep | None = None,
    prior: TemperatureSums = NO_SUMS,
    code_claims: bool = False,
) -> Judged:
    """One verdict per record, in order: each record's own checks, then its group's;
    and what the submission adds to its node's colder-sampling sums, ``prior`` (what
    its node's earlier prefilled submissions left). With ``code_claims`` a code
    record's claimed task reward stands unscored (the validator runs code tests on a
    sample of submissions); every other reward is recomputed from the text.

    A group that fails its checks has every record rejected with the group's reason
    (a record already rejected keeps its own).
    """
    verdicts: list[Verdict | None] = [None] * len(rollouts)
    to_prefill: dict[tuple[tuple[int, ...], float, float], list[int]] = {}
    expected = PromptIds(backend.tokenizer)  # a group's prompt tokenised once
    for i, rollout in enumerate(rollouts):
        if error := checks.known_task(rollout, tasks):
            verdicts[i] = _evidence(error)
            continue
        task = tasks[rollout.problem_id]
        ids = expected(task.prompt, rollout.target_len)
        if early := _unprefilled_verdict(backend, rollout, task, asked, ids):
            verdicts[i] = early
        elif not prefill:
            verdicts[i] = _rewards_verdict(
                backend, rollout, task, score, 0, 0, None, code_claims=code_claims
            )
        else:
            group = (tuple(rollout.prompt_ids), rollout.temperature, rollout.top_p)
            to_prefill.setdefault(group, []).append(i)
    sampled: dict[int, Prefill] = {}  # the prefilled records drawn at random
    prefilled: dict[int, Prefill] = {}
    for members in to_prefill.values():
        prefills = _prefill_group(backend, [rollouts[i] for i in members])
        for i, result in zip(members, prefills, strict=True):
            task = tasks[rollouts[i].problem_id]
            verdicts[i] = _prefilled_verdict(
                backend, rollouts[i], task, score, result, code_claims=code_claims
            )
            if isinstance(result, Prefill):
                prefilled[i] = result
            if isinstance(result, Prefill) and rollouts[i].temperature > 0:
                sampled[i] = result
    if older is not None:
        _stale_verdicts(older, rollouts, verdicts, prefilled)
    judged = [v for v in verdicts if v is not None]
    assert len(judged) == len(rollouts)  # every branch above gives a verdict
    own = TemperatureSums.of([p.scores for p in sampled.values()])
    checked = _temperature_verdicts(rollouts, judged, sampled, prior.then(own))
    return Judged(_group_verdicts(rollouts, checked, asked), own)


def _temperature_verdicts(
    rollouts: Sequence[Rollout],
    verdicts: list[Verdict],
    sampled: Mapping[int, Prefill],
    sums: TemperatureSums,
) -> list[Verdict]:
    """The verdicts with the node's temperature distance (``sums``: this submission's
    sampled tokens folded into its earlier ones') on each record drawn at random; past
    the tolerance, those accepted so far are rejected (never evidence)."""
    z = sums.z
    colder = TEMPERATURE.judge(z) is not Outcome.PASS
    out = list(verdicts)
    for i in sampled:
        verdict = replace(out[i], distances={**out[i].distances, TEMPERATURE.check: z})
        if colder and verdict.accepted:
            verdict = replace(verdict, accepted=False, reason=_colder(sums, rollouts[i]))
        out[i] = verdict
    return out


def _colder(sums: TemperatureSums, rollout: Rollout) -> str:
    """Why a record drawn at random is rejected as sampled colder than claimed."""
    whose, over = "its submission's", ""
    if sums.submissions > 1:
        whose = "its node's"
        over = f", over its {sums.submissions} prefilled submissions (the latest weighing most)"
    return (
        f"{whose} tokens are {sums.z:.3g} standard deviations likelier than sampling at "
        f"temperature {rollout.temperature:g} draws{over}, so they were sampled colder than "
        "claimed"
    )


def _group_verdicts(
    rollouts: Sequence[Rollout], verdicts: list[Verdict], asked: Assignment
) -> list[Verdict]:
    groups: dict[str, list[int]] = {}
    for i, rollout in enumerate(rollouts):
        groups.setdefault(rollout.problem_id, []).append(i)
    for group in groups.values():
        if failed := _group_error(group, rollouts, verdicts, asked.group_size):
            for i in group:
                if verdicts[i].accepted:
                    verdicts[i] = replace(
                        verdicts[i],
                        accepted=False,
                        reason=failed.reason,
                        slashable=failed.slashable,
                    )
    return verdicts
