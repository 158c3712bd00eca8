"""The node's daemon as a volunteer runs it: real `swarmrl node` processes, a real chain,
the terminal app on a real pseudo-terminal, and an orchestrator that is not there (so the
daemon has a reason not to work, and shows it)."""

from __future__ import annotations

import json
import os
import pty
import re
import select
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from simulation.local_swarm import free_port
from swarmrl import keystore
from swarmrl.chain.deploy import write_deployment
from swarmrl.models import gpu_device_files
from swarmrl.settings_toml import write_settings
from tests.integration.conftest import NODE_A, PROVIDER_A

SWARMRL = str(Path(sys.executable).with_name("swarmrl"))
DATA = Path(__file__).parent.parent / "data"
# Nothing listens at port 9 (discard) on loopback: the node cannot join.
ORCHESTRATOR = "/ip4/127.0.0.1/tcp/9/p2p/12D3KooWLyBuoa14i5VcrmMFAGQ8Xn3UPVLL2jwqDMNQQXaoVUS9"
PASSWORD = "correct horse"
LIMIT = 120.0


@pytest.fixture
def node_config(contracts, accounts, deployment, tmp_path) -> Path:
    provider, node = accounts[PROVIDER_A], accounts[NODE_A]
    p = contracts.as_account(provider)
    p.registry.register_provider()
    consent, signature = p.registry.node_consent(node, provider.address)
    p.registry.add_node(node.address, consent.deadline, signature)
    write_deployment(tmp_path / "deployment.json", deployment)
    keystore.save_public(tmp_path / "keys", "node", node.key, PASSWORD)
    return write_settings(
        tmp_path / "node.toml",
        {
            "data_dir": tmp_path / "node",
            "keystore_dir": tmp_path / "keys",
            "deployment": tmp_path / "deployment.json",
            "tasks": DATA / "intellect2_tasks.jsonl",
            "orchestrator": ORCHESTRATOR,
            "metrics_port": free_port(),
        },
    )


def _env(tmp_path: Path) -> dict[str, str]:
    return {**os.environ, "SWARMRL_PASSWORD": PASSWORD, "SWARMRL_LOCK_DIR": str(tmp_path)}


def _node(config: Path, *args: object, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [SWARMRL, "node", *map(str, args), "--config", str(config)],
        capture_output=True,
        text=True,
        env=env,
        timeout=LIMIT,
    )


def _status(config: Path, env: dict[str, str]) -> dict:
    done = _node(config, "status", "--json", env=env)
    assert done.returncode == 0, (done.stdout, done.stderr)
    return json.loads(done.stdout)


def _until(condition: Callable[[], object], what: str) -> None:
    deadline = time.monotonic() + LIMIT
    while not condition():
        assert time.monotonic() < deadline, f"never: {what}"
        time.sleep(0.2)


def _reason(config: Path, env: dict[str, str]) -> str:
    """The daemon's reason line; "" before it answers (it is still starting)."""
    done = _node(config, "status", "--json", env=env)
    running = json.loads(done.stdout)["running"] if done.returncode == 0 else None
    return "" if running is None else running["reason"]


