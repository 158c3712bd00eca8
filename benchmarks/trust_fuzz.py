"""The fuzz part of the trust suite: every decoder of untrusted bytes, fed hostile input.

Runs the targets of :mod:`benchmarks.fuzz_targets`. An input passes when the
decoder returns something sound (the target's own check) or refuses it with its
documented error in one sentence. Anything else is a crash; an input that runs
past ``hang_seconds`` (a per-input alarm) is a hang; one whose decoding grows
the process's peak memory (its RSS high-water mark, which every allocator
moves: Python, arrow, Rust) by more than ``ALLOCATION_LIMIT`` is an unbounded
allocation. A target whose decoder has a documented, higher cap (a key file's
kdf) states its own budget of time and memory. ``trace=True`` also follows the
Python heap with tracemalloc, which sees an allocation the high-water mark
hides, at four times the cost.

The Rust decoders (TOPLOC proof parsing and checking, shard and Merkle proof
checks) are fuzzed by the proptests named ``fuzz_*`` in native/, 256 cases each
in ``cargo test``; :func:`rust` builds the same test binary, runs each of them on
its own with ``PROPTEST_CASES`` set, and reports them as rows named ``rust:...``.

    python -m benchmarks.trust_fuzz [--inputs 2000] [--target NAME ...] [--no-rust]
"""

from __future__ import annotations

import argparse
import json
import os
import reprlib
import resource
import signal
import subprocess
import sys
import tempfile
import threading
import time
import tracemalloc
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import Any

from hypothesis import HealthCheck, Phase, example, given, settings

from benchmarks.fuzz_targets import TARGETS, Session, Target

HANG_SECONDS = 10.0
# Far above what any sound decoding here needs (the largest message is a 4 MiB
# manifest), far below what a length prefix claiming gigabytes would take.
ALLOCATION_LIMIT = 64 * 1024 * 1024
# Hypothesis keeps a tree of every input it drew in one run (to avoid repeats), so
# long runs are cut into runs of this many inputs to keep its memory flat.
BATCH = 5_000

ROOT = Path(__file__).resolve().parent.parent
_REPR = reprlib.Repr()
_REPR.maxstring = _REPR.maxother = 160


# ---- running ------------------------------------------------------------------------


@dataclass
class FuzzResult:
    target: str
    inputs: int = 0
    accepted: int = 0  # inputs the decoder took as sound (the rest it refused)
    crashes: int = 0
    first_crash: str | None = None
    hangs: int = 0
    first_hang: str | None = None
    overallocations: int = 0  # inputs whose decoding grew memory past the limit
    input_growth: int = 0  # bytes: the most one input grew the process's peak memory
    rss_growth: int = 0  # bytes: the growth of the process's peak memory over the run
    slowest: float = 0.0  # seconds, the slowest input
    seconds: float = 0.0

    @property
    def clean(self) -> bool:
        return not (self.crashes or self.hangs or self.overallocations)


class _Hung(BaseException):
    """Raised by the alarm inside a decoder that ran past its time."""


