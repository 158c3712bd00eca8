"""The checks rollout records must pass, each named once and saying why in one sentence.

Records are checked in three places, all with these: intake (does a submission
answer its work order?), the validator (is each record what was asked, for the
task asked? :mod:`swarmrl.rollouts.verify`) and the trainer's feed (is a file in
its spool fit to train on?). A check returns None when the records pass it, else
the sentence saying why not: about one record ("its ...") or, for checks of a
whole submission, about the submission ("it ...").

What records are checked against is never taken from them: an
:class:`Assignment` (in the swarm derived from the signed work order, by hand
from what the node signed), the task from the checker's own task set.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from swarmrl.models.backend import PROOF_CHUNK, Precision
from swarmrl.rollouts.records import Rollout, read_rollouts
from swarmrl.tasks import Task


def read_submitted(path: Path) -> tuple[list[Rollout], str | None]:
    """The records of a submitted file and None, or none and the sentence why they cannot
    be read. The sentence calls it "its file", never by the path it has on the machine
    reading it: a reason goes back to the node, into the ledger and onto screens."""
    try:
        return read_rollouts(path, name="its file"), None
    except ValueError as e:
        return [], str(e)[:300]
    except OSError as e:  # the disk's, not the file's: the reader words the rest itself
        return [], f"its file cannot be read ({(e.strerror or 'a read error').lower()})"


@dataclass(frozen=True)
class Assignment:
    """What a node was asked to produce; every record must say the same. A work order
    also fixes each record's seed and the thinking budget of each task; a file checked
    by hand knows neither (None). Records do not state the `precision` they were
    sampled in: it is the run's, the one they are prefilled in."""

    run: str
    node: str
    step: int
    group_size: int
    max_tokens: int
    temperature: float
    top_p: float
    seed: int | None = None
    budgets: Mapping[str, int] | None = None  # problem id -> thinking budget
    precision: Precision = "fp32"


def as_asked(field: str, claimed: Any, expected: Any) -> str | None:
    """A value a record states is the one asked for."""
    if claimed == expected:
        return None
    return f"its {field} is {claimed}, not the {expected} asked for"


def provenance(record: Rollout, asked: Assignment) -> str | None:
    """Its run, node, policy step, seed, sampling settings and budget are those asked for."""
    same_node = record.node.lower() == asked.node.lower()
    budget = None if asked.budgets is None else asked.budgets.get(record.problem_id)
    return (
        as_asked("run", record.run, asked.run)
        or (None if same_node else as_asked("node", record.node, asked.node))
        or as_asked("policy step", record.policy_step, asked.step)
        or (None if asked.seed is None else as_asked("seed", record.seed, asked.seed))
        or as_asked("max_tokens", record.max_tokens, asked.max_tokens)
        or as_asked("temperature", record.temperature, asked.temperature)
        or as_asked("top_p", record.top_p, asked.top_p)
        or (None if budget is None else as_asked("budget", record.target_len, budget))
    )


def answers(records: Sequence[Rollout], asked: Assignment) -> str | None:
    """A submission answers its order exactly: the group of each task it names (its
    `budgets`), each sample once, and every record as asked (:func:`provenance`)."""
    tasks = asked.budgets or {}
    wanted = {(problem, i) for problem in tasks for i in range(asked.group_size)}
    given = [(r.problem_id, r.sample) for r in records]
    if len(set(given)) != len(given):
        return "it holds one sample twice"
    if set(given) != wanted:
        missing = len(wanted - set(given))
        extra = len(set(given) - wanted)
        return f"it does not answer its order: {missing} samples missing, {extra} not asked for"
    return next((why for r in records if (why := provenance(r, asked))), None)


def known_task(record: Rollout, tasks: Collection[str]) -> str | None:
    """Its problem id names a task of the checker's task set."""
    return None if record.problem_id in tasks else "its problem_id is not in the task set"


def same_task(record: Rollout, task: Task) -> str | None:
    """Its copy of the task is the task set's."""
    row = task.row()
    for field, theirs, ours in (
        ("task type", record.task_type, row["task_type"]),
        ("prompt", record.prompt, row["prompt"]),
        ("verification info", record.verification_info, row["verification_info"]),
    ):
        if theirs != ours:
            return f"its {field} differs from the task set's {task.problem_id}"
    return None


def prompt(record: Rollout, expected: list[int]) -> str | None:
    """Its prompt ids are the task's prompt with the budget it states (`expected`)."""
    if record.prompt_ids != expected:
        return "its prompt ids are not the task's prompt with its budget"
    return None


def step_published(step: int, newest: int | None) -> str | None:
    """A policy step is one that was published (trained), `newest` the latest."""
    if newest is None or step > newest:
        return f"policy step {step} was never published"
    return None


def step_fresh(step: int, newest: int, async_level: int) -> str | None:
    """A policy step is at most `async_level` steps behind the newest."""
    if newest - step > async_level:
        return f"policy step {step} is stale (newest {newest})"
    return None


def within_max_tokens(record: Rollout) -> str | None:
    """Its output is no longer than its max_tokens."""
    n = len(record.output_ids)
    if n > record.max_tokens:
        return f"{n} output tokens exceed its max_tokens {record.max_tokens}"
    return None


def logprobs_per_token(record: Rollout) -> str | None:
    """One log-probability per output token."""
    n = len(record.output_ids)
    if len(record.logprobs) != n:
        return f"{len(record.logprobs)} logprobs for {n} output tokens"
    return None


def proofs_per_chunk(record: Rollout) -> str | None:
    """One TOPLOC proof per chunk of output."""
    chunks = math.ceil(len(record.output_ids) / PROOF_CHUNK)
    if len(record.proofs) != chunks:
        return f"{len(record.proofs)} proofs for {chunks} chunks of output"
    return None


def logprobs_bounded(record: Rollout) -> str | None:
    """Its log-probabilities are finite and at most 0."""
    if not all(math.isfinite(x) and x <= 0 for x in record.logprobs):
        return "its log-probabilities are not all finite and at most 0"
    return None


def vocabulary(record: Rollout, vocab_size: int) -> str | None:
    """Its token ids are ids of a model with `vocab_size` tokens."""
    if not all(0 <= t < vocab_size for t in (*record.prompt_ids, *record.output_ids)):
        return "its token ids fall outside the model's vocabulary"
    return None


def finish(record: Rollout, eos_ids: frozenset[int]) -> str | None:
    """Its output ends at its first end-of-sequence token or at max_tokens, and its
    finish reason says which."""
    output, n = record.output_ids, len(record.output_ids)
    if any(t in eos_ids for t in output[:-1]):
        return "its output goes on past an end-of-sequence token"
    if output[-1] in eos_ids:
        actual = "eos"
    elif n == record.max_tokens:
        actual = "length"
    else:
        return f"its output stops at {n} of {record.max_tokens} tokens with no end-of-sequence"
    if record.finish_reason != actual:
        return f"its finish reason is {record.finish_reason}, but its tokens say {actual}"
    return None


def group(members: Sequence[Rollout], group_size: int) -> str | None:
    """The records of one task are its samples 0 to `group_size` - 1, given one prompt."""
    samples = sorted(r.sample for r in members)
    if samples != list(range(group_size)):
        shown = ", ".join(map(str, samples[:8])) + (" ..." if len(samples) > 8 else "")
        return (
            f"its group holds samples {shown}, where {group_size} (0 to {group_size - 1}) "
            "were asked for"
        )
    if len({tuple(r.prompt_ids) for r in members}) > 1:
        return "its group's samples were not given one prompt"
    return None
