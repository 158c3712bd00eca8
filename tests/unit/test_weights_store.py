"""swarmrl.weights.store: verified shards on disk, resume, keep-N, byte budget, model dirs."""

from __future__ import annotations

import contextlib
import os
import random
from dataclasses import dataclass
from pathlib import Path

import pytest
from eth_account import Account
from eth_utils import keccak
from hypothesis import given, settings
from hypothesis import strategies as st

from swarmrl import shards
from swarmrl.eip712 import swarm_domain
from swarmrl.shards import Manifest
from swarmrl.weights.peer_records import Announcement
from swarmrl.weights.store import (
    ANNOUNCEMENT_FILE,
    MANIFEST_FILE,
    StoreError,
    Version,
    WeightStore,
    bits,
)

ORIGIN = Account.from_key(keccak(text="swarmrl store origin"))
DOMAIN = swarm_domain(31337, "0x5FbDB2315678afecb367f032d93F642f64180aa3")
SHARD = 4096
SIZE = 3 * SHARD + 100  # four shards, the last one short


@dataclass
class Checkpoint:
    path: Path
    data: bytes
    manifest: Manifest
    announcement: Announcement

    def shard(self, index: int) -> bytes:
        return self.data[index * SHARD : (index + 1) * SHARD]

    @property
    def count(self) -> int:
        return self.manifest.shard_count


def make_checkpoint(
    tmp_path: Path,
    step: int,
    *,
    size: int = SIZE,
    name: str = "model.safetensors",
    data: bytes | None = None,
) -> Checkpoint:
    src = tmp_path / "src" / f"step{step}"
    src.mkdir(parents=True, exist_ok=True)
    path = src / name
    if data is None:
        data = random.Random(step).randbytes(size)
    path.write_bytes(data)
    manifest = shards.build_manifest(path, model="org/model", step=step, shard_size=SHARD)
    return Checkpoint(path, data, manifest, Announcement.sign(ORIGIN, manifest, DOMAIN))


def fetch_all(store: WeightStore, ck: Checkpoint) -> Version:
    version = store.begin(ck.announcement, ck.manifest)
    for i in range(ck.count):
        store.write_shard(version, i, ck.shard(i))
    store.finish(version)
    return version


def partial(version: Version) -> Path:
    """The one file of `version` while it is fetched."""
    return version.files_dir / (version.manifest.files[0].name + ".partial")


def fd(version: Version) -> int:
    return version.locate(0)[0]


def steps(store: WeightStore) -> list[int]:
    return [v.step for v in store.versions()]


@pytest.fixture
def store(tmp_path: Path):
    s = WeightStore(tmp_path / "store")
    yield s
    for v in s.versions():
        v.close()


# ---- fetching one version ----------------------------------------------------------


def test_begin_write_finish_gives_the_identical_file(tmp_path, store):
    ck = make_checkpoint(tmp_path, 1)
    assert ck.count == 4
    version = store.begin(ck.announcement, ck.manifest)
    assert partial(version).stat().st_size == SIZE  # preallocated
    assert (version.held_count, version.complete) == (0, False)
    assert store.latest() is None
    assert store.latest(complete=False) is version
    assert store.begin(ck.announcement, ck.manifest) is version  # one version per hash

    for i in reversed(range(ck.count)):
        assert store.write_shard(version, i, ck.shard(i)) is True
        assert version.holds(i)
    assert store.write_shard(version, 2, ck.shard(2)) is False  # already held

    assert store.finish(version) == version.files_dir
    assert version.path == version.files_dir / "model.safetensors"
    assert version.path.read_bytes() == ck.data
    assert not partial(version).exists()
    assert version.complete
    assert store.latest() is version
    assert store.get(ck.announcement.manifest_hash) is version
    # The open descriptor follows the rename: serving goes on through it.
    assert version.locate(1) == (fd(version), SHARD, SHARD)
    assert os.pread(fd(version), 50, SHARD) == ck.data[SHARD : SHARD + 50]
    meta = version.directory
    assert Manifest.from_json((meta / MANIFEST_FILE).read_bytes()) == ck.manifest
    ann = Announcement.model_validate_json((meta / ANNOUNCEMENT_FILE).read_bytes())
    assert ann == ck.announcement


