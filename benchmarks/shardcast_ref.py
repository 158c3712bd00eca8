"""The reference weight broadcast: shardcast 0.3.2 on loopback, one origin and N clients.

shardcast is an HTTP tree wired by hand: an origin shards a file into a versioned folder
and serves it with `http.server`; middle nodes mirror an upstream; clients fetch every
shard with `wget`, reassemble the file and check its BLAKE3 against `distribution.txt`.
Here the origin and every client are separate processes on 127.0.0.1 (so no GIL is
shared) and all clients connect straight to the origin: one tier, which shardcast
supports as is (a client takes any list of server URLs). Middle nodes would not help
here: one polls its upstream every `check_interval` seconds and copies the upstream's
`distribution.txt` before it has the shards, so clients below it would meet 404s and
back off for 2-15 s, and each is one more process on a two-core machine.

What is timed (`seconds`): from the moment the origin's `broadcast()` returns, which is
when it has written the version into `distribution.txt` (shardcast's announcement), until
the last client's `download_version()` returns the reassembled file that shardcast itself
checked against the announced BLAKE3. Each process stamps its own `time.monotonic()`
(one system-wide clock on Linux), so the parent's scheduling does not blur the figure.
Clients learn of the version by a line on stdin sent as soon as the origin announces it,
rather than by polling, so shardcast pays no poll interval at all (ClientNode has no
poll loop of its own; its only intervals are retry back-offs after failed downloads,
left at their defaults of 2 s and 15 s).

Not timed, as one-time costs outside the transfer: interpreter start-up, imports,
client construction (ShardDownloader fetches a `data1.bin` probe from every server to
seed its bandwidth metrics; we put a 1 MiB one in the origin's folder, since shardcast
leaves creating it to the operator), and `broadcast()` itself, which hashes the whole
file and copies it into 50 MB shard files (shardcast's default shard size). That last
cost is reported apart as `prepare_seconds`; a trainer would pay it before every send.

`cpu_seconds` is user+system CPU of the origin and every client, including the `wget`
processes the clients spawn (reaped, so they count in RUSAGE_CHILDREN), over the timed
window only: each process reads getrusage(SELF) + getrusage(CHILDREN) when the window
opens and when its part ends (the origin when the last client is done).

Running several clients on one host needs two work-arounds that change no behaviour:
every ShardDownloader writes its probe to the fixed path /tmp/dummy.bin, so clients
construct one at a time under a file lock; and every client writes its copy of
`distribution.txt` next to the installed package, so each client imports shardcast
through its own symlink to the package, which gives it a private temp path. The origin's
server is bound to 127.0.0.1 instead of its hard-coded 0.0.0.0, and its log-only
outbound-address lookup is replaced by 127.0.0.1; nothing else in shardcast is touched.
Needs `wget` on PATH: without it shardcast would try to `apt install` it.

What shardcast does that weighs on the figure (its design, not this harness): each
client writes every byte twice (shard files, then the reassembled file) and reads it
back to hash it, so eight clients write about 17 GB, which is bound by the disk under
`workdir` once the page cache's dirty limit is reached; the origin is a single-threaded
`http.server` (one shard response at a time, listen backlog 5) while each client opens
10 connections at once, so hundreds of SYNs overflow the backlog per run and wait for
the kernel's 1, 3, 7 s retransmits, some wget requests time out and are retried, and
eight clients vary a lot from run to run: report a median of several runs.

    from benchmarks.shardcast_ref import run_shardcast
    result = run_shardcast(Path("ckpt.bin"), clients=8, workdir=Path("/tmp"))
"""

from __future__ import annotations

import contextlib
import os
import queue
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

SHARDCAST_VERSION = "0.3.2"
PROBE_SIZE = 1024 * 1024

# Shared by both child scripts: CPU of this process and of its reaped children (wget).
_CPU = """
import resource
def cpu():
    own = resource.getrusage(resource.RUSAGE_SELF)
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime
"""

