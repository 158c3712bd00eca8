"""A whole swarm on one machine: anvil, the deployment, keys, and the orchestrator and
nodes as real processes started the way a person starts them (the `swarmrl` command).

The end-to-end tests, `swarmrl bench swarm` and the demo build their swarms with it;
it only runs commands, so it imports neither the node nor the orchestrator. A step that
fails at run time (a command, a process that exits, anvil, a wait that runs out) is a
`SwarmError`: one sentence naming what failed and the log to read.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

from swarmrl import keystore
from swarmrl.chain.anvil import Anvil, dev_accounts
from swarmrl.chain.cli import LOG_FILE
from swarmrl.chain.deploy import (
    DEV_RECORDER,
    DEV_VALIDATOR,
    Deployment,
    ProtocolParams,
    deploy_dev,
    run_id_from_name,
    write_deployment,
)
from swarmrl.chain.errors import ChainConfigError, ChainError, rpc_failure_sentence
from swarmrl.chain.tokens import TOKEN
from swarmrl.settings_toml import write_settings

SWARMRL = Path(sys.executable).with_name("swarmrl")
PASSWORD = "correct horse battery staple"
# The swarm's chain folder, under its root: the `swarmrl` commands' $SWARMRL_CHAIN_DIR,
# and where anvil logs, as `swarmrl chain up`'s does.
CHAIN_DIR = "chain"
# How long a stopped process group has to end, every process in it, before it is killed:
# the orchestrator gives each of its three children 15 s to finish their work.
STOP_SECONDS = 60.0
# How often a swarm that keeps its chain across anvil's restarts dumps it: what was mined
# since the last dump is lost in a kill -9, as blocks are in a reorganisation.
CHAIN_DUMP_SECONDS = 2.0
# Providers among the funded dev accounts (4 onwards).
PROVIDERS = (4, 5, 6, 7)
# The demo's and the end-to-end test's cast: node key names and their providers' accounts.
HONEST = {"node4": 4, "node5": 5, "node6": 6}
CHEATER = ("cheat7", 7)
# The orchestrator settings under which the default model learns on three such nodes. A
# step takes two nodes' orders: with three nodes working at once, a group is then about
# one step old when trained on (at two steps old this small model learns a third as
# fast). Eight prompts a step, not four: with four the held-out rise stalled near +0.03.
LEARNING_RECIPE: dict[str, object] = {
    "group_size": 8,
    "prompts_per_step": 8,
    "prompts_per_assignment": 4,
    "max_tokens": 64,
    "target_len": 128,
    "lr": 3e-4,
    "epoch_seconds": 60,
    "validation_grace": 30,
    "heartbeat_seconds": 2,
    "max_backlog": 3,
}

T = TypeVar("T")


class SwarmError(RuntimeError):
    """A step of a local swarm failed; ``str(e)`` is one sentence naming what failed and
    the log to read."""


class SwarmTimeoutError(SwarmError):
    """A wait ran out while every process of the swarm still ran."""


@dataclass
class Swarm:
    root: Path
    anvil: Anvil
    deployment: Deployment
    deployment_file: Path
    keystore_dir: Path
    password_file: Path
    # Where anvil's chain is dumped, for a swarm that keeps it across restarts.
    chain_state: Path | None = None
    processes: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)
    # Every process group started, kept after the process is gone: `still_running` looks
    # for anything left in them (an orchestrator's trainer, say) once all were stopped.
    groups: dict[int, str] = field(default_factory=dict)
    # Where each started process's output goes, by name.
    logs: dict[str, Path] = field(default_factory=dict)

    def env(self) -> dict[str, str]:
        return {
            **os.environ,
            "SWARMRL_CHAIN_DIR": str(self.root / CHAIN_DIR),
            "PYTHONUNBUFFERED": "1",
        }

    def start(
        self, name: str, args: list[object], log: Path, *, nice: int = 0
    ) -> subprocess.Popen[bytes]:
        """Starts `args` in a process group of its own, output to `log`; `nice` above 0
        lowers its CPU priority (the demo's measurements run before the swarm's work)."""
        handle = log.open("a")
        if nice > 0:
            args = ["nice", "-n", nice, *args]
        process = subprocess.Popen(
            [str(a) for a in args],
            stdout=handle,
            stderr=subprocess.STDOUT,
            env=self.env(),
            start_new_session=True,
        )
        self.processes[name] = process
        self.groups[process.pid] = name
        self.logs[name] = log
        if nice > 0:
            _lower_session_priority(process.pid, nice)
        return process

    def check_running(self, when: str) -> None:
        """SwarmError if anvil or a process this swarm started has exited; `when` says
        what the swarm was doing ("before step 3", "while training")."""
        check_anvil(self.anvil, when)
        for name, process in self.processes.items():
            if process.poll() is not None:
                raise SwarmError(
                    f"{name} exited with code {process.returncode} {when}; its log is "
                    f"{self.logs[name]}"
                )

    def still_running(self) -> list[str]:
        """Names of the started processes with anything of their group still alive."""
        return sorted({self.groups[group] for group in _live_groups(self.groups)})

    def kill(self, name: str, sig: int = signal.SIGKILL, *, group: bool = True) -> None:
        """Sends `sig` to the process group of `name` (`group`; else to its leader alone,
        as `kill PID` does, which leaves the leader to end its children) and waits until
        every process in the group has ended; one that outlives STOP_SECONDS is killed
        (SIGKILL), and an error."""
        if self._stop({name: self.processes.pop(name)}, sig, group=group):
            raise SwarmError(
                f"{name} did not stop within {STOP_SECONDS:.0f} s of signal {sig}; its log is "
                f"{self.logs[name]}"
            )

    def restart_anvil(self) -> None:
        """kill -9 of anvil, then anvil again on its port from its last dump: the chain
        less what was mined since (a swarm made with `keep_chain`)."""
        if self.chain_state is None:
            raise RuntimeError("this swarm's chain is not kept across restarts (keep_chain)")
        self.anvil.kill()
        self.anvil.restart(self.chain_state)

    def stop_all(self) -> list[str]:
        """Stops every process group this swarm started and anvil: SIGTERM, then SIGKILL
        for any group with a process left after STOP_SECONDS. Returns the names of the
        groups that had to be killed so."""
        killed = self._stop(dict(self.processes), signal.SIGTERM)
        self.processes.clear()
        self.anvil.stop()
        return killed

    def _stop(
        self, processes: dict[str, subprocess.Popen[bytes]], sig: int, *, group: bool = True
    ) -> list[str]:
        """Signals the process groups led by `processes` (or their leaders alone, not
        `group`; a leader that has ended may have left children in its group) and waits
        for every process in them, reaping the leaders; at STOP_SECONDS the rest are
        killed. The names of those killed."""
        groups = {process.pid: name for name, process in processes.items()}
        for leader in groups:
            with contextlib.suppress(ProcessLookupError):  # nothing of the group is left
                (os.killpg if group else os.kill)(leader, sig)
        left = _wait_for_groups(groups)
        for rest in left:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(rest, signal.SIGKILL)
        _wait_for_groups(left)
        for process in processes.values():
            process.poll()  # reaped: no zombie left behind
        return sorted(groups[g] for g in left)


@dataclass(frozen=True)
class Proc:
    """One process as /proc shows it."""

    pid: int
    state: str
    parent: int
    group: int

    @property
    def alive(self) -> bool:
        return self.state not in ("Z", "X")  # a zombie has exited; only its entry is left


def processes() -> list[Proc]:
    """Every process /proc shows now."""
    return [p for stat in Path("/proc").glob("[0-9]*/stat") if (p := _read_stat(stat))]


def process(pid: int) -> Proc | None:
    """Process `pid` as /proc shows it now; None once it is gone."""
    return _read_stat(Path(f"/proc/{pid}/stat"))


def alive(pid: int) -> bool:
    """Whether process `pid` is still running (a zombie is not)."""
    return (proc := process(pid)) is not None and proc.alive


def _read_stat(stat: Path) -> Proc | None:
    try:
        # After the command's name (in parentheses, maybe with spaces): state, ppid, pgrp.
        fields = stat.read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None  # it exited while we looked
    return Proc(int(stat.parent.name), fields[0], int(fields[1]), int(fields[2]))


def _live_groups(groups: Iterable[int]) -> set[int]:
    """Those of the process `groups` with a process alive in them."""
    wanted = set(groups)
    return {p.group for p in processes() if p.group in wanted and p.alive}


def _wait_for_groups(groups: Iterable[int]) -> set[int]:
    """Waits up to STOP_SECONDS for every process of `groups` to end; those still alive."""
    deadline = time.monotonic() + STOP_SECONDS
    while (left := _live_groups(groups)) and time.monotonic() < deadline:
        time.sleep(0.1)
    return left


def _lower_session_priority(pid: int, nice: int) -> None:
    """With autogroup scheduling (most desktop kernels) a process's nice value counts
    only against its own session's processes, and each process here has a session of
    its own: the session's autogroup gets the nice value too, where the kernel has one."""
    # Without autogroup scheduling there is no such file: the nice value alone counts.
    with contextlib.suppress(OSError):
        Path(f"/proc/{pid}/autogroup").write_text(str(nice))


