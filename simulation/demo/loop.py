"""`swarmrl demo`: the whole loop on one machine.

Anvil with the protocol deployed; four providers stake and register their nodes
(three honest, one that generates with a cheaper model); the orchestrator and the
four nodes run as processes, started as a person starts them. Training goes on
until the held-out reward has clearly risen (`swarmrl eval` of the newest
checkpoint every few steps, against the initial policy, same seed) or the step
limit; then the nodes stop, the chain is moved past the invalidation window, the
honest providers claim, the cheater's provider tries to and is refused, and the
summary, ``report.json`` and ``reward.png`` are written to the output folder.

Everything it starts runs in a process group of its own and is stopped on the
way out, Ctrl-C included.
"""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import typer

from orchestrator.run_dir import RunDir
from orchestrator.service.status import read_status
from orchestrator.trainer.metrics import read_metrics
from simulation.demo.report import NodeReport, Report, broadcast_seconds, plot_reward
from simulation.demo.report import summary as render_summary
from simulation.local_swarm import (
    CHEATER,
    HONEST,
    LEARNING_RECIPE,
    SWARMRL,
    Swarm,
    SwarmError,
    cli,
    make_swarm,
    node_toml,
    on_chain,
    orchestrator_addr,
    orchestrator_toml,
    stake_and_init_node,
    wait_for,
)
from swarmrl import keystore
from swarmrl.chain.tokens import TOKEN
from swarmrl.work.states import SubmissionStatus

HELD_OUT_SEED, TRAIN_SEED = 12345, 1
# The swarm's processes run at a lower CPU priority than the held-out evaluations: on a
# laptop's few cores an evaluation beside four nodes and a trainer at equal priority
# took minutes; this way it takes about what it takes alone and training waits.
SWARM_NICE = 10
INVALIDATION_WINDOW = 3600
# Each node in the pool bonds the slash penalty (50 SRL) of its provider's stake, whatever
# the number of its epochs in their windows; 500 SRL leaves room to spare.
STAKE = 500


@dataclass(frozen=True)
class LoopConfig:
    out: Path = Path("demo")
    max_steps: int = 50
    check_every: int = 10  # steps between held-out evaluations
    # "Clearly risen": three times the evaluation's standard error (about 0.01 for 96
    # tasks x 8 samples at this reward), which an unchanged policy almost never reaches.
    rise: float = 0.03
    held_out_tasks: int = 96
    eval_samples: int = 8
    eval_max_tokens: int = 64  # what training samples too


def _say(text: str) -> None:
    typer.echo(text)


def run(config: LoopConfig) -> Report:
    """Runs the loop and returns its report (also written to ``config.out``)."""
    out = config.out
    out.mkdir(parents=True, exist_ok=True)
    work = out / "run"
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir()
    report = Report(rise=config.rise)
    began = time.monotonic()
    model, train, held_out = _prepare(work, config)
    _say(f"[chain] anvil with the protocol deployed; four providers stake {STAKE} SRL each")
    swarm = make_swarm(work, invalidation_window=INVALIDATION_WINDOW, run="demo")
    evaluations = Evaluations(config, held_out, work / "eval")
    try:
        with _interrupt_on_sigterm():
            cached = _cached_before(out, model, config)
            if cached is None:
                evaluations.start(0, model)  # the initial policy, while providers stake
            _stake(swarm, report)
            if cached is None:
                result = evaluations.result(wait=True)
                assert result is not None
                cached = result[1]
                _cache_before(out, model, config, cached)
            _note_evaluation(report, (0, cached))
            _start_swarm(swarm, work, model, train, config)
            _train(swarm, work, report, evaluations, config)
            _settle(swarm, work, report)
    finally:
        with _signals_ignored():  # a second Ctrl-C must not cut the cleanup short
            evaluations.stop()
            killed = swarm.stop_all()
    run_folder = RunDir.of_orchestrator(work / "orchestrator")
    report.steps = run_folder.latest() or 0
    report.seconds = time.monotonic() - began
    # What had to be killed for outliving the bound after SIGTERM, and anything even that left.
    report.processes_left = sorted({*killed, *swarm.still_running()})
    report.broadcast_seconds = broadcast_seconds(
        work / "orchestrator" / "logs" / "orchestrator.log",
        [work / key / "node.log" for key in HONEST],
    )
    report.write(out)
    metrics = read_metrics(run_folder.metrics)
    plot_reward(report, metrics, out / "reward.png")
    _say("\n" + render_summary(report))
    _say(f"\nwrote {out / 'report.json'} and {out / 'reward.png'}; logs in {work}")
    return report


