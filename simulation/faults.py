"""Faults for a swarm on one machine (`local_swarm`): kill -9 at random points of a
node, the orchestrator, the trainer and anvil, each started again, and the checks that
nothing was lost to them.

A `FaultPlan` is drawn from a seed, printed with the plan, so a run that fails can be
replayed: each fault is a target, the trainer step it waits for and a delay after it.
`Faults` injects a plan into a running swarm and notes what it saw at each kill;
`check` then asks what issue 24 promises after faults, one list of violations per
promise:

- acknowledged: every receipt a node holds, and every submission the ledger held before
  an orchestrator was killed, is in the ledger, once; no order was answered twice.
- recorded: the work the chain holds, per node and epoch, equals the ledger's, and every
  epoch that closed before the nodes stopped is on chain.
- resumed: each time the trainer was killed (alone, or with its orchestrator), the next
  trainer resumed from the newest checkpoint on disk.
- whole: no partial file is taken for a whole one: every checkpoint loads, the ones the
  trainer may resume from with their state; every weight file a node holds as complete
  hashes to its manifest, its model loads, and it is the trainer's published policy bit
  for bit with nothing kept beside it; every submission intake kept
  hashes to what its node signed; the trainer met no unreadable rollout file.

A hung worker (`hang_a_worker`, `stop_with_a_hung_worker`) is a fault of another kind:
SIGSTOP of a node's worker, never continued, which the node must get past by itself.

The orchestrator and the nodes are processes; this module reads the orchestrator's
files itself and asks a node through its command (`swarmrl node status --json`).
"""

from __future__ import annotations

import json
import os
import random
import re
import signal
import subprocess
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Any

from orchestrator.run_dir import RunDir
from orchestrator.service.ledger import Ledger
from orchestrator.service.ledger.home import ledger_path
from orchestrator.trainer import checkpoint as ckpt
from orchestrator.trainer.metrics import read_metrics
from simulation.local_swarm import (
    SWARMRL,
    Swarm,
    SwarmError,
    SwarmTimeoutError,
    alive,
    process,
    processes,
    wait_for,
)

# How long the daemon may take to start a killed trainer again: it looks every second.
RESTART_SECONDS = 120.0
_TRAINER_STARTED = re.compile(rb"started the trainer process \(pid (\d+)\)")
_TRAINER_AT = re.compile(rb"trainer at step (\d+) of \d+")
_TRAINER_DONE = b"the trainer process finished its work"


class Target(StrEnum):
    NODE = "node"
    ORCHESTRATOR = "orchestrator"
    TRAINER = "trainer"
    ANVIL = "anvil"


class Promise(StrEnum):
    """What the swarm promises after faults; `check` reports violations per promise."""

    ACKNOWLEDGED = "acknowledged submissions in the ledger once"
    RECORDED = "work on chain equals the ledger"
    RESUMED = "training resumes from the last checkpoint"
    WHOLE = "no partial file taken for a whole one"


@dataclass(frozen=True)
class Fault:
    """kill -9 of `target` (the node `node`, for a node) once the trainer has written
    checkpoint `step`, `delay` seconds later; then it is started again."""

    target: Target
    step: int
    delay: float
    node: str | None = None

    def __str__(self) -> str:
        who = self.node if self.target is Target.NODE else self.target.value
        return f"{who} at step {self.step} + {self.delay:.1f} s"


@dataclass(frozen=True)
class FaultPlan:
    seed: int
    faults: tuple[Fault, ...]

    @classmethod
    def draw(
        cls,
        seed: int,
        *,
        count: int,
        steps: tuple[int, int],
        nodes: Sequence[str],
        max_delay: float = 20.0,
    ) -> FaultPlan:
        """`count` faults: every target once, in random order, before any twice (so four
        or more hit each); each at a step drawn from `steps` (first and last included),
        in step order, a delay of up to `max_delay` seconds after it."""
        rng = random.Random(seed)
        targets = rng.sample(list(Target), k=min(count, len(Target)))
        targets += [rng.choice(list(Target)) for _ in range(count - len(targets))]
        at = sorted(rng.randint(*steps) for _ in range(count))
        faults = tuple(
            Fault(
                target,
                step,
                round(rng.uniform(0, max_delay), 1),
                rng.choice(list(nodes)) if target is Target.NODE else None,
            )
            for target, step in zip(targets, at, strict=True)
        )
        return cls(seed, faults)

    def __str__(self) -> str:
        return f"fault seed {self.seed}: " + ", ".join(map(str, self.faults))


