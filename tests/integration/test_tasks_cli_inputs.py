"""Bad task files, bad output paths and out-of-range counts given to the commands that
read or write tasks, as a user types them: each ends in one `error:` sentence (exit 1)
or a usage error (exit 2), before any work, and leaves no output behind."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from orchestrator.tasks.generators import demo_tasks
from swarmrl.tasks import read_tasks, write_tasks
from tests.integration.test_rollouts_cli import swarmrl

# Not writable even by root: a pseudo-file system that takes no new files.
UNWRITABLE = Path("/proc")


@pytest.fixture
def good_tasks(tmp_path: Path) -> Path:
    path = tmp_path / "good.jsonl"
    write_tasks(demo_tasks(4, seed=0), path)
    return path


def bad_tasks_file(tmp_path: Path, kind: str) -> tuple[Path, str]:
    """A task file of one bad kind, and what the error must say about it."""
    path = tmp_path / f"{kind}.jsonl"
    if kind == "missing":
        return path, f"{path} does not exist"
    if kind == "directory":
        path.mkdir()
        return path, f"{path} is a directory; give a file"
    if kind == "empty":
        path.write_bytes(b"")
        return path, f"{path} holds no tasks"
    if kind == "blank":
        path.write_text("\n \n\t\n")
        return path, f"{path} holds no tasks"
    if kind == "latin1":
        path.write_bytes('{"prompt": "Wie viel ist fünf?"}\n'.encode("latin-1"))
        return path, f"{path}: line 1 is not UTF-8 text"
    if kind == "binary":
        path.write_bytes(bytes(range(255, -1, -1)) * 4)
        return path, f"{path}: line 1 is not UTF-8 text"
    if kind == "garbage-parquet":
        path = tmp_path / "garbage.parquet"
        path.write_bytes(b"PAR1" + b"\x00\xff" * 64 + b"PAR1")
        return path, f"{path} is not a readable parquet file"
    raise AssertionError(kind)


BAD_TASK_FILES = ["missing", "directory", "empty", "blank", "latin1", "binary", "garbage-parquet"]


def assert_one_sentence(out, says: str) -> None:
    assert out.returncode == 1, out.stderr
    assert out.stderr == f"error: {says}\n"
    assert out.stdout == ""


@pytest.mark.parametrize("kind", BAD_TASK_FILES)
def test_tasks_check_refuses_a_bad_task_file(tmp_path, kind):
    tasks, says = bad_tasks_file(tmp_path, kind)
    completions = tmp_path / "c.jsonl"
    completions.write_text(json.dumps({"problem_id": "x", "completion": "1"}) + "\n")
    out = swarmrl("tasks", "check", "--tasks", tasks, "--completions", completions, check=False)
    assert_one_sentence(out, says)


@pytest.mark.parametrize("kind", ["directory", "empty", "binary"])
def test_every_command_that_reads_tasks_refuses_a_bad_task_file(tmp_path, kind):
    tasks, says = bad_tasks_file(tmp_path, kind)
    # No model exists: the task file is refused before any model is looked at.
    model = tmp_path / "no-model"
    for command in (
        ["eval", "--model", model, "--tasks", tasks],
        ["tasks", "filter", "--model", model, "--tasks", tasks, "--out", tmp_path / "k.jsonl"],
        ["train", "local", "--model", model, "--tasks", tasks, "--out", tmp_path / "run"],
    ):
        assert_one_sentence(swarmrl(*command, check=False), says)
    assert not (tmp_path / "k.jsonl").exists()


@pytest.mark.parametrize("kind", ["missing", "directory", "empty", "latin1"])
def test_tasks_check_refuses_a_bad_completions_file(tmp_path, good_tasks, kind):
    completions, says = bad_tasks_file(tmp_path, kind)
    says = says.replace("holds no tasks", "holds no completions")
    out = swarmrl(
        "tasks", "check", "--tasks", good_tasks, "--completions", completions, check=False
    )
    assert_one_sentence(out, says)


def bad_outputs(tmp_path: Path) -> list[tuple[Path, str]]:
    folder = tmp_path / "folder.jsonl"
    folder.mkdir()
    a_file = tmp_path / "file"
    a_file.write_text("mine")
    return [
        (folder, f"{folder} is a directory; give a file name to write"),
        (a_file / "out.jsonl", f"cannot write {a_file}/out.jsonl: {a_file} is not a folder"),
        (
            a_file / "no" / "out.jsonl",
            f"cannot write {a_file}/no/out.jsonl: {a_file} is not a folder",
        ),
        (
            UNWRITABLE / "out.jsonl",
            "cannot write /proc/out.jsonl: the folder /proc is not writable",
        ),
        (
            tmp_path / "out.csv",
            f"{tmp_path}/out.csv: tasks are written as .parquet or .jsonl files",
        ),
    ]


def test_tasks_generate_checks_its_output_before_generating(tmp_path):
    for out, says in bad_outputs(tmp_path):
        assert_one_sentence(swarmrl("tasks", "generate", "--out", out, check=False), says)
    assert (tmp_path / "file").read_text() == "mine"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["file", "folder.jsonl"]


def test_tasks_generate_makes_the_folders_of_its_output(tmp_path):
    """docs/orchestrator.md's command on a fresh home, where ~/.local/share/swarmrl does not
    exist."""
    home = tmp_path / "home"
    home.mkdir()
    out = home / ".local" / "share" / "swarmrl" / "orchestrator" / "tasks.jsonl"  # as the shell
    swarmrl("tasks", "generate", "--n", "4", "--seed", "1", "--out", out)  # expands ~/...
    assert len(read_tasks(out)) == 4


def test_tasks_filter_checks_its_output_before_reading_tasks_or_the_model(tmp_path):
    for out, says in bad_outputs(tmp_path):
        out = swarmrl(
            "tasks", "filter", "--model", tmp_path / "no-model",
            "--tasks", tmp_path / "no-tasks.jsonl", "--out", out, check=False,
        )  # fmt: skip
        assert_one_sentence(out, says)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["file", "folder.jsonl"]


def test_train_local_checks_its_run_folder_first(tmp_path, good_tasks):
    taken = tmp_path / "file"
    taken.write_text("mine")
    out = swarmrl(
        "train", "local", "--model", tmp_path / "no-model", "--tasks", good_tasks, "--out", taken,
        check=False,
    )  # fmt: skip
    assert_one_sentence(out, f"{taken} exists and is not a folder")


@pytest.mark.parametrize(
    "args",
    [
        ["tasks", "generate", "--n", "100001"],
        ["tasks", "generate", "--n", "1e3"],
        ["tasks", "generate", "--n", "\uff11\uff10"],  # full-width digits
        ["tasks", "generate", "--seed", "-1"],
        ["tasks", "generate", "--seed", str(2**32)],
        ["tasks", "filter", "--k", "0"],
        ["tasks", "filter", "--k", "1025"],
        ["tasks", "filter", "--temperature", "inf"],
        ["tasks", "filter", "--min", "nan"],
        ["eval", "--n", "1025"],
        ["eval", "--batch-size", "4097"],
        ["train", "local", "--workers", "65"],
        ["train", "local", "--advantage-scale", "huge"],
    ],
)
def test_a_count_out_of_bounds_is_a_usage_error(tmp_path, args):
    needed = {
        "generate": ["--out", tmp_path / "t.jsonl"],
        "filter": [
            "--model",
            tmp_path,
            "--tasks",
            tmp_path / "t.jsonl",
            "--out",
            tmp_path / "k.jsonl",
        ],
        "eval": ["--model", tmp_path, "--tasks", tmp_path / "t.jsonl"],
        "local": ["--model", tmp_path, "--tasks", tmp_path / "t.jsonl", "--out", tmp_path / "r"],
    }[args[1] if args[0] != "eval" else "eval"]
    out = swarmrl(*args, *needed, check=False)
    assert out.returncode == 2, out.stderr
    assert f"Invalid value for '{args[-2]}'" in out.stderr
    assert "Traceback" not in out.stderr
    assert list(tmp_path.iterdir()) == []


def test_a_unicode_output_name_is_written(tmp_path):
    out = tmp_path / "Aufgaben für Ünï.jsonl"
    assert swarmrl("tasks", "generate", "--out", out, "--n", 3).stdout.strip() == str(out)
    assert len(out.read_text().splitlines()) == 3
