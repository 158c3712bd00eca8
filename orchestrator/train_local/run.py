"""`swarmrl train local`: the trainer and its inference workers on one machine.

This process is the trainer; it starts ``workers`` sampler processes, which
generate with the newest checkpoint while the trainer trains, and stops them
all when it stops (at the last step, at the time limit, on Ctrl-C, or on an
error). Each process gets its share of the cores (docs/architecture.md): left at
torch's default, processes on one machine slow each other down several times.

With more than one trainer process (``--nproc-per-node``) the trainer is a torchrun
job instead (``orchestrator.trainer.ranks``), run from a thread of this process, which
stays the run's parent: it keeps the workers, and tells the ranks to stop after the
step in hand (Ctrl-C, SIGTERM, the time limit, a worker that keeps dying). Rank 0
reads the spool and prints and writes what the single trainer does.

Run again with the same ``--out`` to continue a stopped or killed run, on any number
of trainer processes.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import multiprocessing
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from torch.distributed.elastic.multiprocessing.errors import record

from orchestrator.run_dir import RunDir
from orchestrator.service.stop import StopFlag, StopSignal
from orchestrator.train_local.sampler import SamplerConfig, run_sampler
from orchestrator.trainer import checkpoint as ckpt
from orchestrator.trainer.feed import Spool
from orchestrator.trainer.launch import TrainerLaunch
from orchestrator.trainer.loop import StepReport, Trainer
from orchestrator.trainer.metrics import MetricsLog, plot_metrics, read_metrics
from orchestrator.trainer.recipe import GRPORecipe
from swarmrl.files import write_atomically
from swarmrl.tasks import Task, read_tasks

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

    @property
    def worker_names(self) -> tuple[str, ...]:
        return tuple(f"w{i}" for i in range(self.workers))


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
    launch: TrainerLaunch = dataclasses.field(default_factory=TrainerLaunch)  # nnodes 1

    @property
    def folder(self) -> RunDir:
        return RunDir(self.out)


def check_run_dir(run: LocalRun) -> None:
    """A run directory continues only the run it was started for."""
    path = run.folder.settings
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
    # steps, the time limit and the trainer's processes (a checkpoint resumes on any
    # number) may change between sessions of one run; the recipe may not.
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
    trainer_threads = str(place.trainer_threads)
    if run.launch.distributed:
        each = run.launch.threads_per_process(place.trainer_threads)
        trainer_threads = f"{run.launch.nproc_per_node} process(es) x {each}"
    say(
        f"threads: trainer {trainer_threads}, {place.workers} worker(s) x "
        f"{place.worker_threads}, on {len(os.sched_getaffinity(0))} cores"
    )
    deadline = None if run.minutes is None else time.monotonic() + run.minutes * 60
    stop = _StopOnSignal()

    def stopping() -> bool:
        return stop.requested or (deadline is not None and time.monotonic() >= deadline)

    try:
        if run.launch.distributed:
            step = _train_job(run, place, device, stopping)
        else:
            step = _train_here(run, tasks, place, device, stopping, say)
    finally:
        stop.restore()
    _plot(run)
    if stop.requested:
        say(f"stopped at step {step} (interrupted); run again to continue")
    last = run.folder.step(step)
    say(f"step {step}: {last}")
    return last


def _train_here(
    run: LocalRun,
    tasks: list[Task],
    place: Placement,
    device: str,
    stopping: Callable[[], bool],
    say: Callable[[str], None],
) -> int:
    """The trainer in this process, beside its workers, until it trained the last step or
    ``stopping`` said so; returns the step it stopped at."""
    trainer = Trainer(run.out, run.model, tasks, run.recipe, run=run.run, device=device)
    pool = _Workers(run, place, trainer.feed.highest_counter)
    try:
        pool.start()

        def should_stop() -> bool:
            pool.check()
            return stopping()

        _train(trainer, run, place.worker_names, should_stop, say)
    finally:
        pool.stop()
    return trainer.step


def _train(
    trainer: Trainer,
    run: LocalRun,
    workers: tuple[str, ...],
    should_stop: Callable[[], bool],
    say: Callable[[str], None],
) -> None:
    """The trainer's loop, with the line printed and the row written per step: in the
    single trainer, or on every rank of a job (rank 0 prints and writes)."""
    if not trainer.main:  # rank 0 reports the steps
        trainer.train(should_stop=should_stop, on_step=lambda report: None)
        return
    if trainer.step:
        say(f"continuing {run.out} from step {trainer.step}")
    metrics = MetricsLog(run.folder.metrics, resume_step=trainer.step)
    progress = _Progress(run, workers, say)

    def on_step(report: StepReport) -> None:
        metrics.append(progress.row(report))
        if report.step % PLOT_EVERY == 0:
            _plot(run)

    trainer.train(should_stop=should_stop, on_step=on_step)


@dataclasses.dataclass(frozen=True)
class _RankJob:
    """What each rank of the trainer job is given (with the stop flag)."""

    run: LocalRun
    device: str
    threads: int  # the trainer's, shared by this machine's ranks
    workers: tuple[str, ...]


def _train_job(run: LocalRun, place: Placement, device: str, stopping: Callable[[], bool]) -> int:
    """The trainer as a torchrun job of ``run.launch``'s processes, beside this process's
    workers, until it trained the last step or ``stopping`` (asked here) said so; returns
    the step it stopped at. A rank that fails ends the run with run_job's sentence."""
    from orchestrator.trainer.ranks import run_job

    flag = StopFlag(multiprocessing.get_context("spawn"))
    given = _RankJob(run, device, place.trainer_threads, place.worker_names)
    failed: list[Exception] = []

    def job() -> None:
        # The ranks start from this thread and so with its signal mask: the terminal's
        # Ctrl-C, sent to the whole process group, never reaches them. This process
        # decides, and tells them through ``flag``: they stop after the step in hand.
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
        try:
            run_job(run.launch, "train-local", _rank_main, given, flag)
        except Exception as e:  # the main thread raises it
            failed.append(e)

    # torch's agent registers its signal handlers only in the main thread: from this
    # one it would only say so, on every start.
    logging.getLogger("torch.distributed.elastic.multiprocessing.api").addFilter(
        lambda entry: "child thread" not in entry.getMessage()
    )
    # A daemon: at a second Ctrl-C this process exits without waiting for the job, and
    # the ranks die with the thread that started them (``ranks``: their parent-death
    # signal).
    thread = threading.Thread(target=job, name="trainer-job", daemon=True)
    pool = _Workers(run, place, _counters_read(run.out))
    thread.start()
    try:
        pool.start()
        while thread.is_alive():
            try:
                pool.check()
            except ValueError:
                flag.set()
                thread.join()
                raise
            if stopping():
                flag.set()
            thread.join(0.2)
    finally:
        pool.stop()
    if failed:
        raise failed[0]
    step = run.folder.latest()
    assert step is not None  # every rank 0 writes step 0 or resumes from a checkpoint
    return step


