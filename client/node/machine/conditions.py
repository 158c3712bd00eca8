"""When the node may work: the "When to run" settings (idle, the GPU while the machine is
in use, battery, other processes' load, the weekly schedule, programs that pause work)
judged against the machine, as the holds (client.node.machine.holds) they put on the node.

The daemon asks :meth:`Conditions.holds` every few seconds, sets the holds it returns
and clears the rest of CONDITION_HOLDS. What the machine tells comes from a
:class:`Machine`: :class:`LinuxMachine` reads /proc, /sys and /dev; tests pass a fake.
"""

from __future__ import annotations

import logging
import os
import re
import time
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from client.node.machine.holds import Hold

if TYPE_CHECKING:
    from client.node.settings import NodeSettings

log = logging.getLogger("swarmrl.node")

# The holds the conditions set; the daemon clears those that holds() no longer returns.
CONDITION_HOLDS = frozenset(
    {Hold.SCHEDULE, Hold.USER_ACTIVE, Hold.ON_BATTERY, Hold.BUSY, Hold.PROGRAM}
)
# "In use" for pause_gpu_while_active when idle_minutes is 0: BOINC's default.
ACTIVE_MINUTES = 3.0
# Other processes' load is averaged over this long, so a busy moment pauses nothing.
LOAD_WINDOW_SECONDS = 60.0
# The kernel keeps this many characters of a program's name in /proc/<pid>/comm.
COMM_CHARS = 15

_DAY = 86_400
_WEEK = 7 * _DAY
_DAYS = ("monday", "tuesday", "wednesday", "thursday", "friday", "saturday", "sunday")
_DAY_OF = {name: i for i, full in enumerate(_DAYS) for name in (full, full[:3])}
_WINDOW = re.compile(
    r"(?:(?P<first>[a-z]+)(?:\s*-\s*(?P<last>[a-z]+))?)?\s*"
    r"(?:(?P<start>\d{1,2}:\d\d)\s*-\s*(?P<end>\d{1,2}:\d\d))?"
)
WINDOW_FORMAT = '"mon-fri 18:00-08:00", "sat-sun" or "daily 22:00-07:00"'


# ---- what the machine tells --------------------------------------------------------


@dataclass(frozen=True)
class CpuTimes:
    """CPU time spent since boot, summed over all cores, in one unit (clock ticks on
    Linux): only differences between two samples are used."""

    busy: float  # by every process and the kernel
    total: float  # busy and idle: the capacity of all cores
    own: float  # by the node's own process and its children


class Machine(Protocol):
    """What the conditions read of the machine; each read is cheap, as the daemon reads
    them every few seconds."""

    def idle_seconds(self) -> float | None:
        """Seconds since the last keyboard or mouse input; None: the machine gives no
        way to tell (a headless server)."""
        ...

    def on_battery(self) -> bool | None:
        """Whether the machine runs on its battery; None: it tells of no power supply."""
        ...

    def cpu_times(self) -> CpuTimes | None:
        """The CPU time spent so far; None: the machine does not tell."""
        ...

    def programs(self) -> set[str]:
        """The names of the programs running, as /proc/<pid>/comm and the executable's
        file name give them."""
        ...


