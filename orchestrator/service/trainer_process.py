"""The trainer as one of the orchestrator's processes.

It is the learner of ``train local`` unchanged: it reads the validator's spool,
trains, and writes ``checkpoints/step_<n>/``, which the daemon publishes to the
swarm. Restarted, it continues from its newest whole checkpoint, never from one
below the newest step the daemon's weight store has announced. After every step it
appends the step's line to ``metrics.jsonl`` and redraws ``metrics.png``.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
from pathlib import Path

from orchestrator.service.stop import StopSignal
from orchestrator.trainer.loop import StepReport
from orchestrator.trainer.metrics import MetricsLog, plot_metrics, read_metrics
from orchestrator.trainer.recipe import GRPORecipe
from swarmrl.models.backend import Precision

log = logging.getLogger("swarmrl.trainer")


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


def main(config: TrainerProcessConfig, stop: StopSignal) -> None:
    """The child's body (see ``child``): train until the last step or ``stop``."""
    from orchestrator.trainer.loop import Trainer
    from swarmrl.cli_options import quiet_transformers
    from swarmrl.p2p.store import newest_announced_step
    from swarmrl.tasks import read_tasks

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
    )
    on_step = StepWriter(
        config.run_dir, trainer.step, f"swarmrl orchestrator: run {config.run[:10]}"
    )
    log.info("trainer at step %d of %d", trainer.step, config.recipe.steps)
    try:
        trainer.train(
            should_stop=stop.is_set,
            on_step=on_step,
            poll_seconds=0.2,
        )
    finally:
        on_step.close()
    log.info("trainer stopped at step %d", trainer.step)


class StepWriter:
    """What the trainer leaves after each step: the line in ``metrics.jsonl``, a log line,
    and the curves in ``metrics.png``.

    The PNG is drawn in a thread of its own (about a second of CPU), so a step never
    waits for it; steps that come faster than drawings are drawn together by the next
    one, and ``close`` draws the last of them."""

    def __init__(self, run_dir: Path, resume_step: int, title: str) -> None:
        self.metrics = MetricsLog(run_dir / "metrics.jsonl", resume_step=resume_step)
        self.png = run_dir / "metrics.png"
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