@dataclass
class Seen:
    """What `Faults` noted at its kills, for `check`, and what `check` counted."""

    # Submissions the ledger held just before each orchestrator kill.
    acknowledged: set[str] = field(default_factory=set)
    # Per trainer kill: the newest checkpoint on disk once it was dead, and where the
    # trainer's log stood then (the next trainer's first line after it says its step).
    resumes: list[tuple[int, int]] = field(default_factory=list)
    # What went wrong injecting (a trainer the daemon did not start again, say).
    problems: list[str] = field(default_factory=list)
    injected: Counter[Target] = field(default_factory=Counter)
    # How many receipts each node held when `check` asked it.
    receipts: dict[str, int] = field(default_factory=dict)


class Faults:
    """Injects faults into `swarm`: the orchestrator with its data dir `data_dir`, its log
    `log` and its epochs of `epoch_seconds`, started again by `start_orchestrator`; a
    node by `start_node(name)`."""

    def __init__(
        self,
        swarm: Swarm,
        data_dir: Path,
        log: Path,
        *,
        start_orchestrator: Callable[[], object],
        start_node: Callable[[str], object],
        epoch_seconds: float,
    ) -> None:
        self.swarm = swarm
        self.epoch_seconds = epoch_seconds
        self.data_dir = Path(data_dir)
        self.log = Path(log)
        self.start_orchestrator = start_orchestrator
        self.start_node = start_node
        self.seen = Seen()

    @property
    def run_folder(self) -> RunDir:
        return RunDir.of_orchestrator(self.data_dir)

    @property
    def run_dir(self) -> Path:
        return self.run_folder.root

    def step(self) -> int:
        """The newest checkpoint the trainer wrote (0 before its first)."""
        return self.run_folder.latest() or 0

    def wait_for_step(self, step: int, limit: float) -> None:
        """Returns once the trainer wrote checkpoint `step`; SwarmTimeoutError after `limit`
        seconds, SwarmError if a process of the swarm exits first."""
        wait_for(lambda: self.step() >= step, f"step {step}", limit, self.swarm)

    def run(self, plan: FaultPlan, *, limit: float) -> None:
        """Injects `plan`'s faults in order, each once the trainer reached its step;
        SwarmTimeoutError if a step takes over `limit` seconds to come."""
        for fault in plan.faults:
            self.wait_for_step(fault.step, limit)
            time.sleep(fault.delay)
            self.inject(fault)

    def inject(self, fault: Fault) -> None:
        if fault.target is Target.NODE:
            assert fault.node is not None
            self.swarm.kill(fault.node)
            self.start_node(fault.node)
        elif fault.target is Target.ORCHESTRATOR:
            self.seen.acknowledged |= self._ledger_digests()
            self.swarm.kill("orchestrator")
            self._note_resume()
            self.start_orchestrator()
        elif fault.target is Target.TRAINER:
            if not self._kill_trainer():
                return  # it had trained its last step: no trainer left to kill
        else:
            self.swarm.restart_anvil()
        self.seen.injected[fault.target] += 1

    def _ledger_digests(self) -> set[str]:
        path = ledger_path(self.data_dir)
        if not path.is_file():
            return set()
        with Ledger(path, create=False) as ledger:
            return {s.digest for s in ledger.submissions.all()}

    def _trainer_log(self) -> Path:
        return self.data_dir / "logs" / "trainer.log"

    def _note_resume(self) -> None:
        """With the trainer dead: the step it must resume from, and where its log stands."""
        log = self._trainer_log()
        self.seen.resumes.append((self.step(), log.stat().st_size if log.is_file() else 0))

    def _kill_trainer(self) -> bool:
        """kill -9 of the daemon's trainer child, which the daemon starts again; False
        when the trainer finished its last step first (a restarted orchestrator's may
        catch up past a fault's step before the fault comes)."""
        pid = wait_for(
            lambda: self._trainer_pid() or (-1 if self._trainer_done() else None),
            "running trainer",
            RESTART_SECONDS,
            self.swarm,
        )
        if pid == -1:
            return False
        os.kill(pid, signal.SIGKILL)
        while alive(pid):
            time.sleep(0.05)
        self._note_resume()

        def restarted() -> bool:
            newest = self._trainer_pid()
            return newest is not None and newest != pid

        try:
            wait_for(restarted, "the trainer started again", RESTART_SECONDS, self.swarm)
        except SwarmTimeoutError:
            self.seen.problems.append(f"the daemon did not start the trainer (pid {pid}) again")
        return True

    def _trainer_done(self) -> bool:
        """Whether the trainer the daemon started last has finished its work."""
        text = self.log.read_bytes() if self.log.is_file() else b""
        return text.rfind(_TRAINER_DONE) > text.rfind(b"started the trainer process")

    def _trainer_pid(self) -> int | None:
        """The trainer the daemon started last, if it runs: a child in the orchestrator's
        process group (never another process that took a stale pid)."""
        started = _TRAINER_STARTED.findall(self.log.read_bytes()) if self.log.is_file() else []
        if not started:
            return None
        pid, group = int(started[-1]), self.swarm.processes["orchestrator"].pid
        if any(p.pid == pid and p.group == group and p.alive for p in processes()):
            return pid
        return None

    def check(
        self, nodes: dict[str, Path], *, close_limit: float = 180.0
    ) -> dict[Promise, list[str]]:
        """The violations of each promise, once the nodes (their TOML files in `nodes`)
        have stopped and the orchestrator still runs: it waits up to `close_limit`
        seconds for the recorder to put every closed epoch on chain."""
        return {
            Promise.ACKNOWLEDGED: self._acknowledged(nodes),
            Promise.RECORDED: self._recorded(close_limit),
            Promise.RESUMED: self._resumed(),
            Promise.WHOLE: self._whole(nodes),
        }

    # ---- the promises ---------------------------------------------------------------

    def _acknowledged(self, nodes: dict[str, Path]) -> list[str]:
        with Ledger(ledger_path(self.data_dir), create=False) as ledger:
            rows = ledger.submissions.all()
        digests = {r.digest for r in rows}
        out = [f"{d[:16]} was in the ledger before a kill, not after" for d in
               sorted(self.seen.acknowledged - digests)]  # fmt: skip
        answers = Counter(r.order_id for r in rows)
        out += [f"order {o[:16]} answered {n} times" for o, n in answers.items() if n > 1]
        for name, config in nodes.items():
            receipts = node_receipts(self.swarm, config)
            self.seen.receipts[name] = len(receipts)
            for digest in receipts:
                if digest not in digests:
                    out.append(f"{name} holds a receipt for {digest[:16]}, not in the ledger")
        return out

    def _recorded(self, close_limit: float) -> list[str]:
        from orchestrator.service.recorder import paid_units
        from swarmrl.chain.contracts import Contracts

        chain = Contracts.connect(self.swarm.deployment)
        path = ledger_path(self.data_dir)
        out: list[str] = []
        with Ledger(path, create=False) as ledger:
            closed = ledger.epochs.at(time.time(), self.epoch_seconds)

            def all_recorded() -> bool:
                return not ledger.epochs.unrecorded(closed)

            try:
                wait_for(all_recorded, "every closed epoch recorded", close_limit, self.swarm)
            except SwarmTimeoutError:
                out += [f"epoch {e} of {n} closed and is not on chain" for e, n in
                        ledger.epochs.unrecorded(closed)]  # fmt: skip
            held: dict[str, set[int]] = {}
            for row in ledger.epochs.all():
                units = paid_units(ledger.submissions.all(node=row.node, epoch=row.epoch))
                if row.units == 0 and units and not chain.pool.membership_of(row.node)[1].live:
                    units = 0  # out of the pool at recording (slashed): never recorded
                work = chain.pool.work_of(row.epoch, row.node)
                on_chain = 0 if work is None else work.units
                if on_chain != units:
                    out.append(
                        f"epoch {row.epoch} of {row.node}: {on_chain} units on chain, "
                        f"{units} in the ledger"
                    )
                if row.units:
                    held.setdefault(row.node, set()).add(row.epoch)
            for node in {s.node for s in ledger.submissions.all()}:
                ghost = set(chain.pool.recorded_epochs(node)) - held.get(node, set())
                out += [f"epoch {e} of {node} is on chain, not in the ledger" for e in ghost]
        return out

    def _resumed(self) -> list[str]:
        out = list(self.seen.problems)
        for newest, offset in self.seen.resumes:
            resumed = self._resumed_at(offset)
            if resumed is None:
                out.append(f"no trainer started after the kill at step {newest}")
            elif resumed != newest:
                out.append(f"killed at step {newest}, the trainer resumed at {resumed}")
        steps = self.run_folder.steps()
        if steps != list(range(len(steps))):
            out.append(f"checkpoint steps on disk are not 0 to {len(steps) - 1}: {steps}")
        return out

    def _resumed_at(self, offset: int) -> int | None:
        """The step the first trainer started after byte `offset` of its log says it
        resumes at, waiting for it (a recent kill's trainer may still be starting)."""
        log = self._trainer_log()

        def line() -> re.Match[bytes] | None:
            return _TRAINER_AT.search(log.read_bytes(), offset) if log.is_file() else None

        try:
            found = wait_for(line, "the trainer started again", RESTART_SECONDS, self.swarm)
        except SwarmTimeoutError:
            return None
        return int(found.group(1))

    def _whole(self, nodes: dict[str, Path]) -> list[str]:
        from swarmrl.models.directory import check_model
        from swarmrl.work.submit import file_sha256

        out = []
        steps = self.run_folder.steps()
        for step in steps:
            try:
                if step == steps[-1] or ckpt.trainer_dir(self.run_dir, step).is_dir():
                    ckpt.check_resumable(self.run_dir, step)  # the ones it may resume from
                else:
                    check_model(self.run_folder.step(step))
            except ValueError as e:
                out.append(f"checkpoint {step}: {e}")
        for name, config in nodes.items():
            store = _node_dir(config) / "weights"
            out += [f"{name}: {why}" for why in broken_weights(store)]
            out += [f"{name}: {why}" for why in unlike_published(store, self.run_dir)]
        with Ledger(ledger_path(self.data_dir), create=False) as ledger:
            for s in ledger.submissions.all():
                kept = Path(s.file)
                if kept.is_file() and file_sha256(kept) != s.file_sha256:
                    out.append(f"submission {s.digest[:16]}: kept file {kept.name} is not whole")
        metrics = read_metrics(self.run_folder.metrics)
        if metrics and (unusable := metrics[-1].get("unusable_files")):
            out.append(f"the trainer met {unusable} unreadable rollout file(s)")
        return out


