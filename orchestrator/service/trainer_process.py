"""The trainer as one of the orchestrator's processes.

It is the learner of ``train local`` unchanged: it reads the validator's spool,
trains, and writes ``checkpoints/step_<n>/``, which the daemon publishes to the
swarm. Restarted, it continues from its newest whole checkpoint, never from one
below the newest step the daemon's weight store has announced. After every step it
appends the step's line to ``metrics.jsonl`` and redraws ``metrics.png``.

With more than one trainer process in the settings (``TrainerLaunch``) this process
is torchrun's agent instead (``ranks.run_job``): it starts the ranks, which train the
sharded policy together (rank 0 writes what the single process writes), and fails
when one of them dies, to be restarted by the daemon from the newest checkpoint.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import signal
import threading
from pathlib import Path
from typing import TYPE_CHECKING

from torch.distributed.elastic.multiprocessing.errors import record

from orchestrator.run_dir import RunDir
from orchestrator.service.child import ChildSpec
from orchestrator.service.logs import setup_process_logging
from orchestrator.service.stop import StopSignal
from orchestrator.trainer.launch import TrainerLaunch
from orchestrator.trainer.loop import StepReport
from orchestrator.trainer.metrics import MetricsLog, plot_metrics, read_metrics
from orchestrator.trainer.recipe import GRPORecipe
from swarmrl.models.backend import Precision

if TYPE_CHECKING:
    from orchestrator.service.settings import OrchestratorSettings

log = logging.getLogger("swarmrl.trainer")

TRAINER = "trainer"  # the trainer child's name


@dataclasses.dataclass(frozen=True)
class TrainerProcessConfig:
    run_dir: Path
    store_dir: Path  # the daemon's weight store: what the swarm has been given
    model: Path
    tasks_file: Path
    run: str
    recipe: GRPORecipe
    device: str | None
    serving: Precision  # the dtype the policy is published in
    keep_checkpoints: int
    launch: TrainerLaunch = dataclasses.field(default_factory=TrainerLaunch)
    # A job's ranks: where they log (<data_dir>/logs/), whether rank 0 also to stderr,
    # and the cores of all of this machine's ranks together.
    data_dir: Path | None = None
    log_to_stderr: bool = True
    threads: int | None = None


def spec(
    settings: OrchestratorSettings, run: str, *, threads: int, log_to_stderr: bool
) -> ChildSpec[TrainerProcessConfig]:
    """The trainer child of an orchestrator with ``settings``, training run ``run``; the
    daemon's, and on another machine of a job the one `swarmrl orchestrator trainer`
    runs."""
    data_dir = Path(settings.data_dir)
    folder = RunDir.of_orchestrator(data_dir)
    config = TrainerProcessConfig(
        run_dir=folder.root,
        store_dir=folder.weights,
        model=Path(settings.model),
        tasks_file=Path(settings.tasks),
        run=run,
        recipe=settings.recipe(),
        device=settings.device,
        serving=settings.precision,
        keep_checkpoints=settings.keep_checkpoints,
        launch=settings.launch_fields(),
        data_dir=data_dir,
        log_to_stderr=log_to_stderr,
        threads=threads,
    )
    return ChildSpec(
        TRAINER,
        main,
        config,
        data_dir=data_dir,
        log_to_stderr=log_to_stderr,
        threads=threads,
        finishes=True,  # once it trained the run's last step
        # torchrun's agent stops its ranks on SIGTERM, those still starting too: a rank
        # asks for a parent-death signal of its own only once its code runs, seconds
        # after it was spawned.
        death_signal=signal.SIGTERM if config.launch.distributed else signal.SIGKILL,
    )


def main(config: TrainerProcessConfig, stop: StopSignal) -> None:
    """The child's body (see ``child``): train until the last step or ``stop``."""
    if not config.launch.distributed:
        train(config, stop)
        return
    from orchestrator.trainer.ranks import run_job

    log.info(
        "starting %d trainer process(es) here, %d in all",
        config.launch.nproc_per_node,
        config.launch.world_size,
    )
    run_job(config.launch, f"trainer-{config.run[:16]}", rank_main, config, stop)
    log.info("the trainer processes finished")


