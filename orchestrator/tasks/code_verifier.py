"""Code answers: run the candidate program against stdin/stdout tests in a sandbox.

Every test case runs the program once as ``python3 -I main.py`` in a fresh temporary
directory, in a new process group that is killed whole when the case ends or overruns.
A small launcher sets the resource limits inside the child just before exec'ing the
program (not a ``preexec_fn``, which is unsafe in a process that runs threads, as the
orchestrator does). When the orchestrator runs as root, the sandbox runs as ``nobody``
instead, since Linux never enforces the process-count limit on root; ``nobody`` must then
be able to reach the temporary directory (TMPDIR) and the interpreter (otherwise the
system's ``/usr/bin/python3`` is used).

The preferred sandbox is bubblewrap: new user, pid, network, ipc and uts namespaces, a
read-only view of the system and the interpreter, tmpfs ``/tmp``, the temporary directory
as the only writable place and an empty environment. Without a working ``bwrap`` the
program runs under the rlimits alone (no network or filesystem isolation), which the
module logs once as a warning.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Literal

logger = logging.getLogger(__name__)

# A task may ask for more time than the default, but not for unbounded time.
MAX_TIME_LIMIT_S = 60.0
_NOBODY = 65534
_STDERR_TAIL_BYTES = 4096
_WORKDIR = "/work"  # where the temporary directory appears inside bubblewrap


@dataclass(frozen=True)
class SandboxLimits:
    """What one run of a candidate program may use."""

    wall_s: float = 2.0
    cpu_s: int = 2
    memory_bytes: int = 512 << 20  # address space
    file_bytes: int = 1 << 20  # largest file it may write; stdout is a file too
    open_files: int = 64
    processes: int = 32
    output_bytes: int = 1 << 20  # more stdout than this fails the case

    def __post_init__(self) -> None:
        if not (math.isfinite(self.wall_s) and self.wall_s > 0):
            raise ValueError(f"wall_s must be a positive number of seconds, not {self.wall_s!r}")
        for name in (
            "cpu_s",
            "memory_bytes",
            "file_bytes",
            "open_files",
            "processes",
            "output_bytes",
        ):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise ValueError(f"{name} must be a positive integer, not {value!r}")


DEFAULT_LIMITS = SandboxLimits()

CaseStatus = Literal["passed", "wrong_answer", "error", "timeout", "output_limit"]


@dataclass(frozen=True)
class CaseResult:
    """One test case: its outcome, how long it took and the end of its stderr (for logs)."""

    status: CaseStatus
    seconds: float
    stderr: str


@dataclass(frozen=True)
class CodeResult:
    """The cases run, in order, up to and including the first that failed."""

    cases: tuple[CaseResult, ...]
    sandbox: Literal["bwrap", "rlimit"]

    @property
    def passed(self) -> bool:
        return bool(self.cases) and all(c.status == "passed" for c in self.cases)


# --- extraction ---------------------------------------------------------------------------

_THINK_END = "</think>"
_FENCE = re.compile(r"^```[ \t]*([\w+-]*)[ \t]*\n(.*?)^```", re.MULTILINE | re.DOTALL)
_PYTHON_LANGS = ("python", "python3", "py")


def extract_code(text: str) -> str | None:
    """The last ```python block after the last ``</think>``, else the last bare ``` block."""
    final = text.rpartition(_THINK_END)[2]  # all of it when there is no </think>
    python, bare = None, None
    for m in _FENCE.finditer(final):
        lang = m.group(1).lower()
        if lang in _PYTHON_LANGS:
            python = m.group(2)
        elif not lang:
            bare = m.group(2)
    return python if python is not None else bare


# --- verification -------------------------------------------------------------------------


def verify_code(
    completion: str, verification_info: dict[str, Any], limits: SandboxLimits = DEFAULT_LIMITS
) -> bool:
    """Whether the completion's program passes every test in ``verification_info``."""
    tests, time_limit = _parse_info(verification_info)
    if time_limit is not None:
        limits = replace(limits, wall_s=time_limit, cpu_s=max(1, math.ceil(time_limit)))
    source = extract_code(completion)
    return source is not None and run_tests(source, tests, limits).passed


def _parse_info(info: Any) -> tuple[list[dict[str, str]], float | None]:
    if not isinstance(info, dict):
        raise ValueError("code verification_info must be an object")
    tests = info.get("tests")
    _check_tests(tests)
    time_limit = info.get("time_limit_s")
    if time_limit is not None and (
        isinstance(time_limit, bool)
        or not isinstance(time_limit, int | float)
        or not 0 < time_limit <= MAX_TIME_LIMIT_S
    ):
        raise ValueError(
            f"time_limit_s must be a number of seconds in (0, {MAX_TIME_LIMIT_S:g}], "
            f"not {time_limit!r}"
        )
    return tests, time_limit


