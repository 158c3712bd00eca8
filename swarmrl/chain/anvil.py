"""A local anvil chain for development, the demo and tests.

anvil runs as a subprocess bound to 127.0.0.1 only, on a port it picks itself
(``--port 0``): no race between finding a free port and binding it. It always
uses the well-known dev mnemonic, so account *i* has the same key everywhere.
Its output goes to a log file, never a pipe: anvil logs every RPC call, and an
undrained pipe would eventually block it.

anvil keeps its chain in memory. Where a chain must outlive its process (the fault
runs kill it with SIGKILL and start it again), `keep_state` dumps the chain to a file
every few seconds and `restart` starts anvil again on the same port from it: what was
mined after the last dump is lost, as blocks are in a reorganisation.
"""

from __future__ import annotations

import gzip
import os
import re
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from pathlib import Path
from typing import IO, Any
from urllib.parse import urlsplit

from eth_account import Account
from eth_account.signers.local import LocalAccount
from web3 import HTTPProvider, Web3
from web3.types import RPCEndpoint

from swarmrl.chain.errors import ChainConfigError, ChainError, RpcUnavailableError
from swarmrl.files import write_atomically
from swarmrl.processes import die_with_parent

DEV_MNEMONIC = "test test test test test test test test test test test junk"
DEV_CHAIN_ID = 31337
DEV_ACCOUNTS = 10
HOST = "127.0.0.1"
# Process ids are C ints: os.kill raises OverflowError past this.
MAX_PID = 2**31 - 1
REPO_ROOT = Path(__file__).resolve().parents[2]
REPO_ANVIL = REPO_ROOT / "contracts" / "node_modules" / ".bin" / "anvil"
_LISTENING = re.compile(rb"Listening on 127\.0\.0\.1:(\d+)")


def find_anvil() -> Path:
    """$SWARMRL_ANVIL, else the repository's pinned anvil, else `anvil` on PATH."""
    if env := os.environ.get("SWARMRL_ANVIL"):
        path = Path(env)
        if not (path.is_file() and os.access(path, os.X_OK)):
            raise ChainConfigError(f"$SWARMRL_ANVIL is {env}, which is not an executable file")
        return path
    if REPO_ANVIL.is_file() and os.access(REPO_ANVIL, os.X_OK):
        return REPO_ANVIL
    if found := shutil.which("anvil"):
        return Path(found)
    raise ChainConfigError(
        "anvil not found: run `make setup`, put anvil on PATH, or set $SWARMRL_ANVIL"
    )


def dev_accounts(count: int = DEV_ACCOUNTS) -> list[LocalAccount]:
    """anvil's dev accounts: keys derived from the dev mnemonic, m/44'/60'/0'/0/i."""
    Account.enable_unaudited_hdwallet_features()
    return [
        Account.from_mnemonic(DEV_MNEMONIC, account_path=f"m/44'/60'/0'/0/{i}")
        for i in range(count)
    ]


def check_rpc_url(rpc_url: str) -> None:
    """ChainConfigError unless `rpc_url` is an http(s) URL with a host and a valid port."""
    shown = rpc_url if len(rpc_url) <= 100 else rpc_url[:100] + "..."
    try:
        parts = urlsplit(rpc_url)
        valid = parts.scheme in ("http", "https") and bool(parts.hostname) and parts.port != 0
    except ValueError:  # a malformed host or a port out of range
        valid = False
    if not valid:
        raise ChainConfigError(
            f"{shown!r} is not an RPC URL: write it as http://HOST:PORT or https://HOST/..."
        )


def connect(rpc_url: str, *, timeout: float = 10.0) -> Web3:
    """A Web3 for `rpc_url` with a request timeout (the sender does its own retries)."""
    check_rpc_url(rpc_url)
    return Web3(
        HTTPProvider(
            rpc_url,
            request_kwargs={"timeout": timeout},
            exception_retry_configuration=None,
        )
    )


def wait_for_rpc(
    rpc_url: str, *, timeout: float = 30.0, process: subprocess.Popen[bytes] | None = None
) -> None:
    """Polls eth_chainId until it answers; fails early if `process` (a Popen) exits."""
    w3 = connect(rpc_url, timeout=2.0)
    deadline = time.monotonic() + timeout
    while True:
        try:
            if w3.eth.chain_id:
                return
        except Exception as e:  # connection refused while anvil starts
            if process is not None and process.poll() is not None:
                raise ChainError(f"anvil exited with code {process.returncode}") from None
            if time.monotonic() > deadline:
                raise RpcUnavailableError(f"{rpc_url} did not answer in {timeout:g} s") from e
            time.sleep(0.05)


def _wait_for_port(
    log_path: Path, process: subprocess.Popen[bytes], timeout: float, start: int = 0
) -> int:
    """The port anvil says it listens on, in its log from byte `start` on."""
    deadline = time.monotonic() + timeout
    while True:
        match = _LISTENING.search(log_path.read_bytes()[start:])
        if match:
            return int(match.group(1))
        if process.poll() is not None:
            text = log_path.read_bytes()[start:].decode(errors="replace")
            tail = text.strip().splitlines()[-1:]
            raise ChainError(
                f"anvil exited with code {process.returncode} before listening"
                + (f": {tail[0]}" if tail else "")
            )
        if time.monotonic() > deadline:
            raise ChainError(f"anvil did not start listening within {timeout:g} s")
        time.sleep(0.02)