# argv: data_dir port checkpoint. stdin: "BROADCAST", then "STOP".
_ORIGIN = (
    _CPU
    + """
import sys, time
import shardcast
import shardcast.server as server
bind = server.ShardcastServer.__init__
def loopback(self, address, *args, **kwargs):
    bind(self, ("127.0.0.1", address[1]), *args, **kwargs)
server.ShardcastServer.__init__ = loopback
server.get_local_ip = lambda: "127.0.0.1"
from shardcast.origin_server import OriginServer
data_dir, port, checkpoint = sys.argv[1], int(sys.argv[2]), sys.argv[3]
origin = OriginServer(data_dir, port)
print("UP", shardcast.__version__, flush=True)
sys.stdin.readline()
start = time.monotonic()
version = origin.broadcast(checkpoint)
now = time.monotonic()
print("ANNOUNCED", version, now, now - start, cpu(), flush=True)
sys.stdin.readline()
print("CPU", cpu(), flush=True)
sys.stdin.read()
"""
)

# argv: private_dir server_url lock_file output_file. stdin: "GO <version>".
# Both scripts then idle until killed, so an early end of output always means a crash.
_CLIENT = (
    _CPU
    + """
import fcntl, importlib.util, os, sys, time
private, url, lock_path, output = sys.argv[1:5]
package = os.path.dirname(importlib.util.find_spec("shardcast").origin)
os.symlink(package, os.path.join(private, "shardcast"))
sys.path.insert(0, private)
import shardcast
from shardcast.client_node import ClientNode
assert os.path.dirname(shardcast.__file__) == os.path.join(private, "shardcast")
with open(lock_path, "w") as lock:
    fcntl.flock(lock, fcntl.LOCK_EX)
    node = ClientNode([url], os.path.join(private, "out"))
print("READY", shardcast.__version__, flush=True)
version = sys.stdin.readline().split()[1]
start = cpu()
path = node.download_version(version, output)
now = time.monotonic()
print("DONE", now, cpu() - start, "ok" if path else "failed", flush=True)
sys.stdin.read()
"""
)


@dataclass(frozen=True)
class RefResult:
    """One shardcast run: announcement-to-last-client seconds and CPU in that window."""

    seconds: float
    cpu_seconds: float
    prepare_seconds: float  # broadcast(): whole-file BLAKE3 plus copying into shards


class _Child:
    """A child process in its own process group whose stdout lines land in a shared queue."""

    def __init__(
        self,
        name: str,
        argv: list[str],
        cwd: Path,
        env: dict[str, str],
        lines: queue.Queue[tuple[str, str | None]],
    ) -> None:
        self.name = name
        self.log = cwd / f"{name}.log"
        with self.log.open("wb") as log:
            # A new session lets one killpg take the client's wget children down too.
            self.proc = subprocess.Popen(
                argv,
                cwd=cwd,
                env=env,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=log,
                start_new_session=True,
                text=True,
            )
        threading.Thread(target=self._pump, args=(lines,), daemon=True).start()

    def _pump(self, lines: queue.Queue[tuple[str, str | None]]) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            lines.put((self.name, line.strip()))
        lines.put((self.name, None))

    def send(self, line: str) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(line + "\n")
        self.proc.stdin.flush()

    def tail(self) -> str:
        try:
            return self.log.read_text(errors="replace")[-2000:]
        except OSError:
            return ""

    def kill(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait()
        for stream in (self.proc.stdin, self.proc.stdout):
            # A dead child's stdin may still hold unflushed bytes, which close() reports.
            if stream is not None:
                with contextlib.suppress(OSError):
                    stream.close()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def _child_env(max_concurrent_downloads: int | None) -> dict[str, str]:
    # wget honours proxy variables; dropping them keeps every request on loopback. Stray
    # SHARDCAST_* settings would silently change the reference, so only ours get through.
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.lower().endswith("_proxy") and not k.startswith("SHARDCAST_")
    }
    if max_concurrent_downloads is not None:
        env["SHARDCAST_MAX_CONCURRENT_DOWNLOADS"] = str(max_concurrent_downloads)
    env["no_proxy"] = env["NO_PROXY"] = "127.0.0.1,localhost"
    env["PYTHONUNBUFFERED"] = "1"
    return env


def _blake3_file(path: Path) -> str:
    import blake3

    return blake3.blake3(max_threads=blake3.blake3.AUTO).update_mmap(path).hexdigest()


