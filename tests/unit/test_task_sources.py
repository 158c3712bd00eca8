"""Task sources beyond the demo: INTELLECT-2's RL dataset as published, and reasoning-gym."""

from __future__ import annotations

import json
import logging
import math
from pathlib import Path
from types import SimpleNamespace

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import given
from hypothesis import strategies as st

from orchestrator.evaluate import pass_at_k, summarize
from swarmrl.tasks import TASK_TYPES, Task, read_tasks, reasoning_gym, rewards, write_tasks
from swarmrl.tasks import code as code_verifier
from swarmrl.tasks.rewards import node_task_reward, task_reward

DATA = Path(__file__).parents[1] / "data"
INTELLECT2 = DATA / "intellect2_tasks.jsonl"


def intellect2_parquet(path: Path, rows: list[dict] | None = None) -> Path:
    """The fixture rows as the dataset's parquet shards hold them (strings and float64)."""
    rows = rows or [json.loads(line) for line in INTELLECT2.read_text().splitlines()]
    schema = pa.schema(
        [
            ("problem_id", pa.string()),
            ("task_type", pa.string()),
            ("prompt", pa.string()),
            ("verification_info", pa.string()),
            ("solve_rate_qwen_r1_distill_7b", pa.float64()),
        ]
    )
    pq.write_table(pa.Table.from_pylist(rows, schema=schema), path)
    return path


# --- INTELLECT-2's layout -----------------------------------------------------------------


def test_an_intellect2_file_loads_as_it_is(tmp_path):
    from_jsonl = read_tasks(INTELLECT2)
    from_parquet = read_tasks(intellect2_parquet(tmp_path / "train-00000-of-00008.parquet"))
    assert from_jsonl == from_parquet
    types = {t.problem_id: t.task_type for t in from_jsonl}
    assert types["intellect2_math_1"] == "verifiable_math"
    assert types["prime_rl_code_2"] == "prime_rl_code"
    assert from_jsonl[0].solve_rate == 0.25  # from solve_rate_qwen_r1_distill_7b
    assert from_jsonl[1].verification_info == {"ground_truth": 7}


def test_extra_columns_are_ignored_and_a_missing_solve_rate_is_none(tmp_path):
    row = json.loads(INTELLECT2.read_text().splitlines()[0])
    path = tmp_path / "t.jsonl"
    path.write_text(json.dumps({**row, "source": "aops", "difficulty": 3}) + "\n")
    assert read_tasks(path)[0].problem_id == "intellect2_math_1"
    nan = intellect2_parquet(
        tmp_path / "nan.parquet", [{**row, "solve_rate_qwen_r1_distill_7b": math.nan}]
    )
    assert read_tasks(nan)[0].solve_rate is None


def test_intellect2_tasks_round_trip_through_our_files(tmp_path):
    tasks = read_tasks(INTELLECT2)
    write_tasks(tasks, tmp_path / "ours.parquet")
    assert read_tasks(tmp_path / "ours.parquet") == tasks


def _row(task_type: str, info) -> dict:
    text = info if isinstance(info, str) else json.dumps(info)
    return {"problem_id": "p", "task_type": task_type, "prompt": "q", "verification_info": text}


@pytest.mark.parametrize(
    ("task_type", "info", "says"),
    [
        ("verifiable_math", {}, "ground_truth"),
        ("verifiable_math", {"ground_truth": []}, "empty 'ground_truth' list"),
        ("verifiable_math", {"ground_truth": ["1", {"a": 1}]}, "ground_truth"),
        ("verifiable_math", {"ground_truth": True}, "ground_truth"),
        ("prime_rl_code", {}, "test_cases"),
        ("prime_rl_code", {"test_cases": "{not json"}, "test_cases is not valid JSON"),
        ("prime_rl_code", {"test_cases": {"inputs": ["1"], "outputs": []}}, "1 inputs but 0"),
        ("prime_rl_code", {"test_cases": {"inputs": [], "outputs": []}}, "non-empty lists"),
        (
            "prime_rl_code",
            {"test_cases": {"fn_name": "os.system", "inputs": ["1"], "outputs": ["1"]}},
            "not a Python name",
        ),
        (
            "prime_rl_code",
            {"test_cases": {"fn_name": "f", "inputs": ["{oops"], "outputs": ["1"]}},
            "one JSON value per line",
        ),
        (
            "prime_rl_code",
            {"test_cases": {"inputs": [7], "outputs": ["1"]}},
            "input 0 must be text",
        ),
        ("reasoning_gym", {"dataset": "rubiks_cube", "entry": {}}, "dataset must be one of"),
        ("reasoning_gym", {"dataset": "chain_sum", "entry": {"question": "q"}}, "'answer'"),
        ("reasoning_gym", ["chain_sum"], "valid dictionary"),
    ],
)
def test_a_malformed_row_of_every_new_kind_is_one_sentence(tmp_path, task_type, info, says):
    path = tmp_path / "bad.jsonl"
    good = json.loads(INTELLECT2.read_text().splitlines()[0])
    path.write_text(json.dumps(good) + "\n" + json.dumps(_row(task_type, info)) + "\n")
    with pytest.raises(ValueError, match="verification_info") as e:
        read_tasks(path)
    message = str(e.value)
    assert message.startswith(f"{path}: row 2: verification_info: ")
    assert says in message
    assert "\n" not in message


