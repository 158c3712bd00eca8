"""The one way the daemon runs a part of the orchestrator in a process of its own.

A child (the trainer, the validator, the recorder) is a frozen, picklable config
and one entry function ``main(config, stop)`` at module level, which a spawned
process can import. The daemon describes each as a `ChildSpec`; one `Child`
starts it (spawn: nothing of the daemon's threads, libp2p host or open ledger is
inherited), restarts it when it dies, and stops it through its `StopFlag`.

Before ``main`` runs, every child is set up alike: Ctrl-C is left to the daemon
(which stops its children itself), the child gets its share of the cores (torch
and rayon threads; ARCHITECTURE.md, "Concurrency and processes"), and it logs to
``<data_dir>/logs/<name>.log``, and to stderr unless the live view holds the
terminal.
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import signal
from collections.abc import Callable
from dataclasses import dataclass
from multiprocessing.context import SpawnProcess
from pathlib import Path
from typing import Any, Generic, TypeVar

from orchestrator.service.logs import setup_process_logging
from orchestrator.service.stop import StopFlag, StopSignal

log = logging.getLogger("swarmrl.orchestrator")

# A child that dies is restarted this many times before the daemon gives up.
MAX_RESTARTS = 5
STOP_SECONDS = 15.0  # how long a child may take to stop before it is killed

Config = TypeVar("Config")


@dataclass(frozen=True)
class ChildSpec(Generic[Config]):
    """A child process: what runs in it, and how it is set up and supervised."""

    name: str  # in the daemon's log lines and the child's log file's name
    main: Callable[[Config, StopSignal], None]  # module level, so the spawned child finds it
    config: Config  # frozen and picklable
    data_dir: Path  # the child logs to <data_dir>/logs/<name>.log
    log_to_stderr: bool  # False while the terminal shows the live view
    threads: int | None = None  # its share of the cores; None: the libraries' defaults
    finishes: bool = False  # exit code 0 is its work done (the trainer's last step), no crash


class Child:
    """One child process, restarted when it dies (a few times)."""

    def __init__(self, spec: ChildSpec[Any]) -> None:
        self.spec = spec
        self.context = multiprocessing.get_context("spawn")
        self.stop = StopFlag(self.context)
        self.restarts = 0
        self.process: SpawnProcess | None = None
        self.finished = False

    @property
    def name(self) -> str:
        return self.spec.name

    def start(self) -> None:
        self.process = self.context.Process(
            target=_enter, args=(self.spec, self.stop), name=self.name
        )
        self.process.start()
        log.info("started the %s process (pid %d)", self.name, self.process.pid)

    def check(self) -> None:
        """Restarts the child if it died; raises once it died too often."""
        assert self.process is not None, "check a child after starting it"
        if self.finished or self.process.is_alive():
            return
        code = self.process.exitcode
        if code == 0 and self.spec.finishes:
            self.finished = True
            log.info("the %s process finished its work", self.name)
            return
        if self.restarts >= MAX_RESTARTS:
            raise RuntimeError(
                f"the {self.name} process died {self.restarts + 1} times (code {code})"
            )
        self.restarts += 1
        log.warning("the %s process exited with code %s; restarting it", self.name, code)
        self.start()

    def shutdown(self, timeout: float = STOP_SECONDS) -> None:
        """Asks the child to stop; kills it if it has not within `timeout` seconds."""
        self.stop.set()
        if self.process is None:
            return
        self.process.join(timeout)
        if self.process.is_alive():
            self.process.kill()
            self.process.join()


def _enter(spec: ChildSpec[Any], stop: StopFlag) -> None:
    """The child process's body: the setup every child shares, then its ``main``."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    if spec.threads is not None:
        # Set before the native kernels' rayon pool starts; it reads this once.
        os.environ["RAYON_NUM_THREADS"] = str(spec.threads)
        import torch

        torch.set_num_threads(spec.threads)
    setup_process_logging(spec.data_dir, spec.name, stderr=spec.log_to_stderr)
    if spec.threads is not None:
        log.info("the %s process: %d thread(s) for torch and rayon", spec.name, spec.threads)
    spec.main(spec.config, stop)