@contextmanager
def _alarm(seconds: float) -> Iterator[None]:
    """Interrupts the block after `seconds` (where signals reach: the main thread);
    elsewhere the block's time is still compared afterwards."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def hung(signum: int, frame: FrameType | None) -> None:
        raise _Hung

    previous = signal.signal(signal.SIGALRM, hung)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def _one_sentence(error: Exception) -> bool:
    sentence = str(error)
    return bool(sentence.strip()) and "\n" not in sentence


def _shown(value: Any) -> str:
    return _REPR.repr(value)


class _Tally:
    def __init__(self, result: FuzzResult, session: Session[Any], hang_seconds: float) -> None:
        self.result = result
        self.session = session
        self.hang_seconds = max(hang_seconds, session.seconds or 0.0)
        self.memory = session.memory or ALLOCATION_LIMIT

    def feed(self, value: Any) -> None:
        """Decodes one input under the guards and counts what happened."""
        result, session = self.result, self.session
        result.inputs += 1
        tracing = tracemalloc.is_tracing()
        if tracing:
            tracemalloc.reset_peak()
            heap = tracemalloc.get_traced_memory()[0]
        rss = _max_rss()
        start = time.perf_counter()
        crash: str | None = None
        hung = False
        try:
            with _alarm(self.hang_seconds):
                try:
                    decoded = session.decode(value)
                except session.refusals as e:
                    if not _one_sentence(e):
                        crash = f"a refusal that is not one sentence: {e!r}"
                else:
                    if session.sound is not None:
                        session.sound(value, decoded)
                    result.accepted += 1
        except _Hung:
            hung = True
        except BaseException as e:  # anything else a decoder raises is a crash
            if isinstance(e, KeyboardInterrupt):
                raise
            crash = f"{type(e).__name__}: {e}"
        elapsed = time.perf_counter() - start
        result.slowest = max(result.slowest, elapsed)
        # What this input added to the process's peak memory (every allocator: Python,
        # arrow, Rust), or under tracemalloc its peak on the Python heap if larger.
        grown = _max_rss() - rss
        if tracing:
            grown = max(grown, tracemalloc.get_traced_memory()[1] - heap)
        result.input_growth = max(result.input_growth, grown)
        if grown > self.memory:
            result.overallocations += 1
        if hung or elapsed > self.hang_seconds:
            result.hangs += 1
            result.first_hang = result.first_hang or f"{elapsed:.1f} s on {_shown(value)}"
        elif crash is not None:
            result.crashes += 1
            result.first_crash = result.first_crash or f"{crash} on input {_shown(value)}"


def _max_rss() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def fuzz(
    target: Target, inputs: int, *, hang_seconds: float = HANG_SECONDS, trace: bool = False
) -> FuzzResult:
    """Feeds `target` its examples and then `inputs` hostile inputs (fewer if hypothesis
    runs out of distinct ones)."""
    result = FuzzResult(target.name)
    started_tracing = trace and not tracemalloc.is_tracing()
    if started_tracing:
        tracemalloc.start()
    rss = _max_rss()
    start = time.perf_counter()
    try:
        with (
            tempfile.TemporaryDirectory(prefix="swarmrl-fuzz-") as tmp,
            target.session(Path(tmp)) as session,
        ):
            tally = _Tally(result, session, hang_seconds)
            first = True
            while first or result.inputs < inputs + len(session.examples):
                done = result.inputs
                batch = min(BATCH, inputs + len(session.examples) - done)
                _run_batch(tally, batch, examples=session.examples if first else ())
                first = False
                if result.inputs == done:
                    break  # hypothesis found no new input: the strategy is exhausted
    finally:
        if started_tracing:
            tracemalloc.stop()
    result.seconds = time.perf_counter() - start
    result.rss_growth = _max_rss() - rss
    return result


def _run_batch(tally: _Tally, count: int, examples: tuple[Any, ...]) -> None:
    def one(value: Any) -> None:
        tally.feed(value)

    test = given(tally.session.inputs)(one)
    for value in reversed(examples):
        test = example(value)(test)
    settings(
        max_examples=max(count - len(examples), 1),
        deadline=None,
        database=None,
        phases=[Phase.explicit, Phase.generate],
        suppress_health_check=list(HealthCheck),
    )(test)()


def run(
    inputs_per_target: int,
    *,
    names: Sequence[str] | None = None,
    rust_cases: int | None = None,
    hang_seconds: float = HANG_SECONDS,
    trace: bool = False,
    progress: Callable[[FuzzResult], None] | None = None,
) -> list[FuzzResult]:
    """Every target (or those `names`) with `inputs_per_target` inputs each, then, unless
    `rust_cases` is 0, the Rust fuzz proptests with that many cases each (default: as
    many as the Python targets get)."""
    results = []
    for name in names or list(TARGETS):
        result = fuzz(TARGETS[name], inputs_per_target, hang_seconds=hang_seconds, trace=trace)
        results.append(result)
        if progress is not None:
            progress(result)
    cases = inputs_per_target if rust_cases is None else rust_cases
    if cases:
        for result in rust(cases, hang_seconds=max(hang_seconds, 600.0)):
            results.append(result)
            if progress is not None:
                progress(result)
    return results


# ---- the Rust proptests ----------------------------------------------------------------

RUST_CRATE = "swarmrl-native"
RUST_PREFIX = "fuzz_"


def _rust_binary() -> Path:
    """Builds the crate's unit tests (the test profile is optimised: opt-level 2, as
    `cargo test` builds them); the path of the test binary."""
    out = subprocess.run(
        [
            "cargo",
            "test",
            "--locked",
            "-p",
            RUST_CRATE,
            "--lib",
            "--no-run",
            "--message-format=json",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    for line in out.splitlines():
        message = json.loads(line)
        if (
            message.get("reason") == "compiler-artifact"
            and message.get("executable")
            and message["target"]["name"] == RUST_CRATE.replace("-", "_")
        ):
            return Path(message["executable"])
    raise RuntimeError("cargo built no test binary for the native crate")


def rust(cases: int, *, hang_seconds: float = 600.0) -> list[FuzzResult]:
    """Each Rust test named fuzz_* with PROPTEST_CASES=`cases`, run on its own (so its
    time and peak memory are its own); a failed test is a crash, its panic the repr."""
    binary = _rust_binary()
    listing = subprocess.run(
        [binary, "--list", "--format=terse"], capture_output=True, text=True, check=True
    ).stdout
    names = [
        line.removesuffix(": test")
        for line in listing.splitlines()
        if line.endswith(": test")
        and line.split("::")[-1].removesuffix(": test").startswith(RUST_PREFIX)
    ]
    env = {**os.environ, "PROPTEST_CASES": str(cases), "RAYON_NUM_THREADS": "1"}
    results = []
    for name in names:
        result = FuzzResult(f"rust:{name.split('::')[-1]}", inputs=cases)
        start = time.perf_counter()
        # Through a small Python that forks the test: a child forked from this big
        # process would report this process's peak memory as its own.
        command = [sys.executable, "-S", "-c", _PEAK_OF_CHILD, str(binary), "--exact", name]
        child = subprocess.Popen(
            command,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
        )
        try:
            output, _ = child.communicate(timeout=hang_seconds)
        except subprocess.TimeoutExpired:
            os.killpg(child.pid, signal.SIGKILL)
            output, _ = child.communicate()
            result.hangs = 1
            result.first_hang = f"{name} ran past {hang_seconds:.0f} s"
        result.seconds = result.slowest = time.perf_counter() - start
        *lines, last = output.rstrip("\n").split("\n")
        if last.startswith(_PEAK_TAG):
            result.rss_growth = result.input_growth = int(last.removeprefix(_PEAK_TAG)) * 1024
        if child.returncode != 0 and not result.hangs:
            result.crashes = 1
            failed = [line for line in lines if "panicked" in line]
            result.first_crash = " ".join(failed[:2]) or output[-300:]
        elif not result.hangs:
            result.accepted = cases
        results.append(result)
    return results


_PEAK_TAG = "swarmrl-fuzz peak KiB: "
_PEAK_OF_CHILD = f"""
import os, sys
pid = os.fork()
if pid == 0:
    os.execv(sys.argv[1], sys.argv[1:] + ["--test-threads=1"])
