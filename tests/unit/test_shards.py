"""swarmrl.shards on real files, cross-checked against the blake3 PyPI package."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import blake3
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from swarmrl import shards
from swarmrl.shards import Manifest

MIB = 1024 * 1024


def pattern(n: int, seed: int = 0) -> bytes:
    """Deterministic bytes that differ from shard to shard."""
    return bytes((i * 31 + seed + (i >> 8)) % 251 for i in range(n))


def checkpoint(tmp_path: Path, data: bytes, name: str = "model.safetensors") -> Path:
    path = tmp_path / name
    path.write_bytes(data)
    return path


def reference_hashes(data: bytes, shard_size: int) -> list[str]:
    return [
        blake3.blake3(data[i : i + shard_size]).hexdigest() for i in range(0, len(data), shard_size)
    ]


def reference_root(hashes: list[bytes]) -> bytes:
    """RFC 6962's recursive shape (left subtree = largest power of two below n), which is
    what pairing level by level with odd nodes promoted produces."""
    if len(hashes) == 1:
        return blake3.blake3(b"\x00" + hashes[0]).digest()
    k = 1 << ((len(hashes) - 1).bit_length() - 1)
    return blake3.blake3(b"\x01" + reference_root(hashes[:k]) + reference_root(hashes[k:])).digest()


def manifest_for(tmp_path: Path, data: bytes, shard_size: int) -> tuple[Path, Manifest]:
    path = checkpoint(tmp_path, data)
    return path, shards.build_manifest(path, model="org/model", step=7, shard_size=shard_size)


def leftovers(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir())


def one_sentence(e: pytest.ExceptionInfo[BaseException]) -> str:
    msg = str(e.value)
    assert msg
    assert "\n" not in msg, msg
    return msg


# --- hashing and the manifest -----------------------------------------------------------


@pytest.mark.parametrize("threads", [None, 1, 2])
@pytest.mark.parametrize("shard_size", [MIB, 5 * MIB + 1])  # below and above the 4 MiB block
def test_shard_hashes_equal_the_blake3_package(tmp_path, threads, shard_size):
    data = os.urandom(11 * MIB + 12345)
    path = checkpoint(tmp_path, data)
    manifest = shards.build_manifest(
        path, model="org/model", step=7, shard_size=shard_size, threads=threads
    )
    assert manifest.shard_hashes == tuple(reference_hashes(data, shard_size))
    assert manifest.files == (shards.FileEntry(name=path.name, size=len(data)),)
    assert manifest.size == len(data)


@pytest.mark.parametrize("count", [*range(1, 18), 31, 32, 33, 100])
def test_merkle_root_matches_an_independent_construction(count):
    raw = [blake3.blake3(i.to_bytes(4, "little")).digest() for i in range(count)]
    assert shards.merkle_root([h.hex() for h in raw]) == reference_root(raw).hex()


def test_merkle_root_small_cases_by_hand():
    a, b, c = (blake3.blake3(bytes([i])).digest() for i in range(3))

    def leaf(h: bytes) -> bytes:
        return blake3.blake3(b"\x00" + h).digest()

    def node(left: bytes, right: bytes) -> bytes:
        return blake3.blake3(b"\x01" + left + right).digest()

    assert shards.merkle_root([a.hex()]) == leaf(a).hex()
    assert shards.merkle_root([a.hex(), b.hex()]) == node(leaf(a), leaf(b)).hex()
    three = node(node(leaf(a), leaf(b)), leaf(c))
    assert shards.merkle_root([a.hex(), b.hex(), c.hex()]) == three.hex()
    with pytest.raises(ValueError, match="at least one"):
        shards.merkle_root([])


def test_manifest_round_trips_with_stable_canonical_bytes(tmp_path):
    path = checkpoint(tmp_path, pattern(1000))
    manifest = shards.build_manifest(path, model="Qwen/Qwen3-0.6B é", step=3, shard_size=300)
    data = manifest.to_json()
    assert data == manifest.to_json()
    assert Manifest.from_json(data) == manifest
    assert Manifest.from_json(data).to_json() == data
    assert "é".encode() in data  # UTF-8, not \u escapes
    assert data == json.dumps(
        json.loads(data), sort_keys=True, separators=(",", ":"), ensure_ascii=False
    ).encode("utf-8")
    assert json.loads(data)["version"] == 2
    rebuilt = Manifest(**json.loads(data))
    assert rebuilt.to_json() == data


def test_a_delta_link_is_part_of_the_signed_bytes_and_absent_when_none(tmp_path):
    manifest = shards.build_manifest(checkpoint(tmp_path, pattern(1000)), model="m", step=3)
    assert b"delta" not in manifest.to_json()
    link = {"base": "ab" * 32, "manifest": "cd" * 32}
    linked = Manifest.model_validate({**manifest.model_dump(), "delta": link})
    assert Manifest.from_json(linked.to_json()) == linked
    assert linked.to_json() != manifest.to_json()
    with_null = json.loads(manifest.to_json()) | {"delta": None}
    with pytest.raises(ValueError, match="not in canonical form"):
        Manifest.from_json(json.dumps(with_null, sort_keys=True, separators=(",", ":")).encode())
    bad = json.loads(linked.to_json())
    bad["delta"]["base"] = "AB" * 32
    with pytest.raises(ValueError, match=r"^invalid manifest field delta\.base"):
        Manifest.from_json(json.dumps(bad, sort_keys=True, separators=(",", ":")).encode())


def test_manifest_is_immutable_and_strict():
    with pytest.raises(ValueError, match="frozen"):
        SMALL_MANIFEST.step = 8  # type: ignore[misc]
    assert isinstance(SMALL_MANIFEST.shard_hashes, tuple)
    fields = SMALL_MANIFEST.model_dump()
    for change in ({"version": True}, {"version": 1.0}, {"step": True}, {"shard_size": "10"}):
        with pytest.raises(ValueError, match=next(iter(change))):
            Manifest(**(fields | change))


@pytest.mark.parametrize(
    ("file_size", "shard_size"),
    [(1, 1), (1, shards.DEFAULT_SHARD_SIZE), (10, 1), (12, 4), (13, 4), (4, 4), (3, 4), (8, 3)],
)
def test_boundary_sizes(tmp_path, file_size, shard_size):
    data = pattern(file_size)
    path, manifest = manifest_for(tmp_path, data, shard_size)
    count = -(-file_size // shard_size)
    assert manifest.shard_count == count
    assert manifest.shard_hashes == tuple(reference_hashes(data, shard_size))
    ranges = [shards.shard_range(manifest, i) for i in range(count)]
    assert ranges[0][0] == 0
    assert sum(length for _, length in ranges) == file_size
    assert all(length == shard_size for _, length in ranges[:-1])
    for i, (offset, length) in enumerate(ranges):
        shard = shards.read_shard(path, manifest, i)
        assert shard == data[offset : offset + length]
        shards.verify_shard(manifest, i, shard)
    store = tmp_path / "store"
    shards.split(path, store, manifest)
    assert leftovers(store) == [shards.shard_file_name(i) for i in range(count)]
    out = shards.reassemble(store, manifest, tmp_path / "out.bin")
    assert out == tmp_path / "out.bin"
    assert out.read_bytes() == data


def test_empty_file_and_bad_shard_sizes_are_rejected(tmp_path):
    empty = checkpoint(tmp_path, b"")
    with pytest.raises(ValueError, match="empty") as e:
        shards.build_manifest(empty, model="m", step=0)
    one_sentence(e)
    path = checkpoint(tmp_path, b"x", "x.bin")
    for size in (0, -1, shards.MAX_SHARD_SIZE + 1, 1.5):
        with pytest.raises(ValueError, match="shard_size"):
            shards.build_manifest(path, model="m", step=0, shard_size=size)  # type: ignore[arg-type]
    with pytest.raises(FileNotFoundError, match="nope"):
        shards.build_manifest(tmp_path / "nope", model="m", step=0)
    with pytest.raises(ValueError, match="is empty"):  # a directory: its files, one empty
        shards.build_manifest(tmp_path, model="m", step=0)


# --- verifying and reassembling ----------------------------------------------------------


@pytest.mark.parametrize("bad", range(4))
def test_a_flipped_byte_is_caught_and_leaves_nothing(tmp_path, bad):
    data = pattern(1000)
    path, manifest = manifest_for(tmp_path, data, 300)
    store = tmp_path / "store"
    shards.split(path, store, manifest)
    shard_file = store / shards.shard_file_name(bad)
    corrupt = bytearray(shard_file.read_bytes())
    corrupt[len(corrupt) // 2] ^= 0x01
    with pytest.raises(ValueError, match=f"shard {bad} ") as e:
        shards.verify_shard(manifest, bad, corrupt)
    one_sentence(e)
    shard_file.write_bytes(corrupt)

    out_dir = tmp_path / "out"
    out_dir.mkdir()
    previous = out_dir / "model.safetensors"
    previous.write_bytes(b"the previous checkpoint")
    with pytest.raises(ValueError, match=f"shard {bad} does not match") as e:
        shards.reassemble(store, manifest, previous)
    one_sentence(e)
    assert leftovers(out_dir) == ["model.safetensors"]
    assert previous.read_bytes() == b"the previous checkpoint"
    assert shards.missing_shards(store, manifest) == [bad]


def test_verify_shard_rejects_wrong_length_and_bad_index(tmp_path):
    data = pattern(10)
    _, manifest = manifest_for(tmp_path, data, 4)
    with pytest.raises(ValueError, match="shard 2 is 3 bytes, expected 2"):
        shards.verify_shard(manifest, 2, data[7:])
    with pytest.raises(ValueError, match="shard 0 is 0 bytes"):
        shards.verify_shard(manifest, 0, b"")
    for index in (-1, 3, True, "0", 1.0):
        with pytest.raises(ValueError, match="out of range"):
            shards.verify_shard(manifest, index, data[:4])  # type: ignore[arg-type]
    shards.verify_shard(manifest, 1, memoryview(data)[4:8])
    shards.verify_shard(manifest, 1, bytearray(data[4:8]), threads=1)


def test_a_missing_shard_is_named_and_nothing_is_written(tmp_path):
    data = pattern(1000)
    path, manifest = manifest_for(tmp_path, data, 300)
    store = tmp_path / "store"
    shards.split(path, store, manifest)
    (store / shards.shard_file_name(1)).unlink()
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    with pytest.raises(FileNotFoundError, match=r"shard 1 is missing: .*000001\.shard") as e:
        shards.reassemble(store, manifest, out_dir / "model.safetensors")
    one_sentence(e)
    assert leftovers(out_dir) == []


def test_a_truncated_shard_is_named(tmp_path):
    data = pattern(1000)
    path, manifest = manifest_for(tmp_path, data, 300)
    store = tmp_path / "store"
    shards.split(path, store, manifest)
    last = store / shards.shard_file_name(3)
    last.write_bytes(last.read_bytes()[:-1])
    with pytest.raises(ValueError, match="shard 3 is 99 bytes, expected 100"):
        shards.reassemble(store, manifest, tmp_path / "out.bin")
    assert not (tmp_path / "out.bin").exists()


def test_a_node_resumes_from_the_shards_it_has(tmp_path):
    data = os.urandom(5000)
    path, manifest = manifest_for(tmp_path, data, 1024)
    store = tmp_path / "node"
    assert shards.missing_shards(store, manifest) == [0, 1, 2, 3, 4]
    for i in (0, 3):
        shards.store_shard(store, manifest, i, shards.read_shard(path, manifest, i))
    (store / shards.shard_file_name(4)).write_bytes(b"half a shard from a crash")
    assert shards.missing_shards(store, manifest) == [1, 2, 4]
    for i in shards.missing_shards(store, manifest):
        written = shards.store_shard(store, manifest, i, shards.read_shard(path, manifest, i))
        assert written == store / shards.shard_file_name(i)
    assert shards.missing_shards(store, manifest) == []
    out = shards.reassemble(store, manifest, tmp_path / "pulled" / "model.safetensors")
    assert out.read_bytes() == data
    assert leftovers(store) == [shards.shard_file_name(i) for i in range(5)]
    assert shards.shard_file_name(4) == "000004.shard"
    assert shards.shard_file_name(1234567) == "1234567.shard"
    with pytest.raises(ValueError, match="non-negative"):
        shards.shard_file_name(-1)


def test_intact_shards_marks_each_shard_of_a_whole_file_that_matches(tmp_path):
    data = bytearray(os.urandom(5000))
    path, manifest = manifest_for(tmp_path, bytes(data), 1024)
    assert shards.intact_shards(path, manifest) == bytearray([1, 1, 1, 1, 1])
    data[1024] ^= 1  # shard 1
    data[4999] ^= 1  # shard 4, the short last one
    path.write_bytes(data)
    assert shards.intact_shards(path, manifest) == bytearray([1, 0, 1, 1, 0])
    path.write_bytes(bytes(data[:4000]))  # another size: nothing in it can be trusted
    assert shards.intact_shards(path, manifest) == bytearray(5)


def test_store_shard_writes_only_verified_bytes(tmp_path):
    data = pattern(10)
    _, manifest = manifest_for(tmp_path, data, 4)
    store = tmp_path / "store"
    with pytest.raises(ValueError, match="shard 1 does not match"):
        shards.store_shard(store, manifest, 1, data[:4])
    with pytest.raises(ValueError, match="out of range"):
        shards.store_shard(store, manifest, 5, data[:4])
    assert leftovers(store) == []


def test_split_refuses_a_different_file(tmp_path):
    data = pattern(1000)
    _, manifest = manifest_for(tmp_path, data, 300)
    other = checkpoint(tmp_path, data[:-1] + b"\x00", "other.bin")
    with pytest.raises(ValueError, match="shard 3 does not match"):
        shards.split(other, tmp_path / "store", manifest)
    assert leftovers(tmp_path / "store") == [shards.shard_file_name(i) for i in range(3)]
    shorter = checkpoint(tmp_path, data[:-1], "shorter.bin")
    with pytest.raises(ValueError, match="999 bytes, expected 1000"):
        shards.split(shorter, tmp_path / "store2", manifest)
    with pytest.raises(ValueError, match="999 bytes but the manifest says 1000"):
        shards.read_shard(shorter, manifest, 0)


def test_inclusion_proofs(tmp_path):
    _, manifest = manifest_for(tmp_path, pattern(5000), 1000)
    n = manifest.shard_count
    for i, h in enumerate(manifest.shard_hashes):
        proof = shards.inclusion_proof(manifest, i)
        shards.verify_inclusion(manifest.root, n, i, h, proof)
        other = manifest.shard_hashes[(i + 1) % n]
        with pytest.raises(ValueError, match="does not lead to the Merkle root"):
            shards.verify_inclusion(manifest.root, n, i, other, proof)
        with pytest.raises(ValueError, match="does not lead"):
            shards.verify_inclusion(manifest.root, n, i, h, [*proof, h])
    with pytest.raises(ValueError, match="out of range"):
        shards.verify_inclusion(manifest.root, n, n, manifest.shard_hashes[0], [])
    with pytest.raises(ValueError, match="64 lowercase hex"):
        shards.verify_inclusion(manifest.root, n, 0, manifest.shard_hashes[0], ["zz"])


# --- parsing untrusted manifests ---------------------------------------------------------


SMALL = pattern(10)
SMALL_MANIFEST = Manifest(
    model="org/model",
    step=7,
    files=(shards.FileEntry(name="model.safetensors", size=len(SMALL)),),
    shard_size=4,
    shard_hashes=tuple(reference_hashes(SMALL, 4)),
    root=reference_root([bytes.fromhex(h) for h in reference_hashes(SMALL, 4)]).hex(),
)


FILE = {"name": "model.safetensors", "size": len(SMALL)}


def file(**change: object) -> dict:
    """A change to the manifest's one file."""
    return {"files": [FILE | change]}


