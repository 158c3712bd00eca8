"""The CLI contract: every `swarmrl` command, given bad input, ends in exit 1 (bad
input) or 2 (bad command line) with one sentence on stderr, leaves no partial output,
no process and no changed state behind.

The commands and their parameters are read from the typer app, so a new command is
covered as soon as it exists (`test_every_parameter_has_a_meaning` asks for the
meaning of a new path or text parameter once). The fast form runs each case inside
one worker process (an import of swarmrl per case would cost more than the case);
`SWARMRL_CONTRACT=long` runs every case in a process of its own and adds the huge
inputs. Interrupts and concurrent runs always get real processes.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from swarmrl.cli import app
from tests.cli_contract import procs
from tests.cli_contract.commands import discover
from tests.cli_contract.matrix import (
    BAD_INPUT,
    Case,
    build_cases,
    build_relative_pairs,
    unknown_params,
)
from tests.cli_contract.runner import (
    INTERRUPTED,
    failures,
    relative_differences,
    run_alone,
    run_batch,
    start,
    summary,
)
from tests.cli_contract.world import PASSWORD, build_world, wrong_chain_rpc

LONG = os.environ.get("SWARMRL_CONTRACT") == "long"
# A refusal takes well under a second; this only bounds a command that accepted a
# bad value and started working on it.
CASE_TIMEOUT = 120 if LONG else 30
COMMANDS = discover(app)


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    with wrong_chain_rpc() as rpc_url:
        yield build_world(tmp_path_factory.mktemp("contract"), rpc_url, huge_files=LONG)


@pytest.fixture(scope="module")
def outcomes(request, world):
    """The outcome of every case of the commands this session selected, run once."""
    selected = {
        item.callspec.params["command"]
        for item in request.session.items
        if item.originalname == "test_bad_input_is_refused_cleanly"
    }
    commands = [c for c in COMMANDS if c.shown in selected]
    cases = build_cases(world, commands, long=LONG)
    if LONG:
        results = [run_alone(world, c, timeout=CASE_TIMEOUT) for c in cases]
    else:
        results = run_batch(world, cases, timeout=CASE_TIMEOUT)
    by_command: dict[str, list] = {}
    for outcome in results:
        by_command.setdefault(outcome.case.command, []).append(outcome)
    return by_command


def test_every_parameter_has_a_meaning():
    """A path or text parameter gets bad values by what it holds (a model folder, an
    address): a new one needs its meaning in tests/cli_contract/matrix.py."""
    assert unknown_params(COMMANDS) == []


def test_every_command_gets_cases(world):
    cases = build_cases(world, COMMANDS, long=LONG)
    covered = {c.command for c in cases}
    assert covered == {c.shown for c in COMMANDS}
    for case in cases:
        assert case.argv[: len(case.command.split())] == tuple(case.command.split())


@pytest.mark.slow
@pytest.mark.parametrize("command", [c.shown for c in COMMANDS])
def test_bad_input_is_refused_cleanly(outcomes, command):
    mine = outcomes[command]
    assert mine, f"no cases ran for {command}"
    if failures(mine):
        pytest.fail(summary(mine), pytrace=False)


# A relative path is the caller's: relative to the working folder of the command, never
# to a config file's folder, a default folder or anything else (the demo's default
# `--out demo` once reached its orchestrator as demo/run/demo/run/...).

WITH_PATHS = [c.shown for c in COMMANDS if any(p.kind == "path" for p in c.params)]


@pytest.fixture(scope="module")
def relative_outcomes(request, world):
    """Each selected command's path parameters given absolute and relative, run once."""
    selected = {
        item.callspec.params["command"]
        for item in request.session.items
        if item.originalname == "test_a_relative_path_is_the_callers"
    }
    pairs = build_relative_pairs(world, [c for c in COMMANDS if c.shown in selected])
    cases = [case for pair in pairs for case in (pair.absolute, pair.relative)]
    if LONG:
        results = [run_alone(world, c, timeout=CASE_TIMEOUT) for c in cases]
    else:
        results = run_batch(world, cases, timeout=CASE_TIMEOUT)
    by_ident = {outcome.case.ident: outcome for outcome in results}
    by_command: dict[str, list] = {}
    for pair in pairs:
        outcomes = (by_ident[pair.absolute.ident], by_ident[pair.relative.ident])
        by_command.setdefault(pair.command, []).append((pair, *outcomes))
    return by_command


