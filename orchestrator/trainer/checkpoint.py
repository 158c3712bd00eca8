"""The trainer's checkpoints: one directory per optimizer step, complete or absent.

``RUN_DIR/checkpoints/step_<n>/`` is the published policy (``RunDir.step``; the run
folder's contract is ``orchestrator.run_dir``): an HF model directory (config,
generation config, tokenizer, safetensors) with the weights in the run's serving dtype,
what samplers and validators load and the weight broadcast ships, file for file. Beside
it, in ``trainer/`` (never published), what resuming needs: ``dcp/``, the fp32 master
weights and the AdamW state written with torch.distributed.checkpoint (each rank of a
sharded trainer writes its own part, and any number of ranks, one included, reads them
back: a run resumes on another world size), and ``trainer_state.pt`` (step, RNG, data
position). A checkpoint is written under a hidden staging name, every file synced, then
renamed into place by rank 0 once every rank wrote its part: a reader, or a trainer
restarted after kill -9, sees whole checkpoints or none, and a staging directory left by
a crash is swept away on the next start.

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

import contextlib
import logging
import pickle
import shutil
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist

from orchestrator.run_dir import RunDir
from swarmrl.files import fsync, os_error_reason

if TYPE_CHECKING:
    from orchestrator.trainer.batch import TokenScorer

log = logging.getLogger("swarmrl.trainer")

STATE_FILE = "trainer_state.pt"
TRAINER_DIR = "trainer"  # what resuming needs, beside the published policy
DCP_DIR = "dcp"  # in TRAINER_DIR: master weights and optimizer, one part per rank
LM_PREFIX = "lm."  # a TokenScorer's names for its LM's tensors
KEEP_STATES = 2


@dataclass(frozen=True)
class Resume:
    """Where a restarted trainer continues: a whole checkpoint and its trainer state."""

    step: int
    state: dict[str, Any]


def trainer_dir(run_dir: Path, step: int) -> Path:
    return RunDir(Path(run_dir)).step(step) / TRAINER_DIR


def save_checkpoint(
    run_dir: Path,
    step: int,
    policy: TokenScorer,
    optimizer: torch.optim.Optimizer,
    tokenizer: Any,
    state: dict[str, Any],
    *,
    dtype: torch.dtype = torch.float32,
    keep: int = KEEP_STATES,
) -> Path:
    """Write step ``step`` atomically and return its directory: the policy's LM in
    ``dtype`` (the run's serving dtype), and in ``trainer/`` the master weights and
    optimizer state (DCP) and ``state``, which only the newest ``keep`` checkpoints keep.

    Every rank of a sharded trainer calls it (each writes its part; rank 0 the rest
    and ``state``, its own); a single process calls it alone."""
    from orchestrator.trainer.distributed import barrier, full_state_dict, is_main

    folder = RunDir(Path(run_dir))
    final, staging = folder.step(step), folder.staging(step)
    own = staging / TRAINER_DIR
    if is_main():
        if final.exists():
            raise ValueError(f"{final} exists already: this run has a step {step}")
        final.parent.mkdir(parents=True, exist_ok=True)
        shutil.rmtree(staging, ignore_errors=True)
        own.mkdir(parents=True)
    barrier()  # the staging directory exists before any rank writes into it
    try:
        _save_resumable(own / DCP_DIR, policy, optimizer)
        weights = full_state_dict(policy)  # every rank gathers; rank 0 gets them
        if is_main():
            policy.lm.save_pretrained(staging, state_dict=_served(policy, weights, dtype))
            tokenizer.save_pretrained(staging)
            torch.save({**state, "step": step}, own / STATE_FILE)
            # Each rank's DCP files were synced as DCP wrote them (its sync_files); here
            # every other file and the directories that name them, each once.
            for path in (*own.iterdir(), *staging.iterdir()):
                fsync(path)
            staging.rename(final)
            fsync(final.parent)
    except BaseException:
        if is_main():
            shutil.rmtree(staging, ignore_errors=True)
        raise
    barrier()  # no rank goes on before the step is in place
    if is_main():
        for old in folder.steps()[:-keep]:
            shutil.rmtree(trainer_dir(run_dir, old), ignore_errors=True)
    return final


def _served(
    policy: TokenScorer, weights: dict[str, torch.Tensor], dtype: torch.dtype
) -> dict[str, torch.Tensor]:
    """The LM's weights in ``dtype`` under its own names, a tied parameter (the output
    head that is the embeddings) as one tensor under both names. Gathered from shards
    or cast, the two names hold two copies, which save_pretrained would write both of
    (it drops a tied name only where the tensors share memory), and a node's check
    refuses a tensor its model lacks."""
    first: dict[int, str] = {}
    tied: dict[str, str] = {}
    for name, param in policy.named_parameters(remove_duplicate=False):
        tied[name] = first.setdefault(id(param), name)
    served = {name: t.to(dtype) for name, t in weights.items() if tied.get(name, name) == name}
    for name in weights:
        if name not in served:
            served[name] = served[tied[name]]
    return {name.removeprefix(LM_PREFIX): t for name, t in served.items()}


def _save_resumable(
    directory: Path, model: torch.nn.Module, optimizer: torch.optim.Optimizer
) -> None:
    """The fp32 master weights and the optimizer state, each rank its own shards."""
    from torch.distributed.checkpoint.state_dict import get_state_dict
    from torch.distributed.checkpoint.state_dict_saver import save

    fresh = not optimizer.state
    weights, moments = get_state_dict(model, optimizer)
    if fresh:
        # get_state_dict made the moments with one zero-gradient step at rate 0, which
        # AdamW counts; the policy of step 0 has taken none, and the count sets AdamW's
        # bias correction, so it goes back to 0 (the dicts share these tensors).
        for moment in optimizer.state.values():
            moment["step"].zero_()
    with _one_process_meant():
        save(
            {"model": weights, "optimizer": moments},
            checkpoint_id=directory,
            no_dist=not dist.is_initialized(),
        )


def load_resumable(
    run_dir: Path, step: int, model: torch.nn.Module, optimizer: torch.optim.Optimizer
) -> None:
    """Restore step ``step``'s master weights and optimizer state into ``model`` and
    ``optimizer``, sharded or not, whatever the world size that wrote them."""
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
    from torch.distributed.checkpoint.state_dict_loader import load

    directory = trainer_dir(run_dir, step) / DCP_DIR
    weights, moments = get_state_dict(model, optimizer)
    try:
        # Loads in place, into the tensors (and shards) the two dicts hold.
        with _one_process_meant():
            load(
                {"model": weights, "optimizer": moments},
                checkpoint_id=directory,
                no_dist=not dist.is_initialized(),
            )
    except Exception as e:  # DCP wraps every reader failure in its own CheckpointException
        raise ValueError(f"{directory} cannot be read back: {str(e).splitlines()[0]}") from None
    set_state_dict(model, optimizer, model_state_dict=weights, optim_state_dict=moments)


@contextlib.contextmanager
def _one_process_meant() -> Iterator[None]:
    """DCP warns on every call without a process group that it assumes one process:
    that is what a single-process trainer means, every step."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", "torch.distributed is disabled", UserWarning)
        yield


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
    tensor its config calls for, finite, its tokenizer and its state readable, the
    index of its master weights and optimizer state readable. ValueError (one
    sentence) naming what is damaged."""
    from torch.distributed.checkpoint.filesystem import FileSystemReader

    from swarmrl.models.directory import check_model, load_tokenizer

    directory = RunDir(Path(run_dir)).step(step)
    check_model(directory)
    load_tokenizer(directory)
    state = load_state(run_dir, step)
    resumable = trainer_dir(run_dir, step) / DCP_DIR
    try:
        FileSystemReader(resumable).read_metadata()
    except Exception:  # a missing file, a torn pickle: anything that is not an index
        raise ValueError(
            f"{resumable} holds no readable index of the master weights and optimizer state"
        ) from None
    return state


def resume_point(run_dir: Path, published: int | None) -> Resume | None:
    """The newest whole checkpoint to resume from, None for a run with none yet.
    ``published``: the newest step the swarm was given (None where nothing publishes,
    as in ``train local``); no step below it is resumed from. A damaged checkpoint
    above it is moved aside (logged) for the one before it. ValueError (one sentence)
    when nothing at or above ``published`` is whole."""
    folder = RunDir(Path(run_dir))
    root, steps = folder.checkpoints, folder.steps()
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
    folder = RunDir(Path(run_dir))
    aside = folder.damaged(step)
    shutil.rmtree(aside, ignore_errors=True)
    folder.step(step).rename(aside)
    return aside


def sweep_staging(run_dir: Path) -> None:
    """Remove what a crash left half-written."""
    for path in RunDir(Path(run_dir)).stagings():
        shutil.rmtree(path, ignore_errors=True)