class Anvil:
    """A running anvil process; use as a context manager or call `stop()`."""

    def __init__(self, process: subprocess.Popen[bytes], rpc_url: str, log_path: Path) -> None:
        self.process = process
        self.rpc_url = rpc_url
        self.log_path = log_path
        self.chain_id = DEV_CHAIN_ID
        self._owns_log = False
        self._args: list[str] = []  # the command line, less port and state: for restart
        self._detached = False
        self._keeper: threading.Thread | None = None
        self._keeping = threading.Event()
        # Held by a dump and by `kill`: a dump read before a kill is never written after
        # it, over the file the restarted chain came from.
        self._dumping = threading.Lock()

    @property
    def pid(self) -> int:
        return self.process.pid

    @classmethod
    def start(
        cls,
        *,
        chain_id: int = DEV_CHAIN_ID,
        log_path: Path | None = None,
        detached: bool = False,
        timeout: float = 30.0,
        block_seconds: int | None = None,
        extra_args: tuple[str, ...] = (),
    ) -> Anvil:
        """Starts anvil on 127.0.0.1 and returns once it answers RPC.

        `detached` puts anvil in its own session so it outlives this process
        (for `swarmrl chain up`); otherwise it shares our process group.
        `block_seconds` adds an empty block every that many seconds to the block of each
        transaction (anvil's mixed mining): then the latest block's clock, which contracts'
        views read, follows the wall clock on an idle chain too. Without it, the chain
        mines only for transactions, and tests move its clock at will.
        """
        owns_log = log_path is None
        if log_path is None:
            fd, name = tempfile.mkstemp(prefix="swarmrl-anvil-", suffix=".log")
            os.close(fd)
            log_path = Path(name)
        args = [
            str(find_anvil()),
            "--host",
            HOST,
            "--chain-id",
            str(chain_id),
            "--mnemonic",
            DEV_MNEMONIC,
            "--accounts",
            str(DEV_ACCOUNTS),
            *(
                []
                if block_seconds is None
                else ["--block-time", str(block_seconds), "--mixed-mining"]
            ),
            *extra_args,
        ]
        try:
            process, rpc_url = _spawn([*args, "--port", "0"], log_path, detached, timeout)
        except BaseException:
            if owns_log:
                log_path.unlink(missing_ok=True)
            raise
        anvil = cls(process, rpc_url, log_path)
        anvil.chain_id = chain_id
        anvil._owns_log = owns_log
        anvil._args = args
        anvil._detached = detached
        return anvil

    @property
    def port(self) -> int:
        port = urlsplit(self.rpc_url).port
        assert port is not None  # set from the port anvil said it listens on
        return port

    def dump_state(self, path: Path) -> None:
        """Writes the whole chain (state, blocks, transactions) to `path`, replacing it
        only once the dump is whole. anvil's own `--state-interval` rewrites its file in
        place: killed in the middle, it leaves a file it then refuses to load."""
        dump = rpc(self.web3(), "anvil_dumpState", [])
        if not isinstance(dump, str):
            raise ChainError(f"anvil_dumpState answered {type(dump).__name__}, not hex bytes")
        # The answer is the state file's JSON, gzipped, as hex.
        write_atomically(Path(path), gzip.decompress(bytes.fromhex(dump.removeprefix("0x"))))

    def keep_state(self, path: Path, seconds: float) -> None:
        """Dumps the chain to `path` every `seconds` until `stop`, from a thread of its
        own; a dump that fails (anvil killed, restarting) waits for the next turn."""
        if self._keeper is not None:
            raise ChainError("this anvil keeps its state already")

        def keep() -> None:
            while not self._keeping.wait(seconds):
                try:
                    with self._dumping:
                        self.dump_state(path)
                except Exception:  # anvil is down or restarting: the next turn dumps
                    continue

        with self._dumping:
            self.dump_state(path)  # one whole dump before anything can be lost
        self._keeper = threading.Thread(target=keep, name="anvil-state", daemon=True)
        self._keeper.start()

    def kill(self) -> None:
        """SIGKILL, as a crash: what was mined after the last dump is gone."""
        with self._dumping:
            self.process.kill()
            self.process.wait()

    def restart(self, state: Path, timeout: float = 30.0) -> None:
        """Starts anvil again, on the same port, from the chain dumped at `state` (the
        old process must have ended: `kill` or `stop`)."""
        if self.process.poll() is None:
            raise ChainError(f"anvil (pid {self.pid}) still runs; stop it before restarting")
        with open(self.log_path, "ab") as log:
            log.write(b"\n--- restarted from " + str(state).encode() + b" ---\n")
        args = [*self._args, "--port", str(self.port), "--load-state", str(state)]
        self.process, _ = _spawn(args, self.log_path, self._detached, timeout, append=True)

    def web3(self) -> Web3:
        return connect(self.rpc_url)

    def stop(self, timeout: float = 5.0) -> None:
        """Terminates anvil (SIGTERM, then SIGKILL) and reaps it: no zombie."""
        self._keeping.set()
        if self._keeper is not None:
            self._keeper.join()
        _terminate(self.process, timeout)
        if self._owns_log:
            self.log_path.unlink(missing_ok=True)

    def __enter__(self) -> Anvil:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _spawn(
    args: list[str], log_path: Path, detached: bool, timeout: float, *, append: bool = False
) -> tuple[subprocess.Popen[bytes], str]:
    """Runs anvil with `args`, output to `log_path`; the process and its RPC URL once it
    answers (it is stopped again if it does not)."""
    start = log_path.stat().st_size if append else 0
    log: IO[bytes]
    with open(log_path, "ab" if append else "wb") as log:
        process = subprocess.Popen(
            args,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=detached,
            # An attached anvil must not outlive us, even if we are killed
            # before stop() runs (a test run cut short, say).
            preexec_fn=None if detached else _die_with_parent,
        )
    try:
        port = _wait_for_port(log_path, process, timeout, start)
        rpc_url = f"http://{HOST}:{port}"
        wait_for_rpc(rpc_url, timeout=timeout, process=process)
    except BaseException:
        _terminate(process)
        raise
    return process, rpc_url