def test_every_path_parameter_gets_a_relative_case(world):
    pairs = build_relative_pairs(world, COMMANDS)
    given = {(pair.command, pair.label.split()[0]) for pair in pairs}
    assert given == {(c.shown, p.shown) for c in COMMANDS for p in c.params if p.kind == "path"}
    for pair in pairs:
        absolute = pair.given[pair.absolute.ident][0]
        relative = pair.given[pair.relative.ident][0]
        assert Path(absolute).is_absolute()
        assert absolute in pair.absolute.argv
        assert not Path(relative).is_absolute()
        assert relative in pair.relative.argv


@pytest.mark.slow
@pytest.mark.parametrize("command", WITH_PATHS)
def test_a_relative_path_is_the_callers(world, relative_outcomes, command):
    """Each path given relative to the command's folder does what it does given
    absolute: the same exit and sentence, the same files made in the same places."""
    problems = []
    for pair, absolute, relative in relative_outcomes[command]:
        for difference in relative_differences(world, pair, absolute, relative):
            problems.append(
                f"[{command}] {pair.label}\n  $ {relative.case.shown()}\n  {difference}"
            )
    if problems:
        pytest.fail("\n\n".join(problems), pytrace=False)


# The harness itself: on a command line that keeps the contract it finds nothing,
# and it finds each way of breaking it.

SAMPLE_ENTRY = "tests.cli_contract.sample_app:main"


@pytest.fixture(scope="module")
def sample_outcomes(world):
    from tests.cli_contract.sample_app import app as sample_app

    cases = build_cases(world, discover(sample_app), long=False)
    outcomes = run_batch(world, cases, timeout=5, entry=SAMPLE_ENTRY)
    by_command: dict[str, list] = {}
    for outcome in outcomes:
        by_command.setdefault(outcome.case.command, []).append(outcome)
    return by_command


@pytest.mark.slow
def test_the_harness_passes_a_command_that_keeps_the_contract(sample_outcomes):
    good = sample_outcomes["good"]
    assert len(good) > 10
    if failures(good):
        pytest.fail(summary(good), pytrace=False)


@pytest.mark.slow
@pytest.mark.parametrize(
    ("command", "violation"),
    [
        ("crash", "an exception escaped the entry point"),
        ("chatty", "stderr has 2 lines, not one sentence"),
        ("messy", "left in its folder: created"),
        ("orphan", "left running: pid"),
        ("stateful", "changed state: created"),
        ("slow", "still running at its time limit"),
    ],
)
def test_the_harness_finds_each_breach(sample_outcomes, command, violation):
    found = [v for o in failures(sample_outcomes[command]) for v in o.violations()]
    assert any(v.startswith(violation) for v in found), found


@pytest.mark.slow
def test_the_harness_finds_a_relative_path_taken_as_relative_to_something_else(world):
    from tests.cli_contract.sample_app import app as sample_app

    pairs = build_relative_pairs(world, discover(sample_app))
    cases = [case for pair in pairs for case in (pair.absolute, pair.relative)]
    outcomes = {o.case.ident: o for o in run_batch(world, cases, timeout=5, entry=SAMPLE_ENTRY)}

    def differences(command: str) -> list[str]:
        return [
            difference
            for pair in pairs
            if pair.command == command
            for difference in relative_differences(
                world, pair, outcomes[pair.absolute.ident], outcomes[pair.relative.ident]
            )
        ]

    assert differences("good") == []
    elsewhere = differences("elsewhere")
    assert any(
        d.startswith("made: given absolute ['created <path>'], relative []") for d in elsewhere
    )
    assert any(d.startswith("changed: ") for d in elsewhere), elsewhere
    assert differences("writer") == [
        "wrote <cwd>/out.parquet: given absolute 'data_dir = \"<path>\"', relative "
        "'data_dir = \"given-here\"'"
    ]


@pytest.mark.slow
def test_the_harness_finds_a_breach_in_a_process_of_its_own(world):
    """The same checks on a real process: one left in another session is found."""
    case = Case("alone-orphan", "orphan", "--n 2", ("orphan", "--n", "2"), BAD_INPUT)
    program = [sys.executable, "-m", "tests.cli_contract.sample_app"]
    outcome = run_alone(world, case, timeout=60, program=program)
    assert outcome.code == 1
    assert any(v.startswith("left running: pid") for v in outcome.violations())