def valid_fields() -> dict:
    return json.loads(SMALL_MANIFEST.to_json())


def encode(fields: dict) -> bytes:
    return json.dumps(fields, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"version": 1}, "unsupported manifest version 1"),
        ({"version": "1"}, "unsupported manifest version '1'"),
        ({"version": True}, "unsupported manifest version True"),
        ({"version": None}, "unsupported manifest version None"),
        ({"step": -1}, "step"),
        ({"step": True}, "step"),
        ({"step": 1.0}, "step"),
        ({"step": 2**53}, "step"),
        ({"model": ""}, "model"),
        (file(size=8), "have 2 shards, but the manifest lists 3"),
        (file(size=13), "have 4 shards, but the manifest lists 3"),
        ({"files": []}, "files"),
        ({"files": [FILE, FILE]}, "two files have the same name"),
        ({"shard_size": 0}, "shard_size"),
        ({"shard_size": 5}, "lists 3"),
        ({"root": "0" * 64}, "root is not the Merkle root"),
        ({"root": "A" * 64}, "root"),
        ({"shard_hashes": []}, "lists 0"),
        ({"shard_hashes": "ab"}, "shard_hashes"),
        ({"shard_hashes": ["ab", "cd", "ef"]}, "shard_hashes.0"),
        (file(name="etc/passwd"), "plain file name"),
        (file(name=".."), "must not start with '.'"),
        (file(name="a\\b"), "plain file name"),
        (file(name="model.partial"), "end in .partial"),
        (file(name=""), "files.0.name"),
        ({"extra": 1}, "extra"),
    ],
)
def test_from_json_rejects_bad_fields(tmp_path, change, message):
    fields = valid_fields() | change
    with pytest.raises(ValueError, match=message) as e:
        Manifest.from_json(encode(fields))
    one_sentence(e)


