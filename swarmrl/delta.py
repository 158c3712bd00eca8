"""Weight deltas: a policy step shipped as its difference from the previous step, by
the native core.

Two safetensors files with identical headers (the same tensors, dtypes, shapes and
offsets: consecutive steps of one policy) differ only in tensor bytes. :func:`encode`
writes, for each tensor in file order, the smaller of two zstd-compressed encodings:
the XOR of the two byte ranges, or the indices of the changed elements (as LEB128
gaps) followed by their XORs; both store XORs as byte planes (every element's low
byte, then the next byte, ...), so the high bytes a small update leaves alone are runs
of zeros. An unchanged tensor costs a few bytes. Files
whose headers differ cannot be a delta of each other (``ValueError`` saying what
differs); the caller then ships the whole file.

:func:`apply` rebuilds the target only onto the exact base the delta was made against
(the delta records the base file's BLAKE3), and checks every rebuilt tensor and the
whole file against the BLAKE3 hashes the delta carries before the file appears.
:func:`inspect` reads what a delta holds without a base.

A delta file is ``MAGIC``, a u32 format version (``FORMAT_VERSION``), a length-prefixed
JSON header (the hashes, the target size and one record per tensor: name, encoding,
element size, byte length, payload offset and length, BLAKE3), then the payloads; the
native module's ``format.rs`` documents it in full. Deltas come from the network, so
every number in one is checked before it is used and decompression never produces
more than a tensor's own size.

Both directions stream a window of tensors at a time (32 MiB, or one larger tensor),
read by positioned reads: memory is a few times the larger of that and the largest
tensor, never the model. Outputs are written under a hidden temporary name, synced,
and renamed into place; on any error the output path is left as it was.

Bad content raises ``ValueError`` (one sentence), a missing file
``FileNotFoundError``, any other I/O failure ``OSError``. ``threads`` defaults to all
cores (or ``RAYON_NUM_THREADS``); the GIL is released while the work runs.
"""

from __future__ import annotations

import os
from pathlib import Path

from swarmrl import _native
from swarmrl._native import DeltaInfo, DeltaStats, DeltaTensor

__all__ = [
    "DEFAULT_LEVEL",
    "FORMAT_VERSION",
    "MAGIC",
    "MAX_HEADER_BYTES",
    "MAX_LEVEL",
    "MAX_SAFETENSORS_HEADER_BYTES",
    "MIN_LEVEL",
    "DeltaInfo",
    "DeltaStats",
    "DeltaTensor",
    "apply",
    "encode",
    "inspect",
]

MAGIC: bytes = _native.DELTA_MAGIC
FORMAT_VERSION: int = _native.DELTA_FORMAT_VERSION
MAX_HEADER_BYTES: int = _native.DELTA_MAX_HEADER
MAX_SAFETENSORS_HEADER_BYTES: int = _native.DELTA_MAX_SAFETENSORS_HEADER
MIN_LEVEL: int = _native.DELTA_MIN_LEVEL
MAX_LEVEL: int = _native.DELTA_MAX_LEVEL
# zstd's own default: most of level 19's ratio on weight deltas at many times the speed.
DEFAULT_LEVEL = 3

StrPath = str | os.PathLike[str]


def encode(
    base: StrPath,
    target: StrPath,
    out: StrPath,
    *,
    level: int = DEFAULT_LEVEL,
    threads: int | None = None,
) -> DeltaStats:
    """Writes the delta of ``target`` against ``base`` at ``out`` (its directory created
    if needed), replacing any file there, and says what it did. ValueError when the two
    files cannot be a delta of each other, saying what differs."""
    if type(level) is not int or not MIN_LEVEL <= level <= MAX_LEVEL:
        raise ValueError(f"level must be an int from {MIN_LEVEL} to {MAX_LEVEL}, not {level!r}")
    out_path = Path(out)
    out_path.parent.mkdir(parents=True, exist_ok=True)
    return _native.delta_encode(Path(base), Path(target), out_path, level, threads)


def apply(base: StrPath, delta: StrPath, out: StrPath, *, threads: int | None = None) -> None:
    """Rebuilds at ``out`` (its directory created if needed) the target that ``delta``
    encodes against ``base``, replacing any file there. ``base`` must be the exact file
    the delta was made against; the rebuilt file must match the delta's hashes. On any
    error ``out`` is left as it was."""
    out_path = Path(out)
    out_path.parent.mkdir(parents=True, exist_ok=True)
    _native.delta_apply(Path(base), Path(delta), out_path, threads)


def inspect(delta: StrPath) -> DeltaInfo:
    """What the delta at ``delta`` holds: its base's and target's hashes, the target's
    size, and each tensor's record. ValueError when it is not a well-formed delta."""
    return _native.delta_inspect(Path(delta))
