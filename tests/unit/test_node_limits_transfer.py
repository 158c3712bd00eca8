"""client.node.machine.traffic and .limits: the monthly transfer count (kept across
a restart, begun again when the month turns), the quota and free-disk holds, the
weight store's disk cap, and the Limits settings. The caps' rates measured on
loopback are tests/integration/test_rate_caps.py's."""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path
from types import SimpleNamespace

import pytest

from client.node.machine.holds import Hold
from client.node.machine.limits import Limits, disk_hold
from client.node.machine.traffic import SAVE_SECONDS, TRAFFIC_FILE, GiB, Traffic
from client.node.settings import NodeSettings
from swarmrl.settings_toml import load_settings, template
from swarmrl.weights.store import StoreError, WeightStore
from tests.unit.test_weights_store import SIZE, fetch_all, make_checkpoint, steps

NOVEMBER = datetime(2026, 11, 20, 12, 0, tzinfo=UTC).timestamp()
LAST_SECOND = datetime(2026, 11, 30, 23, 59, 59, tzinfo=UTC).timestamp()
DECEMBER = datetime(2026, 12, 1, 0, 0, 1, tzinfo=UTC).timestamp()


def at(stamp: float) -> datetime:
    """The local time the daemon hands its judges."""
    return datetime.fromtimestamp(stamp).astimezone()


class Clock:
    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


@pytest.fixture(autouse=True)
def clean_environment(monkeypatch, tmp_path):
    """No SWARMRL_* of the machine running the tests, and a fresh home."""
    for name in list(os.environ):
        if name.upper().startswith("SWARMRL_"):
            monkeypatch.delenv(name)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))


class Disk:
    """A disk_usage stand-in: `gib` free, wherever asked."""

    def __init__(self, gib: float) -> None:
        self.gib = gib

    def __call__(self, path: Path) -> SimpleNamespace:
        return SimpleNamespace(free=int(self.gib * GiB))


def settings(tmp_path: Path, **limits: object) -> NodeSettings:
    return NodeSettings(data_dir=tmp_path / "node", **limits)


@pytest.fixture
def limits_of(tmp_path) -> Callable[..., Limits]:
    def make(clock: Clock, disk: Disk | None = None, **values: object) -> Limits:
        disk = Disk(100.0) if disk is None else disk
        return Limits(settings(tmp_path, **values), clock=clock, disk_usage=disk)

    return make


@pytest.fixture
def closing() -> Iterator[Callable[[WeightStore], WeightStore]]:
    """Closes the versions of the stores it is given after the test."""
    stores: list[WeightStore] = []

    def keep(store: WeightStore) -> WeightStore:
        stores.append(store)
        return store

    yield keep
    for store in stores:
        for version in store.versions():
            version.close()


# ---- the month's count --------------------------------------------------------------


def test_the_count_goes_on_after_a_restart(tmp_path):
    clock = Clock(NOVEMBER)
    traffic = Traffic(tmp_path / TRAFFIC_FILE, clock=clock)
    traffic.add(100)
    traffic.add(50)
    traffic.close()
    again = Traffic(tmp_path / TRAFFIC_FILE, clock=clock)
    assert again.moved(NOVEMBER) == 150
    again.add(1)
    assert again.moved(NOVEMBER) == 151


def test_the_count_is_written_at_most_every_few_seconds(tmp_path):
    clock = Clock(NOVEMBER)
    path = tmp_path / TRAFFIC_FILE
    traffic = Traffic(path, clock=clock)
    traffic.add(100)
    traffic.save(NOVEMBER + SAVE_SECONDS / 2)
    assert not path.exists()
    traffic.save(NOVEMBER + SAVE_SECONDS)
    assert json.loads(path.read_bytes()) == {"month": "2026-11", "bytes": 100}
    traffic.add(20)
    traffic.save(NOVEMBER + SAVE_SECONDS * 1.5)
    assert json.loads(path.read_bytes())["bytes"] == 100
    traffic.close()
    assert json.loads(path.read_bytes())["bytes"] == 120


def test_the_count_begins_again_when_the_month_turns(tmp_path):
    clock = Clock(LAST_SECOND)
    traffic = Traffic(tmp_path / TRAFFIC_FILE, quota=1000, clock=clock)
    traffic.add(1000)
    assert traffic.over(LAST_SECOND) is not None
    assert traffic.moved(DECEMBER) == 0
    assert traffic.over(DECEMBER) is None
    traffic.close()
    clock.now = DECEMBER
    traffic.add(7)
    assert traffic.moved(DECEMBER) == 7
    # November's count, read in December, is no count at all.
    assert Traffic(tmp_path / "other.json").moved(DECEMBER) == 0
    (tmp_path / "november.json").write_text('{"month": "2026-11", "bytes": 5000}')
    assert Traffic(tmp_path / "november.json", clock=clock).moved(DECEMBER) == 0