def test_from_json_rejects_bad_documents(tmp_path):
    fields = valid_fields()
    good = encode(fields)
    hashes = fields["shard_hashes"]
    cases = {
        b"": "not valid JSON",
        b"\xff\xfe": "not valid UTF-8",
        b"[1, 2]": "must be a JSON object",
        b"{" * 100_000: "not valid JSON",
        b"[" * 100_000 + b"]" * 100_000: "not valid JSON",
        b"{}": "no version",
        json.dumps(fields, sort_keys=True).encode(): "canonical",
        json.dumps(dict(reversed(fields.items())), separators=(",", ":")).encode(): "canonical",
        good[:-1] + b',"step":7}': "canonical",
        good.replace(hashes[0].encode(), hashes[0].upper().encode()): "shard_hashes.0",
        good + b"\n": "canonical",
        b" " * (shards.MAX_MANIFEST_BYTES + 1): "more than",
    }
    for data, message in cases.items():
        with pytest.raises(ValueError, match=message) as e:
            Manifest.from_json(data)
        one_sentence(e)
    assert Manifest.from_json(bytearray(good)).to_json() == good


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
    max_leaves=12,
)


@settings(max_examples=300)
@given(data=st.binary(max_size=512))
def test_from_json_fuzz_raises_only_value_error(data):
    with contextlib.suppress(ValueError):
        Manifest.from_json(data)


