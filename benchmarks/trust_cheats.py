"""Cheats: every way a node of simulation/cheater.py cheats, run against the
orchestrator's own intake and validator; per behaviour whether and how it is caught,
how often and how soon, and what it costs the cheater.

Each behaviour runs as fresh nodes of a run with a ledger of its own (SQLite): each
node joins the work server, heartbeats, takes a signed work order, answers it as
the cheating node does (the same :class:`simulation.cheater.Cheat` object: the
backend it loads and keeps, the records it hands in, the header it signs), and hands
it in through intake; what intake receives the :class:`Validator` judges. Every
node, like a volunteer, joined when the oldest policy step was the newest and has
had each newer one since (a stale node kept the first).

Each behaviour runs twice: in a run whose validator prefills every submission (as
it does a new node's), and in one whose validator prefills none (a trusted node's,
unless its digest is among the ``validation_rate`` sampled). In each, a node hands
in one submission after another, judged by the run's one validator and ledger, until
one is caught (refused, rejected or left to expire); then a fresh node takes over (a
banned node could go no further). A check that judges each submission on its own
catches it with the same chance wherever it falls, so the share caught is that
chance; the colder-sampling check judges a node's prefilled submissions together
(:class:`swarmrl.rollouts.tolerances.TemperatureSums`), so where it needs k of them
the share caught is about 1 / k. A node that was honest for ``trust_after``
submissions first is then caught per submission with probability
``rate = r * P(caught | prefilled) + (1 - r) * P(caught | not prefilled)`` at the
orchestrator's default validation rate r (checks that need no prefill, intake and
the recomputed rewards, catch it either way), after 1 / rate submissions on average:
k / r for the colder sampler, whose unprefilled submissions add nothing to its sums.
Evidence costs the node's provider the pool's slash penalty; any other rejection
costs only the rejected work's reward.

The benchmark runs on the default model after a few real training steps (honest
nodes' submissions, validated and trained on by the trainer), so the stale node
is as far behind as a node holding the first step it may no longer use.

A node that never answers runs as fresh nodes too, each taking orders and leaving
them to expire until the scheduler refuses it work (``abandon_limit`` orders in a
row): caught then, after that many orders.

    python -m benchmarks.trust_cheats [--submissions N] [--cheat NAME ...]
"""

from __future__ import annotations

import argparse
import itertools
import statistics
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Any

from eth_account import Account
from eth_account.signers.local import LocalAccount
from eth_utils import keccak

from client.node.settings import NodeSettings
from client.node.work.session import Identity, Session
from client.node.work.worker import Generation
from orchestrator.run_dir import RunDir
from orchestrator.service.ledger import Ledger
from orchestrator.service.settings import OrchestratorSettings
from orchestrator.service.validator import Validator, ValidatorConfig
from orchestrator.service.work_server import ChainView, RunContext, WorkServer
from simulation.cheater import CHEATS, Cheat
from swarmrl.chain.anvil import dev_accounts
from swarmrl.chain.deploy import ProtocolParams
from swarmrl.chain.tokens import format_tokens
from swarmrl.eip712 import pool_domain, swarm_domain
from swarmrl.models.backend import Backend
from swarmrl.p2p import wire
from swarmrl.p2p.direct import DirectServer
from swarmrl.p2p.host import RemoteError
from swarmrl.rollouts.records import write_rollouts
from swarmrl.tasks import Task
from swarmrl.work import WORK_PROTOCOL
from swarmrl.work.join import NodeReport
from swarmrl.work.states import SubmissionStatus
from swarmrl.work.submit import SubmitHeader

SUBMISSIONS = 16  # per behaviour and run
# Where the keys of the nodes whose work the copying cheats copy start, and those of the
# honest nodes that train the policy's steps; the cheating nodes' keys lie below.
VICTIM_KEYS, TRAINING_KEYS = 10_000, 20_000
# Honest submissions allowed per training step before the benchmark gives up.
TRAINING_ROUNDS = 40
RUN = "0x" + "c4" * 32
CHAIN_ID = 31337
POOL = "0x" + "77" * 20
ORCHESTRATOR = dev_accounts(2)[1]  # the recorder key: it signs orders and receipts
PROVIDER = "0x" + "44" * 20
REPORT = NodeReport(
    backend="torch",
    device="cpu",
    cpu_cores=1,
    version="swarmrl trust benchmark",
    protocol=WORK_PROTOCOL,
)
MAX_BATCH: int = NodeSettings.model_fields["max_batch"].default


