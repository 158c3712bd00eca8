"""The trust suite's false-positive table in its short form: honest rollouts of the
default model, sampled every way an honest node samples (fp32 and bf16, greedy and
top-p, batches of 1 to 64, one and two threads, long completions), are never
evidence and never rejected by the validator's defaults."""

from benchmarks import trust_honest
from benchmarks.trust import LONGEST
from orchestrator.tasks.generators import demo_tasks
from swarmrl.rollouts.tolerances import TOLERANCES


def test_honest_variation_is_never_rejected_nor_evidence(default_model):
    rows = trust_honest.run(
        {"default": default_model}, demo_tasks(200, seed=24), scale=0.1, long_tokens=LONGEST
    )
    assert {r.variation.sampled for r in rows} == {"fp32", "bf16"}
    assert all(r.rollouts >= r.variation.group for r in rows)
    assert [(r.variation.label(), r.reasons) for r in rows if r.rejected] == []
    for tolerance in TOLERANCES:
        worst = max(r.worst.get(tolerance.check, 0.0) for r in rows)
        assert worst <= tolerance.reject, (tolerance.check, worst)
    table = trust_honest.table(rows)
    assert table.count("\n| default, ") == len(rows)
