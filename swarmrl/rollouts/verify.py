"""A validator's check of rollout records, from the records alone.

Per record: the prompt ids are the task's prompt with its stated budget; the
output fits the sampling limits; one prefill pass recomputes the hidden states
and every TOPLOC chunk must be accepted; the claimed log-probabilities must be
the model's (so a node cannot misreport the sampling distribution GRPO relies
on); and the rewards are recomputed by the validator's own verifiers, never
taken from the node.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

from swarmrl import toploc
from swarmrl.models.backend import PROOF_CHUNK, PROOF_TOPK, Backend
from swarmrl.rollouts.generate import prompt_ids
from swarmrl.rollouts.records import Rollout
from swarmrl.tasks import Task, length_penalty

# Log-probabilities recomputed by prefill differ from decode-time ones only by
# float reassociation (batching, KV cache); a mean gap past this is not rounding.
LOGPROB_MEAN_TOLERANCE = 0.02
REWARD_TOLERANCE = 1e-9


@dataclass(frozen=True)
class Verdict:
    """The outcome for one record; ``reason`` says why it was rejected."""

    accepted: bool
    reason: str = ""
    chunks: int = 0
    chunks_accepted: int = 0
    task_reward: float | None = None


def verify_rollout(
    backend: Backend, rollout: Rollout, score: Callable[[Task, str], float]
) -> Verdict:
    """Check one record; never raises for a bad record, only rejects it."""
    try:
        task = rollout.task()
    except ValueError as e:
        return Verdict(False, f"its task data is malformed ({e})")
    if rollout.prompt_ids != prompt_ids(backend.tokenizer, rollout.prompt, rollout.target_len):
        return Verdict(False, "its prompt ids are not the task's prompt with its budget")
    n = len(rollout.output_ids)
    if n > rollout.max_tokens:
        return Verdict(False, f"{n} output tokens exceed its max_tokens {rollout.max_tokens}")
    if len(rollout.logprobs) != n:
        return Verdict(False, f"{len(rollout.logprobs)} logprobs for {n} output tokens")
    chunks = math.ceil(n / PROOF_CHUNK)
    if len(rollout.proofs) != chunks:
        return Verdict(False, f"{len(rollout.proofs)} proofs for {chunks} chunks of output")
    try:
        prefill = backend.prefill(
            rollout.prompt_ids, rollout.output_ids, temperature=rollout.temperature
        )
    except ValueError as e:
        return Verdict(False, f"its tokens cannot be replayed ({e})")
    results = toploc.verify_proofs(prefill.hidden, rollout.proofs, PROOF_CHUNK, PROOF_TOPK)
    passed = sum(r.accepted for r in results)
    if passed < chunks:
        rejected = f"TOPLOC rejected {chunks - passed} of {chunks} chunks"
        return Verdict(False, rejected, chunks, passed)
    gap = sum(abs(a - b) for a, b in zip(prefill.logprobs, rollout.logprobs, strict=True)) / n
    if not math.isfinite(gap) or gap > LOGPROB_MEAN_TOLERANCE:
        return Verdict(False, f"its logprobs are off by {gap:.3g} on average", chunks, passed)
    text = backend.tokenizer.decode(rollout.output_ids, skip_special_tokens=True)
    try:
        task_reward = score(task, text)
    except ValueError as e:
        return Verdict(False, f"its task cannot be scored ({e})", chunks, passed)
    penalty = length_penalty(rollout.target_len, n)
    for name, claimed, actual in (
        ("task reward", rollout.task_reward, task_reward),
        ("length penalty", rollout.length_penalty, penalty),
        ("reward", rollout.reward, task_reward - penalty),
    ):
        if not abs(claimed - actual) <= REWARD_TOLERANCE:
            return Verdict(
                False, f"its {name} is {claimed:g}, recomputed {actual:g}", chunks, passed
            )
    return Verdict(True, "", chunks, passed, task_reward)
