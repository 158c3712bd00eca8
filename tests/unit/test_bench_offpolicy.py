"""`swarmrl bench offpolicy`: every arm trains with its corrections and reports them, and
the summary's figures are the token-weighted ones."""

import json
import math

import pytest

from benchmarks import offpolicy as bench
from orchestrator.run_dir import RunDir
from orchestrator.tasks.generators import demo_tasks
from orchestrator.trainer.recipe import GRPORecipe

# train local's integration test's small recipe: groups the default model disagrees within.
RECIPE = GRPORecipe(group_size=8, prompts_per_step=2, max_tokens=64, lr=3e-4)


def test_each_arm_trains_with_its_correction_and_reports_it(default_model, tmp_path, capsys):
    held_out = demo_tasks(4, seed=bench.HELD_OUT_SEED)
    # The default's repeat trains as the default does: left out, to keep this short.
    arms = [arm for arm in bench.ARMS if arm != bench.AGAIN]
    before, results = bench.ablate(
        default_model,
        demo_tasks(400, seed=1),
        held_out,
        RECIPE,
        2,
        tmp_path,
        arms=arms,
        samples=1,
        workers=1,
    )
    assert len(before) == len(held_out)
    assert [r.arm for r in results] == arms
    for i, r in enumerate(results):
        trained = json.loads(RunDir(tmp_path / f"arm{i}").settings.read_text())
        assert {k: trained[k] for k in r.arm.changes} == r.arm.changes
        assert [row["step"] for row in r.rows] == [1, 2]
        assert all(math.isfinite(row["mismatch_kl"]) for row in r.rows)
        assert len(r.held_out) == len(held_out)
    default, trainer, tis, icepop = (bench.mismatch(r.rows) for r in results)
    assert default.tis_fraction == default.icepop_fraction == 0
    assert trainer.tis_fraction == trainer.icepop_fraction == 0
    assert 0 <= tis.tis_fraction <= 1
    assert tis.icepop_fraction == 0
    assert 0 <= icepop.icepop_fraction <= 1
    assert icepop.tis_fraction == 0
    # Against the trainer's own log-probabilities the PPO ratio is 1 on every token.
    assert all(row["ratio_mean"] == pytest.approx(1) for row in results[1].rows)

    bench.report(before, results)
    out = capsys.readouterr().out
    assert all(f"| {arm.name} | " in out for arm in arms)
    assert "not measured here" in out.splitlines()[-1]


def row(kl, kl_by_age, tokens_by_age, ratio_std, lo, hi, tis, seconds):
    return {
        "mismatch_kl": kl,
        "mismatch_kl_by_staleness": kl_by_age,
        "tokens_by_staleness": tokens_by_age,
        "mismatch_ratio_std": ratio_std,
        "mismatch_ratio_min": lo,
        "mismatch_ratio_max": hi,
        "tis_fraction": tis,
        "icepop_fraction": 0.0,
        "seconds_training": seconds,
    }


def test_the_mismatch_is_weighted_by_tokens():
    # Step 1: 10 fresh tokens; step 2: 10 fresh and 20 one step old (KL 0.01 over all 30).
    rows = [
        row(0.0, [0.0, 0.0, 0.0], [10, 0, 0], 0.0, 1.0, 1.0, 0.0, 2.0),
        row(0.01, [0.0, 0.015, 0.0], [10, 20, 0], 0.2, 0.5, 3.0, 0.1, 4.0),
    ]
    m = bench.mismatch(rows)
    assert m.kl == pytest.approx(0.3 / 40)
    assert m.kl_by_staleness == [0.0, pytest.approx(0.015), None]  # no token 2 steps old
    assert m.tokens_by_staleness == [20, 20, 0]
    assert (m.ratio_std, m.ratio_min, m.ratio_max) == pytest.approx((0.1, 0.5, 3.0))
    assert m.tis_fraction == pytest.approx(3 / 40)
    assert m.step_seconds == 3.0


def test_a_change_is_paired_by_task():
    change, se = bench.paired_change([0.5, 0.25, 1.0], [0.25, 0.25, 0.5])
    assert change == pytest.approx(0.25)
    assert se == pytest.approx(0.25 / math.sqrt(3))  # the differences' stdev is 0.25


def result(arm, held_out, kl=0.0):
    rows = [row(kl, [0.0, kl, 0.0], [0, 100, 0], 0.1, 0.5, 2.0, 0.0, 1.0)]
    return bench.ArmResult(arm, rows, held_out)


def test_a_correction_counts_only_beyond_the_spread_between_two_defaults():
    before = [0.0, 0.0, 0.25, 0.25]
    default = [0.25, 0.25, 0.5, 0.5]
    better = [0.5, 0.5, 0.75, 0.5]  # +0.1875 (se 0.0625): 3 standard errors above
    icepop = bench.Arm("IcePop", {})
    quiet = bench.verdict(before, [result(bench.DEFAULT, default, kl=0.01), result(icepop, better)])
    assert "further than its repeat: IcePop (+0.1875 (0.0625))" in quiet
    assert "1.00e-02 at 1 step old" in quiet
    assert "gains from a correction" in quiet
    # The same gain, when two defaults land as far apart, is noise between runs.
    noisy = bench.verdict(
        before,
        [result(bench.DEFAULT, default), result(bench.AGAIN, better), result(icepop, better)],
    )
    assert "no further than its repeat: IcePop" in noisy
    assert "does not need them" in noisy