@contextmanager
def _interrupt_on_sigterm() -> Iterator[None]:
    """SIGTERM stops the demo the way Ctrl-C does: every process it started goes too."""

    def interrupt(*_: object) -> None:
        raise KeyboardInterrupt

    before = signal.signal(signal.SIGTERM, interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, before)


@contextmanager
def _signals_ignored() -> Iterator[None]:
    held = {s: signal.signal(s, signal.SIG_IGN) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for s, handler in held.items():
            signal.signal(s, handler)


def _prepare(work: Path, config: LoopConfig) -> tuple[Path, Path, Path]:
    from orchestrator.pretrain import Progress, Recipe, build_default_model
    from orchestrator.tasks.generators import demo_tasks
    from swarmrl.models.files import default_models_dir
    from swarmrl.tasks import write_tasks

    # The shipped build's copy; trained here (minutes, with progress) only where the
    # recipe is not the shipped one's.
    recipe = Recipe()
    model = build_default_model(
        default_models_dir() / "default", recipe, progress=Progress(recipe.steps, _say)
    )
    _say(f"[model] the initial policy: {model}")
    train, held_out = work / "train.jsonl", work / "held-out.jsonl"
    write_tasks(demo_tasks(400, seed=TRAIN_SEED), train)
    write_tasks(demo_tasks(config.held_out_tasks, seed=HELD_OUT_SEED), held_out)
    _say(
        f"[tasks] 400 training tasks (seed {TRAIN_SEED}); {config.held_out_tasks} held-out "
        f"tasks (seed {HELD_OUT_SEED}), never trained on"
    )
    return model, train, held_out


def _before_key(model: Path, config: LoopConfig) -> str:
    """What the initial policy's held-out figure depends on: the model's recipe and the
    evaluation's settings (the tasks follow from their seed and count)."""
    recipe = (model / "swarmrl-init.json").read_text()
    c = config
    return f"{recipe}|{HELD_OUT_SEED}|{c.held_out_tasks}|{c.eval_samples}|{c.eval_max_tokens}"


def _cached_before(out: Path, model: Path, config: LoopConfig) -> float | None:
    """The initial policy's held-out reward from an earlier demo with the same model and
    settings: the evaluation is seeded, so it would give the same figure again."""
    path = out / "held-out-before.json"
    try:
        cached = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(cached, dict) or cached.get("key") != _before_key(model, config):
        return None
    reward = cached.get("reward")
    return float(reward) if isinstance(reward, (int, float)) else None


def _cache_before(out: Path, model: Path, config: LoopConfig, reward: float) -> None:
    record = {"key": _before_key(model, config), "reward": reward}
    (out / "held-out-before.json").write_text(json.dumps(record) + "\n")


def _stake(swarm: Swarm, report: Report) -> None:
    from swarmrl.chain.contracts import Contracts

    with on_chain(swarm.anvil, "staking"):
        chain = Contracts.connect(swarm.deployment)
        for key, provider in [*HONEST.items(), CHEATER]:
            stake_and_init_node(swarm, provider, key, STAKE)
            address = keystore.info(swarm.keystore_dir, key).address
            provider_address = chain.registry.provider_of(address)
            assert provider_address is not None  # `node init` registered it
            stake = chain.stakes.stake_of(provider_address) / TOKEN
            report.nodes.append(
                NodeReport(key, address, provider_address, key in HONEST, stake_before=stake)
            )
            _say(f"  provider{provider} staked {stake:.0f} SRL for {key} ({address[:10]}...)")


class Evaluations:
    """Held-out evaluations of checkpoints, one at a time, as `swarmrl eval` processes
    (they run beside the swarm: the demo keeps reporting while one works)."""

    def __init__(self, config: LoopConfig, tasks: Path, folder: Path) -> None:
        self.config = config
        self.tasks = tasks
        self.folder = folder
        folder.mkdir(parents=True, exist_ok=True)
        self.running: tuple[int, subprocess.Popen[bytes]] | None = None

    def start(self, step: int, model: Path) -> None:
        c = self.config
        args = [SWARMRL, "eval", "--model", model, "--tasks", self.tasks, "--n", c.eval_samples,
                "--max-tokens", c.eval_max_tokens, "--json"]  # fmt: skip
        self.running = (
            step,
            subprocess.Popen(
                [str(a) for a in args],
                stdout=(self.folder / f"step_{step}.json").open("w"),
                stderr=(self.folder / f"step_{step}.log").open("w"),
                start_new_session=True,
            ),
        )

    @property
    def busy(self) -> bool:
        return self.running is not None and self.running[1].poll() is None

    def result(self, wait: bool = False) -> tuple[int, float] | None:
        """The finished evaluation's (step, reward), once; None while it runs."""
        if self.running is None:
            return None
        step, process = self.running
        if wait:
            process.wait()
        elif process.poll() is None:
            return None
        self.running = None
        if process.returncode != 0:
            log = self.folder / f"step_{step}.log"
            error = log.read_text().strip().splitlines()
            raise SwarmError(
                f"evaluating step {step} failed: {error[-1] if error else '?'}; its log is {log}"
            )
        figures = json.loads((self.folder / f"step_{step}.json").read_text())
        return step, float(figures["mean_reward"])

    def stop(self) -> None:
        if self.busy:
            assert self.running is not None
            self.running[1].kill()
            self.running[1].wait()


def _start_swarm(swarm: Swarm, work: Path, model: Path, train: Path, config: LoopConfig) -> None:
    orch = orchestrator_toml(
        swarm,
        work / "orchestrator.toml",
        model=model,
        tasks=train,
        data_dir=work / "orchestrator",
        steps=config.max_steps,
        **LEARNING_RECIPE,
    )
    log = work / "orchestrator.log"
    swarm.start(
        "orchestrator", [SWARMRL, "orchestrator", "run", "--config", orch], log, nice=SWARM_NICE
    )
    addr = wait_for(lambda: orchestrator_addr(log), "orchestrator address", 180, swarm)
    _say(f"[swarm] orchestrator listening on {addr}")
    for key in [*HONEST, CHEATER[0]]:
        toml = node_toml(swarm, work / f"{key}.toml", key=key, tasks=train, orchestrator=str(addr))
        if key in HONEST:
            command: list[object] = [SWARMRL, "node", "run", "--headless", "--config", toml]
        else:
            command = [sys.executable, "-m", "simulation.cheater", toml]
        swarm.start(key, command, work / f"{key}.out", nice=SWARM_NICE)
    _say("  three honest nodes and a cheater (it generates with a cheaper model) started")


def _train(
    swarm: Swarm, work: Path, report: Report, evaluations: Evaluations, config: LoopConfig
) -> None:
    run_folder = RunDir.of_orchestrator(work / "orchestrator")
    shown, next_check = 0, config.check_every
    cheater_seen = False
    while True:
        step = run_folder.latest() or 0
        if step > shown:
            shown = step
            _say(_progress_line(work, step, config.max_steps))
        if not cheater_seen:
            cheater_seen = _say_first_rejection(work, report)
        result = evaluations.result()
        if result is not None:
            _note_evaluation(report, result)
            if result[0] > 0 and report.rose:
                return
            if result[0] >= config.max_steps:
                return
        if not evaluations.busy and (step >= next_check or step >= config.max_steps):
            evaluations.start(step, run_folder.step(step))
            next_check = step + config.check_every
        swarm.check_running("while training")
        time.sleep(2)


def _note_evaluation(report: Report, result: tuple[int, float]) -> None:
    step, reward = result
    if step == 0:
        report.held_out_before = reward
        _say(f"  held-out reward of the initial policy: {reward:.3f}")
        return
    report.held_out.append(result)
    before = report.held_out_before
    change = "" if before is None else f" ({reward - before:+.3f})"
    _say(f"  held-out reward at step {step}: {reward:.3f}{change}")


def _progress_line(work: Path, step: int, limit: int) -> str:
    status = read_status(work / "orchestrator")
    submissions = status["submissions"]
    reward = status["task_reward"]
    return (
        f"  step {step}/{limit}  training reward {'-' if reward is None else f'{reward:.2f}'}  "
        f"accepted {submissions.get('accepted', 0)}  rejected {submissions.get('rejected', 0)}  "
        f"awaiting validation {submissions.get('received', 0)}"
    )


def _say_first_rejection(work: Path, report: Report) -> bool:
    cheater = next(n for n in report.nodes if not n.honest)
    rows = _ledger(work)
    for row in rows:
        if row["node"] == cheater.address and row["status"] == SubmissionStatus.REJECTED:
            _say(f"  {cheater.name}'s submission rejected: {row['reason']}")
            return True
    return False


def _ledger(work: Path) -> list[dict[str, Any]]:
    from orchestrator.service.status import ledger_rows

    return ledger_rows(work / "orchestrator")


def _settle(swarm: Swarm, work: Path, report: Report) -> None:
    """Stops the nodes, waits for the cheater's slash, then claims after the window."""
    from swarmrl.chain import anvil
    from swarmrl.chain.contracts import Contracts

    for key in [*HONEST, CHEATER[0]]:
        swarm.kill(key, signal.SIGTERM)
    _say("[chain] nodes stopped; the recorder closes their epochs and slashes the cheater")
    cheater = next(n for n in report.nodes if not n.honest)
    status = wait_for(lambda: _slashed(work, cheater.address), "the cheater's slash", 240, swarm)
    assert isinstance(status, dict)
    report.slash_tx = next(s["tx"] for s in status["slashes"] if s["node"] == cheater.address)
    _say(f"  slashed {cheater.name}: {report.slash_tx}")
    with on_chain(swarm.anvil, "claiming the rewards"):
        chain = Contracts.connect(swarm.deployment)
        anvil.increase_time(swarm.anvil.web3(), INVALIDATION_WINDOW + 1)
        minutes = INVALIDATION_WINDOW // 60
        _say(f"  anvil moves its clock past the {minutes}-minute invalidation window")
        rows = _ledger(work)
        tallied = {n["address"]: n for n in status["nodes"]}
        for node in report.nodes:
            counts = tallied.get(node.address, {})
            node.accepted = counts.get("accepted", 0)
            node.rejected = counts.get("rejected", 0)
            node.units = counts.get("units", 0)
            mine = [r for r in rows if r["node"] == node.address]
            rejected = [r["reason"] for r in mine if r["status"] == SubmissionStatus.REJECTED]
            node.last_rejection = rejected[-1] if rejected else ""
            recorded = status["epochs_recorded"]
            epochs = sorted({e["epoch"] for e in recorded if e["node"] == node.address and e["tx"]})
            if epochs:
                _claim(swarm, node, epochs)
            node.stake_after = chain.stakes.stake_of(node.provider) / TOKEN
    swarm.kill("orchestrator", signal.SIGTERM)


def _slashed(work: Path, address: str) -> dict[str, Any] | None:
    status = read_status(work / "orchestrator")
    return status if any(s["node"] == address and s["tx"] for s in status["slashes"]) else None


def _claim(swarm: Swarm, node: NodeReport, epochs: list[int]) -> None:
    provider = f"provider{HONEST.get(node.name, CHEATER[1])}"
    flags: list[object] = [f for e in epochs for f in ("--epoch", e)]
    out = cli(swarm, "wallet", "claim", provider, "--node", node.address, *flags)
    if out.returncode == 0:
        node.claimed = float(out.stdout.split()[1])
        _say(f"  {provider} claimed {node.claimed:.2f} SRL for {node.name} (epochs {epochs})")
    else:
        node.claim_refused = out.stderr.strip().removeprefix("error: ")
        _say(f"  {provider} tried to claim for {node.name}: refused ({node.claim_refused})")