class Stage(StrEnum):
    """What befell a submission: refused before a byte was kept, rejected by intake or by
    the validator, accepted; or, for a node that never answers, what befell its orders:
    it is refused new ones, or (never refused) they expire."""

    REFUSED = "refused at intake"
    INTAKE = "rejected at intake"
    VALIDATOR = "rejected by the validator"
    ACCEPTED = "not caught"
    HELD_BACK = "refused work"
    EXPIRED = "its orders expire"


class Staked(ChainView):
    """The chain's word on every joining node: its provider has staked (what the chain
    says is not under test here)."""

    def standing(self, node: str, provider: str) -> str | None:
        return None


@dataclass(frozen=True)
class Outcome:
    """How intake and the validator dealt with one submission (for a node that never
    answers, how the scheduler dealt with it after the ``orders`` it took)."""

    stage: Stage
    reason: str = ""
    evidence: bool = False
    orders: int = 1

    @property
    def caught(self) -> bool:
        return self.stage not in (Stage.ACCEPTED, Stage.EXPIRED)


class Orchestrator:
    """The orchestrator's side of a run: its ledger, intake (the work server, reached
    through a :class:`DirectServer`) and validator, over the policy steps in
    ``run_dir``. Its validator prefills every submission (validation rate 1), or with
    ``prefill`` False takes every node as trusted and prefills none (rate 0)."""

    def __init__(
        self,
        root: Path,
        run_dir: Path,
        tasks: Sequence[Task],
        settings: Mapping[str, Any],
        *,
        prefill: bool = True,
    ) -> None:
        self.settings = OrchestratorSettings(data_dir=root / "data", **settings)
        self.now: float | None = None  # the work server's clock, stopped; None: the real one
        self.run_dir = run_dir
        self.run_folder = RunDir(run_dir)
        self.tasks = {t.problem_id: t for t in tasks}
        self.ledger = Ledger(root / "data" / "ledger.sqlite3")
        self.swarm_domain = swarm_domain(CHAIN_ID, POOL)
        self.pool_domain = pool_domain(CHAIN_ID, POOL)
        context = RunContext(
            run=RUN,
            swarm_domain=self.swarm_domain,
            pool_domain=self.pool_domain,
            signer=ORCHESTRATOR,
        )
        self.work_server = WorkServer(
            self.settings,
            context,
            self.ledger,
            self.tasks,
            Staked(),
            published_step=self.run_folder.latest,
            backlog=lambda: 0,
            weights_addrs=lambda: [],
            clock=lambda: time.time() if self.now is None else self.now,
        )
        self.server = DirectServer()
        self.work_server.serve(self.server, root / "spool")
        s = self.settings
        config = ValidatorConfig(
            data_dir=root / "data",
            run_dir=run_dir,
            tasks_file=Path(s.tasks),  # read only by the validator's process body
            validation_rate=1.0 if prefill else 0.0,
            trust_after=s.trust_after if prefill else 0,
            code_check_rate=s.code_check_rate,
            device="cpu",
            async_level=s.async_level,
        )
        self.validator = Validator(config, self.ledger, self.tasks)

    @property
    def step(self) -> int:
        """The newest published policy step."""
        step = self.run_folder.latest()
        assert step is not None  # a run here always has its steps
        return step

    def joined(self, account: LocalAccount) -> Session:
        """A node of ``account`` (its own peer), joined and active."""
        peer = "12D3KooW" + account.address[2:].replace("0", "z")  # base58 has no 0
        me = Identity(
            account=account,
            provider=PROVIDER,
            run=RUN,
            swarm_domain=self.swarm_domain,
            pool_domain=self.pool_domain,
            trusted=frozenset({ORCHESTRATOR.address}),
        )
        session = Session(self.server.caller(peer), "orchestrator", me)
        session.join(REPORT)
        session.heartbeat(None, None)
        return session

    def answer(self, cheat: Cheat, backend: Backend, session: Session, out: Path) -> Outcome:
        """``cheat``'s node takes an order, answers it as the cheat does (with ``backend``,
        the file at ``out``) and hands it in to intake; the validator judges what intake
        keeps. A node that never answers takes order after order until it is refused."""
        if not cheat.answers:
            return self.abandon(session)
        return self.hand_in(session, *self.submission(cheat, backend, session, out))

    def abandon(self, session: Session) -> Outcome:
        """The node takes orders and leaves each to expire (the daemon's sweep, just past
        its deadline, the work server's clock moved there) until the scheduler refuses it
        work; then the clock is the real one again, for the next node."""
        try:
            for taken in range(self.settings.abandon_limit + 1):
                response = session.work()
                if response.order is None:
                    return Outcome(Stage.HELD_BACK, response.reason, orders=taken)
                self.ledger.orders.expire(response.order.deadline + 1)
                self.now = response.order.deadline + 1
            limit = self.settings.abandon_limit
            return Outcome(Stage.EXPIRED, "it is never refused work", orders=limit + 1)
        finally:
            self.now = None

    def submission(
        self, cheat: Cheat, backend: Backend, session: Session, out: Path
    ) -> tuple[SubmitHeader, Path]:
        """The signed submission ``cheat``'s node makes of its next order."""
        order = session.work().order
        assert order is not None  # a run here is never full nor finished
        node, step = session.me.account.address, self.step
        generation = Generation(order, self.tasks, node=node, step=step, batch_size=MAX_BATCH)
        records = cheat.records(backend, generation)
        write_rollouts(records, out)
        return cheat.sign(session, order, step, out)

    def hand_in(self, session: Session, header: SubmitHeader, path: Path) -> Outcome:
        """What intake, then the validator, make of a submission."""
        try:
            answer = session.submit(header, path)
        except (wire.WireError, wire.Refusal, RemoteError) as e:
            return Outcome(Stage.REFUSED, str(e))
        if answer.receipt is None:  # refused for good, from what it signed
            return Outcome(Stage.REFUSED, answer.refused)
        receipt = answer.receipt
        row = self.ledger.submissions.get(receipt.submission)
        assert row is not None  # a receipt is given once the ledger holds it
        stage = Stage.INTAKE
        if row.status is SubmissionStatus.RECEIVED:
            self.validator.run_once()
            row = self.ledger.submissions.get(receipt.submission)
            assert row is not None
            stage = Stage.VALIDATOR
        if row.status is SubmissionStatus.ACCEPTED and not row.reason:
            return Outcome(Stage.ACCEPTED)
        return Outcome(stage, row.reason, row.slashable)

    def close(self) -> None:
        self.ledger.close()