def test_the_daemon_answers_its_commands_and_stops_on_one(node_config, tmp_path):
    env = _env(tmp_path)
    daemon = subprocess.Popen(
        [SWARMRL, "node", "run", "--headless", "--config", str(node_config)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        _until(lambda: _reason(node_config, env).startswith("orchestrator unreachable"), "reason")
        # The address once, and why in a few words (py-libp2p names the peer again).
        unreachable = re.escape(f"orchestrator unreachable: could not connect to {ORCHESTRATOR}")
        reason = _reason(node_config, env)
        assert re.fullmatch(
            rf"{unreachable}: no connection could be opened \(trying again in [\d.]+s\)", reason
        ), reason
        status = _status(node_config, env)
        assert status["running"]["pid"] == daemon.pid
        assert status["running"]["version"]
        assert status["receipts"] == 0
        # The daemon runs no model: torch is its workers' to load (seconds and 400 MiB),
        # and where no GPU driver is, `device = "auto"` needs no torch to resolve.
        if not gpu_device_files():
            assert "libtorch" not in Path(f"/proc/{daemon.pid}/maps").read_text()

        again = _node(node_config, "run", "--headless", env=env)
        assert again.returncode == 1
        assert again.stderr.strip() == (
            f"error: a node already runs for {tmp_path / 'node'} (pid {daemon.pid}); "
            "`swarmrl node attach` shows it, `swarmrl node stop` stops it"
        )

        assert _node(node_config, "pause", env=env).returncode == 0
        _until(lambda: _reason(node_config, env) == "paused by you", "paused")
        assert _node(node_config, "resume", env=env).returncode == 0
        snoozed = _node(node_config, "snooze", "30m", env=env)
        assert snoozed.stdout.startswith("snoozed until"), snoozed.stdout
        bad = _node(node_config, "snooze", "soon", env=env)
        assert bad.returncode != 0
        assert "is not a duration such as 90s, 30m, 1h or 2h30m" in bad.stderr
        assert _node(node_config, "resume", env=env).returncode == 0

        logs = _node(node_config, "logs", "-n", "3", env=env)
        assert logs.returncode == 0
        assert len(logs.stdout.splitlines()) == 3

        # node.toml cut short while the daemon runs: the daemon keeps its settings, and
        # its commands still reach it, by the note it keeps of the file it started with.
        whole = node_config.read_text()
        node_config.write_text(whole[: len(whole) // 2] + "\n[")  # no longer TOML
        broken = _node(node_config, "status", env=env)
        assert broken.returncode == 0, broken.stderr
        assert broken.stderr.startswith(f"warning: {node_config}, line ")
        assert broken.stderr.rstrip().endswith("; asking the node that runs with it")
        assert broken.stdout.startswith("orchestrator unreachable: could not connect to ")

        stopped = _node(node_config, "stop", env=env)
        assert stopped.returncode == 0, stopped.stderr
        assert daemon.wait(timeout=LIMIT) == 0
    finally:
        if daemon.poll() is None:
            daemon.kill()
            daemon.wait()
    # Stopped, the daemon's note is gone: a config that does not load is refused again.
    refused = _node(node_config, "status", env=env)
    assert refused.returncode == 1
    assert refused.stderr.startswith(f"error: {node_config}, line ")
    node_config.write_text(whole)
    # Not running: the journal is read instead, and the socket is gone.
    status = _status(node_config, env)
    assert status["running"] is None
    assert status["pending"] == 0
    assert not (tmp_path / "node" / "control.sock").exists()


class Terminal:
    """A process on a pseudo-terminal of its own, as a person's shell would run it."""

    def __init__(self, command: list[str], env: dict[str, str]) -> None:
        self.master, slave = pty.openpty()
        os.set_blocking(self.master, False)
        self.process = subprocess.Popen(
            command,
            stdin=slave,
            stdout=slave,
            stderr=slave,
            env={**env, "TERM": "xterm-256color", "COLUMNS": "120", "LINES": "40"},
            start_new_session=True,
        )
        os.close(slave)
        self.seen = b""

    def wait_for(self, text: bytes) -> None:
        deadline = time.monotonic() + LIMIT
        while text not in self.seen:
            assert self.process.poll() is None or text in self.seen, self.seen[-2000:]
            assert time.monotonic() < deadline, f"never saw {text!r}: {self.seen[-2000:]!r}"
            if not self._read():
                break

    def exit_code(self) -> int:
        """The process's exit code once it ends. What it writes meanwhile is read: a
        terminal nobody reads fills up, and its writer then waits for ever."""
        deadline = time.monotonic() + LIMIT
        while self.process.poll() is None:
            assert time.monotonic() < deadline, f"it never ended: {self.seen[-2000:]!r}"
            self._read()
        return self.process.returncode

    def _read(self) -> bool:
        """What the terminal shows next, waiting up to 0.2 s; False once it is closed."""
        ready, _, _ = select.select([self.master], [], [], 0.2)
        if ready:
            try:
                self.seen += os.read(self.master, 65536)
            except OSError:
                return False
        return True

    def press(self, key: bytes) -> None:
        os.write(self.master, key)

    def close(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait()
        os.close(self.master)


def test_on_a_terminal_the_app_attaches_detaches_and_dies_without_the_daemon(node_config, tmp_path):
    env = _env(tmp_path)
    # `node run` on a terminal starts the daemon in the background and attaches.
    term = Terminal([SWARMRL, "node", "run", "--config", str(node_config)], env)
    try:
        term.wait_for(b"the node's daemon runs (pid ")
        term.wait_for(b"orchestrator unreachable")  # the app shows the daemon's reason
        term.press(b"q")  # detaches
        assert term.exit_code() == 0
    finally:
        term.close()
    running = _status(node_config, env)["running"]
    assert running is not None
    assert running["reason"].startswith("orchestrator unreachable")
    daemon = running["pid"]

    # Attached again, and killed: the daemon works on.
    term = Terminal([SWARMRL, "node", "attach", "--config", str(node_config)], env)
    try:
        term.wait_for(b"orchestrator unreachable")
        term.process.send_signal(signal.SIGKILL)
        term.exit_code()
    finally:
        term.close()
    assert _status(node_config, env)["running"]["pid"] == daemon

    assert _node(node_config, "stop", env=env).returncode == 0
    _until(lambda: _status(node_config, env)["running"] is None, "the daemon stopped")
    log = (tmp_path / "node" / "node.log").read_text()
    assert "stopped" in log.splitlines()[-1]