def _check_tests(tests: Any) -> None:
    if not isinstance(tests, list) or not tests:
        raise ValueError("code verification_info needs a non-empty list 'tests'")
    for i, case in enumerate(tests):
        if not (
            isinstance(case, dict)
            and isinstance(case.get("stdin"), str)
            and isinstance(case.get("stdout"), str)
        ):
            raise ValueError(f"test {i} must be an object with string 'stdin' and 'stdout'")


def run_tests(source: str, tests: Sequence[dict[str, str]], limits: SandboxLimits) -> CodeResult:
    """Run ``source`` once per test case, stopping at the first case that fails."""
    _check_tests(list(tests))
    backend = _backend()
    results: list[CaseResult] = []
    for case in tests:
        result = _run_case(backend, source, case, limits)
        results.append(result)
        if result.status != "passed":
            break
    return CodeResult(cases=tuple(results), sandbox=backend.kind)


def _same_output(actual: str, expected: str) -> bool:
    return _lines(actual) == _lines(expected)


def _lines(text: str) -> list[str]:
    """Lines without trailing whitespace, trailing blank lines dropped."""
    lines = [line.rstrip() for line in text.split("\n")]
    while lines and not lines[-1]:
        lines.pop()
    return lines


# --- running one case ---------------------------------------------------------------------

# Runs inside the sandbox with the trusted interpreter; the limits then hold across exec.
_LAUNCHER = """\
import os, resource, sys
cpu, memory, fsize, files, procs = map(int, sys.argv[1:6])
resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 1))
resource.setrlimit(resource.RLIMIT_AS, (memory, memory))
resource.setrlimit(resource.RLIMIT_FSIZE, (fsize, fsize))
resource.setrlimit(resource.RLIMIT_NOFILE, (files, files))
resource.setrlimit(resource.RLIMIT_NPROC, (procs, procs))
resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
os.execv(sys.executable, [sys.executable, "-I", "main.py"])
"""
_CPU_KILLED = (-signal.SIGXCPU, 128 + signal.SIGXCPU)  # directly, and as bwrap reports it


@dataclass(frozen=True)
class _Backend:
    kind: Literal["bwrap", "rlimit"]
    python: str
    bwrap: str | None
    uid: int | None  # the unprivileged user to run as, when we are root


def _launch_command(python: str, limits: SandboxLimits) -> list[str]:
    rlimits = (
        limits.cpu_s,
        limits.memory_bytes,
        limits.file_bytes,
        limits.open_files,
        limits.processes,
    )
    return [python, "-I", "-S", "-c", _LAUNCHER, *map(str, rlimits)]


def _bwrap_options(workdir: str, prefix: str) -> list[str]:
    options = (
        ("--ro-bind", prefix, prefix),
        ("--ro-bind-try", "/etc/ld.so.cache", "/etc/ld.so.cache"),
        ("--proc", "/proc"),
        ("--dev", "/dev"),
        ("--tmpfs", "/tmp"),
        ("--bind", workdir, _WORKDIR),
        ("--remount-ro", "/"),  # bwrap's own root tmpfs: no writable /etc or /work siblings
        ("--chdir", _WORKDIR),
        ("--unshare-all", "--die-with-parent", "--new-session", "--clearenv"),
        ("--setenv", "PATH", "/usr/bin:/bin"),
        ("--setenv", "HOME", _WORKDIR),
        ("--setenv", "LANG", "C.UTF-8"),
    )
    return [*_system_binds(), *(arg for option in options for arg in option)]


def _system_binds() -> list[str]:
    """Read-only /usr and friends, keeping merged-/usr symlinks as symlinks."""
    args = []
    for path in ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32"):
        if os.path.islink(path):
            args += ["--symlink", os.readlink(path), path]
        elif os.path.isdir(path):
            args += ["--ro-bind", path, path]
    return args


