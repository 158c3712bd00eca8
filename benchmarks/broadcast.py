"""Weight broadcast on loopback: swarmrl's swarm against shardcast 0.3.2, same file, same run.

One origin and N nodes, each its own process on 127.0.0.1 (no GIL shared), a
random checkpoint (1 GiB by default) in `--workdir`, every store on the same
disk. What is timed, for both: from the announcement (our origin's `publish`
returning, which is when the signed announcement is out; shardcast's
`broadcast()` returning) until the last node has the whole file verified on
disk. Each process stamps `time.monotonic()` (one clock system-wide). Not
timed, for both: interpreter start-up, imports, joining, and the origin's
preparation (ours: hashing into a manifest and signing; shardcast's: hashing
and copying into shard files), reported apart as "prepare".

Also measured in the same run: the physical ceiling of this machine, one
process sending the file over loopback TCP with sendfile to another reading
it into a buffer; and CPU seconds (user + system of the origin and all nodes
over the timed window) per GB delivered.

    python -m benchmarks.broadcast [--size-mib 1024] [--nodes 1 8] [--runs 3]
    swarmrl bench broadcast
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from benchmarks.shards import write_random_file

if TYPE_CHECKING:
    from benchmarks.shardcast_ref import RefResult
    from swarmrl.weights.peer import SwarmNode

MIB = 1024 * 1024
SHARD_MIB = 16
TIMEOUT = 600.0


def _cpu() -> float:
    self_, children = (
        resource.getrusage(resource.RUSAGE_SELF),
        resource.getrusage(resource.RUSAGE_CHILDREN),
    )
    return self_.ru_utime + self_.ru_stime + children.ru_utime + children.ru_stime


def _say(**fields: object) -> None:
    print(json.dumps(fields), flush=True)


# ---- the processes -------------------------------------------------------------------


def _served(node: SwarmNode) -> int:
    """Bytes `node` served to its peers (none if it listens nowhere)."""
    return node.server.bytes_served if node.server is not None else 0


def _peer_main(args: argparse.Namespace) -> None:
    """One origin or node; talks to the driver with JSON lines on stdin/stdout."""
    import logging

    from eth_account import Account
    from libp2p.crypto.ed25519 import create_new_key_pair

    from swarmrl.eip712 import swarm_domain
    from swarmrl.weights.peer import SwarmNode
    from swarmrl.weights.store import WeightStore

    logging.basicConfig(level=logging.WARNING)
    logging.getLogger("libp2p").setLevel(logging.CRITICAL)
    account = Account.from_key(bytes.fromhex(args.key)) if args.key else None
    node = SwarmNode.standalone(
        store=WeightStore(Path(args.store)),
        domain=swarm_domain(31337, "0x" + "42" * 20),
        run="bench",
        trusted=[args.trusted],
        peer_key=create_new_key_pair(),
        account=account,
        reachable=account is not None,  # the origin
        bootstrap=[args.bootstrap] if args.bootstrap else [],
    )
    _say(addr=node.addrs[0])
    if account is not None:
        sys.stdin.readline()  # "publish"
        start = time.monotonic()
        version = node.publish(Path(args.file), model="bench", step=1, shard_size=SHARD_MIB * MIB)
        announced, cpu = time.monotonic(), _cpu()
        _say(announced=announced, prepare=announced - start)
        sys.stdin.readline()  # "done": every node has it
        _say(cpu=_cpu() - cpu, served=_served(node), shards=version.manifest.shard_count)
    else:
        cpu = _cpu()
        node.wait_for(1, timeout=TIMEOUT)
        _say(done=time.monotonic(), cpu=_cpu() - cpu)
        sys.stdin.readline()  # keep serving the others until the driver says stop
        _say(served=_served(node))
    node.close()


def _receiver_main(args: argparse.Namespace) -> None:
    """The ceiling's far end: reads everything into one reused buffer."""
    with socket.create_server(("127.0.0.1", 0)) as server:
        _say(port=server.getsockname()[1])
        conn, _ = server.accept()
        view = memoryview(bytearray(4 * MIB))
        total = 0
        while n := conn.recv_into(view):
            total += n
        _say(received=total, at=time.monotonic())


# ---- the driver ----------------------------------------------------------------------


class _Proc:
    def __init__(self, *argv: str) -> None:
        self.p = subprocess.Popen(
            [sys.executable, "-m", "benchmarks.broadcast", *argv],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )
        assert self.p.stdin is not None  # PIPE
        assert self.p.stdout is not None  # PIPE
        self.stdin, self.stdout = self.p.stdin, self.p.stdout

    def read(self) -> dict[str, Any]:
        """The process's next line: a JSON object of what it measured."""
        line = self.stdout.readline()
        if not line:
            raise RuntimeError(f"a benchmark process exited with {self.p.wait()}")
        fields: dict[str, Any] = json.loads(line)
        return fields

    def tell(self, word: str) -> None:
        self.stdin.write(word + "\n")
        self.stdin.flush()

    def kill(self) -> None:
        if self.p.poll() is None:
            os.killpg(self.p.pid, 9)
        self.p.wait()


