"""The commands that write a daemon's config, run as a user runs them: from their own
folder, with paths relative to it. Read back from anywhere, the file names the files
the user meant and the key they gave (`node init --key node2` wrote `key = "node"`,
and `node doctor` then checked the first node)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from client.node.settings import NodeSettings
from orchestrator.service.settings import OrchestratorSettings
from orchestrator.tasks.generators import demo_tasks
from swarmrl import keystore
from swarmrl.chain.deploy import write_deployment
from swarmrl.chain.tokens import TOKEN
from swarmrl.settings_toml import load_settings
from swarmrl.tasks import write_tasks
from tests.integration.conftest import PROVIDER_A
from tests.model_fixtures import random_tiny_model

SWARMRL = Path(sys.executable).with_name("swarmrl")
PASSWORD = "correct horse"


def swarmrl(cwd: Path, *args: object) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SWARMRL_")}
    env.update(HOME=str(cwd.parent / "home"), SWARMRL_LOCK_DIR=str(cwd.parent / "locks"))
    env.pop("XDG_DATA_HOME", None)
    return subprocess.run(
        [str(SWARMRL), *map(str, args)], capture_output=True, text=True, cwd=cwd, env=env,
        timeout=300,
    )  # fmt: skip


@pytest.fixture
def caller(tmp_path):
    """The user's folder, where the commands run; the tests read the files from another."""
    folder = tmp_path / "caller"
    folder.mkdir()
    return folder


def test_node_init_writes_the_key_and_files_it_was_given(
    caller, contracts, deployment, accounts, monkeypatch
):
    provider = contracts.as_account(accounts[PROVIDER_A])
    provider.registry.register_provider()
    provider.stakes.stake(200 * TOKEN, permit=True)
    keystore.save_public(caller / "keys", "provider", accounts[PROVIDER_A].key, PASSWORD)
    (caller / "password").write_text(PASSWORD + "\n")
    write_deployment(caller / "deployment.json", deployment)

    done = swarmrl(
        caller, "node", "init", "--provider", "provider", "--key", "node2",
        "--keystore-dir", "keys", "--password-file", "password", "--deployment",
        "deployment.json", "--config-out", "conf/node2.toml", "--data-dir", "node2-data",
        "--metrics-port", "9466",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr

    monkeypatch.chdir(caller.parent)
    settings = load_settings(NodeSettings, caller / "conf" / "node2.toml")
    assert settings.key == "node2"
    assert settings.keystore_dir == caller / "keys"
    assert settings.password_file == caller / "password"
    assert settings.deployment == caller / "deployment.json"
    # A second node on the machine: its own data folder and metrics port.
    assert settings.data_dir == caller / "node2-data"
    assert settings.metrics_port == 9466

    # The doctor checks the node that was set up: node2, not the default "node".
    doctor = swarmrl(caller, "node", "doctor", "--config", "conf/node2.toml")
    node2 = keystore.info(caller / "keys", "node2").address
    keystore_line = next(
        line for line in doctor.stdout.splitlines() if line.split()[1:2] == ["keystore"]
    )
    assert keystore_line.startswith("ok"), doctor.stdout
    assert f"key 'node2' unlocks: node {node2}" in keystore_line
    joined = next(line for line in doctor.stdout.splitlines() if line.split()[1:2] == ["joined"])
    assert joined.startswith("ok"), doctor.stdout


def test_node_init_refuses_node_settings_without_a_config_to_write_them_to(caller):
    done = swarmrl(caller, "node", "init", "--provider", "p", "--data-dir", "node2-data")
    assert done.returncode == 2
    assert "give --config-out too" in done.stderr
    assert sorted(caller.iterdir()) == []


def test_orchestrator_init_writes_the_files_it_was_given(caller, deployment, monkeypatch):
    write_tasks(demo_tasks(4, seed=0), caller / "tasks.jsonl")
    random_tiny_model(caller / "model", seed=0)
    write_deployment(caller / "deployment.json", deployment)

    done = swarmrl(
        caller, "orchestrator", "init", "--out", "conf/orchestrator.toml", "--model", "model",
        "--tasks", "tasks.jsonl", "--data-dir", "state", "--deployment", "deployment.json",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr

    monkeypatch.chdir(caller.parent)
    settings = load_settings(OrchestratorSettings, caller / "conf" / "orchestrator.toml")
    assert settings.model == caller / "model"
    assert settings.tasks == caller / "tasks.jsonl"
    assert settings.data_dir == caller / "state"
    assert settings.deployment == caller / "deployment.json"
    assert not (caller / "state").exists()  # written down, made by `run`


def test_orchestrator_init_checks_what_it_is_given_before_writing(caller):
    done = swarmrl(caller, "orchestrator", "init", "--tasks", "missing.jsonl")
    assert done.returncode == 1
    assert done.stderr == "error: missing.jsonl does not exist\n"
    assert list(caller.iterdir()) == []