def test_past_the_quota_the_detail_says_how_much_and_when_it_resets(tmp_path):
    traffic = Traffic(tmp_path / TRAFFIC_FILE, quota=12 * GiB, clock=Clock(NOVEMBER))
    traffic.add(12 * GiB - 1)
    assert traffic.over(NOVEMBER) is None
    traffic.add(GiB // 10 + 1)
    assert traffic.over(NOVEMBER) == (
        "12.1 of 12 GiB moved this month; resets 2026-12-01 00:00 UTC"
    )
    in_december = datetime(2026, 12, 15, tzinfo=UTC).timestamp()
    late = Traffic(tmp_path / "late.json", quota=GiB // 2, clock=Clock(in_december))
    late.add(GiB)
    assert late.over(in_december) == "1.0 of 0.5 GiB moved this month; resets 2027-01-01 00:00 UTC"
    traffic.quota = None
    assert traffic.over(NOVEMBER) is None


def test_a_count_that_does_not_read_begins_at_zero_and_says_so(tmp_path, caplog):
    path = tmp_path / TRAFFIC_FILE
    path.write_text('{"month": "2026-11", "bytes": -3}')
    with caplog.at_level(logging.WARNING, logger="swarmrl.node"):
        assert Traffic(path, clock=Clock(NOVEMBER)).moved(NOVEMBER) == 0
    assert "does not read" in caplog.text


def test_a_count_torn_on_disk_is_read_from_the_copy_it_replaced(tmp_path, caplog):
    path = tmp_path / TRAFFIC_FILE
    traffic = Traffic(path, clock=Clock(NOVEMBER))
    traffic.add(5 * GiB)
    traffic.close()
    traffic.add(GiB)
    traffic.close()  # 6 GiB now, 5 GiB in the copy it replaced
    path.write_bytes(path.read_bytes()[:7])  # torn
    with caplog.at_level(logging.WARNING, logger="swarmrl.node"):
        assert Traffic(path, clock=Clock(NOVEMBER)).moved(NOVEMBER) == 5 * GiB
    assert "the copy before it does" in caplog.text


# ---- free disk ----------------------------------------------------------------------


def test_below_the_free_disk_to_keep_the_detail_says_what_is_free(tmp_path):
    assert disk_hold(tmp_path, 2.0, disk_usage=Disk(1.5)) == (
        "1.5 GiB free, under the 2 GiB to keep free (min_free_disk_gib)"
    )
    # Rounded down, never to the minimum itself.
    assert disk_hold(tmp_path, 2.0, disk_usage=Disk(1.999)).startswith("1.9 GiB free")
    assert disk_hold(tmp_path, 1.0, disk_usage=Disk(1.0)) is None
    # Under a GiB in MiB, not "0.0 GiB free" for a disk with 2 MiB left.
    assert disk_hold(tmp_path, 1.0, disk_usage=Disk(2 / 1024)).startswith("2 MiB free")
    assert disk_hold(tmp_path, 1.0, disk_usage=Disk(0.999)).startswith("1022 MiB free")


def test_a_disk_that_cannot_be_read_holds_the_node(tmp_path):
    gone = tmp_path / "gone"
    assert (
        disk_hold(gone, 1.0) == f"cannot read the free space of {gone}: No such file or directory"
    )


# ---- the limits together --------------------------------------------------------------


def test_the_holds_follow_the_free_disk_and_the_quota(limits_of):
    disk = Disk(0.5)
    limits = limits_of(Clock(NOVEMBER), disk=disk, monthly_transfer_gib=1e-6)
    assert limits.holds(at(NOVEMBER)) == {
        Hold.DISK_FULL: "512 MiB free, under the 1 GiB to keep free (min_free_disk_gib)",
    }
    disk.gib = 2.0
    assert limits.holds(at(NOVEMBER)) == {}


def test_every_byte_paced_counts_and_past_the_quota_nothing_moves_until_the_month_turns(
    limits_of,
):
    clock = Clock(LAST_SECOND)
    limits = limits_of(clock, monthly_transfer_gib=1e-6, max_upload_mbps=8.0)
    limits.downloads.pace(600)  # a weight download
    limits.uploads.pace(300)  # a shard served
    limits.uploads.pace(200, first=True)  # a submission
    assert limits.traffic.moved(LAST_SECOND) == 1100
    quota = limits.holds(at(LAST_SECOND))[Hold.QUOTA]
    assert quota.endswith("moved this month; resets 2026-12-01 00:00 UTC")
    assert limits.uploads.halted
    assert limits.downloads.halted
    clock.now = DECEMBER
    assert Hold.QUOTA not in limits.holds(at(DECEMBER))
    assert limits.uploads.rate == 1e6
    assert limits.downloads.rate is None


def test_a_restart_keeps_the_month_reached_past_its_quota(limits_of, tmp_path):
    clock = Clock(NOVEMBER)
    limits = limits_of(clock, monthly_transfer_gib=1e-6)
    limits.downloads.pace(2000)
    limits.close()
    again = limits_of(clock, monthly_transfer_gib=1e-6)
    assert again.traffic.moved(NOVEMBER) == 2000
    assert again.uploads.halted
    assert again.downloads.halted
    assert Hold.QUOTA in again.holds(at(NOVEMBER))
    again.apply(settings(tmp_path, monthly_transfer_gib=1.0))  # raised: moving again at once
    assert not again.uploads.halted
    assert not again.downloads.halted


def test_changed_settings_reach_the_caps_and_the_quota_at_once(limits_of, tmp_path):
    limits = limits_of(Clock(NOVEMBER), max_download_mbps=8.0)
    assert limits.downloads.rate == 1e6
    assert limits.uploads.rate is None
    limits.apply(
        settings(tmp_path, max_download_mbps=80.0, max_upload_mbps=2.0, monthly_transfer_gib=3)
    )
    assert limits.downloads.rate == 1e7
    assert limits.uploads.rate == 250_000
    assert limits.traffic.quota == 3 * GiB


def test_the_weight_store_drops_its_oldest_versions_to_stay_under_its_cap(
    limits_of, closing, tmp_path
):
    limits = limits_of(Clock(NOVEMBER), max_weight_store_gib=2.5 * SIZE / GiB)
    store = closing(limits.weight_store(tmp_path / "weights"))
    store.keep = 10  # only the byte cap drops versions here
    for step in (1, 2, 3):
        fetch_all(store, make_checkpoint(tmp_path, step))
    assert steps(store) == [2, 3]
    # A lowered cap drops the oldest at once; the newest stays whatever the cap.
    limits.apply(settings(tmp_path, max_weight_store_gib=SIZE / 2 / GiB))
    assert steps(store) == [3]


def test_the_weight_store_takes_no_version_that_would_eat_the_free_disk_to_keep(
    limits_of, closing, tmp_path
):
    limits = limits_of(Clock(NOVEMBER), min_free_disk_gib=1_000_000)  # more than any disk
    store = closing(limits.weight_store(tmp_path / "weights"))
    ck = make_checkpoint(tmp_path, 1)
    with pytest.raises(StoreError, match=r"keeping 1073741824000000 free$"):
        store.begin(ck.announcement, ck.manifest)
    limits.apply(settings(tmp_path, min_free_disk_gib=0.25))
    store.begin(ck.announcement, ck.manifest)


# ---- the settings ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "sentence"),
    [
        ("max_upload_mbps = 0.5", "max_upload_mbps must be at least 1, got 0.5"),
        ("max_weight_store_gib = 0", "max_weight_store_gib must be more than 0, got 0"),
        # Never 0: a disk filled to its last byte fails the node's own writes.
        ("min_free_disk_gib = 0", "min_free_disk_gib must be at least 0.25, got 0"),
        ("monthly_transfer_gib = 0", "monthly_transfer_gib must be more than 0, got 0"),
    ],
)
def test_a_bad_limit_is_refused_in_one_sentence(tmp_path, text, sentence):
    path = tmp_path / "node.toml"
    path.write_text(text + "\n")
    with pytest.raises(ValueError, match=r".") as refused:
        load_settings(NodeSettings, path)
    assert str(refused.value) == f"{path}: {sentence}"


def test_the_limits_have_a_section_of_their_own():
    lines = template(NodeSettings).splitlines()
    start = lines.index("# == Limits ==")
    keys = [line.lstrip("# ").split(" =")[0] for line in lines[start + 1 :] if " = " in line]
    assert keys[:5] == [
        "max_download_mbps",
        "max_upload_mbps",
        "max_weight_store_gib",
        "min_free_disk_gib",
        "monthly_transfer_gib",
    ]


def test_a_write_that_found_no_room_holds_until_the_room_it_lacked_is_there(limits_of):
    disk = Disk(1.5)
    limits = limits_of(Clock(NOVEMBER), disk=disk)
    detail = limits.out_of_room("outbox/x.parquet: No space left on device")
    assert detail == (
        "outbox/x.parquet: No space left on device; held until 2.5 GiB are free (1.5 GiB now)"
    )
    # More than the 1 GiB to keep free is not room for what failed: held still.
    assert limits.holds(at(NOVEMBER)) == {Hold.DISK_FULL: detail}
    disk.gib = 2.5
    assert limits.holds(at(NOVEMBER)) == {}
    disk.gib = 1.5  # forgotten once met: only the 1 GiB to keep free holds now
    assert limits.holds(at(NOVEMBER)) == {}
