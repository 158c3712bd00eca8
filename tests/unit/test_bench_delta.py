"""`swarmrl bench delta`: the per-step delta figure over a real (tiny) training run, and
the command's quick form."""

import itertools
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from benchmarks import delta as bench
from orchestrator.run_dir import RunDir
from orchestrator.tasks.generators import demo_tasks
from orchestrator.trainer.recipe import GRPORecipe
from swarmrl import delta
from swarmrl.models.directory import SINGLE_FILE

SWARMRL = Path(sys.executable).with_name("swarmrl")
TASKS = demo_tasks(8, seed=3)
RECIPE = GRPORecipe(
    steps=2, group_size=4, prompts_per_step=2, max_tokens=8, lr=1e-3, warmup_steps=0
)


def alternating():
    """Rewards that differ within every group of an even size: each group teaches."""
    turns = itertools.cycle([0.0, 1.0])
    return lambda task, text: next(turns)


def test_a_bf16_run_gives_each_step_a_delta_of_the_size_it_has_on_disk(tmp_path, model_dirs):
    run_dir, out = tmp_path / "run", tmp_path / "deltas"
    said = []
    bench.train(model_dirs[0], TASKS, RECIPE, "bf16", run_dir, score=alternating(), say=said.append)
    assert len(said) == 2  # one line per step
    deltas = bench.step_deltas(run_dir, out)
    assert [d.step for d in deltas] == [1, 2]
    for d in deltas:
        base = RunDir(run_dir).step(d.step - 1) / SINGLE_FILE
        target = RunDir(run_dir).step(d.step) / SINGLE_FILE
        shipped = out / f"step_{d.step}.delta"
        assert {t.dtype for t in load_file(target).values()} == {torch.bfloat16}
        assert d.full_bytes == target.stat().st_size
        assert d.delta_bytes == shipped.stat().st_size
        assert d.ratio == shipped.stat().st_size / target.stat().st_size
        assert 0 < d.changed_fraction <= 1  # lr 1e-3 moves a tiny model's weights
        # What was measured is what rebuilds the step.
        delta.apply(base, shipped, tmp_path / "rebuilt.safetensors")
        assert (tmp_path / "rebuilt.safetensors").read_bytes() == target.read_bytes()


def test_a_model_whose_groups_never_teach_gives_up(tmp_path, model_dirs, monkeypatch):
    monkeypatch.setattr(bench, "MAX_IDLE_BATCHES", 2)
    with pytest.raises(ValueError, match="no step after 2 batches"):
        bench.train(
            model_dirs[0], TASKS, RECIPE, "fp32", tmp_path, score=lambda t, s: 0.0, say=print
        )
    assert RunDir(tmp_path).steps() == [0]


def test_the_summary_sets_the_first_step_apart(capsys):
    sizes = ((1, 50), (2, 5), (3, 8), (4, 30))
    deltas = [bench.StepDelta(n, 1000, size, 0.5) for n, size in sizes]
    bench.report_deltas("m", deltas, goal=0.01)
    last = capsys.readouterr().out.splitlines()[-1]
    assert "steps 2-4: median 0.80%, max 3.00% (goal: median <= 1%: met)" in last
    assert "step 1 (AdamW's first): 5.00%" in last


def test_the_quick_form_prints_full_against_delta():
    args = ["bench", "delta", "--skip-learner", "--skip-codec", "--skip-anchor", "--nodes", "10"]
    out = subprocess.run([SWARMRL, *args], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    # The delta as the code ships it (4 MiB shards), by both policies; no full version.
    assert "| delta, 0.152 GB | code | 4 |" in out.stdout
    assert "| delta, 0.152 GB | before 2026-11-27 | 4 |" in out.stdout
    assert "| full," not in out.stdout
