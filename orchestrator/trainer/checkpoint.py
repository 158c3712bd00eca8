"""The trainer's checkpoints: one directory per optimizer step, complete or absent.

``RUN_DIR/checkpoints/step_<n>/`` is an HF model directory (config, safetensors,
tokenizer), what workers hot-reload and the weight broadcast ships, plus
``trainer_state.pt`` (optimizer, step, RNG, data position) for resuming. It is
written under a hidden staging name, every file synced, then renamed into place:
a reader, or a trainer restarted after kill -9, sees whole checkpoints or none,
and a staging directory left by a crash is swept away on the next start.

Every step's weights are kept (they are what evaluation and the broadcast read);
the optimizer state, twice the weights' size, only in the newest few.
"""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path
from typing import Any

import torch

STATE_FILE = "trainer_state.pt"
KEEP_STATES = 2
_STEP_DIR = re.compile(r"step_(\d+)")


def checkpoints_dir(run_dir: Path) -> Path:
    return Path(run_dir) / "checkpoints"


def step_dir(run_dir: Path, step: int) -> Path:
    return checkpoints_dir(run_dir) / f"step_{step}"


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
) -> Path:
    """Write step ``step`` atomically and return its directory. ``weights`` replaces the
    model's own state dict (a data-parallel trainer passes the gathered full one)."""
    final = step_dir(run_dir, step)
    if final.exists():
        raise ValueError(f"{final} exists already: this run has a step {step}")
    final.parent.mkdir(parents=True, exist_ok=True)
    staging = final.parent / f".{final.name}.staging"
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir()
    try:
        model.save_pretrained(staging, state_dict=weights)
        tokenizer.save_pretrained(staging)
        torch.save({**state, "step": step}, staging / STATE_FILE)
        for path in staging.iterdir():
            _fsync(path)
        staging.rename(final)
        _fsync(final.parent)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    for old in steps_on_disk(run_dir)[:-KEEP_STATES]:
        (step_dir(run_dir, old) / STATE_FILE).unlink(missing_ok=True)
    return final


def load_state(run_dir: Path, step: int) -> dict[str, Any]:
    """The trainer state saved with step ``step``; ValueError if it cannot be read."""
    path = step_dir(run_dir, step) / STATE_FILE
    try:
        state: dict[str, Any] = torch.load(path, map_location="cpu", weights_only=True)
        return state
    except (OSError, RuntimeError, ValueError, EOFError) as e:
        raise ValueError(f"{path} is not a readable trainer state ({e})") from None


def sweep_staging(run_dir: Path) -> None:
    """Remove what a crash left half-written."""
    root = checkpoints_dir(run_dir)
    if root.is_dir():
        for path in root.glob(".step_*.staging"):
            shutil.rmtree(path, ignore_errors=True)


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
