"""The code verifier's sandbox, with real subprocesses: limits, kills, isolation, cleanup."""

from __future__ import annotations

import logging
import os
import shutil
import socket
import tempfile
import textwrap
import time
import uuid
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from swarmrl.tasks import code as code_verifier
from swarmrl.tasks.code import (
    SandboxLimits,
    extract_code,
    run_tests,
    verify_code,
)

DOUBLE = "print(2 * int(input()))"
DOUBLE_TESTS = [{"stdin": "21\n", "stdout": "42\n"}, {"stdin": "5", "stdout": "10"}]
FAST = SandboxLimits(wall_s=1.0, cpu_s=1)
KILLED_SOON = SandboxLimits(wall_s=0.5, cpu_s=1)  # for programs that must be killed anyway


def program(source: str, **tokens: object) -> str:
    text = textwrap.dedent(source)
    for name, value in tokens.items():
        text = text.replace(f"<{name}>", str(value))
    return text


def processes_with(token: str) -> list[int]:
    """Host processes whose command line mentions ``token``."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                cmdline = Path("/proc", entry, "cmdline").read_bytes()
            except OSError:
                continue
            if token.encode() in cmdline:
                found.append(int(entry))
    return found


def survivors(token: str, grace_s: float = 2.0) -> list[int]:
    """What is still running after the kernel had ``grace_s`` to reap a killed sandbox."""
    deadline = time.monotonic() + grace_s
    while (found := processes_with(token)) and time.monotonic() < deadline:
        time.sleep(0.05)
    return found


@pytest.fixture(scope="module")
def sandbox_kind() -> str:
    return run_tests("print(1)", [{"stdin": "", "stdout": "1"}], SandboxLimits()).sandbox


@pytest.fixture
def scratch_tmp(monkeypatch):
    """A TMPDIR of our own (reachable by the sandbox user), to see what is left in it."""
    path = tempfile.mkdtemp(prefix="swarmrl-test-")
    os.chmod(path, 0o755)
    monkeypatch.setattr(tempfile, "tempdir", path)
    yield Path(path)
    shutil.rmtree(path)


@pytest.fixture
def rlimit_only(monkeypatch, caplog):
    """The fallback sandbox, chosen as it would be on a machine without bubblewrap."""
    monkeypatch.setattr(code_verifier, "_backend_chosen", None)
    monkeypatch.setattr(code_verifier.shutil, "which", lambda _name: None)
    caplog.set_level(logging.WARNING, logger=code_verifier.__name__)
    yield
    monkeypatch.setattr(code_verifier, "_backend_chosen", None)


# --- extraction ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("```python\nprint(1)\n```", "print(1)\n"),
        ("```py\na\n```\n```python3\nb\n```", "b\n"),
        ("```python\na\n```\nthen the output:\n```\n42\n```", "a\n"),
        ("plain:\n```\nprint(2)\n```", "print(2)\n"),
        ("<think>```python\nfirst\n```</think>\n```python\nsecond\n```", "second\n"),
        ("```python\nfirst\n```\n</think>\nno code after thinking", None),
        ("```cpp\nint main(){}\n```", None),
        ("```python\nprint(1)\n", None),  # cut off before the closing fence
        ("no code at all", None),
    ],
)
def test_extract_code(text, expected):
    assert extract_code(text) == expected


@given(st.text())
def test_extract_code_never_raises(text):
    code = extract_code(text)
    assert code is None or code in text


# --- results ------------------------------------------------------------------------------


def test_a_correct_program_passes():
    result = run_tests(DOUBLE, DOUBLE_TESTS, SandboxLimits())
    assert result.passed
    assert [c.status for c in result.cases] == ["passed", "passed"]


def test_trailing_whitespace_and_blank_lines_do_not_matter():
    source = "print('a  ')\nprint('b\\t')\nprint()\nprint()"
    assert run_tests(source, [{"stdin": "", "stdout": "a\nb"}], SandboxLimits()).passed
    assert not run_tests(source, [{"stdin": "", "stdout": "a\n\nb"}], SandboxLimits()).passed


def test_wrong_output_fails_and_stops_the_run():
    tests = [{"stdin": "1", "stdout": "3"}, *DOUBLE_TESTS]
    result = run_tests(DOUBLE, tests, SandboxLimits())
    assert not result.passed
    assert [c.status for c in result.cases] == ["wrong_answer"]


def test_a_crash_fails_with_its_stderr():
    result = run_tests("raise SystemExit('boom')", DOUBLE_TESTS, SandboxLimits())
    assert [c.status for c in result.cases] == ["error"]
    assert "boom" in result.cases[0].stderr


def test_a_function_call_is_judged_by_its_json_result():
    source = "def double(x):\n    return 2 * x"
    ok = [{"fn_name": "double", "args": [21], "expected": 42}]
    assert run_tests(source, ok, SandboxLimits()).passed
    wrong = [{"fn_name": "double", "args": [21], "expected": 43}]
    assert [c.status for c in run_tests(source, wrong, SandboxLimits()).cases] == ["wrong_answer"]


def test_a_program_printing_a_nesting_too_deep_for_any_reader_fails_cleanly():
    # The last line is read as the call's JSON result: 100,000 nested lists would exhaust
    # the recursion limit of a reader without a depth cap (web3 raises that limit). The
    # program prints them and ends before the driver prints the call's result.
    source = (
        "import os, sys\n"
        "def double(x):\n"
        "    print('[' * 100_000 + ']' * 100_000)\n"
        "    sys.stdout.flush()\n"
        "    os._exit(0)"
    )
    tests = [{"fn_name": "double", "args": [21], "expected": 42}]
    result = run_tests(source, tests, SandboxLimits())
    assert [c.status for c in result.cases] == ["wrong_answer"]


def test_verify_code_end_to_end():
    info = {"tests": DOUBLE_TESTS, "time_limit_s": 1.5}
    assert verify_code(f"<think>easy</think>\n```python\n{DOUBLE}\n```", info)
    assert not verify_code("```python\nprint(42)\n```", info)
    assert not verify_code("I cannot write code today.", info)


@pytest.mark.parametrize(
    "info",
    [
        None,
        {},
        {"tests": []},
        {"tests": "print(1)"},
        {"tests": [{"stdin": "1"}]},
        {"tests": [{"stdin": 1, "stdout": "1"}]},
        {"tests": DOUBLE_TESTS, "time_limit_s": 0},
        {"tests": DOUBLE_TESTS, "time_limit_s": 3600},
        {"tests": DOUBLE_TESTS, "time_limit_s": "2"},
    ],
)
def test_malformed_verification_info_is_an_error(info):
    with pytest.raises(ValueError, match=r"must|needs") as e:
        verify_code(f"```python\n{DOUBLE}\n```", info)
    assert "\n" not in str(e.value)


@pytest.mark.parametrize(
    "changes", [{"wall_s": 0}, {"cpu_s": 0}, {"memory_bytes": -1}, {"processes": 1.5}]
)
def test_bad_limits_are_rejected(changes):
    with pytest.raises(ValueError, match="must be"):
        SandboxLimits(**changes)


# --- containment --------------------------------------------------------------------------


def test_an_infinite_loop_is_killed_at_the_wall_clock_limit():
    start = time.monotonic()
    result = run_tests("import time\nwhile True: time.sleep(0.01)", DOUBLE_TESTS, KILLED_SOON)
    assert [c.status for c in result.cases] == ["timeout"]
    assert time.monotonic() - start < KILLED_SOON.wall_s + 1.0


def test_a_busy_loop_hits_the_cpu_limit():
    # A wall clock far beyond one CPU second, however busy the machine: ending before it
    # is the CPU limit's doing.
    limits = SandboxLimits(wall_s=120.0, cpu_s=1)
    result = run_tests("while True: pass", DOUBLE_TESTS, limits)
    assert [c.status for c in result.cases] == ["timeout"]
    assert result.cases[0].seconds < limits.wall_s


def test_process_count_is_capped():
    token = uuid.uuid4().hex
    source = program(
        """
        import os, sys, time
        if len(sys.argv) == 1:  # re-exec so that every process carries the token
            os.execv(sys.executable, [sys.executable, "-I", "main.py", "<token>"])
        for n in range(1000):
            try:
                if os.fork() == 0:
                    time.sleep(60)
                    os._exit(0)
            except OSError:
                print("capped")
                break
        """,
        token=token,
    )
    limits = SandboxLimits(processes=8)
    assert run_tests(source, [{"stdin": "", "stdout": "capped"}], limits).passed
    assert survivors(token) == []


def test_a_fork_bomb_is_contained_and_fails():
    token = uuid.uuid4().hex
    source = program(
        """
        import os, sys
        if len(sys.argv) == 1:
            os.execv(sys.executable, [sys.executable, "-I", "main.py", "<token>"])
        while True:
            try:
                os.fork()
            except OSError:
                pass
        """,
        token=token,
    )
    start = time.monotonic()
    result = run_tests(source, DOUBLE_TESTS, KILLED_SOON)
    assert not result.passed
    assert time.monotonic() - start < KILLED_SOON.wall_s + 2.0
    assert survivors(token) == []


@pytest.mark.parametrize(
    "source",
    [
        "data = bytearray(1 << 30)\nprint(42)",
        "chunks = []\nwhile True:\n    chunks.append(bytearray(1 << 24))",
    ],
    ids=["one-gib", "growing"],
)
def test_a_memory_hog_hits_the_memory_limit(source):
    """It fails on its allocation (an error, not a timeout), whatever the machine's load:
    the time limits are generous here (a loaded 2-core box once took over the default
    2 s to start Python and reach the limit), so only the memory limit can end it."""
    result = run_tests(source, DOUBLE_TESTS, SandboxLimits(wall_s=20.0, cpu_s=20))
    assert [c.status for c in result.cases] == ["error"]
    assert "MemoryError" in result.cases[0].stderr


def test_a_huge_file_write_fails(scratch_tmp):
    source = program(
        """
        with open("big", "wb") as f:
            for _ in range(64):
                f.write(b"x" * (1 << 20))
        print(42)
        """
    )
    result = run_tests(source, [{"stdin": "", "stdout": "42"}], SandboxLimits())
    assert [c.status for c in result.cases] == ["error"]
    assert "File too large" in result.cases[0].stderr
    assert list(scratch_tmp.iterdir()) == []


def test_too_much_output_fails():
    limits = SandboxLimits(output_bytes=1000)
    result = run_tests("print('x' * 5000)", [{"stdin": "", "stdout": "x" * 5000}], limits)
    assert [c.status for c in result.cases] == ["output_limit"]
    flood = "import sys\nsys.stdout.write('x' * (8 << 20))"
    assert not run_tests(flood, [{"stdin": "", "stdout": "x"}], SandboxLimits()).passed


def test_the_network_is_unreachable(sandbox_kind):
    if sandbox_kind != "bwrap":
        pytest.skip("only bubblewrap isolates the network")
    with socket.create_server(("127.0.0.1", 0)) as server:
        port = server.getsockname()[1]
        source = program(
            """
            import socket
            socket.create_connection(("127.0.0.1", <port>), timeout=1).close()
            print("connected")
            """,
            port=port,
        )
        result = run_tests(source, [{"stdin": "", "stdout": "connected"}], SandboxLimits())
        server.setblocking(False)
        with pytest.raises(BlockingIOError):
            server.accept()
    assert [c.status for c in result.cases] == ["error"]


def test_the_filesystem_outside_the_workdir_is_read_only(sandbox_kind, tmp_path):
    if sandbox_kind != "bwrap":
        pytest.skip("only bubblewrap isolates the filesystem")
    source = program(
        """
        import os
        for path in ("/usr/evil", "/etc/evil", "<tmp>/evil"):
            try:
                open(path, "w").close()
                print("wrote", path)
            except OSError:
                pass
        print(sorted(os.environ))
        """,
        tmp=tmp_path,
    )
    expected = "['HOME', 'LANG', 'PATH', 'PWD']"
    assert run_tests(source, [{"stdin": "", "stdout": expected}], SandboxLimits()).passed
    assert list(tmp_path.iterdir()) == []


def _spawner(token: str, *, escape: bool, then: str) -> str:
    return program(
        """
        import subprocess, sys
        subprocess.Popen(
            [sys.executable, "-c", "import time; time.sleep(60)  # <token>"],
            start_new_session=<escape>,
        )
        <then>
        """,
        token=token,
        escape=escape,
        then=then,
    )


@pytest.mark.parametrize(
    ("then", "status"),
    [("print(42)", "passed"), ("while True: pass", "timeout")],
    ids=["exits", "hangs"],
)
def test_a_background_child_dies_with_the_run(sandbox_kind, then, status):
    token = uuid.uuid4().hex
    # Under bubblewrap even a child in its own session goes down with the pid namespace.
    escape = sandbox_kind == "bwrap"
    start = time.monotonic()
    result = run_tests(_spawner(token, escape=escape, then=then), DOUBLE_TESTS[:1], FAST)
    assert time.monotonic() - start < FAST.wall_s + 1.0
    assert [c.status for c in result.cases] == [status]
    assert survivors(token) == []


def test_the_temp_dir_is_gone_afterwards(scratch_tmp):
    source = program(
        """
        import os
        os.makedirs("a/b")
        with open("a/b/file", "w") as f:
            f.write("data")
        os.chmod("a/b", 0)
        os.chmod("a", 0)
        print(42)
        """
    )
    assert run_tests(source, [{"stdin": "", "stdout": "42"}] * 2, SandboxLimits()).passed
    assert list(scratch_tmp.iterdir()) == []


# --- the rlimit-only fallback -------------------------------------------------------------


def test_fallback_warns_once_and_still_limits(rlimit_only, caplog, scratch_tmp):
    assert run_tests(DOUBLE, DOUBLE_TESTS, SandboxLimits()).sandbox == "rlimit"
    assert run_tests(DOUBLE, DOUBLE_TESTS, SandboxLimits()).passed
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1
    assert "rlimits only" in warnings[0].getMessage()

    token = uuid.uuid4().hex
    hang = _spawner(token, escape=False, then="while True: pass")
    assert [c.status for c in run_tests(hang, DOUBLE_TESTS, KILLED_SOON).cases] == ["timeout"]
    assert survivors(token) == []
    hog = "data = bytearray(1 << 30)"
    assert [c.status for c in run_tests(hog, DOUBLE_TESTS, FAST).cases] == ["error"]
    assert list(scratch_tmp.iterdir()) == []
