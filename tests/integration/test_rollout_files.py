"""`rollouts generate` and `rollouts verify` as libraries, without typer: a node's file
written (swarmrl/rollouts/generate_file.py) and judged (orchestrator/verify_file.py)."""

from __future__ import annotations

import pytest

from orchestrator.tasks.generators import demo_tasks
from orchestrator.verify_file import judge_file, read_file
from swarmrl import keystore
from swarmrl.chain.deploy import write_deployment
from swarmrl.rollouts.generate_file import generate_rollout_file
from swarmrl.rollouts.records import read_rollout_file
from swarmrl.tasks.format import write_tasks
from tests.model_fixtures import random_tiny_model

from .conftest import NODE_A


@pytest.fixture
def node_files(tmp_path, deployment, accounts):
    """A tiny random model, two tasks, the node's key and the session's deployment file."""
    write_tasks(demo_tasks(2, seed=3), tmp_path / "tasks.jsonl")
    keystore.save_public(tmp_path / "keys", "node", accounts[NODE_A].key, "pw")
    (tmp_path / "password").write_text("pw\n")
    write_deployment(tmp_path / "deployment.json", deployment)
    return {
        "model": random_tiny_model(tmp_path / "model", seed=0),
        "tasks": tmp_path / "tasks.jsonl",
        "keystore_dir": tmp_path / "keys",
        "password_file": tmp_path / "password",
        "deployment": tmp_path / "deployment.json",
    }


def test_a_signed_file_is_written_then_judged(tmp_path, node_files, deployment, accounts):
    out = tmp_path / "r.parquet"
    batches = []
    made = generate_rollout_file(
        **node_files,
        out=out,
        n=2,
        max_tokens=8,
        step=3,
        key="node",
        on_batch=lambda done, total, speed: batches.append((done, total)),
    )
    node = accounts[NODE_A].address
    assert (made.path, made.rollouts, made.signer) == (out, 4, node)
    assert batches[-1] == (4, 4)
    assert made.summary().endswith(f", signed by {node}")
    written = read_rollout_file(out)
    assert written.signature is not None
    assert written.signature.step == 3
    assert {(r.node, r.run, r.policy_step) for r in written.rollouts} == {
        (node, deployment.run_id, 3)
    }

    read = read_file(out, node_files["tasks"], deployment=node_files["deployment"])
    assert read.forged is None
    assert read.header() == (
        f"file 0x{made.digest.hex()}: signed by {node} for run {deployment.run_id}, step 3: "
        "2 samples per task, temperature 1, top-p 1, up to 8 tokens"
    )
    judged = judge_file(read, node_files["model"])
    assert judged.rejected == 0
    assert len(judged.lines()) == 4
    assert judged.summary().startswith("4 of 4 rollouts accepted, 0 rejected")

    # The step the validator asks for overrides the signed one: every record is refused.
    asked_later = read_file(out, node_files["tasks"], step=4, deployment=node_files["deployment"])
    judged = judge_file(asked_later, node_files["model"])
    assert judged.rejected == 4
    assert all("its policy step is 3, not the 4 asked for" in line for line in judged.lines())


def test_refusals_come_before_any_sampling_or_judging(tmp_path, node_files):
    out = tmp_path / "r.parquet"
    with pytest.raises(ValueError, match=r"^--node must be a 0x-prefixed 20-byte address"):
        generate_rollout_file(**node_files, out=out, node="0x12")
    with pytest.raises(ValueError, match=r"^--run 'other' is not the deployment's run"):
        generate_rollout_file(**node_files, out=out, run="other", key="node")
    assert not out.exists()

    made = generate_rollout_file(**node_files, out=out, n=2, max_tokens=8)
    assert made.signer is None
    assert made.summary().endswith(", unsigned")
    with pytest.raises(ValueError, match=r"^the file is unsigned, so it does not say how many"):
        read_file(out, node_files["tasks"])
    read = read_file(out, node_files["tasks"], n=2)
    assert read.header().endswith(": unsigned; node, run and step are not attested")
    with pytest.raises(ValueError, match=r"^the validator's own model is unusable"):
        judge_file(read, tmp_path / "nowhere")
