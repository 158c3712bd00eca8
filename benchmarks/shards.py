"""Checkpoint shard hashing: swarmrl's native kernel against the blake3 PyPI package.

One random file (1 GiB by default) in the page cache, 64 MiB shards. Ours is the
whole `build_manifest` (streamed reads, per-shard BLAKE3, Merkle root, manifest);
the reference reads the same file shard by shard into one reused buffer and
hashes each with `blake3.blake3(max_threads=...)`. `update_mmap` hashing the
whole file as one input is shown too, as the package's own fastest path (a
different digest, so not a like-for-like figure). One-thread figures pin the
process to one core, so our read-ahead thread shares that core; all-thread
figures use every core. Each figure is the median of `runs` timed runs after a
warm-up run; GB/s is 1e9 bytes per second.

    python -m benchmarks.shards [--runs 5] [--size-mib 1024]   or   swarmrl bench shards
"""

from __future__ import annotations

import argparse
import os
import tempfile
from collections.abc import Callable
from pathlib import Path

import blake3
import numpy as np

from benchmarks.timing import median_seconds, one_core
from swarmrl import shards

MIB = 1024 * 1024


def median_gbps(fn: Callable[[], object], size: int, runs: int) -> float:
    return size / median_seconds(fn, runs) / 1e9


def write_random_file(path: Path, size: int) -> None:
    rng = np.random.default_rng(0)
    with path.open("wb") as f:
        for offset in range(0, size, 64 * MIB):
            f.write(rng.bytes(min(64 * MIB, size - offset)))


def reference_shard_hashes(path: Path, shard_size: int, max_threads: int) -> list[str]:
    view = memoryview(bytearray(shard_size))
    hashes = []
    with path.open("rb", buffering=0) as f:
        while n := f.readinto(view):
            hashes.append(blake3.blake3(view[:n], max_threads=max_threads).hexdigest())
    return hashes


def reference_mmap(path: Path, max_threads: int) -> bytes:
    return blake3.blake3(max_threads=max_threads).update_mmap(path).digest()


def measure(
    path: Path, size: int, shard_size: int, runs: int, one_thread: bool
) -> dict[str, float]:
    threads, max_threads = (1, 1) if one_thread else (None, blake3.blake3.AUTO)
    ours = shards.build_manifest(
        path, model="bench", step=0, shard_size=shard_size, threads=threads
    )
    assert list(ours.shard_hashes) == reference_shard_hashes(path, shard_size, max_threads)

    def build() -> None:
        shards.build_manifest(path, model="bench", step=0, shard_size=shard_size, threads=threads)

    return {
        "ours": median_gbps(build, size, runs),
        "ref": median_gbps(
            lambda: reference_shard_hashes(path, shard_size, max_threads), size, runs
        ),
        "mmap": median_gbps(lambda: reference_mmap(path, max_threads), size, runs),
    }


def main(
    runs: int = 5, size_mib: int = 1024, shard_size: int = shards.DEFAULT_SHARD_SIZE
) -> dict[str, float]:
    size = size_mib * MIB
    cores = len(os.sched_getaffinity(0))
    with tempfile.TemporaryDirectory(prefix="swarmrl-bench-") as tmp:
        path = Path(tmp) / "model.safetensors"
        write_random_file(path, size)
        path.read_bytes()  # into the page cache: this measures hashing, not the disk
        # All threads first: worker pools started while pinned would stay on one core.
        every = measure(path, size, shard_size, runs, one_thread=False)
        with one_core():
            one = measure(path, size, shard_size, runs, one_thread=True)

    figures = {f"{key}_1t": value for key, value in one.items()}
    figures |= {f"{key}_all": value for key, value in every.items()}
    figures["ratio_1t"] = figures["ours_1t"] / figures["ref_1t"]
    figures["ratio_all"] = figures["ours_all"] / figures["ref_all"]
    report(figures, size, shard_size, runs, cores)
    return figures


def report(f: dict[str, float], size: int, shard_size: int, runs: int, cores: int) -> None:
    print(
        f"Shard hashing, {size / 2**30:.2f} GiB file in {shard_size // MIB} MiB shards "
        f"(page cache): median of {runs} runs, GB/s"
    )
    print(f"  {'':34} {'1 thread':>9} {f'all ({cores})':>9}")
    rows = [
        ("swarmrl build_manifest", "ours"),
        ("blake3 package, shard by shard", "ref"),
        ("ratio swarmrl / blake3", "ratio"),
        ("blake3 update_mmap, whole file", "mmap"),
    ]
    for label, key in rows:
        print(f"  {label:34} {f[f'{key}_1t']:>9.2f} {f[f'{key}_all']:>9.2f}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--size-mib", type=int, default=1024)
    args = parser.parse_args()
    main(args.runs, args.size_mib)
