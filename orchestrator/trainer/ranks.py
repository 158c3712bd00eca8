"""The trainer as a torch.distributed job: the launcher, and what each rank sets up.

``run_job`` is torchrun in-process: torch.distributed.elastic's agent starts
``nproc_per_node`` ranks here and meets the other machines' agents at the c10d
rendezvous. When a rank dies the agent stops the others and fails, and whoever runs
it restarts the whole job, which resumes from the newest checkpoint: the daemon's
trainer child is restarted as a single-process trainer would be, with the same
count of failures. (Not the agent's own restarts: a new round on the same store
left the restarted ranks of a loaded machine waiting forever on each other in gloo's
connect, where a fresh agent, store and port never did.)

Each rank (``joined``) dies with its agent (a rank orphaned by a SIGKILLed agent would
go on writing checkpoints beside the restarted job's), takes its share of the cores,
and opens the process group: NCCL on its own GPU, gloo on a CPU.
"""

from __future__ import annotations

import contextlib
import faulthandler
import multiprocessing
import os
import signal
import tempfile
from collections.abc import Callable, Iterator
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist

from orchestrator.trainer.launch import TrainerLaunch
from swarmrl.cores import take_threads
from swarmrl.processes import die_with_parent

if TYPE_CHECKING:
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError, ProcessFailure

# A collective that waits longer than this ends the job: every wait the trainer does
# (for rollouts, for a checkpoint) is a round of short collectives, never one long one.
COLLECTIVE_TIMEOUT = timedelta(minutes=30)


def run_job(launch: TrainerLaunch, job: str, entry: Callable[..., None], *args: Any) -> None:
    """Runs ``entry(*args)`` on every rank of this machine, under the elastic agent,
    until every rank returned; once one failed, ValueError: which, and how, in one
    sentence."""
    from torch.distributed.elastic.multiprocessing import DefaultLogsSpecs, SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.launcher.api import LaunchConfig, elastic_launch

    alone = launch.nnodes == 1
    # Where the ranks' errors are written (``record``); torch's own default is a new
    # folder in /tmp per job, never removed.
    with tempfile.TemporaryDirectory(prefix="swarmrl-trainer-job-") as errors:
        config = LaunchConfig(
            min_nodes=launch.nnodes,
            max_nodes=launch.nnodes,
            nproc_per_node=launch.nproc_per_node,
            run_id=job,
            rdzv_backend="c10d",
            # One machine meets on a free loopback port, as torchrun --standalone does,
            # so two runs on one machine never collide and nothing listens beyond it.
            rdzv_endpoint="127.0.0.1:0" if alone else launch.rdzv_endpoint,
            local_addr="127.0.0.1" if alone else None,
            max_restarts=0,  # the caller restarts the job (see above)
            monitor_interval=0.5,
            start_method="spawn",
            logs_specs=DefaultLogsSpecs(log_dir=errors),
        )
        try:
            elastic_launch(config, entry)(*args)
        except ChildFailedError as e:
            rank, failure = _first_failure(e, Path(errors))
            if failure.exitcode < 0:
                how = f"was killed by {failure.signal_name()}"
            else:
                # The rank's own sentence (its exception), first line: the rest is traceback.
                said = str(
                    failure.message.get("message", "")
                    if isinstance(failure.message, dict)
                    else failure.message
                )
                first = said.splitlines()[0] if said else f"exit code {failure.exitcode}"
                how = f"failed: {first}"
            raise ValueError(f"trainer rank {rank} {how}; the job stopped") from None
        except SignalException as e:  # the agent stopped its ranks, and so the job, first
            raise ValueError(f"the trainer job was stopped by {e.sigval.name}") from None


def _first_failure(e: ChildFailedError, errors: Path) -> tuple[int, ProcessFailure]:
    """The failure the job's end began with. The agent reports the first rank it saw
    end, and the ranks a failed one leaves waiting in a collective fail too ("connection
    closed by peer"), at times before it has exited. An exception is on file from when
    it was raised (``record``; a failed rank keeps its process group until it exits, see
    ``joined``), so the oldest file is the first; a rank killed by a signal left none."""
    from torch.distributed.elastic.multiprocessing.errors import ProcessFailure

    rank, failure = e.get_first_failure()
    files = sorted(errors.glob("*/attempt_*/*/error.json"), key=lambda f: f.stat().st_mtime_ns)
    if failure.exitcode < 0 or not files:
        return rank, failure
    local = int(files[0].parent.name)
    # The error file holds the rest; its pid serves only a signal's message.
    first = ProcessFailure(local_rank=local, pid=0, exitcode=1, error_file=str(files[0]))
    return rank - failure.local_rank + local, first


@contextlib.contextmanager
def joined(launch: TrainerLaunch, device: str, threads: int | None) -> Iterator[torch.device]:
    """This rank (under ``run_job``) set up, in the process group until the block ends;
    yields its device. ``threads``: the cores of all of this machine's ranks together,
    of which it takes its share."""
    faulthandler.register(signal.SIGUSR1)  # `kill -USR1 PID` prints every thread's stack
    yield _join(device, None if threads is None else launch.threads_per_process(threads))
    # Left only after a clean end. A rank that failed keeps the group until its process
    # exits, so its error is on file before the ranks waiting for it fail in turn: the
    # job's sentence is the first failure's (``_first_failure``).
    dist.destroy_process_group()


def _join(device: str, threads: int | None) -> torch.device:
    """Sets up this rank and returns its device: on cuda, the GPU of its local rank."""
    _die_with_parent()
    if threads is not None:
        take_threads(threads)
    local = int(os.environ["LOCAL_RANK"])
    if torch.device(device).type == "cuda":
        placed = torch.device("cuda", local)
        torch.cuda.set_device(placed)
        backend = "nccl"
    else:
        placed, backend = torch.device("cpu"), "gloo"
        # Loopback only, unless a job spans machines: gloo would otherwise pick the
        # interface of the host name, which may reach beyond 127.0.0.1.
        if int(os.environ.get("GROUP_WORLD_SIZE", "1")) == 1:
            os.environ.setdefault("GLOO_SOCKET_IFNAME", loopback_interface())
    dist.init_process_group(
        backend, timeout=COLLECTIVE_TIMEOUT, device_id=placed if backend == "nccl" else None
    )
    return placed


def loopback_interface() -> str:
    import socket

    names = {name for _, name in socket.if_nameindex()}
    return "lo0" if "lo0" in names else "lo"


def _die_with_parent() -> None:
    """SIGKILL when the agent that spawned this rank dies (Linux; elsewhere, nothing),
    or an end here if it died already. The agent starts its ranks from the thread that
    called ``run_job`` (the trainer child's main thread; `train local`'s job thread): the
    signal comes when that thread ends."""
    agent = multiprocessing.parent_process()
    die_with_parent(parent=None if agent is None else agent.pid)
