"""The trainer's checkpoints: one directory per optimizer step, complete or absent.

``RUN_DIR/checkpoints/step_<n>/`` is the published policy: an HF model directory
(config, generation config, tokenizer, safetensors) with the weights in the run's
serving dtype, what samplers and validators load and the weight broadcast ships,
file for file. Beside it, in ``trainer/`` (never published), what resuming needs:
``trainer_state.pt`` (optimizer, step, RNG, data position) and, when the serving
dtype is not fp32, the fp32 master weights as a model directory of their own. A
checkpoint is written under a hidden staging name, every file synced, then renamed
into place: a reader, or a trainer restarted after kill -9, sees whole checkpoints
or none, and a staging directory left by a crash is swept away on the next start.

Every step's published weights are kept (they are what evaluation and the
validator read); ``trainer/``, the optimizer state alone twice the weights' fp32
size, only in the newest ``keep`` checkpoints.

A checkpoint can still be damaged after it was written (a disk fault, a file
overwritten or deleted), so a trainer resumes only from one checked whole
(`resume_point`). A damaged newest checkpoint is moved aside for the one before
it, but never below the newest step the swarm was given: a step trained again
would be another policy under a number nodes already generate and are judged
with, so then the trainer refuses, in one sentence, to start.
"""

from __future__ import annotations

import logging
import pickle
import re
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from swarmrl.files import fsync, os_error_reason

log = logging.getLogger("swarmrl.trainer")

STATE_FILE = "trainer_state.pt"
TRAINER_DIR = "trainer"  # what resuming needs, beside the published policy
KEEP_STATES = 2
_STEP_DIR = re.compile(r"step_(\d+)")


@dataclass(frozen=True)
class Resume:
    """Where a restarted trainer continues: a whole checkpoint and its trainer state."""

    step: int
    state: dict[str, Any]


def checkpoints_dir(run_dir: Path) -> Path:
    return Path(run_dir) / "checkpoints"


def step_dir(run_dir: Path, step: int) -> Path:
    return checkpoints_dir(run_dir) / f"step_{step}"


def trainer_dir(run_dir: Path, step: int) -> Path:
    return step_dir(run_dir, step) / TRAINER_DIR


def master_dir(run_dir: Path, step: int) -> Path:
    """The model directory holding step ``step``'s fp32 master weights: the trainer's own
    when the serving dtype is narrower, else the published policy itself."""
    own = trainer_dir(run_dir, step)
    return own if (own / "config.json").is_file() else step_dir(run_dir, step)


def steps_on_disk(run_dir: Path) -> list[int]:
    """The steps with a complete checkpoint, oldest first."""
    root = checkpoints_dir(run_dir)
    if not root.is_dir():
        return []
    found = (_STEP_DIR.fullmatch(p.name) for p in root.iterdir() if p.is_dir())
    return sorted(int(m.group(1)) for m in found if m)


def latest_step(run_dir: Path) -> int | None:
    """The newest complete checkpoint's step, or None when there is none."""
    steps = steps_on_disk(run_dir)
    return steps[-1] if steps else None


def save_checkpoint(
    run_dir: Path,
    step: int,
    model: Any,
    tokenizer: Any,
    state: dict[str, Any],
    *,
    weights: dict[str, torch.Tensor] | None = None,
    dtype: torch.dtype = torch.float32,
    keep: int = KEEP_STATES,
) -> Path:
    """Write step ``step`` atomically and return its directory: the policy in ``dtype``
    (the run's serving dtype), the trainer's state (with the fp32 master weights when
    ``dtype`` is narrower) in ``trainer/``, which only the newest ``keep`` checkpoints
    keep. ``weights`` replaces the model's own state dict (a data-parallel trainer
    passes the gathered full one)."""
    final = step_dir(run_dir, step)
    if final.exists():
        raise ValueError(f"{final} exists already: this run has a step {step}")
    final.parent.mkdir(parents=True, exist_ok=True)
    staging = final.parent / f".{final.name}.staging"
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir()
    own = staging / TRAINER_DIR
    own.mkdir()
    try:
        master = model.state_dict() if weights is None else weights
        if dtype == torch.float32:
            model.save_pretrained(staging, state_dict=master)
        else:
            model.save_pretrained(own, state_dict=master)
            served = {name: t.to(dtype) for name, t in master.items()}
            model.save_pretrained(staging, state_dict=served)
        tokenizer.save_pretrained(staging)
        torch.save({**state, "step": step}, own / STATE_FILE)
        for path in (*own.iterdir(), own, *staging.iterdir()):
            fsync(path)
        staging.rename(final)
        fsync(final.parent)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    for old in steps_on_disk(run_dir)[:-keep]:
        shutil.rmtree(trainer_dir(run_dir, old), ignore_errors=True)
    return final


