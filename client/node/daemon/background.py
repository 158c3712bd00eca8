"""Starting the node daemon in the background, for `swarmrl node run` on a terminal: the
daemon outlives the terminal app (and the terminal), which only attaches to it.

The daemon is this same command run headless in a session of its own (no SIGHUP
when the terminal closes), its output in the data dir. The password is asked
here, where the terminal is, and handed over on the daemon's stdin: never on its
command line or in its environment, which its child processes would inherit.
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

from client.node.daemon.control import ControlClient

# Where the daemon's own output goes: its log has every line; this holds what came
# before logging started (a bad setting) or a crash's traceback.
OUTPUT = "daemon.out"
START_SECONDS = 300.0  # the key's unlock and the task set's read come before the socket
POLL_SECONDS = 0.1


class DaemonStartError(ValueError):
    """The daemon exited before it listened; the message is what it said."""


def start_daemon(config: Path | None, data_dir: Path, password: str) -> int:
    """Starts the daemon and returns its pid once its control socket answers;
    DaemonStartError with its last words if it exits before."""
    data_dir.mkdir(parents=True, exist_ok=True)
    command = [sys.executable, "-m", "swarmrl", "node", "run", "--headless", "--spawned"]
    if config is not None:
        command += ["--config", str(config)]
    output = data_dir / OUTPUT
    with output.open("wb") as out:
        child = subprocess.Popen(
            command,
            stdin=subprocess.PIPE,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    assert child.stdin is not None
    try:
        child.stdin.write(password.encode() + b"\n")
        child.stdin.close()
    except BrokenPipeError:
        pass  # it exited already: said below
    client = ControlClient(data_dir)
    deadline = time.monotonic() + START_SECONDS
    while time.monotonic() < deadline:
        if client.running():
            return child.pid
        if child.poll() is not None:
            raise DaemonStartError(
                _last_words(output) or f"the node exited with {child.returncode}"
            )
        time.sleep(POLL_SECONDS)
    child.terminate()
    raise DaemonStartError(f"the node did not start within {START_SECONDS:.0f} s; see {output}")


def _last_words(output: Path) -> str:
    lines = output.read_text(errors="replace").strip().splitlines()
    return lines[-1].removeprefix("error: ") if lines else ""