# --- INTELLECT-2's code tests -------------------------------------------------------------


def _code(source: str) -> str:
    return f"<think>...</think>\n```python\n{source}\n```"


def test_stdin_stdout_cases_in_the_apps_layout():
    task = next(t for t in read_tasks(INTELLECT2) if t.problem_id == "prime_rl_code_1")
    right = "n = int(input())\nprint(sum(map(int, input().split())))"
    assert task_reward(task, _code(right)) == 1.0
    assert task_reward(task, _code("print(6)")) == 0.0  # passes the first case only


def test_function_call_cases_in_the_apps_layout():
    task = next(t for t in read_tasks(INTELLECT2) if t.problem_id == "prime_rl_code_2")
    assert task_reward(task, _code("def add(a, b):\n    return a + b")) == 1.0
    method = "class Solution:\n    def add(self, a, b):\n        return a + b"
    assert task_reward(task, _code(method)) == 1.0
    noisy = "def add(a, b):\n    print('thinking')\n    return a + b"
    assert task_reward(task, _code(noisy)) == 1.0  # the driver's JSON line is the last
    assert task_reward(task, _code("def add(a, b):\n    return a - b")) == 0.0
    assert task_reward(task, _code("def plus(a, b):\n    return a + b")) == 0.0
    assert task_reward(task, _code("def add(a, b):\n    return {a, b}")) == 0.0  # not JSON


def test_a_function_call_case_takes_its_arguments_as_json():
    tests, _ = code_verifier.code_tests(
        {
            "test_cases": {
                "fn_name": "f",
                "inputs": ['[1, 2]\n{"k": "v"}', [3]],
                "outputs": ["[1]", 3],
            }
        },
        "prime_rl_code",
    )
    assert tests == [
        {"fn_name": "f", "args": [[1, 2], {"k": "v"}], "expected": [1]},
        {"fn_name": "f", "args": [3], "expected": 3},
    ]


# --- where code runs ----------------------------------------------------------------------


def test_a_node_without_the_sandbox_runs_no_code_and_says_so_once(monkeypatch, caplog):
    task = next(t for t in read_tasks(INTELLECT2) if t.problem_id == "prime_rl_code_2")
    right = _code("def add(a, b):\n    return a + b")
    monkeypatch.setattr(code_verifier, "sandbox_kind", lambda: "rlimits only")
    monkeypatch.setattr(rewards, "_warned", rewards.threading.Event())
    ran = []
    monkeypatch.setattr(code_verifier, "run_tests", lambda *a, **k: ran.append(a))
    with caplog.at_level(logging.WARNING, logger="swarmrl.tasks.rewards"):
        assert node_task_reward(task, right) == 0.0
        assert node_task_reward(task, right) == 0.0
    assert ran == []
    assert [r.message for r in caplog.records].count(caplog.records[0].message) == 1
    assert "no code reward" in caplog.records[0].message
    math_task = read_tasks(INTELLECT2)[0]
    assert node_task_reward(math_task, r"</think>\boxed{42}") == 1.0  # math is unaffected


# --- reasoning-gym ------------------------------------------------------------------------


def test_reasoning_gym_tasks_are_seeded():
    names = reasoning_gym.parse_source("reasoning-gym:basic_arithmetic,chain_sum,letter_counting")
    a = reasoning_gym.generate(names, 7, seed=3)
    assert a == reasoning_gym.generate(names, 7, seed=3)
    assert a != reasoning_gym.generate(names, 7, seed=4)
    assert [t.problem_id for t in a][:3] == [
        "rg-basic_arithmetic-3-0",
        "rg-basic_arithmetic-3-1",
        "rg-basic_arithmetic-3-2",
    ]
    assert {t.task_type for t in a} == {"reasoning_gym"}
    assert all(t.prompt.isascii() for t in a)  # the default model reads ASCII


