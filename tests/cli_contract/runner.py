"""Running cases (batched in a worker, or each in its own process) and judging the
outcome against the contract."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from tests.cli_contract import procs, tree
from tests.cli_contract.matrix import Case, RelativePair
from tests.cli_contract.worker import lay_out
from tests.cli_contract.world import World

SWARMRL_ENTRY = "swarmrl.cli:main"
SWARMRL = str(Path(sys.executable).with_name("swarmrl"))
# Exit codes of a command stopped by Ctrl-C: click's "Aborted!" (1), the shell
# convention 128 + SIGINT, or death by the signal itself.
INTERRUPTED = frozenset({1, 128 + signal.SIGINT, -signal.SIGINT})
# Phrases that mark a library's words reaching the user instead of a sentence.
LIBRARY_DUMPS = (
    "Traceback (most recent call last)",
    "[Errno",
    "errors.pydantic.dev",
    "validation error for",
)


@dataclass
class Outcome:
    case: Case
    code: int | None
    stdout: str = ""
    stderr: str = ""
    crash: str | None = None  # the traceback of an exception the entry point let out
    timed_out: bool = False
    changed: list[str] = field(default_factory=list)  # in the state folders and inputs
    mess: list[str] = field(default_factory=list)  # in the case's own folder
    left: list[str] = field(default_factory=list)  # processes still running after it
    seconds: float = 0.0

    def violations(self) -> list[str]:
        """How this run breaks the contract; empty if it keeps it."""
        found = []
        if self.crash is not None:
            found.append("an exception escaped the entry point")
        if self.timed_out:
            found.append("still running at its time limit (accepted the input, or hangs)")
        elif self.crash is None and self.code not in self.case.expect:
            allowed = " or ".join(str(c) for c in sorted(self.case.expect))
            found.append(f"exit {self.code}, expected {allowed}")
        silent_allowed = self.case.expect == INTERRUPTED  # 130 after Ctrl-C says enough
        if self.code not in (None, 0, 2) and not self.stderr.strip() and not silent_allowed:
            found.append("failed without a word on stderr")
        for phrase in LIBRARY_DUMPS:
            if phrase in self.stderr or phrase in self.stdout:
                found.append(f"{phrase!r} in the output")
        lines = self.stderr.strip("\n").splitlines()
        if self.code == 1 and self.case.expect != INTERRUPTED and len(lines) != 1:
            found.append(f"stderr has {len(lines)} lines, not one sentence")
        changed = [c for c in self.changed if not any(f in c for f in self.case.may_change)]
        if changed:
            found.append("changed state: " + "; ".join(changed[:5]))
        if self.mess:
            found.append("left in its folder: " + "; ".join(self.mess[:5]))
        if self.left:
            found.append("left running: " + "; ".join(self.left))
        return found

    def describe(self) -> str:
        """The failure, precisely enough to reproduce and route it."""
        stderr = self.stderr.strip()
        if len(stderr) > 800:
            stderr = stderr[:400] + "\n  ...\n" + stderr[-400:]
        text = [
            f"[{self.case.command}] {self.case.label}",
            f"  $ {self.case.shown()}",
            f"  exit {self.code}: " + "; ".join(self.violations()),
        ]
        if stderr:
            text.append("  stderr: " + stderr.replace("\n", "\n          "))
        if self.crash:
            text.append("  exception: " + self.crash.strip().splitlines()[-1])
        return "\n".join(text)


def relative_differences(
    world: World, pair: RelativePair, absolute: Outcome, relative: Outcome
) -> list[str]:
    """How the command given the path relative to its working folder did other than
    given it absolute: another exit, another sentence about the path, other files made
    (each case's own folder shown as <cwd>); empty if none."""
    found = []
    for outcome in (absolute, relative):
        if outcome.crash is not None or outcome.timed_out or outcome.left:
            found.append(f"{outcome.case.ident}: " + "; ".join(outcome.violations()))
    if found:
        return found
    a, b = (_seen(world, pair, o) for o in (absolute, relative))
    for (name, was), (_, is_) in zip(a.items(), b.items(), strict=True):
        if was == is_:
            continue
        if isinstance(was, dict) and isinstance(is_, dict) and was.keys() == is_.keys():
            for file in was:
                lines = zip(was[file].splitlines(), is_[file].splitlines(), strict=False)
                first = next(((x, y) for x, y in lines if x != y), (was[file], is_[file]))
                found.append(f"{name} {file}: given absolute {first[0]!r}, relative {first[1]!r}")
        else:
            found.append(f"{name}: given absolute {was!r}, relative {is_!r}")
    return found


def _seen(world: World, pair: RelativePair, outcome: Outcome) -> dict[str, object]:
    """What a run did, with the path it was given blanked out as <path> and its own
    folder as <cwd>: its exit, its last word on failure, the lines of its output about
    the path, the files it made and what their text says (where a written path is
    compared in its absolute spellings only: one written as given, relative, differs)."""
    scratch = str(_scratch(world, outcome.case))
    spellings = sorted(set(pair.given[outcome.case.ident]), key=len, reverse=True)
    absolute = [s for s in spellings if Path(s).is_absolute()]

    def blank(text: str, spellings: list[str] = spellings) -> str:
        for spelling in spellings:
            text = re.sub(rf"(?<![\w.-]){re.escape(spelling)}(?![\w.-])", "<path>", text)
        return text.replace(scratch, "<cwd>")

    last = outcome.stderr.strip().splitlines()[-1:] if outcome.code != 0 else []
    made = sorted(blank(line) for line in outcome.mess)
    texts = {}
    for line in outcome.mess:
        path = Path(line.removeprefix("created "))
        if line.startswith("created ") and path.is_file() and path.stat().st_size < 1 << 20:
            try:
                texts[blank(str(path))] = blank(path.read_text(), absolute)
            except UnicodeDecodeError:
                continue  # parquet and the like: its place is compared, not its bytes
    return {
        "exit": outcome.code,
        "said": blank(last[0]) if last else "",
        "said of the path": sorted(
            line for line in map(blank, outcome.stdout.splitlines()) if "<path>" in line
        ),
        "made": made,
        "wrote": texts,
        "changed": sorted(blank(line) for line in outcome.changed),
    }


def failures(outcomes: list[Outcome]) -> list[Outcome]:
    return [o for o in outcomes if o.violations()]


def summary(outcomes: list[Outcome]) -> str:
    bad = failures(outcomes)
    head = f"{len(bad)} of {len(outcomes)} bad-input cases broke the CLI contract:"
    return "\n\n".join([head, *(o.describe() for o in bad)])


def run_batch(
    world: World, cases: list[Case], *, timeout: float, entry: str = SWARMRL_ENTRY
) -> list[Outcome]:
    """Every case, in-process in worker processes (a new one after a worker dies)."""
    by_ident = {c.ident: c for c in cases}
    outcomes: dict[str, Outcome] = {}
    remaining = list(cases)
    jobs = world.root / "jobs"
    jobs.mkdir(exist_ok=True)
    while remaining:
        job = Path(tempfile.mkdtemp(prefix="job-", dir=jobs)) / "job.json"
        results = job.with_suffix(".jsonl")
        job.write_text(
            json.dumps(
                {
                    "entry": entry,
                    "timeout": timeout,
                    "watched": [str(w) for w in world.watched],
                    "pristine": str(_pristine(world)),
                    "cases": [
                        {"ident": c.ident, "argv": list(c.argv), "scratch": str(_scratch(world, c))}
                        for c in remaining
                    ],
                }
            )
        )
        died_in = _run_worker(world, job, results, timeout)
        for line in results.read_text().splitlines():
            record = json.loads(line)
            if "start" in record:
                continue
            case = by_ident[record.pop("ident")]
            outcomes[case.ident] = Outcome(case=case, **record)
        if died_in is not None:
            outcomes[died_in] = Outcome(
                case=by_ident[died_in],
                code=None,
                timed_out=True,
                stderr="(the worker running it stopped responding and was killed)",
            )
        remaining = [c for c in cases if c.ident not in outcomes]
    return [outcomes[c.ident] for c in cases]


def _pristine(world: World) -> Path:
    """A copy of the state folders and inputs as built, for the worker to restore."""
    pristine = world.root / "pristine"
    if not pristine.exists():
        for folder in world.watched:
            shutil.copytree(folder, pristine / folder.name, symlinks=True)
    return pristine


def _scratch(world: World, case: Case) -> Path:
    return world.root / "cases" / case.ident


def _run_worker(world: World, job: Path, results: Path, timeout: float) -> str | None:
    """Run one worker; the case it hung or died in, if it did not finish."""
    log = job.with_suffix(".log").open("w")
    worker = subprocess.Popen(
        [sys.executable, "-m", "tests.cli_contract.worker", str(job), str(results)],
        env=world.env,
        cwd=world.root,
        stdin=subprocess.DEVNULL,
        stdout=log,
        stderr=log,
        start_new_session=True,
    )
    # The worker enforces each case's limit itself; this catches a case stuck where a
    # signal cannot reach Python.
    last_size, last_change = -1, time.monotonic()
    while worker.poll() is None:
        size = results.stat().st_size if results.exists() else 0
        if size != last_size:
            last_size, last_change = size, time.monotonic()
        elif time.monotonic() - last_change > timeout + 60:
            os.killpg(worker.pid, signal.SIGKILL)
            worker.wait()
            break
        time.sleep(0.2)
    procs.kill(list(procs.marked(world.env[procs.MARK_VARIABLE])))
    log.close()
    started = [
        json.loads(line) for line in (results.read_text().splitlines() if results.exists() else [])
    ]
    done = {r["ident"] for r in started if "ident" in r}
    unfinished = [r["start"] for r in started if "start" in r and r["start"] not in done]
    if unfinished:
        return unfinished[0]
    if worker.returncode != 0:
        raise RuntimeError(f"the contract worker failed: {job.with_suffix('.log').read_text()}")
    return None


@dataclass
class Started:
    """A command started in a session of its own, its output going to files (a pipe
    would keep the reader waiting on any process the command left holding it)."""

    process: subprocess.Popen
    stdout: Path
    stderr: Path

    def finish(self, timeout: float) -> tuple[int | None, str, str]:
        """Exit code (None if it ran past ``timeout`` and was killed), stdout, stderr."""
        try:
            code = self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait()
            code = None
        read = lambda path: path.read_text(errors="replace")  # noqa: E731
        return code, read(self.stdout), read(self.stderr)


def start(world: World, argv: list[str], cwd: Path, program: list[str] | None = None) -> Started:
    """``swarmrl ARGV`` (or ``program ARGV``) in ``cwd``, in the sandbox's environment."""
    logs = world.root / "logs"
    logs.mkdir(exist_ok=True)
    n = len(list(logs.iterdir())) // 2
    stdout, stderr = logs / f"{n}.out", logs / f"{n}.err"
    with stdout.open("w") as out, stderr.open("w") as err:
        process = subprocess.Popen(
            [*(program or [SWARMRL]), *argv],
            env=world.env,
            cwd=cwd,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=err,
            start_new_session=True,
        )
    return Started(process, stdout, stderr)


def run_alone(
    world: World,
    case: Case,
    *,
    timeout: float,
    program: list[str] | None = None,
    interrupt_after: float | None = None,
) -> Outcome:
    """One case in a real process of its own (session and all), optionally sent
    SIGINT ``interrupt_after`` seconds in; then everything it started is checked."""
    scratch = _scratch(world, case)
    lay_out(scratch)
    before = {str(w): tree.snapshot(w) for w in world.watched}
    scratch_before = tree.snapshot(scratch)
    run = start(world, list(case.argv), scratch, program)
    if interrupt_after is not None:
        try:
            run.process.wait(interrupt_after)
        except subprocess.TimeoutExpired:
            run.process.send_signal(signal.SIGINT)
    code, stdout, stderr = run.finish(timeout)
    left = procs.marked(world.env[procs.MARK_VARIABLE])
    procs.kill(list(left))
    return Outcome(
        case=case,
        code=code,
        stdout=stdout,
        stderr=stderr,
        timed_out=code is None,
        changed=tree.changes(world.watched, before),
        mess=tree.differences(scratch, scratch_before, tree.snapshot(scratch)),
        left=[f"pid {p}: {c}" for p, c in left.items()],
    )
