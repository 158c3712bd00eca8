"""Validation scales apart from training: the daemon runs ``validator_workers``
validator processes, each on its own device with a part of the validator's threads,
and intake lets the backlog grow with them. (That they share the submissions, one
verdict each, even when one is killed: test_validator.py and test_ledger.py.)"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from orchestrator.run_dir import RunDir
from orchestrator.service import validator
from orchestrator.service.daemon import Orchestrator
from orchestrator.service.settings import OrchestratorSettings
from tests.unit.test_work_server import Orchestrator as Intake


@pytest.fixture(autouse=True)
def clean_environment(monkeypatch):
    """No SWARMRL_* of the machine running the tests reaches the settings."""
    for name in list(os.environ):
        if name.upper().startswith("SWARMRL_"):
            monkeypatch.delenv(name)


def daemon(root: Path, **settings: object) -> Orchestrator:
    """The daemon's part that describes its children: its settings and folders, without
    the chain, keys, tasks and ledger it opens at start."""
    made = Orchestrator.__new__(Orchestrator)
    made.settings = OrchestratorSettings(
        data_dir=root / "data",
        model=root / "model",
        tasks=root / "tasks.jsonl",
        deployment=root / "deployment.json",
        keystore_dir=root / "keys",
        device="cuda:0",
        **settings,
    )
    made.data_dir = root / "data"
    made.run_folder = RunDir.of_orchestrator(made.data_dir)
    made.log_to_stderr = False
    return made


def test_one_validator_worker_keeps_the_validators_name_device_and_threads(tmp_path):
    [spec] = daemon(tmp_path)._validator_specs(threads=5)
    assert (spec.name, spec.main, spec.threads) == ("validator", validator.main, 5)
    assert (spec.config.worker, spec.config.device) == ("validator", "cuda:0")


def test_each_validator_worker_has_its_device_and_a_part_of_the_threads(tmp_path):
    specs = daemon(
        tmp_path, validator_workers=3, validator_devices=["cuda:4", "cuda:5", "cuda:6"]
    )._validator_specs(threads=7)
    names = ["validator-0", "validator-1", "validator-2"]
    assert [s.name for s in specs] == names
    # The worker id its leases are held by is its child's, the same at every restart.
    assert [s.config.worker for s in specs] == names
    assert [s.config.device for s in specs] == ["cuda:4", "cuda:5", "cuda:6"]
    assert [s.threads for s in specs] == [2, 2, 2]
    # Fewer threads than workers: each still gets one.
    specs = daemon(tmp_path, validator_workers=2)._validator_specs(threads=1)
    assert [(s.config.device, s.threads) for s in specs] == [("cuda:0", 1), ("cuda:0", 1)]


def test_the_intake_backlog_bound_grows_with_the_validator_workers(tmp_path):
    intake = Intake(tmp_path, validator_workers=3)  # max_backlog=4
    try:
        session = intake.active()
        intake.backlog = 3 * 4
        assert session.work().order is None
        intake.backlog = 3 * 4 - 1
        assert session.work().order is not None
    finally:
        intake.ledger.close()
