"""Math answers: the final ``\\boxed{...}`` after the reasoning, against the ground truth.

Parsing and comparing answers is HuggingFace's math-verify (LaTeX and plain
expressions, fractions, decimals, intervals, sets, units, scientific notation).
What it lacks is ours: the answer is the last ``\\boxed{}`` after the reasoning
(where that ends, by task type: ``swarmrl.tasks.format.answer_text``); a ground
truth may be a number, a string in ``\\boxed{}`` or a list of either (any one
matches); answers longer than ``MAX_ANSWER_CHARS`` are not
read; a division by zero equals nothing; and every comparison runs in a worker
process that is killed when it overruns its time limit, since sympy can take
unbounded time and memory on tiny inputs (``9^{9^{9}}``) and math-verify's own
time limits use signals, which work only in a main thread.

Only math-verify's LaTeX extraction is used: its plain-expression extraction
hands the text to sympy's ``parse_expr``, which evaluates Python, and answers are
model-written.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import re
import select
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from swarmrl.processes import die_with_parent
from swarmrl.tasks.format import TaskType, answer_text

# Longer answers are not worth parsing.
MAX_ANSWER_CHARS = 1000


def extract_answer(text: str, task_type: TaskType = "math") -> str | None:
    """The content of the last ``\\boxed{...}`` after the reasoning, or None (see
    ``answer_text`` for where the reasoning ends, by task type)."""
    final = answer_text(text, task_type)
    return None if final is None else last_boxed(final)


def last_boxed(final: str) -> str | None:
    """The content of the last complete ``\\boxed{...}`` in `final`, or None."""
    start = final.rfind("\\boxed")
    while start != -1:
        content = _braced_after(final, start + len("\\boxed"))
        if content is not None:
            return content
        if _opens_group(final, start + len("\\boxed")):
            return None  # the last box was cut off: the model gave no complete answer
        start = final.rfind("\\boxed", 0, start)  # "\\boxeds" and the like are not boxes
    return None


def _opens_group(text: str, i: int) -> bool:
    while i < len(text) and text[i].isspace():
        i += 1
    return i < len(text) and text[i] == "{"


def _braced_after(text: str, i: int) -> str | None:
    """The content of the brace group starting at ``text[i:]`` (after spaces), or None."""
    while i < len(text) and text[i].isspace():
        i += 1
    if i >= len(text) or text[i] != "{":
        return None
    depth, j = 0, i
    while j < len(text):
        ch = text[j]
        if ch == "\\":
            j += 2  # \{ and \} are literal braces, not grouping
            continue
        if ch == "{":
            depth += 1
        elif ch == "}":
            depth -= 1
            if depth == 0:
                return text[i + 1 : j]
        j += 1
    return None


def ground_truths(verification_info: Any) -> list[str]:
    """Every accepted answer of a math task, as text; ValueError naming what is wrong."""
    if not isinstance(verification_info, dict):
        raise ValueError("math verification_info must be an object")
    truth = verification_info.get("ground_truth")
    items = truth if isinstance(truth, list) else [truth]
    truths = []
    for item in items:
        if isinstance(item, int | float) and not isinstance(item, bool) and math.isfinite(item):
            item = str(item)
        if not isinstance(item, str) or not item.strip():
            raise ValueError(
                "math verification_info needs a 'ground_truth': a non-empty string, "
                "a finite number, or a non-empty list of them"
            )
        boxed = last_boxed(item)
        truths.append(boxed if boxed is not None else item)
    if not truths:
        raise ValueError("math verification_info has an empty 'ground_truth' list")
    return truths


def verify_math(
    completion: str,
    verification_info: dict[str, Any],
    timeout_s: float = 2.0,
    *,
    task_type: TaskType = "math",
) -> bool:
    """Whether the completion's boxed final answer equals one of the task's ground truths."""
    truths = ground_truths(verification_info)
    answer = extract_answer(completion, task_type)
    return answer is not None and any(answers_match(answer, t, timeout_s) for t in truths)


def answers_match(candidate: str, ground_truth: str, timeout_s: float = 2.0) -> bool:
    """Whether two answers are equivalent; a check that overruns ``timeout_s`` is not."""
    if not (isinstance(timeout_s, int | float) and math.isfinite(timeout_s) and timeout_s > 0):
        raise ValueError(f"timeout_s must be a positive number of seconds, not {timeout_s!r}")
    if len(candidate) > MAX_ANSWER_CHARS or len(ground_truth) > MAX_ANSWER_CHARS:
        return False
    a, b = _tidy(candidate), _tidy(ground_truth)
    if not a or not b:
        return False
    if _INTEGER.fullmatch(a) and _INTEGER.fullmatch(b):
        # Two integers need no sympy (nor a round trip to its process): most answers
        # of arithmetic and word problems are integers, and checks run on every rollout.
        return int(a) == int(b)
    return _WORKER.equal(a, b, timeout_s)


_TEXT_COMMANDS = re.compile(r"\\(?:text|textbf|textit|textrm|mathrm|mathbf|mbox)\s*(?=\{)")
_SPACING = re.compile(r"\\[!,;:]")
_INTEGER = re.compile(r"[+-]?[0-9]{1,64}")


def _tidy(answer: str) -> str:
    """Layout math-verify does not drop: spacing commands, text wrappers (nested ones
    too), surrounding space and a sentence's full stop."""
    for m in reversed(list(_TEXT_COMMANDS.finditer(answer))):  # last first: offsets hold
        inner = _braced_after(answer, m.end())
        if inner is not None:
            answer = answer[: m.start()] + inner + answer[m.end() + len(inner) + 2 :]
    return _SPACING.sub("", answer).strip().removesuffix(".").strip()


