"""The validator judges a submission against the signed order the ledger keeps, with a
real (randomly initialised) model: records that answer it are accepted and handed to
the trainer under the order's counter; records claiming other settings than the
order's are evidence."""

from __future__ import annotations

import os
import shutil
import signal
import sqlite3
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from orchestrator.run_dir import RunDir
from orchestrator.service import validator as validator_process
from orchestrator.service.child import Child, ChildSpec
from orchestrator.service.ledger import Ledger
from orchestrator.service.ledger.submissions import SubmissionRow
from orchestrator.service.validator import Validator, ValidatorConfig, spool_sampler
from orchestrator.trainer.feed import spool_name
from swarmrl.chain.anvil import dev_accounts
from swarmrl.eip712 import swarm_domain
from swarmrl.models.backend import SamplingParams
from swarmrl.rollouts.generate import Provenance, generate_rollouts
from swarmrl.rollouts.records import write_rollouts
from swarmrl.tasks import Task, write_tasks
from swarmrl.tasks.rewards import task_reward
from swarmrl.work.assign import Slot, WorkOrder

ACCOUNTS = dev_accounts(6)
ORCHESTRATOR, NODE = ACCOUNTS[1], ACCOUNTS[5]
PROVIDER = ACCOUNTS[4].address
DOMAIN = swarm_domain(31337, "0x" + "ee" * 20)
RUN = "0x" + "5a" * 32
STEP = 3
TASKS = {
    f"t{i}": Task(
        problem_id=f"t{i}",
        task_type="math",
        prompt=f"What is {i} + {i}?",
        verification_info={"ground_truth": str(2 * i)},
    )
    for i in range(2)
}
ORDER = WorkOrder(
    run=RUN,
    node=NODE.address,
    counter=7,
    min_step=STEP - 1,
    seed=11,
    group_size=2,
    max_tokens=24,
    temperature=1.0,
    top_p=1.0,
    tasks=[Slot(problem_id=p, budget=16) for p in TASKS],
    deadline=2_000_000_000,
).signed_by(ORCHESTRATOR, DOMAIN)
ORDER_ID = ORDER.digest(DOMAIN).hex()


@pytest.fixture
def validator(tmp_path, model_dirs):
    data_dir = tmp_path / "data"
    run_dir = RunDir.of_orchestrator(data_dir).root
    shutil.copytree(model_dirs[0], RunDir(run_dir).step(STEP))
    ledger = Ledger(data_dir / "ledger.sqlite3")
    ledger.nodes.join(NODE.address, PROVIDER, "peer", "torch", {}, 1.0)
    ledger.orders.add(ORDER_ID, ORDER, 1.0)
    config = ValidatorConfig(
        data_dir=data_dir,
        run_dir=run_dir,
        tasks_file=tmp_path / "tasks.jsonl",  # read only by the process body
        validation_rate=1.0,
        trust_after=1,
        code_check_rate=1.0,
        device="cpu",
        async_level=2,
    )
    yield Validator(config, ledger, TASKS)
    ledger.close()


def submitted(
    validator: Validator,
    backend,
    tmp_path: Path,
    max_tokens: int,
    shift: float = 0.0,
    n: int = 0,
    temperature: float = 1.0,
    order: WorkOrder = ORDER,
) -> str:
    """A submission answering `order` (in the ledger), its records generated with
    `max_tokens` and their claimed log-probabilities moved by `shift` nats; its digest
    (the `n`th submission). Sampled at another `temperature`, it claims the
    order's, with the log-probabilities that one gives its tokens. An order answers
    once: the `n`th submission of the default order answers a copy of its own."""
    if n and order is ORDER:
        order = ORDER.model_copy(update={"counter": 100 + n}).signed_by(ORCHESTRATOR, DOMAIN)
        if validator.ledger.orders.get(order.digest(DOMAIN).hex()) is None:
            validator.ledger.orders.add(order.digest(DOMAIN).hex(), order, 1.0)
    records = generate_rollouts(
        backend,
        list(TASKS.values()),
        n=ORDER.group_size,
        params=SamplingParams(max_tokens=max_tokens, temperature=temperature, top_p=1.0),
        provenance=Provenance(run=RUN, policy_step=STEP, node=NODE.address),
        seed=order.seed,
        score=task_reward,
        target_for=lambda _: 16,
    )
    if temperature != ORDER.temperature:
        records = [
            r.model_copy(
                update={
                    "temperature": ORDER.temperature,
                    "logprobs": backend.prefill(r.prompt_ids, r.output_ids).logprobs,
                }
            ).sealed()
            for r in records
        ]
    records = [
        r.model_copy(update={"logprobs": [x - shift for x in r.logprobs]}).sealed() for r in records
    ]
    path = tmp_path / f"submission-{n}.parquet"
    write_rollouts(records, path)
    digest = f"{n:02x}" * 32
    validator.ledger.submissions.record(
        SubmissionRow(
            digest=digest,
            node=NODE.address,
            order_id=order.digest(DOMAIN).hex(),
            epoch=0,
            step=STEP,
            file=str(path),
            file_sha256="00" * 32,
            rollout_digest="00" * 32,
            signature="",
            received_at=2.0,
        )
    )
    return digest


