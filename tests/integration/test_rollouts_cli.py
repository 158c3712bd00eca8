"""`swarmrl model`, `tasks` and `rollouts` as a user runs them, on the real default model."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from orchestrator.pretrain import Recipe, build_default_model
from orchestrator.tasks.generators import demo_tasks
from swarmrl.models.backend import SamplingParams
from swarmrl.models.checkpoint import read_state_dict
from swarmrl.models.torch_backend import TorchBackend
from swarmrl.rollouts.records import read_rollouts, write_rollouts
from swarmrl.tasks import read_tasks
from swarmrl.tasks.rewards import task_reward
from tests.model_fixtures import random_tiny_model

SWARMRL = Path(sys.executable).with_name("swarmrl")


def swarmrl(*args, check=True):
    out = subprocess.run([SWARMRL, *map(str, args)], capture_output=True, text=True, timeout=600)
    if check:
        assert out.returncode == 0, out.stderr
    return out


def test_model_init_is_seeded_and_cached(tmp_path):
    short = Recipe(steps=3, batch=4)
    a = build_default_model(tmp_path / "a", short)
    b = build_default_model(tmp_path / "b", short)
    c = build_default_model(tmp_path / "c", Recipe(steps=3, batch=4, seed=1))
    weights = [read_state_dict(d) for d in (a, b, c)]
    assert all(weights[0][k].equal(weights[1][k]) for k in weights[0])
    assert not all(weights[0][k].equal(weights[2][k]) for k in weights[0])
    stamp = (a / "model.safetensors").stat().st_mtime_ns
    assert build_default_model(a, short) == a
    assert (a / "model.safetensors").stat().st_mtime_ns == stamp
    # A default model of another recipe is rebuilt in place; a folder of anything else is
    # refused and left as it was.
    assert build_default_model(a, Recipe(steps=4, batch=4)) == a
    assert not read_state_dict(a)["model.norm.weight"].equal(weights[0]["model.norm.weight"])
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    (foreign / "notes.txt").write_text("mine")
    with pytest.raises(ValueError, match="holds something other"):
        build_default_model(foreign, short)
    assert [p.name for p in foreign.iterdir()] == ["notes.txt"]


@pytest.mark.slow
def test_the_default_model_solves_some_demo_tasks_but_not_most(default_model):
    backend = TorchBackend(default_model, device="cpu")
    from swarmrl.models.checkpoint import encode_prompt
    from swarmrl.tasks import budget_prompt

    tasks = demo_tasks(32, seed=4242)
    prompts = [encode_prompt(backend.tokenizer, budget_prompt(t.prompt, 128)) for t in tasks]
    completions = backend.generate(
        [p for p in prompts for _ in range(4)],
        SamplingParams(max_tokens=256, temperature=1.0, seed=0),
        prove=False,
    )
    rate = sum(task_reward(tasks[i // 4], c.text) for i, c in enumerate(completions)) / 128
    assert 0.02 <= rate <= 0.5, rate
    # It boxes its answer about as often as its pre-training solutions did (30%): what RL
    # teaches first. The rest say "Answer: ...", which scores nothing.
    boxed = sum("\\boxed{" in c.text for c in completions) / 128
    assert 0.15 <= boxed <= 0.5, boxed
    assert sum("Answer: " in c.text for c in completions) / 128 >= 0.4
    assert sum(c.finish_reason == "eos" for c in completions) > 100  # it learnt to stop


@pytest.mark.slow
def test_generate_then_verify_from_the_file_alone(default_model, tmp_path):
    tasks = tmp_path / "tasks.jsonl"
    swarmrl("tasks", "generate", "--n", 4, "--seed", 5, "--out", tasks)
    assert len(read_tasks(tasks)) == 4
    out = tmp_path / "r.parquet"
    made = swarmrl(
        "rollouts", "generate", "--model", default_model, "--tasks", tasks, "--n", 3,
        "--out", out, "--step", 7, "--node", "0x" + "34" * 20, "--seed", 1,
    )  # fmt: skip
    assert made.stdout.strip() == str(out)
    assert "12 rollouts" in made.stderr
    records = read_rollouts(out)
    assert len(records) == 12
    assert {r.policy_step for r in records} == {7}

    checked = swarmrl("rollouts", "verify", out, "--model", default_model)
    lines = checked.stdout.strip().splitlines()
    assert len(lines) == 13
    assert all(": ok " in line for line in lines[:-1])
    assert lines[-1].startswith("12 of 12 rollouts accepted, 0 rejected")

    # A node that inflates one reward: that record is rejected, the file fails.
    forged = list(records)
    forged[5] = forged[5].model_copy(update={"reward": 2.0}).sealed()
    write_rollouts(forged, out)
    checked = swarmrl("rollouts", "verify", out, "--model", default_model, check=False)
    assert checked.returncode == 1
    assert "REJECTED  its reward is 2" in checked.stdout
    assert "11 of 12 rollouts accepted, 1 rejected" in checked.stdout


def test_bad_input_is_one_sentence_and_exit_1(tmp_path):
    model = random_tiny_model(tmp_path / "m", seed=0)
    bad = tmp_path / "r.parquet"
    bad.write_bytes(b"not parquet")
    out = swarmrl("rollouts", "verify", bad, "--model", model, check=False)
    assert out.returncode == 1
    assert out.stderr.startswith("error: ")
    assert "not a readable rollout file" in out.stderr
    tasks = tmp_path / "t.jsonl"
    tasks.write_text(json.dumps({"problem_id": "x", "task_type": "poetry"}) + "\n")
    generate = ("rollouts", "generate", "--tasks", tasks, "--out", tmp_path / "o.parquet")
    out = swarmrl(*generate, "--model", model, check=False)
    assert out.returncode == 1
    assert "row 1" in out.stderr
    swarmrl("tasks", "generate", "--n", 2, "--out", tasks)
    out = swarmrl(*generate, "--model", model, "--node", "0x12", check=False)
    assert out.returncode == 1
    assert out.stderr.strip() == "error: --node must be a 0x-prefixed 20-byte address, got '0x12'"
    out = swarmrl(*generate, "--model", tmp_path, check=False)
    assert out.returncode == 1
    assert "error: " in out.stderr
    assert "tokenizer" in out.stderr


@pytest.mark.slow
def test_filter_keeps_tasks_in_the_solve_rate_band(default_model, tmp_path):
    tasks = tmp_path / "tasks.parquet"
    swarmrl("tasks", "generate", "--n", 8, "--seed", 11, "--out", tasks)
    kept = tmp_path / "kept.parquet"
    out = swarmrl(
        "tasks", "filter", "--model", default_model, "--tasks", tasks, "--out", kept,
        "--k", 4, "--min", 0.25, "--max", 0.75,
    )  # fmt: skip
    rates = pq.read_table(kept).column("solve_rate").to_pylist()
    assert all(0.25 <= r <= 0.75 for r in rates)
    assert f"kept {len(rates)} of 8 tasks" in out.stderr