def test_a_wrong_shard_is_refused_and_nothing_is_marked_or_written(tmp_path, store):
    ck = make_checkpoint(tmp_path, 1)
    version = store.begin(ck.announcement, ck.manifest)
    flipped = bytearray(ck.shard(0))
    flipped[123] ^= 1
    wrong = [
        (0, ck.shard(1)),  # another shard's bytes
        (0, bytes(flipped)),
        (0, ck.shard(0)[:-1]),  # short
        (0, ck.shard(0) + b"x"),  # long
        (3, ck.shard(3) + bytes(SHARD - 100)),  # the short last shard, padded
        (4, ck.shard(0)),  # no such shard
        (-1, ck.shard(0)),
    ]
    for index, data in wrong:
        with pytest.raises(ValueError):  # noqa: PT011 (the message is shards' to choose)
            store.write_shard(version, index, data)
    assert version.held == bytearray(ck.count)
    assert partial(version).read_bytes() == bytes(SIZE)  # not one byte reached the disk
    assert store.write_shard(version, 0, memoryview(ck.shard(0))) is True
    assert version.held == bytearray([1, 0, 0, 0])


def test_begin_refuses_a_manifest_that_is_not_the_announced_one(tmp_path, store):
    one, two = make_checkpoint(tmp_path, 1), make_checkpoint(tmp_path, 2)
    with pytest.raises(ValueError, match="not the announced one"):
        store.begin(one.announcement, two.manifest)
    assert store.versions() == []


# ---- resume ------------------------------------------------------------------------


def test_resume_holds_the_intact_shards_and_refetches_torn_ones(tmp_path):
    root = tmp_path / "store"
    ck = make_checkpoint(tmp_path, 1)
    first = WeightStore(root)
    version = first.begin(ck.announcement, ck.manifest)
    for i in (0, 2, 3):
        first.write_shard(version, i, ck.shard(i))
    version.close()  # the process dies here
    # A torn write: shard 3 half overwritten; shard 1 was never written (zeros).
    with open(partial(version), "r+b") as f:
        f.seek(3 * SHARD + 10)
        f.write(b"\x00" * 50)

    second = WeightStore(root)
    resumed = second.begin(ck.announcement, ck.manifest)
    assert resumed.held == bytearray([1, 0, 1, 0])
    assert second.write_shard(resumed, 0, ck.shard(0)) is False
    for i in (1, 3):
        assert second.write_shard(resumed, i, ck.shard(i)) is True
    second.finish(resumed)
    assert resumed.path.read_bytes() == ck.data
    resumed.close()


def test_resume_of_a_partial_file_of_the_wrong_size_starts_over(tmp_path):
    root = tmp_path / "store"
    ck = make_checkpoint(tmp_path, 1)
    first = WeightStore(root)
    version = first.begin(ck.announcement, ck.manifest)
    first.write_shard(version, 0, ck.shard(0))
    version.close()
    os.truncate(partial(version), SHARD + 7)

    second = WeightStore(root)
    resumed = second.begin(ck.announcement, ck.manifest)
    assert resumed.held == bytearray(ck.count)
    assert partial(resumed).stat().st_size == SIZE
    resumed.close()


def test_a_shard_corrupted_at_rest_is_the_only_one_fetched_again(tmp_path):
    root = tmp_path / "store"
    first = WeightStore(root)
    ck = make_checkpoint(tmp_path, 1)
    version = fetch_all(first, ck)
    version.close()
    with open(version.path, "r+b") as f:  # a disk that lost or mangled a write
        f.seek(SHARD + 99)
        f.write(bytes([ck.data[SHARD + 99] ^ 0xFF]))

    second = WeightStore(root)
    assert second.load() == []  # not trusted as complete ...
    assert second.latest() is None
    resumed = second.begin(ck.announcement, ck.manifest)  # ... but its good shards are kept
    assert resumed.held == bytearray([1, 0, 1, 1])
    assert not resumed.complete
    assert partial(resumed).exists()
    assert second.write_shard(resumed, 1, ck.shard(1)) is True
    second.finish(resumed)
    assert resumed.path.read_bytes() == ck.data
    assert resumed.complete
    resumed.close()


def test_finish_before_every_shard_arrived_refuses(tmp_path, store):
    ck = make_checkpoint(tmp_path, 1)
    version = store.begin(ck.announcement, ck.manifest)
    store.write_shard(version, 0, ck.shard(0))
    with pytest.raises(ValueError):  # noqa: PT011
        store.finish(version)
    assert version.held == bytearray([1, 0, 0, 0])
    assert not version.complete