def test_records_answering_the_order_are_accepted_and_spooled_under_its_counter(
    validator, backend, tmp_path
):
    digest = submitted(validator, backend, tmp_path, ORDER.max_tokens)
    assert validator.run_once() == 1
    row = validator.ledger.submissions.get(digest)
    assert (row.status, row.units, row.reason, row.prefilled) == ("accepted", 4, "", True)
    spooled = validator.spool.directory / spool_name(spool_sampler(NODE.address), ORDER.counter)
    assert spooled.is_file()


def test_records_claiming_other_settings_than_the_order_are_evidence(validator, backend, tmp_path):
    digest = submitted(validator, backend, tmp_path, ORDER.max_tokens - 4)
    assert validator.run_once() == 1
    row = validator.ledger.submissions.get(digest)
    assert (row.status, row.units, row.slashable) == ("rejected", 0, True)
    assert row.reason == "its max_tokens is 20, not the 24 asked for"
    assert validator.ledger.nodes.get(NODE.address).state == "banned"


def test_logprobs_beyond_honest_noise_are_rejected_and_cost_trust_not_stake(
    validator, backend, tmp_path
):
    from swarmrl.rollouts.tolerances import LOGPROBS

    submitted(validator, backend, tmp_path, ORDER.max_tokens, n=1)
    validator.run_once()
    assert validator.ledger.nodes.get(NODE.address).trusted == 1
    between = (LOGPROBS.reject + LOGPROBS.evidence) / 2
    digest = submitted(validator, backend, tmp_path, ORDER.max_tokens, shift=between, n=2)
    validator.run_once()
    row = validator.ledger.submissions.get(digest)
    assert (row.status, row.slashable) == ("rejected", False)
    assert "logprobs are off by" in row.reason
    node = validator.ledger.nodes.get(NODE.address)
    assert (node.state != "banned", node.trusted) == (True, 0)


def test_logprobs_of_another_model_are_evidence(validator, backend, tmp_path):
    from swarmrl.rollouts.tolerances import LOGPROBS

    assert LOGPROBS.evidence is not None
    digest = submitted(validator, backend, tmp_path, ORDER.max_tokens, shift=LOGPROBS.evidence + 1)
    validator.run_once()
    row = validator.ledger.submissions.get(digest)
    assert (row.status, row.slashable) == ("rejected", True)
    assert validator.ledger.nodes.get(NODE.address).state == "banned"


@pytest.mark.parametrize(
    ("precision", "dtype"), [("fp32", torch.float32), ("bf16", torch.bfloat16)]
)
def test_the_validator_prefills_in_the_precision_the_order_declares(validator, precision, dtype):
    backend = validator.backend_at(STEP, precision)
    assert {p.dtype for p in backend.model.parameters()} == {dtype}


@pytest.mark.parametrize("fault", ["damaged", "deleted"])
def test_a_file_that_cannot_be_read_is_rejected_in_words_that_name_no_path(
    validator, backend, tmp_path, fault
):
    digest = submitted(validator, backend, tmp_path, ORDER.max_tokens)
    path = Path(validator.ledger.submissions.get(digest).file)
    if fault == "deleted":
        path.unlink()
    else:
        path.write_bytes(path.read_bytes()[:-64] + bytes(64))  # parquet's footer zeroed
    assert validator.run_once() == 1
    row = validator.ledger.submissions.get(digest)
    assert (row.status, row.units, row.slashable) == ("rejected", 0, False)
    assert (
        row.reason
        == {
            "damaged": "its file is not a readable rollout file (damaged, or not parquet)",
            "deleted": "its file is missing or cannot be opened",
        }[fault]
    )


