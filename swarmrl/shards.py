"""Checkpoint shards: fixed-size pieces of a version's files, hashed with BLAKE3 by the
native core.

A version is one or more files (a model directory: weights, config, tokenizer).
Each file of ``size`` bytes is cut into ``shard_size``-byte shards (64 MiB by
default), all full except perhaps its last; empty files are rejected. Each
shard is hashed with BLAKE3 and a Merkle root binds the list of every file's
shards, in file order: leaf = BLAKE3(0x00 || shard hash), node = BLAKE3(0x01 ||
left || right), an odd last node promoted unchanged, the root of one shard its
leaf. A shard's index names one range of one file (:meth:`Manifest.locate`).

A :class:`Manifest` records all of it, and its canonical JSON
(:meth:`Manifest.to_json`) is what gets signed and broadcast; it may link a
delta of the version (:class:`DeltaLink`, :mod:`swarmrl.weights.delta_versions`). A node that has
the manifest verifies every shard before keeping it (:func:`verify_shard`) and
finds what is intact after a crash (:func:`intact_shards`). A one-file version
can also be kept as a directory of shard files (:func:`split`,
:func:`store_shard`, :func:`missing_shards`, :func:`reassemble`), named by
:func:`shard_file_name`.

Files are streamed through two 4 MiB buffers, the next block read while the
current one is hashed, so memory does not grow with file or shard size. Files
are written under a hidden temporary name, synced, and renamed into place only
once verified: an error never leaves a partial file.

Bad content raises ``ValueError``, a missing shard ``FileNotFoundError``, any
other I/O failure ``OSError``. ``threads`` defaults to all cores (or
``RAYON_NUM_THREADS``); the GIL is released while hashing.
"""

from __future__ import annotations

import bisect
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
    "DeltaLink",
    "FileEntry",
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
    "version_files",
]

MANIFEST_VERSION = 2
# Far more than a model directory holds (weights shards, config, tokenizer files).
MAX_FILES = 256
# A file that is still being fetched; no file of a version may be named so.
PARTIAL_SUFFIX = ".partial"
DEFAULT_SHARD_SIZE = 64 * 1024 * 1024
MAX_SHARD_SIZE: int = _native.SHARDS_MAX_SHARD_SIZE
# About 60,000 shards: 3.8 TiB of checkpoint at the default shard size.
MAX_MANIFEST_BYTES = 4 * 1024 * 1024
# Integers stay exact in every JSON reader, JavaScript's included.
_MAX_JSON_INT = 2**53 - 1
_HEX_HASH = re.compile(r"[0-9a-f]{64}")

BytesLike = bytes | bytearray | memoryview
StrPath = str | os.PathLike[str]


class FileEntry(Strict):
    """One file of a version: its plain name and its size (its shards are the next
    ``ceil(size / shard_size)`` hashes of the manifest's list)."""

    name: str = Field(min_length=1, max_length=255)
    size: int = Field(ge=1, le=_MAX_JSON_INT)

    @field_validator("name")
    @classmethod
    def _plain_name(cls, value: str) -> str:
        _check_encodable(value)
        # A hidden name or the partial suffix would collide with a store's own files.
        if value.startswith(".") or value.endswith(PARTIAL_SUFFIX):
            raise ValueError(f"must not start with '.' or end in {PARTIAL_SUFFIX}")
        if any(c in value for c in "/\\\0"):
            raise ValueError(f"must be a plain file name, not {reprlib.repr(value)}")
        return value


class DeltaLink(Strict):
    """Where a version's delta is: the manifest hash of the version it was made against
    (its base) and of the delta version itself (see :mod:`swarmrl.weights.delta_versions`)."""

    base: Hex32
    manifest: Hex32


