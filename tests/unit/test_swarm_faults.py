"""The fault runs' plan and their check of weight stores, without a swarm: the swarm
itself runs them in tests/e2e/test_swarm_at_work.py and `swarmrl bench trust`."""

from __future__ import annotations

from orchestrator.run_dir import RunDir
from simulation.faults import FaultPlan, Target, broken_weights
from swarmrl.weights.store import WeightStore
from tests.unit.test_weights_store import fetch_all, make_checkpoint

NODES = ["node4", "node5"]


def test_a_plan_hits_every_target_once_before_any_twice_in_step_order():
    for seed in range(50):
        plan = FaultPlan.draw(seed, count=6, steps=(2, 9), nodes=NODES, max_delay=5)
        targets = [f.target for f in plan.faults]
        assert len(targets) == 6
        assert set(targets[: len(Target)]) == set(Target)
        assert sorted(f.step for f in plan.faults) == [f.step for f in plan.faults]
        assert all(2 <= f.step <= 9 and 0 <= f.delay <= 5 for f in plan.faults)
        assert all((f.node in NODES) == (f.target is Target.NODE) for f in plan.faults)
    four = FaultPlan.draw(7, count=4, steps=(2, 9), nodes=NODES)
    assert sorted(f.target for f in four.faults) == sorted(Target)


def test_a_seed_replays_its_plan_and_is_printed_with_it():
    plan = FaultPlan.draw(1234, count=4, steps=(2, 10), nodes=NODES)
    assert FaultPlan.draw(1234, count=4, steps=(2, 10), nodes=NODES) == plan
    assert str(plan).startswith("fault seed 1234: ")
    assert FaultPlan.draw(1235, count=4, steps=(2, 10), nodes=NODES) != plan


def test_a_weight_file_held_as_complete_and_not_whole_is_found(tmp_path):
    store = WeightStore(tmp_path / "store")
    whole = fetch_all(store, make_checkpoint(tmp_path, 1))
    torn = fetch_all(store, make_checkpoint(tmp_path, 2))
    fetching = store.begin(*_announced(make_checkpoint(tmp_path, 3)))  # a .partial: not held
    for version in store.versions():
        version.close()
    assert broken_weights(tmp_path / "store") == []
    with open(torn.path, "r+b") as f:
        f.seek(5000)
        f.write(b"\0" * 10)  # a write lost in shard 1
    assert broken_weights(tmp_path / "store") == [
        f"{torn.path.name} of step 2 has 1 shard(s) not whole"
    ]
    assert whole.path.is_file()
    assert not fetching.path.exists()  # still .partial


def _announced(checkpoint):
    return checkpoint.announcement, checkpoint.manifest


def test_a_nodes_copy_unlike_the_trainers_published_policy_is_found(tmp_path):
    from orchestrator.trainer import checkpoint as ckpt
    from simulation.faults import unlike_published
    from swarmrl import shards
    from swarmrl.weights.peer_records import Announcement
    from tests.unit.test_weights_store import DOMAIN, ORIGIN

    policy = RunDir(tmp_path / "run").step(4)
    (policy / ckpt.TRAINER_DIR).mkdir(parents=True)
    (policy / "config.json").write_bytes(b"{}")
    (policy / "model.safetensors").write_bytes(bytes(range(256)) * 40)
    (policy / ckpt.TRAINER_DIR / ckpt.STATE_FILE).write_bytes(b"moments")
    manifest = shards.build_manifest(policy, model="m", step=4, shard_size=4096)
    store = WeightStore(tmp_path / "store")
    version = store.begin(Announcement.sign(ORIGIN, manifest, DOMAIN), manifest)
    for index in range(manifest.shard_count):
        name = manifest.files[manifest.locate(index)[0]].name
        store.write_shard(version, index, shards.read_shard(policy / name, manifest, index))
    store.finish(version)
    version.close()
    assert unlike_published(tmp_path / "store", tmp_path / "run") == []
    (version.directory / "step_4.tar").write_bytes(b"a second copy")
    with open(version.files_dir / "model.safetensors", "r+b") as f:
        f.write(b"\xff")
    assert unlike_published(tmp_path / "store", tmp_path / "run") == [
        "step 4 keeps ['step_4.tar'] beside its files",
        "model.safetensors of step 4 is not the trainer's",
    ]
