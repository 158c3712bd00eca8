"""The `swarmrl` command line: exit codes and messages."""

import subprocess
import sys
from pathlib import Path

import swarmrl

SWARMRL = Path(sys.executable).with_name("swarmrl")


def run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([SWARMRL, *args], capture_output=True, text=True, timeout=60)


def test_version():
    out = run("--version")
    assert out.returncode == 0
    assert out.stdout.strip() == f"swarmrl {swarmrl.__version__}"


def test_help_lists_the_commands():
    out = run("--help")
    assert out.returncode == 0
    for command in ("demo", "bench"):
        assert command in out.stdout


def test_a_malformed_command_line_exits_2():
    assert run("no-such-command").returncode == 2
    out = run("bench", "toploc", "--runs", "3")
    assert out.returncode == 2
    assert "greater than or equal to 9" in out.stderr
