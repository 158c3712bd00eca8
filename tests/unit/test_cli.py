"""The `swarmrl` command line: exit codes and messages."""

import re
import subprocess
import sys
from pathlib import Path

import typer
from typer.testing import CliRunner

import swarmrl

SWARMRL = Path(sys.executable).with_name("swarmrl")


def run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([SWARMRL, *args], capture_output=True, text=True, timeout=60)


def test_version():
    out = run("--version")
    assert out.returncode == 0
    assert out.stdout.strip() == f"swarmrl {swarmrl.__version__}"


def test_help_lists_the_commands():
    out = run("--help")
    assert out.returncode == 0
    for command in ("demo", "bench"):
        assert command in out.stdout


def test_a_malformed_command_line_exits_2():
    assert run("no-such-command").returncode == 2
    out = run("bench", "toploc", "--runs", "3")
    assert out.returncode == 2
    assert "greater than or equal to 9" in out.stderr


def _commands(command: object, path: tuple[str, ...] = ()) -> list[tuple]:
    """(words after `swarmrl`, command) for every command and group (typer's own click
    classes, hence no isinstance)."""
    found = [(path, command)]
    for name, sub in getattr(command, "commands", {}).items():
        found += _commands(sub, (*path, name))
    return found


def _bracketed(text: str | None) -> list[str]:
    return re.findall(r"\[[^\[\]]*\]", text or "")


def _flat(text: str) -> str:
    return " ".join(text.split())


def test_every_help_page_keeps_its_brackets_and_shows_no_flag_metavar():
    from swarmrl.cli import app

    commands = _commands(typer.main.get_command(app))
    assert len(commands) > 20  # the walk reached the sub-commands
    for path, command in commands:
        out = CliRunner().invoke(app, [*path, "--help"], terminal_width=100)
        where = " ".join(("swarmrl", *path))
        assert out.exit_code == 0, where
        page = _flat(out.output)
        texts = [command.help] + [getattr(p, "help", None) for p in command.params]
        for span in (s for text in texts for s in _bracketed(text)):
            assert _flat(span) in page, f"{where} --help lost {span}"
        assert "<bool>" not in page, where
        for option in command.params:
            if getattr(option, "is_flag", False):
                for name in option.opts:
                    assert not re.search(rf"{re.escape(name)} <", page), f"{where} {name}"


def test_tasks_filter_help_shows_the_band():
    out = run("tasks", "filter", "--help")
    assert out.returncode == 0
    assert "[min, max]" in _flat(out.stdout)
    assert "[default: 8; 1<=x<=1024]" in _flat(out.stdout)


def test_pretraining_reports_its_first_step_and_the_time_left(tmp_path):
    from orchestrator.pretrain import Progress, Recipe, build_default_model

    lines: list[str] = []
    recipe = Recipe(steps=3, batch=2, warmup=1)
    build_default_model(tmp_path / "m", recipe, progress=Progress(recipe.steps, lines.append))
    assert [line.split()[1] for line in lines] == ["1/3", "3/3"]
    assert re.fullmatch(r"step 1/3  loss \d+\.\d{3}  about \d+ s left", lines[0])
    assert lines[-1].endswith("about 0 s left")


def test_model_init_refuses_an_output_it_cannot_write_before_training(tmp_path):
    taken = tmp_path / "file"
    taken.write_text("mine")
    out = run("model", "init", "--out", str(taken))
    assert out.returncode == 1
    assert out.stderr == f"error: {taken} exists and is not a folder\n"
    assert taken.read_text() == "mine"
    out = run("model", "init", "--out", "/proc/swarmrl/default")
    assert out.returncode == 1
    assert (
        out.stderr
        == "error: cannot write /proc/swarmrl/default: the folder /proc is not writable\n"
    )
    out = run("model", "import-smollm2", "--out", str(taken / "smollm2"))
    assert out.returncode == 1
    assert out.stderr == f"error: cannot create {taken}/smollm2: {taken} is not a folder\n"
    for seed in ("-1", str(2**32), "1e3"):
        assert run("model", "init", "--out", str(tmp_path / "m"), "--seed", seed).returncode == 2
    assert not (tmp_path / "m").exists()
