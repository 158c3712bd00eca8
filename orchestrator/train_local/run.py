"""`swarmrl train local`: the trainer and its inference workers on one machine.

This process is the trainer; it starts ``workers`` sampler processes, which
generate with the newest checkpoint while the trainer trains, and stops them
all when it stops (at the last step, at the time limit, on Ctrl-C, or on an
error). Each process gets its share of the cores (ARCHITECTURE.md): left at
torch's default, processes on one machine slow each other down several times.

Run again with the same ``--out`` to continue a stopped or killed run.
"""

from __future__ import annotations

import dataclasses
import json
import multiprocessing
import os
import signal
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from orchestrator.train_local.sampler import SamplerConfig, run_sampler, stats_path
from orchestrator.trainer import checkpoint as ckpt
from orchestrator.trainer.feed import Spool
from orchestrator.trainer.loop import StepReport, Trainer
from orchestrator.trainer.metrics import MetricsLog, plot_metrics, read_metrics
from orchestrator.trainer.recipe import GRPORecipe
from swarmrl.files import write_atomically
from swarmrl.tasks import read_tasks

RUN_FILE = "run.json"
# Restarts of a worker that died before the run gives up.
WORKER_RESTARTS = 3
PLOT_EVERY = 10


@dataclasses.dataclass(frozen=True)
class Placement:
    """Which process gets how many threads."""

    workers: int
    worker_threads: int
    trainer_threads: int

    @classmethod
    def for_machine(cls, workers: int | None, cores: int | None = None) -> Placement:
        cores = cores or len(os.sched_getaffinity(0))
        # At least two: the trainer waits on rollouts part of every step, and a second
        # single-threaded worker takes the core then (on 2 cores, 10-minute runs: the trainer
        # waited 40-50% of its time beside one worker, 9-10% beside two with two unread
        # batches each).
        workers = workers or max(2, cores // 2)
        trainer = max(1, cores // (workers + 1))
        return cls(workers, max(1, (cores - trainer) // workers), trainer)


@dataclasses.dataclass(frozen=True)
class LocalRun:
    model: Path
    tasks: Path
    out: Path
    recipe: GRPORecipe
    run: str = "local"  # the run id rollouts are written for
    minutes: float | None = None
    workers: int | None = None
    backend: str = "torch"
    device: str | None = None


def check_run_dir(run: LocalRun) -> None:
    """A run directory continues only the run it was started for."""
    path = run.out / RUN_FILE
    mine = _run_identity(run)
    if path.is_file():
        theirs = json.loads(path.read_text())
        # A key the recipe gained after the run began: the run had its default.
        defaults = GRPORecipe().model_dump()
        changed = sorted(k for k in mine if theirs.get(k, defaults.get(k)) != mine[k])
        if changed:
            raise ValueError(
                f"{run.out} holds a run with other settings ({', '.join(changed)}); "
                "choose another --out to start a new one"
            )
    else:
        run.out.mkdir(parents=True, exist_ok=True)
        write_atomically(path, (json.dumps(mine, indent=2) + "\n").encode())


def _run_identity(run: LocalRun) -> dict[str, Any]:
    # steps and the time limit may change between sessions of one run; the recipe may not.
    return {
        "model": str(run.model.resolve()),
        "tasks": str(run.tasks.resolve()),
        "run": run.run,
        **run.recipe.model_dump(exclude={"steps"}),
    }


def train_local(run: LocalRun, say: Callable[[str], None]) -> Path:
    """Train until the step count or the time limit; return the newest checkpoint."""
    import torch

    from swarmrl.models.directory import check_model, load_tokenizer
    from swarmrl.models.torch_backend import parse_device

    tasks = read_tasks(run.tasks)
    # Checked before anything is written: workers would otherwise fail one by one.
    check_model(run.model)
    load_tokenizer(run.model)
    device = str(parse_device(run.device))
    check_run_dir(run)
    place = Placement.for_machine(run.workers)
    torch.set_num_threads(place.trainer_threads)
    say(
        f"threads: trainer {place.trainer_threads}, {place.workers} worker(s) x "
        f"{place.worker_threads}, on {len(os.sched_getaffinity(0))} cores"
    )
    trainer = Trainer(run.out, run.model, tasks, run.recipe, run=run.run, device=device)
    start_step = trainer.step
    if start_step:
        say(f"continuing {run.out} from step {start_step}")
    metrics = MetricsLog(run.out / "metrics.jsonl", resume_step=start_step)
    deadline = None if run.minutes is None else time.monotonic() + run.minutes * 60
    pool = _Workers(run, place, trainer.feed.highest_counter)
    stop = _StopOnSignal()
    progress = _Progress(run, pool, say)
    try:
        pool.start()

        def should_stop() -> bool:
            pool.check()
            return stop.requested or (deadline is not None and time.monotonic() >= deadline)

        def on_step(report: StepReport) -> None:
            row = progress.row(report)
            metrics.append(row)
            if report.step % PLOT_EVERY == 0:
                _plot(run)

        trainer.train(should_stop=should_stop, on_step=on_step)
    finally:
        pool.stop()
        stop.restore()
    _plot(run)
    if stop.requested:
        say(f"stopped at step {trainer.step} (interrupted); run again to continue")
    last = ckpt.step_dir(run.out, trainer.step)
    say(f"step {trainer.step}: {last}")
    return last


def _plot(run: LocalRun) -> None:
    rows = read_metrics(run.out / "metrics.jsonl")
    if rows:
        plot_metrics(rows, run.out / "metrics.png", f"swarmrl train local: {run.out.name}")


class _StopOnSignal:
    """Ctrl-C and SIGTERM ask the loop to stop after the step in hand."""

    def __init__(self) -> None:
        self.requested = False
        self._old = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
        for s in self._old:
            signal.signal(s, self._handle)

    def _handle(self, signum: int, _frame: Any) -> None:
        if self.requested:  # a second Ctrl-C: the user means it
            raise KeyboardInterrupt
        self.requested = True

    def restore(self) -> None:
        for s, handler in self._old.items():
            signal.signal(s, handler)


class _Workers:
    """The sampler processes: started, watched (a dead one is restarted a few times),
    and stopped, politely and then not."""

    def __init__(self, run: LocalRun, place: Placement, counters: dict[str, int]) -> None:
        self.run, self.place, self.counters = run, place, counters
        self.context = multiprocessing.get_context("spawn")
        self.stop_event = self.context.Event()
        self.processes: dict[str, Any] = {}
        self.restarts = 0
        self.spool = Spool(run.out / "rollouts")
        r = run.recipe
        self.configs = {
            name: SamplerConfig(
                name=name,
                run_dir=run.out,
                tasks_file=run.tasks,
                run=run.run,
                group_size=r.group_size,
                # A step's worth before filtering each, so a batch decodes in one go.
                prompts_per_batch=r.prompts_per_step,
                max_tokens=r.max_tokens,
                temperature=r.temperature,
                top_p=r.top_p,
                target_len=r.target_len,
                seed=r.seed,
                start_counter=self.spool.next_counter(name, counters.get(name, -1)),
                # Two unread batches each, plus the one in the making: with most groups
                # filtered out a step reads about three batches, and workers that paused
                # behind one kept the trainer waiting a quarter of its time.
                max_pending=2,
                threads=place.worker_threads,
                backend=run.backend,
                device=run.device,
                parent_pid=os.getpid(),
            )
            for name in (f"w{i}" for i in range(place.workers))
        }

    def start(self) -> None:
        for name in self.configs:
            self._spawn(name)

    def _spawn(self, name: str) -> None:
        process = self.context.Process(
            target=run_sampler, args=(self.configs[name], self.stop_event), daemon=True
        )
        process.start()
        self.processes[name] = process

    def check(self) -> None:
        for name, process in self.processes.items():
            if process.is_alive():
                continue
            if self.restarts >= WORKER_RESTARTS:
                raise ValueError(
                    f"inference worker {name} exited with code {process.exitcode} "
                    f"{self.restarts + 1} times; see its error above"
                )
            self.restarts += 1
            counter = self.spool.next_counter(name, self.counters.get(name, -1))
            self.configs[name] = dataclasses.replace(self.configs[name], start_counter=counter)
            self._spawn(name)

    def tokens_and_seconds(self) -> tuple[int, float]:
        tokens, seconds = 0, 0.0
        for name in self.configs:
            try:
                stats = json.loads(stats_path(self.run.out, name).read_text())
            except (OSError, ValueError):
                continue
            tokens += int(stats.get("tokens", 0))
            seconds += float(stats.get("seconds_generating", 0.0))
        return tokens, seconds

    def stop(self) -> None:
        self.stop_event.set()
        for process in self.processes.values():
            process.join(timeout=10)
        for process in self.processes.values():
            if process.is_alive():
                process.kill()
                process.join()


class _Progress:
    """The line printed per step, and the row written for it."""

    def __init__(self, run: LocalRun, pool: _Workers, say: Callable[[str], None]) -> None:
        self.run, self.pool, self.say = run, pool, say
        self.began = self.last = time.monotonic()
        self.tokens, self.generating = pool.tokens_and_seconds()

    def row(self, report: StepReport) -> dict[str, Any]:
        now = time.monotonic()
        tokens, generating = self.pool.tokens_and_seconds()
        rate = (tokens - self.tokens) / max(now - self.last, 1e-9)
        row = {
            **report.as_dict(),
            "seconds_generating": generating - self.generating,
            "tokens_per_second": rate,
            "elapsed": now - self.began,
        }
        row.pop("extra")
        self.tokens, self.generating, self.last = tokens, generating, now
        skipped = "" if report.applied else "  SKIPPED (non-finite loss or gradient)"
        self.say(
            f"step {report.step:>4}/{self.run.recipe.steps}  reward {report.task_reward:.3f}  "
            f"len {report.length:5.1f}  stale {report.staleness_mean:.1f}  "
            f"{rate:6.0f} tok/s  wait {report.seconds_waiting:4.1f}s  "
            f"train {report.seconds_training:4.1f}s{skipped}"
        )
        return row