def make_swarm(
    root: Path,
    *,
    invalidation_window: int = 3600,
    run: str = "e2e-swarm",
    keep_chain: bool = False,
) -> Swarm:
    """anvil, the protocol deployed on it, the dev keys in a keystore, under `root`.
    `keep_chain`: anvil's chain is dumped every CHAIN_DUMP_SECONDS, so that
    `Swarm.restart_anvil` can kill it and start it again (the fault runs). Nothing is
    left running when it fails."""
    log = root / CHAIN_DIR / LOG_FILE
    log.parent.mkdir(parents=True, exist_ok=True)
    try:
        anvil = Anvil.start(log_path=log)
    except ChainConfigError:
        raise  # no anvil to run: its sentence says how to get one
    except ChainError as e:
        raise SwarmError(f"{e}; its log is {log}") from None
    try:
        with on_chain(anvil, "deploying the protocol"):
            deployment = deploy_dev(
                anvil,
                run_id=run_id_from_name(run),
                params=ProtocolParams(
                    min_stake_per_node=100 * TOKEN,
                    unbonding_period=7200,
                    invalidation_window=invalidation_window,
                    reward_per_unit=TOKEN // 100,
                    slash_penalty=50 * TOKEN,
                    quorum=1,
                ),
                tokens_each=1_000 * TOKEN,
                pool_funding=100_000 * TOKEN,
            )
        deployment_file = root / "deployment.json"
        write_deployment(deployment_file, deployment)
        keys = root / "keys"
        password_file = root / "password"
        password_file.write_text(PASSWORD + "\n")
        accounts = dev_accounts()
        # anvil's dev keys are public: each command's unlock costs milliseconds this way.
        keystore.save_public(keys, "recorder", bytes(accounts[DEV_RECORDER].key), PASSWORD)
        keystore.save_public(keys, "validator", bytes(accounts[DEV_VALIDATOR].key), PASSWORD)
        for i in PROVIDERS:
            keystore.save_public(keys, f"provider{i}", bytes(accounts[i].key), PASSWORD)
        chain_state = None
        if keep_chain:
            chain_state = root / "anvil-state.json"
            with on_chain(anvil, "dumping the chain"):
                anvil.keep_state(chain_state, CHAIN_DUMP_SECONDS)
    except BaseException:
        anvil.stop()
        raise
    return Swarm(root, anvil, deployment, deployment_file, keys, password_file, chain_state)