def _die_with_parent() -> None:
    """In the child before exec: SIGTERM when the parent dies (anvil then dumps its state).
    An attached anvil is started from a thread that lives as long as it should (the
    main one): see swarmrl.processes."""
    die_with_parent(signal.SIGTERM)


def _terminate(process: subprocess.Popen[bytes], timeout: float = 5.0) -> None:
    if process.poll() is not None:
        return
    process.terminate()
    try:
        process.wait(timeout)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


def stop_pid(pid: int, timeout: float = 5.0) -> bool:
    """Stops an anvil we did not start in this process (from a pid file).

    Returns False if no such process is running. Checks /proc that the pid is
    really anvil, so a stale pid file never kills an unrelated process.
    """
    if not is_anvil_pid(pid):
        return False
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            return True
        deadline = time.monotonic() + timeout
        while pid_running(pid):
            if time.monotonic() > deadline:
                break
            time.sleep(0.05)
        else:
            return True
    raise ChainError(f"anvil (pid {pid}) did not stop, even after SIGKILL")


def pid_running(pid: int) -> bool:
    """Whether `pid` runs; a zombie (dead, not yet reaped by its parent) does not."""
    if not 0 < pid <= MAX_PID:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # A zombie still answers kill(0); it has stopped for every purpose here.
    stat = Path(f"/proc/{pid}/stat")
    try:
        return stat.read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return True


def is_anvil_pid(pid: int) -> bool:
    """Whether `pid` is a live process whose executable is named anvil."""
    if not pid_running(pid):
        return False
    cmdline = Path(f"/proc/{pid}/cmdline")
    if not cmdline.exists():  # no /proc (macOS): trust the pid file
        return True
    try:
        argv0 = cmdline.read_bytes().split(b"\0", 1)[0]
    except OSError:
        return False
    return Path(argv0.decode(errors="replace")).name == "anvil"


def is_loopback(rpc_url: str) -> bool:
    """Whether `rpc_url` is served on this machine (a loopback address)."""
    return urlsplit(rpc_url).hostname in ("127.0.0.1", "localhost", "::1")


def is_anvil(w3: Web3) -> bool:
    """Whether the node `w3` is connected to is anvil (by its client version)."""
    version = rpc(w3, "web3_clientVersion", [])
    return isinstance(version, str) and version.lower().startswith("anvil/")


# Anvil's own RPC methods for time travel and state snapshots (tests, the demo, `chain advance`).


def increase_time(w3: Web3, seconds: int, *, mine_block: bool = True) -> int:
    """Moves the chain clock forward and mines a block (unless `mine_block` is False: the
    next block carries the new time); returns the latest block's timestamp."""
    rpc(w3, "evm_increaseTime", [int(seconds)])
    if mine_block:
        mine(w3)
    return int(w3.eth.get_block("latest")["timestamp"])


def mine(w3: Web3, blocks: int = 1) -> None:
    for _ in range(blocks):
        rpc(w3, "evm_mine", [])


def snapshot(w3: Web3) -> str:
    """Saves the whole chain state; `revert` restores it (and consumes the snapshot)."""
    return str(rpc(w3, "evm_snapshot", []))


def revert(w3: Web3, snapshot_id: str) -> None:
    if not rpc(w3, "evm_revert", [snapshot_id]):
        raise ChainError(f"anvil could not revert to snapshot {snapshot_id}")


def rpc(w3: Web3, method: str, params: list[Any]) -> Any:
    """One of anvil's own RPC methods (anvil_*, evm_*); ChainError with its message if it fails."""
    response = w3.provider.make_request(RPCEndpoint(method), params)
    if "error" in response:
        raise ChainError(f"{method} failed: {response['error'].get('message', response['error'])}")
    return response.get("result")
