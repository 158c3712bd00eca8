"""Runs many cases in one process: `python -m tests.cli_contract.worker JOB RESULTS`.

Importing swarmrl (and torch) costs seconds; a command refused on its arguments
costs milliseconds. So one worker imports the entry point once and calls it for
each case as the console script would, with its own argv, working folder and
captured stdout and stderr, and reports one JSON line per case.
"""

from __future__ import annotations

import contextlib
import importlib
import json
import os
import shutil
import signal
import sys
import time
import traceback
from pathlib import Path

from typer.testing import CliRunner

from tests.cli_contract import procs, tree


class CaseTimeout(BaseException):
    """Raised in a command that runs past its case's time limit."""


def _on_alarm(signum: int, frame: object) -> None:
    raise CaseTimeout


def lay_out(scratch: Path) -> None:
    """What every case's folder holds before the run: an empty folder and a file that
    bad output paths point at."""
    (scratch / "taken").mkdir(parents=True)
    (scratch / "a-file").write_text("not a folder\n")


def run_case(entry: object, argv: list[str], scratch: Path, timeout: float) -> dict:
    """Call the entry point as `swarmrl ARGV` would run, in ``scratch``."""
    code: int | None = None
    crash = None
    timed_out = False
    home = os.getcwd()
    with CliRunner().isolation(input="") as (out, err, _):
        sys.argv = ["swarmrl", *argv]
        os.chdir(scratch)
        signal.setitimer(signal.ITIMER_REAL, timeout)
        try:
            entry()
            code = 0
        except SystemExit as e:
            code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
        except CaseTimeout:
            timed_out = True
        except BaseException:
            crash = traceback.format_exc()
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
            os.chdir(home)
            with contextlib.suppress(Exception):
                sys.stdout.flush()
                sys.stderr.flush()
        stdout, stderr = out.getvalue(), err.getvalue()
    return {
        "code": code,
        "crash": crash,
        "timed_out": timed_out,
        "stdout": stdout.decode(errors="replace"),
        "stderr": stderr.decode(errors="replace"),
    }


def preload() -> None:
    """What a command's own process would have set up before its first case: torch
    (whose import would eat into the first case's time limit) and multiprocessing's
    resource tracker (a helper process that lives as long as the worker)."""
    from multiprocessing import resource_tracker

    import torch  # noqa: F401

    resource_tracker.ensure_running()


def restore(watched: list[Path], pristine: Path) -> None:
    """Put the state folders and inputs back as they were, so one command that
    changed them (a failure already reported) does not mislead the cases after it."""
    for folder in watched:
        shutil.rmtree(folder, ignore_errors=True)
        shutil.copytree(pristine / folder.name, folder, symlinks=True)


def main() -> None:
    job = json.loads(Path(sys.argv[1]).read_text())
    results = open(sys.argv[2], "a")  # noqa: SIM115 (one line per case, for the run's life)
    module, _, name = job["entry"].partition(":")
    entry = getattr(importlib.import_module(module), name)
    preload()
    signal.signal(signal.SIGALRM, _on_alarm)
    mark = os.environ[procs.MARK_VARIABLE]
    watched = [Path(p) for p in job["watched"]]
    pristine = Path(job["pristine"])
    # The state folders, inputs and marked processes as the next case finds them:
    # nothing but a case changes them, so what is seen after one case is what the next
    # starts from, looked at again only after a repair (a restore, a kill). One look per
    # case instead of two: the looks were a good part of the whole run's time.
    before = {str(w): tree.snapshot(w) for w in watched}
    processes_before = procs.marked(mark)
    for case in job["cases"]:
        scratch = Path(case["scratch"])
        lay_out(scratch)
        scratch_before = tree.snapshot(scratch)
        results.write(json.dumps({"start": case["ident"]}) + "\n")
        results.flush()
        began = time.monotonic()
        result = run_case(entry, case["argv"], scratch, job["timeout"])
        result["seconds"] = round(time.monotonic() - began, 2)
        running = procs.marked(mark)
        left = {p: c for p, c in running.items() if p not in processes_before}
        procs.kill(list(left))
        processes_before = procs.marked(mark) if left else running
        after = {str(w): tree.snapshot(w) for w in watched}
        changed = [
            line for w in watched for line in tree.differences(w, before[str(w)], after[str(w)])
        ]
        if changed:
            restore(watched, pristine)
            after = {str(w): tree.snapshot(w) for w in watched}
        before = after
        result.update(
            ident=case["ident"],
            changed=changed,
            mess=tree.differences(scratch, scratch_before, tree.snapshot(scratch)),
            left=[f"pid {p}: {c}" for p, c in left.items()],
        )
        results.write(json.dumps(result) + "\n")
        results.flush()


if __name__ == "__main__":
    main()
