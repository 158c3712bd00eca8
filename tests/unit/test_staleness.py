"""The stale-step check: a submission's claimed log-probabilities are fitted to an older
step's, on constructed sequences and with real backends (a tiny policy and the same
policy after a small step): records generated with the older step and claimed as the
newer are rejected, never as evidence; honest ones pass, bf16 sampling included."""

from __future__ import annotations

import math
import random

import pytest

from orchestrator.run_dir import RunDir
from orchestrator.service.ledger import Ledger
from orchestrator.service.validator import Validator, ValidatorConfig
from swarmrl.models import load_backend
from swarmrl.models.backend import SamplingParams
from swarmrl.models.torch_backend import TorchBackend
from swarmrl.rollouts.checks import Assignment
from swarmrl.rollouts.generate import Provenance, generate_rollouts
from swarmrl.rollouts.tolerances import STALENESS, Outcome, staleness_fit
from swarmrl.rollouts.verify import OlderStep, verify_rollouts
from swarmrl.tasks import Task
from tests.model_fixtures import nudged_model

TASKS = {
    f"t{i}": Task(
        problem_id=f"t{i}",
        task_type="math",
        prompt=f"What is {i} + {i}?",
        verification_info={"ground_truth": str(2 * i)},
    )
    for i in range(3)
}
NODE = "0x" + "12" * 20
OLDER, CLAIMED = 0, 3  # the claimed step, and the newest one it could not have claimed
SAMPLING = SamplingParams(max_tokens=70, temperature=1.0)
ASKED = Assignment("test", NODE, CLAIMED, 2, SAMPLING.max_tokens, 1.0, 1.0)


def score(task, text):
    """A stand-in verifier: deterministic in the text, so it can be recomputed."""
    return float(len(text) % 2 == 0)


# ---- the fit, on constructed sequences -----------------------------------------------


def sequences(tokens: int, drift: float, noise: float, lean: float, seed: int = 3):
    """Claimed, current and older log-probabilities: the older step's differ from the
    current's by ``drift`` per token (at random), and the claims lie ``lean`` of the
    way toward the older step's, plus ``noise`` (what bf16 sampling adds)."""
    rng = random.Random(seed)
    current = [-rng.expovariate(1.0) for _ in range(tokens)]
    older = [p + rng.gauss(0, drift) for p in current]
    claimed = [
        p + lean * (o - p) + rng.gauss(0, noise) for p, o in zip(current, older, strict=True)
    ]
    return claimed, current, older


def test_honest_claims_lean_toward_the_claimed_step_and_stale_ones_toward_the_older():
    # A default order's tokens; bf16 noise twice the older step's drift.
    honest = staleness_fit(*sequences(1200, drift=0.01, noise=0.02, lean=0.0))
    stale = staleness_fit(*sequences(1200, drift=0.01, noise=0.02, lean=1.0))
    assert honest.slope == pytest.approx(0.0, abs=0.3)
    assert honest.z < -3
    assert STALENESS.judge(honest.z) is Outcome.PASS
    assert stale.slope == pytest.approx(1.0, abs=0.3)
    assert stale.z > STALENESS.reject
    assert STALENESS.judge(stale.z) is Outcome.REJECT  # never evidence
    assert (honest.tokens, stale.tokens) == (1200, 1200)


def test_the_validators_own_rounding_leans_honest_claims_short_of_half_way():
    # The validator's noise is in both of its prefills: c - p and o - p share -noise.
    rng = random.Random(5)
    truth = [-rng.expovariate(1.0) for _ in range(5000)]
    current = [t + rng.gauss(0, 0.02) for t in truth]
    older = [t + rng.gauss(0, 0.01) + rng.gauss(0, 0.02) for t in truth]
    fit = staleness_fit(truth, current, older)
    assert 0.3 < fit.slope < 0.5  # far from 0, and z past 6 counted from 0
    assert fit.slope / fit.se > 6
    assert fit.z < -3  # yet short of half-way
    assert STALENESS.judge(fit.z) is Outcome.PASS


def test_a_short_noisy_submission_is_not_stale_on_its_slope_alone():
    fit = staleness_fit(*sequences(12, drift=0.01, noise=0.03, lean=1.0))
    assert fit.slope > 0.5  # as stale as can be, but within the noise
    assert 0 < fit.z < STALENESS.reject
    assert STALENESS.judge(fit.z) is Outcome.PASS


