"""What the daemons refuse when they start, before any key or the network: a task set
that is missing or a folder, a data_dir that is a file or the other daemon's. Each is
one sentence naming the setting and where to change it, never an errno string."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from orchestrator.tasks.generators import demo_tasks
from swarmrl import keystore
from swarmrl.files import claim_data_dir
from swarmrl.tasks import write_tasks
from tests.cli_contract.world import _deployment
from tests.model_fixtures import random_tiny_model

SWARMRL = Path(sys.executable).with_name("swarmrl")
PEER = "/ip4/127.0.0.1/tcp/9/p2p/12D3KooWLyBuoa14i5VcrmMFAGQ8Xn3UPVLL2jwqDMNQQXaoVUS9"


def refusal(tmp_path: Path, *args: object) -> str:
    """`swarmrl ARGS` run from another folder, which must exit 1 with one sentence."""
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir(exist_ok=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith("SWARMRL_")}
    env.update(HOME=str(tmp_path / "home"), SWARMRL_PASSWORD="unused")
    env.pop("XDG_DATA_HOME", None)
    done = subprocess.run(
        [str(SWARMRL), *map(str, args)],
        capture_output=True,
        text=True,
        cwd=elsewhere,
        env=env,
        timeout=300,
    )
    assert done.returncode == 1, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    return lines[0].removeprefix("error: ")


def node_config(tmp_path: Path, **values: str) -> Path:
    values = {"keystore_dir": "keys", "orchestrator": PEER, "data_dir": "node", **values}
    config = tmp_path / "node.toml"
    config.write_text("".join(f'{key} = "{value}"\n' for key, value in values.items()))
    return config


def test_a_node_whose_tasks_is_a_folder_is_refused_before_its_key_or_the_network(tmp_path):
    # The key's password is not $SWARMRL_PASSWORD: a node that got as far as unlocking it
    # would say so, and the orchestrator's address is one where no peer listens.
    keystore.save(tmp_path / "keys", "node", b"\x01" * 32, "another password")
    (tmp_path / "tasks").mkdir()
    config = node_config(tmp_path, tasks="tasks")
    assert refusal(tmp_path, "node", "run", "--headless", "--config", config) == (
        f"tasks: {tmp_path}/tasks is a directory; give a file (set tasks in {config})"
    )


def test_a_node_without_its_keystore_folder_is_one_sentence(tmp_path):
    config = node_config(tmp_path, keystore_dir="no-keys")
    assert refusal(tmp_path, "node", "run", "--headless", "--config", config) == (
        f"no key named 'node' in {tmp_path}/no-keys"
    )


@pytest.mark.parametrize("kind", ["a file", "an orchestrator's"])
def test_a_node_refuses_a_data_dir_that_is_not_its_own(tmp_path, kind):
    data = tmp_path / "data"
    if kind == "a file":
        data.write_text("mine")
        says = f"{data} exists and is not a folder"
    else:
        claim_data_dir(data, "orchestrator")
        says = f"{data} is an orchestrator's data folder; give the node a folder of its own"
    config = node_config(tmp_path, data_dir="data")
    assert refusal(tmp_path, "node", "run", "--headless", "--config", config) == (
        f"data_dir: {says} (set data_dir in {config})"
    )
    if kind == "a file":
        assert data.read_text() == "mine"


@pytest.fixture
def orchestrator_inputs(tmp_path):
    """A task set, a model and a deployment file an orchestrator starts from."""
    write_tasks(demo_tasks(4, seed=0), tmp_path / "tasks.jsonl")
    random_tiny_model(tmp_path / "model", seed=0)
    _deployment(tmp_path / "deployment.json", "http://127.0.0.1:9")
    return tmp_path


def orchestrator_config(tmp_path: Path, **values: str) -> Path:
    values = {
        "tasks": "tasks.jsonl",
        "model": "model",
        "deployment": "deployment.json",
        "keystore_dir": "keys",
        **values,
    }
    config = tmp_path / "orchestrator.toml"
    config.write_text("".join(f'{key} = "{value}"\n' for key, value in values.items()))
    return config


def test_orchestrator_run_names_a_missing_task_file_and_how_to_make_it(tmp_path):
    config = orchestrator_config(tmp_path, tasks="tasks.jsonl")
    tasks = tmp_path / "tasks.jsonl"
    assert refusal(tmp_path, "orchestrator", "run", "--headless", "--config", config) == (
        f"tasks: {tasks} does not exist (set tasks in {config}, or make it with "
        f"`swarmrl tasks generate --out {tasks}`)"
    )


@pytest.mark.parametrize("kind", ["a file", "a node's"])
def test_orchestrator_run_refuses_a_data_dir_that_is_not_its_own(orchestrator_inputs, kind):
    tmp_path = orchestrator_inputs
    data = tmp_path / "data"
    if kind == "a file":
        data.write_text("mine")
        says = f"{data} exists and is not a folder"
    else:
        claim_data_dir(data, "node")
        says = f"{data} is a node's data folder; give the orchestrator a folder of its own"
    config = orchestrator_config(tmp_path, data_dir="data")
    assert refusal(tmp_path, "orchestrator", "run", "--headless", "--config", config) == (
        f"data_dir: {says} (set data_dir in {config})"
    )
