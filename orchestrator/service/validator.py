"""A validator worker process: every received submission checked against its own order.

The daemon runs ``validator_workers`` of them, each on its own device, sharing the
submissions through the ledger's leases (:mod:`orchestrator.service.ledger.submissions`):
a worker claims the oldest submission no live lease holds, judges it, and hands its
records to the trainer and writes its verdict only while its lease holds. A thread
renews the worker's leases every ``RENEW_SECONDS`` while the process lives, so a live
worker keeps what it judges however long that takes; a worker that dies leaves its
lease to expire after ``LEASE_SECONDS``, and the daemon's restart of it (same worker
id, a new token) releases it at once. Each submission is so judged by one worker at a
time and gets one verdict: a verdict moves a submission only from 'received'.

It checks each submission with
:func:`swarmrl.rollouts.verify.verify_rollouts`: the tasks from the
orchestrator's task set, the run, node, step, group size and sampling settings
from the order it issued, never from the file. Rewards are always recomputed
(code at ``code_check_rate``); prefill (TOPLOC and log-probabilities under the
policy of the submission's step) runs on every submission of a node that has
not yet earned trust, then on ``validation_rate`` of them, chosen by the
submission's digest so a restarted validator chooses the same. A submission with
rejected records resets the node's trust; only evidence
(:mod:`swarmrl.rollouts.tolerances`) bans it. A prefilled submission's sampled tokens
are judged together with the node's earlier prefilled ones (its colder-sampling sums,
kept in the ledger and added to in the transaction that records the verdict).

A prefilled submission is prefilled once more with the newest step its node could
not have claimed (``async_level`` + 1 behind its own; none in a run's first steps),
so that a node generating with a policy too old to claim, claiming the current one,
is rejected (the ``staleness`` tolerance). It costs a second weight load and prefill
per prefilled submission: a worker holds one policy in memory at a time, in the
precision the order declares (bf16 in a run whose nodes sample in bf16, as on GPUs),
on its own device.

Accepted records go to the trainer's spool with the validator's rewards, never
the node's; the outcome (units, reason, evidence) goes to the ledger, where the
recorder commits it on chain and slashes on evidence.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import random
import secrets
import sqlite3
import threading
import time
from pathlib import Path
from typing import Any

from orchestrator.run_dir import RunDir
from orchestrator.service.ledger import Ledger
from orchestrator.service.ledger.home import ledger_path
from orchestrator.service.ledger.submissions import Lease, SubmissionRow
from orchestrator.service.stop import StopSignal
from orchestrator.trainer.feed import Spool
from swarmrl.models.backend import Backend, Precision
from swarmrl.models.held import HeldPolicy
from swarmrl.rollouts import checks
from swarmrl.rollouts.records import Rollout
from swarmrl.rollouts.tolerances import NO_SUMS, TemperatureSums
from swarmrl.rollouts.verify import OlderStep, Verdict, verify_submission
from swarmrl.tasks import Task
from swarmrl.tasks.rewards import task_reward
from swarmrl.work.assign import WorkOrder
from swarmrl.work.states import NodeState, SubmissionStatus

log = logging.getLogger("swarmrl.validator")

POLL_SECONDS = 0.5
# A dead worker's submission waits this long for another worker when the daemon does not
# restart it (a restart releases it at once); a live worker renews well before.
LEASE_SECONDS = 60.0
RENEW_SECONDS = LEASE_SECONDS / 4  # three renewals may fail (a busy ledger) before it lapses
# Submissions a worker claims at a time: one, so an idle worker finds every submission
# not being judged. Claiming several to judge by step would save few weight loads: past
# a run's first steps, the staleness prefill loads another step's weights between any
# two prefills.
CLAIM = 1


@dataclasses.dataclass(frozen=True)
class ValidatorConfig:
    data_dir: Path
    run_dir: Path
    tasks_file: Path
    validation_rate: float
    trust_after: int
    code_check_rate: float
    device: str | None
    async_level: int  # how many steps behind the newest a node may generate
    # The worker's id, its leases' owner, the same across its restarts: its child's name
    # (`validator` when it is the only one).
    worker: str = "validator"


def chosen(digest: str, rate: float, salt: str) -> bool:
    """A fair coin of probability ``rate`` that is a function of the digest."""
    return random.Random(f"{salt}/{digest}").random() < rate


def spool_sampler(node: str) -> str:
    """The trainer spool's sampler name for a node's files."""
    return "n" + node.lower().removeprefix("0x")


class Validator:
    """Judges submissions; holds the policy of the step it last prefilled with."""

    def __init__(self, config: ValidatorConfig, ledger: Ledger, tasks: dict[str, Task]) -> None:
        self.config = config
        self.ledger = ledger
        self.tasks = tasks
        self.lease = Lease(config.worker, secrets.token_hex(8))
        self.run_folder = RunDir(config.run_dir)
        self.spool = Spool(self.run_folder.spool)
        self.policy = HeldPolicy(self._load)  # one policy in memory at a time

    def _load(self, model_dir: Path, precision: Precision) -> Backend:
        from swarmrl.models import load_backend

        return load_backend("torch", model_dir, device=self.config.device, precision=precision)

    def backend_at(self, step: int, precision: Precision) -> Any:
        """The policy of ``step`` (the trainer keeps every step's weights) in
        ``precision``, the one the order declared for sampling: the validator compares
        like with like."""
        return self.policy.hold(self.run_folder.step(step), step, precision)

    def older_step(self, step: int, precision: Precision) -> OlderStep | None:
        """The step a submission claiming ``step`` is checked for staleness against: the
        newest one a node could not have claimed while ``step`` was the newest, when its
        weights are on disk."""
        older = step - self.config.async_level - 1
        if older < 0 or not self.run_folder.step(older).is_dir():
            return None
        return OlderStep(older, lambda: self.backend_at(older, precision))

    def run_once(self) -> int:
        """Claims what is waiting and judges it; returns how many submissions it judged."""
        claimed = self.ledger.submissions.claim(self.lease, CLAIM, time.time(), LEASE_SECONDS)
        for row in claimed:
            self.judge(row)
        return len(claimed)

    def judge(self, row: SubmissionRow) -> None:
        """Judges a submission this worker claimed; its verdict (and its accepted records
        to the trainer) only while the worker's lease holds it."""
        issued = self.ledger.orders.get(row.order_id)
        node = self.ledger.nodes.get(row.node)
        if issued is None or node is None:  # intake checked both; a damaged ledger otherwise
            self._finish(
                row,
                [],
                "its order or node is missing from the ledger",
                slashable=False,
                prefilled=False,
            )
            return
        records, why = checks.read_submitted(Path(row.file))
        if why is not None:
            self._finish(row, [], why, slashable=False, prefilled=False)
            return
        if self.run_folder.latest() is None or not self.run_folder.step(row.step).is_dir():
            self._finish(
                row,
                [],
                f"the policy of step {row.step} is not on disk",
                slashable=False,
                prefilled=False,
            )
            return
        # Trust is earned by passing full checks and spent by abandoning orders.
        trusted = node.trusted - node.abandoned >= self.config.trust_after
        prefill = not trusted or chosen(row.digest, self.config.validation_rate, "prefill")
        check_code = chosen(row.digest, self.config.code_check_rate, "code")
        asked = issued.order.assignment(row.step)
        from swarmrl.tasks.math import cpu_seconds_with_checker

        began = cpu_seconds_with_checker()
        # Without a prefill only the tokenizer is needed, the same at every step: the
        # weights of row.step are loaded only to prefill with them.
        backend = (
            self.backend_at(row.step, asked.precision)
            if prefill or self.policy.backend is None
            else self.policy.backend
        )
        judged = verify_submission(
            backend,
            records,
            self.tasks,
            asked,
            task_reward,
            older=self.older_step(row.step, asked.precision) if prefill else None,
            prefill=prefill,
            prior=node.temperature,
            # Code tests are run on ``code_check_rate`` of the submissions; on the others
            # a code record's own claim stands (math never does).
            code_claims=not check_code,
        )
        verdicts, sums = judged.verdicts, judged.temperature
        seconds = cpu_seconds_with_checker() - began
        self._note_cost(row, len(records), seconds, prefill, trusted)
        evidence = [v for v in verdicts if v.slashable]
        if evidence:
            self._finish(
                row,
                [],
                evidence[0].reason,
                slashable=True,
                prefilled=prefill,
                seconds=seconds,
                temperature=sums,
            )
            return
        accepted = [
            _with_rewards(r, v) for r, v in zip(records, verdicts, strict=True) if v.accepted
        ]
        reasons = [v.reason for v in verdicts if not v.accepted]
        reason = f"{len(reasons)} of {len(records)} rejected: {reasons[0]}" if reasons else ""
        if accepted and not self._spool(row, issued.order, accepted):
            log.warning(
                "lost the lease on %s while judging it; its verdict is left to the worker "
                "that took it over",
                row.digest[:12],
            )
            return
        # A rejected submission's sums count too (TemperatureSums says why).
        finished = self._finish(
            row,
            accepted,
            reason,
            slashable=False,
            prefilled=prefill,
            seconds=seconds,
            temperature=sums,
        )
        if finished and reasons:
            # Short of evidence, a rejection may be honest noise: it costs the node its
            # trust, so what it sends next is checked in full until it earns it again.
            self.ledger.nodes.reset_trust(row.node)

    def _note_cost(
        self, row: SubmissionRow, rollouts: int, cpu: float, prefill: bool, trusted: bool
    ) -> None:
        """One line per judged submission in ``validation.jsonl``: what checking cost
        (loading the step's weights included), and whether the node was trusted yet."""
        line = {
            "digest": row.digest,
            "worker": self.config.worker,
            "rollouts": rollouts,
            "cpu_seconds": cpu,
            "prefill": prefill,
            "trusted": trusted,
        }
        with (self.config.data_dir / "validation.jsonl").open("a") as f:
            f.write(json.dumps(line) + "\n")

    def _spool(self, row: SubmissionRow, order: WorkOrder, records: list[Rollout]) -> bool:
        """Hands the accepted records to the trainer, while this worker's lease holds the
        submission; returns whether it held (else another worker took it over)."""
        from orchestrator.trainer.feed import spool_name

        name = spool_sampler(row.node)
        file = spool_name(name, order.counter)
        # Under the lease, so no other worker spools it meanwhile; a worker restarted after
        # spooling, before writing the outcome, must not hand the trainer the same groups
        # twice: the file is there, read or not.
        with self.ledger.submissions.holding(row.digest, self.lease) as held:
            if held and not any(
                (d / file).exists() for d in (self.spool.directory, self.spool.read_dir)
            ):
                self.spool.put(name, order.counter, records)
        return held

    def _finish(
        self,
        row: SubmissionRow,
        accepted: list[Rollout],
        reason: str,
        *,
        slashable: bool,
        prefilled: bool,
        seconds: float = 0.0,
        temperature: TemperatureSums = NO_SUMS,
    ) -> bool:
        """Writes the verdict and what follows from it (trust, a ban); returns whether it
        was written: not when this worker lost its lease, and another worker's verdict
        (and its consequences) stands."""
        status = SubmissionStatus.ACCEPTED if accepted else SubmissionStatus.REJECTED
        if not self.ledger.submissions.set_outcome(
            row.digest,
            status,
            len(accepted),
            reason[:300],
            slashable,
            prefilled,
            time.time(),
            temperature,
            lease=self.lease,
        ):
            log.warning(
                "judged %s, but another worker took it over: its verdict stands",
                row.digest[:12],
            )
            return False
        if prefilled and accepted and not reason:
            self.ledger.nodes.add_trust(row.node)
        if slashable:
            self.ledger.nodes.set_state(
                row.node, NodeState.BANNED, f"evidence: {reason}"[:300], time.time()
            )
        what = f"{len(accepted)} accepted" if accepted else "rejected"
        flag = " EVIDENCE" if slashable else ""
        log.info(
            "validated %s from %s: %s%s%s (%.2f CPU s, prefill %s)",
            row.digest[:12],
            row.node,
            what,
            f" ({reason})" if reason else "",
            flag,
            seconds,
            "yes" if prefilled else "no",
        )
        return True


def _with_rewards(record: Rollout, verdict: Verdict) -> Rollout:
    """The record as the trainer gets it: with the validator's reward."""
    assert verdict.task_reward is not None
    return record.model_copy(
        update={
            "task_reward": verdict.task_reward,
            "reward": verdict.task_reward - record.length_penalty,
        }
    ).sealed()


def renew_leases(ledger: Ledger, lease: Lease, stopped: threading.Event) -> None:
    """Renews ``lease``'s leases every ``RENEW_SECONDS`` until ``stopped``. A failed
    renewal (a ledger busy past its timeout) is tried again at the next: the lease lapses
    only after several, and then the worker's verdict is refused, never doubled."""
    while not stopped.wait(RENEW_SECONDS):
        try:
            ledger.submissions.renew(lease, time.time(), LEASE_SECONDS)
        except (sqlite3.Error, ValueError) as e:  # a damaged ledger stops the main thread
            log.warning("could not renew the leases of %s: %s", lease.worker, e)


def main(config: ValidatorConfig, stop: StopSignal) -> None:
    """The child's body (see ``child``): judge until ``stop`` is set."""
    from swarmrl.cli_options import quiet_transformers
    from swarmrl.tasks import read_tasks

    quiet_transformers()
    tasks = {t.problem_id: t for t in read_tasks(config.tasks_file)}
    ledger = Ledger(ledger_path(config.data_dir), create=False)
    validator = Validator(config, ledger, tasks)
    # This worker's earlier process is dead (the daemon restarts a worker only then):
    # what it was judging is free again now rather than at its lease's expiry.
    if released := ledger.submissions.release_earlier(validator.lease):
        log.info("released %d submission(s) an earlier %s process held", released, config.worker)
    log.info("validator worker %s on %s", config.worker, config.device or "the default device")
    stopped = threading.Event()
    renewer = threading.Thread(
        target=renew_leases, args=(ledger, validator.lease, stopped), name="leases", daemon=True
    )
    renewer.start()
    try:
        while not stop.is_set():
            if validator.run_once() == 0:
                stop.wait(POLL_SECONDS)
    finally:
        stopped.set()
        renewer.join()
        ledger.close()
