"""When the node may work: each "When to run" setting enforced through a fake machine and
a fake clock, the Linux machine read from a fake /proc, /sys and /dev (and once from the
real one), and the settings' refusals in one sentence."""

from __future__ import annotations

import logging
import os
import sys
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path

import pytest

from client.node.machine.conditions import (
    CONDITION_HOLDS,
    Conditions,
    CpuTimes,
    LinuxMachine,
)
from client.node.machine.holds import Hold
from client.node.settings import NodeSettings
from swarmrl.settings_toml import load_settings

MONDAY = datetime(2024, 1, 1, tzinfo=UTC)  # a Monday, 00:00
CORES = 4
TICKS = 100  # clock ticks per second of one core


@dataclass
class FakeMachine:
    idle: float | None = 3600.0
    battery: bool | None = False
    times: CpuTimes | None = field(default_factory=lambda: CpuTimes(busy=0, total=0, own=0))
    running: set[str] = field(default_factory=set)
    reads: list[str] = field(default_factory=list)

    def idle_seconds(self) -> float | None:
        self.reads.append("idle")
        return self.idle

    def on_battery(self) -> bool | None:
        self.reads.append("battery")
        return self.battery

    def cpu_times(self) -> CpuTimes | None:
        self.reads.append("cpu")
        return self.times

    def programs(self) -> set[str]:
        self.reads.append("programs")
        return set(self.running)

    def spend(self, seconds: float, busy: float, own: float = 0.0) -> None:
        """``seconds`` pass with the CPUs ``busy`` (a share of all cores), ``own`` of it
        the node's."""
        assert self.times is not None
        capacity = seconds * CORES * TICKS
        self.times = CpuTimes(
            busy=self.times.busy + busy * capacity,
            total=self.times.total + capacity,
            own=self.times.own + own * capacity,
        )


def settings(**values: object) -> NodeSettings:
    return NodeSettings(data_dir=Path("/nonexistent"), keystore_dir=Path("/nonexistent"), **values)


def at(day: int, hour: int = 0, minute: int = 0) -> datetime:
    """Monday is day 0 of the week of MONDAY; day 7 is the next Monday."""
    return MONDAY + timedelta(days=day, hours=hour, minutes=minute)


# ---- idle and the GPU ------------------------------------------------------------------


def test_idle_minutes_holds_until_the_input_is_old_enough():
    machine = FakeMachine(idle=120)
    conditions = Conditions(settings(idle_minutes=10), machine, gpu=False)
    assert conditions.holds(MONDAY) == {Hold.USER_ACTIVE: "no input for 2 min of the 10 required"}
    machine.idle = 599.9
    assert conditions.holds(MONDAY) == {Hold.USER_ACTIVE: "no input for 9 min of the 10 required"}
    machine.idle = 600
    assert conditions.holds(MONDAY) == {}
    machine.idle = 4  # someone is back
    assert conditions.holds(MONDAY) == {Hold.USER_ACTIVE: "no input for 0 min of the 10 required"}


def test_without_idle_minutes_a_cpu_node_works_while_someone_types():
    machine = FakeMachine(idle=0)
    assert Conditions(settings(), machine, gpu=False).holds(MONDAY) == {}
    assert "idle" not in machine.reads  # no setting needs it: not asked
    off = settings(pause_gpu_while_active=False)
    assert Conditions(off, machine, gpu=True).holds(MONDAY) == {}


def test_a_gpu_node_pauses_while_the_machine_is_in_use():
    machine = FakeMachine(idle=60)
    gpu = Conditions(settings(), machine, gpu=True)
    assert gpu.holds(MONDAY) == {
        Hold.USER_ACTIVE: "no input for 1 min of the 3 a GPU node waits for"
    }
    machine.idle = 180
    assert gpu.holds(MONDAY) == {}
    # With idle_minutes set, "in use" is input within idle_minutes, for any node.
    machine.idle = 300
    waiting = Conditions(settings(idle_minutes=7.5), machine, gpu=True)
    assert waiting.holds(MONDAY) == {Hold.USER_ACTIVE: "no input for 5 min of the 7.5 required"}