class Manifest(Strict):
    """What a version is: its files, how each is cut, every shard's hash and their root.

    Each file is cut into ``shard_size``-byte shards of its own (all full except
    perhaps its last); ``shard_hashes`` lists the first file's shards, then the
    second's, and so on, so a shard's index names one range of one file. Instances
    are immutable and always consistent: the hash count matches the layout and
    ``root`` is the Merkle root of ``shard_hashes``.
    """

    version: int = MANIFEST_VERSION
    model: str = Field(min_length=1, max_length=256)
    step: int = Field(ge=0, le=_MAX_JSON_INT)
    files: tuple[FileEntry, ...] = Field(min_length=1, max_length=MAX_FILES)
    shard_size: int = Field(ge=1, le=MAX_SHARD_SIZE)
    shard_hashes: tuple[Hex32, ...]
    root: Hex32
    # Signed with the rest: a node that holds `base` may fetch the delta instead.
    delta: DeltaLink | None = None

    @field_validator("version", mode="before")
    @classmethod
    def _known_version(cls, value: Any) -> Any:
        return _check_version(value)

    @field_validator("shard_hashes", "files", mode="before")
    @classmethod
    def _list_to_tuple(cls, value: Any) -> Any:
        # JSON has arrays only; strict mode would otherwise refuse a list for a tuple.
        return tuple(value) if isinstance(value, list) else value

    @field_validator("model")
    @classmethod
    def _encodable(cls, value: str) -> str:
        _check_encodable(value)
        return value

    @model_validator(mode="after")
    def _consistent(self) -> Manifest:
        names = [f.name for f in self.files]
        if len(set(names)) != len(names):
            raise ValueError("two files have the same name")
        count = sum(-(-f.size // self.shard_size) for f in self.files)
        if len(self.shard_hashes) != count:
            raise ValueError(
                f"{self.size} bytes in {len(self.files)} file(s) cut in {self.shard_size}-byte "
                f"shards have {count} shards, but the manifest lists "
                f"{len(self.shard_hashes)} hashes"
            )
        if merkle_root(self.shard_hashes) != self.root:
            raise ValueError("root is not the Merkle root of shard_hashes")
        return self

    @property
    def size(self) -> int:
        """The version's bytes, every file together."""
        return sum(f.size for f in self.files)

    @cached_property
    def _first_shards(self) -> tuple[int, ...]:
        """The index of each file's first shard, then the shard count."""
        firsts = [0]
        for f in self.files:
            firsts.append(firsts[-1] + -(-f.size // self.shard_size))
        return tuple(firsts)

    def shards_of(self, file: int) -> range:
        """The shard indices of file number ``file``."""
        return range(self._first_shards[file], self._first_shards[file + 1])

    def locate(self, index: int) -> tuple[int, int]:
        """Which file shard ``index`` belongs to, and its index within that file;
        ValueError for an index out of range."""
        shard_range(self, index)
        return self._locate(index)

    def _locate(self, index: int) -> tuple[int, int]:
        file = bisect.bisect_right(self._first_shards, index) - 1
        return file, index - self._first_shards[file]

    def plan(self, file: int = 0) -> _native.ShardPlan:
        """File ``file`` as the native core checks its shards, built once."""
        return self._plans[file]

    @cached_property
    def _plans(self) -> tuple[_native.ShardPlan, ...]:
        plans = []
        for i, f in enumerate(self.files):
            indices = self.shards_of(i)
            hashes = self.shard_hashes[indices.start : indices.stop]
            # A file's own root: derived from the signed hashes, checked by nobody else.
            plans.append(
                _native.ShardPlan(
                    f.size, self.shard_size, _pack(hashes), bytes.fromhex(merkle_root(hashes))
                )
            )
        return tuple(plans)

    @property
    def shard_count(self) -> int:
        return len(self.shard_hashes)

    def to_json(self) -> bytes:
        """The canonical bytes: sorted keys, no whitespace, UTF-8. Equal manifests give
        equal bytes, so these are what gets signed. (For this schema, all integers and
        ASCII keys, the form coincides with RFC 8785 JSON canonicalization.)"""
        return json.dumps(
            # Absent, not null, when there is no delta: the one canonical form of both.
            self.model_dump(exclude_none=True),
            sort_keys=True,
            separators=(",", ":"),
            ensure_ascii=False,
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


def _check_encodable(value: str) -> None:
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise ValueError("must be valid Unicode (no lone surrogates)") from None


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
    """Hashes the version at ``path``, streaming, and describes it in a manifest: a file,
    or a directory's regular files (its subdirectories and hidden files are not part
    of it), in name order."""
    if type(shard_size) is not int or not 1 <= shard_size <= MAX_SHARD_SIZE:
        raise ValueError(f"shard_size must be between 1 and {MAX_SHARD_SIZE} bytes")
    path = Path(path)
    paths = version_files(path) if path.is_dir() else [path]
    files: list[FileEntry] = []
    hashes: list[str] = []
    for file in paths:
        blob, size = _native.shards_hash_file(file, shard_size, threads)
        files.append(FileEntry(name=file.name, size=size))
        hashes.extend(_unpack(blob))
    return Manifest(
        model=model,
        step=step,
        files=tuple(files),
        shard_size=shard_size,
        shard_hashes=tuple(hashes),
        root=merkle_root(hashes),
    )


def version_files(directory: StrPath) -> list[Path]:
    """The files of ``directory`` a version is made of: its regular, not hidden files in
    name order. ValueError when there is none."""
    directory = Path(directory)
    found = sorted(
        p for p in directory.iterdir() if p.is_file() and not p.is_symlink() and p.name[0] != "."
    )
    if not found:
        raise ValueError(f"{directory} holds no file to publish")
    return found


def intact_shards(
    path: StrPath, manifest: Manifest, file: int = 0, *, threads: int | None = None
) -> bytearray:
    """Which shards of file number ``file`` of the manifest, read at ``path``, match
    it: one byte per shard of that file, 1 where its hash matches; all 0 when the file
    has another size."""
    entry = manifest.files[file]
    blob, size = _native.shards_hash_file(Path(path), manifest.shard_size, threads)
    indices = manifest.shards_of(file)
    wanted = manifest.shard_hashes[indices.start : indices.stop]
    if size != entry.size:
        return bytearray(len(wanted))
    return bytearray(int(h == w) for h, w in zip(_unpack(blob), wanted, strict=True))


def shard_range(manifest: Manifest, index: int) -> tuple[int, int]:
    """The byte offset and length of shard ``index`` in its file."""
    if type(index) is not int or not 0 <= index < manifest.shard_count:
        raise ValueError(
            f"shard index {reprlib.repr(index)} is out of range: "
            f"there are {manifest.shard_count} shards"
        )
    file, local = manifest._locate(index)
    offset = local * manifest.shard_size
    return offset, min(manifest.shard_size, manifest.files[file].size - offset)


def verify_shard(
    manifest: Manifest, index: int, data: BytesLike, *, threads: int | None = None
) -> None:
    """Raises ValueError unless ``data`` is exactly shard ``index`` of the manifest.
    ``data`` is read in place, without a copy; it must not change during the call."""
    file, local = manifest.locate(index)
    try:
        _native.shards_verify(data, manifest.plan(file), local, threads)
    except ValueError as e:
        if len(manifest.files) == 1:
            raise
        raise ValueError(f"{manifest.files[file].name}: {e}") from None


def read_shard(
    path: StrPath, manifest: Manifest, index: int, *, threads: int | None = None
) -> bytes:
    """Shard ``index`` read from its whole file at ``path``, verified, so a peer never
    serves bytes that do not match the manifest."""
    offset, length = shard_range(manifest, index)
    expected = manifest.files[manifest.locate(index)[0]].size
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        if size != expected:
            raise ValueError(f"{path} is {size} bytes but the manifest says {expected}")
        f.seek(offset)
        data = f.read(length)
    verify_shard(manifest, index, data, threads=threads)
    return data


# A shard directory (one file per shard, named by its index) holds the shards of one
# file: the functions below take a one-file manifest.


def _one_file(manifest: Manifest) -> _native.ShardPlan:
    if len(manifest.files) != 1:
        raise ValueError("a shard directory holds the shards of a one-file version")
    return manifest.plan(0)


def split(
    path: StrPath, out_dir: StrPath, manifest: Manifest, *, threads: int | None = None
) -> None:
    """Writes the file at ``path`` into ``out_dir`` (created if needed) as one file
    per shard, each checked against the manifest. Shard files left by an error are
    complete and verified."""
    plan = _one_file(manifest)
    Path(out_dir).mkdir(parents=True, exist_ok=True)
    _native.shards_split(Path(path), Path(out_dir), plan, threads)


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
    plan = _one_file(manifest)
    shard_range(manifest, index)
    Path(shard_dir).mkdir(parents=True, exist_ok=True)
    return _native.shards_store(Path(shard_dir), _as_bytes(data), plan, index, threads)


def missing_shards(
    shard_dir: StrPath, manifest: Manifest, *, threads: int | None = None
) -> list[int]:
    """The shard indices ``shard_dir`` does not hold intact (absent, wrong size, or
    wrong hash), in order: what a node resuming a download still has to fetch."""
    return _native.shards_missing(Path(shard_dir), _one_file(manifest), threads)


def reassemble(
    shard_dir: StrPath, manifest: Manifest, out_path: StrPath, *, threads: int | None = None
) -> Path:
    """Rebuilds the file from ``shard_dir`` at ``out_path`` (its directory created
    if needed), replacing any file there. Every shard is re-hashed while copied and the
    root checked before the file appears; on a mismatch ``out_path`` is left as it was
    and the error names the bad shard."""
    plan = _one_file(manifest)
    out = Path(out_path)
    out.parent.mkdir(parents=True, exist_ok=True)
    _native.shards_reassemble(Path(shard_dir), out, plan, threads)
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