def stake_and_init_node(swarm: Swarm, provider: int, node_key: str, stake: int = 100) -> str:
    """The volunteer's two commands after `wallet new`: stake (SRL), then `node init`."""
    run_cli(swarm, "wallet", "stake", f"provider{provider}", str(stake))
    out = run_cli(swarm, "node", "init", "--provider", f"provider{provider}", "--key", node_key)
    return out


def cli(swarm: Swarm, *args: object) -> subprocess.CompletedProcess[str]:
    """`swarmrl ARGS` with this swarm's keystore, password and deployment."""
    common = [
        "--keystore-dir",
        swarm.keystore_dir,
        "--password-file",
        swarm.password_file,
        "--deployment",
        swarm.deployment_file,
    ]
    return subprocess.run(
        [str(a) for a in [SWARMRL, *args, *common]],
        capture_output=True,
        text=True,
        env=swarm.env(),
        timeout=300,
    )


def run_cli(swarm: Swarm, *args: object) -> str:
    """`cli`, which must succeed; its standard output. A failure is a SwarmError: anvil's
    exit if it exited (every such command talks to the chain), else the command's own
    last line."""
    out = cli(swarm, *args)
    if out.returncode != 0:
        command = f"`swarmrl {' '.join(map(str, args))}`"
        check_anvil(swarm.anvil, f"during {command}")
        lines = out.stderr.strip().splitlines() or [f"exit code {out.returncode}"]
        raise SwarmError(
            f"{command} failed: {lines[-1].removeprefix('error: ')}; anvil's log is "
            f"{swarm.anvil.log_path}"
        )
    return out.stdout