# ---- keep-N and the byte budget ----------------------------------------------------------


def test_keep_n_drops_the_oldest_complete_versions(tmp_path):
    store = WeightStore(tmp_path / "store", keep=2)
    cks = [make_checkpoint(tmp_path, s) for s in (1, 2, 3)]
    versions = [fetch_all(store, ck) for ck in cks]
    assert steps(store) == [2, 3]
    assert not versions[0].directory.exists()
    assert fd(versions[0]) == -1
    assert store.get(cks[0].announcement.manifest_hash) is None
    assert versions[2].path.read_bytes() == cks[2].data
    with pytest.raises(ValueError, match="at least one"):
        WeightStore(tmp_path / "other", keep=0)


def test_pruning_spares_a_version_being_fetched(tmp_path):
    store = WeightStore(tmp_path / "store", keep=1)
    old = make_checkpoint(tmp_path, 1)
    fetching = store.begin(old.announcement, old.manifest)
    store.write_shard(fetching, 0, old.shard(0))
    fetch_all(store, make_checkpoint(tmp_path, 2))
    fetch_all(store, make_checkpoint(tmp_path, 3))
    assert steps(store) == [1, 3]
    assert partial(fetching).exists()
    assert fetching.holds(0)


def test_a_checkpoint_over_the_budget_is_refused(tmp_path):
    root = tmp_path / "store"
    store = WeightStore(root, max_bytes=SIZE - 1)
    ck = make_checkpoint(tmp_path, 1)
    with pytest.raises(StoreError) as e:
        store.begin(ck.announcement, ck.manifest)
    assert str(e.value) == f"a {SIZE}-byte version does not fit the {SIZE - 1}-byte budget"
    assert store.versions() == []
    assert list(root.iterdir()) == []