@settings(max_examples=300)
@given(
    changes=st.dictionaries(
        st.sampled_from(
            [
                "version",
                "model",
                "step",
                "files",
                "shard_size",
                "shard_hashes",
                "root",
                "other",
            ]
        ),
        json_values,
        max_size=3,
    ),
    drop=st.sampled_from([None, "model", "root", "shard_hashes"]),
)
def test_from_json_fuzz_near_valid_documents(changes, drop):
    fields = valid_fields() | changes
    fields.pop(drop, None)
    data = encode(fields)
    try:
        manifest = Manifest.from_json(data)
    except ValueError:
        return
    # Whatever is accepted is a consistent manifest whose canonical bytes are the input.
    assert manifest.to_json() == data
    assert manifest.root == SMALL_MANIFEST.root


@settings(max_examples=300)
@given(
    index=st.integers(-3, 6),
    data=st.one_of(st.binary(max_size=8), st.sampled_from([SMALL[:4], SMALL[4:8], SMALL[8:]])),
)
def test_verify_shard_fuzz_accepts_only_the_true_shard(index, data):
    try:
        shards.verify_shard(SMALL_MANIFEST, index, data)
    except ValueError:
        return
    offset, length = shards.shard_range(SMALL_MANIFEST, index)
    assert data == SMALL[offset : offset + length]


