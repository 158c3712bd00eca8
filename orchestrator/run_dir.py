"""The run folder: what one training run keeps on disk, the contract between the trainer
and whoever feeds it and reads it. Every process names its paths through `RunDir`.

A run folder is ``--out`` of ``swarmrl train local``, or ``<data_dir>/run/`` of an
orchestrator (`RunDir.of_orchestrator`). It holds:

- ``rollouts/``, the spool (``orchestrator.trainer.feed``): rollout files
  ``<sampler>-<counter>.parquet``, each written whole. Samplers write them: train
  local's workers, and the orchestrator's validator (a submission's accepted records,
  with its own rewards). The trainer alone reads them; a file it read moves to
  ``rollouts/read/`` until a checkpoint used up its last group. What is still unread
  is back-pressure: a train local worker pauses on its own files, the daemon counts
  them all in the backlog it tells nodes to wait on (`unread_rollouts`).
- ``checkpoints/step_<n>/`` (``orchestrator.trainer.checkpoint``): the policy after
  step n, an HF model directory. The trainer (its rank 0) writes it under
  ``.step_<n>.staging`` and renames it into place, so a reader sees whole steps or
  none, and moves a damaged one aside to ``.step_<n>.damaged``. Train local's workers
  load the newest (`latest`); the validator loads the step a submission claims, and an
  older one to check its staleness; the daemon publishes the newest to the swarm;
  evaluation reads any. Its ``trainer/`` part (optimizer, trainer state) is the
  trainer's alone, to resume from.
- ``metrics.jsonl``: one line per step, appended by the trainer; read by
  `orchestrator status`, the live view, the daemon's Prometheus metrics, the
  benchmarks and the swarm's fault checks. ``metrics.png``: its curves, the trainer's
  drawing.
- ``run.json`` (train local): the settings the run was started with, which a
  continued run must match.
- ``samplers/<worker>.json`` (train local): what each worker has generated (tokens,
  its newest counter), written by the worker, read by the trainer's process for
  tokens/s and to restart a worker past its counter.

Beside an orchestrator's run folder, in its data folder, the daemon keeps its weight
store (``<data_dir>/weights/``, `OrchestratorRunDir.weights`): what the swarm has
been given. The daemon writes it as it publishes steps; the trainer reads the newest
step announced there at every start, and never resumes below it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

RUN = "run"  # an orchestrator's run folder, in its data folder
WEIGHTS = "weights"  # an orchestrator's weight store, beside it
_STEP = re.compile(r"step_(\d+)")


@dataclass(frozen=True)
class RunDir:
    """The paths of one run folder (see the module's docstring for who writes what)."""

    root: Path

    @classmethod
    def of_orchestrator(cls, data_dir: Path) -> OrchestratorRunDir:
        """The run folder of the orchestrator whose data folder is ``data_dir``."""
        data_dir = Path(data_dir)
        return OrchestratorRunDir(data_dir / RUN, weights=data_dir / WEIGHTS)

    # ---- rollouts in --------------------------------------------------------------

    @property
    def spool(self) -> Path:
        """Where samplers leave rollout files for the trainer (``feed.Spool``)."""
        return self.root / "rollouts"

    def unread_rollouts(self) -> int:
        """How many rollout files wait in the spool for the trainer to read them."""
        spool = self.spool
        return sum(1 for p in spool.glob("*.parquet")) if spool.is_dir() else 0

    # ---- checkpoints out ----------------------------------------------------------

    @property
    def checkpoints(self) -> Path:
        return self.root / "checkpoints"

    def step(self, step: int) -> Path:
        """The checkpoint of ``step``: the policy after it (present once whole)."""
        return self.checkpoints / f"step_{step}"

    def staging(self, step: int) -> Path:
        """Where the checkpoint of ``step`` is written before it is renamed into place."""
        return self.checkpoints / f".step_{step}.staging"

    def stagings(self) -> list[Path]:
        """Checkpoints a crash left half-written."""
        root = self.checkpoints
        return list(root.glob(".step_*.staging")) if root.is_dir() else []

    def damaged(self, step: int) -> Path:
        """Where a damaged checkpoint of ``step`` is moved aside (kept for a look)."""
        return self.checkpoints / f".step_{step}.damaged"

    def steps(self) -> list[int]:
        """The steps with a complete checkpoint, oldest first."""
        root = self.checkpoints
        if not root.is_dir():
            return []
        found = (_STEP.fullmatch(p.name) for p in root.iterdir() if p.is_dir())
        return sorted(int(m.group(1)) for m in found if m)

    def latest(self) -> int | None:
        """The newest complete checkpoint's step, or None when there is none."""
        steps = self.steps()
        return steps[-1] if steps else None

    # ---- what the trainer reports -------------------------------------------------

    @property
    def metrics(self) -> Path:
        """One line per step (``trainer.metrics``)."""
        return self.root / "metrics.jsonl"

    @property
    def metrics_plot(self) -> Path:
        return self.root / "metrics.png"

    # ---- train local's own --------------------------------------------------------

    @property
    def settings(self) -> Path:
        """The settings a train local run was started with."""
        return self.root / "run.json"

    @property
    def samplers(self) -> Path:
        """Train local's workers' stats files, one per worker (`sampler_stats`)."""
        return self.root / "samplers"

    def sampler_stats(self, worker: str) -> Path:
        """What train local's worker ``worker`` says it has generated."""
        return self.samplers / f"{worker}.json"


@dataclass(frozen=True)
class OrchestratorRunDir(RunDir):
    """An orchestrator's run folder, and beside it the daemon's weight store."""

    weights: Path