def node_account(i: int) -> LocalAccount:
    """The ``i``-th node's key, the same in every run of the benchmark."""
    key: LocalAccount = Account.from_key(keccak(text=f"swarmrl trust cheats {i}"))
    return key


def linked_run(root: Path, steps: Path) -> Path:
    """A run directory of its own (the validator spools there) holding ``steps``'s
    policy checkpoints."""
    run_dir = root / "run"
    run_dir.mkdir(parents=True)
    RunDir(run_dir).checkpoints.symlink_to(RunDir(steps).checkpoints.resolve())
    return run_dir


def node_backend(cheat: Cheat, steps: Path, precision: Any) -> Backend:
    """What the cheat's node holds: the backend it loaded when the oldest step was the
    newest, kept up to date as it would have been since."""
    folder = RunDir(steps)
    held = folder.steps()
    backend = cheat.load(folder.step(held[0]), precision)
    if len(held) > 1:
        cheat.reload(backend, folder.step(held[-1]))
    return backend


@dataclass
class CheatRow:
    """One behaviour's submissions, prefilled and not, and what they cost it."""

    name: str
    what: str
    prefilled: list[Outcome] = field(default_factory=list)
    unprefilled: list[Outcome] = field(default_factory=list)
    validation_rate: float = 0.0
    slash_penalty: int = 0  # wei
    seconds: float = 0.0

    @staticmethod
    def share(outcomes: Sequence[Outcome]) -> float:
        return sum(o.caught for o in outcomes) / len(outcomes) if outcomes else 0.0

    @property
    def evidence(self) -> int:
        return sum(o.evidence for o in self.prefilled)

    @property
    def rate(self) -> float:
        """The chance each submission of a trusted node is caught."""
        r = self.validation_rate
        return r * self.share(self.prefilled) + (1 - r) * self.share(self.unprefilled)

    @property
    def delay(self) -> float:
        """Orders it takes until it is caught, on average (inf: never): a submission each
        (1 / rate), or for a node refused work, the orders it left before."""
        if self.rate == 0:
            return float("inf")
        outcomes = self.prefilled + self.unprefilled
        return statistics.fmean(o.orders for o in outcomes) / self.rate

    def caught_by(self) -> str:
        """The commonest way a prefilled submission was caught, with one reason ("not
        caught" when none was): a check that needs several of a node's submissions
        passes the first ones, and how it catches the last is what matters."""
        caught = [o for o in self.prefilled if o.caught] or self.prefilled
        if not caught:
            return ""
        kinds = Counter((o.stage, o.evidence) for o in caught)
        kind, _ = kinds.most_common(1)[0]
        stage, evidence = kind
        reason = next(o.reason for o in caught if (o.stage, o.evidence) == (stage, evidence))
        label = f"{stage}, evidence" if evidence else stage
        return f"{label}: {reason[:90]}" if reason else label

    def stake_lost(self) -> str:
        if not self.evidence:
            return "0"
        lost = f"{format_tokens(self.slash_penalty)} SRL"
        caught = sum(o.caught for o in self.prefilled)
        return lost if self.evidence == caught else f"{lost} ({self.evidence} of {caught})"