def load_state(run_dir: Path, step: int) -> dict[str, Any]:
    """The trainer state saved with step ``step``; ValueError if it cannot be read."""
    path = trainer_dir(run_dir, step) / STATE_FILE
    try:
        state: dict[str, Any] = torch.load(path, map_location="cpu", weights_only=True)
        return state
    except OSError as e:
        raise ValueError(f"{path} cannot be read: {os_error_reason(e)}") from None
    except (RuntimeError, ValueError, EOFError, pickle.UnpicklingError):
        # Not torch's words: for a damaged file they suggest loading it unsafely.
        raise ValueError(f"{path} is not a whole trainer state: torch cannot load it") from None


def check_resumable(run_dir: Path, step: int) -> dict[str, Any]:
    """The trainer state of step ``step`` once its checkpoint is checked whole: every
    tensor its configs call for (the policy's and the master weights'), finite, its
    tokenizer and its state readable. ValueError (one sentence) naming what is damaged."""
    from swarmrl.models.directory import check_model, load_tokenizer

    directory = step_dir(run_dir, step)
    check_model(directory)
    if (master := master_dir(run_dir, step)) != directory:
        check_model(master)
    load_tokenizer(directory)
    return load_state(run_dir, step)


def resume_point(run_dir: Path, published: int | None) -> Resume | None:
    """The newest whole checkpoint to resume from, None for a run with none yet.
    ``published``: the newest step the swarm was given (None where nothing publishes,
    as in ``train local``); no step below it is resumed from. A damaged checkpoint
    above it is moved aside (logged) for the one before it. ValueError (one sentence)
    when nothing at or above ``published`` is whole."""
    root = checkpoints_dir(run_dir)
    steps = steps_on_disk(run_dir)
    if not steps:
        if published is None:
            return None
        raise ValueError(
            f"{root} holds no checkpoint, but the swarm has policy step {published} "
            "already; restore the checkpoints from a backup (training again from step 0 "
            "would publish other policies under steps the nodes hold)"
        )
    damaged: list[tuple[int, str]] = []
    # Only the newest few keep a trainer state (retention drops the oldest first): the
    # ones a trainer can resume from. The newest without one is damaged, not old.
    for step in reversed(steps):
        if published is not None and step < published:
            break
        if step != steps[-1] and not trainer_dir(run_dir, step).is_dir():
            break
        try:
            state = check_resumable(run_dir, step)
        except ValueError as e:
            damaged.append((step, str(e)))
            continue
        for bad, why in damaged:
            aside = _move_aside(run_dir, bad)
            log.warning("checkpoint %d is damaged (%s); moved to %s", bad, why, aside)
        if damaged:
            log.warning("resuming from checkpoint %d, the newest whole one", step)
        return Resume(step, state)
    if not damaged:
        raise ValueError(
            f"the newest checkpoint in {root} is step {steps[-1]}, but the swarm has policy "
            f"step {published} already; restore the checkpoints from a backup (training "
            "again from there would publish other policies under steps the nodes hold)"
        )
    newest, why = damaged[0]
    if published is not None and newest <= published:
        instead = "the swarm has this step already, so training cannot go back before it"
    else:
        instead = "no checkpoint before it that training could go back to is whole"
    raise ValueError(
        f"cannot resume from checkpoint {newest}: {why}; {instead}: restore {root} from a backup"
    )


def _move_aside(run_dir: Path, step: int) -> Path:
    """Renames a damaged checkpoint out of the steps (kept for a look, never read), so
    its step can be trained again."""
    aside = checkpoints_dir(run_dir) / f".step_{step}.damaged"
    shutil.rmtree(aside, ignore_errors=True)
    step_dir(run_dir, step).rename(aside)
    return aside


def sweep_staging(run_dir: Path) -> None:
    """Remove what a crash left half-written."""
    root = checkpoints_dir(run_dir)
    if root.is_dir():
        for path in root.glob(".step_*.staging"):
            shutil.rmtree(path, ignore_errors=True)