@dataclass
class Result:
    seconds: float
    cpu_seconds: float
    prepare_seconds: float
    origin_share: float  # of all bytes the nodes received, the part the origin sent
    sent_per_needed: float  # bytes sent / bytes the nodes needed (endgame races add some)


def run_swarmrl(checkpoint: Path, nodes: int, workdir: Path) -> Result:
    from eth_account import Account

    from swarmrl.weights.store import FILES_DIR

    key = Account.create()
    root = Path(tempfile.mkdtemp(dir=workdir, prefix="swarmrl-bench-"))
    procs: list[_Proc] = []
    try:
        origin = _Proc(
            "peer", "--store", str(root / "origin"), "--trusted", key.address,
            "--key", key.key.hex(), "--file", str(checkpoint),
        )  # fmt: skip
        procs.append(origin)
        addr = origin.read()["addr"]
        peers = [
            _Proc(
                "peer",
                "--store",
                str(root / f"n{i}"),
                "--trusted",
                key.address,
                "--bootstrap",
                addr,
            )
            for i in range(nodes)
        ]
        procs += peers
        for p in peers:
            p.read()
        time.sleep(2.0)  # gossipsub meshes form on 1 s heartbeats
        origin.tell("publish")
        announced = origin.read()
        done = [p.read() for p in peers]
        origin.tell("done")
        origin_stats = origin.read()
        for p in peers:
            p.tell("stop")
        node_served = sum(p.read()["served"] for p in peers)
        cpu = origin_stats["cpu"] + sum(d["cpu"] for d in done)
        size = checkpoint.stat().st_size
        for i in range(nodes):
            (got,) = (root / f"n{i}").glob(f"step-*/{FILES_DIR}/{checkpoint.name}")
            if got.stat().st_size != size:
                raise RuntimeError(f"node {i} has a {got.stat().st_size}-byte file")
        return Result(
            max(d["done"] for d in done) - announced["announced"],
            cpu,
            announced["prepare"],
            origin_stats["served"] / max(origin_stats["served"] + node_served, 1),
            (origin_stats["served"] + node_served) / (nodes * size),
        )
    finally:
        for p in procs:
            p.kill()
        shutil.rmtree(root, ignore_errors=True)


