"""A version as its difference from the one before: made by the origin, rebuilt by a node.

The origin publishes step n as its full version, whose signed manifest may carry a
:class:`~swarmrl.shards.DeltaLink`: the manifest hash of step n-1 (the base) and of a
second, small version, the delta, served like any other. The delta version holds, for
each file of step n that differs from the base:

- ``<name>.delta`` for a safetensors file whose header the base shares (the same
  tensors: consecutive steps of one policy), encoded by :mod:`swarmrl.delta`;
- ``<name>`` itself for any other file that changed (a new tokenizer, say);

and nothing for a file the base holds unchanged. A node that holds the base fetches
the delta (4 MiB shards: a delta is a few MB to a few hundred), rebuilds step n from
the two (:func:`rebuild`), and keeps the result only if every shard of every file
matches step n's full manifest, so its copy is bit-identical to the trainer's. A node
without the base, or whose rebuild fails, fetches the full version: every node that
rebuilt one serves it, so a full version is always in the swarm while nodes hold it.
"""

from __future__ import annotations

from pathlib import Path

from swarmrl import delta, shards
from swarmrl.files import link_or_copy
from swarmrl.shards import Manifest

DELTA_SUFFIX = ".delta"
# The sizes a delta comes in: ~1% of a 269 MB to 15 GB policy. The broadcast simulation
# (benchmarks/broadcast_sim.py) reached 1,000 nodes 5x sooner in 4 MiB shards than in
# 64 MiB ones, as every node starts serving a shard after seconds, not minutes.
DELTA_SHARD_SIZE = 4 * 1024 * 1024
WEIGHTS_SUFFIX = ".safetensors"


def _unchanged(base: Manifest, target: Manifest, file: int) -> bool:
    entry = target.files[file]
    for i, other in enumerate(base.files):
        if other.name == entry.name:
            mine, theirs = target.shards_of(file), base.shards_of(i)
            return (
                other.size == entry.size
                and base.shard_size == target.shard_size
                and base.shard_hashes[theirs.start : theirs.stop]
                == target.shard_hashes[mine.start : mine.stop]
            )
    return False


def encode(base_dir: Path, base: Manifest, target_dir: Path, target: Manifest, out: Path) -> bool:
    """Writes into the empty directory `out` the delta of the version in `target_dir`
    (described by `target`) against the one in `base_dir` (`base`). False, with `out`
    left empty, when a delta would not be smaller than the version itself (or the two
    are the same), so there is nothing to ship but the full version."""
    names = {f.name for f in target.files}
    written = 0
    for i, entry in enumerate(target.files):
        if _unchanged(base, target, i):
            continue
        source = target_dir / entry.name
        base_file = base_dir / entry.name
        is_weights = entry.name.endswith(WEIGHTS_SUFFIX) and base_file.is_file()
        # A target file named like another's delta would make the delta ambiguous.
        if is_weights and entry.name + DELTA_SUFFIX not in names:
            try:
                stats = delta.encode(base_file, source, out / (entry.name + DELTA_SUFFIX))
            except ValueError:
                pass  # different tensors: the file goes whole
            else:
                if stats.delta_bytes < entry.size:
                    written += stats.delta_bytes
                    continue
                (out / (entry.name + DELTA_SUFFIX)).unlink()
        link_or_copy(source, out / entry.name)
        written += entry.size
    if written == 0 or written >= target.size:
        for path in out.iterdir():
            path.unlink()
        return False
    return True


def rebuild(base_dir: Path, delta_dir: Path, target: Manifest, out: Path) -> None:
    """Writes into the empty directory `out` each file of `target` from the base's
    files and the delta's. ValueError (one sentence) when the delta does not fit the
    base or the target; the caller checks the result against `target` before using it."""
    names = {f.name for f in target.files}
    for path in delta_dir.iterdir():
        name = path.name
        if name not in names and name.removesuffix(DELTA_SUFFIX) not in names:
            raise ValueError(f"the delta holds {name}, which step {target.step} has no use for")
    for entry in target.files:
        whole, patch = delta_dir / entry.name, delta_dir / (entry.name + DELTA_SUFFIX)
        base_file, result = base_dir / entry.name, out / entry.name
        if whole.is_file():
            link_or_copy(whole, result)
        elif patch.is_file():
            if not base_file.is_file():
                raise ValueError(f"the delta patches {entry.name}, which the base does not hold")
            delta.apply(base_file, patch, result)
        elif base_file.is_file():
            link_or_copy(base_file, result)
        else:
            raise ValueError(f"neither the base nor the delta holds {entry.name}")


def matches(directory: Path, manifest: Manifest) -> bool:
    """Whether every shard of every file in `directory` is the one `manifest` lists."""
    for i, entry in enumerate(manifest.files):
        path = directory / entry.name
        if not path.is_file() or path.stat().st_size != entry.size:
            return False
        if not all(shards.intact_shards(path, manifest, i)):
            return False
    return True