def check_anvil(anvil: Anvil, when: str) -> None:
    """SwarmError if anvil has exited; `when` says what the swarm was doing."""
    if (code := anvil.process.poll()) is not None:
        raise SwarmError(f"anvil exited with code {code} {when}; its log is {anvil.log_path}")


@contextlib.contextmanager
def on_chain(anvil: Anvil, what: str) -> Iterator[None]:
    """Runs the block, `what` on anvil's chain ("staking"): a chain or RPC failure in it
    is a SwarmError naming anvil's log (anvil's exit, if it exited)."""
    try:
        yield
    except Exception as e:
        sentence = str(e) if isinstance(e, ChainError) else rpc_failure_sentence(e)
        if sentence is None:
            raise
        check_anvil(anvil, f"while {what}")
        raise SwarmError(f"{what} failed: {sentence}; anvil's log is {anvil.log_path}") from None


def orchestrator_toml(
    swarm: Swarm, path: Path, *, model: Path, tasks: Path, data_dir: Path, **settings: object
) -> Path:
    """An orchestrator config on this swarm's chain and keys: a fixed loopback port (a
    restarted orchestrator is found again, as in production), then `settings`."""
    values: dict[str, object] = {
        "model": model,
        "tasks": tasks,
        "data_dir": data_dir,
        "deployment": swarm.deployment_file,
        "keystore_dir": swarm.keystore_dir,
        "password_file": swarm.password_file,
        "listen": f"/ip4/127.0.0.1/tcp/{free_port()}",
        "metrics_port": free_port(),
    }
    return write_settings(path, {**values, **settings})


def node_toml(
    swarm: Swarm, path: Path, *, key: str, tasks: Path, orchestrator: str, **settings: object
) -> Path:
    """A node config for `key` on this swarm: torch on the CPU with one thread (several
    nodes share the machine), its data dir beside `path`, working whatever the machine
    does (a demo on a laptop's battery still runs), then `settings`."""
    values: dict[str, object] = {
        "data_dir": path.parent / key,
        "deployment": swarm.deployment_file,
        "keystore_dir": swarm.keystore_dir,
        "key": key,
        "password_file": swarm.password_file,
        "tasks": tasks,
        "orchestrator": orchestrator,
        "threads": 1,
        "backend": "torch",
        "device": "cpu",
        "metrics_port": free_port(),
        "pause_on_battery": False,
    }
    return write_settings(path, {**values, **settings})


def wait_for(condition: Callable[[], T | None], what: str, limit: float, swarm: Swarm) -> T:
    """The first true value `condition` returns, asked every half second; SwarmError if
    anvil or a process of `swarm` exits first, SwarmTimeoutError after `limit` seconds."""
    deadline = time.monotonic() + limit
    while True:
        value = condition()
        if value:
            return value
        swarm.check_running(f"before {what}")
        if time.monotonic() > deadline:
            raise SwarmTimeoutError(f"no {what} within {limit:.0f} s; {_logs_to_read(swarm)}")
        time.sleep(0.5)


def _logs_to_read(swarm: Swarm) -> str:
    """Where a wait that ran out is explained, as the end of a sentence: the running
    processes' logs, or anvil's when none runs."""
    logs = [str(swarm.logs[name]) for name in swarm.processes] or [str(swarm.anvil.log_path)]
    return f"the log{'s are' if len(logs) > 1 else ' is'} {', '.join(logs)}"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def orchestrator_addr(log: Path) -> str | None:
    if not log.is_file():
        return None
    m = re.search(r"listening on (/ip4/127\.0\.0\.1/tcp/\d+/p2p/\S+)", log.read_text())
    return m.group(1) if m else None
