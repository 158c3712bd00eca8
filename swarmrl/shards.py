"""Checkpoint shards: fixed-size pieces of a file, hashed with BLAKE3 by the native core.

A checkpoint of ``file_size`` bytes is cut into ``shard_size``-byte shards
(64 MiB by default), all full except perhaps the last; empty files are
rejected. Each shard is hashed with BLAKE3 and a Merkle root binds the list:
leaf = BLAKE3(0x00 || shard hash), node = BLAKE3(0x01 || left || right), an odd
last node promoted unchanged, the root of one shard its leaf.

A :class:`Manifest` records all of it, and its canonical JSON
(:meth:`Manifest.to_json`) is what gets signed and broadcast. A node that has
the manifest verifies every shard before keeping it (:func:`verify_shard`,
:func:`store_shard`), finds what is still missing after a crash
(:func:`missing_shards`) and rebuilds the file (:func:`reassemble`). Shard
files are named by :func:`shard_file_name`.

Files are streamed through two 4 MiB buffers, the next block read while the
current one is hashed, so memory does not grow with file or shard size. Files
are written under a hidden temporary name, synced, and renamed into place only
once verified: an error never leaves a partial file.

Bad content raises ``ValueError``, a missing shard ``FileNotFoundError``, any
other I/O failure ``OSError``. ``threads`` defaults to all cores (or
``RAYON_NUM_THREADS``); the GIL is released while hashing.
"""

from __future__ import annotations

import json
import os
import re
import reprlib
from collections.abc import Sequence
from functools import cached_property
from pathlib import Path
from typing import Any

import pydantic_core
from pydantic import Field, ValidationError, field_validator, model_validator

from swarmrl import _native
from swarmrl.schema import Hex32, Strict, error_location

__all__ = [
    "DEFAULT_SHARD_SIZE",
    "MANIFEST_VERSION",
    "MAX_MANIFEST_BYTES",
    "MAX_SHARD_SIZE",
    "Manifest",
    "build_manifest",
    "inclusion_proof",
    "intact_shards",
    "merkle_root",
    "missing_shards",
    "read_shard",
    "reassemble",
    "shard_file_name",
    "shard_range",
    "split",
    "store_shard",
    "verify_inclusion",
    "verify_shard",
]

MANIFEST_VERSION = 1
DEFAULT_SHARD_SIZE = 64 * 1024 * 1024
MAX_SHARD_SIZE: int = _native.SHARDS_MAX_SHARD_SIZE
# About 60,000 shards: 3.8 TiB of checkpoint at the default shard size.
MAX_MANIFEST_BYTES = 4 * 1024 * 1024
# Integers stay exact in every JSON reader, JavaScript's included.
_MAX_JSON_INT = 2**53 - 1
_HEX_HASH = re.compile(r"[0-9a-f]{64}")

BytesLike = bytes | bytearray | memoryview
StrPath = str | os.PathLike[str]


