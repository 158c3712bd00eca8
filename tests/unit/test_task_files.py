"""Task files (parquet and JSONL): round trips, and one clear error for bad rows."""

from __future__ import annotations

import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from swarmrl.tasks import Task, budget_prompt, length_penalty, read_tasks, write_tasks

TASKS = [
    Task(
        problem_id="m1",
        task_type="math",
        prompt="What is 1/2 + 1/4?",
        verification_info={"ground_truth": "\\frac{3}{4}"},
        solve_rate=0.25,
    ),
    Task(
        problem_id="c1",
        task_type="code",
        prompt="Echo the input.",
        verification_info={"tests": [{"stdin": "a\n", "stdout": "a\n"}]},
    ),
]


@pytest.mark.parametrize("suffix", [".parquet", ".jsonl"])
def test_round_trip(tmp_path, suffix):
    path = tmp_path / f"tasks{suffix}"
    write_tasks(TASKS, path)
    assert read_tasks(path) == TASKS
    assert not list(tmp_path.glob("*.tmp"))


def write_jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


GOOD = TASKS[0].row()


@pytest.mark.parametrize(
    ("row", "message"),
    [
        ({**GOOD, "task_type": "poetry"}, "row 1: task_type"),
        ({**GOOD, "verification_info": "{"}, "row 1: verification_info is not valid JSON"),
        ({**GOOD, "verification_info": "[1]"}, "row 1: verification_info"),
        ({**GOOD, "solve_rate": 1.5}, "row 1: solve_rate"),
        ({**GOOD, "prompt": ""}, "row 1: prompt"),
        ({**GOOD, "verification_info": '{"ground_truth": null}'}, "row 1: verification_info: "),
        ({k: v for k, v in GOOD.items() if k != "prompt"}, "row 1: prompt"),
        ([1, 2], "row 1 is not an object"),
    ],
)
def test_bad_rows_name_the_row_and_field(tmp_path, row, message):
    path = tmp_path / "t.jsonl"
    write_jsonl(path, [row])
    with pytest.raises(ValueError, match=message):
        read_tasks(path)


def test_bad_files_are_one_clear_error(tmp_path):
    path = tmp_path / "t.jsonl"
    write_jsonl(path, [GOOD, GOOD])
    with pytest.raises(ValueError, match="row 2: duplicate problem_id 'm1'"):
        read_tasks(path)
    path.write_text(json.dumps(GOOD) + "\n{nope\n")
    with pytest.raises(ValueError, match="line 2 is not valid JSON"):
        read_tasks(path)
    bad = tmp_path / "t.parquet"
    bad.write_bytes(b"PAR1garbagePAR1")
    with pytest.raises(ValueError, match=r"not a readable parquet file$"):
        read_tasks(bad)
    pq.write_table(pa.table({"problem_id": ["x"]}), bad)
    with pytest.raises(ValueError, match="row 1"):
        read_tasks(bad)
    (tmp_path / "t.csv").write_text("problem_id\n")
    with pytest.raises(ValueError, match=r"from \.parquet or \.jsonl"):
        read_tasks(tmp_path / "t.csv")
    with pytest.raises(ValueError, match=r"missing\.parquet does not exist"):
        read_tasks(tmp_path / "missing.parquet")


@pytest.mark.parametrize("name", ["dir.jsonl", "dir.parquet", "dir"])
def test_a_directory_is_not_a_task_file(tmp_path, name):
    folder = tmp_path / name
    folder.mkdir()
    # A folder of parquet files would otherwise read as a dataset of its files.
    write_tasks(TASKS, folder / "part.parquet")
    with pytest.raises(ValueError, match=f"{name} is a directory; give a file"):
        read_tasks(folder)


def test_a_file_without_tasks_is_an_error(tmp_path):
    empty = tmp_path / "empty.jsonl"
    empty.write_bytes(b"")
    with pytest.raises(ValueError, match=r"empty\.jsonl holds no tasks"):
        read_tasks(empty)
    empty.write_text("\n  \n")
    with pytest.raises(ValueError, match="holds no tasks"):
        read_tasks(empty)
    no_rows = tmp_path / "empty.parquet"
    write_tasks([], no_rows)
    with pytest.raises(ValueError, match=r"empty\.parquet holds no tasks"):
        read_tasks(no_rows)


def test_non_utf8_and_binary_files_are_one_sentence(tmp_path):
    latin1 = tmp_path / "latin1.jsonl"
    latin1.write_bytes(json.dumps(GOOD).encode() + b"\n" + '{"prompt": "é"}'.encode("latin-1"))
    with pytest.raises(ValueError, match=r"latin1.jsonl: line 2 is not UTF-8 text$"):
        read_tasks(latin1)
    binary = tmp_path / "binary.jsonl"
    write_tasks(TASKS, tmp_path / "t.parquet")
    binary.write_bytes((tmp_path / "t.parquet").read_bytes())
    with pytest.raises(ValueError, match=r"binary.jsonl: line \d+ is not (UTF-8 text|valid JSON)$"):
        read_tasks(binary)
    text = tmp_path / "text.parquet"
    text.write_text("problem_id,prompt\n")
    with pytest.raises(ValueError, match=r"text.parquet is not a readable parquet file$"):
        read_tasks(text)


def test_a_byte_order_mark_is_read_as_text(tmp_path):
    path = tmp_path / "bom.jsonl"
    path.write_bytes(b"\xef\xbb\xbf" + json.dumps(GOOD).encode() + b"\n")
    assert read_tasks(path) == TASKS[:1]


def test_the_budget_and_its_penalty():
    assert budget_prompt("Q?", 128) == "Q?\nThink for 128 tokens before giving a response."
    assert length_penalty(128, 100) == pytest.approx(3e-4 * 28)
    assert length_penalty(100, 128) == length_penalty(128, 100)
    assert length_penalty(64, 64) == 0


@settings(max_examples=80, deadline=None)
@given(st.lists(st.one_of(st.binary(max_size=300), st.just(json.dumps(GOOD).encode())), max_size=4))
def test_arbitrary_jsonl_lines_are_read_or_refused_in_one_sentence(tmp_path_factory, lines):
    path = tmp_path_factory.mktemp("fuzz") / "t.jsonl"
    path.write_bytes(b"\n".join(lines))
    error = None
    try:
        tasks = read_tasks(path)
    except ValueError as e:
        error = str(e)
    if error is not None:
        assert error.startswith(str(path))
        assert "\n" not in error
    else:
        assert all(isinstance(t, Task) for t in tasks)
