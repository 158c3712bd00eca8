"""The trust suite's cheat table in its short form: every behaviour of the demo's cheater
(simulation/cheater.py) once, against the orchestrator's own intake, validator and
ledger, on a tiny random policy whose newest step is its older one after a small step
(every weight moved about 1e-4), too small for TOPLOC to tell them apart. Each is
refused or rejected, the slashable ones as evidence, with and without a prefill as
the checks that catch them need; honest work passes every check, the ones for
sampling colder than claimed and for a stale step included."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest
import torch

from benchmarks import trust_cheats
from benchmarks.trust_cheats import Stage
from client.node.settings import NodeSettings
from orchestrator.run_dir import RunDir
from orchestrator.service.settings import OrchestratorSettings
from simulation.cheater import CHEATS, CheatingNode, RandomWeights, Stale
from swarmrl.chain.deploy import ProtocolParams
from swarmrl.chain.tokens import format_tokens
from swarmrl.models.torch_backend import TorchBackend
from swarmrl.tasks import Task
from tests.model_fixtures import nudged_model

TASKS = [
    Task(
        problem_id=f"t{i}",
        task_type="math",
        prompt=f"What is {i} + {i}?",
        verification_info={"ground_truth": str(2 * i)},
    )
    for i in range(6)
]
# Small orders, with tokens enough for a colder sampler's excess to show.
SETTINGS = {"prompts_per_assignment": 2, "group_size": 2, "max_tokens": 48, "target_len": 16}
# The slashable cheats (another model, weights rounded past TOPLOC's bounds, edited
# tokens, forged proofs, false rewards on math tasks, another node's work, an order
# answered in part): what each leaves is evidence no honest node produces.
EVIDENCE = {
    "random-weights",
    "other-seed",
    "smaller-model",
    "int3-weights",
    "edited-tokens",
    "random-proofs",
    "other-proofs",
    "false-rewards",
    "copied",
    "re-signed",
    "dropped-task",
    "cherry-picked-task",
}
# Caught by checks that need no prefill: intake's, and the rewards the validator
# always recomputes. Every other cheat needs the prefill of a sampled submission.
WITHOUT_PREFILL = {
    "false-rewards",
    "copied",
    "re-signed",
    "replayed",
    "dropped-task",
    "cherry-picked-task",
    "idle",
}
# Rounded weights near what honest bf16 does: whether a check catches them is what the
# benchmark measures on the default model; here only that rounding is never evidence.
MEASURED = {"int8-weights", "int4-weights", "fp8-weights"}


@pytest.fixture(scope="module")
def rows(tmp_path_factory, model_dirs):
    root = tmp_path_factory.mktemp("cheats")
    with pytest.MonkeyPatch.context() as env:
        for name in list(os.environ):  # no SWARMRL_* of this machine reaches the settings
            if name.upper().startswith("SWARMRL_"):
                env.delenv(name)
        # The step a stale node kept, the first it may not use, and the current policy.
        newest = OrchestratorSettings().async_level + 1
        shutil.copytree(model_dirs[1], RunDir(root / "steps").step(0))
        nudged_model(model_dirs[1], RunDir(root / "steps").step(newest))
        found = trust_cheats.run(
            root / "steps", TASKS, workdir=root / "work", submissions=1, settings=SETTINGS
        )
    return {row.name: row for row in found}


def test_every_behaviour_is_measured_once_in_each_run(rows):
    assert list(rows) == list(CHEATS)
    assert all((len(r.prefilled), len(r.unprefilled)) == (1, 1) for r in rows.values())


def test_honest_work_passes_every_check_the_colder_sampling_one_included(rows):
    honest = rows["honest"]
    assert [o.stage for o in honest.prefilled + honest.unprefilled] == [
        Stage.ACCEPTED,
        Stage.ACCEPTED,
    ]
    assert (honest.rate, honest.stake_lost()) == (0.0, "0")


def test_every_cheat_is_refused_or_rejected(rows):
    cheats = set(CHEATS) - {"honest"} - MEASURED
    missed = {
        name: rows[name].prefilled[0] for name in cheats if not rows[name].prefilled[0].caught
    }
    assert missed == {}


def test_the_slashable_cheats_are_evidence_and_cost_the_slash_penalty(rows):
    penalty = f"{format_tokens(ProtocolParams().slash_penalty)} SRL"
    for name in EVIDENCE:
        outcome = rows[name].prefilled[0]
        assert (name, outcome.evidence) == (name, True), outcome
        assert rows[name].stake_lost() == penalty
    for name in set(CHEATS) - EVIDENCE - MEASURED:
        assert (name, rows[name].evidence) == (name, 0)


def test_checks_without_a_prefill_catch_every_submission_the_others_a_sampled_share(rows):
    rate = OrchestratorSettings().validation_rate
    for name in set(CHEATS) - {"honest"} - MEASURED:
        row = rows[name]
        if name in WITHOUT_PREFILL:
            # A submission each, or the orders an idle node leaves before it is refused.
            orders = OrchestratorSettings().abandon_limit if name == "idle" else 1
            assert (name, row.unprefilled[0].caught, row.rate, row.delay) == (
                name,
                True,
                1,
                orders,
            )
        else:
            assert (name, row.unprefilled[0].caught) == (name, False)
            assert row.rate == pytest.approx(rate)
            assert row.delay == pytest.approx(1 / rate)


def test_where_each_cheat_is_caught(rows):
    stages = {name: row.prefilled[0].stage for name, row in rows.items()}
    assert {n for n, s in stages.items() if s == Stage.REFUSED} == {"replayed"}
    assert {n for n, s in stages.items() if s == Stage.INTAKE} == {
        "copied",
        "re-signed",
        "dropped-task",
        "cherry-picked-task",
    }
    assert {n for n, s in stages.items() if s == Stage.HELD_BACK} == {"idle"}
    assert stages["false-rewards"] == stages["colder-sampling"] == Stage.VALIDATOR
    assert "not the sender" in rows["replayed"].prefilled[0].reason
    assert "does not answer its order" in rows["copied"].prefilled[0].reason
    assert "its task reward is 1, recomputed 0" in rows["false-rewards"].prefilled[0].reason
    assert "left its last 3 work orders unanswered" in rows["idle"].prefilled[0].reason


def test_sampling_colder_than_asked_is_rejected_and_never_evidence(rows):
    outcome = rows["colder-sampling"].prefilled[0]
    assert (outcome.stage, outcome.evidence) == (Stage.VALIDATOR, False)
    assert "sampled colder than claimed" in outcome.reason


def test_a_stale_step_claimed_as_current_is_rejected_and_never_evidence(rows):
    outcome = rows["stale-step"].prefilled[0]
    assert (outcome.stage, outcome.evidence) == (Stage.VALIDATOR, False)
    assert "of the way from step 3's to step 0's" in outcome.reason
    assert outcome.reason.endswith("so it was generated with an older policy than it claims")


def test_int8_weights_are_never_slashed(rows):
    # On this small model int8 rounding lands between TOPLOC's rejection threshold and
    # its bounds (on the default model, within honest bf16): rounding is never evidence.
    assert not rows["int8-weights"].prefilled[0].evidence


def test_the_table_has_a_line_per_behaviour(rows):
    table = trust_cheats.table(list(rows.values()))
    for name in CHEATS:
        assert table.count(f"\n| {name} |") == 1
    assert "| never | 0 |" in table  # the honest control is never caught


def weights(backend: TorchBackend) -> torch.Tensor:
    return backend.model.get_input_embeddings().weight.float()


def test_a_cheating_node_loads_and_keeps_what_its_cheat_says(tmp_path, model_dirs):
    a, b = model_dirs
    settings = NodeSettings(data_dir=tmp_path, keystore_dir=tmp_path, backend="torch", device="cpu")
    # A stale node keeps the first policy it loaded and claims each newer step.
    node = CheatingNode(settings, None, Stale(tmp_path / "stale"))
    node._hold(a, 1, "fp32")
    node._hold(b, 2, "fp32")
    assert node.backend_step == 2
    assert torch.equal(weights(node.local.backend), weights(TorchBackend(a, device="cpu")))
    # The demo's cheater keeps its random weights through every new step.
    node = CheatingNode(settings, None, RandomWeights(tmp_path / "random"))
    node._hold(a, 1, "fp32")
    cheap = weights(node.local.backend).clone()
    node._hold(b, 2, "fp32")
    assert torch.equal(weights(node.local.backend), cheap)
    assert not torch.equal(cheap, weights(TorchBackend(b, device="cpu")))


@pytest.mark.parametrize(
    "args",
    [["--cheat", "nope", "node.toml"], ["--cheat", "copied", "node.toml"]],
    ids=["unknown cheat", "copying without a source"],
)
def test_a_malformed_cheater_command_line_exits_2(args):
    done = subprocess.run(
        [sys.executable, "-m", "simulation.cheater", *args], capture_output=True, text=True
    )
    assert done.returncode == 2
    assert done.stderr.splitlines()[-1].startswith("python -m simulation.cheater: error: ")


def test_a_cheater_without_its_config_says_so_in_one_sentence(tmp_path):
    missing = tmp_path / "node.toml"
    done = subprocess.run(
        [sys.executable, "-m", "simulation.cheater", str(missing)], capture_output=True, text=True
    )
    assert (done.returncode, done.stderr) == (1, f"error: {missing} does not exist\n")