def broken_weights(store: Path) -> list[str]:
    """What in a weight store (`swarmrl.weights.store`) is held as complete and is not whole:
    a file whose shards do not hash to its manifest, a model that does not load."""
    from swarmrl import shards
    from swarmrl.models.directory import check_model
    from swarmrl.weights.store import DELTA_DIR_SUFFIX, FILES_DIR, MANIFEST_FILE

    out = []
    for directory in sorted(store.glob("step-*")):
        manifest = shards.Manifest.from_json((directory / MANIFEST_FILE).read_bytes())
        files = directory / FILES_DIR
        if not all((files / f.name).is_file() for f in manifest.files):
            continue  # still being fetched (`.partial`)
        for i, entry in enumerate(manifest.files):
            bad = shards.intact_shards(files / entry.name, manifest, i).count(0)
            if bad:
                out.append(f"{entry.name} of step {manifest.step} has {bad} shard(s) not whole")
        # A delta's files are no model; the step it rebuilt is loaded on its own.
        if (files / "config.json").is_file() and not directory.name.endswith(DELTA_DIR_SUFFIX):
            try:
                check_model(files)
            except ValueError as e:
                out.append(f"the model of step {manifest.step}: {e}")
    return out


def node_receipts(swarm: Swarm, config: Path) -> list[str]:
    """The submissions a node holds receipts for, as its `node status --json` says."""
    digests: list[str] = node_status(swarm, config)["receipt_digests"]
    return digests