@record  # a rank's exception reaches the agent, and so the daemon, as its sentence
def rank_main(config: TrainerProcessConfig, stop: StopSignal) -> None:
    """One rank of a trainer job: its share of the cores, its device, its log file
    (rank 0's is the trainer's), then the trainer loop."""
    from orchestrator.trainer.ranks import joined

    rank = int(os.environ["RANK"])
    if config.data_dir is not None:
        name = "trainer" if rank == 0 else f"trainer-rank{rank}"
        setup_process_logging(config.data_dir, name, stderr=rank == 0 and config.log_to_stderr)
    with joined(config.launch, config.device or "cpu", config.threads) as device:
        train(dataclasses.replace(config, device=str(device)), stop)


def train(config: TrainerProcessConfig, stop: StopSignal) -> None:
    """The trainer loop of this process (the only one, or one rank of a job)."""
    from orchestrator.trainer.loop import Trainer
    from swarmrl.cli_options import quiet_transformers
    from swarmrl.tasks import read_tasks
    from swarmrl.weights.store import newest_announced_step

    quiet_transformers()
    trainer = Trainer(
        config.run_dir,
        config.model,
        read_tasks(config.tasks_file),
        config.recipe,
        run=config.run,
        device=config.device or "cpu",
        serving=config.serving,
        keep_checkpoints=config.keep_checkpoints,
        # Read at every start: the daemon publishes while this process runs.
        published=newest_announced_step(config.store_dir),
        launch=config.launch,
    )
    on_step = None
    if trainer.main:
        on_step = StepWriter(
            config.run_dir, trainer.step, f"swarmrl orchestrator: run {config.run[:10]}"
        )
        log.info("trainer at step %d of %d", trainer.step, config.recipe.steps)
    try:
        trainer.train(
            should_stop=stop.is_set,
            on_step=on_step or (lambda report: None),
            poll_seconds=0.2,
        )
    finally:
        if on_step is not None:
            on_step.close()
    if trainer.main:
        log.info("trainer stopped at step %d", trainer.step)


class StepWriter:
    """What the trainer leaves after each step: the line in ``metrics.jsonl``, a log line,
    and the curves in ``metrics.png``.

    The PNG is drawn in a thread of its own (about a second of CPU), so a step never
    waits for it; steps that come faster than drawings are drawn together by the next
    one, and ``close`` draws the last of them."""

    def __init__(self, run_dir: Path, resume_step: int, title: str) -> None:
        folder = RunDir(run_dir)
        self.metrics = MetricsLog(folder.metrics, resume_step=resume_step)
        self.png = folder.metrics_plot
        self.title = title
        self._wanted = threading.Event()
        self._closing = False
        self._steps = 0  # steps written by this writer; the thread draws when it moves
        self._drawer = threading.Thread(target=self._draw_when_wanted, name="plot", daemon=True)
        self._drawer.start()

    def __call__(self, report: StepReport) -> None:
        row = report.as_dict()
        row.pop("extra")
        self.metrics.append(row)
        self._steps += 1
        self._wanted.set()
        log.info(
            "step %d reward %.3f len %.1f stale %.1f groups %d wait %.1fs train %.1fs",
            report.step,
            report.task_reward,
            report.length,
            report.staleness_mean,
            report.kept_groups,
            report.seconds_waiting,
            report.seconds_training,
        )

    def close(self) -> None:
        """Draws the steps not drawn yet and ends the thread."""
        self._closing = True
        self._wanted.set()
        self._drawer.join()

    def _draw_when_wanted(self) -> None:
        drawn = 0
        while True:
            self._wanted.wait()
            self._wanted.clear()
            # Read before drawing: a step during the drawing gets a drawing of its own.
            closing, steps = self._closing, self._steps
            if steps != drawn:
                try:
                    plot_metrics(read_metrics(self.metrics.path), self.png, self.title)
                except Exception as e:  # a picture is not worth the run: the numbers are
                    # in metrics.jsonl, and a trainer that dies over and over ends the daemon
                    log.warning("could not draw %s: %r", self.png, e)
                drawn = steps
            if closing:
                return