def measure(
    name: str,
    steps: Path,
    tasks: Sequence[Task],
    *,
    workdir: Path,
    submissions: int,
    settings: Mapping[str, Any],
) -> CheatRow:
    """One behaviour, ``submissions`` times in a run that prefills and in one that does
    not: each node goes on until it is caught, then a fresh one takes over."""
    began = time.perf_counter()
    kind = CHEATS[name]
    # The honest submissions the copying cheats copy, as other nodes handed them in.
    victims: list[tuple[SubmitHeader, Path]] = []
    cheat = kind(workdir / "node", (lambda: victims[-1]) if kind.copies else None)
    orchestrators = []
    for prefill, label in ((True, "prefilled"), (False, "not-prefilled")):
        root = workdir / label
        orchestrators.append(
            Orchestrator(root, linked_run(root, steps), tasks, settings, prefill=prefill)
        )
    precision = orchestrators[0].settings.precision
    backend = node_backend(cheat, steps, precision)
    honest = Cheat(workdir / "victim")
    victim_backend = node_backend(honest, steps, precision) if kind.copies else None
    row = CheatRow(
        name,
        kind.what,
        validation_rate=orchestrators[0].settings.validation_rate,
        slash_penalty=ProtocolParams().slash_penalty,
    )
    files = itertools.count()
    try:
        for orchestrator, outcomes in zip(
            orchestrators, (row.prefilled, row.unprefilled), strict=True
        ):
            nodes = itertools.count()
            session: Session | None = None
            for i in range(submissions):
                if victim_backend is not None:
                    # Another node's honest submission, handed in, for this one to copy.
                    victim = orchestrator.joined(node_account(VICTIM_KEYS + i))
                    signed = orchestrator.submission(
                        honest, victim_backend, victim, workdir / f"{next(files)}.parquet"
                    )
                    orchestrator.hand_in(victim, *signed)
                    victims.append(signed)
                if session is None:
                    session = orchestrator.joined(node_account(next(nodes)))
                out = workdir / f"{next(files)}.parquet"
                outcomes.append(orchestrator.answer(cheat, backend, session, out))
                if outcomes[-1].caught:
                    session = None
    finally:
        for orchestrator in orchestrators:
            orchestrator.close()
    row.seconds = time.perf_counter() - began
    return row


def run(
    steps: Path,
    tasks: Sequence[Task],
    *,
    workdir: Path,
    cheats: Sequence[str] = tuple(CHEATS),
    submissions: int = SUBMISSIONS,
    settings: Mapping[str, Any] | None = None,
    on_row: Callable[[CheatRow], None] = lambda _row: None,
) -> list[CheatRow]:
    """Each of ``cheats`` (names of simulation.cheater.CHEATS) against runs of the policy
    steps in the run directory ``steps`` (the newest is the current policy), with
    orchestrator ``settings`` beside the defaults; ``on_row`` hears each row when done."""
    if submissions < 1:
        raise ValueError(f"submissions must be at least 1, got {submissions}")
    rows = []
    for name in cheats:
        rows.append(
            measure(
                name,
                steps,
                tasks,
                workdir=workdir / name,
                submissions=submissions,
                settings=settings or {},
            )
        )
        on_row(rows[-1])
    return rows