_, status, usage = os.wait4(pid, 0)
print("\\n{_PEAK_TAG}%d" % usage.ru_maxrss, flush=True)
sys.exit(os.waitstatus_to_exitcode(status))
"""


# ---- reporting ------------------------------------------------------------------------


def _mib(n: int) -> str:
    return f"{n / 2**20:.1f}"


def table(results: Sequence[FuzzResult]) -> str:
    """The results as markdown rows under a header, with a total row."""
    rows = [
        "| target | inputs | accepted | crashes | hangs | over-allocations "
        "| most one input grew MiB | run grew MiB | slowest s | seconds |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for r in results:
        rows.append(
            f"| {r.target} | {r.inputs:,} | {r.accepted:,} | {r.crashes} | {r.hangs} "
            f"| {r.overallocations} | {_mib(r.input_growth)} | {_mib(r.rss_growth)} "
            f"| {r.slowest:.2f} | {r.seconds:.1f} |"
        )
    total = FuzzResult(
        "**total**",
        inputs=sum(r.inputs for r in results),
        accepted=sum(r.accepted for r in results),
        crashes=sum(r.crashes for r in results),
        hangs=sum(r.hangs for r in results),
        overallocations=sum(r.overallocations for r in results),
        input_growth=max((r.input_growth for r in results), default=0),
        rss_growth=max((r.rss_growth for r in results), default=0),
        slowest=max((r.slowest for r in results), default=0.0),
        seconds=sum(r.seconds for r in results),
    )
    rows.append(
        f"| {total.target} | {total.inputs:,} | {total.accepted:,} | {total.crashes} "
        f"| {total.hangs} | {total.overallocations} | {_mib(total.input_growth)} "
        f"| {_mib(total.rss_growth)} | {total.slowest:.2f} | {total.seconds:.1f} |"
    )
    failures = [
        f"- {r.target}: {r.first_crash or r.first_hang or 'allocated over the limit'}"
        for r in results
        if not r.clean
    ]
    return "\n".join(rows + (["", *failures] if failures else []))


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.trust_fuzz", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--inputs", type=int, default=2_000, help="inputs per target")
    parser.add_argument(
        "--target", action="append", choices=sorted(TARGETS), help="only these (repeatable)"
    )
    parser.add_argument(
        "--rust-cases", type=int, default=None, help="cases per Rust proptest (default --inputs)"
    )
    parser.add_argument("--no-rust", action="store_true", help="skip the Rust proptests")
    parser.add_argument("--list", action="store_true", help="list the targets and exit")
    parser.add_argument("--hang-seconds", type=float, default=HANG_SECONDS)
    parser.add_argument(
        "--trace-memory", action="store_true", help="follow the Python heap too (slower)"
    )
    args = parser.parse_args(argv)
    if args.list:
        for target in TARGETS.values():
            print(f"{target.name}: {target.what}")
        return 0
    if args.inputs < 1:
        parser.error("--inputs must be at least 1")

    def show(result: FuzzResult) -> None:
        print(
            f"{result.target}: {result.inputs:,} inputs, {result.crashes} crashes, "
            f"{result.hangs} hangs in {result.seconds:.1f} s",
            file=sys.stderr,
            flush=True,
        )

    results = run(
        args.inputs,
        names=args.target,
        rust_cases=0 if args.no_rust else args.rust_cases,
        hang_seconds=args.hang_seconds,
        trace=args.trace_memory,
        progress=show,
    )
    print(table(results))
    return 0 if all(r.clean for r in results) else 1


if __name__ == "__main__":
    raise SystemExit(main())