def test_colder_sampling_adds_up_over_a_nodes_submissions_each_counted_once(
    validator, backend, tmp_path
):
    from swarmrl.rollouts.tolerances import TEMPERATURE

    first = submitted(validator, backend, tmp_path, ORDER.max_tokens, n=1, temperature=0.65)
    [row] = validator.ledger.submissions.claim(validator.lease, 1, time.time(), 60.0)
    validator.judge(row)
    once = validator.ledger.nodes.get(NODE.address).temperature
    assert (once.submissions, validator.ledger.submissions.get(first).status) == (1, "accepted")
    assert 0 < once.z < TEMPERATURE.reject  # alone, not cold enough to reject
    # Judged again (a validator restarted before it saw its verdict), it counts once.
    validator.judge(row)
    assert validator.ledger.nodes.get(NODE.address).temperature == once
    # The sums are the ledger's: a validator started anew on the file judges with them.
    validator.ledger.close()
    validator.ledger = Ledger(tmp_path / "data" / "ledger.sqlite3")
    assert validator.ledger.nodes.get(NODE.address).temperature == once
    for n in (2, 3):
        digest = submitted(validator, backend, tmp_path, ORDER.max_tokens, n=n, temperature=0.65)
        validator.run_once()
        row = validator.ledger.submissions.get(digest)
        # Each as cold as the first; with the ones before it, past the threshold.
        assert (row.status, row.slashable) == ("rejected", False)
        assert f"draws, over its {n} prefilled submissions (the latest weighing most)" in row.reason
        assert row.reason.endswith("so they were sampled colder than claimed")
    node = validator.ledger.nodes.get(NODE.address)
    assert (node.state != "banned", node.trusted) == (True, 0)  # rejected, never evidence
    # The sums ran on past the first rejection, each submission counted once.
    thrice = once.then(once).then(once)
    assert node.temperature.submissions == thrice.submissions == 3
    assert node.temperature.z == pytest.approx(thrice.z)
    assert thrice.z > once.z
    validator.ledger.close()


def eventually(condition: Callable[[], object], what: str, children: list[Child]) -> None:
    """Waits for `condition`, with a deadline generous for a loaded machine; fails at
    once if a worker died on its own."""
    deadline = time.monotonic() + 180
    while not condition():
        for child in children:
            assert child.process is not None
            assert child.process.is_alive(), f"the {child.name} process died on its own"
        assert time.monotonic() < deadline, f"gave up waiting until {what}"
        time.sleep(0.02)


def leases_of(path: Path, worker: str) -> set[str]:
    """The submissions, still received, that a lease of `worker` holds: read from the
    file, as another process sees them."""
    db = sqlite3.connect(path)
    try:
        rows = db.execute(
            "SELECT l.digest FROM leases l JOIN submissions s ON s.digest = l.digest "
            "WHERE l.worker = ? AND s.status = 'received'",
            (worker,),
        ).fetchall()
    finally:
        db.close()
    return {r[0] for r in rows}


def test_two_workers_one_killed_mid_validation_give_every_submission_one_verdict(
    validator, backend, tmp_path
):
    """Two validator worker processes, supervised as the daemon supervises them: one is
    SIGKILLed while its lease holds a submission it is judging, and restarted as the
    daemon restarts it. Every submission gets exactly one verdict, and the trainer each
    accepted file once."""
    ledger, config = validator.ledger, validator.config
    orders = [
        ORDER.model_copy(update={"counter": 20 + n, "seed": 30 + n}).signed_by(ORCHESTRATOR, DOMAIN)
        for n in range(6)
    ]
    for order in orders:
        ledger.orders.add(order.digest(DOMAIN).hex(), order, 1.0)
    digests = [
        submitted(validator, backend, tmp_path, ORDER.max_tokens, n=n, order=order)
        for n, order in enumerate(orders)
    ]
    write_tasks(TASKS.values(), config.tasks_file)
    first, second = (
        Child(
            ChildSpec(
                f"validator-{i}",
                validator_process.main,
                replace(config, worker=f"validator-{i}"),
                data_dir=config.data_dir,
                log_to_stderr=False,
                threads=1,
            )
        )
        for i in range(2)
    )
    path = config.data_dir / "ledger.sqlite3"
    try:
        first.start()
        eventually(lambda: leases_of(path, "validator-0"), "the first worker claims", [first])
        assert first.process is not None
        os.kill(first.process.pid, signal.SIGKILL)
        first.process.join()
        # It died mid-validation: its lease holds a submission that has no verdict.
        assert len(leases_of(path, "validator-0")) == 1
        second.start()
        first.check()  # the daemon's supervision: restarted, a new process of the worker
        assert first.restarts == 1
        eventually(
            lambda: not ledger.submissions.all(status="received"),
            "every submission has a verdict",
            [first, second],
        )
    finally:
        for child in (first, second):
            if child.process is not None:
                child.shutdown()
    rows = [ledger.submissions.get(d) for d in digests]
    assert [(r.status, r.units, r.reason) for r in rows] == [("accepted", 4, "")] * 6
    # One verdict each: each counted once into the node's sums (in the verdict's own
    # transaction), each logged once by the one worker that wrote it.
    node = ledger.nodes.get(NODE.address)
    assert (node.temperature.submissions, node.trusted) == (6, 6)
    logs = "".join((config.data_dir / "logs" / f"validator-{i}.log").read_text() for i in (0, 1))
    assert [logs.count(f"validated {d[:12]} from") for d in digests] == [1] * 6
    sampler = spool_sampler(NODE.address)
    assert sorted(p.name for p in validator.spool.files()) == [
        spool_name(sampler, order.counter) for order in orders
    ]
