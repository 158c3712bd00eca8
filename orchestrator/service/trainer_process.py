"""The trainer as one of the orchestrator's processes.

It is the learner of ``train local`` unchanged: it reads the validator's spool,
trains, and writes ``checkpoints/step_<n>/``, which the daemon publishes to the
swarm. Restarted, it continues from its newest checkpoint.
"""

from __future__ import annotations

import dataclasses
import logging
import os
from pathlib import Path
from typing import Any

from orchestrator.trainer.loop import TrainerSettings

log = logging.getLogger("swarmrl.trainer")


@dataclasses.dataclass(frozen=True)
class TrainerProcessConfig:
    data_dir: Path
    run_dir: Path
    model: Path
    tasks_file: Path
    settings: TrainerSettings
    threads: int
    device: str | None


def run_trainer(config: TrainerProcessConfig, stop: Any, parent_pid: int) -> None:
    """The process body: train until the last step, ``stop``, or the parent is gone."""
    import signal

    signal.signal(signal.SIGINT, signal.SIG_IGN)
    os.environ["RAYON_NUM_THREADS"] = str(config.threads)
    import torch

    torch.set_num_threads(config.threads)
    from orchestrator.service.logs import setup_process_logging
    from orchestrator.train_local.metrics import MetricsLog
    from orchestrator.trainer.loop import StepReport, Trainer
    from swarmrl.cli_options import quiet_transformers
    from swarmrl.tasks import read_tasks

    setup_process_logging(config.data_dir, "trainer")
    quiet_transformers()
    trainer = Trainer(
        config.run_dir,
        config.model,
        read_tasks(config.tasks_file),
        config.settings,
        device=config.device or "cpu",
    )
    metrics = MetricsLog(config.run_dir / "metrics.jsonl", resume_step=trainer.step)
    log.info("trainer at step %d of %d", trainer.step, config.settings.steps)

    def on_step(report: StepReport) -> None:
        row = report.as_dict()
        row.pop("extra")
        metrics.append(row)
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

    trainer.train(
        should_stop=lambda: stop.is_set() or os.getppid() != parent_pid,
        on_step=on_step,
        poll_seconds=0.2,
    )
    log.info("trainer stopped at step %d", trainer.step)