def run_shardcast(
    checkpoint: Path,
    clients: int,
    workdir: Path,
    timeout: float = 600,
    python: str | None = None,
    max_concurrent_downloads: int | None = None,
) -> RefResult:
    """Broadcasts `checkpoint` with shardcast from one origin to `clients` clients on loopback.

    `python` is the interpreter that has shardcast installed (default: this one).
    `max_concurrent_downloads` sets each client's parallel shard fetches (shardcast's
    default, 10, when None); every other shardcast setting stays at its default.
    `timeout` bounds the whole run, set-up included. Raises if any client fails or
    ends with a file whose BLAKE3 differs from the checkpoint's.
    """
    if clients < 1:
        raise ValueError("clients must be at least 1")
    if shutil.which("wget") is None:
        raise RuntimeError("shardcast clients need wget on PATH")
    checkpoint = Path(checkpoint).resolve()
    expected = _blake3_file(checkpoint)
    python = python or sys.executable
    deadline = time.monotonic() + timeout
    run_dir = Path(tempfile.mkdtemp(prefix="shardcast-", dir=workdir))
    lines: queue.Queue[tuple[str, str | None]] = queue.Queue()
    children: dict[str, _Child] = {}

    def expect(names: set[str], word: str) -> dict[str, list[str]]:
        got: dict[str, list[str]] = {}
        while len(got) < len(names):
            try:
                name, line = lines.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                raise TimeoutError(_report(children, f"no {word} after {timeout} s")) from None
            if line is None:
                raise RuntimeError(_report(children, f"{name} exited before {word}"))
            if name not in names:
                continue
            if not line.startswith(word + " ") or name in got:
                raise RuntimeError(_report(children, f"{name} said {line!r}, wanted {word}"))
            got[name] = line.split()[1:]
        return got

    try:
        env = _child_env(max_concurrent_downloads)
        origin_dir = run_dir / "origin"
        origin_dir.mkdir()
        (origin_dir / "data1.bin").write_bytes(b"\0" * PROBE_SIZE)
        port = _free_port()
        origin = children["origin"] = _Child(
            "origin",
            [python, "-c", _ORIGIN, str(origin_dir), str(port), str(checkpoint)],
            run_dir,
            env,
            lines,
        )
        _check_version(expect({"origin"}, "UP")["origin"], children)

        names = {f"client{i}" for i in range(clients)}
        outputs = {}
        for name in sorted(names):
            private = run_dir / name
            private.mkdir()
            outputs[name] = private / "checkpoint.bin"
            children[name] = _Child(
                name,
                [
                    python,
                    "-c",
                    _CLIENT,
                    str(private),
                    f"http://127.0.0.1:{port}",
                    str(run_dir / "construct.lock"),
                    str(outputs[name]),
                ],
                private,
                env,
                lines,
            )
        for reply in expect(names, "READY").values():
            _check_version(reply, children)

        origin.send("BROADCAST")
        version, announced, prepare, origin_cpu = expect({"origin"}, "ANNOUNCED")["origin"]
        for name in names:
            children[name].send(f"GO {version}")
        done = expect(names, "DONE")
        origin.send("STOP")
        origin_cpu_end = float(expect({"origin"}, "CPU")["origin"][0])

        failed = sorted(name for name, reply in done.items() if reply[2] != "ok")
        if failed:
            raise RuntimeError(_report(children, f"shardcast reported failure in {failed}"))
        for name, path in outputs.items():
            if not path.is_file() or _blake3_file(path) != expected:
                raise RuntimeError(f"{name}: {path} is not byte-identical to {checkpoint}")
        return RefResult(
            seconds=max(float(reply[0]) for reply in done.values()) - float(announced),
            cpu_seconds=origin_cpu_end
            - float(origin_cpu)
            + sum(float(reply[1]) for reply in done.values()),
            prepare_seconds=float(prepare),
        )
    finally:
        for child in children.values():
            child.kill()
        shutil.rmtree(run_dir, ignore_errors=True)


def _check_version(reply: list[str], children: dict[str, _Child]) -> None:
    if reply[:1] != [SHARDCAST_VERSION]:
        raise RuntimeError(_report(children, f"want shardcast {SHARDCAST_VERSION}, got {reply}"))


def _report(children: dict[str, _Child], message: str) -> str:
    tails = "\n".join(f"--- {c.name} ({c.log}):\n{c.tail()}" for c in children.values())
    return f"{message}\n{tails}"