# --- streaming -------------------------------------------------------------------------

MEMORY_PROBE = textwrap.dedent(
    """
    import resource, sys
    from pathlib import Path
    from swarmrl import shards

    path, shard_size = Path(sys.argv[1]), int(sys.argv[2])
    def peak_kib():
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    base = peak_kib()
    manifest = shards.build_manifest(path, model="m", step=0, shard_size=shard_size)
    hashed = peak_kib()
    shards.split(path, path.parent / "store", manifest)
    (path.parent / "store" / shards.shard_file_name(5)).unlink()
    shards.store_shard(path.parent / "store", manifest, 5, shards.read_shard(path, manifest, 5))
    shards.reassemble(path.parent / "store", manifest, path.parent / "out.bin")
    print(base, hashed, peak_kib())
    """
)


@pytest.mark.slow
def test_memory_stays_bounded_by_a_few_shards(tmp_path):
    """A 256 MiB file in 8 MiB shards goes through hashing, splitting and reassembly in a
    fresh process whose peak RSS must grow by less than a few shards (the kernel itself
    needs two 4 MiB buffers whatever the sizes; without streaming it would be 256 MiB)."""
    size, shard_size = 256 * MIB, 8 * MIB
    path = tmp_path / "big.bin"
    with path.open("wb") as f:  # sparse apart from a few marks: quick to make
        for offset in range(0, size, 37 * MIB):
            f.seek(offset)
            f.write(b"mark")
        f.truncate(size)
    out = subprocess.run(
        [sys.executable, "-c", MEMORY_PROBE, str(path), str(shard_size)],
        capture_output=True,
        text=True,
        check=True,
    )
    base, hashed, end = (int(x) * 1024 for x in out.stdout.split())
    assert hashed - base < 2 * shard_size
    # Reading one shard into memory to store it accounts for one more.
    assert end - base < 3 * shard_size
    assert (tmp_path / "out.bin").stat().st_size == size