def test_a_machine_that_tells_no_input_counts_as_idle_and_says_so_once(caplog):
    conditions = Conditions(settings(idle_minutes=10), FakeMachine(idle=None), gpu=True)
    with caplog.at_level(logging.INFO, logger="swarmrl.node"):
        assert conditions.holds(MONDAY) == {}
        assert conditions.holds(MONDAY) == {}
    assert [r.getMessage() for r in caplog.records] == [
        "this machine tells no keyboard or mouse input: it counts as idle"
    ]


# ---- the schedule ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("schedule", "now", "held"),
    [
        # Weekday evenings into the next morning.
        (["mon-fri 18:00-08:00"], at(0, 17, 59), "opens mon 18:00"),
        (["mon-fri 18:00-08:00"], at(0, 18), None),
        (["mon-fri 18:00-08:00"], at(1, 7, 59), None),  # past midnight
        (["mon-fri 18:00-08:00"], at(1, 8), "opens tue 18:00"),
        (["mon-fri 18:00-08:00"], at(5, 7, 59), None),  # Friday's runs into Saturday
        (["mon-fri 18:00-08:00"], at(5, 8), "opens mon 18:00"),  # across the week's end
        (["mon-fri 18:00-08:00"], at(6, 23, 59), "opens mon 18:00"),
        (["mon-fri 18:00-08:00"], at(7, 7), "opens mon 18:00"),  # Sunday's is no window
        # Sunday night into Monday: the window wraps past the week's end.
        (["sun 22:00-02:00"], at(6, 22), None),
        (["sun 22:00-02:00"], at(7, 1, 59), None),
        (["sun 22:00-02:00"], at(7, 2), "opens sun 22:00"),
        # Whole days.
        (["sat-sun"], at(4, 23, 59), "opens sat 00:00"),
        (["sat-sun"], at(5), None),
        (["sat-sun"], at(6, 23, 59), None),
        (["sat-sun"], at(7), "opens sat 00:00"),
        (["Fri-Mon"], at(7, 12), None),  # a day range across the week's end
        (["Fri-Mon"], at(8, 12), "opens fri 00:00"),
        (["wednesday"], at(2, 12), None),
        # Every day, with "daily" or with no days.
        (["daily 22:00-07:00"], at(2, 6, 59), None),
        (["daily 22:00-07:00"], at(2, 7), "opens wed 22:00"),
        (["22:00-07:00"], at(3, 23), None),
        (["22:00-07:00"], at(3, 21), "opens thu 22:00"),
        (["daily"], at(3, 21), None),
        (["mon 00:00-24:00"], at(0, 23, 59), None),
        # Several windows: open in any of them, and the nearest opening said.
        (["mon-fri 18:00-08:00", "sat-sun"], at(5, 12), None),
        (["mon-fri 18:00-08:00", "sat-sun"], at(0, 7), "opens mon 18:00"),
        (["mon 20:00-21:00", "mon 19:00-20:00"], at(0, 12), "opens mon 19:00"),
        # No schedule: any time.
        ([], at(3, 4, 5), None),
    ],
)
def test_the_schedule(schedule, now, held):
    conditions = Conditions(settings(schedule=schedule), FakeMachine(), gpu=False)
    assert conditions.holds(now) == ({Hold.SCHEDULE: held} if held else {})


def test_the_schedule_reads_the_wall_clock_of_now():
    berlin = timezone(timedelta(hours=2))
    conditions = Conditions(settings(schedule=["mon 18:00-19:00"]), FakeMachine(), gpu=False)
    assert conditions.holds(datetime(2024, 1, 1, 18, 30, tzinfo=berlin)) == {}
    # 18:30 in Berlin is 16:30 UTC: the same instant read in UTC is outside the window.
    assert Hold.SCHEDULE in conditions.holds(datetime(2024, 1, 1, 16, 30, tzinfo=UTC))


