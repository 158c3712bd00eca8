"""Which worker gets which GPUs and cores, how an order is split among them, and the
sentence a machine that cannot run the settings gets."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from client.node.settings import NodeSettings
from client.node.work.workers import plan_workers, share_cores, split_batches


def settings(tmp_path, **values) -> NodeSettings:
    return NodeSettings(data_dir=tmp_path, keystore_dir=tmp_path, **values)


def plan(tmp_path, device="cuda", backend="vllm", gpu_count=8, cores=range(16), **values):
    return plan_workers(
        settings(tmp_path, **values),
        device=device,
        backend=backend,
        gpu_count=gpu_count,
        cores=list(cores),
    )


def test_a_worker_per_gpu_each_with_its_share_of_the_cores(tmp_path):
    workers = plan(tmp_path)
    assert [w.gpus for w in workers] == [(g,) for g in range(8)]
    assert [w.cores for w in workers] == [(2 * g, 2 * g + 1) for g in range(8)]
    assert {w.device for w in workers} == {"cuda"}  # each sees its own GPUs from cuda:0
    assert {w.threads for w in workers} == {2}


def test_tensor_parallel_groups_and_chosen_gpus(tmp_path):
    workers = plan(tmp_path, gpus=[4, 5, 6, 7], tensor_parallel_size=2)
    assert [w.gpus for w in workers] == [(4, 5), (6, 7)]
    assert [w.cores for w in workers] == [tuple(range(8)), tuple(range(8, 16))]
    # Fewer cores than workers: they share, each still gets one.
    assert [w.cores for w in plan(tmp_path, cores=[3])] == [(3,)] * 8


def test_one_named_device_is_one_worker_and_the_cpu_runs_cpu_workers(tmp_path):
    assert [w.gpus for w in plan(tmp_path, device="cuda:3")] == [(3,)]
    workers = plan(
        tmp_path, device="cpu", backend="torch", cpu_workers=2, cores=range(4), threads=2
    )
    assert [(w.device, w.gpus, w.cores, w.threads) for w in workers] == [
        ("cpu", (), (0, 1), 1),
        ("cpu", (), (2, 3), 1),
    ]


@pytest.mark.parametrize(
    ("values", "sentence"),
    [
        ({"gpus": [0, 9]}, "the node is set to work on GPU 9, and torch sees GPUs 0-7"),
        ({"gpu_count": 0}, "the node is set to work on a GPU, and torch sees no GPU"),
        ({"tensor_parallel_size": 3}, "tensor_parallel_size 3 does not divide the node's 8 GPUs"),
        (
            {"tensor_parallel_size": 2, "backend": "torch"},
            "tensor_parallel_size 2 needs the vllm backend; torch runs a worker on one GPU",
        ),
        ({"device": "cuda:1", "gpus": [0]}, "device cuda:1 names one GPU; gpus names others"),
        (
            {"device": "cpu", "backend": "torch", "gpus": [0]},
            "gpus and tensor_parallel_size need a GPU; the device is cpu",
        ),
    ],
)
def test_what_the_machine_cannot_run_is_refused_in_one_sentence(tmp_path, values, sentence):
    with pytest.raises(ValueError, match="^" + sentence.replace("(", r"\(").replace(")", r"\)")):
        plan(tmp_path, **values)


def test_gpus_are_listed_once_each():
    with pytest.raises(ValueError, match="gpus must list each GPU's index once"):
        NodeSettings(gpus=[0, 0])
    assert NodeSettings.model_validate({"gpus": "0, 2"}).gpus == [0, 2]


@given(
    batches=st.integers(0, 200),
    speeds=st.lists(st.floats(0.01, 1000), min_size=1, max_size=9),
)
def test_an_order_splits_into_runs_by_speed_that_cover_it_once(batches, speeds):
    runs = split_batches(batches, speeds)
    assert [i for run in runs for i in run] == list(range(batches))
    total = sum(speeds)
    for run, speed in zip(runs, speeds, strict=True):
        assert abs(len(run) - batches * speed / total) < 1 + 1e-9


def test_equal_speeds_split_evenly_and_a_faster_worker_gets_more():
    assert split_batches(6, [1, 1, 1]) == [range(0, 2), range(2, 4), range(4, 6)]
    assert [len(r) for r in split_batches(8, [3, 1])] == [6, 2]


@given(cores=st.lists(st.integers(0, 255), min_size=1, max_size=64, unique=True),
       workers=st.integers(1, 32))  # fmt: skip
def test_core_shares_are_disjoint_when_there_are_cores_enough(cores, workers):
    shares = share_cores(cores, workers)
    assert len(shares) == workers
    assert all(shares)
    if workers <= len(cores):
        assert sorted(c for share in shares for c in share) == sorted(cores)