def test_deep_nesting_is_refused_even_under_web3s_recursion_limit():
    # web3 raises the limit to 100000 on import; json.loads would then overflow
    # the C stack on this input and kill the process instead of raising.
    old = sys.getrecursionlimit()
    sys.setrecursionlimit(100_000)
    try:
        with pytest.raises(ValueError, match="not valid JSON"):
            shards.Manifest.from_json(b"[" * 300_000)
    finally:
        sys.setrecursionlimit(old)


# --- a version of several files ---------------------------------------------------------


def test_a_directory_is_a_version_of_its_files_each_cut_on_its_own(tmp_path):
    model = tmp_path / "model"
    model.mkdir()
    contents = {"config.json": pattern(5, 1), "model.safetensors": pattern(23, 2), "z": b"z"}
    for name, data in contents.items():
        (model / name).write_bytes(data)
    (model / "trainer").mkdir()  # a subdirectory is not part of the version
    (model / "trainer" / "state.pt").write_bytes(b"optimizer")
    (model / ".hidden").write_bytes(b"staging")
    manifest = shards.build_manifest(model, model="org/model", step=1, shard_size=10)
    assert [(f.name, f.size) for f in manifest.files] == [(n, len(d)) for n, d in contents.items()]
    expected = [h for d in contents.values() for h in reference_hashes(d, 10)]
    assert list(manifest.shard_hashes) == expected  # 1 + 3 + 1 shards, file by file
    assert [list(manifest.shards_of(i)) for i in range(3)] == [[0], [1, 2, 3], [4]]
    assert [manifest.locate(i) for i in range(5)] == [(0, 0), (1, 0), (1, 1), (1, 2), (2, 0)]
    assert shards.shard_range(manifest, 3) == (20, 3)  # the weights' short last shard
    for index in range(5):
        file, _ = manifest.locate(index)
        name = manifest.files[file].name
        data = shards.read_shard(model / name, manifest, index)
        shards.verify_shard(manifest, index, data)
        with pytest.raises(ValueError, match=f"^{name}: ") as e:
            shards.verify_shard(manifest, index, bytes(len(data)))
        one_sentence(e)
    assert shards.intact_shards(model / "model.safetensors", manifest, 1) == bytearray([1, 1, 1])
    (model / "model.safetensors").write_bytes(pattern(20, 2) + b"xyz")
    assert shards.intact_shards(model / "model.safetensors", manifest, 1) == bytearray([1, 1, 0])
    with pytest.raises(ValueError, match="one-file version"):
        shards.split(model / "z", tmp_path / "store", manifest)
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(ValueError, match="holds no file to publish"):
        shards.build_manifest(empty, model="org/model", step=1)
