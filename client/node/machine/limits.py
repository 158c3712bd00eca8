"""The node's limits on the machine it shares (the Limits settings), and who keeps
each:

- the rate caps: two pacers (:mod:`swarmrl.p2p.pacing`). ``downloads`` paces the
  weight downloads; ``uploads`` the weights served to peers and the node's
  submissions (the host's uploads), which go first;
- the weight store's disk cap: its byte budget (oldest versions dropped first), and
  the free disk it leaves when it takes a version;
- the minimum of free disk: the DISK_FULL hold (:func:`disk_hold`), also set at
  once when a write of the node's fails for want of room (:meth:`Limits.out_of_room`);
- the monthly transfer quota: every byte paced is counted (:mod:`client.node.machine.traffic`);
  past the quota the QUOTA hold, and both pacers halted (nothing moves but the
  transfers already under way) until the month turns.

Every limit follows the settings while the node runs (:meth:`Limits.apply`); the
daemon looks at the holds every few seconds (:meth:`Limits.holds`).
"""

from __future__ import annotations

import shutil
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from client.node.machine.holds import Hold
from client.node.machine.traffic import TRAFFIC_FILE, Traffic
from swarmrl.p2p.pacing import Pacer
from swarmrl.sizes import GiB, size

if TYPE_CHECKING:
    from client.node.settings import NodeSettings
    from swarmrl.weights.store import WeightStore

DiskUsage = Callable[[Path], Any]  # shutil.disk_usage, or a stand-in with `.free`


def mbps_to_rate(mbps: float | None) -> float | None:
    """Mbit/s as bytes a second (None: no cap)."""
    return None if mbps is None else mbps * 1e6 / 8


def gib_to_bytes(gib: float | None) -> int | None:
    """GiB as bytes (None: no limit)."""
    return None if gib is None else int(gib * GiB)


@dataclass(frozen=True)
class NoRoom:
    """A write of the node's that failed for want of room, and the free space it waits
    for: what failed needed more than was free, so the minimum to keep free alone could
    let the same write fail again at once."""

    reason: str  # the failed write's sentence
    wanted: int  # bytes free before the node works again

    def detail(self, free: int) -> str:
        return f"{self.reason}; held until {size(self.wanted)} are free ({size(free)} now)"


def disk_hold(
    data_dir: Path,
    min_free_gib: float,
    *,
    no_room: NoRoom | None = None,
    disk_usage: DiskUsage = shutil.disk_usage,
) -> str | None:
    """Why the node is held for disk, or None: a write failed for want of room and the
    disk has not the room it waits for yet, the free space on `data_dir`'s disk is under
    `min_free_gib`, or it cannot be read (then nothing can be written there either)."""
    try:
        free = disk_usage(data_dir).free
    except OSError as e:
        return f"cannot read the free space of {data_dir}: {e.strerror or e}"
    if no_room is not None and free < no_room.wanted:
        return no_room.detail(free)
    if free >= min_free_gib * GiB:
        return None
    return f"{size(free)} free, under the {min_free_gib:g} GiB to keep free (min_free_disk_gib)"


class Limits:
    """The node's pacers, transfer count and weight store budget, made from `settings`
    and following them. `clock` gives unix time, `disk_usage` the free disk (tests)."""

    owns = frozenset({Hold.DISK_FULL, Hold.QUOTA})

    def __init__(
        self,
        settings: NodeSettings,
        *,
        clock: Callable[[], float] = time.time,
        disk_usage: DiskUsage = shutil.disk_usage,
    ) -> None:
        self.settings = settings
        self.data_dir = Path(settings.data_dir)
        self._clock = clock
        self._disk_usage = disk_usage
        self._lock = threading.Lock()  # the daemon's tick and a settings change
        self.traffic = Traffic(
            self.data_dir / TRAFFIC_FILE,
            quota=gib_to_bytes(settings.monthly_transfer_gib),
            clock=clock,
        )
        self._over = self.traffic.over(clock()) is not None  # past the quota: halted
        self.uploads = Pacer(on_bytes=self.traffic.add)
        self.downloads = Pacer(on_bytes=self.traffic.add)
        self._pace()
        self._store: WeightStore | None = None
        self._no_room: NoRoom | None = None  # a failed write's, until the disk has room

    def weight_store(self, root: Path) -> WeightStore:
        """The node's weight store at `root`, within the disk cap and the free disk to
        keep; later settings reach it too."""
        from swarmrl.weights.store import WeightStore

        s = self.settings
        self._store = WeightStore(
            root,
            max_bytes=gib_to_bytes(s.max_weight_store_gib),
            min_free=int(s.min_free_disk_gib * GiB),
        )
        return self._store

    def apply(self, settings: NodeSettings) -> None:
        """Settings changed while the node runs: every limit takes its new value at once
        (a lowered store cap drops the oldest versions now)."""
        with self._lock:
            self.settings = settings
            self.traffic.quota = gib_to_bytes(settings.monthly_transfer_gib)
            self._over = self.traffic.over(self._clock()) is not None  # a quota raised or gone
            self._pace()
            store = self._store
        if store is not None:
            store.max_bytes = gib_to_bytes(settings.max_weight_store_gib)
            store.min_free = int(settings.min_free_disk_gib * GiB)
            store.prune()

    def holds(self, now: datetime) -> dict[Hold, str]:
        """Every few seconds (the daemon's judges): DISK_FULL and QUOTA where they hold,
        each with its detail. The pacers halt past the quota and go again when the month
        turns; the month's count is saved when due."""
        stamp = now.timestamp()
        self.traffic.save(stamp)
        quota = self.traffic.over(stamp)
        with self._lock:
            if (quota is not None) != self._over:
                self._over = quota is not None
                self._pace()
            if self._no_room is not None and self._free() >= self._no_room.wanted:
                self._no_room = None  # the room it waited for is there
            no_room = self._no_room
        disk = disk_hold(
            self.data_dir,
            self.settings.min_free_disk_gib,
            no_room=no_room,
            disk_usage=self._disk_usage,
        )
        found = {Hold.DISK_FULL: disk, Hold.QUOTA: quota}
        return {hold: detail for hold, detail in found.items() if detail is not None}

    def out_of_room(self, reason: str) -> str:
        """A write of the node's failed for want of room (`reason`, its sentence): the
        DISK_FULL hold lasts until the disk has min_free_disk_gib more free than now. The
        hold's detail."""
        free = self._free()
        no_room = NoRoom(reason, free + int(self.settings.min_free_disk_gib * GiB))
        with self._lock:
            self._no_room = no_room
        return no_room.detail(free)

    def _free(self) -> int:
        """The free bytes on the data dir's disk; 0 when they cannot be read."""
        try:
            return int(self._disk_usage(self.data_dir).free)
        except OSError:
            return 0

    def close(self) -> None:
        """Keeps the month's count for the next start."""
        self.traffic.close()

    def _pace(self) -> None:
        """The settings' rates, or none past the quota. With the lock held (or alone)."""
        s = self.settings
        self.uploads.rate = 0 if self._over else mbps_to_rate(s.max_upload_mbps)
        self.downloads.rate = 0 if self._over else mbps_to_rate(s.max_download_mbps)