@record  # a rank's exception reaches the agent, and so this run's error, as its sentence
def _rank_main(job: _RankJob, stop: StopSignal) -> None:
    """One rank of the trainer job: its share of the threads, its device, the loop."""
    from orchestrator.trainer.ranks import joined
    from swarmrl.cli_options import quiet_transformers

    quiet_transformers()
    run = job.run
    with joined(run.launch, job.device, job.threads) as device:
        trainer = Trainer(
            run.out,
            run.model,
            read_tasks(run.tasks),
            run.recipe,
            run=run.run,
            device=str(device),
            launch=run.launch,
        )
        _train(trainer, run, job.workers, stop.is_set, _say)


def _say(text: str) -> None:
    """A rank's ``say``: the parent's (typer's echo to stderr) does not cross processes."""
    print(text, file=sys.stderr, flush=True)


def _counters_read(run_dir: Path) -> dict[str, int]:
    """Per worker, the highest counter of its files the trainer had read at its newest
    checkpoint (where the trainer is a job, its feed is in another process)."""
    step = RunDir(run_dir).latest()
    if step is None:
        return {}
    try:
        state = ckpt.load_state(run_dir, step)
    except ValueError:  # the trainer goes back to an older one; the workers' stats say
        return {}
    return dict(state.get("feed", {}).get("highest_counter", {}))


def _plot(run: LocalRun) -> None:
    rows = read_metrics(run.folder.metrics)
    if rows:
        plot_metrics(rows, run.folder.metrics_plot, f"swarmrl train local: {run.out.name}")


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

    def __init__(self, run: LocalRun, place: Placement, counters: Mapping[str, int]) -> None:
        """``counters``: per worker, the highest counter of its files the trainer has read
        (the feed's, live, or as its newest checkpoint says)."""
        self.run, self.place, self.counters = run, place, counters
        self.context = multiprocessing.get_context("spawn")
        self.stop_event = self.context.Event()
        self.processes: dict[str, Any] = {}
        self.restarts = 0
        self.spool = Spool(run.folder.spool)
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
                start_counter=self._next_counter(name),
                # Two unread batches each, plus the one in the making: with most groups
                # filtered out a step reads about three batches, and workers that paused
                # behind one kept the trainer waiting a quarter of its time.
                max_pending=2,
                threads=place.worker_threads,
                backend=run.backend,
                device=run.device,
                parent_pid=os.getpid(),
            )
            for name in place.worker_names
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
            counter = self._next_counter(name)
            self.configs[name] = dataclasses.replace(self.configs[name], start_counter=counter)
            self._spawn(name)

    def _next_counter(self, name: str) -> int:
        """Past every batch the worker wrote, in any session: its files still on disk, the
        ones the trainer read (and deleted once used), and its own count."""
        used = max(
            self.counters.get(name, -1), int(_stats(self.run.folder, name).get("counter", -1))
        )
        return self.spool.next_counter(name, used)

    def stop(self) -> None:
        self.stop_event.set()
        for process in self.processes.values():
            process.join(timeout=10)
        for process in self.processes.values():
            if process.is_alive():
                process.kill()
                process.join()


class _Progress:
    """The line printed per step, and the row written for it; the workers' token counts
    come from their stats files, so a rank of a job keeps them too."""

    def __init__(self, run: LocalRun, workers: tuple[str, ...], say: Callable[[str], None]) -> None:
        self.run, self.workers, self.say = run, workers, say
        self.began = self.last = time.monotonic()
        self.tokens, self.generating = self._generated()

    def _generated(self) -> tuple[int, float]:
        """Tokens the workers generated, and the seconds it took them, all told."""
        tokens, seconds = 0, 0.0
        for name in self.workers:
            stats = _stats(self.run.folder, name)
            tokens += int(stats.get("tokens", 0))
            seconds += float(stats.get("seconds_generating", 0.0))
        return tokens, seconds

    def row(self, report: StepReport) -> dict[str, Any]:
        now = time.monotonic()
        tokens, generating = self._generated()
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


def _stats(folder: RunDir, worker: str) -> dict[str, Any]:
    """What a worker says of itself (``RunDir.sampler_stats``); nothing before its first
    batch."""
    try:
        stats: dict[str, Any] = json.loads(folder.sampler_stats(worker).read_text())
        return stats
    except (OSError, ValueError):
        return {}
