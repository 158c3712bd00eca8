"""The training recipe and the trainer's process settings are declared once: `train
local`'s options are their fields, with their defaults and bounds, and what the models
refuse is a bad option value."""

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
import typer
from annotated_types import Ge, Le
from typer.testing import CliRunner

from orchestrator.run_dir import RunDir
from orchestrator.train_local.cli import field_flag, recipe_argv
from orchestrator.trainer.launch import TrainerLaunch
from orchestrator.trainer.recipe import GRPORecipe
from swarmrl.cli import app

SWARMRL = Path(sys.executable).with_name("swarmrl")


def _train_local() -> typer.core.TyperCommand:
    return typer.main.get_command(app).commands["train"].commands["local"]


@pytest.mark.parametrize("model", [GRPORecipe, TrainerLaunch])
def test_train_local_has_an_option_per_field_with_its_default_and_bounds(model):
    options = {p.name: p for p in _train_local().params}
    for name, field in model.model_fields.items():
        option = options[name]
        assert option.opts == [field_flag(name)]
        if field.annotation is bool:  # a flag, and its opposite
            assert option.secondary_opts == ["--no-" + field_flag(name)[2:]]
        assert option.default == field.default, name
        low = next((r.ge for r in field.metadata if isinstance(r, Ge)), None)
        high = next((r.le for r in field.metadata if isinstance(r, Le)), None)
        assert (option.min, option.max) == (low, high), name
        assert option.help.startswith(field.description.split(";")[0]), name


@pytest.mark.parametrize(
    ("options", "sentence"),
    [
        (["--lr", "0"], "Invalid value for '--lr': must be more than 0, got 0.0"),
        (["--eps-low", "1"], "Invalid value for '--eps-low': must be less than 1, got 1.0"),
        (
            ["--temperature", "0.0000001"],
            "Invalid value for '--temperature': must be a multiple of 0.000001, got 1e-07",
        ),
        (["--max-grad-norm", "inf"], "Invalid value for '--max-grad-norm': must be a finite"),
        (
            ["--eps-high", "4"],
            "Invalid value for '--delta' / '--eps-high': delta must be at least 1 + eps_high = 5, "
            "got 4",
        ),
        (["--async-level", "1001"], "Invalid value for '--async-level'"),
        (
            ["--tis-cap", "2"],
            "Invalid value for '--tis-cap' / '--ratio-against': tis_cap needs ratio_against = "
            "trainer",
        ),
        (["--tis-cap", "0.5"], "Invalid value for '--tis-cap': must be 0 (off) or at least 1"),
        (["--icepop-low", "1"], "Invalid value for '--icepop-low': must be less than 1"),
        (["--icepop-high", "1"], "Invalid value for '--icepop-high': must be 0 (none) or more"),
        (["--nproc-per-node", "0"], "Invalid value for '--nproc-per-node'"),
        (
            ["--rdzv-endpoint", "nohost"],
            "Invalid value for '--rdzv-endpoint': must be host:port, like 127.0.0.1:29400, "
            "got 'nohost'",
        ),
        (
            ["--nnodes", "2"],
            "Invalid value for '--nnodes': train local trains on this machine only; a trainer "
            "on several machines is `swarmrl orchestrator run`'s",
        ),
    ],
)
def test_what_the_recipe_and_launch_refuse_is_a_bad_option_value(tmp_path, options, sentence):
    paths = ["--model", tmp_path / "m", "--tasks", tmp_path / "t.jsonl", "--out", tmp_path / "r"]
    out = CliRunner().invoke(app, ["train", "local", *map(str, paths), *options])
    assert out.exit_code == 2
    assert sentence in " ".join(out.output.split())
    assert list(tmp_path.iterdir()) == []


def test_the_options_reach_the_run_as_one_recipe(tmp_path, model_dirs):
    tasks = tmp_path / "tasks.jsonl"
    subprocess.run([SWARMRL, "tasks", "generate", "--n", "4", "--out", tasks], check=True)
    recipe = GRPORecipe(group_size=2, prompts_per_step=1, max_tokens=4, top_p=0.5, seed=7)
    out = tmp_path / "run"
    args = ["train", "local", "--model", model_dirs[0], "--tasks", tasks, "--out", out]
    args += ["--workers", "1", "--device", "cpu", "--minutes", "0", *recipe_argv(recipe)]
    done = subprocess.run([SWARMRL, *map(str, args)], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    # The run directory's identity is the recipe the options gave, field for field.
    identity = json.loads(RunDir(out).settings.read_text())
    assert identity == {
        "model": str(model_dirs[0].resolve()),
        "tasks": str(tasks.resolve()),
        "run": "local",
        **recipe.model_dump(exclude={"steps"}),
    }


def test_the_corrections_are_off_by_default_and_reach_the_loss():
    off = GRPORecipe().loss_config()
    assert off.tis_cap == 0.0
    assert not off.icepop
    on = GRPORecipe(
        ratio_against="trainer", tis_cap=2.0, icepop_low=0.5, icepop_high=5.0
    ).loss_config()
    assert (on.tis_cap, on.icepop_low, on.icepop_high) == (2.0, 0.5, 5.0)
    # The recipe's 0 is "no upper bound": the loss's infinity.
    assert GRPORecipe(icepop_low=0.5).loss_config().icepop_high == math.inf
