"""The extension module built from native/ (pyo3): its exact signatures.

Only ``swarmrl.toploc``, ``swarmrl.shards`` and ``swarmrl.delta`` import it; they are its
Python faces and
normalise what they pass (bf16 bit patterns as a C-contiguous 2-D ``uint16`` array,
hashes as raw 32-byte strings, a list of hashes as one concatenated ``bytes``).
``mypy.stubtest swarmrl._native`` (part of ``make lint``) checks this file against the
built module. ``threads=None`` means every core, or ``RAYON_NUM_THREADS`` when set.
"""

from collections.abc import Sequence
from os import PathLike
from pathlib import Path
from typing import Literal, final

import numpy as np
import numpy.typing as npt
from typing_extensions import Buffer

_Path = str | PathLike[str]

__all__ = [
    "DELTA_FORMAT_VERSION",
    "DELTA_MAGIC",
    "DELTA_MAX_HEADER",
    "DELTA_MAX_LEVEL",
    "DELTA_MAX_SAFETENSORS_HEADER",
    "DELTA_MIN_LEVEL",
    "SHARDS_MAX_SHARD_SIZE",
    "TOPLOC_FIELD_PRIME",
    "TOPLOC_MAX_EXP_MISMATCH_PER_128",
    "TOPLOC_MAX_MANT_ERR_MEAN",
    "TOPLOC_MAX_MANT_ERR_MEDIAN",
    "DeltaInfo",
    "DeltaStats",
    "DeltaTensor",
    "ShardPlan",
    "VerifyResult",
    "delta_apply",
    "delta_encode",
    "delta_inspect",
    "shards_file_name",
    "shards_hash",
    "shards_hash_file",
    "shards_inclusion_proof",
    "shards_merkle_root",
    "shards_missing",
    "shards_reassemble",
    "shards_split",
    "shards_store",
    "shards_verify",
    "shards_verify_inclusion",
    "toploc_build_proofs",
    "toploc_verify_proofs",
]

# -- toploc -----------------------------------------------------------------------

TOPLOC_FIELD_PRIME: int
TOPLOC_MAX_EXP_MISMATCH_PER_128: int
TOPLOC_MAX_MANT_ERR_MEAN: float
TOPLOC_MAX_MANT_ERR_MEDIAN: float

@final
class VerifyResult:
    """The verdict on one chunk: how far its recomputed top-k is from the proof, and
    whether that is within the acceptance thresholds."""

    @property
    def exp_mismatches(self) -> int: ...
    @property
    def mant_err_mean(self) -> float: ...
    @property
    def mant_err_median(self) -> float: ...
    @property
    def accepted(self) -> bool: ...

def toploc_build_proofs(
    acts: npt.NDArray[np.uint16], chunk: int, topk: int, threads: int | None = None
) -> list[bytes]:
    """One proof per ``chunk`` rows of ``acts``; ValueError on a bad shape or setting."""

def toploc_verify_proofs(
    acts: npt.NDArray[np.uint16],
    proofs: Sequence[bytes | None],
    chunk: int,
    topk: int,
    threads: int | None = None,
) -> list[VerifyResult]:
    """One verdict per proof; a missing or malformed proof rejects its chunk."""

# -- shards -----------------------------------------------------------------------

SHARDS_MAX_SHARD_SIZE: int

@final
class ShardPlan:
    """A manifest as the core checks shards against it: layout, every shard hash and
    the root, checked against each other once when built."""

    def __new__(
        cls, file_size: int, shard_size: int, hashes_blob: bytes, root: bytes
    ) -> ShardPlan: ...

def shards_file_name(index: int) -> str: ...
def shards_hash(data: bytes, threads: int | None = None) -> bytes:
    """The BLAKE3 hash of one shard."""

def shards_hash_file(path: _Path, shard_size: int, threads: int | None = None) -> tuple[bytes, int]:
    """Every shard's hash, concatenated, and the file's size."""

def shards_merkle_root(hashes_blob: bytes) -> bytes: ...
def shards_inclusion_proof(hashes_blob: bytes, index: int) -> bytes: ...
def shards_verify_inclusion(
    root: bytes, count: int, index: int, shard_hash: bytes, proof: bytes
) -> None:
    """ValueError unless ``proof`` places ``shard_hash`` at ``index`` under ``root``."""

def shards_verify(data: Buffer, plan: ShardPlan, index: int, threads: int | None = None) -> None:
    """ValueError unless ``data`` (read in place) is shard ``index`` of ``plan``."""

def shards_store(
    dir: _Path, data: bytes | bytearray, plan: ShardPlan, index: int, threads: int | None = None
) -> Path:
    """Verifies shard ``index`` and writes it atomically under ``dir``; its path."""

def shards_split(
    path: _Path, out_dir: _Path, plan: ShardPlan, threads: int | None = None
) -> None: ...
def shards_missing(dir: _Path, plan: ShardPlan, threads: int | None = None) -> list[int]:
    """Indexes of the shards under ``dir`` that are absent or do not verify."""

def shards_reassemble(
    dir: _Path, out: _Path, plan: ShardPlan, threads: int | None = None
) -> None: ...

# -- delta ------------------------------------------------------------------------

DELTA_MAGIC: bytes
DELTA_FORMAT_VERSION: int
DELTA_MAX_HEADER: int
DELTA_MAX_SAFETENSORS_HEADER: int
DELTA_MIN_LEVEL: int
DELTA_MAX_LEVEL: int

@final
class DeltaStats:
    """What ``delta_encode`` did."""

    @property
    def target_bytes(self) -> int: ...
    @property
    def delta_bytes(self) -> int: ...
    @property
    def tensors(self) -> int: ...
    @property
    def xor_tensors(self) -> int: ...
    @property
    def sparse_tensors(self) -> int: ...
    @property
    def changed_elements(self) -> int: ...
    @property
    def total_elements(self) -> int: ...
    @property
    def seconds(self) -> float: ...

@final
class DeltaTensor:
    """One tensor's record in a delta; hashes are hex."""

    @property
    def name(self) -> str: ...
    @property
    def encoding(self) -> Literal["xor", "sparse"]: ...
    @property
    def element_size(self) -> int: ...
    @property
    def length(self) -> int: ...
    @property
    def offset(self) -> int: ...
    @property
    def compressed(self) -> int: ...
    @property
    def blake3(self) -> str: ...

@final
class DeltaInfo:
    """What a delta holds, from its header; hashes are hex."""

    @property
    def base_blake3(self) -> str: ...
    @property
    def target_blake3(self) -> str: ...
    @property
    def target_size(self) -> int: ...
    @property
    def delta_size(self) -> int: ...
    @property
    def tensors(self) -> tuple[DeltaTensor, ...]: ...
    @property
    def tensor_count(self) -> int: ...

def delta_encode(
    base: _Path, target: _Path, out: _Path, level: int = 3, threads: int | None = None
) -> DeltaStats:
    """Writes the delta of ``target`` against ``base`` at ``out``, atomically."""

def delta_apply(base: _Path, delta: _Path, out: _Path, threads: int | None = None) -> None:
    """Rebuilds the target at ``out``, atomically, checking every hash the delta carries."""

def delta_inspect(delta: _Path) -> DeltaInfo:
    """The checked header of the delta at ``delta``."""
