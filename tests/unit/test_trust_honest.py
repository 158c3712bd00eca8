"""The trust suite's false-positive table in its short form: honest rollouts of the
default model, sampled every way an honest node samples (fp32 and bf16, greedy and
top-p, batches of 1 to 64, one and two threads, long completions), are never
evidence and never rejected by the validator's defaults."""

from benchmarks import trust_honest
from orchestrator.tasks.generators import demo_tasks
from swarmrl.rollouts.tolerances import TOLERANCES


def test_honest_variation_is_never_rejected_nor_evidence(default_model, tmp_path, monkeypatch):
    models, tasks, results = {"default": default_model}, demo_tasks(200, seed=24), tmp_path / "r"
    rows = trust_honest.run(models, tasks, scale=0.1, results=results)
    assert {r.variation.sampled for r in rows} == {"fp32", "bf16"}
    assert all(r.rollouts >= r.variation.group for r in rows)
    assert [(r.variation.label(), r.reasons) for r in rows if r.rejected] == []
    for tolerance in TOLERANCES:
        worst = max(r.worst.get(tolerance.check, 0.0) for r in rows)
        assert worst <= tolerance.reject, (tolerance.check, worst)
    table = trust_honest.table(rows)
    assert table.count("\n| default, ") == len(rows)

    # A run stopped part-way is taken up again: its rows are kept as measured (a line
    # cut short by the stop is measured again), and nothing kept is measured twice.
    lines = results.read_text().splitlines()
    assert len(lines) == len(rows)
    results.write_text("\n".join([*lines[:-1], lines[-1][: len(lines[-1]) // 2]]) + "\n")
    measured = []
    measure = trust_honest.measure
    monkeypatch.setattr(trust_honest, "measure", lambda v, *a: measured.append(v) or measure(v, *a))
    again = trust_honest.run(models, tasks, scale=0.1, results=results)
    assert measured == [rows[-1].variation]
    assert [(r.variation, r.rollouts, r.worst) for r in again[:-1]] == [
        (r.variation, r.rollouts, r.worst) for r in rows[:-1]
    ]
    assert again[-1].rollouts == rows[-1].rollouts