def test_reasoning_gym_scores_the_answer_after_the_reasoning(tmp_path):
    (task,) = reasoning_gym.generate(["chain_sum"], 1, seed=0)
    answer = task.verification_info["entry"]["answer"]
    assert task_reward(task, f"<think>adding up</think> \\boxed{{{answer}}}") == 1.0
    assert task_reward(task, f"<think>adding up</think> {answer}") == 1.0
    assert (
        task_reward(task, f"<think>\\boxed{{{answer}}}</think> \\boxed{{{int(answer) + 1}}}") == 0.0
    )
    assert task_reward(task, "") == 0.0
    write_tasks([task], tmp_path / "rg.jsonl")
    assert read_tasks(tmp_path / "rg.jsonl") == [task]


@pytest.mark.parametrize(
    "source",
    [
        "reasoning-gym:",
        "reasoning-gym:rubiks_cube",
        "gym:chain_sum",
        "chain_sum",
        "reasoning-gym:chain_sum,",
        "reasoning-gym:chain_sum,chain_sum",
        "reasoning-gym:\uff43hain_sum",  # a full-width c
    ],
)
def test_an_unknown_source_is_one_sentence(source):
    with pytest.raises(ValueError, match=r"reasoning-gym|--source"):
        reasoning_gym.parse_source(source)


def test_a_dataset_named_twice_is_refused_not_drawn_twice():
    with pytest.raises(ValueError, match="'chain_sum' is named twice in --source"):
        reasoning_gym.parse_source("reasoning-gym:chain_sum,letter_counting,chain_sum")


# --- evaluation figures -------------------------------------------------------------------


def test_pass_at_k_by_hand():
    assert pass_at_k(4, 0, 1) == 0.0
    assert pass_at_k(4, 1, 1) == 0.25
    assert pass_at_k(4, 1, 4) == 1.0
    assert pass_at_k(4, 2, 2) == pytest.approx(1 - 1 / 6)  # 1 - C(2,2)/C(4,2)


def test_an_evaluation_summary_by_hand():
    tasks = [
        Task(problem_id="a", task_type="math", prompt="q", verification_info={"ground_truth": "1"}),
        Task(problem_id="b", task_type="reasoning_gym", prompt="q", verification_info={}),
    ]
    rec = lambda reward, n: SimpleNamespace(task_reward=reward, output_ids=[0] * n)  # noqa: E731
    records = [rec(1.0, 10), rec(0.0, 20), rec(0.0, 30), rec(0.5, 40)]
    result = summarize(tasks, records, 2)
    assert result.mean_reward == pytest.approx(1.5 / 4)
    assert result.pass_at == {1: 0.25, 2: 0.5}  # a: 1 of 2 solved; b: partial is not solved
    assert result.mean_length == 25
    assert result.by_type["math"].mean_reward == 0.5
    assert result.by_type["reasoning_gym"].tasks == 1


# --- untrusted task data ------------------------------------------------------------------

_json = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=12,
)
_apps = st.fixed_dictionaries(
    {},
    optional={
        "inputs": st.lists(st.text(max_size=12) | _json, max_size=3),
        "outputs": st.lists(st.text(max_size=12) | _json, max_size=3),
        "fn_name": st.text(max_size=6) | _json,
    },
)


def _refusal(call) -> str | None:
    """None if the call went through, else its ValueError's message."""
    try:
        call()
    except ValueError as e:
        return str(e)
    return None


@given(task_type=st.sampled_from(TASK_TYPES), info=_json | _apps.map(lambda t: {"test_cases": t}))
def test_any_verification_info_loads_or_is_one_sentence(task_type, info):
    row = {"problem_id": "p", "task_type": task_type, "prompt": "q", "verification_info": info}
    refusal = _refusal(lambda: Task.from_row(row))
    assert refusal is None or "\n" not in refusal


@given(test_cases=_apps | st.text(max_size=40))
def test_any_apps_test_cases_load_or_are_one_sentence(test_cases):
    info = {"test_cases": test_cases}
    refusal = _refusal(lambda: code_verifier.code_tests(info, "prime_rl_code"))
    if refusal is not None:
        assert "\n" not in refusal
        return
    tests, _ = code_verifier.code_tests(info, "prime_rl_code")
    assert tests
    assert all(("stdin" in t) != ("fn_name" in t) for t in tests)