def _floor_main(args: argparse.Namespace) -> None:
    """One node's unavoidable data work without any network: read the checkpoint into
    a shard buffer (as a receive would), verify it with the native kernel, write it into
    a preallocated file, sync it."""
    from swarmrl import shards

    manifest = shards.Manifest.from_json(Path(args.manifest).read_bytes())
    buffer = bytearray(manifest.shard_size)
    _say(ready=True)
    sys.stdin.readline()
    start = time.monotonic()
    out = os.open(args.out, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
    os.posix_fallocate(out, 0, manifest.size)
    with open(args.file, "rb", buffering=0) as f:
        for index in range(manifest.shard_count):
            offset, length = shards.shard_range(manifest, index)
            view = memoryview(buffer)[:length]
            f.readinto(view)
            shards.verify_shard(manifest, index, view, threads=1)
            os.pwrite(out, view, offset)
    os.fsync(out)
    os.close(out)
    _say(start=start, end=time.monotonic())


def machine_floor(checkpoint: Path, nodes: int, workdir: Path) -> float:
    """Seconds for `nodes` processes at once to do a node's data work (_floor_main):
    what this machine needs for N nodes before any byte crosses a socket."""
    from swarmrl import shards

    root = Path(tempfile.mkdtemp(dir=workdir, prefix="floor-"))
    procs: list[_Proc] = []
    try:
        manifest_path = root / "manifest.json"
        manifest = shards.build_manifest(
            checkpoint, model="floor", step=0, shard_size=SHARD_MIB * MIB
        )
        manifest_path.write_bytes(manifest.to_json())
        procs = [
            _Proc(
                "floor",
                "--file",
                str(checkpoint),
                "--manifest",
                str(manifest_path),
                "--out",
                str(root / f"n{i}.bin"),
            )
            for i in range(nodes)
        ]
        for p in procs:
            p.read()
        for p in procs:
            p.tell("go")
        times = [p.read() for p in procs]
        seconds: float = max(t["end"] for t in times) - min(t["start"] for t in times)
        return seconds
    finally:
        for p in procs:
            p.kill()
        shutil.rmtree(root, ignore_errors=True)


def loopback_ceiling(checkpoint: Path) -> float:
    """GB/s of one sendfile stream from this process to a reader process."""
    receiver = _Proc("receiver")
    try:
        port = receiver.read()["port"]
        size = checkpoint.stat().st_size
        with socket.create_connection(("127.0.0.1", port)) as s, open(checkpoint, "rb") as f:
            start = time.monotonic()
            sent = 0
            while sent < size:
                sent += os.sendfile(s.fileno(), f.fileno(), sent, size - sent)
        end: float = receiver.read()["at"]
        return size / (end - start) / 1e9
    finally:
        receiver.kill()


def _fmt(values: list[float]) -> str:
    return f"{statistics.median(values):.2f} ({min(values):.2f}-{max(values):.2f})"


def _median(results: Sequence[Result | RefResult], field: str) -> float:
    return statistics.median(float(getattr(r, field)) for r in results)


def main(runs: int = 3, size_mib: int = 1024, nodes: tuple[int, ...] = (1, 8)) -> None:
    from benchmarks.shardcast_ref import run_shardcast

    workdir = Path(os.environ.get("SWARMRL_BENCH_DIR") or tempfile.gettempdir())
    with tempfile.TemporaryDirectory(dir=workdir, prefix="broadcast-") as tmp:
        checkpoint = Path(tmp) / "model.safetensors"
        write_random_file(checkpoint, size_mib * MIB)
        gb = checkpoint.stat().st_size / 1e9
        ceilings = [loopback_ceiling(checkpoint) for _ in range(runs)]
        print(f"broadcast of a {size_mib} MiB checkpoint on loopback, workdir {workdir}")
        print(f"  loopback TCP ceiling (sendfile -> recv_into): {_fmt(ceilings)} GB/s")
        base = None
        for n in nodes:
            ours: list[Result] = []
            ref: list[RefResult] = []
            for _ in range(runs):  # interleaved, so drift in the machine hits both alike
                ours.append(run_swarmrl(checkpoint, n, Path(tmp)))
                ref.append(run_shardcast(checkpoint, n, Path(tmp)))
            floors = [machine_floor(checkpoint, n, Path(tmp)) for _ in range(runs)]
            t_ours, t_ref = _median(ours, "seconds"), _median(ref, "seconds")
            print(f"  {n} node(s): seconds from announcement to the last verified copy,")
            print(f"  median (min-max) of {runs}; prepare = the origin's work before announcing")
            print(
                f"    swarmrl   {_fmt([r.seconds for r in ours])}"
                f"   prepare {_fmt([r.prepare_seconds for r in ours])}"
            )
            print(
                f"    shardcast {_fmt([r.seconds for r in ref])}"
                f"   prepare {_fmt([r.prepare_seconds for r in ref])}"
            )
            print(
                f"    delivered: swarmrl {n * gb / t_ours:.2f} GB/s, shardcast "
                f"{n * gb / t_ref:.2f} GB/s in all: swarmrl {t_ref / t_ours:.2f}x faster"
            )
            cpu_ours = _median(ours, "cpu_seconds") / (gb * n)
            cpu_ref = _median(ref, "cpu_seconds") / (gb * n)
            print(f"    CPU s per GB delivered: swarmrl {cpu_ours:.2f}, shardcast {cpu_ref:.2f}")
            print(
                f"    swarmrl origin sent {_median(ours, 'origin_share'):.0%} of the bytes; "
                f"bytes sent / needed {_median(ours, 'sent_per_needed'):.3f}"
            )
            print(
                f"    machine floor, {n} process(es) each reading, verifying, writing and "
                f"syncing 1 copy, no network: {_fmt(floors)} s"
            )
            if base is None:
                base = t_ours
            else:
                print(f"    swarmrl time at {n} nodes / at {nodes[0]}: {t_ours / base:.2f}x")


def _cli() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="mode")
    peer = sub.add_parser("peer")
    for opt in ("--store", "--trusted", "--key", "--file", "--bootstrap"):
        peer.add_argument(opt)
    sub.add_parser("receiver")
    floor = sub.add_parser("floor")
    for opt in ("--file", "--manifest", "--out"):
        floor.add_argument(opt)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--size-mib", type=int, default=1024)
    parser.add_argument("--nodes", type=int, nargs="+", default=[1, 8])
    args = parser.parse_args()
    if args.mode == "peer":
        _peer_main(args)
    elif args.mode == "receiver":
        _receiver_main(args)
    elif args.mode == "floor":
        _floor_main(args)
    else:
        main(args.runs, args.size_mib, tuple(args.nodes))


if __name__ == "__main__":
    _cli()