def node_status(swarm: Swarm, config: Path) -> dict[str, Any]:
    """What a node's `node status --json` says (its daemon's, while one runs)."""
    out = subprocess.run(
        [str(SWARMRL), "node", "status", "--json", "--config", str(config)],
        capture_output=True,
        text=True,
        env=swarm.env(),
        timeout=300,
        check=True,
    )
    status: dict[str, Any] = json.loads(out.stdout)
    return status


# ---- a hung worker ----------------------------------------------------------------------

# The most a node may take to notice a hung worker and hand its order in: the deadline
# of the request it hangs in (a minute at least), then a worker's start, load and part.
HUNG_SECONDS = 600.0
# The most a node (re)started a moment ago may take to start its workers and take an order.
WORKER_SECONDS = 300.0
_ORDER = b" swarmrl.node order "
_GENERATED = b" swarmrl.node generated "
_KILLED_HUNG = b"taken for hung); started again"
_SUBMITTED = b" swarmrl.node submitted "


@dataclass(frozen=True)
class Hang:
    """What a node did about its worker stopped mid-work: seconds from the SIGSTOP until
    it killed the worker, and until it handed an order in again."""

    killed: float
    submitted: float


def hang_a_worker(swarm: Swarm, key: str) -> Hang:
    """SIGSTOP of node `key`'s worker, never continued, as a GPU or driver hang looks to
    the node: the node must kill it once the request it hangs in is past its deadline,
    start it again, and hand its order in; SwarmTimeoutError if it does not."""
    log = swarm.logs[key]
    before = log.read_bytes()
    worker = worker_of(swarm, key)

    def order_after_a_part() -> bool:
        _, generated, after = log.read_bytes()[len(before) :].partition(_GENERATED)
        return bool(generated) and _ORDER in after

    # Stopped in a part (the request whose deadline is the shortest) of an order after
    # one the node generated: a worker's first part, its speed not yet measured, may take
    # FIRST_PART_SECONDS (15 min), past HUNG_SECONDS, and a node a fault just restarted
    # has done none (in one run it was node5, the plan's last target).
    wait_for(order_after_a_part, f"{key}'s order after a part", WORKER_SECONDS, swarm)
    os.kill(worker, signal.SIGSTOP)
    stopped = time.monotonic()
    wait_for(
        lambda: _KILLED_HUNG in log.read_bytes()[len(before) :],
        f"{key} killing its hung worker",
        HUNG_SECONDS,
        swarm,
    )
    killed = time.monotonic() - stopped
    wait_for(
        lambda: _SUBMITTED in log.read_bytes()[len(before) :].split(_KILLED_HUNG, 1)[1],
        f"{key} handing an order in after its hung worker",
        HUNG_SECONDS,
        swarm,
    )
    return Hang(killed, time.monotonic() - stopped)


