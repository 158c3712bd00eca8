"""swarmrl.weights.download: which holder a download asks for a shard."""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest

from swarmrl.weights.download import EXPLORE, Download, PeerBook, PeerState
from swarmrl.weights.store import WeightStore
from tests.unit.test_weights_store import make_checkpoint


@pytest.fixture
def download(tmp_path: Path) -> Iterator[Download]:
    store = WeightStore(tmp_path / "store")
    ck = make_checkpoint(tmp_path, 1)
    version = store.begin(ck.announcement, ck.manifest)
    yield Download(store, version, PeerBook(), rng=random.Random(7))
    version.close()


def picks(download: Download, holders: list[PeerState], n: int = 2000) -> Counter[str]:
    return Counter(download._pick_peer(holders).peer_id for _ in range(n))


def test_with_no_holder_measured_any_is_tried(download):
    holders = [PeerState("a"), PeerState("b"), PeerState("c")]
    assert set(picks(download, holders)) == {"a", "b", "c"}


def test_a_new_holder_is_found_by_exploring_not_tried_first(download):
    # Trying every unmeasured holder first sent every worker of every node to each
    # peer the moment it advertised a shard; now it waits for a random pick.
    fast, slow, new = PeerState("fast", rate=100e6), PeerState("slow", rate=10e6), PeerState("new")
    n = 2000
    got = picks(download, [fast, slow, new], n)
    explored = EXPLORE * n / 3  # a random pick lands on each holder alike
    assert 0.5 * explored < got["new"] < 2 * explored
    assert 0.5 * explored < got["slow"] < 2 * explored
    assert got["fast"] == n - got["new"] - got["slow"]


def test_the_best_rate_per_request_in_flight_wins(download, monkeypatch):
    monkeypatch.setattr("swarmrl.weights.download.EXPLORE", 0.0)
    loaded = PeerState("loaded", rate=100e6, inflight=3)  # 25 MB/s for one more request
    idle = PeerState("idle", rate=40e6)
    assert picks(download, [loaded, idle, PeerState("new")], 50) == {"idle": 50}
    loaded.inflight = 1
    assert picks(download, [loaded, idle, PeerState("new")], 50) == {"loaded": 50}