# Real processes: Ctrl-C in the middle of work, and two runs at once.


@pytest.fixture(scope="module")
def many_tasks(world):
    """Enough tasks that sampling them on the tiny model runs for minutes."""
    from orchestrator.tasks.generators import demo_tasks
    from swarmrl.tasks import write_tasks

    path = world.root / "many-tasks.parquet"
    write_tasks(demo_tasks(256, seed=1), path)
    return path


LONG_RUNS = {
    "tasks filter": ["--k", "8", "--max-tokens", "64", "--device", "cpu"],
    "rollouts generate": ["--n", "8", "--max-tokens", "64", "--targets", "64", "--device", "cpu"],
    "eval": ["--n", "8", "--max-tokens", "64", "--device", "cpu"],
}


@pytest.mark.slow
@pytest.mark.parametrize("command", list(LONG_RUNS))
def test_ctrl_c_mid_run_leaves_nothing_behind(world, many_tasks, command):
    scratch = world.root / "cases" / f"interrupt-{command.replace(' ', '-')}"
    argv = [*command.split(), "--model", str(world.valid["model"]), "--tasks", str(many_tasks)]
    if command != "eval":
        argv += ["--out", str(scratch / "out.parquet")]
    case = Case(scratch.name, command, "Ctrl-C mid-run", (*argv, *LONG_RUNS[command]), INTERRUPTED)
    # Seconds enough for the imports and the model to load, so that the interrupt
    # lands in the work; whenever it lands, the contract is the same.
    outcome = run_alone(world, case, timeout=120, interrupt_after=8)
    assert outcome.code is not None, "the command outlived its interrupt"
    assert outcome.code != 0, "the work finished before the interrupt; give it more"
    assert not outcome.violations(), outcome.describe()


def _together(world, cwd: Path, *argvs: list[str]) -> list[tuple[int | None, str, str]]:
    """Start every command line at once; (exit code, stdout, stderr) of each."""
    runs = [start(world, argv, cwd) for argv in argvs]
    return [run.finish(timeout=120) for run in runs]


def test_two_new_keys_of_one_name_at_once_make_one_key(world, tmp_path):
    keystores = tmp_path / "keystores"
    argv = ["wallet", "new", "twin", "--keystore-dir", str(keystores)]
    results = sorted(_together(world, tmp_path, argv, argv))
    assert [code for code, _, _ in results] == [0, 1], results
    loser_stderr = results[1][2]
    assert len(loser_stderr.strip().splitlines()) == 1, loser_stderr
    assert "Traceback" not in loser_stderr
    assert [p.name for p in keystores.iterdir()] == ["twin.json"]
    from swarmrl import keystore

    keystore.unlock(keystores, "twin", PASSWORD)
    assert procs.marked(world.env[procs.MARK_VARIABLE]) == {}


def test_two_writers_of_one_task_file_leave_one_whole_file(world, tmp_path):
    out = tmp_path / "tasks.parquet"
    results = _together(
        world,
        tmp_path,
        *(["tasks", "generate", "--n", "64", "--seed", seed, "--out", str(out)] for seed in "12"),
    )
    assert [code for code, _, _ in results] == [0, 0], results
    from swarmrl.tasks import read_tasks

    assert len(read_tasks(out)) == 64
    assert [p.name for p in tmp_path.iterdir()] == ["tasks.parquet"]


@pytest.mark.slow
def test_two_chains_up_on_one_state_dir_start_one(world, tmp_path):
    argv = ["chain", "up", "--state-dir", str(tmp_path / "chain")]
    try:
        results = sorted(_together(world, tmp_path, argv, argv), key=str)
    finally:
        down = start(world, ["chain", "down", "--state-dir", str(tmp_path / "chain")], tmp_path)
        down_code, _, down_stderr = down.finish(timeout=120)
    assert [code for code, _, _ in results] == [0, 1], results
    loser_stderr = results[1][2]
    assert len(loser_stderr.strip().splitlines()) == 1, loser_stderr
    assert "Traceback" not in loser_stderr
    assert down_code == 0, down_stderr
    assert procs.marked(world.env[procs.MARK_VARIABLE]) == {}