def stop_with_a_hung_worker(swarm: Swarm, key: str, config: Path) -> float:
    """SIGSTOP of node `key`'s worker in a part, then SIGTERM of the node's daemon, as
    `kill PID` or `node stop` stop it: the seconds until every process of it ended
    (Swarm.kill: SwarmError past STOP_SECONDS)."""
    worker = worker_of(swarm, key)

    def generating() -> list[str]:
        # "worker 0 generating batch 2 of 3: 12 s so far, ...": the part, not how long
        # it has run, which changes by the second.
        running = node_status(swarm, config)["running"]
        waiting = [] if running is None else running["waiting"]
        return [w.split(":")[0] for w in waiting if " generating batch" in w]

    def hung() -> bool:
        # Stopped in a part: the node says it waits for the same batch before the stop
        # and after it. Stopped anywhere else (a load of the policy that just came, which
        # the trainer sends every few seconds) the worker is let go on and tried again;
        # the node would kill it past that request's shorter deadline (one run did).
        if worker not in {p.pid for p in processes() if p.parent == swarm.processes[key].pid}:
            raise SwarmError(f"{key} started a worker again while its worker {worker} hung")
        before = generating()
        if not before:
            return False
        os.kill(worker, signal.SIGSTOP)
        wait_for(lambda: _stopped_or_gone(worker), f"{key}'s worker stopped", 30, swarm)
        if generating() == before:
            return True
        os.kill(worker, signal.SIGCONT)
        return False

    wait_for(hung, f"{key} waiting for its hung worker's part", HUNG_SECONDS, swarm)
    began = time.monotonic()
    # Not its group: the worker would get the SIGTERM too (in one CI run it died of it),
    # and the daemon's stop, which must end a worker that does not answer, go untested.
    swarm.kill(key, signal.SIGTERM, group=False)
    return time.monotonic() - began