def table(rows: Sequence[CheatRow]) -> str:
    """The cheat table (markdown): per behaviour, how it is caught, how often with and
    without a prefill, at what rate and after how many submissions once the node is
    trusted, and the stake it loses."""
    lines = [
        "| behaviour | what the node does | how it is caught (commonest) | caught, prefilled | "
        "caught, not prefilled | evidence | detection rate once trusted | "
        "expected delay (submissions) | stake lost |",
        "| --- | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for r in rows:
        n, m = len(r.prefilled), len(r.unprefilled)
        caught = sum(o.caught for o in r.prefilled)
        unprefilled = sum(o.caught for o in r.unprefilled)
        delay = "never" if r.rate == 0 else f"{r.delay:.3g}"
        reason = r.caught_by().replace("|", "/")
        lines.append(
            f"| {r.name} | {r.what} | {reason} | {caught}/{n} | {unprefilled}/{m} | "
            f"{r.evidence}/{n} | {r.rate:.3g} | {delay} | {r.stake_lost()} |"
        )
    return "\n".join(lines)


def trained_steps(
    root: Path,
    base_model: Path,
    tasks: Sequence[Task],
    count: int,
    settings: Mapping[str, Any] | None = None,
) -> Path:
    """A run directory whose checkpoints are the policy's steps 0 to ``count``: the base
    model, then each step the trainer took on honest nodes' submissions that intake
    and the validator accepted (the run's own loop: the trainer in a thread of its own,
    reading the spool the validator writes, while nodes keep working)."""
    from orchestrator.trainer.loop import Trainer

    run_dir = root / "run"
    orchestrator = Orchestrator(root, run_dir, tasks, settings or {})
    trainer = Trainer(run_dir, base_model, list(tasks), orchestrator.settings.recipe(), run=RUN)
    honest = Cheat(root / "node")
    held = trainer.step
    backend = honest.load(orchestrator.run_folder.step(held), orchestrator.settings.precision)
    stop = threading.Event()
    training = threading.Thread(
        target=trainer.train,
        kwargs={
            "should_stop": lambda: trainer.step >= count or stop.is_set(),
            "on_step": lambda _report: None,
        },
        name="trainer",
    )
    training.start()
    try:
        for i in itertools.count():
            if not training.is_alive():
                break
            if i >= TRAINING_ROUNDS * count:
                raise RuntimeError(
                    f"the trainer took {trainer.step} of {count} steps in {i} submissions of "
                    "honest work: too few groups whose rewards differ"
                )
            # A node takes each new policy as it comes: once its checkpoint is whole on
            # disk (the trainer counts a step before it has written it).
            newest = orchestrator.run_folder.latest()
            if newest is not None and newest > held:
                held = newest
                honest.reload(backend, orchestrator.run_folder.step(held))
            session = orchestrator.joined(node_account(TRAINING_KEYS + i))
            orchestrator.answer(honest, backend, session, root / f"honest-{i}.parquet")
    finally:
        stop.set()
        training.join()
        orchestrator.close()
    if trainer.step < count:
        raise RuntimeError(f"the trainer stopped at step {trainer.step} of {count}")
    return run_dir


def main(submissions: int = SUBMISSIONS, cheats: Sequence[str] = tuple(CHEATS)) -> list[CheatRow]:
    import torch

    from orchestrator.pretrain import build_default_model
    from orchestrator.tasks.generators import demo_tasks
    from swarmrl.cli_options import quiet_transformers
    from swarmrl.models.files import default_models_dir

    quiet_transformers()
    # The default model is too small to gain from more; on a shared machine they spin.
    torch.set_num_threads(1)
    tasks = demo_tasks(2000, seed=24)
    model = build_default_model(default_models_dir() / "default")
    defaults = OrchestratorSettings()
    behind = defaults.async_level + 1
    print(
        f"torch {torch.__version__}, CPU; the default model after {behind} training steps; "
        f"{submissions} submissions per behaviour, prefilled and not; the orchestrator's "
        f"defaults (validation_rate {defaults.validation_rate:g}, trust_after "
        f"{defaults.trust_after}); the pool's slash penalty "
        f"{format_tokens(ProtocolParams().slash_penalty)} SRL",
        flush=True,
    )
    began = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="swarmrl-cheats-") as tmp:
        root = Path(tmp)
        steps = trained_steps(root / "training", model, tasks, behind)
        print(f"  {behind} policy steps trained ({time.perf_counter() - began:.0f} s)", flush=True)
        rows = run(
            steps,
            tasks,
            workdir=root / "cheats",
            cheats=cheats,
            submissions=submissions,
            on_row=lambda r: print(
                f"  {r.name}: caught {sum(o.caught for o in r.prefilled)}/{len(r.prefilled)} "
                f"prefilled, {sum(o.caught for o in r.unprefilled)}/{len(r.unprefilled)} not "
                f"({r.seconds:.0f} s)",
                flush=True,
            ),
        )
    print()
    print("Cheats: each node behaviour against intake and the validator")
    print()
    print(table(rows))
    print(f"\n{len(rows)} behaviours, in {time.perf_counter() - began:.0f} s")
    return rows


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--submissions", type=int, default=SUBMISSIONS)
    parser.add_argument(
        "--cheat",
        action="append",
        choices=list(CHEATS),
        help="measure only this behaviour (repeated: these); every one when not given",
    )
    args = parser.parse_args()
    main(args.submissions, args.cheat or tuple(CHEATS))