def test_the_budget_drops_the_oldest_to_make_room(tmp_path):
    store = WeightStore(tmp_path / "store", keep=10, max_bytes=2 * SIZE + SIZE // 2)
    one, two, three = (make_checkpoint(tmp_path, s) for s in (1, 2, 3))
    v1 = fetch_all(store, one)
    fetch_all(store, two)
    assert steps(store) == [1, 2]
    v3 = store.begin(three.announcement, three.manifest)
    assert steps(store) == [2, 3]
    assert not v1.directory.exists()
    for i in range(three.count):
        store.write_shard(v3, i, three.shard(i))
    store.finish(v3)
    assert v3.path.read_bytes() == three.data
    assert steps(store) == [2, 3]


def test_the_budget_holds_with_several_versions_being_fetched(tmp_path):
    store = WeightStore(tmp_path / "store", keep=10, max_bytes=2 * SIZE + SIZE // 2)
    for step in (1, 2, 3):
        ck = make_checkpoint(tmp_path, step)
        with contextlib.suppress(StoreError):
            store.begin(ck.announcement, ck.manifest)
    assert sum(v.manifest.size for v in store.versions()) <= store.max_bytes


# ---- restart and origins ----------------------------------------------------------------


def test_load_reregisters_complete_versions(tmp_path):
    root = tmp_path / "store"
    first = WeightStore(root)
    cks = [make_checkpoint(tmp_path, s) for s in (1, 2)]
    for ck in cks:
        fetch_all(first, ck)
    half = make_checkpoint(tmp_path, 3)
    partial = first.begin(half.announcement, half.manifest)
    first.write_shard(partial, 0, half.shard(0))
    (root / "step-junk").mkdir()  # unreadable leftovers are skipped
    (root / "step-0000000009-badbadbadbadbadb").mkdir()
    (root / "step-0000000009-badbadbadbadbadb" / ANNOUNCEMENT_FILE).write_text("{")
    for v in first.versions():
        v.close()

    second = WeightStore(root)
    loaded = second.load()
    assert [v.step for v in loaded] == [1, 2]
    assert steps(second) == [1, 2]  # the partial one waits for its announcement
    for v, ck in zip(loaded, cks, strict=True):
        assert v.complete
        assert v.held_count == ck.count
        assert v.path.read_bytes() == ck.data
        assert os.pread(fd(v), 10, 0) == ck.data[:10]
        assert second.get(ck.announcement.manifest_hash) is v
    assert second.load() == []  # nothing twice
    for v in second.versions():
        v.close()


def test_origin_files_are_linked_in_and_the_trainers_stay(tmp_path):
    store = WeightStore(tmp_path / "store", keep=1)
    origin = make_checkpoint(tmp_path, 1)
    version = store.add_origin(origin.path, origin.manifest, origin.announcement)
    assert version.complete
    assert version.path.samefile(origin.path)  # a second name, not a copy
    assert version.held_count == origin.count
    assert os.pread(fd(version), 10, SHARD) == origin.data[SHARD : SHARD + 10]
    assert (version.directory / MANIFEST_FILE).exists()

    fetch_all(store, make_checkpoint(tmp_path, 2))
    assert steps(store) == [2]  # no longer served ...
    assert not version.directory.exists()
    assert origin.path.read_bytes() == origin.data  # ... but the trainer's file stays


def test_add_origin_checks_the_file_and_the_announcement(tmp_path, store):
    one, two = make_checkpoint(tmp_path, 1), make_checkpoint(tmp_path, 2)
    with pytest.raises(ValueError, match="not the announced one"):
        store.add_origin(one.path, two.manifest, one.announcement)
    with open(one.path, "ab") as f:
        f.write(b"more")
    with pytest.raises(StoreError, match="changed size"):
        store.add_origin(one.path, one.manifest, one.announcement)
    assert store.versions() == []
    assert list(store.root.iterdir()) == []


# ---- model directories ---------------------------------------------------------------


def test_a_model_directory_travels_as_its_files_and_is_kept_once(tmp_path):
    model = tmp_path / "model"
    model.mkdir()
    files = {"config.json": b'{"a": 1}', "model.safetensors": os.urandom(SHARD * 2 + 5)}
    for name, content in files.items():
        (model / name).write_bytes(content)
    (model / "trainer").mkdir()  # the trainer's state: never part of the version
    (model / "trainer" / "trainer_state.pt").write_bytes(b"moments")
    manifest = shards.build_manifest(model, model="org/model", step=1, shard_size=SHARD)
    announcement = Announcement.sign(ORIGIN, manifest, DOMAIN)
    origin = WeightStore(tmp_path / "origin")
    served = origin.add_origin(model, manifest, announcement)
    assert sorted(p.name for p in served.files_dir.iterdir()) == sorted(files)

    node = WeightStore(tmp_path / "node")
    version = node.begin(announcement, manifest)
    assert version.manifest.shard_count == 4  # config: 1, weights: 3
    for index in reversed(range(4)):
        file_fd, offset, length = served.locate(index)
        assert version.locate(index)[1:] == (offset, length)
        node.write_shard(version, index, os.pread(file_fd, length, offset))
    node.finish(version)
    assert version.path == version.files_dir
    assert {p.name: p.read_bytes() for p in version.files_dir.iterdir()} == files
    # Nothing twice: the files once, beside the announcement and the manifest.
    on_disk = sum(p.stat().st_size for p in version.directory.rglob("*") if p.is_file())
    meta = (version.directory / MANIFEST_FILE, version.directory / ANNOUNCEMENT_FILE)
    assert on_disk == manifest.size + sum(p.stat().st_size for p in meta)
    for v in (served, version):
        v.close()


# ---- bitfields ---------------------------------------------------------------------------


def version_holding(held: list[int]) -> Version:
    return Version(None, None, Path("."), bytearray(held))  # type: ignore[arg-type]


def test_bitfield_is_most_significant_bit_first():
    version = version_holding([1, 0, 1, 1, 0, 0, 0, 0, 1])
    assert version.bitfield() == b"\xb0\x80"
    assert version_holding([]).bitfield() == b""
    assert [version.holds(i) for i in (-1, 0, 1, 8, 9)] == [False, True, False, True, False]
    assert bits(b"\xb0\x80", 9) == bytearray([1, 0, 1, 1, 0, 0, 0, 0, 1])
    assert bits(b"\xff", 3) == bytearray([1, 1, 1])  # bits past the count are ignored
    assert bits(b"", 3) == bytearray(3)  # a short bitfield holds nothing more
    assert bits(b"\x80", 12) == bytearray([1] + [0] * 11)


@settings(max_examples=200)
@given(held=st.lists(st.integers(0, 1), max_size=100))
def test_bits_inverts_bitfield(held):
    field = version_holding(held).bitfield()
    assert len(field) == (len(held) + 7) // 8
    assert bits(field, len(held)) == bytearray(held)