def test_a_fit_with_nothing_to_go_on_passes():
    same = [-1.0, -2.0, -0.5]
    for claimed, current, older in (
        ([-1.0], [-1.1], [-1.2]),  # one token
        ([-0.9, -1.8, -0.4], same, same),  # the older step scores every token alike
        ([1e300, -1e300], [-1.0, -2.0], [-1.5, -0.5]),  # sums past a float
    ):
        fit = staleness_fit(claimed, current, older)
        assert (fit.slope, fit.se, fit.z) == (0.0, math.inf, 0.0)
        assert STALENESS.judge(fit.z) is Outcome.PASS


def test_tokens_not_finite_are_left_out():
    claimed, current, older = sequences(200, drift=0.01, noise=0.0, lean=1.0)
    fit = staleness_fit(
        [*claimed, -math.inf, 0.0], [*current, -1.0, math.nan], [*older, -1.0, -1.0]
    )
    assert fit.tokens == 200
    assert (fit.slope, fit.z) == (pytest.approx(1.0), math.inf)


# ---- with real backends ---------------------------------------------------------------


@pytest.fixture(scope="module")
def policies(tmp_path_factory, model_dirs):
    """Backends of a policy (the older step) and of that policy after a small step."""
    newer = nudged_model(model_dirs[0], tmp_path_factory.mktemp("steps") / "newer")
    return TorchBackend(model_dirs[0], device="cpu"), TorchBackend(newer, device="cpu")


def claimed_as_newer(backend):
    """Records ``backend`` generates, claiming the newer step."""
    return generate_rollouts(
        backend,
        list(TASKS.values()),
        n=ASKED.group_size,
        params=SAMPLING,
        provenance=Provenance(run="test", policy_step=CLAIMED, node=NODE),
        seed=9,
        score=score,
        target_for=lambda _speed: 40,
        batch_size=4,
    )


def judged(backend, records, older):
    loads = []

    def load():
        loads.append(older)
        return older

    verdicts = verify_rollouts(backend, records, TASKS, ASKED, score, older=OlderStep(OLDER, load))
    return verdicts, len(loads)


def test_records_of_the_older_step_claimed_as_the_newer_are_rejected(policies):
    older, newer = policies
    records = claimed_as_newer(older)
    # Every other check passes them: the policy moved too little for TOPLOC to see.
    assert all(v.accepted for v in verify_rollouts(newer, records, TASKS, ASKED, score))
    verdicts, loads = judged(newer, records, older)
    assert loads == 1
    assert not any(v.accepted or v.slashable for v in verdicts)
    reason = verdicts[0].reason
    assert reason.startswith("its submission's log-probabilities lie 1.00 of the way from ")
    assert reason.endswith("so it was generated with an older policy than it claims")
    assert "step 3's to step 0's" in reason
    assert all(v.distances[STALENESS.check] > STALENESS.reject for v in verdicts)


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_honest_records_of_the_newer_step_pass(policies, precision):
    older, newer = policies
    sampler = load_backend("torch", newer.model_dir, device="cpu", precision=precision)
    verdicts, loads = judged(newer, claimed_as_newer(sampler), older)
    assert loads == 1
    assert [v.reason for v in verdicts if not v.accepted] == []
    assert all(v.distances[STALENESS.check] < -STALENESS.reject for v in verdicts)


def test_the_older_step_is_not_loaded_when_no_record_is_left_to_judge(policies, model_dirs):
    older, _newer = policies
    other = TorchBackend(model_dirs[1], device="cpu")  # another model: TOPLOC rejects all
    verdicts, loads = judged(other, claimed_as_newer(older), older)
    assert not any(v.accepted for v in verdicts)
    assert loads == 0


def test_the_validator_checks_against_the_newest_step_a_node_could_not_claim(tmp_path):
    run_dir = tmp_path / "run"
    for step in (0, 3):
        RunDir(run_dir).step(step).mkdir(parents=True)
    config = ValidatorConfig(
        data_dir=tmp_path,
        run_dir=run_dir,
        tasks_file=tmp_path / "tasks.jsonl",
        validation_rate=1.0,
        trust_after=1,
        code_check_rate=1.0,
        device="cpu",
        async_level=2,
    )
    ledger = Ledger(tmp_path / "ledger.sqlite3")
    try:
        validator = Validator(config, ledger, TASKS)
        older = validator.older_step(3, "fp32")
        assert older is not None
        assert older.step == 0
        # A run's first steps have none; nor has a step whose older one is not kept.
        assert validator.older_step(2, "fp32") is None
        assert validator.older_step(4, "fp32") is None
    finally:
        ledger.close()