class Manifest(Strict):
    """What a checkpoint is: its size, how it is cut, every shard's hash and their root.

    Instances are immutable and always consistent: the hash count matches the
    layout and ``root`` is the Merkle root of ``shard_hashes``.
    """

    version: int = MANIFEST_VERSION
    model: str = Field(min_length=1, max_length=256)
    step: int = Field(ge=0, le=_MAX_JSON_INT)
    file_name: str = Field(min_length=1, max_length=255)
    file_size: int = Field(ge=1, le=_MAX_JSON_INT)
    shard_size: int = Field(ge=1, le=MAX_SHARD_SIZE)
    shard_hashes: tuple[Hex32, ...]
    root: Hex32

    @field_validator("version", mode="before")
    @classmethod
    def _known_version(cls, value: Any) -> Any:
        return _check_version(value)

    @field_validator("shard_hashes", mode="before")
    @classmethod
    def _list_to_tuple(cls, value: Any) -> Any:
        # JSON has arrays only; strict mode would otherwise refuse a list for a tuple.
        return tuple(value) if isinstance(value, list) else value

    @field_validator("model", "file_name")
    @classmethod
    def _encodable(cls, value: str) -> str:
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            raise ValueError("must be valid Unicode (no lone surrogates)") from None
        return value

    @field_validator("file_name")
    @classmethod
    def _plain_name(cls, value: str) -> str:
        if value in (".", "..") or any(c in value for c in "/\\\0"):
            raise ValueError(f"must be a plain file name, not {reprlib.repr(value)}")
        return value

    @model_validator(mode="after")
    def _consistent(self) -> Manifest:
        count = -(-self.file_size // self.shard_size)
        if len(self.shard_hashes) != count:
            raise ValueError(
                f"a {self.file_size}-byte file in {self.shard_size}-byte shards has {count} "
                f"shards, but the manifest lists {len(self.shard_hashes)} hashes"
            )
        if merkle_root(self.shard_hashes) != self.root:
            raise ValueError("root is not the Merkle root of shard_hashes")
        return self

    @property
    def shard_count(self) -> int:
        return len(self.shard_hashes)

    @cached_property
    def plan(self) -> _native.ShardPlan:
        """This manifest as the native core checks shards against it, built once."""
        return _native.ShardPlan(
            self.file_size, self.shard_size, _pack(self.shard_hashes), bytes.fromhex(self.root)
        )

    def to_json(self) -> bytes:
        """The canonical bytes: sorted keys, no whitespace, UTF-8. Equal manifests give
        equal bytes, so these are what gets signed. (For this schema, all integers and
        ASCII keys, the form coincides with RFC 8785 JSON canonicalization.)"""
        return json.dumps(
            self.model_dump(), sort_keys=True, separators=(",", ":"), ensure_ascii=False
        ).encode("utf-8")

    @classmethod
    def from_json(cls, data: bytes) -> Manifest:
        """Parses untrusted bytes. Anything but a well-formed, consistent manifest in
        canonical form raises ValueError with one sentence saying what is wrong."""
        if len(data) > MAX_MANIFEST_BYTES:
            raise ValueError(
                f"manifest is {len(data)} bytes, more than the {MAX_MANIFEST_BYTES} allowed"
            )
        try:
            text = bytes(data).decode("utf-8")
        except UnicodeDecodeError:
            raise ValueError("manifest is not valid UTF-8") from None
        try:
            # pydantic-core's parser caps nesting itself; json.loads relies on the
            # interpreter's recursion limit, which web3 raises to 100000, far past
            # what the C stack survives.
            obj = pydantic_core.from_json(text)
        except ValueError:
            raise ValueError("manifest is not valid JSON") from None
        if not isinstance(obj, dict):
            raise ValueError("manifest must be a JSON object")
        # The version decides how to read the rest, so it is checked first.
        if "version" not in obj:
            raise ValueError("manifest has no version")
        _check_version(obj["version"])
        try:
            manifest = cls.model_validate(obj)
        except ValidationError as e:
            raise ValueError(_one_sentence(e)) from None
        # One manifest, one byte string: no second encoding may carry the same signature.
        if manifest.to_json() != data:
            raise ValueError("manifest is not in canonical form (sorted keys, no whitespace)")
        return manifest


def _check_version(value: Any) -> int:
    if type(value) is not int or value != MANIFEST_VERSION:
        raise ValueError(
            f"unsupported manifest version {reprlib.repr(value)}; "
            f"this build reads version {MANIFEST_VERSION}"
        )
    return value


def _one_sentence(error: ValidationError) -> str:
    msg = error.errors()[0]["msg"].removeprefix("Value error, ")
    field = error_location(error, "")
    return f"invalid manifest field {field}: {msg}" if field else f"invalid manifest: {msg}"


def _pack(hex_hashes: Sequence[str]) -> bytes:
    return b"".join(bytes.fromhex(h) for h in hex_hashes)


def _unpack(blob: bytes) -> tuple[str, ...]:
    return tuple(blob[i : i + 32].hex() for i in range(0, len(blob), 32))


def _hash_bytes(value: str, what: str) -> bytes:
    if not isinstance(value, str) or not _HEX_HASH.fullmatch(value):
        raise ValueError(f"{what} must be 64 lowercase hex characters")
    return bytes.fromhex(value)


def _as_bytes(data: BytesLike) -> bytes | bytearray:
    return bytes(data) if isinstance(data, memoryview) else data


def merkle_root(shard_hashes: Sequence[str]) -> str:
    """The Merkle root (hex) over hex shard hashes; there must be at least one."""
    for h in shard_hashes:
        _hash_bytes(h, "a shard hash")
    return _native.shards_merkle_root(_pack(shard_hashes)).hex()


def shard_file_name(index: int) -> str:
    """The name of shard ``index``'s file in a shard directory."""
    if type(index) is not int or index < 0:
        raise ValueError(f"shard index must be a non-negative int, not {reprlib.repr(index)}")
    return _native.shards_file_name(index)


def build_manifest(
    path: StrPath,
    *,
    model: str,
    step: int,
    shard_size: int = DEFAULT_SHARD_SIZE,
    threads: int | None = None,
) -> Manifest:
    """Hashes the checkpoint at ``path``, streaming, and describes it in a manifest."""
    if type(shard_size) is not int or not 1 <= shard_size <= MAX_SHARD_SIZE:
        raise ValueError(f"shard_size must be between 1 and {MAX_SHARD_SIZE} bytes")
    path = Path(path)
    blob, file_size = _native.shards_hash_file(path, shard_size, threads)
    hashes = _unpack(blob)
    return Manifest(
        model=model,
        step=step,
        file_name=path.name,
        file_size=file_size,
        shard_size=shard_size,
        shard_hashes=hashes,
        root=merkle_root(hashes),
    )


def intact_shards(path: StrPath, manifest: Manifest, threads: int | None = None) -> bytearray:
    """Which shards of the whole checkpoint at ``path`` match ``manifest``: one byte per
    shard, 1 where its hash matches; all 0 when the file has another size."""
    blob, size = _native.shards_hash_file(Path(path), manifest.shard_size, threads)
    if size != manifest.file_size:
        return bytearray(manifest.shard_count)
    found = _unpack(blob)
    return bytearray(int(h == want) for h, want in zip(found, manifest.shard_hashes, strict=True))


def shard_range(manifest: Manifest, index: int) -> tuple[int, int]:
    """The byte offset and length of shard ``index`` in the checkpoint."""
    if type(index) is not int or not 0 <= index < manifest.shard_count:
        raise ValueError(
            f"shard index {reprlib.repr(index)} is out of range: "
            f"there are {manifest.shard_count} shards"
        )
    offset = index * manifest.shard_size
    return offset, min(manifest.shard_size, manifest.file_size - offset)


def verify_shard(
    manifest: Manifest, index: int, data: BytesLike, *, threads: int | None = None
) -> None:
    """Raises ValueError unless ``data`` is exactly shard ``index`` of the manifest.
    ``data`` is read in place, without a copy; it must not change during the call."""
    shard_range(manifest, index)
    _native.shards_verify(data, manifest.plan, index, threads)


def read_shard(
    path: StrPath, manifest: Manifest, index: int, *, threads: int | None = None
) -> bytes:
    """Shard ``index`` read from the whole checkpoint at ``path``, verified, so a peer
    never serves bytes that do not match the manifest."""
    offset, length = shard_range(manifest, index)
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        if size != manifest.file_size:
            raise ValueError(f"{path} is {size} bytes but the manifest says {manifest.file_size}")
        f.seek(offset)
        data = f.read(length)
    verify_shard(manifest, index, data, threads=threads)
    return data


def split(
    path: StrPath, out_dir: StrPath, manifest: Manifest, *, threads: int | None = None
) -> None:
    """Writes the checkpoint at ``path`` into ``out_dir`` (created if needed) as one file
    per shard, each checked against the manifest. Shard files left by an error are
    complete and verified."""
    Path(out_dir).mkdir(parents=True, exist_ok=True)
    _native.shards_split(Path(path), Path(out_dir), manifest.plan, threads)


def store_shard(
    shard_dir: StrPath,
    manifest: Manifest,
    index: int,
    data: BytesLike,
    *,
    threads: int | None = None,
) -> Path:
    """Verifies ``data`` as shard ``index`` and only then writes it into ``shard_dir``
    (created if needed), atomically, replacing any file there. Returns its path."""
    shard_range(manifest, index)
    Path(shard_dir).mkdir(parents=True, exist_ok=True)
    return _native.shards_store(Path(shard_dir), _as_bytes(data), manifest.plan, index, threads)


def missing_shards(
    shard_dir: StrPath, manifest: Manifest, *, threads: int | None = None
) -> list[int]:
    """The shard indices ``shard_dir`` does not hold intact (absent, wrong size, or
    wrong hash), in order: what a node resuming a download still has to fetch."""
    return _native.shards_missing(Path(shard_dir), manifest.plan, threads)


def reassemble(
    shard_dir: StrPath, manifest: Manifest, out_path: StrPath, *, threads: int | None = None
) -> Path:
    """Rebuilds the checkpoint from ``shard_dir`` at ``out_path`` (its directory created
    if needed), replacing any file there. Every shard is re-hashed while copied and the
    root checked before the file appears; on a mismatch ``out_path`` is left as it was
    and the error names the bad shard."""
    out = Path(out_path)
    out.parent.mkdir(parents=True, exist_ok=True)
    _native.shards_reassemble(Path(shard_dir), out, manifest.plan, threads)
    return out


def inclusion_proof(manifest: Manifest, index: int) -> list[str]:
    """The sibling hashes (hex, leaf to root) proving shard ``index`` is under the root:
    enough for a peer that knows only the root to check one shard."""
    shard_range(manifest, index)
    return list(_unpack(_native.shards_inclusion_proof(_pack(manifest.shard_hashes), index)))


def verify_inclusion(
    root: str, shard_count: int, index: int, shard_hash: str, proof: Sequence[str]
) -> None:
    """Raises ValueError unless ``proof`` shows ``shard_hash`` is shard ``index`` of
    ``shard_count`` under ``root``."""
    if type(shard_count) is not int or type(index) is not int or not 0 <= index < shard_count:
        raise ValueError(f"shard index {index!r} is out of range for {shard_count!r} shards")
    _native.shards_verify_inclusion(
        _hash_bytes(root, "root"),
        shard_count,
        index,
        _hash_bytes(shard_hash, "shard hash"),
        b"".join(_hash_bytes(h, "each proof hash") for h in proof),
    )