# --- the comparing worker -----------------------------------------------------------------

# Generous: the first check pays for starting Python and importing math-verify and sympy,
# which is not the candidate's fault and must not count against its time limit.
_STARTUP_TIMEOUT_S = 120.0
# sympy itself needs a few hundred MiB; past this a check is pathological.
_WORKER_MEMORY_BYTES = 2 << 30


class _ComparingWorker:
    """One persistent math-verify process, reused across checks, replaced when one overruns.

    A plain subprocess speaking JSON lines, not multiprocessing: a spawned child would
    re-import the caller's main module (torch and all, or a script without a main guard).
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._process: subprocess.Popen[bytes] | None = None
        self._retired_cpu = 0.0

    def equal(self, a: str, b: str, timeout_s: float) -> bool:
        with self._lock:
            process = self._running()
            stdin = process.stdin
            assert stdin is not None  # started with stdin=PIPE
            try:
                stdin.write(json.dumps([a, b]).encode() + b"\n")
                stdin.flush()
                answer = _read_line(process, timeout_s)
            except OSError:
                answer = None  # the worker died mid-check (e.g. out of memory): not a match
            if answer is None:
                self._discard()
                return False
            return answer == b"1\n"

    @property
    def pid(self) -> int | None:
        return self._process.pid if self._process is not None else None

    def cpu_seconds(self) -> float:
        """CPU time the workers have used, replaced ones included (Linux; 0 elsewhere):
        their checks cost CPU that the caller's own process time does not show."""
        return self._retired_cpu + self._running_cpu()

    def _running_cpu(self) -> float:
        pid = self.pid
        if pid is None:
            return 0.0
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
        except OSError:
            return 0.0
        # Fields after the parenthesised name; utime and stime are the 12th and 13th.
        fields = stat.rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def _running(self) -> subprocess.Popen[bytes]:
        if self._process is not None and self._process.poll() is None:
            return self._process
        self._discard()
        self._process = subprocess.Popen(
            [sys.executable, "-I", "-c", _WORKER_CODE],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
        )
        if _read_line(self._process, _STARTUP_TIMEOUT_S) != b"ready\n":
            self._discard()
            raise RuntimeError("the math-verify worker process did not start")
        return self._process

    def _discard(self) -> None:
        if self._process is not None:
            self._retired_cpu += self._running_cpu()
            self._process.kill()
            self._process.wait()
            for pipe in (self._process.stdin, self._process.stdout):
                if pipe is not None:
                    pipe.close()
        self._process = None


def _read_line(process: subprocess.Popen[bytes], timeout_s: float) -> bytes | None:
    """One reply line, or None if none came within the time limit or the worker died."""
    stdout = process.stdout
    assert stdout is not None  # started with stdout=PIPE
    ready, _, _ = select.select([stdout], [], [], timeout_s)
    if not ready:
        return None
    return stdout.readline() or None


_WORKER = _ComparingWorker()


def checker_cpu_seconds() -> float:
    """CPU seconds math-verify's worker process has used so far."""
    return _WORKER.cpu_seconds()


def cpu_seconds_with_checker() -> float:
    """This process's CPU time plus math-verify's worker's: the difference across a
    piece of work that scores rewards is what it cost (the worker's share is invisible
    to ``time.process_time``)."""
    return time.process_time() + checker_cpu_seconds()


# The worker imports this very swarmrl (isolated mode ignores PYTHONPATH and the cwd).
_PACKAGE_ROOT = str(Path(__file__).resolve().parents[2])
_WORKER_CODE = (
    f"import sys; sys.path.insert(0, {_PACKAGE_ROOT!r}); "
    "from swarmrl.tasks.math import serve_worker; serve_worker()"
)


def serve_worker() -> None:
    """The worker's loop: a JSON ``[a, b]`` per line in, ``1`` or ``0`` per line out."""
    import resource

    # A worker deep in sympy when its parent dies would spin on, orphaned, for minutes.
    die_with_parent()
    with contextlib.suppress(ValueError, OSError):  # some platforms have no RLIMIT_AS
        resource.setrlimit(resource.RLIMIT_AS, (_WORKER_MEMORY_BYTES, _WORKER_MEMORY_BYTES))
    _equal("x", "x")  # import and warm math-verify before saying ready
    out = sys.stdout.buffer
    out.write(b"ready\n")
    out.flush()
    for line in sys.stdin.buffer:
        try:
            a, b = json.loads(line)
            result = _equal(a, b)
        except Exception:
            result = False  # whatever cannot be decided is not a match
        out.write(b"1\n" if result else b"0\n")
        out.flush()


def _equal(candidate: str, ground_truth: str) -> bool:
    """math-verify's verdict, with its own (signal-based) time limits off: the parent's
    deadline kills this process instead."""
    import sympy
    from math_verify import LatexExtractionConfig, parse, verify

    config = [LatexExtractionConfig(boxed_match_priority=0)]
    gold, target = (
        parse(f"\\boxed{{{text}}}", extraction_config=config, parsing_timeout=None)
        for text in (ground_truth, candidate)
    )
    if not gold or not target:
        return False
    undefined = (sympy.zoo, sympy.nan)
    if any(isinstance(x, sympy.Basic) and x.has(*undefined) for x in (*gold, *target)):
        return False  # 1/0 equals nothing, least of all another division by zero
    return bool(verify(gold, target, timeout_seconds=None))
