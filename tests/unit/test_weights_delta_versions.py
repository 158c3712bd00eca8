"""A version shipped as its delta: swarmrl.weights.delta_versions on real policy directories (the
default architecture's weights in bf16, config, tokenizer), and the store rebuilding
a version from its base and its delta, refusing one that does not rebuild it."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
import torch
from eth_account import Account
from safetensors.torch import load_file

from swarmrl import shards
from swarmrl.eip712 import swarm_domain
from swarmrl.shards import DeltaLink, Manifest
from swarmrl.weights import delta_versions, peer_records
from swarmrl.weights.peer_records import Announcement
from swarmrl.weights.store import STAGING_PREFIX, Version, WeightStore
from tests.unit.test_delta import Weights, perturbed, saved

DOMAIN = swarm_domain(31337, "0x" + "44" * 20)
KEY = Account.create()


@pytest.fixture(scope="module")
def weights(model_dirs) -> Weights:
    return load_file(model_dirs[0] / "model.safetensors")


def policy(root: Path, tensors: Weights, *, tokenizer: str = "tok", step: int) -> Manifest:
    """A policy directory at `root` and its manifest as step `step`."""
    root.mkdir(parents=True)
    saved(tensors, root / "model.safetensors")
    (root / "config.json").write_text('{"hidden": 64}')
    (root / "tokenizer.json").write_text(tokenizer)
    return shards.build_manifest(root, model="m", step=step, shard_size=64 * 1024)


def steps(weights: Weights, tmp_path: Path, **second) -> tuple[Path, Manifest, Path, Manifest]:
    """Step 1 and step 2 (one optimiser-sized move of every weight) of a bf16 policy."""
    first = policy(tmp_path / "one", perturbed(weights, torch.bfloat16, "none"), step=1)
    nxt = policy(tmp_path / "two", perturbed(weights, torch.bfloat16, "relative"), step=2, **second)
    return tmp_path / "one", first, tmp_path / "two", nxt


def test_a_delta_holds_only_what_changed_and_rebuilds_the_step_bit_for_bit(weights, tmp_path):
    one, first, two, second = steps(weights, tmp_path, tokenizer="a new tokenizer")
    made = tmp_path / "delta"
    made.mkdir()
    assert delta_versions.encode(one, first, two, second, made)
    # The weights as their delta, the changed tokenizer whole, the config not at all.
    assert sorted(p.name for p in made.iterdir()) == ["model.safetensors.delta", "tokenizer.json"]
    assert (made / "model.safetensors.delta").stat().st_size < second.files[1].size / 4

    out = tmp_path / "rebuilt"
    out.mkdir()
    delta_versions.rebuild(one, made, second, out)
    assert delta_versions.matches(out, second)
    for entry in second.files:
        assert (out / entry.name).read_bytes() == (two / entry.name).read_bytes()


def test_no_delta_when_nothing_changed_and_whole_weights_when_the_tensors_differ(weights, tmp_path):
    one, first, _, _ = steps(weights, tmp_path)
    made = tmp_path / "delta"
    made.mkdir()
    same = first.model_copy(update={"step": 2})
    assert not delta_versions.encode(one, first, one, same, made)
    assert list(made.iterdir()) == []
    # Other tensors altogether: no delta of the weights, they go whole.
    other = policy(tmp_path / "other", {"x": torch.ones(50_000, dtype=torch.bfloat16)}, step=2)
    assert delta_versions.encode(one, first, tmp_path / "other", other, made)
    assert [p.name for p in made.iterdir()] == ["model.safetensors"]


@pytest.mark.parametrize(
    ("harm", "error"),
    [
        ("stray", "the delta holds notes.txt, which step 2 has no use for"),
        ("wrong base", "base"),
        ("no base file", "which the base does not hold"),
    ],
)
def test_a_delta_that_does_not_fit_is_one_sentence(weights, tmp_path, harm, error):
    one, first, two, second = steps(weights, tmp_path)
    made = tmp_path / "delta"
    made.mkdir()
    assert delta_versions.encode(one, first, two, second, made)
    if harm == "stray":
        (made / "notes.txt").write_text("not part of step 2")
    elif harm == "wrong base":
        one = two  # the step itself is not the base the delta was made against
    else:
        (one / "model.safetensors").unlink()
    out = tmp_path / "rebuilt"
    out.mkdir()
    with pytest.raises(ValueError, match=error):
        delta_versions.rebuild(one, made, second, out)


def _origin_store(
    tmp_path: Path, weights: Weights, *, whole: bool = False
) -> tuple[WeightStore, Version, Version]:
    """A store holding step 1 and step 2's delta (`whole`: and step 2, as an origin
    publishes it)."""
    one, first, two, second = steps(weights, tmp_path)
    made = tmp_path / "delta"
    made.mkdir()
    assert delta_versions.encode(one, first, two, second, made)
    delta_manifest = shards.build_manifest(made, model="m", step=2, shard_size=4096)
    link = DeltaLink(
        base=peer_records.manifest_hash(first), manifest=peer_records.manifest_hash(delta_manifest)
    )
    second = Manifest.model_validate({**second.model_dump(), "delta": link})
    store = WeightStore(tmp_path / "store", keep=2)
    base = store.add_origin(one, first, Announcement.sign(KEY, first, DOMAIN))
    announced = Announcement.sign(KEY, second, DOMAIN)
    if whole:
        store.add_origin(two, second, announced)
    delta = store.add_origin(made, delta_manifest, announced, target=second)
    return store, base, delta


def test_the_store_keeps_a_rebuilt_step_once_and_its_delta_goes_with_it(weights, tmp_path):
    store, base, delta = _origin_store(tmp_path, weights)
    assert store.latest() is base  # a delta is never the newest version
    rebuilt = store.add_rebuilt(delta, base)
    assert store.latest() is rebuilt
    assert rebuilt.step == 2
    assert delta_versions.matches(rebuilt.files_dir, rebuilt.manifest)
    assert not list(store.root.glob(STAGING_PREFIX + "*"))
    store.drop(rebuilt)
    assert store.versions() == [base]  # the delta went with the step it rebuilds


def test_a_rebuild_that_does_not_match_the_signed_manifest_keeps_nothing(weights, tmp_path):
    store, base, delta = _origin_store(tmp_path, weights)
    # The delta's own hashes pass; the manifest's do not: a config that differs.
    (base.files_dir / "config.json").unlink()
    (base.files_dir / "config.json").write_text('{"hidden": 65}')
    with pytest.raises(ValueError, match=r"^step 2 rebuilt from its delta does not match"):
        store.add_rebuilt(delta, base)
    assert store.versions() == [base, delta]
    assert not list(store.root.glob(STAGING_PREFIX + "*"))
    assert sorted(p.name for p in store.root.iterdir()) == sorted(
        p.name for p in (base.directory, delta.directory)
    )


def test_a_truncated_delta_is_one_sentence_and_changes_nothing(weights, tmp_path):
    store, base, delta = _origin_store(tmp_path, weights)
    patch = delta.files_dir / "model.safetensors.delta"
    data = patch.read_bytes()
    patch.unlink()  # its own bytes, not the origin's
    patch.write_bytes(data[: len(data) // 2])
    with pytest.raises(
        ValueError, match=r"^the delta is truncated: tensor '[\w.]+' needs \d+ bytes"
    ):
        store.add_rebuilt(delta, base)
    assert store.versions() == [base, delta]
    assert not list(store.root.glob(STAGING_PREFIX + "*"))


def _restarted(store: WeightStore, caplog) -> tuple[WeightStore, list[Version]]:
    """`store` closed, and a store on its root that loaded what it left, warnings in
    `caplog`."""
    for version in store.versions():
        version.close()
    again = WeightStore(store.root, keep=store.keep)
    with caplog.at_level(logging.WARNING, logger="swarmrl"):
        loaded = again.load()
    return again, loaded


def test_a_restarted_store_drops_the_deltas_of_steps_it_holds_in_part_without_a_warning(
    weights, tmp_path, caplog
):
    store, base, delta = _origin_store(tmp_path, weights)
    delta_dir = delta.files_dir.parent
    assert delta_dir.name.endswith("-delta")
    again, loaded = _restarted(store, caplog)
    # Its manifest is the delta's own, never the one its announcement names: expected,
    # and no reason to tell the volunteer of corruption at every start.
    assert caplog.text == ""
    assert [v.step for v in loaded] == [base.step]
    assert not delta_dir.exists()
    for version in again.versions():
        version.close()


def test_a_restarted_origin_serves_its_deltas_again(weights, tmp_path, caplog):
    # Its nodes were fetching the newest step's delta when it was killed: dropped, they
    # waited for a holder that never came.
    store, _, delta = _origin_store(tmp_path, weights, whole=True)
    again, loaded = _restarted(store, caplog)
    assert caplog.text == ""
    assert [(v.step, v.is_delta) for v in loaded] == [(1, False), (2, False), (2, True)]
    held = again.get(delta.manifest_hash)
    assert held is not None
    assert held.complete
    assert held.target == delta.target
    assert held.bitfield() == delta.bitfield()
    newest = again.latest()  # never the delta
    assert newest is not None
    assert newest.step == 2
    assert again.load() == []  # nothing twice, and the delta it holds stays
    assert held.directory.is_dir()
    for version in again.versions():
        version.close()