def _stopped_or_gone(pid: int) -> bool:
    return (proc := process(pid)) is None or proc.state == "T"


def worker_of(swarm: Swarm, key: str) -> int:
    """The pid of node `key`'s (first) worker process, once it runs one (a node started
    a moment ago, by a fault among them, has yet to start its workers)."""

    def worker() -> int | None:
        daemon = swarm.processes[key].pid
        for proc in processes():
            if proc.parent == daemon and proc.alive:
                try:
                    command = Path(f"/proc/{proc.pid}/cmdline").read_bytes()
                except OSError:
                    continue  # it ended while we looked
                if b"client.node.work.worker" in command:
                    return proc.pid
        return None

    return wait_for(worker, f"{key}'s worker", WORKER_SECONDS, swarm)


def unlike_published(store: Path, run_dir: Path) -> list[str]:
    """How the complete versions in a node's weight store differ from the policies the
    trainer published under their steps: a file missing, added or not bit-identical,
    or anything kept beside the files (a second copy, an archive)."""
    from swarmrl import shards
    from swarmrl.weights.store import ANNOUNCEMENT_FILE, DELTA_DIR_SUFFIX, FILES_DIR, MANIFEST_FILE

    out = []
    for directory in sorted(store.glob("step-*")):
        if directory.name.endswith(DELTA_DIR_SUFFIX):
            continue  # what a step's delta is made of, checked by the step it rebuilt
        manifest = shards.Manifest.from_json((directory / MANIFEST_FILE).read_bytes())
        files = directory / FILES_DIR
        held = sorted(p.name for p in files.iterdir())
        if any(name.endswith(shards.PARTIAL_SUFFIX) for name in held):
            continue  # still being fetched
        step = manifest.step
        extra = {p.name for p in directory.iterdir()} - {
            ANNOUNCEMENT_FILE,
            MANIFEST_FILE,
            FILES_DIR,
        }
        if extra:
            out.append(f"step {step} keeps {sorted(extra)} beside its files")
        published = {p.name: p for p in shards.version_files(RunDir(run_dir).step(step))}
        if held != sorted(published):
            out.append(f"step {step} holds {held}, the trainer published {sorted(published)}")
            continue
        for name in held:
            if (files / name).read_bytes() != published[name].read_bytes():
                out.append(f"{name} of step {step} is not the trainer's")
    return out


def _node_dir(config: Path) -> Path:
    """A node's data dir, as `local_swarm.node_toml` lays it out: beside its TOML file."""
    return config.parent / config.stem