class LinuxMachine:
    """The :class:`Machine` of a Linux host, from the files under ``root`` (``/``; a fake
    tree in tests): /proc, /sys and /dev, each read skipping what it may not see."""

    def __init__(
        self,
        root: Path = Path("/"),
        *,
        pid: int | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.proc = root / "proc"
        self.power = root / "sys" / "class" / "power_supply"
        self.dev = root / "dev"
        self.pid = os.getpid() if pid is None else pid
        self.clock = clock

    def idle_seconds(self) -> float | None:
        # A terminal's access time moves when someone types in it (the kernel updates
        # it on a read, at most every few seconds), and stat needs no read permission.
        # Input devices' times do not move on every kernel (evdev leaves them): input to
        # a graphical session may then go unseen, and the machine counts as idle.
        devices = [
            *self.dev.glob("input/event*"),
            *self.dev.glob("pts/[0-9]*"),
            *self.dev.glob("tty[0-9]*"),
        ]
        latest = None
        for device in devices:
            try:
                accessed = device.stat().st_atime
            except OSError:  # gone since the glob
                continue
            latest = accessed if latest is None else max(latest, accessed)
        return None if latest is None else max(0.0, self.clock() - latest)

    def on_battery(self) -> bool | None:
        # A battery discharging while no charger is online. Batteries of a mouse or a
        # headset (scope Device) say nothing of the machine; "Not charging" and "Full"
        # are on a charger.
        try:
            supplies = list(self.power.iterdir())
        except OSError:
            return None
        if not supplies:
            return None
        discharging = False
        for supply in supplies:
            kind = _read(supply / "type")
            if kind is None:
                continue
            if kind != "Battery" and _read(supply / "online") == "1":
                return False
            if kind == "Battery" and _read(supply / "scope") != "Device":
                discharging |= _read(supply / "status") == "Discharging"
        return discharging

    def cpu_times(self) -> CpuTimes | None:
        stat = _read(self.proc / "stat")
        if stat is None or not stat.startswith("cpu "):
            return None
        # user nice system idle iowait irq softirq steal (guest time is within user's)
        ticks = [int(n) for n in stat.split("\n", 1)[0].split()[1:9]]
        idle = ticks[3] + ticks[4]
        busy = sum(ticks) - idle
        return CpuTimes(busy=busy, total=busy + idle, own=self._own_ticks())

    def _own_ticks(self) -> float:
        """The CPU time of this process, its children alive (a backend's workers) and
        those it has waited for."""
        children: dict[int, list[int]] = {}
        spent: dict[int, int] = {}
        for pid, fields in self._stats():
            children.setdefault(int(fields[1]), []).append(pid)
            # utime stime cutime cstime: the process's and its waited-for children's
            spent[pid] = sum(int(n) for n in fields[11:15])
        total, todo = 0, [self.pid]
        while todo:
            pid = todo.pop()
            total += spent.get(pid, 0)
            todo += children.get(pid, [])
        return total

    def _stats(self) -> Iterable[tuple[int, list[str]]]:
        """Each process's /proc/<pid>/stat fields after its name (state first)."""
        for entry in _processes(self.proc):
            text = _read(entry / "stat")
            if text is not None and ")" in text:
                # The name is in parentheses and may hold spaces and parentheses itself.
                yield int(entry.name), text[text.rindex(")") + 1 :].split()

    def programs(self) -> set[str]:
        names = set()
        for entry in _processes(self.proc):
            comm = _read(entry / "comm")
            if comm:
                names.add(comm)
            try:
                exe = os.readlink(entry / "exe")
            except OSError:  # another user's process, a kernel thread, or gone
                continue
            # An executable replaced while it runs (an upgrade) reads "... (deleted)".
            names.add(os.path.basename(exe.removesuffix(" (deleted)")))
        return names


def _processes(proc: Path) -> Iterable[Path]:
    try:
        return [entry for entry in proc.iterdir() if entry.name.isdigit()]
    except OSError:
        return []


def _read(path: Path) -> str | None:
    """A small /proc or /sys file's text, stripped; None where it is not to be read."""
    try:
        return path.read_text(errors="replace").strip()
    except OSError:
        return None


# ---- the weekly schedule -----------------------------------------------------------


@dataclass(frozen=True)
class Window:
    """One weekly window: on each of ``days`` (0 is Monday) from ``start`` to ``end``,
    seconds after midnight; an end at or before the start is the next day's."""

    days: frozenset[int]
    start: int
    end: int

    def spans(self) -> list[tuple[int, int]]:
        """Its spans as (start, length): the start in seconds of the week from Monday
        00:00, the length in seconds (Sunday's may run into the next week's Monday)."""
        length = self.end - self.start if self.end > self.start else _DAY - self.start + self.end
        return [(day * _DAY + self.start, length) for day in sorted(self.days)]


def parse_window(text: str) -> Window:
    """A schedule entry: days ("mon", "mon-fri", "fri-mon", "daily"; none: daily), a
    time range ("18:00-08:00"; none: the whole day), or both. ValueError: what is wrong,
    to follow the entry's name."""
    m = _WINDOW.fullmatch(text.strip().lower())
    if m is None or not (m["first"] or m["start"]):
        raise ValueError(f"is not a weekly window like {WINDOW_FORMAT}")
    days = frozenset(range(7))
    if m["first"] and not (m["first"] == "daily" and m["last"] is None):
        first, last = _DAY_OF.get(m["first"]), _DAY_OF.get(m["last"] or m["first"])
        if first is None or last is None:
            raise ValueError(f"names no day: use mon to sun or daily, as in {WINDOW_FORMAT}")
        days = frozenset((first + i) % 7 for i in range((last - first) % 7 + 1))
    start, end = 0, _DAY
    if m["start"]:
        start, end = _seconds(m["start"]), _seconds(m["end"])
        if start == _DAY:
            raise ValueError("starts at 24:00: write 00:00")
        if start == end:
            raise ValueError("ends when it starts (00:00-24:00 is the whole day)")
    return Window(days, start, end)


def _seconds(clock: str) -> int:
    hours, minutes = (int(n) for n in clock.split(":"))
    if minutes > 59 or hours * 60 + minutes > 24 * 60:
        raise ValueError(f"has no time {clock}: times run from 00:00 to 24:00")
    return hours * 3600 + minutes * 60


def _opening(windows: list[Window], now: datetime) -> str | None:
    """None while a window is open; else when the next one opens ("mon 18:00")."""
    second = now.weekday() * _DAY + now.hour * 3600 + now.minute * 60 + now.second
    spans = [span for window in windows for span in window.spans()]
    if any((second - start) % _WEEK < length for start, length in spans):
        return None
    start = min((span[0] for span in spans), key=lambda start: (start - second) % _WEEK)
    day, time_of_day = divmod(start, _DAY)
    return f"{_DAYS[day][:3]} {time_of_day // 3600:02d}:{time_of_day % 3600 // 60:02d}"


# ---- the judgement -----------------------------------------------------------------


class Conditions:
    """The holds the "When to run" settings put on the node, judged on ``machine``;
    ``gpu``: whether the node generates on a GPU (pause_gpu_while_active holds only
    then). Keeps the load of the last minute between calls."""

    owns = CONDITION_HOLDS

    def __init__(self, settings: NodeSettings, machine: Machine, *, gpu: bool) -> None:
        self.machine = machine
        self.gpu = gpu
        self._samples: deque[tuple[float, CpuTimes]] = deque()
        self._told: set[str] = set()
        self.apply(settings)

    def apply(self, settings: NodeSettings) -> None:
        """Judges by `settings` from now on (node.toml changed while the daemon runs);
        the minute of load already sampled is kept."""
        self.settings = settings
        self._windows = [parse_window(entry) for entry in settings.schedule]
        self._programs = {name.casefold(): name for name in settings.pause_while_running}

    def holds(self, now: datetime) -> dict[Hold, str]:
        """Each condition that holds the node now, with what it says of itself. ``now``:
        the local time, tz-aware (``datetime.now().astimezone()``): the schedule reads its
        weekday and time of day, the load its timestamp, which a change to or from
        daylight saving time leaves steady."""
        if now.tzinfo is None:
            raise ValueError("now must be tz-aware: datetime.now().astimezone()")
        checks = {
            Hold.SCHEDULE: lambda: self._schedule(now),
            Hold.USER_ACTIVE: self._user_active,
            Hold.ON_BATTERY: self._battery,
            Hold.BUSY: lambda: self._busy(now.timestamp()),
            Hold.PROGRAM: self._program,
        }
        held = {}
        for hold, check in checks.items():
            # Every check runs, held or not: the load window goes on filling.
            detail = check()
            if detail is not None:
                held[hold] = detail
        return held

    def _schedule(self, now: datetime) -> str | None:
        if not self._windows:
            return None
        opening = _opening(self._windows, now)
        return None if opening is None else f"opens {opening}"

    def _user_active(self) -> str | None:
        s = self.settings
        if s.idle_minutes > 0:
            required, of = s.idle_minutes, "required"
        elif s.pause_gpu_while_active and self.gpu:
            required, of = ACTIVE_MINUTES, "a GPU node waits for"
        else:
            return None
        idle = self.machine.idle_seconds()
        if idle is None:
            self._tell_once(
                "idle", "this machine tells no keyboard or mouse input: it counts as idle"
            )
            return None
        if idle >= required * 60:
            return None
        # Whole minutes: the reason shown changes once a minute, not at every look.
        return f"no input for {int(idle // 60)} min of the {required:g} {of}"

    def _battery(self) -> str | None:
        if self.settings.pause_on_battery and self.machine.on_battery():
            return "work resumes on mains power"
        return None

    def _busy(self, now: float) -> str | None:
        limit = self.settings.max_other_load
        if limit == 0:
            return None
        times = self.machine.cpu_times()
        if times is None:
            self._tell_once("load", "this machine tells no CPU times: max_other_load is off")
            return None
        samples = self._samples
        while samples and samples[-1][0] > now:  # the clock was set back
            samples.pop()
        samples.append((now, times))
        # The oldest sample kept is the newest one at least a window old.
        while len(samples) > 1 and samples[1][0] <= now - LOAD_WINDOW_SECONDS:
            samples.popleft()
        since, first = samples[0]
        capacity = times.total - first.total
        if now - since < LOAD_WINDOW_SECONDS or capacity <= 0:
            return None  # not a whole window seen yet: a start on a busy moment waits
        # The node's own time is taken out: pausing it must not be what ends the hold.
        other = (times.busy - first.busy) - (times.own - first.own)
        percent = round(100 * max(0.0, other) / capacity)
        if percent <= limit:
            return None
        return f"other processes keep the CPUs {percent}% busy (limit {limit}%)"

    def _program(self) -> str | None:
        if not self._programs:
            return None
        running = {name.casefold() for name in self.machine.programs()}
        # comm holds a long name's first characters only.
        found = [
            name
            for key, name in self._programs.items()
            if key in running or key[:COMM_CHARS] in running
        ]
        if not found:
            return None
        return f"{', '.join(found)} {'runs' if len(found) == 1 else 'run'}"

    def _tell_once(self, key: str, message: str) -> None:
        if key not in self._told:
            self._told.add(key)
            log.info(message)