def _run_case(
    backend: _Backend, source: str, case: dict[str, str], limits: SandboxLimits
) -> CaseResult:
    workdir = tempfile.mkdtemp(prefix="swarmrl-sandbox-")
    try:
        Path(workdir, "main.py").write_text(source, encoding="utf-8")
        with contextlib.ExitStack() as stack:
            command = _launch_command(backend.python, limits)
            if backend.bwrap is not None:
                prefix = str(Path(backend.python).parent.parent)
                command = [backend.bwrap, *_bwrap_options(workdir, prefix), "--", *command]
            user: dict[str, Any] = {}
            if backend.uid is not None:
                os.chown(workdir, backend.uid, backend.uid)
                user = {"user": backend.uid, "group": backend.uid, "extra_groups": []}
            stdin, stdout, stderr = (
                stack.enter_context(tempfile.TemporaryFile()) for _ in range(3)
            )
            stdin.write(case["stdin"].encode("utf-8"))
            stdin.seek(0)
            start = time.monotonic()
            proc = subprocess.Popen(
                command,
                stdin=stdin,
                stdout=stdout,
                stderr=stderr,
                cwd=workdir,
                env={"PATH": "/usr/bin:/bin", "HOME": workdir, "LANG": "C.UTF-8"},
                start_new_session=True,
                **user,
            )
            timed_out = False
            try:
                proc.wait(timeout=limits.wall_s)
            except subprocess.TimeoutExpired:
                timed_out = True
            finally:
                # Also when it exited: children it left behind go with the group.
                _kill_group(proc.pid)
                proc.wait()
            seconds = time.monotonic() - start
            stdout.seek(0)
            out = stdout.read(limits.output_bytes + 1)
            stderr.seek(max(0, stderr.seek(0, os.SEEK_END) - _STDERR_TAIL_BYTES))
            err = stderr.read().decode("utf-8", errors="replace")
    finally:
        _remove_tree(workdir)
    status: CaseStatus
    if timed_out or proc.returncode in _CPU_KILLED:
        status = "timeout"
    elif len(out) > limits.output_bytes:
        status = "output_limit"
    elif proc.returncode != 0:
        status = "error"
    elif _same_output(out.decode("utf-8", errors="replace"), case["stdout"]):
        status = "passed"
    else:
        status = "wrong_answer"
    return CaseResult(status=status, seconds=seconds, stderr=err)


def _kill_group(pgid: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pgid, signal.SIGKILL)


def _remove_tree(path: str) -> None:
    if os.geteuid() != 0:
        # The program ran as us and may have made its directories unreadable. Following a
        # symlink here could only touch what that program could touch itself anyway.
        os.chmod(path, 0o700)
        for root, dirs, _ in os.walk(path):
            for d in dirs:
                p = os.path.join(root, d)
                if not os.path.islink(p):
                    os.chmod(p, 0o700)
    shutil.rmtree(path, ignore_errors=True)
    if os.path.exists(path):
        logger.warning("could not remove the sandbox directory %s", path)


# --- choosing the sandbox -----------------------------------------------------------------

_backend_lock = threading.Lock()
_backend_chosen: _Backend | None = None


def sandbox_kind() -> str:
    """What isolates candidate programs here: "bubblewrap" or "rlimits only"."""
    return "bubblewrap" if _backend().kind == "bwrap" else "rlimits only"


def _backend() -> _Backend:
    global _backend_chosen
    with _backend_lock:
        if _backend_chosen is None:
            _backend_chosen = _choose_backend()
        return _backend_chosen


def _interpreters() -> list[str]:
    """The base interpreter behind this one (not a venv's), then the system's."""
    found = []
    for candidate in (os.path.realpath(sys.executable), "/usr/bin/python3"):
        path = os.path.realpath(candidate)
        if os.path.isfile(path) and path not in found:
            found.append(path)
    return found


def _self_test(backend: _Backend) -> str | None:
    """None when the backend runs a trivial program correctly, else what went wrong."""
    try:
        result = _run_case(backend, "print(6 * 7)", {"stdin": "", "stdout": "42"}, DEFAULT_LIMITS)
    except OSError as e:  # e.g. the interpreter is not executable by the sandbox user
        return str(e)
    return None if result.status == "passed" else f"{result.status}: {result.stderr.strip()}"


def _choose_backend() -> _Backend:
    uid = _NOBODY if os.geteuid() == 0 else None
    bwrap = shutil.which("bwrap")
    reason = "bubblewrap (bwrap) is not installed"
    if bwrap is not None:
        for python in _interpreters():
            backend = _Backend("bwrap", python, bwrap, uid)
            problem = _self_test(backend)
            if problem is None:
                return backend
            reason = f"bubblewrap failed its self-test ({problem[-300:]!r})"
    logger.warning(
        "%s: candidate programs run under rlimits only, without network or filesystem isolation",
        reason,
    )
    problem: str | None = "no Python interpreter found"
    for python in _interpreters():
        backend = _Backend("rlimit", python, None, uid)
        problem = _self_test(backend)
        if problem is None:
            return backend
    raise RuntimeError(f"no Python interpreter runs in the code sandbox ({problem!r:.300})")
