"""`swarmrl bench trainer`: a configuration measured as a 2-rank job of the tiny model,
the resident-memory measure it rests on, and the table's ratios."""

from __future__ import annotations

import mmap
from pathlib import Path

from benchmarks import trainer as bench


def test_two_ranks_each_hold_half_the_model_and_measure_a_step(model_dirs):
    batch = bench.Batch(samples=4, prompt=8, completion=16)
    setup = bench.Setup(model_dirs[0], ranks=2, checkpointing=True, batch=batch, steps=1, threads=2)
    figure = bench.measure(setup, "test-bench-trainer")
    assert [r.rank for r in figure.ranks] == [0, 1]
    # FSDP2 split every parameter between the ranks: nothing held twice, nothing lost.
    assert sum(r.parameters for r in figure.ranks) == bench.parameter_count(model_dirs[0])
    assert all(r.parameters < bench.parameter_count(model_dirs[0]) for r in figure.ranks)
    for r in figure.ranks:
        assert len(r.seconds) == 1  # the warm-up step is not timed
        assert 0 < r.seconds[0] < 60
        # The policy, torch and transformers are resident before the first step.
        assert r.loaded > 100 * bench.MIB
        assert r.peak >= r.loaded
        # At least its share of the gradients and of AdamW's two moments, in fp32.
        assert r.tensors >= 3 * 4 * r.parameters


def test_the_peak_is_the_high_water_mark_since_the_reset():
    bench.reset_peak()
    before = bench.resident_bytes()
    # A mapping of its own: pages the heap freed earlier in this worker (torch's) could
    # be reused resident, and the peak would not move.
    block = mmap.mmap(-1, 64 * bench.MIB)
    for offset in range(0, len(block), mmap.PAGESIZE):  # touch every page: resident
        block[offset] = 1
    block.close()
    assert bench.peak_resident_bytes() - before >= 60 * bench.MIB
    bench.reset_peak()
    assert bench.peak_resident_bytes() - bench.resident_bytes() < 16 * bench.MIB


def test_the_synthetic_batch_is_fixed_by_its_seed():
    batch = bench.Batch(samples=4, prompt=3, completion=5)
    samples = bench.synthetic_batch(100, batch)
    assert samples == bench.synthetic_batch(100, batch)
    assert samples != bench.synthetic_batch(100, batch, seed=1)
    assert [(len(s.prompt_ids), len(s.output_ids), len(s.sampler_logprobs)) for s in samples] == [
        (3, 5, 5)
    ] * 4
    assert {s.advantage for s in samples} == {-1.0, 1.0}
    assert all(0 <= t < 100 for s in samples for t in s.prompt_ids + s.output_ids)


def test_the_table_compares_each_configuration_with_one_rank(capsys, model_dirs):
    batch = bench.Batch(samples=2, prompt=1, completion=1)

    def figure(ranks: int, checkpointing: bool, seconds: float, above: int) -> bench.Figure:
        setup = bench.Setup(Path(model_dirs[0]), ranks, checkpointing, batch, 1, 2)
        mib = bench.MIB
        return bench.Figure(
            setup,
            [
                bench.RankFigure(
                    r, 10**7 // ranks, 100 * mib, (100 + above) * mib, above // 2 * mib, [seconds]
                )
                for r in range(ranks)
            ],
        )

    bench.trainer_table("tiny", [figure(1, False, 2.0, 40), figure(2, True, 3.0, 10)])
    rows = capsys.readouterr().out.splitlines()
    # 4 tokens a step; every ratio is to the first row's.
    assert rows[-2:] == [
        "| 1 | off | 2.00 | 2 | 10.00 M | 140 MiB | 40 MiB | 20 MiB | 1.00 | 1.00 | 1.00 |",
        "| 2 | on | 3.00 | 1 | 5.00 M | 110 MiB | 10 MiB | 5 MiB | 0.25 | 0.25 | 1.50 |",
    ]