def test_a_time_without_a_zone_is_refused():
    conditions = Conditions(settings(), FakeMachine(), gpu=False)
    with pytest.raises(ValueError, match="tz-aware"):
        conditions.holds(datetime(2024, 1, 1, 12))


# ---- battery ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("pause_on_battery", "on_battery", "held"),
    [
        (True, True, True),
        (True, False, False),
        (True, None, False),  # no power supply told of: a desktop
        (False, True, False),
    ],
)
def test_battery(pause_on_battery, on_battery, held):
    machine = FakeMachine(battery=on_battery)
    conditions = Conditions(settings(pause_on_battery=pause_on_battery), machine, gpu=False)
    expected = {Hold.ON_BATTERY: "work resumes on mains power"} if held else {}
    assert conditions.holds(MONDAY) == expected


# ---- other processes' load ---------------------------------------------------------------


def run_for(conditions, machine, start, seconds, busy, own=0.0, every=5):
    """The daemon's looks every ``every`` seconds for ``seconds``, the CPUs ``busy`` all
    along: the BUSY detail of each look (None: not held) and the time after."""
    seen = []
    for _ in range(int(seconds // every)):
        machine.spend(every, busy, own)
        start += timedelta(seconds=every)
        seen.append(conditions.holds(start).get(Hold.BUSY))
    return seen, start


def test_a_busy_moment_does_not_pause_the_node():
    machine = FakeMachine()
    conditions = Conditions(settings(max_other_load=50), machine, gpu=False)
    assert conditions.holds(MONDAY) == {}
    seen, now = run_for(conditions, machine, MONDAY, 60, busy=0.1)
    seen2, now = run_for(conditions, machine, now, 5, busy=1.0)  # all cores, for 5 s
    seen3, _ = run_for(conditions, machine, now, 120, busy=0.1)
    assert seen + seen2 + seen3 == [None] * (12 + 1 + 24)


def test_a_sustained_load_pauses_the_node_until_it_falls():
    machine = FakeMachine()
    conditions = Conditions(settings(max_other_load=50), machine, gpu=False)
    conditions.holds(MONDAY)
    seen, now = run_for(conditions, machine, MONDAY, 60, busy=0.9)
    # Busy from the start, but held only once a whole minute was seen.
    assert seen == [None] * 11 + ["other processes keep the CPUs 90% busy (limit 50%)"]
    seen, now = run_for(conditions, machine, now, 60, busy=0.9)
    assert set(seen) == {"other processes keep the CPUs 90% busy (limit 50%)"}
    # Quiet again: held while the minute's average is over the limit, not after.
    seen, _ = run_for(conditions, machine, now, 60, busy=0.0)
    assert seen[0] is not None
    assert seen[-1] is None
    cleared = seen.index(None)
    assert all(s is not None for s in seen[:cleared])
    assert all(s is None for s in seen[cleared:])


def test_the_nodes_own_cpu_time_does_not_count():
    machine = FakeMachine()
    conditions = Conditions(settings(max_other_load=50), machine, gpu=False)
    conditions.holds(MONDAY)
    seen, now = run_for(conditions, machine, MONDAY, 120, busy=0.95, own=0.9)
    assert set(seen) == {None}
    seen, _ = run_for(conditions, machine, now, 65, busy=0.95, own=0.3)
    assert seen[-1] == "other processes keep the CPUs 65% busy (limit 50%)"


def test_a_clock_set_back_starts_the_minute_again():
    machine = FakeMachine()
    conditions = Conditions(settings(max_other_load=50), machine, gpu=False)
    conditions.holds(MONDAY)
    _, now = run_for(conditions, machine, MONDAY, 60, busy=0.9)
    assert Hold.BUSY in conditions.holds(now)
    seen, _ = run_for(conditions, machine, now - timedelta(hours=1), 55, busy=0.9)
    assert set(seen) == {None}  # under a minute seen since the clock moved back


def test_no_load_limit_reads_no_cpu_times_and_no_cpu_times_is_said_once(caplog):
    machine = FakeMachine()
    Conditions(settings(), machine, gpu=False).holds(MONDAY)
    assert "cpu" not in machine.reads
    blind = Conditions(settings(max_other_load=10), FakeMachine(times=None), gpu=False)
    with caplog.at_level(logging.INFO, logger="swarmrl.node"):
        assert blind.holds(MONDAY) == {}
        assert blind.holds(MONDAY + timedelta(minutes=5)) == {}
    assert [r.getMessage() for r in caplog.records] == [
        "this machine tells no CPU times: max_other_load is off"
    ]


# ---- programs ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("running", "held"),
    [
        ({"firefox", "bash"}, None),
        ({"blender"}, "Blender runs"),
        ({"steam", "blender", "firefox"}, "steam, Blender run"),
        ({"a-very-long-pro"}, "a-very-long-program runs"),  # comm keeps 15 characters
        ({"a-very-long-program"}, "a-very-long-program runs"),  # the executable's name
    ],
)
def test_programs_that_pause_work(running, held):
    chosen = settings(pause_while_running=["steam", "Blender", "a-very-long-program", "steam"])
    conditions = Conditions(chosen, FakeMachine(running=running), gpu=False)
    assert conditions.holds(MONDAY) == ({Hold.PROGRAM: held} if held else {})


def test_every_condition_at_once():
    machine = FakeMachine(idle=0, battery=True, running={"steam"})
    chosen = settings(
        idle_minutes=1,
        max_other_load=20,
        schedule=["sat-sun"],
        pause_while_running=["steam"],
    )
    conditions = Conditions(chosen, machine, gpu=True)
    conditions.holds(MONDAY)
    _, now = run_for(conditions, machine, MONDAY, 60, busy=0.5)
    assert set(conditions.holds(now)) == CONDITION_HOLDS


# ---- the Linux machine, on a fake tree -------------------------------------------------


def touch(path: Path, text: str = "", atime: float | None = None) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    if atime is not None:
        os.utime(path, (atime, 1.0))
    return path


def test_idle_is_the_newest_access_to_an_input_device_or_terminal(tmp_path):
    now = 1_700_000_000.0
    machine = LinuxMachine(tmp_path, clock=lambda: now)
    assert machine.idle_seconds() is None  # a machine without either
    touch(tmp_path / "dev" / "input" / "event0", atime=now - 900)
    touch(tmp_path / "dev" / "input" / "mice", atime=now)  # not an event device
    touch(tmp_path / "dev" / "tty1", atime=now - 3000)
    touch(tmp_path / "dev" / "tty", atime=now)  # the controlling terminal, not a console
    touch(tmp_path / "dev" / "pts" / "ptmx", atime=now)  # the multiplexer, no session
    assert machine.idle_seconds() == 900
    touch(tmp_path / "dev" / "pts" / "3", atime=now - 42)
    assert machine.idle_seconds() == 42
    touch(tmp_path / "dev" / "pts" / "4", atime=now + 60)  # a clock behind the file's
    assert machine.idle_seconds() == 0


def supply(root: Path, name: str, **files: str) -> None:
    for key, value in files.items():
        touch(root / "sys" / "class" / "power_supply" / name / key, value + "\n")


def test_on_battery_is_a_discharging_battery_with_no_charger_online(tmp_path):
    machine = LinuxMachine(tmp_path)
    assert machine.on_battery() is None  # no power supply told of
    supply(tmp_path, "hidpp_battery_0", type="Battery", scope="Device", status="Discharging")
    assert machine.on_battery() is False  # a desktop with a wireless mouse
    supply(tmp_path, "BAT0", type="Battery", status="Discharging")
    supply(tmp_path, "AC", type="Mains", online="0")
    assert machine.on_battery() is True
    supply(tmp_path, "AC", type="Mains", online="1")
    assert machine.on_battery() is False
    supply(tmp_path, "AC", type="Mains", online="0")
    supply(tmp_path, "ucsi-source-psy-1", type="USB", online="1")  # USB-C charging
    assert machine.on_battery() is False
    supply(tmp_path, "ucsi-source-psy-1", type="USB", online="0")
    supply(tmp_path, "BAT0", type="Battery", status="Not charging")  # a charge threshold
    assert machine.on_battery() is False


def process(root: Path, pid: int, ppid: int, comm: str, ticks: tuple[int, ...]) -> Path:
    """A /proc/<pid> with its stat (utime stime cutime cstime = ``ticks``) and comm."""
    folder = root / "proc" / str(pid)
    middle = " ".join(["0"] * 9)  # pgrp session tty_nr tpgid flags minflt cminflt ...
    stat = f"{pid} ({comm}) S {ppid} {middle} {' '.join(map(str, ticks))} 20 0 1 0 100\n"
    touch(folder / "stat", stat)
    touch(folder / "comm", comm + "\n")
    return folder


def test_cpu_times_count_the_node_and_its_children_as_its_own(tmp_path):
    machine = LinuxMachine(tmp_path, pid=100)
    assert machine.cpu_times() is None  # no /proc/stat
    touch(
        tmp_path / "proc" / "stat",
        "cpu  100 20 30 1000 50 5 5 10 7 0\ncpu0 1 2 3 4 5 6 7 8 0 0\nintr 1 2\n",
    )
    process(tmp_path, 1, 0, "systemd", (9, 9, 9, 9))
    process(tmp_path, 100, 1, "python3", (10, 5, 3, 2))  # the node
    process(tmp_path, 101, 100, "VLLM::Engine (1)", (40, 1, 0, 0))  # its worker
    process(tmp_path, 102, 101, "a) b", (7, 0, 0, 0))  # the worker's child
    process(tmp_path, 200, 1, "firefox", (500, 50, 0, 0))
    touch(tmp_path / "proc" / "self" / "stat", "not a process folder")
    assert machine.cpu_times() == CpuTimes(busy=170, total=1220, own=68)


def test_programs_are_names_and_executables(tmp_path):
    (tmp_path / "proc").mkdir()
    machine = LinuxMachine(tmp_path)
    assert machine.programs() == set()
    shell = process(tmp_path, 10, 1, "bash", (0, 0, 0, 0))
    (shell / "exe").symlink_to("/usr/bin/bash")
    content = process(tmp_path, 11, 1, "Web Content", (0, 0, 0, 0))
    (content / "exe").symlink_to("/opt/firefox/firefox (deleted)")  # upgraded meanwhile
    process(tmp_path, 12, 2, "kworker/0:1", (0, 0, 0, 0))  # no executable: a kernel thread
    assert machine.programs() == {"bash", "Web Content", "firefox", "kworker/0:1"}


def test_the_judgement_on_a_fake_tree(tmp_path):
    now = MONDAY.timestamp() + 30
    touch(tmp_path / "dev" / "pts" / "0", atime=now - 30)
    process(tmp_path, 10, 1, "steam", (0, 0, 0, 0))
    supply(tmp_path, "BAT1", type="Battery", status="Discharging")
    chosen = settings(idle_minutes=2, pause_while_running=["steam"])
    conditions = Conditions(chosen, LinuxMachine(tmp_path, clock=lambda: now), gpu=False)
    assert conditions.holds(MONDAY) == {
        Hold.USER_ACTIVE: "no input for 0 min of the 2 required",
        Hold.ON_BATTERY: "work resumes on mains power",
        Hold.PROGRAM: "steam runs",
    }


@pytest.mark.skipif(sys.platform != "linux", reason="reads /proc and /sys")
def test_the_real_machine_answers_without_raising():
    machine = LinuxMachine()
    idle = machine.idle_seconds()
    assert idle is None or (isinstance(idle, float) and idle >= 0)
    assert machine.on_battery() in (True, False, None)
    times = machine.cpu_times()
    assert times is not None
    assert 0 <= times.busy <= times.total
    assert times.own >= 0  # a fresh process may not have spent a tick yet
    programs = machine.programs()
    assert all(isinstance(name, str) and name for name in programs)
    assert any("python" in name or "pytest" in name for name in programs)  # this one


# ---- the settings ------------------------------------------------------------------------


@pytest.fixture
def clean_environment(monkeypatch):
    for name in list(os.environ):
        if name.upper().startswith("SWARMRL_"):
            monkeypatch.delenv(name)


def refusal(path: Path | None) -> str:
    with pytest.raises(ValueError, match=r".") as caught:
        load_settings(NodeSettings, path)
    message = str(caught.value)
    assert "\n" not in message
    return message


FORMAT = '"mon-fri 18:00-08:00", "sat-sun" or "daily 22:00-07:00"'


@pytest.mark.usefixtures("clean_environment")
@pytest.mark.parametrize(
    ("text", "sentence"),
    [
        (
            'schedule = ["mon-fry 18:00-08:00"]',
            f"schedule 'mon-fry 18:00-08:00' names no day: use mon to sun or daily, as in {FORMAT}",
        ),
        ('schedule = ["18:00"]', f"schedule '18:00' is not a weekly window like {FORMAT}"),
        ('schedule = [""]', f"schedule '' is not a weekly window like {FORMAT}"),
        (
            'schedule = ["sat-sun", "mon 25:00-26:00"]',
            "schedule 'mon 25:00-26:00' has no time 25:00: times run from 00:00 to 24:00",
        ),
        (
            'schedule = ["mon 18:60-19:00"]',
            "schedule 'mon 18:60-19:00' has no time 18:60: times run from 00:00 to 24:00",
        ),
        (
            'schedule = ["mon 08:00-08:00"]',
            "schedule 'mon 08:00-08:00' ends when it starts (00:00-24:00 is the whole day)",
        ),
        ('schedule = ["24:00-08:00"]', "schedule '24:00-08:00' starts at 24:00: write 00:00"),
        (
            'pause_while_running = ["/usr/bin/steam"]',
            "pause_while_running '/usr/bin/steam' must be a program's name, not a path: 'steam'",
        ),
        ('pause_while_running = [" "]', "pause_while_running has an empty name"),
        ("max_other_load = 101", "max_other_load must be at most 100, got 101"),
        ("idle_minutes = -1", "idle_minutes must be at least 0, got -1"),
    ],
)
def test_a_bad_condition_is_refused_in_one_sentence(tmp_path, text, sentence):
    path = tmp_path / "node.toml"
    path.write_text(text + "\n")
    assert refusal(path).startswith(f"{path}: {sentence}")


@pytest.mark.usefixtures("clean_environment")
def test_the_environment_gives_lists_separated_by_commas(tmp_path, monkeypatch):
    monkeypatch.setenv("SWARMRL_SCHEDULE", "mon-fri 18:00-08:00, sat-sun")
    monkeypatch.setenv("SWARMRL_PAUSE_WHILE_RUNNING", "steam,blender")
    node = load_settings(NodeSettings, None)
    assert node.schedule == ["mon-fri 18:00-08:00", "sat-sun"]
    assert node.pause_while_running == ["steam", "blender"]
    monkeypatch.setenv("SWARMRL_SCHEDULE", "sat-sun,funday")
    assert refusal(None).startswith("SWARMRL_SCHEDULE: schedule 'funday' names no day")
