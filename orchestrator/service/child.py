"""The one way the daemon runs a part of the orchestrator in a process of its own.

A child (the trainer, the validator, the recorder) is a frozen, picklable config
and one entry function ``main(config, stop)`` at module level, which a spawned
process can import. The daemon describes each as a `ChildSpec`; one `Child`
starts it (spawn: nothing of the daemon's threads, libp2p host or open ledger is
inherited), restarts it when it dies, and stops it through its `StopFlag`.

A child that fails says why in one sentence: it logs it (a traceback only for what
no sentence was written for: a bug) and hands it to the daemon through a pipe before
it exits. The daemon restarts it a few times, saying so, and stops with
`ChildFailedError` once it failed the same way `SAME_FAILURES` times in a row (a
damaged file, a setting: what a restart cannot mend) or `MAX_RESTARTS` times in all,
so a child never fails in a loop behind a daemon that looks up. Both count failures
since the child last got somewhere (`progressed`: the trainer took a step): a trainer
killed three times in a day, training between the kills, is no loop.

Before ``main`` runs, every child is set up alike: it dies with the daemon (a daemon
killed with SIGKILL takes its children with it at once, where its stop flag reached
them only once they next looked, seconds to minutes later), Ctrl-C is left to the
daemon (which stops its children itself), the child gets its share of the cores
(torch and rayon threads; docs/architecture.md, "Concurrency and processes"), and it logs
to ``<data_dir>/logs/<name>.log``, and to stderr unless the live view holds the
terminal.
"""

from __future__ import annotations

import contextlib
import logging
import multiprocessing
import os
import signal
import sys
from collections.abc import Callable
from dataclasses import dataclass
from multiprocessing.connection import Connection
from multiprocessing.context import SpawnProcess
from pathlib import Path
from typing import Any, Generic, TypeVar

from orchestrator.service.logs import setup_process_logging
from orchestrator.service.stop import StopFlag, StopSignal
from swarmrl.chain.errors import ChainError
from swarmrl.cores import take_threads
from swarmrl.files import os_error_sentence
from swarmrl.processes import die_with_parent

log = logging.getLogger("swarmrl.orchestrator")

# A child that dies is restarted this many times before the daemon gives up.
MAX_RESTARTS = 5
# A child that fails the same way this many times in a row is not restarted again.
SAME_FAILURES = 3
STOP_SECONDS = 15.0  # how long a child may take to stop before it is killed
MAX_SENTENCE = 1000  # characters of a child's failure the daemon is told


class ChildFailedError(ValueError):
    """A child failed too often; ``str(e)`` says which and why in one sentence. A
    ValueError, as every failure the command line shows as one sentence."""


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
    # What it gets the moment the daemon dies (its parent-death signal).
    death_signal: signal.Signals = signal.SIGKILL


class Child:
    """One child process, restarted when it dies (a few times)."""

    def __init__(self, spec: ChildSpec[Any]) -> None:
        self.spec = spec
        self.context = multiprocessing.get_context("spawn")
        self.stop = StopFlag(self.context)
        self.restarts = 0
        self.failure: str | None = None  # why it failed last, in one sentence
        self.same_failures = 0  # how many times in a row it failed so
        self.process: SpawnProcess | None = None
        self._why: Connection | None = None  # where the running child says why it failed
        self.finished = False

    @property
    def name(self) -> str:
        return self.spec.name

    def start(self) -> None:
        """Starts the child, from the thread that lives as long as it should (the main
        one): its parent-death signal comes when that thread ends (swarmrl.processes)."""
        reader, writer = self.context.Pipe(duplex=False)
        self.process = self.context.Process(
            target=_enter, args=(self.spec, self.stop, writer, os.getpid()), name=self.name
        )
        self.process.start()
        writer.close()  # the child holds the only writing end now
        if self._why is not None:
            self._why.close()
        self._why = reader
        log.info("started the %s process (pid %d)", self.name, self.process.pid)

    def check(self) -> None:
        """Restarts the child if it died; ChildFailedError once it failed the same way
        `SAME_FAILURES` times in a row or died too often."""
        assert self.process is not None, "check a child after starting it"
        if self.finished or self.process.is_alive():
            return
        code = self.process.exitcode
        if code == 0 and self.spec.finishes:
            self.finished = True
            log.info("the %s process finished its work", self.name)
            return
        why = self._told() or _exit_reason(code)
        self.same_failures = self.same_failures + 1 if why == self.failure else 1
        self.failure = why
        if self.same_failures >= SAME_FAILURES:
            raise ChildFailedError(
                f"the {self.name} process failed the same way {self.same_failures} times "
                f"in a row: {why}"
            )
        if self.restarts >= MAX_RESTARTS:
            raise ChildFailedError(
                f"the {self.name} process died {self.restarts + 1} times, the last time: {why}"
            )
        self.restarts += 1
        log.warning(
            "the %s process failed: %s; restarting it (if it fails the same way %d more "
            "time(s), the orchestrator stops)",
            self.name,
            why,
            SAME_FAILURES - self.same_failures,
        )
        self.start()

    def progressed(self) -> None:
        """The child got its work done since it was last started (the trainer trained a
        step): what failed before was mended by a restart, and its failures are not
        counted against the next ones."""
        self.restarts = 0
        self.same_failures = 0
        self.failure = None

    def _told(self) -> str | None:
        """The sentence the dead child left in its pipe, if it left one."""
        if self._why is None or not self._why.poll():
            return None
        try:
            return self._why.recv_bytes().decode(errors="replace")
        except (EOFError, OSError):  # it died without a word (SIGKILL, out of memory)
            return None

    def shutdown(self, timeout: float = STOP_SECONDS) -> None:
        """Asks the child to stop; kills it if it has not within `timeout` seconds."""
        self.stop.set()
        if self.process is None:
            return
        self.process.join(timeout)
        if self.process.is_alive():
            self.process.kill()
            self.process.join()


def _enter(spec: ChildSpec[Any], stop: StopFlag, why: Connection, parent: int) -> None:
    """The child process's body: the setup every child shares, then its ``main``; a
    failure ends as one logged sentence, handed to the daemon through ``why``."""
    die_with_parent(spec.death_signal, parent=parent)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    if spec.threads is not None:
        take_threads(spec.threads)
    setup_process_logging(spec.data_dir, spec.name, stderr=spec.log_to_stderr)
    if spec.threads is not None:
        log.info("the %s process: %d thread(s) for torch and rayon", spec.name, spec.threads)
    try:
        spec.main(spec.config, stop)
    except Exception as e:
        sentence = failure_sentence(e)
        if sentence is None:  # nobody foresaw it: its traceback is what finds the bug
            log.exception("the %s process failed", spec.name)
            sentence = f"{type(e).__name__}: {e}"
        else:
            log.error("the %s process stops: %s", spec.name, sentence)
        with contextlib.suppress(OSError):  # the daemon is gone: nobody left to tell
            why.send_bytes(" ".join(sentence.split())[:MAX_SENTENCE].encode())
        sys.exit(1)


def failure_sentence(error: Exception) -> str | None:
    """The one sentence a child's failure is written as, where one was written for it:
    bad input or state (ValueError, which includes a damaged ledger), the chain, the
    file system; None for anything else."""
    if isinstance(error, ValueError | ChainError):
        return str(error)
    if isinstance(error, OSError):
        return os_error_sentence(error)
    return None


def _exit_reason(code: int | None) -> str:
    """How a child that left no sentence ended, in words."""
    if code == 0:
        return "it ended without being asked to"
    if code is not None and code < 0:
        return f"killed by {signal.Signals(-code).name}"
    return f"exit code {code}"
